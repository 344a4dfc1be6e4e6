"""Needle in a haystack: recurlen's six tasks after RULER's (Hsieh et al., 2024), generated offline and exact in the
model's tokens.

A needle is one sentence that ties a value to a key ("One secret number for quiet-harbor is 4821930."). A task
hides needles in L tokens of haystack and asks for the value(s) of some key(s):

    single_number / single_word / single_uuid   one needle; the value is a 7-digit number, a word pair, a UUID
    multikey      the needle among num_keys - 1 distractor needles of other keys, at random places
    multivalue    num_values needles of the same key; every value must be recalled (partial credit per value)
    multiquery    num_keys needles of different keys; num_queries of them are asked for at once

RULER has eight NIAH configurations (single 1/2/3, multi-key 1/2/3, multi-value, multi-query) over essay,
repeated-sentence and needle haystacks; these six are recurlen's. single_number, single_uuid, multikey, multivalue and
multiquery have the shapes of RULER's niah_single_1/2, niah_single_3, niah_multikey_1, niah_multivalue and
niah_multiquery; single_word (a word-pair value) is not RULER's, and RULER's niah_multikey_2/3 (a haystack made of
needles, UUID keys in _3) have no task here. The haystack is one setting for every task (niah_config), the needle and
question are recurlen's wording, and the needles and the scorer below differ from RULER's as stated there.

The prompt is assembled from separately tokenized pieces, so every length is exact (the haystack is cut at a
token boundary):

    INTRO  hay[:before]  NEEDLES  hay[before:]  QUESTION   ->  answer " v1, v2, ..." + EOS

with the distractor needles (multikey, multiquery's unasked keys) inserted at uniform random haystack positions.
The asked-for needles form one block whose start has `before = round(depth * n_hay)` haystack tokens in front of
it: depth 0 / 1 puts it right after the intro / right before the question (RULER scatters each needle at a random
depth). A value counts as recalled when the generated text holds it whole (a whole number, word pair or UUID, not a
part of a longer one; word pairs and UUIDs in any case), where RULER's string_match_all takes any case-insensitive
substring; a prompt scores the fraction of its values recalled, as RULER's does, so single-value tasks score 0 or 1.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from recurlen.evaluation.tasks.common import TaskExample
from recurlen.evaluation.tasks.niah_config import NIAH_TASKS, NiahConfig
from recurlen.util.tokenizers import Tokenizer

# Short on purpose: with the byte tokenizer a multikey prompt's needles and question already take ~280 tokens.
INTRO = "Secret {plural} are hidden below. Remember them.\n"
NEEDLE = " One secret {kind} for {key} is {value}. "
ASK_ONE = "\nWhat is the secret {kind} for {key}? It is"
ASK_ALL = "\nWhat are all the secret {plural} for {key}? They are"
ASK_MANY = "\nWhat are the secret {plural} for {keys}? In that order, they are"

ADJECTIVES = ("amber", "bold", "brisk", "calm", "clever", "crimson", "dusty", "eager", "fancy", "gentle", "golden",
              "hollow", "humble", "icy", "jolly", "lively", "lucky", "mellow", "misty", "noble", "odd", "plain",
              "proud", "quiet", "rapid", "rusty", "silent", "silver", "sleepy", "smooth", "solid", "sunny", "swift",
              "tidy", "velvet", "vivid", "wild", "windy", "witty", "young")
NOUNS = ("anchor", "badger", "barrel", "beacon", "canyon", "cedar", "comet", "copper", "falcon", "garden", "harbor",
         "island", "kettle", "lantern", "meadow", "mirror", "napkin", "otter", "parrot", "pebble", "pepper", "pillow",
         "planet", "pocket", "quarry", "rabbit", "ribbon", "saddle", "signal", "spruce", "summit", "teapot", "thistle",
         "tunnel", "valley", "violin", "walnut", "willow", "window", "zephyr")
KINDS = {"number": "number", "word": "word", "uuid": "uuid"}
_PATTERNS = {"number": re.compile(r"(?<![0-9])[0-9]+(?![0-9])"),
             "word": re.compile(r"(?<![A-Za-z-])[A-Za-z]+-[A-Za-z]+(?![A-Za-z-])"),
             "uuid": re.compile(r"(?<![0-9A-Fa-f-])[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-"
                                r"[0-9A-Fa-f]{12}(?![0-9A-Fa-f-])")}


@dataclass(frozen=True)
class NiahSpec:
    """One task's shape: the value type, keys with needles, needles per key, keys asked for."""

    value: str
    keys: int = 1
    values: int = 1
    queries: int = 1


def task_specs(cfg: NiahConfig) -> dict[str, NiahSpec]:
    """Every task with cfg's counts (RULER's counts by default: 4 keys, 4 values, 4 queries)."""
    specs = {"single_number": NiahSpec("number"), "single_word": NiahSpec("word"), "single_uuid": NiahSpec("uuid"),
             "multikey": NiahSpec("number", keys=cfg.num_keys),
             "multivalue": NiahSpec("number", values=cfg.num_values),
             "multiquery": NiahSpec("number", keys=cfg.num_keys, queries=cfg.num_queries)}
    assert tuple(specs) == NIAH_TASKS
    return specs


