"""The resume decision: which checkpoint (damaged ones moved aside), which settings may change, resume=never /
archive, what config.yaml and config_history.yaml record, and non-finite values stopped before they are saved."""

import logging
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from recurlen.training.experiments.compose import resolved_config
from recurlen.training.fault_injection import InjectNonFinite
from recurlen.training.finetune import build_model, build_trainer, check_devices, run_finetune
from recurlen.training.resume import (
    Damaged,
    config_differences,
    decide,
    kind_of,
    move_aside,
    record,
    validate_checkpoint,
)
from recurlen.training.run_dir import RUN_META_KEY, RunDir
from recurlen.util.errors import NonFinite, UserError
from recurlen.util.faults import FAULT_ENV

RUN = ("intervention=state_passing", "data.batch_size=2", "data.val_segments=4", "data.max_documents=40",
       "trainer.max_steps=4", "trainer.checkpoint_every_n_steps=2", "optim.warmup_steps=0", "optim.schedule=constant")
"""This module's run, on top of conftest's tiny one: 4 steps of state passing, a checkpoint every 2, a constant rate
(stopping at step 2 does not change the rates of the steps before)."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory, experiment):
    """A finished 4-step run: step=000002.ckpt, step=000004.ckpt and last.ckpt (step 4)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    run_finetune(experiment(out, *RUN))
    return out


@pytest.fixture
def run_copy(tmp_path, trained):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    ckpts = out / "checkpoints"
    now = time.time()
    for i, name in enumerate(["step=000002.ckpt", "step=000004.ckpt", "last.ckpt"]):  # copytree kept equal mtimes
        os.utime(ckpts / name, (now + i, now + i))
    return out


def model_of(cfg):
    return build_model(cfg)


# ------------------------------------------------------------------------------------------- config comparison


def test_settings_are_fixed_changeable_or_ignored():
    for key in ("model.name", "model.arch.d_model", "intervention.name", "intervention.reset_prob", "data.batch_size",
                "data.seq_len", "data.source", "data.layout", "seed", "trainer.accumulate_grad_batches",
                "task.copying.length", "some.unknown.key"):
        assert kind_of(key) == "fixed", key
    for key in ("optim.lr", "optim.schedule", "trainer.max_steps", "trainer.checkpoint_every_n_steps",
                "diagnostics.effrem", "data.val_sequences", "data.cache_dir", "trainer.devices", "task.lengths",
                "task.copying.seeds", "model.backend"):
        assert kind_of(key) == "changeable", key
    assert kind_of("run_dir") == kind_of("resume") == "ignored"


def test_config_differences_split_by_kind():
    old = {"run_dir": "a", "model": {"name": "nano", "arch": {}}, "optim": {"lr": 1e-3, "betas": [0.9, 0.95]},
           "data": {"batch_size": 2}, "trainer": {"max_steps": 4}}
    new = {"run_dir": "b", "model": {"name": "nano", "arch": {"d_model": 32}}, "optim": {"lr": 5e-4,
           "betas": [0.9, 0.95]}, "data": {"batch_size": 4}, "trainer": {"max_steps": 8, "added_later": 1}}
    fixed, changeable = config_differences(old, new)
    assert [str(d) for d in fixed] == ["data.batch_size 2 -> 4", "model.arch {} -> {'d_model': 32}"]
    assert [str(d) for d in changeable] == ["optim.lr 0.001 -> 0.0005", "trainer.max_steps 4 -> 8"]
    assert config_differences(old, old) == ([], [])


# ------------------------------------------------------------------------------------------ checkpoint validation


def _damage(path, how):
    """Damage a checkpoint in place, keeping its time stamp (it stays the newest)."""
    stamp = path.stat().st_mtime
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "bit-flip":  # one bit in the middle of the tensor data: torch.load alone does not notice
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(flipped))
    os.utime(path, (stamp, stamp))


@pytest.mark.parametrize(("how", "why"), [("truncated", "not a complete checkpoint file"), ("empty", "is empty"),
                                          ("bit-flip", "fails its checksum")])
