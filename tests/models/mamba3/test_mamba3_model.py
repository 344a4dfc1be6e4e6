"""The Mamba-3 LM: split invariance, step() == forward, its config, state type, layout and initialisation."""

import pytest
import torch

from recurlen.models.mamba3 import Mamba3Config, Mamba3LM, Mamba3State

SHAPE = dict(d_model=32, n_layer=2, d_state=16, headdim=16, chunk_size=8)


def make(seed=0, **fields) -> Mamba3LM:
    torch.manual_seed(seed)
    model = Mamba3LM(Mamba3Config(**{**SHAPE, **fields}), backend="torch").eval()
    with torch.no_grad():  # away from the init's symmetric values, so a swapped or dropped term shows
        for block in model.backbone.layers:
            mixer = block.mixer
            mixer.B_bias.normal_(1.0, 0.3)
            mixer.C_bias.normal_(1.0, 0.3)
            mixer.D.uniform_(0.5, 1.5)
            mixer.B_norm.weight.uniform_(0.5, 1.5)
            mixer.C_norm.weight.uniform_(0.5, 1.5)
    return model


def random_state(model: Mamba3LM, batch: int, seed: int = 1) -> Mamba3State:
    g = torch.Generator().manual_seed(seed)
    zero = model.zero_state(batch)
    return Mamba3State(**{n: torch.randn(t.shape, generator=g) * 0.5 for n, t in zero.parts().items()})


def ids(batch, length, seed=2):
    return torch.randint(0, 257, (batch, length), generator=torch.Generator().manual_seed(seed))


