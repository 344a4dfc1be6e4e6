"""TBTT over documents, through the Trainer: a lane carries its state exactly within a document and starts every
new document from zeros; a killed run resumes the same way."""

import json
import string

import numpy as np
import pytest
import torch

from tests.training.test_training import run_recorded

T = 16
EOS = 256  # the byte tokenizer's


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory) -> str:
    """60 documents of 3 to 70 bytes (T = 16: one shorter than T, tails of every length, some of exactly kT)."""
    rng = np.random.default_rng(0)
    lengths = [3, T, 2 * T, *rng.integers(3, 71, size=57).tolist()]
    letters = np.array(list(string.ascii_lowercase + " "))
    path = tmp_path_factory.mktemp("short-docs") / "docs.jsonl"
    with open(path, "w") as f:
        for n in lengths:
            f.write(json.dumps({"text": "".join(rng.choice(letters, size=n))}) + "\n")
    return str(path)


def run(experiment, run_dir, source, *extra, crash_after=None):
    cfg = experiment(run_dir, f"data.source={source}", "data.val_segments=0", "data.val_sequences=0",
                     "intervention=tbptt", "intervention.pass_conv=true", "trainer.max_steps=10",
                     "trainer.checkpoint_every_n_steps=5", *extra)
    assert cfg.data.layout == "documents" and cfg.intervention.reset_prob == 0.0
    return run_recorded(cfg, crash_after=crash_after)


@pytest.mark.parametrize("cap", [None, 2])
def test_lanes_reset_exactly_at_document_boundaries_and_carry_within_resume_included(tmp_path, experiment,
                                                                                     short_documents, cap):
    extra = [f"intervention.tbptt_segments={'null' if cap is None else cap}"]
    full = run(experiment, tmp_path / "full", short_documents, *extra)
    assert len(full.inits) == len(full.batches) == 10
    carried = restarted = 0
    for k in range(1, 10):
        batch, prev, init, before = full.batches[k], full.batches[k - 1], full.inits[k], full.finals[k - 1]
        for lane in range(4):
            new_document = bool(batch["new_stream"][lane])
            assert new_document == (int(batch["segment"][lane]) == 0)  # no epoch slice starts in 10 steps
            restarts = new_document or (cap is not None and int(batch["segment"][lane]) % cap == 0)
            if restarts:
                restarted += 1
                assert init.ssm[:, lane].abs().sum() == 0 and init.conv[:, lane].abs().sum() == 0, (k, lane)
            else:  # the same document goes on: its exact state (conv window included) and its next tokens
                carried += 1
                assert torch.equal(init.ssm[:, lane], before.ssm[:, lane]), (k, lane)
                assert torch.equal(init.conv[:, lane], before.conv[:, lane]), (k, lane)
                assert int(batch["input_ids"][lane, 0]) == int(prev["targets"][lane, -1])
            if new_document:  # the previous segment was its document's last: its EOS is scored, then padding
                last = prev["loss_mask"][lane].nonzero().max()
                assert int(prev["targets"][lane, last]) == EOS and not prev["loss_mask"][lane, last + 1:].any()
    assert carried > 5 and restarted > 5
    # A run killed after 5 steps resumes with every lane's carried state and its data position.
    first = run(experiment, tmp_path / "killed", short_documents, *extra, crash_after=5)
    second = run(experiment, tmp_path / "killed", short_documents, *extra)
    for got, want in zip(first.inits[:5] + second.inits, full.inits):
        assert torch.equal(got.ssm, want.ssm) and torch.equal(got.conv, want.conv)
    assert first.losses[:5] + second.losses == full.losses


def test_window_and_document_forms_are_named_and_checked(experiment, tmp_path):
    window = experiment(tmp_path, "intervention=tbptt", "intervention.tbptt_over=stream",
                        "intervention.tbptt_segments=8")
    assert window.data.layout == "contiguous"
    with pytest.raises(ValueError, match=r"tbptt_over=documents needs data.layout=documents .* got "
                                         r"data.layout='contiguous'"):
        experiment(tmp_path, "intervention=tbptt", "data.layout=contiguous")
    with pytest.raises(ValueError, match=r"tbptt_over='pages' is unknown; allowed: \['documents', 'stream'\]"):
        experiment(tmp_path, "intervention=tbptt", "intervention.tbptt_over=pages")
