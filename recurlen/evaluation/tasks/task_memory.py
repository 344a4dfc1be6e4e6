"""The memory a passkey or NIAH evaluation needs, said by the plan and refused in one line before the task trains or
evaluates, as a training run's memory is (recurlen.training.memory, whose parts it reuses).

The model reads a prompt in chunks (its memory does not grow with the length), but the prompts themselves are Python
lists of token ids built whole: `recurlen niah task.lengths=[1000000000]` was killed by the system at 22 GB after 70
s, before its first prompt was complete. What one cell at the longest length L holds at once, per token of L:

- the haystack: the filler (the passkey sentences, passkey's and niah's default) is tokenised as one text of 2 L
  tokens and cut; with the byte tokenizer that costs ~40 B per token of L at the peak, with a `tokenizers`
  tokenizer ~1150 B (its own buffers while it encodes 2 L tokens; measured 1135 B with a BPE tokenizer.json of
  3.7 characters per token). niah's embedded haystack is a tiled window (~48 B); the held-out one keeps `trials`
  rows as a tensor and as lists (16 B each);
- the cell's `trials` prompts: 8 B each (list entries; the token objects are the haystack's);
- a batch of `eval_batch_size` of them, copied into lists and a LongTensor: 16 B each.

Measured with the byte tokenizer at L = 2M (peak RSS over the process before the first prompt): 46 to 229 B per
token for trials x batch from 1 x 1 to 8 x 8, which this sum (48 + 8 trials + 16 batch) meets within 15%; with the
BPE tokenizer 1135 B whatever the trials, this sum 1150 + 8 trials + 16 batch. Besides that: the process
(memory.PROCESS_BYTES), the model's float32 weights and its forward pass over one chunk, at most what a training step
keeps of it (memory.activation_bytes; the no-grad forward frees each layer's intermediates).

On a GPU the model, the batch's tensor and the forward are there and the prompts stay on the host: each side is
checked against its own memory, the GPU's forward as the upper bound it is (refused only when the weights and the
batch alone do not fit, as training's kernel path is).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recurlen.models import registry
from recurlen.training import memory
from recurlen.util.errors import UserError

PROMPT_TASKS = ("passkey", "niah")
"""The tasks whose evaluation builds prompts of task.lengths tokens from a haystack (estimated here)."""
FILLER_BYTES = {"bytes": 48, "other": 1150}
"""Bytes per token of L at the filler's peak: the byte tokenizer, any other (see the module docstring)."""
EMBEDDED_BYTES = 48
PROMPT_BYTES = 8
BATCH_BYTES = 16


@dataclass(frozen=True)
class TaskMemory:
    task: str
    length: int
    trials: int
    batch: int
    chunk: int
    per_token: int
    """Host bytes per token of the longest length: haystack, prompts, a batch."""
    weights: int
    forward: int
    """The model's forward over one chunk of the batch: at most what a training step keeps of it."""
    device: str

    @property
    def prompts(self) -> int:
        return self.per_token * self.length

    @property
    def host(self) -> int:
        """CPU memory: the process and the prompts, plus the model on a CPU."""
        return memory.PROCESS_BYTES + self.prompts + (self.weights + self.forward if self.device == "cpu" else 0)

    @property
    def device_bytes(self) -> int:
        """GPU memory (on a GPU): the weights, the batch's tokens, the forward."""
        return self.weights + 8 * self.batch * self.length + self.forward

    def describe(self) -> str:
        parts = (f"the prompts and their haystack {memory.size_text(self.prompts)}, the model "
                 f"{memory.size_text(self.weights)}, its forward over a chunk of {self.chunk} tokens at most "
                 f"{memory.size_text(self.forward)}, the process ~{memory.size_text(memory.PROCESS_BYTES)}")
        where = (f"about {memory.size_text(self.host)} of CPU memory" if self.device == "cpu" else
                 f"about {memory.size_text(self.host)} of CPU memory and at most {memory.size_text(self.device_bytes)}"
                 " of GPU memory")
        return (f"{self.task} at {self.length} tokens, {self.trials} trial{'s' * (self.trials != 1)} in batches of "
                f"{self.batch}: {where} ({parts})")

    def refusal(self, cpu_available: int | None, gpu_available: int | None = None) -> str | None:
        """The one line that refuses the task here (None: it fits, or what is available cannot be read)."""
        lower = "lower task.lengths{fit}, task.trials or task.eval_batch_size"
        if cpu_available is not None and self.host > cpu_available:
            room = cpu_available - (self.host - self.prompts)
            fit = f" (up to about {room // self.per_token} tokens fit)" if room > self.per_token else ""
            return (f"{self.describe()}, but {memory.size_text(cpu_available)} of CPU memory is available; "
                    + lower.format(fit=fit))
        if (self.device == "cuda" and gpu_available is not None
                and self.weights + 8 * self.batch * self.length > gpu_available):
            return (f"{self.describe()}, but {memory.size_text(gpu_available)} of GPU memory is available; "
                    + lower.format(fit=""))
        return None


def for_task(cfg, lengths: list[int], *, model=None) -> TaskMemory | None:
    """The estimate for a passkey / niah experiment evaluating `lengths` (None for the other tasks): of `model` when
    it is built, else of the shape cfg.model names (on the meta device; nothing is loaded)."""
    t = cfg.task
    if t.name not in PROMPT_TASKS or not lengths:
        return None
    haystack = "filler" if t.name == "passkey" else t.niah.haystack
    kind = "bytes" if cfg.data.tokenizer in ("bytes", "byte") else "other"
    per_token = {"filler": FILLER_BYTES[kind], "embedded": EMBEDDED_BYTES,
                 "heldout": 2 * BATCH_BYTES * t.trials}[haystack]
    batch = min(t.eval_batch_size, t.trials)
    per_token += PROMPT_BYTES * t.trials + BATCH_BYTES * batch
    cuda = torch.cuda.is_available()  # where the task's evaluation runs (recurlen.evaluation.tasks.runner._load)
    weights = forward = 0
    if not (model is None and cfg.model.pretrained and cfg.model.name == "custom"):  # else: a shape unknown yet
        if model is None:
            with torch.device("meta"):
                model = registry.get(cfg.model.architecture).build(cfg.model.config, backend="torch")
        weights = sum(p.numel() for p in model.parameters()) * 4
        forward, _ = memory.activation_bytes(registry.of_model(model).name, model.config, lanes=batch,
                                             seq_len=min(t.chunk_len, max(lengths)))
    return TaskMemory(task=t.name, length=max(lengths), trials=t.trials, batch=batch, chunk=t.chunk_len,
                      per_token=per_token, weights=weights, forward=forward, device="cuda" if cuda else "cpu")


def check_fits(est: TaskMemory | None) -> None:
    """A UserError when the task's evaluation cannot fit here (before it trains or writes anything)."""
    if est is None:
        return
    gpu = memory.available_bytes("cuda") if est.device == "cuda" else None
    refusal = est.refusal(memory.available_bytes("cpu"), gpu)
    if refusal is not None:
        raise UserError(refusal)


__all__ = ["PROMPT_TASKS", "TaskMemory", "check_fits", "for_task"]
