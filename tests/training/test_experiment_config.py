"""Experiment composition: every YAML composes and instantiates; bad keys and values name themselves."""

import re

import pytest
import torch
from omegaconf import OmegaConf

from recurlen import Mamba2LM
from recurlen.evaluation.tasks.config import TaskExperimentConfig
from recurlen.models import registry, table
from recurlen.training.experiments import compose as composition
from recurlen.training.experiments.compose import available, compose, experiments_dir, load_experiment, to_object
from recurlen.training.experiments.schema import GROUPS, ExperimentConfig


def _leaves(node, prefix=""):
    """Dotted key -> value of every leaf of a YAML mapping (lists compared whole)."""
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _get(resolved, dotted):
    for key in dotted.split("."):
        resolved = resolved[key]
    return list(resolved) if isinstance(resolved, tuple) else resolved


def _yaml(path):
    return OmegaConf.to_container(OmegaConf.load(path))


def _group_values(group, choice):
    """What a group choice states: its file, or for a model its row of the model table with its file on top."""
    if group == "model":
        return _leaves(OmegaConf.to_container(composition.model_choice(choice)))
    return _leaves(_yaml(experiments_dir() / group / f"{choice}.yaml"))


def _own_values(name):
    """What experiments/<name>.yaml states itself, over what its `base` chain states."""
    raw = _yaml(experiments_dir() / f"{name}.yaml")
    defaults, values = raw.pop("defaults", {}), {}
    if "base" in raw:
        base_defaults, values = _own_values(raw.pop("base"))
        defaults = {**base_defaults, **defaults}
    return defaults, {**values, **_leaves(raw)}


@pytest.mark.parametrize("experiment", available(pipelines=False))
def test_every_experiment_composes_to_what_its_file_says(experiment):
    defaults, values = _own_values(experiment)
    schema = TaskExperimentConfig if "task.name" in values else ExperimentConfig
    cfg, resolved = load_experiment([f"experiment={experiment}"], schema=schema)
    assert isinstance(cfg, schema) and resolved["name"] == experiment
    for group, choice in defaults.items():
        for key, value in _group_values(group, choice).items():
            if f"{group}.{key}" not in values:  # the experiment's own value wins over its group file's
                assert _get(resolved, f"{group}.{key}") == value, (group, key)
    assert values, experiment
    for key, value in values.items():
        assert _get(resolved, key) == value, key


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_choice_composes_to_its_file(group):
    choices = available(group)
    assert choices, f"experiments/{group}/ has no choices"
    for choice in choices:
        cfg, resolved = load_experiment([f"{group}={choice}"])
        own = _group_values(group, choice)
        assert own, (group, choice)
        _, experiment_values = _own_values("finetune")
        for key, value in own.items():
            if f"{group}.{key}" not in experiment_values and not (group == "data" and key == "layout"):
                assert _get(resolved, f"{group}.{key}") == value, (group, choice, key)


def test_experiments_inherit_from_experiments(tmp_path):
    for group, choice in (("intervention", "none"), ("intervention", "tbptt"), ("data", "embedded"),
                          ("trainer", "cpu")):  # model nano is a row of the model table, in no file
        (tmp_path / group).mkdir(exist_ok=True)
        (tmp_path / group / f"{choice}.yaml").write_text((experiments_dir() / group / f"{choice}.yaml").read_text())
    (tmp_path / "a.yaml").write_text("defaults: {model: nano, intervention: none, data: embedded}\n"
                                     "optim: {lr: 0.1, warmup_steps: 7}\ntrainer: {max_steps: 9}\n")
    (tmp_path / "b.yaml").write_text("base: a\ndefaults: {intervention: tbptt}\noptim: {lr: 0.2}\n")
    (tmp_path / "c.yaml").write_text("base: b\ntrainer: {max_steps: 11}\n")
    c = to_object(compose(["experiment=c"], root=tmp_path))
    assert (c.name, c.optim.lr, c.optim.warmup_steps, c.trainer.max_steps) == ("c", 0.2, 7, 11)
    assert (c.intervention.name, c.model.name, c.data.layout) == ("tbptt", "nano", "documents")
    (tmp_path / "a.yaml").write_text("base: c\n")
    with pytest.raises(ValueError, match=r"c -> b -> a -> c: `base` goes round in a circle"):
        compose(["experiment=c"], root=tmp_path)
    (tmp_path / "d.yaml").write_text("base: nowhere\n")
    with pytest.raises(ValueError, match=r"unknown experiment 'nowhere'"):
        compose(["experiment=d"], root=tmp_path)


