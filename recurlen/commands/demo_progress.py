"""The demo's progress bar: how much of the demo's work is done, and how long the rest will take.

A rate over stages (Lightning's and tqdm's default estimate) knows nothing until a stage ends and then
extrapolates from a stage that is nothing like the next ones (stage 1 of 7 is a third of the demo). The demo knows
better: each stage's cost was measured on a reference run (REFERENCE below), in three parts, starting up (process,
data, model), the training steps (with their periodic validations) and finishing (the end-of-run validation, the
checkpoint); the plan's stages are priced from that table, scaled by their steps. As the demo runs, the work done
(steps reported by the stages' bars, phases completed) is compared with the wall time it took: this machine's speed
relative to the reference, by which the remaining reference cost is scaled. Post-trainings that run side by side
are priced as a schedule on `parallel` workers (what is left of the longest worker), not as a sum.

Before any work is done the speed is not measured yet: the first estimate is the reference cost scaled by the load
this machine has at the start (start_slowdown: the demo's threads share the cores with the processes already
running), so that a busy machine is not promised an idle one's time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tqdm import tqdm

from recurlen.util.threads import load_average, usable_cpus

log = logging.getLogger(__name__)


BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| "


@dataclass(frozen=True)
class StageCost:
    """Wall seconds of one training stage on the reference machine."""

    startup: float
    """From the process start to its first training step (imports, data, model, checkpoint loading)."""
    per_step: float
    """Per training step, the periodic validations included."""
    finish: float
    """From the last step to the process exit (the end-of-run validation, the checkpoint)."""


@dataclass(frozen=True)
class Reference:
    """The measured reference run: its machine, and every stage's cost there."""

    machine: str
    pretrain: StageCost
    """At parallel x threads_per_run threads."""
    posttrain: dict[str, StageCost]
    """Per intervention, with `parallel` (2) post-trainings side by side, one thread each."""
    eval_per_token: float
    """Seconds per model per held-out token (position-wise pass, the reset control and the state statistics)."""
    effrem_per_token: float
    """Seconds per model per EffRem suffix token (sequences x the suffixes of its t-grid)."""
    eval_startup: float
    """Per model (loading it) and once for the held-out data."""


# Measured on a full demo (`recurlen demo`: 2000 pre-training steps at 2 threads, 750 post-training steps for each of
# the five interventions, two at a time, one thread each; evaluation of 6 models on 64 sequences of 1024 tokens with
# EffRem) on 2 CPU cores, otherwise idle (load 0.4 -> 1.6): every phase as its runs/demo/demo_timings.json recorded
# it. The whole run took 492 s (8.2 min), as the plan priced from this table says.
REFERENCE = Reference(
    machine="2 idle CPU cores",
    pretrain=StageCost(startup=4.2, per_step=0.073, finish=3.7),
    posttrain={
        "none": StageCost(startup=3.9, per_step=0.123, finish=4.2),
        "random_noise": StageCost(startup=3.9, per_step=0.131, finish=3.9),
        "fitted_noise": StageCost(startup=4.3, per_step=0.133, finish=4.6),
        "state_passing": StageCost(startup=3.8, per_step=0.123, finish=4.9),
        "tbptt": StageCost(startup=4.1, per_step=0.121, finish=4.5),
    },
    eval_per_token=5.3e-5,
    effrem_per_token=5.3e-5,
    eval_startup=1.0,
)


@dataclass
class _Stage:
    name: str
    cost: StageCost
    steps: int
    state: str = "queued"
    """queued -> starting -> stepping -> finishing -> done (or reused)."""
    step: int = 0
    phase_since: float = 0.0

    def remaining(self, now: float, speed: float | None) -> float:
        """Reference seconds left. With a speed, an opaque phase (starting, finishing) is credited with its elapsed
        time at that speed, up to 90% of its cost, so that the estimate moves while nothing is reported; without,
        it counts whole until it is seen to end (what the speed is measured from)."""
        c = self.cost
        if self.state in ("done", "reused"):
            return 0.0
        if self.state == "queued":
            return c.startup + self.steps * c.per_step + c.finish
        steps_left = max(self.steps - self.step, 0) * c.per_step
        credit = 0.0 if speed is None else (now - self.phase_since) / speed
        if self.state == "starting":
            return max(c.startup - credit, 0.1 * c.startup) + steps_left + c.finish
        if self.state == "stepping":
            return steps_left + c.finish
        return max(c.finish - credit, 0.1 * c.finish)


