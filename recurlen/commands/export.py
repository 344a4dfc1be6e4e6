"""`recurlen export`: a post-trained model as a directory the ecosystem loads, with a model card.

    recurlen export runs/demo/post/state_passing --out exports/sp format=transformers
    recurlen export runs/x/checkpoints/step=000500.ckpt --out exports/x --eval runs/x-eval dtype=bfloat16

format=official      the architecture's release format (state-spaces/mamba2-*, state-spaces/mamba-*, fla-hub/gla-*):
                     recurlen and the reference library (mamba-ssm, fla) load it with their from_pretrained.
format=transformers  config.json + model.safetensors that transformers' AutoModelForCausalLM loads
                     (Mamba2ForCausalLM, MambaForCausalLM); recurlen loads it too. Only for the architectures
                     transformers has a class for.
Next to the weights: the tokenizer's files (where the model's tokenizer has files), README.md, the model card
(recurlen.commands.model_card), and recurlen_export.json, the record of what the export wrote, the training context T
and the run's data settings, so that `recurlen eval DIR` reads the run's held-out documents
(recurlen.models.export_manifest). Nothing is uploaded: `huggingface-cli upload NAME DIR` is the user's step.

A run that is still training (another process holds its writer lock) is exported as its latest checkpoint: the
export says which step of how many, and so does the card.

--out is the user's directory: a non-empty one is written into only when it is an earlier export of the same run, or
with overwrite=true; either way only the export's own files are replaced, and no other file is deleted. Everything is
written into a temporary directory next to it first, then renamed into place (the whole directory when it is new).
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from recurlen.commands.model_card import find_evidence, write_card
from recurlen.models import official, registry, transformers_format
from recurlen.models.export_manifest import MANIFEST_NAME, ExportManifest, read_manifest, shareable_data, source_id
from recurlen.training.run_dir import checkpoint_step, load_model, run_config, run_dir_of
from recurlen.util.atomic_files import WriteAdvice, advice, host_name, pid_alive, write_error, write_text
from recurlen.util.errors import UserError

log = logging.getLogger(__name__)

FORMATS = ("official", "transformers")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "vocab.txt", "merges.txt")
"""The files of a Hugging Face tokenizer that are copied next to the weights."""


@dataclass
class ExportSettings:
    format: str = "official"
    """official (the architecture's release format, for recurlen and mamba-ssm / fla) | transformers
    (config.json + weights for AutoModelForCausalLM)."""
    dtype: str = "float32"
    """Dtype of the written weights: float32 (exact round trip) | float16 | bfloat16."""
    weights: str = "auto"
    """auto | safetensors | bin. auto: model.safetensors, except the official Mamba formats' pytorch_model.bin
    (the only file mamba-ssm's from_pretrained reads)."""
    card: bool = True
    """Write README.md, the model card with the run's evidence."""
    tensorboard: bool = False
    """Also write the card's comparison as a TensorBoard run (compare/events...) next to its plots; off by default,
    since an upload of the directory would publish it."""
    overwrite: bool = False
    """Write into a non-empty --out that is not an earlier export of this run. Only the export's files are replaced
    there; the directory's other files are kept."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format={self.format!r} is unknown; allowed: {list(FORMATS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is unknown; allowed: {list(DTYPES)}")
        official.weights_file(self.weights, official.SAFETENSORS_NAME)  # refuses an unknown choice by name


def check_source(source: str) -> None:
    """A run directory must hold a checkpoint to export (one line otherwise, naming what it does hold)."""
    run = run_dir_of(source)
    if run is not None and Path(source).is_dir() and not run.has_checkpoint():
        others = run.checkpoint_candidates()
        hint = f"name one of its checkpoints, e.g. {others[0]}" if others else "train it first (recurlen finetune)"
        raise UserError(f"{source} is a run directory without a checkpoint ({run.last_checkpoint} does not exist): "
                        f"nothing to export; {hint}")


def _source_id(source: str) -> str:
    """The same id for every checkpoint of a run (its directory, last.ckpt, a step checkpoint)."""
    run = run_dir_of(source)
    return source_id(run.path if run is not None else source)


def _listing(names: list[str], most: int = 6) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check_out(out: str | Path, source: str, settings: ExportSettings) -> ExportManifest | None:
    """--out may take this export: it is new, empty, an earlier export of the same run, or overwrite=true says so
    -> the record of the earlier export there (None where there is none)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory; choose another --out")
    present = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not present:
        return None
    earlier = read_manifest(out)
    if earlier is not None and earlier.source_id == _source_id(source):
        return earlier
    if not settings.overwrite:
        what = f"an export of another run, {earlier.run}" if earlier is not None else "not an export of this run"
        raise UserError(f"--out {out} is not empty and is {what} (it holds {_listing(present)}); set overwrite=true "
                        "to write the export's files there (the other files are kept), or choose another --out")
    return earlier


def _tokenizer(spec: str | None, out: Path) -> tuple[str, dict]:
    """Copy the tokenizer's files next to the weights -> (what the card says of it, transformers' token ids)."""
    from recurlen.util.tokenizers import load_tokenizer

    if spec is None:
        return "not recorded (pass the one it was trained with)", {}
    try:
        tok = load_tokenizer(spec)
    except (ValueError, FileNotFoundError) as err:
        log.warning("tokenizer %s not found (%s): no tokenizer files written", spec, err)
        return f"{spec} (its files were not found: not copied)", {}
    ids = {"bos_token_id": tok.eos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.eos_id}
    if spec in ("bytes", "byte"):
        return f"bytes (UTF-8 bytes 0-255, end of document {tok.eos_id}; no tokenizer files)", ids
    src = Path(tok.name)
    files = [src] if src.is_file() else [src / n for n in TOKENIZER_FILES if (src / n).is_file()]
    for f in files:
        if not (out / f.name).exists() or not (out / f.name).samefile(f):
            shutil.copyfile(f, out / f.name)
    return f"{spec} ({', '.join(f.name for f in files)} copied here)", ids


def export_plan(source: str, out: str, settings: ExportSettings, eval_path: str | None) -> list[str]:
    from recurlen.commands.preflight import describe_checkpoint
    from recurlen.diagnostics.plots import results_file

    check_source(source)
    earlier = check_out(out, source, settings)
    if eval_path is not None:
        try:
            results_file(eval_path)
        except FileNotFoundError as err:
            raise UserError(f"--eval {eval_path}: {err} (give `recurlen eval`'s --out directory)") from None
    card = "README.md" + (f" with the evaluation in {eval_path}" if eval_path else "") if settings.card else "none"
    progress = training_progress(source)
    return ["recurlen export: plan", f"  model    {describe_checkpoint(source)}",
            *([f"  step     {progress.describe()}"] if progress is not None else []),
            f"  format   {settings.format}, {settings.dtype}, weights {settings.weights}", f"  card     {card}",
            f"  output   {out}" + (" (an earlier export of this run: its files are replaced)" if earlier else "")]


@dataclass
class TrainingProgress:
    """How far the exported checkpoint of a run got: its step, the run's trainer.max_steps, and whether another
    process is training the run now (its writer lock: recurlen.util.writer_lock)."""

    step: int | None
    max_steps: int | None
    live: bool
    """Another live process holds the run's writer lock: it is training."""

    @property
    def partial(self) -> bool:
        return self.live or (self.step is not None and self.max_steps is not None and self.step < self.max_steps)

    def describe(self) -> str:
        of = f" of the run's trainer.max_steps={self.max_steps}" if self.max_steps is not None else ""
        where = f"step {self.step if self.step is not None else '?'}{of}"
        if self.live:
            return (f"{where}: the run is still training (its writer.json names the process); this is its latest "
                    "checkpoint")
        return where + (": the run stopped before its last step" if self.partial else "")


def training_progress(source: str) -> TrainingProgress | None:
    """The exported checkpoint's step against its run's max_steps, and whether the run is live (None for a source
    that is no recurlen checkpoint)."""
    from recurlen.util.writer_lock import refusal

    run = run_dir_of(source)
    p = Path(source).expanduser()
    checkpoint = run.last_checkpoint if run is not None and p.is_dir() else p if p.suffix == ".ckpt" else None
    if checkpoint is None or not checkpoint.is_file():
        return None
    max_steps = ((run_config(source) or {}).get("trainer") or {}).get("max_steps")
    return TrainingProgress(checkpoint_step(checkpoint), max_steps if isinstance(max_steps, int) else None,
                            live=run is not None and refusal(run.path) is not None)


EXPORT_ADVICE = WriteAdvice(place="--out", kept="the export stopped and removed what it had written: --out is as it "
                            "was", then="export again")
"""What a failed write of the export says (a run's advice speaks of run_dir and resuming checkpoints)."""


def export(source: str, out: str | Path, settings: ExportSettings, *, eval_path: str | None = None,
           command: list[str] | None = None) -> Path:
    """Write the model of `source` (a run directory, a .ckpt, a pretrained directory) to `out` -> the weights file.
    command: the export's own words, for the card's "reproduce" section."""
    with advice(EXPORT_ADVICE):
        return _export(source, out, settings, eval_path=eval_path, command=command)


def _export(source: str, out: str | Path, settings: ExportSettings, *, eval_path: str | None,
            command: list[str] | None) -> Path:
    check_source(source)
    out = Path(out)
    if out.exists() and Path(source).is_dir() and out.resolve() == Path(source).resolve():
        raise UserError(f"--out {out} is the directory exported from; write the export elsewhere")
    earlier = check_out(out, source, settings)
    loaded = load_model(source, backend="torch")
    model = loaded.model.eval()
    arch = registry.of_model(model)
    dtype = DTYPES[settings.dtype]
    fmt = arch.transformers_format
    if settings.format == "transformers" and fmt is None:
        raise UserError(f"transformers has no {arch.title} class: format=transformers cannot express it; "
                        f"format=official writes {model.official.library}'s own format, which loads with: "
                        f"{model.official.loading}")
    _check_weights_conflict(out, earlier, settings, model)
    progress = training_progress(source)
    if progress is not None and progress.live:
        # The export goes on: a checkpoint of a live run is a whole model; which one it is must not go unsaid.
        log.warning("%s is still training (another process holds its writer lock; its writer.json names it): "
                    "exporting its latest checkpoint, step %s of trainer.max_steps=%s; export again once the run has "
                    "finished for its last step", source, progress.step, progress.max_steps)
    evidence = find_evidence(source, run_dir_of(source), eval_path) if settings.card else None  # before writing
    where = out.resolve()
    try:  # a read-only place, a file where a directory belongs: one line naming --out
        where.parent.mkdir(parents=True, exist_ok=True)
        _remove_left_over_temporaries(where)
        # Next to --out, so that the renames into place stay on one file system; os.mkdir, not mkdtemp, whose 0700
        # would become the directory's mode.
        tmp = where.parent / f".{where.name}.export.{host_name()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        os.mkdir(tmp)
    except OSError as err:
        raise (write_error(err, where) or err) from err
    try:
        weights = _write(tmp, source=source, loaded=loaded, arch=arch, settings=settings, dtype=dtype,
                         evidence=evidence, eval_path=eval_path, progress=progress,
                         export_words=command or [source, "--out", str(out), f"format={settings.format}"])
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if not p.is_dir())
        run = run_dir_of(source)
        cfg = run_config(source) if run is not None or str(source).endswith(".ckpt") else None
        manifest = ExportManifest(run=(run.path if run is not None else Path(source)).name,
                                  source_id=_source_id(source), train_seq_len=loaded.train_seq_len,
                                  files=sorted([*files, MANIFEST_NAME]), data=shareable_data((cfg or {}).get("data")))
        write_text(tmp / MANIFEST_NAME, manifest.to_json())
        _install(tmp, out, manifest, earlier)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)  # ours alone; a failure before _install left --out as it was
    return out / weights.name


