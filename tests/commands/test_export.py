"""`recurlen export`: a run leaves recurlen in the official format or transformers', with a model card, and a
transformers-format directory comes back as the starting point of a post-training."""

import json
import shlex

import pytest
import torch
from omegaconf import OmegaConf

from recurlen.commands.model_card import finetune_words
from recurlen.models import registry
from recurlen.training.experiments.compose import compose
from recurlen.training.finetune import run_finetune
from recurlen.training.run_dir import load_model, run_config
from tests.commands.export_helpers import run, state_passing_run

IDS = torch.randint(0, 257, (2, 80), generator=torch.Generator().manual_seed(0))


pytestmark = pytest.mark.usefixtures("cli_logs")  # each test's log lines land in its own capture


@pytest.fixture(scope="module")
def runs(tmp_path_factory, experiment):
    """`runs(arch)`: a tiny post-training run of the architecture (state passing, 2 steps), made once."""
    made = {}

    def get(arch: str):
        if arch not in made:
            made[arch] = state_passing_run(tmp_path_factory, experiment, arch=arch)
        return made[arch]

    return get


def logits(path) -> torch.Tensor:
    model = load_model(str(path), backend="torch").model.eval()
    with torch.no_grad():
        return model(IDS)[0][..., :257]


ARCHS = tuple(registry.architectures())
TRANSFORMERS_ARCHS = [name for name, a in registry.architectures().items() if a.transformers_format is not None]
"""The architectures transformers has a class for (their registry entry's transformers_format)."""


@pytest.mark.parametrize("arch", ARCHS)
def test_official_export_loads_back_identically(capsys, tmp_path, runs, arch):
    rc, _, err = run(capsys, "export", runs(arch), "--out", tmp_path / "out", "card=false")
    assert rc == 0, err
    own = registry.get(arch).model_cls.official.weights  # mamba-ssm reads pytorch_model.bin only; fla safetensors
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(["config.json", "recurlen_config.json",
                                                                          "recurlen_export.json", own])
    assert torch.equal(logits(tmp_path / "out"), logits(runs(arch)))
    if own != "model.safetensors":  # safetensors on request; a re-export in place leaves one weights file
        assert run(capsys, "export", runs(arch), "--out", tmp_path / "out", "card=false", "weights=safetensors")[0] == 0
        assert not (tmp_path / "out" / own).exists() and (tmp_path / "out" / "model.safetensors").is_file()
        assert torch.equal(logits(tmp_path / "out"), logits(runs(arch)))


@pytest.mark.parametrize("arch", TRANSFORMERS_ARCHS)
def test_transformers_export_gives_recurlen_s_logits_in_transformers(capsys, tmp_path, runs, close_scaled, arch):
    transformers = pytest.importorskip("transformers")
    rc, _, err = run(capsys, "export", runs(arch), "--format", "transformers", "--out", tmp_path, "card=false")
    assert rc == 0, err
    config = json.loads((tmp_path / "config.json").read_text())
    fmt = registry.get(arch).transformers_format
    assert config["architectures"] == [fmt.class_name] and config["eos_token_id"] == 256  # the byte tokenizer's EOS
    # The class config.json names, from transformers itself: importing fla re-registers the Auto classes' mamba /
    # mamba2 model types with fla's own classes for the rest of the process (docs/export.md).
    hf = getattr(transformers, config["architectures"][0]).from_pretrained(tmp_path).eval()
    assert type(hf).__module__.startswith("transformers.")
    with torch.no_grad():
        theirs = hf(IDS).logits[..., :257]
    close_scaled(theirs, logits(runs(arch)), 1e-4, f"{arch}: transformers vs recurlen")
    assert torch.equal(logits(tmp_path), logits(runs(arch)))  # and recurlen reads the export back exactly


def test_a_pretrained_directory_exports_with_its_tokenizer_files_and_token_ids(capsys, tmp_path, nano_model):
    from tokenizers import Tokenizer, models, pre_tokenizers

    source = tmp_path / "mamba1-pretrained"
    nano_model("mamba1").save_pretrained(str(source))
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2, "<|endoftext|>": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(source / "tokenizer.json"))
    rc, _, err = run(capsys, "export", source, "--out", tmp_path / "out", "format=transformers", "dtype=bfloat16")
    assert rc == 0, err
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["eos_token_id"], config["dtype"]) == (3, "bfloat16")
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(tmp_path / "out" / "model.safetensors")).values()} == {torch.bfloat16}
    card = (tmp_path / "out" / "README.md").read_text()
    assert "tokenizer.json copied here" in card and "## Training" not in card  # not a run: no training to tell
    assert "No evaluation of this checkpoint was found: none is claimed" in card


