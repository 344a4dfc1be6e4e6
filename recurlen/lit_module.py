"""The LightningModule: a Mamba-2 LM trained from intervention-chosen initial states.

Each training step
  1. the intervention gives every lane (batch row) its initial state: zeros, noise, fitted noise, or the
     lane's carried final state of the previous step (state passing / TBTT);
  2. the model returns logits and the final states; the loss is the token-mean cross-entropy;
  3. the final states are detached and kept per lane, on this rank, for the next step.
Carried states and fitted-noise statistics are training state: they are gathered from all ranks into
the checkpoint and each rank takes its lanes back on resume. They are plain attributes, not buffers,
so DDP never broadcasts them (each rank owns different lanes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn

from recurlen import arch
from recurlen.interventions import Accumulator, FittedNoiseStats, Intervention, InterventionConfig
from recurlen.layered_state import LayeredState
from recurlen.optim import OptimConfig, build_optimizer
from recurlen.runs import RUN_META_KEY

log = logging.getLogger(__name__)


def token_loss(logits_BLV: torch.Tensor, targets_BL: torch.Tensor, mask_BL: torch.Tensor | None) -> torch.Tensor:
    """Mean cross-entropy over the scored tokens (all, or those where the batch's loss_mask is True)."""
    nll = F.cross_entropy(logits_BLV.float().reshape(-1, logits_BLV.shape[-1]), targets_BL.reshape(-1),
                          reduction="none")
    if mask_BL is None:
        return nll.mean()
    mask = mask_BL.reshape(-1).to(nll.dtype)
    return (nll * mask).sum() / mask.sum().clamp_min(1.0)


class RecurlenModule(L.LightningModule):
    def __init__(self, model: arch.RecurrentLM, *, intervention: InterventionConfig, optim: OptimConfig, seed: int,
                 train_seq_len: int, tokenizer: str, total_steps: int, hparams: dict | None = None) -> None:
        super().__init__()
        self.model = model
        self.intervention_cfg = intervention
        self.intervention = Intervention(intervention, seed=seed)
        self.optim_cfg = optim
        self.seed = seed
        self.train_seq_len = train_seq_len
        self.tokenizer_spec = tokenizer
        self.total_steps = total_steps
        if hparams is not None:
            self.save_hyperparameters(hparams)  # the resolved experiment config, kept in every checkpoint
        self.fitted: FittedNoiseStats | None = None
        self.carried: LayeredState | None = None
        self.carried_lanes: torch.Tensor | None = None
        self._t_last: float | None = None

    # ------------------------------------------------------------------ fitted noise
    def set_fitted_noise(self, stats: FittedNoiseStats) -> None:
        stats.check_state(self.model.zero_state(1, device="cpu"))
        self.fitted = stats

    @torch.no_grad()
    def fit_noise(self, batches: Iterable[dict], *, num_batches: int) -> FittedNoiseStats:
        """Per (layer, head) Gaussian of the final states of training sequences run from zeros (all ranks pooled)."""
        was_training = self.model.training
        self.model.eval()
        acc = Accumulator()
        sequences = 0
        for n, batch in enumerate(batches, start=1):
            _, final = self.model.forward_hidden(batch["input_ids"].to(self.device))
            acc.add(final)
            sequences += batch["input_ids"].shape[0]
            if n >= num_batches:
                break
        self.model.train(was_training)
        if acc.sum_KH is None:
            raise ValueError("fitting the noise got no training batches")
        if self._trainer is not None and self.trainer.world_size > 1:
            packed = torch.stack([acc.sum_KH, acc.sumsq_KH]).to(self.device)
            packed = self.trainer.strategy.reduce(packed, reduce_op="sum")
            count = self.trainer.strategy.reduce(torch.tensor(float(acc.count), device=self.device), reduce_op="sum")
            acc.sum_KH, acc.sumsq_KH, acc.count = packed[0], packed[1], int(count.item())
        world = self.trainer.world_size if self._trainer is not None else 1
        return acc.stats(num_states=sequences * world, seq_len=self.train_seq_len)

    def on_fit_start(self) -> None:
        if self.intervention_cfg.name != "fitted_noise" or self.fitted is not None:
            return
        if self.intervention_cfg.fit_stats:
            self.set_fitted_noise(FittedNoiseStats.load(self.intervention_cfg.fit_stats))
            return
        dm = self.trainer.datamodule
        stats = self.fit_noise((dm.train_batch(step) for step in range(self.intervention_cfg.fit_batches)),
                               num_batches=self.intervention_cfg.fit_batches)
        self.set_fitted_noise(stats)
        log.info("fitted noise on the final states of %d sequences: mean |mu| %.3g, mean sigma %.3g", stats.num_states,
                 stats.mean_KH.abs().mean().item(), stats.std_KH.mean().item())

    # ------------------------------------------------------------------ training
    def _initial_state(self, batch: dict) -> LayeredState:
        lanes_B = batch["lane"]
        zeros = self.model.zero_state(lanes_B.shape[0], device=self.device)
        carried = self.carried
        if carried is not None:
            if carried.device != self.device:  # restored from a checkpoint before the model moved
                carried = self.carried = carried.to(self.device)
            assert self.carried_lanes is not None and torch.equal(self.carried_lanes, lanes_B.cpu()), \
                "carried states belong to other lanes than this batch's"
        return self.intervention.initial_state(zeros=zeros, carried=carried, new_stream_B=batch["new_stream"],
                                               step=int(batch["step"]), rank=self.global_rank, fitted=self.fitted)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        input_ids, targets = batch["input_ids"], batch["targets"]
        init = self._initial_state(batch)
        hidden, final = self.model.forward_hidden(input_ids, init)
        loss = token_loss(self.model.logits_from_hidden(hidden), targets, batch.get("loss_mask"))
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite training loss ({loss.item()}) at global step {self.global_step} (micro-step "
                f"{int(batch['step'])}); stopping. The last checkpoint was written before this step and is intact; "
                "lower optim.lr or raise optim.warmup_steps and resume from it.")
        if self.intervention.passes_state:
            self.carried = final.detach()
            self.carried_lanes = batch["lane"].detach().cpu()
        batch_size = input_ids.shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=batch_size)
        self.log("train/final_state_rms", final.norms()[f"{final.RECURRENT[0]}_rms_K"].mean(), batch_size=batch_size)
        return loss

    def on_train_batch_start(self, batch, batch_idx) -> None:
        if self._t_last is None:
            self._t_last = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._t_last is not None and now > self._t_last:
            tokens = batch["input_ids"].numel() * self.trainer.world_size
            self.log("train/tokens_per_s", tokens / (now - self._t_last), batch_size=1)
        self._t_last = now
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=1)

    def on_before_optimizer_step(self, optimizer) -> None:
        norms = [p.grad.detach().float().norm() for p in self.model.parameters() if p.grad is not None]
        if norms:
            self.log("train/grad_norm", torch.stack(norms).norm(), batch_size=1)

    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits, _ = self.model(batch["input_ids"])  # in-context loss from a zero state
        loss = token_loss(logits, batch["targets"], batch.get("loss_mask"))
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def configure_optimizers(self):
        opt, sched = build_optimizer(self.model, self.optim_cfg, total_steps=self.total_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ------------------------------------------------------------------ checkpoints
    def _gather_carried(self) -> dict | None:
        if self.carried is None:
            return None
        parts, lanes = self.carried.parts(), self.carried_lanes.to(self.device)
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1:  # every rank calls this (checkpoint dumps run on all ranks); rank 0 writes the file
            parts = {n: self.all_gather(t.transpose(0, 1)).flatten(0, 1).transpose(0, 1) for n, t in parts.items()}
            lanes = self.all_gather(lanes).flatten(0, 1)
        # The state's parts by name (Mamba-2: ssm, conv; Mamba-1: ssm, conv; GLA: kv, conv), (layers, lanes, ...).
        return {**{n: t.cpu() for n, t in parts.items()}, "lanes": lanes.cpu(), "world_size": world}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[RUN_META_KEY] = {
            "architecture": arch.of_model(self.model).name,
            "model_config": self.model.config.to_dict(),
            "tokenizer": self.tokenizer_spec,
            "train_seq_len": self.train_seq_len,
            "intervention": self.intervention_cfg.name,
            "fitted_noise": None if self.fitted is None else self.fitted.state_dict(),
            "carried": self._gather_carried(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        meta = checkpoint.get(RUN_META_KEY) or {}
        if meta.get("fitted_noise") is not None:
            self.set_fitted_noise(FittedNoiseStats.from_state_dict(meta["fitted_noise"]))
        carried = meta.get("carried")
        self.carried, self.carried_lanes = None, None
        if carried is None:
            return
        world = self.trainer.world_size if self._trainer is not None else 1
        rank = self.trainer.global_rank if self._trainer is not None else 0
        if carried["world_size"] != world:
            rank_zero_warn(f"the checkpoint carried lane states for world size {carried['world_size']} but this run "
                           f"has {world}; lanes cannot be mapped, so every lane restarts from a zero state")
            return
        lanes_total = carried["lanes"].shape[0]
        per_rank = lanes_total // world
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        cls = type(self.model.zero_state(1, device="cpu"))
        self.carried = cls.from_state_dict({n: carried[n][:, rows] for n in cls.part_names()}).to(self.device)
        self.carried_lanes = carried["lanes"][rows].clone()
