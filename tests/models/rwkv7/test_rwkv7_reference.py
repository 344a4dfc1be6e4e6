"""RWKV-7 against an independent reference: BlinkDL's `rwkv` pip package (its RWKV_x070 class, RWKV_V7_ON=1,
strategy 'cpu fp32') on a random checkpoint written in BlinkDL's x070 .pth format. Logits and every state part (the
WKV matrix, both token shifts) must agree in one pass, token by token, and split with the whole state carried from a
random state: relative error < 1e-4 in float32 (error / max |reference|, per tensor).

The package picks its RWKV-7 class at import time from RWKV_V7_ON; it is imported here as a private copy (the
RWKV-6 reference test imports it without the variable) and never left in sys.modules. It is a test dependency only
(the dev extra); without it these tests skip.
"""

import importlib
import os
import sys

import pytest
import torch

from recurlen.models.rwkv7 import RWKV7LM, RWKV7Config, RWKV7State
from recurlen.models.rwkv7.checkpoint import BLINKDL_FILE

TOL = 1e-4
WORST: dict[str, float] = {}


@pytest.fixture(scope="module")
def rwkv7_cls():
    env = {"RWKV_V7_ON": "1", "RWKV_JIT_ON": "0", "RWKV_CUDA_ON": "0"}
    saved_env = {k: os.environ.get(k) for k in env}
    saved_module = sys.modules.pop("rwkv.model", None)
    os.environ.update(env)
    try:
        pytest.importorskip("rwkv")
        module = importlib.import_module("rwkv.model")
        cls = module.RWKV_x070
    finally:
        sys.modules.pop("rwkv.model", None)
        if saved_module is not None:
            sys.modules["rwkv.model"] = saved_module
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield cls
    if WORST:
        print("\nrecurlen vs the rwkv package (RWKV-7), worst relative errors: "
              + ", ".join(f"{k} {v:.1e}" for k, v in WORST.items()))


@pytest.fixture(scope="module")
def pair(rwkv7_cls, tmp_path_factory):
    """(recurlen's model loaded from the .pth, the rwkv package's model of the same file)."""
    torch.manual_seed(0)
    # Heads of 16 (the package reads the head size off r_k), 3 layers, random everything.
    cfg = RWKV7Config(hidden_size=64, num_hidden_layers=3, head_dim=16, decay_low_rank_dim=8, gate_low_rank_dim=16,
                      a_low_rank_dim=8, v_low_rank_dim=8, intermediate_size=128, head_norm_eps=64e-5, chunk_size=16)
    model = RWKV7LM(cfg, backend="torch")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.5) + (1.0 if "norm.weight" in name else 0.0))
        for block in model.model.layers:
            block.attn.w_lora.lora[2].bias.uniform_(-6.0, 3.0)  # slow and fast channels
    path = BLINKDL_FILE.save(model, tmp_path_factory.mktemp("rwkv7") / "RWKV-x070-random.pth")
    ours = RWKV7LM.from_pretrained(str(path), backend="torch").eval()
    assert ours.config.head_norm_eps == 64e-5 and ours.config.num_heads == 4
    theirs = rwkv7_cls(str(path)[:-len(".pth")], "cpu fp32")  # it appends .pth itself
    assert (theirs.n_head, theirs.head_size, theirs.n_layer) == (4, 16, 3)
    return ours, theirs


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-12))


def check(what: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    err = rel(got, ref)
    WORST[what.split(":")[0]] = max(WORST.get(what.split(":")[0], 0.0), err)
    assert err < TOL, f"{what}: relative error {err:.2e}"


def to_package_state(state: RWKV7State) -> list[torch.Tensor]:
    """Lane 0 of a recurlen state as the package's list: per layer [time-mix shift, WKV (H, V, K) value-major,
    channel-mix shift]."""
    out = []
    for i in range(state.n_layer):
        out += [state.att_shift[i, 0].clone(), state.wkv[i, 0].transpose(-1, -2).contiguous(),
                state.ffn_shift[i, 0].clone()]
    return out


def assert_states_match(ours: RWKV7State, theirs: list[torch.Tensor], what: str) -> None:
    for i in range(ours.n_layer):
        check(f"att_shift: {what}, layer {i}", ours.att_shift[i, 0], theirs[3 * i])
        check(f"wkv: {what}, layer {i}", ours.wkv[i, 0], theirs[3 * i + 1].transpose(-1, -2))
        check(f"ffn_shift: {what}, layer {i}", ours.ffn_shift[i, 0], theirs[3 * i + 2])


IDS = torch.randint(0, 257, (1, 48), generator=torch.Generator().manual_seed(5))


def test_whole_sequence_logits_and_states_match(pair):
    ours, theirs = pair
    with torch.no_grad():
        logits, state = ours(IDS)
    ref_logits, ref_state = theirs.forward(IDS[0].tolist(), None, full_output=True)
    check("logits: one pass", logits[0], ref_logits)
    assert_states_match(state, ref_state, "one pass")


def test_token_by_token_matches(pair):
    ours, theirs = pair
    state, ref_state = None, None
    for t in range(20):
        logits, state = ours.step(IDS[:, t], state)
        ref_logits, ref_state = theirs.forward([int(IDS[0, t])], ref_state)
        check(f"logits: token {t}", logits[0], ref_logits)
    assert_states_match(state, ref_state, "token by token")


def test_split_with_the_whole_state_carried_from_a_random_state_matches(pair):
    """Pieces of 17, 1 and 30 tokens with the state carried, starting from a random state handed to both."""
    ours, theirs = pair
    gen = torch.Generator().manual_seed(7)
    zero = ours.zero_state(1)
    start = RWKV7State(*(torch.randn(t.shape, generator=gen) for t in zero.parts().values()))
    state, ref_state = start, to_package_state(start)
    for a, b in ((0, 17), (17, 18), (18, 48)):
        with torch.no_grad():
            logits, state = ours(IDS[:, a:b], state)
        ref_logits, ref_state = theirs.forward(IDS[0, a:b].tolist(), ref_state, full_output=True)
        check(f"logits: piece {a}:{b}", logits[0], ref_logits.view(b - a, -1))
    assert_states_match(state, ref_state, "split")


def test_the_package_file_round_trips_and_other_files_are_refused(pair, tmp_path):
    """recurlen writes back the tensors it read (names, shapes, values); an RWKV-6 key or a tuned state is refused."""
    from recurlen.models.rwkv7.checkpoint import blinkdl_read, blinkdl_write
    from recurlen.util.errors import UserError

    ours, _ = pair
    written = blinkdl_write(ours)
    cfg, sd = blinkdl_read(written, "x.pth")
    assert cfg == ours.config
    assert sd.keys() == ours.state_dict().keys()
    assert all(torch.equal(sd[k], v) for k, v in ours.state_dict().items())
    with pytest.raises(UserError, match=r"keys recurlen's RWKV-7 does not have: \['blocks.0.att.time_state'\]"):
        blinkdl_read({**written, "blocks.0.att.time_state": torch.zeros(4, 16, 16)}, "x.pth")
    first_v = {f"blocks.0.att.v{j}": torch.zeros(1) for j in range(3)}  # some releases have them; never read
    assert blinkdl_read({**written, **first_v}, "x.pth")[1].keys() == sd.keys()
