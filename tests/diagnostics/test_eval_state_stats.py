"""State statistics by position: curve shapes, positions, and values against a direct forward."""

from __future__ import annotations

import torch

from recurlen import Mamba2LM, preset
from recurlen.diagnostics.positionwise import evaluate_positionwise
from recurlen.diagnostics.state_stats import STATE_STATS, state_statistics


def test_state_curves_shapes_and_values():
    torch.manual_seed(0)
    model = Mamba2LM(preset("nano", n_layer=3), backend="torch").eval()
    seqs = torch.randint(0, 257, (3, 300), generator=torch.Generator().manual_seed(3))
    res = evaluate_positionwise(model, seqs, train_len=40, chunk_len=128, batch_size=2, state_points=12,
                                reset_control=False)
    curves = res.state
    pos = curves.positions
    assert pos == sorted(set(pos)) and pos[-1] == 300 and pos[0] == 1
    assert {40, 80, 160, 128, 256} <= set(pos)  # multiples of T and chunk ends
    assert sum(p < 40 for p in pos) >= 5  # dense early
    d = curves.to_dict()
    assert d["num_sequences"] == 3 and d["positions"] == pos
    for stat in STATE_STATS:
        assert len(d[stat]) == 3 and all(len(curve) == len(pos) for curve in d[stat])
    # The sampled values are those of the state after `p` tokens, from a direct forward.
    for p in (pos[0], 40, 300):
        with torch.no_grad():
            _, state = model(seqs[:, :p])
        want_FK = state_statistics(state).mean(dim=-1)
        got_FK = curves.sums_FKS[:, :, pos.index(p)] / 3
        torch.testing.assert_close(got_FK, want_FK, atol=1e-5, rtol=1e-4)
    assert (curves.means()["ssm_norm"][:, -1] > curves.means()["ssm_norm"][:, 0]).all()


def test_state_only_pass_skips_nll():
    model = Mamba2LM(preset("nano"), backend="torch").eval()
    seqs = torch.randint(0, 257, (2, 100))
    res = evaluate_positionwise(model, seqs, train_len=20, chunk_len=64, with_nll=False, state_points=4)
    assert res.reset_nll_sum_P is None and torch.isnan(res.nll_sum_P).all()
    assert res.state.count == 2 and res.state.sums_FKS.shape == (4, 2, len(res.state.positions))
