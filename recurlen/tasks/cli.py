"""Command-line entry points of the long-context tasks (wired into `recurlen` as subcommands).

  recurlen passkey  [overrides]   fine-tune with fitted noise on passkey examples, then the depth x length grid
  recurlen babilong [overrides]   fine-tune on BABILong examples, then accuracy by task and length
  recurlen copying  [overrides]   train from scratch with each intervention and seed, then copy 3x longer strings

Overrides are those of `recurlen finetune` (experiment=NAME, group=choice, a.b=value); the experiment
defaults to the subcommand's name. `task.train=false` skips training and evaluates `model.pretrained` (or
the run directory's last checkpoint), e.g. the zero-shot baseline of an official checkpoint:

  recurlen passkey task.train=false model=780m task.lengths=[2048,8192,32768]
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("recurlen.tasks")


def _run(task: str, argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write(__doc__.strip() + "\n")
        return 0
    from recurlen.experiment.compose import load_experiment
    from recurlen.tasks.runner import run_task

    cfg, resolved = load_experiment(list(argv), default_experiment=task)
    if cfg.task.name != task:
        raise ValueError(f"`recurlen {task}` runs experiments with task.name={task}; this one has "
                         f"task.name={cfg.task.name!r} (pick experiment={task} or set task.name={task})")
    path = run_task(cfg, resolved)
    log.info("%s done: %s", task, path)
    return 0


def cmd_passkey(argv: list[str]) -> int:
    return _run("passkey", argv)


def cmd_babilong(argv: list[str]) -> int:
    return _run("babilong", argv)


def cmd_copying(argv: list[str]) -> int:
    return _run("copying", argv)


COMMANDS = {
    "passkey": (cmd_passkey, "passkey retrieval: fine-tune (fitted noise), then accuracy by depth and length"),
    "babilong": (cmd_babilong, "BABILong: fine-tune, then accuracy by task and length"),
    "copying": (cmd_copying, "synthetic copying: train with / without state passing, test on 3x longer strings"),
}


def main(argv: list[str] | None = None) -> int:
    """`python -m recurlen.tasks.cli passkey|babilong|copying [overrides]` (the same as the recurlen subcommands)."""
    from recurlen.cli import _setup_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write(f"usage: python -m recurlen.tasks.cli {{{','.join(COMMANDS)}}} [overrides]\n")
        return 2
    _setup_logging()
    try:
        return COMMANDS[argv[0]][0](argv[1:])
    except (ValueError, FileNotFoundError) as err:
        sys.stderr.write(f"recurlen {argv[0]}: error: {err}\n")
        return 2


__all__ = ["COMMANDS", "cmd_babilong", "cmd_copying", "cmd_passkey", "main"]

if __name__ == "__main__":
    sys.exit(main())
