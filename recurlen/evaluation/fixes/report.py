"""The report's section on training-free fixes: each fix beside the runs, with what it cost.

    lines = fixes_section(runs)     # runs: results.json run entries; [] when no entry is a fix's
    lines += fixes_task_lines(tasks)  # tasks: passkey / niah results.json; [] when none has "fixes"
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from recurlen.evaluation.evidence import IN_CONTEXT_REL_TOL, fmt_interval, in_context_cost, interval_check, run_verdict


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _bins(run: dict) -> list[dict]:
    return (run.get("positionwise") or {}).get("bins") or []


def fix_values(fix: dict) -> str:
    """The values a fix chose, in words: its scales, or its memory cap and how many entries it changed."""
    values = fix.get("values") or {}
    if "scales" in values:
        return "scales " + ", ".join(f"{s:.3g}" for s in values["scales"])
    if "memory_T" in values:
        cap = "none helped (unchanged)" if values["memory_T"] is None else f"{values['memory_T']:g} T"
        return f"memory cap {cap}, {values.get('entries_changed')} of {values.get('entries')} entries changed"
    if "global_channels" in values:  # longmamba
        words = (f"{sum(values['global_channels'])} of {sum(values['channels'])} channels global "
                 f"({', '.join(map(str, values['global_channels']))} per layer)")
        return words + ("" if values["filtered"] else f"; none filtered (target {values['target_len']} tokens)")
    if "multipliers" in values:  # stuffed_mamba
        words = ", ".join(f"{k} {v:g}" for k, v in values["multipliers"].items())
        cap = values.get("state_norm")
        return words + (f", state norm capped at {cap:g} x its norm at T" if cap is not None else "")
    return ""


def _cell(row: dict | None, key: str, spec: str) -> str:
    row = row or {}
    ci = fmt_interval(row.get(f"{key}_ci"), spec)
    return _fmt(row.get(key), spec) + (f" {ci}" if ci else "")


def _verdict(run: dict, base: dict | None) -> str:
    """The run's loss verdict and, for a fix, its in-context cost against its base, each read on its interval."""
    verdict = run_verdict(run)
    text = {"no context": "does not use context", None: "not measured"}.get(verdict.get("outcome"),
                                                                           verdict.get("outcome"))
    if verdict.get("outcome") == "undecided":
        text += f" at {verdict['num_sequences']}" + (f" (~{verdict['needed_sequences']} would decide)"
                                                   if verdict.get("needed_sequences") else "")
    cost = in_context_cost(run, base) if base is not None and run is not base else None
    if cost is not None:
        status = interval_check("", cost.value, cost.interval, "abs<=", IN_CONTEXT_REL_TOL, n=cost.n)["status"]
        word = {"pass": "within", "miss": "outside", "undecided": "undecided against"}[status]
        text += f"; [0,T) {cost.value:+.1%} {fmt_interval(cost.interval, '+.1%')} {word} {IN_CONTEXT_REL_TOL:.0%}"
    return text


