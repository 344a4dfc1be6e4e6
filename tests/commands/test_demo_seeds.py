"""`recurlen demo seeds=N`: where each seed's runs go, and the report's verdicts as counts over seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from recurlen.commands.demo import demo_checks, demo_plan, load_demo_config
from recurlen.commands.demo_seeds import seed_overrides, seed_roots, seeds_lines, seeds_summary
from recurlen.diagnostics.intervals import t_interval
from recurlen.util.errors import UserError
from tests.synthetic_results import positionwise_run, with_sequences


def synthetic_demo(root: Path, base_816: float, tbptt_816: float, *, digest: str = "same") -> None:
    """A demo run root's eval/results.json: base and tbptt with 16 sequences each around the given means."""
    rng = np.random.default_rng(int(base_816 * 1000))
    runs = []
    for label, value, sd in (("base", base_816, 0.05), ("tbptt", tbptt_816, 0.01)):
        run = positionwise_run(label, {"[0,T)": 2.0})
        diffs = {"[8T,16T)": list(value + sd * rng.standard_normal(16)),
                 "[16T,32T)": list(value + sd * rng.standard_normal(16))}
        runs.append(with_sequences(run, diffs, context=list(2.0 + 0.01 * rng.standard_normal(16)), digest=digest))
    (root / "eval").mkdir(parents=True)
    (root / "eval" / "results.json").write_text(json.dumps({"format": "recurlen.eval/1", "runs": runs}))


def test_seed_zero_is_the_demo_as_it_was_and_the_others_have_their_own_roots():
    assert seed_roots(Path("runs/demo"), 3) == [Path("runs/demo"), Path("runs/demo/seeds/1"),
                                                Path("runs/demo/seeds/2")]
    assert seed_overrides(0) == [] and seed_overrides(2) == ["seed=2", "data.seed=2"]
    assert load_demo_config([]).seeds == 1
    plan = "\n".join(demo_plan(load_demo_config(["seeds=3"])))
    assert "seeds        3: stages 1-3 once per seed, seed 0 in runs/demo, seed k in runs/demo/seeds/k" in plan
    with pytest.raises(ValueError, match="demo seeds must be a positive integer; got 0"):
        load_demo_config(["seeds=0"])


def test_verdicts_are_counted_over_seeds_with_the_across_seed_interval(tmp_path):
    roots = seed_roots(tmp_path / "demo", 3)
    for root, (b, t) in zip(roots, [(0.6, 0.0), (0.5, 0.01), (0.2, 0.02)]):
        synthetic_demo(root, b, t)
    summary = seeds_summary(roots, checks=demo_checks)
    base = summary["runs"]["base"]
    assert base["outcomes"] == ["fails", "fails", "between"]
    cell = base["cells"]["[8T,16T)"]
    assert cell["mean"] == pytest.approx(np.mean(cell["values"]))
    assert cell["interval"] == pytest.approx(list(t_interval(cell["values"])))
    assert summary["runs"]["tbptt"]["outcomes"] == ["holds"] * 3
    assert summary["checks"]["baseline fails: full - reset >= +0.3 in [8T,16T)"] == ["pass", "pass", "miss"]
    text = "\n".join(seeds_lines(summary))
    assert "| base | fails 2/3, mostly holds 1/3 | +0.000 [+0.000, +0.000] (+0.000 / +0.000 / +0.000) | +0.4" in text
    assert "| tbptt | holds 3/3 |" in text
    assert "| baseline fails: full - reset >= +0.3 in [8T,16T) | PASS 2/3, MISS 1/3 |" in text


def test_seeds_scored_on_other_sequences_are_refused(tmp_path):
    roots = seed_roots(tmp_path / "demo", 2)
    synthetic_demo(roots[0], 0.6, 0.0, digest="a")
    synthetic_demo(roots[1], 0.6, 0.0, digest="b")
    with pytest.raises(UserError, match="scored different held-out sequences"):
        seeds_summary(roots, checks=demo_checks)
    with pytest.raises(UserError, match="has no evaluation"):
        seeds_summary(seed_roots(tmp_path / "missing", 2), checks=demo_checks)


def test_make_demo_seeds_passes_seeds_to_the_demo():
    import subprocess

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(["make", "-n", "demo", "SEEDS=3"], cwd=root, capture_output=True, text=True, timeout=60)
    assert "seeds=3" in out.stdout, out.stdout
    plain = subprocess.run(["make", "-n", "demo"], cwd=root, capture_output=True, text=True, timeout=60)
    assert "seeds=" not in plain.stdout, plain.stdout


def test_each_seed_runs_the_whole_demo_in_its_root_and_the_report_counts_them(tmp_path, monkeypatch):
    """run_demo with seeds=3: the pipeline once per seed with that seed's settings (stages stubbed by a synthetic
    evaluation), then seed 0's report written again with the seeds' counts and results.json's "seeds"."""
    import recurlen.commands.demo as demo

    seen = []

    def fake_run_demo(cfg):
        seen.append((cfg.run_root, cfg.seeds, list(cfg.overrides)))
        root = Path(cfg.run_root)
        synthetic_demo(root, 0.6 - 0.2 * len(seen), 0.0)
        (root / demo.TIMINGS).write_text(json.dumps({"stages": []}))
        return root

    monkeypatch.setattr(demo, "_run_demo", fake_run_demo)
    monkeypatch.setattr(demo, "setup_notes", lambda cfg: ["## Setup", ""])
    root = tmp_path / "demo"
    cfg = load_demo_config([f"run_root={root}", "seeds=3", "overrides=[data.max_documents=60]"])
    assert demo._run_seeds(cfg) == root
    assert seen == [(str(root), 1, ["data.max_documents=60"]),
                    (str(root / "seeds" / "1"), 1, ["data.max_documents=60", "seed=1", "data.seed=1"]),
                    (str(root / "seeds" / "2"), 1, ["data.max_documents=60", "seed=2", "data.seed=2"])]
    report = (root / "report.md").read_text()
    assert "## Across seeds" in report and "| base | fails 1/3, mostly holds 1/3, holds 1/3 |" in report
    assert json.loads((root / "results.json").read_text())["seeds"]["seeds"] == 3
    # What the demo prints last: seed 0's verdicts, then the counts over seeds copied from the report.
    from recurlen.commands.demo_summary import closing_lines

    closing = closing_lines(root, quick=False, interventions=["tbptt"])
    assert ("Across seeds: base fails 1/3, mostly holds 1/3, holds 1/3; tbptt holds 3/3 (the report's 'Across seeds' "
            "section)") in closing
