"""The A knob on the architectures whose decay is per channel or per head and that have no dt (GLA, RWKV-6, Gated
DeltaNet, RWKV-7): a scale of each token's log decay, the model as trained without it or at 1, the chunked forward
equal to the step under it, folded exactly where the decay's rate is a parameter in log space (RWKV-6's time_decay,
Gated DeltaNet's A_log), refused in one line by the writers where it is not, and the fixes (a_scale, forget_more)
running through the registry. That the scan and the step receive exactly s times the log decay, and on which side
of a clamp, each architecture's folder checks (tests/models/<arch>/test_<arch>_scaled_decay.py)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from recurlen.evaluation.fixes import FIXES, get
from recurlen.evaluation.fixes.calibration import calibration_loss
from recurlen.evaluation.fixes.forget_more import entry_rates
from recurlen.models import registry, timescales
from recurlen.util.errors import UserError

DECAY_ONLY = [n for n, a in registry.architectures().items()
              if "A" in timescales.knobs(a.model_cls) and "dt" not in timescales.knobs(a.model_cls)]
FOLDS = [n for n in DECAY_ONLY if "A_log" in timescales.knobs(registry.get(n).model_cls)]


def _ids(seed: int, length: int = 40) -> torch.Tensor:
    return torch.randint(0, 200, (2, length), generator=torch.Generator().manual_seed(seed))


def test_each_architecture_with_the_knob_checks_its_scan_in_its_own_folder():
    """Where the scan receives the log decay is each architecture's own: tests/models/<arch>/ checks it."""
    assert DECAY_ONLY and FOLDS and set(FOLDS) < set(DECAY_ONLY)  # some fold, some cannot
    tests = Path(__file__).resolve().parents[2] / "models"
    for arch in DECAY_ONLY:
        assert (tests / arch / f"test_{arch}_scaled_decay.py").is_file(), arch


@pytest.mark.parametrize("arch", DECAY_ONLY)
def test_no_scale_and_a_scale_of_one_are_the_model_as_trained(nano_model, arch):
    model = nano_model(arch)
    ids = _ids(1)
    with torch.no_grad():
        want, want_state = model(ids)
        want_step, want_next = model.step(ids[:, 0], want_state)
        for scales in (torch.ones(len(timescales.mixers(model))), None):
            timescales.set_scales(model, "A", scales)
            got, state = model(ids)
            got_step, got_next = model.step(ids[:, 0], state)
            assert torch.equal(got, want) and torch.equal(got_step, want_step)
            for name, part in want_state.parts().items():
                assert torch.equal(state.parts()[name], part), name
                assert torch.equal(got_next.parts()[name], want_next.parts()[name]), name


@pytest.mark.parametrize("arch", FOLDS)
def test_decay_rates_are_scaled_by_s(nano_model, arch):
    model = nano_model(arch)
    with torch.no_grad():
        plain = [m.decay_rates() for m in timescales.mixers(model)]
        timescales.set_scales(model, "A", torch.tensor([0.5, 2.0]))
        for mixer, rates, s in zip(timescales.mixers(model), plain, (0.5, 2.0)):
            assert rates.shape == model.zero_state(1).parts()[model.state_cls.RECURRENT[0]].shape[2:]
            assert torch.equal(mixer.decay_rates(), rates * s)


