"""`recurlen arbiter` (make arbiter): the loss verdict and the retrieval verdict on a base that does both.

full - reset cannot tell a model that uses its long context from one that forgets it fast enough never to be hurt
by it. The arbiter trains a base that retrieves within its training context AND is a language model, then judges
its post-trainings and the training-free fixes on it by both, on the same weights:

  1. base          experiments/arbiter-pretrain.yaml: a tiny Mamba-2 from scratch on batches of corpus text and
                   passkey examples (task.text_rows)                                        <run_root>/base
  2. post/<name>   the base post-trained on the same mix with each intervention             <run_root>/post/<name>
  3. judge         the base, each post-training and the base with each fix (applied once): full - reset on
                   held-out text to the longest passkey length, passkey accuracy by length and depth, every trial
                   kept                                                                      <run_root>/results.json
  4. report        the table per base with both verdicts and what they say together         <run_root>/report.md

Each training stage is an ordinary run (`recurlen passkey` with task.train, in a process of its own, its output
in <run dir>/train.log) and a finished one is reused as a run directory always is (its checkpoint reached
trainer.max_steps); the judging runs `parallel` models at a time with `threads_per_run` threads each.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from recurlen.evaluation.arbiter.judge import JudgeSettings
from recurlen.evaluation.tasks.retrieval import RETRIEVAL_BAR
from recurlen.training.experiments.compose import experiments_dir
from recurlen.training.interventions import INTERVENTIONS
from recurlen.util.atomic_files import write_json, write_text

log = logging.getLogger(__name__)

RESULTS_FORMAT = "recurlen.arbiter/1"


@dataclass
class ArbiterConfig:
    pipeline: str = "arbiter"
    """Marks experiments/arbiter.yaml as a pipeline (run by `recurlen arbiter`), not a single training run."""
    run_root: str = "runs/arbiter"
    """Where the stages' run directories, results.json and report.md go."""
    pretrain_experiment: str = "arbiter-pretrain"
    """The base's experiment (experiments/NAME.yaml): a passkey experiment with task.text_rows."""
    posttrain_experiment: str = "arbiter-posttrain"
    """The post-trainings' experiment, run once per intervention from the base."""
    interventions: list[str] = field(default_factory=lambda: ["none", "fitted_noise", "state_passing", "tbptt"])
    """Post-trainings to compare (none: plain fine-tuning)."""
    fixes: list[str] = field(default_factory=lambda: ["mambaextend", "a_scale", "forget_more"])
    """Training-free fixes applied to the base (NAME or KEY=NAME, as `recurlen eval fixes=[...]`)."""
    fix: dict[str, Any] = field(default_factory=dict)
    """Each fix's settings by its key, fix.KEY.SETTING=VALUE."""
    overrides: list[str] = field(default_factory=list)
    """Overrides given to both training stages (e.g. trainer.max_steps=20 for a smoke run)."""
    posttrain_overrides: list[str] = field(default_factory=list)
    """Overrides given to the post-trainings only."""
    parallel: int = 2
    """Runs (post-trainings, judged models) at the same time, each in its own process."""
    threads_per_run: int = 1
    """Torch threads of each of them."""
    base_threads: int | None = None
    """Torch threads of the base's training, which runs alone; None: parallel x threads_per_run (on a machine
    shared with other jobs one thread can be the faster)."""
    retrieval_bar: float = RETRIEVAL_BAR
    """A length retrieves when its Wilson interval's lower end reaches this accuracy."""
    judge: JudgeSettings = field(default_factory=JudgeSettings)

    def __post_init__(self) -> None:
        from recurlen.evaluation.fixes import arguments as fix_args

        unknown = sorted(set(self.interventions) - set(INTERVENTIONS))
        if unknown:
            raise ValueError(f"arbiter interventions {unknown} are unknown; allowed: {list(INTERVENTIONS)}")
        if self.parallel < 1 or self.threads_per_run < 1 or (self.base_threads is not None and self.base_threads < 1):
            raise ValueError("arbiter parallel, threads_per_run and base_threads must be >= 1")
        if not 0.0 < self.retrieval_bar < 1.0:
            raise ValueError(f"arbiter retrieval_bar={self.retrieval_bar} must be in (0, 1)")
        self.fixes, self.fix = fix_args.normalise(self.fixes, self.fix)
        fix_args.check_arguments(self.fixes, self.fix, what="arbiter")

    @property
    def root(self) -> Path:
        return Path(self.run_root)


