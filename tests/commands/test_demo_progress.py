"""The demo's bar: its time left comes from the measured stage costs, rescaled by the speed measured as the demo
runs, never from a rate over stages (which reads `?stage/s` through stage 1 and then extrapolates stage 1)."""

import pytest

from recurlen.commands.demo_progress import DemoProgress, Reference, StageCost, makespan

STAGE = StageCost(startup=5.0, per_step=0.1, finish=5.0)
REF = Reference(machine="test", pretrain=StageCost(startup=5.0, per_step=0.1, finish=10.0),
                posttrain={"none": STAGE, "state_passing": STAGE, "tbptt": STAGE},
                eval_per_token=1e-3, effrem_per_token=0.0, eval_startup=0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def progress(clock, **kw):
    # pretrain 5 + 1000 x 0.1 + 10 = 115; posts 5 + 100 x 0.1 + 5 = 20 each, 3 on 2 workers: 40; eval 4 x 10 = 40.
    args = dict(pretrain_steps=1000, post_steps=100, interventions=["none", "state_passing", "tbptt"], parallel=2,
                eval_models=4, eval_tokens=10_000, effrem_tokens=0, reference=REF, refresh_s=0, disable=True,
                clock=clock)
    return DemoProgress(**{**args, **kw})


def test_makespan_schedules_the_queue_on_the_least_loaded_worker():
    assert makespan([], [20, 20, 20], 2) == 40
    assert makespan([15], [20, 20], 2) == 35  # one running with 15 left: the others go 20 | 15 + 20
    assert makespan([3, 4], [], 2) == 4
    assert makespan([], [], 2) == 0


def test_before_any_step_the_estimate_is_the_reference_plan():
    clock = Clock()
    bar = progress(clock)
    assert bar.first_estimate == pytest.approx(115 + 40 + 40)
    fraction, elapsed, remaining = bar.estimate()
    assert (fraction, elapsed, remaining) == (0.0, 0.0, pytest.approx(195))
    bar.stage_started("pretrain")
    clock.now += 2.0  # starting up: the estimate moves down with time, it is never unknown
    assert bar.estimate()[2] == pytest.approx(193)


def test_a_machine_slower_than_the_reference_scales_what_is_left():
    clock = Clock()
    bar = progress(clock)
    bar.stage_started("pretrain")
    clock.now += 10.0  # start-up took twice its reference
    bar.on_step("pretrain", 0, 1000)
    clock.now += 60.0  # then 300 steps (30 reference seconds) in 60 s: half the reference speed
    bar.on_step("pretrain", 300, 1000)
    assert bar.speed() == pytest.approx(70 / 35)
    left_reference = 700 * 0.1 + 10 + 40 + 40
    assert bar.estimate()[2] == pytest.approx(left_reference * 2.0)
    assert bar.estimate()[0] == pytest.approx(35 / 195)


def test_after_a_long_first_stage_the_estimate_is_the_rest_of_the_plan_not_a_stage_rate():
    """The report: stage 1 (a third of the demo) at 1/4 of the reference speed, then 1:05:12 predicted for 11.8 min
    of work. The estimate here is what is left of the plan at the measured speed."""
    clock = Clock()
    bar = progress(clock)
    bar.stage_started("pretrain")
    bar.on_step("pretrain", 0, 1000)
    for step in range(100, 1001, 100):
        clock.now += 40.0  # 10 reference seconds each, at 1/4 of the speed
        bar.on_step("pretrain", step, 1000)
    clock.now += 40.0
    bar.stage_finished("pretrain", reused=False)
    speed = bar.speed()
    assert speed == pytest.approx(4.0, rel=0.05)
    assert bar.estimate()[2] == pytest.approx((40 + 40) * speed)  # two post-training waves, then the evaluation


def test_post_trainings_side_by_side_count_once_in_the_speed():
    clock = Clock()
    bar = progress(clock, pretrain_steps=0)
    bar.stage_finished("pretrain", reused=True)
    for name in ("post/none", "post/state_passing"):
        bar.stage_started(name)
    clock.now += 5.0  # both at the reference speed, side by side: start-up 5 s, then 100 steps of 0.1 s each
    for name in ("post/none", "post/state_passing"):
        bar.on_step(name, 0, 100)
    clock.now += 10.0
    for name in ("post/none", "post/state_passing"):
        bar.on_step(name, 100, 100)
    assert bar.speed() == pytest.approx(1.0)


def test_reused_stages_and_resumed_steps_leave_the_plan_without_counting_as_speed():
    clock = Clock()
    bar = progress(clock)
    bar.stage_started("pretrain")
    bar.stage_finished("pretrain", reused=True)  # done by an earlier run
    assert bar.planned == pytest.approx(40 + 40)
    assert bar.speed() == 1.0 and bar.estimate()[0] == 0.0
    bar.stage_started("post/none")
    bar.on_step("post/none", 60, 100)  # resumed at step 60: those steps were done before
    assert bar.planned == pytest.approx(80 - 6.0)
    assert bar.estimate()[0] == pytest.approx(5.0 / 74)  # its start-up, the only work seen done


def test_the_bar_shows_elapsed_and_left_and_what_runs():
    clock = Clock()
    bar = progress(clock, disable=False)
    bar.stage_started("pretrain")
    bar.on_step("pretrain", 0, 1000)
    clock.now += 10.0
    bar.on_step("pretrain", 100, 1000)
    line = str(bar.bar)
    assert "[00:10<" in line and "pretrain 100/1000" in line and "?" not in line, line
    bar.close(finished=False)


def test_the_first_estimate_is_priced_from_the_load_at_the_start():
    from recurlen.commands.demo_progress import start_slowdown

    # The demo's threads share the cores with the runnable processes already there; never faster than idle.
    assert start_slowdown(2, load=0.3, cpus=2).factor == 1.15
    assert start_slowdown(2, load=0.0, cpus=2).factor == 1.0
    assert start_slowdown(2, load=6.0, cpus=2).factor == 4.0
    assert start_slowdown(2, load=1.0, cpus=16).factor == 1.0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("recurlen.commands.demo_progress.load_average", lambda: None)
        assert start_slowdown(2, cpus=2).factor == 1.0  # the load cannot be read here: priced as idle
    clock = Clock()
    busy = progress(clock, slowdown=start_slowdown(2, load=6.0, cpus=2))
    assert busy.first_estimate == pytest.approx(4 * (115 + 40 + 40))  # it was the idle cores' 195 s at any load
    assert busy.estimate()[2] == pytest.approx(4 * (115 + 40 + 40))  # the bar's time left agrees until measured
    busy.stage_started("pretrain")  # then the speed measured here takes over
    clock.now += 20.0
    busy.on_step("pretrain", 0, 1000)
    clock.now += 60.0
    busy.on_step("pretrain", 300, 1000)  # 5 + 30 reference seconds done in 80 wall seconds
    assert busy.speed() == pytest.approx(80 / 35)


def test_the_demo_s_estimate_line_says_the_load_it_was_priced_from(monkeypatch):
    import recurlen.commands.demo_progress as demo_progress
    from recurlen.commands.demo import demo_plan, load_demo_config

    monkeypatch.setattr(demo_progress, "load_average", lambda: 6.0)
    monkeypatch.setattr(demo_progress, "usable_cpus", lambda: 2)
    plan = demo_plan(load_demo_config(["quick=true"]))
    time_line = next(line for line in plan if line.strip().startswith("time"))
    assert "x4.0 for this machine's load at the start: load average 6.0 on 2 cores, with the demo's 2 threads" \
        in time_line, time_line
