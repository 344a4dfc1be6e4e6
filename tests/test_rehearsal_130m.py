"""Official-shape rehearsal on CPU: what a first GPU session runs, at the real 130m shape, through the real commands.

A randomly initialised Mamba-2 130m checkpoint in the official format (config.json + fp16 pytorch_model.bin, tied
head) loads through from_pretrained; `recurlen finetune model=130m` (the command `make finetune MODEL=130m` runs,
with model.pretrained pointed at the local directory instead of the hub id) post-trains 3 steps per intervention
at T = 2048 in bf16-mixed precision; a run with carried states writes a checkpoint and resumes from it; `recurlen
eval` scores one 131072-token sequence in chunks. Batch 1 lane and the fewest steps that still check each part:
this is the most expensive test of the suite (see the README for its time).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recurlen import Mamba2LM, preset
from recurlen.training.run_dir import RUN_META_KEY, RunDir

# Not in CI's slow tier: ~50 min on 2 busy cores, ~20 estimated idle (the 128k evaluation ~7-13 of them).
pytestmark = [pytest.mark.slow, pytest.mark.rehearsal]

REPO = Path(__file__).resolve().parents[1]
INTERVENTIONS = ("none", "random_noise", "fitted_noise", "state_passing", "tbptt")
T = 2048
EVAL_LEN = 131072


def write_official_130m(directory: Path) -> dict[str, torch.Tensor]:
    """What the hub's state-spaces/mamba2-130m holds: config.json and fp16 weights with both tied keys."""
    directory.mkdir(parents=True)
    torch.manual_seed(0)
    model = Mamba2LM(preset("130m"), backend="torch")
    (directory / "config.json").write_text(json.dumps(model.config.to_official_json(), indent=2))
    state_dict = {k: v.detach().to(torch.float16).clone() for k, v in model.state_dict().items()}
    torch.save(state_dict, directory / "pytorch_model.bin")
    return state_dict


def write_corpus(directory: Path) -> Path:
    """Plain-text documents: enough for a few training segments and, after the validation split (20%), one
    held-out sequence of EVAL_LEN byte tokens."""
    directory.mkdir()
    rng = random.Random(0)
    words = ["state", "length", "token", "model", "recurrent", "memory", "context", "chunk", "lane", "scan",
             "the", "of", "and", "a", "to", "in", "is", "it", "that", "with"]
    for i in range(60):
        (directory / f"doc{i:03d}.txt").write_text(" ".join(rng.choice(words) for _ in range(4000)))
    return directory


def env() -> dict[str, str]:
    drop = ("SLURM_", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_", "RANK", "GROUP_RANK", "RECURLEN_FAULT",
            "OMP_NUM_THREADS")
    out = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    out.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    return out


def recurlen(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "recurlen", *args], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=3600)
    assert done.returncode == 0, f"recurlen {args[0]} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done


def finetune(checkpoint: Path, corpus: Path, run_dir: Path, intervention: str, *, steps: int
             ) -> subprocess.CompletedProcess:
    # `make finetune MODEL=130m INTERVENTION=<i> STEPS=<n> RUN=<dir>` is `recurlen finetune model=130m
    # intervention=<i> trainer.max_steps=<n> run_dir=<dir>`; the rest points the preset's hub id and the Pile at
    # local files and keeps the run small (1 lane, no validation, no diagnostics; `recurlen eval` below
    # still finds the held-out documents of val_fraction).
    return recurlen(
        "finetune", "model=130m", f"intervention={intervention}", f"trainer.max_steps={steps}", f"run_dir={run_dir}",
        f"model.pretrained={checkpoint}", "model.backend=torch",
        f"data.source={corpus}", "data.tokenizer=bytes", "data.streaming=false", "data.num_proc=null",
        "data.max_documents=null", f"data.seq_len={T}", "data.batch_size=1", "data.val_fraction=0.2",
        "data.val_sequences=0", "data.val_segments=0", f"data.cache_dir={run_dir.parent / 'cache'}",
        "trainer.accelerator=cpu", "trainer.precision=bf16-mixed", "trainer.progress_bar=false",
        "trainer.log_every_n_steps=1", "intervention.fit_batches=1", "diagnostics.positionwise=false",
        "diagnostics.state_norm=false")


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(RunDir(run_dir).last_checkpoint, map_location="cpu", weights_only=True)


def carried_ssm(ckpt: dict) -> torch.Tensor:
    carried = ckpt[RUN_META_KEY]["intervention_state"]["carried"]
    assert carried is not None, "no carried states in the checkpoint"
    return carried["state"]["ssm"]


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> tuple[Path, Path]:
    """The official-format 130m checkpoint and a plain-text corpus."""
    root = tmp_path_factory.mktemp("rehearsal")
    write_official_130m(root / "mamba2-130m")
    return root / "mamba2-130m", write_corpus(root / "corpus")


