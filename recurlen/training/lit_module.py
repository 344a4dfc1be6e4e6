"""The LightningModule: a recurrent LM (any architecture) trained from intervention-chosen initial states.

Each training step
  1. the intervention gives every lane (batch row) its initial state: zeros, noise, fitted noise, or the
     lane's carried final state of the previous step (state passing / TBTT);
  2. the model returns logits and the final states; the loss is the token-mean cross-entropy;
  3. the intervention observes the final states (state passing keeps them, detached, for the next step).
What the intervention remembers (carried states, fitted-noise statistics) is its own state: this module
only hands it to the checkpoint and back, together with every rank (see recurlen.training.interventions).
"""

from __future__ import annotations

import logging
import re
import time

import lightning as L
import torch
import torch.nn.functional as F

from recurlen.models import registry
from recurlen.models.head_loss import HEAD_LOSSES, chunked_token_loss, logits_exceed_one_chunk
from recurlen.models.interface import RecurrentLM
from recurlen.models.state import LayeredState
from recurlen.training.compile import CompiledForward
from recurlen.training.interventions import InterventionConfig, build_intervention, legacy_state
from recurlen.training.optim import OptimConfig, build_optimizer, lr_multiplier
from recurlen.training.run_dir import RUN_META_KEY
from recurlen.training.stateful import Ranks
from recurlen.util.errors import NonFinite, UserError

log = logging.getLogger(__name__)


def token_loss(logits_BLV: torch.Tensor, targets_BL: torch.Tensor, mask_BL: torch.Tensor | None) -> torch.Tensor:
    """Mean cross-entropy over the scored tokens (all, or those where the batch's loss_mask is True); a float
    loss_mask weighs each target, sum(w nll) / sum(w) (a task mix's task_share, recurlen.evaluation.tasks.mix)."""
    nll = F.cross_entropy(logits_BLV.float().reshape(-1, logits_BLV.shape[-1]), targets_BL.reshape(-1),
                          reduction="none")
    if mask_BL is None:
        return nll.mean()
    mask = mask_BL.reshape(-1).to(nll.dtype)
    return (nll * mask).sum() / mask.sum().clamp_min(1.0)


def check_head_loss(model: RecurrentLM, mode: str) -> None:
    if mode not in HEAD_LOSSES:
        raise UserError(f"trainer.head_loss={mode!r} is unknown; allowed: {list(HEAD_LOSSES)}")
    if mode == "chunked" and not hasattr(model, "head_rows"):
        raise UserError(f"trainer.head_loss=chunked needs recurlen's LM shell (its lm_head); {type(model).__name__} "
                        "has none: use trainer.head_loss=plain")


def head_token_loss(model: RecurrentLM, hidden_BLD: torch.Tensor, targets_BL: torch.Tensor,
                    mask_BL: torch.Tensor | None, *, mode: str = "auto") -> torch.Tensor:
    """token_loss of the model's logits. 'chunked' computes it without the whole logits (recurlen.models.head_loss:
    the same loss and gradients up to float rounding); 'auto' does so where the micro-batch's float32 logits exceed one
    chunk (64 MiB: 8 x 2048 tokens of a 50k vocabulary are 3.1 GiB; the demo's 64 x 32 x 257 are 2 MiB and keep the
    plain path, so its numbers do not move)."""
    if chunks_head_loss(model, targets_BL.numel(), mode):
        return chunked_token_loss(model, hidden_BLD, targets_BL, mask_BL)
    return token_loss(model.logits_from_hidden(hidden_BLD), targets_BL, mask_BL)


def chunks_head_loss(model: RecurrentLM, positions: int, mode: str) -> bool:
    rows = getattr(model, "head_rows", None)
    return mode == "chunked" or (mode == "auto" and rows is not None and logits_exceed_one_chunk(positions, rows))