def _remove_left_over_temporaries(where: Path) -> None:
    """The temporary directories of exports to `where` that were killed (this machine, their process gone): each
    holds a whole model's weights."""
    for tmp in where.parent.glob(f".{glob.escape(where.name)}.export.{host_name()}.*.tmp"):
        pid = tmp.name[:-len(".tmp")].rsplit(".", 2)[-2]
        if tmp.is_dir() and pid.isdigit() and not pid_alive(int(pid)):
            log.info("removing %s, left by an export that did not finish", tmp)
            shutil.rmtree(tmp)


def _check_weights_conflict(out: Path, earlier: ExportManifest | None, settings: ExportSettings, model) -> None:
    """A weights file of the other kind that the export did not write stays, and refuses the export: next to the
    new one, which of the two a reader loads would depend on the reader."""
    default = official.SAFETENSORS_NAME if settings.format == "transformers" else model.official.weights
    mine = official.weights_file(settings.weights, default)
    ours = set(earlier.files) if earlier is not None else set()
    for other in sorted(set(official.WEIGHTS_FILES.values()) - {mine}):
        if (out / other).exists() and other not in ours:
            raise UserError(f"--out {out} holds {other}, which no export of this run wrote; next to the {mine} of "
                            "this export a loader would take either: move it away or choose another --out")


