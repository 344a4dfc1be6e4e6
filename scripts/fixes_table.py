"""The training-free field in one table (docs/evaluation.md, "Every fix on every base"): on each architecture's demo
base and on the retrieval arbiter's base, every post-training and every fix that applies, with the loss verdict, the
retrieval verdict, intervals and cost; the fixes that do not apply are named with the reason.

    .venv/bin/python scripts/fixes_table.py [--arch ARCH ...] [--root DIR] [--rerun] [--dry-run]
    make fixes-table

For each architecture with a demo run root (runs/demo for Mamba-2, else runs/demo-<arch>-quick, else
runs/demo-<arch>), it evaluates the demo's base, its post-trainings and the base with every fix that applies (the
budgets of TABLE_FIXES) in one `recurlen eval` on NUM_SEQUENCES held-out sequences at the demo's own evaluation
length (<run root>/fixes-table; reused when its inputs are unchanged), then reads runs/arbiter/results.json where
`make arbiter` has written it. Seed 0 of each demo: the seeds' counts are the demo reports' (`make demo SEEDS=3`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from recurlen.commands.demo import demo_architectures
from recurlen.evaluation.fixes import FIXES
from recurlen.evaluation.fixes.field import arbiter_rows, demo_rows, markdown, refused_rows
from recurlen.models import registry, timescales
from recurlen.util.errors import UserError

NUM_SEQUENCES = 64
"""Held-out sequences each table evaluation scores (the full demo's; the quick demos' reports score 32)."""
TABLE_FIXES: tuple[tuple[str, str, dict], ...] = (
    ("mambaextend", "mambaextend", {"steps": 30}),
    ("mambaextend_bp", "mambaextend", {"method": "backprop", "steps": 30, "lr": 0.3}),
    ("a_scale", "a_scale", {"steps": 30}),
    ("a_scale_bp", "a_scale", {"method": "backprop", "steps": 30, "lr": 0.3}),
    ("forget_more", "forget_more", {}),
    ("stuffed_mamba", "stuffed_mamba", {"search": "da_mult"}),
    ("stuffed_mamba_norm", "stuffed_mamba", {"search": "state_norm"}),
)
"""Each fix at the budgets docs/evaluation.md compares on the Mamba-2 demo (SPSA 30 steps; backprop at lr 0.3, the
one that held there), Stuffed Mamba's decay multiplier and its state-norm cap each chosen from its grid: key, fix
name, settings. A registered fix missing here is run at its defaults."""
OUT = "fixes-table"


def demo_root(arch: str, root: Path) -> Path | None:
    """The architecture's demo run root: the full demo's for Mamba-2, the quick demo's for the others (full when
    only that one exists)."""
    names = ["demo"] if arch == "mamba2" else [f"demo-{arch}-quick", f"demo-{arch}"]
    return next((root / "runs" / n for n in names if (root / "runs" / n / "results.json").is_file()), None)


def table_fixes() -> list[tuple[str, str, dict]]:
    listed = {name for _, name, _ in TABLE_FIXES}
    return [*TABLE_FIXES, *((name, name, {}) for name in FIXES if name not in listed)]


def refusal(arch: str, fix_name: str) -> str:
    """Why a fix does not apply: the knobs it needs against those the architecture's LM class offers."""
    fix = FIXES[fix_name]
    offered = timescales.knobs(registry.get(arch).model_cls)
    missing = [k for k in fix.needs if k not in offered]
    return (f"needs the {'/'.join(missing)} knob{'s' if len(missing) > 1 else ''}; "
            f"{registry.get(arch).title} offers {', '.join(offered) or 'none'} (its LM class's TIMESCALES)")