def test_task_experiments_need_the_task_schema():
    with pytest.raises(ValueError, match=r"sections \['task'\] are not part of this kind of experiment"):
        load_experiment(["experiment=passkey"])
    assert load_experiment(["experiment=passkey"], schema=TaskExperimentConfig)[0].task.name == "passkey"


def test_pipelines_load_and_refuse_single_run_composition():
    from recurlen.commands.demo import load_demo_config

    assert set(available()) - set(available(pipelines=False)) == {"arbiter", "demo"}
    demo = load_demo_config(["eval.num_sequences=8"])
    assert demo.eval.num_sequences == 8 and len(demo.interventions) == 5
    with pytest.raises(ValueError, match="is a pipeline of several runs; run it with `recurlen demo`"):
        compose(["experiment=demo"])
    with pytest.raises(ValueError, match="is a pipeline of several runs; run it with `recurlen arbiter`"):
        compose(["experiment=arbiter"])
    with pytest.raises(ValueError, match="unknown demo setting .eval.lenght.; did you mean eval.length"):
        load_demo_config(["eval.lenght=3"])


@pytest.mark.parametrize("row", table.rows(), ids=lambda row: row.name)
def test_a_model_choice_is_its_row_of_the_model_table(row):
    cfg, _ = load_experiment([f"model={row.name}"])
    m = cfg.model
    assert (m.name, m.architecture, m.pretrained, m.default_data, m.pretrain_lr) == (
        row.name, row.architecture, row.pretrained, row.default_data, row.pretrain_lr)
    assert row.pretrained == (row.hub_id if row.hub_file is None else f"{row.hub_id}/{row.hub_file}")
    assert m.config == registry.get(row.architecture).config_cls(**row.shape)
    # The data the row brings is tokenized as the model was trained.
    assert cfg.data.tokenizer == row.tokenizer
    assert cfg.optim.lr == (1e-4 if row.pretrain_lr is None else row.pretrain_lr * 0.1)


def test_the_official_rows_are_the_published_checkpoints():
    official = {row.name: (row.hub_id, row.train_seq_len, row.pretrain_lr) for row in table.rows() if row.hub_id}
    assert official == {
        "130m": ("state-spaces/mamba2-130m", 2048, 3e-3), "370m": ("state-spaces/mamba2-370m", 2048, 1.5e-3),
        "780m": ("state-spaces/mamba2-780m", 2048, 1.25e-3), "1.3b": ("state-spaces/mamba2-1.3b", 2048, 1e-3),
        "2.7b": ("state-spaces/mamba2-2.7b", 2048, 8e-4),
        **{f"mamba1-{size}": (f"state-spaces/mamba-{size}", 2048, None)
           for size in ("130m", "370m", "790m", "1.4b", "2.8b")},
        "gla-340m": ("fla-hub/gla-340M-15B", 2048, None), "gla-1.3b": ("fla-hub/gla-1.3B-100B", 2048, None),
        **{f"rwkv6-{size}": ("BlinkDL/rwkv-6-world", 4096, None) for size in ("1.6b", "3b", "7b")},
        **{f"rwkv7-{size}": ("BlinkDL/rwkv-7-world", 4096, None) for size in ("0.4b", "1.5b")}}
    # The CPU rows: every architecture's nano and tiny shapes (the tests and the demo need both), and Mamba-2's small.
    cpu = {f"{arch.prefix}{size}" for arch in registry.architectures().values() for size in ("nano", "tiny")}
    assert {row.name for row in table.rows() if not row.hub_id} == cpu | {"small"}
    assert all(row.architecture in registry.architectures() for row in table.rows())
    # A directory's name says which checkpoint it is; a repository of several models' files names each by its file.
    repos = [(row.hub_id.split("/")[1].lower(), row.hub_file) for row in table.rows() if row.hub_id]
    assert len(set(repos)) == len(repos)


