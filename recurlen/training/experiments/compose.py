"""Compose an experiment from experiments/*.yaml, group choices and CLI dotlist overrides.

    recurlen finetune model=780m intervention=tbptt trainer.max_steps=1000

`experiment=NAME` picks experiments/NAME.yaml (a subcommand gives the default). A `group=choice`
argument whose group is a folder of experiments/ (model, intervention, data, trainer) picks
experiments/<group>/<choice>.yaml; every other `a.b=c` is an omegaconf dotlist override. A model choice is
a row of the model table (recurlen.models.table), or a file experiments/model/<architecture>/<choice>.yaml
that names a row and changes or adds fields (the demos' slowly decaying initialisations). The result is
validated against the typed schema, so an unknown key or a bad value fails with a message that names it
and says what is allowed.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from recurlen.models import registry, table
from recurlen.training.experiments.schema import GROUPS, ExperimentConfig
from recurlen.training.interventions import layout_for
from recurlen.util.arguments import as_list, check_finite, check_key, schema_keys, suggest


def experiments_dir() -> Path:
    """$RECURLEN_EXPERIMENTS if set; else the experiments/ shipped inside the installed package (a wheel
    install), else the source checkout's experiments/ next to the package (an editable install).
    Never the current directory: a command runs the same from anywhere."""
    env = os.environ.get("RECURLEN_EXPERIMENTS")
    package = Path(__file__).resolve().parents[2]  # recurlen/training/experiments/compose.py -> recurlen/
    candidates = [Path(env)] if env else [package / "experiments", package.parent / "experiments"]
    for c in candidates:
        if (c / "model").is_dir():
            return c
    raise FileNotFoundError(f"no experiments directory found (looked in {[str(c) for c in candidates]}); "
                            "set RECURLEN_EXPERIMENTS to a directory laid out like the project's experiments/")


def available(group: str | None = None, *, root: Path | None = None, pipelines: bool = True) -> list[str]:
    root = root or experiments_dir()
    if group == "model":
        return sorted({*table.names(), *model_files(root)})
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


def _unknown(root: Path, group: str, choice: str) -> ValueError:
    choices = available(group, root=root)
    return ValueError(f"unknown {group} {choice!r}{suggest(choice, choices)}; allowed: {choices}")


def _group_file(root: Path, group: str, choice: str) -> Path:
    path = root / group / f"{choice}.yaml"
    if not path.is_file():
        raise _unknown(root, group, choice)
    return path


def model_files(root: Path | None = None) -> dict[str, Path]:
    """Choice -> experiments/model/<architecture>/<choice>.yaml: models that change or add to a row of the model
    table (a file named like a row changes that row). The folder names the architecture."""
    folder = (root or experiments_dir()) / "model"
    loose = sorted(p.name for p in folder.glob("*.yaml"))
    if loose:
        raise ValueError(f"{folder}: model files {loose} belong in a folder named after their architecture "
                         f"(model/<architecture>/); the model table (recurlen.models.table) holds the plain rows")
    found = {p.stem: p for p in sorted(folder.glob("*/*.yaml"))}
    known = registry.architectures()
    for path in found.values():
        if path.parent.name not in known:
            raise ValueError(f"{path}: its folder {path.parent.name!r} is not an architecture; allowed: "
                             f"{list(known)}")
    return found


def model_choice(choice: str, *, root: Path | None = None) -> DictConfig:
    """The model section that `model=CHOICE` gives: a row of the model table, or a model file on top of the row it
    names (the file's `arch` fields over the row's shape)."""
    root = root or experiments_dir()
    path = model_files(root).get(choice)
    if path is None:
        row = table.find(choice)
        if row is None:
            raise _unknown(root, "model", choice)
        return _row_section(row)
    part = _load_yaml(path)
    architecture = path.parent.name
    if part.get("architecture", architecture) != architecture:
        raise ValueError(f"{path}: architecture {part.architecture!r} is not its folder's ({architecture!r})")
    part.architecture = architecture
    row = table.find(str(part.get("name")))
    if row is None or row.architecture != architecture:
        return part  # 'custom' or a name of another architecture: the schema names the problem
    # The file's values win; its keys keep their place in front (config.yaml reads as the file, then the row).
    return OmegaConf.merge(part, OmegaConf.merge(_row_section(row), part))


def _row_section(row: table.ModelRow) -> DictConfig:
    return OmegaConf.create({"name": row.name, "architecture": row.architecture, "pretrained": row.pretrained,
                             "default_data": row.default_data, "pretrain_lr": row.pretrain_lr,
                             "arch": dict(row.shape)})


def parse_overrides(args: list[str], *, schema: type[ExperimentConfig] = ExperimentConfig
                    ) -> tuple[str | None, dict[str, str], list[str]]:
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
            check_key(key.lstrip("+~"), schema, what="key", extra=("experiment", *GROUPS))
            dotlist.append(as_list(arg, schema))
    return experiment, groups, dotlist


def compose(args: list[str], *, default_experiment: str = "finetune", root: Path | None = None,
            schema: type[ExperimentConfig] = ExperimentConfig) -> DictConfig:
    """The merged, unvalidated config (omegaconf), for saving and printing.

    schema: the dataclass the experiment is merged onto (a caller with more sections passes a subclass)."""
    root = root or experiments_dir()
    experiment, choices, dotlist = parse_overrides(list(args), schema=schema)
    experiment = experiment or default_experiment
    defaults, exp = _experiment_file(root, experiment, chain=())
    known = {f.name for f in fields(schema)}
    unknown_sections = sorted(set(exp) - known)
    if unknown_sections:
        raise ValueError(f"experiments/{experiment}.yaml: sections {unknown_sections} are not part of this kind of "
                         f"experiment (it has {sorted(known)}); an experiment with a `task` section runs with its "
                         "task's command, e.g. `recurlen passkey`")
    merged = OmegaConf.structured(schema)
    layout_explicit = any(d.startswith("data.layout=") for d in dotlist) or "layout" in (exp.get("data") or {})
    try:
        for group in GROUPS:
            choice = choices.get(group, defaults.get(group))
            if group == "data" and "data" not in choices and merged.model.default_data:
                choice = merged.model.default_data  # an official model brings its corpus and tokenizer
            if choice is not None:
                if group == "model":
                    part = model_choice(str(choice), root=root)
                else:
                    part = _load_yaml(_group_file(root, group, str(choice)))
                layout_explicit |= group == "data" and "layout" in part
                merged = OmegaConf.merge(merged, {group: part})
        merged = OmegaConf.merge(merged, exp)
        if dotlist:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(dotlist))
        if not layout_explicit:  # the intervention decides how lanes walk the data unless told otherwise
            merged.data.layout = layout_for(merged.intervention.name, merged.intervention.tbptt_over)
        lr_explicit = any(d.startswith("optim.lr=") for d in dotlist)
        if merged.optim.lr_from_pretrain is not None and merged.model.pretrain_lr is not None and not lr_explicit:
            # Post-training at a fraction of the model's own pre-training peak rate (the paper: ~1/10).
            merged.optim.lr = float(merged.model.pretrain_lr) * float(merged.optim.lr_from_pretrain)
    except OmegaConfBaseException as err:
        raise ValueError(f"bad config: {_explain(err, schema)}") from err
    if not merged.name:
        merged.name = experiment
    return merged


def _experiment_file(root: Path, experiment: str, *, chain: tuple[str, ...]) -> tuple[dict, DictConfig]:
    """(group defaults, body) of experiments/<experiment>.yaml, with `base: OTHER` resolved: the file starts
    from OTHER's defaults and body and changes what it states (a chain of bases works the same way)."""
    exp_path = root / f"{experiment}.yaml"
    if not exp_path.is_file():
        names = available(root=root, pipelines=False)
        raise ValueError(f"unknown experiment {experiment!r}{suggest(experiment, names)}; allowed: {names}")
    if experiment in chain:
        raise ValueError(f"experiments {' -> '.join([*chain, experiment])}: `base` goes round in a circle")
    exp = _load_yaml(exp_path)
    if "pipeline" in exp:
        raise ValueError(f"experiments/{experiment}.yaml is a pipeline of several runs; run it with "
                         f"`recurlen {exp.pipeline}` (make {exp.pipeline})")
    defaults = exp.pop("defaults", None)
    defaults = OmegaConf.create() if defaults is None else defaults
    if not isinstance(defaults, DictConfig):
        raise ValueError(f"{exp_path}: 'defaults' must be a mapping group -> choice, e.g. {{model: tiny}}")
    unknown_groups = sorted(set(defaults) - set(GROUPS))
    if unknown_groups:
        raise ValueError(f"{exp_path}: unknown groups in defaults {unknown_groups}; allowed: {list(GROUPS)}")
    defaults = dict(defaults)
    base = exp.pop("base", None)
    if base is None:
        return defaults, exp
    base_defaults, base_exp = _experiment_file(root, str(base), chain=(*chain, experiment))
    return {**base_defaults, **defaults}, OmegaConf.merge(base_exp, exp)


