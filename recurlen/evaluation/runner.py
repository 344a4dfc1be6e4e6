"""`recurlen eval`: evaluate one or several checkpoints on held-out long sequences.

    cfg = EvalConfig(checkpoints=["baseline=runs/base", "sp=runs/state_passing"], train_len=2048)
    results = run_eval(cfg, sequences)          # sequences: LongTensor (num, >= L) or list of 1-D

writes <output_dir>/results.json (atomically) and PNG plots comparing the runs; with several runs first of all
compare_full_minus_reset.png (full - reset and loss of every run against position in units of T, on shared
axes, one colour per run) and the same figure as a TensorBoard run <output_dir>/compare.

results.json:
    {"format": "recurlen.eval/1", "config": {EvalConfig fields}, "device": "cpu",
     "plots": {"ppl": "ppl_by_position.png", ...},
     "runs": [{"label", "source", "train_len", "seq_len",
               "positionwise": {"train_len", "seq_len", "num_sequences", "convention",
                                "bins":     [{"name": "[2T,4T)", "start", "end", "kind": "context", "count",
                                              "loss", "ppl", "reset_loss", "reset_ppl", "full_minus_reset"}],
                                "log_bins": [same, kind "log", names in tokens]},
               "state":  {"positions": [S], "num_sequences", "ssm_norm": [[S] x layers], "ssm_std",
                          "conv_norm", "conv_std"},
               "effrem": {"T", "t": [G], "effrem": [G], "num_sequences", "suffix_tokens_per_sequence"},
               "fix":    {"name", "base", "paper", "config", "calibrated_parameters", "values", "calibration",
                          "seconds"}}]}     # only on a training-free fix's entry (fixes=[...]), labelled base+name
Sections of tasks that were not run are absent; reset_* keys only with the "reset" task; numbers
that are not finite are written as null.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from recurlen.diagnostics.effrem import check_t_grid, effective_remembrance
from recurlen.diagnostics.model_access import available_length, require_state_api, select_sequences, unigram_loss
from recurlen.diagnostics.plots import PLOT_NAMES, RESULTS_NAME, write_plots
from recurlen.diagnostics.positionwise import evaluate_positionwise
from recurlen.evaluation import fixes as fix_table
from recurlen.evaluation.fixes import arguments as fix_args
from recurlen.models import registry
from recurlen.training.resume import checkpoint_to_read
from recurlen.training.run_dir import load_model, run_dir_of
from recurlen.util.atomic_files import json_safe, write_json
from recurlen.util.errors import UserError

log = logging.getLogger(__name__)

TASKS = ("positionwise", "reset", "state", "effrem")
RESULTS_FORMAT = "recurlen.eval/1"
GPU_SEQ_LEN = 131072
CPU_CONTEXT_MULTIPLE = 16


@dataclass
class EvalConfig:
    checkpoints: list[str] = field(default_factory=list)
    """Runs to compare: "path" or "label=path" (run dir, Lightning .ckpt, pretrained dir, cached hub id)."""
    output_dir: str = "eval"
    """Where results.json and the PNG plots go."""
    seq_len: int | None = None
    """L, tokens per held-out sequence. None: the held-out data's data.val_length, else 16 x its data.seq_len (the
    first run's own data unless data= / data.* say otherwise; on CPU and CUDA alike). run_eval on sequences it is
    given: 131072 on CUDA, 16 x train_len on CPU."""
    num_sequences: int = 8
    """Held-out sequences for the position-wise / state evaluation."""
    train_len: int | None = None
    """T, the training context. None: read from each checkpoint (ValueError if it does not say)."""
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    """What to run, any of TASKS: positionwise, reset (the reset-every-T control), state, effrem."""
    log_bins: int = 24
    """Number of log-spaced position bins (next to the fixed [0,T), [T,2T), [2T,4T), ... bins); 0: none."""
    chunk_len: int = 2048
    """Tokens per forward call; memory is O(batch_size x chunk_len), independent of L."""
    batch_size: int = 8
    """Sequences per forward call."""
    state_points: int = 48
    """Extra log-spaced positions where the state is sampled (dense early, besides every chunk end)."""
    effrem_len: int | None = None
    """T of EffRem_T. None: 4 x train_len (the paper: 8192 for 2k-context models)."""
    effrem_t: list[int] | None = None
    """t-grid in [0, T-1]. None: effrem_points evenly spaced values."""
    effrem_points: int = 17
    """Points of the evenly spaced t-grid when effrem_t is None."""
    effrem_sequences: int | None = None
    """Sequences averaged for EffRem. None: num_sequences."""
    effrem_max_rows: int = 64
    """Most suffix rows in one forward call."""
    device: str = "auto"
    """"auto" (CUDA if available), "cpu", "cuda", "cuda:1", ..."""
    backend: str = "auto"
    """Model backend: auto / torch / kernel (see recurlen.models.interface)."""
    padded_vocab: bool = False
    """Normalise next-token distributions over the padded LM head (the official Mamba-2 models' 50288 rows, as
    their own evaluation does) instead of the vocab_size real rows (recurlen's default; the padded rows are
    never targets). Changes the NLL by log(1 + padded mass) per token."""
    bf16: bool = False
    """bf16 autocast on CUDA (ignored on CPU); the NLL and the TV are always computed in float32+."""
    progress: bool = True
    """tqdm progress bars."""
    num_threads: int | None = None
    """torch threads on CPU; None leaves torch's default."""
    fixes: list[str] = field(default_factory=list)
    """Training-free fixes evaluated beside the runs, each on a fresh copy of the run fix_base names: NAME, or
    KEY=NAME to have one fix twice with other settings (fix.KEY.*), NAME any of recurlen.evaluation.fixes.FIXES
    (mambaextend, a_scale, forget_more, stuffed_mamba, longmamba); labelled BASE+KEY (a bare NAME's KEY is NAME)."""
    fix_base: str | None = None
    """Label of the run the fixes are applied to. None: the first checkpoint."""
    fix: dict[str, Any] = field(default_factory=dict)
    """Each fix's settings by its key, fix.KEY.SETTING=VALUE (e.g. fix.mambaextend.steps=40)."""

    def __post_init__(self) -> None:
        self.checkpoints = [str(c) for c in self.checkpoints]  # omegaconf ListConfig -> list
        self.tasks = [str(t) for t in self.tasks]
        if not self.checkpoints:
            raise ValueError("eval: checkpoints is empty; give at least one 'path' or 'label=path'")
        unknown = sorted(set(self.tasks) - set(TASKS))
        if unknown or not self.tasks:
            raise ValueError(f"eval: unknown tasks {unknown or '(none given)'}; allowed: {list(TASKS)}")
        for name in ("num_sequences", "chunk_len", "batch_size", "effrem_points", "effrem_max_rows"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"eval: {name} must be a positive integer; got {getattr(self, name)!r}")
        for name in ("seq_len", "train_len", "effrem_len", "effrem_sequences"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"eval: {name} must be a positive integer or None; got {value!r}")
        if self.log_bins < 0 or self.state_points < 0:
            raise ValueError(f"eval: log_bins and state_points must be >= 0; got {self.log_bins}, {self.state_points}")
        if self.train_len is not None:
            if self.seq_len is not None and self.seq_len <= self.train_len:
                raise ValueError(f"eval: seq_len={self.seq_len} must be larger than the training context "
                                 f"train_len={self.train_len}")
            if self.effrem_len is not None and self.effrem_len <= self.train_len:
                raise ValueError(f"eval: effrem_len={self.effrem_len} must be larger than the training context "
                                 f"train_len={self.train_len}")
        if self.effrem_t is not None:
            self.effrem_t = [int(t) for t in self.effrem_t]
            if self.effrem_len is not None:
                check_t_grid(self.effrem_t, self.effrem_len)
        labels = [label for label, _ in self.labelled_checkpoints()]
        dupes = sorted({lab for lab in labels if labels.count(lab) > 1})
        if dupes:
            raise ValueError(f"eval: checkpoint labels must be unique; {dupes} repeat (write them as 'label=path')")
        self.fixes, self.fix = fix_args.normalise(self.fixes, self.fix)
        if self.fix_base is not None and self.fix_base not in labels:
            raise ValueError(f"eval: fix_base={self.fix_base!r} is not a checkpoint's label; labels: {labels}")
        fix_args.check_arguments(self.fixes, self.fix, what="eval")

    def fix_keys(self) -> list[tuple[str, str]]:
        """[(key, fix name)] of `fixes`: KEY=NAME, or NAME as its own key."""
        return fix_args.fix_keys(self.fixes)

    def fix_configs(self) -> list[tuple[str, fix_table.Fix, Any]]:
        """[(key, fix, its typed settings)] in the order of `fixes`."""
        return fix_args.fix_configs(self.fixes, self.fix)

    def calibration_rows(self) -> int:
        """Held-out sequences the fixes' calibrations need beside the evaluation's (the most any one needs)."""
        return fix_args.calibration_rows(self.fixes, self.fix)

    def scored_rows(self) -> int:
        """Held-out sequences the evaluation scores (the first ones); calibration takes the ones after."""
        return max(self.num_sequences, self.effrem_sequences or 0)

    def labelled_checkpoints(self) -> list[tuple[str, str]]:
        """[(label, path)]; an unlabelled path is named after its run directory."""
        out = []
        for spec in self.checkpoints:
            label, sep, path = spec.partition("=")
            if not sep or not label or "/" in label:
                label, path = _default_label(spec), spec
            out.append((label, path))
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def _default_label(path: str) -> str:
    p = Path(path)
    if p.suffix == ".ckpt" and p.parent.name == "checkpoints":
        return p.parent.parent.name or p.stem
    return p.name or str(path)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"eval: unknown device {device!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"eval: device={device!r} but CUDA is not available on this machine")
    return dev


