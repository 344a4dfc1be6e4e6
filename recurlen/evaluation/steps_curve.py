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

"Holds" is the report's verdict per bin read on its interval: the upper end of full - reset's 95% paired-bootstrap
interval over the run's validation sequences (data.val_sequences, logged beside each value as full_minus_reset_lo /
_hi) at most +0.05 as shown (3 decimals); a point whose interval straddles the bar is undecided, not holding. A
log without intervals (an older recurlen) is read on its values, and the section says so. The validation's sample
is the run's own (often 4 or 8 sequences), not the evaluation's: the section names both, so that a verdict of the
report (on the evaluation's sequences) and a point of this curve never disagree silently. The first step at which a
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
_TAG = re.compile(r"^val/full_minus_reset(?P<end>_lo|_hi)?@\[0*(\d+)T,0*(\d+)T\)$")
VAL_DATA_KEYS = ("source", "hf_config", "split", "text_field", "id_field", "tokenizer", "seq_len", "seed",
                 "val_fraction", "val_length", "val_sequences", "val_mode", "max_documents")
"""The data settings that decide a run's validation sequences (and T): equal in both runs, the base's last
validation is the post-training curve's step 0."""


def bin_name(a: int, b: int) -> str:
    return f"[{a}T,{b}T)"


def holds(value: float | None, interval: Sequence[float] | None = None) -> bool:
    """The bin holds: the upper end of its interval (the value where there is none) at most HOLDS as shown."""
    top = value if interval is None else interval[1]
    return top is not None and math.isfinite(top) and float(format(top, ".3f")) <= HOLDS


def logged_curve(run: RunDir) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, list[float]]]]:
    """full - reset per far bin at every validation of a run, and its interval where logged:
    ({bin: {optimizer steps done: value}}, {bin: {step: [lo, hi]}})."""
    out: dict[str, dict[int, float]] = {bin_name(a, b): {} for a, b in FAR_BINS}
    ends: dict[str, dict[int, dict[str, float]]] = {bin_name(a, b): {} for a, b in FAR_BINS}
    for row in read_metrics(run.metrics_file):
        for key, value in row.items():
            m = _TAG.match(key)
            if not m or (int(m.group(2)), int(m.group(3))) not in FAR_BINS:
                continue
            name, step = bin_name(int(m.group(2)), int(m.group(3))), int(row["step"]) + 1  # a resume: the last
            if m["end"]:
                ends[name].setdefault(step, {})[m["end"]] = value
            else:
                out[name][step] = value
    intervals = {b: {s: [e["_lo"], e["_hi"]] for s, e in steps.items() if "_lo" in e and "_hi" in e}
                 for b, steps in ends.items()}
    return out, intervals


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
    curve, intervals = logged_curve(run)
    if not pretrained or not any(curve.values()):
        return None
    entry = {"label": label, "run_dir": str(run.path), "intervention": (cfg.get("intervention") or {}).get("name"),
             "val_every_n_steps": (cfg.get("trainer") or {}).get("val_every_n_steps"), "base": str(pretrained),
             "val_sequences": (cfg.get("data") or {}).get("val_sequences"),
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
        base_curve, base_intervals = logged_curve(base_run)
        if steps is not None and same_data and all(steps in base_curve[b] for b in curve):
            for b in curve:
                curve[b][0] = base_curve[b][steps]
                if steps in base_intervals[b]:
                    intervals[b][0] = base_intervals[b][steps]
            entry["base_at_step_0"] = True
        if steps:
            same = per_step is not None and per_step == entry["posttrain_tokens_per_step"]
            entry["fraction_basis"] = "steps" if same or entry["pretrain_tokens"] is None else "tokens"
    points = sorted({s for values in curve.values() for s in values})
    entry["points"] = [{"step": s, **{b: curve[b].get(s) for b in curve},
                        "intervals": {b: intervals[b][s] for b in curve if s in intervals[b]}} for s in points]
    entry.update(_first_steps(entry))
    return entry


def _first_steps(entry: dict) -> dict:
    """First step at which each bin (and both) holds; the step from which it holds at every later validation; their
    shares of pre-training."""
    names = [bin_name(a, b) for a, b in FAR_BINS]
    def held(p: dict, b: str) -> bool:
        return holds(p[b], (p.get("intervals") or {}).get(b))

    ok = {b: [(p["step"], held(p, b)) for p in entry["points"] if p[b] is not None] for b in names}
    ok["both"] = [(p["step"], all(held(p, b) for b in names)) for p in entry["points"]
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


def _every(c: dict) -> str:
    n = c.get("val_every_n_steps")
    return f"every {n} steps" if n else "at the end only (trainer.val_every_n_steps=0)"


def _point(p: dict, b: str) -> str:
    interval = (p.get("intervals") or {}).get(b)
    return _f(p[b]) + ("" if interval is None else f" [{interval[0]:+.3f}, {interval[1]:+.3f}]")


def steps_lines(curves: Sequence[dict], *, evaluated_sequences: int | None = None) -> list[str]:
    """The report's section: the first step at which each far bin holds, then the curve itself, with the sample
    each point stands on (the run's own validation sequences) beside the evaluation's."""
    names = [bin_name(a, b) for a, b in FAR_BINS]
    samples = sorted({c.get("val_sequences") for c in curves if c.get("val_sequences")})
    with_ci = all(p.get("intervals") for c in curves for p in c["points"])
    sample = (f"Each point is the run's own validation on {' / '.join(map(str, samples)) or '?'} held-out sequences "
              "(data.val_sequences)" + (f", not the {evaluated_sequences} this report's verdicts read"
                                        if evaluated_sequences else "")
              + (": its 95% paired-bootstrap interval follows it, and a bin holds where the upper end is at most "
                 f"+{HOLDS:g}" if with_ci else
                 ": the log has no intervals (an older recurlen), so a bin holds where its value is at most "
                 f"+{HOLDS:g}")
              + ". Where a point and a verdict disagree, the verdict's larger sample decides; the point's interval "
                "says how far it can be trusted.")
    lines = ["## Post-training steps to hold", "",
             "full - reset in the far bins at every validation of each post-training run (its metrics.csv), against "
             "post-training steps; step 0 is the base's last validation where it is the same checkpoint on the same "
             "held-out data. \"first\" is the first validation at which a bin holds; \"from\" the step from which it "
             "holds at every later validation.", "", sample, "",
             f"![steps to hold]({STEPS_PNG})", "",
             "| run | validated | sequences | " + " | ".join(f"{b} first (share) | {b} from" for b in names)
             + " | both first |", "|---" * (4 + 2 * len(names)) + "|"]
    for c in curves:
        last = c["points"][-1]["step"] if c["points"] else 0
        never = f"not in {last}"
        cells = []
        for b in names:
            first = c["first_holding_step"][b]
            cells += [never if first is None else f"{first} ({_share(c, b)})",
                      never if c["holding_from_step"][b] is None else str(c["holding_from_step"][b])]
        both = c["first_holding_step"]["both"]
        lines.append(f"| {c['label']} | {_every(c)} | {c.get('val_sequences') or '?'} | " + " | ".join(cells)
                     + f" | {never if both is None else both} |")
    lines += ["", "The curves (full - reset, nats/token" + (", with 95% intervals" if with_ci else "") + "):", ""]
    for c in curves:
        base = "" if c["base_at_step_0"] else " (no step 0: the base's last validation is not of the same checkpoint "
        base += "" if c["base_at_step_0"] else "on the same data)"
        lines += [f"{c['label']} ({c['pretrain_steps'] or '?'} pre-training steps){base}", "",
                  "| step | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        lines += [f"| {p['step']} | " + " | ".join(_point(p, b) for b in names) + " |" for p in c["points"]]
        lines.append("")
    return lines


__all__ = ["FAR_BINS", "HOLDS", "STEPS_PNG", "holds", "logged_curve", "plot_steps_curve", "run_curve",
           "steps_curves", "steps_lines", "tokens_per_step"]
