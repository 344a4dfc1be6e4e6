"""Data configuration: where the corpus comes from, how lanes walk it, what is held out."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LAYOUTS = ("documents", "contiguous", "independent", "packed")
TOKENIZE = ("auto", "all", "needed")
NEEDED_ABOVE_BYTES = 256 << 20
"""tokenize='auto' reads local sources larger than this as far as the run needs (tokenize='needed'); smaller ones,
the embedded corpus and hub datasets are tokenized whole, as before (their lanes spread over the whole corpus)."""
VAL_MODES = ("first", "pack", "windows")
# How much longer than seq_len the long validation sequences are unless val_length says otherwise.
DEFAULT_VAL_LENGTH_FACTOR = 16


@dataclass
class DataConfig:
    source: str = "embedded"
    """'embedded' (stdlib .py), .txt/.json(l)/.parquet/.csv file, glob or dir, save_to_disk dir, or 'hf:<name>'."""
    hf_config: str | None = None
    """Configuration (subset) of an 'hf:' dataset, e.g. 'wikitext-103-raw-v1'."""
    split: str = "train"
    """Split read from an 'hf:' dataset or a saved DatasetDict; held-out documents are then chosen by hash."""
    text_field: str = "text"
    """Column holding each document's text (string, or bytes for the byte tokenizer)."""
    id_field: str | None = None
    """Column whose value decides a document's split by hash; None hashes the text itself."""
    tokenizer: str = "bytes"
    """'bytes', a tokenizer.json, a tokenizer directory, or a hub id in the local cache."""
    seq_len: int = 256
    """Tokens per training segment (each segment reads seq_len + 1 tokens for the shifted targets)."""
    batch_size: int = 8
    """Lanes (batch rows) per rank; global lanes = batch_size * world_size."""
    layout: str = "contiguous"
    """'documents': each lane walks whole documents segment by segment, a new document flagged (TBTT);
    'contiguous': lanes continue an EOS-joined stream of documents step after step (TBTT's window form);
    'independent': fresh random segments each step;
    'packed': the contiguous layout's rows with each document's start flagged (`resets`): the model zeroes the state
    there, so every document is read from zeros (TBTT carries a document on into the next row), no padding.
    The intervention picks the layout unless it is set."""
    seed: int = 0
    """Seeds the per-epoch document order and the independent layout's segment order."""
    val_fraction: float = 0.05
    """Share of documents held out, decided by a hash of the document id, so it is the same in every run."""
    val_segments: int = 64
    """Fixed held-out seq_len + 1 segments in val_dataloader (split across ranks); 0 disables it."""
    val_length: int | None = None
    """Length of the long validation sequences; None means 16 * seq_len."""
    val_sequences: int = 4
    """Number of long validation sequences; 0 disables them."""
    val_mode: str = "first"
    """'first': starts of distinct long held-out documents; 'pack': held-out documents joined with EOS, cut."""
    num_workers: int = 0
    """DataLoader worker processes for the train loader (batches stay in step order with any number)."""
    num_proc: int | None = None
    """Processes for tokenization (`Dataset.map(num_proc=...)`) when the corpus cache is built."""
    cache_dir: str | None = None
    """Token cache; None uses $RECURLEN_CACHE or ~/.cache/recurlen."""
    max_documents: int | None = None
    """Read at most this many documents (the first ones; needed to bound a streamed corpus)."""
    streaming: bool = False
    """Stream the source instead of downloading / preparing it whole (use with max_documents)."""
    tokenize: str = "auto"
    """'all': tokenize the whole source before the first step (lanes spread over all of it); 'needed': tokenize, in
    source order, only as far as the run's steps and held-out set read (lanes walk the source from its start, see
    lanes.py; a longer or resumed run extends the cache); 'auto': 'needed' for local jsonl / parquet / text sources
    above 256 MB, else 'all'."""
    pin_memory: bool = True
    """Pin batches in page-locked memory when CUDA is available."""

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"source={self.source!r} is empty; allowed: 'embedded', a path or glob, or 'hf:<name>'")
        if self.source.startswith("hf:") and not self.source[3:].strip():
            raise ValueError(f"source={self.source!r} names no dataset; write 'hf:<name>', e.g. 'hf:pg19'")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} is not supported; allowed: {list(LAYOUTS)}")
        if self.tokenize not in TOKENIZE:
            raise ValueError(f"tokenize={self.tokenize!r} is not supported; allowed: {list(TOKENIZE)}")
        if self.val_mode not in VAL_MODES:
            raise ValueError(f"val_mode={self.val_mode!r} is not supported; allowed: {list(VAL_MODES)}")
        if not self.text_field:
            raise ValueError("text_field is empty; name the column that holds the document text")
        for name in ("seq_len", "batch_size"):
            _require_int(name, getattr(self, name), minimum=1)
        for name in ("val_segments", "val_sequences", "num_workers"):
            _require_int(name, getattr(self, name), minimum=0)
        for name in ("val_length", "num_proc", "max_documents"):
            if getattr(self, name) is not None:
                _require_int(name, getattr(self, name), minimum=1, none_ok=True)
        _require_int("seed", self.seed, minimum=0)
        if not 0.0 <= float(self.val_fraction) < 1.0:
            raise ValueError(f"val_fraction={self.val_fraction!r} is out of range; allowed: 0 <= val_fraction < 1")

    @property
    def long_val_length(self) -> int:
        """val_length, or its default of 16 * seq_len."""
        return self.val_length if self.val_length is not None else DEFAULT_VAL_LENGTH_FACTOR * self.seq_len

    @property
    def cache_root(self) -> Path:
        root = self.cache_dir or os.environ.get("RECURLEN_CACHE") or "~/.cache/recurlen"
        return Path(root).expanduser()


def _require_int(name: str, value: object, *, minimum: int, none_ok: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = f"an integer >= {minimum}" + (" or None" if none_ok else "")
        raise ValueError(f"{name}={value!r} is not allowed; need {allowed}")


__all__ = ["DEFAULT_VAL_LENGTH_FACTOR", "LAYOUTS", "NEEDED_ABOVE_BYTES", "TOKENIZE", "VAL_MODES", "DataConfig"]