def makespan(loads: list[float], queue: list[float], workers: int) -> float:
    """Time until `workers` finish: the running loads first, then each queued job on the least loaded worker."""
    slots = sorted(loads + [0.0] * max(workers - len(loads), 0))
    for job in queue:
        slots.sort()
        slots[0] += job
    return max(slots, default=0.0)


def _demo_cost(arch: str) -> float:
    """The architecture's demo relative to Mamba-2's (its registry entry's demo_cost; 1 for a name not registered)."""
    from recurlen.models import registry

    return registry.get(arch).demo_cost if arch in registry.architectures() else 1.0


@dataclass(frozen=True)
class Slowdown:
    """How much slower than on the reference's idle cores the demo should run here, judged at its start."""

    factor: float
    """>= 1: wall seconds here per reference second."""
    load: float | None
    """The one-minute load average at the start (None where it cannot be read)."""
    cpus: int
    threads: int

    def describe(self) -> str:
        """What the estimate line says of it."""
        if self.load is None:
            return "the load average cannot be read here: priced as idle"
        return (f"x{self.factor:.1f} for this machine's load at the start: load average {self.load:.1f} on {self.cpus} "
                f"cores, with the demo's {self.threads} threads")


def start_slowdown(threads: int, *, load: float | None = None, cpus: int | None = None) -> Slowdown:
    """The demo's `threads` share the `cpus` cores with the `load` runnable processes already there (the one-minute
    load average, os.getloadavg; read here when not given): each thread gets cpus / (load + threads) of a core when
    that is less than one, so the stages take (load + threads) / cpus times their reference cost (never less: the
    reference ran on idle cores, and this machine's cores may be no faster)."""
    cpus = cpus if cpus is not None else usable_cpus()
    load = load if load is not None else load_average()
    if load is None:
        return Slowdown(1.0, None, cpus, threads)
    return Slowdown(max(1.0, (load + threads) / max(cpus, 1)), load, cpus, threads)


