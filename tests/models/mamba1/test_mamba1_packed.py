"""Mamba-1 with documents packed in a row on the kernel backend: mamba-ssm's CUDA selective_scan_fn has no reset, so
the mixer runs the PyTorch scan and conv for such rows (exact), says so once, and never calls the kernel."""

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
