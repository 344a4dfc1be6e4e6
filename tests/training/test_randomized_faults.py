"""Randomized faults: one run interrupted N times at random moments, resumed each time, ends bitwise equal to the
uninterrupted run: its final checkpoint, every step checkpoint, and every logged scalar.

Each interruption draws a kind (SIGTERM, SIGINT, SIGUSR1: the run writes a checkpoint and stops; or kill -9) and a
phase (a training step, a validation, a checkpoint write, the rename that ends a write) and where in it: the step,
the moment within the step or validation, which checkpoint file and how far its write got. The moments are hit by
the process itself (RECURLEN_FAULT, see recurlen.util.faults): a signal sent to oneself is delivered right there, as
a scheduler's would be at that instant, and unlike a timed signal from outside it lands at the same moment on every
machine, so a seed reproduces a failure exactly:

    RECURLEN_FAULT_SEED=<seed printed by the failure> pytest -m slow tests/training/test_randomized_faults.py

RECURLEN_FAULT_COUNT sets N (default 24).
"""

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from recurlen.training.resume import newest_finite_checkpoint
from recurlen.training.run_dir import RunDir
from recurlen.util.faults import MOMENTS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("RECURLEN_FAULT_SEED", "1729"))
COUNT = int(os.environ.get("RECURLEN_FAULT_COUNT", "24"))
VAL_EVERY, CKPT_EVERY = 3, 2
"""Validation every 3 steps, a checkpoint every 2: some validations follow a checkpoint of their own step (resume
must run them again), others do not (resume retrains up to them)."""
STEPS = 5 * COUNT + 8
"""Room for COUNT interruptions: one moves the run on by 2 to 3 steps on average, 7 at most (a kill -9 can move it
back); `draw` says so if a seed ever needs more."""
KINDS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGKILL")
PHASES = ("step", "validation", "write", "rename")
MEASURED = ("train/tokens_per_s",)
"""Scalars that measure wall-clock time: not compared (nor whether a step cut short by a kill -9 has one)."""


def repro() -> str:
    return f"seed={SEED}: rerun with RECURLEN_FAULT_SEED={SEED} RECURLEN_FAULT_COUNT={COUNT}"


def args(run_dir, cache_dir):
    return [sys.executable, "-m", "recurlen", "finetune", "model=nano", "intervention=state_passing",
            "data.seq_len=16", "data.batch_size=2", "data.val_length=64", "data.val_sequences=2",
            "data.val_segments=8", "data.val_fraction=0.2", f"data.cache_dir={cache_dir}", "data.max_documents=60",
            f"trainer.max_steps={STEPS}", f"trainer.val_every_n_steps={VAL_EVERY}", "trainer.limit_val_batches=1",
            f"trainer.checkpoint_every_n_steps={CKPT_EVERY}", "trainer.log_every_n_steps=1",
            "trainer.progress_bar=false", "trainer.accelerator=cpu", "trainer.num_threads=1",
            "diagnostics.positionwise=false", "diagnostics.state_norm=false", "optim.lr=1e-3", f"run_dir={run_dir}"]


