"""Verdicts that carry their sample: every full - reset cell and in-context cost read with its 95% interval.

    ev = bin_evidence(row, n)                  # one bin of results.json: mean, interval, what it allows
    v = run_verdict(run)                       # fails / holds / between / undecided for one evaluated run
    cost = in_context_cost(run, base)          # [0,T) loss against the base's, paired by sequence where it can be
    c = interval_check(text, value, interval, ">=", 0.3, n=64)   # a check that passes, misses or is undecided

The bars (docs/evaluation.md, "Reading a verdict"):
  fails    the interval's lower end reaches FAILS_MARGIN (+0.3 nats/token) in a bin past T
  holds    the upper ends stay at or under GENERALIZES_TOL (+0.05) in every bin past T (an intersection-union
           test: each bin at 95% makes the joint claim at 95% too, no correction needed)
  between  every bin decided, none fails, not all hold: the longer context costs something, under the bar
  undecided  some bin's interval straddles a bar and the run's verdict depends on which side it falls: the verdict
           says at how many sequences, and about how many would decide it (as many as would shrink the straddling
           interval clear of its bar, were mean and spread to stay as measured)
A run whose results keep no per-sequence scores (an older recurlen, or one sequence) is judged on its point values,
and its verdict says so. Values compare as the report shows them (3 decimals).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from recurlen.diagnostics.compare import FLAT_TOL
from recurlen.diagnostics.intervals import BOOTSTRAP_SEED, decide, ratio_bootstrap, sequences_to_decide

GENERALIZES_TOL = FLAT_TOL
"""full - reset at most this (nats) counts as no harm from the longer context."""
FAILS_MARGIN = 0.3
"""full - reset at least this (nats, as shown) counts as a clear failure."""
IN_CONTEXT_REL_TOL = 0.08
"""A post-training or a fix keeps the [0,T) loss within this fraction of its base's."""
USES_CONTEXT_REL = 0.1
"""A run uses its context if its loss in [T,2T) is at least this fraction below the unigram loss."""
SHOWN_DECIMALS = 3
OUTCOMES = ("fails", "between", "holds")
WORDS = {"fails": "fails", "between": "mostly holds", "holds": "holds"}
"""How a verdict's outcome reads in prose and in counts over seeds."""


def shown(value: float | None) -> float | None:
    """The value as the report prints it (rounded to SHOWN_DECIMALS), the one a reader checks the verdict against."""
    return None if value is None else float(format(value, f".{SHOWN_DECIMALS}f"))


def bins_of(run: dict) -> list[dict]:
    return (run.get("positionwise") or {}).get("bins") or []


def num_sequences(run: dict) -> int | None:
    return (run.get("positionwise") or {}).get("num_sequences")


def fmt_interval(interval: Sequence[float] | None, spec: str = "+.3f") -> str:
    return "" if not interval else f"[{format(interval[0], spec)}, {format(interval[1], spec)}]"


@dataclass(frozen=True)
class BinEvidence:
    """One bin's full - reset, its interval, and the outcomes it leaves open."""

    name: str
    mean: float
    interval: tuple[float, float] | None
    possible: tuple[str, ...]
    """The run outcomes this bin allows (OUTCOMES order): one where the bin is decided."""
    needed_n: int | None
    bar: float | None

    def text(self) -> str:
        ci = fmt_interval(self.interval)
        return f"{self.mean:+.3f} {ci} in {self.name}" if ci else f"{self.mean:+.3f} in {self.name}"


def bin_evidence(row: dict, n: int | None) -> BinEvidence:
    """What one bin's full - reset allows: the bars against the interval's ends as shown (the point value without
    an interval)."""
    mean = row["full_minus_reset"]
    ci = row.get("full_minus_reset_ci")
    if ci is None:
        lo = hi = shown(mean)
    else:
        lo, hi = shown(ci[0]), shown(ci[1])
    possible = tuple(o for o, ok in (("fails", hi >= FAILS_MARGIN), ("between", hi > GENERALIZES_TOL and
                                                                     lo < FAILS_MARGIN),
                                     ("holds", lo <= GENERALIZES_TOL)) if ok)
    needed = bar = None
    if len(possible) > 1 and ci is not None and n:
        d = decide(mean, lo, hi, n=n, fail_bar=FAILS_MARGIN, hold_bar=GENERALIZES_TOL)
        needed, bar = d.needed_n, d.bar
    return BinEvidence(row["name"], mean, None if ci is None else (ci[0], ci[1]), possible, needed, bar)


def combine(evidence: Sequence[BinEvidence]) -> tuple[str, ...]:
    """The run outcomes the bins leave open: fails if some bin may fail; holds if every bin may hold; between if no
    bin surely fails and some bin may do more than hold."""
    out = []
    if any("fails" in e.possible for e in evidence):
        out.append("fails")
    # between: no bin fails (each has another option) and at least one bin lies between the bars.
    if all(set(e.possible) - {"fails"} for e in evidence) and any("between" in e.possible for e in evidence):
        out.append("between")
    if all("holds" in e.possible for e in evidence):
        out.append("holds")
    return tuple(out)


