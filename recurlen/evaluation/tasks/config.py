"""Task experiments: a training experiment plus a `task` section saying which long-context task trains and
evaluates the model (`recurlen passkey | babilong | copying` compose them with TaskExperimentConfig).

    task.name=passkey    passkey retrieval (Mohtashami & Jaggi, 2023)
    task.name=babilong   BABILong (Kuratov et al., 2024): bAbI facts hidden in long haystack text
    task.name=copying    synthetic copying (Jelassi et al., 2024, "Repeat After Me")
    task.name=niah       needle in a haystack: recurlen's tasks after RULER's (Hsieh et al., 2024)

Training examples are `data.seq_len` tokens long (the training context), `data.batch_size` per rank, and are
tokenized with `data.tokenizer`; this section holds only what is specific to the tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recurlen.evaluation.tasks.niah_config import NiahConfig
from recurlen.training.experiments.schema import ExperimentConfig
from recurlen.training.run_dir import RUNS_DIR

TASKS = ("passkey", "babilong", "copying", "niah")
LOSS_ON = ("answer", "all")
HAYSTACKS = ("embedded", "filler")
# The bAbI tasks of the BABILong release; the offline generator writes qa1-qa3.
BABILONG_TASKS = tuple(f"qa{i}" for i in range(1, 21))
GENERATED_TASKS = ("qa1", "qa2", "qa3")
GENERATED_MIN_FACTS = {"qa1": 1, "qa2": 3, "qa3": 3}
"""Fewest facts a generated story of each task can have (qa2 / qa3: a move, a pick-up, another move)."""
COPY_INTERVENTIONS = ("none", "random_noise", "fitted_noise", "state_passing")
FIX_TASKS = ("passkey", "niah")
"""Tasks that evaluate training-free fixes beside the model (fixes=[...]): those that evaluate one given model."""


def _positive(section: str, name: str, value: object, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"task.{section}{name}={value!r} is not allowed; need an integer >= {minimum}")


@dataclass
class PasskeyConfig:
    depths: list[float] = field(default_factory=lambda: [0.1, 0.5, 0.9])
    """Where the key sentence sits: the fraction of the filler that comes before it (0 = first, 1 = last)."""
    key_digits: int = 5
    """Digits of the pass key (the paper: 5)."""
    loss_on: str = "answer"
    """Fine-tuning loss on the 'answer' tokens (the key after the question, and EOS) or on 'all' tokens."""
    max_new_tokens: int | None = None
    """Tokens generated per answer; None = the answer's length + 2."""

    def __post_init__(self) -> None:
        if not self.depths:
            raise ValueError("task.passkey.depths is empty; give at least one depth in [0, 1]")
        for d in self.depths:
            if not 0.0 <= float(d) <= 1.0:
                raise ValueError(f"task.passkey.depths has {d}; every depth must be in [0, 1]")
        _positive("passkey.", "key_digits", self.key_digits)
        if self.loss_on not in LOSS_ON:
            raise ValueError(f"task.passkey.loss_on={self.loss_on!r} is unknown; allowed: {list(LOSS_ON)}")
        if self.max_new_tokens is not None:
            _positive("passkey.", "max_new_tokens", self.max_new_tokens)


