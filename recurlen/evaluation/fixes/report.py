"""The report's section on training-free fixes: each fix beside the runs, with what it cost.

    lines = fixes_section(runs)     # runs: results.json run entries; [] when no entry is a fix's
"""

from __future__ import annotations

from collections.abc import Sequence


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _bins(run: dict) -> list[dict]:
    return (run.get("positionwise") or {}).get("bins") or []


def _values(fix: dict) -> str:
    values = fix.get("values") or {}
    if "scales" in values:
        return "scales " + ", ".join(f"{s:.3g}" for s in values["scales"])
    if "memory_T" in values:
        cap = "none helped (unchanged)" if values["memory_T"] is None else f"{values['memory_T']:g} T"
        return f"memory cap {cap}, {values.get('entries_changed')} of {values.get('entries')} entries changed"
    return ""


def fixes_section(runs: Sequence[dict]) -> list[str]:
    """Markdown lines: every run and fix with in-context loss, full - reset per bin past T, and the fixes' cost."""
    fixed = [r for r in runs if r.get("fix")]
    if not fixed:
        return []
    names = [b["name"] for b in _bins(runs[0])]
    far = names[1:]
    lines = ["## Fixes that need no training", "",
             "Each fix is applied to a fresh copy of the run it names, calibrated on held-out sequences that are not "
             "the ones scored here, then evaluated like the runs. Cost: numbers the calibration chose, its wall "
             "time and forward passes (post-training updates every weight for its steps).", "",
             "| run | kind | in-context loss " + names[0] + " | " + " | ".join(f"full - reset {n}" for n in far)
             + " | calibrated numbers | calibration s | forward passes |",
             "|---" * (6 + len(far)) + "|"]
    for run in runs:
        fix = run.get("fix")
        rows = {b["name"]: b for b in _bins(run)}
        cells = [_fmt((rows.get(names[0]) or {}).get("loss"), ".3f")]
        cells += [_fmt((rows.get(n) or {}).get("full_minus_reset"), "+.3f") for n in far]
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
        how = (f"calibrated by {cal['method']} ({cal['steps']} steps, {cal['data']['sequences']} x "
               f"{cal['data']['length']} tokens): loss {cal['loss_before']:.3f} -> {cal['loss_after']:.3f}"
               if cal else "not calibrated (settings given)")
        lines.append(f"- {run['label']}: {fix['paper']}; {_values(fix)}; {how}")
    return lines + [""]


__all__ = ["fixes_section"]
