"""Synthetic copying (Jelassi et al., 2024, "Repeat After Me"): read a random string, then repeat it.

    s_1 ... s_k  |  s_1 ... s_k  EOS          s_i uniform over the first `alphabet_size` lowercase letters

Every symbol is one token (checked for the tokenizer in use). Training strings have min_length..n symbols
(n = copying.length), the loss is on the copy and its EOS. Evaluation gives the model strings of length L
(typically n, 2n, 3n, 4n) and the separator, decodes L tokens greedily with the recurrent state, and scores
character accuracy: the share of positions i < L where the output equals s_i (missing tokens count as wrong).
The paper reports, at > 3x the training length, 0.27 +- 0.03 for Mamba-2 and 0.47 +- 0.11 with state passing.
"""

from __future__ import annotations

import logging
import string

import numpy as np

from recurlen.arch import RecurrentLM
from recurlen.tasks.common import TaskExample, greedy_answers
from recurlen.tasks.config import CopyingConfig
from recurlen.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class CopyingFormat:
    """Token ids of the alphabet and separator in one tokenizer, and example builders."""

    def __init__(self, tokenizer: Tokenizer, cfg: CopyingConfig) -> None:
        self.cfg = cfg
        self.eos_id = tokenizer.eos_id
        self.alphabet = string.ascii_lowercase[:cfg.alphabet_size]
        ids = []
        for ch in self.alphabet + cfg.separator:
            tok = tokenizer.encode(ch)
            if len(tok) != 1:
                raise ValueError(f"copying needs one token per symbol, but tokenizer {tokenizer.name!r} encodes "
                                 f"{ch!r} as {len(tok)} tokens; use data.tokenizer=bytes")
            ids.append(tok[0])
        self.symbol_ids = np.array(ids[:-1], dtype=np.int64)
        self.sep_id = ids[-1]

    def random_strings(self, rng: np.random.Generator, num: int, length: int) -> np.ndarray:
        """(num, length) token ids of uniform random strings."""
        return self.symbol_ids[rng.integers(0, len(self.symbol_ids), (num, length))]

    def training_example(self, rng: np.random.Generator, *, seq_len: int) -> TaskExample:
        n = self.cfg.length
        if 2 * n + 2 > seq_len + 1:
            raise ValueError(f"data.seq_len={seq_len} is too short for copying strings of length {n}: an example "
                             f"takes 2n + 2 = {2 * n + 2} tokens, so data.seq_len must be >= {2 * n + 1}")
        k = int(rng.integers(self.cfg.min_length, n + 1))
        s = self.random_strings(rng, 1, k)[0].tolist()
        return TaskExample(ids=s + [self.sep_id] + s + [self.eos_id], answer_start=k + 1)


def char_accuracy(output: list[int], target: list[int]) -> float:
    """Share of target positions the output reproduces (a short output is wrong where it is missing)."""
    if not target:
        raise ValueError("the target string is empty")
    return sum(1 for o, t in zip(output, target) if o == t) / len(target)


def evaluate_copying(model: RecurrentLM, fmt: CopyingFormat, *, lengths: list[int], trials: int, seed: int,
                     batch_size: int, chunk_len: int, progress: bool = True) -> dict:
    """Character accuracy and exact-match rate per string length (the same strings for every model)."""
    char_acc, exact = {}, {}
    for length in lengths:
        strings = fmt.random_strings(np.random.default_rng([seed, length]), trials, length)
        prompts = [row.tolist() + [fmt.sep_id] for row in strings]
        outs = greedy_answers(model, prompts, max_new_tokens=length, stop_id=fmt.eos_id, batch_size=batch_size,
                              chunk_len=chunk_len, desc=f"copying L={length}" if progress else None)
        accs = [char_accuracy(o, s.tolist()) for o, s in zip(outs, strings)]
        char_acc[str(length)] = float(np.mean(accs))
        exact[str(length)] = float(np.mean([a == 1.0 for a in accs]))
        log.info("copying L=%d: character accuracy %.3f, exact %.3f", length, char_acc[str(length)],
                 exact[str(length)])
    return {"lengths": list(lengths), "trials": trials, "char_accuracy": char_acc, "exact_match": exact}


def headline_length(lengths: list[int], *, n: int, factor: int) -> int:
    """The shortest evaluated length >= factor * n (else the longest one)."""
    above = [L for L in sorted(lengths) if factor * n <= L]
    if not above:
        log.warning("no evaluated copying length reaches %d x %d; the summary uses the longest, %d", factor, n,
                    max(lengths))
        return max(lengths)
    return above[0]


def summarize(runs: list[dict], *, lengths: list[int], headline: int) -> dict:
    """Mean and sample std (ddof=1; 0 for one seed) of character accuracy over seeds, per intervention."""
    out = {}
    for name in dict.fromkeys(r["intervention"] for r in runs):
        mine = [r for r in runs if r["intervention"] == name]
        table = np.array([[r["char_accuracy"][str(L)] for L in lengths] for r in mine])
        std = table.std(axis=0, ddof=1) if len(mine) > 1 else np.zeros(len(lengths))
        col = lengths.index(headline)
        out[name] = {"seeds": [r["seed"] for r in mine],
                     "mean": {str(L): float(m) for L, m in zip(lengths, table.mean(axis=0))},
                     "std": {str(L): float(s) for L, s in zip(lengths, std)},
                     "at_headline": {"length": headline, "mean": float(table[:, col].mean()), "std": float(std[col])}}
    return out


__all__ = ["CopyingFormat", "char_accuracy", "evaluate_copying", "headline_length", "summarize"]
