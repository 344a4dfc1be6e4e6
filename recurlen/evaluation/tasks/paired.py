"""Paired comparison of two interventions over the same seeds: is the difference more than seed noise?

Seeds pair the runs: seed s of `none` and seed s of `state_passing` start from the same initial weights and see
the same data order, so the per-seed difference removes what the seed alone does. Two tests of that difference:

  t test        Student's t on the per-seed differences (n - 1 degrees of freedom), two-sided
  sign flips    the exact permutation test: every assignment of signs to the differences (2^n of them), the
                share whose |mean| is at least the observed one, two-sided. It assumes nothing about the shape of
                the differences, but with n seeds it cannot go below 2 / 2^n (0.0625 for 5 seeds)

A difference is called significant at p < 0.05 by the t test; the sign-flip p is reported beside it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

ALPHA = 0.05


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must lie in [0, 1]; got {x}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):  # the continued fraction converges fast on this side
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom."""
    if df < 1:
        raise ValueError(f"a t test needs at least 1 degree of freedom; got {df}")
    if math.isinf(t):
        return 0.0
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Exact two-sided permutation p of the mean of paired differences (all 2^n sign assignments)."""
    observed = abs(sum(diffs))
    flips = list(itertools.product((1.0, -1.0), repeat=len(diffs)))
    # A tolerance: sums that are equal in exact arithmetic may differ in the last bit.
    hits = sum(abs(sum(s * d for s, d in zip(signs, diffs))) >= observed - 1e-12 for signs in flips)
    return hits / len(flips)


def paired_test(treated: Sequence[float], control: Sequence[float]) -> dict:
    """Compare per-seed values (treated[i] and control[i] share seed i): mean difference, its std, t, both ps."""
    if len(treated) != len(control):
        raise ValueError(f"paired values need one of each per seed; got {len(treated)} and {len(control)}")
    diffs = [float(a) - float(b) for a, b in zip(treated, control)]
    n = len(diffs)
    mean = sum(diffs) / n if n else float("nan")
    out = {"n": n, "mean_difference": mean, "std_difference": None, "t": None, "p_t": None,
           "p_sign_flip": sign_flip_p(diffs) if n else None, "significant": False}
    if n < 2:
        return out
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    t = mean / (std / math.sqrt(n)) if std > 0 else (math.copysign(math.inf, mean) if mean else 0.0)
    p = t_two_sided_p(t, n - 1)
    out.update(std_difference=std, t=t, p_t=p, significant=p < ALPHA)
    return out


def describe(test: dict) -> str:
    """One line: `+0.368 (t = 2.10, p = 0.104, sign flips p = 0.125, n = 5): not significant at 0.05`."""
    if test["t"] is None:
        return f"{test['mean_difference']:+.3f} (n = {test['n']}: too few seeds for a test)"
    verdict = "significant" if test["significant"] else "not significant"
    return (f"{test['mean_difference']:+.3f} (t = {test['t']:.2f}, p = {test['p_t']:.3f}, sign flips p = "
            f"{test['p_sign_flip']:.3f}, n = {test['n']}): {verdict} at {ALPHA:g}")


__all__ = ["ALPHA", "describe", "incomplete_beta", "paired_test", "sign_flip_p", "t_two_sided_p"]