class DemoProgress:
    """The demo's bar: `demo: 23%|██  | [01:20<04:30] pretrain 600/2000` (see the module docstring)."""

    def __init__(self, *, pretrain_steps: int, post_steps: int, interventions: list[str], parallel: int,
                 eval_models: int, eval_tokens: int, effrem_tokens: int, eval_label: str = "eval", arch: str = "mamba2",
                 reference: Reference = REFERENCE, refresh_s: float = 1.0, disable: bool = False,
                 clock: Callable[[], float] = time.monotonic, slowdown: Slowdown | None = None) -> None:
        """refresh_s: seconds between redraws while no stage reports (0: only on reports); clock: the time source;
        slowdown: this machine against the reference until its speed is measured (start_slowdown; None: as idle)."""
        scale = _demo_cost(arch)
        ref = reference

        def scaled(c: StageCost) -> StageCost:
            return StageCost(c.startup * scale, c.per_step * scale, c.finish * scale)

        self.parallel = parallel
        self.pretrain = _Stage("pretrain", scaled(ref.pretrain), pretrain_steps)
        self.posts = {f"post/{name}": _Stage(f"post/{name}", scaled(ref.posttrain.get(name, ref.posttrain["none"])),
                                             post_steps) for name in interventions}
        self.eval_cost = scale * (eval_models * (ref.eval_startup + ref.eval_per_token * eval_tokens
                                                 + ref.effrem_per_token * effrem_tokens) + ref.eval_startup)
        self.eval_state, self.eval_since, self.eval_label = "queued", 0.0, eval_label
        self.lock = threading.Lock()
        self.clock = clock
        self.start = self.clock()
        self.planned = self._remaining(self.start, None)
        """Reference seconds of the work this run does: the plan less what turned out done already (reused
        stages, steps trained before a resume)."""
        self.start_slowdown = slowdown
        self.slowdown = slowdown.factor if slowdown is not None else 1.0
        self.first_estimate = self.planned * self.slowdown
        """Wall seconds on this machine, priced from the reference and the load at the start."""
        self._mark = (0.0, 0.0)  # (wall seconds, reference seconds done) when work was last seen to be done
        self.bar = tqdm(total=1000, desc="demo", dynamic_ncols=True, disable=disable,
                        bar_format=BAR_FORMAT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, args=(refresh_s,), daemon=True) if refresh_s > 0 else None
        if self._thread is not None:
            self._thread.start()

    def _stage(self, name: str) -> _Stage:
        return self.pretrain if name == "pretrain" else self.posts[name]

    # ---- what the demo reports
    def stage_started(self, name: str) -> None:
        with self.lock:
            stage = self._stage(name)
            stage.state, stage.phase_since = "starting", self.clock()

    def on_step(self, name: str, step: int, total: int) -> None:
        with self.lock:
            stage, now = self._stage(name), self.clock()
            if stage.state == "starting":  # its bar's first draw: where it starts (a resumed stage: further on)
                self.planned -= step * stage.cost.per_step
                stage.state, stage.steps = "stepping", total
            stage.step = max(stage.step, step)
            if stage.step >= stage.steps and stage.state == "stepping":
                stage.state, stage.phase_since = "finishing", now
            self._measured(now)
        self._draw()

    def stage_finished(self, name: str, *, reused: bool) -> None:
        with self.lock:
            stage, now = self._stage(name), self.clock()
            if reused:  # no work: out of the plan
                before = self._remaining(now, None)
                stage.state = "reused"
                self.planned -= before - self._remaining(now, None)
            else:
                stage.state, stage.step = "done", stage.steps
                self._measured(now)
        self._draw()

    def eval_started(self) -> None:
        with self.lock:
            self.eval_state, self.eval_since = "running", self.clock()
        self._draw()

    def close(self, *, finished: bool = True) -> None:
        """Stop the bar: at 100% when the demo finished, where it stood when it stopped early (a signal, an error)."""
        if finished:
            with self.lock:
                self.eval_state = "done"
                self._measured(self.clock())
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._draw()
        self.bar.close()

    # ---- the estimate
    def _measured(self, now: float) -> None:
        self._mark = (now - self.start, self.planned - self._remaining(now, None))

    def speed(self) -> float:
        """Wall seconds per reference second, measured where work was last seen done (the slowdown judged from the
        load at the start until there is enough of it to tell). Post-trainings side by side count once: done work
        is what the schedule has shrunk by."""
        wall, done = self._mark
        return wall / done if done >= 2.0 and wall > 0 else self.slowdown

    def _remaining(self, now: float, speed: float | None) -> float:
        running = [s.remaining(now, speed) for s in self.posts.values() if s.state not in ("queued", "done", "reused")]
        queued = [s.remaining(now, speed) for s in self.posts.values() if s.state == "queued"]
        if self.eval_state == "queued":
            ev = self.eval_cost
        elif self.eval_state == "running":
            credit = 0.0 if speed is None else (now - self.eval_since) / speed
            ev = max(self.eval_cost - credit, 0.1 * self.eval_cost)
        else:
            ev = 0.0
        return self.pretrain.remaining(now, speed) + makespan(running, queued, self.parallel) + ev

    def estimate(self) -> tuple[float, float, float]:
        """(fraction done, elapsed seconds, remaining seconds on this machine)."""
        with self.lock:
            now = self.clock()
            speed = self.speed()
            remaining = self._remaining(now, speed)
            fraction = 1.0 - remaining / self.planned if self.planned > 0 else 1.0
            return min(max(fraction, 0.0), 1.0), now - self.start, remaining * speed

    def describe(self) -> str:
        with self.lock:
            stages = [self.pretrain, *self.posts.values()]
            active = [f"{s.name} starting" if s.state == "starting" else f"{s.name} {s.step}/{s.steps}"
                      for s in stages if s.state in ("starting", "stepping", "finishing")]
            if self.eval_state == "running":
                active.append(self.eval_label)
        return ", ".join(active)

    def _draw(self) -> None:
        fraction, elapsed, remaining = self.estimate()
        done = self.eval_state == "done"
        left = "" if done else f"<{tqdm.format_interval(remaining)}"
        text = f"[{tqdm.format_interval(elapsed)}{left}] {self.describe()}"
        # The text goes into the format itself: tqdm's {postfix} would start it with ", ".
        self.bar.bar_format = BAR_FORMAT + text.replace("{", "{{").replace("}", "}}")
        self.bar.n = 1000 if done else int(fraction * 1000)
        self.bar.refresh()

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            self._draw()


__all__ = ["REFERENCE", "DemoProgress", "Reference", "Slowdown", "StageCost", "makespan", "start_slowdown"]
