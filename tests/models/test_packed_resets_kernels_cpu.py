"""Packed rows on the kernel paths: backend="kernel" with `resets` == backend="torch" with `resets` (which
tests/models/test_packed_resets.py checks against the documents run one by one), with the real Triton kernels on CPU
under Triton's interpreter (make test-kernels): mamba-ssm's SSD scan with `seq_idx` (Mamba-2), its Mamba-3 kernel
and fla's chunked kernels with `cu_seqlens` (GLA, RWKV-6, Gated DeltaNet). Every registry architecture whose kernels
have a CPU path is here (an architecture without one, Mamba-1's CUDA scan, is skipped with its reason).

Logits, every part of the final state (each row's last document's) and every gradient (the parameters and the state
handed in), float32, rows whose documents start on a chunk edge of the scans and off it, a document of one token, a
row flagged at position 0 and a row without flags.
"""

import sys
from pathlib import Path

import pytest
import torch

from recurlen.models import registry
from recurlen.training.lit_module import token_loss

pytestmark = [pytest.mark.kernels]

ARCHITECTURES = tuple(registry.architectures())
CHUNK = 16
LENGTH = 40
ROWS = (
    (False, (16, 1, 7, 8, 8)),  # continues the state handed in; documents start on 16 and 32 and between
    (True, (1, 12, 4, 20, 3)),  # flagged at 0; a one-token document first
    (False, (40,)),  # one document
)
SHAPES = {"mamba2": dict(d_model=32), "mamba3": dict(d_model=32), "gated_deltanet": dict(head_dim=16)}
"""Smaller than the nano models where the interpreter's time is long (every kernel program runs in numpy)."""


def _fla_afresh(module: str, loader: str):
    """An fla op's cached loader cleared, so that it imports the op now, under the interpreter (and after)."""
    import importlib

    load = getattr(importlib.import_module(module), loader)
    load.cache_clear()
    found, why = load()
    if found is None:
        pytest.fail(f"{module}.{loader}: fla's op does not import ({why}); make test-kernels installs fla-core")
    yield
    load.cache_clear()


@pytest.fixture(scope="module")
def gated_delta_interpreter(triton_cpu):
    yield from _fla_afresh("recurlen.models.gated_deltanet.kernels", "_chunk_gated_delta_rule")


@pytest.fixture(scope="module")
def rwkv7_interpreter(triton_cpu):
    yield from _fla_afresh("recurlen.models.rwkv7.kernels", "_chunk_rwkv7")


@pytest.fixture(scope="module")
def mamba3_interpreter(triton_cpu):
    """mamba-ssm's Mamba-3 kernel, patched for the interpreter as tests/models/mamba3's harness does."""
    from recurlen.models.mamba3 import kernels

    sys.path.insert(0, str(Path(__file__).parent / "mamba3"))
    from mamba3_interpreter_patches import mamba_ssm_package_in_place, patch_mamba3_kernels

    kernels._mamba3_kernel.cache_clear()
    fn, why = kernels._mamba3_kernel()
    if fn is None:
        pytest.fail(f"mamba-ssm's Mamba-3 kernel does not import ({why}); make test-kernels installs it")
    patch = patch_mamba3_kernels()
    mamba_ssm_package_in_place(patch)
    yield
    patch.undo()
    kernels._mamba3_kernel.cache_clear()


INTERPRETERS = {"mamba2": "triton_interpreter", "gla": "fla_interpreter", "rwkv6": "fla_rwkv6_interpreter",
                "gated_deltanet": "gated_delta_interpreter", "mamba3": "mamba3_interpreter",
                "rwkv7": "rwkv7_interpreter"}
"""The fixture that imports each architecture's kernels under the interpreter."""
TOLERANCES = {"rwkv7": (5e-4, 1e-3)}
"""(logits and states, gradients) where a kernel is less exact than 1e-5 / 1e-4 against the torch path without packed
rows too (RWKV-7's: tests/models/rwkv7/test_rwkv7_kernels_cpu.py's KERNEL_TOL, GRAD_TOL)."""


def resets_of(rows) -> torch.Tensor:
    resets = torch.zeros(len(rows), LENGTH, dtype=torch.bool)
    for b, (flag_first, lengths) in enumerate(rows):
        resets[b, torch.tensor(lengths).cumsum(0)[:-1]] = True
        resets[b, 0] = flag_first
    return resets


def forward_backward(model, ids, init, resets, backend):
    model.zero_grad(set_to_none=True)
    init = type(init)(**{n: t.clone().requires_grad_() for n, t in init.parts().items()})
    logits, final = model(ids[:, :-1], init, resets=resets, backend=backend)
    # Every final part enters the loss (an angle through cos: kernels reduce it mod 2 pi at other points).
    loss = token_loss(logits, ids[:, 1:], None)
    for name, t in final.parts().items():
        if t.numel():
            loss = loss + (t.cos() if name in final.FRAME else t.pow(2)).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    grads.update({f"state.{n}": t.grad for n, t in init.parts().items() if t.numel()})
    return logits.detach(), final.detach(), grads


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_packed_kernel_path_equals_torch_path(name, nano_model, close_scaled, request):
    kernels = registry.get(name).model_cls.kernels
    if kernels.install_cpu is None:
        pytest.skip(f"{kernels.what} has no CPU path (the torch path's packed rows are tested on CPU)")
    assert name in INTERPRETERS, f"{name}'s kernels run on CPU: add the fixture that imports them to INTERPRETERS"
    request.getfixturevalue(INTERPRETERS[name])
    model = nano_model(name, chunk_size=CHUNK, **SHAPES.get(name, {}))
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (len(ROWS), LENGTH + 1), generator=g)
    zero = model.zero_state(len(ROWS))
    init = type(zero)(**{n: torch.randn(t.shape, generator=g) * 0.5 for n, t in zero.parts().items()})
    resets = resets_of(ROWS)
    ref_logits, ref_final, ref_grads = forward_backward(model, ids, init, resets, "torch")
    logits, final, grads = forward_backward(model, ids, init, resets, "kernel")
    tol, grad_tol = TOLERANCES.get(name, (1e-5, 1e-4))
    close_scaled(logits, ref_logits, tol, "logits")
    for part, ref in ref_final.parts().items():
        got = getattr(final, part)
        if part in ref_final.FRAME:  # an angle: compared mod 2 pi
            got = ref + torch.remainder(got - ref + torch.pi, 2 * torch.pi) - torch.pi
        close_scaled(got, ref, max(tol, 1e-4), f"final {part} state")
    assert set(grads) == set(ref_grads)
    for n, ref in ref_grads.items():
        close_scaled(grads[n], ref, grad_tol, f"gradient of {n}")
    # The comparison has power: without the flags the kernel's logits differ from the packed ones.
    with torch.no_grad():
        joined, _ = model(ids[:, :-1], init, backend="kernel")
    assert float((joined[0, 16:] - ref_logits[0, 16:]).abs().max()) > 1e-3
