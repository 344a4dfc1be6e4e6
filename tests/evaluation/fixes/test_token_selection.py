"""LongMamba's token selection (fix `longmamba`): its align-target recipe by hand, its settings, the architectures it
refuses, its calibration end to end on tiny Mamba-2 and Mamba-1 models, and a neutral setting that scores exactly
like its base in `recurlen eval`."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch

from recurlen.commands.report import write_report
from recurlen.evaluation.fixes import get
from recurlen.evaluation.fixes.calibration import calibration_loss
from recurlen.evaluation.fixes.token_selection import align_targets
from recurlen.evaluation.runner import EvalConfig, run_eval
from recurlen.models import registry, timescales
from recurlen.util.errors import UserError

T = 32
FILTERING = [a for a in registry.architectures() if "dt_select" in timescales.knobs(registry.get(a).model_cls)]


def test_align_targets_follow_longmambas_recipe_by_hand():
    """dt 1, 2, 3, 4 over a window of T = 4, aligned to 8 tokens: sorted 4, 3, 2, 1 stretched (linear, half-pixel
    centres) to 4, 3.75, 3.25, 2.75, 2.25, 1.75, 1.25, 1, whose running sum first passes the window's 10 at rank 2
    (4 + 3.75 + 3.25 = 11): the threshold is the value one rank further, 2.75. Clamping the top half at its smallest
    (3) makes the window's sum 9 and the stretch 3, 3, 3, 2.75, 2.25, ...: 11.75 > 9 at rank 3, threshold 2.25."""
    dt_TC = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    rate_C = torch.tensor([0.1])
    decay, threshold = align_targets(dt_TC, rate_C, target_len=8, clamp_top=0.0)
    assert threshold.tolist() == pytest.approx([2.75]) and decay.tolist() == pytest.approx([math.exp(-1.0)])
    decay, threshold = align_targets(dt_TC, rate_C, target_len=8, clamp_top=0.5)
    assert threshold.tolist() == pytest.approx([2.25]) and decay.tolist() == pytest.approx([math.exp(-0.9)])
    _, within = align_targets(dt_TC, rate_C, target_len=4, clamp_top=0.0)  # up to T: nothing to filter
    assert within.tolist() == [0.0]


@pytest.mark.parametrize(("settings", "bad"), [
    ({"channel_threshold": "nan"}, "fix.longmamba.channel_threshold must be a finite number; got nan"),
    ({"scale": "inf"}, "fix.longmamba.scale must be a finite number; got inf"),
    ({"channel_threshold": 1.5}, r"channel_threshold must be in \[0, 1\]; got 1.5"),
    ({"clamp_top": 1.0}, r"clamp_top must be in \[0, 1\); got 1.0"),
    ({"aggregate": "median"}, "aggregate must be avg or max; got 'median'"),
    ({"scale": -1.0}, "scale must be a finite number >= 0; got -1.0"),
    ({"target_len": 1}, "target_len must be >= 2 tokens or None; got 1"),
])
def test_bad_settings_are_refused_in_one_line(settings, bad):
    with pytest.raises(UserError, match=f"fix longmamba: {bad}") as err:
        get("longmamba").make_config(settings)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch", [a for a, spec in registry.architectures().items()
                                  if not get("longmamba").applies_to(spec)])
def test_it_refuses_architectures_without_a_token_filter_by_name(nano_model, arch):
    title = re.escape(registry.get(arch).title)
    with pytest.raises(UserError, match=rf"^fix longmamba does not apply to {title} \({arch}\): it scales dt_select"):
        get("longmamba").apply(nano_model(arch), get("longmamba").make_config({}), calibration=None, train_len=T)


def independent_decays(model, windows_WT: torch.Tensor, clamp_top: float) -> list[torch.Tensor]:
    """Each layer's decay over a window, exp(-rate sum dt), averaged over windows run one by one: dt from the
    mixers' dt_probe, clamped at the k-th largest, without align_targets."""
    sums: list[list[torch.Tensor]] = [[] for _ in timescales.mixers(model)]
    probes = [m.dt_probe() for m in timescales.mixers(model)]
    handles = [module.register_forward_hook(lambda _m, _i, out, i=i, f=f: sums[i].append(f(out)[0]))
               for i, (module, f, _) in enumerate(probes)]
    with torch.no_grad():
        for window in windows_WT:
            model(window[None])
    for h in handles:
        h.remove()
    k = max(1, int(windows_WT.shape[1] * clamp_top))
    out = []
    for (_, _, rate_C), dts in zip(probes, sums):
        dt_WTC = torch.stack(dts).double()
        dt_WTC = torch.minimum(dt_WTC, dt_WTC.topk(k, dim=1).values.amin(dim=1, keepdim=True))
        out.append(torch.exp(-rate_C.double() * dt_WTC.sum(1)).mean(0))
    return out


