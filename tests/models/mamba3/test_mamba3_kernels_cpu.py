"""Mamba-3 against mamba-ssm's own code, executed on CPU under Triton's interpreter (make test-kernels).

Three checks on random weights: recurlen's kernel path (recurlen/models/mamba3/kernels.py, the code a GPU run calls)
equals its PyTorch path, logits, final states and every gradient, the initial state's included; mamba-ssm's
`mamba3_siso_combined` with `Input_States` and `return_final_states` equals recurlen's scan, and a split with its
states carried equals one call; mamba-ssm's `Mamba3` module, loaded with a recurlen layer's weights, gives the
layer's outputs.

The patches that let mamba-ssm's Mamba-3 kernels run under the interpreter (its inline-PTX cos / sin / tanh, its
bfloat16 casts) are this harness's, never recurlen's: tests/models/mamba3/mamba3_interpreter_patches.py says why.
"""

import pytest
import torch

from recurlen.models.mamba3 import Mamba3Config, Mamba3LM, Mamba3State
from recurlen.models.mamba3 import kernels as m3_kernels
from recurlen.models.mamba3.scan import mamba3_chunked
from recurlen.training.lit_module import token_loss

pytestmark = [pytest.mark.kernels, pytest.mark.usefixtures("mamba3_interpreter")]

SHAPE = dict(d_model=32, n_layer=2, d_state=16, headdim=16, chunk_size=16)
LENGTH = 37  # 3 chunks of 16, the last one partial


@pytest.fixture(scope="module")
def mamba3_interpreter(triton_cpu):
    """mamba-ssm's Mamba-3 kernels imported now (after triton_cpu's patches), patched for the interpreter."""
    from mamba3_interpreter_patches import mamba_ssm_package_in_place, patch_mamba3_kernels

    m3_kernels._mamba3_kernel.cache_clear()
    fn, why = m3_kernels._mamba3_kernel()
    if fn is None:
        pytest.fail(f"mamba-ssm's Mamba-3 kernel does not import ({why}); make test-kernels installs it")
    patch = patch_mamba3_kernels()
    mamba_ssm_package_in_place(patch)
    yield fn
    patch.undo()
    m3_kernels._mamba3_kernel.cache_clear()


def make(seed=0, **fields) -> Mamba3LM:
    torch.manual_seed(seed)
    model = Mamba3LM(Mamba3Config(**{**SHAPE, **fields}), backend="torch").eval()
    with torch.no_grad():  # away from the init's symmetric values, so a swapped or dropped term shows
        for block in model.backbone.layers:
            mixer = block.mixer
            mixer.B_bias.normal_(1.0, 0.3)
            mixer.C_bias.normal_(1.0, 0.3)
            mixer.D.uniform_(0.5, 1.5)
            mixer.dt_bias.uniform_(-1.0, 0.5)  # dt ~ 0.3-1: angles turn by up to ~3 radians per token
            mixer.in_proj.weight.mul_(3.0)
    return model


def random_state(model: Mamba3LM, batch: int, seed: int = 1) -> Mamba3State:
    g = torch.Generator().manual_seed(seed)
    zero = model.zero_state(batch)
    return Mamba3State(**{n: torch.randn(t.shape, generator=g) * 0.5 for n, t in zero.parts().items()})


def scaled(got, ref):
    return ((got - ref).abs().max() / ref.abs().max()).item()


def forward_backward(model: Mamba3LM, ids: torch.Tensor, init: Mamba3State, backend: str):
    model.zero_grad(set_to_none=True)
    init = Mamba3State(**{n: t.clone().requires_grad_() for n, t in init.parts().items()})
    logits, final = model(ids, init, backend=backend)
    # Every final part enters the loss (the angle through cos: the kernel reduces it mod 2 pi at other points).
    loss = token_loss(logits[:, :-1], ids[:, 1:], None) + final.ssm.pow(2).mean() + final.angle.cos().mean() \
        + final.k.pow(2).mean() + final.v.pow(2).mean()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    grads.update({f"initial_state.{n}": t.grad for n, t in init.parts().items()})
    return logits.detach(), final.detach(), grads


