"""RWKV-6 against an independent reference: BlinkDL's `rwkv` pip package (its own RWKV-6 code path, strategy
'cpu fp32') on a random checkpoint written in BlinkDL's .pth format. Logits and every state part (the WKV matrix, both
token shifts) must agree token by token, over whole sequences, and split with the state carried: relative error
< 1e-4 in float32 (error / max |reference|, per tensor).

The package is a test dependency only (the dev extra); without it these tests skip.
"""

import os

import pytest
import torch

from recurlen.models.rwkv6 import RWKV6LM, RWKV6State, preset
from recurlen.models.rwkv6.checkpoint import BLINKDL_FILE

TOL = 1e-4


@pytest.fixture(scope="module")
def rwkv_model_cls():
    # The package reads these at import: no TorchScript, no CUDA extension, not its RWKV-7 class.
    env = {"RWKV_JIT_ON": "0", "RWKV_CUDA_ON": "0"}
    saved = {k: os.environ.get(k) for k in (*env, "RWKV_V7_ON")}
    os.environ.update(env)
    os.environ.pop("RWKV_V7_ON", None)
    try:
        model_module = pytest.importorskip("rwkv.model")
        yield model_module.RWKV
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def pair(rwkv_model_cls, tmp_path_factory):
    """(recurlen's model loaded from the .pth, the rwkv package's model of the same file)."""
    torch.manual_seed(0)
    # Heads of 16 (the package derives the head count from time_faaaa), 3 layers, random everything.
    model = RWKV6LM(preset("nano", num_hidden_layers=3, num_heads=4, head_norm_eps=64e-5), backend="torch")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.5) + (1.0 if "norm.weight" in name else 0.0))
        for block in model.model.layers:
            block.attn.w_proj.linear.lora[2].bias.uniform_(-4.0, 0.0)  # slow and fast channels
    path = BLINKDL_FILE.save(model, tmp_path_factory.mktemp("rwkv6") / "RWKV-x060-random.pth")
    ours = RWKV6LM.from_pretrained(str(path), backend="torch").eval()
    theirs = rwkv_model_cls(str(path), strategy="cpu fp32", verbose=False)
    assert theirs.version == 6.0
    return ours, theirs


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-12))


def to_package_state(state: RWKV6State) -> list[torch.Tensor]:
    """Lane 0 of a recurlen state as the package's list: per layer [time-mix shift, WKV (H, K, V), channel-mix
    shift]."""
    out = []
    for i in range(state.n_layer):
        out += [state.att_shift[i, 0].clone(), state.wkv[i, 0].clone(), state.ffn_shift[i, 0].clone()]
    return out


def assert_states_match(ours: RWKV6State, theirs: list[torch.Tensor], what: str) -> float:
    worst = 0.0
    for i in range(ours.n_layer):
        for name, got, ref in (("att_shift", ours.att_shift[i, 0], theirs[3 * i]),
                               ("wkv", ours.wkv[i, 0], theirs[3 * i + 1]),
                               ("ffn_shift", ours.ffn_shift[i, 0], theirs[3 * i + 2])):
            err = rel(got, ref)
            assert err < TOL, f"{what}: layer {i} {name} relative error {err:.2e}"
            worst = max(worst, err)
    return worst


IDS = torch.randint(0, 257, (1, 48), generator=torch.Generator().manual_seed(5))


def test_whole_sequence_logits_and_states_match(pair):
    ours, theirs = pair
    with torch.no_grad():
        logits, state = ours(IDS)
        ref_logits, ref_state = theirs.forward(IDS[0].tolist(), None, full_output=True)
    assert rel(logits[0], ref_logits) < TOL, f"logits relative error {rel(logits[0], ref_logits):.2e}"
    assert_states_match(state, ref_state, "whole sequence")


def test_token_by_token_matches(pair):
    ours, theirs = pair
    state, ref_state = None, None
    for t in range(20):
        logits, state = ours.step(IDS[:, t], state)
        ref_logits, ref_state = theirs.forward([int(IDS[0, t])], ref_state)
        assert rel(logits[0], ref_logits) < TOL, f"token {t}: logits relative error {rel(logits[0], ref_logits):.2e}"
    assert_states_match(state, ref_state, "token by token")


def test_split_with_the_state_carried_and_a_nonzero_start_match(pair):
    """Pieces of 17, 1 and 30 tokens with the state carried, starting from a random state handed to both."""
    ours, theirs = pair
    gen = torch.Generator().manual_seed(7)
    zero = ours.zero_state(1)
    start = RWKV6State(torch.randn(zero.wkv.shape, generator=gen), torch.randn(zero.att_shift.shape, generator=gen),
                       torch.randn(zero.ffn_shift.shape, generator=gen))
    state, ref_state = start, to_package_state(start)
    for a, b in ((0, 17), (17, 18), (18, 48)):
        with torch.no_grad():
            logits, state = ours(IDS[:, a:b], state)
        ref_logits, ref_state = theirs.forward(IDS[0, a:b].tolist(), ref_state, full_output=True)
        ref_logits = ref_logits.view(b - a, -1)
        assert rel(logits[0], ref_logits) < TOL, f"piece {a}:{b}: relative error {rel(logits[0], ref_logits):.2e}"
    assert_states_match(state, ref_state, "split")
