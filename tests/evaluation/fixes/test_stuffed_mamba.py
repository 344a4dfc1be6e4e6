"""The `stuffed_mamba` fix: Stuffed Mamba's multipliers and state norm cap on Mamba-2 (the knobs themselves:
tests/models/mamba2/test_stuffed_knobs.py). Identity at its defaults (also scored by `recurlen eval`, with the
padded head and without), what each multiplier does, the cap's calibration at T, the search, refusals."""

from __future__ import annotations

import copy

import pytest
import torch

from recurlen.commands.report import write_report
from recurlen.evaluation.fixes import get
from recurlen.evaluation.fixes.calibration import calibration_loss
from recurlen.evaluation.fixes.stuffed_mamba import state_norms_at
from recurlen.evaluation.runner import EvalConfig, run_eval
from recurlen.models import registry, timescales
from recurlen.util.errors import UserError
from tests.evaluation.fixes.test_fixes import T, calibration, slow_model  # noqa: F401 (fixtures)

FIX = get("stuffed_mamba")


def _apply(model, settings, rows=None):
    return FIX.apply(model, FIX.make_config(settings), calibration=rows, train_len=T)


def _ids(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 200, (2, length), generator=torch.Generator().manual_seed(seed))


def test_at_its_defaults_the_fix_is_the_model_as_trained(nano_model):
    model = nano_model("mamba2")
    ids = _ids(40, 1)
    with torch.no_grad():
        want, want_state = model(ids)
        record = _apply(model, {"dt_mult": 1.0, "da_mult": 1.0, "b_mult": 1.0, "a_mult": 1.0})
        got, got_state = model(ids)
    assert torch.equal(got, want) and torch.equal(got_state.ssm, want_state.ssm)
    assert record.values["multipliers"] == {"dt_mult": 1.0, "da_mult": 1.0, "b_mult": 1.0, "a_mult": 1.0}
    assert record.calibration is None and record.calibrated_parameters == 0 and record.values["folded_into"] is None


def test_each_multiplier_is_one_value_on_every_layer(nano_model):
    model = nano_model("mamba2")
    _apply(model, {"dt_mult": 0.5, "da_mult": 0.99, "b_mult": 0.7})
    for mixer in timescales.mixers(model):
        assert (float(mixer.dt_scale), float(mixer.decay_scale), float(mixer.B_scale)) == \
            pytest.approx((0.5, 0.99, 0.7), rel=1e-7)
        assert mixer.A_scale is None and mixer.state_norm_max is None


def test_b_mult_doubles_the_first_layers_state_from_zero_and_da_mult_halves_its_decay(nano_model):
    """After one token the first layer's state is decay x h0 + its input (that layer's input is the embedding, which
    no multiplier moves): b_mult 2 doubles the input (from h0 = 0), da_mult 0.5 halves the decayed h0."""
    base = nano_model("mamba2")
    ids = _ids(1, 2)
    zero = base.zero_state(2)
    h0 = copy.deepcopy(zero)
    h0.ssm.normal_(generator=torch.Generator().manual_seed(3))

    def first_layer(model, state):
        with torch.no_grad():
            return model(ids, state)[1].ssm[0]

    doubled, halved = copy.deepcopy(base), copy.deepcopy(base)
    _apply(doubled, {"b_mult": 2.0})
    _apply(halved, {"da_mult": 0.5})
    inp = first_layer(base, zero)
    assert inp.abs().max() > 1e-3
    torch.testing.assert_close(first_layer(doubled, zero), 2 * inp, rtol=1e-6, atol=0)
    kept = first_layer(base, h0) - inp
    torch.testing.assert_close(first_layer(halved, h0) - first_layer(halved, zero), 0.5 * kept, rtol=1e-5, atol=1e-6)


def test_a_mult_is_folded_into_A_log(nano_model):
    model = nano_model("mamba2")
    ids = _ids(40, 4)
    scaled = copy.deepcopy(model)
    timescales.set_scales(scaled, "A", torch.full((2,), 3.0))
    record = _apply(model, {"a_mult": 3.0})
    assert record.values["folded_into"] == "A_log" and all(m.A_scale is None for m in timescales.mixers(model))
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[0], scaled(ids)[0], atol=2e-5, rtol=1e-5)


def test_the_state_norm_cap_is_each_heads_norm_at_T_times_the_setting(slow_model, calibration):  # noqa: F811
    model = copy.deepcopy(slow_model)
    record = _apply(model, {"state_norm": 1.5, "b_mult": 0.8, "chunk_len": 512}, calibration)
    with torch.no_grad():
        measured = copy.deepcopy(slow_model)
        timescales.set_scales(measured, "B", torch.full((2,), 0.8))
        norms_KH = state_norms_at(measured, calibration, position=T, chunk_len=7)  # another chunking, the same state
    caps = torch.stack([m.state_norm_max for m in timescales.mixers(model)])
    torch.testing.assert_close(caps, 1.5 * norms_KH, rtol=1e-5, atol=0)
    assert record.values["state_norm_caps"] == [[float(v) for v in c] for c in caps]
    assert record.calibration["method"] == "state norms at T" and record.calibration["forward_passes"] == 1
    assert record.calibrated_parameters == caps.numel()
    with torch.no_grad():  # past T the state of the uncapped model grows beyond the cap; the capped one's does not
        free = torch.linalg.vector_norm(measured(calibration[:2])[1].ssm, dim=(-2, -1)).amax(1)
        capped = torch.linalg.vector_norm(model(calibration[:2])[1].ssm, dim=(-2, -1)).amax(1)
    assert (free > caps * 1.01).any() and (capped <= caps * (1 + 1e-5)).all()


