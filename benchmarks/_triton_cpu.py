"""Triton's interpreter made ready to run CUDA-oriented kernel wrappers on CPU tensors: the one copy of these patches,
used by the kernel tests' fixture (tests/conftest.py, `triton_cpu`: make test-kernels) and by a benchmark that
rehearses its GPU code path on a CPU (benchmarks/gpu_check.py --cpu-rehearsal).

They patch this process only, and the kernel libraries run unchanged:
  - torch.cuda.device(index) wraps every launch; with a CPU tensor the index is None and CPU torch fails, so it
    becomes a no-op context;
  - backward kernels size their grids by torch.cuda.get_device_properties(...).multi_processor_count;
  - autotuners would benchmark their configs, which the interpreter cannot: each keeps its first config;
  - the interpreter checks every integer add / mul for overflow (compiled kernels only in debug mode); that check
    is about half of the interpreted time, so it is off;
  - loop indices become tensors, as in compiled kernels (_tensor_loop_index).
TRITON_INTERPRET=1 must be in the environment before triton is first imported (kernels are decorated at import), and
the patched autotuners apply to kernel modules imported inside the context.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import os
import types
from collections.abc import Iterator

import torch

_MISSING = object()


def _tensor_loop_index(transformer: ast.NodeTransformer, node: ast.For) -> ast.For:
    """The interpreter's kernel rewriter, for loops: in `for i in range(n)` compiled Triton makes `i` a tensor
    (kernels call `i.to(tl.int64)`), the interpreter a Python int. The index is converted at the top of the body,
    as the interpreter already does for every assignment. `tl.static_range` (a compile-time index) is left alone."""
    node = transformer.generic_visit(node)
    func = getattr(node.iter, "func", None)
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name == "range" and isinstance(node.target, ast.Name):
        to_tensor = ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor",
                                  ctx=ast.Load())
        convert = ast.Assign(targets=[ast.Name(id=node.target.id, ctx=ast.Store())],
                             value=ast.Call(func=to_tensor, args=[ast.Name(id=node.target.id, ctx=ast.Load()),
                                                                  ast.Constant(value=False)], keywords=[]))
        node.body.insert(0, ast.copy_location(convert, node.body[0]))
    return node


@contextlib.contextmanager
def interpreted_kernels() -> Iterator[None]:
    """The patches of the module docstring while the context is open; everything patched is put back after."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("Triton's interpreter needs TRITON_INTERPRET=1 in the environment before triton is imported")
    from triton.runtime import autotuner, interpreter

    first_config_init = autotuner.Autotuner.__init__

    def keep_first_config(self, fn, arg_names, configs, *args, **kwargs):
        first_config_init(self, fn, arg_names, configs[:1], *args, **kwargs)

    builder = interpreter.interpreter_builder
    patches = [(autotuner.Autotuner, "__init__", keep_first_config),
               (torch.cuda, "device", lambda index: contextlib.nullcontext()),
               (torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(multi_processor_count=16)),
               (builder, "options", dataclasses.replace(builder.options, sanitize_overflow=False)),
               (interpreter.ASTTransformer, "visit_For", _tensor_loop_index)]
    saved = []
    try:
        for owner, name, value in patches:
            # vars(), not getattr: an attribute that was not there (visit_For) is deleted again, not shadowed
            saved.append((owner, name, vars(owner).get(name, _MISSING)))
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, old in reversed(saved):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
