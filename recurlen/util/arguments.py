"""The command line's one argument style, and `--help` generated from the config dataclasses.

Every command takes `key=value` settings (omegaconf dotlist: `trainer.max_steps=100`, `task.lengths=[256,512]`),
in any order with the few flags it has, which name paths (`--out DIR`, `--checkpoint PATH`), plus
`--dry-run` (validate, resolve and print the plan, then stop), `--debug` (tracebacks for user errors) and
`--help`. Unknown keys fail before any work, with the closest known keys as suggestions.

The help of a command lists each settings dataclass field as `key  type  value  meaning`, the meaning
being the field's docstring (the string literal under the field, as in the dataclasses of this project).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import math
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recurlen.util.errors import UserError

COMMON_FLAGS = {"--dry-run": "validate and resolve everything, print the plan, do nothing else",
                "--debug": "show tracebacks of user errors too (also RECURLEN_DEBUG=1)",
                "--help": "this help"}


@dataclass
class Words:
    """A command line split into flags and words."""

    words: list[str] = field(default_factory=list)
    """Everything that is not a flag, in order: key=value settings and positional paths."""
    paths: dict[str, str] = field(default_factory=dict)
    """Values of the command's path flags, by flag name without dashes (`--out DIR` -> {"out": "DIR"})."""
    dry_run: bool = False
    help: bool = False

    def settings(self) -> list[str]:
        return [w for w in self.words if "=" in w]

    def positional(self) -> list[str]:
        return [w for w in self.words if "=" not in w]


def split_words(argv: Sequence[str], *, path_flags: Mapping[str, str] = (), dry_run: bool = True) -> Words:
    """Flags (in any position) apart from words. Unknown flags are user errors that list the allowed ones."""
    out = Words()
    allowed = [*path_flags, *(f for f in COMMON_FLAGS if dry_run or f != "--dry-run"), "-h"]
    items = list(argv)
    i = 0
    while i < len(items):
        word = items[i]
        i += 1
        if word in ("-h", "--help"):
            out.help = True
        elif word == "--debug":
            continue
        elif word == "--dry-run" and dry_run:
            out.dry_run = True
        elif word.startswith("--"):
            name, _, value = word.partition("=")
            if name not in path_flags:
                hint = suggest(name, allowed)
                raise UserError(f"unknown option {name}{hint}; this command takes {', '.join(allowed)} "
                                "and key=value settings")
            if not value:
                if i >= len(items) or items[i].startswith("--"):
                    raise UserError(f"{name} needs a value ({path_flags[name]})")
                value = items[i]
                i += 1
            out.paths[name[2:].replace("-", "_")] = value
        else:
            out.words.append(word)
    return out


def suggest(word: str, candidates: Iterable[str], *, n: int = 3) -> str:
    """'; did you mean X?' for the closest candidates (also matching on the last dotted part), else ''."""
    candidates = list(dict.fromkeys(candidates))
    close = difflib.get_close_matches(word, candidates, n=n, cutoff=0.6)
    if not close and "." in word:
        tail = word.rsplit(".", 1)[1]
        by_tail = {c.rsplit(".", 1)[-1]: c for c in reversed(candidates)}
        close = [by_tail[t] for t in difflib.get_close_matches(tail, list(by_tail), n=n, cutoff=0.75)]
    if not close:
        tail = word.rsplit(".", 1)[-1]
        close = [c for c in candidates if c.rsplit(".", 1)[-1] == tail][:n]
    return f"; did you mean {' or '.join(close)}?" if close else ""


# ---- dataclass introspection -------------------------------------------------------------------------------


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring (the string literal right under it), for cls and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # source not available (frozen app): no meanings shown
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # pragma: no cover - unresolvable annotation: fall back to the raw strings
        return {f.name: f.type for f in dataclasses.fields(cls)}


def _type_name(cls: type, name: str) -> str:
    raw = next(f.type for f in dataclasses.fields(cls) if f.name == name)
    return raw if isinstance(raw, str) else getattr(raw, "__name__", str(raw))


def _sections(cls: type) -> dict[str, type]:
    return {f.name: _hints(cls)[f.name] for f in dataclasses.fields(cls)
            if dataclasses.is_dataclass(_hints(cls).get(f.name))}