def evaluate_model(model: torch.nn.Module, sequences, *, cfg: EvalConfig, train_len: int, label: str,
                   source: str, device: torch.device) -> dict:
    """One run entry of results.json for a model already loaded (the runner and reports use it)."""
    require_state_api(model)
    seq_len = cfg.seq_len or (GPU_SEQ_LEN if device.type == "cuda" else CPU_CONTEXT_MULTIPLE * train_len)
    if seq_len <= train_len:
        raise UserError(f"eval [{label}]: seq_len={seq_len} must be larger than the training context "
                        f"train_len={train_len}")
    tasks = set(cfg.tasks)
    effrem_len = _effrem_context(cfg, sequences, train_len=train_len, label=label) if "effrem" in tasks else 0
    entry: dict = {"label": label, "source": source, "train_len": train_len, "seq_len": seq_len}
    try:
        a = registry.of_model(model)
        entry.update(architecture=a.name, model=a.describe(model.config))
    except ValueError:  # a model outside the registry that still has the state API
        pass
    if tasks & {"positionwise", "reset", "state"}:
        result = evaluate_positionwise(
            model, sequences, train_len=train_len, seq_len=seq_len, num_sequences=cfg.num_sequences,
            chunk_len=cfg.chunk_len, batch_size=cfg.batch_size, reset_control="reset" in tasks,
            state_stats="state" in tasks, state_points=cfg.state_points, bf16=cfg.bf16, progress=cfg.progress)
        if tasks & {"positionwise", "reset"}:
            entry["positionwise"] = result.summary(num_log_bins=cfg.log_bins)
            entry["unigram_loss"] = unigram_loss(select_sequences(sequences, length=seq_len,
                                                                  num=cfg.num_sequences, what="eval"))
        if result.state is not None:
            entry["state"] = result.state.to_dict()
    if "effrem" in tasks:
        eff = effective_remembrance(
            model, sequences, context_len=effrem_len, t_grid=cfg.effrem_t, num_points=cfg.effrem_points,
            num_sequences=cfg.effrem_sequences or cfg.num_sequences, train_len=train_len, chunk_len=cfg.chunk_len,
            batch_size=cfg.batch_size, max_batch_rows=cfg.effrem_max_rows, bf16=cfg.bf16, progress=cfg.progress)
        entry["effrem"] = eff.to_dict()
    return entry


