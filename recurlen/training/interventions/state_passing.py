"""State passing and truncated backprop through time: a lane starts from its own final state of the last step."""

from __future__ import annotations

import torch

from recurlen.models.state import LayeredState
from recurlen.training.interventions.base import Intervention, step_generator
from recurlen.training.interventions.config import InterventionConfig
from recurlen.training.stateful import Ranks


class StatePassing(Intervention):
    """Each lane starts from its own final state of the previous step, detached (the gradient stops there).

    state_passing: the lane's previous batch is an unrelated sequence, so stream boundaries are ignored.
    tbptt: the lane's data continues its document (documents layout; the window form: its EOS-joined stream,
    contiguous layout), so this is truncated backprop through time; a lane whose document or long sequence
    starts anew starts from zeros.
    The carried states live on this rank (plain tensors, not buffers: DDP must not broadcast them, each
    rank owns other lanes); checkpoints gather every rank's lanes and each rank takes its own back.
    """

    passes_state = True

    def __init__(self, cfg: InterventionConfig, *, seed: int, zero_state: LayeredState,
                 ranks: Ranks | None = None) -> None:
        super().__init__(cfg, seed=seed, zero_state=zero_state, ranks=ranks)
        self.carried: LayeredState | None = None
        self.carried_lanes: torch.Tensor | None = None

    def restarts(self, *, step: int, new_stream_B: torch.Tensor, segment_B: torch.Tensor | None) -> torch.Tensor:
        """tbptt: (B,) the lanes whose segment at `step` starts a long sequence from zeros: a new stream (a new
        document, or the lane's first step) or, with tbptt_segments = k, a segment k, 2k, ... into its document
        (documents) or a step that is a multiple of k (stream: every lane at once)."""
        reset_B = new_stream_B.to(dtype=torch.bool).clone()
        k = self.cfg.tbptt_segments
        if step == 0:
            reset_B[:] = True
        if k is not None:
            if self.cfg.tbptt_over == "documents":
                if segment_B is None:
                    raise ValueError("tbptt with tbptt_over=documents needs batches with a `segment` (the "
                                     "documents layout, data.layout=documents)")
                reset_B |= segment_B.to(reset_B.device) % k == 0
            elif step % k == 0:
                reset_B[:] = True
        return reset_B

    def initial_state(self, *, zeros: LayeredState, lanes_B: torch.Tensor, new_stream_B: torch.Tensor, step: int,
                      rank: int, segment_B: torch.Tensor | None = None) -> LayeredState:
        device = zeros.device
        if self.carried is None:
            return zeros
        if self.carried.device != device:  # restored from a checkpoint before the model moved
            self.carried = self.carried.to(device)
        assert self.carried_lanes is not None and torch.equal(self.carried_lanes, lanes_B.cpu()), \
            "carried states belong to other lanes than this batch's"
        state = self.carried.detach()  # the gradient stops at the step boundary
        if not self.cfg.pass_conv:
            state = state.recurrent_only()
        # In TBTT a lane whose document (or long sequence) ends must not inherit the old state. State passing
        # ignores stream boundaries on purpose: its previous batch is an unrelated sequence anyway.
        if self.cfg.name == "tbptt":
            reset_B = self.restarts(step=step, new_stream_B=new_stream_B, segment_B=segment_B).to(device)
        else:
            reset_B = torch.zeros(zeros.batch_size, dtype=torch.bool, device=device)
        if self.cfg.reset_prob > 0:
            g = step_generator(self.seed, step, rank, stream=2, device=device)
            draw_B = torch.rand(zeros.batch_size, generator=g, device=device)
            reset_B = reset_B | (draw_B < self.cfg.reset_prob)
        return state.reset(reset_B)

    def observe(self, final: LayeredState, lanes_B: torch.Tensor, *, step: int) -> None:
        super().observe(final, lanes_B, step=step)
        self.carried = final.detach()
        self.carried_lanes = lanes_B.detach().cpu()

    def state_dict(self) -> dict:
        """Every rank's carried lanes, in rank order (every rank must call this: it gathers)."""
        if self.carried is None:
            return {"carried": None}
        ranks = self.ranks
        state, lanes = self.carried, self.carried_lanes.to(self.carried.device)
        if ranks.world_size > 1:
            # all_gather stacks a leading rank dim; lanes are dim 1 of every part of a state.
            state = type(state).from_state_dict({n: ranks.all_gather(t.transpose(0, 1).contiguous()).flatten(0, 1)
                                                 .transpose(0, 1) for n, t in state.parts().items()})
            lanes = ranks.all_gather(lanes).flatten(0, 1)
        # The state type's own state_dict: its parts by name (Mamba-2 / Mamba-1: ssm, conv; GLA: kv, conv).
        return {"carried": {"state": state.state_dict(), "lanes": lanes.cpu(), "world_size": ranks.world_size}}

    def load_state_dict(self, state: dict) -> None:
        carried = state.get("carried")
        self.carried, self.carried_lanes = None, None
        if carried is None:
            return
        ranks = self.ranks
        if carried["world_size"] != ranks.world_size:
            # Imported here: composing a config imports this package, and Lightning costs seconds to import.
            from lightning.pytorch.utilities import rank_zero_warn

            rank_zero_warn(f"the checkpoint carried lane states for world size {carried['world_size']} but this run "
                           f"has {ranks.world_size}; lanes cannot be mapped, so every lane restarts from a zero state")
            return
        per_rank = carried["lanes"].shape[0] // ranks.world_size
        rows = slice(ranks.rank * per_rank, (ranks.rank + 1) * per_rank)
        cls = type(self.zero_state)
        self.carried = cls.from_state_dict({n: t[:, rows] for n, t in carried["state"].items()})
        self.carried_lanes = carried["lanes"][rows].clone()
