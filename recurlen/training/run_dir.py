"""The run directory: its layout, which checkpoint a run resumes from, and loading what a run trained.

Layout of a run directory (`recurlen finetune` writes it; eval, tasks, the demo and reports read it):
  config.yaml                   the resolved experiment config the run uses (also in every checkpoint's
                                hyperparameters); written once the resume decision is made (recurlen.training.resume)
  config_history.yaml           when the run started, and every resume that changed a setting (what, from, to)
  checkpoints/last.ckpt         newest state, replaced in place
  checkpoints/step=NNNNNN.ckpt  kept every trainer.checkpoint_every_n_steps
  checkpoints/*.damaged         a checkpoint found damaged when resuming, moved aside (never deleted)
  archive/<time>/               an earlier run of this directory, moved here by resume=archive
  hpc_ckpt_N.ckpt               written by Lightning when SLURM pre-empts the job
  tb/                           TensorBoard event files
  metrics.csv                   every logged scalar, one row per logging call (step, then the metrics by name);
                                a resumed run replaces the rows of the steps it trains again
  wandb/, mlruns/               W&B's offline files and MLflow's local store, when trainer.loggers asks for them
  fitted_noise.pt               fitted-noise statistics (fitted_noise intervention, `recurlen fit-noise`)
  ranks/rank<r>.json            what each rank trained on (lanes, steps, last loss)
  writer.lock, writer.json      while a run writes here: its single-writer lock and who holds it (host, pid, since,
                                heartbeat); taken before anything else is written, removed when the run ends
                                (recurlen.util.writer_lock). eval and report only read a run: they never need it

Any model recurlen evaluates is loaded through `load_model`: a run directory, one of its .ckpt files (keys
prefixed "model.", the model config and data facts under RUN_META_KEY), an official-format directory, or a
hub id in the local cache.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from omegaconf import OmegaConf

from recurlen.models import registry, table
from recurlen.models.interface import RecurrentLM
from recurlen.models.official import CONFIG_NAME
from recurlen.util.atomic_files import write_text
from recurlen.util.errors import UserError
from recurlen.util.hub import resolve_hub_file, resolve_pretrained_dir
from recurlen.util.writer_lock import WriterLock, hold

CHECKPOINTS_DIR = "checkpoints"
LAST_CHECKPOINT = "last.ckpt"
STEP_CHECKPOINT = "step={step:06d}"
"""Lightning's filename pattern of the kept step checkpoints (without .ckpt)."""
PREEMPTION_GLOB = "hpc_ckpt_*.ckpt"
CONFIG_FILE = "config.yaml"
HISTORY_FILE = "config_history.yaml"
ARCHIVE_DIR = "archive"
DAMAGED_SUFFIX = ".damaged"
FITTED_NOISE_FILE = "fitted_noise.pt"
TENSORBOARD_DIR = "tb"
METRICS_FILE = "metrics.csv"
WANDB_DIR = "wandb"
MLFLOW_DIR = "mlruns"
RANKS_DIR = "ranks"
RESUME_CHOICES = ("auto", "never", "archive")
"""`resume` is one of these or the path of a .ckpt file: auto continues the run in run_dir (if any), never starts
a new run in an empty run_dir, archive moves an earlier run aside (ARCHIVE_DIR) and starts a new one."""
RUN_META_KEY = "recurlen"
"""Key of a Lightning checkpoint under which the LightningModule stores the model config and training facts."""


