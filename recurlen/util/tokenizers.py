"""Tokenizers: bytes for the embedded corpus, and any local Hugging Face tokenizer.

The official Mamba-2 checkpoints use GPT-NeoX-20B's tokenizer (vocab 50277, EOS "<|endoftext|>" = 0);
point `load_tokenizer` at a tokenizer.json or a directory holding one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from recurlen.util.errors import UserError


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...
    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus an end-of-document id 256. Any string encodes; any ids decode."""

    name = "bytes"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        # surrogateescape: text read with errors="surrogateescape" gets its raw bytes back.
        return list(text.encode("utf-8", errors="surrogateescape"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A `tokenizers` tokenizer.json (fast path) or, failing that, transformers' AutoTokenizer."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path).expanduser()
        file = path / "tokenizer.json" if path.is_dir() else path
        self.name = str(path)
        if file.is_file():
            from tokenizers import Tokenizer as FastTokenizer

            try:
                self._tok = FastTokenizer.from_file(str(file))
            except Exception as err:  # the tokenizers library raises a bare Exception for a malformed file
                first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
                raise UserError(f"{file} is not a valid tokenizer.json ({first}); use the file the model was "
                                "trained with, or data.tokenizer=bytes") from err
            self._hf = None
            self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
            self.eos_id = self._find_eos(path if path.is_dir() else path.parent)
        elif path.is_dir():
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            self._tok = None
            self.vocab_size = len(self._hf)
            if self._hf.eos_token_id is None:
                raise ValueError(f"tokenizer at {path} defines no EOS token; recurlen separates documents with it")
            self.eos_id = int(self._hf.eos_token_id)
        else:
            raise FileNotFoundError(f"no tokenizer at {path}: expected tokenizer.json or a tokenizer directory")

    def _find_eos(self, directory: Path) -> int:
        names = []
        for cfg_name in ("tokenizer_config.json", "special_tokens_map.json"):
            cfg = directory / cfg_name
            if cfg.is_file():
                tok = json.loads(cfg.read_text()).get("eos_token")
                if isinstance(tok, dict):
                    tok = tok.get("content")
                if tok:
                    names.append(tok)
        names += ["<|endoftext|>", "</s>", "<eos>"]
        for tok in names:
            tid = self._tok.token_to_id(tok)
            if tid is not None:
                return tid
        raise ValueError(f"tokenizer {self.name} has none of the EOS tokens {names}; recurlen needs one")

    def encode(self, text: str) -> list[int]:
        if self._tok is not None:
            return self._tok.encode(text, add_special_tokens=False).ids
        return self._hf.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._tok is not None:
            return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]
        return [self._hf.encode(t, add_special_tokens=False) for t in texts]

    def decode(self, ids: list[int]) -> str:
        if self._tok is not None:
            return self._tok.decode(list(ids), skip_special_tokens=False)
        return self._hf.decode(list(ids))


def load_tokenizer(spec: str) -> Tokenizer:
    """'bytes', a tokenizer.json path, a tokenizer directory, or a hub id found in the local HF cache."""
    if spec in ("bytes", "byte"):
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if path.exists():
        return HFTokenizer(path)
    if spec.count("/") == 1:
        from recurlen.util.hub import resolve_pretrained_dir

        return HFTokenizer(resolve_pretrained_dir(spec))
    raise ValueError(f"unknown tokenizer {spec!r}; allowed: 'bytes', a tokenizer.json file, a tokenizer directory, "
                     "or a hub id in the local cache")


def check_vocab_fits(tokenizer: Tokenizer, model_vocab_size: int) -> None:
    if tokenizer.vocab_size > model_vocab_size:
        raise ValueError(f"tokenizer {tokenizer.name!r} has {tokenizer.vocab_size} ids but the model's vocabulary "
                         f"holds {model_vocab_size}; use a model with vocab_size >= {tokenizer.vocab_size}")


class UsesTokenizer:
    """What the training loop asks of a DataModule about its tokenizer (the data and the task modules share it)."""

    tokenizer: Tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    def check_model_vocab(self, model_vocab_size: int) -> None:
        """ValueError if the tokenizer produces ids the model has no embedding row for."""
        check_vocab_fits(self.tokenizer, model_vocab_size)
