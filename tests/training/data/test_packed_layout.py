"""data.layout=packed: the contiguous layout's rows with every document start flagged (no padding), exact resume, and
TBTT over documents on packed rows through the Trainer (a lane carries its state only where its document goes on)."""

from __future__ import annotations

import json
import string
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch

from recurlen.training.data import DataConfig, RecurlenDataModule
from recurlen.training.finetune import run_finetune
from tests.training.test_training import Recorder, run_recorded

T = 16
EOS = 256  # the byte tokenizer's
KEYS = ("input_ids", "targets", "lane", "new_stream", "step", "loss_mask", "segment", "resets")


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory) -> str:
    """80 documents of 0 to 70 bytes (T = 16: many documents per row, one empty, some of exactly kT)."""
    rng = np.random.default_rng(0)
    lengths = [0, 3, T, 2 * T, *rng.integers(1, 71, size=76).tolist()]
    letters = np.array(list(string.ascii_lowercase + " "))
    path = tmp_path_factory.mktemp("short-docs") / "docs.jsonl"
    with open(path, "w") as f:
        for n in lengths:
            f.write(json.dumps({"text": "".join(rng.choice(letters, size=n))}) + "\n")
    return str(path)


def make_dm(source: str, cache: Path, *, layout: str = "packed", rank: int = 0, world: int = 1,
            tokenize: str = "all", batch_size: int = 3) -> RecurlenDataModule:
    cfg = DataConfig(source=source, cache_dir=str(cache), seq_len=T, batch_size=batch_size, layout=layout, seed=5,
                     val_segments=0, val_sequences=0, val_fraction=0.1, tokenize=tokenize, num_proc=1)
    return RecurlenDataModule(cfg, rank=rank, world_size=world)


@pytest.mark.parametrize("tokenize", ["all", "needed"])
def test_packed_rows_are_the_contiguous_rows_with_each_document_start_flagged(tmp_path, short_documents, tokenize):
    packed = make_dm(short_documents, tmp_path, tokenize=tokenize)
    contiguous = make_dm(short_documents, tmp_path, layout="contiguous", tokenize=tokenize)
    steps = 40 if tokenize == "all" else 20  # 'all': past the first epoch (lane slices of ~95 tokens)
    prev = None
    flagged = 0
    for step in range(steps):
        batch, ref = packed.train_batch(step), contiguous.train_batch(step)
        assert torch.equal(batch["input_ids"], ref["input_ids"]) and torch.equal(batch["targets"], ref["targets"])
        resets, mask, ids = batch["resets"], batch["loss_mask"], batch["input_ids"]
        assert resets.dtype == torch.bool and resets.shape == ids.shape and torch.equal(resets[:, 0],
                                                                                        batch["new_stream"])
        # Inside a row a document starts right after each EOS; a flag after another token is where a lane's slice
        # of an epoch ends (the EOS between two epochs' slices is flagged itself): at most one a row.
        after_eos, inner = ids[:, :-1] == EOS, resets[:, 1:]
        assert not (after_eos & ~inner).any(), step
        assert ((inner & ~after_eos).sum(dim=1) <= 1).all(), step
        if tokenize == "needed":  # no epochs: a flag is a document start, nothing else
            assert torch.equal(inner, after_eos), step
        # A target that starts a document (its input is an EOS) is not scored; every other one is.
        assert torch.equal(mask[:, :-1], ~resets[:, 1:]), step
        if prev is not None:
            continues = ~batch["new_stream"]
            # A continuing row's first document is the previous row's last: one more row into it than there.
            want = torch.where(prev["resets"][:, 1:].any(dim=1), 1, prev["segment"] + 1)
            assert torch.equal(batch["segment"][continues], want[continues]), step
            # After a row whose last input is an EOS the next row starts a document.
            assert not (continues & (prev["input_ids"][:, -1] == EOS)).any(), step
            assert not (continues & ~prev["loss_mask"][:, -1]).any(), step
        assert (batch["segment"][batch["new_stream"]] == 0).all()
        flagged += int(resets.sum())
        prev = batch
    assert flagged > steps  # several documents per row: the layout packs them