def _write(tmp: Path, *, source: str, loaded, arch, settings: ExportSettings, dtype: torch.dtype,
           evidence, eval_path: str | None, progress: TrainingProgress | None, export_words: list[str]) -> Path:
    """The weights, the tokenizer's files and the card into `tmp` -> the weights file."""
    model = loaded.model
    tokenizer_note, ids = _tokenizer(loaded.tokenizer, tmp)
    if settings.format == "transformers":
        fmt = arch.transformers_format
        weights = transformers_format.save(model, tmp, fmt, dtype=dtype, weights=settings.weights, extra=ids)
        format_name, library = f"transformers ({fmt.class_name})", "transformers"
        loading = "from transformers import AutoModelForCausalLM; model = AutoModelForCausalLM.from_pretrained(DIR)"
    else:
        weights = official.save(model, tmp, model.official, dtype=dtype, weights=settings.weights)
        format_name, library, loading = f"official ({model.official.library})", model.official.library, \
            model.official.loading
    log.info("wrote %s (%s, %s)", weights.name, format_name, settings.dtype)
    if settings.card:
        write_card(tmp, source=source, loaded=loaded, arch=arch, format_name=format_name, library=library,
                   loading=loading, weights=weights.name, dtype=settings.dtype, tokenizer_note=tokenizer_note,
                   evidence=evidence, eval_path=eval_path, export_words=export_words, tensorboard=settings.tensorboard,
                   progress=progress)
    return weights


