"""95% intervals for the numbers a verdict rests on, and the verdict an interval allows.

    lo, hi = paired_bootstrap(full_NK - reset_NK, seed=0)         # per bin: mean full - reset over sequences
    lo, hi = ratio_bootstrap(run_ctx_N, base_ctx_N, seed=0)        # in-context cost: mean(run) / mean(base) - 1
    lo, hi = binomial_interval(successes=7, trials=8)              # retrieval accuracy (Wilson score interval)
    v = decide(mean, lo, hi, n=64, fail_bar=0.3, hold_bar=0.05)    # fails / holds / between / undecided

Why a paired bootstrap over sequences: a held-out sequence is the unit that was sampled. Its full and reset
scores are measured on the same tokens, so their difference removes the sequence's own difficulty; resampling
sequences (never tokens: the tokens of one sequence are strongly correlated) keeps each pair together. The
percentile interval of B resampled means needs no normality of the per-sequence differences, which are skewed for
a model that fails on a few sequences. The resampling is seeded and the seed is recorded beside the interval, so
a results file reproduces its intervals bit for bit.

Legend: N sequences, K bins, B bootstrap resamples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
"""Two-sided coverage of every interval recurlen prints."""
RESAMPLES = 2000
"""Bootstrap resamples: the percentile ends move by well under 0.005 nats between seeds at the demo's sizes."""
BOOTSTRAP_SEED = 0
"""The default resampling seed (recorded with every interval)."""


def _z(level: float) -> float:
    """The two-sided normal quantile of `level` (1.96 for 0.95)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"interval level must be in (0, 1); got {level!r}")
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def _percentiles(samples_BK: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    alpha = (1.0 - level) / 2.0
    return np.quantile(samples_BK, alpha, axis=0), np.quantile(samples_BK, 1.0 - alpha, axis=0)


def _resample_indices(n: int, *, seed: int, resamples: int) -> np.ndarray:
    if n < 2:
        raise ValueError(f"a bootstrap interval needs at least 2 sequences; got {n}")
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def paired_bootstrap(diff_NK: np.ndarray | Sequence, *, seed: int = BOOTSTRAP_SEED, resamples: int = RESAMPLES,
                     level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of the mean over sequences of per-sequence differences (N,) or (N, K), per column.

    One index draw serves every column, so the bins of one resample come from the same sequences (a claim about
    several bins at once reads one consistent resample)."""
    diff = np.asarray(diff_NK, dtype=np.float64)
    squeeze = diff.ndim == 1
    diff_NK = diff[:, None] if squeeze else diff
    idx_BN = _resample_indices(diff_NK.shape[0], seed=seed, resamples=resamples)
    means_BK = diff_NK[idx_BN].mean(axis=1)
    lo, hi = _percentiles(means_BK, level)
    return (lo[0], hi[0]) if squeeze else (lo, hi)


def ratio_bootstrap(run_N: np.ndarray | Sequence, base_N: np.ndarray | Sequence, *, paired: bool = True,
                    seed: int = BOOTSTRAP_SEED, resamples: int = RESAMPLES,
                    level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of mean(run) / mean(base) - 1: the in-context cost of a run against its base. paired: both
    were scored on the same sequences, resampled with the same indices (a sequence's difficulty cancels); else each
    is resampled on its own."""
    run, base = np.asarray(run_N, dtype=np.float64), np.asarray(base_N, dtype=np.float64)
    if run.ndim != 1 or base.ndim != 1 or (paired and run.shape != base.shape):
        raise ValueError(f"ratio_bootstrap needs 1-D arrays (of the same sequences when paired); got {run.shape} and "
                         f"{base.shape}")
    idx_BN = _resample_indices(run.shape[0], seed=seed, resamples=resamples)
    other_BN = idx_BN if paired else \
        np.random.default_rng([seed, 1]).integers(0, base.shape[0], size=(resamples, base.shape[0]))
    ratios_B = run[idx_BN].mean(axis=1) / base[other_BN].mean(axis=1) - 1.0
    lo, hi = _percentiles(ratios_B[:, None], level)
    return float(lo[0]), float(hi[0])


def binomial_interval(successes: int, trials: int, *, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a proportion: unlike the normal approximation it stays inside [0, 1] and is not
    empty at 0 / n or n / n, which is where retrieval accuracies sit."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"binomial interval needs 0 <= successes <= trials, trials >= 1; got {successes} of "
                         f"{trials}")
    z = _z(level)
    p = successes / trials
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def t_interval(values: Sequence[float], *, level: float = LEVEL) -> tuple[float, float]:
    """Student-t interval of the mean of a few values (the across-seed interval: 3 seeds have 2 degrees of freedom,
    a wide interval, as it should be)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"an across-seed interval needs at least 2 values; got {x.size}")
    q = _t_quantile(level, x.size - 1)
    half = q * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)


