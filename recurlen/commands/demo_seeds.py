"""`recurlen demo seeds=N`: the demo's whole pipeline under N seeds, and what the seeds agree on.

    roots = seed_roots(Path("runs/demo"), 3)      # runs/demo, runs/demo/seeds/1, runs/demo/seeds/2
    summary = seeds_summary(roots, checks=demo_checks)
    lines = seeds_lines(summary)                    # the report's "Across seeds" section

Seed 0 is the demo as it always was, in its run root, so that `seeds=1` (the default) changes nothing and a demo run
before seeds existed is seed 0 of a later `seeds=3`. Seed k > 0 runs in <run root>/seeds/k with `seed=k data.seed=k`
on every training stage: the initialisation, the order of the training documents and the interventions'
randomness. Every seed is evaluated on the same held-out sequences: the held-out split is a hash of the document
ids and the evaluation takes the first long held-out documents, so no seed moves them (the results' sequence digests
say so, and the summary refuses seeds whose digests differ).

What the seeds add to one seed's 95% intervals (which cover the held-out sample, not the training): each verdict as
a count over seeds ("fails 3/3"), each check's outcomes over seeds, and per cell the mean over seeds with its
Student-t interval (N - 1 degrees of freedom: wide for 3 seeds, as it should be).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from recurlen.diagnostics.intervals import t_interval
from recurlen.evaluation.evidence import WORDS, bins_of, fmt_interval, in_context_cost, run_verdict
from recurlen.util.errors import UserError

SEEDS_DIR = "seeds"
CELL_BINS = ("[4T,8T)", "[8T,16T)", "[16T,32T)")
"""The far bins the across-seed table gives (those the evaluation reached)."""


def seed_roots(root: Path, seeds: int) -> list[Path]:
    """Run roots of seeds 0 .. seeds - 1: seed 0 is the root itself."""
    return [root if k == 0 else root / SEEDS_DIR / str(k) for k in range(seeds)]


def seed_overrides(k: int) -> list[str]:
    """The training stages' settings of seed k (none for seed 0: the demo as it always was)."""
    return [] if k == 0 else [f"seed={k}", f"data.seed={k}"]


def _runs(root: Path) -> dict[str, dict]:
    path = root / "eval" / "results.json"
    if not path.is_file():
        raise UserError(f"seed run root {root} has no evaluation ({path}); rerun the demo with the same seeds= to "
                        "finish it")
    return {r["label"]: r for r in json.loads(path.read_text())["runs"]}


def seeds_summary(roots: Sequence[Path], *, checks: Callable[[Sequence[dict]], list[dict]]) -> dict:
    """Per run label: each seed's verdict and far-bin full - reset, the verdict counts, each cell's mean over seeds
    with its t interval, the in-context cost likewise; per check: its status at each seed."""
    per_seed = [_runs(Path(r)) for r in roots]
    digests = {(r.get("positionwise") or {}).get("sequences_digest") for runs in per_seed for r in runs.values()}
    if len(digests - {None}) > 1:
        raise UserError("the seeds' evaluations scored different held-out sequences (their digests differ): their "
                        "verdicts cannot be compared; evaluate every seed with the same eval settings")
    labels = [label for label in per_seed[0] if all(label in runs for runs in per_seed)]
    base_label = next((b for b in ("base", "baseline") if b in labels), None)
    out: dict = {"seeds": len(roots), "roots": [str(r) for r in roots], "runs": {}, "checks": {}}
    for label in labels:
        runs = [runs[label] for runs in per_seed]
        verdicts = [run_verdict(r) for r in runs]
        cells = {}
        for name in CELL_BINS:
            values = [_bin(r, name) for r in runs]
            if all(v is not None for v in values):
                cells[name] = _across(values)
        cost = None
        if base_label and label != base_label:
            costs = [in_context_cost(r, runs_k[base_label]) for r, runs_k in zip(runs, per_seed)]
            if all(c is not None for c in costs):
                cost = _across([c.value for c in costs])
        out["runs"][label] = {"outcomes": [v.get("outcome") for v in verdicts],
                              "counts": dict(Counter(v.get("outcome") for v in verdicts)),
                              "cells": cells, "in_context_cost": cost}
    for k, runs in enumerate(per_seed):
        for c in checks(list(runs.values())):
            out["checks"].setdefault(c["check"], [None] * len(per_seed))[k] = c["status"]
    return out


def _bin(run: dict, name: str) -> float | None:
    row = next((r for r in bins_of(run) if r["name"] == name), None)
    return None if row is None else row.get("full_minus_reset")


def _across(values: Sequence[float]) -> dict:
    return {"values": list(values), "mean": sum(values) / len(values),
            "interval": list(t_interval(values)) if len(values) > 1 else None}


def _count(outcomes: Sequence[str | None]) -> str:
    n = len(outcomes)
    counts = Counter(WORDS.get(o, o) if o else "not measured" for o in outcomes)
    return ", ".join(f"{o} {c}/{n}" for o, c in counts.most_common())


def seeds_lines(summary: dict) -> list[str]:
    """The report's "Across seeds" section."""
    n = summary["seeds"]
    lines = ["## Across seeds", "",
             f"{n} seeds (initialisation, training data order and the interventions' randomness; seed 0 is "
             f"{summary['roots'][0]}, seed k is {summary['roots'][0]}/seeds/k), each evaluated on the same held-out "
             "sequences. Verdicts as counts over seeds (each seed's verdict reads its own 95% intervals over the "
             "held-out sequences); each cell is the mean over seeds with its 95% Student-t interval over seeds "
             f"({n - 1} degrees of freedom), then each seed's value. The sections after this one are seed 0's.", "",
             "| run | verdicts | " + " | ".join(f"full - reset {b}" for b in CELL_BINS) + " | in-context cost |",
             "|---" * (3 + len(CELL_BINS)) + "|"]
    for label, r in summary["runs"].items():
        cells = []
        for b in CELL_BINS:
            c = r["cells"].get(b)
            cells.append("-" if c is None else _cell(c, "+.3f"))
        cost = r["in_context_cost"]
        lines.append(f"| {label} | {_count(r['outcomes'])} | " + " | ".join(cells) + " | "
                     + ("-" if cost is None else _cell(cost, "+.1%")) + " |")
    if summary["checks"]:
        lines += ["", "| check | outcomes over seeds |", "|---|---|"]
        lines += [f"| {check} | {_count([s.upper() if s else None for s in statuses])} |"
                  for check, statuses in summary["checks"].items()]
    return lines + [""]


def _cell(c: dict, spec: str) -> str:
    ci = fmt_interval(c["interval"], spec)
    return f"{format(c['mean'], spec)} {ci} ({' / '.join(format(v, spec) for v in c['values'])})"


__all__ = ["SEEDS_DIR", "seed_overrides", "seed_roots", "seeds_lines", "seeds_summary"]