def _install(tmp: Path, out: Path, manifest: ExportManifest, earlier: ExportManifest | None) -> None:
    """Move the export from `tmp` into `out`: a new --out is `tmp` renamed (all at once); into an existing one each
    file is renamed over its namesake, and the earlier export's files this one no longer writes are removed (no
    other file is touched)."""
    if not out.exists():
        os.replace(tmp, out)
        log.info("wrote %s: %s", out, _listing(manifest.files, most=12))
        return
    before = earlier.files if earlier is not None else []
    # Until every file is in place the record lists the earlier files and the new ones: an interrupted export
    # leaves a directory that the next export of this run may still replace.
    both = ExportManifest(**{**manifest.__dict__, "files": sorted({*before, *manifest.files})})
    write_text(out / MANIFEST_NAME, both.to_json())
    for name in manifest.files:
        if name != MANIFEST_NAME:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / name, out / name)
    for name in sorted(set(before) - set(manifest.files)):
        stale = out / name
        if stale.is_file() or stale.is_symlink():
            stale.unlink()
        for parent in stale.relative_to(out).parents:  # directories the earlier export made, when left empty
            if parent != Path(".") and (out / parent).is_dir() and not any((out / parent).iterdir()):
                (out / parent).rmdir()
    os.replace(tmp / MANIFEST_NAME, out / MANIFEST_NAME)  # last: the record of a complete export
    kept = sorted(p.name for p in out.iterdir() if p.name not in {Path(f).parts[0] for f in manifest.files})
    log.info("wrote %s into %s%s", _listing(manifest.files, most=12), out,
             f" (kept: {_listing(kept)})" if kept else "")


__all__ = ["DTYPES", "FORMATS", "ExportSettings", "TrainingProgress", "check_out", "check_source", "export",
           "export_plan", "training_progress"]