def test_damaged_checkpoints_are_found(run_copy, how, why):
    last = RunDir(run_copy).last_checkpoint
    validate_checkpoint(last)  # intact before
    _damage(last, how)
    with pytest.raises(Damaged, match=why):
        validate_checkpoint(last)


def test_foreign_and_non_finite_checkpoints_are_not_resumed_from(run_copy):
    path = run_copy / "checkpoints" / "foreign.ckpt"
    torch.save({"state_dict": {}}, path)
    with pytest.raises(Damaged, match=r"lacks \['global_step'"):
        validate_checkpoint(path)
    ckpt = torch.load(RunDir(run_copy).last_checkpoint, weights_only=True)
    ckpt["state_dict"]["model.backbone.norm_f.weight"][0] = float("nan")
    torch.save(ckpt, path)
    with pytest.raises(Damaged, match=r"non-finite weights \(model.backbone.norm_f.weight\)"):
        validate_checkpoint(path)


def test_a_damaged_last_ckpt_is_moved_aside_and_the_newest_intact_one_used(run_copy, experiment, caplog):
    cfg = experiment(run_copy, *RUN, "trainer.max_steps=6")
    run = RunDir(run_copy)
    _damage(run.last_checkpoint, "bit-flip")
    with caplog.at_level(logging.WARNING, logger="recurlen.training.resume"):
        decision = decide(run, "auto", resolved_config(cfg), model_of(cfg), max_steps=6)
    assert decision.checkpoint == str(run.checkpoints / "step=000004.ckpt") and decision.step == 4
    assert not run.last_checkpoint.exists() and (run.checkpoints / "last.ckpt.damaged").is_file()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "last.ckpt fails its checksum" in warnings[0] and "last.ckpt.damaged" in warnings[0]
    assert decision.moved_aside == [str(run.checkpoints / "last.ckpt.damaged")]
    # A non-zero rank reaches the same choice without moving anything.
    _damage(run.checkpoints / "step=000004.ckpt", "truncated")
    decision = decide(run, "auto", resolved_config(cfg), model_of(cfg), max_steps=6, rank=1)
    assert decision.step == 2 and (run.checkpoints / "step=000004.ckpt").is_file()


def test_no_intact_checkpoint_is_one_clear_error_and_stays_one(run_copy, experiment):
    cfg = experiment(run_copy, *RUN)
    run = RunDir(run_copy)
    for path in run.checkpoint_candidates():
        _damage(path, "truncated")
    for _ in range(2):  # the second time the damaged files are already aside: still no silent fresh start
        with pytest.raises(UserError, match=r"no intact checkpoint left in .*last.ckpt.*damaged.*resume=archive"):
            decide(run, "auto", resolved_config(cfg), model_of(cfg), max_steps=4)
    assert sorted(p.name for p in run.checkpoints.iterdir()) == [
        "last.ckpt.damaged", "step=000002.ckpt.damaged", "step=000004.ckpt.damaged"]


def test_an_explicit_damaged_checkpoint_is_an_error_not_moved(run_copy, experiment):
    cfg = experiment(run_copy, *RUN)
    path = run_copy / "checkpoints" / "step=000002.ckpt"
    _damage(path, "empty")
    with pytest.raises(UserError, match=r"resume=.*step=000002.ckpt is empty"):
        decide(RunDir(run_copy), str(path), resolved_config(cfg), model_of(cfg), max_steps=4)
    assert path.is_file()


def test_move_aside_never_overwrites(tmp_path):
    for _ in range(3):
        (tmp_path / "last.ckpt").write_text("x")
        move_aside(tmp_path / "last.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt.damaged", "last.ckpt.damaged-1",
                                                          "last.ckpt.damaged-2"]


# ------------------------------------------------------------------------------------------------ honest resume


@pytest.mark.parametrize("override", ["data.batch_size=4", "intervention=fitted_noise", "intervention.reset_prob=0.5",
                                      "data.seq_len=32", "seed=1"])
