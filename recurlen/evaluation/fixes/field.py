"""The training-free field in one table: on each base, every post-training and every fix with its loss verdict, its
retrieval verdict, their intervals and what each cost.

    rows = demo_rows(arch_title, results, timings)        # a demo base's evaluation (recurlen eval with fixes=)
    rows = arbiter_rows(arbiter_results)                  # the retrieval arbiter's base (recurlen arbiter)
    rows += refused_rows(arch_title, refused)             # the fixes that do not apply, and why
    print("\n".join(markdown(rows)))

Each row is a FieldRow. The loss verdict is recurlen.evaluation.evidence.run_verdict's (fails / holds / mostly holds
/ undecided at n sequences, read on 95% paired-bootstrap intervals), shown with the worst bin past T; the in-context
cost is the [0,T) loss against the same base's, with its interval. The retrieval verdict exists only where the
base retrieves within its training context (the arbiter's base, recurlen.evaluation.arbiter): the text demos' bases
do not (passkey 0.00 at T), so their rows say "not judged" rather than a verdict nobody measured. The cost: a
post-training's steps x rows x tokens and seconds (the demo's stage timings), a fix's calibrated numbers, forward
passes and seconds (its calibration record).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recurlen.evaluation.arbiter.verdict import arbiter_verdict, retrieval_words
from recurlen.evaluation.evidence import WORDS, fmt_interval, in_context_cost, run_verdict
from recurlen.evaluation.fixes.report import fix_values

HEADER = ("base", "model", "loss verdict", "worst full - reset past T", "in-context cost [0,T)", "retrieval verdict",
          "cost")
NOT_JUDGED = "not judged: the base does not retrieve"


@dataclass(frozen=True)
class FieldRow:
    base: str
    model: str
    loss: str
    worst: str
    cost_in_context: str
    retrieval: str
    cost: str

    def cells(self) -> tuple[str, ...]:
        return (self.base, self.model, self.loss, self.worst, self.cost_in_context, self.retrieval, self.cost)


def loss_words(verdict: dict) -> str:
    """fails / holds to 16T / mostly holds / undecided at n (~m would decide) / does not use context."""
    outcome = verdict.get("outcome")
    if outcome is None:
        return "not measured"
    if outcome == "no context":
        return "does not use context"
    if outcome == "undecided":
        needed = verdict.get("needed_sequences")
        return f"undecided at {verdict['num_sequences']}" + (f" (~{needed} would decide)" if needed else "")
    if outcome == "holds":
        return f"holds to {verdict['text'].split('up to ', 1)[1].split(' ', 1)[0]}"
    return WORDS[outcome]


def worst_words(verdict: dict) -> str:
    if verdict.get("worst_full_minus_reset") is None:
        return "-"
    return (f"{verdict['worst_full_minus_reset']:+.3f} {fmt_interval(verdict.get('worst_interval'))} "
            f"in {verdict['worst_bin']}").replace("  ", " ")


def context_words(run: dict, base: dict) -> str:
    if run is base:
        return "(the base)"
    cost = in_context_cost(run, base)
    if cost is None:
        return "-"
    return f"{cost.value:+.1%} {fmt_interval(cost.interval, '+.1%')}".strip()


def fix_cost(fix: dict) -> str:
    """A fix's cost: what it calibrated and with how many forward passes, in how many seconds."""
    calibration = fix.get("calibration") or {}
    count = fix.get("calibrated_parameters", 0)
    numbers = f"{count} number{'' if count == 1 else 's'}"
    if not calibration:
        return f"{numbers} given, no calibration pass"
    passes = calibration.get("forward_passes")
    data = calibration.get("data") or {}
    shape = f" of {data['sequences']} x {data['length']} tokens" if data else ""
    seconds = calibration.get("seconds")
    return (f"{numbers}, {passes} forward passes{shape}"
            + (f", {seconds:.1f} s" if seconds is not None else ""))


def post_cost(label: str, timings: dict | None, steps: int | None) -> str:
    """A post-training's cost: its steps (every parameter updated) and seconds, from the demo's stage timings."""
    stage = next((s for s in (timings or {}).get("stages", []) if s.get("stage") == f"post/{label}"), None)
    steps = steps or (stage or {}).get("steps")
    if steps is None:
        return "-"
    seconds = (stage or {}).get("seconds")
    return f"{steps} training steps, all parameters" + (f", {seconds:.0f} s" if seconds else "")


def _label(run: dict) -> str:
    if run.get("fix"):
        values = fix_values(run["fix"])
        return f"{run['label']} ({values})" if values else run["label"]
    return run["label"]


def demo_rows(base_name: str, runs: Sequence[dict], timings: dict | None = None) -> list[FieldRow]:
    """Rows of one text base's evaluation: runs[0] is the base, then its post-trainings and fixes."""
    base = runs[0]
    rows = []
    for run in runs:
        verdict = run_verdict(run)
        if run is base:
            cost = "-"
        elif run.get("fix"):
            cost = fix_cost(run["fix"])
        else:
            cost = post_cost(run["label"], timings, None)
        rows.append(FieldRow(base_name, _label(run), loss_words(verdict), worst_words(verdict),
                             context_words(run, base), NOT_JUDGED if run is base else "not judged", cost))
    return rows


def arbiter_rows(results: dict) -> list[FieldRow]:
    """Rows of the arbiter's bases: both verdicts on the same weights."""
    bar = results.get("retrieval_bar")
    rows = []
    for group in results["bases"]:
        entries = group["entries"]
        base = entries[0]
        name = f"arbiter ({base['loss'].get('architecture', 'mamba2')}, T = {base['train_len']})"
        for entry in entries:
            v = arbiter_verdict(entry, base=base, **({"bar": bar} if bar is not None else {}))
            retrieval = retrieval_words(v["retrieval"], entry["train_len"])
            if v["verdict"] == "holds by forgetting":
                retrieval += ": holds the loss by forgetting"
            if entry is base:
                cost = "-"
            elif entry.get("fix"):
                cost = fix_cost(entry["fix"])
            else:
                cost = post_cost(entry["label"], None, entry.get("steps"))
            rows.append(FieldRow(name, _label(entry), loss_words(v["loss"]), worst_words(v["loss"]),
                                 context_words(entry["loss"], base["loss"]), retrieval, cost))
    return rows


def refused_rows(base_name: str, refused: dict[str, str]) -> list[FieldRow]:
    """One row per fix that does not apply to the base's architecture, with the reason."""
    return [FieldRow(base_name, name, "does not apply", "-", "-", "-", reason) for name, reason in refused.items()]


def markdown(rows: Sequence[FieldRow]) -> list[str]:
    lines = ["| " + " | ".join(HEADER) + " |", "|---" * len(HEADER) + "|"]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return lines


__all__ = ["HEADER", "NOT_JUDGED", "FieldRow", "arbiter_rows", "demo_rows", "fix_cost", "loss_words", "markdown",
           "post_cost", "refused_rows"]