def _explain(err: OmegaConfBaseException, schema: type[ExperimentConfig] = ExperimentConfig) -> str:
    msg = str(err).splitlines()[0]
    key = getattr(err, "full_key", None)
    text = f"{key}: {msg}" if key and key not in msg else msg
    if key and ("not in struct" in msg or "not in dataclass" in msg):
        text += suggest(str(key), schema_keys(schema))
    return text


def to_object(cfg: DictConfig) -> ExperimentConfig:
    """Validate: types via omegaconf, values via the dataclasses' __post_init__, cross-field rules after."""
    _check_finite(cfg)
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:
        raise ValueError(f"bad config: {_explain(err, OmegaConf.get_type(cfg) or ExperimentConfig)}") from err
    obj.validate()
    return obj


def _check_finite(cfg: DictConfig) -> None:
    """No setting is nan or +-inf (recurlen.util.arguments.check_finite: a run with lr=inf diverges at its first
    step). The model's own config is the architecture's business (Mamba-2's dt_limit ends at inf)."""
    try:
        values = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:
        return  # to_object says what is wrong with it
    check_finite(values, skip=("model.config",))


def resolved_config(cfg: ExperimentConfig) -> dict[str, Any]:
    """A validated config as the plain dict that config.yaml and the checkpoints' hyperparameters hold."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def load_experiment(args: list[str], *, default_experiment: str = "finetune",
                    schema: type[ExperimentConfig] = ExperimentConfig) -> tuple[ExperimentConfig, dict[str, Any]]:
    cfg = compose(args, default_experiment=default_experiment, schema=schema)
    obj = to_object(cfg)
    return obj, OmegaConf.to_container(cfg, resolve=True)
