"""A new architecture is one folder's worth of code: a toy defined in this file alone runs everything recurlen does.

The toy is a diagonal linear RNN LM: per layer and channel h_t = a * h_{t-1} + b * x_t (x the layer's normed,
projected input, 0 < a < 1 learned), read out by a projection into the residual stream. It has what an
architecture folder holds (a config, a state type, blocks, the LM with its kernel path and checkpoint format,
a registry entry) and nothing else: registered for this module only, it runs
  - the whole contract of tests/models/test_architectures.py (imported below, run here on the toy),
  - the oracles of the position-wise evaluation with its reset control and of EffRem, and the diagnostic
    callbacks in a real fit (imported from their test modules, run here on the toy),
  - every intervention through a tiny post-training run, the run's checkpoint loaded back through the registry.

Its model section is the one thing built by hand (run_config): experiment files name models of recurlen's model
table, and a plug-in architecture has no rows there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import lightning.pytorch as pl
import pytest
import torch
import torch.nn as nn

# The shared tests, run again here on the toy: pytest collects them in this module, with its fixtures. test_callbacks
# and test_eval_* are in tests/callbacks/ and tests/diagnostics/, on the path through pyproject's pytest pythonpath.
from test_architectures import (  # noqa: F401
    make_lm,
    test_bad_inputs_are_refused_naming_the_problem,
    test_every_state_part_is_read,
    test_gradient_reaches_every_initial_state_part_and_matches_finite_differences,
    test_greedy_generation_is_the_argmax_of_one_forward,
    test_official_format_round_trip_through_the_registry,
    test_resume_is_exact,
    test_split_invariance,
    test_state_type_operations_round_trip,
    test_step_equals_forward_token_by_token,
)
from test_callbacks import test_callbacks_log_scalars_figures_and_layout  # noqa: F401
from test_eval_effrem import (  # noqa: F401
    contexts,
    test_context_free_model_has_zero_effrem,
    test_effrem_matches_definition_and_range,
)
from test_eval_positionwise import (  # noqa: F401
    seqs,
    test_chunked_nll_equals_one_forward,
    test_reset_control_matches_independent_segments,
)

from recurlen.models import registry
from recurlen.models.backends import KernelPath
from recurlen.models.config import ModelConfig
from recurlen.models.interface import Architecture
from recurlen.models.layers import RMSNorm
from recurlen.models.lm import StatefulLM
from recurlen.models.official import WEIGHTS_NAME, OfficialFormat
from recurlen.models.state import LayeredState
from recurlen.training.experiments.schema import ModelSection
from recurlen.training.finetune import run_finetune
from recurlen.training.interventions import INTERVENTIONS
from recurlen.training.run_dir import RUN_META_KEY, load_model

MODEL_TYPE = "toy-diagonal-rnn"

# ------------------------------------------------------------------------------------------ the architecture
# Legend: K layers, B lanes, L tokens, D width.


@dataclass
class ToyConfig(ModelConfig):
    vocab_size: int = 257
    """Byte vocabulary of the embedded corpus."""
    width: int = 32
    """Channels of the residual stream and of every layer's state."""
    n_layer: int = 2
    tie_embeddings: bool = False
    """LM head shares the embedding matrix."""

    def __post_init__(self) -> None:
        self.check_positive_ints(("vocab_size", "width", "n_layer"))

    def describe(self) -> str:
        return f"toy diagonal RNN (width {self.width}, {self.n_layer} layers)"

    @staticmethod
    def recognises(raw: dict[str, Any]) -> bool:
        return raw.get("model_type") == MODEL_TYPE

    def to_official_json(self) -> dict[str, Any]:
        return {"model_type": MODEL_TYPE, **self.to_dict()}

    @classmethod
    def from_official_json(cls, raw: dict[str, Any], *, source: str = "config.json") -> ToyConfig:
        return cls.from_dict({k: v for k, v in raw.items() if k != "model_type"})


@dataclass
class ToyState(LayeredState):
    h: torch.Tensor  # (K, B, D) float32

    RECURRENT: ClassVar[tuple[str, ...]] = ("h",)
    GROUP_DIMS: ClassVar[dict[str, int]] = {"h": 0}  # fitted noise per layer

    @classmethod
    def zeros_for(cls, config: ToyConfig, batch: int, *, device: torch.device | str | None = None) -> ToyState:
        return cls(torch.zeros(config.n_layer, batch, config.width, device=device))


