"""Greedy decoding with the recurrent state: constant memory in the prompt length."""

from __future__ import annotations

import torch

from recurlen.model import Mamba2LM
from recurlen.state import RecurrentState


@torch.no_grad()
def prefill(model: Mamba2LM, prompt_ids_BL: torch.Tensor, *, state: RecurrentState | None = None,
            chunk_len: int = 4096) -> tuple[torch.Tensor, RecurrentState]:
    """Run a prompt of any length in chunks; returns the last position's logits and the state."""
    logits = None
    for start in range(0, prompt_ids_BL.shape[1], chunk_len):
        hidden, state = model.forward_hidden(prompt_ids_BL[:, start:start + chunk_len], state)
        logits = model.logits_from_hidden(hidden[:, -1])
    return logits, state


@torch.no_grad()
def greedy_generate(model: Mamba2LM, prompt_ids_BL: torch.Tensor, *, max_new_tokens: int,
                    state: RecurrentState | None = None, chunk_len: int = 4096,
                    stop_ids: set[int] | None = None) -> torch.Tensor:
    """Greedy continuation (batch, max_new_tokens); rows that hit a stop id keep emitting it."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1; got {max_new_tokens}")
    logits_BV, state = prefill(model, prompt_ids_BL, state=state, chunk_len=chunk_len)
    out = []
    done_B = torch.zeros(prompt_ids_BL.shape[0], dtype=torch.bool, device=prompt_ids_BL.device)
    for _ in range(max_new_tokens):
        next_B = logits_BV.argmax(dim=-1)
        if out and stop_ids:
            next_B = torch.where(done_B, out[-1], next_B)
        out.append(next_B)
        if stop_ids:
            done_B |= torch.isin(next_B, torch.tensor(sorted(stop_ids), device=next_B.device))
            if bool(done_B.all()):
                break
        logits_BV, state = model.step(next_B, state)
    return torch.stack(out, dim=1)
