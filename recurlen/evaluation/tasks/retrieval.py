"""The retrieval verdict: does a model find the key at a prompt length, read on a Wilson interval over its trials.

    by_length = retrieval_by_length(passkey_result)        # each length's trials pooled over the depths
    cell = by_length[0]; cell.verdict                      # "retrieves" / "loses retrieval" / "undecided"
    reach(by_length)                                       # the longest length up to which every length retrieves

A length's trials are every (depth, key) trial at that length, each outcome 1 (the key) or 0 as the passkey
evaluation recorded it (results.json: cells[].outcomes). The 95% Wilson score interval of their mean
(recurlen.diagnostics.intervals.binomial_interval) decides:

    retrieves        its lower end is at or above RETRIEVAL_BAR: the model finds the key more often than not
    loses retrieval  its upper end is below RETRIEVAL_BAR
    undecided        it straddles the bar: more trials would decide it

Pooling the depths makes the interval one of the mean accuracy over the depth grid: the trials are independent
Bernoulli draws whose chance may differ by depth, and a binomial interval on them is, if anything, wide for that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from recurlen.diagnostics.intervals import LEVEL, binomial_interval

RETRIEVAL_BAR = 0.5
"""Accuracy a model must clear at a length (the interval's lower end) to retrieve there; below it (the upper end),
it loses retrieval. Chance is ~0 for a 5-digit key."""
VERDICTS = ("retrieves", "loses retrieval", "undecided")


@dataclass(frozen=True)
class RetrievalCell:
    """One prompt length's trials, pooled over the depths, and what their interval allows."""

    length: int
    correct: int
    trials: int
    interval: tuple[float, float]
    verdict: str

    @property
    def accuracy(self) -> float:
        return self.correct / self.trials

    def text(self) -> str:
        lo, hi = self.interval
        return f"{self.accuracy:.2f} [{lo:.2f}, {hi:.2f}]"

    def to_dict(self) -> dict:
        return {**asdict(self), "accuracy": self.accuracy, "interval": list(self.interval), "level": LEVEL}


def verdict(correct: int, trials: int, *, bar: float = RETRIEVAL_BAR) -> tuple[tuple[float, float], str]:
    """The Wilson interval of correct / trials and its verdict against `bar`."""
    if not 0.0 < bar < 1.0:
        raise ValueError(f"retrieval bar must be in (0, 1); got {bar!r}")
    lo, hi = binomial_interval(correct, trials)
    return (lo, hi), "retrieves" if lo >= bar else "loses retrieval" if hi < bar else "undecided"


def cell_outcomes(cell: dict) -> list[int]:
    """A results.json cell's trial outcomes; a cell written before outcomes were kept is refused (its count alone
    cannot be recomputed from trials)."""
    outcomes = cell.get("outcomes")
    if outcomes is None:
        raise ValueError(f"passkey cell at length {cell.get('length')} depth {cell.get('depth')} keeps no per-trial "
                         "outcomes (results of an older recurlen): evaluate it again")
    if len(outcomes) != cell["trials"] or sum(outcomes) != cell["correct"]:
        raise ValueError(f"passkey cell at length {cell['length']} depth {cell['depth']}: {len(outcomes)} outcomes "
                         f"summing to {sum(outcomes)} disagree with trials={cell['trials']} correct={cell['correct']}")
    return [int(x) for x in outcomes]


def retrieval_by_length(result: dict, *, bar: float = RETRIEVAL_BAR) -> list[RetrievalCell]:
    """Each evaluated length of a passkey result (results.json, or an entry of its `fixes`), ascending, with the
    trials of every depth pooled."""
    pooled: dict[int, list[int]] = {}
    for cell in result["cells"]:
        pooled.setdefault(int(cell["length"]), []).extend(cell_outcomes(cell))
    out = []
    for length in sorted(pooled):
        outcomes = pooled[length]
        interval, word = verdict(sum(outcomes), len(outcomes), bar=bar)
        out.append(RetrievalCell(length, sum(outcomes), len(outcomes), interval, word))
    return out


def reach(cells: Sequence[RetrievalCell]) -> int | None:
    """The longest length up to which every evaluated length retrieves (None: it does not retrieve at the first)."""
    longest = None
    for c in sorted(cells, key=lambda c: c.length):
        if c.verdict != "retrieves":
            break
        longest = c.length
    return longest


def lost_where_base_retrieves(cells: Sequence[RetrievalCell], base: Sequence[RetrievalCell]) -> list[int]:
    """The lengths where the base retrieves and this model loses retrieval (decided both ways, not undecided)."""
    base_retrieves = {c.length for c in base if c.verdict == "retrieves"}
    return [c.length for c in cells if c.length in base_retrieves and c.verdict == "loses retrieval"]


__all__ = ["RETRIEVAL_BAR", "VERDICTS", "RetrievalCell", "cell_outcomes", "lost_where_base_retrieves", "reach",
           "retrieval_by_length", "verdict"]
