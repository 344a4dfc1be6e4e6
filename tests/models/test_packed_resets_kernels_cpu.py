"""Packed rows on the kernel paths: backend="kernel" with `resets` == backend="torch" with `resets` (which
tests/models/test_packed_resets.py checks against the documents run one by one), with the real Triton kernels on CPU
under Triton's interpreter (make test-kernels): mamba-ssm's SSD scan with `seq_idx` (Mamba-2), its Mamba-3 kernel
and fla's chunked kernels with `cu_seqlens` (GLA, RWKV-6, Gated DeltaNet). Every registry architecture whose kernels
have a CPU path is here (an architecture without one, Mamba-1's CUDA scan, is skipped with its reason).

Logits, every part of the final state (each row's last document's) and every gradient (the parameters and the state
handed in), float32, rows whose documents start on a chunk edge of the scans and off it, a document of one token, a
row flagged at position 0 and a row without flags.
"""

import dataclasses
import importlib
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
SMALLER = {"d_model": 32}
"""Config fields set smaller than the nano models' where a config has them: the interpreter runs every kernel program
in numpy."""


@pytest.fixture
def kernels_under_interpreter(triton_cpu):
    """`load(name)`: the architecture's kernels imported afresh under the interpreter (every cached loader of its
    kernels module cleared, before and after), with its folder's interpreter harness applied where it has one
    (tests/models/<name>/<name>_interpreter_patches.py, as Mamba-3's, whose kernels need patches to run there)."""
    undo = []

    def load(name: str) -> None:
        arch = registry.get(name)
        module = importlib.import_module(arch.model_cls.__module__.rsplit(".", 1)[0] + ".kernels")
        loaders = [f for f in vars(module).values() if callable(getattr(f, "cache_clear", None))]
        for loader in loaders:
            loader.cache_clear()
        undo.append(lambda: [loader.cache_clear() for loader in loaders])
        found, why = arch.model_cls.kernels.load()
        if found is None:
            pytest.fail(f"{arch.model_cls.kernels.what} does not import ({why}); make test-kernels installs it")
        harness = Path(__file__).parent / name / f"{name}_interpreter_patches.py"
        if harness.is_file():
            sys.path.insert(0, str(harness.parent))
            patches = importlib.import_module(harness.stem)
            patch = getattr(patches, f"patch_{name}_kernels")()
            if hasattr(patches, "mamba_ssm_package_in_place"):
                patches.mamba_ssm_package_in_place(patch)
            undo.append(patch.undo)

    yield load
    for step in reversed(undo):
        step()


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
def test_packed_kernel_path_equals_torch_path(name, nano_model, close_scaled, kernels_under_interpreter):
    arch = registry.get(name)
    kernels = arch.model_cls.kernels
    if kernels.install_cpu is None:
        pytest.skip(f"{kernels.what} has no CPU path (the torch path's packed rows are tested on CPU)")
    kernels_under_interpreter(name)
    fields = {f.name for f in dataclasses.fields(arch.config_cls)}
    model = nano_model(name, chunk_size=CHUNK, **{k: v for k, v in SMALLER.items() if k in fields})
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
