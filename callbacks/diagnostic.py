"""What the diagnostic callbacks share: when to run, where model / data / T come from, how results
are summed across ranks (torchmetrics), and how they reach TensorBoard."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torchmetrics import Metric

from recurlen.diagnostics.model_access import require_state_api, select_sequences


class SumStates(Metric):
    """Named float64 tensors summed over updates and over ranks (dist_reduce_fx="sum").

    Every diagnostic reduces to sums plus counts (NLL per bin, state statistics, TV per t), so a
    rank evaluates its share of the sequences and `compute()` returns the totals of all ranks.
    """

    full_state_update = False
    is_differentiable = False

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._names = tuple(shapes)
        for name, shape in shapes.items():
            self.add_state(name, default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, **values: torch.Tensor) -> None:
        unknown = sorted(set(values) - set(self._names))
        if unknown:
            raise ValueError(f"SumStates.update: unknown names {unknown}; declared {list(self._names)}")
        for name, value in values.items():
            setattr(self, name, getattr(self, name) + torch.as_tensor(value).to(self.device, torch.float64))

    def compute(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self._names}


def synced_sums(pl_module: pl.LightningModule, local: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sum `local` over all ranks (every rank must call this, also one without sequences)."""
    metric = SumStates({k: tuple(v.shape) for k, v in local.items()}).to(pl_module.device)
    metric.update(**local)
    totals = metric.compute()
    return {k: v.detach().cpu() for k, v in totals.items()}


def resolve_model(pl_module: pl.LightningModule) -> torch.nn.Module:
    model = getattr(pl_module, "model", None)
    if model is None:
        raise ValueError(f"{type(pl_module).__name__} has no .model; recurlen's diagnostics evaluate "
                         "pl_module.model (a recurlen recurrent LM, see recurlen.models.interface)")
    require_state_api(model)
    return model


def full_parameters(trainer: pl.Trainer) -> contextlib.AbstractContextManager:
    """Under FSDP each rank holds a shard of every parameter; the diagnostics call pl_module.model outside
    the wrapped forward, so the full parameters are gathered for the duration (on every rank: a collective)
    and dropped afterwards. A no-op for every other strategy."""
    from lightning.pytorch.strategies import FSDPStrategy

    if isinstance(trainer.strategy, FSDPStrategy):
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(trainer.strategy.model, writeback=False)
    return contextlib.nullcontext()


def resolve_train_len(pl_module: pl.LightningModule, explicit: int | None) -> int:
    train_len = explicit if explicit is not None else getattr(pl_module, "train_seq_len", None)
    if not isinstance(train_len, int) or isinstance(train_len, bool) or train_len < 1:
        raise ValueError(f"training context unknown: pass train_len= to the callback or give "
                         f"{type(pl_module).__name__} an int .train_seq_len (got {train_len!r})")
    return train_len


def held_out_sequences(trainer: pl.Trainer, explicit: torch.Tensor | None, *, length: int | None, num: int | None,
                       what: str) -> torch.Tensor:
    """The same (num, length) held-out sequences on every rank (explicit, else the DataModule's).

    length=None takes them at their full length (the shortest one's, for a list of 1-D tensors).
    """
    if explicit is None:
        datamodule = getattr(trainer, "datamodule", None)
        getter = getattr(datamodule, "long_validation_sequences", None)
        if not callable(getter):
            raise ValueError(f"{what}: trainer.datamodule ({type(datamodule).__name__}) has no "
                             "long_validation_sequences(); use a recurlen DataModule or pass sequences=")
        # Ask for exactly what is needed where the DataModule takes it (recurlen's takes length= / num=);
        # otherwise take its default sequences and cut them below.
        accepted = inspect.signature(getter).parameters
        request = {k: v for k, v in (("length", length), ("num", num)) if v is not None and k in accepted}
        explicit = getter(**request)
    if length is None:
        length = explicit.shape[-1] if isinstance(explicit, torch.Tensor) else min(len(s) for s in explicit)
    return select_sequences(explicit, length=length, num=num, what=what)


def resolve_chunk_len(chunk_len: int | None, train_len: int) -> int:
    """None: 4 x the training context (a few long calls; memory is O(batch x chunk_len x vocab))."""
    chunk_len = 4 * train_len if chunk_len is None else chunk_len
    if not isinstance(chunk_len, int) or chunk_len < 1:
        raise ValueError(f"chunk_len must be a positive integer or None; got {chunk_len!r}")
    return chunk_len


def rank_share(seqs_NL: torch.Tensor, trainer: pl.Trainer) -> torch.Tensor:
    """Round-robin share of this rank; ranks never evaluate the same sequence, one may get none."""
    return seqs_NL[trainer.global_rank::trainer.world_size]


def tensorboard_writers(trainer: pl.Trainer) -> list:
    if not trainer.is_global_zero:
        return []
    return [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


def logging_step(trainer: pl.Trainer) -> int:
    """The step Lightning gives the scalars logged now (what its own LearningRateMonitor and
    DeviceStatsMonitor use), so that figures line up with them; global_step can be one ahead."""
    return int(getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step))


