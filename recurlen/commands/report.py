"""`recurlen report`: a Markdown report (tables, verdicts, plots) from evaluation results of any runs.

    recurlen report runs/demo/eval/results.json [more results.json or eval dirs] --out runs/demo
    recurlen report runs/eval780m runs/passkey/780m-fitted_noise/passkey --out runs/780m   # + task results

Writes <out>/report.md, <out>/results.json (all runs merged, plus the verdicts) and the PNG plots.
Works on the CPU demo and on GPU evaluations of the official checkpoints alike; the long-context tasks'
results (passkey, BABILong, copying) get their own section (recurlen.evaluation.tasks.report).

Verdicts first check that a run uses its context at all: its loss in [T,2T) must be clearly (10%) below
the unigram loss of the same held-out tokens, the best any model that ignores context can do; otherwise
the verdict is "does not use context". Then they read the paired control: full - reset per position bin,
where "reset" scores the same tokens with the state zeroed every T tokens. It removes the bin-to-bin
differences of content, so:
  full - reset <= tolerance in every bin   -> the run length-generalizes there
  full - reset >= fail_margin in a bin     -> longer context hurts: it fails to length-generalize
Verdicts and checks compare the value as the report shows it (3 decimals): +0.0504 is shown as +0.050 and
passes "<= +0.05", rather than a row that reads "+0.050 | MISS".

With several runs the report opens with the comparison figure (recurlen.diagnostics.compare): full - reset and
loss of every run against position in units of T on shared axes, also a TensorBoard run <out>/compare.
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from recurlen.diagnostics.compare import FLAT_TOL
from recurlen.diagnostics.plots import PLOT_NAMES, results_file, write_plots
from recurlen.evaluation.fixes.report import fixes_section, fixes_task_lines
from recurlen.evaluation.steps_curve import STEPS_PNG, plot_steps_curve, steps_curves, steps_lines
from recurlen.evaluation.tasks.report import check_task_result, is_task_result, strip_private, task_sections
from recurlen.util.atomic_files import save_figure, write_json, write_text
from recurlen.util.errors import UserError

GENERALIZES_TOL = FLAT_TOL
"""full - reset at most this (nats) counts as no harm from the longer context."""
FAILS_MARGIN = 0.3
"""full - reset at least this (nats, as shown) counts as a clear failure: the verdict's FAILS and every check that
says a run fails (the demo's)."""
USES_CONTEXT_REL = 0.1
"""A run uses its context if its loss in [T,2T) is at least this fraction below the unigram loss."""


SOURCE_NOTE = ("Every number below comes from this evaluation (results.json). TensorBoard's `val` columns and "
               "charts are the training runs' own validation, on their data.val_sequences held-out sequences (the "
               "HParams `data` column): other or fewer sequences, so their values differ from these "
               "(docs/dashboards.md).")
"""Where the report's numbers come from, said next to them: a reader comparing them with TensorBoard's."""


SHOWN_DECIMALS = 3
"""Numbers in report.md have 3 decimals; verdicts and checks compare those shown values."""
CHECK_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt,
             "abs<=": lambda value, limit: abs(value) <= limit}


def shown(value: float | None) -> float | None:
    """The value as the report prints it (rounded to SHOWN_DECIMALS), the one a reader checks the verdict against."""
    return None if value is None else float(format(value, f".{SHOWN_DECIMALS}f"))


def threshold_check(text: str, value: float | None, op: str, threshold: float) -> dict:
    """One row of a report's Checks: passed when the value as shown satisfies `op threshold` (None never passes).

    write_report re-derives "passed" of every check that carries op and threshold, so a check and the value
    printed next to it always agree."""
    if op not in CHECK_OPS:
        raise ValueError(f"check op {op!r} is unknown; allowed: {list(CHECK_OPS)}")
    value_shown = shown(value)
    return {"check": text, "value": value, "op": op, "threshold": threshold,
            "passed": value_shown is not None and bool(CHECK_OPS[op](value_shown, threshold))}