@pytest.mark.parametrize("world", [1, 2])
def test_resume_yields_the_uninterrupted_packed_batches(tmp_path, short_documents, world):
    def consume(dm, n):
        out = []
        for batch in islice(iter(dm.train_dataloader()), n):
            dm.record_step(int(batch["step"]))
            out.append(batch)
        return out

    n, m = 7, 6
    for rank in range(world):
        uninterrupted = consume(make_dm(short_documents, tmp_path, rank=rank, world=world, batch_size=2), n + m)
        first = make_dm(short_documents, tmp_path, rank=rank, world=world, batch_size=2)
        consume(first, n)
        resumed = make_dm(short_documents, tmp_path, rank=rank, world=world, batch_size=2)
        resumed.load_state_dict(first.state_dict())
        after = consume(resumed, m)
        assert len(after) == m
        for got, want in zip(after, uninterrupted[n:]):
            assert set(got) == set(want) and set(KEYS) <= set(got)
            for key in KEYS:
                assert torch.equal(got[key], want[key]), key


def run(experiment, run_dir, source, *extra, crash_after=None):
    cfg = experiment(run_dir, f"data.source={source}", "data.val_segments=0", "data.val_sequences=0",
                     "data.layout=packed", "intervention=tbptt", "intervention.pass_conv=true",
                     "trainer.max_steps=10", "trainer.checkpoint_every_n_steps=5", *extra)
    assert cfg.data.layout == "packed" and cfg.intervention.reset_prob == 0.0
    return run_recorded(cfg, crash_after=crash_after)


def test_tbptt_on_packed_rows_carries_only_a_continuing_document_and_resumes_exactly(tmp_path, experiment,
                                                                                    short_documents):
    full = run(experiment, tmp_path / "full", short_documents)
    assert len(full.inits) == len(full.batches) == 10
    carried = restarted = 0
    for k in range(1, 10):
        batch, init, before = full.batches[k], full.inits[k], full.finals[k - 1]
        for lane in range(4):
            if bool(batch["new_stream"][lane]):
                restarted += 1
                assert init.ssm[:, lane].abs().sum() == 0 and init.conv[:, lane].abs().sum() == 0, (k, lane)
            else:  # the row's first document goes on: its exact state (conv window included)
                carried += 1
                assert torch.equal(init.ssm[:, lane], before.ssm[:, lane]), (k, lane)
                assert torch.equal(init.conv[:, lane], before.conv[:, lane]), (k, lane)
    # A row rarely starts exactly where a document does (once here); most go on, from a state that is not zero.
    assert carried > 30 and restarted >= 1 and full.inits[5].ssm.abs().sum() > 0
    # A run killed after 5 steps resumes with every lane's carried state and its data position.
    first = run(experiment, tmp_path / "killed", short_documents, crash_after=5)
    second = run(experiment, tmp_path / "killed", short_documents)
    for got, want in zip(first.inits[:5] + second.inits, full.inits):
        assert torch.equal(got.ssm, want.ssm) and torch.equal(got.conv, want.conv)
    assert first.losses[:5] + second.losses == full.losses


def test_the_model_is_given_the_flags_after_column_0(tmp_path, experiment, short_documents, monkeypatch):
    """The training step hands the model the batch's resets with column 0 cleared (the intervention chose the
    row's initial state), and its loss is the packed one: documents read from zeros."""
    seen = []
    cfg = experiment(tmp_path / "run", f"data.source={short_documents}", "data.val_segments=0",
                     "data.val_sequences=0", "data.layout=packed", "intervention=none", "trainer.max_steps=2")
    rec = Recorder()

    class Spy(type(rec)):
        def on_train_start(self, trainer, pl_module):
            model = pl_module.model
            original = model.forward_hidden

            def spy(input_ids, state=None, **kw):
                seen.append(kw.get("resets"))
                return original(input_ids, state, **kw)

            model.forward_hidden = spy

    spy = Spy()
    run_finetune(cfg, callbacks=[spy])
    batch = spy.batches[0]
    assert seen[0] is not None and not seen[0][:, 0].any()
    assert torch.equal(seen[0][:, 1:], batch["resets"][:, 1:]) and batch["resets"][:, 1:].any()


def test_tbptt_over_documents_takes_packed_rows_and_the_window_form_does_not(experiment, tmp_path):
    cfg = experiment(tmp_path / "a", "intervention=tbptt", "data.layout=packed")
    cfg.validate()
    with pytest.raises(ValueError, match="needs data.layout=contiguous .*got data.layout='packed'"):
        experiment(tmp_path / "b", "intervention=tbptt", "intervention.tbptt_over=stream", "data.layout=packed")


def test_packed_rows_need_an_architecture_with_resets(experiment, tmp_path, monkeypatch):
    from recurlen.models import registry

    monkeypatch.setattr(registry.get("mamba2").model_cls, "supports_resets", False)
    with pytest.raises(ValueError, match="data.layout=packed needs a model that resets its state inside a row; "
                                         "mamba2 does not"):
        experiment(tmp_path / "run", "data.layout=packed")
