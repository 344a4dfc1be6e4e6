"""What RWKV-6 and RWKV-7 share (recurlen.models.rwkv_common): one config base with the shared fields and checks, one
state type, one walk over BlinkDL's .pth names. Both architectures' own tests (tests/models/rwkv6, rwkv7) cover their
formats end to end; these pin the shared parts and that both folders use them."""

import pytest
import torch

from recurlen.models.rwkv6 import RWKV6Config, RWKV6State
from recurlen.models.rwkv7 import RWKV7Config, RWKV7State
from recurlen.models.rwkv_common import RWKVConfig, RWKVState, blinkdl_layers, blinkdl_read_keys, blinkdl_write_keys
from recurlen.util.errors import UserError

SHARED_JSON = {"architectures", "attn", "attn_mode", "fuse_norm", "gate_low_rank_dim", "hidden_act", "hidden_ratio",
               "hidden_size", "initializer_range", "intermediate_size", "model_type", "norm_bias", "norm_eps",
               "norm_first", "num_heads", "num_hidden_layers", "tie_word_embeddings", "vocab_size"}


def test_both_architectures_use_the_shared_config_and_state():
    assert issubclass(RWKV6Config, RWKVConfig) and issubclass(RWKV7Config, RWKVConfig)
    assert issubclass(RWKV6State, RWKVState) and issubclass(RWKV7State, RWKVState)
    for state in (RWKV6State, RWKV7State):  # the parts and their checks are written once
        assert not {"zeros_for", "__post_init__", "RECURRENT", "WINDOW"} & set(vars(state))
        assert state.part_names() == ("wkv", "att_shift", "ffn_shift")


def test_config_json_keys_and_defaults_are_fla_s():
    six, seven = RWKV6Config().to_official_json(), RWKV7Config().to_official_json()
    assert set(six) == SHARED_JSON | {"expand_k", "expand_v", "proj_low_rank_dim"}
    assert set(seven) == SHARED_JSON | {"head_dim", "a_low_rank_dim", "decay_low_rank_dim", "v_low_rank_dim",
                                        "value_dim"}
    assert (six["hidden_ratio"], seven["hidden_ratio"]) == (3.5, 4)  # fla's defaults differ
    assert (RWKV6Config().ffn_size, RWKV7Config().ffn_size) == (448, 512)
    assert RWKV6Config().group_norm_eps == 1e-5 and RWKV7Config(head_dim=32, hidden_size=64).group_norm_eps == 32e-5


@pytest.mark.parametrize("cls", [RWKV6Config, RWKV7Config])
@pytest.mark.parametrize(("bad", "match"), [
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported; allowed: 'sqrelu'"),
    ({"attn_mode": "parallel"}, "attn_mode='parallel'; allowed: 'chunk', 'fused_recurrent'"),
    ({"hidden_ratio": None}, "give intermediate_size or a positive hidden_ratio"),
    ({"head_norm_eps": 0.0}, "head_norm_eps must be > 0; got 0.0"),
])
def test_shared_checks_refuse_in_both(cls, bad, match):
    with pytest.raises(ValueError, match=match):
        cls(**bad)


def test_the_embedding_norm_refusal_names_the_architecture():
    for cls, name in ((RWKV6Config, "RWKV-6"), (RWKV7Config, "RWKV-7")):
        with pytest.raises(ValueError, match=f"every {name} checkpoint has the embedding norm"):
            cls(norm_first=False)


def test_state_zeros_and_shape_error_per_architecture():
    six = RWKV6State.zeros_for(RWKV6Config(hidden_size=64, num_heads=2, expand_k=0.5), 3)
    assert [tuple(t.shape) for t in six.parts().values()] == [(2, 3, 2, 16, 32), (2, 3, 64), (2, 3, 64)]
    seven = RWKV7State.zeros_for(RWKV7Config(hidden_size=64, head_dim=16), 3)
    assert [tuple(t.shape) for t in seven.parts().values()] == [(2, 3, 4, 16, 16), (2, 3, 64), (2, 3, 64)]
    flat = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"RWKV7State needs wkv \(layers, batch, heads, head_dim, head_dim\)"):
        RWKV7State(flat, flat, flat)
    with pytest.raises(ValueError, match=r"RWKV6State needs wkv \(layers, batch, heads, head_dim, head_v_dim\)"):
        RWKV6State(flat, flat, flat)


def _blinkdl(layers=2):
    t = {"emb.weight": torch.randn(5, 4), "ln_out.weight": torch.randn(4), "ln_out.bias": torch.randn(4),
         "head.weight": torch.randn(5, 4), "blocks.0.ln0.weight": torch.randn(4), "blocks.0.ln0.bias": torch.randn(4)}
    t.update({f"blocks.{i}.att.key.weight": torch.randn(4, 4) for i in range(layers)})
    return t


def _read_hook(i, rest, tensor):
    return {"attn.k.weight": tensor.t()} if rest == "att.key.weight" else None


def test_blinkdl_walk_renames_the_shared_keys_and_hands_the_rest_to_the_hook():
    t = _blinkdl(layers=3)
    assert blinkdl_layers(t) == 3
    out = blinkdl_read_keys(t, _read_hook, source="x.pth", title="RWKV-9", unsupported="other files")
    assert set(out) == {"model.embeddings.weight", "model.norm.weight", "model.norm.bias", "lm_head.weight",
                        "model.layers.0.pre_norm.weight", "model.layers.0.pre_norm.bias",
                        *(f"model.layers.{i}.attn.k.weight" for i in range(3))}
    assert torch.equal(out["model.layers.2.attn.k.weight"], t["blocks.2.att.key.weight"].t())
    back = blinkdl_write_keys(out, 3, lambda i, prefix: {"att.key.weight": out[prefix + "attn.k.weight"].t()})
    assert list(back) == list(t) and all(torch.equal(back[k], t[k]) and back[k].is_contiguous() for k in t)


def test_blinkdl_walk_refuses_what_no_hook_takes_in_one_line():
    t = {**_blinkdl(), "time_state": torch.zeros(1), "blocks.1.ln0.weight": torch.zeros(4)}  # ln0 only in block 0
    with pytest.raises(UserError) as err:
        blinkdl_read_keys(t, _read_hook, source="x.pth", title="RWKV-9", unsupported="tuned states")
    assert str(err.value) == ("x.pth: keys recurlen's RWKV-9 does not have: ['blocks.1.ln0.weight', 'time_state'] "
                              "(tuned states are not supported)")
