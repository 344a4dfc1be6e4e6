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
trainer.max_steps); the judging runs `parallel` models at a time with `threads_per_run` threads each, and a model
judged before on the same inputs is reused (recurlen.commands.arbiter_stages). Stopped (a signal to the process
group, Ctrl-C), it continues from its checkpoints and judged models when run again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

from recurlen.commands.arbiter_config import ArbiterConfig, base_words, load_arbiter_config, post_words
from recurlen.commands.arbiter_stages import Job, cached_entry, compose, job_inputs, judge_job, pool, train_stage
from recurlen.util.atomic_files import write_json, write_text

log = logging.getLogger(__name__)

RESULTS_FORMAT = "recurlen.arbiter/1"


def arbiter_plan(cfg: ArbiterConfig) -> list[str]:
    """The stages it would run, each training stage's experiment composed and validated."""
    base = compose(base_words(cfg))
    posts = {iv: compose(post_words(cfg, iv)) for iv in cfg.interventions}
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


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its finished workers (a stage's pool is joined when the stage ends)."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _trained(run_dir: Path, max_steps: int) -> bool:
    """Whether a training stage already reached its steps (then running it only finds it done)."""
    from recurlen.training.run_dir import RunDir, checkpoint_step

    last = RunDir(run_dir).last_checkpoint
    return last.is_file() and checkpoint_step(last) == max_steps


def run_arbiter(cfg: ArbiterConfig) -> Path:
    """Every stage; returns report.md."""
    root = cfg.root
    root.mkdir(parents=True, exist_ok=True)
    stages: dict[str, dict] = {}
    base_steps = compose(base_words(cfg)).trainer.max_steps
    post_steps = {iv: compose(post_words(cfg, iv)).trainer.max_steps for iv in cfg.interventions}

    def timed(name: str, reused: bool, run) -> None:
        wall, cpu = time.perf_counter(), _cpu_seconds()
        run()
        stages[name] = {"seconds": time.perf_counter() - wall, "cpu_seconds": _cpu_seconds() - cpu, "reused": reused}

    def base() -> None:
        with pool(1) as workers:  # the base alone
            log.info("arbiter 1/4: training the base -> %s (log: %s)", root / "base", root / "base" / "train.log")
            threads = cfg.base_threads or cfg.parallel * cfg.threads_per_run
            workers.submit(train_stage, base_words(cfg), threads).result()

    def post() -> None:
        with pool(cfg.parallel) as workers:
            log.info("arbiter 2/4: post-training %s, %d at a time -> %s", ", ".join(cfg.interventions), cfg.parallel,
                     root / "post")
            for f in [workers.submit(train_stage, post_words(cfg, iv), cfg.threads_per_run)
                      for iv in cfg.interventions]:
                f.result()

    entries: list[dict] = []
    timed("base", _trained(root / "base", base_steps), base)
    timed("post", all(_trained(root / "post" / iv, n) for iv, n in post_steps.items()), post)
    timed("judge", False, lambda: entries.extend(judge_all(cfg)))
    stages["judge"]["reused"] = all(e.get("reused") for e in entries)
    log.info("arbiter 4/4: the table -> %s", root / "report.md")
    return write_results(cfg, entries, stages)


def judge_all(cfg: ArbiterConfig) -> list[dict]:
    """Every model judged (the base, each post-training, the base with each fix), `parallel` at a time; one judged
    before on the same inputs (<run_root>/judge/<label>.json) is reused."""
    from recurlen.evaluation.fixes.arguments import calibration_rows, fix_keys
    from recurlen.evaluation.heldout import heldout_sequences, run_data_config

    root = cfg.root
    T = compose(base_words(cfg)).data.seq_len
    need = cfg.judge.num_sequences + calibration_rows(cfg.fixes, cfg.fix)
    sequences = heldout_sequences(run_data_config(str(root / "base")), length=cfg.judge.text_length(T), num=need)
    post_steps = {iv: compose(post_words(cfg, iv)).trainer.max_steps for iv in cfg.interventions}
    jobs = [Job("base", "base", str(root / "base")),
            *(Job(iv, "post", str(root / "post" / iv), steps=post_steps[iv]) for iv in cfg.interventions),
            *(Job(f"base+{key}", "fix", str(root / "base"), fix_key=key) for key, _ in fix_keys(cfg.fixes))]
    out = {job.label: root / "judge" / f"{job.label}.json" for job in jobs}
    done = {job.label: cached_entry(out[job.label], job_inputs(job, cfg, sequences)) for job in jobs}
    todo = [job for job in jobs if done[job.label] is None]
    log.info("arbiter 3/4: judging %d models by the loss and by retrieval, %d at a time (%d judged before on the "
             "same inputs; logs: %s)", len(todo), cfg.parallel, len(jobs) - len(todo), root / "judge")
    with pool(cfg.parallel) as workers:
        futures = {job.label: workers.submit(judge_job, job, cfg, sequences, cfg.threads_per_run, str(out[job.label]))
                   for job in todo}
        for label, f in futures.items():
            done[label] = f.result()
    # results.json says of each entry whether this run measured it or found it judged before.
    return [{**done[job.label], "reused": job not in todo} for job in jobs]


def write_results(cfg: ArbiterConfig, entries: list[dict], stages: dict[str, dict]) -> Path:
    """results.json (every entry, its loss per sequence and its passkey outcomes per trial, the verdicts, the stages'
    seconds) and report.md under cfg.run_root."""
    from recurlen.evaluation.arbiter.table import arbiter_lines

    results = {"format": RESULTS_FORMAT, "config": asdict(cfg), "retrieval_bar": cfg.retrieval_bar,
               "bases": [{"label": "base", "entries": entries}], "stages": stages}
    write_json(cfg.root / "results.json", results, indent=2)  # the measurements first, whatever the table does
    lines, verdicts = arbiter_lines(results)
    results["verdicts"] = verdicts
    write_json(cfg.root / "results.json", results, indent=2)
    wall = sum(s["seconds"] for s in stages.values())
    cpu = sum(s["cpu_seconds"] for s in stages.values())
    each = ", ".join(f"{name} {s['seconds']:.0f} s{' (done before: reused)' if s['reused'] else ''}"
                     for name, s in stages.items())
    report = ["# recurlen arbiter: the loss verdict and the retrieval verdict", "",
              f"Every number below comes from {cfg.root / 'results.json'} (`recurlen arbiter`: {wall / 60:.1f} min of "
              f"wall time, {each}; {cpu / 60:.1f} min of CPU time).", "", *lines]
    write_text(cfg.root / "report.md", "\n".join(report) + "\n")
    return cfg.root / "report.md"


__all__ = ["RESULTS_FORMAT", "ArbiterConfig", "arbiter_plan", "judge_all", "load_arbiter_config", "run_arbiter",
           "write_results"]
