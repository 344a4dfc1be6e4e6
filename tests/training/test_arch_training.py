"""Post-training works the same for every architecture: each intervention, fitted noise per the state's
groups, carried states in checkpoints, and run loading (exact resume: tests/models/test_architectures.py)."""

import pytest
import torch

from recurlen.models import registry
from recurlen.training.finetune import run_finetune
from recurlen.training.interventions import (
    INTERVENTIONS,
    FittedNoiseStats,
    InterventionConfig,
    build_intervention,
)
from recurlen.training.run_dir import RUN_META_KEY, load_model

ARCHS = tuple(registry.architectures())


@pytest.mark.parametrize("intervention", INTERVENTIONS)
@pytest.mark.parametrize("name", ARCHS)
def test_each_intervention_trains_each_architecture(tmp_path, experiment, name, intervention):
    cfg = experiment(tmp_path / "run", f"intervention={intervention}", arch=name)
    run_dir = run_finetune(cfg)
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    meta = ckpt[RUN_META_KEY]
    assert ckpt["global_step"] == 2 and meta["architecture"] == name and meta["intervention"] == intervention
    a = registry.get(name)
    zero = a.build(cfg.model.config).zero_state(4)
    state = meta["intervention_state"]
    if intervention in ("state_passing", "tbptt"):
        carried = state["carried"]["state"]  # the state type's own state_dict
        for part in a.state_cls.part_names():  # every part of the state type, lanes second
            assert carried[part].shape == getattr(zero, part).shape
        assert carried[a.state_cls.RECURRENT[0]].abs().sum() > 0
    else:
        assert "carried" not in state
    if intervention == "fitted_noise":
        stats = FittedNoiseStats.from_state_dict(state["fitted_noise"])
        k, groups, _ = zero.group_view(a.state_cls.RECURRENT[0]).shape
        assert stats.mean_KH.shape == (k, groups) and (stats.std_KH > 0).all()
    loaded = load_model(str(run_dir), backend="torch")
    assert isinstance(loaded.model, a.model_cls)
    prefix = "model."
    for key, value in loaded.model.state_dict().items():
        assert torch.equal(value, ckpt["state_dict"][prefix + key]), key


@pytest.mark.parametrize("name", ARCHS)
def test_noise_is_drawn_on_the_recurrent_part_with_fitted_groups(name):
    a = registry.get(name)
    zeros = a.build(a.preset("nano")).zero_state(3)
    part = a.state_cls.RECURRENT[0]
    k, groups, _ = zeros.group_view(part).shape
    stats = FittedNoiseStats(mean_KH=torch.arange(k * groups, dtype=torch.float32).view(k, groups) * 10,
                             std_KH=torch.full((k, groups), 1e-3))
    stats.check_state(zeros)
    iv = build_intervention(InterventionConfig(name="fitted_noise"), seed=0, zero_state=zeros[0:1])
    iv.set_stats(stats)
    state = iv.initial_state(zeros=zeros, lanes_B=torch.arange(3), new_stream_B=torch.zeros(3, dtype=torch.bool),
                             step=0, rank=0)
    means = state.group_view(part).mean(dim=-1)
    torch.testing.assert_close(means, stats.mean_KH, rtol=0, atol=1e-3)
    for window in a.state_cls.WINDOW:
        assert getattr(state, window).abs().sum() == 0  # noise never touches the conv windows
    with pytest.raises(ValueError, match="fitted-noise mean has shape"):
        FittedNoiseStats(mean_KH=torch.zeros(k, groups + 1), std_KH=torch.zeros(k, groups + 1)).check_state(zeros)


@pytest.mark.parametrize("name", ARCHS)
def test_refresh_pools_the_final_states_per_fitted_group(name):
    """fit_refresh=every with a window of one step: the statistics become that step's, per the state's groups."""
    a = registry.get(name)
    model = a.build(a.preset("nano"))
    zeros = model.zero_state(3)
    part = a.state_cls.RECURRENT[0]
    k, groups, _ = zeros.group_view(part).shape
    iv = build_intervention(InterventionConfig(name="fitted_noise", fit_refresh="every", fit_refresh_every=1),
                            seed=0, zero_state=zeros[0:1])
    iv.set_stats(FittedNoiseStats(mean_KH=torch.zeros(k, groups), std_KH=torch.ones(k, groups)))
    iv.setup(model, lambda step: {}, seq_len=16)
    final = zeros.clone()
    getattr(final, part).copy_(torch.randn(getattr(final, part).shape, generator=torch.Generator().manual_seed(0))
                               * 3.0 + 2.0)
    iv.observe(final, torch.arange(3), step=0)
    x = final.group_view(part).double()
    torch.testing.assert_close(iv.stats.mean_KH, x.mean(-1).float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(iv.stats.std_KH, x.std(-1, correction=0).float(), rtol=1e-5, atol=1e-6)
    assert iv.stats.mean_KH.shape == (k, groups)
