"""Synthetic copying (Jelassi et al., 2024, "Repeat After Me"): read a random string, then repeat it.

An example, in the reference code's format:

    $ s_1 ... s_k | s_1 ... s_k .          s_i uniform over the first `alphabet_size` lowercase letters

Every symbol is one token (checked for the tokenizer in use). Training strings have min_length..n symbols
(n = copying.length); the loss is on the copy and its end marker. A training row (data.seq_len + 1 tokens)
holds one example followed by `*` padding, or (copying.packed) examples back to back as the reference packs
them, an example cut by the row's end left unscored.

Two metrics, both the reference's character accuracy over the copy (never the end marker):
    char_acc          teacher-forced: the whole example is fed, the argmax at each copy position is compared
                      with the true symbol (the reference's `char_acc`)
    greedy_char_acc   the model reads `$ s |` and decodes greedily until `.` (missing symbols count as wrong)

Two readings of the paper's "sequences more than three times longer than in training":
    single   one example whose string is L symbols long, L = 1, 2, 3, 4 x n by default
    stream   a zero-state sequence of stream_factor x T tokens (T = data.seq_len) made of training-format
             examples (rows as in training, one after the other), scored on the examples that start at or
             after (stream_factor - 1) x T; the rest is context, fed as is
The paper reports, at > 3x the training length, 0.27 +- 0.03 for Mamba-2 and 0.47 +- 0.11 with state passing.
"""

from __future__ import annotations

import logging
import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from recurlen.evaluation.generation import greedy_generate, prefill
from recurlen.evaluation.tasks.common import TaskExample, model_device
from recurlen.evaluation.tasks.config import CopyingConfig
from recurlen.models.interface import RecurrentLM
from recurlen.util.tokenizers import Tokenizer

log = logging.getLogger(__name__)

READINGS = ("single", "stream")
METRICS = ("char_acc", "greedy_char_acc")


@dataclass(frozen=True)
class Placed:
    """An example inside a longer token sequence: `$` at `start`, a string of `k` symbols."""

    start: int
    k: int

    @property
    def separator(self) -> int:
        return self.start + self.k + 1

    @property
    def end(self) -> int:
        """One past the end marker."""
        return self.start + 2 * self.k + 3


class CopyingFormat:
    """Token ids of the alphabet and the markers in one tokenizer, and example / row / stream builders."""

    def __init__(self, tokenizer: Tokenizer, cfg: CopyingConfig) -> None:
        self.cfg = cfg
        self.alphabet = string.ascii_lowercase[:cfg.alphabet_size]
        ids = []
        for ch in self.alphabet + cfg.start + cfg.separator + cfg.end + cfg.pad:
            tok = tokenizer.encode(ch)
            if len(tok) != 1:
                raise ValueError(f"copying needs one token per symbol, but tokenizer {tokenizer.name!r} encodes "
                                 f"{ch!r} as {len(tok)} tokens; use data.tokenizer=bytes")
            ids.append(tok[0])
        self.symbol_ids = np.array(ids[:cfg.alphabet_size], dtype=np.int64)
        self.start_id, self.sep_id, self.end_id, self.pad_id = ids[cfg.alphabet_size:]

    def random_strings(self, rng: np.random.Generator, num: int, length: int) -> np.ndarray:
        """(num, length) token ids of uniform random strings."""
        return self.symbol_ids[rng.integers(0, len(self.symbol_ids), (num, length))]

    def example_ids(self, s: Sequence[int]) -> list[int]:
        s = list(s)
        return [self.start_id, *s, self.sep_id, *s, self.end_id]

    def _length(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.cfg.min_length, self.cfg.length + 1))

    def check_seq_len(self, seq_len: int) -> None:
        n = self.cfg.length
        if 2 * n + 3 > seq_len + 1:
            raise ValueError(f"data.seq_len={seq_len} is too short for copying strings of length {n}: an example "
                             f"`$ s | s .` takes 2n + 3 = {2 * n + 3} tokens, so data.seq_len must be >= {2 * n + 2}")

    def training_example(self, rng: np.random.Generator, *, seq_len: int) -> TaskExample:
        """One training row's content (seq_len + 1 tokens at most; rows_from_examples pads with `*`)."""
        self.check_seq_len(seq_len)
        if not self.cfg.packed:
            k = self._length(rng)
            return TaskExample(ids=self.example_ids(self.random_strings(rng, 1, k)[0]), answer_start=k + 2)
        width = seq_len + 1
        ids: list[int] = []
        scored: list[bool] = []
        while len(ids) < width:
            k = self._length(rng)
            ex = self.example_ids(self.random_strings(rng, 1, k)[0])
            if len(ids) + len(ex) > width:  # cut by the row's end: context only, as in the reference
                ex = ex[:width - len(ids)]
                ids += ex
                scored += [False] * len(ex)
                break
            ids += ex
            # Target t predicts token t + 1: the copy and the end marker are tokens k + 2 .. 2k + 2.
            scored += [False] * (k + 1) + [True] * (k + 1) + [False]
        return TaskExample(ids=ids, answer_start=0, scored=tuple(scored[:len(ids) - 1]))

    def stream_layout(self, rng: np.random.Generator, *, seq_len: int, factor: int) -> tuple[list[Placed], int]:
        """Examples of a stream of >= factor x seq_len tokens laid out as training rows follow each other:
        one example per seq_len + 1 tokens (`*` after it), or back to back when packed. Returns the placed
        examples and the stream's length."""
        self.check_seq_len(seq_len)
        total, pos, placed = factor * seq_len, 0, []
        while pos < total:
            k = self._length(rng)
            placed.append(Placed(pos, k))
            pos = placed[-1].end if self.cfg.packed else pos + seq_len + 1
        return placed, max(pos, placed[-1].end)

    def fill(self, placed: Sequence[Placed], length: int, strings: Sequence[np.ndarray]) -> np.ndarray:
        """(length,) token ids: each placed example with its string, `*` elsewhere."""
        row = np.full(length, self.pad_id, dtype=np.int64)
        for p, s in zip(placed, strings):
            row[p.start:p.end] = self.example_ids(s)
        return row


