"""Passkey retrieval (Mohtashami & Jaggi, 2023): find a 5-digit key hidden in L tokens of filler.

The prompt, assembled from separately tokenized pieces so that every length is exact in the model's
tokens (the filler is cut at a token boundary):

    INTRO  filler[:before]  KEY_SENTENCE  filler[:after]  QUESTION   ->  answer " 12345" + EOS

`before = round(depth * n_filler)`, `n_filler = L - len(INTRO) - len(KEY_SENTENCE) - len(QUESTION)`, so
the whole prompt is exactly L tokens and depth 0 / 1 puts the key right after the intro / right before
the question. The answer is read by greedy decoding with the recurrent state (prefill in chunks):
memory does not grow with L.

Fine-tuning examples are the same prompts at the training length with a uniform random depth. The
paper fine-tunes with the fitted-noise intervention: state passing is ill-suited here, because the data
after the revealed key is not stationary (the tokens after the key depend on it, and the question comes
at a fixed place), so a state carried over from the previous example is not a realistic state for this
data the way it is for a text stream.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import numpy as np

from recurlen.evaluation.tasks.common import TaskExample, greedy_answers
from recurlen.models.interface import RecurrentLM
from recurlen.util.errors import UserError
from recurlen.util.tokenizers import Tokenizer

log = logging.getLogger(__name__)

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
KEY_SENTENCE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\nWhat is the pass key? The pass key is"
ANSWER = " {key}"
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class PasskeyPrompt:
    ids: list[int]
    """The prompt: exactly `length` tokens."""
    answer_ids: list[int]
    """What a correct model continues with (" 12345"), without EOS."""
    key: str
    depth: float
    key_start: int
    """Token index where the key sentence starts."""
    n_filler: int
    """Filler tokens in the prompt (before + after the key sentence)."""


class PasskeyBuilder:
    """Builds prompts in one tokenizer's tokens; caches the tokenized pieces and the filler stream."""

    def __init__(self, tokenizer: Tokenizer, *, key_digits: int = 5) -> None:
        self.tok = tokenizer
        self.key_digits = key_digits
        self.intro = tokenizer.encode(INTRO)
        self.question = tokenizer.encode(QUESTION)
        self._filler: list[int] = []

    def filler(self, n: int) -> list[int]:
        """The first n tokens of the repeated filler, tokenized as one text (natural merges across sentences)."""
        if len(self._filler) < n:
            reps = 2 * max(1, n // max(1, len(self.tok.encode(FILLER)))) + 2
            self._filler = self.tok.encode(FILLER * reps)
        return self._filler[:n]

    def overhead(self, key: str) -> int:
        """Tokens that are not filler: intro, key sentence and question."""
        return len(self.intro) + len(self.tok.encode(KEY_SENTENCE.format(key=key))) + len(self.question)

    def min_length(self) -> int:
        return self.overhead("9" * self.key_digits)

    def random_key(self, rng: np.random.Generator) -> str:
        first = int(rng.integers(1, 10))  # no leading zero: the key reads as a number
        rest = rng.integers(0, 10, self.key_digits - 1)
        return str(first) + "".join(str(int(d)) for d in rest)

    def build(self, *, length: int, depth: float, key: str) -> PasskeyPrompt:
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"passkey depth={depth} is outside [0, 1]; 0 puts the key first, 1 last")
        if len(key) != self.key_digits or not key.isdigit():
            raise ValueError(f"pass key {key!r} must be {self.key_digits} digits")
        key_ids = self.tok.encode(KEY_SENTENCE.format(key=key))
        overhead = len(self.intro) + len(key_ids) + len(self.question)
        n_filler = length - overhead
        if n_filler < 0:
            raise ValueError(f"passkey length L={length} is too short to hold the key and the question: the intro, key "
                             f"sentence and question alone take {overhead} tokens with this tokenizer; need L >= "
                             f"{overhead}")
        before = int(round(depth * n_filler))
        filler = self.filler(n_filler)
        ids = self.intro + filler[:before] + key_ids + filler[:n_filler - before] + self.question
        assert len(ids) == length
        return PasskeyPrompt(ids=ids, answer_ids=self.tok.encode(ANSWER.format(key=key)), key=key, depth=depth,
                             key_start=len(self.intro) + before, n_filler=n_filler)

    def training_example(self, rng: np.random.Generator, *, seq_len: int, eos_id: int) -> TaskExample:
        """A prompt at a uniform random depth, sized so that prompt + answer + EOS fill seq_len + 1 tokens."""
        key = self.random_key(rng)
        answer = self.tok.encode(ANSWER.format(key=key))
        prompt = self.build(length=seq_len - len(answer), depth=float(rng.random()), key=key)
        return TaskExample(ids=prompt.ids + answer + [eos_id], answer_start=len(prompt.ids))