@pytest.mark.parametrize("arch", FILTERING)
def test_apply_calibrates_on_training_length_windows_and_filters_the_global_channels(nano_model, arch):
    model = nano_model(arch)
    calibration = torch.randint(0, model.config.vocab_size, (3, 8 * T), generator=torch.Generator().manual_seed(0))
    fix = get("longmamba")
    record = fix.apply(model, fix.make_config({"sequences": 2, "chunk_len": 64}), calibration=calibration,
                       train_len=T)
    cal, values = record.calibration, record.values
    assert cal["windows"] == 2 * 8 and cal["window_len"] == T and cal["target_len"] == 8 * T
    assert cal["forward_passes"] == 3 and cal["forward_calls"] == 8 and cal["seconds"] > 0
    assert cal["data"] == {"sequences": 2, "length": 8 * T, "rows": "the held-out sequences after the evaluation's"}
    decays = independent_decays(model, calibration[:2].reshape(-1, T), clamp_top=0.1)
    assert values["global_channels"] == [int((d > 0.05).sum()) for d in decays]
    assert values["filtered"] and 0 < sum(values["global_channels"]) < sum(values["channels"])
    for mixer, d in zip(timescales.mixers(model), decays):
        if mixer.dt_select is not None:
            assert torch.equal(mixer.dt_select > 0, d > 0.05)  # a threshold exactly where a channel is global
    assert record.calibrated_parameters == sum(values["global_channels"])
    with torch.no_grad():
        after = float(calibration_loss(model, calibration[:2], chunk_len=64, batch_size=2))
    assert after == pytest.approx(cal["loss_after"], abs=1e-6)  # the model returned is the one measured
    assert cal["loss_after"] != cal["loss_before"]


@pytest.mark.parametrize("arch", FILTERING)
def test_neutral_settings_leave_the_model_bit_for_bit(nano_model, arch):
    model = nano_model(arch)
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    calibration = torch.randint(0, model.config.vocab_size, (2, 4 * T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, _ = model(ids)
    fix = get("longmamba")
    for settings in ({"channel_threshold": 1.0}, {"scale": 0.0}, {"target_len": T}):
        fixed = copy.deepcopy(model)
        record = fix.apply(fixed, fix.make_config({**settings, "sequences": 2}), calibration=calibration, train_len=T)
        assert not record.values["filtered"] and all(m.dt_select is None for m in timescales.mixers(fixed))
        with torch.no_grad():
            assert torch.equal(fixed(ids)[0], want), settings
    assert record.values["target_len"] == T and sum(record.values["global_channels"]) > 0  # global, none filtered


def test_calibration_shorter_than_the_training_length_is_refused_in_one_line(nano_model):
    fix = get("longmamba")
    with pytest.raises(UserError, match=r"fix longmamba: its windows are the training length \(64 tokens\), longer "
                                        r"than the calibration sequences \(48\); set fix.longmamba.length >= 64"):
        fix.apply(nano_model("mamba2"), fix.make_config({"sequences": 1}), calibration=torch.zeros(1, 48).long(),
                  train_len=64)


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory, nano_model) -> str:
    path = tmp_path_factory.mktemp("ckpt") / "base"
    nano_model().save_pretrained(str(path))
    return str(path)


@pytest.mark.parametrize("padded", [False, True])
def test_in_eval_a_neutral_filter_scores_exactly_like_its_base_and_a_calibrated_one_does_not(base_checkpoint,
                                                                                              tmp_path, padded):
    """channel_threshold 1 makes no channel global: the fix's row is its base's to the last bit, with the official
    padded head (padded_vocab=true) as without it; the default settings filter tokens and move the loss."""
    seqs = torch.randint(0, 257, (4, 256), generator=torch.Generator().manual_seed(5))
    cfg = EvalConfig(checkpoints=[f"base={base_checkpoint}"], output_dir=str(tmp_path / "eval"), train_len=T,
                     seq_len=256, num_sequences=2, chunk_len=128, batch_size=2, log_bins=0,
                     tasks=["positionwise", "reset"], device="cpu", progress=False, padded_vocab=padded,
                     fixes=["off=longmamba", "longmamba"],
                     fix={"off": {"channel_threshold": 1.0, "sequences": 1}, "longmamba": {"sequences": 2}})
    base, off, on = run_eval(cfg, seqs)["runs"]
    assert (off["label"], on["label"]) == ("base+off", "base+longmamba")
    for key in ("bins", "per_sequence"):
        assert off["positionwise"][key] == base["positionwise"][key]
    assert on["positionwise"]["per_sequence"] != base["positionwise"]["per_sequence"]
    assert on["fix"]["calibration"]["windows"] == 2 * 256 // T and on["fix"]["values"]["filtered"]
    report = write_report([tmp_path / "eval"], out_dir=tmp_path / "report").read_text()
    line = next(ln for ln in report.splitlines() if ln.startswith("- base+longmamba: LongMamba (Ye et al., ICLR 2025"))
    assert " channels global (" in line and "none filtered" not in line
    assert f"calibrated by align targets on 16 windows of {T} tokens (from 2 x 256 tokens), thresholds for 256" in line
