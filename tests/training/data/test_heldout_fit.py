"""A corpus of your own (a folder of .txt files): the dry run checks its held-out documents as the run does, refuses
the data group's defaults when they do not fit (it said "everything resolved", then the run stopped) and names
what would fit; the small-corpus settings of docs/data.md pass both."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from recurlen.commands.cli import main
from recurlen.training.data.config import DataConfig
from recurlen.training.data.corpus import load_corpus
from recurlen.training.data.heldout_fit import heldout_plan
from recurlen.training.data.stream import HeldOut
from recurlen.util.tokenizers import load_tokenizer

WORDS = ["the", "state", "of", "a", "recurrent", "model", "carries", "what", "it", "has", "read", "so", "far",
         "into", "the", "next", "token"]


@pytest.fixture
def txt_folder(tmp_path):
    """40 documents of 300 to 3000 bytes, one .txt file each."""
    folder = tmp_path / "my-corpus"
    folder.mkdir()
    rng = random.Random(0)
    for i in range(40):
        text = " ".join(rng.choice(WORDS) for _ in range(60 + 12 * i))
        (folder / f"doc{i:02d}.txt").write_text(text)
    return folder


def test_the_dry_run_refuses_held_out_defaults_that_do_not_fit(txt_folder, tmp_path, cache_dir, capsys, cli_logs):
    args = ["finetune", f"data.source={txt_folder}", f"data.cache_dir={cache_dir}", f"run_dir={tmp_path / 'run'}"]
    assert main([*args, "--dry-run"]) == 2
    # One error line (before it, the log line of the token cache the dry run built: the run reads it).
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "built corpus cache" not in line]
    assert len(err) == 1
    assert re.match(r"recurlen finetune: error: data: val_mode='first' needs 16 held-out documents of at least "
                    r"val_length=1024 tokens but found \d+ among \d+ held-out documents", err[0]), err[0]
    assert re.search(r"\(\d+ of 40 documents held out \(val_fraction 0.05\), \d+ tokens; at val_length=1024 they "
                     r"give val_mode=first \d+, windows \d+, pack \d+ sequences\)$", err[0]), err[0]
    # The run refuses with the same line, before it writes anything.
    assert main(args) == 2
    again = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("recurlen finetune:")]
    assert again == err
    assert not (tmp_path / "run" / "config.yaml").exists()
    # The small-corpus settings of docs/data.md: the plan says what the validation takes, and the run trains.
    small = ["data.val_fraction=0.25", "data.val_mode=windows", "data.val_sequences=4", "data.val_length=512"]
    assert main([*args, *small, "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert re.search(r"held-out     \d+ of 40 documents held out \(val_fraction 0.25\), \d+ tokens: 4 sequences of "
                     r"512 tokens \(windows\) fit", plan), plan
    tiny = ["trainer.max_steps=1", "trainer.val_every_n_steps=0", "trainer.checkpoint_every_n_steps=0",
            "trainer.progress_bar=false", "trainer.limit_val_batches=1", "trainer.num_threads=1",
            "diagnostics.positionwise=false", "diagnostics.state_norm=false", "data.batch_size=4"]
    assert main([*args, *small, *tiny]) == 0
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_what_would_fit_is_what_each_mode_can_cut(txt_folder, cache_dir):
    cfg = DataConfig(source=str(txt_folder), cache_dir=cache_dir, seq_len=32, val_fraction=0.25, val_length=512,
                     val_sequences=1)
    tokenizer = load_tokenizer("bytes")
    corpus = load_corpus(cfg, tokenizer)
    heldout = HeldOut(corpus, corpus.split(0.25)[1], eos_id=tokenizer.eos_id, val_fraction=0.25)
    line = heldout_plan(cfg)
    counts = dict(re.findall(r"(first|windows|pack) (\d+)", heldout_plan_error(cfg, val_sequences=10_000)))
    assert line is not None and set(counts) == {"first", "windows", "pack"}
    for mode, n in counts.items():
        n = int(n)
        assert heldout.long_sequences(n, 512, mode).shape == (n, 512)  # as many as it says: they are cut
        with pytest.raises(ValueError):
            heldout.long_sequences(n + 1, 512, mode)  # one more: the run would refuse
    assert int(counts["pack"]) == heldout.stream.length // 512 and int(counts["first"]) == int(
        np.sum(heldout.lens >= 512))


def heldout_plan_error(cfg: DataConfig, *, val_sequences: int) -> str:
    from dataclasses import replace

    with pytest.raises(ValueError) as err:
        heldout_plan(replace(cfg, val_sequences=val_sequences))
    return str(err.value).rsplit("they give", 1)[1]
