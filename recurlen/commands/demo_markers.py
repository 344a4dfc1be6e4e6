"""When a finished demo stage is reused: its done marker (DONE_MARKER in the stage's run directory) records the
arguments it ran with and what it started from (stage_inputs); a stage is done while both still agree with today's
(inputs_agree) and its checkpoint holds the planned steps."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from recurlen.training.run_dir import RunDir, checkpoint_step

DONE_MARKER = "stage_done.json"


def marker_matches(run_dir: Path, args: list[str], inputs: dict | None = None) -> bool | None:
    """Whether the stage's done marker records these arguments and inputs (stage_inputs(args), computed here unless
    given); None when the stage has no marker."""
    marker = run_dir / DONE_MARKER
    if not marker.is_file():
        return None
    recorded = json.loads(marker.read_text())
    return recorded.get("args") == args and inputs_agree(recorded.get("inputs") or {}, inputs or stage_inputs(args),
                                                         args)


def inputs_agree(recorded: dict, current: dict, args: list[str]) -> bool:
    """A finished stage's recorded inputs against today's. The starting checkpoint must be the same file. The
    composed experiment must hold the same values, except that a setting recorded nowhere (one that a newer recurlen
    added) may stand at its default: a new setting's default keeps the old behaviour, so a finished stage is not
    trained again for it. A value that changed, a setting that went away, or a marker that recorded only the
    experiment's fingerprint (an older one) has to agree exactly."""
    if recorded.get("start") != current.get("start"):
        return False
    if recorded.get("experiment") == current.get("experiment"):
        return True
    then, now = recorded.get("config"), current.get("config")
    if not isinstance(then, dict) or not isinstance(now, dict) or set(then) - set(now):
        return False
    if any(then[key] != now[key] for key in then):
        return False
    added = [key for key in now if key not in then]
    if not added:
        return False  # same values, other fingerprint: the fingerprint's form changed; do not guess
    from recurlen.training.experiments.compose import load_experiment

    cfg = load_experiment(list(args))[0]
    return all(_at_default(cfg, key, now[key]) for key in added)


_NO_DEFAULT = object()


def _at_default(cfg, dotted: str, value) -> bool:
    """Whether the setting `dotted` of the composed experiment holds its dataclass field's default."""
    import dataclasses

    *parents, name = dotted.split(".")
    node = cfg
    for part in parents:
        node = getattr(node, part, _NO_DEFAULT)
        if node is _NO_DEFAULT:
            return False
    if not dataclasses.is_dataclass(node):
        return False
    field_ = next((f for f in dataclasses.fields(node) if f.name == name), None)
    if field_ is None:
        return False
    if field_.default is not dataclasses.MISSING:
        default = field_.default
    elif field_.default_factory is not dataclasses.MISSING:
        default = field_.default_factory()
    else:
        return False
    return json.loads(json.dumps(default, default=str)) == value


def _flat_config(cfg) -> dict:
    """The composed experiment as dotted setting -> value, as JSON writes it (what a done marker records)."""
    container = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    flat: dict = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(f"{prefix}{key}.", value)
        else:
            flat[prefix[:-1]] = node

    walk("", container)
    return json.loads(json.dumps(flat, default=str))


def stage_done(run_dir: Path, args: list[str], planned_steps: int, inputs: dict | None = None) -> bool:
    """Done = the marker records these arguments and inputs and the stage's checkpoint reached the planned step."""
    if not marker_matches(run_dir, args, inputs):
        return False
    step = checkpoint_step(RunDir(run_dir).last_checkpoint)
    return step is not None and step >= planned_steps


def stage_inputs(args: list[str]) -> dict:
    """What a stage's result depends on beyond its arguments: the experiment as composed now (its fingerprint and
    its settings; an edited experiment file changes them) and the checkpoint it starts from (a re-run pre-training
    changes it), so that a finished stage is reused only while both are what it was trained from (inputs_agree)."""
    import hashlib

    from recurlen.training.experiments.compose import load_experiment

    cfg = load_experiment(list(args))[0]
    inputs = {"experiment": hashlib.sha256(OmegaConf.to_yaml(OmegaConf.structured(cfg)).encode()).hexdigest()[:16],
              "config": _flat_config(cfg)}
    start = Path(cfg.model.pretrained) if cfg.model.pretrained else None
    if start is not None and start.is_file():
        digest = hashlib.sha256()
        with open(start, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        inputs["start"] = digest.hexdigest()[:16]
    return inputs


__all__ = ["DONE_MARKER", "inputs_agree", "marker_matches", "stage_done", "stage_inputs"]
