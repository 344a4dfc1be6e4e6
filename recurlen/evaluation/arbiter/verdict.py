"""The loss verdict and the retrieval verdict of one model, side by side, and what they say together.

    v = arbiter_verdict(entry, base=base_entry)      # entries of the arbiter's results.json (arbiter.judge)
    v["verdict"]   # "holds by forgetting" / "holds and retrieves" / "fails" / "undecided" / "base does not retrieve"

The loss verdict is recurlen.evaluation.evidence.run_verdict on the entry's held-out text (full - reset past T with
its 95% paired-bootstrap intervals: fails / holds / mostly holds / undecided). The retrieval verdict
(recurlen.evaluation.tasks.retrieval) reads each passkey length's Wilson interval against the bar: retrieves /
loses retrieval / undecided, and compares the model with its base at the lengths where the base retrieves.
full - reset alone cannot tell a model that uses its long context from one that forgets it fast enough never to
be hurt by it; retrieval can, on a base that retrieves within T. Together:

    holds by forgetting     the loss holds (or mostly holds) and the model loses retrieval at a length where the base
                            retrieves: it buys its flat loss by forgetting what it read
    holds and retrieves     the loss holds (or mostly holds) and the model retrieves wherever the base does
    fails                   the loss fails past T (whatever it retrieves)
    undecided               either verdict is undecided where it matters: more sequences or trials would decide it
    base does not retrieve  the base misses the bar at T itself: retrieval cannot arbitrate on it
"""

from __future__ import annotations

from recurlen.evaluation.evidence import WORDS, run_verdict
from recurlen.evaluation.tasks.retrieval import (
    RETRIEVAL_BAR,
    RetrievalCell,
    lost_where_base_retrieves,
    reach,
    retrieval_by_length,
)

VERDICTS = ("holds by forgetting", "holds and retrieves", "fails", "undecided", "base does not retrieve")
HOLDING = ("holds", "between")
"""Loss outcomes that count as holding the loss ("between": mostly holds, under the failure bar)."""


def length_name(n: int, train_len: int) -> str:
    """256 at T = 256 -> 'T'; 1024 -> '4T'; a length that is no multiple of T in tokens."""
    if n % train_len:
        return f"{n} tokens"
    k = n // train_len
    return "T" if k == 1 else f"{k}T"


def _names(lengths: list[int], train_len: int) -> str:
    return ", ".join(length_name(n, train_len) for n in lengths)


def retrieval_summary(cells: list[RetrievalCell], base: list[RetrievalCell], train_len: int) -> dict:
    """The model's retrieval against its base's: the lengths it loses or leaves undecided where the base retrieves,
    how far it retrieves, and the outcome (loses retrieval / undecided / retrieves). Where the base retrieves at no
    length there is nothing to keep: the outcome is the model's own verdict at its shortest length."""
    lost = lost_where_base_retrieves(cells, base)
    base_retrieves = {c.length for c in base if c.verdict == "retrieves"}
    open_ = [c.length for c in cells if c.length in base_retrieves and c.verdict == "undecided"]
    if base_retrieves:
        outcome = "loses retrieval" if lost else "undecided" if open_ else "retrieves"
    else:
        outcome = min(cells, key=lambda c: c.length).verdict
    far = reach(cells)
    return {"outcome": outcome, "lost": lost, "undecided": open_, "reach": far,
            "reach_name": None if far is None else length_name(far, train_len)}


def retrieval_words(summary: dict, train_len: int) -> str:
    """The table's retrieval cell: the outcome, and how far it retrieves or where it loses retrieval."""
    if summary["lost"]:
        return f"loses retrieval at {_names(summary['lost'], train_len)}"
    if summary["outcome"] == "undecided" and summary["undecided"]:
        return f"undecided at {_names(summary['undecided'], train_len)}"
    if summary["reach_name"]:
        return f"retrieves to {summary['reach_name']}"
    return summary["outcome"]


def arbiter_verdict(entry: dict, *, base: dict, bar: float = RETRIEVAL_BAR) -> dict:
    """Both verdicts of `entry` (its base: `base`, which may be the entry itself) and the one they make together."""
    T = entry["train_len"]
    loss = run_verdict(entry["loss"])
    cells = retrieval_by_length(entry["passkey"], bar=bar)
    base_cells = retrieval_by_length(base["passkey"], bar=bar)
    retrieval = retrieval_summary(cells, base_cells, T)
    base_at_T = next((c for c in base_cells if c.length == T), None)
    outcome = loss.get("outcome")
    loss_words = WORDS.get(outcome, outcome or "not measured")
    reach_text = (f"retrieves to {retrieval['reach_name']}" if retrieval["reach"] is not None
                  else f"does not retrieve at {length_name(cells[0].length, T)}")
    if base_at_T is None or base_at_T.verdict != "retrieves":
        why = "is not evaluated at T" if base_at_T is None else f"{base_at_T.text()} at T, bar {bar:g}"
        word, text = "base does not retrieve", (f"the base does not retrieve within T ({why}): retrieval cannot "
                                                f"arbitrate; loss: {loss_words}")
    elif outcome == "fails":
        word, text = "fails", f"fails past T (loss); {retrieval_words(retrieval, T)}"
    elif outcome in HOLDING and retrieval["outcome"] == "loses retrieval":
        word = "holds by forgetting"
        text = (f"{loss_words} the loss by forgetting: loses retrieval at {_names(retrieval['lost'], T)}, where the "
                "base retrieves")
    elif outcome in HOLDING and retrieval["outcome"] == "retrieves":
        word, text = "holds and retrieves", f"{loss_words} the loss and {reach_text}"
    else:
        loss_part = f"the loss is {outcome or 'not measured'}" if outcome not in HOLDING else f"{loss_words} the loss"
        word, text = "undecided", f"undecided: {loss_part}; {retrieval_words(retrieval, T)}"
    return {"label": entry["label"], "kind": entry["kind"], "verdict": word, "text": text, "loss": loss,
            "retrieval": {**retrieval, "bar": bar, "by_length": [c.to_dict() for c in cells]}}


__all__ = ["HOLDING", "VERDICTS", "arbiter_verdict", "length_name", "retrieval_summary", "retrieval_words"]