def test_model_files_change_the_row_they_name():
    from recurlen.commands.demo import demo_architectures

    files = composition.model_files()
    for name, path in files.items():  # in its architecture's folder, named <prefix><row>-*, changing that row
        arch = registry.get(path.parent.name)
        row = table.find(OmegaConf.load(path).name, architecture=arch.name)
        assert row is not None and name.startswith(f"{row.name}-"), (name, path)
    # Every demo's slowly decaying model is one of them (each architecture's prefix: Mamba-2's is bare).
    assert {f"{registry.get(a).prefix}tiny-slow" for a in demo_architectures()} <= set(files)
    assert "tiny-slow" in files
    slow, _ = load_experiment(["model=mamba1-tiny-slow"])
    assert slow.model.name == "mamba1-tiny" and slow.model.architecture == "mamba1"
    assert slow.model.config == registry.get("mamba1").preset(
        "tiny", chunk_size=8, A_init_range=[0.001, 0.1], A_init_log_uniform=True)
    assert set(available("model")) == set(table.names()) | set(files)


def test_model_files_live_in_their_architecture_folder(tmp_path):
    (tmp_path / "model" / "gla").mkdir(parents=True)
    (tmp_path / "model" / "gla" / "wide.yaml").write_text("name: gla-tiny\narch: {hidden_size: 256}\n")
    (tmp_path / "a.yaml").write_text("defaults: {model: wide}\n")
    assert to_object(compose(["experiment=a"], root=tmp_path)).model.config.hidden_size == 256
    other = next(name for name in registry.architectures() if name != "gla")
    (tmp_path / "model" / "gla" / "wide.yaml").write_text(f"name: gla-tiny\narchitecture: {other}\n")
    with pytest.raises(ValueError, match=rf"wide.yaml: architecture '{other}' is not its folder's \('gla'\)"):
        compose(["experiment=a"], root=tmp_path)
    (tmp_path / "model" / "rwkv").mkdir()
    (tmp_path / "model" / "rwkv" / "x.yaml").write_text("name: x\n")
    allowed = re.escape(str(list(registry.architectures())))
    with pytest.raises(ValueError, match=rf"its folder 'rwkv' is not an architecture; allowed: {allowed}"):
        compose(["experiment=a"], root=tmp_path)
    (tmp_path / "model" / "rwkv" / "x.yaml").unlink()
    (tmp_path / "model" / "780m.yaml").write_text("name: 780m\n")
    with pytest.raises(ValueError, match=r"model files \['780m.yaml'\] belong in a folder named after their "):
        compose(["experiment=a"], root=tmp_path)


def test_small_model_presets_instantiate():
    for name in ("nano", "tiny", "small"):
        cfg, _ = load_experiment([f"model={name}"])
        model = Mamba2LM(cfg.model.config)
        logits, state = model(torch.zeros(1, 3, dtype=torch.long))
        assert logits.shape == (1, 3, 257)