def _effrem_context(cfg: EvalConfig, sequences, *, train_len: int, label: str) -> int:
    """T of EffRem_T: effrem_len, else 4 x train_len, fitted to the held-out sequences when they are shorter
    (said in a warning); an effrem_len given that they cannot serve is a UserError naming the settings to change."""
    want = cfg.effrem_len or 4 * train_len
    have = available_length(sequences, cfg.effrem_sequences or cfg.num_sequences)
    if have == 0 or want <= have:  # have == 0: too few sequences, which select_sequences reports
        return want
    if cfg.effrem_len is None and have > train_len and max(cfg.effrem_t or [0]) < have:
        log.warning("eval [%s]: EffRem's context is 4 x train_len = %d by default, but the held-out sequences hold %d "
                    "tokens: measuring EffRem_%d (seq_len=%d or more measures EffRem_%d)", label, want, have, have,
                    want, want)
        return have
    raise UserError(f"eval [{label}]: EffRem with a context of {want} tokens needs held-out sequences that long; "
                    f"they hold {have} (seq_len): raise seq_len to {want} or more, set effrem_len between "
                    f"train_len={train_len} and {have}, or leave effrem out of tasks")


def _summary_line(entry: dict) -> str:
    parts = [entry["label"]]
    for row in (entry.get("positionwise") or {}).get("bins", []):
        parts.append(f"{row['name']} ppl {row['ppl']:.3f}")
    if entry.get("effrem"):
        parts.append(f"EffRem(t={entry['effrem']['t'][-1]}) {entry['effrem']['effrem'][-1]:.3f}")
    return " | ".join(parts)


