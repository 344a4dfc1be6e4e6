"""Fitted noise refreshed from the final states seen in training: the every / ema math, pooling over ranks,
and checkpoints of the refresh (open window included)."""

import threading

import pytest
import torch

from recurlen import Mamba2LM, preset
from recurlen.training.interventions import FittedNoiseStats, InterventionConfig, build_intervention
from recurlen.training.interventions.noise_refresh import Moments, StatsRefresh
from recurlen.training.stateful import Ranks


def fitted(refresh: str, *, every: int = 2, decay: float = 0.75):
    model = Mamba2LM(preset("nano"))
    cfg = InterventionConfig(name="fitted_noise", fit_refresh=refresh, fit_refresh_every=every, fit_ema=decay)
    iv = build_intervention(cfg, seed=0, zero_state=model.zero_state(1, device="cpu"))
    k, h = model.config.n_layer, model.config.nheads
    iv.set_stats(FittedNoiseStats(torch.full((k, h), 0.5), torch.full((k, h), 2.0), num_states=8, seq_len=16))
    iv.setup(model, lambda step: {}, seq_len=16)  # statistics already set: nothing is fitted
    return model, iv


def final_states(model, step: int, lanes: int = 3, scale: float = 1.0):
    g = torch.Generator().manual_seed(100 + step)
    state = model.zero_state(lanes)
    state.ssm.copy_(torch.randn(state.ssm.shape, generator=g) * scale + step)
    return state


