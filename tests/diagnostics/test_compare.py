"""The comparison figure: every run on one set of axes in units of T, one shared y-scale, one colour per run;
written by `recurlen eval` / `recurlen report` as a PNG and as a TensorBoard run of its own."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.colors import to_hex
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from recurlen.diagnostics.compare import (
    COMPARE_PNG,
    COMPARE_TAG,
    COMPARE_TB_DIR,
    assign_colors,
    comparison_data,
    comparison_table,
    plot_comparison,
)
from recurlen.diagnostics.plots import write_plots

T = 32
NAMES = ["[0,T)", "[T,2T)", "[2T,4T)", "[4T,8T)", "[8T,16T)", "[16T,32T)"]
# The demo's six runs: the base climbs to +1.5, state passing stays within +-0.15 (the user's example).
FMR = {"base": [0, 0.05, 0.3, 0.8, 1.2, 1.5], "none": [0, 0.04, 0.2, 0.5, 0.9, 1.1],
       "random_noise": [0, 0.0, 0.1, 0.3, 0.5, 0.6], "fitted_noise": [0, 0.0, 0.05, 0.2, 0.4, 0.5],
       "state_passing": [0, -0.1, -0.15, 0.02, 0.1, 0.15], "tbptt": [0, -0.12, -0.1, -0.05, 0.0, 0.01]}


def run_entry(label: str, fmr: list[float], loss0: float = 1.5) -> dict:
    rows, start = [], 0
    for i, (name, d) in enumerate(zip(NAMES, fmr)):
        end = T if i == 0 else 2 * start
        rows.append({"name": name, "start": start, "end": end, "kind": "context", "count": 64,
                     "loss": loss0 + d, "ppl": float(np.exp(loss0 + d)), "reset_loss": loss0,
                     "reset_ppl": float(np.exp(loss0)), "full_minus_reset": d})
        start = end
    return {"label": label, "train_len": T, "seq_len": 32 * T,
            "positionwise": {"train_len": T, "seq_len": 32 * T, "num_sequences": 4, "bins": rows, "log_bins": []}}


@pytest.fixture
def runs() -> list[dict]:
    return [run_entry(label, fmr) for label, fmr in FMR.items()]


def test_all_runs_share_one_y_scale_and_have_distinct_colours(runs):
    fig = plot_comparison(runs)
    ax_fmr, ax_loss = fig.axes
    lines = {line.get_label().split("  (")[0]: line for line in ax_fmr.get_lines()
             if not line.get_label().startswith("_")}
    assert list(lines) == list(FMR)  # every run, in order, on the same axes
    colors = [to_hex(line.get_color()) for line in lines.values()]
    assert len(set(colors)) == len(FMR)
    assert colors[list(FMR).index("base")] == "#000000" and colors[list(FMR).index("state_passing")] == "#1f77b4"
    # One y-range for all: it holds the base's +1.5 and state passing's -0.15 alike.
    lo, hi = ax_fmr.get_ylim()
    assert lo <= -0.15 and hi >= 1.5
    for label, line in lines.items():
        x, y = line.get_data()
        assert list(x) == [1, 2, 3, 4, 5]  # [T,2T) ... [16T,32T): x in doublings of T; [0,T) (always 0) left out
        assert list(y) == pytest.approx(FMR[label][1:])
    assert [t.get_text() for t in ax_fmr.get_xticklabels()] == NAMES
    assert "(max past T +1.50)" in lines["base"].get_label()
    assert "(max past T +0.15)" in lines["state_passing"].get_label()
    loss_lines = [line for line in ax_loss.get_lines() if not line.get_label().startswith("_")]
    assert [to_hex(line.get_color()) for line in loss_lines] == colors  # the same colour per run in both panels
    assert list(loss_lines[0].get_data()[0]) == [0, 1, 2, 3, 4, 5]


def test_comparison_data_is_what_is_plotted(runs):
    data = comparison_data(runs)
    assert data["bins"] == NAMES and data["positions"] == [0, 1, 2, 3, 4, 5]
    by_label = {r["label"]: r for r in data["runs"]}
    assert by_label["base"]["worst_past_T"] == 1.5 and by_label["tbptt"]["worst_past_T"] == 0.01
    table = comparison_table(runs)
    assert table.splitlines()[0] == "| run | [T,2T) | [2T,4T) | [4T,8T) | [8T,16T) | [16T,32T) |"
    assert "| state_passing | -0.100 | -0.150 | +0.020 | +0.100 | +0.150 |" in table


def test_colours_never_repeat():
    # Two runs after the same intervention, and more runs than the palette has colours.
    labels = ["780m-tbptt", "1.3b-tbptt", "pretrain", "base", *[f"run{i}" for i in range(30)]]
    colors = assign_colors(labels)
    assert len(set(colors)) == len(labels)
    assert colors[0] == "#2ca02c" and colors[2] == "#000000" and colors[3] != "#000000"
    assert assign_colors(["none", "tbptt"]) == assign_colors(["none", "tbptt"])  # fixed, not random


def test_eval_and_report_outputs_hold_the_png_and_a_tensorboard_run(tmp_path, runs):
    plots = write_plots(runs, tmp_path)
    assert list(plots)[0] == "compare" and plots["compare"] == tmp_path / COMPARE_PNG
    assert plots["compare"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    acc = EventAccumulator(str(tmp_path / COMPARE_TB_DIR), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    assert acc.Tags()["images"] == [COMPARE_TAG]
    assert "compare/full_minus_reset_table/text_summary" in acc.Tags()["tensors"]
    write_plots(runs, tmp_path)  # written again: still one image, not two versions side by side
    acc = EventAccumulator(str(tmp_path / COMPARE_TB_DIR), size_guidance={"images": 0})
    acc.Reload()
    assert len(acc.Images(COMPARE_TAG)) == 1
    # One run compares with nothing: no comparison.
    assert "compare" not in write_plots(runs[:1], tmp_path / "one")
    assert not (tmp_path / "one" / COMPARE_TB_DIR).exists()


def test_report_opens_with_the_comparison(tmp_path, runs):
    from recurlen.commands.report import write_report

    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.json").write_text(json.dumps({"format": "recurlen.eval/1", "runs": runs}))
    text = write_report([tmp_path / "eval"], out_dir=tmp_path / "out").read_text()
    assert text.index("## At a glance") < text.index("## Loss by position")
    assert text.count(f"![compare]({COMPARE_PNG})") == 1
    assert (tmp_path / "out" / COMPARE_PNG).is_file() and (tmp_path / "out" / COMPARE_TB_DIR).is_dir()