class RecurlenModule(L.LightningModule):
    def __init__(self, model: RecurrentLM, *, intervention: InterventionConfig, optim: OptimConfig, seed: int,
                 train_seq_len: int, tokenizer: str, total_steps: int, hparams: dict | None = None,
                 head_loss: str = "auto", compile: bool = False) -> None:
        super().__init__()
        self.model = model
        check_head_loss(model, head_loss)
        self.head_loss = head_loss
        self.compiled = CompiledForward(self._forward_loss, what=type(model).__name__) if compile else None
        self.intervention = build_intervention(intervention, seed=seed, zero_state=model.zero_state(1, device="cpu"))
        self.intervention.bind(model)  # before a strategy wraps or shards it
        self.optim_cfg = optim
        self.seed = seed
        self.train_seq_len = train_seq_len
        self.tokenizer_spec = tokenizer
        self.total_steps = total_steps
        if hparams is not None:
            self.save_hyperparameters(hparams)  # the resolved experiment config, kept in every checkpoint
        self._t_last: float | None = None
        self.last_grad_norm: torch.Tensor | None = None

    def ranks(self) -> Ranks:
        """This process's place among the run's ranks, and the collectives an intervention may need."""
        if self._trainer is None or self.trainer.world_size == 1:
            return Ranks()
        return Ranks(rank=self.global_rank, world_size=self.trainer.world_size, all_gather=self.all_gather,
                     all_reduce_sum=lambda t: self.trainer.strategy.reduce(t, reduce_op="sum"))

    def setup(self, stage: str) -> None:
        # Lightning calls this once the ranks exist and before it restores a checkpoint: the intervention's
        # state_dict / load_state_dict reach the other ranks through these.
        self.intervention.connect(self.ranks())

    def on_fit_start(self) -> None:
        self.intervention.setup(self.model, lambda step: self.trainer.datamodule.train_batch(step),
                                seq_len=self.train_seq_len)

    # ------------------------------------------------------------------ training
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        input_ids, targets, lanes_B = batch["input_ids"], batch["targets"], batch["lane"]
        init = self.intervention.initial_state(zeros=self.model.zero_state(lanes_B.shape[0], device=self.device),
                                               lanes_B=lanes_B, new_stream_B=batch["new_stream"],
                                               step=int(batch["step"]), rank=self.global_rank,
                                               segment_B=batch.get("segment"))
        run = self._forward_loss if self.compiled is None else self.compiled
        resets = batch.get("resets")  # data.layout=packed: where a document starts inside the row
        if resets is not None:
            # Column 0 is the intervention's (new_stream): it chose the row's initial state; the model resets after.
            resets = resets.clone()
            resets[:, 0] = False
        loss, final = run(input_ids, init, targets, batch.get("loss_mask"), *(() if resets is None else (resets,)))
        self._check_finite(loss, final)
        self.intervention.observe(final, lanes_B, step=int(batch["step"]))
        batch_size = input_ids.shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=batch_size)
        self.log("train/final_state_rms", final.norms()[f"{final.RECURRENT[0]}_rms_K"].mean(), batch_size=batch_size)
        for name, value in self.intervention.scalars().items():
            self.log(f"train/{name}", value, batch_size=batch_size)
        return loss

    def _forward_loss(self, input_ids: torch.Tensor, init: LayeredState, targets: torch.Tensor,
                      mask: torch.Tensor | None,
                      resets: torch.Tensor | None = None) -> tuple[torch.Tensor, LayeredState]:
        # A model is given resets only with packed rows (an architecture without them keeps its signature).
        hidden, final = self.model.forward_hidden(input_ids, init, **({} if resets is None else {"resets": resets}))
        return head_token_loss(self.model, hidden, targets, mask, mode=self.head_loss), final

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

    def _check_finite(self, loss: torch.Tensor, final: LayeredState) -> None:
        """Stop where a NaN or infinity first shows: the carried state (naming the layer) or the loss.

        One host sync for both. The state comes first: a non-finite state makes the loss non-finite too, and
        the layer it names says more. Under DDP the flags are summed over the ranks first, so that every rank
        stops at the same step: a rank stopping alone would leave the others waiting in the gradient all-reduce."""
        bad_layers = [~torch.isfinite(getattr(final, part).detach()).flatten(1).all(dim=1) for part in final.RECURRENT]
        local = torch.cat([(~torch.isfinite(loss.detach())).view(1), *bad_layers]).float()
        ranks = self.ranks()
        # The reduce works in place: it gets a copy, `local` stays this rank's own.
        flags = (ranks.all_reduce_sum(local.clone()) if ranks.world_size > 1 else local).cpu().tolist()
        if not any(flags):
            return
        where = "" if any(local.cpu().tolist()) else " on another rank"
        offset = 1
        for part, layers in zip(final.RECURRENT, bad_layers):
            hits = [k for k, bad in enumerate(flags[offset:offset + len(layers)]) if bad]
            if hits:
                raise NonFinite(f"non-finite carried state ({part} of layer {hits[0]}){where}", step=self.global_step,
                                elsewhere=bool(where))
            offset += len(layers)
        raise NonFinite(f"non-finite training loss ({loss.item() if not where else 'nan'}){where}",
                        step=self.global_step, elsewhere=bool(where))

    def on_before_optimizer_step(self, optimizer) -> None:
        # The rate this optimizer step uses: the scheduler steps after it, so reading it later shows step k+1's.
        self.log("train/lr", optimizer.param_groups[0]["lr"], batch_size=1)
        named = [(n, p.grad) for n, p in self.model.named_parameters() if p.grad is not None]
        norms = [g.detach().float().norm() for _, g in named]
        if norms:
            total = torch.stack(norms).norm()
            self.log("train/grad_norm", total, batch_size=1)
            self.last_grad_norm = total.detach()  # kept per step by divergence.StepHealth (read on the host lazily)
            # Before the update: a non-finite gradient would make every weight it touches non-finite. Under
            # 16-mixed the gradient scaler skips such steps itself.
            if not str(self.trainer.precision).startswith("16") and not torch.isfinite(total):
                finite = torch.stack([torch.isfinite(g).all() for _, g in named]).cpu().tolist()
                bad = next((n for (n, _), ok in zip(named, finite) if not ok), None)
                if bad is not None:  # else only the norm overflowed; clipping deals with large gradients
                    raise NonFinite(f"non-finite gradient of {bad}{_layer_of(bad)}", step=self.global_step)

    def on_train_start(self) -> None:
        self.apply_optim_config()

    def apply_optim_config(self) -> None:
        """Make the optimizer and the schedule follow this run's optim settings.

        On a resume Lightning restores the hyperparameters of the run that wrote the checkpoint (the rate, the
        schedule's base rate, betas, weight decay); recurlen.training.resume allows these to change, so the values asked
        for now are put back. The rate is what the schedule gives at the current step, computed as the schedule
        computes it: with unchanged settings it is bit for bit the rate the restored run would have used."""
        if not self.trainer.optimizers or not self.trainer.lr_scheduler_configs:
            return
        opt, sched, cfg = self.trainer.optimizers[0], self.trainer.lr_scheduler_configs[0].scheduler, self.optim_cfg
        decay = (cfg.weight_decay, 0.0)  # recurlen.training.optim.param_groups: decayed matrices, then the rest
        sched.base_lrs = [cfg.lr for _ in opt.param_groups]
        rate = cfg.lr * lr_multiplier(sched.last_epoch, cfg=cfg, total_steps=self.total_steps)
        for group, wd in zip(opt.param_groups, decay):
            group.update(lr=rate, initial_lr=cfg.lr, weight_decay=wd, betas=tuple(cfg.betas), eps=cfg.eps)

    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        # In-context loss from a zero state
        if chunks_head_loss(self.model, batch["targets"].numel(), self.head_loss):
            hidden, _ = self.model.forward_hidden(batch["input_ids"])
            loss = chunked_token_loss(self.model, hidden, batch["targets"], batch.get("loss_mask"))
        else:
            logits, _ = self.model(batch["input_ids"])
            loss = token_loss(logits, batch["targets"], batch.get("loss_mask"))
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def configure_optimizers(self):
        opt, sched = build_optimizer(self.model, self.optim_cfg, total_steps=self.total_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        # Lightning's FSDP precision plugin refuses norm clipping, so under FSDP the Trainer is given no clip value
        # (finetune.build_trainer) and the wrapped module clips: its clip_grad_norm_ takes the norm over all shards.
        wrapped = getattr(self.trainer.strategy, "model", None)
        if self.optim_cfg.grad_clip and gradient_clip_val is None and hasattr(wrapped, "clip_grad_norm_"):
            wrapped.clip_grad_norm_(self.optim_cfg.grad_clip)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Every rank runs this (the intervention gathers its lanes from all ranks); rank 0 writes the file.
        # Nothing is written yet: a non-finite weight stops here, so no checkpoint (a signal's included) holds one.
        params = list(self.model.named_parameters())
        finite = torch.stack([torch.isfinite(p.detach()).all() for _, p in params]).cpu().tolist()
        bad = next((n for (n, _), ok in zip(params, finite) if not ok), None)
        if bad is not None:
            raise NonFinite(f"non-finite weights in {bad}{_layer_of(bad)} (refused to write a checkpoint of them)",
                            step=self.global_step)
        checkpoint[RUN_META_KEY] = {
            "architecture": registry.of_model(self.model).name,
            "model_config": self.model.config.to_dict(),
            "tokenizer": self.tokenizer_spec,
            "train_seq_len": self.train_seq_len,
            "intervention": self.intervention.name,
            "intervention_state": self.intervention.state_dict(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        meta = checkpoint.get(RUN_META_KEY) or {}
        state = meta["intervention_state"] if "intervention_state" in meta else legacy_state(meta)
        self.intervention.load_state_dict(state)


def _layer_of(param_name: str) -> str:
    """' (layer k)' for a parameter of the k-th block, '' for the embedding, final norm and head."""
    match = re.search(r"(?:^|\.)layers\.(\d+)\.", param_name)
    return f" (layer {match.group(1)})" if match else ""

