"""Documents packed into one row, the state reset where each starts (`model(ids, state, resets=...)`), equal running
the documents one by one: every architecture of the registry (and its variants), the torch path, float64.

A packed row gives the same logits, the same final state (its last document's), the same loss and the same gradients
(every parameter, the state handed in) as its documents run separately: the row's first document from the state handed
in (from zeros where position 0 is flagged), every other one from zeros. Boundaries fall on chunk edges and off them,
one document is a single token, one row has no flag at all.
"""

import pytest
import torch
import torch.nn.functional as F

from recurlen.models import registry
from recurlen.training.lit_module import token_loss
from recurlen.util.errors import UserError

ARCHITECTURES = tuple(registry.architectures())
CASES = [(name, {}) for name in ARCHITECTURES] + [
    (name, dict(fields)) for name in ARCHITECTURES for fields in registry.get(name).variants]
CHUNK = 8
"""The scans' chunk length here: the rows below cut documents at multiples of it and between them."""

ROWS = (
    (False, (8, 1, 7, 16, 3, 5)),  # continues the state handed in; edges at 8, 16 and 32, a one-token document
    (True, (1, 12, 4, 20, 3)),  # flagged at 0 (drops the state handed in); a one-token document first
    (False, (40,)),  # one document: no flag at all
)
LENGTH = 40
TOL = 1e-9
"""float64: the packed and the separate runs differ only in the order of their sums."""


def case_id(case) -> str:
    name, fields = case
    return "-".join([name, *(f"{k}={v}" for k, v in fields.items())])


def random_state(model, batch: int, *, seed: int):
    """Every part of the state drawn from N(0, 1) (float64): each moves the logits, so a part a reset misses shows."""
    zero = model.zero_state(batch)
    g = torch.Generator().manual_seed(seed)
    return type(zero)(**{n: torch.randn(t.shape, generator=g, dtype=torch.float64) for n, t in zero.parts().items()})


def resets_of(rows) -> torch.Tensor:
    resets = torch.zeros(len(rows), LENGTH, dtype=torch.bool)
    for b, (flag_first, lengths) in enumerate(rows):
        assert sum(lengths) == LENGTH
        starts = torch.tensor(lengths).cumsum(0)[:-1]
        resets[b, starts] = True
        resets[b, 0] = flag_first
    return resets


def objective(logits, targets, final, weights):
    """The training loss plus a random linear function of the logits and of every part of the final state, so that
    the gradients of all of them are compared."""
    # Summed in float64 (token_loss's cross-entropy is float32): the separate runs add up.
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")
    loss = loss + (logits * weights["logits"][: logits.shape[0], : logits.shape[1]]).sum()
    for name, t in final.parts().items():
        loss = loss + (t * weights[name][:, : t.shape[1]]).sum()
    return loss


def run(model, ids, init, weights, *, resets=None, backend="torch"):
    """Logits, final state, loss, and the gradients of the parameters and of the initial state's parts."""
    model.zero_grad(set_to_none=True)
    init = type(init)(**{n: t.clone().requires_grad_() for n, t in init.parts().items()})
    logits, final = model(ids[:, :-1], init, resets=resets, backend=backend)
    loss = objective(logits, ids[:, 1:], final, weights)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    grads.update({f"state.{n}": t.grad for n, t in init.parts().items()})
    return logits.detach(), final.detach(), loss.detach(), grads


def run_separately(model, ids, init, weights, rows, *, backend="torch"):
    """The same, each document of each row in its own call: the row's first from the state handed in (zeros where
    flagged), the others from zeros; logits concatenated, the final state of each row's last document, the losses
    and the gradients summed."""
    model.zero_grad(set_to_none=True)
    init = type(init)(**{n: t.clone().requires_grad_() for n, t in init.parts().items()})
    total, row_logits, finals = 0.0, [], []
    for b, (flag_first, lengths) in enumerate(rows):
        state = init[b].zeros_like() if flag_first else init[b]
        pieces, start = [], 0
        for length in lengths:
            seg = ids[b:b + 1, start:start + length + 1]
            logits, final = model(seg[:, :-1], state, backend=backend)
            last = start + length == LENGTH
            w = {"logits": weights["logits"][b:b + 1, start:start + length]}
            w.update({n: weights[n][:, b:b + 1] if last else torch.zeros_like(weights[n][:, b:b + 1])
                      for n in final.parts()})
            total = total + objective(logits, seg[:, 1:], final, w)
            pieces.append(logits)
            start += length
            state = final.zeros_like()
        row_logits.append(torch.cat(pieces, dim=1))
        finals.append(final)
    total.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    grads.update({f"state.{n}": t.grad for n, t in init.parts().items()})
    return torch.cat(row_logits).detach(), type(finals[0]).cat(finals).detach(), total.detach(), grads


