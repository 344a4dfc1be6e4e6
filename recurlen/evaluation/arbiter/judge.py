"""Both verdicts on one set of weights: full - reset on held-out text and passkey retrieval by length.

    settings = JudgeSettings(length_factors=[1, 2, 4, 8, 16, 32], trials=16)
    entry = judge(model, label="base+forget_more", kind="fix", source=path, sequences=held_out_NL,
                  tokenizer=tok, train_len=256, settings=settings, fix=record)

The loss is measured as `recurlen eval` measures it (recurlen.evaluation.runner.evaluate_model: the position-wise
loss and the reset control, each held-out sequence's per-bin losses and the bins' paired-bootstrap intervals),
on the first `num_sequences` held-out sequences of the longest passkey length; the passkey prompts are those of
`recurlen passkey` (recurlen.evaluation.tasks.passkey.evaluate_passkey), every trial's outcome kept. A fix is
applied once, before both, so that the two verdicts judge the same weights (a fix calibrated twice, once per
command, could choose other values for each).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import torch

from recurlen.evaluation.runner import EvalConfig, evaluate_model
from recurlen.evaluation.tasks.passkey import evaluate_passkey
from recurlen.util.tokenizers import Tokenizer

log = logging.getLogger(__name__)

KINDS = ("base", "post", "fix")
"""What an entry is: the base, a post-training of it, or the base with a training-free fix."""


@dataclass
class JudgeSettings:
    length_factors: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    """Passkey prompt lengths in units of the training context T; the held-out text is as long as the longest."""
    depths: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0])
    """Where the key sits in the filler (0: first, 1: right before the question)."""
    trials: int = 16
    """Keys per (length, depth): a length's verdict reads trials x len(depths) outcomes."""
    eval_seed: int = 1234
    """Seed of the keys: the same prompts for every model, so their outcomes pair up."""
    num_sequences: int = 32
    """Held-out text sequences the loss is measured on (the calibration of a fix reads the ones after them)."""
    chunk_len: int = 1024
    """Tokens per forward call (the state is carried between calls)."""
    batch_size: int = 16
    """Held-out sequences, or passkey prompts, per forward call."""

    def __post_init__(self) -> None:
        self.length_factors = [int(f) for f in self.length_factors]
        self.depths = [float(d) for d in self.depths]
        if not self.length_factors or any(f < 1 for f in self.length_factors):
            raise ValueError(f"judge.length_factors={self.length_factors} must be multiples >= 1 of T")
        if max(self.length_factors) < 2:
            raise ValueError("judge.length_factors must reach past T (a factor >= 2): the loss verdict reads the "
                             "bins past T")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError(f"judge.depths={self.depths} must be in [0, 1]")
        for name in ("trials", "num_sequences", "chunk_len", "batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"judge.{name} must be a positive integer; got {getattr(self, name)!r}")
        if self.num_sequences < 2:
            raise ValueError("judge.num_sequences must be >= 2: an interval needs at least two sequences")

    def lengths(self, train_len: int) -> list[int]:
        return sorted({f * train_len for f in self.length_factors})

    def text_length(self, train_len: int) -> int:
        return max(self.length_factors) * train_len

    def to_dict(self) -> dict:
        return asdict(self)


def judge(model: torch.nn.Module, *, label: str, kind: str, source: str, sequences: torch.Tensor,
          tokenizer: Tokenizer, train_len: int, settings: JudgeSettings, fix: dict | None = None,
          device: torch.device | None = None) -> dict:
    """One entry of the arbiter's results.json: the loss entry (as recurlen eval writes a run) and the passkey
    result (as recurlen passkey writes one), measured on `model` as it is."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is unknown; allowed: {list(KINDS)}")
    s = settings
    model.eval()
    cfg = EvalConfig(checkpoints=[label], seq_len=s.text_length(train_len), num_sequences=s.num_sequences,
                     train_len=train_len, tasks=["positionwise", "reset"], log_bins=0, chunk_len=s.chunk_len,
                     batch_size=s.batch_size, progress=False)
    loss = evaluate_model(model, sequences, cfg=cfg, train_len=train_len, label=label, source=source,
                          device=device or torch.device("cpu"))
    passkey = evaluate_passkey(model, tokenizer, lengths=s.lengths(train_len), depths=s.depths, trials=s.trials,
                               seed=s.eval_seed, batch_size=s.batch_size, chunk_len=s.chunk_len, progress=False)
    log.info("%s: passkey mean accuracy by length %s", label,
             {n: round(a, 2) for n, a in passkey["mean_accuracy_by_length"].items()})
    entry = {"label": label, "kind": kind, "source": source, "train_len": train_len, "loss": loss,
             "passkey": passkey}
    if fix is not None:
        entry["fix"] = fix
    return entry


__all__ = ["KINDS", "JudgeSettings", "judge"]