def test_a_changed_fixed_setting_is_refused_naming_it(run_copy, experiment, override):
    cfg = experiment(run_copy, *RUN, override)
    before = (run_copy / "config.yaml").read_text()
    with pytest.raises(UserError, match=r"fixed settings differ .*" + override.split("=")[0].split(".")[0]
                       + r".* -> .*another run_dir or add resume=archive"):
        decide(RunDir(run_copy), "auto", resolved_config(cfg), model_of(cfg), max_steps=4)
    assert (run_copy / "config.yaml").read_text() == before


def test_another_model_is_refused_by_the_model_check(run_copy, experiment):
    cfg = experiment(run_copy, *RUN, "model=tiny")
    with pytest.raises(UserError, match=r"holds another model \(d_model 64 -> 128.*another run_dir"):
        decide(RunDir(run_copy), "auto", resolved_config(cfg), model_of(cfg), max_steps=4)


def test_changed_settings_are_applied_logged_and_recorded(run_copy, experiment, caplog):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = experiment(run_copy, *RUN, "trainer.max_steps=6", "optim.lr=5e-4")
    with caplog.at_level(logging.INFO, logger="recurlen.training.resume"):
        run_finetune(cfg)
    notice = [r.getMessage() for r in caplog.records if "changed settings" in r.getMessage()]
    assert len(notice) == 1 and "optim.lr 0.001 -> 0.0005; trainer.max_steps 4 -> 6" in notice[0]
    assert torch.load(RunDir(run_copy).last_checkpoint, weights_only=True)["global_step"] == 6
    acc = EventAccumulator(str(run_copy / "tb"))
    acc.Reload()
    lrs = {e.step: e.value for e in acc.Scalars("train/lr")}
    assert lrs[3] == pytest.approx(1e-3) and lrs[4] == pytest.approx(5e-4) and lrs[5] == pytest.approx(5e-4)
    assert OmegaConf.load(run_copy / "config.yaml").optim.lr == 5e-4
    history = OmegaConf.to_container(OmegaConf.load(run_copy / "config_history.yaml"))
    assert [h["event"] for h in history] == ["start", "resume"]
    assert history[1]["step"] == 4 and history[1]["changed"] == {
        "optim.lr": {"from": 1e-3, "to": 5e-4}, "trainer.max_steps": {"from": 4, "to": 6}}


def test_a_finished_run_trains_nothing_and_records_nothing(run_copy, experiment, caplog):
    before = (run_copy / "config.yaml").read_text(), (run_copy / "checkpoints" / "last.ckpt").read_bytes()
    with caplog.at_level(logging.INFO, logger="recurlen.training.resume"):
        run_finetune(experiment(run_copy, *RUN, "optim.lr=3e-3"))
    assert any("nothing to train (changed settings not applied: optim.lr 0.001 -> 0.003)" in r.getMessage()
               for r in caplog.records)
    assert ((run_copy / "config.yaml").read_text(), (run_copy / "checkpoints" / "last.ckpt").read_bytes()) == before


def test_resume_never_refuses_a_used_run_dir_and_archive_moves_it(run_copy, experiment):
    run = RunDir(run_copy)
    (run_copy / "notes.txt").write_text("mine")
    cfg = experiment(run_copy, *RUN, "resume=never")
    with pytest.raises(UserError, match=r"resume=never but .* already holds a run \(config.yaml, .*checkpoints.*"
                                        r"resume=archive"):
        decide(run, "never", resolved_config(cfg), model_of(cfg), max_steps=4)
    cfg = experiment(run_copy, *RUN, "resume=archive", "data.batch_size=4")  # a new run may change anything
    decision = decide(run, "archive", resolved_config(cfg), model_of(cfg), max_steps=4)
    assert decision.checkpoint is None and decision.archived_to
    archived = sorted(p.name for p in (run.archive).iterdir())
    assert len(archived) == 1
    moved = run.archive / archived[0]
    assert (moved / "checkpoints" / "last.ckpt").is_file() and (moved / "config.yaml").is_file()
    assert sorted(p.name for p in run_copy.iterdir()) == ["archive", "notes.txt"]  # other files stay
    record(run, resolved_config(cfg), decision)
    history = OmegaConf.to_container(OmegaConf.load(run.history_file))
    assert history[0]["event"] == "start" and history[0]["archived_earlier_run_to"] == str(moved)
    assert OmegaConf.load(run.config_file).data.batch_size == 4