@pytest.mark.parametrize(("settings", "passes"), [({"search": "da_mult"}, 6),
                                                  ({"search": "state_norm", "grid": [1.0, 2.0]}, 4)])
def test_the_search_lowers_the_calibration_loss_of_a_model_that_fails(slow_model, calibration,  # noqa: F811
                                                                      settings, passes):
    model = copy.deepcopy(slow_model)
    with torch.no_grad():
        before = float(calibration_loss(model, calibration, chunk_len=512, batch_size=4))
    record = _apply(model, {**settings, "chunk_len": 512}, calibration)
    with torch.no_grad():
        after = float(calibration_loss(model, calibration, chunk_len=512, batch_size=4))
    cal = record.calibration
    assert cal["loss_before"] == pytest.approx(before, abs=1e-6)
    assert after == pytest.approx(cal["loss_after"], abs=1e-5) and after < before - 0.01
    chosen = record.values["state_norm"] if settings["search"] == "state_norm" else \
        record.values["multipliers"][settings["search"]]
    assert chosen in cal["grid"] and cal["searched"] == settings["search"] and len(cal["losses"]) == len(cal["grid"])
    assert cal["forward_passes"] == passes and cal["seconds"] > 0 and record.calibrated_parameters >= 1


def test_a_grid_that_does_not_help_keeps_the_given_value(slow_model, calibration):  # noqa: F811
    model = copy.deepcopy(slow_model)
    record = _apply(model, {"search": "b_mult", "grid": [30.0], "chunk_len": 512}, calibration)
    assert record.values["multipliers"]["b_mult"] == 1.0 and record.calibration["loss_after"] == \
        record.calibration["loss_before"]
    assert all(m.B_scale is None for m in timescales.mixers(model))


@pytest.mark.parametrize("arch", [a for a, spec in registry.architectures().items()
                                  if not get("stuffed_mamba").applies_to(spec)])
def test_other_architectures_are_refused_by_name(nano_model, arch):
    with pytest.raises(UserError, match=rf"^fix stuffed_mamba does not apply to .* \({arch}\): it scales "
                                        r"dt/A/B/decay/state_norm of each layer, which only \[.*'mamba2'.*\] offer$"):
        _apply(nano_model(arch), {"b_mult": 0.5})


@pytest.mark.parametrize(("settings", "bad"), [
    ({"b_mult": "nan"}, r"fix.stuffed_mamba.b_mult must be a finite number; got nan"),
    ({"dt_mult": "inf"}, r"fix.stuffed_mamba.dt_mult must be a finite number; got inf"),
    ({"da_mult": 0}, r"da_mult must be > 0 \(1: unchanged\); got 0.0"),
    ({"a_mult": -2}, r"a_mult must be > 0 \(1: unchanged\); got -2.0"),
    ({"state_norm": 0}, r"state_norm must be > 0 or None; got 0.0"),
    ({"search": "c_mult"}, r"search must be one of \['dt_mult', 'da_mult', 'b_mult', 'a_mult', 'state_norm'\]"),
    ({"grid": [0.5]}, r"grid is tried only for a `search`"),
    ({"search": "b_mult", "grid": [0.5, 0]}, r"the grid's values must be > 0"),
])
def test_bad_settings_are_refused_in_one_line(settings, bad):
    with pytest.raises(UserError, match=f"^fix stuffed_mamba: {bad}") as err:
        FIX.make_config(settings)
    assert "\n" not in str(err.value)


def test_a_cap_needs_calibration_sequences_as_long_as_T(nano_model):
    seqs = _ids(10, 5)
    with pytest.raises(UserError, match=r"state_norm measures each head's norm at T = 16 tokens; the calibration "
                                        r"sequences have 10 \(set fix.stuffed_mamba.length >= 16\)"):
        FIX.apply(nano_model("mamba2"), FIX.make_config({"state_norm": 1.0, "sequences": 2}), calibration=seqs,
                  train_len=16)


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory, nano_model) -> str:
    path = tmp_path_factory.mktemp("ckpt") / "base"
    nano_model(seed=0).save_pretrained(str(path))
    return str(path)


@pytest.mark.parametrize("padded", [False, True])
def test_eval_scores_the_fix_at_its_defaults_exactly_like_its_base(base_checkpoint, tmp_path, padded):
    seqs = torch.randint(0, 257, (3, 256), generator=torch.Generator().manual_seed(5))
    cfg = EvalConfig(checkpoints=[f"base={base_checkpoint}"], output_dir=str(tmp_path / "eval"), train_len=32,
                     seq_len=256, num_sequences=2, chunk_len=128, batch_size=2, log_bins=0,
                     tasks=["positionwise", "reset"], device="cpu", progress=False, padded_vocab=padded,
                     fixes=["stuffed_mamba", "cap=stuffed_mamba"],
                     fix={"stuffed_mamba": {}, "cap": {"state_norm": 2.0, "da_mult": 0.99, "sequences": 1}})
    base, fixed, capped = run_eval(cfg, seqs)["runs"]
    assert fixed["label"] == "base+stuffed_mamba" and capped["label"] == "base+cap"
    for key in ("bins", "per_sequence"):
        assert fixed["positionwise"][key] == base["positionwise"][key]
    assert capped["positionwise"]["per_sequence"] != base["positionwise"]["per_sequence"]
    report = write_report([tmp_path / "eval"], out_dir=tmp_path / "report").read_text()
    assert "dt_mult 1, da_mult 0.99, b_mult 1, a_mult 1, state norm capped at 2 x its norm at T; state norms at T " \
           "measured (1 x 32 tokens), no search" in report
    assert "- base+stuffed_mamba: Stuffed Mamba (Chen et al., COLM 2025" in report