class Haystack(Protocol):
    kind: str

    def tokens(self, index: int, n: int) -> list[int]:
        """n haystack tokens for trial `index` (the same for every length and depth, so cells pair up)."""
        ...


class FillerHaystack:
    """The passkey filler sentences repeated (RULER's repeated-sentence 'noise' haystack, joined by spaces where RULER
    joins with newlines), tokenized as one text."""

    kind = "filler"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self._ids: list[int] = []

    def tokens(self, index: int, n: int) -> list[int]:
        if len(self._ids) < n:
            from recurlen.evaluation.tasks.passkey import FILLER

            reps = 2 * max(1, n // max(1, len(self.tok.encode(FILLER)))) + 2
            self._ids = self.tok.encode(FILLER * reps)
        return self._ids[:n]


class TextHaystack:
    """Windows of a token stream: row `index` of given held-out sequences, or a seeded window of the embedded text."""

    def __init__(self, kind: str, *, rows: list[list[int]] | None = None, tokenizer: Tokenizer | None = None) -> None:
        self.kind = kind
        self.rows = rows
        self._pool = None
        if rows is None:
            from recurlen.evaluation.tasks.babilong_gen import Haystack as Pool

            assert tokenizer is not None
            self._pool = Pool(tokenizer, "embedded")

    def tokens(self, index: int, n: int) -> list[int]:
        if self._pool is not None:
            return self._pool.window(np.random.default_rng([index]), n)
        row = self.rows[index % len(self.rows)]
        if n > len(row):
            raise ValueError(f"the {self.kind} haystack holds {len(row)} tokens per sequence; a prompt needs {n}")
        return list(row[:n])


@dataclass(frozen=True)
class NiahSample:
    """What one prompt asks: the needles (key, value) in the order they are placed, the asked keys and the answer."""

    task: str
    kind: str
    asked: list[tuple[str, str]]
    """The asked-for needles, in the order of the block (and of the expected answer)."""
    distractors: list[tuple[str, str]]
    question: str
    expected: list[str]


@dataclass(frozen=True)
class NiahPrompt:
    ids: list[int]
    """The prompt: exactly `length` tokens."""
    answer_ids: list[int]
    sample: NiahSample
    depth: float
    needle_start: int
    """Token index where the block of asked-for needles starts."""
    needle_tokens: int
    n_hay: int
    """Haystack tokens in the prompt."""
    hay_before: int
    """Haystack tokens before the block (round(depth * n_hay))."""


def _word(rng: np.random.Generator) -> str:
    return f"{ADJECTIVES[int(rng.integers(len(ADJECTIVES)))]}-{NOUNS[int(rng.integers(len(NOUNS)))]}"


def random_value(rng: np.random.Generator, kind: str, *, digits: int = 7) -> str:
    if kind == "number":
        return str(int(rng.integers(10 ** (digits - 1), 10 ** digits)))  # no leading zero: it reads as a number
    if kind == "word":
        return _word(rng)
    if kind == "uuid":
        return str(uuid.UUID(bytes=rng.bytes(16), version=4))
    raise ValueError(f"needle value kind {kind!r} is unknown; allowed: {list(KINDS)}")


def _distinct(rng: np.random.Generator, n: int, draw, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        v = draw()
        if v not in taken:
            taken.add(v)
            out.append(v)
    return out


def make_sample(rng: np.random.Generator, task: str, spec: NiahSpec, *, digits: int = 7) -> NiahSample:
    """Keys, values and the question of one prompt; keys and values are all distinct."""
    taken: set[str] = set()
    keys = _distinct(rng, spec.keys, lambda: _word(rng), taken)
    values = [_distinct(rng, spec.values, lambda: random_value(rng, spec.value, digits=digits), taken)
              for _ in keys]
    asked_keys = [keys[int(i)] for i in sorted(rng.choice(len(keys), spec.queries, replace=False))]
    rng.shuffle(asked_keys)  # asked in a random order, answered in that order
    asked = [(k, v) for k in asked_keys for v in values[keys.index(k)]]
    distractors = [(k, v) for k, vs in zip(keys, values) if k not in asked_keys for v in vs]
    kind = KINDS[spec.value]
    if spec.queries > 1:
        names = ", ".join(asked_keys[:-1]) + " and " + asked_keys[-1]
        question = ASK_MANY.format(plural=kind + "s", keys=names)
    elif spec.values > 1:
        question = ASK_ALL.format(plural=kind + "s", key=asked_keys[0])
    else:
        question = ASK_ONE.format(kind=kind, key=asked_keys[0])
    return NiahSample(task=task, kind=spec.value, asked=asked, distractors=distractors, question=question,
                      expected=[v for _, v in asked])


def answer_text(sample: NiahSample) -> str:
    return " " + ", ".join(sample.expected)


class NiahBuilder:
    """Prompts of one tokenizer, exact in length, with the asked-for needles at the requested depth."""

    def __init__(self, tokenizer: Tokenizer, cfg: NiahConfig) -> None:
        self.tok, self.cfg = tokenizer, cfg
        self.specs = task_specs(cfg)

    def sample(self, rng: np.random.Generator, task: str) -> NiahSample:
        if task not in self.specs:
            raise ValueError(f"niah task {task!r} is unknown; allowed: {list(NIAH_TASKS)}")
        return make_sample(rng, task, self.specs[task], digits=self.cfg.number_digits)

    def _needles(self, sample: NiahSample, pairs: list[tuple[str, str]]) -> str:
        return "".join(NEEDLE.format(kind=KINDS[sample.kind], key=k, value=v) for k, v in pairs)

    def build(self, rng: np.random.Generator, sample: NiahSample, *, length: int, depth: float,
              haystack: Haystack, index: int) -> NiahPrompt:
        """The prompt of `sample` in exactly `length` tokens; rng places the distractor needles."""
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"niah depth={depth} is outside [0, 1]; 0 puts the needles first, 1 last")
        intro = self.tok.encode(INTRO.format(plural=KINDS[sample.kind] + "s"))
        block = self.tok.encode(self._needles(sample, sample.asked))
        others = [self.tok.encode(self._needles(sample, [p])) for p in sample.distractors]
        question = self.tok.encode(sample.question)
        overhead = len(intro) + len(block) + sum(len(o) for o in others) + len(question)
        n_hay = length - overhead
        if n_hay < 0:
            raise ValueError(f"niah length L={length} is too short for a {sample.task} prompt: its intro, needles and "
                             f"question alone take {overhead} tokens with this tokenizer; need L >= {overhead}")
        before = int(round(depth * n_hay))
        hay = haystack.tokens(index, n_hay)
        # Distractors at uniform haystack positions; at the block's own position they go in front of it.
        cuts = sorted((int(c), i) for i, c in enumerate(rng.integers(0, n_hay + 1, len(others))))
        inserts = sorted([(c, 0, i) for c, i in cuts] + [(before, 1, -1)])
        ids, prev, start = list(intro), 0, -1
        for cut, is_block, i in inserts:
            ids += hay[prev:cut]
            prev = cut
            if is_block:
                start = len(ids)
                ids += block
            else:
                ids += others[i]
        ids += hay[prev:] + question
        assert len(ids) == length and start >= 0
        return NiahPrompt(ids=ids, answer_ids=self.tok.encode(answer_text(sample)), sample=sample, depth=depth,
                          needle_start=start, needle_tokens=len(block), n_hay=n_hay, hay_before=before)

    def min_length(self, task: str) -> int:
        """Tokens a prompt of `task` needs besides haystack (for the longest values this generator writes)."""
        spec = self.specs[task]
        key = max(ADJECTIVES, key=len) + "-" + max(NOUNS, key=len)
        longest = {"number": "9" * self.cfg.number_digits, "word": key,
                   "uuid": "ffffffff-ffff-4fff-bfff-ffffffffffff"}[spec.value]
        kind = KINDS[spec.value]
        needle = len(self.tok.encode(NEEDLE.format(kind=kind, key=key, value=longest)))
        asks = [ASK_ONE.format(kind=kind, key=key), ASK_ALL.format(plural=kind + "s", key=key),
                ASK_MANY.format(plural=kind + "s", keys=", ".join([key] * max(1, spec.queries - 1)) + " and " + key)]
        return (len(self.tok.encode(INTRO.format(plural=kind + "s"))) + spec.keys * spec.values * needle
                + max(len(self.tok.encode(a)) for a in asks))

    def training_example(self, rng: np.random.Generator, *, seq_len: int, eos_id: int,
                         haystack: Haystack) -> TaskExample:
        """A prompt of a random configured task at a uniform random depth; prompt + answer + EOS = seq_len + 1."""
        task = self.cfg.tasks[int(rng.integers(len(self.cfg.tasks)))]
        sample = self.sample(rng, task)
        answer = self.tok.encode(answer_text(sample))
        prompt = self.build(rng, sample, length=seq_len - len(answer), depth=float(rng.random()), haystack=haystack,
                            index=int(rng.integers(1 << 30)))
        return TaskExample(ids=prompt.ids + answer + [eos_id], answer_start=len(prompt.ids))


def read_values(text: str, kind: str) -> list[str]:
    """Every whole value of `kind` in a generated answer, in order (words and UUIDs lower-cased)."""
    found = _PATTERNS[kind].findall(text)
    return found if kind == "number" else [v.lower() for v in found]


def score_niah(text: str, expected: list[str], kind: str) -> float:
    """The fraction of the expected values that the answer holds exactly (1.0 / 0.0 for one value)."""
    if not expected:
        raise ValueError("score_niah needs at least one expected value")
    got = set(read_values(text, kind))
    return sum((v if kind == "number" else v.lower()) in got for v in expected) / len(expected)


__all__ = ["ADJECTIVES", "ASK_ALL", "ASK_MANY", "ASK_ONE", "INTRO", "NEEDLE", "NOUNS", "FillerHaystack", "Haystack",
           "NiahBuilder", "NiahPrompt", "NiahSample", "NiahSpec", "TextHaystack", "answer_text", "make_sample",
           "random_value", "read_values", "score_niah", "task_specs"]
