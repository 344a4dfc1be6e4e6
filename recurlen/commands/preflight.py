"""What a command is about to use, resolved without loading, training or downloading anything.

Every command checks its inputs here before any heavy work (so a typo fails in a second, not after an
hour on a GPU), and `--dry-run` prints the same resolution as the plan. A local path that does not exist
is a UserError; a hub id is looked up in the local Hugging Face cache only, and one that is not there is
reported as "would be downloaded" (the real run downloads it when online) or, with HF_HUB_OFFLINE=1, as missing:
every missing input is listed at once, each with the `hf download` line that fetches it.

A plan also collects what would make the run refuse to start on this machine (a strategy it cannot run, a
directory another process writes, inputs missing offline, memory that does not fit, resume=never on a run): a dry
run ends with them instead of "everything resolved", and the real run refuses with them in one line before it
imports Lightning or builds anything (Refusals).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from recurlen.models import registry
from recurlen.training.devices import strategy_problem
from recurlen.training.run_dir import CHECKPOINTS_DIR, LAST_CHECKPOINT, RunDir
from recurlen.util.errors import UserError
from recurlen.util.hub import hub_file_parts, offline
from recurlen.util.tokenizers import package_file
from recurlen.util.writer_lock import refusal as writer_refusal

RUN_CHECKPOINT = Path(CHECKPOINTS_DIR) / LAST_CHECKPOINT


def looks_like_hub_id(spec: str) -> bool:
    """owner/name, where `owner` is not a local directory (runs/x is a missing run, not a hub id)."""
    return (spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
            and Path(spec).suffix not in (".ckpt", ".pt", ".bin", ".json", ".safetensors")
            and not Path(spec.split("/")[0]).is_dir())


def _hub_cached(repo_id: str, filename: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency of datasets / tokenizers
        return False
    return isinstance(try_to_load_from_cache(repo_id, filename), str)


@dataclass
class Missing:
    """Inputs of a plan that are not in the local Hugging Face cache, each with the command that fetches it."""

    items: list[tuple[str, str]] = field(default_factory=list)
    """(what, `hf download ...` arguments)"""

    def add(self, what: str, command: str) -> None:
        self.items.append((what, command))

    def lines(self) -> list[str]:
        """The plan's lines: where the cache is, then each item's command."""
        if not self.items:
            return []
        from huggingface_hub import constants

        home = os.environ.get("HF_HOME") or str(Path(constants.HF_HUB_CACHE).parent)
        head = (f"missing      {len(self.items)} input(s) not in the local Hugging Face cache "
                f"({constants.HF_HUB_CACHE})"
                + (", HF_HUB_OFFLINE=1: nothing is downloaded" if offline() else ": the run downloads them")
                + f"; to fetch them first, on a machine with network (export HF_HOME={home}):")
        width = max(len(command) for _, command in self.items)
        return [head, *(f"               {command:{width}s}   # {what}" for what, command in self.items)]

    def refusal(self) -> str | None:
        if not self.items or not offline():
            return None
        from huggingface_hub import constants

        home = os.environ.get("HF_HOME") or str(Path(constants.HF_HUB_CACHE).parent)
        return (f"{len(self.items)} input(s) are not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and "
                f"HF_HUB_OFFLINE=1 is set, so nothing is downloaded: {', '.join(w for w, _ in self.items)}; on a "
                f"machine with network run `export HF_HOME={home}; "
                + "; ".join(c for _, c in self.items) + "` (older huggingface_hub: huggingface-cli download) into "
                "that cache or a copy of it HF_HOME points at here; then rerun")


@dataclass
class Refusals:
    """What would make a run refuse to start on this machine; `early` ones the command refuses with before
    importing Lightning (the others the run says itself, once it has loaded what it measures)."""

    items: list[tuple[str, bool]] = field(default_factory=list)

    def add(self, text: str, *, early: bool = True) -> None:
        self.items.append((text, early))

    def early(self) -> list[str]:
        return [text for text, early in self.items if early]

    def __bool__(self) -> bool:
        return bool(self.items)


def _cache_note(cached: bool) -> str:
    if cached:
        return "in the local cache"
    return "not in the local cache" + (" and HF_HUB_OFFLINE=1: missing" if offline() else ": would be downloaded")


def describe_checkpoint(spec: str, missing: Missing | None = None) -> str:
    """Where a model would come from: a run directory, a .ckpt, a pretrained directory or a hub id (one that is
    not in the local cache goes into `missing`)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return f"{spec} (pretrained directory)"
        if (path / RUN_CHECKPOINT).is_file():
            return f"{spec} (run directory: {RUN_CHECKPOINT})"
        raise UserError(f"{spec!r} is a directory but neither a run directory (no {RUN_CHECKPOINT}) nor a "
                        "pretrained directory (no config.json)")
    if path.is_file():
        if path.suffix != ".ckpt":
            try:  # an architecture's release format that is one weights file
                return f"{spec} ({registry.detect(path).title} weights file)"
            except UserError:
                raise UserError(f"{spec!r} is a file but neither a .ckpt checkpoint nor a weights file of a known "
                                "architecture; pass a run directory, a .ckpt, a pretrained directory or a hub id") \
                    from None
        return f"{spec} (checkpoint file)"
    if looks_like_hub_id(spec):
        cached = _hub_cached(spec, "config.json")
        if not cached and missing is not None:
            missing.add(f"checkpoint {spec}", f"hf download {spec}")
        return f"{spec} (hub id, {_cache_note(cached)})"
    if (parts := hub_file_parts(spec)) is not None:
        cached = _hub_cached(*parts)
        if not cached and missing is not None:
            missing.add(f"checkpoint {spec}", f"hf download {parts[0]} {parts[1]}")
        return f"{spec} (file of a hub repository, {_cache_note(cached)})"
    raise UserError(f"checkpoint {spec!r} does not exist; allowed: a run directory, a .ckpt file, a pretrained "
                    "directory, a hub id (owner/name) or a file of one (owner/name/file)")


