"""Which strategies a machine runs, said before anything is built: FSDP and DeepSpeed on CUDA only (DeepSpeed when
installed), ddp_spawn nowhere (a run's callbacks do not pickle), ddp and one process everywhere."""

from __future__ import annotations

import pytest

from recurlen.training.devices import launch_rank, strategies_here, strategy_problem


@pytest.mark.parametrize(("cuda", "deepspeed", "want"), [
    (False, False, ["auto", "single_device", "ddp"]),
    (False, True, ["auto", "single_device", "ddp"]),
    (True, False, ["auto", "single_device", "ddp", "fsdp"]),
    (True, True, ["auto", "single_device", "ddp", "fsdp", "deepspeed"]),
])
def test_strategies_here(cuda, deepspeed, want):
    assert strategies_here("auto", cuda=cuda, deepspeed=deepspeed) == want
    for strategy in want:
        assert strategy_problem(strategy, "auto", cuda=cuda, deepspeed=deepspeed) is None


def test_each_refusal_names_why_and_what_runs_here():
    assert strategy_problem("fsdp", "cpu", cuda=False, deepspeed=True) == (
        "trainer.strategy=fsdp needs a CUDA GPU (Lightning runs it on CUDA only); trainer.accelerator=cpu on this "
        "machine trains on the CPU, where these run: auto, single_device, ddp")
    assert strategy_problem("deepspeed", "gpu", cuda=True, deepspeed=False).startswith(
        "trainer.strategy=deepspeed needs the deepspeed package, which is not installed")
    for cuda in (False, True):
        assert "ddp_spawn is not supported" in strategy_problem("ddp_spawn", "auto", cuda=cuda, deepspeed=True)


def test_launch_rank(monkeypatch):
    for name in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert launch_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert launch_rank() == 1
    monkeypatch.setenv("RANK", "3")
    assert launch_rank() == 3