@pytest.mark.parametrize("arch", DECAY_ONLY)
def test_the_chunked_forward_equals_the_step_at_a_scale(nano_model, arch, step_by_step):
    model = nano_model(arch)
    timescales.set_scales(model, "A", torch.full((len(timescales.mixers(model)),), 0.5))
    ids = _ids(4, 24)
    with torch.no_grad():
        whole, final = model(ids)
        unscaled, _ = nano_model(arch)(ids)
    stepped, stepped_final = step_by_step(model, ids, None)
    assert (whole - unscaled).abs().max() > 1e-3  # the scale reached the model
    torch.testing.assert_close(stepped, whole, atol=1e-5, rtol=0)
    part = model.state_cls.RECURRENT[0]
    torch.testing.assert_close(getattr(stepped_final, part), getattr(final, part), atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", FOLDS)
def test_an_A_scale_folds_exactly_into_the_log_rate(nano_model, arch):
    """In float64: the fold moves log s into the log-rate parameter, where the scaled model multiplies by s."""
    model = nano_model(arch).double()
    ids = _ids(5)
    rates = [timescales.log_rate(m).detach().clone() for m in timescales.mixers(model)]
    timescales.set_scales(model, "A", torch.tensor([0.5, 4.0], dtype=torch.float64))
    with torch.no_grad():
        scaled, scaled_state = model(ids)
        assert timescales.fold_A_scales(model)
        folded, folded_state = model(ids)
    assert all(m.A_scale is None for m in timescales.mixers(model))
    for mixer, before, s in zip(timescales.mixers(model), rates, (0.5, 4.0)):
        torch.testing.assert_close(timescales.log_rate(mixer).detach(), before + math.log(s), atol=1e-12, rtol=0)
    torch.testing.assert_close(folded, scaled, atol=1e-6, rtol=0)
    part = model.state_cls.RECURRENT[0]
    torch.testing.assert_close(getattr(folded_state, part), getattr(scaled_state, part), atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", [n for n in DECAY_ONLY if n not in FOLDS])
def test_writing_an_A_scale_without_a_log_rate_is_refused_in_one_line(nano_model, arch, tmp_path):
    model = nano_model(arch)
    timescales.set_scales(model, "A", torch.tensor([1.0, 2.0]))
    with pytest.raises(UserError) as err:
        model.save_pretrained(str(tmp_path / "m"))
    line = str(err.value)
    assert "\n" not in line and "has its A scaled per layer (a_scale)" in line and "no A_log to fold it into" in line
    assert not (tmp_path / "m").exists()
    assert not timescales.fold_A_scales(model) and float(timescales.mixers(model)[1].A_scale) == 2.0


@pytest.mark.parametrize("arch", DECAY_ONLY)
def test_a_scale_applies_through_the_registry_and_calibrates(nano_model, arch):
    """Two SPSA steps on held-out rows: the fix keeps the lowest calibration loss it measured and leaves the model
    at it (folded into the log rate where there is one, on the loaded model where not)."""
    assert FIXES["a_scale"].applies_to(registry.get(arch))
    model = nano_model(arch)
    data = torch.randint(0, 200, (2, 65), generator=torch.Generator().manual_seed(6))
    fix = get("a_scale")
    record = fix.apply(model, fix.make_config({"steps": 2, "sequences": 2, "chunk_len": 32}), calibration=data,
                       train_len=16)
    assert len(record.values["scales"]) == 2 and record.calibration["steps"] == 2
    assert record.calibration["loss_after"] <= record.calibration["loss_before"]
    with torch.no_grad():
        now = float(calibration_loss(model, data, chunk_len=32, batch_size=2))
    assert now == pytest.approx(record.calibration["loss_after"], abs=1e-5)
    folds = arch in FOLDS
    assert record.values["folded_into"] == ("A_log" if folds else None)
    kept = [None if m.A_scale is None else float(m.A_scale) for m in timescales.mixers(model)]
    assert kept == ([None, None] if folds else pytest.approx(record.values["scales"]))


@pytest.mark.parametrize("arch", DECAY_ONLY)
def test_forget_more_caps_the_folding_architectures_and_refuses_the_others_by_name(nano_model, arch):
    fix = get("forget_more")
    entry = registry.get(arch)
    if arch not in FOLDS:
        assert not fix.applies_to(entry)
        with pytest.raises(UserError, match=rf"fix forget_more does not apply to {entry.title} \({arch}\)"):
            fix.apply(nano_model(arch), fix.make_config({"memory": 2.0}), calibration=None, train_len=16)
        return
    model = nano_model(arch)
    with torch.no_grad():  # rates spread over e^6 in every layer, through the parameter the fix changes
        for mixer in timescales.mixers(model):
            rate = timescales.log_rate(mixer)
            rate.add_(torch.linspace(-6.0, 0.0, rate.numel()).view(rate.shape))
        before = [entry_rates(m) for m in timescales.mixers(model)]
    every = torch.cat(before)
    cap = float((every.min() * every.max()).sqrt())  # between the slowest and the fastest entry
    record = fix.apply(model, fix.make_config({"memory": 1.0 / cap / 16}), calibration=None, train_len=16)
    slow_somewhere = fast_somewhere = False
    for mixer, rates in zip(timescales.mixers(model), before):
        after = entry_rates(mixer)
        slow = rates < cap
        slow_somewhere, fast_somewhere = slow_somewhere or bool(slow.any()), fast_somewhere or bool((~slow).any())
        torch.testing.assert_close(after[slow], torch.full_like(after[slow], cap), rtol=1e-5, atol=0)
        assert torch.equal(after[~slow], rates[~slow])
    assert slow_somewhere and fast_somewhere
    assert record.values["entries_changed"] == int((every < cap).sum())
    assert record.values["folded_into"] == "A_log"


def test_a_deep_copy_keeps_a_scale_and_the_fixes_see_every_fla_mixer(nano_model):
    """fla's blocks hold their mixer as `attn`: the timescales find it (one per layer), and a scale set on them
    survives the deep copy the evaluation makes of a model before it applies a fix."""
    for arch in DECAY_ONLY:
        model = nano_model(arch)
        layers = timescales.mixers(model)
        assert len(layers) == model.config.num_hidden_layers
        assert all(m is block.attn for m, block in zip(layers, model.model.layers))
        timescales.set_scales(model, "A", torch.tensor([0.5, 2.0]))
        assert [float(m.A_scale) for m in timescales.mixers(copy.deepcopy(model))] == [0.5, 2.0]


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("arch", DECAY_ONLY)
def test_a_neutral_decay_fix_scores_exactly_like_its_base_in_the_evaluation(nano_model, tmp_path, arch, padded):
    """Through `recurlen eval` (its scoring, its padded head or not): a_scale with 0 calibration steps (scales 1) and
    forget_more with a cap no entry reaches leave every bin and every sequence's score as the base's, to the bit."""
    from recurlen.evaluation.runner import EvalConfig, run_eval

    nano_model(arch).save_pretrained(str(tmp_path / "base"))
    fixes = ["a_scale"] + (["forget_more"] if "A_log" in timescales.knobs(registry.get(arch).model_cls) else [])
    cfg = EvalConfig(checkpoints=[f"base={tmp_path / 'base'}"], output_dir=str(tmp_path / "eval"), train_len=16,
                     seq_len=128, num_sequences=2, chunk_len=64, batch_size=2, log_bins=0,
                     tasks=["positionwise", "reset"], device="cpu", progress=False, padded_vocab=padded, fixes=fixes,
                     fix={"a_scale": {"steps": 0, "sequences": 1}, **({"forget_more": {"memory": 1e12}}
                                                                      if "forget_more" in fixes else {})})
    seqs = torch.randint(0, 200, (3, 128), generator=torch.Generator().manual_seed(7))
    base, *fixed = run_eval(cfg, seqs)["runs"]
    assert [f["label"] for f in fixed] == [f"base+{name}" for name in fixes]
    for entry in fixed:
        for key in ("bins", "per_sequence"):
            assert entry["positionwise"][key] == base["positionwise"][key], (entry["label"], key)
