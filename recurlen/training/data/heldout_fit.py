"""Whether a corpus's held-out documents can serve a run's validation settings, known before the run starts: what
a dry run checks, on the same token cache and by the same rules as the run's DataModule (which checks it again).

A small corpus of your own (a folder of .txt files, a short jsonl) with the data group's defaults (16 held-out
sequences of 1024 tokens, the starts of distinct documents) used to pass the dry run and then stop the run; the
dry run now reads the corpus when that costs no download and little time, and names what would fit."""

from __future__ import annotations

from recurlen.training.data.config import DataConfig

PREPARE_LIMIT_BYTES = 64 << 20
"""Local files up to this size are tokenized by the dry run (into the cache the run then reads); larger ones, and
hub datasets, are checked by the run itself, unless their token cache exists already."""


def heldout_plan(cfg: DataConfig) -> str | None:
    """The plan's line on the held-out data (documents, tokens, what the validation takes from them); None when the
    corpus cannot be read without a download or a long build. ValueError, naming what would fit, when the held-out
    documents cannot serve val_segments / val_sequences x val_length in val_mode."""
    from recurlen.training.data.corpus import corpus_key, load_corpus
    from recurlen.training.data.sources import resolve_source
    from recurlen.training.data.stream import HeldOut
    from recurlen.util.tokenizers import load_tokenizer

    if cfg.val_segments == 0 and cfg.val_sequences == 0:
        return None
    source = resolve_source(cfg)
    if source.kind == "hf":
        return None
    from recurlen.training.data.prefix_cache import tokenize_needed

    if tokenize_needed(cfg, source):  # the held-out set is read with the run's first documents (source_lanes.py)
        return None
    try:
        tokenizer = load_tokenizer(cfg.tokenizer)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot be loaded is the plan's tokenizer line's to report
        return None
    cached = (cfg.cache_root / f"corpus-{corpus_key(cfg, tokenizer, source)}").exists()
    small = source.kind == "files" and sum(f.stat().st_size for f in source.files) <= PREPARE_LIMIT_BYTES
    if not (cached or small):
        return None
    corpus = _quietly(load_corpus, cfg, tokenizer)
    heldout_ids = corpus.split(cfg.val_fraction)[1]
    heldout = HeldOut(corpus, heldout_ids, eos_id=tokenizer.eos_id, val_fraction=cfg.val_fraction)
    what = held_out_summary(heldout, corpus.num_documents, cfg.val_fraction)
    if cfg.val_segments > 0:
        heldout.segments(1, cfg.seq_len)
    if cfg.val_sequences > 0:
        long_sequences(heldout, cfg, num_documents=corpus.num_documents)
        what += f": {cfg.val_sequences} sequences of {cfg.long_val_length} tokens ({cfg.val_mode}) fit"
    return what


def held_out_summary(heldout, num_documents: int, val_fraction: float) -> str:
    return (f"{len(heldout.ids)} of {num_documents} documents held out (val_fraction {val_fraction:g}), "
            f"{heldout.stream.length} tokens")


def long_sequences(heldout, cfg: DataConfig, *, num_documents: int):
    """The run's long validation sequences (cfg.val_sequences x cfg.long_val_length in cfg.val_mode); a ValueError
    that names what each val_mode would cut when they do not fit. The DataModule and the dry run both call it, so
    that both say the same line."""
    length = cfg.long_val_length
    try:
        return heldout.long_sequences(cfg.val_sequences, length, cfg.val_mode)
    except ValueError as err:
        raise ValueError(f"{err} ({held_out_summary(heldout, num_documents, cfg.val_fraction)}; at "
                         f"val_length={length} they give {fits(heldout, length)})") from None


def _quietly(build, *args):
    """`datasets`' bars ("Downloading data" for local files, "Generating train split", "tokenizing") kept out of a
    plan: the files are local and the plan's own lines say what was read."""
    from datasets.utils import logging as ds_logging

    was = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        return build(*args)
    finally:
        if was:
            ds_logging.enable_progress_bar()


def fits(heldout, length: int) -> str:
    """How many long sequences of `length` tokens each val_mode can cut from the held-out documents."""
    lens = heldout.lens
    first = int((lens >= length).sum())
    windows = int((lens // length).sum())
    pack = heldout.stream.length // length
    return f"val_mode=first {first}, windows {windows}, pack {pack} sequences"


__all__ = ["PREPARE_LIMIT_BYTES", "fits", "held_out_summary", "heldout_plan", "long_sequences"]