def _t_quantile(level: float, dof: int) -> float:
    """Two-sided Student-t quantile, by bisection on the t CDF (recurlen does not depend on scipy)."""
    target = 0.5 + level / 2.0
    lo, hi = 0.0, 1000.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if _t_cdf(mid, dof) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def _t_cdf(t: float, dof: int) -> float:
    # Simpson integration of the t density from 0 to t: smooth, and 2000 panels are exact to ~1e-10 here.
    def density(x: float) -> float:
        return math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi) \
            * (1 + x * x / dof) ** (-(dof + 1) / 2)

    panels = 2000
    h = t / panels
    total = density(0.0) + density(t)
    for i in range(1, panels):
        total += (4 if i % 2 else 2) * density(i * h)
    return 0.5 + total * h / 3


@dataclass(frozen=True)
class Decision:
    """What an interval allows one to say against two bars (fail_bar >= hold_bar)."""

    outcome: str
    """"fails" (the interval's lower end reaches fail_bar), "holds" (its upper end stays at or under hold_bar),
    "between" (wholly between the bars: harm, but under the failure bar) or "undecided" (it straddles a bar)."""
    needed_n: int | None
    """Undecided only: about how many sequences would decide it, were the mean and spread to stay as measured
    (the interval narrows as 1 / sqrt(n)); None when decided, or when the mean sits on the bar."""
    bar: float | None
    """Undecided only: the bar the interval straddles."""

    def to_dict(self) -> dict:
        return asdict(self)


def decide(mean: float, lo: float, hi: float, *, n: int, fail_bar: float, hold_bar: float) -> Decision:
    """The verdict an interval allows: fails where lo >= fail_bar, holds where hi <= hold_bar, between where the
    interval lies strictly between the bars, otherwise undecided at n, with the n that would decide it."""
    if fail_bar < hold_bar:
        raise ValueError(f"fail_bar ({fail_bar}) must be at least hold_bar ({hold_bar})")
    if not all(math.isfinite(v) for v in (mean, lo, hi)):
        return Decision("undecided", None, None)
    if lo >= fail_bar:
        return Decision("fails", None, None)
    if hi <= hold_bar:
        return Decision("holds", None, None)
    if lo > hold_bar and hi < fail_bar:
        return Decision("between", None, None)
    # The interval straddles the bar nearest its mean: the one more sequences would settle.
    bar = fail_bar if abs(mean - fail_bar) <= abs(mean - hold_bar) else hold_bar
    return Decision("undecided", sequences_to_decide(mean, (hi - lo) / 2.0, bar, n=n), bar)


def sequences_to_decide(mean: float, half_width: float, bar: float, *, n: int) -> int | None:
    """About how many sequences would shrink an interval of this half-width at n clear of the bar, were the mean
    and the spread to stay as measured (the width falls as 1 / sqrt(n)); None when the mean sits on the bar."""
    gap = abs(mean - bar)
    if gap == 0.0 or not math.isfinite(gap):
        return None
    # 1e-9: (0.08 / 0.02)^2 is 16.000000000000004 in floating point, not a 17th sequence.
    return max(n + 1, math.ceil(n * (half_width / gap) ** 2 - 1e-9))


__all__ = ["BOOTSTRAP_SEED", "LEVEL", "RESAMPLES", "Decision", "binomial_interval", "decide", "paired_bootstrap",
           "ratio_bootstrap", "sequences_to_decide", "t_interval"]