def weights_for(model, state, *, seed: int):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    w = {"logits": torch.randn(len(ROWS), LENGTH, vocab, generator=g, dtype=torch.float64) * 0.1}
    w.update({n: torch.randn(t.shape, generator=g, dtype=torch.float64) for n, t in state.parts().items()})
    return w


def assert_same(got, ref, what):
    scale = float(ref.abs().max().clamp_min(1e-12)) if ref.numel() else 1.0
    err = float((got - ref).abs().max()) if ref.numel() else 0.0
    assert err <= TOL * scale, f"{what}: max |packed - separate| = {err:.3g}, > {TOL:g} x {scale:.3g}"


@pytest.fixture(params=CASES, ids=case_id)
def case(request):
    return request.param


def packed_model(nano_model, name, fields):
    model = nano_model(name, chunk_size=CHUNK, **fields).double()
    assert type(model).supports_resets, f"{name} has no in-row resets (StatefulLM.supports_resets)"
    return model


def test_packed_row_equals_documents_run_separately(case, nano_model):
    name, fields = case
    model = packed_model(nano_model, name, fields)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (len(ROWS), LENGTH + 1), generator=g)
    init = random_state(model, len(ROWS), seed=4)
    weights = weights_for(model, init, seed=5)
    logits, final, loss, grads = run(model, ids, init, weights, resets=resets_of(ROWS))
    ref_logits, ref_final, ref_loss, ref_grads = run_separately(model, ids, init, weights, ROWS)
    assert_same(logits, ref_logits, "logits")
    for part, t in ref_final.parts().items():
        assert_same(getattr(final, part), t, f"final {part} state")
    assert_same(loss, ref_loss, "objective (cross-entropy + random functions of logits and final state)")
    # The training loss (token_loss, float32 inside): the packed row's mean equals the documents' tokens' mean.
    targets = ids[:, 1:]
    got = float(token_loss(logits, targets, None))
    want = float(token_loss(ref_logits, targets, None))
    assert abs(got - want) <= 1e-6 * abs(want), f"training loss: packed {got} != separate {want}"
    assert set(grads) == set(ref_grads)
    for n, ref in ref_grads.items():
        assert_same(grads[n], ref, f"gradient of {n}")


def test_resets_change_the_result(case, nano_model):
    """The check above can fail: without the flags the same packed row gives other logits (the documents read
    each other's state)."""
    name, fields = case
    model = packed_model(nano_model, name, fields)
    ids = torch.randint(0, model.config.vocab_size, (len(ROWS), LENGTH), generator=torch.Generator().manual_seed(3))
    init = random_state(model, len(ROWS), seed=4)
    with torch.no_grad():
        packed, _ = model(ids, init, resets=resets_of(ROWS))
        joined, _ = model(ids, init)
    assert float((packed[0, 8:] - joined[0, 8:]).abs().max()) > 1e-3


def test_no_flags_is_the_plain_call(case, nano_model):
    """resets all False is the call without resets (the packed path costs nothing in meaning where no document
    starts)."""
    name, fields = case
    model = packed_model(nano_model, name, fields)
    ids = torch.randint(0, model.config.vocab_size, (2, 27), generator=torch.Generator().manual_seed(7))
    init = random_state(model, 2, seed=8)
    with torch.no_grad():
        plain, plain_final = model(ids, init)
        flagged, flagged_final = model(ids, init, resets=torch.zeros(2, 27, dtype=torch.bool))
    assert_same(flagged, plain, "logits")
    for part, t in plain_final.parts().items():
        assert_same(getattr(flagged_final, part), t, f"final {part} state")


def test_bad_resets_are_refused(nano_model):
    model = nano_model("mamba2")
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"resets must be a bool tensor of the ids' shape \(2, 5\)"):
        model(ids, resets=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="resets must be a bool tensor"):
        model(ids, resets=torch.zeros(2, 5))


def test_an_architecture_without_resets_refuses_them(nano_model, monkeypatch):
    model = nano_model("mamba2")
    monkeypatch.setattr(type(model), "supports_resets", False)
    with pytest.raises(UserError, match="cannot reset its state inside a row.*data.layout=documents"):
        model(torch.zeros(1, 3, dtype=torch.long), resets=torch.zeros(1, 3, dtype=torch.bool))
