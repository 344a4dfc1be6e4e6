"""trainer.head_loss (the LM head's loss in chunks) and trainer.compile (torch.compile of the step) train as the
plain eager step does: the same losses, step by step, within float tolerance."""

import logging

import lightning as L
import pytest
import torch

from recurlen.training import lit_module
from recurlen.training.compile import CompiledForward
from recurlen.training.finetune import run_finetune


class Losses(L.Callback):
    def __init__(self):
        self.losses: list[float] = []
        self.val: float | None = None
        self.compile_failure: str | None = "not compiled"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))
        if pl_module.compiled is not None:
            self.compile_failure = pl_module.compiled.failure

    def on_validation_end(self, trainer, pl_module):
        self.val = float(trainer.callback_metrics["val/loss"])


def train(experiment, run_dir, *overrides) -> Losses:
    rec = Losses()
    run_finetune(experiment(run_dir, "trainer.max_steps=3", "trainer.val_every_n_steps=3", *overrides),
                 callbacks=[rec])
    assert len(rec.losses) == 3 and rec.val is not None
    return rec


@pytest.fixture
def chunked_calls(monkeypatch):
    calls = []
    original = lit_module.chunked_token_loss

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(lit_module, "chunked_token_loss", counting)
    return calls


def test_chunked_head_loss_trains_as_the_plain_path(tmp_path, experiment, chunked_calls):
    plain = train(experiment, tmp_path / "plain", "trainer.head_loss=plain")
    assert not chunked_calls
    chunked = train(experiment, tmp_path / "chunked", "trainer.head_loss=chunked")
    assert len(chunked_calls) == 4  # 3 training steps and the one validation batch
    assert chunked.losses == pytest.approx(plain.losses, rel=1e-5)
    assert chunked.val == pytest.approx(plain.val, rel=1e-5)


def test_auto_keeps_small_logits_on_the_plain_path(tmp_path, experiment, chunked_calls):
    """The demos' micro-batches (tiny logits) keep the plain path under the default, so their numbers do not move."""
    train(experiment, tmp_path / "auto")
    assert not chunked_calls
    assert lit_module.chunks_head_loss(type("M", (), {"head_rows": 50277})(), 8 * 2048, "auto")


def test_an_unknown_head_loss_is_refused_in_one_line(experiment, tmp_path):
    allowed = r"allowed: \['auto', 'chunked', 'plain'\]"
    with pytest.raises(ValueError, match=r"trainer.head_loss='fused' is unknown; " + allowed):
        experiment(tmp_path / "run", "trainer.head_loss=fused")


def test_a_step_that_cannot_compile_trains_eagerly_with_one_warning(caplog):
    def failing_backend(graph, example_inputs):
        raise RuntimeError("no compiler here")

    fn = CompiledForward(lambda x: (x * 2).sum(), what="Toy", backend=failing_backend)
    with caplog.at_level(logging.WARNING, logger="recurlen.training.compile"):
        assert float(fn(torch.ones(3))) == 6.0
        assert float(fn(torch.ones(4))) == 8.0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "torch.compile failed for Toy" in warnings[0] and "no compiler here" in warnings[0]
    assert warnings[0].endswith("training eagerly") and fn.compiled is None


def test_a_step_that_compiles_is_not_run_eagerly():
    seen = []

    def recording_backend(graph, example_inputs):
        seen.append(graph)
        return graph.forward

    fn = CompiledForward(lambda x: (x * 2).sum(), backend=recording_backend)
    assert float(fn(torch.ones(3))) == 6.0 and seen and fn.failure is None


@pytest.mark.slow
def test_trainer_compile_trains_with_the_eager_losses(tmp_path, experiment):
    """torch.compile (inductor's C++ code on CPU) of the nano model's step: same losses as eager. Slow: compiling
    takes minutes of CPU on a 2-core machine."""
    eager = train(experiment, tmp_path / "eager")
    compiled = train(experiment, tmp_path / "compiled", "trainer.compile=true")
    assert compiled.compile_failure is None  # it compiled, rather than falling back to eager
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-4)
    assert compiled.val == pytest.approx(eager.val, rel=1e-4)
