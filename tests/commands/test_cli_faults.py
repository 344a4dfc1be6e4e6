"""Operator faults that used to end in a traceback: each is one line naming the problem and the fix (exit 2, no
traceback), said before anything is written in the run directory (or the eval's output directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recurlen.commands import cli
from recurlen.models import registry
from recurlen.util import atomic_files

pytestmark = pytest.mark.usefixtures("cli_logs")

REPO = Path(__file__).resolve().parents[2]


def finetune(run_dir, cache_dir, *extra) -> list[str]:
    return ["finetune", "model=nano", "intervention=state_passing", "data.seq_len=16", "data.batch_size=4",
            "data.val_segments=0", "data.val_sequences=0", "data.max_documents=60", f"data.cache_dir={cache_dir}",
            "diagnostics.positionwise=false", "diagnostics.state_norm=false", "trainer.accelerator=cpu",
            "trainer.num_threads=1", "trainer.progress_bar=false", "trainer.max_steps=2", f"run_dir={run_dir}",
            *extra]


def one_line_error(capsys, argv, *needles) -> str:
    rc = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert errors[0].startswith(f"recurlen {argv[0]}: error: ")
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> Path:
    """The nano Mamba-2 model as an official-format directory."""
    a = registry.get("mamba2")
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("official") / "nano"
    a.build(a.preset("nano"), backend="torch").save_pretrained(str(out))
    return out


def test_a_run_dir_that_is_a_file_or_lies_under_one(tmp_path, cache_dir, capsys):
    afile = tmp_path / "config.yaml"
    afile.write_text("seed: 0\n")
    one_line_error(capsys, finetune(afile, cache_dir), f"run_dir={afile} is a file, not a directory; choose another")
    one_line_error(capsys, finetune(afile / "run", cache_dir), f"run_dir={afile / 'run'} lies under {afile}, which "
                   "is a file")
    assert afile.read_text() == "seed: 0\n" and sorted(os.listdir(tmp_path)) == ["config.yaml"]


@pytest.mark.parametrize(("name", "content", "needles"), [
    ("empty.txt", "", ("is empty: its 1 file(s) hold no bytes",)),
    ("notext.jsonl", '{"body": "hello"}\n', ("text_field='text' is not a field of source=", "its fields: ['body']")),
    ("bad.jsonl", '{"text": "hello"\n{oops\n', ("datasets could not read these json files: ", "fix or remove")),
], ids=["empty-txt", "jsonl-without-text", "malformed-jsonl"])
def test_unreadable_data_is_said_before_the_run_directory_is_written(tmp_path, cache_dir, capsys, name, content,
                                                                     needles):
    source = tmp_path / name
    source.write_text(content)
    run = tmp_path / "run"
    one_line_error(capsys, finetune(run, cache_dir, f"data.source={source}"), f"source='{source}'", *needles)
    assert not run.exists()


def _zstd_garbage(path: Path) -> None:
    path.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(256)) * 2)  # zstd's magic number, then no valid frame


@pytest.mark.parametrize("tokenize", ["all", "needed"])
@pytest.mark.parametrize(("name", "write", "needles"), [
    ("empty.jsonl", lambda p: p.write_text('{"text": ""}\n' * 40), ("is empty: none of its ", "rows has any text")),
    ("text.jsonl.zst", lambda p: p.write_text('{"text": "hello"}\n' * 40),
     ("text.jsonl.zst does not decompress as zstd (zstd decompress error: ", "its name ends in .zst but it is not "
      "zstd-compressed; fix, recompress or remove it")),
    ("damaged.jsonl.zst", _zstd_garbage, ("damaged.jsonl.zst does not decompress as zstd (zstd decompress error: ",
                                          "the file is damaged")),
], ids=["empty-documents", "text-named-zst", "damaged-zst"])
def test_empty_or_undecompressable_data_is_one_line_in_both_tokenize_modes(tmp_path, cache_dir, capsys, tokenize,
                                                                           name, write, needles):
    """tokenize=needed divided by the sample's zero tokens per document; a .zst that does not decompress raised
    zstandard's error, naming no file, in both modes."""
    source = tmp_path / name
    write(source)
    run = tmp_path / "run"
    one_line_error(capsys, finetune(run, cache_dir, f"data.source={source}", f"data.tokenize={tokenize}"),
                   f"source='{source}'", *needles)
    assert not run.exists()