def schema_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key of a (nested) settings dataclass, dotted."""
    keys = []
    for f in dataclasses.fields(cls):
        hint = _hints(cls).get(f.name)
        if dataclasses.is_dataclass(hint):
            keys += schema_keys(hint, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def check_key(key: str, cls: type, *, what: str = "setting", extra: Sequence[str] = ()) -> None:
    """A UserError with suggestions unless `key` (dotted) names a field of cls (or one of `extra`)."""
    if key in extra:
        return
    current: Any = cls
    for part in key.split("."):
        if not dataclasses.is_dataclass(current):
            return  # inside a dict / list / scalar field: omegaconf checks the rest
        names = {f.name for f in dataclasses.fields(current)}
        if part not in names:
            raise UserError(f"unknown {what} {key!r}{suggest(key, [*schema_keys(cls), *extra])} "
                            f"(`--help` lists them all)")
        current = _hints(current).get(part)


def check_dotlist(words: Iterable[str], cls: type, *, what: str = "setting", extra: Sequence[str] = ()) -> None:
    for word in words:
        if "=" not in word:
            raise UserError(f"{word!r} is not a key=value {what} (e.g. {schema_keys(cls)[0]}=...)")
        check_key(word.split("=", 1)[0].lstrip("+~"), cls, what=what, extra=extra)


def _list_typed(hint: Any) -> bool:
    """list[...] or list[...] | None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(typing.get_origin(arg) is list for arg in typing.get_args(hint))
    return typing.get_origin(hint) is list


def as_list(word: str, cls: type) -> str:
    """`KEY=VALUE` for a list setting of cls with a bare VALUE (no brackets) as `KEY=[VALUE]`: trainer.loggers=wandb
    means [wandb] and task.lengths=512 means [512], which omegaconf refuses ("AnyNode is not a ListConfig")."""
    key, sep, value = word.partition("=")
    bare = value.strip()
    if not sep or not bare or bare.startswith("[") or bare.lower() in ("null", "~"):
        return word
    current: Any = cls
    for part in key.lstrip("+~").split("."):
        if not dataclasses.is_dataclass(current):
            return word
        current = _hints(current).get(part)
    return f"{key}=[{value}]" if _list_typed(current) else word


def check_finite(values: Any, *, prefix: str = "", skip: Sequence[str] = ()) -> None:
    """A ValueError naming the first setting that is nan or +-inf, in a plain dict / list of settings (omegaconf's
    to_container of a typed config): the one rule every command's settings go through.

    omegaconf reads `nan` and `inf` as floats for a float setting, and a range check lets them through: `x <= 0`
    is false for nan (a cap of nan memory, a step of nan size), and `x > 0` is true for inf. `prefix` is where the
    settings sit (`fix.forget_more`); keys in `skip` are not looked into (a model's own config)."""

    def walk(value: Any, key: str) -> None:
        if key in skip:
            return
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key} must be a finite number; got {value}")

    walk(values, prefix)


# ---- help text ---------------------------------------------------------------------------------------------


def format_value(value: Any) -> str:
    """A value as a key=value setting writes it (null, true, [a,b])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return str(value)


def settings_help(cls: type, values: Any = None, *, prefix: str = "", skip: Sequence[str] = ()) -> list[str]:
    """Lines `key  type = value  meaning` for every field of cls, nested sections under a heading.

    values: an object or DictConfig with the same shape whose values are shown (default: the fields'
    defaults).
    """
    lines: list[str] = []
    docs = field_docs(cls)
    rows, nested = [], []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if f.name in skip or key in skip:
            continue
        value = _get(values, f.name) if values is not None else _default(f)
        if f.name in _sections(cls):
            nested.append((f, key, value))
            continue
        rows.append((key, f"{_type_name(cls, f.name)} = {format_value(value)}", docs.get(f.name, "")))
    width_key = max((len(r[0]) for r in rows), default=0)
    width_type = max((len(r[1]) for r in rows), default=0)
    for key, kind, doc in rows:
        lines.append(f"  {key:<{width_key}}  {kind:<{min(width_type, 34)}}  {doc}".rstrip())
    for f, key, value in nested:
        sub = _sections(cls)[f.name]
        title = docs.get(f.name, "")
        lines += ["", f" {key}:" + (f"  {title}" if title else "")]
        lines += settings_help(sub, value, prefix=key + ".", skip=skip)
    return lines


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _get(values: Any, name: str) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(values, DictConfig):
        node = values.get(name)
        return OmegaConf.to_container(node, resolve=False) if isinstance(node, ListConfig) else node
    return getattr(values, name, None)


def render_help(usage: str, description: str, sections: Sequence[tuple[str, Sequence[str]]],
                flags: Mapping[str, str]) -> str:
    lines = [f"usage: {usage}", "", description.strip(), ""]
    width = max(len(f) for f in [*flags, *COMMON_FLAGS])
    for name, meaning in {**flags, **COMMON_FLAGS}.items():
        lines.append(f"  {name:<{width}}  {meaning}")
    for title, body in sections:
        lines += ["", title] + list(body)
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["Words", "as_list", "check_dotlist", "check_finite", "check_key", "field_docs", "format_value",
           "render_help", "schema_keys", "settings_help", "split_words", "suggest"]