@pytest.mark.parametrize("fields", [{}, dict(ngroups=2, rope_fraction=1.0, is_outproj_norm=True)])
def test_kernel_path_equals_torch_path(fields):
    model = make(**fields)
    ids = torch.randint(0, 257, (2, LENGTH), generator=torch.Generator().manual_seed(2))
    init = random_state(model, 2)
    ref_logits, ref_final, ref_grads = forward_backward(model, ids, init, "torch")
    logits, final, grads = forward_backward(model, ids, init, "kernel")
    assert scaled(logits, ref_logits) < 1e-5
    # The kernel sums the angle in float32 within each chunk (recurlen in float64): ~1e-5 radians after 37 tokens
    # turning by up to ~3 radians each, which the rotated state and keys carry (~2e-5 relative with every pair turned).
    for name in ("ssm", "k", "v"):
        assert scaled(getattr(final, name), getattr(ref_final, name)) < 1e-4, name
    turn = torch.remainder(final.angle - ref_final.angle + torch.pi, 2 * torch.pi) - torch.pi
    assert turn.abs().max() < 1e-4
    missing = sorted(name for name, g in grads.items() if g is None)
    assert not missing, f"no gradient for {missing}"
    for name, ref in ref_grads.items():
        assert scaled(grads[name], ref) < 1e-4, (name, scaled(grads[name], ref))


def _scan_inputs(batch=2, length=LENGTH, nheads=4, headdim=16, d_state=16, ngroups=1, n_angles=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, length, ngroups, d_state, generator=g) for _ in range(2))
    v = torch.randn(batch, length, nheads, headdim, generator=g)
    dt = torch.rand(batch, length, nheads, generator=g) * 0.8 + 0.05
    adt = -torch.rand(batch, length, nheads, generator=g) * dt
    trap = torch.randn(batch, length, nheads, generator=g)
    angles = torch.randn(batch, length, nheads, n_angles, generator=g) * 2
    q_bias, k_bias = (torch.randn(nheads, d_state, generator=g) * 0.3 + 1 for _ in range(2))
    initial = (torch.randn(batch, nheads, headdim, d_state, generator=g), torch.rand(batch, nheads, n_angles,
               generator=g) * 6, torch.randn(batch, nheads, d_state, generator=g),
               torch.randn(batch, nheads, headdim, generator=g))
    return [q, k, v, adt, dt, trap, angles, q_bias, k_bias], initial


def test_mamba_ssm_kernel_with_states_equals_recurlen_scan_and_splits(mamba3_interpreter):
    siso = mamba3_interpreter
    args, (h0, theta0, k0, v0) = _scan_inputs()
    q, k, v, adt, dt, trap, angles, q_bias, k_bias = args
    D = torch.rand(4) + 0.5

    def kernel(lo, hi, states):
        theta, h, kk, vv = states
        return siso(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], adt[:, lo:hi].transpose(1, 2).contiguous(),
                    dt[:, lo:hi].transpose(1, 2).contiguous(), trap[:, lo:hi].transpose(1, 2).contiguous(),
                    q_bias, k_bias, angles[:, lo:hi], D=D, Z=None, Input_States=(theta, h, kk, vv), chunk_size=16,
                    return_final_states=True)

    y, theta, h, k_last, v_last = kernel(0, LENGTH, (theta0, h0, k0, v0))
    y_ref, (h_ref, theta_ref, k_ref, v_ref) = mamba3_chunked(*args, chunk_size=16, initial=(h0, theta0, k0, v0))
    y_ref = y_ref + v * D[:, None]
    assert scaled(y, y_ref) < 1e-5 and scaled(h, h_ref) < 1e-5 and scaled(k_last, k_ref) < 1e-5
    assert torch.equal(v_last.float(), v_ref) and (theta - theta_ref).abs().max() < 1e-5
    # A split at 20 (inside the second chunk) with the states carried equals the one call.
    y1, *states = kernel(0, 20, (theta0, h0, k0, v0))
    y2, theta2, h2, k2, v2 = kernel(20, LENGTH, tuple(states))
    assert scaled(torch.cat([y1, y2], 1), y) < 1e-5 and scaled(h2, h) < 1e-5 and scaled(k2, k_last) < 1e-5


@pytest.mark.parametrize("fields", [{}, dict(ngroups=2, rope_fraction=1.0, is_outproj_norm=True)])
def test_mamba_ssm_module_reads_recurlen_weights(fields):
    from mamba_ssm.modules.mamba3 import Mamba3

    model = make(**fields)
    cfg = model.config
    mixer = model.backbone.layers[0].mixer
    theirs = Mamba3(cfg.d_model, d_state=cfg.d_state, expand=cfg.expand, headdim=cfg.headdim, ngroups=cfg.ngroups,
                    rope_fraction=cfg.rope_fraction, A_floor=cfg.A_floor, is_outproj_norm=cfg.is_outproj_norm,
                    chunk_size=cfg.chunk_size)
    theirs.load_state_dict(mixer.state_dict(), strict=True)
    u = torch.randn(2, LENGTH, cfg.d_model, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, *_ = mixer(u, *model.zero_state(2).layer(0), use_kernels=False)
        out = theirs(u)
    assert scaled(out, ours) < 1e-5
