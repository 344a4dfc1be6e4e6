"""Harness patches that let mamba-ssm's Mamba-3 kernels run under Triton's interpreter (tests only, never recurlen's
code path). Imported by tests/models/mamba3/test_mamba3_kernels_cpu.py inside its fixture, with TRITON_INTERPRET=1.

  - mamba_ssm/ops/triton/mamba3/utils.py's cos / sin / tanh helpers are inline PTX (`cos.approx.f32`, ...), which
    the interpreter refuses: they are replaced by the same functions written in triton.language (numpy underneath).
  - the wrappers cast q, k, v, the trapezoid's weight, the angles and z to bfloat16, and the forward keeps its chunk
    states in bfloat16. The interpreter mishandles bfloat16 (outputs ~1e9, different for each chunk size), so here
    those casts are float32: the tests compare the kernels' algorithm in float32. On a GPU the bf16 casts stay.
  - mamba-ssm's package `__init__` needs its CUDA extension. recurlen's kernel path imports the Triton module with an
    empty package in its place, but only when it has to: where another library (fla's models try to import
    mamba-ssm) left the Triton modules in sys.modules without the package, the kernel imports without it, and
    `mamba_ssm.modules.mamba3` (the reference module, imported by the tests only) would run the failing `__init__`.
    The empty package is put in place for the tests too.
  - two backward wrappers (compute_dzdo, compute_dqkv) assert that their tensors are on CUDA; they are recompiled
    from their own source without that line (the kernels they launch run on CPU tensors under the interpreter).
"""

import importlib
import importlib.util
import inspect
import sys
import types

import pytest
import torch
import triton
import triton.language as tl

CUDA_ASSERTING = ("compute_dzdo", "compute_dqkv")
KERNEL_MODULES = ("mamba3_siso_fwd", "mamba3_siso_bwd", "angle_dt", "mamba3_siso_combined")


@triton.jit
def cos_numpy(x):
    return tl.cos(x)


@triton.jit
def sin_numpy(x):
    return tl.sin(x)


@triton.jit
def tanh_numpy(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def sech2_numpy(x):
    t = 2.0 * tl.sigmoid(2.0 * x) - 1.0
    return 1.0 - t * t


def patch_mamba3_kernels() -> pytest.MonkeyPatch:
    """Apply both patches to the imported kernel modules; undo with the returned MonkeyPatch."""
    patch = pytest.MonkeyPatch()
    torch_f32 = types.ModuleType("torch")  # torch as the wrappers see it, with bfloat16 meaning float32
    torch_f32.__dict__.update(torch.__dict__)
    torch_f32.bfloat16 = torch.float32
    helpers = {"cos_approx": cos_numpy, "sin_approx": sin_numpy, "tanh_approx": tanh_numpy,
               "sech2_approx": sech2_numpy}
    for name in KERNEL_MODULES:
        module = importlib.import_module(f"mamba_ssm.ops.triton.mamba3.{name}")
        patch.setattr(module, "torch", torch_f32)
        for helper, replacement in helpers.items():
            if hasattr(module, helper):
                patch.setattr(module, helper, replacement)
    bwd = importlib.import_module("mamba_ssm.ops.triton.mamba3.mamba3_siso_bwd")
    combined = importlib.import_module("mamba_ssm.ops.triton.mamba3.mamba3_siso_combined")
    for name in CUDA_ASSERTING:
        source = "\n".join(line for line in inspect.getsource(getattr(bwd, name)).splitlines()
                           if "is_cuda" not in line)
        defined: dict = {}
        exec(compile(source, bwd.__file__, "exec"), bwd.__dict__, defined)  # noqa: S102 - its own source, one line less
        patch.setattr(bwd, name, defined[name])
        patch.setattr(combined, name, defined[name])
    return patch


def mamba_ssm_package_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty `mamba_ssm` package in sys.modules where none is (see the module docstring), undone with the patch."""
    if "mamba_ssm" in sys.modules:
        return
    spec = importlib.util.find_spec("mamba_ssm")
    package = types.ModuleType("mamba_ssm")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    monkeypatch.setitem(sys.modules, "mamba_ssm", package)
