"""What the three tasks share: training rows, batched greedy answers, TensorBoard.

A task example is a token sequence with a scored tail (the answer):

    ids = prompt + answer + [EOS]        answer_start = len(prompt)

Training rows are data.seq_len + 1 tokens (inputs and the shifted targets), the example left-aligned and
followed by EOS padding; loss_mask marks the targets that are scored (the answer and its EOS, or every
real token), never the padding.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from recurlen.diagnostics.model_access import model_device
from recurlen.evaluation.generation import greedy_generate
from recurlen.models.interface import RecurrentLM

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskExample:
    ids: list[int]
    """prompt + answer (+ EOS)."""
    answer_start: int
    """Index in ids of the first answer token: the model is asked to produce ids[answer_start:]."""
    scored: tuple[bool, ...] | None = None
    """Per target (ids[t + 1], predicted at position t), whether the loss scores it; None scores the answer
    from answer_start on (or every token with loss_on='all'). For rows that pack several examples."""


def rows_from_examples(examples: Sequence[TaskExample], *, seq_len: int, pad_id: int,
                       loss_on: str = "answer") -> dict[str, torch.Tensor]:
    """input_ids / targets / loss_mask (B, seq_len) from examples of at most seq_len + 1 tokens."""
    rows = np.full((len(examples), seq_len + 1), pad_id, dtype=np.int64)
    mask = np.zeros((len(examples), seq_len), dtype=bool)
    for b, ex in enumerate(examples):
        n = len(ex.ids)
        if n > seq_len + 1:
            raise ValueError(f"a task example has {n} tokens but training rows hold data.seq_len + 1 = {seq_len + 1}")
        rows[b, :n] = ex.ids
        if ex.scored is not None:
            if len(ex.scored) != n - 1:
                raise ValueError(f"a task example has {n} tokens but {len(ex.scored)} scored flags; need {n - 1}")
            mask[b, :n - 1] = ex.scored
            continue
        # Target t is token t + 1: the answer's first token is predicted at position answer_start - 1.
        start = 0 if loss_on == "all" else ex.answer_start - 1
        mask[b, start:n - 1] = True
    seg = torch.from_numpy(rows)
    return {"input_ids": seg[:, :-1].contiguous(), "targets": seg[:, 1:].contiguous(),
            "loss_mask": torch.from_numpy(mask)}


@torch.no_grad()
def greedy_answers(model: RecurrentLM, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, stop_id: int | None,
                   batch_size: int, chunk_len: int, desc: str | None = None) -> list[list[int]]:
    """Greedy continuations of every prompt, with the recurrent state (constant memory in the prompt length).

    Only prompts of equal length share a batch: padding would run through the state and change the answer.
    Tokens after a stop id are dropped.
    """
    device = model_device(model)
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
        by_len[len(p)].append(i)
    batches = [idx[s:s + batch_size] for _, idx in sorted(by_len.items()) for s in range(0, len(idx), batch_size)]
    out: list[list[int]] = [[] for _ in prompts]
    stop = None if stop_id is None else {stop_id}
    for idx in tqdm(batches, desc=desc, disable=desc is None, leave=False):
        ids = torch.tensor([list(prompts[i]) for i in idx], dtype=torch.long, device=device)
        gen = greedy_generate(model, ids, max_new_tokens=max_new_tokens, chunk_len=chunk_len, stop_ids=stop)
        for row, i in enumerate(idx):
            toks = gen[row].tolist()
            if stop_id is not None and stop_id in toks:
                toks = toks[:toks.index(stop_id)]
            out[i] = toks
    return out


def length_label(n: int) -> str:
    """BABILong's names for lengths: 0 -> '0k', 4096 -> '4k', 1048576 -> '1M'; others as the number."""
    if n == 0:
        return "0k"
    if n == 1 << 20:
        return "1M"
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


__all__ = ["TaskExample", "greedy_answers", "length_label", "rows_from_examples"]
