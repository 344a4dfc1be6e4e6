"""`recurlen export`: a post-trained model as a directory the ecosystem loads, with a model card.

    recurlen export runs/demo/post/state_passing --out exports/sp format=transformers
    recurlen export runs/x/checkpoints/step=000500.ckpt --out exports/x --eval runs/x-eval dtype=bfloat16

format=official      the architecture's release format (state-spaces/mamba2-*, state-spaces/mamba-*, fla-hub/gla-*):
                     recurlen and the reference library (mamba-ssm, fla) load it with their from_pretrained.
format=transformers  config.json + model.safetensors that transformers' AutoModelForCausalLM loads
                     (Mamba2ForCausalLM, MambaForCausalLM); recurlen loads it too. Only for the architectures
                     transformers has a class for.
Next to the weights: the tokenizer's files (where the model's tokenizer has files) and README.md, the model card
(recurlen.commands.model_card). Nothing is uploaded: `huggingface-cli upload NAME DIR` is the user's step.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from recurlen.commands.model_card import find_evidence, write_card
from recurlen.models import official, registry, transformers_format
from recurlen.training.run_dir import load_model, run_dir_of
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
    if eval_path is not None:
        try:
            results_file(eval_path)
        except FileNotFoundError as err:
            raise UserError(f"--eval {eval_path}: {err} (give `recurlen eval`'s --out directory)") from None
    card = "README.md" + (f" with the evaluation in {eval_path}" if eval_path else "") if settings.card else "none"
    return ["recurlen export: plan", f"  model    {describe_checkpoint(source)}",
            f"  format   {settings.format}, {settings.dtype}, weights {settings.weights}", f"  card     {card}",
            f"  output   {out}"]


def export(source: str, out: str | Path, settings: ExportSettings, *, eval_path: str | None = None,
           command: list[str] | None = None) -> Path:
    """Write the model of `source` (a run directory, a .ckpt, a pretrained directory) to `out` -> the weights file.
    command: the export's own words, for the card's "reproduce" section."""
    check_source(source)
    out = Path(out)
    if out.exists() and Path(source).is_dir() and out.resolve() == Path(source).resolve():
        raise UserError(f"--out {out} is the directory exported from; write the export elsewhere")
    loaded = load_model(source, backend="torch")
    model = loaded.model.eval()
    arch = registry.of_model(model)
    dtype = DTYPES[settings.dtype]
    fmt = arch.transformers_format
    if settings.format == "transformers" and fmt is None:
        raise UserError(f"transformers has no {arch.title} class: format=transformers cannot express it; "
                        f"format=official writes {model.official.library}'s own format, which loads with: "
                        f"{model.official.loading}")
    evidence = find_evidence(source, run_dir_of(source), eval_path) if settings.card else None  # before writing
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_note, ids = _tokenizer(loaded.tokenizer, out)
    if settings.format == "transformers":
        weights = transformers_format.save(model, out, fmt, dtype=dtype, weights=settings.weights, extra=ids)
        format_name, library = f"transformers ({fmt.class_name})", "transformers"
        loading = "from transformers import AutoModelForCausalLM; model = AutoModelForCausalLM.from_pretrained(DIR)"
    else:
        weights = official.save(model, out, model.official, dtype=dtype, weights=settings.weights)
        format_name, library, loading = f"official ({model.official.library})", model.official.library, \
            model.official.loading
    log.info("wrote %s (%s, %s)", weights, format_name, settings.dtype)
    if settings.card:
        card = write_card(out, source=source, loaded=loaded, arch=arch, format_name=format_name, library=library,
                          loading=loading, weights=weights.name, dtype=settings.dtype,
                          tokenizer_note=tokenizer_note, evidence=evidence, eval_path=eval_path,
                          export_words=command or [source, "--out", str(out), f"format={settings.format}"])
        log.info("wrote %s", card)
    return weights


__all__ = ["DTYPES", "FORMATS", "ExportSettings", "check_source", "export", "export_plan"]
