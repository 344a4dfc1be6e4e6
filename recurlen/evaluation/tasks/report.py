"""The long-context tasks' section of `recurlen report`: passkey, BABILong, copying and NIAH results as tables.

A task result is the results.json that `recurlen passkey|babilong|copying` writes (format
recurlen.evaluation.tasks.<task>/N). Several results of one task (e.g. fitted_noise vs none, or a fine-tuned run vs
the zero-shot checkpoint) are compared in one table; each result's own figure is copied next to the report.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from recurlen.evaluation.tasks.common import length_label

TASK_FORMAT_PREFIX = "recurlen.tasks."
TASK_ORDER = ("passkey", "babilong", "copying", "niah")


def is_task_result(data: dict) -> bool:
    return str(data.get("format", "")).startswith(TASK_FORMAT_PREFIX)


def check_task_result(data: dict, where: str) -> dict:
    task = data.get("task")
    if task not in TASK_ORDER:
        raise ValueError(f"{where}: task result with task={task!r}; known tasks: {list(TASK_ORDER)}")
    needed = {"passkey": ("lengths", "depths", "accuracy"), "babilong": ("lengths", "tasks", "accuracy"),
              "copying": ("lengths", "summary", "readings"),
              "niah": ("lengths", "depths", "tasks", "accuracy", "accuracy_by_length")}[task]
    missing = [k for k in needed if k not in data]
    if missing:
        raise ValueError(f"{where}: {task} result lacks {missing}; is it a complete recurlen {task} results.json?")
    return data


def result_label(data: dict) -> str:
    """The run directory's (or checkpoint's) name: runs/passkey/tiny-fitted_noise -> tiny-fitted_noise."""
    return Path(str(data.get("model", "?")).rstrip("/")).name or "?"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _header(first: str, columns: Sequence[str]) -> list[str]:
    return [_row([first, *columns]), "|---" * (len(columns) + 1) + "|"]


def _by_length(data: dict, key: str) -> dict[int, float]:
    return {int(k): v for k, v in (data.get(key) or {}).items()}


def _passkey_lines(results: Sequence[dict]) -> list[str]:
    lines = ["### Passkey retrieval", "",
             "Accuracy of the 5-digit key (greedy decoding with the state carried), mean over depths, by prompt "
             "length in tokens.", ""]
    lengths = sorted({n for r in results for n in r["lengths"]})
    lines += _header("run (T)", [length_label(n) for n in lengths])
    for r in results:
        mean = _by_length(r, "mean_accuracy_by_length")
        lines.append(_row([f"{result_label(r)} ({r.get('train_len', '?')})", *(_pct(mean.get(n)) for n in lengths)]))
    for r in results:
        lines += ["", f"{result_label(r)}: accuracy by depth ({r.get('trials', '?')} trials per cell)", ""]
        lines += _header("depth", [length_label(n) for n in r["lengths"]])
        lines += [_row([f"{d:g}", *(_pct(v) for v in row)]) for d, row in zip(r["depths"], r["accuracy"])]
    return lines + [""]


def _babilong_lines(results: Sequence[dict]) -> list[str]:
    lines = ["### BABILong", "", "Exact label-set accuracy by task and context length (tokens).", ""]
    for r in results:
        labels = r.get("labels") or [length_label(n) for n in r["lengths"]]
        lines += [f"{result_label(r)} (source: {r.get('source', '?')}, T = {r.get('train_len', '?')})", ""]
        lines += _header("task", labels)
        lines += [_row([task, *(_pct(v) for v in row)]) for task, row in zip(r["tasks"], r["accuracy"])]
        mean = _by_length(r, "mean_accuracy_by_length")
        lines += [_row(["mean", *(_pct(mean.get(n)) for n in r["lengths"])]), ""]
    return lines


def _ms(cell: dict | None) -> str:
    return "-" if not cell else f"{cell['mean']:.3f} +- {cell['std']:.3f}"


def _copying_lines(results: Sequence[dict]) -> list[str]:
    lines = ["### Synthetic copying", ""]
    for r in results:
        n, headline = r.get("train_length"), r.get("headline_length")
        lines += [f"{result_label(r)}: character accuracy, mean +- std over seeds; trained on strings of up to "
                  f"n = {n} symbols in rows of T = {r.get('train_seq_len')} tokens (chance {_pct(r.get('chance'))}). "
                  "char_acc: teacher-forced (the reference's metric); greedy_char_acc: greedy decoding.", ""]
        readings = r.get("readings") or {}
        lines += [f"Reading `single`: {readings.get('single', 'one string of L symbols')}; headline L = {headline}.",
                  ""]
        lines += _header("intervention / metric", [str(n_) for n_ in r["lengths"]])
        for name, s in r["summary"].items():
            for metric, cell in s["single"].items():
                mean, std = _by_length(cell, "mean"), _by_length(cell, "std")
                lines.append(_row([f"{name} {metric}", *(f"{mean[k]:.3f} +- {std.get(k, 0.0):.3f}" if k in mean
                                                         else "-" for k in r["lengths"])]))
        lines += ["", f"Reading `stream`: {readings.get('stream', '')}.", ""]
        lines += _header("intervention", ["char_acc", "greedy_char_acc"])
        for name, s in r["summary"].items():
            lines.append(_row([name, _ms(s["stream"].get("char_acc")), _ms(s["stream"].get("greedy_char_acc"))]))
        paired = {name: s["paired"] for name, s in r["summary"].items() if s.get("paired")}
        if paired:
            from recurlen.evaluation.tasks.paired import describe

            lines += ["", "Paired by seed (difference of char_acc against the first intervention; Student's t on the "
                      "per-seed differences, and the exact sign-flip test):", ""]
            for name, tests in paired.items():
                for reading, label in (("single", f"single at L = {headline}"), ("stream", "stream")):
                    test = tests[reading].get("char_acc")
                    if test:
                        lines.append(f"- {name} - {tests['against']}, {label}: {describe(test)}")
        paper = r.get("paper") or {}
        if paper:
            lines += ["", "Paper (Mamba-2, > 3x the training length, character accuracy): "
                      + "; ".join(f"{k} {v['mean']:.2f} +- {v['std']:.2f}" for k, v in paper.items())]
        lines.append("")
    return lines


def _niah_lines(results: Sequence[dict]) -> list[str]:
    from recurlen.evaluation.tasks.niah_eval import niah_lines

    return niah_lines(results, result_label)


SECTIONS = {"passkey": _passkey_lines, "babilong": _babilong_lines, "copying": _copying_lines, "niah": _niah_lines}


def _copy_figure(data: dict, out: Path, index: int) -> str | None:
    figure, where = (data.get("plots") or {}).get("figure"), data.get("_dir")
    if not figure or not where or not (Path(where) / figure).is_file():
        return None
    name = f"{data['task']}_{index}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', result_label(data))}.png"
    if (Path(where) / figure).resolve() != (out / name).resolve():
        shutil.copyfile(Path(where) / figure, out / name)
    return name


def task_sections(results: Sequence[dict], out: Path) -> list[str]:
    """Markdown lines for every task present, in TASK_ORDER, with the figures copied into `out`."""
    if not results:
        return []
    lines = ["## Long-context tasks", ""]
    for task in TASK_ORDER:
        group = [r for r in results if r["task"] == task]
        if not group:
            continue
        lines += SECTIONS[task](group)
        for i, r in enumerate(group):
            name = _copy_figure(r, out, i)
            if name:
                lines += [f"![{task} {result_label(r)}]({name})", ""]
    return lines


def strip_private(data: dict) -> dict:
    """The result as stored in the merged results.json (without the reader's bookkeeping)."""
    return {k: v for k, v in data.items() if not k.startswith("_")}
