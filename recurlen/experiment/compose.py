"""Compose an experiment from experiments/*.yaml, group choices and CLI dotlist overrides.

    recurlen finetune model=780m intervention=tbptt trainer.max_steps=1000

`experiment=NAME` picks experiments/NAME.yaml (a subcommand gives the default). A `group=choice`
argument whose group is a folder of experiments/ (model, intervention, data, trainer) picks
experiments/<group>/<choice>.yaml; every other `a.b=c` is an omegaconf dotlist override. The
result is validated against the typed schema, so an unknown key or a bad value fails with a message
that names it and says what is allowed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from recurlen.cli_args import check_key, schema_keys, suggest
from recurlen.experiment.schema import GROUPS, ExperimentConfig
from recurlen.interventions import LAYOUT_FOR


def experiments_dir() -> Path:
    """$RECURLEN_EXPERIMENTS, else ./experiments, else the one next to the installed package (editable install)."""
    env = os.environ.get("RECURLEN_EXPERIMENTS")
    candidates = [Path(env)] if env else []
    candidates += [Path.cwd() / "experiments", Path(__file__).resolve().parents[2] / "experiments"]
    for c in candidates:
        if (c / "model").is_dir():
            return c
    raise FileNotFoundError(f"no experiments/ directory found (looked in {[str(c) for c in candidates]}); "
                            "run from the repository root or set RECURLEN_EXPERIMENTS")


def available(group: str | None = None, *, root: Path | None = None, pipelines: bool = True) -> list[str]:
    root = root or experiments_dir()
    folder = root if group is None else root / group
    names = sorted(p.stem for p in folder.glob("*.yaml"))
    if group is None and not pipelines:
        names = [n for n in names if "pipeline" not in _load_yaml(folder / f"{n}.yaml")]
    return names


def _load_yaml(path: Path) -> DictConfig:
    try:
        cfg = OmegaConf.load(path)
    except Exception as err:
        raise ValueError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(cfg, DictConfig):
        raise ValueError(f"{path}: must hold a mapping at the top level")
    return cfg


def _group_file(root: Path, group: str, choice: str) -> Path:
    path = root / group / f"{choice}.yaml"
    if not path.is_file():
        choices = available(group, root=root)
        raise ValueError(f"unknown {group} {choice!r}{suggest(choice, choices)}; allowed: {choices}")
    return path


def parse_overrides(args: list[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """Split CLI words into (experiment, group choices, dotlist)."""
    experiment, groups, dotlist = None, {}, []
    for arg in args:
        if "=" not in arg:
            raise ValueError(f"override {arg!r} is not of the form key=value (e.g. model=780m, trainer.max_steps=100)")
        key, value = arg.split("=", 1)
        if key == "experiment":
            experiment = value
        elif key in GROUPS:  # a whole section is never a scalar, so `model=x` always picks a file
            groups[key] = value
        else:
            check_key(key.lstrip("+~"), ExperimentConfig, what="key", extra=("experiment", *GROUPS))
            dotlist.append(arg)
    return experiment, groups, dotlist


def compose(args: list[str], *, default_experiment: str = "finetune", root: Path | None = None) -> DictConfig:
    """The merged, unvalidated config (omegaconf), for saving and printing."""
    root = root or experiments_dir()
    experiment, choices, dotlist = parse_overrides(list(args))
    experiment = experiment or default_experiment
    exp_path = root / f"{experiment}.yaml"
    if not exp_path.is_file():
        names = available(root=root, pipelines=False)
        raise ValueError(f"unknown experiment {experiment!r}{suggest(experiment, names)}; allowed: {names}")
    exp = _load_yaml(exp_path)
    if "pipeline" in exp:
        raise ValueError(f"experiments/{experiment}.yaml is a pipeline of several runs; run it with "
                         f"`recurlen {exp.pipeline}` (make {exp.pipeline})")
    defaults = exp.pop("defaults", None) or {}
    if not isinstance(defaults, DictConfig):
        raise ValueError(f"{exp_path}: 'defaults' must be a mapping group -> choice, e.g. {{model: tiny}}")
    unknown_groups = sorted(set(defaults) - set(GROUPS))
    if unknown_groups:
        raise ValueError(f"{exp_path}: unknown groups in defaults {unknown_groups}; allowed: {list(GROUPS)}")
    merged = OmegaConf.structured(ExperimentConfig)
    layout_explicit = any(d.startswith("data.layout=") for d in dotlist) or "layout" in (exp.get("data") or {})
    try:
        for group in GROUPS:
            choice = choices.get(group, defaults.get(group))
            if group == "data" and "data" not in choices and merged.model.default_data:
                choice = merged.model.default_data  # an official model brings its corpus and tokenizer
            if choice is not None:
                part = _load_yaml(_group_file(root, group, str(choice)))
                layout_explicit |= group == "data" and "layout" in part
                merged = OmegaConf.merge(merged, {group: part})
        merged = OmegaConf.merge(merged, exp)
        if dotlist:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(dotlist))
        if not layout_explicit:  # the intervention decides how lanes walk the data unless told otherwise
            merged.data.layout = LAYOUT_FOR.get(merged.intervention.name, merged.data.layout)
    except OmegaConfBaseException as err:
        raise ValueError(f"bad config: {_explain(err)}") from err
    if not merged.name:
        merged.name = experiment
    return merged


def _explain(err: OmegaConfBaseException) -> str:
    msg = str(err).splitlines()[0]
    key = getattr(err, "full_key", None)
    text = f"{key}: {msg}" if key and key not in msg else msg
    if key and ("not in struct" in msg or "not in dataclass" in msg):
        text += suggest(str(key), schema_keys(ExperimentConfig))
    return text


def to_object(cfg: DictConfig) -> ExperimentConfig:
    """Validate: types via omegaconf, values via the dataclasses' __post_init__, cross-field rules after."""
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:
        raise ValueError(f"bad config: {_explain(err)}") from err
    obj.validate()
    return obj


def load_experiment(args: list[str], *,
                    default_experiment: str = "finetune") -> tuple[ExperimentConfig, dict[str, Any]]:
    cfg = compose(args, default_experiment=default_experiment)
    obj = to_object(cfg)
    return obj, OmegaConf.to_container(cfg, resolve=True)
