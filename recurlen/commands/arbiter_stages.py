"""What `recurlen arbiter` runs in its worker processes: a training stage, and the judging of one model.

    run_dir = train_stage(words, threads)                 # an ordinary training run on the task mix
    entry = judge_job(job, cfg, sequences, threads, log)   # both verdicts of one model (a fix applied first)

Each worker is a spawned process whose output goes to a log file of its own (runs side by side stay readable).
A judged model is kept in <run_root>/judge/<label>.json with what it was judged on (the checkpoint, the settings,
the fix, the held-out sequences' digest): running the arbiter again reuses it while those stand, so a finished
measurement is never lost to a later stage and a report can be rewritten without measuring again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from recurlen.commands.arbiter_config import ArbiterConfig
from recurlen.util.atomic_files import write_json

log = logging.getLogger(__name__)


def redirect(log_path: Path) -> None:
    """This worker's output, and recurlen's log lines, into its log file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logfile = open(log_path, "a")  # noqa: SIM115 (the worker's stdout and stderr for the rest of its life)
    os.dup2(logfile.fileno(), 1)
    os.dup2(logfile.fileno(), 2)
    sys.stdout, sys.stderr = logfile, logfile
    # A spawned worker starts without the command line's logging setup; one that ran a job before drops the handler
    # of that job's log.
    root = logging.getLogger("recurlen")
    for old in [h for h in root.handlers if getattr(h, "arbiter_job", False)]:
        root.removeHandler(old)
        old.stream.close()
    handler = logging.StreamHandler(logfile)
    handler.arbiter_job = True
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def compose(words: list[str]):
    """A task experiment from command-line words (experiment=..., overrides)."""
    from recurlen.evaluation.tasks.config import load_task_experiment

    return load_task_experiment(words)


def train_stage(words: list[str], threads: int) -> str:
    """One training stage: compose, train on the task mix (or find it finished), return its run directory."""
    from recurlen.evaluation.tasks.datamodules import build_task_datamodule
    from recurlen.training.finetune import run_finetune

    cfg = compose(words)
    redirect(Path(cfg.resolved_run_dir) / "train.log")
    torch.set_num_threads(threads)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, num_threads=threads, progress_bar=False))
    return str(run_finetune(cfg, datamodule=build_task_datamodule(cfg)))


@dataclass(frozen=True)
class Job:
    """A model to judge: a run directory, and the fix applied to it first (None: the run as trained)."""

    label: str
    kind: str
    path: str
    fix_key: str | None = None
    steps: int | None = None


def job_inputs(job: Job, cfg: ArbiterConfig, sequences: torch.Tensor) -> dict:
    """What a judged entry depends on: equal inputs, the same measurement."""
    from recurlen.diagnostics.positionwise import sequences_digest
    from recurlen.evaluation.fixes.arguments import fix_keys
    from recurlen.training.resume import checkpoint_to_read
    from recurlen.training.run_dir import RunDir

    ckpt = checkpoint_to_read(RunDir(job.path))
    stat = ckpt.stat()
    fix = None
    if job.fix_key is not None:
        name = dict(fix_keys(cfg.fixes))[job.fix_key]
        fix = {"key": job.fix_key, "name": name, "settings": cfg.fix.get(job.fix_key, {})}
    return json.loads(json.dumps({"job": asdict(job), "checkpoint": str(ckpt), "checkpoint_bytes": stat.st_size,
                                  "checkpoint_mtime_ns": stat.st_mtime_ns, "judge": cfg.judge.to_dict(),
                                  "fix": fix, "sequences": sequences_digest(sequences)}))


def cached_entry(path: Path, inputs: dict) -> dict | None:
    """The entry judged before with these inputs, or None."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved.get("entry") if saved.get("inputs") == inputs else None


def judge_job(job: Job, cfg: ArbiterConfig, sequences: torch.Tensor, threads: int, out: str) -> dict:
    """Judge one model: load it, apply its fix, measure both verdicts; the entry also goes to `out` (.json, with
    its inputs) and the worker's output to the .log beside it."""
    from recurlen.evaluation.arbiter.judge import judge
    from recurlen.evaluation.fixes.arguments import apply_fix, fix_configs
    from recurlen.training.run_dir import load_model
    from recurlen.util.tokenizers import load_tokenizer

    out_path = Path(out)
    redirect(out_path.with_suffix(".log"))
    torch.set_num_threads(threads)
    inputs = job_inputs(job, cfg, sequences)
    loaded = load_model(inputs["checkpoint"], device="cpu")
    T = loaded.train_seq_len
    record = None
    if job.fix_key is not None:
        key, fix, fix_cfg = next(c for c in fix_configs(cfg.fixes, cfg.fix) if c[0] == job.fix_key)
        record = apply_fix(loaded.model, key, fix, fix_cfg, base="base", rows=sequences[cfg.judge.num_sequences:],
                           length=cfg.judge.text_length(T), train_len=T)
    entry = judge(loaded.model, label=job.label, kind=job.kind, source=job.path, sequences=sequences,
                  tokenizer=load_tokenizer(loaded.tokenizer or "bytes"), train_len=T, settings=cfg.judge, fix=record)
    if job.steps is not None:
        entry["steps"] = job.steps
    write_json(out_path, {"inputs": inputs, "entry": entry})
    return entry


def pool(parallel: int):
    """Worker processes; spawned: a forked child would inherit this process's torch threads and Lightning state."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=parallel, mp_context=mp.get_context("spawn"))


__all__ = ["Job", "cached_entry", "compose", "job_inputs", "judge_job", "pool", "redirect", "train_stage"]
