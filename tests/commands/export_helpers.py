"""What the export tests share: the command line run in this process, and the tiny run they export."""

from __future__ import annotations

from recurlen.commands import cli
from recurlen.training.finetune import run_finetune


def run(capsys, *argv) -> tuple[int, str, str]:
    """`recurlen ARGV` in this process -> (exit status, stdout, stderr)."""
    rc = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def state_passing_run(tmp_path_factory, experiment, *, arch: str = "mamba2"):
    """A tiny post-training run of `arch` (state passing, the tests' 2 steps): its run directory."""
    root = tmp_path_factory.mktemp(f"run-{arch}")
    return run_finetune(experiment(root / "post" / "state_passing", "intervention=state_passing", arch=arch))