class ToyBlock(nn.Module):
    """hidden + out_proj(h), h_t = a * h_{t-1} + b * x_t, x = in_proj(norm(hidden)), a = sigmoid(decay_logit)."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.width)
        self.in_proj = nn.Linear(cfg.width, cfg.width, bias=False)
        self.decay_logit = nn.Parameter(torch.linspace(0.0, 4.0, cfg.width))  # a from 0.5 to 0.98
        self.b = nn.Parameter(torch.ones(cfg.width))
        self.out_proj = nn.Linear(cfg.width, cfg.width, bias=False)

    def forward(self, hidden_BLD: torch.Tensor, parts: tuple[torch.Tensor], *, use_kernels: bool):
        (h_BD,) = parts
        a_D = torch.sigmoid(self.decay_logit)
        hs = []
        for x_BD in self.in_proj(self.norm(hidden_BLD)).unbind(1):
            h_BD = a_D * h_BD + self.b * x_BD
            hs.append(h_BD)
        return hidden_BLD + self.out_proj(torch.stack(hs, 1).to(hidden_BLD.dtype)), (h_BD,)

    def step(self, hidden_BD: torch.Tensor, parts: tuple[torch.Tensor]):
        hidden_B1D, parts = self(hidden_BD.unsqueeze(1), parts, use_kernels=False)
        return hidden_B1D.squeeze(1), parts


class ToyLM(StatefulLM):
    config_cls = ToyConfig
    state_cls = ToyState
    kernels = KernelPath(what="the toy's kernels", load=lambda: (None, "no kernels"), install_cuda="there are none")
    official = OfficialFormat(weights=WEIGHTS_NAME, embedding_key="embed.weight", tie_flag="tie_embeddings")

    def __init__(self, config: ToyConfig, *, backend: str = "auto") -> None:
        super().__init__(config, backend=backend)
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.blocks = nn.ModuleList([ToyBlock(config) for _ in range(config.n_layer)])
        self.norm_f = RMSNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    @property
    def embedding(self) -> nn.Embedding:
        return self.embed

    @property
    def layers(self) -> nn.ModuleList:
        return self.blocks

    def finish(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm_f(hidden)


TOY = Architecture(name="toy", title="Toy RNN", model_cls=ToyLM)

# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def toy():
    registry.register(TOY)
    yield TOY
    registry.unregister(TOY.name)


@pytest.fixture(scope="module")
def arch(toy) -> str:
    """The diagnostics' tests take their architecture from here: the toy."""
    return toy.name


@pytest.fixture
def case(toy):
    """The contract's tests take their model from here: the toy with its config's defaults."""
    return toy.name, {}


@pytest.fixture
def run_config(toy, experiment):
    """The conftest's tiny post-training run, its model section the toy's (no `model=` choice names it)."""

    def make(run_dir, *overrides: str):
        cfg = experiment(run_dir, *overrides)
        return dataclasses.replace(cfg, model=ModelSection(name="custom", architecture=toy.name))

    return make


# ------------------------------------------------------------------------------------------ the toy's own tests


def test_registered_for_this_module_through_the_registry_only(toy):
    assert registry.get("toy") is toy and list(registry.architectures())[-1] == "toy"
    model = toy.build(ToyConfig(), backend="torch")
    assert registry.of_model(model) is toy and registry.of_config(model.config) is toy
    with pytest.raises(ValueError, match="architecture 'gla' is recurlen's own; register another name"):
        registry.register(dataclasses.replace(TOY, name="gla"))


class FirstLayerStates(pl.Callback):
    """Layer 0's state into and out of every training forward, read by hooks on the first block."""

    def __init__(self) -> None:
        self.into: list[torch.Tensor] = []
        self.out: list[torch.Tensor] = []

    def on_train_start(self, trainer, pl_module) -> None:
        block = pl_module.model.layers[0]  # called as block(carry, parts) -> (carry, parts)

        def into(module, args) -> None:
            if module.training:
                self.into.append(args[1][0].detach().clone())

        def out(module, args, result) -> None:
            if module.training:
                self.out.append(result[1][0].detach().clone())

        block.register_forward_pre_hook(into)
        block.register_forward_hook(out)


@pytest.mark.parametrize("intervention", INTERVENTIONS)
def test_each_intervention_post_trains_the_toy(run_config, tmp_path, intervention):
    seen = FirstLayerStates()
    run_dir = run_finetune(run_config(tmp_path / "run", f"intervention={intervention}"), callbacks=[seen])
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    meta = ckpt[RUN_META_KEY]
    assert ckpt["global_step"] == 2 and meta["architecture"] == "toy" and meta["intervention"] == intervention
    first, second = seen.into
    assert first.shape == second.shape == (4, 32)  # lanes x width
    if intervention == "none":
        assert first.abs().sum() == 0 and second.abs().sum() == 0
    if intervention in ("random_noise", "fitted_noise"):
        assert first.abs().sum() > 0 and not torch.equal(first, second)  # fresh noise every step
    if intervention in ("state_passing", "tbptt"):
        assert first.abs().sum() == 0  # nothing to carry yet
        carried = [torch.equal(second[lane], seen.out[0][lane]) for lane in range(4)]
        reset = [second[lane].abs().sum() == 0 for lane in range(4)]
        assert all(c or r for c, r in zip(carried, reset)) and any(carried)
        assert meta["intervention_state"]["carried"]["state"]["h"].shape == (2, 4, 32)
    if intervention == "fitted_noise":
        assert meta["intervention_state"]["fitted_noise"]["mean_KH"].shape == (2, 1)  # per layer (GROUP_DIMS 0)
    loaded = load_model(str(run_dir), backend="torch").model
    assert isinstance(loaded, ToyLM)
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, ckpt["state_dict"]["model." + key]), key
