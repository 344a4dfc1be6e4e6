"""The recurrent-model contract, checked once for every architecture in the registry (and the variants whose state
or scan takes another shape): split invariance, the state type's operations, step == forward, gradients into the
initial state, generation, official-format checkpoints, exact resume of a post-training run.

The tests take two fixtures, `make_lm` (a fresh small model) and `run_config` (a tiny post-training run of it);
tests/models/test_toy_architecture.py runs the same tests on an architecture defined in that file alone.
"""

import json

import lightning.pytorch as pl
import pytest
import torch

from recurlen.evaluation.generation import greedy_generate
from recurlen.models import registry
from recurlen.training.finetune import run_finetune
from recurlen.training.run_dir import RUN_META_KEY

TOL = 1e-5
"""Relative tolerance (of the reference's largest magnitude) of float32 results computed in other pieces."""

ARCHITECTURES = tuple(registry.architectures())  # at collection: the toy is registered later, for its module only
# Besides each nano preset, the variants whose state or scan has another shape (each registry entry's `variants`:
# Mamba-2 with grouped B and C, GLA with short convolutions, whose windows join the state).
CASES = [(name, {}) for name in ARCHITECTURES] + [
    (name, dict(fields)) for name in ARCHITECTURES for fields in registry.get(name).variants]


def case_id(case) -> str:
    name, fields = case
    return "-".join([name, *(f"{k}={v}" for k, v in fields.items())])


@pytest.fixture(params=CASES, ids=case_id)
def case(request):
    return request.param


@pytest.fixture
def make_lm(case, nano_model):
    """`make_lm(seed=0)`: a fresh model of the case (torch backend, eval mode)."""
    name, fields = case
    return lambda seed=0: nano_model(name, seed=seed, **fields)


@pytest.fixture
def run_config(case, experiment):
    """`run_config(run_dir, *overrides)`: the conftest's tiny post-training run of the case's model."""
    name, fields = case
    words = [f"model.arch.{k}={json.dumps(v)}" for k, v in fields.items()]
    return lambda run_dir, *overrides: experiment(run_dir, *words, *overrides, arch=name)


def random_state(model, batch: int, *, seed: int, dtype: torch.dtype = torch.float32):
    """A state of the model's type with every part drawn from N(0, 1): every part then moves the logits."""
    zero = model.zero_state(batch)
    g = torch.Generator().manual_seed(seed)
    return type(zero)(**{n: torch.randn(t.shape, generator=g, dtype=dtype) for n, t in zero.parts().items()})


def relative_change(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).abs().max() / ref.abs().max())


def ids_of(model, batch: int, length: int, *, seed: int) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------ state in, state out


@pytest.mark.parametrize("cuts", [[64], [1, 2, 3], [5, 70, 71, 130], list(range(1, 40))],
                         ids=["one", "short-first", "across-chunks", "one-token-pieces"])
def test_split_invariance(make_lm, split_equals_one_call, cuts):
    model = make_lm()
    tols = {part: TOL for part in model.zero_state(1).part_names()}
    split_equals_one_call(model, ids_of(model, 3, 150, seed=1), random_state(model, 3, seed=2), cuts=cuts,
                          part_tols=tols, logits_tol=TOL, backend="torch")


def test_every_state_part_is_read(make_lm):
    """What makes the split check able to fail: the model reads every part of the state it is given (zeroing one
    changes what follows by far more than the check's tolerance), and the initial state moves the logits."""
    model = make_lm()
    ids, init = ids_of(model, 2, 96, seed=1), random_state(model, 2, seed=2)
    with torch.no_grad():
        assert relative_change(model(ids)[0], model(ids, init)[0]) > 1e-2, "the initial state is not read"
        _, carried = model(ids[:, :48], init)
        going_on, _ = model(ids[:, 48:], carried)
        for part, t in carried.parts().items():
            if t.numel() == 0:
                continue
            dropped = type(carried)(**{**carried.parts(), part: torch.zeros_like(t)})
            change = relative_change(model(ids[:, 48:], dropped)[0], going_on)
            assert change > 1e-2, f"dropping the {part} state changed the logits by only {change:.3g} (relative)"


def test_step_equals_forward_token_by_token(make_lm, close_scaled, step_by_step):
    model = make_lm()
    ids, init = ids_of(model, 2, 40, seed=1), random_state(model, 2, seed=2)
    with torch.no_grad():
        _, state = model(ids[:, :7], init)
        full_logits, full_state = model(ids[:, 7:], state)
        hidden, _ = model.forward_hidden(ids[:, 7:], state)
    step_logits, state = step_by_step(model, ids[:, 7:], state)
    close_scaled(model.logits_from_hidden(hidden), full_logits, 0.0, "logits from forward_hidden")
    close_scaled(step_logits, full_logits, TOL, "logits, step vs forward")
    for part, t in state.parts().items():
        close_scaled(t, getattr(full_state, part), TOL, f"final {part} state, step vs forward")