def test_finetune_starts_exactly_from_transformers_weights_and_resumes_nothing(tmp_path, experiment):
    """A directory written by transformers itself (its config.json, model.safetensors) is model.pretrained."""
    transformers = pytest.importorskip("transformers")
    import lightning as L

    torch.manual_seed(0)
    hf = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        hidden_size=64, num_heads=8, head_dim=16, state_size=16, n_groups=1, num_hidden_layers=2, vocab_size=264,
        chunk_size=16))
    hf.save_pretrained(tmp_path / "hf")
    published = {k.replace("backbone.embeddings.", "backbone.embedding."): v for k, v in hf.state_dict().items()}

    class AtStart(L.Callback):
        def on_train_start(self, trainer, pl_module):
            self.weights = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    seen = AtStart()
    run_dir = run_finetune(experiment(tmp_path / "run", f"model.pretrained={tmp_path / 'hf'}", "trainer.max_steps=1"),
                           callbacks=[seen])
    assert seen.weights.keys() == published.keys()
    assert all(torch.equal(seen.weights[k], published[k]) for k in published)
    history = OmegaConf.load(run_dir / "config_history.yaml")
    assert [e.event for e in history] == ["start"]  # a new run: no Lightning checkpoint resumed
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 1


def test_model_card_holds_the_evaluation_and_the_commands_that_reproduce_it(capsys, tmp_path, runs, monkeypatch):
    run_dir = runs("mamba2")
    monkeypatch.chdir(run_dir.parent)  # the card shows paths as typed from here
    rc, _, err = run(capsys, "eval", f"sp={run_dir}", "seq_len=64", "num_sequences=2", "tasks=[positionwise,reset]",
                     "log_bins=0", "batch_size=2", "chunk_len=32", "progress=false", "--out", tmp_path / "eval")
    assert rc == 0, err
    rc, _, err = run(capsys, "export", run_dir, "--out", tmp_path / "out", "--eval", tmp_path / "eval",
                     "format=transformers")
    assert rc == 0, err
    card = (tmp_path / "out" / "README.md").read_text()
    front = card.split("---\n")[1]
    assert "library_name: transformers" in front and "- state_passing" in front and "- mamba2" in front
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    for b in results["runs"][0]["positionwise"]["bins"]:  # the position-wise table, bin by bin, as evaluated
        assert f"| {b['name']} | {b['loss']:.3f} | {b['ppl']:.2f} | {b['full_minus_reset']:+.3f} |" in card
    assert "2 optimizer steps of 64 tokens (4 lanes x 16 tokens x 1 accumulated x 1 rank): 128 tokens" in card
    assert "| reset_prob | 0.1 |" in card and "![full_minus_reset](full_minus_reset.png)" in card
    assert (tmp_path / "out" / "full_minus_reset.png").stat().st_size > 0
    commands = card.split("```bash\n")[-2].split("```")[0].splitlines()
    finetune = shlex.split(commands[0])[2:]
    recomposed = OmegaConf.to_container(compose(finetune), resolve=True)
    assert recomposed == {**run_config(run_dir), "run_dir": "state_passing"}  # the run exactly, as seen from here
    assert commands[1].startswith("recurlen eval sp=state_passing seq_len=64")
    assert "huggingface-cli upload" in card

    # Without an evaluation the card claims nothing; an evaluation of other runs is refused by name.
    assert run(capsys, "export", run_dir, "--out", tmp_path / "bare", "format=official")[0] == 0
    assert "No evaluation of this checkpoint was found" in (tmp_path / "bare" / "README.md").read_text()
    rc, _, err = run(capsys, "export", runs("mamba1"), "--out", tmp_path / "x", "--eval", tmp_path / "eval")
    assert rc == 2 and err.count("\n") == 1 and "holds no evaluation of" in err
    assert not (tmp_path / "x").exists()  # refused before anything was written


def test_bad_input_is_one_line(capsys, tmp_path, runs):
    without = next(a for a in registry.architectures().values() if a.transformers_format is None)  # GLA
    empty = tmp_path / "empty_run"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "config.yaml").write_text("name: x\n")
    cases = [
        ((empty, "--out", tmp_path / "o"), "is a run directory without a checkpoint"),
        ((runs("mamba2"), "--out", tmp_path / "o", "format=onnx"), "format='onnx' is unknown; allowed: "
                                                                   "['official', 'transformers']"),
        ((runs(without.name), "--out", tmp_path / "o", "format=transformers"),
         f"transformers has no {without.title} class"),
        ((runs("mamba2"), "--out", tmp_path / "o", "weights=pt"), "weights='pt' is unknown"),
        ((runs("mamba2"),), "--out DIR is required"),
    ]
    for argv, message in cases:
        rc, out, err = run(capsys, "export", *argv)
        assert rc == 2 and out == "" and err.count("\n") == 1 and message in err, (argv, err)
    assert not (tmp_path / "o").exists()  # nothing written before the error


def test_finetune_words_recompose_a_run_that_differs_from_its_experiment(tmp_path, experiment):
    cfg = OmegaConf.to_container(OmegaConf.structured(experiment(
        tmp_path / "r", "model.arch.A_init_range=[0.5,2.0]", "optim.eps=1e-7", "data.tokenizer=bytes")), resolve=True)
    words = [shlex.split(w)[0] for w in finetune_words(cfg, paths={})]
    assert OmegaConf.to_container(compose(words), resolve=True) == cfg