def describe_tokenizer(spec: str, missing: Missing | None = None) -> str:
    if spec in ("bytes", "byte"):
        return "bytes"
    if spec.startswith("package:"):  # a vocabulary file shipped in an installed package
        return f"{spec} ({package_file(spec)})"
    if Path(spec).expanduser().exists():
        return f"{spec} (local)"
    if looks_like_hub_id(spec):
        cached = _hub_cached(spec, "tokenizer.json") or _hub_cached(spec, "tokenizer_config.json")
        if not cached and missing is not None:  # the tokenizer's files, not a model's weights
            missing.add(f"tokenizer {spec}", f"hf download {spec} --include '*.json'")
        return f"{spec} (hub id, {_cache_note(cached)})"
    raise UserError(f"tokenizer {spec!r} does not exist; allowed: 'bytes', a tokenizer.json file, a tokenizer "
                    "directory, a vocabulary list file, package:<package>/<file>, or a hub id (owner/name)")


def describe_data(data, missing: Missing | None = None) -> str:
    """The data source (local files must exist), tokenizer and shape of a DataConfig (a streamed hub dataset
    offline, and a tokenizer not in the cache, go into `missing`)."""
    from recurlen.training.data.sources import resolve_source

    try:
        source = resolve_source(data)
    except (FileNotFoundError, ValueError) as err:
        raise UserError(str(err)) from err
    if source.kind == "hf":
        what = f"hub dataset {source.location} ({'streamed' if data.streaming else 'downloaded or cached'})"
        datasets_offline = offline() or os.environ.get("HF_DATASETS_OFFLINE", "0").strip().lower() in ("1", "true")
        if data.streaming and datasets_offline:  # datasets cannot stream a hub dataset without network
            local = f"data/{source.location.split('/')[-1]}"
            what += ": cannot be streamed offline"
            if missing is not None:
                missing.add(f"data hf:{source.location} (then data.source={local}/FILE)",
                            f"hf download {source.location} FILE... --repo-type dataset --local-dir {local}")
    elif source.kind == "embedded":
        what = "embedded corpus (the Python standard library's .py files)"
    else:
        what = f"{data.source} ({len(source.files)} files)"
    cap = f", first {data.max_documents} documents" if data.max_documents else ""
    return (f"{what}{cap}; tokenizer {describe_tokenizer(data.tokenizer, missing)}; T = {data.seq_len}, "
            f"batch {data.batch_size} per rank, layout {data.layout}")


