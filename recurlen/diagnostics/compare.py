"""One figure that answers "which run stays flat past T": every run on the same axes, in units of T.

    fig = plot_comparison(runs)              # runs: results.json run entries (recurlen.diagnostics.plots)
    write_comparison_tensorboard(runs, "runs/demo")   # the TensorBoard run runs/demo/compare

Left: full - reset (loss with the carried context minus loss with the state reset every T, the paired control
that removes the bins' differences of content) per position bin [T,2T), [2T,4T), ..., [16T,32T). Right: the
loss itself, from [0,T) on. One axes per quantity, so every run shares one y-scale: a run whose full - reset
moves by +-0.15 looks flat next to one that climbs to +1.5, as it should. Each run has its own colour from a
fixed palette (the demo's labels always get the same one), never shared with another run of the figure. The
figures of the training callbacks and the TensorBoard charts per bin scale every run on its own, which makes
the same question take one chart per bin and a careful look at each axis.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from recurlen.util.tensorboard import write_event_dir

COMPARE_PNG = "compare_full_minus_reset.png"
COMPARE_TB_DIR = "compare"
"""Event directory (under the output directory) that TensorBoard lists as a run named .../compare."""
COMPARE_TAG = "compare/full_minus_reset_and_loss_by_position"
FLAT_TOL = 0.05
"""|full - reset| up to this (nats/token) counts as flat: no harm from the longer context (the report's verdict)."""

KNOWN_COLORS = {
    "base": "#000000", "baseline": "#000000", "pretrain": "#000000",
    "none": "#d62728",            # red: plain fine-tuning, expected to fail like the base
    "random_noise": "#ff7f0e",    # orange
    "fitted_noise": "#9467bd",    # purple
    "state_passing": "#1f77b4",   # blue
    "tbptt": "#2ca02c",           # green
}
"""The demo's labels (and intervention names) keep their colour from figure to figure."""
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f", "#000000", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5")
"""The other runs', in order; past its end, evenly spaced hues (still one colour per run)."""


def assign_colors(labels: Sequence[str]) -> list[str]:
    """One distinct colour per label: a known label's own colour when no earlier run took it, else the palette's
    next free one (two runs labelled after the same intervention, e.g. 780m-tbptt and 1.3b-tbptt, differ)."""
    taken: set[str] = set()
    wanted = [_known_color(label) for label in labels]
    out: list[str | None] = [None] * len(labels)
    for i, color in enumerate(wanted):
        if color is not None and color not in taken:
            out[i] = color
            taken.add(color)
    free = [c for c in PALETTE if c not in taken]
    missing = [i for i, c in enumerate(out) if c is None]
    if len(missing) > len(free):
        extra = len(missing) - len(free)
        hues = [to_hex(colormaps["hsv"](k / extra)) for k in range(extra)]
        free += [c for c in hues if c not in taken and c not in free]
    for i, color in zip(missing, free):
        out[i] = color
    return [str(c) for c in out]


def _known_color(label: str) -> str | None:
    if label in KNOWN_COLORS:
        return KNOWN_COLORS[label]
    # "780m-state_passing", "post/tbptt": the longest intervention name inside the label.
    hits = [k for k in KNOWN_COLORS if k in label and len(k) > 4]
    return KNOWN_COLORS[max(hits, key=len)] if hits else None


def _bins(run: dict) -> list[dict]:
    return (run.get("positionwise") or {}).get("bins") or []


def bin_position(row: dict, train_len: int) -> float:
    """Where a bin sits on the comparison's x-axis: 0 for [0,T), k + 1 for [2^k T, 2^(k+1) T) (bins double)."""
    start = row["start"] / train_len
    return 0.0 if start < 1 else math.log2(start) + 1.0


def comparison_data(runs: Sequence[dict]) -> dict:
    """What the comparison figure plots: per run its label, colour, and per quantity (x, y) in bin order.

    {"bins": [bin names in order], "runs": [{"label", "color", "fix", "full_minus_reset": {"x", "y"},
    "loss": {"x", "y"}, "worst_past_T": max full - reset past T or None}]}; runs without position-wise bins are
    left out."""
    shown = [r for r in runs if _bins(r) and r.get("train_len")]
    names: dict[float, str] = {}
    out = []
    for run, color in zip(shown, assign_colors([str(r.get("label", "run")) for r in shown])):
        T = run["train_len"]
        rows = _bins(run)
        for row in rows:
            names.setdefault(bin_position(row, T), row["name"])
        past = [r for r in rows if r["start"] >= T and r.get("full_minus_reset") is not None]
        full = [r for r in rows if r.get("loss") is not None]
        out.append({
            "label": str(run.get("label", "run")), "color": color, "fix": bool(run.get("fix")),
            "full_minus_reset": {"x": [bin_position(r, T) for r in past], "y": [r["full_minus_reset"] for r in past]},
            "loss": {"x": [bin_position(r, T) for r in full], "y": [r["loss"] for r in full]},
            "worst_past_T": max((r["full_minus_reset"] for r in past), default=None),
        })
    return {"bins": [names[x] for x in sorted(names)], "positions": sorted(names), "runs": out}


def plot_comparison(runs: Sequence[dict], *, flat_tol: float = FLAT_TOL) -> Figure:
    """full - reset (left) and loss (right) against position in units of T, all runs on shared axes."""
    data = comparison_data(runs)
    fig = Figure(figsize=(11, 4.5), layout="constrained")  # 1100 px in TensorBoard: fits a 1600 px window
    ax_fmr, ax_loss = fig.subplots(1, 2, sharex=True)
    if not data["runs"]:
        ax_fmr.text(0.5, 0.5, "no position-wise results in these runs", ha="center", va="center",
                    transform=ax_fmr.transAxes)
        return fig
    has_fmr = any(r["full_minus_reset"]["x"] for r in data["runs"])
    ax_fmr.axhspan(-flat_tol, flat_tol, color="0.88", linewidth=0,
                   label=f"flat: within +-{flat_tol:g} (below: the context helps)")
    ax_fmr.axhline(0.0, color="0.3", linewidth=0.8)
    for run in data["runs"]:
        worst = run["worst_past_T"]
        suffix = "" if worst is None else f"  (max past T {worst:+.2f})"
        fmr, loss = run["full_minus_reset"], run["loss"]
        style = "--" if run["fix"] else "-"  # a training-free fix (results.json's "fix"): dashed beside the runs
        if fmr["x"]:
            ax_fmr.plot(fmr["x"], fmr["y"], marker="o", markersize=4, linewidth=2, color=run["color"],
                        label=run["label"] + suffix, linestyle=style)
        ax_loss.plot(loss["x"], loss["y"], marker="o", markersize=4, linewidth=2, color=run["color"],
                     label=run["label"], linestyle=style)
    for ax in (ax_fmr, ax_loss):
        ax.axvline(0.5, color="0.5", linestyle=":", linewidth=1)  # the training context ends here
        ax.annotate("T", (0.5, 0.0), xycoords=("data", "axes fraction"), xytext=(2, 4), textcoords="offset points",
                    color="0.4", fontsize=9)
        ax.set_xticks(data["positions"], data["bins"])
        ax.set_xlabel("position in units of the training context T (dotted: T)")
        ax.grid(alpha=0.3)
    ax_fmr.set_xlim(-0.3, max(data["positions"]) + 0.3)
    ax_fmr.set_ylabel("loss(full) - loss(reset every T)  [nats/token]")
    ax_fmr.set_title("full - reset: flat past T = length-generalizes; rising = fails" if has_fmr else
                     "full - reset: no reset control in these results")
    ax_loss.set_ylabel("loss, full context  [nats/token]")
    ax_loss.set_title("loss by position (bin to bin: mostly content)")
    ax_fmr.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Which run stays flat past T?  {len(data['runs'])} runs; each panel has one y-axis for all of them",
                 fontsize=11)
    return fig