def char_accuracy(output: Sequence[int], target: Sequence[int]) -> float:
    """Share of target positions the output reproduces (a short output is wrong where it is missing)."""
    if not len(target):
        raise ValueError("the target string is empty")
    return sum(1 for o, t in zip(output, target) if o == t) / len(target)


def teacher_forced_accuracy(pred_BL: torch.Tensor, ids_BL: torch.Tensor, placed: Sequence[Placed]) -> np.ndarray:
    """(B, len(placed)) character accuracy of argmax predictions over each placed example's copy.

    pred_BL[:, t] is the prediction for token t + 1, so the copy's symbols (tokens separator + 1 ..
    separator + k) are predicted at separator .. separator + k - 1."""
    out = np.zeros((ids_BL.shape[0], len(placed)))
    for j, p in enumerate(placed):
        pred = pred_BL[:, p.separator:p.separator + p.k]
        true = ids_BL[:, p.separator + 1:p.separator + 1 + p.k]
        out[:, j] = (pred == true).float().mean(dim=1).cpu().numpy()
    return out


@torch.no_grad()
def score_placed(model: RecurrentLM, ids_BL: torch.Tensor, placed: Sequence[Placed], *, end_id: int,
                 chunk_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced and greedy character accuracy, (B, len(placed)) each, of the placed examples of a
    batch of equal-layout sequences run from a zero state.

    Greedy: the true tokens are fed up to an example's separator, the copy is decoded greedily from that
    state, and the true tokens then continue from the saved state (the decoded tokens never enter it)."""
    device = model_device(model)
    ids_BL = ids_BL.to(device)
    preds, state = [], None
    for s in range(0, ids_BL.shape[1], chunk_len):
        logits, state = model(ids_BL[:, s:s + chunk_len], state)
        preds.append(logits.argmax(dim=-1))
    teacher = teacher_forced_accuracy(torch.cat(preds, dim=1), ids_BL, placed)
    greedy = np.zeros_like(teacher)
    state, pos = None, 0
    for j, p in enumerate(sorted(placed, key=lambda q: q.start)):
        if p.separator > pos:
            _, state = prefill(model, ids_BL[:, pos:p.separator], state=state, chunk_len=chunk_len)
            pos = p.separator
        gen = greedy_generate(model, ids_BL[:, p.separator:p.separator + 1], state=state, max_new_tokens=p.k,
                              chunk_len=chunk_len, stop_ids={end_id}).tolist()
        target = ids_BL[:, p.separator + 1:p.separator + 1 + p.k].tolist()
        for b, (toks, true) in enumerate(zip(gen, target)):
            if end_id in toks:
                toks = toks[:toks.index(end_id)]
            greedy[b, j] = char_accuracy(toks, true)
    return teacher, greedy


def evaluate_single(model: RecurrentLM, fmt: CopyingFormat, *, lengths: Sequence[int], trials: int, seed: int,
                    batch_size: int, chunk_len: int) -> dict:
    """`single` reading: one example with an L-symbol string per trial (the same strings for every model)."""
    out = {m: {} for m in METRICS} | {"exact_match": {}}
    for length in lengths:
        strings = fmt.random_strings(np.random.default_rng([seed, length]), trials, length)
        placed = [Placed(0, length)]
        teacher, greedy = [], []
        for s in range(0, trials, batch_size):
            rows = [fmt.fill(placed, 2 * length + 3, [row]) for row in strings[s:s + batch_size]]
            ids = torch.as_tensor(np.stack(rows))
            t, g = score_placed(model, ids, placed, end_id=fmt.end_id, chunk_len=chunk_len)
            teacher.append(t[:, 0])
            greedy.append(g[:, 0])
        teacher_a, greedy_a = np.concatenate(teacher), np.concatenate(greedy)
        out["char_acc"][str(length)] = float(teacher_a.mean())
        out["greedy_char_acc"][str(length)] = float(greedy_a.mean())
        out["exact_match"][str(length)] = float((greedy_a == 1.0).mean())
        log.info("copying single L=%d: char_acc %.3f, greedy_char_acc %.3f", length, out["char_acc"][str(length)],
                 out["greedy_char_acc"][str(length)])
    return {"lengths": list(lengths), "trials": trials, **out}


def evaluate_stream(model: RecurrentLM, fmt: CopyingFormat, *, seq_len: int, trials: int, seed: int,
                    batch_size: int, chunk_len: int) -> dict:
    """`stream` reading: trials zero-state streams of >= stream_factor x seq_len tokens; every batch of
    streams shares one layout (string lengths), drawn per batch, with its own strings per stream."""
    factor = fmt.cfg.stream_factor
    score_from = (factor - 1) * seq_len
    teacher, greedy, lengths = [], [], []
    for b, s in enumerate(range(0, trials, batch_size)):
        rng = np.random.default_rng([seed, 7, b])
        placed, total = fmt.stream_layout(rng, seq_len=seq_len, factor=factor)
        rows = min(batch_size, trials - s)
        ids = np.stack([fmt.fill(placed, total, [fmt.random_strings(rng, 1, p.k)[0] for p in placed])
                        for _ in range(rows)])
        scored = [p for p in placed if p.start >= score_from]
        assert scored, "a stream always has an example starting in its last seq_len tokens"
        t, g = score_placed(model, torch.as_tensor(ids), scored, end_id=fmt.end_id, chunk_len=chunk_len)
        teacher.append(t.ravel())
        greedy.append(g.ravel())
        lengths.append(total)
    teacher_a, greedy_a = np.concatenate(teacher), np.concatenate(greedy)
    res = {"train_seq_len": seq_len, "factor": factor, "min_length": int(min(lengths)), "score_from": score_from,
           "trials": trials, "examples": int(teacher_a.size), "char_acc": float(teacher_a.mean()),
           "greedy_char_acc": float(greedy_a.mean())}
    log.info("copying stream (%d x T = %d tokens, scored from %d): char_acc %.3f, greedy_char_acc %.3f over %d "
             "examples", factor, factor * seq_len, score_from, res["char_acc"], res["greedy_char_acc"],
             res["examples"])
    return res


def headline_length(lengths: list[int], *, n: int, factor: int) -> int:
    """The shortest evaluated length >= factor * n (else the longest one)."""
    above = [L for L in sorted(lengths) if factor * n <= L]
    if not above:
        log.warning("no evaluated copying length reaches %d x %d; the summary uses the longest, %d", factor, n,
                    max(lengths))
        return max(lengths)
    return above[0]


def _mean_std(values: Sequence[float]) -> dict:
    """Mean and sample std (ddof=1; 0 for one seed)."""
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0}


def summarize(runs: list[dict], *, headline: int) -> dict:
    """Per intervention and reading: mean +- std over seeds of both metrics.

    single: {"char_acc": {"mean": {L: ..}, "std": {L: ..}}, "greedy_char_acc": ..} and `at_headline`;
    stream: {"char_acc": {"mean": .., "std": ..}, "greedy_char_acc": ..}."""
    out = {}
    for name in dict.fromkeys(r["intervention"] for r in runs):
        mine = [r for r in runs if r["intervention"] == name]
        lengths = mine[0]["single"]["lengths"]
        single, stream, at = {}, {}, {"length": headline}
        for m in METRICS:
            cells = {str(L): _mean_std([r["single"][m][str(L)] for r in mine]) for L in lengths}
            single[m] = {k: {L: c[k] for L, c in cells.items()} for k in ("mean", "std")}
            at[m] = cells[str(headline)]
            if all("stream" in r for r in mine):
                stream[m] = _mean_std([r["stream"][m] for r in mine])
        out[name] = {"seeds": [r["seed"] for r in mine], "single": single, "stream": stream, "at_headline": at}
    _add_paired(out, runs, headline=headline)
    return out


def _add_paired(summary: dict, runs: list[dict], *, headline: int) -> None:
    """Each intervention against the first one (none, as experiments/copying.yaml lists them), paired by seed:
    `paired` = {reading: {metric: test}} on the seeds both ran (recurlen.evaluation.tasks.paired)."""
    from recurlen.evaluation.tasks.paired import paired_test

    names = list(summary)
    if len(names) < 2:
        return
    control = {r["seed"]: r for r in runs if r["intervention"] == names[0]}
    for name in names[1:]:
        mine = [r for r in runs if r["intervention"] == name and r["seed"] in control]
        if not mine:
            continue
        tests: dict = {"against": names[0], "seeds": [r["seed"] for r in mine], "single": {}, "stream": {}}
        for m in METRICS:
            tests["single"][m] = paired_test([r["single"][m][str(headline)] for r in mine],
                                             [control[r["seed"]]["single"][m][str(headline)] for r in mine])
            if all("stream" in r and "stream" in control[r["seed"]] for r in mine):
                tests["stream"][m] = paired_test([r["stream"][m] for r in mine],
                                                 [control[r["seed"]]["stream"][m] for r in mine])
        summary[name]["paired"] = tests


__all__ = ["METRICS", "READINGS", "CopyingFormat", "Placed", "char_accuracy", "evaluate_single", "evaluate_stream",
           "headline_length", "score_placed", "summarize", "teacher_forced_accuracy"]