def load_arbiter_config(args: list[str]) -> ArbiterConfig:
    """experiments/arbiter.yaml with key=value overrides, validated (unknown keys: one line with suggestions)."""
    from recurlen.util.arguments import check_dotlist

    check_dotlist(args, ArbiterConfig, what="arbiter setting")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(ArbiterConfig), OmegaConf.load(experiments_dir() / "arbiter.yaml"),
                              OmegaConf.from_dotlist(args))
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:
        raise ValueError(f"bad arbiter config: {str(err).splitlines()[0]} ({getattr(err, 'full_key', '')})") from err


def base_words(cfg: ArbiterConfig) -> list[str]:
    return [f"experiment={cfg.pretrain_experiment}", f"run_dir={cfg.root / 'base'}", *cfg.overrides]


def post_words(cfg: ArbiterConfig, intervention: str) -> list[str]:
    return [f"experiment={cfg.posttrain_experiment}", f"model.pretrained={cfg.root / 'base'}",
            f"intervention={intervention}", f"run_dir={cfg.root / 'post' / intervention}", *cfg.overrides,
            *cfg.posttrain_overrides]


def _compose(words: list[str]):
    from recurlen.evaluation.tasks.config import load_task_experiment

    return load_task_experiment(words)


def arbiter_plan(cfg: ArbiterConfig) -> list[str]:
    """The stages it would run, each training stage's experiment composed and validated."""
    base = _compose(base_words(cfg))
    posts = {iv: _compose(post_words(cfg, iv)) for iv in cfg.interventions}
    s, T = cfg.judge, base.data.seq_len
    steps = {p.trainer.max_steps for p in posts.values()}
    given = "".join(f"; fix.{key}.{k}={v}" for key, settings in cfg.fix.items() for k, v in settings.items())

    return ["recurlen arbiter: plan",
            f"  1. base         {base.model.name}, T = {T}, {base.trainer.max_steps} steps of {base.data.batch_size} "
            f"rows ({base.task.text_rows} text, {base.data.batch_size - base.task.text_rows} passkey) "
            f"-> {cfg.root / 'base'}",
            f"  2. post/<name>  {', '.join(cfg.interventions)}: {'/'.join(map(str, sorted(steps)))} steps each on the "
            f"same mix, {cfg.parallel} at a time -> {cfg.root / 'post'}",
            f"  3. judge        base, {len(posts)} post-trainings, {len(cfg.fixes)} fixes on the base"
            + (f" ({', '.join(cfg.fixes)}{given})" if cfg.fixes else "")
            + f": full - reset on {s.num_sequences} held-out sequences of {s.text_length(T)} tokens; passkey at "
            f"{', '.join(map(str, s.lengths(T)))} tokens x depths {s.depths} x {s.trials} keys",
            f"  4. report       {cfg.root / 'results.json'}, {cfg.root / 'report.md'}"]


# ---- stages ------------------------------------------------------------------------------------------------


def _redirect(log_path: Path) -> None:
    """This worker's output into its log file (runs side by side stay readable)."""
    import sys

    log_path.parent.mkdir(parents=True, exist_ok=True)
    logfile = open(log_path, "a")  # noqa: SIM115 (the worker's stdout and stderr for the rest of its life)
    os.dup2(logfile.fileno(), 1)
    os.dup2(logfile.fileno(), 2)
    sys.stdout, sys.stderr = logfile, logfile


def train_stage(words: list[str], threads: int) -> str:
    """One training stage (in a worker process): compose, train on the mix (or find it finished), return its dir."""
    import dataclasses

    import torch

    from recurlen.evaluation.tasks.datamodules import build_task_datamodule
    from recurlen.training.finetune import run_finetune

    cfg = _compose(words)
    _redirect(Path(cfg.resolved_run_dir) / "train.log")
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


def judge_job(job: Job, cfg: ArbiterConfig, sequences, threads: int, log_path: str | None) -> dict:
    """Judge one model (in a worker process): load it, apply its fix, measure both verdicts."""
    import torch

    from recurlen.evaluation.arbiter.judge import judge
    from recurlen.evaluation.fixes.arguments import apply_fix, fix_configs
    from recurlen.training.resume import checkpoint_to_read
    from recurlen.training.run_dir import RunDir, load_model
    from recurlen.util.tokenizers import load_tokenizer

    if log_path:
        _redirect(Path(log_path))
    torch.set_num_threads(threads)
    loaded = load_model(str(checkpoint_to_read(RunDir(job.path))), device="cpu")
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
    return entry