def pooled(states) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 first and second moments per (layer, head) of the SSM states, straight from their entries."""
    x = torch.cat([s.ssm.double().transpose(0, 1) for s in states], dim=0)  # (lanes, K, H, P, N)
    x = x.transpose(0, 1).transpose(1, 2).flatten(2)  # (K, H, lanes * P * N)
    return x.mean(-1), x.pow(2).mean(-1)


def test_every_replaces_the_statistics_by_each_window_and_keeps_them_in_between():
    model, iv = fitted("every", every=2)
    before = iv.stats
    s0, s1, s2 = (final_states(model, k) for k in range(3))
    iv.observe(s0, torch.arange(3), step=0)
    assert iv.stats is before  # the window is still open
    iv.observe(s1, torch.arange(3), step=1)
    mean, m2 = pooled([s0, s1])
    torch.testing.assert_close(iv.stats.mean_KH, mean.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(iv.stats.std_KH, (m2 - mean.pow(2)).sqrt().float(), rtol=1e-6, atol=1e-6)
    assert iv.stats.num_states == 6 and iv.stats.seq_len == 16
    iv.observe(s2, torch.arange(3), step=2)
    torch.testing.assert_close(iv.stats.mean_KH, mean.float(), rtol=1e-6, atol=1e-6)  # unchanged until step 3
    iv.observe(final_states(model, 3), torch.arange(3), step=3)
    mean, _ = pooled([s2, final_states(model, 3)])
    torch.testing.assert_close(iv.stats.mean_KH, mean.float(), rtol=1e-6, atol=1e-6)  # the old window is gone
    assert iv.scalars()["fitted_noise_std"] == pytest.approx(iv.stats.std_KH.mean().item())


def test_ema_blends_first_and_second_moments_with_the_decay():
    model, iv = fitted("ema", every=1, decay=0.75)
    m = Moments.of_gaussian(torch.full((2, 8), 0.5), torch.full((2, 8), 2.0))
    mean, m2 = m.mean_KG, m.m2_KG
    assert torch.allclose(m2, torch.full((2, 8), 4.25, dtype=torch.float64))
    for step in range(3):
        s = final_states(model, step, scale=3.0)
        iv.observe(s, torch.arange(3), step=step)
        w_mean, w_m2 = pooled([s])
        mean, m2 = 0.75 * mean + 0.25 * w_mean, 0.75 * m2 + 0.25 * w_m2
        torch.testing.assert_close(iv.stats.mean_KH, mean.float(), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(iv.stats.std_KH, (m2 - mean.pow(2)).sqrt().float(), rtol=1e-6, atol=1e-6)
    # The noise is drawn from the refreshed statistics: N(mean, std^2) per (layer, head).
    eps_init = iv.initial_state(zeros=model.zero_state(64), lanes_B=torch.arange(64),
                                new_stream_B=torch.zeros(64, dtype=torch.bool), step=5, rank=0)
    x = eps_init.ssm.double().transpose(1, 2).flatten(2)  # (K, H, lanes * P * N)
    torch.testing.assert_close(x.mean(-1).float(), iv.stats.mean_KH, atol=0.05, rtol=0.01)
    torch.testing.assert_close(x.std(-1).float(), iv.stats.std_KH, atol=0.05, rtol=0.01)


def test_no_refresh_is_todays_behaviour():
    model, iv = fitted("none")
    before = iv.stats
    for step in range(4):
        iv.observe(final_states(model, step), torch.arange(3), step=step)
    assert iv.stats is before and iv.scalars() == {}
    assert set(iv.state_dict()) == {"fitted_noise"}


def test_config_rejects_bad_refresh_settings():
    with pytest.raises(ValueError, match=r"fit_refresh='sometimes' is unknown; allowed: \['none', 'every', 'ema'\]"):
        InterventionConfig(name="fitted_noise", fit_refresh="sometimes")
    with pytest.raises(ValueError, match="fit_refresh_every must be >= 1"):
        InterventionConfig(name="fitted_noise", fit_refresh="every", fit_refresh_every=0)
    with pytest.raises(ValueError, match=r"fit_ema must be in \[0, 1\)"):
        InterventionConfig(name="fitted_noise", fit_refresh="ema", fit_ema=1.0)


class FakeCollective:
    """all_reduce_sum / all_gather among threads standing for ranks (every rank calls at once)."""

    def __init__(self, world: int):
        self.world, self.barrier, self.slots = world, threading.Barrier(world), [None] * world

    def ranks(self, rank: int) -> Ranks:
        def exchange(t):
            self.slots[rank] = t.clone()
            self.barrier.wait()
            out = torch.stack(self.slots)
            self.barrier.wait()
            return out

        return Ranks(rank=rank, world_size=self.world, all_gather=exchange,
                     all_reduce_sum=lambda t: exchange(t).sum(dim=0))

    def run(self, fn):
        """[fn(rank) for every rank], each rank on its own thread (so that their collectives meet)."""
        results, errors = [None] * self.world, []

        def one(rank):
            try:
                results[rank] = fn(rank)
            except Exception as err:  # surfaced below
                errors.append(err)

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        return results


@pytest.mark.parametrize("mode", ["every", "ema"])
def test_ranks_pool_their_final_states_and_agree(mode):
    """Two ranks with other lanes: both get the statistics of all lanes, as one rank holding them all would."""
    world, steps = 2, 4
    collective = FakeCollective(world)
    models_ivs = [fitted(mode, every=2) for _ in range(world)]
    for rank, (_, iv) in enumerate(models_ivs):  # as the LightningModule does once the trainer's ranks exist
        iv.connect(collective.ranks(rank))
    single_model, single = fitted(mode, every=2)
    states = {(r, k): final_states(single_model, 10 * k + r) for r in range(world) for k in range(steps)}

    def run(rank):
        for k in range(steps):
            models_ivs[rank][1].observe(states[(rank, k)], torch.arange(3) + 3 * rank, step=k)

    collective.run(run)
    for k in range(steps):
        both = type(states[(0, k)]).cat([states[(0, k)], states[(1, k)]])  # rank 0's lanes, then rank 1's
        single.observe(both, torch.arange(6), step=k)
    for _, iv in models_ivs:
        torch.testing.assert_close(iv.stats.mean_KH, single.stats.mean_KH, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(iv.stats.std_KH, single.stats.std_KH, rtol=1e-6, atol=1e-6)
        assert iv.stats.num_states == single.stats.num_states == 4 * 6  # final states seen by refreshes
    assert torch.equal(models_ivs[0][1].stats.mean_KH, models_ivs[1][1].stats.mean_KH)  # ranks agree exactly


@pytest.mark.parametrize("mode", ["every", "ema"])
def test_checkpoint_in_an_open_window_resumes_bitwise(mode):
    model, whole = fitted(mode, every=3)
    _, first = fitted(mode, every=3)
    for step in range(7):
        whole.observe(final_states(model, step), torch.arange(3), step=step)
    for step in range(4):  # windows end at steps 2 and 5: step 3 is inside the second
        first.observe(final_states(model, step), torch.arange(3), step=step)
    saved = first.state_dict()
    assert saved["fitted_noise_refresh"]["windows"].shape == (1, 2 * 2 * 8 + 2)
    _, resumed = fitted(mode, every=3)
    resumed.load_state_dict(saved)
    resumed.setup(model, lambda step: {}, seq_len=16)  # keeps the restored moments
    for step in range(4, 7):
        resumed.observe(final_states(model, step), torch.arange(3), step=step)
    a, b = whole.state_dict(), resumed.state_dict()
    for key in ("mean_KH", "std_KH"):
        assert torch.equal(a["fitted_noise"][key], b["fitted_noise"][key])
    for key in ("mean_KG", "m2_KG", "windows"):
        assert torch.equal(a["fitted_noise_refresh"][key], b["fitted_noise_refresh"][key])
    assert a["fitted_noise_refresh"]["refreshes"] == b["fitted_noise_refresh"]["refreshes"] == 2


def test_every_rank_saves_all_open_windows_and_takes_its_own_back():
    """state_dict() gathers through the ranks the intervention was connected to; load_state_dict(state) gives each
    rank its own part of the open window, as the LightningModule's checkpoint hooks use them."""
    world = 2
    collective = FakeCollective(world)
    ivs = [fitted("every", every=4)[1] for _ in range(world)]
    for rank, iv in enumerate(ivs):
        iv.connect(collective.ranks(rank))
    model = Mamba2LM(preset("nano"))

    def save(rank):
        for step in range(2):  # the window (4 steps) is still open; rank 1 has more lanes than rank 0
            lanes = 2 + rank
            ivs[rank].observe(final_states(model, 10 * step + rank, lanes=lanes), torch.arange(lanes), step=step)
        return ivs[rank].state_dict()

    saved = collective.run(save)
    refresh = saved[0]["fitted_noise_refresh"]
    assert refresh["world_size"] == world and refresh["windows"].shape == (world, 2 * 2 * 8 + 2)
    assert refresh["windows"].dtype == torch.float64 and refresh["windows"][:, -1].tolist() == [4.0, 6.0]
    for key in ("mean_KG", "m2_KG", "windows"):  # every rank saved the same thing
        assert torch.equal(saved[1]["fitted_noise_refresh"][key], refresh[key])
    for rank, iv in enumerate(ivs):
        back = fitted("every", every=4)[1]
        back.connect(Ranks(rank=rank, world_size=world))
        back.load_state_dict(saved[0])
        assert back.refresh.count == iv.refresh.count > 0 and back.refresh.lanes_in_window == 2 * (2 + rank)
        assert torch.equal(back.refresh.sum_KG, iv.refresh.sum_KG)
        assert torch.equal(back.refresh.sumsq_KG, iv.refresh.sumsq_KG)


def test_open_window_of_another_world_size_goes_to_rank_zero():
    r = StatsRefresh("every", every=4, decay=0.0)
    r.start(torch.zeros(2, 3), torch.ones(2, 3))
    r.add(torch.ones(2, 3, 5), lanes=1)
    saved = r.state_dict()
    two = [StatsRefresh("every", every=4, decay=0.0, ranks=Ranks(rank=rank, world_size=1 if rank == 0 else 3))
           for rank in range(2)]
    saved2 = {**saved, "windows": torch.cat([saved["windows"], saved["windows"]]), "world_size": 2}
    for x in two:
        x.load_state_dict(saved2)
    assert two[0].count == 10 and torch.equal(two[0].sum_KG, torch.full((2, 3), 10.0, dtype=torch.float64))
    assert two[1].count == 0 and two[1].sum_KG is None
