"""The demo ends with its verdicts, where its report is and what to run next, not with the report's ~150 lines; the
lines it prints are the report's own."""

import pytest

import recurlen.commands.demo as demo
from recurlen.commands import cli
from recurlen.commands.demo import demo_checks
from recurlen.commands.demo_summary import report_verdicts
from recurlen.commands.report import write_report
from recurlen.util.atomic_files import write_json
from tests.synthetic_results import positionwise_run

pytestmark = pytest.mark.usefixtures("cli_logs")


def finished_demo(root):
    """A quick demo's root as it looks when it has finished: its runs' results, its report, its base checkpoint."""
    runs = [positionwise_run("base", {"[0,T)": 2.0, "[4T,8T)": 0.2, "[8T,16T)": 0.5}, bins=5),
            positionwise_run("none", {"[0,T)": 2.0, "[4T,8T)": 0.2, "[8T,16T)": 0.4}, bins=5),
            positionwise_run("state_passing", {"[0,T)": 2.02, "[8T,16T)": -0.01}, bins=5),
            positionwise_run("tbptt", {"[0,T)": 2.03, "[8T,16T)": 0.01}, bins=5)]
    write_json(root / "eval" / "results.json", {"runs": runs})
    write_report([root / "eval" / "results.json"], out_dir=root, checks=demo_checks)
    (root / "pretrain" / "checkpoints").mkdir(parents=True)
    (root / "pretrain" / "checkpoints" / "last.ckpt").write_bytes(b"planted")
    return root


def test_the_demo_prints_its_verdicts_where_the_report_is_and_what_to_run_next(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = finished_demo(tmp_path / "runs" / "demo-quick")
    monkeypatch.setattr(demo, "run_demo", lambda cfg: cfg.run_root and root)  # the stages ran: their report is there
    assert cli.main(["demo", "quick=true"]) == 0
    out = capsys.readouterr().out
    report = (root / "report.md").read_text()
    assert "# recurlen report" not in out and "## Loss by position" not in out  # it used to print all of report.md
    verdicts = report_verdicts(report)
    assert [v.split(":")[0] for v in verdicts[:4]] == ["- base", "- none", "- state_passing", "- tbptt"]
    assert "- tbptt: in-context cost +1.5%" in verdicts[6] and verdicts[-1].endswith("checks passed.")
    assert all(v in report for v in verdicts[:-1]) and f"**{verdicts[-1]}**" in report
    lines = out.splitlines()
    assert lines[1:2 + len(verdicts)] == ["recurlen demo: done", *verdicts]  # the report's lines, no numbers of its own
    assert f"The report, with every table, the checks and the plots: {root / 'report.md'}" in out
    nxt = [line.strip().split("  #")[0].strip() for line in lines[lines.index("Next:") + 1:]]
    assert nxt == ["make demo", "make finetune", "make eval", f"make export RUN={root / 'post' / 'state_passing'}"]
    assert len(lines) < 20 < len(report.splitlines())


def test_make_finetune_and_eval_are_offered_only_for_the_demo_they_use(tmp_path, monkeypatch):
    from recurlen.commands.demo_summary import next_lines

    monkeypatch.chdir(tmp_path)
    quick = finished_demo(tmp_path / "runs" / "demo-quick")
    finished_demo(tmp_path / "runs" / "demo")  # the full demo finished too: the Makefile takes its base
    offered = [line.split()[1] for line in next_lines(quick, quick=True, interventions=["none", "tbptt"])]
    assert offered == ["demo", "export"]
    gla = [line.split()[1] for line in next_lines(tmp_path / "runs" / "demo-gla", quick=False, interventions=["none"])]
    assert gla == []  # no fixed run to export, and make finetune / eval would use the Mamba-2 demo's runs
