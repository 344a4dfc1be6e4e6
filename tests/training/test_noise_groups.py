"""intervention.fit_groups: the groups fitted noise fits one mean and std over. The default is today's grouping
bit for bit; finer groups (blocks, decay) fit each group its own std; the grouping is saved with the statistics
and a resumed run continues exactly; bad values are one-line errors."""

import lightning.pytorch as pl
import pytest
import torch

from recurlen.models import registry
from recurlen.training.finetune import run_finetune
from recurlen.training.interventions import (
    Accumulator,
    FittedNoiseStats,
    InterventionConfig,
    build_intervention,
    fit_noise_stats,
    noise_part,
    step_generator,
)
from recurlen.training.interventions.noise_groups import NoiseGroups, build_groups
from recurlen.training.run_dir import RUN_META_KEY
from recurlen.util.errors import UserError

ARCHS = tuple(registry.architectures())


def nano(arch: str, seed: int = 0):
    a = registry.get(arch)
    torch.manual_seed(seed)
    return a.build(a.preset("nano")).eval()


def fitted(model, **settings):
    cfg = InterventionConfig(name="fitted_noise", **settings)
    return build_intervention(cfg, seed=3, zero_state=model.zero_state(1, device="cpu"))


def draw(iv, model, step: int, lanes: int = 4):
    return iv.initial_state(zeros=model.zero_state(lanes), lanes_B=torch.arange(lanes),
                            new_stream_B=torch.zeros(lanes, dtype=torch.bool), step=step, rank=0)


# ---------------------------------------------------------------------------------------------------- default


@pytest.mark.parametrize("arch", ARCHS)
def test_default_groups_fit_and_draw_as_before_bit_for_bit(arch):
    """fit_groups=default (also when written out) fits per the state type's groups and draws, for a fixed seed,
    exactly what the per (layer, group) formula of the state's GROUP_DIMS draws; nothing new is saved."""
    model = nano(arch)
    part = noise_part(model.zero_state(1))
    g = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, 200, (3, 16), generator=g)} for _ in range(2)]
    stats = fit_noise_stats(model, iter(batches), num_batches=2, seq_len=16)
    # The per (layer, group) moments straight from the final states' group view.
    with torch.no_grad():
        finals = [model.forward_hidden(b["input_ids"])[1].group_view(part).double() for b in batches]
    x = torch.cat(finals, dim=-1)
    mean = x.sum(-1) / x.shape[-1]
    assert torch.equal(stats.mean_KH, mean.float())
    assert stats.groups.default and set(stats.state_dict()) == {"mean_KH", "std_KH", "num_states", "seq_len"}
    for settings in ({}, {"fit_groups": "default"}):
        iv = fitted(model, **settings)
        iv.set_stats(stats)
        for step in range(2):
            got = getattr(draw(iv, model, step), part)
            eps = torch.randn(got.shape, generator=step_generator(3, step, 0, stream=1, device=torch.device("cpu")))
            dims = model.zero_state(1).GROUP_DIMS.get(part, 0)
            view = (got.shape[0], 1, *got.shape[2:2 + dims], *([1] * (got.dim() - 2 - dims)))
            assert torch.equal(got, stats.mean_KH.view(view) + stats.std_KH.view(view) * eps)
        assert set(iv.state_dict()["fitted_noise"]) == {"mean_KH", "std_KH", "num_states", "seq_len"}


def test_default_config_and_yaml_agree():
    from omegaconf import OmegaConf

    yaml = OmegaConf.load("experiments/intervention/fitted_noise.yaml")
    cfg = InterventionConfig(name="fitted_noise")
    assert cfg.fit_groups == yaml.fit_groups == "default"
    assert cfg.fit_group_count is None and yaml.fit_group_count is None
    assert InterventionConfig(name="fitted_noise", fit_groups="decay").fit_group_count == 8


# ---------------------------------------------------------------------------------------------------- finer