def scaled(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("fields", [{}, dict(ngroups=2, rope_fraction=1.0), dict(is_outproj_norm=True)])
def test_any_split_with_the_state_carried_equals_one_call(fields):
    model = make(**fields)
    x, init = ids(2, 41), random_state(model, 2)
    with torch.no_grad():
        whole, final = model(x, init)
        for cuts in ([1], [8, 9], [5, 17, 30], [40]):
            state, pieces = init, []
            for a, b in zip([0, *cuts], [*cuts, 41]):
                out, state = model(x[:, a:b], state)
                pieces.append(out)
            assert scaled(torch.cat(pieces, 1), whole) < 1e-5, cuts
            for name, t in final.parts().items():
                assert scaled(getattr(state, name), t) < 1e-5, (cuts, name)


@pytest.mark.parametrize("fields", [{}, dict(ngroups=2, rope_fraction=1.0), dict(is_outproj_norm=True)])
def test_step_equals_forward(fields):
    model = make(**fields)
    x, init = ids(2, 19), random_state(model, 2)
    with torch.no_grad():
        whole, final = model(x, init)
        state, outs = init, []
        for t in range(19):
            out, state = model.step(x[:, t], state)
            outs.append(out)
    assert scaled(torch.stack(outs, 1), whole) < 1e-5
    for name, t in final.parts().items():
        assert scaled(getattr(state, name), t) < 1e-5, name


def test_chunk_size_does_not_change_the_result():
    x = ids(2, 37)
    with torch.no_grad():
        ref, _ = make(chunk_size=64)(x)
        for chunk in (1, 7, 16):
            assert scaled(make(chunk_size=chunk)(x)[0], ref) < 1e-5, chunk


def test_state_type():
    model = make()
    state = model.zero_state(3)
    cfg = model.config
    assert (Mamba3State.RECURRENT, Mamba3State.FRAME, Mamba3State.WINDOW) == (("ssm",), ("angle",), ("k", "v"))
    assert state.ssm.shape == (2, 3, cfg.nheads, cfg.headdim, cfg.d_state)
    assert state.angle.shape == (2, 3, cfg.nheads, cfg.num_rope_angles) == (2, 3, 4, 4)
    assert state.k.shape == (2, 3, cfg.nheads, cfg.d_state) and state.v.shape == (2, 3, cfg.nheads, cfg.headdim)
    with pytest.raises(ValueError, match="Mamba3State needs ssm"):
        Mamba3State(state.ssm[0], state.angle, state.k, state.v)
    with torch.no_grad():
        _, final = model(ids(3, 10), state)
    assert all(t.dtype == torch.float32 for t in final.parts().values())
    assert (final.angle >= 0).all() and (final.angle < 2 * torch.pi).all()  # kept mod 2 pi


def test_mamba_ssm_layout_and_initialisation():
    model = make(is_outproj_norm=True)
    cfg = model.config
    names = {n: tuple(p.shape) for n, p in model.named_parameters()}
    h, n = cfg.nheads, cfg.d_state
    assert names["backbone.layers.0.mixer.in_proj.weight"] == (2 * 64 + 2 * n + 3 * h + 4, 32)
    assert names["backbone.layers.1.mixer.B_bias"] == (h, 1, n) == names["backbone.layers.1.mixer.C_bias"]
    assert names["backbone.layers.0.mixer.norm.weight"] == (64,) and "lm_head.weight" not in names  # tied
    assert {"backbone.layers.0.mixer.B_norm.weight", "backbone.layers.0.mixer.dt_bias",
            "backbone.layers.0.mixer.D", "backbone.layers.0.mixer.out_proj.weight"} <= set(names)
    assert "backbone.layers.0.mixer.norm.weight" not in dict(make().named_parameters())
    torch.manual_seed(0)
    fresh = Mamba3LM(Mamba3Config(**SHAPE, dt_min=0.01, dt_max=0.05)).backbone.layers[0].mixer
    dt = torch.nn.functional.softplus(fresh.dt_bias)
    assert (dt > 0.0099).all() and (dt < 0.0501).all()
    assert (fresh.B_bias == 1).all() and (fresh.C_bias == 1).all() and (fresh.D == 1).all()
    assert model.state_decays() == {}  # the decay is computed from the input


def test_config_refuses_mimo_and_bad_values_by_name():
    with pytest.raises(ValueError, match="is_mimo=True .*SISO only"):
        Mamba3Config(is_mimo=True)
    with pytest.raises(ValueError, match="rope_fraction must be 0.5 or 1.0"):
        Mamba3Config(rope_fraction=0.25)
    with pytest.raises(ValueError, match="rotation angles"):
        Mamba3Config(d_state=4)
    raw = Mamba3Config(**SHAPE).to_official_json()
    assert raw["ssm_cfg"]["layer"] == "Mamba3" and Mamba3Config.recognises(raw)
    assert Mamba3Config.from_official_json(raw) == Mamba3Config(**SHAPE)
    raw["ssm_cfg"]["is_mimo"] = True
    with pytest.raises(ValueError, match="is_mimo=true .*SISO only"):
        Mamba3Config.from_official_json(raw)


def test_official_format_round_trip(tmp_path):
    model = make(ngroups=2)
    model.save_pretrained(str(tmp_path))
    again = Mamba3LM.from_pretrained(str(tmp_path), backend="torch").eval()
    x = ids(2, 12)
    with torch.no_grad():
        assert torch.equal(model(x)[0], again(x)[0])


def test_what_each_part_carries_across_a_cut():
    """Carried whole, a cut is invisible; zeroing any part changes the next token; turning the angle, the SSM
    state's key pairs and the previous key together by the same angles changes nothing (only angle differences
    reach the outputs, which is why a random angle is no noise of its own for the state)."""
    from recurlen.models.mamba3.scan import rotate

    model = make()
    x, cut = ids(2, 40), 24
    with torch.no_grad():
        full, _ = model(x, random_state(model, 2))
        _, state = model(x[:, :cut], random_state(model, 2))

        def after(s):
            return model(x[:, cut:], s)[0]

        assert scaled(after(state), full[:, cut:]) < 1e-5
        for part in Mamba3State.part_names():
            zeroed = Mamba3State(**{**state.parts(), part: torch.zeros_like(getattr(state, part))})
            assert (after(zeroed)[:, 0] - full[:, cut]).abs().max() > 1e-3, part
        phi = torch.rand(state.angle.shape, generator=torch.Generator().manual_seed(5)) * 2 * torch.pi
        turned = Mamba3State(rotate(state.ssm, phi.unsqueeze(-2)), torch.remainder(state.angle + phi, 2 * torch.pi),
                             rotate(state.k, phi), state.v)
        assert scaled(after(turned), full[:, cut:]) < 1e-5
        only_angle = Mamba3State(state.ssm, torch.remainder(state.angle + phi, 2 * torch.pi), state.k, state.v)
        assert (after(only_angle)[:, 0] - full[:, cut]).abs().max() > 1e-3
        # What state passing and TBTT hand over by default (recurrent_only: ssm in its frame, the one-token window
        # k / v zeroed) continues the sequence far better than ssm with its angle zeroed, the old default.
        frameless = Mamba3State(state.ssm, torch.zeros_like(state.angle), torch.zeros_like(state.k),
                                torch.zeros_like(state.v))
        assert torch.equal(state.recurrent_only().angle, state.angle)
        kept, lost = (scaled(after(s)[:, 1:], full[:, cut + 1:]) for s in (state.recurrent_only(), frameless))
        assert kept < lost / 5, (kept, lost)


def test_log_decay_min_bounds_every_tokens_decay_and_is_refused_by_the_official_export(tmp_path):
    """The model organism's clamp (log_decay_min): A dt never goes below it, on the chunked path and in step(),
    which agree with it on; a clamped model has no mamba-ssm counterpart, so the official export refuses it."""
    from recurlen.util.errors import UserError

    free, clamped = make(), make(log_decay_min=-0.02)
    with torch.no_grad():  # larger dd_A / dd_dt rows, so that many tokens decay faster than the clamp allows
        for model in (free, clamped):
            for block in model.backbone.layers:
                block.mixer.in_proj.weight.mul_(4.0)
    u = torch.randn(2, 23, SHAPE["d_model"])
    with torch.no_grad():
        adt_free = free.backbone.layers[0].mixer._inputs(u)[4]
        adt = clamped.backbone.layers[0].mixer._inputs(u)[4]
    assert (adt_free < -0.02).float().mean() > 0.1  # the clamp has work to do
    assert adt.min().item() == pytest.approx(-0.02) and torch.equal(adt, adt_free.clamp(min=-0.02))
    x, init = ids(2, 19), random_state(clamped, 2)
    with torch.no_grad():
        whole, _ = clamped(x, init)
        state, outs = init, []
        for t in range(19):
            out, state = clamped.step(x[:, t], state)
            outs.append(out)
        assert scaled(torch.stack(outs, 1), whole) < 1e-5
        assert scaled(free(x, init)[0], whole) > 1e-3  # the clamp changes the model
    with pytest.raises(UserError, match="log_decay_min=-0.02 .*mamba-ssm's Mamba3 cannot express"):
        clamped.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="log_decay_min must be < 0"):
        Mamba3Config(log_decay_min=0.0)
