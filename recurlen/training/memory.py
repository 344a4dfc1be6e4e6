"""How much memory a training run needs, said before its first step (and by --dry-run), and refused when it cannot fit.

A run that does not fit is otherwise killed by the kernel with no message (`data.batch_size=100000` on a nano
model: exit 137 at 14 GB), or fails with a CUDA out-of-memory error after the model, data and run directory are
set up. The estimate has three parts:

- weights, their gradients and AdamW's two moments: 4 x the parameters' bytes (sharded over the ranks by FSDP);
- activations: what autograd keeps for the backward pass. They are *measured*, not guessed from a formula: the
  model is built on PyTorch's meta device (shapes only, no memory, no compute) and one forward pass of one lane
  at length min(T, PROBE_LEN) adds up the bytes of every tensor saved for backward. Scans are chunked, so this is
  linear in the lanes and in T: it is scaled to the run's lanes per rank x T. The sum counts views of one buffer
  more than once, which makes it ~20% high; the backward pass's own temporaries make the real peak ~5-10% higher
  than what is saved (measured on the nano and tiny Mamba-2 models at batch 8-16 x T 1024-2048). The two roughly
  cancel: BACKWARD_FACTOR keeps a margin. Where the step computes its loss in chunks (trainer.head_loss=chunked, or
  auto with logits above one chunk: recurlen.models.head_loss), that loss keeps no logits, only the hidden states'
  gradient per position and the head weight's float32 gradient once per step, whatever the batch, and so does the
  estimate (tests/training/test_memory.py measures a chunked step against it);
- the process itself (Python, torch, the data): PROCESS_BYTES.

The kernel backend (mamba-ssm / fla on CUDA) keeps fewer activations than the PyTorch path measured here, so on
that path the estimate is an upper bound: a run is refused only when its weights and optimizer state alone do not
fit, and warned about otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from recurlen.models import registry
from recurlen.util.errors import UserError

log = logging.getLogger(__name__)

PROBE_LEN = 1024
"""The length the meta-device forward pass runs at (longer T is scaled linearly)."""
BACKWARD_FACTOR = 1.25
"""The peak of a step over the activations saved for backward (the backward pass's own temporaries, a margin)."""
PROCESS_BYTES = 512 * 2**20
"""Python, torch, Lightning and the data pipeline of a CPU run (measured: ~380 MiB resident before the first step)."""
GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    gradients: int
    optimizer: int
    activations: int
    """Of the whole step: lanes per rank x T."""
    per_lane: int
    """Activations of one lane (what one more unit of data.batch_size costs)."""
    device: str
    """'cpu' or 'cuda'."""
    upper_bound: bool = False
    """The activations were measured on the PyTorch path and the run uses kernels (which keep fewer)."""
    activations_fixed: int = 0
    """Of the activations, what does not grow with the lanes (the chunked head loss's float32 head gradient)."""

    @property
    def fixed(self) -> int:
        """What does not grow with the batch: weights, gradients, optimizer state, and the process on a CPU."""
        return self.weights + self.gradients + self.optimizer + (PROCESS_BYTES if self.device == "cpu" else 0)

    @property
    def total(self) -> int:
        return self.fixed + int(BACKWARD_FACTOR * self.activations)

    def describe(self) -> str:
        what = "at most " if self.upper_bound else "about "
        kind = "GPU" if self.device == "cuda" else "CPU"
        return (f"{what}{size_text(self.total)} of {kind} memory per rank (activations "
                f"{size_text(int(BACKWARD_FACTOR * self.activations))}, weights {size_text(self.weights)}, gradients "
                f"{size_text(self.gradients)}, AdamW state {size_text(self.optimizer)}"
                + (", the process ~" + size_text(PROCESS_BYTES) if self.device == "cpu" else "") + ")")

    def lanes_that_fit(self, available: int) -> int:
        room = available - self.fixed - BACKWARD_FACTOR * self.activations_fixed
        return max(0, int(room / (BACKWARD_FACTOR * self.per_lane))) if self.per_lane else 0


def size_text(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"


def activation_bytes(architecture: str, config, *, lanes: int, seq_len: int,
                     head_loss: str = "auto") -> tuple[int, int]:
    """(bytes of the activations a training step of `lanes` x `seq_len` tokens keeps for backward, of one lane):
    one lane's forward pass on the meta device, at min(seq_len, PROBE_LEN), scaled, with the loss as
    trainer.head_loss=`head_loss` computes it at that step's lanes x seq_len positions. The first number is
    lanes x the second, plus (chunked loss) what the loss keeps once per step."""
    from recurlen.training.lit_module import chunks_head_loss, token_loss

    probe_len = min(seq_len, PROBE_LEN)
    with torch.device("meta"):
        model = registry.get(architecture).build(config, backend="torch")
    # The device context reaches a factory function only through torch's cached list of them, and that list holds
    # whatever torch.linspace was when it was first read: transformers' from_pretrained reads it while it has
    # torch.linspace patched, after which a torch.linspace in an __init__ (RWKV-6's decay ramp) builds on the CPU.
    # Moving what was built is exact for any such tensor and free for the rest.
    model = model.to("meta")
    chunked = hasattr(model, "head_rows") and chunks_head_loss(model, lanes * seq_len, head_loss)
    params = {id(p) for p in model.parameters()}
    saved = 0

    def count(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        if id(t) not in params:  # a weight saved for backward is counted with the weights
            saved += t.numel() * t.element_size()
        return t

    ids = torch.zeros(1, probe_len, dtype=torch.long, device="meta")
    once = 0  # bytes the loss keeps once per step, however many lanes
    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        if chunked:
            hidden_1LD, _ = model.forward_hidden(ids)
        else:
            logits, _ = model(ids)
            token_loss(logits, ids, None)
    if chunked:
        # What chunked_head_loss saves for its backward, and nothing else (its logits live one chunk at a time): the
        # hidden states' gradient, in their dtype, and the head weight's, in float32 (float64 for a float64 head).
        # Read off the shapes: the loss cannot run on the meta device (autocast refuses it), and a test measures it.
        saved += hidden_1LD.numel() * hidden_1LD.element_size()
        weight = model.lm_head.weight
        once = weight.numel() * torch.promote_types(weight.dtype, torch.float32).itemsize
    per_lane = int(saved * seq_len / probe_len)
    return per_lane * lanes + once, per_lane


def estimate(model_config, architecture: str, *, lanes: int, seq_len: int, num_params: int, device: str,
             precision: str, strategy: str, world_size: int, kernels: bool,
             head_loss: str = "auto") -> MemoryEstimate:
    """The memory one rank of a training run needs (see the module docstring)."""
    activations, per_lane = activation_bytes(architecture, model_config, lanes=lanes, seq_len=seq_len,
                                             head_loss=head_loss)
    once = activations - per_lane * lanes  # the chunked loss's head gradient: float32 at any precision
    if "16" in precision:  # mixed / half precision keeps most activations in 16 bits
        activations, per_lane = (activations - once) // 2 + once, per_lane // 2
    weight_bytes = 2 if precision in ("bf16-true", "16-true") else 4
    shards = world_size if strategy.startswith("fsdp") else 1
    weights = num_params * weight_bytes // shards
    return MemoryEstimate(weights=weights, gradients=weights, optimizer=2 * num_params * 4 // shards,
                          activations=activations, per_lane=per_lane, device=device,
                          upper_bound=kernels and device == "cuda", activations_fixed=once)


def available_bytes(device: str) -> int | None:
    """Memory this process could still get: free GPU memory, or the CPU's available memory within the cgroup's
    limit (a container or a SLURM job's --mem). None when it cannot be read."""
    if device == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info()
            return int(free)
        except (RuntimeError, AssertionError):
            return None
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit, usage = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 2**60:
            found.append(int(limit) - int(usage))
        break
    if not found and hasattr(os, "sysconf"):
        with contextlib.suppress(ValueError, OSError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return min(found) if found else None


def check_fits(est: MemoryEstimate, *, already_resident: int = 0, lanes: int, seq_len: int) -> None:
    """A UserError when the run cannot fit (naming the estimate, what is available and what to lower); a warning
    when the estimate is only an upper bound that does not fit. already_resident: bytes of the estimate that this
    process holds already (the loaded weights): they are not in the available memory any more."""
    available = available_bytes(est.device)
    if available is None:
        return
    available += already_resident
    if est.total <= available:
        return
    fit = est.lanes_that_fit(available)
    lower = (f"lower data.batch_size (about {fit} lanes of T={seq_len} fit)" if fit else
             "data.batch_size=1 does not fit either: lower data.seq_len" if est.per_lane else "")
    others = "; or shard the weights and optimizer state over more GPUs (trainer.strategy=fsdp)" if (
        est.device == "cuda") else ""
    text = (f"this run needs {est.describe()} for {lanes} lanes of T={seq_len} tokens, but {size_text(available)} is "
            f"available; {lower}{others}")
    if est.upper_bound and est.fixed <= available:
        log.warning("%s (the estimate is an upper bound on the kernel path: trying anyway)", text)
        return
    raise UserError(text)




def for_experiment(cfg, model=None) -> MemoryEstimate:
    """The estimate for an experiment config: of `model` when it is built, else of the shape cfg.model names
    (built on the meta device to count its parameters)."""
    t = cfg.trainer
    cuda = t.accelerator in ("gpu", "cuda") or (t.accelerator == "auto" and torch.cuda.is_available())
    precision = t.precision if t.precision != "auto" else ("bf16-mixed" if cuda else "32-true")
    if model is None:
        with torch.device("meta"):
            model = registry.get(cfg.model.architecture).build(cfg.model.config, backend="torch")
    architecture = registry.of_model(model).name
    kernels = cuda and cfg.model.backend in ("auto", "kernel")
    return estimate(model.config, architecture, lanes=cfg.data.batch_size, seq_len=cfg.data.seq_len,
                    num_params=sum(p.numel() for p in model.parameters()), device="cuda" if cuda else "cpu",
                    precision=precision, strategy=t.strategy, world_size=_worldsize_text(t) if cuda else 1,
                    kernels=kernels, head_loss=t.head_loss)


def _worldsize_text(t) -> int:
    devices = str(t.devices).strip()
    if devices.isdigit():
        per_node = int(devices)
    elif "," in devices:
        per_node = len([d for d in devices.split(",") if d.strip()])
    else:
        per_node = max(1, torch.cuda.device_count())
    return per_node * t.num_nodes


__all__ = ["MemoryEstimate", "activation_bytes", "available_bytes", "check_fits", "estimate", "for_experiment",
           "size_text"]
