"""Figures of task results; each takes the results dict that results.json holds, never a model.

Figures are matplotlib Figure objects built without pyplot (no GUI backend, no global registry).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from recurlen.tasks.common import length_label


def _heatmap(matrix: list[list[float]], *, rows: list[str], cols: list[str], title: str, xlabel: str,
             ylabel: str, train_col: int | None = None) -> Figure:
    data = np.array([[np.nan if v is None else v for v in row] for row in matrix], dtype=float)
    fig = Figure(figsize=(1.0 + 0.9 * max(4, len(cols)), 1.2 + 0.55 * max(2, len(rows))))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(data, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            if np.isfinite(data[i, j]):
                ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=8)
    if train_col is not None:
        ax.axvline(train_col + 0.5, color="k", linestyle="--", linewidth=1)
        xlabel += "   (dashed: end of the training context)"
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="accuracy")
    return fig


def _train_col(lengths: list[int], train_len: int | None) -> int | None:
    """Index of the last evaluated length within the training context (None if none / unknown)."""
    if not train_len:
        return None
    inside = [i for i, n in enumerate(lengths) if n <= train_len]
    return inside[-1] if inside and inside[-1] < len(lengths) - 1 else None


def plot_passkey(results: dict) -> Figure:
    lengths = results["lengths"]
    title = f"passkey retrieval ({results['trials']} trials per cell)"
    if results.get("train_len"):
        title += f", trained at {results['train_len']} tokens"
    return _heatmap(results["accuracy"], rows=[f"{d:g}" for d in results["depths"]],
                    cols=[length_label(n) for n in lengths], title=title, xlabel="prompt length (tokens)",
                    ylabel="depth of the key", train_col=_train_col(lengths, results.get("train_len")))


def plot_babilong(results: dict) -> Figure:
    lengths = results["lengths"]
    matrix = results["accuracy"] + [[results["mean_accuracy_by_length"][str(n)] for n in lengths]]
    title = "BABILong accuracy"
    if results.get("train_len"):
        title += f", trained at {results['train_len']} tokens"
    return _heatmap(matrix, rows=list(results["tasks"]) + ["mean"], cols=results["labels"], title=title,
                    xlabel="length", ylabel="task", train_col=_train_col(lengths, results.get("train_len")))


def plot_copying(results: dict) -> Figure:
    """Character accuracy by string length, mean +- std over seeds, per intervention."""
    lengths, n = results["lengths"], results["train_length"]
    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    for name, s in results["summary"].items():
        mean = np.array([s["mean"][str(L)] for L in lengths])
        std = np.array([s["std"][str(L)] for L in lengths])
        ax.errorbar(lengths, mean, yerr=std, marker="o", capsize=3, label=f"{name} ({len(s['seeds'])} seeds)")
    ax.axvline(n, color="k", linestyle="--", linewidth=1, label=f"trained up to n={n}")
    if results.get("chance") is not None:
        ax.axhline(results["chance"], color="gray", linestyle=":", linewidth=1, label="chance")
    ax.set_xlabel("string length")
    ax.set_ylabel("character accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("synthetic copying")
    ax.legend(fontsize=8)
    return fig


__all__ = ["plot_babilong", "plot_copying", "plot_passkey"]
