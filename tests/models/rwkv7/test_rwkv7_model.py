"""The RWKV-7 LM: against a float64 per-token reference written from the paper's equations (reading the parameters by
their fla names), split invariance, step == forward, its config in fla's config.json, fla's init where it is
deterministic (the contract every architecture shares is tests/models/test_architectures.py; fla's own model and
kernel are compared in test_rwkv7_kernels_cpu.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

from recurlen.models.rwkv7 import RWKV7LM, RWKV7Config, RWKV7State

NANO = dict(hidden_size=64, num_hidden_layers=3, head_dim=16, decay_low_rank_dim=8, gate_low_rank_dim=16,
            a_low_rank_dim=8, v_low_rank_dim=8, intermediate_size=128)


def randomised(seed=0, **fields) -> RWKV7LM:
    """fla's init leaves o_proj, the channel mix's value and the LoRAs' first halves at zero: every parameter is
    randomised so that each of them moves the logits."""
    torch.manual_seed(seed)
    model = RWKV7LM(RWKV7Config(**{**NANO, "chunk_size": 16, **fields}), backend="torch").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.5) + (1.0 if "norm.weight" in name else 0.0))
    return model


def random_state(model: RWKV7LM, batch: int, seed: int = 2) -> RWKV7State:
    gen = torch.Generator().manual_seed(seed)
    return RWKV7State(*(torch.randn(t.shape, generator=gen) for t in model.zero_state(batch).parts().values()))


def reference_lm(model: RWKV7LM, ids: torch.Tensor, init: RWKV7State):
    """The whole LM token by token in float64: the paper's time mix (value-major wkv, transition matrix applied),
    BlinkDL's channel mix, fla's block."""
    cfg = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    H, N, D = cfg.num_heads, cfg.head_dim, cfg.hidden_size

    def ln(x, prefix):
        return F.layer_norm(x, (D,), p[prefix + ".weight"], p[prefix + ".bias"], cfg.norm_eps)

    def lora(x, prefix, act):
        return act(x @ p[prefix + ".lora.0.weight"].T) @ p[prefix + ".lora.2.weight"].T + p.get(prefix + ".lora.2.bias",
                                                                                              0.0)

    wkv = [init.wkv[i].double().transpose(-1, -2).clone() for i in range(cfg.num_hidden_layers)]  # (B, H, V, K)
    att_prev = [init.att_shift[i].double().clone() for i in range(cfg.num_hidden_layers)]
    ffn_prev = [init.ffn_shift[i].double().clone() for i in range(cfg.num_hidden_layers)]
    logits = []
    for t in range(ids.shape[1]):
        h = ln(p["model.embeddings.weight"][ids[:, t]], "model.layers.0.pre_norm")
        v_first = None
        for i in range(cfg.num_hidden_layers):
            a = f"model.layers.{i}.attn."
            x = ln(h, f"model.layers.{i}.attn_norm")
            mixed = {m: x + (att_prev[i] - x) * p[a + f"x_{m}"].view(D) for m in "rwkvag"}
            att_prev[i] = x
            r = mixed["r"] @ p[a + "r_proj.weight"].T
            log_w = -math.exp(-0.5) * torch.sigmoid(lora(mixed["w"], a + "w_lora", torch.tanh))
            w = torch.exp(log_w if cfg.log_decay_min is None else log_w.clamp(min=cfg.log_decay_min))
            k = mixed["k"] @ p[a + "k_proj.weight"].T
            v = mixed["v"] @ p[a + "v_proj.weight"].T
            if i == 0:
                v_first = v
            else:
                v = v + (v_first - v) * torch.sigmoid(lora(mixed["v"], a + "v_lora", lambda z: z))
            alpha = torch.sigmoid(lora(mixed["a"], a + "a_lora", lambda z: z))
            gate = lora(mixed["g"], a + "g_lora", torch.sigmoid)
            kappa = F.normalize((k * p[a + "k_k"]).view(-1, H, N), dim=-1)
            k = k * (1 + (alpha - 1) * p[a + "k_a"])
            heads = lambda z: z.view(-1, H, N)  # noqa: E731
            # wkv_t = wkv_t-1 (diag(w_t) - kappa^T (alpha kappa)) + v^T k
            transition = torch.diag_embed(heads(w)) - kappa.unsqueeze(-1) * (heads(alpha) * kappa).unsqueeze(-2)
            wkv[i] = wkv[i] @ transition + heads(v).unsqueeze(-1) * heads(k).unsqueeze(-2)
            o = (wkv[i] @ heads(r).unsqueeze(-1)).squeeze(-1)
            o = F.group_norm(o.reshape(-1, D), H, p[a + "g_norm.weight"], p[a + "g_norm.bias"],
                             cfg.group_norm_eps).view(-1, H, N)
            o = o + (heads(r) * heads(k) * p[a + "r_k"]).sum(-1, keepdim=True) * heads(v)
            h = h + (o.reshape(-1, D) * gate) @ p[a + "o_proj.weight"].T
            f = f"model.layers.{i}.ffn."
            x = ln(h, f"model.layers.{i}.ffn_norm")
            key = F.relu((x + (ffn_prev[i] - x) * p[f + "x_k"]) @ p[f + "key.weight"].T).square()
            ffn_prev[i] = x
            h = h + key @ p[f + "value.weight"].T
        logits.append(ln(h, "model.norm") @ p["lm_head.weight"].T)
    state = RWKV7State(torch.stack(wkv).transpose(-1, -2), torch.stack(att_prev), torch.stack(ffn_prev))
    return torch.stack(logits, dim=1), state


@pytest.mark.parametrize("layers", [1, 3])
def test_lm_equals_the_float64_per_token_reference(close_scaled, layers):
    model = randomised(num_hidden_layers=layers)
    ids = torch.randint(0, 257, (2, 37), generator=torch.Generator().manual_seed(1))
    init = random_state(model, 2)
    ref_logits, ref_state = reference_lm(model, ids, init)
    model.double()
    with torch.no_grad():
        logits, state = model(ids, RWKV7State(*(t.double() for t in init.parts().values())))
    err = float((logits - ref_logits).abs().max() / ref_logits.abs().max())
    print(f"RWKV-7 LM vs float64 per-token reference ({layers} layers): logits {err:.1e} (relative)")
    close_scaled(logits, ref_logits, 1e-10, "logits")
    for name in ("wkv", "att_shift", "ffn_shift"):
        close_scaled(getattr(state, name), getattr(ref_state, name), 1e-10, f"final {name}")


def test_split_with_the_state_carried_equals_one_call(split_equals_one_call):
    model = randomised()
    ids = torch.randint(0, 257, (2, 53), generator=torch.Generator().manual_seed(3))
    # cuts inside a chunk of 16, a one-token call, a remainder across two chunks
    split_equals_one_call(model, ids, random_state(model, 2, seed=4), cuts=(7, 8, 30), backend="torch",
                          part_tols={"wkv": 1e-5, "att_shift": 1e-6, "ffn_shift": 1e-6}, recurrent="wkv")


def test_step_equals_forward(close_scaled, step_by_step):
    model = randomised()
    ids = torch.randint(0, 257, (2, 21), generator=torch.Generator().manual_seed(5))
    init = random_state(model, 2)
    with torch.no_grad():
        logits, final = model(ids, init)
    step_logits, state = step_by_step(model, ids, init)
    close_scaled(step_logits, logits, 1e-5, "logits, step vs forward")
    for name in ("wkv", "att_shift", "ffn_shift"):
        close_scaled(getattr(state, name), getattr(final, name), 1e-5, f"final {name}, step vs forward")


def test_fla_config_json_round_trip_and_refusals():
    cfg = RWKV7Config(**NANO)
    raw = cfg.to_official_json()
    assert raw["model_type"] == "rwkv7" and raw["num_heads"] == 4 and raw["value_dim"] == [64] * 3
    assert "chunk_size" not in raw and "head_norm_eps" not in raw
    assert RWKV7Config.from_official_json(raw) == RWKV7Config(**NANO)
    with pytest.raises(ValueError, match="value_dim=128 is not supported"):
        RWKV7Config.from_official_json({**raw, "value_dim": 128})
    with pytest.raises(ValueError, match="attn=.* is not supported"):
        RWKV7Config.from_official_json({**raw, "attn": {"layers": [1]}})
    with pytest.raises(ValueError, match="num_heads=3 disagrees"):
        RWKV7Config(**{**NANO, "num_heads": 3})
    assert RWKV7Config(**NANO).group_norm_eps == pytest.approx(16e-5)  # fla: head_dim * norm_eps


def test_init_follows_fla():
    """What fla's RWKV7ForCausalLM sets deterministically (its random parts, orthogonal matrices, are compared
    against fla's own model in the kernel tier)."""
    model = RWKV7LM(RWKV7Config(**NANO)).requires_grad_(False)
    for i, block in enumerate(model.model.layers):
        attn = block.attn
        assert float(attn.o_proj.weight.abs().max()) == 0 and float(block.ffn.value.weight.abs().max()) == 0
        assert torch.allclose(attn.g_norm.weight, torch.full((64,), ((i + 1) / 3) ** 0.7))
        assert float(attn.x_r[0, 0, 0]) == 1.0 and float(attn.k_a[0]) == pytest.approx(1.02)
        assert hasattr(attn, "v_lora") == (i > 0)
        w0 = attn.w_lora.lora[2].bias
        assert float(w0.min()) == pytest.approx(-8.0) and float(w0.max()) <= 3.0
    assert float(model.model.embeddings.weight.abs().max()) <= 1e-4
    head = model.lm_head.weight.double()
    gain = 0.5 * math.sqrt(257 / 64)
    torch.testing.assert_close(head.T @ head, gain ** 2 * torch.eye(64, dtype=torch.float64), atol=1e-5, rtol=0)