def uses_context(run: dict) -> tuple[bool | None, str]:
    """Is the loss in [T,2T) clearly below the no-context (unigram) loss of the same held-out tokens?

    None when the results do not say (no unigram_loss, e.g. results of an older recurlen)."""
    T = run.get("train_len") or (run.get("positionwise") or {}).get("train_len")
    row = next((r for r in bins_of(run) if T and r["start"] == T), None)
    unigram = run.get("unigram_loss")
    if row is None or row.get("loss") is None or not unigram:
        return None, ""
    uses = row["loss"] <= (1.0 - USES_CONTEXT_REL) * unigram
    return uses, (f"loss in {row['name']} {row['loss']:.3f} vs {unigram:.3f} for the held-out tokens' unigram "
                  f"frequencies (no context)")


def far_rows(run: dict, *, up_to_multiple: float | None = None) -> list[dict]:
    """The bins past T with a reset control, up to a multiple of T when given."""
    T = run.get("train_len") or (run.get("positionwise") or {}).get("train_len")
    rows = [r for r in bins_of(run) if r.get("full_minus_reset") is not None and T and r["start"] >= T]
    if up_to_multiple is not None:
        rows = [r for r in rows if r["end"] / T <= up_to_multiple + 1e-9]
    return rows


def run_verdict(run: dict, *, up_to_multiple: float | None = None) -> dict:
    """Does the run use its context at all? If so, what do full - reset's intervals past T (up to a multiple of T)
    allow: fails, holds, between, or undecided at n sequences?"""
    label = run["label"]
    uses, evidence_text = uses_context(run)
    if uses is False:
        # full - reset is ~0 for a model that ignores context: it would pass as "length-generalizes".
        return {"label": label, "measured": True, "uses_context": False, "generalizes": False, "fails": False,
                "outcome": "no context", "text": f"{label}: does not use context ({evidence_text}; it must be at "
                                                 f"least {USES_CONTEXT_REL:.0%} lower): full - reset says nothing here"}
    rows = far_rows(run, up_to_multiple=up_to_multiple)
    if not rows:
        return {"label": label, "measured": False, "text": f"{label}: no reset control was run"}
    n = num_sequences(run)
    ev = [bin_evidence(r, n) for r in rows]
    possible = combine(ev)
    outcome = possible[0] if len(possible) == 1 else "undecided"
    worst = max(ev, key=lambda e: e.mean)
    has_ci = all(e.interval is not None for e in ev)
    sample = (f"95% intervals over {n} held-out sequences" if has_ci else
              f"point values: the results keep no per-sequence scores ({n or '?'} sequences)")
    span = rows[-1]["name"].split(",")[-1].rstrip(")")
    needed = max((e.needed_n for e in ev if len(e.possible) > 1 and e.needed_n), default=None)
    if outcome == "fails":
        first = next(e for e in ev if e.possible == ("fails",)) if any(e.possible == ("fails",) for e in ev) \
            else next(e for e in ev if "fails" in e.possible)
        text = f"{label}: FAILS past the training context: full - reset {first.text()} (worst {worst.text()}; {sample})"
    elif outcome == "holds":
        text = (f"{label}: length-generalizes up to {span} (full - reset <= +{GENERALIZES_TOL} in every bin"
                f"{', upper ends included' if has_ci else ''}; worst {worst.text()}; {sample})")
    elif outcome == "between":
        text = (f"{label}: mostly holds, but the longer context costs up to {worst.text()} nats (between +"
                f"{GENERALIZES_TOL} and +{FAILS_MARGIN}; {sample})")
    else:
        open_bins = [e for e in ev if len(e.possible) > 1]
        which = "; ".join(f"{e.text()} straddles {e.bar:+g}" if e.bar is not None else e.text() for e in open_bins)
        decide_at = f"; about {needed} sequences would decide it" if needed else ""
        text = (f"{label}: undecided at {n} sequences between {' and '.join(WORDS[o] for o in possible)}: "
                f"full - reset {which}{decide_at} ({sample})")
    return {"label": label, "measured": True, "uses_context": uses, "outcome": outcome, "possible": list(possible),
            "generalizes": outcome == "holds", "fails": outcome == "fails", "worst_bin": worst.name,
            "worst_full_minus_reset": worst.mean, "worst_interval": None if worst.interval is None
            else list(worst.interval), "num_sequences": n, "needed_sequences": needed if outcome == "undecided"
            else None, "text": text}


def in_context_loss(run: dict) -> float | None:
    rows = bins_of(run)
    return rows[0]["loss"] if rows else None


def _first_bin_losses(run: dict) -> np.ndarray | None:
    per = (run.get("positionwise") or {}).get("per_sequence") or {}
    loss = per.get("loss")
    if not loss or len(loss) < 2:
        return None
    return np.array([row[0] for row in loss], dtype=np.float64)


