"""The arbiter's table: per base, every model's loss verdict and retrieval verdict side by side, with intervals.

    lines = arbiter_lines(results)          # results: the arbiter's results.json (recurlen arbiter)

One row per model (the base, its post-trainings, the base with each training-free fix): the in-context loss
[0,T) and its cost against the base, full - reset in the last bins past T with their 95% paired-bootstrap
intervals, the loss verdict, passkey accuracy at each length with its 95% Wilson interval (trials of every depth
pooled), the retrieval verdict, and what the two say together (recurlen.evaluation.arbiter.verdict).
"""

from __future__ import annotations

from collections.abc import Sequence

from recurlen.evaluation.arbiter.verdict import arbiter_verdict, length_name, retrieval_words
from recurlen.evaluation.evidence import bins_of, fmt_interval, in_context_cost, in_context_loss
from recurlen.evaluation.fixes.report import fix_values
from recurlen.evaluation.tasks.retrieval import RETRIEVAL_BAR

FAR_BINS = 2
"""Bins past T shown beside the verdict: the last ones (the verdict itself reads every bin past T)."""


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _loss_cell(row: dict | None) -> str:
    if row is None or row.get("full_minus_reset") is None:
        return "-"
    ci = fmt_interval(row.get("full_minus_reset_ci"))
    return f"{row['full_minus_reset']:+.3f} {ci}".strip()


def _context_cell(entry: dict, base: dict) -> str:
    ctx = in_context_loss(entry["loss"])
    if ctx is None:
        return "-"
    if entry is base:
        return f"{ctx:.3f}"
    cost = in_context_cost(entry["loss"], base["loss"])
    if cost is None:
        return f"{ctx:.3f}"
    ci = "" if cost.interval is None else f" [{cost.interval[0]:+.1%}, {cost.interval[1]:+.1%}]"
    return f"{ctx:.3f} ({cost.value:+.1%}{ci})"


def _far_rows(entry: dict) -> list[dict]:
    T = entry["train_len"]
    return [r for r in bins_of(entry["loss"]) if r["start"] >= T][-FAR_BINS:]


def _label(entry: dict) -> str:
    if entry.get("fix"):
        values = fix_values(entry["fix"])
        return f"{entry['label']} ({values})" if values else entry["label"]
    steps = entry.get("steps")
    return f"{entry['label']} ({steps} steps)" if steps else entry["label"]


def base_table(entries: Sequence[dict], *, bar: float = RETRIEVAL_BAR) -> tuple[list[str], list[dict]]:
    """Markdown lines of one base's table (entries[0] is the base) and each row's verdict."""
    base = entries[0]
    T = base["train_len"]
    verdicts = [arbiter_verdict(e, base=base, bar=bar) for e in entries]
    far_names = [r["name"] for r in _far_rows(base)]
    lengths = [c["length"] for c in verdicts[0]["retrieval"]["by_length"]]
    header = ["model", "loss [0,T) (cost)", *(f"full - reset {n}" for n in far_names), "loss verdict",
              *(f"passkey {length_name(n, T)}" for n in lengths), "retrieval", "together"]
    lines = [_row(header), "|---" * len(header) + "|"]
    for e, v in zip(entries, verdicts):
        far = {r["name"]: r for r in _far_rows(e)}
        by_len = {c["length"]: c for c in v["retrieval"]["by_length"]}
        acc = [f"{by_len[n]['accuracy']:.2f} [{by_len[n]['interval'][0]:.2f}, {by_len[n]['interval'][1]:.2f}]"
               if n in by_len else "-" for n in lengths]
        retrieval = retrieval_words(v["retrieval"], T)
        loss_outcome = v["loss"].get("outcome", "-")
        lines.append(_row([_label(e), _context_cell(e, base), *(_loss_cell(far.get(n)) for n in far_names),
                           loss_outcome, *acc, retrieval, v["text"]]))
    return lines, verdicts


def arbiter_lines(results: dict) -> tuple[list[str], list[dict]]:
    """The report's lines for every base of the arbiter's results, and every row's verdict."""
    bar = results.get("retrieval_bar", RETRIEVAL_BAR)
    lines, verdicts = [], []
    for group in results["bases"]:
        entries = group["entries"]
        base = entries[0]
        loss = base["loss"]["positionwise"]
        trials = base["passkey"]["trials"] * len(base["passkey"]["depths"])
        lines += [f"### Base {base['label']} (T = {base['train_len']})", "",
                  f"Loss: full - reset on {loss['num_sequences']} held-out text sequences of {loss['seq_len']} tokens "
                  "(95% paired-bootstrap intervals over sequences; the verdict reads every bin past T). Retrieval: "
                  f"passkey accuracy over {trials} trials per length ({base['passkey']['trials']} keys x depths "
                  f"{', '.join(f'{d:g}' for d in base['passkey']['depths'])}), 95% Wilson intervals; a length "
                  f"retrieves when the lower end is >= {bar:g}, loses retrieval when the upper end is < {bar:g}.", ""]
        table, group_verdicts = base_table(entries, bar=bar)
        lines += table + [""]
        lines += [f"- {v['loss'].get('text', v['label'])}" for v in group_verdicts] + [""]
        verdicts += group_verdicts
    return lines, verdicts


__all__ = ["FAR_BINS", "arbiter_lines", "base_table"]
