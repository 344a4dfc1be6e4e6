"""Typed schema of an experiment. Every YAML under experiments/ is merged onto these dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recurlen.models import registry
from recurlen.models.backends import BACKENDS
from recurlen.models.head_loss import HEAD_LOSSES
from recurlen.training.data.config import DataConfig
from recurlen.training.interventions import INTERVENTIONS, InterventionConfig
from recurlen.training.loggers import check_logger_names
from recurlen.training.optim import OptimConfig
from recurlen.training.run_dir import RUNS_DIR, check_resume, check_run_name

GROUPS = ("model", "intervention", "data", "trainer")
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "64-true")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "fsdp", "deepspeed", "single_device")
ON_NONFINITE = ("stop", "rollback")


@dataclass
class ModelSection:
    name: str = "tiny"
    """A name of the model table, recurlen.models.table (docs/architectures.md; an unknown name is refused
    with the list), or 'custom'."""
    architecture: str = registry.DEFAULT
    """An architecture of recurlen.models.registry (an unknown one is refused with the list); decides what
    `arch` holds."""
    pretrained: str | None = None
    """Weights to start from: an official directory, a hub id in the local cache, or a recurlen run
    checkpoint / run directory. None trains from the initialisation given by `arch`."""
    backend: str = "auto"
    """'auto' (kernels on CUDA when installed), 'torch', or 'kernel'."""
    arch: dict[str, Any] = field(default_factory=dict)
    """Shape and initialisation: fields of the architecture's config (Mamba2Config, Mamba1Config, GLAConfig;
    unset fields keep its defaults); ignored (the checkpoint's config wins) when `pretrained` is set."""
    default_data: str | None = None
    """The data group used with this model unless the command line picks one (official models: pile)."""
    pretrain_lr: float | None = None
    """Peak learning rate the checkpoint was pre-trained with (official models: the model table's pretrain_lr);
    post-training uses a fraction of it (optim.lr_from_pretrain)."""

    def __post_init__(self) -> None:
        a = registry.get(self.architecture)
        if self.name not in a.model_names() and self.name != "custom":
            raise ValueError(f"model.name={self.name!r} is unknown for architecture={self.architecture}; allowed: "
                             f"{a.model_names()} or 'custom'")
        a.config_from_dict(self.arch)  # validates the arch fields (unknown keys and bad values name themselves)
        if self.backend not in BACKENDS:
            raise ValueError(f"model.backend={self.backend!r} is unknown; allowed: {list(BACKENDS)}")
        if self.pretrain_lr is not None and not self.pretrain_lr > 0:
            raise ValueError(f"model.pretrain_lr must be > 0 or null; got {self.pretrain_lr}")

    @property
    def config(self):
        """The architecture's typed config built from `arch`."""
        return registry.get(self.architecture).config_from_dict(self.arch)


@dataclass
class TrainerSection:
    max_steps: int = 500
    """Optimizer steps (the paper post-trains for 500, ~0.1% of pre-training)."""
    accumulate_grad_batches: int = 1
    """Micro-batches per optimizer step."""
    accelerator: str = "auto"
    """'auto', 'cpu' or 'gpu' (Lightning's names)."""
    devices: str = "auto"
    """'auto', a count, or a comma list of ids; per node."""
    num_nodes: int = 1
    """Machines; devices are per node."""
    strategy: str = "auto"
    """auto, ddp, fsdp, ... (Lightning's names). Each rank owns its lanes and their states."""
    precision: str = "auto"
    """'auto' = bf16-mixed on CUDA (fp32 master weights), 32-true elsewhere."""
    val_every_n_steps: int = 100
    """Run validation (and the diagnostics callbacks) every this many optimizer steps; 0 = only at the end."""
    limit_val_batches: int = 8
    """Batches of held-out segments that val/loss averages per validation."""
    log_every_n_steps: int = 10
    """Log train/* scalars every this many optimizer steps."""
    checkpoint_every_n_steps: int = 100
    """Keep a step checkpoint every this many steps (plus last.ckpt); 0 = only last.ckpt at the end."""
    num_threads: int | None = None
    """torch.set_num_threads on CPU; None leaves torch's default."""
    progress_bar: bool = True
    """The step progress bar (step n/max, tokens/s)."""
    loggers: list[str] = field(default_factory=list)
    """Loggers beside TensorBoard (tb/) and metrics.csv, which every run writes: wandb (offline in the run directory
    unless WANDB_MODE is set), mlflow (a local store in the run directory unless MLFLOW_TRACKING_URI is set); each
    needs its package installed. E.g. trainer.loggers=[wandb,mlflow]."""
    slurm_auto_requeue: bool = True
    """Under SLURM, requeue the job on the pre-emption signal; it resumes from last.ckpt."""
    deterministic: bool = False
    """torch deterministic algorithms (slower)."""
    on_nonfinite: str = "stop"
    """A NaN / infinity in a step: 'stop' (one line naming the checkpoint from before the divergence began and the
    command that resumes it at a lower rate) or 'rollback' (do that automatically: reload it, lower optim.lr 4x,
    skip the batches that diverged; each rollback is recorded in config_history.yaml)."""
    max_rollbacks: int = 3
    """With on_nonfinite=rollback: stop after this many rollbacks in one invocation."""
    head_loss: str = "auto"
    """The LM head's cross-entropy: 'plain' (the whole float32 logits of a micro-batch, then the loss), 'chunked' (64
    MiB of logits at a time, the gradients made in the same pass: the whole logits never exist; same loss and gradients
    up to float rounding), or 'auto' (chunked where a micro-batch's logits exceed 64 MiB, as 8 x 2048 tokens of a 50k
    vocabulary do; the CPU demos' tiny batches keep the plain path). docs/benchmarks.md has the measured memory."""
    compile: bool = False
    """torch.compile the training step's forward and loss (a model it cannot compile trains eagerly, with one warning
    line). Off by default: docs/benchmarks.md has compile against eager on CPU."""

    def __post_init__(self) -> None:
        for name in ("max_steps", "accumulate_grad_batches", "num_nodes", "limit_val_batches", "log_every_n_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be >= 1; got {getattr(self, name)}")
        for name in ("val_every_n_steps", "checkpoint_every_n_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"trainer.{name} must be >= 0; got {getattr(self, name)}")
        check_logger_names(self.loggers)
        if self.on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"trainer.on_nonfinite={self.on_nonfinite!r} is unknown; allowed: {list(ON_NONFINITE)}")
        if self.max_rollbacks < 0:
            raise ValueError(f"trainer.max_rollbacks must be >= 0; got {self.max_rollbacks}")
        if self.head_loss not in HEAD_LOSSES:
            raise ValueError(f"trainer.head_loss={self.head_loss!r} is unknown; allowed: {list(HEAD_LOSSES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"trainer.precision={self.precision!r} is unknown; allowed: {list(PRECISIONS)}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"trainer.strategy={self.strategy!r} is unknown; allowed: {list(STRATEGIES)}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"trainer.num_threads must be >= 1 or null; got {self.num_threads}")
        devices = str(self.devices).strip()
        ids = [d.strip() for d in devices.split(",") if d.strip()]
        if devices == "0" or not (devices in ("auto", "-1") or (devices.isdigit() and int(devices) >= 1)
                                  or ("," in devices and ids and all(d.isdigit() for d in ids))):
            raise ValueError(f"trainer.devices={self.devices!r} is not allowed; need 'auto', a count >= 1, -1 (every "
                             "device) or a comma list of device ids such as '0,1' (devices=0 would train on nothing)")


@dataclass
class DiagnosticsConfig:
    positionwise: bool = True
    """Position-wise loss / perplexity (and the reset control) on the long held-out sequences."""
    state_norm: bool = True
    """State norm / std by position, per layer."""
    effrem: bool = False
    """Effective Remembrance (costly: one suffix run per grid point)."""
    chunk_len: int | None = None
    """Evaluation chunk length (state carried between chunks); None = 4 * train length."""
    bins: str = "multiples"
    """'multiples' of the training context ([0,T), [T,2T), [2T,4T), ...) or 'log' spaced."""
    num_sequences: int | None = None
    """Long sequences to evaluate (None: all the DataModule provides)."""
    effrem_T_factor: int = 4
    """EffRem's T as a multiple of the training context (paper: 4x)."""
    effrem_points: int = 8
    """Points of the t-grid in [0, T]."""
    every_n_val: int = 1
    """Run the diagnostics every n-th validation."""
    state_layers: list[int] = field(default_factory=list)
    """Layers whose state norm / std get TensorBoard scalars of their own; the mean over layers always does."""

    def __post_init__(self) -> None:
        if self.bins not in ("multiples", "log"):
            raise ValueError(f"diagnostics.bins={self.bins!r} is unknown; allowed: ['multiples', 'log']")
        for name in ("effrem_T_factor", "effrem_points", "every_n_val"):
            if getattr(self, name) < 1:
                raise ValueError(f"diagnostics.{name} must be >= 1; got {getattr(self, name)}")


@dataclass
class ExperimentConfig:
    name: str = ""
    """Experiment name (the experiment file's); part of the default run directory."""
    run_dir: str | None = None
    """Where checkpoints, TensorBoard logs and the resolved config go. Default runs/<name>/<model>-<intervention>,
    so that runs of other models or interventions never resume from each other's checkpoints."""
    resume: str = "auto"
    """'auto' continues the run in run_dir from its furthest-trained intact checkpoint (changed settings: see the
    README's resume rules), 'never' starts a new run and refuses a run_dir that holds one, 'archive' moves that run to
    run_dir/archive/<time>/ and starts a new one, or the path of a .ckpt to continue from."""
    seed: int = 0
    """Seeds the initialisation, the data order and the interventions' randomness."""
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    intervention: InterventionConfig = field(default_factory=InterventionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)

    @property
    def resolved_run_dir(self) -> str:
        if self.run_dir:
            return self.run_dir
        return f"{RUNS_DIR}/{self.name}/{self.model.name}-{self.intervention.name}"

    def __post_init__(self) -> None:
        check_resume(self.resume)
        if not self.run_dir:  # the name is part of the default run directory
            check_run_name(self.name)

    def validate(self) -> None:
        """Rules that span sections."""
        model_cls = registry.get(self.model.architecture).model_cls
        if self.data.layout == "packed" and not model_cls.supports_resets:
            raise ValueError(f"data.layout=packed needs a model that resets its state inside a row; "
                             f"{self.model.architecture} does not (use data.layout=documents)")
        # TBTT over documents also walks packed rows: each document read from zeros, carried across rows.
        allowed = (self.intervention.layout, "packed") if self.intervention.tbptt_over == "documents" else \
            (self.intervention.layout,)
        if self.intervention.name == "tbptt" and self.data.layout not in allowed:
            raise ValueError(f"intervention tbptt with tbptt_over={self.intervention.tbptt_over} needs "
                             f"data.layout={' or '.join(allowed)} (each lane must continue its "
                             f"{self.intervention.tbptt_over}); got data.layout={self.data.layout!r}")
        if self.intervention.name not in INTERVENTIONS:  # pragma: no cover - InterventionConfig already checks
            raise ValueError(f"unknown intervention {self.intervention.name!r}")
