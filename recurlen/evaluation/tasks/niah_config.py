"""The `task.niah` section: which needle-in-a-haystack tasks run, where the needles sit, what they hide in.

The tasks are recurlen's own, modelled on RULER's NIAH configurations (Hsieh et al., 2024, "RULER: What's the Real
Context Size of Your Long-Context Language Models?"); recurlen generates them offline (recurlen.evaluation.tasks.niah,
whose docstring says how each differs from RULER's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

NIAH_TASKS = ("single_number", "single_word", "single_uuid", "multikey", "multivalue", "multiquery")
"""single_*: one needle, its value a 7-digit number / a hyphenated word pair / a UUID; multikey: the needle among
distractor needles of other keys; multivalue: several needles of one key, every value asked for; multiquery:
several keys asked for at once."""
NIAH_HAYSTACKS = ("filler", "embedded", "heldout")


def _count(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"task.niah.{name}={value!r} is not allowed; need an integer >= {minimum}")


@dataclass
class NiahConfig:
    tasks: list[str] = field(default_factory=lambda: list(NIAH_TASKS))
    """Tasks evaluated (and mixed in the fine-tuning examples): any of single_number, single_word, single_uuid,
    multikey, multivalue, multiquery."""
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    """Where the asked-for needles sit: the fraction of the haystack's tokens before them (0 = first, 1 = last)."""
    haystack: str = "filler"
    """'filler' (the passkey sentences repeated, RULER's repeated-sentence haystack), 'embedded' (windows of the Python
    standard library's sources, where RULER uses essays) or 'heldout' (the evaluated run's own held-out text, its data
    config's validation split; fine-tuning examples then hide in 'embedded' windows: held-out text is never trained
    on). One haystack for every task: RULER's needle haystack (multikey_2/3) has no counterpart."""
    num_keys: int = 4
    """multikey and multiquery: keys with a needle in the prompt (multikey asks for one, multiquery for num_queries)."""
    num_values: int = 4
    """multivalue: needles (values) of the asked-for key; all must be recalled."""
    num_queries: int = 4
    """multiquery: keys asked for at once (at most num_keys)."""
    number_digits: int = 7
    """Digits of a number value (RULER: 7)."""
    max_new_tokens: int | None = None
    """Tokens generated per answer; None = the longest expected answer's length + 2."""

    def __post_init__(self) -> None:
        self.tasks = [str(t) for t in self.tasks]
        if not self.tasks:
            raise ValueError(f"task.niah.tasks is empty; allowed: {list(NIAH_TASKS)}")
        bad = [t for t in self.tasks if t not in NIAH_TASKS]
        if bad:
            raise ValueError(f"task.niah.tasks has {bad}; allowed: {list(NIAH_TASKS)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"task.niah.tasks repeats a task: {self.tasks}")
        if not self.depths:
            raise ValueError("task.niah.depths is empty; give at least one depth in [0, 1]")
        self.depths = [float(d) for d in self.depths]
        for d in self.depths:
            if not 0.0 <= d <= 1.0:
                raise ValueError(f"task.niah.depths has {d}; every depth must be in [0, 1]")
        if self.haystack not in NIAH_HAYSTACKS:
            raise ValueError(f"task.niah.haystack={self.haystack!r} is unknown; allowed: {list(NIAH_HAYSTACKS)}")
        _count("num_keys", self.num_keys, minimum=2)
        _count("num_values", self.num_values, minimum=2)
        _count("num_queries", self.num_queries, minimum=2)
        if self.num_queries > self.num_keys:
            raise ValueError(f"task.niah.num_queries={self.num_queries} exceeds num_keys={self.num_keys}: multiquery "
                             "asks only for keys that have a needle")
        _count("number_digits", self.number_digits, minimum=2)
        if self.max_new_tokens is not None:
            _count("max_new_tokens", self.max_new_tokens, minimum=1)


__all__ = ["NIAH_HAYSTACKS", "NIAH_TASKS", "NiahConfig"]
