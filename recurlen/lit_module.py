"""The LightningModule: a recurrent LM (any architecture) trained from intervention-chosen initial states.

Each training step
  1. the intervention gives every lane (batch row) its initial state: zeros, noise, fitted noise, or the
     lane's carried final state of the previous step (state passing / TBTT);
  2. the model returns logits and the final states; the loss is the token-mean cross-entropy;
  3. the intervention observes the final states (state passing keeps them, detached, for the next step).
What the intervention remembers (carried states, fitted-noise statistics) is its own state: this module
only hands it to the checkpoint and back, together with every rank (see recurlen.interventions).
"""

from __future__ import annotations

import logging
import time

import lightning as L
import torch
import torch.nn.functional as F

from recurlen import arch
from recurlen.interventions import InterventionConfig, Ranks, build_intervention, legacy_state
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
        self.intervention = build_intervention(intervention, seed=seed, zero_state=model.zero_state(1, device="cpu"))
        self.optim_cfg = optim
        self.seed = seed
        self.train_seq_len = train_seq_len
        self.tokenizer_spec = tokenizer
        self.total_steps = total_steps
        if hparams is not None:
            self.save_hyperparameters(hparams)  # the resolved experiment config, kept in every checkpoint
        self._t_last: float | None = None

    def ranks(self) -> Ranks:
        """This process's place among the run's ranks, and the collectives an intervention may need."""
        if self._trainer is None or self.trainer.world_size == 1:
            return Ranks()
        return Ranks(rank=self.global_rank, world_size=self.trainer.world_size, all_gather=self.all_gather,
                     all_reduce_sum=lambda t: self.trainer.strategy.reduce(t, reduce_op="sum"))

    def on_fit_start(self) -> None:
        self.intervention.setup(self.model, lambda step: self.trainer.datamodule.train_batch(step), ranks=self.ranks(),
                                seq_len=self.train_seq_len)

    # ------------------------------------------------------------------ training
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        input_ids, targets, lanes_B = batch["input_ids"], batch["targets"], batch["lane"]
        init = self.intervention.initial_state(zeros=self.model.zero_state(lanes_B.shape[0], device=self.device),
                                               lanes_B=lanes_B, new_stream_B=batch["new_stream"],
                                               step=int(batch["step"]), rank=self.global_rank)
        hidden, final = self.model.forward_hidden(input_ids, init)
        loss = token_loss(self.model.logits_from_hidden(hidden), targets, batch.get("loss_mask"))
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite training loss ({loss.item()}) at global step {self.global_step} (micro-step "
                f"{int(batch['step'])}); stopping. The last checkpoint was written before this step and is intact; "
                "lower optim.lr or raise optim.warmup_steps and resume from it.")
        self.intervention.observe(final, lanes_B)
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
            self.log("train/tokens_per_s", tokens / (now - self._t_last), batch_size=1, prog_bar=True)
        self._t_last = now
        if self.device.type == "cuda":  # what a run at this shape needs per GPU (sizing jobs, checking leaks)
            self.log("train/peak_gpu_memory_gib", torch.cuda.max_memory_allocated(self.device) / 2**30, batch_size=1)

    def on_before_optimizer_step(self, optimizer) -> None:
        # The rate this optimizer step uses: the scheduler steps after it, so reading it later shows step k+1's.
        self.log("train/lr", optimizer.param_groups[0]["lr"], batch_size=1)
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
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Every rank runs this (the intervention gathers its lanes from all ranks); rank 0 writes the file.
        checkpoint[RUN_META_KEY] = {
            "architecture": arch.of_model(self.model).name,
            "model_config": self.model.config.to_dict(),
            "tokenizer": self.tokenizer_spec,
            "train_seq_len": self.train_seq_len,
            "intervention": self.intervention.name,
            "intervention_state": self.intervention.state_dict(self.ranks()),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        meta = checkpoint.get(RUN_META_KEY) or {}
        state = meta["intervention_state"] if "intervention_state" in meta else legacy_state(meta)
        self.intervention.load_state_dict(state, self.ranks())
