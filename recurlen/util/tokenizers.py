"""Tokenizers: bytes for the embedded corpus, any local Hugging Face tokenizer, and vocabulary lists (byte strings
matched greedily, longest first; one may be named as a file shipped in an installed package, read offline).

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


class VocabListTokenizer:
    """A vocabulary file of byte strings, one per line as `<id> <Python str or bytes literal> <length in bytes>`,
    encoded by greedy longest match over UTF-8 bytes (a trie tokenizer: every byte has an id of its own, so any
    string encodes). Such files leave id 0 out: it is the end-of-document id."""

    def __init__(self, path: str | Path) -> None:
        import ast

        path = Path(path)
        self.name = str(path)
        self._id_of: dict[bytes, int] = {}
        self._bytes_of: dict[int, bytes] = {}
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as err:
            raise UserError(f"{path} is not a text vocabulary ({err.reason})") from err
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                head, rest = line.split(" ", 1)
                literal, length = rest.rsplit(" ", 1)
                token = ast.literal_eval(literal)
                token = token.encode("utf-8") if isinstance(token, str) else token
                if not isinstance(token, bytes) or len(token) != int(length):
                    raise ValueError("length does not match")
                tid = int(head)
            except (ValueError, SyntaxError) as err:
                raise UserError(f"{path}:{number} is not `<id> <literal> <length>` ({err})") from err
            self._id_of[token] = tid
            self._bytes_of[tid] = token
        if 0 in self._bytes_of or not self._bytes_of:
            raise UserError(f"{path}: a vocabulary list must leave id 0 (the end of a document) unassigned")
        missing = [b for b in range(256) if bytes([b]) not in self._id_of]
        if missing:
            raise UserError(f"{path}: bytes {missing[:8]} have no id, so not every string encodes")
        self.vocab_size = max(self._bytes_of) + 1
        self.eos_id = 0
        # Per first byte, the token lengths that exist, longest first: the candidates a greedy match tries.
        lengths: dict[int, set[int]] = {}
        for token in self._id_of:
            lengths.setdefault(token[0], set()).add(len(token))
        self._lengths = {b: sorted(ls, reverse=True) for b, ls in lengths.items()}

    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8", errors="surrogateescape")
        ids, i, n = [], 0, len(data)
        while i < n:
            for length in self._lengths[data[i]]:
                tid = self._id_of.get(data[i:i + length]) if i + length <= n else None
                if tid is not None:
                    ids.append(tid)
                    i += length
                    break
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: list[int]) -> str:
        return b"".join(self._bytes_of.get(int(i), b"") for i in ids).decode("utf-8", errors="replace")


def package_file(spec: str) -> Path:
    """`package:<package>/<file>`: a data file shipped inside an installed Python package, found without importing
    the package and without network."""
    import importlib.util

    name, _, file = spec.removeprefix("package:").partition("/")
    found = importlib.util.find_spec(name) if name else None
    if found is None or not found.submodule_search_locations or not file:
        raise UserError(f"tokenizer {spec!r}: no installed Python package {name!r} holding {file!r}; install it "
                        f"(pip install {name}) or point data.tokenizer at the file itself")
    path = Path(next(iter(found.submodule_search_locations))) / file
    if not path.is_file():
        raise UserError(f"tokenizer {spec!r}: the package {name!r} has no file {file!r} ({path})")
    return path


def _is_vocab_list(path: Path) -> bool:
    if not path.is_file() or path.suffix != ".txt":
        return False
    with path.open(encoding="utf-8", errors="replace") as f:
        first = f.readline().split(" ")
    return len(first) >= 3 and first[0].isdigit() and first[1][:1] in ("'", '"', "b")


def load_tokenizer(spec: str) -> Tokenizer:
    """'bytes', a tokenizer.json path, a tokenizer directory, a vocabulary list file (or `package:<pkg>/<file>`, one
    shipped in an installed package), or a hub id found in the local HF cache."""
    if spec in ("bytes", "byte"):
        return ByteTokenizer()
    if spec.startswith("package:"):
        return VocabListTokenizer(package_file(spec))
    path = Path(spec).expanduser()
    if _is_vocab_list(path):
        return VocabListTokenizer(path)
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
