"""Post-training end to end through the Lightning Trainer, on the nano model and the embedded corpus."""

import inspect
import json

import lightning as L
import pytest
import torch

from recurlen.models.mamba2.state import RecurrentState
from recurlen.training.data.datamodule import RecurlenDataModule
from recurlen.training.finetune import run_finetune
from recurlen.training.interventions import (
    INTERVENTIONS,
    KINDS,
    FittedNoiseStats,
    StatsRefresh,
    build_intervention,
    fit_noise_stats,
)
from recurlen.training.lit_module import RecurlenModule
from recurlen.training.run_dir import RUN_META_KEY, load_model
from recurlen.training.stateful import Stateful
from recurlen.util.errors import NonFinite

RUN = ("trainer.max_steps=4", "trainer.val_every_n_steps=2", "trainer.limit_val_batches=2",
       "intervention.fit_batches=8")
"""This module's run, on top of conftest's tiny one: 4 steps, validation every 2 on 2 batches, fitted noise fitted
on 8 batches (the intervention's default)."""


class Recorder(L.Callback):
    """Initial and final states and the loss of every training step."""

    def __init__(self):
        self.inits, self.finals, self.losses, self.batches = [], [], [], []

    def on_train_start(self, trainer, pl_module):
        model, recorder = pl_module.model, self
        original = model.forward_hidden

        def spy(input_ids, state=None, **kw):
            hidden, final = original(input_ids, state, **kw)
            if model.training:
                recorder.inits.append(None if state is None else state.detach().clone())
                recorder.finals.append(final.detach().clone())
            return hidden, final

        model.forward_hidden = spy

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))
        self.batches.append({k: v.clone() for k, v in batch.items()})


@pytest.mark.parametrize("name", INTERVENTIONS)
def test_each_intervention_trains_end_to_end(tmp_path, experiment, name):
    cfg = experiment(tmp_path / "run", *RUN, f"intervention={name}")
    rec = Recorder()
    run_dir = run_finetune(cfg, callbacks=[rec])
    assert len(rec.losses) == 4 and all(torch.isfinite(torch.tensor(rec.losses)))
    # 4 steps, saving every 100 (the default): only last.ckpt, written at the end, and no last-v1.ckpt.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt"]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    meta = ckpt[RUN_META_KEY]
    assert ckpt["global_step"] == 4 and meta["intervention"] == name
    assert ckpt["hyper_parameters"]["intervention"]["name"] == name
    assert (run_dir / "config.yaml").read_text().count(f"name: {name}") == 1
    first = rec.inits[0]
    if name in ("none",):
        assert all(s.ssm.abs().sum() == 0 for s in rec.inits)
    if name in ("random_noise", "fitted_noise"):
        assert first.ssm.abs().sum() > 0 and first.conv.abs().sum() == 0
        assert not torch.equal(rec.inits[0].ssm, rec.inits[1].ssm)  # fresh noise every step
    state = meta["intervention_state"]
    if name == "fitted_noise":
        assert state["fitted_noise"]["mean_KH"].shape == (2, 8)
        assert (run_dir / "fitted_noise.pt").is_file()
    if name in ("state_passing", "tbptt"):
        assert state["carried"]["state"]["ssm"].shape == (2, 4, 8, 16, 16)  # RecurrentState.state_dict()
        assert torch.equal(state["carried"]["lanes"], torch.arange(4))
    else:
        assert "carried" not in state


@pytest.mark.parametrize("name, pass_conv", [("state_passing", True), ("tbptt", True), ("state_passing", False),
                                             ("tbptt", False)])
