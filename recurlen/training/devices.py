"""What this machine can run, checked before anything is imported, built or written: the accelerator, the device
count and the distributed strategy a trainer section asks for, and this process's launch rank.

Lightning says the same things, but with a 30-40 line traceback once the experiment is built and config.yaml is
written (and the left-over run directory then makes resume=never refuse the rerun). Nothing here imports
Lightning, and torch only inside the checks that ask it (launch_rank is read before anything is imported).
"""

from __future__ import annotations

import importlib.util
import os

from recurlen.util.errors import UserError

CPU_STRATEGIES = ("auto", "single_device", "ddp")
"""What runs on CPU: one process, or DDP over gloo with trainer.devices=N processes (tested: a 2-rank run resumes
bit-identically). FSDP and DeepSpeed are CUDA-only in Lightning; ddp_spawn pickles the Trainer into each spawned
process, and a run's callbacks hold its writer lock and signal handlers, which do not pickle (TypeError: cannot
pickle '_thread.RLock' object, on CPU and GPU alike)."""
SPAWN_STRATEGIES = ("ddp_spawn",)


def uses_cuda(accelerator: str) -> bool:
    """Whether a trainer.accelerator value trains on a CUDA GPU here ('auto' does when one is available)."""
    import torch

    accelerator = str(accelerator).lower()
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def strategies_here(accelerator: str, *, cuda: bool | None = None, deepspeed: bool | None = None) -> list[str]:
    """The trainer.strategy values that run with this accelerator on this machine (with what is installed)."""
    cuda = uses_cuda(accelerator) if cuda is None else cuda
    deepspeed = importlib.util.find_spec("deepspeed") is not None if deepspeed is None else deepspeed
    return [*CPU_STRATEGIES, *(["fsdp"] if cuda else []), *(["deepspeed"] if cuda and deepspeed else [])]


def strategy_problem(strategy: str, accelerator: str, *, cuda: bool | None = None,
                     deepspeed: bool | None = None) -> str | None:
    """Why trainer.strategy cannot run here (one line naming what can), or None when it can."""
    cuda = uses_cuda(accelerator) if cuda is None else cuda
    deepspeed = importlib.util.find_spec("deepspeed") is not None if deepspeed is None else deepspeed
    here = strategies_here(accelerator, cuda=cuda, deepspeed=deepspeed)
    if strategy in here:
        return None
    where = (f"trainer.accelerator={accelerator} on this machine trains on "
             + ("a CUDA GPU" if cuda else "the CPU"))
    if strategy in SPAWN_STRATEGIES:
        why = ("is not supported: it pickles the Trainer into spawned processes, and a run's writer lock and signal "
               "handling do not pickle; trainer.strategy=ddp starts the same ranks as processes of their own")
    elif strategy == "deepspeed" and cuda:
        why = "needs the deepspeed package, which is not installed (pip install deepspeed)"
    elif strategy in ("fsdp", "deepspeed"):
        why = "needs a CUDA GPU (Lightning runs it on CUDA only)"
    else:
        why = "is unknown"
    return f"trainer.strategy={strategy} {why}; {where}, where these run: {', '.join(here)}"


def check_strategy(t) -> None:
    """UserError for a trainer section whose strategy cannot run here (see strategy_problem)."""
    problem = strategy_problem(str(t.strategy), str(t.accelerator))
    if problem:
        raise UserError(problem)


def check_devices(t) -> None:
    """Devices this machine cannot give are a one-line error before any model or data is built (Lightning would
    say so with a traceback, after the heavy work)."""
    import torch

    accelerator = str(t.accelerator).lower()
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"trainer.accelerator={t.accelerator} but this machine has no usable CUDA GPU (torch "
                            f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'}); use "
                            "trainer.accelerator=cpu or auto")
        devices = str(t.devices)
        count = torch.cuda.device_count()
        if devices in ("auto", "-1"):
            wanted = 0
        elif devices.isdigit():
            wanted = int(devices)
        else:
            wanted = len([d for d in devices.split(",") if d.strip()])
        if wanted > count:
            raise UserError(f"trainer.devices={devices} asks for {wanted} GPUs; this machine has {count}")
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise UserError("trainer.accelerator=mps but MPS is not available here; use trainer.accelerator=cpu or auto")


def launch_rank() -> int:
    """This process's rank as its launcher set it, before the Trainer exists (0 for a plain single process)."""
    for name in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    node = int(os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or 0)
    local = int(os.environ.get("LOCAL_RANK") or 0)
    return 0 if node == 0 and local == 0 else 1


__all__ = ["CPU_STRATEGIES", "check_devices", "check_strategy", "launch_rank", "strategies_here", "strategy_problem",
           "uses_cuda"]
