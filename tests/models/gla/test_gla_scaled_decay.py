"""GLA's A knob (recurlen.models.timescales): its scan and its step receive s times the log forget gate, the scale
after the config's clamp_min (every channel scaled, those at the clamp too); the checks are shared
(tests/models/decay_scale_checks.py)."""

from __future__ import annotations

from recurlen.models.gla import model as gla_model
from tests.models.decay_scale_checks import (
    check_scale_side_of_clamp,
    check_scan_and_step_receive_s_times_the_log_decay,
    record_log_decays,
)


def test_the_scan_and_the_step_receive_s_times_the_log_decay(nano_model, monkeypatch):
    seen = record_log_decays(monkeypatch, gla_model, "gla_chunked", "gla_step", 3)
    check_scan_and_step_receive_s_times_the_log_decay(nano_model("gla"), seen)


def test_the_scale_comes_after_the_clamp(nano_model, monkeypatch):
    seen = record_log_decays(monkeypatch, gla_model, "gla_chunked", "gla_step", 3)
    check_scale_side_of_clamp(nano_model("gla", clamp_min=-0.01), seen, -0.01, after=True)