def test_gradient_reaches_every_initial_state_part_and_matches_finite_differences(make_lm):
    model = make_lm().double()
    ids = ids_of(model, 1, 11, seed=1)
    start = random_state(model, 1, seed=2, dtype=torch.float64)
    leaves = {n: t.clone().requires_grad_() for n, t in start.parts().items() if t.numel()}
    g = torch.Generator().manual_seed(3)
    w = torch.randn(1, 11, model.config.vocab_size, dtype=torch.float64, generator=g)

    def f(parts):
        logits, final = model(ids, type(start)(**{**start.parts(), **parts}))
        return (logits * w).sum() + 0.1 * sum(getattr(final, n).pow(2).sum() for n in final.RECURRENT)

    f(leaves).backward()
    eps = 1e-6
    for name, leaf in leaves.items():
        assert leaf.grad is not None and leaf.grad.abs().sum() > 0, f"no gradient reaches the initial {name} state"
        for idx in torch.randperm(leaf.numel(), generator=g)[:4].tolist():
            plus, minus = leaf.detach().clone(), leaf.detach().clone()
            plus.view(-1)[idx] += eps
            minus.view(-1)[idx] -= eps
            with torch.no_grad():
                fd = (f({**leaves, name: plus}) - f({**leaves, name: minus})) / (2 * eps)
            assert leaf.grad.view(-1)[idx].item() == pytest.approx(fd.item(), rel=1e-5, abs=1e-7), (name, idx)


def test_greedy_generation_is_the_argmax_of_one_forward(make_lm):
    model = make_lm()
    prompt = ids_of(model, 2, 20, seed=1)
    generated = greedy_generate(model, prompt, max_new_tokens=8, chunk_len=6)
    seq = prompt
    with torch.no_grad():
        for _ in range(8):
            seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, seq[:, 20:])


# ------------------------------------------------------------------------------------------ the state type


def test_state_type_operations_round_trip(make_lm):
    model = make_lm()
    ids = ids_of(model, 4, 12, seed=1)
    with torch.no_grad():
        _, state = model(ids, random_state(model, 4, seed=2))
    cls = type(state)
    zero = model.zero_state(4)
    assert cls is registry.of_model(model).state_cls
    assert type(zero) is cls and state.n_layer == zero.n_layer and state.batch_size == 4
    assert all(t.abs().sum() == 0 for t in zero.parts().values())
    kinds = (cls.RECURRENT, cls.FRAME, cls.WINDOW)  # every part is of exactly one kind
    assert sorted(p for kind in kinds for p in kind) == sorted(cls.part_names()) and cls.RECURRENT
    for part in cls.float32_parts():
        assert getattr(state, part).dtype == torch.float32, part

    def same(a, b) -> bool:
        return type(a) is type(b) and all(torch.equal(x, y) for x, y in zip(a.parts().values(), b.parts().values()))

    # lanes: index (int, slice, index tensor, mask), concatenate, reset, where
    assert same(cls.cat([state[0], state[1:3], state[torch.tensor([3])]]), state)
    assert same(state[torch.tensor([False, True, False, True])], state[torch.tensor([1, 3])])
    reset = state.reset(torch.tensor([True, False, True, False]))
    for part, t in reset.parts().items():
        assert t[:, [0, 2]].abs().sum() == 0 and torch.equal(t[:, [1, 3]], getattr(state, part)[:, [1, 3]]), part
    assert same(state.where(torch.tensor([False, True, False, True]), zero), reset)
    with pytest.raises(ValueError, match=r"mask must have shape \(4,\)"):
        state.where(torch.ones(3, dtype=torch.bool), zero)
    # reset lanes restart exactly like fresh sequences
    with torch.no_grad():
        torch.testing.assert_close(model(ids, state.reset(torch.ones(4, dtype=torch.bool)))[0], model(ids)[0],
                                   rtol=0, atol=0)
    # save and load; move; detach; the recurrent parts only
    saved = state.state_dict()
    assert set(saved) == set(cls.part_names()) and all(t.device.type == "cpu" for t in saved.values())
    assert same(cls.from_state_dict(saved), state)
    with pytest.raises(ValueError, match=f"a saved {cls.__name__} needs keys"):
        cls.from_state_dict({})
    moved = state.to("cpu", window_dtype=torch.float64)
    for part, t in moved.parts().items():
        assert t.dtype == (torch.float64 if part in cls.WINDOW else torch.float32), part
        assert torch.equal(t.float(), getattr(state, part)), part
    tracked = cls(**{n: t.clone().requires_grad_() for n, t in state.parts().items()})
    assert not any(t.requires_grad for t in tracked.detach().parts().values())
    only = state.recurrent_only()
    for part, t in only.parts().items():
        assert torch.equal(t, getattr(state, part)) if part not in cls.WINDOW else t.abs().sum() == 0, part
    # statistics: per-layer norms of every part; the groups fitted noise is fitted over
    norms = state.norms()
    assert set(norms) == {f"{p}_rms_K" for p in cls.part_names()}
    for part in cls.RECURRENT:
        want = getattr(state, part).pow(2).flatten(1).mean(1).sqrt()
        torch.testing.assert_close(norms[f"{part}_rms_K"], want)
        k, groups, samples = state.group_view(part).shape
        assert k == state.n_layer and groups * samples == getattr(state, part)[0].numel()
        assert samples % 4 == 0  # every lane's entries are samples of each group


