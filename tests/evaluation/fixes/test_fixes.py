"""Training-free fixes: the timescale knobs (identity at 1, exact folds), each fix's mechanism on a tiny model that
really fails past its training length, refusal by name, settings."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
import torch.nn.functional as F

from recurlen.evaluation.fixes import FIXES, get
from recurlen.evaluation.fixes.calibration import calibration_loss
from recurlen.evaluation.fixes.forget_more import entry_rates
from recurlen.models import registry, timescales
from recurlen.util.errors import UserError

T = 16
V = 32
SCALING = [a for a in registry.architectures() if {"dt", "A"} <= set(timescales.knobs(registry.get(a).model_cls))]


def _bigram_stream(num: int, length: int, seed: int) -> torch.Tensor:
    """Tokens of a fixed random bigram chain: the next token depends on the last one only, so a model that lets
    its state grow past the training length only loses."""
    table = torch.softmax(torch.randn(V, V, generator=torch.Generator().manual_seed(0)) * 3, dim=-1)
    gen = torch.Generator().manual_seed(seed)
    x = torch.empty(num, length, dtype=torch.long)
    x[:, 0] = torch.randint(0, V, (num,), generator=gen)
    for t in range(1, length):
        x[:, t] = torch.multinomial(table[x[:, t - 1]], 1, generator=gen)[:, 0]
    return x


@pytest.fixture(scope="module")
def slow_model() -> torch.nn.Module:
    """A nano Mamba-2 with slow decays (memories of 10^3..10^5 tokens), pre-trained 40 steps at T = 16: its loss
    past T is well above its loss inside T."""
    arch = registry.get("mamba2")
    torch.manual_seed(0)
    model = arch.build(arch.preset("nano", vocab_size=V, A_init_range=(1e-2, 1e-1), dt_min=1e-3, dt_max=1e-2),
                       backend="torch")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(40):
        x = _bigram_stream(16, T + 1, step)
        logits, _ = model(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def calibration() -> torch.Tensor:
    return _bigram_stream(4, 512, 1234)


def test_the_slow_model_fails_past_its_training_length(slow_model):
    x = _bigram_stream(4, 512, 999)
    with torch.no_grad():
        logits, _ = slow_model(x[:, :-1])
    nll = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="none").view(4, -1)
    assert nll[:, T:4 * T].mean() > nll[:, :T].mean() + 0.2


@pytest.mark.parametrize("arch", SCALING)
@pytest.mark.parametrize("knob", ["dt", "A"])
def test_a_scale_of_one_is_the_identity_and_other_scales_change_the_model(nano_model, arch, knob):
    model = nano_model(arch)
    ids = torch.randint(0, 200, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, _ = model(ids)
        timescales.set_scales(model, knob, torch.ones(len(timescales.mixers(model))))
        same, _ = model(ids)
        timescales.set_scales(model, knob, torch.tensor([1.0, 3.0]))
        other, _ = model(ids)
    assert torch.equal(same, want)
    assert (other - want).abs().max() > 1e-3


@pytest.mark.parametrize("arch", [a for a in SCALING if "A_log" in timescales.knobs(registry.get(a).model_cls)])
def test_an_A_scale_folds_into_A_log_exactly(nano_model, arch):
    model = nano_model(arch)
    ids = torch.randint(0, 200, (2, 40), generator=torch.Generator().manual_seed(2))
    timescales.set_scales(model, "A", torch.tensor([0.5, 4.0]))
    with torch.no_grad():
        scaled, _ = model(ids)
        assert timescales.fold_A_scales(model)
        folded, _ = model(ids)
    assert all(m.A_scale is None for m in timescales.mixers(model))
    torch.testing.assert_close(folded, scaled, atol=2e-5, rtol=1e-5)


def test_mamba1_dt_scale_equals_its_exact_rewrite_in_the_weights(nano_model):
    """Mamba-1's y = (C h + D x) silu(z) is linear in h: dt x s equals A x s, D / s and out_proj x s (the state is
    then h / s), an independent statement of what the dt scale does."""
    model = nano_model("mamba1")
    rewritten = copy.deepcopy(model)
    s = torch.tensor([0.3, 2.5])
    timescales.set_scales(model, "dt", s)
    with torch.no_grad():
        for mixer, scale in zip(timescales.mixers(rewritten), s):
            mixer.A_log.add_(torch.log(scale))
            mixer.D.div_(scale)
            mixer.out_proj.weight.mul_(scale)
        ids = torch.randint(0, 200, (2, 40), generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(model(ids)[0], rewritten(ids)[0], atol=5e-5, rtol=1e-4)


def test_on_mamba3_a_dt_scale_speeds_the_rotation_and_an_A_scale_leaves_it(nano_model):
    """Mamba-3's angle advances by pi tanh(.) dt per token, so a dt scale s turns B and C s times as far (checked on
    the first layer, whose input no scale changes; s an integer, so s x (angle mod 2 pi) is s x angle mod 2 pi); an
    A scale moves the decay alone and leaves the angle bit for bit."""
    model = nano_model("mamba3")
    layers = len(timescales.mixers(model))
    ids = torch.randint(0, 200, (2, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, plain = model(ids)
        timescales.set_scales(model, "A", torch.full((layers,), 3.0))
        _, a_scaled = model(ids)
        timescales.set_scales(model, "A", None)
        timescales.set_scales(model, "dt", torch.full((layers,), 3.0))
        _, dt_scaled = model(ids)
    theta = plain.angle[0].double()
    assert theta.abs().max() > 0.1  # the rotation is not vacuous
    assert torch.equal(a_scaled.angle[0], plain.angle[0])
    turned = dt_scaled.angle[0].double()
    for f in (torch.cos, torch.sin):  # equal as angles (mod 2 pi)
        torch.testing.assert_close(f(turned), f(3 * theta), atol=1e-4, rtol=0)
    assert (f(turned) - f(theta)).abs().max() > 0.1


@pytest.mark.parametrize("arch", SCALING)
def test_scaled_models_step_as_they_run_a_sequence(nano_model, arch, step_by_step):
    model = nano_model(arch)
    timescales.set_scales(model, "dt", torch.tensor([0.5, 2.0]))
    timescales.set_scales(model, "A", torch.tensor([3.0, 0.7]))
    ids = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        whole, _ = model(ids)
    stepped, _ = step_by_step(model, ids, None)
    torch.testing.assert_close(stepped[:, -1], whole[:, -1], atol=1e-4, rtol=1e-4)


def test_a_fix_applies_to_the_architectures_the_registry_says_and_refuses_others_by_name(nano_model):
    models = {name: nano_model(name) for name in registry.architectures()}
    refusals = 0  # a fix may apply to every architecture (a_scale does): the refusals are counted over all fixes
    for name, fix in FIXES.items():
        assert registry.DEFAULT in fix.architectures()
        for arch_name, entry in registry.architectures().items():
            if set(fix.needs) <= set(timescales.knobs(entry.model_cls)):
                assert arch_name in fix.architectures()
                fix.check_model(models[arch_name])
            else:
                refusals += 1
                assert arch_name not in fix.architectures()
                with pytest.raises(UserError, match=rf"fix {name} does not apply to {re.escape(entry.title)} "
                                                    rf"\({arch_name}\): it scales {'/'.join(fix.needs)} of each"):
                    get(name).apply(models[arch_name], fix.make_config({}), calibration=None, train_len=T)
    assert refusals, "no fix refuses any architecture: the refusal above is untested"


def test_settings_are_typed_and_checked_in_one_line():
    with pytest.raises(UserError, match=r"fix mambaextend: .*stepz.*its settings: \[.*'steps'"):
        get("mambaextend").make_config({"stepz": 3})
    with pytest.raises(UserError, match="method must be spsa or backprop"):
        get("a_scale").make_config({"method": "adam"})
    with pytest.raises(UserError, match=r"unknown fix 'mambaextnd'; did you mean mambaextend\?; allowed"):
        get("mambaextnd")
    assert get("mambaextend").make_config({"steps": "7"}).steps == 7


@pytest.mark.parametrize(("name", "settings", "bad"), [
    ("forget_more", {"memory": "nan"}, "fix.cap.memory must be a finite number; got nan"),
    ("forget_more", {"grid": ["nan"]}, r"fix.cap.grid\[0\] must be a finite number; got nan"),
    ("mambaextend", {"perturb": "nan"}, "fix.cap.perturb must be a finite number; got nan"),
    ("mambaextend", {"method": "backprop", "lr": "nan"}, "fix.cap.lr must be a finite number; got nan"),
    ("a_scale", {"max_scale": "inf"}, "fix.cap.max_scale must be a finite number; got inf"),
])
def test_a_non_finite_setting_is_refused_by_name(name, settings, bad):
    # `x <= 0` is false for nan: without the rule these ran and gave nan results or calibrated nothing.
    with pytest.raises(UserError, match=f"fix {name}: {bad}"):
        get(name).make_config(settings, key="cap")


@pytest.mark.parametrize("name", ["mambaextend", "a_scale"])
def test_an_uncalibrated_scale_fix_at_one_leaves_the_logits_unchanged(nano_model, name):
    model = nano_model("mamba2")
    ids = torch.randint(0, 200, (2, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want, _ = model(ids)
        record = get(name).apply(model, get(name).make_config({"steps": 0}), calibration=None, train_len=T)
        got, _ = model(ids)
    assert record.calibration is None and record.values["scales"] == [1.0, 1.0]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name,settings,margin", [
    ("mambaextend", {"steps": 6, "lr": 2.0}, 0.004),
    ("mambaextend", {"steps": 6, "lr": 0.5, "method": "backprop"}, 0.01),
    ("a_scale", {"steps": 6, "lr": 2.0}, 0.0005),
    ("a_scale", {"steps": 6, "lr": 0.5, "method": "backprop"}, 0.01),
    ("forget_more", {}, 0.01),
])
def test_calibration_lowers_the_calibration_loss_of_a_model_that_fails(slow_model, calibration, name, settings,
                                                                       margin):
    model = copy.deepcopy(slow_model)
    fix = get(name)
    cfg = fix.make_config({**settings, "chunk_len": 512})
    with torch.no_grad():
        before = float(calibration_loss(model, calibration, chunk_len=512, batch_size=4))
    record = fix.apply(model, cfg, calibration=calibration, train_len=T)
    with torch.no_grad():
        after = float(calibration_loss(model, calibration, chunk_len=512, batch_size=4))
    assert record.calibration["loss_before"] == pytest.approx(before, abs=1e-6)
    assert after == pytest.approx(record.calibration["loss_after"], abs=1e-5)  # the model returned is the one chosen
    assert after < before - margin
    assert record.calibration["data"] == {"sequences": 4, "length": 512,
                                          "rows": "the held-out sequences after the evaluation's"}
    assert record.calibrated_parameters == (1 if name == "forget_more" else 2)


def test_spsa_is_reproducible_from_its_seed(slow_model, calibration):
    runs = []
    for _ in range(2):
        model = copy.deepcopy(slow_model)
        fix = get("mambaextend")
        runs.append(fix.apply(model, fix.make_config({"steps": 2, "chunk_len": 512, "seed": 3}),
                              calibration=calibration, train_len=T).values["scales"])
    assert runs[0] == runs[1]


def test_forget_more_caps_every_slow_entry_and_leaves_the_fast_ones(slow_model):
    model = copy.deepcopy(slow_model)
    with torch.no_grad():  # make one head fast, so that a cap of 2T leaves it alone
        timescales.mixers(model)[0].A_log[0] += math.log(1.0 / float(entry_rates(timescales.mixers(model)[0])[0]) / 4)
    before = [m.A_log.detach().clone() for m in timescales.mixers(model)]
    rates_before = [entry_rates(m) for m in timescales.mixers(model)]
    record = get("forget_more").apply(model, get("forget_more").make_config({"memory": 2.0}), calibration=None,
                                      train_len=T)
    cap = 1.0 / (2.0 * T)
    for mixer, a_log, rate in zip(timescales.mixers(model), before, rates_before):
        after = entry_rates(mixer)
        assert (after >= cap * (1 - 1e-4)).all()
        fast = rate >= cap
        assert torch.equal(mixer.A_log[fast], a_log[fast]) and fast.sum() < fast.numel()
        torch.testing.assert_close(after[~fast], torch.full_like(after[~fast], cap), rtol=1e-4, atol=0)
    assert record.values["entries_changed"] == sum(int((r < cap).sum()) for r in rates_before) > 0
    assert record.calibration is None and record.calibrated_parameters == 0


def test_forget_more_bounds_the_state_that_grows_without_it(slow_model):
    x = _bigram_stream(2, 1024, 7)
    capped = copy.deepcopy(slow_model)
    get("forget_more").apply(capped, get("forget_more").make_config({"memory": 1.0}), calibration=None, train_len=T)
    with torch.no_grad():
        norms = {}
        for name, model in (("base", slow_model), ("capped", capped)):
            state, norms[name] = None, []
            for start in range(0, 1024, 128):
                _, state = model(x[:, start:start + 128], state)
                norms[name].append(float(state.ssm[0].norm()))
    assert norms["base"][-1] > 2 * norms["base"][0]  # the base's state keeps growing past T
    assert max(norms["capped"][1:]) < 1.5 * norms["capped"][0]  # capped at memory T: it stays where it was at 8T
