"""transformers' format of the architectures transformers has a class for: config.json of its config class and the
weights under its parameter names, so that `AutoModelForCausalLM.from_pretrained(DIR)` loads the directory.

An architecture declares what its format is (a `TransformersFormat` in its folder: model_type and class name, the
config fields as pairs of names with transformers' defaults, the parameter prefixes transformers names otherwise);
writing, recognising and reading are written once, here. recurlen loads such a directory wherever it takes a
checkpoint (recurlen.models.lm.StatefulLM.from_pretrained): models published in that format can be post-trained.

transformers' embedding has no padding: the vocab_size written is the embedding's rows (padded_vocab_size), and a
directory read back without recurlen_config.json holds that vocabulary unpadded. The padded rows are no tokens the
tokenizer has, yet their logits are ordinary numbers (the head has no bias to push them to -inf): generation_config.json
lists them as `suppress_tokens`, which transformers' `generate` sets to -inf at every step (its
SuppressTokensLogitsProcessor), so that generating never emits an id the tokenizer cannot decode; the logits of a
plain forward pass still hold them, as recurlen's own with score_padded_vocab. recurlen_config.json, written
next to config.json as in the official format, keeps recurlen's exact config (transformers ignores the file).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from recurlen.models import official
from recurlen.models.timescales import prepare_to_write
from recurlen.util.atomic_files import write_text


@dataclass(frozen=True)
class Field:
    theirs: str
    """The field of transformers' config class."""
    ours: str
    """recurlen's config attribute written into it: a field, or a property derived from fields."""
    default: Any
    """transformers' default: what a config.json that leaves the field out means."""
    read_into: str | None = None
    """The recurlen field it is read into when that is not `ours`; a derived `ours` without one is only checked."""


@dataclass(frozen=True)
class TransformersFormat:
    model_type: str
    """config.json's model_type, by which transformers' Auto classes (and recurlen) recognise the format."""
    class_name: str
    """The causal-LM class transformers builds (config.json's architectures)."""
    fields: tuple[Field, ...]
    """The config fields recurlen reads and writes, with transformers' defaults."""
    keys: tuple[tuple[str, str], ...] = ()
    """(recurlen's key prefix, transformers' key prefix) of parameters transformers names otherwise."""
    read_constants: dict[str, Any] = field(default_factory=dict)
    """recurlen config fields every directory of this format implies (e.g. an unpadded vocabulary)."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """transformers fields with the one value recurlen runs: written as such; another value is refused by name."""

    def recognises(self, raw: dict[str, Any]) -> bool:
        return raw.get("model_type") == self.model_type

    # ------------------------------------------------------------------ config.json
    def config_json(self, config: Any) -> dict[str, Any]:
        """transformers' config.json of a recurlen config (the model's own fields; token ids are the caller's)."""
        out: dict[str, Any] = {"architectures": [self.class_name], "model_type": self.model_type}
        for f in self.fields:
            value = getattr(config, f.ours)
            value = list(value) if isinstance(value, tuple) else value
            if value == _plain(f.default) and not _finite(value):
                continue  # JSON has no infinity; left out, the field means transformers' default
            out[f.theirs] = value
        return {**out, **self.fixed}

    def config_from_json(self, raw: dict[str, Any], config_cls: type, *, source: str = "config.json") -> Any:
        """recurlen's config of a transformers config.json; what recurlen cannot run is refused by name."""
        if not self.recognises(raw):
            raise ValueError(f"{source}: model_type is {raw.get('model_type')!r}; need {self.model_type!r}")
        for key, want in self.fixed.items():
            if raw.get(key, want) != want:
                raise ValueError(f"{source}: {key}={raw[key]!r} is not supported (need {want!r})")
        settable = {f.name for f in dataclasses.fields(config_cls) if f.init}
        kwargs, derived = dict(self.read_constants), []
        for f in self.fields:
            target = f.read_into or f.ours
            if target in settable:
                kwargs[target] = _plain(raw.get(f.theirs, f.default))
            else:
                derived.append(f)
        config = config_cls(**kwargs)
        for f in derived:
            got, want = _plain(raw.get(f.theirs, f.default)), getattr(config, f.ours)
            if got != want:
                raise ValueError(f"{source}: {f.theirs}={got!r} does not fit the other fields, which give {want!r}")
        return config

    # ------------------------------------------------------------------ parameter names
    def to_theirs(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {_renamed(k, self.keys): v for k, v in state.items()}

    def to_ours(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {_renamed(k, tuple((b, a) for a, b in self.keys)): v for k, v in state.items()}


def _renamed(key: str, prefixes: tuple[tuple[str, str], ...]) -> str:
    for old, new in prefixes:
        if key.startswith(old):
            return new + key[len(old):]
    return key


def _plain(value: Any) -> Any:
    """JSON values as the configs take them: transformers writes an infinity as {"__float__": "Infinity"}."""
    if isinstance(value, dict) and set(value) == {"__float__"}:
        return float(value["__float__"])
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _finite(value: Any) -> bool:
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


GENERATION_CONFIG_NAME = "generation_config.json"


def generation_config(config: Any, token_ids: dict[str, Any]) -> dict[str, Any]:
    """transformers' generation_config.json: the token ids, and the padded vocabulary's rows as suppress_tokens."""
    rows = getattr(config, "padded_vocab_size", config.vocab_size)
    padded = list(range(config.vocab_size, rows))
    return {**token_ids, **({"suppress_tokens": padded} if padded else {})}


def save(model: nn.Module, directory: str | Path, fmt: TransformersFormat, *, dtype: torch.dtype = torch.float32,
         weights: str | None = None, extra: dict[str, Any] | None = None) -> Path:
    """config.json (+ `extra` fields, e.g. token ids), generation_config.json (those ids, the padded rows never
    generated) and the weights under transformers' names; weights: 'safetensors' (default) or 'bin'. The tied head
    is left out of a safetensors file, as transformers does."""
    prepare_to_write(model)  # a fix's scale is folded into the weights or refused, never dropped
    tied = getattr(model.config, model.official.tie_flag)
    config_json = {**fmt.config_json(model.config), "dtype": str(dtype).removeprefix("torch."), **(extra or {})}
    path = official.write_checkpoint(
        directory, config_json=config_json, recurlen_config=model.config.to_dict(),
        state=fmt.to_theirs(model.state_dict()), weights=official.weights_file(weights, official.SAFETENSORS_NAME),
        dtype=dtype, tied_key="lm_head.weight" if tied else None)
    generation = generation_config(model.config, extra or {})
    if generation:
        write_text(Path(directory) / GENERATION_CONFIG_NAME, json.dumps(generation, indent=2))
    return path


def read(directory: Path, model_cls: type, fmt: TransformersFormat) -> tuple[Any, dict[str, torch.Tensor]]:
    """(recurlen config, recurlen-named weights) of a transformers-format directory."""
    config = official.read_config(directory, model_cls.config_cls,
                                  from_json=lambda raw, source: fmt.config_from_json(raw, model_cls.config_cls,
                                                                                     source=source))
    return config, fmt.to_ours(official.read_state_dict(directory, model_cls.official))


__all__ = ["GENERATION_CONFIG_NAME", "Field", "TransformersFormat", "generation_config", "read", "save"]