# ------------------------------------------------------------------------------------------------ non-finite values


@pytest.mark.parametrize(("what", "message"), [
    ("grad", r"non-finite gradient of backbone.layers.0.\S+ \(layer 0\) at global step 3"),
    ("state", r"non-finite carried state \(ssm of layer 0\) at global step 3"),
    ("loss", r"non-finite training loss \(nan\) at global step 3")])
def test_nan_stops_before_it_is_saved_and_the_advice_works(tmp_path, experiment, monkeypatch, what, message):
    run = RunDir(tmp_path / "run")
    monkeypatch.setenv(FAULT_ENV, f"point=step,step=3,action=nan,what={what}")
    step2 = run.checkpoints / "step=000002.ckpt"
    with pytest.raises(NonFinite, match=message + f".*the newest checkpoint from before it is {step2} "
                                                  r"\(step 2\).*optim.lr=0.00025") as err:
        run_finetune(experiment(run.path, *RUN, "trainer.max_steps=6"))
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["last.ckpt", "step=000002.ckpt"]
    assert torch.load(run.last_checkpoint, weights_only=True)["global_step"] == 2
    monkeypatch.delenv(FAULT_ENV)
    assert err.value.overrides == ("optim.lr=0.00025", f"resume={step2}")
    run_finetune(experiment(run.path, *RUN, "trainer.max_steps=6", *err.value.overrides))  # the advice
    ckpt = torch.load(run.last_checkpoint, weights_only=True)
    assert ckpt["global_step"] == 6 and all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
    assert OmegaConf.load(run.config_file).optim.lr == 2.5e-4



@pytest.mark.parametrize("head_loss", ["plain", "chunked"])
def test_a_loss_fault_reaches_the_loss_on_either_head_loss_path(tmp_path, experiment, monkeypatch, head_loss):
    """what=loss makes the step's loss non-finite whether the head makes the logits or the chunked loss never does."""
    monkeypatch.setenv(FAULT_ENV, "point=step,step=1,action=nan,what=loss")
    with pytest.raises(NonFinite, match=r"non-finite training loss \(nan\) at global step 1"):
        run_finetune(experiment(tmp_path / "run", *RUN, f"trainer.head_loss={head_loss}"))

def test_the_fault_hooks_are_there_only_when_a_fault_is_asked_for(tmp_path, experiment, monkeypatch):
    cfg = experiment(tmp_path / "run", *RUN)
    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)

    def injectors():
        return [c for c in build_trainer(cfg, RunDir(cfg.resolved_run_dir), []).callbacks
                if isinstance(c, InjectNonFinite)]

    assert injectors() == []
    monkeypatch.setenv(FAULT_ENV, "point=middle,file=last.ckpt,action=kill")  # a write fault: no training hooks
    assert injectors() == []
    monkeypatch.setenv(FAULT_ENV, "point=step,step=7,action=nan,what=grad,rank=1")  # another rank's fault
    assert injectors() == []
    monkeypatch.setenv(FAULT_ENV, "point=step,step=7,action=nan,what=grad")
    [fault] = injectors()
    assert (fault.step, fault.what) == (7, "grad")


def test_non_finite_weights_are_never_written(tmp_path, experiment, monkeypatch):
    """A weight that goes non-finite after an update (here: made so) stops the checkpoint that would hold it."""
    run = RunDir(tmp_path / "run")
    monkeypatch.setenv(FAULT_ENV, "point=step,step=1,action=nan,what=weight")
    with pytest.raises(NonFinite, match=r"non-finite weights in backbone.embedding.weight .*refused to write"):
        run_finetune(experiment(run.path, *RUN))
    assert not run.checkpoints.exists() or not list(run.checkpoints.glob("*.ckpt"))