def test_the_nano_model_reads_its_state_from_the_start():
    """fla's zero residual outputs make a fresh model ignore its state (the shared contract tests could not fail on
    it); with zero_residual_init off (the nano row) the first logits move with the initial state."""
    ids = torch.randint(0, 257, (1, 8), generator=torch.Generator().manual_seed(1))
    changes = {}
    for zero in (True, False):
        torch.manual_seed(0)
        model = RWKV7LM(RWKV7Config(**NANO, zero_residual_init=zero)).eval()
        with torch.no_grad():
            base, _ = model(ids)
            moved, _ = model(ids, random_state(model, 1))
        changes[zero] = float((moved - base).abs().max() / base.abs().max())
    assert changes[True] == 0.0 and changes[False] > 1e-2, changes


def test_decay_offset_range_sets_the_starting_memories():
    """The demo's slow start: w0 spread over each head's channels, so at init (lora.0 zero) the decays per token are
    exp(-exp(-1/2) sigmoid(w0)): 0.9998 .. 0.989 for [-8, -4]; fla's ramp otherwise."""
    model = RWKV7LM(RWKV7Config(**NANO, decay_offset_range=[-8.0, -4.0])).requires_grad_(False)
    x = torch.randn(3, 64)
    for block in model.model.layers:
        w0 = block.attn.w_lora(x)  # the data-dependent part starts at zero
        torch.testing.assert_close(w0, torch.linspace(-8.0, -4.0, 16).repeat(4).expand(3, -1))
        decay = torch.exp(-math.exp(-0.5) * torch.sigmoid(w0))
        assert 0.9997 < float(decay.max()) < 0.9999 and 0.988 < float(decay.min()) < 0.990
    assert RWKV7Config(**NANO, decay_offset_range=[-8, -4]).decay_offset_range == (-8.0, -4.0)
    assert "decay_offset_range" not in RWKV7Config(**NANO).to_official_json()
    fla = RWKV7LM(RWKV7Config(**NANO)).model.layers[0].attn.w_lora.lora[2].bias.detach()
    assert float(fla.min()) == pytest.approx(-8.0) and float(fla.max()) > 0


