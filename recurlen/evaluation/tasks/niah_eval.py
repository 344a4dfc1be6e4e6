"""The needle-in-a-haystack family evaluated: scores per (task, depth, length), the heatmaps, the report's tables.

    res = evaluate_niah(model, tokenizer, cfg.task.niah, lengths=[256, 1024], trials=8, seed=1234, ...)
    fig = plot_niah(results)            # one depth x length heatmap per task, and their mean
    lines = niah_lines([results, ...])  # the report's section: one table per evaluated model (its name)

Answers are read by greedy decoding with the recurrent state (recurlen.evaluation.tasks.common.greedy_answers), as
passkey's are. Every prompt is a pure function of (seed, task, length, depth, trial): models evaluated with the same
seed see the same prompts, so their cells pair up.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from recurlen.evaluation.tasks.common import greedy_answers, length_label
from recurlen.evaluation.tasks.niah import Haystack, NiahBuilder, NiahPrompt, score_niah
from recurlen.evaluation.tasks.niah_config import NIAH_TASKS, NiahConfig
from recurlen.models.interface import RecurrentLM
from recurlen.util.errors import UserError
from recurlen.util.tokenizers import Tokenizer

log = logging.getLogger(__name__)


def cell_prompts(builder: NiahBuilder, task: str, *, length: int, depth: float, trials: int, seed: int,
                 haystack: Haystack) -> list[NiahPrompt]:
    """The `trials` prompts of one cell; trial i hides in haystack window i at every length and depth."""
    rng = np.random.default_rng([seed, NIAH_TASKS.index(task), length, int(round(depth * 1000))])
    return [builder.build(rng, builder.sample(rng, task), length=length, depth=depth, haystack=haystack, index=i)
            for i in range(trials)]


def check_lengths(builder: NiahBuilder, tasks: Sequence[str], lengths: Sequence[int]) -> None:
    """A UserError when a length cannot hold a task's intro, needles and question (the haystack fills the rest):
    `recurlen niah` says it before it trains, not after."""
    short = {t: builder.min_length(t) for t in tasks if min(lengths) < builder.min_length(t)}
    if short:
        raise UserError(f"niah lengths {sorted(n for n in lengths if n < max(short.values()))} are too short for "
                        f"the needles and the question of {sorted(short)}; with this tokenizer need L >= "
                        f"{max(short.values())} (raise task.lengths, or leave those tasks out of task.niah.tasks)")


def evaluate_niah(model: RecurrentLM, tokenizer: Tokenizer, cfg: NiahConfig, *, lengths: list[int], trials: int,
                  seed: int, batch_size: int, chunk_len: int, haystack: Haystack, progress: bool = True) -> dict:
    """Score (fraction of the expected values recalled) per (task, depth, length) cell, averaged over trials."""
    builder = NiahBuilder(tokenizer, cfg)
    check_lengths(builder, cfg.tasks, lengths)
    cells = []
    grid = [(t, n, d) for t in cfg.tasks for n in lengths for d in cfg.depths]
    for i, (task, length, depth) in enumerate(grid):
        prompts = cell_prompts(builder, task, length=length, depth=depth, trials=trials, seed=seed,
                               haystack=haystack)
        new = cfg.max_new_tokens or max(len(p.answer_ids) for p in prompts) + 2
        outs = greedy_answers(model, [p.ids for p in prompts], max_new_tokens=new, stop_id=tokenizer.eos_id,
                              batch_size=batch_size, chunk_len=chunk_len,
                              desc=f"niah {task} L={length} depth={depth:g} ({i + 1}/{len(grid)})" if progress
                              else None)
        texts = [tokenizer.decode(o) for o in outs]
        scores = [score_niah(t, p.sample.expected, p.sample.kind) for t, p in zip(texts, prompts)]
        cells.append({"task": task, "length": length, "depth": depth, "trials": trials,
                      "accuracy": float(np.mean(scores)), "all_correct": int(sum(s == 1.0 for s in scores)),
                      # trial by trial (the fraction of the values recalled): anyone can recompute an interval
                      "scores": [float(s) for s in scores],
                      "examples": [{"expected": p.sample.expected, "output": t} for p, t in zip(prompts[:3], texts)]})
        log.info("niah %s L=%d depth=%.2f: accuracy %.3f (%d/%d fully right)", task, length, depth,
                 cells[-1]["accuracy"], cells[-1]["all_correct"], trials)
    acc = {(c["task"], c["depth"], c["length"]): c["accuracy"] for c in cells}
    by_length = {t: {str(n): float(np.mean([acc[(t, d, n)] for d in cfg.depths])) for n in lengths}
                 for t in cfg.tasks}
    return {"tasks": list(cfg.tasks), "lengths": list(lengths), "depths": list(cfg.depths), "trials": trials,
            "haystack": haystack.kind, "cells": cells,
            "accuracy": {t: [[acc[(t, d, n)] for n in lengths] for d in cfg.depths] for t in cfg.tasks},
            "accuracy_by_length": by_length,
            "mean_accuracy_by_length": {str(n): float(np.mean([by_length[t][str(n)] for t in cfg.tasks]))
                                        for n in lengths},
            "mean_accuracy": float(np.mean(list(acc.values())))}


def mean_matrix(results: dict) -> list[list[float]]:
    """Depth x length accuracy averaged over the tasks."""
    return np.mean([results["accuracy"][t] for t in results["tasks"]], axis=0).tolist()


def plot_niah(results: dict) -> Figure:
    """One depth x length heatmap per task and, with several tasks, one of their mean; a dashed line ends the training
    context (when some evaluated lengths are inside it and some beyond)."""
    panels = [(t, results["accuracy"][t]) for t in results["tasks"]]
    panels += [("mean over tasks", mean_matrix(results))] if len(panels) > 1 else []
    lengths, depths = results["lengths"], results["depths"]
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(1.2 + 0.75 * max(3, len(lengths)) * cols, 0.9 + (0.45 * max(2, len(depths)) + 0.8) * rows))
    train = results.get("train_len")
    inside = [j for j, n in enumerate(lengths) if train and n <= train]
    dashed = bool(inside) and inside[-1] < len(lengths) - 1
    for k, (name, matrix) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, k + 1)
        data = np.array(matrix, dtype=float)
        im = ax.imshow(data, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(lengths)), [length_label(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=6)
        if dashed:
            ax.axvline(inside[-1] + 0.5, color="k", linestyle="--", linewidth=1)
        ax.set_title(name, fontsize=9)
        if k % cols == 0:
            ax.set_ylabel("depth of the needles")
        if k >= len(panels) - cols:
            ax.set_xlabel("prompt length (tokens)")
    title = f"needle in a haystack ({results['trials']} trials per cell, {results.get('haystack', '?')} haystack)"
    if train:
        title += f", trained at {train} tokens" + (" (dashed)" if dashed else "")
    fig.suptitle(title, fontsize=10)
    fig.colorbar(im, ax=fig.axes, label="accuracy", shrink=0.8)
    return fig


def _pct(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def niah_lines(results: Sequence[dict], label) -> list[str]:
    """The report's section: per evaluated model (named by `label(result)`, so a fix is one more name), the accuracy
    per task by length (mean over depths), then the mean over tasks by depth and length."""
    lines = ["### Needle in a haystack", "",
             "recurlen's needle-in-a-haystack tasks (after RULER's), generated offline: the fraction of the asked-for "
             "values recalled whole (greedy decoding with the state carried), by prompt length in tokens.", ""]
    for r in results:
        lengths = r["lengths"]
        head = [length_label(n) for n in lengths]
        lines += [f"{label(r)} (T = {r.get('train_len', '?')}, {r.get('haystack', '?')} haystack, "
                  f"{r.get('trials', '?')} trials per cell): mean over depths", "",
                  "| task | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
        for t in r["tasks"]:
            row = r["accuracy_by_length"][t]
            lines.append(f"| {t} | " + " | ".join(_pct(row.get(str(n))) for n in lengths) + " |")
        mean = r["mean_accuracy_by_length"]
        lines += ["| mean | " + " | ".join(_pct(mean.get(str(n))) for n in lengths) + " |", "",
                  f"{label(r)}: mean over tasks by depth", "", "| depth | " + " | ".join(head) + " |",
                  "|---" * (len(head) + 1) + "|"]
        lines += [f"| {d:g} | " + " | ".join(_pct(v) for v in row) + " |"
                  for d, row in zip(r["depths"], mean_matrix(r))]
        lines.append("")
    return lines


__all__ = ["cell_prompts", "check_lengths", "evaluate_niah", "mean_matrix", "niah_lines", "plot_niah"]
