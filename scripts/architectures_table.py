"""One Markdown table of every architecture's demo (docs/demo.md, "Seven architectures at a glance"), printed from
the demos' own results.json files, so that every number in it comes from this command.

    .venv/bin/python scripts/architectures_table.py [--quick ARCH ...] [--run ARCH=RUN_ROOT ...]
        [--control ARCH=RUN_ROOT ...] [--root DIR]

One row per architecture that has a demo (recurlen.commands.demo.demo_architectures(), the registry's order), read
from the run root `recurlen demo arch=ARCH` writes (runs/demo, runs/demo-<arch>); `--quick ARCH` reads that
architecture's quick demo (runs/demo-<arch>-quick, evaluated to 16T) instead, `--run ARCH=RUN_ROOT` a demo run with
another run_root (a setting searched with `recurlen demo ... run_root=...`); the row names the run root it read and
says when it is a quick demo (its demo_config.yaml). A run root
without results.json gives a row that says so, never numbers from elsewhere. Each row:
  - setting: the fields of the demo's model (its pre-training's config.yaml) that differ from the model table's row
    of the same name: the model-organism setting (slow-decay init, clamp) the demo adds to the published shape;
  - base, none, fitted_noise, state_passing, tbptt: full - reset in [4T,8T) / [8T,16T) / [16T,32T) (nats/token, as
    the report shows them), and for the post-trainings the [0,T) loss's change against the base's (in-context cost);
  - verdict: the base fails (full - reset >= the report's FAILS_MARGIN in [8T,16T)), fails past 16T (below that bar
    in [8T,16T), over it in [16T,32T)), degrades (above GENERALIZES_TOL in [8T,16T), below the bar to the evaluation's
    end) or does not fail; a fix holds (full -
    reset <= GENERALIZES_TOL in every bin from T to 16T, [0,T) loss within the demo's 8% of the base's): "fails and
    fixed"; else the best fix's cut in [8T,16T) ("fails, halved" from 50% on). `--control ARCH=RUN_ROOT` names a demo
    of the same architecture without the setting: where that base does not fail, the verdict says the architecture
    fails only with the setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from recurlen.commands.demo import DemoConfig, demo_architectures
from recurlen.commands.demo_seeds import seed_roots
from recurlen.evaluation.evidence import (
    FAILS_MARGIN,
    GENERALIZES_TOL,
    IN_CONTEXT_REL_TOL,
    all_bins_check,
    fmt_interval,
    in_context_cost,
    interval_status,
    num_sequences,
    shown,
)
from recurlen.models import registry
from recurlen.util.errors import UserError

BINS = ("[4T,8T)", "[8T,16T)", "[16T,32T)")
"""The far bins of every cell: full - reset there."""
RUNS = ("base", "none", "fitted_noise", "state_passing", "tbptt")
"""The columns: the demo's labels (intervention names), in the order docs/demo.md's tables use."""
FIXES = ("state_passing", "tbptt")
"""The post-trainings whose success the verdict reports (the demo's checks test these two)."""
NUMERICS_ONLY = frozenset({"chunk_size"})
"""Config fields that block a scan into chunks without changing what it computes (any value, the same model)."""
HEADER = ["architecture", "run", "setting (vs the model table's row)", "base", "none", "fitted_noise", "state_passing",
          "tbptt", "verdict"]


def read_demo(root: Path) -> tuple[dict[str, dict] | None, dict]:
    """({label: run} of root/results.json or None where there is none, {field: value} of the demo model's setting)."""
    results = root / "results.json"
    runs = None
    if results.is_file():
        data = json.loads(results.read_text())
        if not isinstance(data, dict) or "runs" not in data:
            raise UserError(f"{results} is not a recurlen report's results.json (no 'runs')")
        runs = {r["label"]: r for r in data["runs"]}
    return runs, model_setting(root / "pretrain" / "config.yaml")


def model_setting(config_yaml: Path) -> dict:
    """The model fields of a pre-training's config.yaml that differ from its model table row's config."""
    if not config_yaml.is_file():
        return {}
    model = OmegaConf.to_container(OmegaConf.load(config_yaml).model, resolve=True)
    preset = dataclasses.asdict(registry.architectures()[model["architecture"]].preset(model["name"]))
    return {k: v for k, v in (model.get("arch") or {}).items()
            if k not in NUMERICS_ONLY and _plain(v) != _plain(preset.get(k))}


def _plain(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def far_bin(run: dict, name: str, key: str = "full_minus_reset") -> float | None:
    row = next((r for r in (run.get("positionwise") or {}).get("bins") or [] if r["name"] == name), None)
    return None if row is None else shown(row.get(key))


def in_context_change(run: dict, base: dict) -> float | None:
    """[0,T) loss against the base's, as a fraction of the unrounded losses (as the demo's in-context check)."""
    cost = in_context_cost(run, base)
    return None if cost is None else cost.value


def cell(run: dict | None, base: dict | None) -> str:
    if run is None:
        return "-"
    text = " / ".join("n/a" if v is None else f"{v:+.3f}" for v in (far_bin(run, b) for b in BINS))
    change = None if run is base or base is None else in_context_change(run, base)
    return text if change is None else f"{text} ({change:+.1%})"


def _row(run: dict, name: str) -> dict | None:
    return next((r for r in (run.get("positionwise") or {}).get("bins") or []
                 if r["name"] == name and r.get("full_minus_reset") is not None), None)


def _status(row: dict | None, op: str, bar: float) -> str | None:
    """The claim `full - reset op bar` of one bin read on its interval (its value without one): pass / miss /
    undecided; None where the bin was not evaluated."""
    return None if row is None else interval_status(op, bar, row["full_minus_reset"], row.get("full_minus_reset_ci"))


def _with_ci(row: dict) -> str:
    ci = fmt_interval(row.get("full_minus_reset_ci"))
    return f"{row['full_minus_reset']:+.3f}" + (f" {ci}" if ci else "")


def holds(run: dict) -> tuple[str, str] | None:
    """How far a post-training holds, read on the intervals: ('16T' or the evaluation's end, 'pass') where the upper
    ends stay at or under GENERALIZES_TOL in every bin from T (to the end where every later bin holds too),
    ('16T', 'undecided') where an interval up to 16T straddles the bar, None where a bin up to 16T misses."""
    T = run["train_len"]
    past = [r for r in run["positionwise"]["bins"] if r["start"] >= T and r.get("full_minus_reset") is not None]
    upto16 = [r for r in past if r["end"] <= 16 * T]
    if not upto16:
        return None
    status = all_bins_check("", upto16, "<=", GENERALIZES_TOL)["status"]
    if status == "miss":
        return None
    if status == "undecided":
        return "16T", "undecided"
    every = all_bins_check("", past, "<=", GENERALIZES_TOL)["status"] == "pass"
    return (f"{-(-past[-1]['end'] // T)}T" if every else "16T"), "pass"


def verdict(runs: dict[str, dict], control: tuple[str, dict[str, dict] | None] | None = None) -> str:
    """The row's verdict, every claim read on its 95% interval over the held-out sequences (the point values where
    a results file has none): a claim whose interval straddles its bar is said to be undecided, with the sample."""
    base = runs.get("base")
    row816 = None if base is None else _row(base, "[8T,16T)")
    if row816 is None:
        return "no base with a [8T,16T) bin"
    n = num_sequences(base)
    sample = f" at {n} sequences" if row816.get("full_minus_reset_ci") and n else ""
    fails = _status(row816, ">=", FAILS_MARGIN)
    if fails == "undecided":
        return f"undecided{sample}: base {_with_ci(row816)} in [8T,16T) straddles the {FAILS_MARGIN:+g} bar"
    flat = _status(row816, "<=", GENERALIZES_TOL)
    late_row = _row(base, "[16T,32T)")
    late = _status(late_row, ">=", FAILS_MARGIN)
    # Under the bar in [8T,16T) (where the demo's check reads) but over it in [16T,32T): a failure that comes later.
    fails_late = fails == "miss" and late == "pass"
    if fails == "miss" and not fails_late and flat == "pass":
        return f"does not fail (base {_with_ci(row816)} in [8T,16T))"
    if fails == "miss" and not fails_late and flat == "undecided":
        return f"does not fail or degrades, undecided{sample} (base {_with_ci(row816)} in [8T,16T))"
    # Between the two bars the base is harmed, but not as much as the demo's check calls a failure.
    word, bar = ("fails", FAILS_MARGIN) if fails == "pass" or fails_late else ("degrades", GENERALIZES_TOL)
    held = {name: holds(runs[name]) for name in FIXES if name in runs}
    held = {name: reach for name, reach in held.items() if reach}
    # A fix also keeps the [0,T) loss within the demo's 8% of the base's (its in-context check).
    cost = {name: in_context_cost(runs[name], base) for name in held}
    cost_status = {name: None if c is None else interval_status("abs<=", IN_CONTEXT_REL_TOL, c.value, c.interval)
                   for name, c in cost.items()}
    fixed = {name: reach for name, (reach, status) in held.items() if status == "pass" and cost_status[name] == "pass"}
    open_ = {name: reach for name, (reach, status) in held.items() if name not in fixed and cost_status[name] != "miss"}
    fixed_text = ", ".join(f"{name} to {reach}" for name, reach in fixed.items())
    open_text = ", ".join(f"{name} to {reach} undecided{sample} ({_open_reason(held[name][1], cost[name])})"
                          for name, reach in open_.items())
    if word == "degrades":
        text = f"degrades, below the {FAILS_MARGIN:+g} bar (base {_with_ci(row816)} in [8T,16T))"
        text += f"; held by {fixed_text}" if fixed else ""
    elif fails_late:
        text = (f"fails past 16T (base {_with_ci(late_row)} in [16T,32T); {_with_ci(row816)} in [8T,16T), under "
                f"the {FAILS_MARGIN:+g} bar there)")
        text += f"; fixed: {fixed_text}" if fixed else "" if open_ else "; not fixed"
    elif fixed:
        text = "fails and fixed: " + fixed_text
    elif held and not open_:
        text = ("fails, not fixed: " + ", ".join(f"{name} holds to {reach} but costs {_cost(cost[name])}"
                                                for name, (reach, _) in held.items())
                + f" in context (over {IN_CONTEXT_REL_TOL:.0%})")
    elif open_:
        text = "fails"
    else:
        tried = {name: far_bin(runs[name], "[8T,16T)") for name in FIXES if name in runs}
        tried = {k: v for k, v in tried.items() if v is not None}
        if not tried:
            return "fails; no fix was run"
        failed = far_bin(base, "[8T,16T)")
        best = min(tried, key=tried.get)
        cut = 1.0 - tried[best] / failed
        text = f"fails, {'halved' if cut >= 0.5 else 'not fixed'} (best: {best}, [8T,16T) cut by {cut:.0%}; not fixed)"
    if open_text:
        text += f"; {open_text}"
    if control is not None:
        where, control_runs = control
        other = None if not control_runs or "base" not in control_runs else far_bin(control_runs["base"], "[8T,16T)")
        if other is None:
            text += f"; the run without the setting ({where}) has no results"
        elif other < bar:
            text += f"; {word} only with the setting: without it ({where}) base {other:+.3f} in [8T,16T)"
        else:
            text += f"; {word} without the setting too ({where}: base {other:+.3f} in [8T,16T))"
    return text


def _open_reason(hold_status: str, cost) -> str:
    if hold_status == "undecided":
        return f"full - reset's interval reaches over +{GENERALIZES_TOL}"
    return f"in-context cost {_cost(cost)} straddles {IN_CONTEXT_REL_TOL:.0%}" if cost is not None \
        else "no in-context loss"


def _cost(cost) -> str:
    ci = fmt_interval(cost.interval, "+.1%")
    return f"{cost.value:+.1%}" + (f" {ci}" if ci else "")


def seeds_verdict(root: Path, runs: dict[str, dict]) -> str | None:
    """With several seeds (a demo run with seeds=N: its results.json's "seeds"), each seed's verdict counted: the
    base's failure and how far each fix holds."""
    results = json.loads((root / "results.json").read_text()) if (root / "results.json").is_file() else {}
    seeds = (results.get("seeds") or {}).get("seeds")
    if not seeds or seeds < 2:
        return None
    per_seed = [runs] + [read_demo(r)[0] or {} for r in seed_roots(root, seeds)[1:]]
    words = [verdict(r) for r in per_seed]
    base = sum(w.startswith("fails") for w in words)
    parts = [f"base fails {base}/{seeds}"]
    for name in FIXES:
        reaches = [holds(r[name]) if name in r else None for r in per_seed]
        for reach in sorted({h[0] for h in reaches if h and h[1] == "pass"}):
            parts.append(f"{name} holds to {reach} {sum(1 for h in reaches if h and h[1] == 'pass' and h[0] == reach)}"
                         f"/{seeds}")
        costs = [in_context_cost(r[name], r["base"]) if name in r and "base" in r else None for r in per_seed]
        within = sum(1 for c in costs if c is not None
                     and interval_status("abs<=", IN_CONTEXT_REL_TOL, c.value, c.interval) == "pass")
        if any(c is not None for c in costs):
            parts.append(f"{name} within {IN_CONTEXT_REL_TOL:.0%} in context {within}/{seeds}")
    return f"{seeds} seeds: " + "; ".join(parts)


def describe(setting: dict) -> str:
    if not setting:
        return "none: the table's shape and init"
    return ", ".join(f"{k} {json.dumps(v)}" for k, v in setting.items())


def rows(root: Path, *, quick: Sequence[str] = (), controls: dict[str, str] | None = None,
         chosen: dict[str, str] | None = None) -> list[list[str]]:
    """One table row per architecture with a demo, cells as printed."""
    controls = controls or {}
    titles = {name: arch.title for name, arch in registry.architectures().items()}
    out = []
    for arch in demo_architectures():
        run_root = (chosen or {}).get(arch) or DemoConfig(arch=arch, quick=arch in quick).run_root
        runs, setting = read_demo(root / run_root)
        label = f"{run_root} (quick demo)" if is_quick(root / run_root) else run_root
        if runs is None:
            out.append([titles[arch], f"{label}: no results.json", describe(setting) if setting else "-",
                        *["-"] * (len(HEADER) - 4), "not measured here"])
            continue
        control = None
        if arch in controls:
            control_runs, control_setting = read_demo(root / controls[arch])
            control = (f"{controls[arch]}: {describe(control_setting)}", control_runs)
        base = runs.get("base")
        counts = seeds_verdict(root / run_root, runs)
        out.append([titles[arch], label, describe(setting), *[cell(runs.get(name), base) for name in RUNS],
                    verdict(runs, control) + (f" ({counts})" if counts else "")])
    return out


def is_quick(run_root: Path) -> bool:
    """Whether the demo that wrote run_root was the quick one (its demo_config.yaml)."""
    config = run_root / "demo_config.yaml"
    return config.is_file() and bool(OmegaConf.load(config).get("quick", False))


def markdown(table_rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|---" * len(HEADER) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in table_rows])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="directory the demos' run roots (runs/...) are under")
    parser.add_argument("--quick", action="append", default=[], metavar="ARCH",
                        help="read this architecture's quick demo (runs/demo-<arch>-quick) instead of the full one")
    parser.add_argument("--run", action="append", default=[], metavar="ARCH=RUN_ROOT",
                        help="read this architecture's row from a demo run with another run_root")
    parser.add_argument("--control", action="append", default=[], metavar="ARCH=RUN_ROOT",
                        help="a demo of ARCH without its demo's setting (its base says whether it fails without it)")
    args = parser.parse_args(argv)
    try:
        known = demo_architectures()
        controls = dict(c.split("=", 1) for c in args.control if "=" in c)
        chosen = dict(c.split("=", 1) for c in args.run if "=" in c)
        bad = [a for a in [*args.quick, *controls, *chosen] if a not in known]
        bad += [c for c in [*args.control, *args.run] if "=" not in c]
        if bad:
            raise UserError(f"unknown architecture or malformed --control / --run {bad}; architectures with a demo: "
                            f"{known}, --control and --run as ARCH=RUN_ROOT")
        print("full - reset (nats/token) in [4T,8T) / [8T,16T) / [16T,32T) from a zero state; (x%): the [0,T) "
              "loss against the base's.\n")
        print(markdown(rows(Path(args.root), quick=args.quick, controls=controls, chosen=chosen)))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