@pytest.fixture(scope="module")
def tbptt_run(official) -> Path:
    """TBTT post-trained 3 steps: the reference of the resume check and the model of the 128k evaluation."""
    checkpoint, corpus = official
    run_dir = checkpoint.parent / "runs" / "tbptt"
    finetune(checkpoint, corpus, run_dir, "tbptt", steps=3)
    return run_dir


def test_official_130m_loads(official):
    """The official format loads through from_pretrained: fp16 upcast, head tied to the embedding."""
    checkpoint, _ = official
    model = Mamba2LM.from_pretrained(str(checkpoint), backend="torch")
    assert model.config == preset("130m")
    assert model.lm_head.weight is model.backbone.embedding.weight
    assert model.backbone.embedding.weight.dtype == torch.float32
    saved = torch.load(checkpoint / "pytorch_model.bin", weights_only=True, mmap=True)
    assert saved["backbone.layers.23.mixer.in_proj.weight"].dtype == torch.float16
    assert torch.equal(model.backbone.layers[23].mixer.in_proj.weight,
                       saved["backbone.layers.23.mixer.in_proj.weight"].float())


def test_official_130m_post_training_and_resume(official, tbptt_run):
    checkpoint, corpus = official
    runs = tbptt_run.parent

    # 3 steps per intervention at T = 2048 in bf16-mixed (tbptt's run is the fixture's).
    for intervention in INTERVENTIONS:
        run_dir = runs / intervention
        if intervention != "tbptt":
            finetune(checkpoint, corpus, run_dir, intervention, steps=3)
        ckpt = last_checkpoint(run_dir)
        assert ckpt["global_step"] == 3, intervention
        assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values()), intervention
        assert RunDir(run_dir).read_config()["trainer"]["precision"] == "bf16-mixed"
        if intervention in ("state_passing", "tbptt"):
            ssm = carried_ssm(ckpt)
            assert ssm.shape == (24, 1, 24, 64, 128) and ssm.dtype == torch.float32, ssm.shape
            assert torch.isfinite(ssm).all() and ssm.abs().sum() > 0
        del ckpt
        if intervention != "tbptt":  # 1.5 GB per run (weights + AdamW); tbptt is the reference and the eval's model
            shutil.rmtree(run_dir / "checkpoints")

    # Checkpoint with carried states, then resume: TBTT (SSM state and conv window carried) stopped after 2 steps
    # and resumed to 3 ends exactly where the uninterrupted 3-step run ended, which it cannot do unless the step
    # count, the optimizer, the data position and the carried states all came back.
    resumed = runs / "tbptt-resumed"
    finetune(checkpoint, corpus, resumed, "tbptt", steps=2)
    at_2 = last_checkpoint(resumed)
    assert at_2["global_step"] == 2 and carried_ssm(at_2).abs().sum() > 0
    # TBTT carries the conv window too
    assert at_2[RUN_META_KEY]["intervention_state"]["carried"]["state"]["conv"].abs().sum() > 0
    del at_2
    done = finetune(checkpoint, corpus, resumed, "tbptt", steps=3)
    assert "resuming from" in done.stdout + done.stderr
    got, want = last_checkpoint(resumed), last_checkpoint(tbptt_run)
    assert got["global_step"] == want["global_step"] == 3
    for key, value in want["state_dict"].items():
        assert torch.equal(got["state_dict"][key], value), f"resumed run differs from the uninterrupted one at {key}"
    torch.testing.assert_close(carried_ssm(got), carried_ssm(want), rtol=0, atol=0)


def test_official_130m_eval_131072_tokens(tbptt_run, tmp_path):
    """One 131072-token held-out sequence in chunks (64 x T) through `recurlen eval`."""
    out = tmp_path / "eval"
    recurlen("eval", f"tbptt={tbptt_run}", f"seq_len={EVAL_LEN}", "num_sequences=1", "batch_size=1",
             f"chunk_len={T}", "tasks=[positionwise,state]", "progress=false", "data.val_mode=pack",
             "--out", str(out))
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert run["seq_len"] == EVAL_LEN and run["train_len"] == T
    bins = run["positionwise"]["bins"]
    assert [b["name"] for b in bins][-1] == "[32T,64T)" and bins[-1]["end"] == EVAL_LEN - 1
    assert all(b["loss"] is not None and 0 < b["loss"] < 20 for b in bins), bins
    assert run["state"]["positions"][-1] == EVAL_LEN
