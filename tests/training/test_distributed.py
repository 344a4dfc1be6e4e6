"""Multi-process runs on CPU (gloo): 2-process DDP, and 2 "nodes" on loopback through Lightning's launcher."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recurlen.training.run_dir import RUN_META_KEY

# Several processes each; CI runs the slow tests.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(run_dir, cache_dir, *extra):
    return [sys.executable, "-m", "recurlen", "finetune", "model=nano", "intervention=tbptt",
            "data.seq_len=16", "data.batch_size=3", "data.val_length=64", "data.val_sequences=2",
            "data.val_segments=8", "data.val_fraction=0.2", f"data.cache_dir={cache_dir}", "data.max_documents=60",
            "trainer.max_steps=4", "trainer.val_every_n_steps=2", "trainer.limit_val_batches=2",
            "trainer.checkpoint_every_n_steps=2", "trainer.progress_bar=false", "trainer.accelerator=cpu",
            "trainer.num_threads=1", "diagnostics.positionwise=false", "diagnostics.state_norm=false",
            f"run_dir={run_dir}", *extra]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE",
                                                                      "MASTER_", "RANK", "GROUP_RANK"))}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra})
    return env


def _check_disjoint_lanes(run_dir: Path, world: int, per_rank: int) -> None:
    summaries = [json.loads((run_dir / "ranks" / f"rank{r}.json").read_text()) for r in range(world)]
    assert [s["world_size"] for s in summaries] == [world] * world
    lanes = [set(s["lanes"]) for s in summaries]
    assert all(len(x) == per_rank for x in lanes)
    assert set().union(*lanes) == set(range(world * per_rank))  # disjoint and covering
    assert all(s["global_step"] == 4 for s in summaries)
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    carried = ckpt[RUN_META_KEY]["intervention_state"]["carried"]
    assert carried["world_size"] == world and carried["state"]["ssm"].shape[1] == world * per_rank
    assert carried["lanes"].tolist() == list(range(world * per_rank))  # gathered from every rank, in lane order


def test_ddp_two_processes_on_cpu(tmp_path, cache_dir):
    run = tmp_path / "ddp"
    proc = subprocess.run(_args(run, cache_dir, "trainer.devices=2", "trainer.strategy=ddp"), cwd=REPO,
                          env=_env(MASTER_PORT=str(_free_port())), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_disjoint_lanes(run, world=2, per_rank=3)
    # Resume on the same world size continues; the carried lane states come back to their ranks.
    proc = subprocess.run(_args(run, cache_dir, "trainer.devices=2", "trainer.strategy=ddp", "trainer.max_steps=6"),
                          cwd=REPO, env=_env(MASTER_PORT=str(_free_port())), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from" in proc.stderr + proc.stdout
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6


def test_two_nodes_on_loopback(tmp_path, cache_dir):
    run = tmp_path / "nodes"
    port = str(_free_port())
    procs = [subprocess.Popen(_args(run, cache_dir, "trainer.devices=1", "trainer.num_nodes=2", "trainer.strategy=ddp"),
                              cwd=REPO, env=_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(node)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    _check_disjoint_lanes(run, world=2, per_rank=3)
    nodes = sorted(json.loads((run / "ranks" / f"rank{r}.json").read_text())["node_rank"] for r in range(2))
    assert nodes == [0, 1]


def test_ddp_fitted_noise_refresh_pools_ranks(tmp_path, cache_dir):
    """The refresh's collectives on a real process group: both ranks fold the same window (one refresh at
    step 2), and the checkpoint after step 4 holds each rank's part of the open window."""
    run = tmp_path / "refresh"
    proc = subprocess.run(_args(run, cache_dir, "trainer.devices=2", "trainer.strategy=ddp",
                                "intervention=fitted_noise", "intervention.fit_batches=1",
                                "intervention.fit_refresh=ema", "intervention.fit_refresh_every=3",
                                "intervention.fit_ema=0.5"),
                          cwd=REPO, env=_env(MASTER_PORT=str(_free_port())), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)[RUN_META_KEY]["intervention_state"]
    refresh = state["fitted_noise_refresh"]
    assert refresh["world_size"] == 2 and refresh["refreshes"] == 1 and refresh["mode"] == "ema"
    assert refresh["states_seen"] == 3 * 2 * 3  # 3 steps x 2 ranks x 3 lanes
    windows = refresh["windows"]
    assert windows.shape[0] == 2 and windows[:, -1].tolist() == [3.0, 3.0]  # step 3: 3 lanes on each rank
    assert not torch.equal(windows[0, :-2], windows[1, :-2])  # the ranks saw other lanes
    assert torch.equal(state["fitted_noise"]["mean_KH"], refresh["mean_KG"].float())
