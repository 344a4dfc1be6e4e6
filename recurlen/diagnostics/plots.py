"""Plots of evaluation results; every function takes run entries (dicts), never models.

A run entry is one element of results.json's "runs" list (see recurlen.evaluation.runner), so the
same functions draw one fresh evaluation, the diagnostics of a training callback, or several
results.json files compared side by side (baseline vs interventions) in a report:

    runs = load_runs(["eval/baseline", "eval/state_passing/results.json"])
    plot_positionwise(runs).savefig("ppl.png")

With several runs the first plot is the comparison (recurlen.diagnostics.compare): full - reset and loss of every
run on shared axes in units of T, also written as a TensorBoard run <out_dir>/compare.

Figures are matplotlib.figure.Figure objects built without pyplot: no GUI backend, no global
figure registry to leak memory in a long training run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from recurlen.diagnostics.compare import COMPARE_PNG, assign_colors, plot_comparison, write_comparison_tensorboard
from recurlen.diagnostics.state_stats import STATE_STATS
from recurlen.util.atomic_files import save_figure

RESULTS_NAME = "results.json"
PLOT_NAMES = {
    "compare": COMPARE_PNG,
    "ppl": "ppl_by_position.png",
    "loss": "loss_by_position.png",
    "full_minus_reset": "full_minus_reset.png",
    "state": "state_by_position.png",
    "effrem": "effrem.png",
}
STAT_TITLES = {"ssm_norm": "SSM state norm", "ssm_std": "SSM state std", "conv_norm": "conv state norm",
               "conv_std": "conv state std"}


def results_file(path: str | os.PathLike) -> Path:
    """A results.json file, given it or the directory holding it."""
    p = Path(path)
    p = p / RESULTS_NAME if p.is_dir() else p
    if not p.is_file():
        raise FileNotFoundError(f"no {RESULTS_NAME} at {p}")
    return p


def load_runs(paths: Iterable[str | os.PathLike]) -> list[dict]:
    """All run entries of several results.json files (or directories holding one), in order."""
    runs = []
    for path in paths:
        p = results_file(path)
        data = json.loads(p.read_text())
        if "runs" not in data:
            raise ValueError(f"{p} is not a recurlen results file (no 'runs' key)")
        runs.extend(data["runs"])
    return runs


def _values(xs: Sequence) -> np.ndarray:
    # JSON has no NaN: results.json stores non-finite numbers as null.
    return np.array([np.nan if v is None else v for v in xs], dtype=float)


def _bin_rows(run: dict) -> list[dict]:
    pw = run.get("positionwise") or {}
    return pw.get("log_bins") or pw.get("bins") or []


def _bin_centers(rows: Sequence[dict]) -> np.ndarray:
    # Geometric centre of [start, end) in "tokens of context" (position p has p + 1), for a log axis.
    return np.array([math.sqrt((r["start"] + 1) * r["end"]) for r in rows])


def _mark_train_len(ax, runs: Sequence[dict], colors: Sequence[str]) -> None:
    for run, color in zip(runs, colors):
        if run.get("train_len"):
            ax.axvline(run["train_len"], color=color, linestyle=":", linewidth=1)


def _colors(runs: Sequence[dict]) -> list[str]:
    # The comparison's colours: a run keeps its colour in every plot, and no two runs share one.
    return assign_colors([str(r.get("label", "run")) for r in runs])


def _empty(fig: Figure, ax, what: str) -> Figure:
    ax.text(0.5, 0.5, f"no {what} in these results", ha="center", va="center", transform=ax.transAxes)
    return fig


def _finish(fig: Figure, ax, shown: Sequence, what: str) -> Figure:
    """A legend and a grid, or the empty-plot note when no run had `what`."""
    if not shown:
        return _empty(fig, ax, what)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def plot_positionwise(runs: Sequence[dict], *, metric: str = "ppl") -> Figure:
    """Loss or perplexity vs position (log-spaced bins), one line per run; dotted lines at T."""
    if metric not in ("ppl", "loss"):
        raise ValueError(f"metric must be 'ppl' or 'loss'; got {metric!r}")
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    shown = [r for r in runs if _bin_rows(r)]
    colors = _colors(shown)
    for run, color in zip(shown, colors):
        rows = _bin_rows(run)
        ax.plot(_bin_centers(rows), _values([r[metric] for r in rows]), marker="o", markersize=3, color=color,
                label=run.get("label", "run"))
    _mark_train_len(ax, shown, colors)
    ax.set_xscale("log")
    ax.set_xlabel("position (tokens of context); dotted: training context T")
    ax.set_ylabel("perplexity" if metric == "ppl" else "loss (nats / token)")
    ax.set_title(f"{'Perplexity' if metric == 'ppl' else 'Loss'} by position")
    return _finish(fig, ax, shown, "position-wise results")


def plot_full_minus_reset(runs: Sequence[dict]) -> Figure:
    """Loss(full context) - loss(state reset every T) by position: > 0 means longer context hurts."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    shown = [r for r in runs if _bin_rows(r) and "full_minus_reset" in _bin_rows(r)[0]]
    colors = _colors(shown)
    for run, color in zip(shown, colors):
        # Within [0,T) the reset changes nothing (full - reset = 0 by construction): the curve starts at T.
        rows = [r for r in _bin_rows(run) if r["end"] > (run.get("train_len") or 0)]
        ax.plot(_bin_centers(rows), _values([r["full_minus_reset"] for r in rows]), marker="o", markersize=3,
                color=color, label=run.get("label", "run"))
    _mark_train_len(ax, shown, colors)
    if shown and shown[0].get("train_len"):
        ax.axvspan(1, shown[0]["train_len"], color="0.85", alpha=0.6, linewidth=0, label="[0,T): full = reset")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("position (tokens of context); dotted: training context T")
    ax.set_ylabel("loss(full) - loss(reset every T)  [nats]")
    ax.set_title("Does longer context hurt? (> 0: yes, <= 0: length-generalizes)")
    return _finish(fig, ax, shown, "reset-control results")