class RunDir:
    """The paths of one run directory; nothing is created until something is written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoints / LAST_CHECKPOINT

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def fitted_noise(self) -> Path:
        return self.path / FITTED_NOISE_FILE

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD_DIR

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def history_file(self) -> Path:
        return self.path / HISTORY_FILE

    @property
    def archive(self) -> Path:
        return self.path / ARCHIVE_DIR

    def check_location(self) -> None:
        """run_dir must be a directory or not exist yet, and not lie under a file (said before anything is built)."""
        for p in (self.path, *self.path.parents):
            if p.exists():
                if not p.is_dir():
                    where = "is a file" if p == self.path else f"lies under {p}, which is a file"
                    raise UserError(f"run_dir={self.path} {where}, not a directory; choose another run_dir")
                return

    def writer_lock(self, *, enabled: bool = True) -> contextlib.AbstractContextManager[WriterLock | None]:
        """The run's single-writer lock, held for the life of a run by the process that writes it (rank 0);
        a second process is refused at once, naming the holder. A no-op when not `enabled` (the other ranks)."""
        if not enabled:
            return contextlib.nullcontext()
        self.check_location()
        return hold(self.path, advice="choose another run_dir")

    def rank_summary(self, rank: int) -> Path:
        return self.path / RANKS_DIR / f"rank{rank}.json"

    def has_checkpoint(self) -> bool:
        return self.last_checkpoint.is_file()

    def checkpoint_candidates(self) -> list[Path]:
        """Every checkpoint a resume could start from, the furthest trained first: by the step each holds (read
        memory-mapped), then by time, last.ckpt first among equals. Files whose step cannot be read come first,
        so that a resume examines them and moves them aside as damaged. By step, not by time: a copied or
        restored run directory gives every file the copy's time, which would resume from an older checkpoint.
        (A deliberate roll-back to an older checkpoint moves the later ones to the archive, see resume.py, so
        the directory holds one line of checkpoints.)"""
        return [path for path, _ in self.checkpoint_steps()]

    def checkpoint_steps(self) -> list[tuple[Path, int | None]]:
        """checkpoint_candidates() with the step each holds (None: unreadable)."""
        found = list(self.checkpoints.glob("*.ckpt")) + list(self.path.glob(PREEMPTION_GLOB))
        stamped = []
        for p in found:
            try:
                mtime = p.stat().st_mtime
            except FileNotFoundError:  # moved aside by another rank meanwhile
                continue
            step = checkpoint_step(p)
            stamped.append((step is None, -1 if step is None else step, mtime, p.name == LAST_CHECKPOINT, p.name,
                            (p, step)))
        return [entry for *_, entry in sorted(stamped, reverse=True)]

    def damaged_checkpoints(self) -> list[Path]:
        """Checkpoints moved aside as damaged by an earlier resume."""
        return sorted(self.checkpoints.glob(f"*{DAMAGED_SUFFIX}*")) + sorted(self.path.glob(f"*{DAMAGED_SUFFIX}*"))

    def run_files(self) -> list[Path]:
        """What an earlier run left in this directory (what resume=never refuses to mix with, and resume=archive
        moves aside): config, history, checkpoints, logs (TensorBoard, metrics.csv, W&B, MLflow), rank summaries,
        fitted noise."""
        names = (CONFIG_FILE, HISTORY_FILE, CHECKPOINTS_DIR, TENSORBOARD_DIR, METRICS_FILE, WANDB_DIR, MLFLOW_DIR,
                 RANKS_DIR, FITTED_NOISE_FILE)
        out = [self.path / n for n in names if (self.path / n).exists()]
        return out + sorted(self.path.glob(PREEMPTION_GLOB))

    def resume_checkpoint(self, resume: str) -> str | None:
        """'never' / 'archive' -> None; a .ckpt path as is; 'auto' -> the furthest-trained checkpoint of this run,
        None if it has none (whether it is intact is recurlen.training.resume's business)."""
        check_resume(resume)
        if resume in ("never", "archive"):
            return None
        if resume != "auto":
            if not Path(resume).is_file():
                raise FileNotFoundError(f"resume={resume!r}: no such checkpoint file (use 'auto', 'never', "
                                        "'archive' or a .ckpt path)")
            return resume
        candidates = self.checkpoint_candidates()
        return str(candidates[0]) if candidates else None

    def save_config(self, resolved: dict) -> Path:
        return write_text(self.config_file, OmegaConf.to_yaml(OmegaConf.create(resolved)))

    def read_config(self) -> dict | None:
        """The resolved experiment config this run was trained with, or None when the run has none."""
        if not self.config_file.is_file():
            return None
        return OmegaConf.to_container(OmegaConf.load(self.config_file), resolve=True)


RUNS_DIR = "runs"
"""Where runs go by default: runs/<name>/<model>-<intervention>."""


def check_run_name(name: str) -> None:
    """A run's name is a folder inside RUNS_DIR; one that leads outside it ('..', an absolute path) is refused."""
    target = os.path.normpath(os.path.join(RUNS_DIR, name))
    if target != RUNS_DIR and not target.startswith(RUNS_DIR + os.sep):
        raise ValueError(f"name={name!r} would put the run in {target}, outside {RUNS_DIR}/: a name is a folder "
                         f"inside {RUNS_DIR}/ (no '..', not absolute); use run_dir=PATH to put a run elsewhere")


def check_resume(resume: str) -> None:
    """'auto', 'never' or the path of a .ckpt file (whether that file exists is checked when the run starts)."""
    if resume in ("True", "False"):  # resume=yes / no / true / on ... reach here as a yes/no value
        raise ValueError(f"resume={'yes' if resume == 'True' else 'no'} (a yes/no word) does not say how to resume; "
                         f"use one of {list(RESUME_CHOICES)} (auto continues the run in run_dir, if any) or the path "
                         "of a .ckpt file")
    if resume not in RESUME_CHOICES and not str(resume).endswith(".ckpt"):
        raise ValueError(f"resume={resume!r} is not allowed; use one of {list(RESUME_CHOICES)} or the path of a "
                         ".ckpt file")


def checkpoint_step(path: str | Path) -> int | None:
    """The global step a checkpoint was written at (memory-mapped: the weights are not read); None when the file
    does not load."""
    try:
        ckpt = torch.load(Path(path), map_location="cpu", weights_only=True, mmap=True)
        return int(ckpt["global_step"])
    except Exception:  # a damaged or foreign file has no step to report
        return None


def run_dir_of(path: str | Path) -> RunDir | None:
    """The run directory that a run directory or one of its checkpoints belongs to (None for anything else)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return RunDir(p) if (p / CONFIG_FILE).is_file() or (p / CHECKPOINTS_DIR).is_dir() else None
    if p.suffix == ".ckpt":
        for parent in (p.parent.parent, p.parent) if p.parent.name == CHECKPOINTS_DIR else (p.parent,):
            if (parent / CONFIG_FILE).is_file():
                return RunDir(parent)
    return None


def run_config(path: str | Path) -> dict | None:
    """The resolved experiment config of the run that `path` (a run directory or a .ckpt) belongs to.

    Read from the run's config.yaml; a .ckpt kept outside its run directory falls back to the
    hyperparameters stored in it (memory-mapped: the weights are not read).
    """
    run = run_dir_of(path)
    if run is not None and run.config_file.is_file():
        return run.read_config()
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".ckpt":
        from recurlen.util.errors import load_error

        try:
            ckpt = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
        except Exception as err:  # a planted pickle, a truncated file: one line naming it, as load_checkpoint_file
            raise load_error(p, err) from err
        if not isinstance(ckpt, dict):
            raise UserError(f"{p} is not a recurlen checkpoint (it holds a {type(ckpt).__name__}, not a dict)")
        return dict(ckpt.get("hyper_parameters") or {}) or None
    return None


class LoadedModel:
    """A model plus what is known of how it was trained (None where the source does not say)."""

    def __init__(self, model: RecurrentLM, *, tokenizer: str | None, train_seq_len: int | None,
                 source: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.train_seq_len = train_seq_len
        self.source = source


def load_checkpoint_file(path: str | Path) -> dict:
    """A recurlen .ckpt (weights_only); a file that does not load is a one-line user error naming it."""
    from recurlen.util.errors import load_error

    try:
        ckpt = torch.load(Path(path), map_location="cpu", weights_only=True)
    except Exception as err:
        raise load_error(path, err) from err
    if not isinstance(ckpt, dict):
        raise UserError(f"{path} is not a recurlen checkpoint (it holds a {type(ckpt).__name__}, not a dict)")
    return ckpt


def _checkpoint_file(path: str) -> Path | None:
    """The .ckpt that `path` names: itself, or a run directory's last checkpoint; None for other sources."""
    p = Path(path).expanduser()
    if p.is_dir() and not (p / CONFIG_NAME).is_file() and RunDir(p).has_checkpoint():
        return RunDir(p).last_checkpoint
    if p.is_file() and p.suffix == ".ckpt":
        return p
    return None


def load_model(path: str, *, backend: str = "auto", device=None) -> LoadedModel:
    """Load a run (its directory or a .ckpt), an official-format directory / cached hub id, or a weights file of an
    architecture whose release format is one file."""
    ckpt_path = _checkpoint_file(path)
    if ckpt_path is not None:
        ckpt = load_checkpoint_file(ckpt_path)
        meta = ckpt.get(RUN_META_KEY)
        if not meta or "model_config" not in meta:
            raise UserError(f"{ckpt_path} is a Lightning checkpoint without recurlen metadata (key {RUN_META_KEY!r}); "
                             "it was not written by recurlen's LightningModule and has no state API to evaluate")
        # Checkpoints written before there were several architectures hold Mamba-2 models.
        a = registry.get(meta.get("architecture", registry.DEFAULT))
        model = a.build(a.config_from_dict(meta["model_config"]), backend=backend)
        prefix = "model."
        state_dict = {k[len(prefix):]: v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}
        a.load_state_dict(model, state_dict, str(ckpt_path))
        return LoadedModel(model.to(device), tokenizer=meta.get("tokenizer"), train_seq_len=meta.get("train_seq_len"),
                           source=str(ckpt_path))
    file = resolve_hub_file(str(path)) or Path(path).expanduser()  # owner/name/file: from the HF cache
    if file.is_file():  # an architecture's release format that is one weights file (registry.detect says whose)
        a = registry.detect(file)
        model = a.load_pretrained(file, backend=backend, device=device, dtype=torch.float32)
        known = table.official(file)
        train_seq_len = known.train_seq_len if known is not None and known.architecture == a.name else None
        return LoadedModel(model, tokenizer=None, train_seq_len=train_seq_len, source=str(file))
    directory = resolve_pretrained_dir(str(path))
    a = registry.detect(directory)
    model = a.load_pretrained(directory, backend=backend, device=device, dtype=torch.float32)
    has_tokenizer = (directory / "tokenizer.json").is_file() or (directory / "tokenizer_config.json").is_file()
    known = table.official(directory)  # an official checkpoint (by hub id or directory name) says its context
    train_seq_len = known.train_seq_len if known is not None and known.architecture == a.name else None
    if train_seq_len is None:  # `recurlen export` records the exported run's
        from recurlen.models.export_manifest import recorded_train_seq_len

        train_seq_len = recorded_train_seq_len(directory)
    return LoadedModel(model, tokenizer=str(directory) if has_tokenizer else None, train_seq_len=train_seq_len,
                       source=str(directory))


__all__ = ["ARCHIVE_DIR", "CONFIG_FILE", "DAMAGED_SUFFIX", "FITTED_NOISE_FILE", "HISTORY_FILE", "LAST_CHECKPOINT",
           "LoadedModel", "RUNS_DIR", "RUN_META_KEY", "RunDir", "check_resume", "check_run_name",
           "checkpoint_step", "load_checkpoint_file", "load_model", "run_config", "run_dir_of"]