def _checkpoint_of(path: str) -> str:
    """A run directory is evaluated at the checkpoint its resume would continue from, chosen by the resume's own
    checks (recurlen.training.resume.checkpoint_to_read): a damaged last.ckpt falls back to the intact checkpoint
    of the same step. Any other source is loaded as given."""
    run, p = run_dir_of(path), Path(path).expanduser()
    if run is None or not p.is_dir() or (p / "config.json").is_file() or not run.has_checkpoint():
        return path
    return str(checkpoint_to_read(run))


def _load(cfg: EvalConfig, label: str, path: str, *, device: torch.device):
    """(the loaded run, its T) as the evaluation scores it: at its resume checkpoint, normalised over the padded LM
    head with padded_vocab=true."""
    loaded = load_model(_checkpoint_of(path), backend=cfg.backend, device=device)
    train_len = cfg.train_len or loaded.train_seq_len
    if train_len is None:
        raise UserError(f"eval [{label}]: {path} does not record its training context; set train_len= "
                        "(EvalConfig.train_len)")
    if cfg.padded_vocab:
        if not hasattr(loaded.model, "score_padded_vocab"):
            raise ValueError(f"eval [{label}]: padded_vocab=true needs a model with a padded LM head "
                             f"(Mamba-2); {type(loaded.model).__name__} has none")
        loaded.model.score_padded_vocab = True
    return loaded, train_len


def _evaluate_fixes(cfg: EvalConfig, sequences, *, device: torch.device) -> list[dict]:
    """One entry per training-free fix: the base run loaded afresh, the fix applied (calibrated on the held-out
    sequences after those the evaluation scores), then evaluated like any run."""
    if not cfg.fixes:
        return []
    labelled = dict(cfg.labelled_checkpoints())
    base = cfg.fix_base or next(iter(labelled))
    rest = sequences[cfg.scored_rows():]
    entries = []
    for key, fix, fix_cfg in cfg.fix_configs():
        label = f"{base}+{key}"
        # Scored (and calibrated) like the runs it is compared with: padded_vocab applies to the fix's model too.
        loaded, train_len = _load(cfg, label, labelled[base], device=device)
        record = fix_args.apply_fix(loaded.model, key, fix, fix_cfg, base=base, rows=rest, length=cfg.seq_len,
                                    train_len=train_len)
        entry = evaluate_model(loaded.model, sequences, cfg=cfg, train_len=train_len, label=label,
                               source=loaded.source, device=device)
        entry["fix"] = record
        log.info("%s", _summary_line(entry))
        entries.append(entry)
        del loaded
    return entries


def run_eval(cfg: EvalConfig, sequences: torch.Tensor | list[torch.Tensor]) -> dict:
    """Evaluate every checkpoint of cfg on the held-out sequences; write results.json and plots."""
    device = resolve_device(cfg.device)
    out_dir = Path(cfg.output_dir)
    runs = []
    for label, path in cfg.labelled_checkpoints():
        loaded, train_len = _load(cfg, label, path, device=device)
        log.info("evaluating %s (%s) at T=%d on %s", label, loaded.source, train_len, device)
        entry = evaluate_model(loaded.model, sequences, cfg=cfg, train_len=train_len, label=label,
                               source=loaded.source, device=device)
        log.info("%s", _summary_line(entry))
        runs.append(entry)
        del loaded  # one model on the device at a time
        if device.type == "cuda":
            torch.cuda.empty_cache()
    runs += _evaluate_fixes(cfg, sequences, device=device)
    plots = write_plots(runs, out_dir)
    results = {"format": RESULTS_FORMAT, "config": cfg.to_dict(), "device": str(device),
               "plots": {kind: PLOT_NAMES[kind] for kind in plots}, "runs": runs}
    write_json(out_dir / RESULTS_NAME, results, indent=2)
    return json_safe(results)