@dataclass(frozen=True)
class Cost:
    """The [0,T) loss of a run against its base's: mean(run) / mean(base) - 1, with its interval."""

    value: float
    interval: tuple[float, float] | None
    paired: bool
    """Both scored on the same sequences (equal digests): resampled in pairs; else each resampled on its own."""
    n: int | None

    def to_dict(self) -> dict:
        return asdict(self)


def in_context_cost(run: dict, base: dict, *, seed: int = BOOTSTRAP_SEED) -> Cost | None:
    """The in-context cost of a run against its base, with a 95% bootstrap interval where both keep per-sequence
    scores (paired when they were scored on the same sequences). None when either lacks a [0,T) loss."""
    ctx, base_ctx = in_context_loss(run), in_context_loss(base)
    if ctx is None or not base_ctx:
        return None
    value = ctx / base_ctx - 1.0
    a, b = _first_bin_losses(run), _first_bin_losses(base)
    if a is None or b is None:
        return Cost(value, None, False, num_sequences(run))
    digest = (run.get("positionwise") or {}).get("sequences_digest")
    paired = digest is not None and digest == (base.get("positionwise") or {}).get("sequences_digest")
    return Cost(value, ratio_bootstrap(a, b, paired=paired, seed=seed), paired, len(a))


CHECK_OPS = ("<=", "<", ">=", ">", "abs<=")


def interval_status(op: str, threshold: float, value: float | None,
                    interval: Sequence[float] | None) -> str:
    """'pass', 'miss' or 'undecided': the claim `value op threshold` against the interval's ends as shown (the value
    itself where there is no interval; None never passes)."""
    if op not in CHECK_OPS:
        raise ValueError(f"check op {op!r} is unknown; allowed: {list(CHECK_OPS)}")
    if value is None or not math.isfinite(value):
        return "miss"
    lo, hi = (shown(value), shown(value)) if interval is None else (shown(interval[0]), shown(interval[1]))
    if op in (">=", ">"):
        sure, never = (lo >= threshold, hi < threshold) if op == ">=" else (lo > threshold, hi <= threshold)
    elif op in ("<=", "<"):
        sure, never = (hi <= threshold, lo > threshold) if op == "<=" else (hi < threshold, lo >= threshold)
    else:
        sure, never = (lo >= -threshold and hi <= threshold), (lo > threshold or hi < -threshold)
    return "pass" if sure else "miss" if never else "undecided"


def interval_check(text: str, value: float | None, interval: Sequence[float] | None, op: str, threshold: float, *,
                   n: int | None = None) -> dict:
    """One row of a report's Checks, read on its interval: passes when the whole interval satisfies the claim,
    misses when none of it does, undecided otherwise (with n, the sample it was measured on)."""
    status = interval_status(op, threshold, value, interval)
    needed = None
    if status == "undecided" and interval is not None and n:
        bar = threshold if op != "abs<=" else math.copysign(threshold, value)
        needed = sequences_to_decide(value, (interval[1] - interval[0]) / 2.0, bar, n=n)
    return {"check": text, "value": value, "interval": None if interval is None else [float(x) for x in interval],
            "op": op, "threshold": threshold, "num_sequences": n, "status": status, "passed": status == "pass",
            "needed_sequences": needed}


def all_bins_check(text: str, rows: Sequence[dict], op: str, threshold: float, *, n: int | None = None,
                   key: str = "full_minus_reset") -> dict:
    """A check that every bin satisfies `op threshold`: it passes when every bin passes, misses when some bin
    misses, else is undecided; the row it shows is the one that decides it (a missing bin, else the bin nearest to
    missing), so that re-reading that row alone gives the same status."""
    checks = [interval_check(text, r.get(key), r.get(f"{key}_ci"), op, threshold, n=n) for r in rows]
    if not checks:
        return interval_check(text, None, None, op, threshold, n=n)
    def ends(c: dict) -> tuple[float, float]:
        return tuple(c["interval"]) if c["interval"] else (c["value"], c["value"])

    # Facing an upper bar (<=, <) a bin is nearer to missing the higher its interval reaches and surer to miss the
    # higher its lower end; facing a lower bar (>=, >) the other way round.
    upper_bar = op in ("<=", "<")
    missed = [c for c in checks if c["status"] == "miss"]
    if missed:
        return max(missed, key=lambda c: ends(c)[0] if upper_bar else -ends(c)[1])
    return max(checks, key=lambda c: ends(c)[1] if upper_bar else -ends(c)[0])


__all__ = ["CHECK_OPS", "FAILS_MARGIN", "GENERALIZES_TOL", "IN_CONTEXT_REL_TOL", "USES_CONTEXT_REL", "WORDS",
           "BinEvidence", "Cost", "all_bins_check", "bin_evidence", "bins_of", "combine", "far_rows", "fmt_interval",
           "in_context_cost", "in_context_loss", "interval_check", "interval_status", "num_sequences", "run_verdict",
           "shown", "uses_context"]
