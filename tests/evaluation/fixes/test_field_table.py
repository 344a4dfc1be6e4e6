"""The training-free field's one table (recurlen.evaluation.fixes.field, scripts/fixes_table.py) on synthetic results:
each row's loss verdict read on its intervals, the in-context cost against the same base, the retrieval verdict only
where the base retrieves, each cost in its own units, and the fixes that do not apply named with the reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from recurlen.evaluation.fixes.field import NOT_JUDGED, arbiter_rows, demo_rows, markdown, refused_rows
from tests.evaluation.arbiter.test_verdict_table import entry
from tests.synthetic_results import positionwise_run, with_sequences

FAR = ("[T,2T)", "[2T,4T)", "[4T,8T)", "[8T,16T)", "[16T,32T)")


def run(label: str, far: float, *, sd: float = 0.05, loss0: float = 2.0, fix: dict | None = None) -> dict:
    rng = np.random.default_rng(len(label))
    diffs = {name: list(far + sd * rng.standard_normal(64)) for name in FAR}
    out = with_sequences(positionwise_run(label, {"[0,T)": loss0}), diffs,
                         context=list(loss0 + 0.01 * np.random.default_rng(0).standard_normal(64)))
    if fix is not None:
        out["fix"] = fix
    return out


FIX = {"name": "a_scale", "calibrated_parameters": 2, "values": {"scales": [3.0, 4.0]},
       "calibration": {"forward_passes": 31, "seconds": 7.25, "data": {"sequences": 4, "length": 512}}}
TIMINGS = {"stages": [{"stage": "post/tbptt", "steps": 250, "seconds": 79.2}]}


def test_demo_rows_read_every_verdict_on_its_interval():
    rows = demo_rows("GLA demo", [run("base", 0.8), run("tbptt", -0.05, loss0=2.1),
                                  run("base+a_scale", 0.2, fix=FIX)], TIMINGS)
    base, tbptt, fixed = rows
    assert base.loss == "fails" and base.retrieval == NOT_JUDGED and base.cost_in_context == "(the base)"
    assert tbptt.loss == "holds to 32T" and tbptt.cost == "250 training steps, all parameters, 79 s"
    assert tbptt.cost_in_context.startswith("+5.0% [")  # 2.1 / 2.0 - 1, paired by sequence
    assert fixed.loss == "mostly holds" and fixed.model == "base+a_scale (scales 3, 4)"
    assert fixed.cost == "2 numbers, 31 forward passes of 4 x 512 tokens, 7.2 s"
    assert fixed.worst.startswith("+0.2") and "[+0.1" in fixed.worst


def test_undecided_rows_say_at_how_many_sequences():
    (row,) = demo_rows("x", [run("base", 0.3, sd=0.3)])
    assert row.loss.startswith("undecided at 64 (~") and row.loss.endswith("would decide)")


def test_arbiter_rows_carry_the_retrieval_verdict():
    base = entry("base", "base", 0.6, {1: 47, 2: 40, 4: 10, 8: 0})
    forgets = entry("base+forget_more", "fix", 0.0, {1: 20, 2: 10, 4: 5, 8: 0})
    forgets["fix"] = {"name": "forget_more", "calibrated_parameters": 1, "values": {"memory_T": 0.5},
                      "calibration": {"forward_passes": 8, "seconds": 1.0}}
    rows = arbiter_rows({"bases": [{"label": "base", "entries": [base, forgets]}]})
    assert rows[0].retrieval == "retrieves to 2T" and rows[0].loss == "fails"
    assert rows[1].retrieval.startswith("loses retrieval at 2T") and rows[1].retrieval.endswith("by forgetting")
    assert rows[1].cost == "1 number, 8 forward passes, 1.0 s"


def test_refused_fixes_are_rows_with_the_reason_and_the_table_has_one_header():
    rows = refused_rows("GLA demo", {"mambaextend": "needs the dt knob; GLA offers A"})
    assert rows[0].loss == "does not apply" and "needs the dt knob" in rows[0].cost
    lines = markdown(rows)
    assert lines[0].startswith("| base | model | loss verdict") and len(lines) == 3


def test_the_docs_table_is_what_make_fixes_table_prints(monkeypatch, capsys):
    """docs/evaluation.md's table, where the demos' and the arbiter's runs it was printed from are here (CI has none:
    skipped); an evaluation the command would have to run means they are not."""
    root = Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(root / "scripts"))
    import fixes_table

    def reuse_only(words, out, *, rerun):
        inputs = out / "table_inputs.json"
        if not (out / "results.json").is_file() or not inputs.is_file() or json.loads(inputs.read_text()) != words:
            pytest.skip(f"{out} is not here as the docs' table was printed from (CI has no runs/)")

    monkeypatch.setattr(fixes_table, "evaluate", reuse_only)
    monkeypatch.chdir(root)
    if not (root / "runs" / "arbiter" / "results.json").is_file():
        pytest.skip("runs/arbiter is not here (CI has no runs/)")
    assert fixes_table.main([]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    text = (root / "docs" / "evaluation.md").read_text()
    section = text.split("### Every fix on every base", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    documented = [line for line in section.splitlines() if line.startswith("|")]
    assert printed == documented
