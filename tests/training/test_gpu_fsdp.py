"""Post-training under FSDP with the diagnostics on: the callbacks gather the sharded parameters.

Lightning's FSDP needs CUDA, so this is a GPU test (make test-gpu); it is skipped elsewhere.
"""

import pytest
import torch

from recurlen.training.experiments.compose import load_experiment
from recurlen.training.finetune import run_finetune

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="FSDP needs CUDA")]


def test_fsdp_run_with_diagnostics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, _ = load_experiment([
        "model=nano", "model.backend=torch", "intervention=tbptt", "data.seq_len=32", "data.batch_size=4",
        "data.val_length=256", "data.val_sequences=2", "data.val_segments=8", f"data.cache_dir={tmp_path / 'cache'}",
        "data.max_documents=60", "data.val_fraction=0.2", "trainer.max_steps=4", "trainer.val_every_n_steps=2",
        "trainer.limit_val_batches=2", "trainer.progress_bar=false", "trainer.accelerator=gpu", "trainer.devices=1",
        "trainer.strategy=fsdp", "trainer.precision=32-true", "diagnostics.positionwise=true",
        "diagnostics.state_norm=true", f"run_dir={tmp_path / 'run'}"])
    run_dir = run_finetune(cfg)
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert any(t.startswith("val/ppl@") for t in tags), sorted(tags)
    assert any(t.startswith("val/state_norm/") for t in tags), sorted(tags)
