"""The model table: every named model recurlen knows, one typed row each.

A row says everything a name stands for: its architecture, its shape (fields of that architecture's config),
where the official weights live and what they were trained with. `model=NAME` composes a model section from its
row, `Architecture.preset(name)` builds its config, and `official(directory)` says which official checkpoint a
hub id or a directory is. Rows name their architecture by its registry name (a string): this module sits below
the architecture folders and imports none of them.

A new architecture is one folder of recurlen/models/ plus one group of rows here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class ModelRow:
    """One named model."""

    name: str
    """The choice `model=NAME` (make: MODEL=NAME). Mamba-2's names are bare (tiny, 780m); the other architectures'
    start with the architecture's name (mamba1-790m, gla-340m)."""
    architecture: str
    """Registry name of its architecture (recurlen.models.registry): mamba2, mamba1, gla."""
    shape: Mapping[str, Any]
    """Fields of the architecture's config; fields not given keep the config's defaults."""
    hub_id: str | None = None
    """The official checkpoint on the Hugging Face hub; None for the CPU shapes, trained from scratch."""
    hub_file: str | None = None
    """The weights file inside the hub repository, where the repository holds several models' files (one .pth per
    size, as BlinkDL's do); None where the repository is the checkpoint directory."""
    tokenizer: str = "bytes"
    """The tokenizer it was trained with: 'bytes', or a hub id whose files hold the tokenizer."""
    pretrain_lr: float | None = None
    """Peak learning rate of its pre-training where it is recorded; post-training takes a fraction of it."""
    train_seq_len: int | None = None
    """The context it was pre-trained at (what 'past T' means for it); None where the user trains it."""
    default_data: str | None = None
    """The data group it is trained on unless the command line picks one (experiments/data/<group>.yaml)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", MappingProxyType(dict(self.shape)))  # rows are shared: never mutated
        if (self.hub_id is None) != (self.train_seq_len is None):
            raise ValueError(f"model {self.name!r}: an official checkpoint (hub_id) states its training context "
                             f"(train_seq_len) and a CPU shape states neither; got hub_id={self.hub_id!r}, "
                             f"train_seq_len={self.train_seq_len!r}")
        if self.pretrain_lr is not None and not self.pretrain_lr > 0:
            raise ValueError(f"model {self.name!r}: pretrain_lr must be > 0 or None; got {self.pretrain_lr}")

    @property
    def pretrained(self) -> str | None:
        """What `model=NAME` loads: the hub id, or `hub_id/hub_file` for one file of a repository of several."""
        if self.hub_id is None or self.hub_file is None:
            return self.hub_id
        return f"{self.hub_id}/{self.hub_file}"

    @property
    def size(self) -> str:
        """The name without its architecture's prefix (mamba1-790m -> 790m), as the architecture's own presets
        are named (`registry.get('mamba1').preset('790m')`)."""
        return self.name.removeprefix(f"{self.architecture}-")


# GPT-NeoX-20B's tokenizer (state-spaces/mamba-* and mamba2-* hold none of their own).
_NEOX = "EleutherAI/gpt-neox-20b"
# The Llama-2 tokenizer the fla-hub GLA checkpoints hold (the 1.3B's files are the same as the 340M's).
_LLAMA2 = "fla-hub/gla-340M-15B"
# Every official checkpoint below was pre-trained at context 2048 (the Mamba and Mamba-2 papers; fla-hub's cards).
_PILE = dict(tokenizer=_NEOX, train_seq_len=2048, default_data="pile")
_PILE_GLA = dict(tokenizer=_LLAMA2, train_seq_len=2048, default_data="pile-gla")

# What the official shapes of one architecture share.
_MAMBA2 = dict(vocab_size=50277, pad_vocab_size_multiple=16, d_state=128, headdim=64, expand=2, ngroups=1,
               chunk_size=256)  # embedding padded 50277 -> 50288
_MAMBA1 = dict(vocab_size=50277, pad_vocab_size_multiple=8, d_state=16, expand=2)  # 50277 -> 50280
_GLA = dict(num_hidden_layers=24, num_heads=4, vocab_size=32000)
# BlinkDL's RWKV-6 world models (BlinkDL/rwkv-6-world, RWKV-x060-World-*-v2.1-*-ctx4096.pth): heads of 64, key and
# value dims = hidden, channel mix 3.5 x hidden, the world tokenizer (65536 ids, shipped in the `rwkv` package),
# trained at context 4096 (the files' ctx4096). Their .pth holds no config; ln_x's eps is BlinkDL's 64e-5.
_RWKV6 = dict(vocab_size=65536, expand_k=1.0, expand_v=1.0, hidden_ratio=3.5, head_norm_eps=64e-5)
_WORLD = dict(hub_id="BlinkDL/rwkv-6-world", tokenizer="package:rwkv/rwkv_vocab_v20230424.txt", train_seq_len=4096,
              default_data="pile-world")
# BlinkDL's RWKV-7 world models (BlinkDL/rwkv-7-world, RWKV-x070-World-*-ctx4096.pth): heads of 64, channel mix
# 4 x hidden, the same world tokenizer and context. The low ranks are those of fla-hub/rwkv7-0.4B-world and
# fla-hub/rwkv7-1.5B-world's config.json (the same weights converted); the 0.1B and 2.9B files have no row here: their
# ranks could not be confirmed (a file's own shape is read off its weights when it is loaded, row or not).
_RWKV7 = dict(vocab_size=65536, head_dim=64, hidden_ratio=4, head_norm_eps=64e-5)
_WORLD7 = dict(_WORLD, hub_id="BlinkDL/rwkv-7-world")

MODELS: tuple[ModelRow, ...] = (
    # ---- Mamba-2. CPU shapes: byte vocabulary of the embedded corpus.
    ModelRow("nano", "mamba2", dict(d_model=64, n_layer=2, d_state=16, headdim=16, chunk_size=64)),
    ModelRow("tiny", "mamba2", dict(d_model=128, n_layer=2, d_state=64, headdim=32, chunk_size=64)),
    ModelRow("small", "mamba2", dict(d_model=256, n_layer=4, d_state=64, headdim=32, chunk_size=64)),
    # state-spaces/mamba2-*, trained on the Pile. Pre-training peak lr: 5 x GPT-3's for the size (README,
    # "Fine-tuning"): 6e-4, 3e-4, 2.5e-4, 2e-4, 1.6e-4.
    ModelRow("130m", "mamba2", dict(d_model=768, n_layer=24, **_MAMBA2), hub_id="state-spaces/mamba2-130m",
             pretrain_lr=3e-3, **_PILE),
    ModelRow("370m", "mamba2", dict(d_model=1024, n_layer=48, **_MAMBA2), hub_id="state-spaces/mamba2-370m",
             pretrain_lr=1.5e-3, **_PILE),
    ModelRow("780m", "mamba2", dict(d_model=1536, n_layer=48, **_MAMBA2), hub_id="state-spaces/mamba2-780m",
             pretrain_lr=1.25e-3, **_PILE),
    ModelRow("1.3b", "mamba2", dict(d_model=2048, n_layer=48, **_MAMBA2), hub_id="state-spaces/mamba2-1.3b",
             pretrain_lr=1e-3, **_PILE),
    ModelRow("2.7b", "mamba2", dict(d_model=2560, n_layer=64, **_MAMBA2), hub_id="state-spaces/mamba2-2.7b",
             pretrain_lr=8e-4, **_PILE),
    # ---- Mamba-1. CPU shapes: byte vocabulary.
    ModelRow("mamba1-nano", "mamba1", dict(d_model=64, n_layer=2, d_state=8)),
    ModelRow("mamba1-tiny", "mamba1", dict(d_model=128, n_layer=2, d_state=16)),
    # state-spaces/mamba-*, trained on the Pile (no pre-training rate recorded here).
    ModelRow("mamba1-130m", "mamba1", dict(d_model=768, n_layer=24, **_MAMBA1), hub_id="state-spaces/mamba-130m",
             **_PILE),
    ModelRow("mamba1-370m", "mamba1", dict(d_model=1024, n_layer=48, **_MAMBA1), hub_id="state-spaces/mamba-370m",
             **_PILE),
    ModelRow("mamba1-790m", "mamba1", dict(d_model=1536, n_layer=48, **_MAMBA1), hub_id="state-spaces/mamba-790m",
             **_PILE),
    ModelRow("mamba1-1.4b", "mamba1", dict(d_model=2048, n_layer=48, **_MAMBA1), hub_id="state-spaces/mamba-1.4b",
             **_PILE),
    ModelRow("mamba1-2.8b", "mamba1", dict(d_model=2560, n_layer=64, **_MAMBA1), hub_id="state-spaces/mamba-2.8b",
             **_PILE),
    # ---- GLA. CPU shapes: byte vocabulary.
    ModelRow("gla-nano", "gla", dict(hidden_size=64, num_hidden_layers=2, num_heads=2, hidden_ratio=2,
                                     intermediate_size=128)),
    ModelRow("gla-tiny", "gla", dict(hidden_size=128, num_hidden_layers=2, num_heads=2, intermediate_size=256)),
    # fla-hub/gla-*, trained by fla's authors on SlimPajama (15B / 100B tokens); post-trained on the Pile with
    # their tokenizer (no pre-training rate recorded here).
    ModelRow("gla-340m", "gla", dict(hidden_size=1024, tie_word_embeddings=True, **_GLA),
             hub_id="fla-hub/gla-340M-15B", **_PILE_GLA),
    ModelRow("gla-1.3b", "gla", dict(hidden_size=2048, **_GLA), hub_id="fla-hub/gla-1.3B-100B", **_PILE_GLA),
    # ---- Mamba-3 (SISO; mamba-ssm's Mamba3 mixer). CPU shapes: byte vocabulary. No official rows: no released
    # checkpoint in this layout could be confirmed.
    ModelRow("mamba3-nano", "mamba3", dict(d_model=64, n_layer=2, d_state=16, headdim=16, chunk_size=64)),
    ModelRow("mamba3-tiny", "mamba3", dict(d_model=128, n_layer=2, d_state=64, headdim=32, chunk_size=64)),
    # ---- Gated DeltaNet (fla's GatedDeltaNetForCausalLM). CPU shapes: byte vocabulary. No official rows: the
    # paper's authors released no weights, and no fla-hub checkpoint of this layout could be confirmed.
    ModelRow("gated_deltanet-nano", "gated_deltanet", dict(hidden_size=64, num_hidden_layers=2, num_heads=2,
                                                           head_dim=16, intermediate_size=128)),
    ModelRow("gated_deltanet-tiny", "gated_deltanet", dict(hidden_size=128, num_hidden_layers=2, num_heads=2,
                                                           head_dim=32, intermediate_size=256)),
    # ---- RWKV-6 (Finch). CPU shapes: byte vocabulary.
    ModelRow("rwkv6-nano", "rwkv6", dict(hidden_size=64, num_hidden_layers=2, num_heads=2, intermediate_size=128,
                                         proj_low_rank_dim=8, gate_low_rank_dim=16)),
    ModelRow("rwkv6-tiny", "rwkv6", dict(hidden_size=128, num_hidden_layers=2, num_heads=2, intermediate_size=256,
                                         proj_low_rank_dim=16, gate_low_rank_dim=32)),
    ModelRow("rwkv6-1.6b", "rwkv6", dict(hidden_size=2048, num_hidden_layers=24, num_heads=32, proj_low_rank_dim=32,
                                         gate_low_rank_dim=64, **_RWKV6),
             hub_file="RWKV-x060-World-1B6-v2.1-20240328-ctx4096.pth", **_WORLD),
    ModelRow("rwkv6-3b", "rwkv6", dict(hidden_size=2560, num_hidden_layers=32, num_heads=40, proj_low_rank_dim=32,
                                       gate_low_rank_dim=64, **_RWKV6),
             hub_file="RWKV-x060-World-3B-v2.1-20240417-ctx4096.pth", **_WORLD),
    ModelRow("rwkv6-7b", "rwkv6", dict(hidden_size=4096, num_hidden_layers=32, num_heads=64, proj_low_rank_dim=64,
                                       gate_low_rank_dim=128, **_RWKV6),
             hub_file="RWKV-x060-World-7B-v2.1-20240507-ctx4096.pth", **_WORLD),
    # ---- RWKV-7 ("Goose", x070). CPU shapes: byte vocabulary. The nano model (the shared tests') starts with its
    # residual outputs non-zero, so that a fresh one reads its state; the tiny one starts as fla's does.
    ModelRow("rwkv7-nano", "rwkv7", dict(hidden_size=64, num_hidden_layers=2, head_dim=16, intermediate_size=128,
                                         decay_low_rank_dim=8, a_low_rank_dim=8, v_low_rank_dim=8,
                                         gate_low_rank_dim=16, chunk_size=16, zero_residual_init=False)),
    ModelRow("rwkv7-tiny", "rwkv7", dict(hidden_size=128, num_hidden_layers=2, head_dim=32, intermediate_size=256,
                                         decay_low_rank_dim=16, a_low_rank_dim=16, v_low_rank_dim=8,
                                         gate_low_rank_dim=32)),
    ModelRow("rwkv7-0.4b", "rwkv7", dict(hidden_size=1024, num_hidden_layers=24, decay_low_rank_dim=64,
                                         a_low_rank_dim=64, v_low_rank_dim=32, gate_low_rank_dim=128, **_RWKV7),
             hub_file="RWKV-x070-World-0.4B-v2.9-20250107-ctx4096.pth", **_WORLD7),
    ModelRow("rwkv7-1.5b", "rwkv7", dict(hidden_size=2048, num_hidden_layers=24, decay_low_rank_dim=96,
                                         a_low_rank_dim=96, v_low_rank_dim=64, gate_low_rank_dim=256, **_RWKV7),
             hub_file="RWKV-x070-World-1.5B-v3-20250127-ctx4096.pth", **_WORLD7),
)


_ADDED: list[ModelRow] = []
"""Rows of architectures registered from outside recurlen (recurlen.models.registry.register)."""


def add(new_rows: Sequence[ModelRow]) -> None:
    """Name more models (a plug-in architecture's); a name may stand for one model only."""
    taken = {row.name for row in (*MODELS, *_ADDED)}
    clash = sorted(taken & {row.name for row in new_rows})
    if clash:
        raise ValueError(f"model names {clash} are taken; name the models of a new architecture '<architecture>-*'")
    _ADDED.extend(new_rows)


def remove(architecture: str) -> None:
    """Forget the rows added for `architecture` (a plug-in's, when it is unregistered)."""
    _ADDED[:] = [row for row in _ADDED if row.architecture != architecture]


def rows(architecture: str | None = None) -> list[ModelRow]:
    """The table's rows (of one architecture), in table order, then any added ones."""
    return [row for row in (*MODELS, *_ADDED) if architecture is None or row.architecture == architecture]


def names(architecture: str | None = None) -> list[str]:
    """Model names (of one architecture), sorted."""
    return sorted(row.name for row in rows(architecture))


def find(name: str, *, architecture: str | None = None) -> ModelRow | None:
    """The row named `name`; with an architecture, also by its size (mamba1 + 790m -> mamba1-790m)."""
    for row in rows(architecture):
        if name == row.name or (architecture is not None and name == row.size):
            return row
    return None


def official(directory: str | Path) -> ModelRow | None:
    """The official checkpoint a hub id or a checkpoint directory is, by name, never by what it holds: the hub id
    itself, a directory named like the hub repository (.../mamba2-780m), or the repository's snapshot in the
    Hugging Face cache (.../models--state-spaces--mamba2-780m/snapshots/<revision>). None for anything else
    (a directory of one's own, even one named mamba2-780m-long, states nothing about how it was trained). A row
    with a hub_file is named by that file (its repository holds other models too)."""
    path = Path(directory)
    seen = {path.name.lower()}
    if path.parent.name == "snapshots":
        seen.add(path.parent.parent.name.lower())
    for row in rows():
        if row.hub_file is not None:  # one of several files of its repository: only the file names its model
            if path.name.lower() == row.hub_file.lower():
                return row
        elif row.hub_id is not None:
            repo = row.hub_id.lower()
            if seen & {repo.split("/")[-1], "models--" + repo.replace("/", "--")}:
                return row
    return None


__all__ = ["MODELS", "ModelRow", "add", "find", "names", "official", "remove", "rows"]