def log_figures(trainer: pl.Trainer, figures: Mapping[str, Any]) -> None:
    step = logging_step(trainer)
    for writer in tensorboard_writers(trainer):
        for tag, fig in figures.items():
            # close=False: closing goes through pyplot, which these pyplot-free figures never touch.
            writer.add_figure(tag, fig, global_step=step, close=False)


def register_custom_scalars(trainer: pl.Trainer, category: str, charts: Mapping[str, list[str]]) -> None:
    """Add a category of multiline charts (tag regexes) to the run's custom-scalars layout.

    TensorBoard reads one layout per run (the latest), so each callback's charts are merged into
    the layout kept on the writer and the merged layout is written again.
    """
    for writer in tensorboard_writers(trainer):
        layout = getattr(writer, "_recurlen_custom_scalars", {})
        layout[category] = {title: ["Multiline", list(tags)] for title, tags in charts.items()}
        # The per-bin comparisons open the tab, whichever callback registered first.
        layout = dict(sorted(layout.items(), key=lambda item: "position bin" not in item[0]))
        writer._recurlen_custom_scalars = layout
        writer.add_custom_scalars(layout)


class DiagnosticCallback(pl.Callback):
    """Runs `evaluate` at the end of every n-th real validation epoch (never in the sanity check)."""

    def __init__(self, *, num_sequences: int | None = None, train_len: int | None = None,
                 chunk_len: int | None = None, batch_size: int = 4, sequences: torch.Tensor | None = None,
                 bf16: bool = False, every_n_val_epochs: int = 1, log_figures: bool = True,
                 prefix: str = "val") -> None:
        """The settings every diagnostic shares: which held-out sequences (sequences, or num_sequences of the
        datamodule's), the training context T (default pl_module.train_seq_len), tokens per model call
        (chunk_len, default 4 x T), rows per batch and bf16 autocast."""
        if not isinstance(every_n_val_epochs, int) or every_n_val_epochs < 1:
            raise ValueError(f"every_n_val_epochs must be a positive integer; got {every_n_val_epochs!r}")
        self.num_sequences = num_sequences
        self.train_len = train_len
        self.chunk_len = chunk_len
        self.batch_size = batch_size
        self.sequences = sequences
        self.bf16 = bf16
        self.every_n_val_epochs = every_n_val_epochs
        self.log_figures = log_figures
        self.prefix = prefix
        self.val_epochs = 0
        """Real (non-sanity) validation epochs seen; part of the callback state, so resume keeps the cadence."""
        self.num_runs = 0
        self.last_results: dict | None = None
        """The synced results of the latest run (a run entry in the results.json format)."""

    def layout(self) -> tuple[str, dict[str, list[str]]]:
        raise NotImplementedError

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise NotImplementedError

    def model_and_lengths(self, pl_module: pl.LightningModule) -> tuple[torch.nn.Module, int, int]:
        """The model to measure, the training context T and the chunk length, resolved for this run."""
        train_len = resolve_train_len(pl_module, self.train_len)
        return resolve_model(pl_module), train_len, resolve_chunk_len(self.chunk_len, train_len)

    def held_out(self, trainer: pl.Trainer, length: int | None, train_len: int, *,
                 what: str = "seq_len") -> torch.Tensor:
        """The held-out sequences (num, length); they must reach past the training context."""
        name = type(self).__name__
        seqs_NL = held_out_sequences(trainer, self.sequences, length=length, num=self.num_sequences, what=name)
        if seqs_NL.shape[1] <= train_len:
            raise ValueError(f"{name}: {what}={seqs_NL.shape[1]} must be larger than the training context "
                             f"train_len={train_len}")
        return seqs_NL

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        category, charts = self.layout()
        if charts:
            register_custom_scalars(trainer, category, charts)

    def hparam_metrics(self) -> list[str]:
        """Scalar tags of this diagnostic that are columns of the HParams table (after an evaluation)."""
        return []

    title = "diagnostic"
    """What the diagnostic measures, as its progress bar and the validation's announcement name it."""

    def show_progress(self, trainer: pl.Trainer, num_sequences: int | None = None) -> str | bool:
        """The label of a progress bar for the diagnostic's evaluation (on rank 0, when the run shows progress),
        else False: the bar says it is validation and what it measures, so a long pass is never unexplained."""
        if not (trainer.is_global_zero and trainer.progress_bar_callback is not None):
            return False
        count = f", {num_sequences} sequences" if num_sequences else ""
        return f"validation ({self.title}{count})"

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.val_epochs += 1
        if self.val_epochs % self.every_n_val_epochs:
            return
        with full_parameters(trainer):
            self.evaluate(trainer, pl_module)
        self.num_runs += 1

    def log_scalars(self, pl_module: pl.LightningModule, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            # The values are already identical on every rank; sync_dist only keeps Lightning from
            # warning about unsynced epoch-level logs (the mean of equal values is that value).
            pl_module.log(name, float(value), sync_dist=True, on_epoch=True, on_step=False)

    def state_dict(self) -> dict[str, Any]:
        return {"val_epochs": self.val_epochs, "num_runs": self.num_runs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.val_epochs = int(state_dict.get("val_epochs", 0))
        self.num_runs = int(state_dict.get("num_runs", 0))
