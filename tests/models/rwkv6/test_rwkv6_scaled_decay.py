"""RWKV-6's A knob (recurlen.models.timescales): its scan and its step receive s times the log decay; the check is
shared (tests/models/decay_scale_checks.py). That s folds into time_decay exactly is
tests/evaluation/fixes/test_decay_scales.py's."""

from __future__ import annotations

from recurlen.models.rwkv6 import model as rwkv6_model
from tests.models.decay_scale_checks import check_scan_and_step_receive_s_times_the_log_decay, record_log_decays


def test_the_scan_and_the_step_receive_s_times_the_log_decay(nano_model, monkeypatch):
    seen = record_log_decays(monkeypatch, rwkv6_model, "wkv6_chunked", "wkv6_step", 3)
    check_scan_and_step_receive_s_times_the_log_decay(nano_model("rwkv6"), seen)


def test_time_decay_is_the_log_rate_the_fixes_fold_into(nano_model):
    from recurlen.models import timescales

    mixer = timescales.mixers(nano_model("rwkv6"))[0]
    assert timescales.log_rate(mixer) is mixer.w_proj.linear.lora[2].bias is mixer.time_decay