def test_overrides_and_defaults():
    cfg, resolved = load_experiment(["model=780m", "intervention=state_passing", "trainer.max_steps=1000",
                                     "optim.lr=3e-4", "data.batch_size=4"])
    assert cfg.model.pretrained == "state-spaces/mamba2-780m"
    assert cfg.data.source.startswith("hf:") and cfg.data.seq_len == 2048  # official models bring the Pile
    assert cfg.intervention.name == "state_passing" and cfg.data.layout == "independent"
    assert cfg.trainer.max_steps == 1000 and cfg.optim.lr == 3e-4 and cfg.data.batch_size == 4
    assert resolved["trainer"]["max_steps"] == 1000
    tb, _ = load_experiment(["intervention=tbptt"])
    assert tb.data.layout == "documents"  # TBTT over documents (the paper's)
    window, _ = load_experiment(["intervention=tbptt", "intervention.tbptt_over=stream"])
    assert window.data.layout == "contiguous"
    assert load_experiment(["model=780m", "data=embedded"])[0].data.source == "embedded"


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"unknown model 'huge'; allowed: \['1.3b'"):
        compose(["model=huge"])
    with pytest.raises(ValueError, match=r"unknown intervention 'magic'; allowed: \['fitted_noise'"):
        compose(["intervention=magic"])
    with pytest.raises(ValueError, match=r"unknown data 'nowhere'"):
        compose(["data=nowhere"])
    with pytest.raises(ValueError, match=r"unknown experiment 'nope'"):
        compose(["experiment=nope"])
    with pytest.raises(ValueError, match=r"trainer.max_stepz"):
        compose(["trainer.max_stepz=3"])
    with pytest.raises(ValueError, match=r"optim.lr.*could not be converted"):
        compose(["optim.lr=fast"])
    with pytest.raises(ValueError, match="not of the form key=value"):
        compose(["max_steps"])
    with pytest.raises(ValueError, match=r"intervention tbptt with tbptt_over=documents needs data.layout=documents"):
        load_experiment(["intervention=tbptt", "data.layout=independent"])
    with pytest.raises(ValueError, match=r"noise_std must be > 0"):
        to_object(compose(["intervention=random_noise", "intervention.noise_std=0"]))
    with pytest.raises(ValueError, match=r"intervention.name='magic' is unknown"):
        load_experiment(["intervention.name=magic"])
    with pytest.raises(ValueError, match=r"reset_prob must be in \[0, 1\]"):
        load_experiment(["intervention.reset_prob=1.5"])
    with pytest.raises(ValueError, match=r"trainer.precision='fp8' is unknown"):
        load_experiment(["trainer.precision=fp8"])
    with pytest.raises(ValueError, match=r"layout='diagonal' is not supported"):
        load_experiment(["data.layout=diagonal"])


def test_default_run_dirs_keep_models_and_interventions_apart():
    # Runs resume from their run directory: two interventions sharing one would resume from each other.
    dirs = {load_experiment([f"model={m}", f"intervention={i}"])[0].resolved_run_dir
            for m in ("tiny", "780m") for i in ("tbptt", "state_passing")}
    assert dirs == {"runs/finetune/tiny-tbptt", "runs/finetune/tiny-state_passing",
                    "runs/finetune/780m-tbptt", "runs/finetune/780m-state_passing"}
    assert load_experiment(["run_dir=runs/mine"])[0].resolved_run_dir == "runs/mine"
    task = TaskExperimentConfig
    assert load_experiment(["experiment=passkey"], schema=task)[0].resolved_run_dir == "runs/passkey/tiny-fitted_noise"
    assert load_experiment(["experiment=copying"], schema=task)[0].resolved_run_dir == "runs/copying/tiny"


def test_post_training_lr_is_a_tenth_of_each_presets_pre_training_peak():
    from recurlen.training.experiments.compose import load_experiment

    want = {"130m": 3e-4, "370m": 1.5e-4, "780m": 1.25e-4, "1.3b": 1e-4, "2.7b": 8e-5, "tiny": 1e-4}
    for model, lr in want.items():
        cfg, resolved = load_experiment([f"model={model}"])
        assert cfg.optim.lr == pytest.approx(lr) and resolved["optim"]["lr"] == pytest.approx(lr), model
    cfg, _ = load_experiment(["model=780m", "optim.lr=2e-4"])  # an explicit rate wins
    assert cfg.optim.lr == 2e-4
    cfg, _ = load_experiment(["model=780m", "optim.lr_from_pretrain=0.2"])
    assert cfg.optim.lr == pytest.approx(2.5e-4)
    with pytest.raises(ValueError, match=r"optim.lr_from_pretrain must be in \(0, 1\] or null; got 2.0"):
        load_experiment(["model=780m", "optim.lr_from_pretrain=2.0"])
