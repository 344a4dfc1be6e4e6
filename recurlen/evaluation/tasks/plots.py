"""Figures of task results; each takes the results dict that results.json holds, never a model.

Figures are matplotlib Figure objects built without pyplot (no GUI backend, no global registry).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from recurlen.evaluation.tasks.common import length_label


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
    """Left: the `single` reading by string length; right: the `stream` reading. Both metrics (teacher-forced
    solid, greedy dashed), mean +- std over seeds, per intervention."""
    lengths, n = results["lengths"], results["train_length"]
    fig = Figure(figsize=(10.0, 4.0))
    ax, ax_stream = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = list(results["summary"])
    for i, name in enumerate(names):
        s = results["summary"][name]
        for metric, style in (("char_acc", "-"), ("greedy_char_acc", "--")):
            cell = s["single"][metric]
            mean = np.array([cell["mean"][str(L)] for L in lengths])
            std = np.array([cell["std"][str(L)] for L in lengths])
            ax.errorbar(lengths, mean, yerr=std, marker="o", capsize=3, linestyle=style, color=f"C{i}",
                        label=f"{name} {metric} ({len(s['seeds'])} seeds)")
            if metric in s["stream"]:
                x = i + (0.2 if metric == "greedy_char_acc" else -0.2)
                ax_stream.bar(x, s["stream"][metric]["mean"], width=0.4, yerr=s["stream"][metric]["std"], capsize=3,
                              color=f"C{i}", alpha=1.0 if metric == "char_acc" else 0.5,
                              label=f"{name} {metric}")
    ax.axvline(n, color="k", linestyle="--", linewidth=1, label=f"trained up to n={n}")
    for a in (ax, ax_stream):
        if results.get("chance") is not None:
            a.axhline(results["chance"], color="gray", linestyle=":", linewidth=1, label="chance")
        a.set_ylim(-0.02, 1.02)
        a.set_ylabel("character accuracy")
        a.legend(fontsize=7)
    ax.set_xlabel("string length")
    ax.set_title("copying, reading `single`")
    ax_stream.set_xticks(range(len(names)), names)
    factor, t = results.get("stream_factor"), results.get("train_seq_len")
    ax_stream.set_title(f"copying, reading `stream` (examples past {factor - 1} x T, T = {t})" if factor else
                        "copying, reading `stream`")
    return fig


__all__ = ["plot_babilong", "plot_copying", "plot_passkey"]