def test_bad_inputs_are_refused_naming_the_problem(make_lm, monkeypatch):
    model = make_lm()
    ids = ids_of(model, 2, 8, seed=1)
    state = model.zero_state(2)
    cls, part = type(state), type(state).RECURRENT[0]
    with pytest.raises(ValueError, match=rf"state.{part} has shape .*; this model and batch need"):
        model(ids, model.zero_state(3))
    with pytest.raises(ValueError, match=rf"state.{part} must be float32"):
        model(ids, cls(**{**state.parts(), part: getattr(state, part).half()}))
    with pytest.raises(ValueError, match=f"state must be a {cls.__name__} or None; got tuple"):
        model(ids, tuple(state.parts().values()))
    with pytest.raises(ValueError, match=r"input_ids must be an integer tensor of shape \(batch, length\)"):
        model(ids.float())
    with pytest.raises(ValueError, match=r"input_ids must be an integer tensor of shape \(batch,\)"):
        model.step(ids)
    with pytest.raises(ValueError, match="input_ids has length 0"):
        model(ids[:, :0])
    with pytest.raises(ValueError, match=r"unknown backend 'cuda'; allowed: \['auto', 'torch', 'kernel'\]"):
        model(ids, backend="cuda")
    with pytest.raises(ValueError, match="unknown backend 'triton'"):
        type(model)(model.config, backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="backend='kernel' needs a CUDA device for .*; the model is on cpu"):
        model(ids, backend="kernel")


# ------------------------------------------------------------------------------------------ checkpoints


def test_official_format_round_trip_through_the_registry(case, make_lm, tmp_path):
    model = make_lm(seed=1)
    a = registry.of_model(model)
    assert a.name == case[0] and registry.of_config(model.config) is a and isinstance(model, a.model_cls)
    model.save_pretrained(str(tmp_path / "out"))
    assert registry.detect(tmp_path / "out") is a
    again = a.load_pretrained(tmp_path / "out", backend="torch")
    assert type(again) is type(model) and again.config == model.config
    mine, theirs = model.state_dict(), again.state_dict()
    assert list(mine) == list(theirs)
    for key, value in mine.items():
        assert torch.equal(value, theirs[key]), key
    ids = ids_of(model, 2, 9, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(again(ids)[0], model(ids)[0], rtol=0, atol=0)
    # Half precision, as the hub's files are: loads back upcast, within float16 rounding.
    model.save_pretrained(str(tmp_path / "half"), dtype=torch.float16)
    half = a.load_pretrained(tmp_path / "half", backend="torch")
    for key, value in half.state_dict().items():
        assert value.dtype == torch.float32, key
        torch.testing.assert_close(value, mine[key], rtol=1e-3, atol=1e-4, msg=key)


class StartingStep(pl.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.step = trainer.global_step


def test_resume_is_exact(run_config, tmp_path):
    """4 steps in one go against 2 steps, then the same run resumed to 4: bit for bit the same weights, optimizer
    state and carried lane states (constant schedule: stopping at 2 does not change the first steps' rates)."""
    extra = ["intervention=state_passing", "intervention.pass_conv=true", "trainer.checkpoint_every_n_steps=2",
             "optim.schedule=constant"]
    run_finetune(run_config(tmp_path / "straight", "trainer.max_steps=4", *extra))
    run_finetune(run_config(tmp_path / "resumed", "trainer.max_steps=2", *extra))
    started = StartingStep()
    run_finetune(run_config(tmp_path / "resumed", "trainer.max_steps=4", *extra), callbacks=[started])
    assert started.step == 2  # resumed, not trained again from the start
    a, b = (torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)
            for run in ("straight", "resumed"))
    assert a["global_step"] == b["global_step"] == 4
    assert list(a["state_dict"]) == list(b["state_dict"])
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    (opt_a,), (opt_b,) = a["optimizer_states"], b["optimizer_states"]
    for param, slots in opt_a["state"].items():
        for slot, value in slots.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt_b["state"][param][slot])), (param, slot)
    ca, cb = (ckpt[RUN_META_KEY]["intervention_state"]["carried"] for ckpt in (a, b))
    assert torch.equal(ca["lanes"], cb["lanes"])
    assert set(ca["state"]) == set(cb["state"]) and ca["state"]
    for part, value in ca["state"].items():
        assert torch.equal(value, cb["state"][part]), part
    recurrent = registry.get(a[RUN_META_KEY]["architecture"]).state_cls.RECURRENT[0]
    assert ca["state"][recurrent].abs().sum() > 0  # a state was really carried
