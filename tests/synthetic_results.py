"""Synthetic results.json entries for the tests of what reads them (the report's tables, the docs' figures, the
architectures table): position bins with chosen numbers, in the evaluation's own format."""

from __future__ import annotations


def positionwise_run(label: str, values: dict[str, float], *, T: int = 32, bins: int = 6) -> dict:
    """A results.json run with bins [0,T), [T,2T), ... ([8T,16T) for bins=5, [16T,32T) for 6): `values` gives the
    [0,T) loss and full - reset of the later bins by name (0 where not given)."""
    rows, start = [], 0
    for i in range(bins):
        end = T if i == 0 else 2 * start
        name = "[0,T)" if i == 0 else f"[{'' if start == T else start // T}T,{end // T}T)"
        fmr = values.get(name, 0.0) if i else 0.0
        loss = values["[0,T)"] + 0.1 * i + fmr
        rows.append({"name": name, "start": start, "end": end, "kind": "context", "count": 8, "loss": loss,
                     "ppl": 2.718 ** loss, "reset_loss": loss - fmr, "reset_ppl": 2.718 ** (loss - fmr),
                     "full_minus_reset": fmr})
        start = end
    return {"label": label, "train_len": T, "seq_len": end,
            "positionwise": {"train_len": T, "seq_len": end, "num_sequences": 8, "bins": rows, "log_bins": []}}


def with_sequences(run: dict, diffs: dict[str, list[float]], *, context: list[float] | None = None,
                   digest: str = "same", seed: int = 0) -> dict:
    """The run with per-sequence scores, as `recurlen eval` keeps them: `diffs` gives each sequence's full - reset
    by bin name (0 where not given), `context` each sequence's [0,T) loss (the run's [0,T) loss for all where not
    given). The bins' means, losses and intervals are recomputed from them by the evaluation's own code."""
    import numpy as np

    from recurlen.diagnostics.positionwise import per_sequence_section

    pw = run["positionwise"]
    rows = pw["bins"]
    n = len(next(iter(diffs.values()))) if diffs else len(context or [])
    reset_NK = np.array([[r["reset_loss"]] * n for r in rows]).T
    diff_NK = np.array([diffs.get(r["name"], [0.0] * n) for r in rows]).T
    if context is not None:
        reset_NK[:, 0] = context
    loss_NK = reset_NK + diff_NK
    for k, row in enumerate(rows):
        row.update(loss=float(loss_NK[:, k].mean()), reset_loss=float(reset_NK[:, k].mean()),
                   full_minus_reset=float(diff_NK[:, k].mean()))
    pw.update(num_sequences=n, **per_sequence_section(rows, loss_NK, reset_NK, digest=digest, seed=seed))
    return run