def _consistent(check: dict) -> dict:
    if "op" in check and "threshold" in check:
        return {**check, "passed": threshold_check(check["check"], check["value"], check["op"],
                                                   check["threshold"])["passed"]}
    return check


def bins_of(run: dict) -> list[dict]:
    return (run.get("positionwise") or {}).get("bins") or []


def _fmt(x, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _bin_end_multiple(row: dict, train_len: int) -> float:
    return row["end"] / train_len


def uses_context(run: dict) -> tuple[bool | None, str]:
    """Is the loss in [T,2T) clearly below the no-context (unigram) loss of the same held-out tokens?

    None when the results do not say (no unigram_loss, e.g. results of an older recurlen)."""
    T = run.get("train_len") or (run.get("positionwise") or {}).get("train_len")
    row = next((r for r in bins_of(run) if T and r["start"] == T), None)
    unigram = run.get("unigram_loss")
    if row is None or row.get("loss") is None or not unigram:
        return None, ""
    uses = row["loss"] <= (1.0 - USES_CONTEXT_REL) * unigram
    return uses, (f"loss in {row['name']} {row['loss']:.3f} vs {unigram:.3f} for the held-out tokens' unigram "
                  f"frequencies (no context)")


def run_verdict(run: dict, *, up_to_multiple: float | None = None) -> dict:
    """Does the run use its context at all? If so: does full - reset stay <= tolerance in every bin (up to a
    multiple of T), and where does it fail?"""
    T = run.get("train_len") or (run.get("positionwise") or {}).get("train_len")
    uses, evidence = uses_context(run)
    if uses is False:
        # full - reset is ~0 for a model that ignores context: it would pass as "length-generalizes".
        return {"label": run["label"], "measured": True, "uses_context": False, "generalizes": False,
                "fails": False, "text": f"{run['label']}: does not use context ({evidence}; it must be at least "
                                        f"{USES_CONTEXT_REL:.0%} lower): full - reset says nothing here"}
    rows = [r for r in bins_of(run) if r.get("full_minus_reset") is not None and r["start"] >= T]
    if up_to_multiple is not None:
        rows = [r for r in rows if _bin_end_multiple(r, T) <= up_to_multiple + 1e-9]
    if not rows:
        return {"label": run["label"], "measured": False, "text": f"{run['label']}: no reset control was run"}
    worst = max(rows, key=lambda r: r["full_minus_reset"])
    first_fail = next((r for r in rows if shown(r["full_minus_reset"]) >= FAILS_MARGIN), None)
    generalizes = all(shown(r["full_minus_reset"]) <= GENERALIZES_TOL for r in rows)
    span = rows[-1]["name"].split(",")[-1].rstrip(")")
    if generalizes:
        text = (f"{run['label']}: length-generalizes up to {span} (full - reset <= +{GENERALIZES_TOL} in every bin; "
                f"worst {worst['full_minus_reset']:+.3f} in {worst['name']})")
    elif first_fail is not None:
        text = (f"{run['label']}: FAILS past the training context: full - reset {first_fail['full_minus_reset']:+.3f} "
                f"in {first_fail['name']} (worst {worst['full_minus_reset']:+.3f} in {worst['name']})")
    else:
        text = (f"{run['label']}: mostly holds, but the longer context costs up to {worst['full_minus_reset']:+.3f} "
                f"nats in {worst['name']}")
    return {"label": run["label"], "measured": True, "uses_context": uses, "generalizes": generalizes,
            "fails": first_fail is not None,
            "worst_bin": worst["name"], "worst_full_minus_reset": worst["full_minus_reset"], "text": text}


def in_context_loss(run: dict) -> float | None:
    rows = bins_of(run)
    return rows[0]["loss"] if rows else None


def _table(runs: Sequence[dict], key: str, title: str, spec: str) -> list[str]:
    names = [r["name"] for r in bins_of(runs[0])] if runs else []
    lines = [f"### {title}", "", "| run | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for run in runs:
        values = {r["name"]: r.get(key) for r in bins_of(run)}
        lines.append(f"| {run['label']} | " + " | ".join(_fmt(values.get(n), spec) for n in names) + " |")
    return lines + [""]


def _state_lines(runs: Sequence[dict]) -> list[str]:
    lines = []
    for run in runs:
        state = run.get("state")
        if not state or not state.get("positions"):
            continue
        pos, norms = state["positions"], state["ssm_norm"]
        mean = [sum(layer[i] for layer in norms) / len(norms) for i in range(len(pos))]
        picks = sorted({0, len(pos) // 4, len(pos) // 2, len(pos) - 1})
        pts = ", ".join(f"t={pos[i]}: {_fmt(mean[i], '.3g')}" for i in picks)
        lines.append(f"- {run['label']}: recurrent state norm (mean over layers) {pts}")
    return lines


def _effrem_lines(runs: Sequence[dict]) -> list[str]:
    lines = []
    for run in runs:
        eff = run.get("effrem")
        if not eff:
            continue
        pts = ", ".join(f"t={t}: {_fmt(v)}" for t, v in list(zip(eff["t"], eff["effrem"]))[1::2])
        lines.append(f"- {run['label']} (T={eff['T']}): {pts}")
    return lines


def read_results(paths: Sequence[str | os.PathLike]) -> tuple[list[dict], list[dict]]:
    """(evaluation runs, task results) of results.json files or directories holding one, in order."""
    runs, tasks = [], []
    for path in paths:
        p = results_file(path)
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as err:
            raise UserError(f"{p} is not valid JSON ({err}); it is not a recurlen results file") from err
        if not isinstance(data, dict):
            raise UserError(f"{p} holds a JSON {type(data).__name__}, not a recurlen results file (a JSON object "
                            "with 'runs', from `recurlen eval` / `recurlen report`, or a task result)")
        if is_task_result(data):
            tasks.append({**check_task_result(data, str(p)), "_dir": str(p.parent)})
        elif "runs" in data:
            runs.extend(data["runs"])
            tasks.extend({**check_task_result(t, str(p)), "_dir": str(p.parent)} for t in data.get("tasks", []))
        else:
            raise UserError(f"{p} is not a recurlen results file: neither evaluation runs (a 'runs' key, from "
                             "`recurlen eval` / `recurlen report`) nor a task result (`recurlen passkey|babilong|"
                             "copying|niah`)")
    return runs, tasks


def write_report(results: Sequence[str | os.PathLike], *, out_dir: str | os.PathLike, title: str | None = None,
                 timings: Sequence[dict] | None = None, wall_seconds: float | None = None,
                 notes: Sequence[str] = (), checks: Callable[[Sequence[dict]], list[dict]] | None = None) -> Path:
    """report.md, a merged results.json and the plots in out_dir, from evaluation and / or task results.

    checks: acceptance checks of a particular experiment (the demo's), given the runs; each
    {"check": text, "value": number, "passed": bool}, tabulated under "Checks"."""
    runs, tasks = read_results(results)
    if not runs and not tasks:
        raise ValueError("no runs in the given results files")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(runs, out) if runs else []
    verdicts = [run_verdict(r) for r in runs]
    checks = [_consistent(c) for c in checks(runs)] if checks and runs else []
    lines = [f"# {title or 'recurlen report'}", ""]
    if runs:
        T = runs[0].get("train_len")
        L = runs[0].get("seq_len")
        lines += [f"Generated {time.strftime('%Y-%m-%d %H:%M')}. Training context T = {T}; evaluated to L = {L} "
                  f"tokens ({(L or 0) // max(T or 1, 1)}T) on "
                  f"{(runs[0].get('positionwise') or {}).get('num_sequences', '?')} held-out sequences from a zero "
                  "initial state.", "", SOURCE_NOTE, ""]
    else:
        lines += [f"Generated {time.strftime('%Y-%m-%d %H:%M')}.", ""]
    lines += list(notes) + ([""] if notes else [])
    if len({r.get("architecture") for r in runs}) > 1:  # runs of several architectures, side by side
        lines += ["## Models", "", "| run | model | T |", "|---|---|---|"]
        lines += [f"| {r['label']} | {r.get('model', '?')} | {r.get('train_len', '?')} |" for r in runs] + [""]
    if runs:
        lines += _evaluation_lines(runs, verdicts, checks, plots)
    curves = steps_to_hold(runs, out)
    lines += steps_lines(curves) if curves else []
    lines += task_sections(tasks, out)
    lines += fixes_task_lines(tasks)
    if timings:
        # Steps as the stage's checkpoint holds them (what was trained, not what was asked for).
        lines += ["## Stages", "", "| stage | steps | seconds | reused |", "|---|---|---|---|"]
        lines += [f"| {t['stage']} | {t.get('steps', '?')} | {t['seconds']:.0f} | {'yes' if t['reused'] else 'no'} |"
                  for t in timings]
        lines += [""]
    if wall_seconds is not None:
        lines += [f"Total wall time: {wall_seconds / 60:.1f} min.", ""]
    text = "\n".join(lines)
    write_text(out / "report.md", text)
    merged = {"format": "recurlen.report/1", "runs": runs, "verdicts": verdicts, "checks": checks,
              "plots": {k: PLOT_NAMES[k] for k in plots}, "timings": list(timings or []),
              "tasks": [strip_private(t) for t in tasks], "steps_curve": curves}
    write_json(out / "results.json", merged, indent=2)
    return out / "report.md"


def steps_to_hold(runs: Sequence[dict], out: Path) -> list[dict]:
    """The post-training runs' far-bin curves from their own logs (recurlen.evaluation.steps_curve), the figure
    written into out; [] when no evaluated run is a post-training run with a validation log."""
    curves = steps_curves(runs)
    if curves:
        save_figure(plot_steps_curve(curves), out / STEPS_PNG, dpi=110, tight=True)
    return curves


def _evaluation_lines(runs: Sequence[dict], verdicts: Sequence[dict], checks: Sequence[dict],
                      plots: Sequence[str]) -> list[str]:
    lines: list[str] = []
    lines += ["## Verdicts", ""] + [f"- {v['text']}" for v in verdicts] + [""]
    if "compare" in plots:
        lines += ["## At a glance", "",
                  "Every run on the same axes, in units of the training context T: a run that length-generalizes "
                  f"keeps full - reset in or below the grey band (full - reset <= +{GENERALIZES_TOL:g}) past T; one "
                  "that fails climbs with position.", "", f"![compare]({PLOT_NAMES['compare']})", ""]
    if checks:
        lines += ["## Checks", "", "| check | value | result |", "|---|---|---|"]
        lines += [f"| {c['check']} | {_fmt(c['value'], '+.3f')} | {'PASS' if c['passed'] else 'MISS'} |"
                  for c in checks]
        missed = [c for c in checks if not c["passed"]]
        lines += ["", f"**{len(checks) - len(missed)} of {len(checks)} checks passed.**" +
                  ("" if not missed else " Missed: " + "; ".join(c["check"] for c in missed) + "."), ""]
    lines += ["## Loss by position", "",
              "How to read: each column is a range of token positions in multiples of T. A model that "
              "length-generalizes keeps full - reset at or below 0 in every column; a model that fails "
              "has full - reset growing with position. Loss differences between columns are mostly "
              "differences of content, which is why full - reset is the verdict.", ""]
    lines += _table(runs, "loss", "Loss (nats/token), full context", ".3f")
    lines += _table(runs, "full_minus_reset", "full - reset (nats/token): > 0 means longer context hurts", "+.3f")
    lines += _table(runs, "ppl", "Perplexity", ".3f")
    lines += fixes_section(runs)
    state_lines, eff_lines = _state_lines(runs), _effrem_lines(runs)
    if state_lines:
        lines += ["## State norm by position", ""] + state_lines + [""]
    if eff_lines:
        lines += ["## Effective Remembrance", "",
                  "EffRem_T(t) = TV(q(.|x[0:T]), q(.|x[t:T])): how much the prediction at T still depends on the "
                  "first t tokens. Near 0 for small t means distant tokens barely matter.", ""] + eff_lines + [""]
    lines += ["## Plots", ""] + [f"![{kind}]({PLOT_NAMES[kind]})" for kind in plots if kind != "compare"] + [""]
    return lines
