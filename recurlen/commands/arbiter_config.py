"""`recurlen arbiter`'s settings (experiments/arbiter.yaml and key=value overrides) and its stages' command lines.

    cfg = load_arbiter_config(["judge.trials=32", "fixes=[forget_more]"])
    base_words(cfg), post_words(cfg, "tbptt")     # the words each training stage composes its experiment from
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from recurlen.evaluation.arbiter.judge import JudgeSettings
from recurlen.evaluation.tasks.retrieval import RETRIEVAL_BAR
from recurlen.training.experiments.compose import experiments_dir
from recurlen.training.interventions import INTERVENTIONS


@dataclass
class ArbiterConfig:
    pipeline: str = "arbiter"
    """Marks experiments/arbiter.yaml as a pipeline (run by `recurlen arbiter`), not a single training run."""
    run_root: str = "runs/arbiter"
    """Where the stages' run directories, results.json and report.md go."""
    pretrain_experiment: str = "arbiter-pretrain"
    """The base's experiment (experiments/NAME.yaml): a passkey experiment with task.text_rows."""
    posttrain_experiment: str = "arbiter-posttrain"
    """The post-trainings' experiment, run once per intervention from the base."""
    interventions: list[str] = field(default_factory=lambda: ["none", "fitted_noise", "state_passing", "tbptt"])
    """Post-trainings to compare (none: plain fine-tuning)."""
    fixes: list[str] = field(default_factory=lambda: ["mambaextend", "a_scale", "forget_more"])
    """Training-free fixes applied to the base (NAME or KEY=NAME, as `recurlen eval fixes=[...]`)."""
    fix: dict[str, Any] = field(default_factory=dict)
    """Each fix's settings by its key, fix.KEY.SETTING=VALUE."""
    overrides: list[str] = field(default_factory=list)
    """Overrides given to both training stages (e.g. trainer.max_steps=20 for a smoke run)."""
    posttrain_overrides: list[str] = field(default_factory=list)
    """Overrides given to the post-trainings only."""
    parallel: int = 2
    """Runs (post-trainings, judged models) at the same time, each in its own process."""
    threads_per_run: int = 1
    """Torch threads of each of them."""
    base_threads: int | None = None
    """Torch threads of the base's training, which runs alone; None: parallel x threads_per_run (on a machine
    shared with other jobs one thread can be the faster)."""
    retrieval_bar: float = RETRIEVAL_BAR
    """A length retrieves when its Wilson interval's lower end reaches this accuracy."""
    judge: JudgeSettings = field(default_factory=JudgeSettings)

    def __post_init__(self) -> None:
        from recurlen.evaluation.fixes import arguments as fix_args

        unknown = sorted(set(self.interventions) - set(INTERVENTIONS))
        if unknown:
            raise ValueError(f"arbiter interventions {unknown} are unknown; allowed: {list(INTERVENTIONS)}")
        if self.parallel < 1 or self.threads_per_run < 1 or (self.base_threads is not None and self.base_threads < 1):
            raise ValueError("arbiter parallel, threads_per_run and base_threads must be >= 1")
        if not 0.0 < self.retrieval_bar < 1.0:
            raise ValueError(f"arbiter retrieval_bar={self.retrieval_bar} must be in (0, 1)")
        self.fixes, self.fix = fix_args.normalise(self.fixes, self.fix)
        fix_args.check_arguments(self.fixes, self.fix, what="arbiter")

    @property
    def root(self) -> Path:
        return Path(self.run_root)


def load_arbiter_config(args: list[str]) -> ArbiterConfig:
    """experiments/arbiter.yaml with key=value overrides, validated (unknown keys: one line with suggestions)."""
    from recurlen.util.arguments import check_dotlist

    check_dotlist(args, ArbiterConfig, what="arbiter setting")
    try:
        given = OmegaConf.from_dotlist(args)
        experiment = OmegaConf.load(experiments_dir() / "arbiter.yaml")
        if "fixes" in given and "fix" in experiment:
            # The experiment's settings are for its own fixes: a command line that names other fixes drops those it
            # leaves out (its own fix.KEY.* settings are still checked against its fixes).
            keys = {str(f).split("=", 1)[0] for f in given.fixes}
            experiment.fix = {k: v for k, v in experiment.fix.items() if k in keys}
        cfg = OmegaConf.merge(OmegaConf.structured(ArbiterConfig), experiment, given)
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:
        raise ValueError(f"bad arbiter config: {str(err).splitlines()[0]} ({getattr(err, 'full_key', '')})") from err


def base_words(cfg: ArbiterConfig) -> list[str]:
    return [f"experiment={cfg.pretrain_experiment}", f"run_dir={cfg.root / 'base'}", *cfg.overrides]


def post_words(cfg: ArbiterConfig, intervention: str) -> list[str]:
    return [f"experiment={cfg.posttrain_experiment}", f"model.pretrained={cfg.root / 'base'}",
            f"intervention={intervention}", f"run_dir={cfg.root / 'post' / intervention}", *cfg.overrides,
            *cfg.posttrain_overrides]


__all__ = ["ArbiterConfig", "base_words", "load_arbiter_config", "post_words"]
