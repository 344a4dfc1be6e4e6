"""Shared test setup: the architectures, a small model of each, the corpus cache, a tiny post-training run."""

from pathlib import Path

import pytest
import torch

from recurlen.models import registry

# One thread per test process: the suite also starts subprocesses (DDP, multi-node), and oversubscribed
# cores make small-tensor work orders of magnitude slower than it is.
torch.set_num_threads(1)

ARCHITECTURES = tuple(registry.architectures())
"""recurlen's architectures by registry name (read at collection: a test's own registered ones are not here)."""

TINY_RUN = ("data.seq_len=16", "data.batch_size=4", "data.val_length=64", "data.val_sequences=2",
            "data.val_segments=8", "data.max_documents=60", "data.val_fraction=0.2", "trainer.max_steps=2",
            "trainer.val_every_n_steps=0", "trainer.limit_val_batches=1", "trainer.progress_bar=false",
            "trainer.accelerator=cpu", "trainer.devices=1", "trainer.num_threads=1", "trainer.log_every_n_steps=1",
            "optim.warmup_steps=1", "optim.lr=1e-3", "intervention.fit_batches=2", "diagnostics.positionwise=false",
            "diagnostics.state_norm=false")
"""A post-training run of a few seconds on CPU: the nano model, the embedded corpus, no diagnostics."""


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch(request) -> str:
    """Each architecture's registry name in turn (a module's tests run for one, then the next)."""
    return request.param


@pytest.fixture(scope="session")
def nano_model():
    """`nano_model(arch="mamba2", *, seed=0, backend="torch", **fields)`: the architecture's nano model (an
    architecture without one, such as a test's own, is built from its config's defaults), its config fields
    overridden, initialised after torch.manual_seed(seed), in eval mode."""

    def build(arch: str = "mamba2", *, seed: int = 0, backend: str = "torch", **fields) -> torch.nn.Module:
        a = registry.get(arch)
        config = a.preset("nano", **fields) if "nano" in a.presets else a.config_cls(**fields)
        torch.manual_seed(seed)
        return a.build(config, backend=backend).eval()

    return build


@pytest.fixture(scope="module")
def arch_model(arch, nano_model) -> torch.nn.Module:
    """The nano model of `arch` (seed 0, eval mode), shared by a module's tests: they must not change it."""
    return nano_model(arch)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """One corpus cache for the session: its entries are keyed by source, documents and tokenizer, so runs with
    other data settings share it (a test that damages a cache must make its own)."""
    return str(tmp_path_factory.mktemp("corpus-cache"))


@pytest.fixture
def cli_logs(monkeypatch):
    """`recurlen.commands.cli.main` run in this process logs to this test's stderr (capsys), not to the stream of
    the test that first set its handler up (which pytest has closed since)."""
    import logging

    monkeypatch.setattr(logging.getLogger("recurlen"), "handlers", [])


@pytest.fixture(scope="session")
def experiment(cache_dir):
    """`experiment(run_dir, *overrides, arch="mamba2")` -> ExperimentConfig: TINY_RUN on the architecture's nano
    model, in run_dir, the overrides (command-line words) last."""
    from recurlen.training.experiments.compose import load_experiment

    def make(run_dir, *overrides: str, arch: str = "mamba2"):
        a = registry.get(arch)
        if "nano" not in a.presets:  # its prefix would be '' and `model=nano` Mamba-2's
            raise ValueError(f"architecture {arch!r} has no nano model to choose; give the run its model section")
        words = [f"model={a.prefix}nano", *TINY_RUN, f"data.cache_dir={cache_dir}", f"run_dir={run_dir}",
                 *overrides]
        return load_experiment(words)[0]

    return make


@pytest.fixture
def run_tiny_task(tmp_path, cache_dir):
    """`recurlen <task>` on the nano model with quick trainer settings, in tmp_path/run -> results.json path."""
    from recurlen.evaluation.tasks.config import load_task_experiment
    from recurlen.evaluation.tasks.runner import run_task

    def run(task: str, *overrides: str):
        cfg = load_task_experiment([
            f"experiment={task}", "model=nano", "trainer.progress_bar=false", "trainer.num_threads=1",
            "trainer.limit_val_batches=1", "task.val_batches=1", f"data.cache_dir={cache_dir}",
            f"run_dir={tmp_path}/run", *overrides])
        return run_task(cfg)

    return run


# Kernel modules whose autotuners must be created after the interpreter fixture's patches.
_KERNEL_MODULES = ("mamba_ssm.ops.triton.ssd_combined", "fla.ops")


