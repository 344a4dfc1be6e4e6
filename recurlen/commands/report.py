"""`recurlen report`: a Markdown report (tables, verdicts, plots) from evaluation results of any runs.

    recurlen report runs/demo/eval/results.json [more results.json or eval dirs] --out runs/demo
    recurlen report runs/eval780m runs/passkey/780m-fitted_noise/passkey --out runs/780m   # + task results

Writes <out>/report.md, <out>/results.json (all runs merged, plus the verdicts) and the PNG plots.
Works on the CPU demo and on GPU evaluations of the official checkpoints alike; the long-context tasks'
results (passkey, BABILong, copying) get their own section (recurlen.evaluation.tasks.report).

Verdicts first check that a run uses its context at all: its loss in [T,2T) must be clearly (10%) below
the unigram loss of the same held-out tokens, the best any model that ignores context can do; otherwise
the verdict is "does not use context". Then they read the paired control: full - reset per position bin,
where "reset" scores the same tokens with the state zeroed every T tokens, each with its 95% paired-bootstrap
interval over the held-out sequences (recurlen.evaluation.evidence):
  upper ends <= tolerance in every bin    -> the run length-generalizes there
  lower end >= fail_margin in a bin       -> longer context hurts: it fails to length-generalize
  an interval across a bar the verdict turns on -> undecided at n sequences (and about how many would decide it)
The checks and the in-context cost (the [0,T) loss against the base's, against the 8% bar) read their intervals
the same way: PASS, MISS or UNDECIDED. Bars compare the interval's ends as the report shows them (3 decimals).

With several runs the report opens with the comparison figure (recurlen.diagnostics.compare): full - reset and
loss of every run against position in units of T on shared axes, also a TensorBoard run <out>/compare.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from recurlen.diagnostics.plots import PLOT_NAMES, results_file, write_plots
from recurlen.evaluation.evidence import (
    GENERALIZES_TOL,
    IN_CONTEXT_REL_TOL,
    bins_of,
    fmt_interval,
    in_context_cost,
    interval_check,
    run_verdict,
)
from recurlen.evaluation.fixes.report import fixes_section, fixes_task_lines
from recurlen.evaluation.steps_curve import STEPS_PNG, plot_steps_curve, steps_curves, steps_lines
from recurlen.evaluation.tasks.report import check_task_result, is_task_result, strip_private, task_sections
from recurlen.util.atomic_files import save_figure, write_json, write_text
from recurlen.util.errors import UserError

SOURCE_NOTE = ("Every number below comes from this evaluation (results.json). TensorBoard's `val` columns and "
               "charts are the training runs' own validation, on their data.val_sequences held-out sequences (the "
               "HParams `data` column): other or fewer sequences, so their values differ from these "
               "(docs/dashboards.md).")
"""Where the report's numbers come from, said next to them: a reader comparing them with TensorBoard's."""
BASE_LABELS = ("base", "baseline", "pretrain")
"""Labels that name the pre-trained base, against which the report gives every other run's in-context cost."""
STATUS = {"pass": "PASS", "miss": "MISS", "undecided": "UNDECIDED"}


def threshold_check(text: str, value: float | None, op: str, threshold: float, *,
                    interval: Sequence[float] | None = None, n: int | None = None) -> dict:
    """One row of a report's Checks: read on its 95% interval where there is one (passes when all of it satisfies
    `op threshold`, misses when none of it does, else undecided), else on the value as shown (None never passes).

    write_report re-derives the status of every check that carries op and threshold, so a check and the numbers
    printed next to it always agree."""
    return interval_check(text, value, interval, op, threshold, n=n)


def _consistent(check: dict) -> dict:
    if "op" in check and "threshold" in check:
        return {**check, **threshold_check(check["check"], check["value"], check["op"], check["threshold"],
                                           interval=check.get("interval"), n=check.get("num_sequences"))}
    return {**check, "status": check.get("status") or ("pass" if check.get("passed") else "miss")}