def eval_words(arch: str, run_root: Path) -> tuple[list[str], dict[str, str]]:
    """The `recurlen eval` words for one demo base, and the fixes refused with their reasons."""
    config = OmegaConf.load(run_root / "demo_config.yaml")
    runs = [f"base={run_root / 'pretrain' / 'checkpoints' / 'last.ckpt'}"]
    runs += [f"{iv}={run_root / 'post' / iv / 'checkpoints' / 'last.ckpt'}" for iv in config.interventions
             if (run_root / "post" / iv / "checkpoints" / "last.ckpt").is_file()]
    architecture = registry.get(arch)
    chosen, settings, refused = [], [], {}
    for key, name, values in table_fixes():
        if not FIXES[name].applies_to(architecture):
            refused.setdefault(name, refusal(arch, name))
            continue
        chosen.append(key if key == name else f"{key}={name}")
        settings += [f"fix.{key}.{k}={v}" for k, v in values.items()]
    words = [*runs, f"seq_len={config.eval.length}", f"num_sequences={NUM_SEQUENCES}", "chunk_len=256",
             "batch_size=16", "log_bins=0", "tasks=[positionwise,reset]", f"fixes=[{','.join(chosen)}]", *settings,
             "progress=false", "num_threads=1"]
    return words, refused


def evaluate(words: list[str], out: Path, *, rerun: bool) -> None:
    """Run the evaluation unless `out` holds one of the same words."""
    inputs = out / "table_inputs.json"
    if not rerun and (out / "results.json").is_file() and inputs.is_file() \
            and json.loads(inputs.read_text()) == words:
        return
    cmd = [sys.executable, "-m", "recurlen", "eval", *words, "--out", str(out)]
    print(f"evaluating: recurlen eval {' '.join(words)} --out {out}", file=sys.stderr)
    if subprocess.run(cmd, check=False).returncode != 0:
        raise UserError(f"the evaluation for {out} failed (its command above); fix it and run again")
    inputs.write_text(json.dumps(words))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="directory the run roots (runs/...) are under")
    parser.add_argument("--arch", action="append", default=[], help="only these architectures (default: every one "
                                                                   "with a demo run root)")
    parser.add_argument("--rerun", action="store_true", help="evaluate again even where the inputs are unchanged")
    parser.add_argument("--dry-run", action="store_true", help="print each evaluation's command, run nothing")
    args = parser.parse_args(argv)
    root = Path(args.root)
    try:
        known = demo_architectures()
        bad = [a for a in args.arch if a not in known]
        if bad:
            raise UserError(f"unknown architecture {bad}; architectures with a demo: {known}")
        rows, missing = [], []
        for arch in args.arch or known:
            run_root = demo_root(arch, root)
            if run_root is None:
                missing.append(arch)
                continue
            words, refused = eval_words(arch, run_root)
            out = run_root / OUT
            if args.dry_run:
                print(f"recurlen eval {' '.join(words)} --out {out}")
                continue
            evaluate(words, out, rerun=args.rerun)
            results = json.loads((out / "results.json").read_text())
            timings_file = run_root / "demo_timings.json"
            timings = json.loads(timings_file.read_text()) if timings_file.is_file() else None
            name = f"{registry.get(arch).title} demo ({run_root.name}, T = {results['runs'][0]['train_len']})"
            rows += demo_rows(name, results["runs"], timings) + refused_rows(name, refused)
        arbiter = root / "runs" / "arbiter" / "results.json"
        if args.dry_run:
            return 0
        if arbiter.is_file():
            rows += arbiter_rows(json.loads(arbiter.read_text()))
        print(f"Seed 0 of each demo; loss: full - reset on {NUM_SEQUENCES} held-out sequences per demo base (95% "
              "paired-bootstrap intervals, every bin past T read); retrieval: passkey on the arbiter's base (48 "
              "trials per length, Wilson intervals).\n")
        print("\n".join(markdown(rows)))
        if missing:
            print(f"\nNo demo run root for {', '.join(missing)}: run `make demo ARCH=<arch> QUICK=1` first.")
        if not arbiter.is_file():
            print("\nNo arbiter results (runs/arbiter/results.json): run `make arbiter` for the retrieval verdicts.")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
