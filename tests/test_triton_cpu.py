"""benchmarks/_triton_cpu.py, the one copy of the Triton-interpreter patches that the kernel tests' fixture
(tests/conftest.py, `triton_cpu`) and the GPU check's CPU rehearsal (benchmarks/gpu_check.py --cpu-rehearsal) enter:
what it patches while open, that it puts everything back, and its rewrite of kernel loop indices."""

import ast
import contextlib
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def triton_cpu_module(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import _triton_cpu

    return _triton_cpu


def test_the_patches_hold_inside_the_context_and_are_undone_after(triton_cpu_module, monkeypatch):
    from triton.runtime import autotuner, interpreter

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    before = (torch.cuda.device, torch.cuda.get_device_properties, autotuner.Autotuner.__init__,
              interpreter.interpreter_builder.options)
    had_visit_for = "visit_For" in vars(interpreter.ASTTransformer)
    with triton_cpu_module.interpreted_kernels():
        assert isinstance(torch.cuda.device(None), contextlib.nullcontext)
        assert torch.cuda.get_device_properties(0).multi_processor_count == 16
        assert autotuner.Autotuner.__init__ is not before[2]
        assert interpreter.interpreter_builder.options.sanitize_overflow is False
        # the kernel tests' loop-index rewrite, which the rehearsal's own copy of the patches lacked
        assert vars(interpreter.ASTTransformer)["visit_For"] is triton_cpu_module._tensor_loop_index
    assert (torch.cuda.device, torch.cuda.get_device_properties, autotuner.Autotuner.__init__,
            interpreter.interpreter_builder.options) == before
    assert ("visit_For" in vars(interpreter.ASTTransformer)) == had_visit_for


def test_without_the_interpreter_in_the_environment_it_refuses(triton_cpu_module, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"), triton_cpu_module.interpreted_kernels():
        pass


def test_range_loop_indices_become_tensors_and_static_ranges_stay(triton_cpu_module):
    source = "for i in range(n):\n    x = i\nfor j in tl.static_range(4):\n    y = j\n"
    transformer = ast.NodeTransformer()
    loops = [triton_cpu_module._tensor_loop_index(transformer, node) for node in ast.parse(source).body]
    assert ast.unparse(loops[0].body[0]) == "i = interpreter_semantic.to_tensor(i, False)"
    assert ast.unparse(loops[1]) == "for j in tl.static_range(4):\n    y = j"