def spread_state(model, lanes: int, scale_KE: torch.Tensor):
    """Final states of `lanes` lanes whose entries have the given stds (K, entries per layer), mean 0.5 x std."""
    zeros = model.zero_state(lanes)
    part = noise_part(zeros)
    t = getattr(zeros, part)
    k = t.shape[0]
    eps = torch.randn(t.shape, generator=torch.Generator().manual_seed(5))
    scale = scale_KE.view(k, 1, *t.shape[2:])
    getattr(zeros, part).copy_(eps * scale + 0.5 * scale)
    return zeros


def group_std(groups: NoiseGroups, state, part) -> torch.Tensor:
    """(K, G) pooled std of a state's entries over each group of `groups`."""
    return groups.view(state, part).double().std(dim=-1, correction=0).float()


def slow_and_fast_mamba1():
    """A nano Mamba-1 whose (channel, state) entries decay at rates log-uniform over four orders of magnitude, in
    a shuffled order (the decay groups are not blocks of channels)."""
    model = nano("mamba1")
    with torch.no_grad():
        for i, block in enumerate(model.backbone.layers):
            a_log = block.mixer.A_log
            rates = torch.logspace(-4, 0, a_log.numel())[torch.randperm(a_log.numel(),
                                                                       generator=torch.Generator().manual_seed(i))]
            block.mixer.dt_proj.bias.fill_(0.0)  # softplus(0) = log 2 for every channel
            a_log.copy_(torch.log(rates / torch.log(torch.tensor(2.0))).view_as(a_log))
    return model


def test_decay_groups_fit_each_group_its_own_std_which_per_layer_pooling_does_not():
    model = slow_and_fast_mamba1()
    rates_KE = model.state_decays()["ssm"].flatten(1)
    scale_KE = rates_KE.rsqrt()  # slow entries hold large values: stds from 1 to 100 within a layer
    state = spread_state(model, 64, scale_KE)
    iv = fitted(model, fit_groups="decay", fit_group_count=4)
    groups = iv.groups(model)
    assert groups.kind == "decay" and groups.count == 4 and groups.order_KE.shape == rates_KE.shape
    # Group 0 holds the slowest quarter of each layer's entries, group 3 the fastest.
    sorted_rates = rates_KE.gather(1, groups.order_KE).view(2, 4, -1)
    assert (sorted_rates[:, :-1].amax(-1) <= sorted_rates[:, 1:].amin(-1)).all()
    acc = Accumulator(groups)
    acc.add(state)
    iv.set_stats(acc.stats(num_states=64, seq_len=16))
    want = group_std(groups, state, "ssm")  # each group's own entries
    assert (want[:, 0] > 10 * want[:, 3]).all()  # scales differ by orders of magnitude across the groups
    torch.testing.assert_close(iv.stats.std_KH, want, rtol=1e-5, atol=0)
    noise = draw(iv, model, step=0, lanes=64)
    torch.testing.assert_close(group_std(groups, noise, "ssm"), want, rtol=0.05, atol=0)
    # Pooled per layer (today's Mamba-1 default) the noise has one std: far off both ends of the decay groups.
    per_layer = fitted(model)
    per_layer_acc = Accumulator()
    per_layer_acc.add(state)
    per_layer.set_stats(per_layer_acc.stats(num_states=64, seq_len=16))
    assert per_layer.stats.std_KH.shape == (2, 1)
    pooled = group_std(groups, draw(per_layer, model, step=0, lanes=64), "ssm")
    assert (pooled[:, 3] > 5 * want[:, 3]).all() and (pooled[:, 0] < 0.8 * want[:, 0]).all()