def early_refusal(cfg, *, lock: bool = True, strategy: bool = True) -> None:
    """What refuses a run before anything is imported or built: a strategy this machine cannot run, and a run
    directory another live process writes (its writer.json: recurlen.util.writer_lock.refusal)."""
    if strategy:
        problem = strategy_problem(str(cfg.trainer.strategy), str(cfg.trainer.accelerator))
        if problem:
            raise UserError(problem)
    if lock:
        run = RunDir(cfg.resolved_run_dir)
        run.check_location()
        held = writer_refusal(run.path, advice="choose another run_dir")
        if held is not None:
            raise held


def experiment_plan(cfg, *, command: str, refusals: Refusals | None = None, lock: bool = True) -> list[str]:
    """Resolve an experiment's inputs (UserError for a missing local one) and describe the run; what would make
    it refuse to start here goes into `refusals` (`lock`: whether the command takes the run directory's writer
    lock in this process)."""
    refusals = Refusals() if refusals is None else refusals
    missing = Missing()
    run = RunDir(cfg.resolved_run_dir)
    run.check_location()
    run_dir = run.path
    try:
        ckpt = run.resume_checkpoint(cfg.resume)
    except FileNotFoundError as err:
        raise UserError(str(err)) from err
    if ckpt is None:
        resume = "starts fresh"
        if run.run_files() and cfg.resume == "archive":
            resume += f"; the earlier run moves to {run.archive}/<time>/"
        elif run.run_files() and cfg.resume == "never":
            resume = "will be refused: run_dir holds a run; resume=archive moves it aside"
            refusals.add(f"run_dir={run_dir} holds a run and resume=never; resume=archive moves it aside, "
                         "resume=auto continues it", early=False)
    elif cfg.resume == "auto":
        # What the run refuses once it has built the model and read the checkpoint (another model, intervention,
        # data: a run directory of an earlier run), the dry run refuses now, from the run's config.yaml.
        from recurlen.training.experiments.compose import resolved_config
        from recurlen.training.resume import resume_refusal

        refusal = resume_refusal(run, resolved_config(cfg))
        if refusal is not None:
            raise UserError(refusal)
        resume = f"resumes from the furthest-trained intact checkpoint: {ckpt} (the next one if it is damaged)"
    else:
        resume = f"from {cfg.resume}"
    model = (describe_checkpoint(cfg.model.pretrained, missing) if cfg.model.pretrained
             else f"new {cfg.model.name}, random initialisation (trained from scratch, model.pretrained unset): "
                  f"{registry.get(cfg.model.architecture).describe(cfg.model.config)}")
    t = cfg.trainer
    devices = (f"{t.accelerator} x {t.devices} devices x {t.num_nodes} nodes, strategy {t.strategy}, "
               f"precision {t.precision}")
    strategy = strategy_problem(str(t.strategy), str(t.accelerator))
    if strategy:
        devices += " (not on this machine)"
        refusals.add(strategy)
    held = writer_refusal(run_dir, advice="choose another run_dir") if lock else None
    if held is not None:
        refusals.add(str(held))
    iv = cfg.intervention
    task = getattr(cfg, "task", None)  # task experiments only
    trains = not (task is not None and task.name and not task.train)
    lines = [f"experiment   {cfg.name} -> {run_dir} ({resume})",
             f"model        {model} (backend {cfg.model.backend})",
             f"data         {describe_data(cfg.data, missing)}",
             f"intervention {iv.name}" + (f" (reset_prob {iv.reset_prob})" if iv.name in ("state_passing", "tbptt")
                                          else ""),
             f"training     {t.max_steps} steps, lr {cfg.optim.lr:g}, {devices}" if trains else
             f"training     none (task.train=false): the task evaluates "
             f"{cfg.model.pretrained or f'the last checkpoint of {run_dir}'} as it is"]
    if not getattr(getattr(cfg, "task", None), "name", None):  # a task's own DataModule checks its own data
        from recurlen.training.data.heldout_fit import heldout_plan

        try:  # what the run's DataModule refuses, said now (where the corpus reads without a download)
            held_out = heldout_plan(cfg.data)
        except (FileNotFoundError, ValueError) as err:
            raise UserError(f"data: {err}") from None
        if held_out:
            lines.insert(3, f"held-out     {held_out}")
        from recurlen.training.data.tokenize_plan import tokenize_plan

        devices = str(t.devices)  # 'auto' / -1 / a list: counted as the ids given, else one device
        per_node = len(devices.split(",")) if "," in devices else int(devices) if devices.isdigit() else 1
        try:
            tokenize = tokenize_plan(cfg.data, steps=t.max_steps * t.accumulate_grad_batches,
                                     num_global_lanes=cfg.data.batch_size * per_node * t.num_nodes)
        except (FileNotFoundError, ValueError) as err:
            raise UserError(f"data: {err}") from None
        if tokenize:
            lines.insert(3, f"tokenize     {tokenize}")
    lines += missing.lines()
    if missing.refusal():
        refusals.add(missing.refusal())
    if trains:
        lines.append(f"memory       {_memory_line(cfg, refusals)}")
    lines.append(f"logs         {_logs_line(t.loggers, run)}")
    if task is not None and task.name:
        from recurlen.evaluation.tasks.runner import eval_lengths

        lines.append(f"task         {task.name} (train: {str(task.train).lower()}), lengths {eval_lengths(cfg)}")
        if task.train and task.text_rows:
            share = "every scored token alike" if task.task_share is None else f"task share {task.task_share:g}"
            lines.append(f"mix          {task.text_rows} of the {cfg.data.batch_size} rows corpus text in the "
                         f"intervention's layout, the rest {task.name} examples; loss: {share}")
        task_memory = _task_memory_line(cfg, eval_lengths(cfg), refusals)
        if task_memory:
            lines.append(f"task memory  {task_memory}")
    if held is not None:
        lines.append(f"writer       refused: {held}")
    return [f"recurlen {command}: plan"] + [f"  {line}" for line in lines]


