"""Checks of the A knob (recurlen.models.timescales: a scale of each token's log decay) that need to know where an
architecture's model module hands its log decay to its chunked scan and its one-token step; each architecture's
folder (tests/models/<arch>/test_<arch>_scaled_decay.py) calls them with its own names. What holds for every
architecture with the knob is tests/evaluation/fixes/test_decay_scales.py."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from recurlen.models import timescales


def record_log_decays(monkeypatch, module: ModuleType, chunked: str, step: str, at: int) -> list[torch.Tensor]:
    """Every log decay that `module`'s chunked scan and step (functions it calls by those names, the log decay their
    positional argument `at`) receive from now on, in call order."""
    seen: list[torch.Tensor] = []
    for name in (chunked, step):
        fn = getattr(module, name)

        def recorded(*args, _fn=fn, **kwargs):
            seen.append(args[at].detach().clone())
            return _fn(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)
    return seen


def log_decays(model, seen: list[torch.Tensor], scales: torch.Tensor | None, seed: int = 2) -> list[torch.Tensor]:
    """With the A scales set: a forward over 39 tokens, then one step; the log decays the scans received (each
    layer's chunked scan, then each layer's step)."""
    ids = torch.randint(0, 200, (2, 40), generator=torch.Generator().manual_seed(seed))
    seen.clear()
    timescales.set_scales(model, "A", scales)
    with torch.no_grad():
        _, state = model(ids[:, :-1])
        model.step(ids[:, -1], state)
    return list(seen)


def check_scan_and_step_receive_s_times_the_log_decay(model, seen: list[torch.Tensor]) -> None:
    """Layer 0 at 1, layer 1 at 0.5 (a power of two, so s x g is exact): layer 1's input is the model's own, and
    its scan and its step receive exactly half the log decay, layer 0's exactly the original."""
    plain = log_decays(model, seen, None)
    scaled = log_decays(model, seen, torch.tensor([1.0, 0.5]))
    assert len(plain) == len(scaled) == 4  # two layers' chunked scans, then two layers' steps
    assert all(float(g.abs().max()) > 1e-3 for g in plain)
    for g_plain, g_scaled, s in zip(plain, scaled, (1.0, 0.5, 1.0, 0.5)):
        assert torch.equal(g_scaled, g_plain * s)


def check_scale_side_of_clamp(model, seen: list[torch.Tensor], clamp: float, *, after: bool) -> None:
    """On a model whose clamp on the log decay binds, layer 1 scaled by 4. After the clamp: every channel scaled,
    those at the clamp too. Before it: the clamp still bounds the scaled decay, the channels at it stay there."""
    plain = log_decays(model, seen, None, seed=3)[1]  # layer 1's chunked scan
    assert float(plain.min()) == pytest.approx(clamp)  # the clamp binds
    scaled = log_decays(model, seen, torch.tensor([1.0, 4.0]), seed=3)[1]
    if after:
        assert torch.equal(scaled, plain * 4.0) and float(scaled.min()) == pytest.approx(4 * clamp)
    else:
        assert float(scaled.min()) == pytest.approx(clamp)
        assert torch.equal(scaled[plain == clamp], plain[plain == clamp])
        assert (scaled < plain).any()
