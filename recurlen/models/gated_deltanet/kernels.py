"""Optional GPU path for Gated DeltaNet: flash-linear-attention's chunked gated delta rule (Triton).

`fla.ops.gated_delta_rule.chunk_gated_delta_rule` is called as fla's own GatedDeltaNet layer calls it, with what
the layer fuses into the kernel: the L2 norm of q and k, beta = sigmoid(b) (times 2 with allow_neg_eigval), the
decay g = -exp(A_log) softplus(a + dt_bias), and grouped value heads (q, k with num_heads heads, v with
num_v_heads). It takes an initial state (N, HV, K, V) and returns the final one; the glue pins the key-major state
(`state_v_first=False`, where fla's layer keeps it value-major in its cache) and the time-major inputs
(recurlen.models.fla_model's glue, shared by fla's ops). Nothing from fla is imported at module load time.

On CPU tensors the same kernel runs only under Triton's interpreter (TRITON_INTERPRET=1 before triton is imported,
with recurlen[kernels-cpu] and fla-core): the kernel tests use it to execute this glue without a GPU
(make test-kernels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from recurlen.models.backends import KernelPath
from recurlen.models.fla_model import FLA_INSTALL_CPU, FLA_INSTALL_CUDA, cached_loader, run_chunked

_chunk_gated_delta_rule = cached_loader("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")

KERNELS = KernelPath(what="flash-linear-attention's chunk_gated_delta_rule (Triton)",
                     load=lambda: _chunk_gated_delta_rule(), install_cuda=FLA_INSTALL_CUDA,
                     install_cpu=FLA_INSTALL_CPU)


def chunk_gated_delta_rule(q_BLHK: torch.Tensor, k_BLHK: torch.Tensor, v_BLHV: torch.Tensor, a_BLH: torch.Tensor,
                           b_BLH: torch.Tensor, *, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float,
                           allow_neg_eigval: bool, initial_state_BHKV: torch.Tensor, clamp_min: float | None = None,
                           resets_BL: torch.Tensor | None = None, fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's kernel on raw q, k (before their L2 norm; num_heads heads), v (num_v_heads heads), a and b (before the
    gate and beta activations), with the state in and out; the final state comes back float32.

    `clamp_min` (the config's clamp on the log decay, which fla's fused gate lacks): the decay is computed here,
    clamped, and given to the kernel as a log decay instead of being fused into it.
    `fn` replaces fla's kernel (a test may pass the same function imported under Triton's CPU interpreter). With
    `resets_BL` the rows' documents go in as fla's varlen sequences (`cu_seqlens`; fla_model.run_chunked).
    """
    if clamp_min is None:
        gate = {"use_gate_in_kernel": True, "A_log": A_log, "dt_bias": dt_bias}
    else:
        a_BLH = (-torch.exp(A_log.float()) * F.softplus(a_BLH.float() + dt_bias.float())).clamp(min=clamp_min)
        gate = {"use_gate_in_kernel": False}
    # fla-core 0.6.0 returns the initial state's gradient (the interpreter tests compare it with the torch path's).
    return run_chunked(fn or _chunk_gated_delta_rule()[0], q_BLHK, k_BLHK, v_BLHV, a_BLH, b_BLH, scale=scale,
                       initial_state_BHKV=initial_state_BHKV, resets_BL=resets_BL, use_qk_l2norm_in_kernel=True,
                       use_beta_sigmoid_in_kernel=True, allow_neg_eigval=allow_neg_eigval, **gate)


__all__ = ["KERNELS", "chunk_gated_delta_rule"]