@dataclass
class BabilongConfig:
    source: str = "generate"
    """'generate' (offline bAbI-style qa1-qa3 stories hidden in haystack text), a local directory in the
    layout of recurlen.evaluation.tasks.babilong, or 'hf:RMT-team/babilong' (the hub, or its local cache)."""
    tasks: list[str] = field(default_factory=lambda: list(GENERATED_TASKS))
    """bAbI tasks to evaluate (qa1..qa20; the generator and fine-tuning on generated data know qa1-qa3)."""
    train_source: str = "generate"
    """Fine-tuning examples: 'generate' (at data.seq_len) or a source as above read at `train_length`."""
    train_length: str = "0k"
    """Length configuration (e.g. '0k', '1k') read for fine-tuning when train_source is not 'generate'."""
    haystack: str = "embedded"
    """Text the facts hide in: 'embedded' (the Python standard library's sources, ASCII) or 'filler'
    (the passkey filler sentences). The BABILong release uses PG-19 books."""
    num_facts: int = 6
    """Facts per generated story (distractors included); the supporting facts are among them."""
    max_new_tokens: int = 12
    """Tokens generated per answer; the metric reads the first sentence only."""
    prompt: str = "plain"
    """'plain' (context, question, 'Answer:') or 'few_shot': the BABILong release's instruction, in-context
    examples and answer format per task (qa1-qa5), as in the paper's few-shot evaluation. Fine-tuning examples
    use the same prompt (few_shot needs a data.seq_len that holds its ~1000-character preamble)."""

    def __post_init__(self) -> None:
        from recurlen.evaluation.tasks.babilong_prompts import FEW_SHOT, PROMPT_STYLES

        if self.prompt not in PROMPT_STYLES:
            raise ValueError(f"task.babilong.prompt={self.prompt!r} is unknown; allowed: {list(PROMPT_STYLES)}")
        if self.prompt == "few_shot":
            bad = [t for t in self.tasks if t not in FEW_SHOT]
            if bad:
                raise ValueError(f"task.babilong.prompt=few_shot has examples for {sorted(FEW_SHOT)}; tasks {bad} "
                                 "have none (use prompt=plain for them)")
        if not self.tasks:
            raise ValueError(f"task.babilong.tasks is empty; allowed: {list(BABILONG_TASKS)}")
        for t in self.tasks:
            if t not in BABILONG_TASKS:
                raise ValueError(f"task.babilong.tasks has {t!r}, which does not exist; allowed: "
                                 f"{list(BABILONG_TASKS)}")
        if self.source == "generate" or self.train_source == "generate":
            bad = [t for t in self.tasks if t not in GENERATED_TASKS]
            if bad:
                raise ValueError(f"task.babilong.tasks {bad} cannot be generated offline (source or train_source "
                                 f"is 'generate'); the generator knows {list(GENERATED_TASKS)}")
        if not self.source or not self.train_source:
            raise ValueError("task.babilong.source and train_source must be 'generate', a directory or 'hf:<name>'")
        if self.haystack not in HAYSTACKS:
            raise ValueError(f"task.babilong.haystack={self.haystack!r} is unknown; allowed: {list(HAYSTACKS)}")
        _positive("babilong.", "num_facts", self.num_facts)
        if self.source == "generate" or self.train_source == "generate":
            need = max(GENERATED_MIN_FACTS[t] for t in self.tasks)
            if self.num_facts < need:
                raise ValueError(f"task.babilong.num_facts={self.num_facts} is too few for generated "
                                 f"{list(self.tasks)} stories; need >= {need}")
        _positive("babilong.", "max_new_tokens", self.max_new_tokens)


