"""Which path a forward takes, and the errors and warning when the kernels cannot run (no GPU needed)."""

import sys
import warnings

import pytest
import torch

from recurlen import Mamba2LM, preset
from recurlen.models import backends
from recurlen.models.mamba2 import kernels

NOT_INSTALLED = "ModuleNotFoundError: No module named 'mamba_ssm'"


@pytest.fixture
def model():
    torch.manual_seed(0)
    return Mamba2LM(preset("nano"))


@pytest.fixture
def without_mamba_ssm(monkeypatch):
    monkeypatch.setattr(kernels, "_mamba_kernels", lambda: (None, NOT_INSTALLED))
    backends._warn_auto_without_kernels.cache_clear()
    yield
    backends._warn_auto_without_kernels.cache_clear()


def test_kernel_backend_on_cpu_without_the_interpreter_says_what_is_missing(model, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError) as err:
        model(torch.randint(0, 257, (1, 8)), backend="kernel")
    msg = str(err.value)
    assert "backend='kernel'" in msg and "CUDA" in msg and "on cpu" in msg
    assert "TRITON_INTERPRET=1" in msg and "make test-kernels" in msg and "backend='torch'" in msg


def test_kernel_backend_without_mamba_ssm_says_how_to_install(model, monkeypatch, without_mamba_ssm):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU with the interpreter: only mamba-ssm is missing
    with pytest.raises(ValueError) as err:
        model(torch.randint(0, 257, (1, 8)), backend="kernel")
    msg = str(err.value)
    assert NOT_INSTALLED in msg and "make test-kernels" in msg and "MAMBA_SKIP_CUDA_BUILD=TRUE" in msg
    # on CUDA the advice is the CUDA install
    with pytest.raises(ValueError, match=r"No module named 'mamba_ssm'.*recurlen\[cuda\]"):
        model._use_kernels(torch.device("cuda"), "kernel")


def test_auto_on_cuda_without_mamba_ssm_warns_once_then_takes_the_torch_path(model, without_mamba_ssm):
    with pytest.warns(RuntimeWarning, match=r"backend='auto' on CUDA: mamba-ssm's Triton kernels did not import"):
        assert model._use_kernels(torch.device("cuda"), "auto") is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model._use_kernels(torch.device("cuda"), None) is False  # the model's own backend, 'auto'
        assert model._use_kernels(torch.device("cpu"), "auto") is False


def test_auto_on_cpu_never_asks_for_the_kernels(model, monkeypatch):
    def fail():
        raise AssertionError("auto on CPU must not import mamba-ssm")

    monkeypatch.setattr(kernels, "_mamba_kernels", fail)
    logits, _ = model(torch.randint(0, 257, (1, 8)))
    assert logits.shape == (1, 8, 257)


def test_unknown_backend_lists_the_allowed_ones(model):
    with pytest.raises(ValueError, match=r"unknown backend 'triton'; allowed: \['auto', 'torch', 'kernel'\]"):
        model(torch.randint(0, 257, (1, 8)), backend="triton")


@pytest.fixture
def triton_only_mamba_ssm(tmp_path, monkeypatch):
    """A mamba_ssm package laid out like a build without CUDA extensions: its __init__ fails on Mamba-1's
    extension, its Triton modules import (here they hold marker functions)."""
    root = tmp_path / "site" / "mamba_ssm"
    (root / "ops" / "triton").mkdir(parents=True)
    (root / "__init__.py").write_text("import selective_scan_cuda_missing_for_this_test\n")
    (root / "ops" / "__init__.py").write_text("")
    (root / "ops" / "triton" / "__init__.py").write_text("")
    (root / "ops" / "triton" / "ssd_combined.py").write_text("def mamba_chunk_scan_combined():\n    return 'scan'\n")
    (root / "ops" / "triton" / "layernorm_gated.py").write_text("def rmsnorm_fn():\n    return 'norm'\n")
    if any(name == "mamba_ssm" or name.startswith("mamba_ssm.") for name in sys.modules):
        pytest.skip("a real mamba_ssm is imported in this process")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    kernels._mamba_kernels.cache_clear()
    yield
    for name in [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]:
        del sys.modules[name]
    kernels._mamba_kernels.cache_clear()


def test_triton_only_mamba_ssm_imports_without_its_package_init(triton_only_mamba_ssm):
    fns, why = kernels._mamba_kernels()
    assert why is None and fns is not None
    scan, norm = fns
    assert (scan(), norm()) == ("scan", "norm")
    assert not hasattr(sys.modules["mamba_ssm"], "Mamba2")  # the empty package, not the failing __init__