CLAMP = -0.05


def test_log_decay_min_off_is_the_unclamped_model_and_on_bounds_every_decay(step_by_step):
    """The model organism's clamp: off (the default) the decays are RWKV-7's own; on, log w = max(log w, clamp) on
    the chunked path and in step(); outside RWKV-7's range it is refused."""
    free, clamped = randomised(), randomised(log_decay_min=CLAMP)
    assert RWKV7Config(**NANO).log_decay_min is None
    x = torch.randn(2, 9, 64)
    attn_free, attn = free.model.layers[1].attn, clamped.model.layers[1].attn
    delta = torch.randn(2, 9, 64)
    with torch.no_grad():
        log_w_free = attn_free._project(x, delta, torch.randn(2, 9, 64))[1]
        log_w = attn._project(x, delta, torch.randn(2, 9, 64))[1]
    assert (log_w_free < CLAMP).float().mean() > 0.3  # the clamp has work to do
    assert torch.equal(log_w, log_w_free.clamp(min=CLAMP)) and float(log_w.min()) == pytest.approx(CLAMP)
    ids = torch.randint(0, 257, (2, 21), generator=torch.Generator().manual_seed(5))
    init = random_state(clamped, 2)
    step_logits, _ = step_by_step(clamped, ids, init)
    with torch.no_grad():
        logits, _ = clamped(ids, init)
        assert float((step_logits - logits).abs().max() / logits.abs().max()) < 1e-5
        assert float((free(ids, init)[0] - logits).abs().max() / logits.abs().max()) > 1e-3  # the clamp changes it
    for bad in (0.0, -0.7):
        with pytest.raises(ValueError, match="log_decay_min must be null or in"):
            RWKV7Config(**NANO, log_decay_min=bad)


def test_lm_with_the_clamp_binding_equals_the_float64_reference(close_scaled):
    model = randomised(log_decay_min=CLAMP)
    ids = torch.randint(0, 257, (2, 37), generator=torch.Generator().manual_seed(1))
    init = random_state(model, 2)
    ref_logits, ref_state = reference_lm(model, ids, init)
    free_logits, _ = reference_lm(randomised(), ids, init)
    assert float((free_logits - ref_logits).abs().max() / ref_logits.abs().max()) > 1e-3  # the clamp binds
    model.double()
    with torch.no_grad():
        logits, state = model(ids, RWKV7State(*(t.double() for t in init.parts().values())))
    close_scaled(logits, ref_logits, 1e-10, "logits (clamped)")
    close_scaled(state.wkv, ref_state.wkv, 1e-10, "final wkv (clamped)")


def test_a_clamped_model_is_refused_by_both_official_exports(tmp_path):
    from recurlen.models.rwkv7.checkpoint import blinkdl_write
    from recurlen.util.errors import UserError

    clamped = randomised(log_decay_min=CLAMP)
    with pytest.raises(UserError, match="log_decay_min=-0.05 clamps the decay, which fla's RWKV7 config.json"):
        clamped.save_pretrained(str(tmp_path / "fla"))
    with pytest.raises(UserError, match="which BlinkDL's RWKV-7 .pth cannot express"):
        blinkdl_write(clamped)
    assert "log_decay_min" not in RWKV7Config(**NANO).to_official_json()
    assert set(blinkdl_write(randomised())) == set(blinkdl_write(randomised(seed=1)))  # unclamped: written
