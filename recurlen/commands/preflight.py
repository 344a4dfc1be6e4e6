"""What a command is about to use, resolved without loading, training or downloading anything.

Every command checks its inputs here before any heavy work (so a typo fails in a second, not after an
hour on a GPU), and `--dry-run` prints the same resolution as the plan. A local path that does not exist
is a UserError; a hub id is looked up in the local Hugging Face cache only, and one that is not there is
reported as "would be downloaded" (the real run downloads it when online).
"""

from __future__ import annotations

from pathlib import Path

from recurlen.models import registry
from recurlen.training.run_dir import CHECKPOINTS_DIR, LAST_CHECKPOINT, RunDir
from recurlen.util.errors import UserError
from recurlen.util.hub import hub_file_parts
from recurlen.util.tokenizers import package_file

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


def _cache_note(cached: bool) -> str:
    return "in the local cache" if cached else "not in the local cache: would be downloaded"


def describe_checkpoint(spec: str) -> str:
    """Where a model would come from: a run directory, a .ckpt, a pretrained directory or a hub id."""
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
        return f"{spec} (hub id, {_cache_note(_hub_cached(spec, 'config.json'))})"
    if (parts := hub_file_parts(spec)) is not None:
        return f"{spec} (file of a hub repository, {_cache_note(_hub_cached(*parts))})"
    raise UserError(f"checkpoint {spec!r} does not exist; allowed: a run directory, a .ckpt file, a pretrained "
                    "directory, a hub id (owner/name) or a file of one (owner/name/file)")


def describe_tokenizer(spec: str) -> str:
    if spec in ("bytes", "byte"):
        return "bytes"
    if spec.startswith("package:"):  # a vocabulary file shipped in an installed package
        return f"{spec} ({package_file(spec)})"
    if Path(spec).expanduser().exists():
        return f"{spec} (local)"
    if looks_like_hub_id(spec):
        cached = _hub_cached(spec, "tokenizer.json") or _hub_cached(spec, "tokenizer_config.json")
        return f"{spec} (hub id, {_cache_note(cached)})"
    raise UserError(f"tokenizer {spec!r} does not exist; allowed: 'bytes', a tokenizer.json file, a tokenizer "
                    "directory, a vocabulary list file, package:<package>/<file>, or a hub id (owner/name)")


def describe_data(data) -> str:
    """The data source (local files must exist), tokenizer and shape of a DataConfig."""
    from recurlen.training.data.sources import resolve_source

    try:
        source = resolve_source(data)
    except (FileNotFoundError, ValueError) as err:
        raise UserError(str(err)) from err
    if source.kind == "hf":
        what = f"hub dataset {source.location} ({'streamed' if data.streaming else 'downloaded or cached'})"
    elif source.kind == "embedded":
        what = "embedded corpus (the Python standard library's .py files)"
    else:
        what = f"{data.source} ({len(source.files)} files)"
    cap = f", first {data.max_documents} documents" if data.max_documents else ""
    return (f"{what}{cap}; tokenizer {describe_tokenizer(data.tokenizer)}; T = {data.seq_len}, "
            f"batch {data.batch_size} per rank, layout {data.layout}")


def experiment_plan(cfg, *, command: str) -> list[str]:
    """Resolve an experiment's inputs (UserError for a missing local one) and describe the run."""
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
    model = (describe_checkpoint(cfg.model.pretrained) if cfg.model.pretrained
             else f"new {cfg.model.name}, random initialisation (trained from scratch, model.pretrained unset): "
                  f"{registry.get(cfg.model.architecture).describe(cfg.model.config)}")
    t = cfg.trainer
    devices = (f"{t.accelerator} x {t.devices} devices x {t.num_nodes} nodes, strategy {t.strategy}, "
               f"precision {t.precision}")
    iv = cfg.intervention
    lines = [f"experiment   {cfg.name} -> {run_dir} ({resume})",
             f"model        {model} (backend {cfg.model.backend})",
             f"data         {describe_data(cfg.data)}",
             f"intervention {iv.name}" + (f" (reset_prob {iv.reset_prob})" if iv.name in ("state_passing", "tbptt")
                                          else ""),
             f"training     {t.max_steps} steps, lr {cfg.optim.lr:g}, {devices}"]
    if not getattr(getattr(cfg, "task", None), "name", None):  # a task's own DataModule checks its own data
        from recurlen.training.data.heldout_fit import heldout_plan

        try:  # what the run's DataModule refuses, said now (where the corpus reads without a download)
            held_out = heldout_plan(cfg.data)
        except (FileNotFoundError, ValueError) as err:
            raise UserError(f"data: {err}") from None
        if held_out:
            lines.insert(3, f"held-out     {held_out}")
    lines.append(f"memory       {_memory_line(cfg)}")
    lines.append(f"logs         {_logs_line(t.loggers, run)}")
    task = getattr(cfg, "task", None)  # task experiments only
    if task is not None and task.name:
        lines.append(f"task         {task.name} (train: {str(task.train).lower()}), lengths "
                     f"{list(task.lengths or [])}")
    return [f"recurlen {command}: plan"] + [f"  {line}" for line in lines]


def _logs_line(names: list[str], run: RunDir) -> str:
    """Where the run logs; a chosen logger whose package is missing is the same one line the run would print."""
    from recurlen.training import loggers

    loggers.check_installed(names)
    return loggers.describe(names, run)


def _memory_line(cfg) -> str:
    """The estimate of recurlen.training.memory for the shape cfg.model names, and whether it fits here."""
    from recurlen.training import memory

    if cfg.model.pretrained and cfg.model.name == "custom":
        return "estimated when the model is loaded (its shape is in the checkpoint)"
    est = memory.for_experiment(cfg)
    available = memory.available_bytes(est.device)
    if available is None:
        return est.describe()
    verdict = "fits" if est.total <= available else "does NOT fit: the run will refuse to start"
    return (f"{est.describe()}; {memory.size_text(available)} available here: {verdict}"
            + (f" (about {est.lanes_that_fit(available)} lanes would)" if est.total > available else ""))


__all__ = ["describe_checkpoint", "describe_data", "describe_tokenizer", "experiment_plan", "looks_like_hub_id"]
