"""Run a task experiment end to end: fine-tune (or train) through `run_finetune`, then evaluate.

    cfg = load_task_experiment(["experiment=passkey", "trainer.max_steps=100"])
    results_json = run_task(cfg)

Output directory (task.output_dir, default <run_dir>/<task>):
    results.json          what a report reads (format "recurlen.tasks.<task>/1"; written atomically); passkey and
                          niah with fixes=[...]: "fixes", one entry per training-free fix scored like the model
                          (label BASE+KEY, the fix's record, its accuracies; recurlen.evaluation.tasks.fixed)
    <task>_*.png          the heatmap (passkey, babilong; niah: one per task) or accuracy-by-length plot (copying)
    tb/                   TensorBoard, a run of its own: the figure, and the accuracies against the evaluated
                          length in the section task/ (tags task/<task>/<metric>_by_<axis>/<series>, the length
                          in the step slot: TensorBoard's x-axis still reads "step", so the tag and a custom
                          scalars chart name the axis), apart from the training run's val/ and train/ scalars
    data/                 babilong with source=generate: the evaluated records, in the layout load_babilong reads

Copying trains one model per (intervention, seed) in <run_dir>/<intervention>/seed<seed> (each resumable like
any run) and aggregates mean +- std over seeds.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from recurlen.evaluation.tasks import task_memory
from recurlen.evaluation.tasks.config import TASKS, TaskExperimentConfig
from recurlen.evaluation.tasks.datamodules import build_task_datamodule
from recurlen.training.experiments.compose import resolved_config
from recurlen.training.finetune import launch_rank, run_finetune
from recurlen.training.interventions import InterventionConfig
from recurlen.training.run_dir import RunDir, load_model
from recurlen.util.atomic_files import save_figure, write_json
from recurlen.util.tensorboard import write_event_dir
from recurlen.util.tokenizers import check_vocab_fits, load_tokenizer

log = logging.getLogger(__name__)

PLOT_NAMES = {"passkey": "passkey_heatmap.png", "babilong": "babilong_heatmap.png", "copying": "copying_accuracy.png",
              "niah": "niah_heatmap.png"}


def task_output_dir(cfg: TaskExperimentConfig) -> Path:
    return Path(cfg.task.output_dir or Path(cfg.resolved_run_dir) / str(cfg.task.name))


def eval_lengths(cfg: TaskExperimentConfig) -> list[int]:
    if cfg.task.lengths:
        return [int(n) for n in cfg.task.lengths]
    if cfg.task.name == "copying":
        return [k * cfg.task.copying.length for k in (1, 2, 3, 4)]
    return [k * cfg.data.seq_len for k in (1, 2, 4, 8, 16)]


def _train_or_locate(cfg: TaskExperimentConfig) -> str:
    """Fine-tune when task.train, and return what to evaluate: the run dir; else model.pretrained as is
    (zero-shot), or without it the run directory's last checkpoint (re-evaluating a finished run)."""
    run = RunDir(cfg.resolved_run_dir)
    if cfg.task.train:
        return str(run_finetune(cfg, datamodule=build_task_datamodule(cfg)))
    if cfg.model.pretrained:
        return cfg.model.pretrained
    if run.has_checkpoint():
        return str(run.path)
    raise ValueError(f"task.train=false and there is nothing to evaluate: {run.last_checkpoint} does not "
                     "exist and model.pretrained is not set; set model.pretrained=<dir or run> or task.train=true")


def _load(source: str, cfg: TaskExperimentConfig):
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = load_model(source, backend=cfg.model.backend, device=device)
    tok_spec = loaded.tokenizer or cfg.data.tokenizer
    tokenizer = load_tokenizer(tok_spec)
    check_vocab_fits(tokenizer, loaded.model.config.vocab_size)
    return loaded, tokenizer, tok_spec, device


def starting_model(cfg: TaskExperimentConfig) -> dict | None:
    """model.pretrained and, for a recurlen run (e.g. a corpus post-training with state passing or TBTT, the
    paper's first stage before the task fine-tune), the intervention and context it was trained with."""
    if not cfg.model.pretrained:
        return None
    from recurlen.training.run_dir import RUN_META_KEY

    p = Path(cfg.model.pretrained).expanduser()
    ckpt = p if p.suffix == ".ckpt" else RunDir(p).last_checkpoint
    if not ckpt.is_file():  # an official checkpoint: no recurlen post-training
        return {"path": cfg.model.pretrained, "intervention": None}
    # mmap: only the run metadata is read, not the weights and optimizer state (gigabytes for official shapes)
    meta = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True).get(RUN_META_KEY) or {}
    return {"path": cfg.model.pretrained, "intervention": meta.get("intervention"),
            "train_seq_len": meta.get("train_seq_len")}


