"""The recurrent-model interface, checked the same way for every registered architecture."""

import re
from pathlib import Path

import pytest
import torch

from recurlen import models
from recurlen.models import registry

NAMES = sorted(registry.architectures())


def fields_with_a_window(name: str) -> dict:
    """Nano fields for an architecture whose nano state has no window part but a variant of it has one (GLA with
    short convolutions): the tests below then carry a window too. {} where the nano state has one already."""
    a = registry.get(name)

    def has_window(fields) -> bool:
        state = a.build(a.preset("nano", **fields)).zero_state(1)
        return bool(state.WINDOW) and all(getattr(state, part).numel() for part in state.WINDOW)

    return {} if has_window({}) else next((dict(v) for v in a.variants if has_window(v)), {})


def test_registry_lists_every_architecture_folder_and_rejects_others():
    folders = sorted(p.parent.name for root in models.__path__ for p in Path(root).glob("*/architecture.py"))
    assert folders == NAMES and len(NAMES) >= 2
    assert list(registry.architectures())[:len(registry.ORDER)] == list(registry.ORDER)
    with pytest.raises(ValueError, match=rf"^unknown architecture 'rwkv'; allowed: {re.escape(str(NAMES))}$"):
        registry.get("rwkv")
    with pytest.raises(ValueError, match="unknown Mamba-1 preset 'huge'"):
        registry.get("mamba1").preset("huge")


def test_detect_refuses_unknown_configs(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="is not a config of a known architecture"):
        registry.detect(tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_every_named_model_composes_to_its_preset(name):
    from recurlen.training.experiments.compose import load_experiment

    a = registry.get(name)
    assert a.model_names()
    for model_name in a.model_names():
        cfg, _ = load_experiment([f"model={model_name}"])
        assert cfg.model.name == model_name and cfg.model.architecture == name
        assert cfg.model.config == a.preset(model_name) == a.preset(model_name.removeprefix(a.prefix))


def test_presets_are_the_model_tables_rows():
    assert registry.get("mamba1").preset("790m") == registry.get("mamba1").preset("mamba1-790m", n_layer=48)
    assert registry.get("mamba1").preset("790m").d_model == 1536 and registry.get("gla").preset("340m").num_heads == 4
    # Mamba-2's names are bare, every other architecture's start with its name.
    assert {n: a.prefix for n, a in registry.architectures().items()} == {
        n: "" if n == registry.DEFAULT else f"{n}-" for n in NAMES}
    with pytest.raises(ValueError, match=r"unknown GLA preset 'mamba1-tiny'; allowed: \['gla-1.3b', 'gla-340m', "):
        registry.get("gla").preset("mamba1-tiny")


@pytest.mark.parametrize(("directory", "official"), [
    ("state-spaces/mamba2-780m", "780m"),  # a hub id
    ("/ckpt/Mamba2-780M", "780m"),  # a directory named like the hub repository
    ("/hub/models--fla-hub--gla-340M-15B/snapshots/" + "a" * 40, "gla-340m"),  # the hub cache's snapshot
    ("/ckpt/mamba-790m/", "mamba1-790m"),
    ("/ckpt/mamba2-780m-long", None),  # a checkpoint of one's own, whatever its name contains
    ("/runs/mamba2-tiny", None),
    ("/hub/models--someone--mamba2-780m-ft/snapshots/" + "a" * 40, None),
])
def test_the_model_table_says_which_official_checkpoint_a_directory_is(directory, official):
    from recurlen.models import table

    row = table.official(directory)
    assert (row.name if row else None) == official


def test_an_official_checkpoint_directory_loads_with_its_training_context(tmp_path, nano_model):
    from recurlen.training.run_dir import load_model

    model = nano_model("mamba2")
    for name in ("mamba2-130m", "mamba-130m", "mine"):
        model.save_pretrained(str(tmp_path / name))
    # By name only: a Mamba-2 model in a directory named after a Mamba-1 checkpoint is not that checkpoint.
    assert [load_model(str(tmp_path / name), backend="torch").train_seq_len
            for name in ("mamba2-130m", "mamba-130m", "mine")] == [2048, None, None]


def test_model_section_validates_the_architecture_and_its_fields():
    from recurlen.training.experiments.compose import load_experiment

    with pytest.raises(ValueError, match=r"unknown keys \['headdim'\]"):
        load_experiment(["model=mamba1-tiny", "model.arch.headdim=8"])
    with pytest.raises(ValueError, match="unknown architecture 'rwkv'"):
        load_experiment(["model.architecture=rwkv"])
    with pytest.raises(ValueError, match="model.name='tiny' is unknown for architecture=gla"):
        load_experiment(["model.architecture=gla"])


def test_eval_and_report_put_architectures_side_by_side(tmp_path, nano_model):
    from recurlen.commands.report import write_report
    from recurlen.evaluation.runner import EvalConfig, run_eval

    paths = []
    for name in NAMES:
        model = nano_model(name, **fields_with_a_window(name))
        model.save_pretrained(str(tmp_path / name))
        paths.append(f"{name}={tmp_path / name}")
    seqs = torch.randint(0, 257, (3, 200), generator=torch.Generator().manual_seed(4))
    cfg = EvalConfig(checkpoints=paths, output_dir=str(tmp_path / "eval"), train_len=32, seq_len=128,
                     num_sequences=2, chunk_len=50, batch_size=2, state_points=4, log_bins=4, effrem_points=3,
                     effrem_sequences=2, device="cpu", progress=False)
    results = run_eval(cfg, seqs)
    assert [r["architecture"] for r in results["runs"]] == NAMES
    for run in results["runs"]:
        assert run["positionwise"]["bins"] and run["state"]["ssm_norm"] and run["effrem"]["effrem"]
    report = write_report([str(tmp_path / "eval" / "results.json")], out_dir=tmp_path / "report").read_text()
    assert "## Models" in report
    for name in NAMES:
        assert f"| {name} | {registry.get(name).title} (" in report


@pytest.mark.parametrize("name", NAMES)
def test_tasks_run_on_every_architecture(name, nano_model):
    from recurlen.evaluation.tasks.config import CopyingConfig
    from recurlen.evaluation.tasks.copying import CopyingFormat, evaluate_single
    from recurlen.evaluation.tasks.passkey import evaluate_passkey
    from recurlen.util.tokenizers import ByteTokenizer

    model, tok = nano_model(name, **fields_with_a_window(name)), ByteTokenizer()
    passkey = evaluate_passkey(model, tok, lengths=[260], depths=[0.5], trials=2, seed=0, batch_size=2, chunk_len=64,
                               progress=False)
    assert passkey["lengths"] == [260] and 0.0 <= passkey["mean_accuracy"] <= 1.0
    fmt = CopyingFormat(tok, CopyingConfig(length=6, min_length=3, alphabet_size=4))
    copying = evaluate_single(model, fmt, lengths=[6], trials=2, seed=0, batch_size=2, chunk_len=16)
    assert set(copying["exact_match"]) == {"6"} and 0.0 <= copying["exact_match"]["6"] <= 1.0
