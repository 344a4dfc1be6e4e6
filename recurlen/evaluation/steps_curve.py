"""How many post-training steps a run needs before the far bins hold, read from its own validation log.

    curves = steps_curves(runs)     # runs: results.json run entries; one curve per post-training run found
    fig = plot_steps_curve(curves)  # full - reset in [8T,16T) and [16T,32T) against post-training steps
    lines = steps_lines(curves)     # the report's tables: the curve, and the first step at which each bin holds

A post-training run (model.pretrained set) validates every trainer.val_every_n_steps steps, and its position-wise
callback logs val/full_minus_reset@[kT,2kT) into the run's metrics.csv; nothing is evaluated again here. A row that
Lightning logs at step s is the model after s + 1 optimizer steps (validation runs before the step counter moves
on), so the curve's steps are s + 1: the last point of a 750-step run is at 750. Step 0 is the base itself: the
last validation of the run it starts from, when that validation is of the checkpoint it starts from (same step) on
the same held-out data (same data and validation settings); otherwise the curve starts at the first validation.

"Holds" is the report's verdict per bin: full - reset <= +0.05 as shown (3 decimals). The first step at which a
bin holds is given beside its share of pre-training: the base's steps, or its tokens when one step of the two runs
holds a different number of tokens (batch x context x accumulation x devices).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.figure import Figure

from recurlen.diagnostics.compare import FLAT_TOL, assign_colors
from recurlen.training.csv_logger import read_metrics
from recurlen.training.run_dir import RunDir, run_dir_of

FAR_BINS = ((8, 16), (16, 32))
"""The bins the curve follows, in multiples of T: [8T,16T) and [16T,32T)."""
HOLDS = FLAT_TOL
"""full - reset at most this (nats/token, as shown with 3 decimals) holds: the report's verdict."""
STEPS_PNG = "steps_to_hold.png"
_TAG = re.compile(r"^val/full_minus_reset@\[0*(\d+)T,0*(\d+)T\)$")
VAL_DATA_KEYS = ("source", "hf_config", "split", "text_field", "id_field", "tokenizer", "seq_len", "seed",
                 "val_fraction", "val_length", "val_sequences", "val_mode", "max_documents")
"""The data settings that decide a run's validation sequences (and T): equal in both runs, the base's last
validation is the post-training curve's step 0."""


def bin_name(a: int, b: int) -> str:
    return f"[{a}T,{b}T)"