def _header(cfg: TaskExperimentConfig, *, source: str, train_len: int | None, tokenizer: str,
            device: str) -> dict:
    task_cfg = {k: v for k, v in resolved_config(cfg)["task"].items() if k not in TASKS or k == cfg.task.name}
    return {"format": f"recurlen.tasks.{cfg.task.name}/1", "task": cfg.task.name, "model": source,
            "starting_model": starting_model(cfg),
            "train_len": train_len, "tokenizer": tokenizer, "device": device, "seed": cfg.seed,
            "intervention": cfg.intervention.name, "task_config": task_cfg,
            "plots": {"figure": PLOT_NAMES[cfg.task.name]}, "tensorboard": "tb"}


AXES = {"passkey": "prompt_tokens", "babilong": "prompt_tokens", "copying": "string_length", "niah": "prompt_tokens"}
"""What the step slot of each task's scalars holds: the prompt's length in tokens, or the copied string's in symbols."""


def task_tag(task: str, metric: str, series: str) -> str:
    """'task/passkey/accuracy_by_prompt_tokens/depth_0.5': the section (task/), the x-axis and the line, in the tag."""
    return f"task/{task}/{metric}_by_{AXES[task]}/{series}"


def task_tensorboard(out: Path, task: str, scalars: dict[str, list[tuple[int, float]]], figure) -> Path:
    """The task's TensorBoard run out/tb: its scalars, one custom-scalars chart per metric naming the x-axis, a
    note in the Text tab, and the figure."""
    axis = AXES[task].replace("_", " ")
    metrics = sorted({tag.split("/")[2] for tag in scalars})
    charts = {f"{task}: {m.replace('_by_', ' vs ').replace('_', ' ')} (x axis: {axis}, not a training step)":
              [f"^task/{task}/{m}/"] for m in metrics}
    note = (f"The {task} scalars under task/{task}/ have the evaluated length ({axis}) where TensorBoard says "
            "'step': they are one evaluation of a finished model, not a training curve.")
    return write_event_dir(out / "tb", scalars=scalars, figures={f"task/{task}/figure": figure},
                           texts={f"task/{task}/x_axis": note}, layout={f"task: {task} by length": charts})


def _finish(out: Path, results: dict, figure, scalars: dict) -> Path:
    save_figure(figure, out / results["plots"]["figure"], dpi=110, tight=True)
    task_tensorboard(out, results["task"], scalars, figure)
    write_json(out / "results.json", results)
    log.info("%s results: %s (plot %s)", results["task"], out / "results.json", out / results["plots"]["figure"])
    return out / "results.json"


def _fixes(cfg: TaskExperimentConfig, **kw) -> dict:
    """results.json's "fixes": each training-free fix of cfg.fixes scored like the model (absent without fixes)."""
    from recurlen.evaluation.tasks.fixed import evaluate_fixes

    entries = evaluate_fixes(cfg, **kw)
    return {"fixes": entries} if entries else {}


def _fix_scalars(task: str, results: dict) -> dict:
    """Each fix's mean accuracy by length, a line beside the model's mean."""
    return {task_tag(task, "accuracy", f"mean_{e['label']}"): [(int(n), a) for n, a in
                                                               e["mean_accuracy_by_length"].items()]
            for e in results.get("fixes", [])}


def run_passkey(cfg: TaskExperimentConfig) -> Path:
    from recurlen.evaluation.tasks.passkey import evaluate_passkey
    from recurlen.evaluation.tasks.plots import plot_passkey

    source = _train_or_locate(cfg)
    loaded, tokenizer, tok_spec, device = _load(source, cfg)
    t, pk, lengths = cfg.task, cfg.task.passkey, eval_lengths(cfg)

    def score(model) -> dict:
        return evaluate_passkey(model, tokenizer, lengths=lengths, depths=[float(d) for d in pk.depths],
                                trials=t.trials, seed=t.eval_seed, batch_size=t.eval_batch_size, chunk_len=t.chunk_len,
                                key_digits=pk.key_digits, max_new_tokens=pk.max_new_tokens)

    res = score(loaded.model.eval())
    results = {**_header(cfg, source=source, train_len=loaded.train_seq_len, tokenizer=tok_spec,
                         device=device), **res,
               **_fixes(cfg, source=source, device=device, length=max(lengths), score=score)}
    scalars = {task_tag("passkey", "accuracy", f"depth_{d:g}"): [(n, results["accuracy"][i][j])
                                                                 for j, n in enumerate(res["lengths"])]
               for i, d in enumerate(res["depths"])}
    scalars[task_tag("passkey", "accuracy", "mean")] = [(int(n), a) for n, a in res["mean_accuracy_by_length"].items()]
    scalars.update(_fix_scalars("passkey", results))
    return _finish(task_output_dir(cfg), results, plot_passkey(results), scalars)