@dataclass
class CopyingConfig:
    length: int = 16
    """n: the longest string trained on; training strings have min_length..n symbols."""
    min_length: int = 1
    """Shortest training string."""
    alphabet_size: int = 26
    """Symbols are the first alphabet_size lowercase letters (one token each)."""
    start: str = "$"
    """The marker before the string (the reference's `$`)."""
    separator: str = "|"
    """The symbol between the string and its copy."""
    end: str = "."
    """The marker after the copy (the reference's `.`); greedy decoding stops there."""
    pad: str = "*"
    """Fills a training row after its last example (never scored)."""
    packed: bool = False
    """False: one example per training row, `*`-padded. True: examples back to back from the row's start
    (the reference packs rows this way); an example cut by the row's end is not scored."""
    stream_factor: int = 4
    """`stream` reading: zero-state sequences of stream_factor x data.seq_len tokens made of training-format
    examples; scored on the examples that start at or after (stream_factor - 1) x data.seq_len."""
    stream_trials: int | None = None
    """Streams evaluated per model; None = task.trials."""
    interventions: list[str] = field(default_factory=lambda: ["none", "state_passing"])
    """Interventions compared (each trained from scratch once per seed)."""
    seeds: list[int] = field(default_factory=lambda: list(range(10)))
    """Seeds of the model initialisation and the training examples; seed s of every intervention pairs with seed s
    of the others (recurlen.evaluation.tasks.paired). Ten: with three or five the stream reading's gain (+0.2 to
    +0.4, per-seed std ~0.35) was not distinguishable from seed noise either way."""
    headline_factor: int = 3
    """The `single` reading's summary uses the evaluated string length nearest to headline_factor * n
    from above (the paper: > 3x the training length)."""
    parallel: int = 1
    """Runs trained at once, each in its own process with trainer.num_threads / parallel threads (small
    models use one core better than two; 1 trains in this process, one run after the other)."""

    def __post_init__(self) -> None:
        _positive("copying.", "length", self.length)
        _positive("copying.", "min_length", self.min_length)
        if self.min_length > self.length:
            raise ValueError(f"task.copying.min_length={self.min_length} exceeds length={self.length}")
        if not 2 <= self.alphabet_size <= 26:
            raise ValueError(f"task.copying.alphabet_size={self.alphabet_size} is not allowed; need 2..26")
        marks = {"start": self.start, "separator": self.separator, "end": self.end, "pad": self.pad}
        for name, mark in marks.items():
            if not isinstance(mark, str) or len(mark) != 1 or mark.islower():
                raise ValueError(f"task.copying.{name}={mark!r} must be one character that is not a lowercase "
                                 "letter (those are the alphabet)")
        if len(set(marks.values())) != len(marks):
            raise ValueError(f"task.copying start / separator / end / pad must differ; got {marks}")
        _positive("copying.", "stream_factor", self.stream_factor, minimum=2)
        if self.stream_trials is not None:
            _positive("copying.", "stream_trials", self.stream_trials)
        if not self.interventions:
            raise ValueError(f"task.copying.interventions is empty; allowed: {list(COPY_INTERVENTIONS)}")
        for name in self.interventions:
            if name not in COPY_INTERVENTIONS:
                raise ValueError(f"task.copying.interventions has {name!r}; allowed: {list(COPY_INTERVENTIONS)} "
                                 "(tbptt needs documents that continue, which copying examples are not)")
        if not self.seeds:
            raise ValueError("task.copying.seeds is empty; give at least one seed")
        _positive("copying.", "headline_factor", self.headline_factor)
        _positive("copying.", "parallel", self.parallel)


