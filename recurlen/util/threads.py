"""How many torch threads a standalone command uses: one per core that other processes leave free.

torch's default is one thread per core whatever the machine's load; on a shared machine at a load of ~7 per core a
fine-tuning ran 60x slower with it than with one thread, its threads waiting on each other and on the other
processes. The demo gives each of its stages a fixed share (recurlen.commands.demo); a command run on its own
takes the cores the load average leaves free, at least one, and says so in one line (training keeps torch's
default unless trainer.num_threads is set, and says which count would suit: see set_threads).
"""

from __future__ import annotations

import math
import os
import sys

WAIT_POLICY = "OMP_WAIT_POLICY"


def choose_threads(cpus: int, load: float) -> int:
    """Threads for `cpus` usable cores at a one-minute load average of `load` (runnable processes): the cores
    the load leaves free, rounded half up (load 1.4 on 2 cores leaves 1), between 1 and cpus."""
    free = math.floor(cpus - load + 0.5)
    return max(1, min(cpus, free))


def usable_cpus() -> int:
    """Cores this process may run on (its affinity: a container's or a SLURM job's share), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None


def wait_passively_when_busy(env: dict | None = None) -> bool:
    """On a busy machine (a one-minute load of at least one runnable process per usable core), make OpenMP's idle
    threads sleep instead of spinning: OMP_WAIT_POLICY=PASSIVE, unless the user set a policy. Returns whether it did.

    Spinning threads that wait at each parallel region's barrier for a sibling the scheduler has parked cost a
    2-thread training step 7x its time at a load of 6 on 2 cores (benchmarks/bench_wait_policy.py). The policy
    changes how threads wait, never how work is split, so the numbers stay bit for bit those of the same thread
    count. OpenMP reads the variable when it starts, so this runs before torch is imported (and is inherited by the
    processes a command starts: the demo's stages); an idle machine keeps the default."""
    env = os.environ if env is None else env
    if WAIT_POLICY in env or "torch" in sys.modules:
        return False
    load = load_average()
    if load is None or load < usable_cpus():
        return False
    env[WAIT_POLICY] = "PASSIVE"
    return True


def set_threads(requested: int | None = None, *, setting: str = "num_threads", choose: bool = True) -> str:
    """Set torch's intra-op threads and say how many and why (one line): `requested` (a command's setting) as it
    is; else OMP_NUM_THREADS as torch read it; else choose_threads from the free cores, or with choose=False
    torch's default with the count that would suit (training: a float sum over 1 or 2 threads differs in its last
    bits, so a run that chose by the load could not resume bit for bit; it asks for a fixed setting instead)."""
    import torch

    cpus = usable_cpus()
    if requested:
        torch.set_num_threads(requested)
        return f"torch threads: {requested} ({setting}={requested}; {cpus} cores here)"
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return (f"torch threads: {torch.get_num_threads()} (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; "
                f"{setting}=N to choose)")
    load = load_average()
    if load is None:
        return f"torch threads: {torch.get_num_threads()} (torch's default; the load average cannot be read here)"
    threads, free = choose_threads(cpus, load), f"load average {load:.1f} on {cpus} cores"
    if choose:
        torch.set_num_threads(threads)
        return f"torch threads: {threads} ({free} leaves ~{max(0.0, cpus - load):.1f} free; {setting}=N to choose)"
    default = torch.get_num_threads()
    if threads >= default:
        return f"torch threads: {default} (torch's default, one per core; {free})"
    return (f"torch threads: {default} (torch's default, one per core), but the {free} leaves ~"
            f"{max(0.0, cpus - load):.1f} free: {setting}={threads} would run faster (a run keeps one fixed count, "
            "so that a resume repeats it bit for bit)")


__all__ = ["choose_threads", "load_average", "set_threads", "usable_cpus"]