def test_step_k_final_state_is_step_k_plus_1_initial_state(tmp_path, experiment, name, pass_conv):
    cfg = experiment(tmp_path / "run", *RUN, f"intervention={name}", "intervention.reset_prob=0.25",
                     "trainer.max_steps=6", f"intervention.pass_conv={str(pass_conv).lower()}")
    assert cfg.intervention.pass_conv is pass_conv
    rec = Recorder()
    run_finetune(cfg, callbacks=[rec])
    assert rec.inits[0].ssm.abs().sum() == 0  # nothing to carry at step 0
    resets = 0
    for k in range(1, 6):
        prev, init = rec.finals[k - 1], rec.inits[k]
        for lane in range(4):
            if init.ssm[:, lane].abs().sum() == 0:  # a reset lane (reset_prob)
                resets += 1
                continue
            assert torch.equal(init.ssm[:, lane], prev.ssm[:, lane])
            if pass_conv:  # the whole state continues
                assert torch.equal(init.conv[:, lane], prev.conv[:, lane])
            else:  # the default for both, as the paper's pseudocode: the SSM state only
                assert init.conv[:, lane].abs().sum() == 0
    assert 0 < resets < 20  # reset_prob 0.25 over 20 lane-steps


def test_tbptt_lanes_continue_exactly(tmp_path, experiment):
    """Carried state after 2 steps of 16 tokens == the state after one 32-token forward (frozen weights)."""
    cfg = experiment(tmp_path / "run", *RUN, "intervention=tbptt", "intervention.reset_prob=0",
                     "intervention.pass_conv=true", "trainer.max_steps=2", "optim.lr=1e-30", "optim.weight_decay=0",
                     "optim.grad_clip=0")
    rec = Recorder()
    run_finetune(cfg, callbacks=[rec])
    b0, b1 = rec.batches
    assert torch.equal(b0["lane"], b1["lane"]) and torch.equal(b0["input_ids"][:, 1:], b0["targets"][:, :-1])
    assert torch.equal(b1["input_ids"][:, 0], b0["targets"][:, -1])  # lane k+1 starts where k ended
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    module_model = load_model(
        str(tmp_path / "run" / "checkpoints" / "last.ckpt")).model
    with torch.no_grad():
        _, state = module_model.forward_hidden(torch.cat([b0["input_ids"], b1["input_ids"]], dim=1))
    carried = RecurrentState.from_state_dict(ckpt[RUN_META_KEY]["intervention_state"]["carried"]["state"])
    torch.testing.assert_close(carried.ssm, state.ssm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(carried.conv, state.conv, rtol=1e-5, atol=1e-6)


def test_tbptt_window_lanes_restart_from_zero_exactly_every_tbptt_segments_resume_included(tmp_path, experiment):
    """TBTT's window form: long sequences of tbptt_segments segments of the stream from a zero state, no random
    resets; a run killed inside a long sequence resumes with the carried state and restarts on the same steps."""
    common = ["intervention=tbptt", "intervention.tbptt_over=stream", "intervention.tbptt_segments=3",
              "intervention.pass_conv=true", "trainer.max_steps=8",
              "trainer.checkpoint_every_n_steps=4", "trainer.val_every_n_steps=4"]
    cfg = experiment(tmp_path / "full", *RUN, *common)
    assert cfg.intervention.reset_prob == 0.0  # the intervention's preset: no random resets
    full = Recorder()
    run_finetune(cfg, callbacks=[full])
    cfg = experiment(tmp_path / "killed", *RUN, *common)
    first = Recorder()
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        run_finetune(cfg, callbacks=[first, CrashAfter(4)])  # killed in the second long sequence (steps 3-5)
    cfg = experiment(tmp_path / "killed", *RUN, *common)
    second = Recorder()
    run_finetune(cfg, callbacks=[second])
    for rec in (full, first):
        assert len(rec.inits) == len(rec.batches)
    for run, inits, finals in (("full", full.inits, full.finals),
                               ("resumed", first.inits + second.inits, first.finals + second.finals)):
        assert len(inits) == 8, run
        for k, init in enumerate(inits):
            starts = k % 3 == 0
            per_lane_zero = [bool(init.ssm[:, b].abs().sum() == 0 and init.conv[:, b].abs().sum() == 0)
                             for b in range(4)]
            assert per_lane_zero == [starts] * 4, (run, k)
            if not starts:  # inside a long sequence: exactly the previous segment's final state, conv included
                assert torch.equal(init.ssm, finals[k - 1].ssm) and torch.equal(init.conv, finals[k - 1].conv)
    for got, want in zip(first.inits + second.inits, full.inits):
        assert torch.equal(got.ssm, want.ssm) and torch.equal(got.conv, want.conv)
    assert first.losses + second.losses == full.losses


def test_fitted_noise_statistics_match_the_fitting_data(tmp_path, experiment):
    from recurlen.training.data.datamodule import RecurlenDataModule
    from recurlen.training.finetune import build_model

    cfg = experiment(tmp_path / "run", *RUN, "intervention=fitted_noise", "intervention.fit_batches=3")
    dm = RecurlenDataModule(cfg.data)
    dm.setup("fit")
    model = build_model(cfg)
    stats = fit_noise_stats(model, (dm.train_batch(s) for s in range(3)), num_batches=3, seq_len=16)
    finals = [model.forward_hidden(dm.train_batch(s)["input_ids"])[1].ssm for s in range(3)]
    ssm = torch.cat(finals, dim=1)  # (K, 12, H, P, N)
    assert stats.mean_KH.shape == (2, 8) and stats.num_states == 12
    torch.testing.assert_close(stats.mean_KH, ssm.mean(dim=(1, 3, 4)), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(stats.std_KH, ssm.std(dim=(1, 3, 4), unbiased=False), rtol=1e-3, atol=1e-6)
    with pytest.raises(ValueError, match=r"fitted-noise mean has shape \(3, 8\); this model needs \(2, 8\)"):
        build_intervention(cfg.intervention, seed=0, zero_state=model.zero_state(1)).set_stats(
            FittedNoiseStats(torch.zeros(3, 8), torch.ones(3, 8)))
    with pytest.raises(FileNotFoundError, match="fitted-noise statistics file"):
        FittedNoiseStats.load(str(tmp_path / "absent.pt"))


class CrashAfter(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise KeyboardInterrupt("simulated kill")


def run_recorded(cfg, *, crash_after: int | None = None) -> Recorder:
    """Train `cfg` with a Recorder (and a CrashAfter(crash_after) that stops it by KeyboardInterrupt / SystemExit)."""
    rec = Recorder()
    if crash_after is None:
        run_finetune(cfg, callbacks=[rec])
    else:
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            run_finetune(cfg, callbacks=[rec, CrashAfter(crash_after)])
    return rec


REFRESH = {"every": ["intervention.fit_refresh=every", "intervention.fit_refresh_every=2"],
           "ema": ["intervention.fit_refresh=ema", "intervention.fit_refresh_every=2", "intervention.fit_ema=0.5"]}


@pytest.mark.parametrize("name, refresh", [("tbptt", None), ("state_passing", None), ("fitted_noise", None),
                                           ("fitted_noise", "every"), ("fitted_noise", "ema")])
def test_resume_after_kill_is_exact(tmp_path, experiment, name, refresh):
    # With a refresh every 2 steps, the kill after 3 steps leaves a window open (step 2 seen, step 3 not yet).
    common = [f"intervention={name}", "trainer.max_steps=6", "trainer.checkpoint_every_n_steps=3",
              "trainer.val_every_n_steps=3", "intervention.reset_prob=0.3", *REFRESH.get(refresh, [])]
    cfg = experiment(tmp_path / "full", *RUN, *common)
    full = Recorder()
    run_finetune(cfg, callbacks=[full])

    cfg = experiment(tmp_path / "killed", *RUN, *common)
    first = Recorder()
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        run_finetune(cfg, callbacks=[first, CrashAfter(3)])
    assert (tmp_path / "killed" / "checkpoints" / "step=000003.ckpt").is_file()
    cfg = experiment(tmp_path / "killed", *RUN, *common)  # resume=auto
    second = Recorder()
    run_finetune(cfg, callbacks=[second])

    assert first.losses == full.losses[:3]
    assert second.losses == full.losses[3:], (second.losses, full.losses)
    for got, want in zip(first.batches + second.batches, full.batches):
        assert all(torch.equal(got[k], want[k]) for k in want)
    for run in ("full", "killed"):  # the resumed run replaces last.ckpt in place (no versioned copies)
        names = sorted(p.name for p in (tmp_path / run / "checkpoints").iterdir())
        assert names == ["last.ckpt", "step=000003.ckpt", "step=000006.ckpt"], names
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(tmp_path / "killed" / "checkpoints" / "last.ckpt", weights_only=True)
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    sa, sb = a[RUN_META_KEY]["intervention_state"], b[RUN_META_KEY]["intervention_state"]
    if sa.get("carried") is not None:
        for key in ("ssm", "conv"):
            assert torch.equal(sa["carried"]["state"][key], sb["carried"]["state"][key])
    if name == "fitted_noise":  # the resumed run kept the statistics it fitted (and refreshed) before the kill
        for key in ("mean_KH", "std_KH"):
            assert torch.equal(sa["fitted_noise"][key], sb["fitted_noise"][key])
        for got, want in zip(first.inits + second.inits, full.inits):  # the same noise at every step
            assert torch.equal(got.ssm, want.ssm)
    if refresh is not None:
        ra, rb = sa["fitted_noise_refresh"], sb["fitted_noise_refresh"]
        assert ra["refreshes"] == rb["refreshes"] == 3 and ra["mode"] == refresh
        for key in ("mean_KG", "m2_KG", "windows"):
            assert torch.equal(ra[key], rb[key]), key
        mid = torch.load(tmp_path / "full" / "checkpoints" / "step=000003.ckpt", weights_only=True)
        mid = mid[RUN_META_KEY]["intervention_state"]
        assert mid["fitted_noise_refresh"]["windows"][0, -2] > 0  # saved with a window open
        assert not torch.equal(mid["fitted_noise"]["std_KH"], sa["fitted_noise"]["std_KH"])  # refreshed since
        assert torch.equal(sa["fitted_noise"]["mean_KH"], ra["mean_KG"].float())
        saved = torch.load(tmp_path / "full" / "fitted_noise.pt", weights_only=True)  # the run's final statistics
        assert torch.equal(saved["std_KH"], sa["fitted_noise"]["std_KH"])


@pytest.mark.parametrize("cls", [*dict.fromkeys(KINDS.values()), StatsRefresh, FittedNoiseStats, RecurlenDataModule],
                         ids=lambda cls: cls.__name__)
def test_every_checkpointed_part_has_the_same_two_methods(cls):
    """state_dict() and load_state_dict(state): the ranks a part gathers across are never passed to them."""
    assert issubclass(cls, Stateful)
    save, load = inspect.signature(cls.state_dict), inspect.signature(cls.load_state_dict)
    assert list(save.parameters) == ["self"]
    assert len(load.parameters) == 2 and all(p.kind is p.POSITIONAL_OR_KEYWORD for p in load.parameters.values())


def _tbptt_module():
    from recurlen import Mamba2LM, preset
    from recurlen.training.interventions import InterventionConfig
    from recurlen.training.optim import OptimConfig

    return RecurlenModule(Mamba2LM(preset("nano")), intervention=InterventionConfig(name="tbptt"),
                          optim=OptimConfig(), seed=0, train_seq_len=16, tokenizer="bytes", total_steps=1)


def test_resume_with_other_world_size_warns_and_resets():
    module = _tbptt_module()
    state = module.model.zero_state(8)
    state.ssm.normal_()
    carried = {"state": state.state_dict(), "lanes": torch.arange(8), "world_size": 2}
    ckpt = {RUN_META_KEY: {"intervention_state": {"carried": carried}}}
    with pytest.warns(UserWarning, match="world size 2 but this run has 1; lanes cannot be mapped"):
        module.on_load_checkpoint(ckpt)
    assert module.intervention.carried is None
    carried["world_size"] = 1
    module.on_load_checkpoint(ckpt)
    assert torch.equal(module.intervention.carried.ssm, state.ssm)
    assert torch.equal(module.intervention.carried_lanes, torch.arange(8))


def test_checkpoints_written_before_interventions_owned_their_state_still_resume():
    """The old layout: a hand-built carried dict and the fitted statistics side by side in the run metadata."""
    module = _tbptt_module()
    state = module.model.zero_state(8)
    state.ssm.normal_()
    old = {RUN_META_KEY: {"carried": {"ssm": state.ssm, "conv": state.conv, "lanes": torch.arange(8),
                                      "world_size": 1}, "fitted_noise": None}}
    module.on_load_checkpoint(old)
    assert isinstance(module.intervention.carried, RecurrentState)
    assert torch.equal(module.intervention.carried.ssm, state.ssm)
    saved = {}
    module.on_save_checkpoint(saved)  # and it is written back in today's layout
    assert torch.equal(saved[RUN_META_KEY]["intervention_state"]["carried"]["state"]["ssm"], state.ssm)


class PoisonAt(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.backbone.norm_f.weight.fill_(float("nan"))


def test_nan_loss_stops_with_step_and_keeps_checkpoint(tmp_path, experiment):
    cfg = experiment(tmp_path / "run", *RUN, "trainer.max_steps=6", "trainer.checkpoint_every_n_steps=2")
    step2 = tmp_path / "run" / "checkpoints" / "step=000002.ckpt"
    with pytest.raises(NonFinite, match=r"non-finite training loss \(nan\) at global step 3; .*the steps before 3 "
                       rf"were healthy; the newest checkpoint from before it is {step2} \(step 2\): resume from it "
                       r"with a lower rate \(optim.lr=0.00025 instead of 0.001\)"):
        run_finetune(cfg, callbacks=[PoisonAt(3)])
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())


def test_rank_summary_and_tensorboard_scalars(tmp_path, experiment):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = experiment(tmp_path / "run", *RUN, "intervention=state_passing")
    run_dir = run_finetune(cfg)
    summary = json.loads((run_dir / "ranks" / "rank0.json").read_text())
    assert summary["lanes"] == [0, 1, 2, 3] and summary["global_step"] == 4
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/final_state_rms",
            "val/loss"} <= tags
    lrs = [e.value for e in acc.Scalars("train/lr")]
    assert lrs[0] == pytest.approx(1e-3)  # one warmup step, then cosine down
    assert lrs[-1] < lrs[0]


def test_under_fsdp_the_wrapped_module_clips_the_gradient_norm():
    """Lightning's FSDP precision plugin refuses norm clipping: the Trainer gets no clip value under FSDP and the
    module clips through FSDP's own clip_grad_norm_ (global over the shards), with optim.grad_clip."""
    from types import SimpleNamespace

    from recurlen.training.finetune import _is_fsdp
    from recurlen.training.lit_module import RecurlenModule

    calls = []
    wrapped = SimpleNamespace(clip_grad_norm_=lambda max_norm: calls.append(max_norm))
    module = SimpleNamespace(optim_cfg=SimpleNamespace(grad_clip=0.7),
                             trainer=SimpleNamespace(strategy=SimpleNamespace(model=wrapped)))
    RecurlenModule.configure_gradient_clipping(module, optimizer=None, gradient_clip_val=None)
    assert calls == [0.7]
    assert _is_fsdp("fsdp") and _is_fsdp("fsdp_cpu_offload") and not _is_fsdp("ddp") and not _is_fsdp("auto")