@dataclass
class TaskConfig:
    name: str | None = None
    """passkey / babilong / copying / niah: train on that task's examples and evaluate on it (None: no task)."""
    train: bool = True
    """Fine-tune (copying: train from scratch) before evaluating; false evaluates model.pretrained as is
    (or the run directory's last checkpoint)."""
    lengths: list[int] | None = None
    """Evaluation lengths: prompt tokens (passkey, babilong; 0 = BABILong's facts-only '0k') or string
    symbols (copying).
    None: 1, 2, 4, 8, 16 x data.seq_len (copying: 1, 2, 3, 4 x copying.length)."""
    trials: int = 8
    """Examples per evaluation cell: (length, depth) for passkey, (task, length) for babilong,
    length for copying, (task, length, depth) for niah."""
    eval_batch_size: int = 8
    """Prompts decoded together (only prompts of equal length are batched: no padding enters the state)."""
    chunk_len: int = 2048
    """Prompt tokens per forward call while prefilling; memory is O(batch x chunk_len) at any length."""
    eval_seed: int = 1234
    """Seed of the evaluation examples (the same for every model, so results pair up)."""
    val_batches: int = 4
    """Fixed held-out batches of task examples for the trainer's validation loss."""
    text_rows: int = 0
    """Rows of each training batch (of data.batch_size) that read the corpus of data.* in the intervention's layout
    instead of task examples, so that the model learns the task and stays a language model
    (recurlen.evaluation.tasks.mix; TBTT then walks the text rows' documents). 0: task examples only."""
    task_share: float | None = None
    """With text_rows: the task rows' share of the training loss, in (0, 1) (their answers are a few tokens where a
    text row scores all of its own); None weighs every scored token alike."""
    output_dir: str | None = None
    """Where results.json, the PNG plots and TensorBoard events go; None = <run_dir>/<task name>."""
    passkey: PasskeyConfig = field(default_factory=PasskeyConfig)
    babilong: BabilongConfig = field(default_factory=BabilongConfig)
    copying: CopyingConfig = field(default_factory=CopyingConfig)
    niah: NiahConfig = field(default_factory=NiahConfig)

    def __post_init__(self) -> None:
        if self.name is not None and self.name not in TASKS:
            raise ValueError(f"task.name={self.name!r} is unknown; allowed: {list(TASKS)} or null")
        if self.lengths is not None:
            if not self.lengths:
                raise ValueError("task.lengths is empty; give at least one length or null for the default")
            for n in self.lengths:
                _positive("", "lengths", n, minimum=0)
        for name in ("trials", "eval_batch_size", "chunk_len"):
            _positive("", name, getattr(self, name))
        _positive("", "val_batches", self.val_batches, minimum=0)
        _positive("", "text_rows", self.text_rows, minimum=0)
        if self.task_share is not None and not 0.0 < float(self.task_share) < 1.0:
            raise ValueError(f"task.task_share={self.task_share!r} must be in (0, 1) or null (every scored token "
                             "alike)")


@dataclass
class TaskExperimentConfig(ExperimentConfig):
    """An experiment with a `task` section (experiments/passkey.yaml, babilong.yaml, copying.yaml)."""

    task: TaskConfig = field(default_factory=TaskConfig)
    fixes: list[str] = field(default_factory=list)
    """Training-free fixes evaluated beside the model (passkey, niah), each on a fresh copy of it (or of fix_base),
    as `recurlen eval fixes=[...]`: NAME or KEY=NAME, NAME any of recurlen.evaluation.fixes; calibrated on the
    evaluated run's held-out text (its data config, else data), at the longest evaluated length unless
    fix.KEY.length says otherwise."""
    fix_base: str | None = None
    """What the fixes are applied to: a run directory, .ckpt or pretrained directory. None: the evaluated model."""
    fix: dict[str, Any] = field(default_factory=dict)
    """Each fix's settings by its key, fix.KEY.SETTING=VALUE (e.g. fix.mambaextend.steps=40)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        from recurlen.evaluation.fixes import arguments as fix_args

        self.fixes, self.fix = fix_args.normalise(self.fixes, self.fix)
        if self.fixes and self.task.name not in FIX_TASKS:
            raise ValueError(f"fixes=[...] is evaluated by the tasks {list(FIX_TASKS)}; task.name={self.task.name!r} "
                             "takes none")
        fix_args.check_arguments(self.fixes, self.fix, what=f"task {self.task.name}")
        if self.task.text_rows and self.task.text_rows >= self.data.batch_size:
            raise ValueError(f"task.text_rows={self.task.text_rows} leaves no task rows in a batch of "
                             f"data.batch_size={self.data.batch_size}; need text_rows < batch_size")

    @property
    def resolved_run_dir(self) -> str:
        if not self.run_dir and self.task.name == "copying":
            # The sweep trains every intervention of task.copying.interventions, each in a directory below this.
            return f"{RUNS_DIR}/{self.name}/{self.model.name}"
        return super().resolved_run_dir


def load_task_experiment(args: list[str], *, default_experiment: str = "passkey") -> TaskExperimentConfig:
    """Compose and validate a task experiment from CLI words (experiment=NAME, group=choice, a.b=value)."""
    from recurlen.training.experiments.compose import load_experiment

    return load_experiment(list(args), default_experiment=default_experiment, schema=TaskExperimentConfig)[0]