def parse_passkey(text: str) -> str:
    """The first number in a generated answer; ValueError when there is none."""
    m = _NUMBER.search(text)
    if m is None:
        raise ValueError(f"answer {text!r} is not a number: it contains no digits, so no pass key can be read from it")
    return m.group(0)


def score_passkey(text: str, key: str) -> float:
    """1.0 when the first number in the answer is exactly the key, else 0.0 (an answer with no number: 0.0)."""
    try:
        return float(parse_passkey(text) == key)
    except ValueError:
        return 0.0


def check_lengths(builder: PasskeyBuilder, lengths: list[int]) -> None:
    """A UserError when a length cannot hold the intro, the key sentence and the question: `recurlen passkey` says it
    before it trains, not after."""
    short = [n for n in lengths if n < builder.min_length()]
    if short:
        raise UserError(f"passkey lengths {short} are too short to hold the key and the question; with this tokenizer "
                        f"need L >= {builder.min_length()} (raise task.lengths)")


def evaluate_passkey(model: RecurrentLM, tokenizer: Tokenizer, *, lengths: list[int], depths: list[float], trials: int,
                     seed: int, batch_size: int, chunk_len: int, key_digits: int = 5,
                     max_new_tokens: int | None = None, progress: bool = True) -> dict:
    """Accuracy per (depth, length) cell over `trials` random keys, each trial's outcome (1 the key, 0 not) in
    the order the keys were drawn; examples of the first answers are kept."""
    builder = PasskeyBuilder(tokenizer, key_digits=key_digits)
    for d in depths:
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"passkey depth={d} is outside [0, 1]; 0 puts the key first, 1 last")
    check_lengths(builder, lengths)
    cells = []
    n_cells = len(lengths) * len(depths)
    for i, (length, depth) in enumerate((n, d) for n in lengths for d in depths):
        rng = np.random.default_rng([seed, length, int(round(depth * 1000))])
        prompts = [builder.build(length=length, depth=depth, key=builder.random_key(rng)) for _ in range(trials)]
        new = max_new_tokens or max(len(p.answer_ids) for p in prompts) + 2
        outs = greedy_answers(model, [p.ids for p in prompts], max_new_tokens=new, stop_id=tokenizer.eos_id,
                              batch_size=batch_size, chunk_len=chunk_len,
                              desc=f"passkey L={length} depth={depth} ({i + 1}/{n_cells})" if progress else None)
        texts = [tokenizer.decode(o) for o in outs]
        scores = [score_passkey(t, p.key) for t, p in zip(texts, prompts)]
        non_numeric = sum(1 for t in texts if not _NUMBER.search(t))
        cells.append({"length": length, "depth": depth, "trials": trials, "correct": int(sum(scores)),
                      "accuracy": float(np.mean(scores)), "non_numeric": non_numeric,
                      "outcomes": [int(x) for x in scores],  # trial by trial: anyone can recompute an interval
                      "examples": [{"key": p.key, "output": t} for p, t in zip(prompts[:3], texts[:3])]})
        log.info("passkey L=%d depth=%.2f: accuracy %.3f (%d/%d; %d answers without a number)", length, depth,
                 cells[-1]["accuracy"], cells[-1]["correct"], trials, non_numeric)
    acc = {(c["depth"], c["length"]): c["accuracy"] for c in cells}
    return {"lengths": list(lengths), "depths": list(depths), "trials": trials, "cells": cells,
            "accuracy": [[acc[(d, n)] for n in lengths] for d in depths],
            "mean_accuracy_by_length": {str(n): float(np.mean([acc[(d, n)] for d in depths])) for n in lengths},
            "mean_accuracy": float(np.mean(list(acc.values())))}


__all__ = ["ANSWER", "FILLER", "INTRO", "KEY_SENTENCE", "QUESTION", "PasskeyBuilder", "PasskeyPrompt",
           "check_lengths", "evaluate_passkey", "parse_passkey", "score_passkey"]
