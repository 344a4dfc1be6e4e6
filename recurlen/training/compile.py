"""`trainer.compile=true`: a training step's forward and loss through torch.compile, eager where it cannot compile.

torch.compile traces on the first call, so a model it cannot compile (an op dynamo does not support, a kernel
library it cannot trace, no C++ compiler for inductor's CPU code) fails there, not when the run is set up. Such a
failure is said in one warning line naming the error, and the run goes on eagerly: the same step, uncompiled.
Any other error (a wrong shape, out of memory) is the step's own and is raised as it would be eagerly: a dynamo
error in the first call is retried eagerly, which raises the step's own error if it has one.

What it gains was measured side by side with eager (docs/benchmarks.md, "trainer.compile"): the default is off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)


class CompiledForward:
    """fn through torch.compile, falling back to fn itself (for the rest of the run) where compiling fails."""

    def __init__(self, fn: Callable[..., Any], *, what: str = "the model",
                 backend: str | Callable = "inductor") -> None:
        self.eager = fn
        self.what = what
        self.compiled: Callable[..., Any] | None = torch.compile(fn, backend=backend)
        self.failure: str | None = None

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            return self.eager(*args)
        try:
            return self.compiled(*args)
        except torch._dynamo.exc.TorchDynamoException as err:  # inductor's and the backends' errors derive from it
            self.failure = _one_line(err)
            self.compiled = None
        log.warning("trainer.compile: torch.compile failed for %s (%s); training eagerly", self.what, self.failure)
        return self.eager(*args)


def _one_line(err: BaseException) -> str:
    """The error and what caused it (a backend's own error is the cause of dynamo's), on one line."""
    parts = []
    while err is not None and len(parts) < 3:
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
        parts.append(f"{type(err).__name__}: {first}"[:300])
        err = err.__cause__ or getattr(err, "inner_exception", None)
    return " <- ".join(parts)


__all__ = ["CompiledForward"]