@pytest.fixture(scope="session")
def triton_cpu():
    """Triton's interpreter, ready to run CUDA-oriented kernel wrappers on CPU tensors (make test-kernels).

    Needs recurlen[kernels-cpu] (triton). The interpreter must be on before any kernel module is imported
    (kernels are decorated at import). The patches (no-op torch.cuda.device, a multiprocessor count, one config
    per autotuner, no overflow checks, tensor loop indices) are benchmarks/_triton_cpu.py's, which the GPU check's
    CPU rehearsal uses too; they patch this test process only, and recurlen's kernel glue and the kernel libraries
    run unchanged.
    """
    import sys

    try:
        import triton
        from triton.runtime import interpreter
    except ImportError as err:
        pytest.fail(f"triton is not installed ({err}); make test-kernels installs recurlen[kernels-cpu]")
    # Triton decides at decoration time (its own library functions at `import triton`) whether a kernel is
    # compiled or interpreted, and lightning imports triton early: the variable must be in the environment.
    if not isinstance(triton.language.standard.cumsum, interpreter.InterpretedFunction):
        pytest.fail("triton was imported without its interpreter; run the kernel tests with TRITON_INTERPRET=1 "
                    "in the environment, in their own process: make test-kernels")
    early = [name for name in _KERNEL_MODULES if name in sys.modules]  # their autotuners exist already, unpatched
    if early:
        pytest.fail(f"{early} were imported before this fixture; run the kernel tests in their own process: "
                    "make test-kernels")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
        from _triton_cpu import interpreted_kernels
    with interpreted_kernels():
        yield


def _imported_afresh(loader, what: str):
    """Clears a kernel library's cached loader so that it imports the library now, under the interpreter, fails the
    test with the loader's reason if it does not import, and clears the cache again after the session."""
    loader.cache_clear()
    found, why = loader()
    if found is None:
        pytest.fail(f"{what} does not import ({why}); make test-kernels installs it")
    yield
    loader.cache_clear()


@pytest.fixture(scope="session")
def triton_interpreter(triton_cpu):
    """mamba-ssm's real Triton kernels under the interpreter (a Python-only mamba-ssm build)."""
    from recurlen.models.mamba2 import kernels

    yield from _imported_afresh(kernels._mamba_kernels, "mamba-ssm (its Triton kernels)")


@pytest.fixture(scope="session")
def fla_interpreter(triton_cpu):
    """flash-linear-attention's real chunked GLA kernel under the interpreter (fla-core, its ops package)."""
    from recurlen.models.gla import kernels

    yield from _imported_afresh(kernels._chunk_gla, "flash-linear-attention's chunk_gla")


@pytest.fixture(scope="session")
def fla_rwkv6_interpreter(triton_cpu):
    """flash-linear-attention's real chunked RWKV-6 kernel under the interpreter (fla-core, its ops package)."""
    from recurlen.models.rwkv6 import kernels

    yield from _imported_afresh(kernels._chunk_rwkv6, "flash-linear-attention's chunk_rwkv6")


def assert_close_scaled(got: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    """max |got - ref| <= tol x max |ref|: one relative tolerance for tensors of any scale (logits, states)."""
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    if ref.numel() == 0:  # e.g. the conv state of a GLA without short convs
        return
    scale = float(ref.detach().abs().max().clamp_min(1e-6))
    err = float((got.detach().double() - ref.detach().double()).abs().max())
    assert err <= tol * scale, f"{what}: max |got - ref| = {err:.3g}, > {tol:g} x {scale:.3g}"


@pytest.fixture(scope="session")
def close_scaled():
    """`close_scaled(got, ref, tol, what)`: max |got - ref| <= tol x max |ref| (assert_close_scaled)."""
    return assert_close_scaled


@pytest.fixture(scope="session")
def step_by_step():
    """`step_by_step(model, ids, state)` -> (logits (B, L, V), final state): model.step token by token from `state`
    (None: zeros), without gradients; what a one-call forward is compared with."""

    def run(model, ids, state):
        outs = []
        with torch.no_grad():
            for t in range(ids.shape[1]):
                logits, state = model.step(ids[:, t], state)
                outs.append(logits)
        return torch.stack(outs, dim=1), state

    return run


@pytest.fixture(scope="session")
def split_equals_one_call():
    """The split-invariance check, for any architecture and backend: the LM run by `backend` on `ids` in one call
    and in pieces cut at `cuts` (the state carried between pieces) gives the same logits as that one call and as
    one call of the torch backend, and the same final state: every part in `part_tols` (name -> tolerance) against
    the one call of `backend`, the `recurrent` part (if named) also against the torch backend's."""

    def check(model, ids, init, *, cuts, part_tols: dict[str, float], recurrent: str | None = None,
              logits_tol: float = 1e-5, backend: str = "kernel"):
        with torch.no_grad():
            ref_logits, ref_final = model(ids, init, backend="torch")
            full_logits, full_final = (ref_logits, ref_final) if backend == "torch" else \
                model(ids, init, backend=backend)
            pieces, state = [], init
            for start, end in zip((0, *cuts), (*cuts, ids.shape[1])):
                logits, state = model(ids[:, start:end], state, backend=backend)
                pieces.append(logits)
        split_logits = torch.cat(pieces, dim=1)
        assert_close_scaled(split_logits, full_logits, logits_tol, f"logits, split vs one call ({backend})")
        assert_close_scaled(split_logits, ref_logits, logits_tol, f"logits, split {backend} vs one call torch")
        for part, tol in part_tols.items():
            assert_close_scaled(getattr(state, part), getattr(full_final, part), tol,
                                f"final {part} state, split vs one call")
        if recurrent is not None:
            assert_close_scaled(getattr(state, recurrent), getattr(ref_final, recurrent), part_tols[recurrent],
                                f"final {recurrent} state, split {backend} vs torch")

    return check
