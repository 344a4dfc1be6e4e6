"""Triton's interpreter made ready to run CUDA-oriented kernel wrappers on CPU tensors, for a rehearsal on a CPU.

The same neutralisations as the kernel tests' fixture (tests/conftest.py, `triton_cpu`), for a benchmark that
rehearses its GPU code path on a CPU (benchmarks/gpu_check.py --cpu-rehearsal). They patch this process only, and
the kernel libraries run unchanged:
  - torch.cuda.device(index) wraps every launch; with a CPU tensor the index is None and CPU torch fails, so it
    becomes a no-op context;
  - backward kernels size their grids by torch.cuda.get_device_properties(...).multi_processor_count;
  - autotuners would benchmark their configs, which the interpreter cannot: each keeps its first config;
  - the interpreter checks every integer add / mul for overflow (compiled kernels only in debug mode); that check
    is about half of the interpreted time, so it is off.
TRITON_INTERPRET=1 must be in the environment before triton is first imported (kernels are decorated at import).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import types
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def interpreted_kernels() -> Iterator[None]:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("Triton's interpreter needs TRITON_INTERPRET=1 in the environment before triton is imported")
    from triton.runtime import autotuner, interpreter

    first_config_init = autotuner.Autotuner.__init__

    def keep_first_config(self, fn, arg_names, configs, *args, **kwargs):
        first_config_init(self, fn, arg_names, configs[:1], *args, **kwargs)

    builder = interpreter.interpreter_builder
    saved = (torch.cuda.device, torch.cuda.get_device_properties, builder.options)
    autotuner.Autotuner.__init__ = keep_first_config
    torch.cuda.device = lambda index: contextlib.nullcontext()
    torch.cuda.get_device_properties = lambda device: types.SimpleNamespace(multi_processor_count=16)
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    try:
        yield
    finally:
        autotuner.Autotuner.__init__ = first_config_init
        torch.cuda.device, torch.cuda.get_device_properties, builder.options = saved