def run(cmd, fault=None):
    drop = ("SLURM_", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_", "RANK", "GROUP_RANK", "RECURLEN_FAULT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    if fault:
        env["RECURLEN_FAULT"] = fault
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def resumed_step(out: Path) -> int:
    """The step the next run of `out` continues from (the resume decision's choice: the furthest intact one)."""
    found = newest_finite_checkpoint(RunDir(out)) if (out / "checkpoints").is_dir() else None
    return found[1] if found else 0


def draw(rng: random.Random, start: int) -> tuple[str, str, str, str]:
    """(kind, phase, RECURLEN_FAULT, where in words) of one interruption of a run that resumes at step `start`.

    Every target lies ahead of `start` (so this run reaches it) and before STEPS - 2 (so a signal still finds a
    step to stop after: a run that ends by itself would not be interrupted)."""
    assert start <= STEPS - 10, f"the run is at step {start} of {STEPS}: too close to its end to interrupt it"
    kind, phase = rng.choice(KINDS), rng.choice(PHASES)
    action = "action=kill" if kind == "SIGKILL" else f"action=signal,signal={kind}"
    if phase == "step":  # the step taken while global_step is `step`
        step = start + rng.randrange(3)
        moment = rng.choice(MOMENTS["train"])
        return kind, phase, f"point=train,step={step},moment={moment},{action}", f"step {step + 1} at {moment}"
    if phase == "validation":  # the validation after `step` steps: the next one, or the one after
        step = (start // VAL_EVERY + 1 + rng.randrange(2)) * VAL_EVERY
        step = min(step, (STEPS - 3) // VAL_EVERY * VAL_EVERY)
        moment = rng.choice(MOMENTS["validation"])
        return kind, phase, f"point=validation,step={step},moment={moment},{action}", f"validation {step} at {moment}"
    # A checkpoint write: step=N.ckpt, then last.ckpt, every CKPT_EVERY steps: the next one, or the one after.
    ahead = rng.randrange(2)
    step = (start // CKPT_EVERY + 1 + ahead) * CKPT_EVERY
    point = "rename" if phase == "rename" else rng.choice(("start", "middle"))
    target, skip = (f"step={step:06d}.ckpt", 0) if rng.random() < 0.5 else ("last.ckpt", ahead)
    return kind, phase, f"point={point},file={target},skip={skip},{action}", f"{point} of {target} at step {step}"


def scalars(run_dir: Path) -> tuple[dict[tuple[str, int], bytes], list[str]]:
    """Every scalar the run logged, {(tag, step): float32 bytes}, the last write of a step winning (a resumed run
    logs again the steps after its checkpoint), and the steps whose writes disagree (none may)."""
    import numpy as np
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    files = []
    for path in (run_dir / "tb").glob("events.out.tfevents.*"):
        events = list(EventFileLoader(str(path)).Load())  # a torn last record (kill -9) is left out
        if events:
            files.append((events[0].wall_time, path.name, events))
    found: dict[tuple[str, int], bytes] = {}
    disagree = []
    for _, name, events in sorted(files):  # one process after the other: by the time each began writing
        for event in events:
            for value in event.summary.value if event.HasField("summary") else ():
                if value.HasField("tensor"):
                    number = tensor_util.make_ndarray(value.tensor)
                else:
                    number = np.asarray(value.simple_value)
                key, raw = (value.tag, event.step), np.asarray(number, dtype=np.float32).tobytes()
                if key in found and found[key] != raw and value.tag not in MEASURED:
                    disagree.append(f"{value.tag} at step {event.step} ({name})")
                found[key] = raw
    return found, disagree


def leaves(obj, path=""):
    """(path, value) of every leaf of a checkpoint's nested dicts and lists."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from leaves(value, f"{path}/{key}")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from leaves(value, f"{path}[{i}]")
    else:
        yield path, obj


IGNORED = ("/epoch", "/loops/fit_loop/epoch_progress/", "/loops/fit_loop/epoch_loop.val_loop.batch_progress/",
           "/callbacks/Preemption", "/hyper_parameters/run_dir")
"""Not the run's state, what tells how it got there: Lightning ends its epoch when a signal stops training and the
resumed run begins the next (recurlen has one endless epoch: where the data stands is a function of the step, so
the epoch counts stops), its count of validation batches begun counts a validation run again after a kill -9
(recurlen.training.resume.revalidate_pending), the pre-emption callback records how a stop ended, and the run
directory is another."""


def compare_checkpoints(got_path: Path, want_path: Path, got_dir: Path, want_dir: Path) -> tuple[int, float]:
    """Every tensor equal bitwise, every other value equal (paths with the run directory named alike). Returns
    (tensors compared, max |diff|)."""
    got = dict(leaves(torch.load(got_path, map_location="cpu", weights_only=True)))
    want = dict(leaves(torch.load(want_path, map_location="cpu", weights_only=True)))
    keys = {k for k in got.keys() | want.keys() if not k.startswith(IGNORED)}
    wrong = [f"{k}: only in {'the interrupted' if k in got else 'the reference'}" for k in keys if k not in got
             or k not in want]
    tensors, worst = 0, 0.0
    for key in sorted(keys & got.keys() & want.keys()):
        value, expected = got[key], want[key]
        if isinstance(expected, torch.Tensor):
            tensors += 1
            if not isinstance(value, torch.Tensor) or (value.dtype, value.shape) != (expected.dtype, expected.shape):
                wrong.append(f"{key}: {value!r} vs {expected!r}")
                continue
            if expected.numel():
                worst = max(worst, (value.double() - expected.double()).abs().nan_to_num(0.0).max().item())
            # Bytes, not values: -0.0 and 0.0 differ, and a NaN equals the same NaN.
            if not torch.equal(value.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)):
                wrong.append(f"{key}: tensors differ")
        else:
            if isinstance(expected, str) and isinstance(value, str):
                value, expected = value.replace(str(got_dir), "<run>"), expected.replace(str(want_dir), "<run>")
            if value != expected:
                wrong.append(f"{key}: {value!r} != {expected!r}")
    assert not wrong, f"{got_path.name} differs from the uninterrupted run's: {wrong[:10]}; {repro()}"
    return tensors, worst


def test_a_run_interrupted_many_times_at_random_moments_ends_bitwise_equal(tmp_path, cache_dir, capsys):
    reference, out = tmp_path / "reference", tmp_path / "interrupted"
    proc = run(args(reference, cache_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]

    rng = random.Random(SEED)
    kinds, phases, log = Counter(), Counter(), []
    while len(log) < COUNT:
        start = resumed_step(out)
        kind, phase, fault, where = draw(rng, start)
        proc = run(args(out, cache_dir), fault)
        what = f"interruption {len(log) + 1} ({kind} during {where}, resumed at step {start}, {fault})"
        expected = -signal.SIGKILL if kind == "SIGKILL" else 128 + signal.Signals[kind]
        assert proc.returncode == expected, f"{what}: exit {proc.returncode}; {repro()}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, f"{what}; {repro()}\n{proc.stderr[-3000:]}"
        if kind != "SIGKILL":  # a handled signal: a checkpoint of the step it stopped after
            assert f"interrupted by {kind} after step" in proc.stderr and resumed_step(out) > start, \
                f"{what}; {repro()}\n{proc.stderr[-3000:]}"
        kinds[kind] += 1
        phases[phase] += 1
        log.append(what)
    proc = run(args(out, cache_dir))
    assert proc.returncode == 0, f"the final resume failed; {repro()}\n" + "\n".join(log) + proc.stderr[-3000:]
    history = "\n".join(log)

    # Nothing left behind: no temporaries of killed writes, no file moved aside as damaged, no writer lock.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == sorted(
        p.name for p in (reference / "checkpoints").iterdir()), f"{repro()}\n{history}"
    leftovers = [p for p in out.rglob("*") if p.name.endswith((".tmp", ".damaged")) or p.name.startswith("writer.")]
    assert not leftovers, f"{leftovers}; {repro()}\n{history}"

    tensors, worst = 0, 0.0
    for ckpt in sorted((reference / "checkpoints").iterdir()):
        n, diff = compare_checkpoints(out / "checkpoints" / ckpt.name, ckpt, out, reference)
        tensors, worst = tensors + n, max(worst, diff)
    got, disagree = scalars(out)
    want, _ = scalars(reference)
    assert not disagree, f"a step logged twice with different values: {disagree[:5]}; {repro()}\n{history}"
    got, want = ({k: v for k, v in d.items() if k[0] not in MEASURED} for d in (got, want))
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    assert not missing and not extra, f"missing {missing[:8]}, extra {extra[:8]}; {repro()}\n{history}"
    differ = sorted(k for k in want if got[k] != want[k])
    assert not differ, f"scalars differ: {differ[:8]}; {repro()}\n{history}"
    compared = len(want)

    summary = (f"randomized faults seed={SEED}: {COUNT} interruptions ("
               + ", ".join(f"{kinds[k]} {'kill -9' if k == 'SIGKILL' else k}" for k in KINDS) + "; phases "
               + ", ".join(f"{p} {phases[p]}" for p in PHASES) + f") survived, max |diff| {worst:g} over {tensors} "
               f"tensors in {len(list((reference / 'checkpoints').iterdir()))} checkpoints and {compared} scalars")
    with capsys.disabled():
        print("\n" + summary)
