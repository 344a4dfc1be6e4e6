"""Mamba-1's kernel backend on the CPU (the mixers told to use the kernels). Documents packed in a row: mamba-ssm's
CUDA selective_scan_fn has no reset, so the mixer runs the PyTorch scan and conv for such rows (exact), says so once,
and never calls the kernel. A MambaExtend dt scale: the kernel gets the scaled dt, equal to the PyTorch path."""

import logging

import torch

from recurlen.models.mamba1 import kernels
from recurlen.models.mamba1 import model as mamba1_model


def test_packed_rows_take_the_torch_scan_on_the_kernel_backend(nano_model, monkeypatch, caplog):
    model = nano_model("mamba1")
    ids = torch.randint(0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    resets = torch.zeros(2, 20, dtype=torch.bool)
    resets[:, [5, 13]] = True
    with torch.no_grad():
        ref, ref_final = model(ids, resets=resets, backend="torch")

    def no_kernel(*args, **kwargs):
        raise AssertionError("the CUDA selective scan has no reset: packed rows must not reach it")

    # What the kernel backend would do on a GPU, here on the CPU: the mixers are told to use the kernels.
    monkeypatch.setattr(type(model), "_use_kernels", lambda self, device, backend: True)
    monkeypatch.setattr(kernels, "selective_scan", no_kernel)
    mamba1_model._warn_packed_on_torch_scan.cache_clear()
    with caplog.at_level(logging.WARNING, logger=mamba1_model.__name__), torch.no_grad():
        got, final = model(ids, resets=resets)
    assert torch.equal(got, ref) and torch.equal(final.ssm, ref_final.ssm) and torch.equal(final.conv, ref_final.conv)
    assert sum("cannot reset the state inside a row" in r.getMessage() for r in caplog.records) == 1


def test_the_kernel_path_with_a_dt_scale_equals_the_torch_path(nano_model, monkeypatch):
    """A MambaExtend dt scale on the kernel backend: the kernel is given the scaled dt's softplus preimage (dt_proj
    run once); here mamba-ssm's CUDA scan is replaced by its documented contract, run on the CPU."""
    from tests.models.mamba1.test_mamba1 import reference_selective_scan_fn

    model = nano_model("mamba1")
    for layer, scale in zip(model.layers, (0.1, 10.0)):
        layer.mixer.dt_scale = torch.tensor(scale)
    ids = torch.randint(0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, ref_final = model(ids, backend="torch")
    monkeypatch.setattr(type(model), "_use_kernels", lambda self, device, backend: True)
    monkeypatch.setattr(kernels, "_selective_scan_fn", lambda: (reference_selective_scan_fn, None))
    with torch.no_grad():
        got, final = model(ids)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final.ssm, ref_final.ssm, rtol=1e-4, atol=1e-4)
    for layer in model.layers:
        layer.mixer.dt_scale = None
    with torch.no_grad():
        plain, _ = model(ids)
    # The scale changes the logits far more than the two paths differ: the comparison above can fail.
    assert (plain - ref).abs().max() > 100 * max((got - ref).abs().max(), 1e-6)