def babilong_cells(cfg: TaskExperimentConfig, tokenizer, lengths: list[int], out: Path) -> dict[tuple[str, int], list]:
    """(task, length) -> records: generated (and written under out/data) or read from task.babilong.source."""
    from recurlen.evaluation.tasks.babilong import generate_records, load_babilong, write_babilong_dir
    from recurlen.evaluation.tasks.common import length_label

    b, t = cfg.task.babilong, cfg.task
    cells = {}
    if b.source == "generate":
        from recurlen.evaluation.tasks.babilong_gen import Haystack

        haystack = Haystack(tokenizer, b.haystack, min_tokens=max(lengths))
        for task in b.tasks:
            for n in lengths:
                cells[(task, n)] = generate_records(tokenizer, task=task, length=n, num=t.trials, seed=t.eval_seed,
                                                    num_facts=b.num_facts, haystack=haystack, prompt=b.prompt)
        write_babilong_dir(out / "data", {(length_label(n), task): recs for (task, n), recs in cells.items()})
        return cells
    for task in b.tasks:
        for n in lengths:
            cells[(task, n)] = load_babilong(b.source, task=task, length=length_label(n))[:t.trials]
    return cells


def run_babilong(cfg: TaskExperimentConfig) -> Path:
    from recurlen.evaluation.tasks.babilong import evaluate_babilong
    from recurlen.evaluation.tasks.plots import plot_babilong

    source = _train_or_locate(cfg)
    loaded, tokenizer, tok_spec, device = _load(source, cfg)
    out = task_output_dir(cfg)
    cells = babilong_cells(cfg, tokenizer, eval_lengths(cfg), out)
    res = evaluate_babilong(loaded.model.eval(), tokenizer, cells, batch_size=cfg.task.eval_batch_size,
                            chunk_len=cfg.task.chunk_len, max_new_tokens=cfg.task.babilong.max_new_tokens,
                            prompt=cfg.task.babilong.prompt)
    results = {**_header(cfg, source=source, train_len=loaded.train_seq_len, tokenizer=tok_spec,
                         device=device), "source": cfg.task.babilong.source, "prompt": cfg.task.babilong.prompt,
               **res}
    scalars = {task_tag("babilong", "accuracy", task): [(n, res["accuracy"][i][j])
                                                        for j, n in enumerate(res["lengths"])]
               for i, task in enumerate(res["tasks"])}
    scalars[task_tag("babilong", "accuracy", "mean")] = [(int(n), a)
                                                         for n, a in res["mean_accuracy_by_length"].items()]
    return _finish(out, results, plot_babilong(results), scalars)


def _sub_run(cfg: TaskExperimentConfig, *, intervention: str, seed: int) -> TaskExperimentConfig:
    """The copying run of one (intervention, seed): the experiment with those two changed, in its own directory."""
    run_dir = str(Path(cfg.resolved_run_dir) / intervention / f"seed{seed}")
    iv = InterventionConfig(**{**dataclasses.asdict(cfg.intervention), "name": intervention})
    return dataclasses.replace(cfg, seed=seed, run_dir=run_dir, name=f"{cfg.name}-{intervention}-seed{seed}",
                               intervention=iv)


def _train_in_child(sub: TaskExperimentConfig, threads: int) -> str:
    """One copying run in a worker process, its output in <run_dir>/train.log (runs side by side stay readable)."""
    import os
    import sys

    run_dir = Path(sub.resolved_run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "train.log", "a") as logfile:
        os.dup2(logfile.fileno(), 1)
        os.dup2(logfile.fileno(), 2)
        sys.stdout, sys.stderr = logfile, logfile
        torch.set_num_threads(threads)
        sub = dataclasses.replace(sub, trainer=dataclasses.replace(sub.trainer, num_threads=threads,
                                                                   progress_bar=False))
        return _train_or_locate(sub)