def test_fitted_noise_file_of_another_model_or_damaged_is_one_line(tmp_path, experiment):
    from recurlen.training.interventions import FittedNoiseStats

    bad = tmp_path / "noise.pt"
    FittedNoiseStats(torch.zeros(3, 8), torch.ones(3, 8)).save(str(bad))
    cfg = experiment(tmp_path / "run", *RUN, "intervention=fitted_noise", f"intervention.fit_stats={bad}")
    with pytest.raises(UserError, match=rf"intervention.fit_stats={bad}: fitted-noise mean has shape \(3, 8\); this "
                                        r"model needs \(2, 8\).*recurlen fit-noise"):
        run_finetune(cfg)
    bad.write_bytes(bad.read_bytes()[:100])
    with pytest.raises(UserError, match=rf"{bad} cannot be loaded: it is damaged or truncated"):
        run_finetune(cfg)
    torch.save({"mean": torch.zeros(2)}, bad)
    with pytest.raises(UserError, match=rf"{bad} is not a fitted-noise statistics file"):
        run_finetune(cfg)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_devices_this_machine_lacks_are_one_line_errors():
    from recurlen.training.experiments.schema import TrainerSection

    with pytest.raises(ValueError, match=r"trainer.devices='0' is not allowed"):
        TrainerSection(devices="0")
    TrainerSection(devices="0,1")
    TrainerSection(devices="2")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(UserError, match="trainer.accelerator=gpu but this machine has no usable CUDA GPU"):
        check_devices(TrainerSection(accelerator="gpu", devices="1"))


def test_a_checkpoint_written_now_has_every_key_validation_asks_for(trained):
    ckpt = validate_checkpoint(RunDir(trained).last_checkpoint)
    assert ckpt[RUN_META_KEY]["intervention"] == "state_passing"


def test_a_copied_run_resumes_from_its_furthest_checkpoint_whatever_the_file_times(run_copy, experiment):
    """cp -r / a restore gives every file the copy's time; the step each holds decides."""
    cfg = experiment(run_copy, *RUN, "trainer.max_steps=6")
    run = RunDir(run_copy)
    now = time.time()
    for i, name in enumerate(["last.ckpt", "step=000004.ckpt", "step=000002.ckpt"]):  # the oldest looks newest
        os.utime(run.checkpoints / name, (now + i, now + i))
    decision = decide(run, "auto", resolved_config(cfg), model_of(cfg), max_steps=6)
    assert decision.step == 4 and Path(decision.checkpoint).name in ("last.ckpt", "step=000004.ckpt")


def test_a_roll_back_archives_the_later_checkpoints_so_the_next_resume_stays_on_the_new_line(run_copy, experiment,
                                                                                           caplog):
    cfg = experiment(run_copy, *RUN, "trainer.max_steps=6")
    run = RunDir(run_copy)
    older = run.checkpoints / "step=000002.ckpt"
    with caplog.at_level(logging.INFO, logger="recurlen.training.resume"):
        decision = decide(run, str(older), resolved_config(cfg), model_of(cfg), max_steps=6)
    assert decision.step == 2 and decision.archived_to
    archived = Path(decision.archived_to)
    assert archived.parent == run.archive and archived.name.startswith("rollback-")
    assert sorted(p.name for p in archived.iterdir()) == ["last.ckpt", "step=000004.ckpt"]  # moved, not deleted
    assert [p.name for p in run.checkpoint_candidates()] == ["step=000002.ckpt"]
    assert any("rolled back to step=000002.ckpt" in r.getMessage() for r in caplog.records)
    record(run, resolved_config(cfg), decision)
    assert "rolled_back_later_checkpoints_to" in run.history_file.read_text()
