"""The intervention section's defaults are the same from Python as from the experiment files."""

from omegaconf import OmegaConf

from recurlen.training.interventions import InterventionConfig

REPO_EXPERIMENTS = "experiments/intervention"


def test_reset_prob_defaults_per_intervention_match_the_yaml_files():
    # The paper's TBTT has no random resets: a TBTT built in Python must not get state passing's 0.1.
    assert InterventionConfig(name="tbptt").reset_prob == 0.0
    assert InterventionConfig(name="state_passing").reset_prob == 0.1
    for name in ("state_passing", "tbptt"):
        yaml = OmegaConf.load(f"{REPO_EXPERIMENTS}/{name}.yaml")
        assert InterventionConfig(name=name).reset_prob == yaml.reset_prob
    assert InterventionConfig(name="tbptt", reset_prob=0.3).reset_prob == 0.3


def test_state_passing_and_tbptt_carry_the_same_state_parts_by_default():
    # The two differ only in the data: both carry the SSM state only (the paper's pseudocode), from Python and yaml.
    for name in ("state_passing", "tbptt"):
        assert InterventionConfig(name=name).pass_conv is False
        assert OmegaConf.load(f"{REPO_EXPERIMENTS}/{name}.yaml").pass_conv is False