def holds(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and float(format(value, ".3f")) <= HOLDS


def logged_curve(run: RunDir) -> dict[str, dict[int, float]]:
    """full - reset per far bin at every validation of a run: {bin: {optimizer steps done: value}}."""
    out: dict[str, dict[int, float]] = {bin_name(a, b): {} for a, b in FAR_BINS}
    for row in read_metrics(run.metrics_file):
        for key, value in row.items():
            m = _TAG.match(key)
            if m and (int(m.group(1)), int(m.group(2))) in FAR_BINS:
                out[bin_name(int(m.group(1)), int(m.group(2)))][int(row["step"]) + 1] = value  # a resume: the last
    return out


def _world(trainer: dict) -> int | None:
    devices = trainer.get("devices", 1)
    if isinstance(devices, (list, tuple)):
        n = len(devices)
    else:
        try:
            n = int(str(devices))
        except ValueError:  # "auto": how many it found is not in the config
            return None
    return n * int(trainer.get("num_nodes") or 1)


def tokens_per_step(cfg: dict) -> int | None:
    data, trainer = cfg.get("data") or {}, cfg.get("trainer") or {}
    world = _world(trainer)
    if world is None or not data.get("batch_size") or not data.get("seq_len"):
        return None
    return int(data["batch_size"]) * int(data["seq_len"]) * int(trainer.get("accumulate_grad_batches") or 1) * world


def _checkpoint_step(path: Path) -> int | None:
    try:  # mmap: the step only, not the weights and optimizer state
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"])
    except (OSError, RuntimeError, KeyError, ValueError, TypeError):
        return None


def _base(pretrained: str) -> tuple[RunDir, dict, Path] | None:
    """The base run a post-training starts from, its config and the checkpoint it starts from."""
    base = run_dir_of(pretrained)
    if base is None or not base.config_file.is_file():
        return None
    p = Path(pretrained).expanduser()
    return base, base.read_config() or {}, p if p.suffix == ".ckpt" else base.last_checkpoint


def run_curve(label: str, source: str) -> dict | None:
    """The curve of one evaluated run, when it is a post-training run whose metrics.csv has the far bins."""
    run = run_dir_of(source)
    if run is None or not run.config_file.is_file():
        return None
    cfg = run.read_config() or {}
    pretrained = (cfg.get("model") or {}).get("pretrained")
    curve = logged_curve(run)
    if not pretrained or not any(curve.values()):
        return None
    entry = {"label": label, "run_dir": str(run.path), "intervention": (cfg.get("intervention") or {}).get("name"),
             "val_every_n_steps": (cfg.get("trainer") or {}).get("val_every_n_steps"), "base": str(pretrained),
             "base_at_step_0": False, "pretrain_steps": None, "pretrain_tokens": None,
             "posttrain_tokens_per_step": tokens_per_step(cfg), "fraction_basis": None}
    base = _base(str(pretrained))
    if base is not None:
        base_run, base_cfg, ckpt = base
        steps = _checkpoint_step(ckpt) if ckpt.is_file() else None
        per_step = tokens_per_step(base_cfg)
        entry.update(pretrain_steps=steps, pretrain_tokens=None if steps is None or per_step is None
                     else steps * per_step)
        same_data = all((cfg.get("data") or {}).get(k) == (base_cfg.get("data") or {}).get(k) for k in VAL_DATA_KEYS)
        base_curve = logged_curve(base_run)
        if steps is not None and same_data and all(steps in base_curve[b] for b in curve):
            for b in curve:
                curve[b][0] = base_curve[b][steps]
            entry["base_at_step_0"] = True
        if steps:
            same = per_step is not None and per_step == entry["posttrain_tokens_per_step"]
            entry["fraction_basis"] = "steps" if same or entry["pretrain_tokens"] is None else "tokens"
    points = sorted({s for values in curve.values() for s in values})
    entry["points"] = [{"step": s, **{b: curve[b].get(s) for b in curve}} for s in points]
    entry.update(_first_steps(entry))
    return entry


def _first_steps(entry: dict) -> dict:
    """First step at which each bin (and both) holds; the step from which it holds at every later validation; their
    shares of pre-training."""
    names = [bin_name(a, b) for a, b in FAR_BINS]
    ok = {b: [(p["step"], holds(p[b])) for p in entry["points"] if p[b] is not None] for b in names}
    ok["both"] = [(p["step"], all(holds(p[b]) for b in names)) for p in entry["points"]
                  if all(p[b] is not None for b in names)]
    first = {b: next((s for s, h in seq if h), None) for b, seq in ok.items()}
    stays = {}
    for b, seq in ok.items():
        tail = [s for i, (s, h) in enumerate(seq) if all(hh for _, hh in seq[i:])]
        stays[b] = tail[0] if tail else None
    fraction = {b: _fraction(entry, s) for b, s in first.items()}
    return {"first_holding_step": first, "holding_from_step": stays, "fraction_of_pretraining": fraction}


def _fraction(entry: dict, step: int | None) -> float | None:
    if step is None or entry["fraction_basis"] is None:
        return None
    if entry["fraction_basis"] == "steps":
        return step / entry["pretrain_steps"]
    return step * entry["posttrain_tokens_per_step"] / entry["pretrain_tokens"]


def steps_curves(runs: Sequence[dict]) -> list[dict]:
    """A curve for every evaluated run (results.json run entries, by label) that is a post-training run with a log."""
    out = []
    for r in runs:
        curve = run_curve(r["label"], str(r.get("source") or ""))
        if curve is not None:
            out.append(curve)
    return out


def plot_steps_curve(curves: Sequence[dict]) -> Figure:
    """full - reset against post-training steps, one panel per far bin, one line per run; a ring marks the first
    step at which the bin holds, the grey band is 'holds' (<= +0.05)."""
    names = [bin_name(a, b) for a, b in FAR_BINS]
    fig = Figure(figsize=(11.0, 4.2))
    colors = assign_colors([c["label"] for c in curves])
    for k, b in enumerate(names):
        ax = fig.add_subplot(1, len(names), k + 1)
        ax.axhspan(-10.0, HOLDS, color="0.9", zorder=0)
        ax.axhline(HOLDS, color="0.5", linewidth=1, linestyle=":")
        for c, color in zip(curves, colors):
            pts = [(p["step"], p[b]) for p in c["points"] if p[b] is not None]
            if not pts:
                continue
            ax.plot(*zip(*pts), marker="o", markersize=3, color=color, label=c["label"])
            first = c["first_holding_step"][b]
            if first is not None:
                ax.plot([first], [dict(pts)[first]], marker="o", markersize=10, markerfacecolor="none", color=color)
        values = [p[b] for c in curves for p in c["points"] if p[b] is not None]
        if values:
            ax.set_ylim(min(min(values), 0.0) - 0.05, max(max(values), HOLDS) + 0.05)
        ax.set_xlabel("post-training steps (0: the base)")
        ax.set_ylabel("full - reset (nats/token)")
        ax.set_title(f"full - reset in {b}; holds: <= +{HOLDS:g}")
        ax.legend(fontsize=7)
    return fig


def _f(x, spec: str = "+.3f") -> str:
    return "-" if x is None else format(x, spec)


def _share(c: dict, b: str) -> str:
    x = c["fraction_of_pretraining"][b]
    return "-" if x is None else f"{x:.1%} of pre-training {c['fraction_basis']}"


def steps_lines(curves: Sequence[dict]) -> list[str]:
    """The report's section: the first step at which each far bin holds, then the curve itself."""
    names = [bin_name(a, b) for a, b in FAR_BINS]
    lines = ["## Post-training steps to hold", "",
             f"full - reset in the far bins at every validation of each post-training run (its metrics.csv), against "
             f"post-training steps; step 0 is the base's last validation where it is the same checkpoint on the same "
             f"held-out data. A bin holds at full - reset <= +{HOLDS:g}. \"first\" is the first validation at which it "
             "holds; \"from\" the step from which it holds at every later validation.", "",
             f"![steps to hold]({STEPS_PNG})", "",
             "| run | validated every | " + " | ".join(f"{b} first (share) | {b} from" for b in names)
             + " | both first |", "|---" * (3 + 2 * len(names)) + "|"]
    for c in curves:
        last = c["points"][-1]["step"] if c["points"] else 0
        never = f"not in {last}"
        cells = []
        for b in names:
            first = c["first_holding_step"][b]
            cells += [never if first is None else f"{first} ({_share(c, b)})",
                      never if c["holding_from_step"][b] is None else str(c["holding_from_step"][b])]
        both = c["first_holding_step"]["both"]
        lines.append(f"| {c['label']} | {c.get('val_every_n_steps') or '?'} steps | " + " | ".join(cells)
                     + f" | {never if both is None else both} |")
    lines += ["", "The curves (full - reset, nats/token):", ""]
    for c in curves:
        base = "" if c["base_at_step_0"] else " (no step 0: the base's last validation is not of the same checkpoint "
        base += "" if c["base_at_step_0"] else "on the same data)"
        lines += [f"{c['label']} ({c['pretrain_steps'] or '?'} pre-training steps){base}", "",
                  "| step | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        lines += [f"| {p['step']} | " + " | ".join(_f(p[b]) for b in names) + " |" for p in c["points"]]
        lines.append("")
    return lines


__all__ = ["FAR_BINS", "HOLDS", "STEPS_PNG", "holds", "logged_curve", "plot_steps_curve", "run_curve",
           "steps_curves", "steps_lines", "tokens_per_step"]