def _train_copying_runs(cfg: TaskExperimentConfig, subs: list[TaskExperimentConfig]) -> list[str]:
    parallel = min(cfg.task.copying.parallel, len(subs))
    if parallel == 1 or not cfg.task.train:
        out = []
        for sub in subs:
            log.info("copying: training %s -> %s", sub.intervention.name, sub.resolved_run_dir)
            out.append(_train_or_locate(sub))
        return out
    import multiprocessing as mp
    import os
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, (cfg.trainer.num_threads or os.cpu_count() or 1) // parallel)
    log.info("copying: training %d runs, %d at a time with %d thread(s) each; logs in <run>/train.log", len(subs),
             parallel, threads)
    # spawn: a forked child would inherit this process's torch thread pool and Lightning state.
    with ProcessPoolExecutor(max_workers=parallel, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_train_in_child, sub, threads) for sub in subs]
        return [f.result() for f in futures]


def run_copying(cfg: TaskExperimentConfig) -> Path:
    from recurlen.evaluation.tasks.copying import (
        CopyingFormat,
        evaluate_single,
        evaluate_stream,
        headline_length,
        summarize,
    )
    from recurlen.evaluation.tasks.plots import plot_copying

    c, t = cfg.task.copying, cfg.task
    lengths = eval_lengths(cfg)
    headline = headline_length(lengths, n=c.length, factor=c.headline_factor)
    subs = [_sub_run(cfg, intervention=i, seed=s) for i in c.interventions for s in c.seeds]
    sources = _train_copying_runs(cfg, subs)
    runs, header = [], None
    for sub, source in zip(subs, sources):
        loaded, tokenizer, tok_spec, device = _load(source, cfg)
        fmt, model = CopyingFormat(tokenizer, c), loaded.model.eval()
        log.info("copying: evaluating %s, seed %d", sub.intervention.name, sub.seed)
        single = evaluate_single(model, fmt, lengths=lengths, trials=t.trials, seed=t.eval_seed,
                                 batch_size=t.eval_batch_size, chunk_len=t.chunk_len)
        stream = evaluate_stream(model, fmt, seq_len=cfg.data.seq_len, trials=c.stream_trials or t.trials,
                                 seed=t.eval_seed, batch_size=t.eval_batch_size, chunk_len=t.chunk_len)
        runs.append({"intervention": sub.intervention.name, "seed": sub.seed, "run_dir": source, "single": single,
                     "stream": stream})
        header = header or _header(cfg, source=str(cfg.resolved_run_dir), train_len=loaded.train_seq_len,
                                   tokenizer=tok_spec, device=device)
    summary = summarize(runs, headline=headline)
    for name, s in summary.items():
        log.info("copying %s over %d seeds: single at L=%d (%.1fx n=%d) char_acc %.3f +- %.3f; stream (past %dx T) "
                 "char_acc %.3f +- %.3f", name, len(s["seeds"]), headline, headline / c.length, c.length,
                 s["at_headline"]["char_acc"]["mean"], s["at_headline"]["char_acc"]["std"], c.stream_factor - 1,
                 s["stream"]["char_acc"]["mean"], s["stream"]["char_acc"]["std"])
    for name, s in summary.items():
        if s.get("paired"):
            from recurlen.evaluation.tasks.paired import describe

            log.info("copying %s - %s, paired by seed, char_acc: single at L=%d %s; stream %s", name,
                     s["paired"]["against"], headline, describe(s["paired"]["single"]["char_acc"]),
                     describe(s["paired"]["stream"]["char_acc"]) if s["paired"]["stream"] else "-")
    results = {**header, "format": "recurlen.tasks.copying/2", "intervention": list(c.interventions),
               "train_length": c.length, "train_seq_len": cfg.data.seq_len, "packed": c.packed, "lengths": lengths,
               "headline_length": headline, "stream_factor": c.stream_factor, "chance": 1.0 / c.alphabet_size,
               "readings": {"single": f"one example whose string has L symbols (L = {lengths})",
                            "stream": f"zero-state sequences of >= {c.stream_factor} x T = "
                                      f"{c.stream_factor * cfg.data.seq_len} tokens of training-format examples, "
                                      f"scored on the examples starting at or after "
                                      f"{(c.stream_factor - 1) * cfg.data.seq_len}"},
               "metrics": {"char_acc": "teacher-forced character accuracy over the copy (the reference's char_acc)",
                           "greedy_char_acc": "character accuracy of the greedily decoded copy"},
               "runs": runs, "summary": summary,
               "paper": {"none": {"mean": 0.27, "std": 0.03}, "state_passing": {"mean": 0.47, "std": 0.11}}}
    scalars = {task_tag("copying", m, name): [(int(L), v) for L, v in s["single"][m]["mean"].items()]
               for name, s in summary.items() for m in ("char_acc", "greedy_char_acc")}
    return _finish(task_output_dir(cfg), results, plot_copying(results), scalars)


