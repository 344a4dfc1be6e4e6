"""Which path a forward takes: the pure-PyTorch scan or an architecture's optional kernels.

    backend='torch'   always the PyTorch path (CPU, tests, the oracle)
    backend='kernel'  the kernels, or a ValueError that names what is missing
    backend='auto'    the kernels on CUDA when they import; otherwise PyTorch (one warning on CUDA)

An architecture declares its kernels as a `KernelPath` (how to import them, how to install them, whether
Triton's CPU interpreter can run them); the choice above is made here, once, for every architecture.
Nothing here imports a kernel package: `load` does, the first time a kernel backend is asked for.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

BACKENDS = ("auto", "torch", "kernel")
log = logging.getLogger(__name__)


def check_backend(value: str) -> str:
    if value not in BACKENDS:
        raise ValueError(f"unknown backend {value!r}; allowed: {list(BACKENDS)}")
    return value


def interpreter_on() -> bool:
    """Triton's interpreter was asked for (it runs kernels on CPU tensors; set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


@dataclass(frozen=True)
class KernelPath:
    what: str
    """What the kernel backend runs, for messages ("mamba-ssm's Triton kernels")."""
    load: Callable[[], tuple[Any, str | None]]
    """(the kernels, None) or (None, why they did not import); cached by the architecture."""
    install_cuda: str
    """How to install them on a CUDA machine."""
    install_cpu: str | None = None
    """How to install them for Triton's CPU interpreter; None: they cannot run on a CPU at all."""

    def require(self, device: torch.device) -> None:
        """ValueError naming what is missing when backend='kernel' cannot run on `device`."""
        on_interpreter = device.type == "cpu" and interpreter_on() and self.install_cpu is not None
        if device.type != "cuda" and not on_interpreter:
            where = ("on a CPU they run only under Triton's interpreter (TRITON_INTERPRET=1 before triton is "
                     "imported, with recurlen[kernels-cpu]): make test-kernels") if self.install_cpu else \
                "they have no CPU path"
            raise ValueError(f"backend='kernel' needs a CUDA device for {self.what}; the model is on {device}. "
                             f"Use backend='torch' (or 'auto') here; {where}.")
        fns, why = self.load()
        if fns is None:
            install = self.install_cuda if device.type == "cuda" else self.install_cpu
            raise ValueError(f"backend='kernel' needs {self.what}, which did not import ({why}). "
                             f"Install them: {install}; or use backend='torch'.")

    def auto(self, device: torch.device) -> bool:
        """backend='auto': the kernels on CUDA when they import; otherwise the PyTorch path (one warning on CUDA)."""
        if device.type != "cuda":
            return False
        fns, why = self.load()
        if fns is None:
            _warn_auto_without_kernels(self.what, why, self.install_cuda)
            return False
        return True

    def uses_kernels(self, backend: str, device: torch.device) -> bool:
        backend = check_backend(backend)
        if backend == "torch":
            return False
        if backend == "kernel":
            self.require(device)
            return True
        return self.auto(device)


@functools.cache
def _warn_auto_without_kernels(what: str, why: str, install: str) -> None:
    warnings.warn(f"backend='auto' on CUDA: {what} did not import ({why}); using the PyTorch path, which is much "
                  f"slower. Install them: {install}.", RuntimeWarning, stacklevel=5)


__all__ = ["BACKENDS", "KernelPath", "check_backend", "interpreter_on"]


def import_without_failing_init(package: str, load: Callable[[], Any], what: str) -> tuple[Any, str | None]:
    """(load(), None), or (None, why not). A package whose `__init__` fails (mamba-ssm built without its CUDA
    extensions, `MAMBA_SKIP_CUDA_BUILD=TRUE`, loads Mamba-1's extension there) is given an empty package in place of
    its `__init__`, so that `load` can import its Triton modules; `what` names them in the log line that says so."""
    try:
        return load(), None
    except Exception as err:  # ImportError, or a CUDA extension that fails to load
        first = f"{type(err).__name__}: {err}"
    if package in sys.modules or importlib.util.find_spec(package) is None:
        return None, first  # the package imported (the failure is the kernel's), or it is not installed
    spec = importlib.util.find_spec(package)
    empty = types.ModuleType(package)
    empty.__path__ = list(spec.submodule_search_locations)
    empty.__spec__ = spec
    sys.modules[package] = empty
    try:
        loaded = load()
    except Exception as err:
        sys.modules.pop(package, None)
        return None, f"{first}; without the package __init__: {type(err).__name__}: {err}"
    log.info("%s's package __init__ failed (%s); using %s without it", package, first, what)
    return loaded, None
