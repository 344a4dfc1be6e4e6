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

And a folder of recurlen's copied under a new name (slow tier): on the package's search path, with its rows added to
the model table, it runs every shared test case of its source without an edit (the shared tests take their
architectures from the registry; tests/test_architecture_lists.py keeps them from listing names).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
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

from recurlen.models import registry, table
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


def test_the_memory_estimate_builds_on_the_meta_device_after_transformers_built_a_model(toy, monkeypatch):
    """transformers' from_pretrained builds on the meta device with torch.linspace patched, and torch caches its list
    of factory functions the first time a device context reads it: from then on the real torch.linspace ignores
    `with torch.device("meta")`, and the toy's decay parameter (a torch.linspace) was built on the CPU by the
    memory estimate, which then raised "Tensor on device meta is not on the expected device cpu" (the estimate
    runs before every training run; test_resume_is_exact failed so after the transformers-format tests)."""
    from torch.utils import _device

    from recurlen.training import memory

    original = torch.linspace
    _device._device_constructors.cache_clear()
    monkeypatch.setattr(torch, "linspace", lambda *a, **k: original(*a, **{"device": "cpu", **k}))
    try:
        with torch.device("meta"):  # fills the cache with the patched function, as transformers does
            torch.empty(1)
        monkeypatch.undo()
        with torch.device("meta"):
            assert torch.linspace(0, 1, 3).device.type == "cpu"  # the process is in the state described
        estimated, per_lane = memory.activation_bytes(toy.name, ToyConfig(), lanes=2, seq_len=16)
        assert estimated == 2 * per_lane > 0
    finally:
        _device._device_constructors.cache_clear()


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


# ------------------------------------------------------------------------------------------ a copied folder

COPIED = "copiedarch"
"""The registry name of the copy (a word no test id holds otherwise, so that `-k` selects its cases only)."""
SOURCE = "gla"
"""The folder copied: GLA's checkpoint formats recognise it by its name (config.json's model_type), so a copy
renamed is an architecture of its own; Mamba-1's (mamba-ssm's layout) and RWKV-6's (BlinkDL's .pth keys) are
recognised by their layout, which a copy shares."""


def copy_folder(source: str, name: str, into: Path) -> Path:
    """recurlen/models/<source> copied to into/<name>, renamed as a contributor renames it: its imports of its own
    modules and its registry name / model_type."""
    src = Path(registry.__file__).parent / source
    shutil.copytree(src, into / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in (into / name).glob("*.py"):
        text = path.read_text().replace(f"recurlen.models.{source}", f"recurlen.models.{name}")
        path.write_text(text.replace(f'"{source}"', f'"{name}"'))
    return into / name


PLUGIN = '''"""The copied folder on recurlen.models' search path (the registry finds it like recurlen's own), its rows
added to the model table (recurlen's own are written in recurlen/models/table.py): the CPU shapes of the folder
it was copied from, renamed."""
import dataclasses

import recurlen.models
from recurlen.models import table

recurlen.models.__path__.append({packages!r})
table.add([dataclasses.replace(row, name=row.name.replace({source!r} + "-", {name!r} + "-", 1), architecture={name!r})
           for row in table.rows({source!r}) if row.hub_id is None])
'''


REGISTRY_WIDE = ("put_architectures_side_by_side", "every_architecture_folder", "model_tables_rows",
                 "both_demo_experiments", "test_architecture_lists")
"""The shared tests that are not parametrized but go over every architecture in one case (the evaluation and
report of all side by side, the registry's folders, the table's prefixes, the demos, the guard against lists of
names): run with the copy's own cases."""


def shared_tests(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest over tests/ with the copied folder on the package's path, in its own process (the registry is read
    once per process), in the default tier."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "plugin"),
                                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "copied_folder", "-p", "no:cacheprovider",
                           "--basetemp", str(tmp_path / "basetemp"), *args, "tests"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=3000)


@pytest.mark.slow  # ~2 min on 2 busy cores: every shared test case of one architecture (54 for GLA's copy)
def test_a_folder_copied_under_a_new_name_runs_every_shared_test_without_an_edit(tmp_path):
    copy_folder(SOURCE, COPIED, tmp_path / "packages")
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "copied_folder.py").write_text(
        PLUGIN.format(packages=str(tmp_path / "packages"), source=SOURCE, name=COPIED))
    models_dir = Path(registry.__file__).parent
    try:
        listed = shared_tests(tmp_path, "--collect-only")
        assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-3000:]
        ids = [line for line in listed.stdout.splitlines() if "::" in line]
        copied = [i for i in ids if COPIED in i]
        # Every case of the copy is a case of its source, and every case of the source in a shared test (outside
        # tests/models/<source>/) is one of the copy's but those that ask for what the copy lacks: a demo
        # (experiments/demo-<arch>-*.yaml) and the official rows of the model table (checkpoints on the hub).
        source_ids = {i for i in ids if re.search(rf"[\[-]{SOURCE}[\]-]", i)
                      and not i.startswith(f"tests/models/{SOURCE}/")}
        as_source = {i.replace(COPIED, SOURCE) for i in copied}
        assert as_source <= source_ids, sorted(as_source - source_ids)
        official = [row.name for row in table.rows(SOURCE) if row.hub_id is not None]
        missing = sorted(source_ids - as_source)
        assert all("demo" in i or any(f"{name}]" in i for name in official) for i in missing), missing
        modules = {i.split("::")[0] for i in copied}
        assert {i.split("::")[0] for i in source_ids} - {"tests/commands/test_demo.py"} <= modules
        wide = [i for i in ids if any(word in i for word in REGISTRY_WIDE)]
        assert len(wide) >= len(REGISTRY_WIDE)
        ran = shared_tests(tmp_path, "-k", " or ".join((COPIED, *REGISTRY_WIDE)))
        assert ran.returncode == 0, ran.stdout[-5000:] + ran.stderr[-3000:]
        summary = ran.stdout.strip().splitlines()[-1]
        assert re.search(rf"\b{len(copied) + len(wide)} passed", summary) and "skipped" not in summary, summary
    finally:
        assert not (models_dir / COPIED).exists()  # the copy never entered recurlen/models/