def _logs_line(names: list[str], run: RunDir) -> str:
    """Where the run logs; a chosen logger whose package is missing is the same one line the run would print."""
    from recurlen.training import loggers

    loggers.check_installed(names)
    return loggers.describe(names, run)


def _task_memory_line(cfg, lengths: list[int], refusals: Refusals) -> str | None:
    """The task's evaluation at its longest length (recurlen.evaluation.tasks.task_memory), and whether it fits here;
    one that does not is refused before anything trains or is written."""
    from recurlen.evaluation.tasks import task_memory
    from recurlen.training import memory

    est = task_memory.for_task(cfg, lengths)
    if est is None:
        return None
    cpu = memory.available_bytes("cpu")
    refusal = est.refusal(cpu, memory.available_bytes("cuda") if est.device == "cuda" else None)
    if refusal is not None:
        refusals.add(refusal)
    here = f"; {memory.size_text(cpu)} of CPU memory available here" if cpu is not None else ""
    return f"{est.describe()}{here}: " + ("does NOT fit: the task will refuse to start" if refusal else "fits")


def _memory_line(cfg, refusals: Refusals | None = None) -> str:
    """The estimate of recurlen.training.memory for the shape cfg.model names, and whether it fits here."""
    from recurlen.training import memory

    if cfg.model.pretrained and cfg.model.name == "custom":
        return "estimated when the model is loaded (its shape is in the checkpoint)"
    est = memory.for_experiment(cfg)
    available = memory.available_bytes(est.device)
    if available is None:
        return est.describe()
    verdict = "fits" if est.total <= available else "does NOT fit: the run will refuse to start"
    if est.total > available and refusals is not None:  # the run says it itself, with the loaded model's shape
        refusals.add(f"memory: {memory.size_text(est.total)} per rank does not fit in the "
                     f"{memory.size_text(available)} available here", early=False)
    return (f"{est.describe()}; {memory.size_text(available)} available here: {verdict}"
            + (f" (about {est.lanes_that_fit(available)} lanes would)" if est.total > available else ""))


__all__ = ["Missing", "Refusals", "describe_checkpoint", "describe_data", "describe_tokenizer", "early_refusal",
           "experiment_plan", "looks_like_hub_id"]