def fixes_section(runs: Sequence[dict]) -> list[str]:
    """Markdown lines: every run and fix with in-context loss, full - reset per bin past T (with 95% intervals), its
    verdict read on them, and the fixes' cost."""
    fixed = [r for r in runs if r.get("fix")]
    if not fixed:
        return []
    names = [b["name"] for b in _bins(runs[0])]
    far = names[1:]
    by_label = {r["label"]: r for r in runs}
    lines = ["## Fixes that need no training", "",
             "Each fix is applied to a fresh copy of the run it names, calibrated on held-out sequences that are not "
             "the ones scored here, then evaluated like the runs. Cost: numbers the calibration chose, its wall "
             "time and forward passes (post-training updates every weight for its steps). Each full - reset cell "
             "has its 95% paired-bootstrap interval over the held-out sequences; the verdict reads them "
             "(fails / holds / between / undecided at n sequences), and a fix's in-context cost is against its base "
             "(the 8% bar). A loss verdict cannot tell remembering from forgetting: the retrieval arbiter "
             "(docs/evaluation.md) can.", "",
             "| run | kind | in-context loss " + names[0] + " | " + " | ".join(f"full - reset {n}" for n in far)
             + " | verdict | calibrated numbers | calibration s | forward passes |",
             "|---" * (7 + len(far)) + "|"]
    for run in runs:
        fix = run.get("fix")
        rows = {b["name"]: b for b in _bins(run)}
        cells = [_fmt((rows.get(names[0]) or {}).get("loss"), ".3f")]
        cells += [_cell(rows.get(n), "full_minus_reset", "+.3f") for n in far]
        cells.append(_verdict(run, by_label.get(fix["base"]) if fix else None))
        if fix:
            cal = fix.get("calibration") or {}
            cost = [str(fix.get("calibrated_parameters", "?")), _fmt(cal.get("seconds"), ".1f"),
                    str(cal.get("forward_passes", 0))]
            kind = f"{fix['name']} on {fix['base']}"
        else:
            cost, kind = ["-", "-", "-"], "run"
        lines.append(f"| {run['label']} | {kind} | " + " | ".join(cells + cost) + " |")
    lines += [""]
    for run in fixed:
        fix = run["fix"]
        cal = fix.get("calibration")
        how = (f"calibrated by {cal['method']} on {cal['windows']} windows of {cal['window_len']} tokens (from "
               f"{cal['data']['sequences']} x {cal['data']['length']} tokens), thresholds for {cal['target_len']} "
               f"tokens: loss {cal['loss_before']:.3f} -> {cal['loss_after']:.3f}" if cal and "windows" in cal else
               f"calibrated by {cal['method']} ({cal['steps']} steps, {cal['data']['sequences']} x "
               f"{cal['data']['length']} tokens): loss {cal['loss_before']:.3f} -> {cal['loss_after']:.3f}"
               if cal and cal.get("loss_before") is not None else
               f"{cal['method']} measured ({cal['data']['sequences']} x {cal['data']['length']} tokens), no search"
               if cal else "not calibrated (settings given)")
        lines.append(f"- {run['label']}: {fix['paper']}; {fix_values(fix)}; {how}")
    return lines + [""]


TASK_TITLES = {"passkey": "passkey accuracy (mean over depths)", "niah": "needle-in-a-haystack score (mean over "
                                                                            "tasks and depths)"}


def fixes_task_lines(tasks: Sequence[dict]) -> list[str]:
    """Markdown lines: for each passkey / niah result with fixes, the model and every fix by prompt length."""
    with_fixes = [t for t in tasks if t.get("fixes") and t.get("task") in TASK_TITLES]
    if not with_fixes:
        return []
    lines = ["## Fixes that need no training, on the tasks", "",
             "Each fix applied to a fresh copy of the model, calibrated on held-out text (not the task's prompts), "
             "then scored on the same prompts as the model. A fix that flattens full - reset but scores 0 past T "
             "keeps the loss by forgetting, not by remembering.", ""]
    for t in with_fixes:
        lengths = [int(n) for n in t["lengths"]]
        T = t.get("train_len")
        cols = [f"{n}" + (f" ({n / T:g}T)" if T else "") for n in lengths]
        lines += [f"{TASK_TITLES[t['task']]}, {t.get('trials', '?')} trials per cell, by prompt tokens:", "",
                  "| model | " + " | ".join(cols) + " | calibration s |", "|---" * (len(cols) + 2) + "|"]
        rows = [(Path(str(t.get("model", "?")).rstrip("/")).name, t, None)] + \
               [(e["label"], e, e["fix"]) for e in t["fixes"]]
        for label, r, fix in rows:
            mean = {int(n): a for n, a in (r.get("mean_accuracy_by_length") or {}).items()}
            cal = (fix or {}).get("calibration") or {}
            cost = "-" if fix is None else _fmt(cal.get("seconds"), ".1f") if cal else "0 (given)"
            lines.append(f"| {label} | " + " | ".join(_fmt(mean.get(n), ".2f") for n in lengths) + f" | {cost} |")
        lines += [""]
    return lines


__all__ = ["fix_values", "fixes_section", "fixes_task_lines"]
