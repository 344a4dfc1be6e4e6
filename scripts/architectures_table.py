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
from recurlen.evaluation.evidence import FAILS_MARGIN, GENERALIZES_TOL, IN_CONTEXT_REL_TOL, shown
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
    mine, theirs = (next((r.get("loss") for r in (x.get("positionwise") or {}).get("bins") or []
                          if r["name"] == "[0,T)"), None) for x in (run, base))
    return None if mine is None or not theirs else mine / theirs - 1.0


def cell(run: dict | None, base: dict | None) -> str:
    if run is None:
        return "-"
    text = " / ".join("n/a" if v is None else f"{v:+.3f}" for v in (far_bin(run, b) for b in BINS))
    change = None if run is base or base is None else in_context_change(run, base)
    return text if change is None else f"{text} ({change:+.1%})"


def holds(run: dict) -> str | None:
    """How far a post-training holds: full - reset <= GENERALIZES_TOL in every bin from T up to 16T gives '16T', or
    the evaluation's end where every later bin holds too; None where it does not hold to 16T."""
    T = run["train_len"]
    past = [r for r in run["positionwise"]["bins"] if r["start"] >= T and r.get("full_minus_reset") is not None]
    upto16 = [r for r in past if r["end"] <= 16 * T]
    if not (upto16 and all(shown(r["full_minus_reset"]) <= GENERALIZES_TOL for r in upto16)):
        return None
    held = [r for r in past if shown(r["full_minus_reset"]) <= GENERALIZES_TOL]
    return f"{-(-past[-1]['end'] // T)}T" if len(held) == len(past) else "16T"


def verdict(runs: dict[str, dict], control: tuple[str, dict[str, dict] | None] | None = None) -> str:
    base = runs.get("base")
    failed = None if base is None else far_bin(base, "[8T,16T)")
    if failed is None:
        return "no base with a [8T,16T) bin"
    if failed <= GENERALIZES_TOL:
        return f"does not fail (base {failed:+.3f} in [8T,16T))"
    # Between the two bars the base is harmed, but not as much as the demo's check calls a failure.
    word, bar = ("fails", FAILS_MARGIN) if failed >= FAILS_MARGIN else ("degrades", GENERALIZES_TOL)
    late = far_bin(base, "[16T,32T)")
    # Under the bar in [8T,16T) (where the demo's check reads) but over it in [16T,32T): a failure that comes later.
    fails_late = word == "degrades" and late is not None and late >= FAILS_MARGIN
    if fails_late:
        word = "fails"
    held = {name: holds(runs[name]) for name in FIXES if name in runs}
    held = {name: reach for name, reach in held.items() if reach}
    # A fix also keeps the [0,T) loss within the demo's 8% of the base's (its in-context check).
    cost = {name: in_context_change(runs[name], base) for name in held}
    fixed = {name: reach for name, reach in held.items() if cost[name] is not None
             and abs(cost[name]) <= IN_CONTEXT_REL_TOL}
    fixed_text = ", ".join(f"{name} to {reach}" for name, reach in fixed.items())
    if word == "degrades":
        text = f"degrades, below the {FAILS_MARGIN:+g} bar (base {failed:+.3f} in [8T,16T))"
        text += f"; held by {fixed_text}" if fixed else ""
    elif fails_late:
        text = (f"fails past 16T (base {late:+.3f} in [16T,32T); {failed:+.3f} in [8T,16T), under the "
                f"{FAILS_MARGIN:+g} bar there)")
        text += f"; fixed: {fixed_text}" if fixed else "; not fixed"
    elif fixed:
        text = "fails and fixed: " + fixed_text
    elif held:
        text = ("fails, not fixed: " + ", ".join(f"{name} holds to {reach} but costs {cost[name]:+.1%}" for name, reach
                                                in held.items()) + f" in context (over {IN_CONTEXT_REL_TOL:.0%})")
    else:
        tried = {name: far_bin(runs[name], "[8T,16T)") for name in FIXES if name in runs}
        tried = {k: v for k, v in tried.items() if v is not None}
        if not tried:
            return "fails; no fix was run"
        best = min(tried, key=tried.get)
        cut = 1.0 - tried[best] / failed
        text = f"fails, {'halved' if cut >= 0.5 else 'not fixed'} (best: {best}, [8T,16T) cut by {cut:.0%}; not fixed)"
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
        out.append([titles[arch], label, describe(setting), *[cell(runs.get(name), base) for name in RUNS],
                    verdict(runs, control)])
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
