"""Greedy decoding with the recurrent state: constant memory in the prompt length."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recurlen.models import registry
from recurlen.models.interface import RecurrentLM
from recurlen.models.state import LayeredState


@torch.no_grad()
def prefill(model: RecurrentLM, prompt_ids_BL: torch.Tensor, *, state: LayeredState | None = None,
            chunk_len: int = 4096) -> tuple[torch.Tensor, LayeredState]:
    """Run a prompt of any length in chunks; returns the last position's logits and the state."""
    logits = None
    for start in range(0, prompt_ids_BL.shape[1], chunk_len):
        hidden, state = model.forward_hidden(prompt_ids_BL[:, start:start + chunk_len], state)
        logits = model.logits_from_hidden(hidden[:, -1])
    return logits, state


@torch.no_grad()
def greedy_generate(model: RecurrentLM, prompt_ids_BL: torch.Tensor, *, max_new_tokens: int,
                    state: LayeredState | None = None, chunk_len: int = 4096,
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


@dataclass
class GenerateConfig:
    model: str = "tiny"
    """A model of the model table (recurlen.models.table), by its name or its size, randomly initialised (a smoke
    check); ignored with --checkpoint."""
    architecture: str = registry.DEFAULT
    """The model's architecture: a name of recurlen.models.registry (mamba2, mamba1, ...)."""
    tokenizer: str | None = None
    """Tokenizer spec; None: the checkpoint's, else bytes."""
    prompt: str = "def main("
    """The text to continue."""
    max_new_tokens: int = 64
    """Tokens generated greedily."""

    def __post_init__(self) -> None:
        from recurlen.models import table

        a = registry.get(self.architecture)
        if table.find(self.model, architecture=a.name) is None:
            raise ValueError(f"model={self.model!r} is unknown for architecture={self.architecture}; allowed: "
                             f"{a.model_names()}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1; got {self.max_new_tokens}")


def generate_text(cfg: GenerateConfig, *, checkpoint: str | None = None) -> tuple[str, str]:
    """(the prompt and its greedy continuation, a one-line summary of what ran)."""
    from recurlen.util.tokenizers import load_tokenizer

    if checkpoint:
        from recurlen.training.run_dir import load_model

        loaded = load_model(checkpoint)
        model, tok_spec = loaded.model, cfg.tokenizer or loaded.tokenizer or "bytes"
    else:
        torch.manual_seed(0)
        a = registry.get(cfg.architecture)
        model, tok_spec = a.build(a.preset(cfg.model)), cfg.tokenizer or "bytes"
    tok = load_tokenizer(tok_spec)
    ids = torch.tensor([tok.encode(cfg.prompt)])
    out = greedy_generate(model.eval(), ids, max_new_tokens=cfg.max_new_tokens, stop_ids={tok.eos_id})
    kept, reason = stop_reason(out[0].tolist(), max_new_tokens=cfg.max_new_tokens, eos_id=tok.eos_id)
    summary = (f"{ids.shape[1]}-token prompt, {len(kept)} new tokens ({reason}), "
               f"{model.num_parameters() / 1e6:.2f}M parameters")
    return cfg.prompt + tok.decode(kept), summary


def stop_reason(tokens: list[int], *, max_new_tokens: int, eos_id: int | None) -> tuple[list[int], str]:
    """(the generated tokens before the end-of-text token, why generation stopped), for a user who asked for
    max_new_tokens and got fewer: the model emitted the end-of-text token, the budget ran out, or neither."""
    if eos_id is not None and eos_id in tokens:
        n = tokens.index(eos_id)
        return tokens[:n], (f"stopped: the model emitted the end-of-text token (id {eos_id}) after {n} of at most "
                            f"max_new_tokens={max_new_tokens}")
    if len(tokens) >= max_new_tokens:
        return tokens, f"stopped: reached max_new_tokens={max_new_tokens}"
    return tokens, (f"stopped after {len(tokens)} of max_new_tokens={max_new_tokens} without an end-of-text "
                    "token (the decoder gave no more)")
