"""Shared test setup."""

import pytest
import torch

# One thread per test process: the suite also starts subprocesses (DDP, multi-node), and oversubscribed
# cores make small-tensor work orders of magnitude slower than it is.
torch.set_num_threads(1)


@pytest.fixture
def run_tiny_task(tmp_path):
    """`recurlen <task>` on the nano model with quick trainer settings, in tmp_path/run -> results.json path."""
    from recurlen.tasks.config import load_task_experiment
    from recurlen.tasks.runner import run_task

    def run(task: str, *overrides: str):
        cfg = load_task_experiment([
            f"experiment={task}", "model=nano", "trainer.progress_bar=false", "trainer.num_threads=1",
            "trainer.limit_val_batches=1", "task.val_batches=1", f"run_dir={tmp_path}/run", *overrides])
        return run_task(cfg)

    return run


@pytest.fixture(scope="session")
def triton_interpreter():
    """mamba-ssm's real Triton kernels, executed on CPU tensors by Triton's interpreter (make test-kernels).

    Needs recurlen[kernels-cpu] (triton) and a Python-only mamba-ssm build. The interpreter must be on before
    mamba-ssm's Triton modules are imported (kernels are decorated at import). What is patched here is patched
    in this test process only; recurlen's kernel glue runs unchanged:
      - torch.cuda.device(index) wraps every launch; with a CPU tensor the index is None and CPU torch fails,
        so it becomes a no-op context;
      - backward kernels size their grids by torch.cuda.get_device_properties(...).multi_processor_count;
      - autotuners would benchmark their configs, which the interpreter cannot: each keeps its first config;
      - the interpreter checks every integer add / mul for overflow (compiled kernels do so only in debug
        mode); that check is ~half of the interpreted time, so it is off.
    """
    import dataclasses
    import sys
    import types
    from contextlib import nullcontext

    from recurlen import kernels

    try:
        import triton
        from triton.runtime import autotuner, interpreter
    except ImportError as err:
        pytest.fail(f"triton is not installed ({err}); make test-kernels installs recurlen[kernels-cpu]")
    # Triton decides at decoration time (its own library functions at `import triton`) whether a kernel is
    # compiled or interpreted, and lightning imports triton early: the variable must be in the environment.
    if not isinstance(triton.language.standard.cumsum, interpreter.InterpretedFunction):
        pytest.fail("triton was imported without its interpreter; run the kernel tests with TRITON_INTERPRET=1 "
                    "in the environment, in their own process: make test-kernels")
    if "mamba_ssm.ops.triton.ssd_combined" in sys.modules:  # its autotuners exist already, unpatched
        pytest.fail("mamba-ssm's Triton kernels were imported before this fixture; run the kernel tests in their "
                    "own process: make test-kernels")
    patch = pytest.MonkeyPatch()
    first_config_init = autotuner.Autotuner.__init__

    def keep_first_config(self, fn, arg_names, configs, *args, **kwargs):
        first_config_init(self, fn, arg_names, configs[:1], *args, **kwargs)

    patch.setattr(autotuner.Autotuner, "__init__", keep_first_config)
    patch.setattr(torch.cuda, "device", lambda index: nullcontext())
    patch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(multi_processor_count=16))
    builder = interpreter.interpreter_builder
    patch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=False))
    kernels._mamba_kernels.cache_clear()
    fns, why = kernels._mamba_kernels()
    if fns is None:
        patch.undo()
        pytest.fail(f"mamba-ssm's Triton kernels do not import ({why}); make test-kernels installs them")
    yield
    patch.undo()
    kernels._mamba_kernels.cache_clear()