def _pool(parallel: int):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    # spawn: a forked child would inherit this process's torch thread pool and Lightning state.
    return ProcessPoolExecutor(max_workers=parallel, mp_context=mp.get_context("spawn"))


def run_arbiter(cfg: ArbiterConfig) -> Path:
    """Every stage; returns report.md."""
    from recurlen.evaluation.fixes.arguments import calibration_rows, fix_keys
    from recurlen.evaluation.heldout import heldout_sequences, run_data_config

    root = cfg.root
    root.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    with _pool(1) as pool:  # the base alone, with every thread
        log.info("arbiter 1/4: training the base -> %s (log: %s)", root / "base", root / "base" / "train.log")
        pool.submit(train_stage, base_words(cfg), cfg.base_threads or cfg.parallel * cfg.threads_per_run).result()
    timings["base"] = time.perf_counter() - started
    mark = time.perf_counter()
    with _pool(cfg.parallel) as pool:
        log.info("arbiter 2/4: post-training %s, %d at a time -> %s", ", ".join(cfg.interventions), cfg.parallel,
                 root / "post")
        futures = [pool.submit(train_stage, post_words(cfg, iv), cfg.threads_per_run) for iv in cfg.interventions]
        for f in futures:
            f.result()
    timings["post"] = time.perf_counter() - mark
    mark = time.perf_counter()
    T = _compose(base_words(cfg)).data.seq_len
    data = run_data_config(str(root / "base"))
    need = cfg.judge.num_sequences + calibration_rows(cfg.fixes, cfg.fix)
    sequences = heldout_sequences(data, length=cfg.judge.text_length(T), num=need)
    post_steps = {iv: _compose(post_words(cfg, iv)).trainer.max_steps for iv in cfg.interventions}
    jobs = [Job("base", "base", str(root / "base")),
            *(Job(iv, "post", str(root / "post" / iv), steps=post_steps[iv]) for iv in cfg.interventions),
            *(Job(f"base+{key}", "fix", str(root / "base"), fix_key=key) for key, _ in fix_keys(cfg.fixes))]
    log.info("arbiter 3/4: judging %d models by the loss and by retrieval, %d at a time (logs: %s)", len(jobs),
             cfg.parallel, root / "judge")
    with _pool(cfg.parallel) as pool:
        futures = [pool.submit(judge_job, job, cfg, sequences, cfg.threads_per_run,
                               str(root / "judge" / f"{job.label}.log")) for job in jobs]
        entries = [f.result() for f in futures]
    timings["judge"] = time.perf_counter() - mark
    timings["total"] = time.perf_counter() - started
    return write_results(cfg, entries, timings)


def write_results(cfg: ArbiterConfig, entries: list[dict], timings: dict[str, float]) -> Path:
    """results.json (every entry, its loss per sequence and its passkey outcomes per trial, the verdicts) and
    report.md under cfg.run_root."""
    from recurlen.evaluation.arbiter.table import arbiter_lines

    results = {"format": RESULTS_FORMAT, "config": asdict(cfg), "retrieval_bar": cfg.retrieval_bar,
               "bases": [{"label": "base", "entries": entries}], "seconds": timings}
    lines, verdicts = arbiter_lines(results)
    results["verdicts"] = verdicts
    write_json(cfg.root / "results.json", results, indent=2)
    minutes = timings.get("total", 0.0) / 60
    report = ["# recurlen arbiter: the loss verdict and the retrieval verdict", "",
              f"Every number below comes from {cfg.root / 'results.json'} (`recurlen arbiter`, {minutes:.1f} min: "
              + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items() if k != "total") + ").", "", *lines]
    write_text(cfg.root / "report.md", "\n".join(report) + "\n")
    return cfg.root / "report.md"


__all__ = ["RESULTS_FORMAT", "ArbiterConfig", "Job", "arbiter_plan", "base_words", "judge_job",
           "load_arbiter_config", "post_words", "run_arbiter", "train_stage", "write_results"]
