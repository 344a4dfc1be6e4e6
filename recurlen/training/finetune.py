"""`recurlen finetune`: build the model, data, module and Trainer from an experiment config and fit.

What the run directory holds, and how a run resumes, is `recurlen.training.run_dir`'s business.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info

from recurlen.models import registry
from recurlen.models.interface import RecurrentLM
from recurlen.training import memory
from recurlen.training.csv_logger import ContinueMetricsFile
from recurlen.training.data.datamodule import RecurlenDataModule
from recurlen.training.devices import check_devices, check_strategy, launch_rank
from recurlen.training.divergence import SkipBatches, StepHealth, model_default_lr, plan_recovery, with_lr
from recurlen.training.experiments.compose import resolved_config
from recurlen.training.experiments.schema import ExperimentConfig
from recurlen.training.fault_injection import InjectNonFinite
from recurlen.training.interventions import FittedNoise, build_intervention, fit_noise_stats
from recurlen.training.lit_module import RecurlenModule
from recurlen.training.loggers import build_loggers, check_installed
from recurlen.training.lost_rank import RankWatch
from recurlen.training.pace import Pace
from recurlen.training.preemption import Preemption
from recurlen.training.progress_bar import StepProgressBar
from recurlen.training.resume import decide, record
from recurlen.training.run_dir import LAST_CHECKPOINT, STEP_CHECKPOINT, RunDir, load_model
from recurlen.util.atomic_files import check_file_size_limit, save_torch, write_json
from recurlen.util.errors import Interrupted, NonFinite, user_input
from recurlen.util.writer_lock import WriterLock

log = logging.getLogger(__name__)


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in str(record.getMessage())


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropAdverts())


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint to a temporary sibling and rename it: a crash never leaves a torn file."""

    def __init__(self) -> None:
        super().__init__()
        self._preloaded: tuple[str, dict] | None = None

    def preload(self, path: str, checkpoint: dict) -> None:
        """The resume decision already read and checked this checkpoint: hand it over instead of reading it again."""
        self._preloaded = (str(Path(path)), checkpoint)

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        save_torch(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        if self._preloaded is not None and self._preloaded[0] == str(Path(path)):
            checkpoint, self._preloaded = self._preloaded[1], None
            return checkpoint
        # Never unpickle code, whatever torch's default or the caller asks: a checkpoint handed over is data.
        return torch.load(path, map_location=map_location or "cpu", weights_only=True)


class RunCheckpoint(ModelCheckpoint):
    """step=N.ckpt every N steps plus last.ckpt, which is also written when training ends off the interval.

    The version counter is off: last.ckpt is always the same file (replaced atomically), never last-v1.ckpt.
    """

    def __init__(self, dirpath: Path, every_n_train_steps: int) -> None:
        super().__init__(dirpath=dirpath, filename=STEP_CHECKPOINT, auto_insert_metric_name=False,
                         every_n_train_steps=every_n_train_steps, save_top_k=-1, save_last=True,
                         enable_version_counter=False)
        self.CHECKPOINT_NAME_LAST = LAST_CHECKPOINT.removesuffix(self.FILE_EXTENSION)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        every = self._every_n_train_steps
        if every >= 1 and trainer.global_step % every == 0 and not self._should_skip_saving_checkpoint(trainer):
            # Lightning hands a step's metrics to the loggers only after this hook, so a process killed while the
            # checkpoint below is written would leave a checkpoint of this step whose scalars were never logged,
            # and the resume, starting after it, never logs them either. They are logged first (Lightning logs
            # them again after the hook: the same values at the same step, once per checkpoint).
            trainer._logger_connector.update_train_step_metrics()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        # Recent Lightning saves last on train end itself; older versions do not. Never save twice.
        if getattr(self, "_last_global_step_saved", None) != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class KeepLock(Callback):
    """Stops the run at the next step once another process has taken its writer lock over (it found this one's
    heartbeat stale: a suspended process, a hung file system), before either writes into the other's files."""

    def __init__(self, lock: WriterLock) -> None:
        self.lock = lock

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.lock.check()


class RankSummary(Callback):
    """Each rank records the lanes it trained on: proof that ranks never share a lane."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.lanes: set[int] = set()
        self.steps = 0
        self.last_loss: float | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.lanes.update(int(x) for x in batch["lane"].tolist())
        self.steps += 1
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.last_loss = float(loss.detach()) if loss is not None else None

    def on_train_end(self, trainer, pl_module) -> None:
        summary = {"global_rank": trainer.global_rank, "world_size": trainer.world_size,
                   "node_rank": trainer.node_rank, "lanes": sorted(self.lanes), "micro_steps": self.steps,
                   "global_step": trainer.global_step, "last_loss": self.last_loss}
        write_json(self.run.rank_summary(trainer.global_rank), summary)


def build_model(cfg: ExperimentConfig) -> RecurrentLM:
    if cfg.model.pretrained:
        loaded = load_model(cfg.model.pretrained, backend=cfg.model.backend)
        rank_zero_info(f"loaded {loaded.source} ({loaded.model.num_parameters() / 1e6:.1f}M parameters)")
        return loaded.model
    # Said, as the plan says it: `finetune model=tiny` is easily taken for a post-training of a pre-trained model.
    rank_zero_info(f"model {cfg.model.name}: random initialisation, trained from scratch (model.pretrained unset)")
    torch.manual_seed(cfg.seed)  # the same initialisation on every rank
    return registry.get(cfg.model.architecture).build(cfg.model.config, backend=cfg.model.backend)


def _precision(name: str) -> str:
    if name != "auto":
        return name
    return "bf16-mixed" if torch.cuda.is_available() else "32-true"


def _devices(value: str):
    value = str(value)
    if value == "auto":
        return "auto"
    if value.isdigit() or value == "-1":
        return int(value)
    return [int(x) for x in value.split(",") if x.strip()]


def build_trainer(cfg: ExperimentConfig, run: RunDir, extra_callbacks: list[Callback], *,
                  validates: bool = True) -> L.Trainer:
    """validates=False: the run has nothing to validate on (no held-out segments, no diagnostics), and Lightning
    runs no validation loop at all (an empty one would still be announced and drawn as a bar of 0 batches)."""
    t = cfg.trainer
    accum = t.accumulate_grad_batches
    every_val = t.val_every_n_steps if t.val_every_n_steps > 0 else t.max_steps
    every_ckpt = t.checkpoint_every_n_steps if t.checkpoint_every_n_steps > 0 else t.max_steps
    slurm = SLURMEnvironment.detect()
    callbacks = [RunCheckpoint(run.checkpoints, every_ckpt), RankSummary(run), ContinueMetricsFile(),
                 Preemption(keep_slurm_requeue=slurm and t.slurm_auto_requeue),
                 Pace(val_every_n_steps=t.val_every_n_steps, validates=validates), *extra_callbacks]
    fault = InjectNonFinite.from_env()  # only when a fault test asks for a non-finite value (recurlen.util.faults)
    if fault is not None:
        callbacks.append(fault)
    if t.progress_bar:
        callbacks.append(StepProgressBar())
    plugins: list = [AtomicCheckpointIO()]
    if slurm:
        plugins.append(SLURMEnvironment(auto_requeue=t.slurm_auto_requeue))
    return L.Trainer(
        max_steps=t.max_steps, accelerator=t.accelerator, devices=_devices(t.devices), num_nodes=t.num_nodes,
        strategy=t.strategy, precision=_precision(t.precision), accumulate_grad_batches=accum,
        gradient_clip_val=None if _is_fsdp(t.strategy) else cfg.optim.grad_clip or None,
        val_check_interval=min(every_val, t.max_steps) * accum,
        check_val_every_n_epoch=None, limit_val_batches=t.limit_val_batches if validates else 0,
        num_sanity_val_steps=0,
        log_every_n_steps=t.log_every_n_steps, enable_progress_bar=t.progress_bar, deterministic=t.deterministic,
        logger=build_loggers(t.loggers, run, experiment=cfg.name),
        callbacks=callbacks, plugins=plugins, use_distributed_sampler=False, default_root_dir=str(run.path),
    )


def _is_fsdp(strategy: str) -> bool:
    """FSDP clips its gradients itself (RecurlenModule.configure_gradient_clipping)."""
    return str(strategy).startswith("fsdp")


def diagnostics_callbacks(cfg: ExperimentConfig, datamodule: L.LightningDataModule) -> list[Callback]:
    """The validation diagnostics that cfg.diagnostics asks for, on the DataModule's long held-out sequences.

    None when the DataModule has no long held-out documents (or the config keeps none): then what the run
    learned past its context is measured by whoever owns that data (a task's own evaluation)."""
    from recurlen.callbacks import EffectiveRemembrance, HParamsTable, PositionwisePerplexity, StateNormMonitor

    if not callable(getattr(datamodule, "long_validation_sequences", None)) or cfg.data.val_sequences == 0:
        return []
    d, T = cfg.diagnostics, cfg.data.seq_len
    common = dict(num_sequences=d.num_sequences, chunk_len=d.chunk_len, every_n_val_epochs=d.every_n_val)
    out: list[Callback] = []
    if d.positionwise:
        out.append(PositionwisePerplexity(bins=d.bins, **common))
    if d.state_norm:
        out.append(StateNormMonitor(layers=d.state_layers, **common))
    if d.effrem:
        out.append(EffectiveRemembrance(context_len=d.effrem_T_factor * T, num_points=d.effrem_points, **common))
    return out + [HParamsTable(hparams_row(cfg), out)] if out else out


def hparams_row(cfg: ExperimentConfig) -> dict[str, object]:
    """What tells runs apart in TensorBoard's HParams table: the run (TensorBoard's own run column cuts a long
    path), the intervention, T, the data with the held-out sequences the metric columns are measured on (the
    training-time validation: `recurlen eval` / the demo's report measure their own), and the rest of the setup
    in one column. TensorBoard shows up to five settings columns of 10em each before the metrics; with one column
    per setting the full - reset columns started past 1600 px, with five they are in view."""
    from pathlib import PurePath

    iv = cfg.intervention
    reset = iv.reset_prob if iv.name in ("state_passing", "tbptt") else 0.0
    run = PurePath(cfg.resolved_run_dir)
    where = run.parent.relative_to("runs") if run.parts[:1] == ("runs",) else PurePath(run.parent.name)
    d = cfg.data
    held_out = min(d.val_sequences, cfg.diagnostics.num_sequences or d.val_sequences)
    source = d.source if d.source == "embedded" or d.source.startswith("hf:") else PurePath(d.source).name
    setup = (f"{cfg.trainer.max_steps} steps, lr {cfg.optim.lr:g}, {cfg.model.name}"
             + (f", reset_prob {reset:g}" if reset else "") + f", {cfg.name}")
    # What tells rows apart first, as TensorBoard cuts a cell after ~17 characters: the run directory's own name,
    # then where it lies ('state_passing (demo/post)'); the validation's sequences, then the corpus.
    return {"run": f"{run.name} ({where.as_posix()})" if where.parts else run.name, "intervention": iv.name,
            "T": d.seq_len, "data": f"val {held_out}x{d.long_val_length} {d.val_mode}, {source}", "setup": setup}


def run_finetune(cfg: ExperimentConfig, *, datamodule: L.LightningDataModule | None = None,
                 callbacks: Sequence[Callback] = ()) -> Path:
    """Train cfg's model with its intervention in cfg's run directory (resuming it when it holds a checkpoint).

    datamodule: the training data; by default the corpus DataModule of cfg.data. Any DataModule with the
    same batch contract works (a task passes its own). callbacks: added to the run's own (checkpoints, rank
    summaries, and the diagnostics of cfg.diagnostics when the DataModule has long held-out sequences).
    Returns the run directory.
    """
    run = RunDir(cfg.resolved_run_dir)
    resolved = resolved_config(cfg)
    check_devices(cfg.trainer)
    check_strategy(cfg.trainer)
    check_installed(cfg.trainer.loggers)
    rank = launch_rank()
    # Before anything is built or written: a second process on this run directory is refused at once.
    with run.writer_lock(enabled=rank == 0) as lock:
        return _finetune(cfg, run, resolved, rank=rank, lock=lock, datamodule=datamodule, callbacks=callbacks)


def _finetune(cfg: ExperimentConfig, run: RunDir, resolved: dict, *, rank: int, lock: WriterLock | None,
              datamodule: L.LightningDataModule | None, callbacks: Sequence[Callback]) -> Path:
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    corpus = datamodule is None  # the run's own held-out data (a task's DataModule validates on its own)
    if datamodule is None:
        datamodule = RecurlenDataModule(cfg.data)
        if rank == 0:  # a source that cannot be read is said now, not inside the Trainer after config.yaml
            with user_input():
                datamodule.prepare_data()
                datamodule.setup("fit")
    model = build_model(cfg)
    datamodule.check_model_vocab(model.config.vocab_size)
    if cfg.intervention.name == "fitted_noise":  # a grouping the model cannot have or a bad file: say so now
        noise = build_intervention(cfg.intervention, seed=cfg.seed, zero_state=model.zero_state(1, device="cpu"))
        noise.groups(model)
        if cfg.intervention.fit_stats:
            noise.load_stats_file()
    # Before anything is written: a run that cannot fit says so now, not as exit 137 or a CUDA OOM mid-run.
    est = memory.for_experiment(cfg, model)
    rank_zero_info(f"memory: {est.describe()}")
    memory.check_fits(est, already_resident=est.weights if est.device == "cpu" else 0, lanes=cfg.data.batch_size,
                      seq_len=cfg.data.seq_len)
    if rank == 0:  # weights and AdamW's two moments
        check_file_size_limit(3 * sum(p.numel() * p.element_size() for p in model.parameters()),
                              f"a checkpoint of {cfg.model.name}")
    # Nothing in the run directory changes before this decision (resume.py): which checkpoint, which settings.
    decision = decide(run, cfg.resume, resolved, model, max_steps=cfg.trainer.max_steps, rank=rank)
    if decision.finished:
        return run.path
    if rank == 0:
        record(run, resolved, decision)
    guard = [KeepLock(lock)] if lock is not None else []
    extra: list[Callback] = []
    rollbacks = 0
    while True:
        module = RecurlenModule(model, intervention=cfg.intervention, optim=cfg.optim, seed=cfg.seed,
                                train_seq_len=cfg.data.seq_len, tokenizer=cfg.data.tokenizer,
                                total_steps=cfg.trainer.max_steps, hparams=resolved,
                                head_loss=cfg.trainer.head_loss, compile=cfg.trainer.compile)
        health, watch = StepHealth(), RankWatch(run.path)
        diagnostics = diagnostics_callbacks(cfg, datamodule)
        trainer = build_trainer(cfg, run, [*guard, health, watch, *extra, *diagnostics, *callbacks],
                                validates=bool(diagnostics or callbacks) or not corpus or cfg.data.val_segments > 0)
        ckpt_path = decision.checkpoint
        if ckpt_path:
            rank_zero_info(f"resuming from {ckpt_path} (step {decision.step})")
            io = trainer.strategy.checkpoint_io
            if isinstance(io, AtomicCheckpointIO) and decision.loaded is not None:
                io.preload(ckpt_path, decision.loaded)
            decision.loaded = None
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
            break
        except RuntimeError:
            if watch.lost is None:  # not a collective that failed for a lost rank: a bug, with its traceback
                raise
            raise watch.lost from None
        except NonFinite as err:
            # Where the divergence began and the newest checkpoint from before it (later ones are diverged too).
            recovery = plan_recovery(run, health.history(), failed_step=err.step, lr=cfg.optim.lr,
                                     default_lr=model_default_lr(cfg))
            advised = err.with_advice(recovery.describe(), recovery.overrides())
            if cfg.trainer.on_nonfinite != "rollback" or rollbacks >= cfg.trainer.max_rollbacks:
                raise advised from None
            if trainer.world_size > 1:  # every rank would have to agree on the files first: not done automatically
                raise advised.with_advice(f"{recovery.describe()} (on_nonfinite=rollback runs in one process only)",
                                          recovery.overrides()) from None
            rollbacks += 1
            log.warning("%s at global step %d: rollback %d of %d: %s", err.what, err.step, rollbacks,
                        cfg.trainer.max_rollbacks, recovery.describe())
            cfg, resolved = with_lr(cfg, recovery.lr)
            L.seed_everything(cfg.seed, workers=True, verbose=False)
            model = build_model(cfg)  # the starting weights again; a rollback's checkpoint replaces them
            decision = decide(run, recovery.checkpoint or "archive", resolved, model,
                              max_steps=cfg.trainer.max_steps, rank=rank)
            if rank == 0:
                record(run, resolved, decision, note=recovery.history_entry())
            # A rollback skips the batches that led into the divergence (the data goes on after the step that
            # failed); starting over reads the data from its start again.
            extra = [SkipBatches(err.step + 1 if recovery.checkpoint else 0)]
    fitted = module.intervention
    if isinstance(fitted, FittedNoise) and fitted.stats is not None and trainer.is_global_zero:
        fitted.stats.save(str(run.fitted_noise))
    _close_process_group(trainer)
    preemption = next(c for c in trainer.callbacks if isinstance(c, Preemption))
    if preemption.stopped_on is not None:  # stopped on a signal after writing last.ckpt: resumable, not a success
        last = run.last_checkpoint
        stopped = Interrupted(preemption.stopped_on, step=preemption.stopped_at_step,
                              checkpoint=str(last) if last.is_file() else None)
        stopped.elsewhere = not trainer.is_global_zero  # every rank stops; rank 0 alone says so
        raise stopped
    return run.path


def _close_process_group(trainer: L.Trainer) -> None:
    """Leave the process group together: a rank that exits while a peer's gloo/NCCL link is open can abort."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        trainer.strategy.barrier("recurlen-finish")
        dist.destroy_process_group()


def run_fit_noise(cfg: ExperimentConfig, out: str | Path | None = None):
    """Fit the fitted-noise statistics on `intervention.fit_batches` training batches and save them
    (default <run_dir>/fitted_noise.pt). Returns (path, statistics)."""
    dm = RecurlenDataModule(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    model = build_model(cfg)
    dm.check_model_vocab(model.config.vocab_size)
    n = cfg.intervention.fit_batches
    groups = FittedNoise(cfg.intervention, seed=cfg.seed, zero_state=model.zero_state(1, device="cpu")).groups(model)
    stats = fit_noise_stats(model, (dm.train_batch(s) for s in range(n)), num_batches=n, seq_len=cfg.data.seq_len,
                            groups=groups)
    run = RunDir(cfg.resolved_run_dir)
    with contextlib.nullcontext() if out else run.writer_lock():
        path = Path(out) if out else run.fitted_noise
        stats.save(str(path))
    return path, stats
