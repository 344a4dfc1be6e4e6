"""Experiment composition: every YAML composes and instantiates; bad keys and values name themselves."""

import pytest
import torch

from recurlen import Mamba2LM
from recurlen.config import PRESETS, Mamba2Config
from recurlen.experiment.compose import available, compose, load_experiment, to_object
from recurlen.experiment.schema import GROUPS


@pytest.mark.parametrize("experiment", available(pipelines=False))
def test_every_experiment_composes(experiment):
    cfg, resolved = load_experiment([f"experiment={experiment}"])
    assert resolved["name"]
    assert cfg.trainer.max_steps >= 1


def test_pipelines_load_and_refuse_single_run_composition():
    from recurlen.demo import load_demo_config

    assert set(available()) - set(available(pipelines=False)) == {"demo"}
    demo = load_demo_config(["eval.num_sequences=8"])
    assert demo.eval.num_sequences == 8 and len(demo.interventions) == 5
    with pytest.raises(ValueError, match="is a pipeline of several runs; run it with `recurlen demo`"):
        compose(["experiment=demo"])
    with pytest.raises(ValueError, match="unknown demo setting .eval.lenght.; did you mean eval.length"):
        load_demo_config(["eval.lenght=3"])


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_choice_composes(group):
    for choice in available(group):
        cfg, _ = load_experiment([f"{group}={choice}"])
        if group == "model":
            assert cfg.model.name == choice


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_model_yaml_matches_python_preset(name):
    cfg, _ = load_experiment([f"model={name}"])
    assert cfg.model.config == Mamba2Config(**PRESETS[name])


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
    assert tb.data.layout == "contiguous"
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
    with pytest.raises(ValueError, match=r"intervention tbptt needs data.layout=contiguous"):
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
    assert load_experiment(["experiment=passkey"])[0].resolved_run_dir == "runs/passkey/tiny-fitted_noise"
    assert load_experiment(["experiment=copying"])[0].resolved_run_dir == "runs/copying/tiny"