def write_comparison_tensorboard(runs: Sequence[dict], out_dir: str | os.PathLike) -> Path:
    """The comparison as the image of a TensorBoard run out_dir/compare/, with the numbers as a Markdown table in
    its Text tab (the PNG, compare_full_minus_reset.png, comes with the other plots: recurlen.diagnostics.plots)."""
    return write_event_dir(Path(out_dir) / COMPARE_TB_DIR, figures={COMPARE_TAG: plot_comparison(runs)},
                           texts={"compare/full_minus_reset_table": comparison_table(runs)})


def comparison_table(runs: Sequence[dict]) -> str:
    """full - reset per bin past T, one row per run, as Markdown (TensorBoard's Text tab renders it)."""
    data = comparison_data(runs)
    names = [n for n, x in zip(data["bins"], data["positions"]) if x >= 1]
    lines = ["| run | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for run in data["runs"]:
        by_x = dict(zip(run["full_minus_reset"]["x"], run["full_minus_reset"]["y"]))
        cells = [_cell(by_x.get(x)) for x, n in zip(data["positions"], data["bins"]) if x >= 1]
        lines.append(f"| {run['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:+.3f}"


__all__ = ["COMPARE_PNG", "COMPARE_TAG", "COMPARE_TB_DIR", "FLAT_TOL", "assign_colors", "comparison_data",
           "comparison_table", "plot_comparison",
           "write_comparison_tensorboard"]