def niah_haystack(cfg: TaskExperimentConfig, tokenizer, source: str, lengths: list[int]):
    """The haystack the needles hide in; 'heldout' reads the evaluated run's own held-out text (its data config,
    else the experiment's), one sequence per trial."""
    from recurlen.evaluation.tasks.niah import FillerHaystack, TextHaystack

    kind = cfg.task.niah.haystack
    if kind == "filler":
        return FillerHaystack(tokenizer)
    if kind == "embedded":
        return TextHaystack("embedded", tokenizer=tokenizer)
    from recurlen.evaluation.heldout import heldout_sequences, run_data_config

    data = run_data_config(source) or cfg.data
    rows = heldout_sequences(data, length=max(lengths), num=cfg.task.trials)
    return TextHaystack("heldout", rows=rows.tolist())


def run_niah(cfg: TaskExperimentConfig) -> Path:
    from recurlen.evaluation.tasks.niah_eval import evaluate_niah, plot_niah

    source = _train_or_locate(cfg)
    loaded, tokenizer, tok_spec, device = _load(source, cfg)
    t, lengths = cfg.task, eval_lengths(cfg)
    haystack = niah_haystack(cfg, tokenizer, source, lengths)

    def score(model) -> dict:
        return evaluate_niah(model, tokenizer, t.niah, lengths=lengths, trials=t.trials, seed=t.eval_seed,
                             batch_size=t.eval_batch_size, chunk_len=t.chunk_len, haystack=haystack)

    res = score(loaded.model.eval())
    results = {**_header(cfg, source=source, train_len=loaded.train_seq_len, tokenizer=tok_spec,
                         device=device), **res,
               **_fixes(cfg, source=source, device=device, length=max(lengths), score=score)}
    scalars = {task_tag("niah", "accuracy", task): [(int(n), a) for n, a in res["accuracy_by_length"][task].items()]
               for task in res["tasks"]}
    scalars[task_tag("niah", "accuracy", "mean")] = [(int(n), a) for n, a in res["mean_accuracy_by_length"].items()]
    scalars.update(_fix_scalars("niah", results))
    return _finish(task_output_dir(cfg), results, plot_niah(results), scalars)


RUNNERS = {"passkey": run_passkey, "babilong": run_babilong, "copying": run_copying, "niah": run_niah}


def check_lengths(cfg: TaskExperimentConfig, tokenizer) -> None:
    """passkey, niah: a UserError when an evaluated length cannot hold the task's prompt without its filler."""
    if cfg.task.name == "passkey":
        from recurlen.evaluation.tasks import passkey

        passkey.check_lengths(passkey.PasskeyBuilder(tokenizer, key_digits=cfg.task.passkey.key_digits),
                              eval_lengths(cfg))
    elif cfg.task.name == "niah":
        from recurlen.evaluation.tasks import niah_eval
        from recurlen.evaluation.tasks.niah import NiahBuilder

        niah_eval.check_lengths(NiahBuilder(tokenizer, cfg.task.niah), cfg.task.niah.tasks, eval_lengths(cfg))


def run_task(cfg: TaskExperimentConfig) -> Path:
    """Train (task.train) and evaluate cfg.task.name; returns the path of results.json."""
    if cfg.task.name not in RUNNERS:
        raise ValueError(f"task.name={cfg.task.name!r} is not a task to run; allowed: {list(TASKS)}")
    if cfg.task.train:  # the trained model's tokenizer: lengths it cannot evaluate are said before the training
        check_lengths(cfg, load_tokenizer(cfg.data.tokenizer))
    # Prompts too long for this machine's memory: one line now, not the system's kill after the training.
    task_memory.check_fits(task_memory.for_task(cfg, eval_lengths(cfg)))
    # Training and the evaluation written after it are one run: the writer lock covers both.
    with RunDir(cfg.resolved_run_dir).writer_lock(enabled=launch_rank() == 0):
        return RUNNERS[cfg.task.name](cfg)


__all__ = ["AXES", "RUNNERS", "babilong_cells", "check_lengths", "eval_lengths", "niah_haystack", "run_babilong",
           "run_copying", "run_niah", "run_passkey", "run_task", "task_output_dir", "task_tag", "task_tensorboard"]