def _fmt(x, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def base_run(runs: Sequence[dict]) -> dict | None:
    """The run labelled as the base (BASE_LABELS), if any."""
    by_label = {r["label"]: r for r in runs}
    return next((by_label[b] for b in BASE_LABELS if b in by_label), None)


def cost_lines(runs: Sequence[dict]) -> list[str]:
    """Each run's [0,T) loss against the base's, with its interval and what it allows against the 8% bar."""
    base = base_run(runs)
    if base is None:
        return []
    lines = []
    for run in runs:
        if run is base:
            continue
        cost = in_context_cost(run, base)
        if cost is None:
            continue
        check = threshold_check("", cost.value, "abs<=", IN_CONTEXT_REL_TOL, interval=cost.interval, n=cost.n)
        word = {"pass": "within", "miss": "outside", "undecided": "undecided against"}[check["status"]]
        how = (f"95% interval {fmt_interval(cost.interval, '+.1%')}, {'paired' if cost.paired else 'unpaired'} "
               f"bootstrap over {cost.n} sequences" if cost.interval else "point value: no per-sequence scores")
        more = f"; about {check['needed_sequences']} sequences would decide it" if check["needed_sequences"] else ""
        lines.append(f"- {run['label']}: in-context cost {cost.value:+.1%} ({how}): {word} the "
                     f"{IN_CONTEXT_REL_TOL:.0%} bar{more}")
    return lines


def _table(runs: Sequence[dict], key: str, title: str, spec: str) -> list[str]:
    """One row per run, one column per bin; a value with an interval (KEY_ci) is followed by it."""
    names = [r["name"] for r in bins_of(runs[0])] if runs else []
    lines = [f"### {title}", "", "| run | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for run in runs:
        rows = {r["name"]: r for r in bins_of(run)}
        cells = []
        for n in names:
            row = rows.get(n) or {}
            ci = fmt_interval(row.get(f"{key}_ci"), spec)
            cells.append(_fmt(row.get(key), spec) + (f" {ci}" if ci else ""))
        lines.append(f"| {run['label']} | " + " | ".join(cells) + " |")
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
                 notes: Sequence[str] = (), checks: Callable[[Sequence[dict]], list[dict]] | None = None,
                 extra: dict | None = None) -> Path:
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
    lines += steps_lines(curves, evaluated_sequences=(runs[0].get("positionwise") or {}).get("num_sequences")
                         if runs else None) if curves else []
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
              "tasks": [strip_private(t) for t in tasks], "steps_curve": curves, **(extra or {})}
    write_json(out / "results.json", merged, indent=2)
    return out / "report.md"


def checks_lines(checks: Sequence[dict]) -> list[str]:
    """The Checks table (value, its 95% interval and sample, PASS / MISS / UNDECIDED) and its one-line count."""
    lines = ["## Checks", "", "| check | value | 95% interval (sequences) | result |", "|---|---|---|---|"]
    for c in checks:
        spec = "+.1%" if c.get("op") == "abs<=" else "+.3f"
        ci = fmt_interval(c.get("interval"), spec)
        sample = f"{ci} ({c['num_sequences']})" if ci else "-"
        result = STATUS[c["status"]]
        if c["status"] == "undecided" and c.get("needed_sequences"):
            result += f" (about {c['needed_sequences']} sequences would decide it)"
        lines.append(f"| {c['check']} | {_fmt(c['value'], spec)} | {sample} | {result} |")
    by = {k: [c for c in checks if c["status"] == k] for k in STATUS}
    count = f"**{len(by['pass'])} of {len(checks)} checks passed"
    count += "".join(f", {len(by[k])} {k}{'ed' if k == 'miss' else ''}" for k in ("undecided", "miss") if by[k])
    count += ".**"
    for k, word in (("undecided", "Undecided"), ("miss", "Missed")):
        if by[k]:
            count += f" {word}: " + "; ".join(c["check"] for c in by[k]) + "."
    return lines + ["", count, ""]


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
    costs = cost_lines(runs)
    if costs:
        lines += ["In-context cost: each run's [0,T) loss against the base's, mean(run) / mean(base) - 1.", ""]
        lines += costs + [""]
    if "compare" in plots:
        lines += ["## At a glance", "",
                  "Every run on the same axes, in units of the training context T: a run that length-generalizes "
                  f"keeps full - reset in or below the grey band (full - reset <= +{GENERALIZES_TOL:g}) past T; one "
                  "that fails climbs with position.", "", f"![compare]({PLOT_NAMES['compare']})", ""]
    if checks:
        lines += checks_lines(checks)
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