def test_block_groups_follow_blocks_of_channels():
    model = nano("mamba1")
    part, (k, _, d, n) = "ssm", model.zero_state(1).ssm.shape
    channel_scale = 10.0 ** (torch.arange(d) // (d // 4)).float()  # 4 blocks of channels: std 1, 10, 100, 1000
    state = spread_state(model, 16, channel_scale[:, None].expand(d, n).reshape(1, -1).expand(k, -1))
    iv = fitted(model, fit_groups="blocks", fit_group_count=4)
    groups = iv.groups(model)
    acc = Accumulator(groups)
    acc.add(state)
    iv.set_stats(acc.stats(num_states=16, seq_len=16))
    # Each block's std is its channels' own (1, 10, 100, 1000); the mean of a block is 0.5 x its std.
    torch.testing.assert_close(iv.stats.std_KH, channel_scale[::d // 4].expand(k, 4), rtol=0.05, atol=0)
    noise = getattr(draw(iv, model, step=1, lanes=16), part)  # (K, B, D, N)
    per_block = noise.transpose(1, 2).reshape(k, 4, -1).std(dim=-1)
    torch.testing.assert_close(per_block, channel_scale[::d // 4].expand(k, 4), rtol=0.05, atol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_block_groups_work_for_every_architecture(arch):
    model = nano(arch)
    zeros = model.zero_state(1)
    part = noise_part(zeros)
    entries = getattr(zeros, part)[0, 0].numel()
    iv = fitted(model, fit_groups="blocks", fit_group_count=2)
    g = torch.Generator().manual_seed(1)
    stats = fit_noise_stats(model, iter([{"input_ids": torch.randint(0, 200, (3, 16), generator=g)}]),
                            num_batches=1, seq_len=16, groups=iv.groups(model))
    iv.set_stats(stats)
    assert stats.mean_KH.shape == (zeros.n_layer, 2) and stats.groups.order_KE.shape == (zeros.n_layer, entries)
    assert getattr(draw(iv, model, 0), part).shape[2:] == getattr(zeros, part).shape[2:]


def test_mamba2_decay_groups_are_groups_of_heads():
    model = nano("mamba2")
    rates = model.state_decays()["ssm"]  # (K, H, P, N): one rate per head
    assert torch.equal(rates, rates[:, :, :1, :1].expand_as(rates))
    groups = fitted(model, fit_groups="decay", fit_group_count=4).groups(model)
    k, h, entries = rates.shape[0], rates.shape[1], rates[0].numel()
    group_of = torch.empty_like(groups.order_KE).scatter_(
        1, groups.order_KE, torch.arange(entries).div(entries // 4, rounding_mode="floor").expand(k, -1))
    per_head = group_of.view(k, h, -1)
    assert torch.equal(per_head.amin(-1), per_head.amax(-1))  # every head lies in one group (8 heads: 2 a group)
    head_rate = rates[:, :, 0, 0]
    for layer in range(k):  # the groups are quantiles of the heads' rates: slowest first
        group_rates = [head_rate[layer][per_head[layer, :, 0] == q] for q in range(4)]
        assert all(a.max() <= b.min() for a, b in zip(group_rates, group_rates[1:]))


# ---------------------------------------------------------------------------------------------------- files


def test_groups_are_saved_with_the_statistics_and_checked_against_the_run(tmp_path):
    model = slow_and_fast_mamba1()
    iv = fitted(model, fit_groups="decay", fit_group_count=4)
    acc = Accumulator(iv.groups(model))
    acc.add(spread_state(model, 4, torch.ones(2, 1024)))
    stats = acc.stats(num_states=4, seq_len=16)
    path = tmp_path / "noise.pt"
    stats.save(str(path))
    back = FittedNoiseStats.load(str(path))
    assert back.groups.kind == "decay" and back.groups.count == 4
    assert torch.equal(back.groups.order_KE, stats.groups.order_KE)
    fitted(model, fit_groups="decay", fit_group_count=4).set_stats(back)  # the same settings take it
    for settings, asked in (({}, "default"), ({"fit_groups": "decay", "fit_group_count": 8}, r"decay \(8 per layer\)"),
                            ({"fit_groups": "blocks", "fit_group_count": 4}, r"blocks \(4 per layer\)")):
        other = fitted(model, **settings, fit_stats=str(path))
        with pytest.raises(UserError, match=rf"^intervention.fit_stats={path}: the fitted-noise statistics are "
                                            rf"grouped decay \(4 per layer\); this run asks for "
                                            rf"intervention.fit_groups={asked}; fit them again") as err:
            other.load_stats_file()
        assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------------- resume


class StartingStep(pl.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.step = trainer.global_step


def test_resume_with_decay_groups_and_a_refresh_is_exact(tmp_path, experiment):
    """4 steps in one go against 2, then resumed to 4: the same weights, the same statistics, grouping and refresh
    moments, bit for bit; the grouping is the one fitted at the start (not recomputed from the trained decays)."""
    extra = ["intervention=fitted_noise", "intervention.fit_groups=decay", "intervention.fit_group_count=4",
             "intervention.fit_refresh=ema", "intervention.fit_refresh_every=1", "trainer.checkpoint_every_n_steps=2",
             "optim.schedule=constant"]
    run_finetune(experiment(tmp_path / "straight", "trainer.max_steps=4", *extra, arch="mamba1"))
    run_finetune(experiment(tmp_path / "resumed", "trainer.max_steps=2", *extra, arch="mamba1"))
    started = StartingStep()
    run_finetune(experiment(tmp_path / "resumed", "trainer.max_steps=4", *extra, arch="mamba1"), callbacks=[started])
    assert started.step == 2  # resumed, not trained again from the start
    a, b = (torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)
            for run in ("straight", "resumed"))
    assert a["global_step"] == b["global_step"] == 4
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    sa, sb = (ckpt[RUN_META_KEY]["intervention_state"] for ckpt in (a, b))
    assert sa["fitted_noise"]["groups"] == sb["fitted_noise"]["groups"] == "decay"
    assert sa["fitted_noise"]["group_count"] == sb["fitted_noise"]["group_count"] == 4
    for key in ("mean_KH", "std_KH", "order_KE"):
        assert torch.equal(sa["fitted_noise"][key], sb["fitted_noise"][key]), key
    for key in ("mean_KG", "m2_KG", "windows"):
        assert torch.equal(sa["fitted_noise_refresh"][key], sb["fitted_noise_refresh"][key]), key
    assert sa["fitted_noise"]["mean_KH"].shape == (2, 4)
    # The order of the start model's decays, kept although training moved them.
    start = experiment(tmp_path / "x", *extra, arch="mamba1")
    from recurlen.training.finetune import build_model

    torch.manual_seed(start.seed)
    first = build_groups("decay", 4, zeros=nano("mamba1").zero_state(1), part="ssm", model=build_model(start))
    assert torch.equal(sa["fitted_noise"]["order_KE"], first.order_KE)
    # Recorded in the run's config, and in the statistics file the run leaves.
    config = (tmp_path / "resumed" / "config.yaml").read_text()
    assert "fit_groups: decay" in config and "fit_group_count: 4" in config
    saved = FittedNoiseStats.load(str(tmp_path / "resumed" / "fitted_noise.pt"))
    assert saved.groups.kind == "decay" and torch.equal(saved.mean_KH, sb["fitted_noise"]["mean_KH"])


def test_a_checkpoint_with_other_groups_is_refused_in_one_line(tmp_path, experiment):
    """A run written with the default groups (e.g. before fit_groups existed: the key is not in its config) and
    resumed with finer ones is refused in one line, not continued on mismatched statistics."""
    run_dir = run_finetune(experiment(tmp_path / "run", "intervention=fitted_noise", arch="mamba1"))
    # As an earlier recurlen wrote it: the run's settings without the new keys (not a settings difference then).
    path = run_dir / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=True)
    for key in ("fit_groups", "fit_group_count"):
        del ckpt["hyper_parameters"]["intervention"][key]
    torch.save(ckpt, path)
    (run_dir / "config.yaml").unlink()
    cfg = experiment(tmp_path / "run", "intervention=fitted_noise", "intervention.fit_groups=decay",
                     "trainer.max_steps=3", arch="mamba1")
    with pytest.raises(UserError, match=r"^the checkpoint's fitted noise does not fit this run: the fitted-noise "
                                        r"statistics are grouped default; this run asks for "
                                        r"intervention.fit_groups=decay \(8 per layer\); .*resume=archive") as err:
        run_finetune(cfg)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("settings", "message"), [
    ({"fit_groups": "quantile"}, r"intervention.fit_groups='quantile' is unknown; allowed: \['default', 'blocks', "
                                 r"'decay'\]"),
    ({"fit_group_count": 4}, r"intervention.fit_group_count=4 applies to fit_groups \['blocks', 'decay'\] only; "
                             "with fit_groups=default leave it null"),
    ({"fit_groups": "decay", "fit_group_count": 0}, r"intervention.fit_group_count=0 is not allowed; need an "
                                                     r"integer >= 1 \(groups per layer\) or null \(8\)"),
    ({"fit_groups": "blocks", "fit_group_count": True}, "intervention.fit_group_count=True is not allowed"),
])
def test_bad_settings_are_one_line_errors(settings, message):
    with pytest.raises(ValueError, match="^" + message) as err:
        InterventionConfig(name="fitted_noise", **settings)
    assert "\n" not in str(err.value)


def test_groups_a_model_cannot_have_are_one_line_errors_before_anything_is_written(tmp_path, experiment):
    model = nano("mamba1")  # a layer's ssm state: 128 channels x 8 = 1024 entries
    with pytest.raises(UserError, match=r"^intervention.fit_group_count=3 does not divide the 1024 entries of a "
                                        r"layer's ssm state \(128, 8\); allowed here: a divisor of 1024, e.g. "
                                        r"\[1, 2, 4, 8, 16, 32, 64\]$"):
        fitted(model, fit_groups="blocks", fit_group_count=3).groups(model)
    # The architectures whose decays depend on the input (their models state no decay rates: GLA, RWKV-6).
    dependent = [arch for arch in ARCHS if not nano(arch).state_decays()]
    assert dependent
    for arch in dependent:
        model = nano(arch)
        name = type(model).__name__
        with pytest.raises(UserError, match=rf"^intervention.fit_groups=decay needs decay rates that are parameters; "
                                            rf"this model's \({name}\) depend on the input; allowed for it: default, "
                                            "blocks$"):
            fitted(model, fit_groups="decay").groups(model)
    cfg = experiment(tmp_path / "run", "intervention=fitted_noise", "intervention.fit_groups=decay",
                     arch=dependent[0])
    with pytest.raises(UserError, match="fit_groups=decay needs decay rates that are parameters"):
        run_finetune(cfg)
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_the_groups_follow_the_model_as_built_not_as_wrapped():
    """bind(model) (the LightningModule, before a strategy wraps or shards the model) fixes the groups the first
    fit uses; decay rates that move afterwards do not regroup."""
    model = slow_and_fast_mamba1()
    iv = fitted(model, fit_groups="decay", fit_group_count=4)
    iv.bind(model)
    before = iv.bound_groups.order_KE.clone()
    with torch.no_grad():
        for block in model.backbone.layers:
            block.mixer.A_log.neg_()  # the slowest entries become the fastest
    g = torch.Generator().manual_seed(1)
    iv.setup(model, lambda step: {"input_ids": torch.randint(0, 200, (2, 8), generator=g)}, seq_len=8)
    assert torch.equal(iv.stats.groups.order_KE, before)
    assert not torch.equal(iv.groups(model).order_KE, before)


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_rows_fit_each_row_s_last_document_not_a_state_across_documents(arch):
    """data.layout=packed: the fit resets at each flagged document start, as training does, so a row contributes
    its last document's final state (run alone from zeros), never a state carried across a boundary."""
    model = nano(arch).double()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 200, (3, 24), generator=gen)
    resets = torch.zeros(3, 24, dtype=torch.bool)
    resets[0, 9] = resets[1, 5] = resets[1, 17] = True  # row 2: one document continued from the row's start
    last_start = [9, 17, 0]
    got = fit_noise_stats(model, [{"input_ids": ids, "resets": resets}], num_batches=1, seq_len=24)
    want = Accumulator()
    for row, start in enumerate(last_start):
        want.add(model.forward_hidden(ids[row:row + 1, start:])[1])
    want = want.stats(num_states=3, seq_len=24)
    torch.testing.assert_close(got.mean_KH, want.mean_KH, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got.std_KH, want.std_KH, rtol=1e-5, atol=1e-7)
    joined = fit_noise_stats(model, [{"input_ids": ids}], num_batches=1, seq_len=24)
    assert not torch.allclose(joined.mean_KH, want.mean_KH, rtol=1e-3, atol=0)  # the test can tell the two apart
