"""An export comes back whole: `recurlen eval DIR` takes T from it, its JSON files are strict JSON that read back
to the same config, transformers' `generate` never emits a padded vocabulary row, and the card's commands do not
hold the machine's --out path."""

import json

import pytest
import torch

from recurlen.commands import cli
from recurlen.models import registry
from recurlen.training.run_dir import load_model
from tests.commands.export_helpers import run, state_passing_run

pytestmark = pytest.mark.usefixtures("cli_logs")  # each test's log lines land in its own capture


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, experiment):
    """A tiny Mamba-2 post-training run (state passing, 2 steps, T = 16)."""
    return state_passing_run(tmp_path_factory, experiment)


def strict_json(path):
    def refuse(constant):
        raise ValueError(f"{path}: {constant} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("fmt", ["official", "transformers"])
def test_eval_of_an_export_takes_T_from_it(capsys, tmp_path, run_dir, cache_dir, fmt):
    out = tmp_path / "export"
    assert run(capsys, "export", run_dir, "--out", out, f"format={fmt}", "card=false")[0] == 0
    rc, _, err = run(capsys, "eval", out, "seq_len=64", "num_sequences=2", "tasks=[positionwise,reset]", "log_bins=0",
                     "batch_size=2", "chunk_len=32", "progress=false", f"data.cache_dir={cache_dir}",
                     "data.max_documents=60", "data.val_fraction=0.2", "data.tokenizer=bytes",
                     "--out", tmp_path / "eval")
    assert rc == 0, err  # it used to stop with "does not record its training context; set train_len="
    entry = json.loads((tmp_path / "eval" / "results.json").read_text())["runs"][0]
    assert entry["train_len"] == 16 and [b["name"] for b in entry["positionwise"]["bins"]][:2] == ["[0,T)", "[T,2T)"]
    assert json.loads((out / "recurlen_export.json").read_text())["train_seq_len"] == 16  # where it was read


@pytest.mark.parametrize("name", registry.architectures())
def test_every_json_file_is_strict_json_and_reads_back_to_the_same_config(tmp_path, nano_model, name):
    a = registry.get(name)
    if "nano" not in a.presets:
        pytest.skip(f"{name} has no nano model")
    model = nano_model(name)
    formats = ["official"] + (["transformers"] if a.transformers_format is not None else [])
    model.save_pretrained(str(tmp_path / "pretrained"))
    for fmt in formats:
        out = tmp_path / fmt
        assert cli.main(["export", str(tmp_path / "pretrained"), "--out", str(out), f"format={fmt}", "card=false"]) == 0
        for path in sorted(out.glob("*.json")):
            strict_json(path)  # Python's json writes an infinite dt_limit as Infinity, which JSON does not have
        back = load_model(str(out), backend="torch").model.config
        assert back == model.config, (fmt, back, model.config)
    if name == "mamba2":  # the infinity is written as transformers writes it, and read back as the float
        raw = strict_json(tmp_path / "official" / "recurlen_config.json")
        assert raw["dt_limit"] == [0.0, {"__float__": "Infinity"}] and back.dt_limit[1] == float("inf")


@pytest.mark.parametrize("name", [a for a in registry.architectures() if registry.get(a).transformers_format])
def test_transformers_generate_never_emits_a_padded_vocabulary_row(tmp_path, nano_model, name):
    transformers = pytest.importorskip("transformers")
    model = nano_model(name)
    vocab, rows = model.config.vocab_size, model.config.padded_vocab_size
    assert rows > vocab  # the nano models pad 257 to 264
    prompt = torch.tensor([[72, 101, 108, 108, 111, 32]])
    with torch.no_grad():
        h = model.forward_hidden(prompt)[0][0, -1]
        # The padded rows point at the prompt's last hidden state: ordinary logits would make them the argmax.
        model.lm_head.weight[vocab:] = 1000 * h / h.norm() ** 2
    model.save_pretrained(str(tmp_path / "pretrained"))
    assert cli.main(["export", str(tmp_path / "pretrained"), "--out", str(tmp_path / "hf"), "format=transformers",
                     "card=false"]) == 0
    architecture = json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"][0]
    hf = getattr(transformers, architecture).from_pretrained(tmp_path / "hf").eval()  # not Auto: fla re-registers it
    with torch.no_grad():
        assert hf(prompt).logits[0, -1].argmax() >= vocab  # the rigged rows win a plain forward pass
        greedy = hf.generate(prompt, max_new_tokens=8, do_sample=False)[0, prompt.shape[1]:]
        torch.manual_seed(0)
        sampled = hf.generate(prompt, max_new_tokens=8, do_sample=True, top_k=0)[0, prompt.shape[1]:]
    assert len(greedy) > 0 and greedy.max() < vocab, greedy
    assert len(sampled) > 0 and sampled.max() < vocab, sampled
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["suppress_tokens"] == list(range(vocab, rows))


def test_the_card_s_reproduce_block_holds_no_absolute_out_path(capsys, tmp_path, run_dir, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # --out is outside the working directory: DIR, as the card calls it elsewhere
    out = tmp_path / "exports" / "sp"
    assert run(capsys, "export", run_dir, "--out", out, "format=transformers")[0] == 0
    card = (out / "README.md").read_text()
    export_line = card.split("## Reproduce")[1].split("```bash\n")[1].split("```")[0].splitlines()[-1]
    assert export_line.startswith("recurlen export ") and export_line.endswith("--out DIR format=transformers")
    assert str(out) not in card
    monkeypatch.chdir(tmp_path)  # inside it: the path as typed from here
    assert run(capsys, "export", run_dir, "--out", out, "format=transformers")[0] == 0
    card = (out / "README.md").read_text()
    assert "--out exports/sp format=transformers" in card and str(out) not in card