def test_a_checkpoint_larger_than_the_file_size_limit_is_said_first(tmp_path, cache_dir, capsys, monkeypatch):
    monkeypatch.setattr(atomic_files, "file_size_limit", lambda: 500 * 1024)
    run = tmp_path / "run"
    one_line_error(capsys, finetune(run, cache_dir), "a checkpoint of nano takes about 0.", "MB, more than the "
                   "file-size limit (ulimit -f 500, i.e. 0.512 MB); raise it (ulimit -f unlimited) and rerun")
    assert not run.exists()


def test_a_write_over_the_file_size_limit_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic_files, "file_size_limit", lambda: 1024)

    def short_write(path):
        raise RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 1024 vs 918")

    with pytest.raises(atomic_files.UserError, match=r"cannot write .*last.ckpt: it would exceed the file-size limit "
                                                     r"\(ulimit -f 1, .*\); raise it \(ulimit -f unlimited\)"):
        atomic_files.atomic_write(tmp_path / "last.ckpt", short_write)
    assert os.listdir(tmp_path) == []


def test_a_name_that_leads_outside_runs_is_refused(tmp_path, cache_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    words = [w for w in finetune("x", cache_dir) if not w.startswith("run_dir=")]
    one_line_error(capsys, [*words, "name=../../escape"], "name='../../escape' would put the run in ../escape, "
                   "outside runs/", "use run_dir=PATH")
    assert os.listdir(tmp_path) == [] and not (tmp_path.parent / "escape").exists()
    assert cli.main([*words, "name=a/b", "--dry-run"]) == 0  # a folder inside runs/ is fine
    assert "runs/a/b/nano-state_passing" in capsys.readouterr().out


def test_resume_with_a_yes_no_word_and_another_runs_checkpoint_say_what_they_mean(tmp_path, cache_dir, capsys):
    one_line_error(capsys, finetune(tmp_path / "x", cache_dir, "resume=yes"), "resume=yes (a yes/no word) does not "
                   "say how to resume; use one of ['auto', 'never', 'archive']")
    assert cli.main(finetune(tmp_path / "a", cache_dir)) == 0
    capsys.readouterr()
    ckpt = tmp_path / "a" / "checkpoints" / "last.ckpt"
    line = one_line_error(capsys, finetune(tmp_path / "xc", cache_dir, f"resume={ckpt}", "seed=1"),
                          f"resume={ckpt}: that checkpoint was trained with other fixed settings than those asked "
                          "for: seed 0 -> 1", f"leave out resume= to start a new run in {tmp_path / 'xc'}")
    assert "holds a run" not in line and not (tmp_path / "xc").exists()


@pytest.fixture
def no_hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache, offline."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf"


@pytest.mark.parametrize(("argv", "hub_id"), [
    (["eval", "state-spaces/mamba2-780m"], "state-spaces/mamba2-780m"),
    (["generate", "--checkpoint", "state-spaces/mamba2-130m"], "state-spaces/mamba2-130m"),
], ids=["eval", "generate"])
def test_a_hub_id_missing_from_the_cache_says_how_to_fetch_it(tmp_path, capsys, no_hub, argv, hub_id):
    out = tmp_path / "out"
    argv = [*argv, f"run_dir={out}"] if argv[0] == "finetune" else [*argv, "--out", str(out)] \
        if argv[0] == "eval" else argv
    one_line_error(capsys, argv, f"'{hub_id}' is not in the local Hugging Face cache ({no_hub / 'hub'}) and "
                   "HF_HUB_OFFLINE=1 is set", f"`HF_HOME={no_hub} hf download {hub_id}`", "(HF_HOME)")
    assert not out.exists()


HUB_780M = ("checkpoint state-spaces/mamba2-780m", "hf download state-spaces/mamba2-780m",
            "tokenizer EleutherAI/gpt-neox-20b", "hf download EleutherAI/gpt-neox-20b --include '*.json'",
            "data hf:monology/pile-uncopyrighted",
            "hf download monology/pile-uncopyrighted FILE... --repo-type dataset")


def test_the_780m_run_offline_names_every_missing_input_at_once(tmp_path, capsys, no_hub):
    """Checkpoint, tokenizer and data in one line, each with its command (the run named the tokenizer alone)."""
    out = tmp_path / "out"
    line = one_line_error(capsys, ["finetune", "model=780m", "trainer.accelerator=cpu", f"run_dir={out}"],
                          f"3 input(s) are not in the local Hugging Face cache ({no_hub / 'hub'}) and HF_HUB_OFFLINE=1 "
                          f"is set", f"`export HF_HOME={no_hub}; ", *HUB_780M)
    assert "would be downloaded" not in line and not out.exists()


def test_the_780m_dry_run_offline_lists_what_is_missing_and_what_would_be_refused(tmp_path, capsys, no_hub,
                                                                                    monkeypatch):
    from recurlen.training import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**30)  # 1 GiB here: 780m does NOT fit
    assert cli.main(["finetune", "model=780m", "trainer.accelerator=cpu", f"run_dir={tmp_path / 'out'}",
                     "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would be downloaded" not in out and "everything resolved" not in out, out
    for needle in HUB_780M:
        assert needle in out, needle
    commands = [line.split("#")[0].strip() for line in out.splitlines() if line.strip().startswith("hf download")]
    assert len(commands) == 3, out
    end = out[out.index("dry run: "):].splitlines()
    assert end[0] == "dry run: nothing was loaded, trained or written; on this machine the run would be refused:"
    assert end[1].startswith("  - 3 input(s) are not in the local Hugging Face cache") and \
        end[2].startswith("  - memory: ") and end[2].endswith("does not fit in the 1.00 GiB available here"), end
    assert not (tmp_path / "out").exists()


def test_online_a_missing_hub_input_would_be_downloaded_and_is_no_refusal(tmp_path, capsys, no_hub, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert cli.main(["finetune", "model=780m", "trainer.accelerator=cpu", "data=embedded",
                     f"run_dir={tmp_path / 'out'}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "state-spaces/mamba2-780m (hub id, not in the local cache: would be downloaded)" in out
    assert "hf download state-spaces/mamba2-780m" in out and "3 input(s)" not in out
    assert "HF_HUB_OFFLINE" not in out.split("dry run: ")[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU machine's strategies")
@pytest.mark.parametrize(("strategy", "why"), [
    ("fsdp", "needs a CUDA GPU (Lightning runs it on CUDA only)"),
    ("deepspeed", "needs a CUDA GPU (Lightning runs it on CUDA only)"),
    ("ddp_spawn", "is not supported: it pickles the Trainer into spawned processes"),
])
def test_a_strategy_this_machine_cannot_run_is_one_line_before_anything_is_written(tmp_path, cache_dir, capsys,
                                                                                  strategy, why):
    run = tmp_path / "run"
    argv = [*finetune(run, cache_dir), f"trainer.strategy={strategy}"]
    line = one_line_error(capsys, argv, f"trainer.strategy={strategy} {why}",
                          "trainer.accelerator=cpu on this machine trains on the CPU, where these run: auto, "
                          "single_device, ddp")
    assert not run.exists()
    assert cli.main([*argv, "--dry-run"]) == 0  # the dry run says the same, and not "everything resolved"
    out = capsys.readouterr().out
    assert "everything resolved" not in out and f"  - {line.split('error: ', 1)[1]}" in out.splitlines(), out
    assert not run.exists()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "+inf", "Infinity"])
def test_a_non_finite_learning_rate_is_refused_with_one_line_before_the_run_directory(tmp_path, cache_dir, capsys,
                                                                                      value):
    run = tmp_path / "run"
    line = one_line_error(capsys, [*finetune(run, cache_dir), f"optim.lr={value}"], "optim.lr must be a finite number; "
                          "got ")
    assert line.split("; got ")[1] in ("inf", "-inf", "nan")  # omegaconf reads each as a float
    assert not run.exists()
    one_line_error(capsys, [*finetune(run, cache_dir), "optim.grad_clip=inf"], "optim.grad_clip must be a finite "
                   "number; got inf")
    assert not run.exists()


def test_a_failed_download_is_one_line_too(no_hub, monkeypatch):
    import huggingface_hub

    from recurlen.util.hub import resolve_pretrained_dir

    def unreachable(repo_id, **kwargs):
        raise OSError("Name or service not known\nsecond line")

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(atomic_files.UserError, match=r"and downloading it failed \(OSError: Name or service not "
                                                     r"known\); on a machine with network run `HF_HOME="):
        resolve_pretrained_dir("state-spaces/mamba2-130m")


def test_eval_of_an_official_directory_uses_its_own_length_and_count(tmp_path, cache_dir, capsys, official):
    """The held-out data serves the eval's seq_len / num_sequences (not a training run's 16 x 1024), and EffRem's
    default context (4T) is fitted to the sequences when they are shorter."""
    from recurlen.evaluation.heldout import build_data_config, heldout_sequences

    out = tmp_path / "eval"
    data = ["data.max_documents=60", "data.val_fraction=0.1", f"data.cache_dir={cache_dir}"]
    with pytest.raises(atomic_files.UserError, match="cannot give 16 sequence"):  # what the data group validates
        heldout_sequences(build_data_config(str(official), None, data), length=1024, num=16)
    assert cli.main(["eval", f"x={official}", "seq_len=64", "num_sequences=2", "train_len=32", "tasks=[effrem]",
                     "effrem_points=3", "progress=false", *data, "--out", str(out)]) == 0
    capsys.readouterr()
    assert json.loads((out / "results.json").read_text())["runs"][0]["effrem"]["T"] == 64
    one_line_error(capsys, ["eval", f"x={official}", "seq_len=64", "num_sequences=2", "train_len=32", "effrem_len=200",
                            "tasks=[effrem]", *data, "--out", str(tmp_path / "e2")],
                   "EffRem with a context of 200 tokens needs held-out sequences that long; they hold 64 (seq_len): "
                   "raise seq_len to 200 or more, set effrem_len between train_len=32 and 64")
    one_line_error(capsys, ["eval", f"x={official}", "seq_len=100000", "num_sequences=2", "train_len=32", *data,
                            "--out", str(tmp_path / "e3")],
                   "the held-out data cannot give 2 sequence(s) of seq_len=100000 tokens: ", "lower seq_len or "
                   "num_sequences")
    assert not (tmp_path / "e2").exists() and not (tmp_path / "e3").exists()


def test_eval_of_a_damaged_official_directory(tmp_path, capsys, official):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "config.json").write_text("{not json")
    one_line_error(capsys, ["eval", f"x={junk}", "train_len=32", "--out", str(tmp_path / "e1")],
                   f"{junk / 'config.json'} is not valid JSON (", "write or download it again")
    head = tmp_path / "head"
    head.mkdir()
    for f in official.iterdir():
        (head / f.name).write_bytes(f.read_bytes())
    state = torch.load(head / "pytorch_model.bin", weights_only=True)
    state["lm_head.weight"] = torch.cat([state["lm_head.weight"], state["lm_head.weight"][:1]])
    torch.save(state, head / "pytorch_model.bin")
    rows, width = state["backbone.embedding.weight"].shape
    one_line_error(capsys, ["eval", f"x={head}", "train_len=32", "--out", str(tmp_path / "e2")],
                   f"tie_embeddings is true but lm_head.weight has shape ({rows + 1}, {width}) and "
                   f"backbone.embedding.weight ({rows}, {width})")


def test_a_checkpoint_outside_a_run_directory_that_does_not_load_is_one_line(tmp_path, capsys):
    """eval reads the held-out data's settings from a lone .ckpt's hyperparameters: a planted pickle or a truncated
    file is refused there in one line, as inside a run directory."""
    import pickle

    class Planted:
        def __reduce__(self):
            return (os.system, ("echo planted",))

    planted = tmp_path / "planted.ckpt"
    planted.write_bytes(pickle.dumps({"hyper_parameters": Planted()}))
    one_line_error(capsys, ["eval", f"x={planted}", "train_len=32", "--out", str(tmp_path / "e1")], str(planted))
    truncated = tmp_path / "truncated.ckpt"
    torch.save({"hyper_parameters": {"a": 1}, "w": torch.zeros(1000)}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:300])
    one_line_error(capsys, ["eval", f"x={truncated}", "train_len=32", "--out", str(tmp_path / "e2")], str(truncated))
    assert not (tmp_path / "e1").exists() and not (tmp_path / "e2").exists()


def test_an_official_directory_whose_two_configs_disagree_is_one_line(tmp_path, capsys, official):
    """config.json replaced by another architecture's while recurlen_config.json still holds this one's."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in official.iterdir():
        (mixed / f.name).write_bytes(f.read_bytes())
    other = registry.get("mamba1")
    (mixed / "config.json").write_text(json.dumps(other.preset("nano").to_official_json()))
    one_line_error(capsys, ["eval", f"x={mixed}", "train_len=32", "--out", str(tmp_path / "e1")],
                   "recurlen_config.json does not describe the", "the two files come from different models")


def test_the_command_prints_no_traceback_for_unreadable_data(tmp_path, cache_dir):
    """The real command line: datasets' own error log is silenced, its reason is in the one line."""
    source = tmp_path / "bad.jsonl"
    source.write_text('{"text": "hello"\n{oops\n')
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "recurlen", *finetune(run, cache_dir, f"data.source={source}")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "Generating train split" not in line]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith(f"recurlen finetune: error: source='{source}': datasets could not read")
    assert not run.exists()