def plot_state(runs: Sequence[dict], *, stats: Sequence[str] = STATE_STATS) -> Figure:
    """One panel per statistic: the layer mean (solid) and every layer (faint), one colour per run."""
    unknown = [s for s in stats if s not in STATE_STATS]
    if unknown:
        raise ValueError(f"unknown state statistics {unknown}; allowed: {list(STATE_STATS)}")
    cols = 2 if len(stats) > 1 else 1
    fig = Figure(figsize=(6 * cols, 3.6 * math.ceil(len(stats) / cols)), layout="constrained")
    axes = fig.subplots(math.ceil(len(stats) / cols), cols, squeeze=False).ravel()
    shown = [r for r in runs if r.get("state")]
    colors = _colors(shown)
    for ax, stat in zip(axes, stats):
        for run, color in zip(shown, colors):
            positions = np.array(run["state"]["positions"], dtype=float)
            curves_KS = np.array([_values(c) for c in run["state"][stat]])
            label_every = max(1, math.ceil(len(curves_KS) / 8))  # at most ~8 layer labels per run
            for layer, curve_S in enumerate(curves_KS):
                ax.plot(positions, curve_S, color=color, alpha=0.25, linewidth=0.8)
                if layer % label_every == 0 or layer == len(curves_KS) - 1:
                    ax.annotate(f"L{layer}", (positions[-1], curve_S[-1]), xytext=(2, 0), textcoords="offset points",
                                color=color, fontsize=6, va="center")
            ax.plot(positions, curves_KS.mean(axis=0), color=color, linewidth=2,
                    label=f"{run.get('label', 'run')} (mean of {len(curves_KS)} layers; faint: L0, L1, ...)")
        _mark_train_len(ax, shown, colors)
        ax.set_xscale("log")
        # Log scale: runs whose states differ by orders of magnitude stay readable side by side.
        ax.set_yscale("log")
        ax.set_xlabel("tokens read")
        ax.set_title(STAT_TITLES[stat])
        ax.grid(alpha=0.3)
        if shown:
            ax.legend(fontsize=7)
    if not shown:
        return _empty(fig, axes[0], "state statistics")
    return fig


def plot_effrem(runs: Sequence[dict]) -> Figure:
    """EffRem_T(t) vs t, one line per run (lower: the prediction at T depends less on x[0:t])."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    shown = [r for r in runs if r.get("effrem")]
    for run, color in zip(shown, _colors(shown)):
        eff = run["effrem"]
        ax.plot(eff["t"], _values(eff["effrem"]), marker="o", markersize=3, color=color,
                label=f"{run.get('label', 'run')} (T={eff['T']})")
    ax.set_xlabel("t (tokens dropped from the start of the context)")
    ax.set_ylabel("EffRem_T(t) = TV(q(.|x[0:T]), q(.|x[t:T]))")
    ax.set_ylim(bottom=0)
    ax.set_title("Effective Remembrance")
    return _finish(fig, ax, shown, "EffRem results")


def figures_for(runs: Sequence[dict]) -> dict[str, Figure]:
    """Every plot for which the runs have data, keyed like PLOT_NAMES."""
    figs: dict[str, Figure] = {}
    if sum(1 for r in runs if (r.get("positionwise") or {}).get("bins")) > 1:
        figs["compare"] = plot_comparison(runs)  # several runs: the one figure that compares them, first
    if any(_bin_rows(r) for r in runs):
        figs["ppl"] = plot_positionwise(runs, metric="ppl")
        figs["loss"] = plot_positionwise(runs, metric="loss")
        if any("full_minus_reset" in _bin_rows(r)[0] for r in runs if _bin_rows(r)):
            figs["full_minus_reset"] = plot_full_minus_reset(runs)
    if any(r.get("state") for r in runs):
        figs["state"] = plot_state(runs)
    if any(r.get("effrem") for r in runs):
        figs["effrem"] = plot_effrem(runs)
    return figs


def write_plots(runs: Sequence[dict], out_dir: str | os.PathLike, *, tensorboard: bool = True) -> dict[str, Path]:
    """All available plots of `runs` as PNGs in out_dir -> {kind: path}; with several runs also the comparison
    as a TensorBoard run, out_dir/compare (recurlen.diagnostics.compare), unless tensorboard=False."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = figures_for(runs)
    if "compare" in figs and tensorboard:
        write_comparison_tensorboard(runs, out)
    return {kind: save_figure(fig, out / PLOT_NAMES[kind]) for kind, fig in figs.items()}
