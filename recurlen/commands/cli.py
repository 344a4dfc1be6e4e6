"""recurlen's command line: every command in one table (COMMANDS), each a few lines over a library function.

One argument style: `key=value` settings in any order (for experiments: `experiment=NAME`, `GROUP=CHOICE`
and dotted overrides), flags only for paths (`--out DIR`, `--checkpoint PATH`), and on every command
`--help` (generated from the config dataclasses), `--dry-run` (validate and resolve everything, print the
plan, stop) and `--debug`. Errors that are the user's to fix print one line without a traceback
(recurlen.util.errors).
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from recurlen.util.arguments import Words, as_list, check_dotlist, render_help, settings_help, split_words, suggest
from recurlen.util.errors import Interrupted, UserError, debug_requested, one_line, user_input

log = logging.getLogger("recurlen")

EXPERIMENT_USAGE = "[experiment=NAME] [GROUP=CHOICE ...] [KEY=VALUE ...]"


def _setup_logging() -> None:
    from recurlen.util.progress import TqdmHandler

    # Only recurlen's own logger gets a handler: Lightning already prints its messages once. The handler
    # writes through tqdm, so a log line never lands inside a progress bar.
    root = logging.getLogger("recurlen")
    if not root.handlers:
        handler = TqdmHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):  # Lightning's console handlers, likewise
        lightning_log = logging.getLogger(name)
        for i, old in enumerate(lightning_log.handlers):
            if type(old) is logging.StreamHandler:
                # Lightning made its handler on stderr at import; the new one follows sys.stderr as it is now.
                new = TqdmHandler(old.stream if old.stream is sys.stdout else None)
                new.setFormatter(old.formatter)
                new.setLevel(old.level)
                lightning_log.handlers[i] = new
    # Known-harmless library warnings that would otherwise greet every run.
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
    warnings.filterwarnings("ignore", message=".*IterableDataset. has .__len__. defined.*")


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


# ---- experiments: finetune, config, fit-noise, passkey, babilong, copying, niah ---------------------------------


TASK_COMMANDS = ("passkey", "babilong", "copying", "niah")


def _schema(command: str):
    """Task commands (and `config`, which prints either kind) compose with the task section; training without."""
    from recurlen.evaluation.tasks.config import TaskExperimentConfig
    from recurlen.training.experiments.schema import ExperimentConfig

    return TaskExperimentConfig if command in (*TASK_COMMANDS, "config") else ExperimentConfig


def _experiment(w: Words, command: str, default: str = "finetune", *, lock: bool = True):
    """Compose and check an experiment; a run that this machine would refuse is refused here (a held run
    directory and a strategy that cannot run before the plan, which imports Lightning to size the memory)."""
    from recurlen.training.devices import launch_rank
    from recurlen.util.writer_lock import refusal

    # The launcher's other ranks start while rank 0 holds the lock: only rank 0 looks at it.
    lock = lock and launch_rank() == 0
    run_dirs = [word.split("=", 1)[1] for word in w.words if word.startswith("run_dir=")]
    if lock and not w.dry_run and run_dirs and run_dirs[-1]:
        # A run directory named on the command line is looked at before torch and the config are imported (4 s
        # at a load of 7): a second writer of it is refused in a fraction of a second.
        held = refusal(run_dirs[-1], advice="choose another run_dir")
        if held is not None:
            raise held
    from recurlen.commands.preflight import Refusals, early_refusal, experiment_plan
    from recurlen.training.experiments.compose import load_experiment

    with user_input():
        positional = w.positional()
        if positional:
            raise UserError(f"{positional[0]!r} is not a key=value override (e.g. model=780m, trainer.max_steps=100)")
        cfg, resolved = load_experiment(w.words, default_experiment=default, schema=_schema(command))
        if command in TASK_COMMANDS and cfg.task.name != command:
            raise UserError(f"`recurlen {command}` runs experiments with task.name={command}; this one has "
                            f"task.name={cfg.task.name!r} (pick experiment={command} or set task.name={command})")
        if not w.dry_run:
            early_refusal(cfg, lock=lock, strategy=command != "fit-noise")
        refusals = Refusals()
        plan = experiment_plan(cfg, command=command, refusals=refusals, lock=lock)
        if not w.dry_run and refusals.early():  # every reason at once (all missing inputs in one line)
            raise UserError("; ".join(refusals.early()))
    return cfg, resolved, plan, refusals


def cmd_finetune(w: Words) -> int:
    cfg, _, plan, refusals = _experiment(w, "finetune")
    if w.dry_run:
        return _dry(plan, refusals)
    set_threads(cfg.trainer.num_threads, setting="trainer.num_threads", choose=False)
    import shlex

    from recurlen.training.finetune import run_finetune
    from recurlen.training.lost_rank import LostRank
    from recurlen.util.errors import NonFinite

    try:
        run_dir = run_finetune(cfg)
    except LostRank as err:  # the command that resumes the run, as typed
        raise err.with_command(shlex.join(["recurlen", "finetune", *w.words])) from None
    except NonFinite as err:  # the advice as the exact command that follows it
        if not err.overrides:
            raise
        raise NonFinite(err.what, step=err.step, elsewhere=err.elsewhere, overrides=err.overrides,
                        advice=f"{err.advice}: {err.command('recurlen finetune', w.words)}") from None
    from recurlen.training.run_dir import RunDir
    from recurlen.training.run_summary import finished_lines

    for line in finished_lines(RunDir(run_dir)):  # the last lines: where it is, how it validated, what next
        log.info(line)
    return 0


def cmd_config(w: Words) -> int:
    from omegaconf import OmegaConf

    from recurlen.training.experiments.compose import compose, to_object

    with user_input():
        cfg = compose(w.words, schema=_schema("config"))
        to_object(cfg)  # validate before printing
    _out(OmegaConf.to_yaml(cfg, resolve=True))
    return 0


def cmd_fit_noise(w: Words) -> int:
    cfg, _, plan, refusals = _experiment(w, "fit-noise", lock="out" not in w.paths)
    if w.dry_run:
        return _dry(plan + [f"  output       {w.paths.get('out') or cfg.resolved_run_dir + '/fitted_noise.pt'}"],
                    refusals)
    from recurlen.training.finetune import run_fit_noise

    path, stats = run_fit_noise(cfg, w.paths.get("out"))
    log.info("fitted noise on %d final states of length %d: |mean| %.4g, std %.4g -> %s", stats.num_states,
             stats.seq_len, stats.mean_KH.abs().mean().item(), stats.std_KH.mean().item(), path)
    return 0


def _task(name: str) -> Callable[[Words], int]:
    def run(w: Words) -> int:
        cfg, _, plan, refusals = _experiment(w, name, default=name)
        if w.dry_run:
            return _dry(plan + _task_fix_plan(cfg), refusals)
        from recurlen.evaluation.tasks.runner import run_task

        log.info("%s done: %s", name, run_task(cfg))
        return 0

    return run


def _dry(plan: list[str], refusals=None) -> int:
    """The plan, then "everything resolved" or what would make the run refuse to start here. Exit 0 either way: a
    plan for another machine (a GPU cluster, a filled cache) is checked on this one."""
    if refusals:
        end = ["dry run: nothing was loaded, trained or written; on this machine the run would be refused:",
               *(f"  - {text}" for text, _ in refusals.items)]
    else:
        end = ["dry run: everything resolved; nothing was loaded, trained or written"]
    _out("\n".join(plan + end))
    return 0


def set_threads(requested: int | None, *, setting: str, choose: bool = True) -> None:
    """torch's threads for this command (recurlen.util.threads), said in one line unless the command line or the
    experiment set them."""
    from recurlen.util.threads import set_threads as set_torch_threads

    line = set_torch_threads(requested, setting=setting, choose=choose)
    if not requested:
        log.info(line)


# ---- evaluation: eval, report ------------------------------------------------------------------------------


def _eval_inputs(w: Words):
    """EvalConfig and held-out DataConfig from the words: settings, data=GROUP, data.KEY=VALUE, [label=]paths."""
    from omegaconf import OmegaConf

    from recurlen.commands.preflight import describe_checkpoint
    from recurlen.evaluation.heldout import build_data_config
    from recurlen.evaluation.runner import EvalConfig
    from recurlen.training.data.config import DataConfig

    names = [f.name for f in fields(EvalConfig) if f.name not in ("checkpoints", "output_dir")]
    checkpoints, settings, data_group, data_overrides = [], [], None, []
    with user_input():
        for word in w.words:
            key = word.split("=", 1)[0]
            if key == "data":
                data_group = word.split("=", 1)[1]
            elif key.startswith("data."):
                check_dotlist([word[len("data."):]], DataConfig, what="data setting")
                data_overrides.append(word)
            elif "=" in word and key.split(".", 1)[0] in names:  # fix.NAME.KEY=VALUE: a fix's setting
                settings.append(as_list(word, EvalConfig))  # tasks=positionwise is [positionwise]
            else:
                checkpoints.append(word)
        out_dir = w.paths.get("out", "runs/eval")
        base = OmegaConf.structured(EvalConfig(checkpoints=checkpoints or ["?"], output_dir=out_dir))
        cfg = OmegaConf.to_object(OmegaConf.merge(base, OmegaConf.from_dotlist(settings)))
        if not checkpoints:
            raise UserError("no checkpoints given: name one or more run directories, checkpoints or hub ids "
                            "(`label=path` to name them in the results)")
        cfg.checkpoints = checkpoints
        resolved = []
        for word, (label, path) in zip(checkpoints, cfg.labelled_checkpoints()):
            try:
                resolved.append(f"  {label:14s} {describe_checkpoint(path)}")
            except UserError:
                close = suggest(label, names, n=1) if "=" in word else ""
                if not close:
                    raise
                # KEY=VALUE with KEY close to a setting: a misspelt setting far more often than a label of a path
                # that does not exist, so the setting leads.
                raise UserError(f"unknown eval setting {label!r}{close[:-1]}={path}? (`--help` lists them all); read "
                                f"as LABEL=PATH instead, checkpoint {path!r} does not exist") from None
        data = build_data_config(cfg.labelled_checkpoints()[0][1], data_group, data_overrides)
    return cfg, data, resolved


def _fix_plan(cfg) -> list[str]:
    """The dry run's line on the training-free fixes: each with its settings and the run it is applied to."""
    if not cfg.fixes:
        return []
    from recurlen.evaluation.fixes.arguments import describe

    base = cfg.fix_base or cfg.labelled_checkpoints()[0][0]
    return [f"  fixes on {base:6s} {describe(cfg.fixes, cfg.fix)}, calibrated on {cfg.calibration_rows()} held-out "
            f"sequence(s) after the {cfg.scored_rows()} scored"]


def _task_fix_plan(cfg) -> list[str]:
    """The task's dry-run line on the training-free fixes (passkey, niah): settings, base and calibration rows."""
    if not getattr(cfg, "fixes", None):
        return []
    from recurlen.evaluation.fixes.arguments import calibration_rows, describe

    return [f"  fixes on {cfg.fix_base or 'the evaluated model'}: {describe(cfg.fixes, cfg.fix)}, calibrated on "
            f"{calibration_rows(cfg.fixes, cfg.fix)} held-out sequence(s) of its data after the first "
            f"{cfg.task.trials}"]


def cmd_eval(w: Words) -> int:
    cfg, data, resolved = _eval_inputs(w)
    if w.dry_run:
        from recurlen.commands.preflight import describe_data

        with user_input():
            held_out = describe_data(data)
        return _dry(["recurlen eval: plan", *resolved,
                     f"  held-out       {cfg.num_sequences} sequences of {cfg.seq_len or data.long_val_length} tokens "
                     f"from {held_out}", f"  tasks          {', '.join(cfg.tasks)}", *_fix_plan(cfg),
                     f"  output         {cfg.output_dir}"])
    from recurlen.evaluation.heldout import evaluate_checkpoints
    from recurlen.util.stop_signals import stopped_by_signals

    set_threads(cfg.num_threads, setting="num_threads")
    with stopped_by_signals(f"the evaluation, before its results.json was written to {cfg.output_dir}; rerun the "
                            "same command to evaluate"):
        written = evaluate_checkpoints(cfg, data)
    log.info("wrote %s", written)
    return 0


@dataclass
class ReportSettings:
    title: str | None = None
    """The report's heading (default 'recurlen report')."""


def cmd_report(w: Words) -> int:
    from omegaconf import OmegaConf

    from recurlen.commands.report import read_results, write_report

    with user_input():
        check_dotlist(w.settings(), ReportSettings)
        settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ReportSettings),
                                                       OmegaConf.from_dotlist(w.settings())))
        if not w.positional():
            raise UserError("no results given: name results.json files or directories holding one")
        if "out" not in w.paths:
            raise UserError("--out DIR is required: where report.md, results.json and the plots go")
        runs, tasks = read_results(w.positional())
    if w.dry_run:
        return _dry(["recurlen report: plan", f"  {len(runs)} evaluated runs, {len(tasks)} task results",
                     f"  output  {w.paths['out']}/report.md, results.json, plots"])
    set_threads(None, setting="OMP_NUM_THREADS")
    log.info("wrote %s", write_report(w.positional(), out_dir=w.paths["out"], title=settings.title))
    return 0


# ---- demo, generate ----------------------------------------------------------------------------------------


def cmd_demo(w: Words) -> int:
    from recurlen.commands.demo import demo_plan, load_demo_config, run_demo

    with user_input():
        cfg = load_demo_config(w.words)
        plan = demo_plan(cfg)
    if w.dry_run:
        return _dry(plan)
    root = run_demo(cfg)
    from recurlen.commands.demo_summary import closing_lines

    # The verdicts, where the report is and what to run next: the report's ~150 lines stay in report.md.
    _out("\n".join(closing_lines(root, quick=cfg.quick, interventions=cfg.interventions)))
    return 0


def cmd_arbiter(w: Words) -> int:
    from recurlen.commands.arbiter import arbiter_plan, load_arbiter_config, run_arbiter

    with user_input():
        cfg = load_arbiter_config(w.words)
        plan = arbiter_plan(cfg)
    if w.dry_run:
        return _dry(plan)
    report = run_arbiter(cfg)
    _out(report.read_text())  # the arbiter's output is its table
    return 0


def cmd_generate(w: Words) -> int:
    from omegaconf import OmegaConf

    from recurlen.commands.preflight import describe_checkpoint
    from recurlen.evaluation.generation import GenerateConfig, generate_text

    with user_input():
        check_dotlist(w.words, GenerateConfig)
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(GenerateConfig),
                                                  OmegaConf.from_dotlist(w.words)))
        source = describe_checkpoint(w.paths["checkpoint"]) if "checkpoint" in w.paths else f"untrained {cfg.model}"
    if w.dry_run:
        return _dry(["recurlen generate: plan", f"  model  {source}", f"  {cfg.max_new_tokens} tokens after "
                     f"{cfg.prompt!r}"])
    set_threads(None, setting="OMP_NUM_THREADS")
    text, summary = generate_text(cfg, checkpoint=w.paths.get("checkpoint"))
    _out(text)
    log.info(summary)
    return 0


# ---- export ------------------------------------------------------------------------------------------------


def cmd_export(w: Words) -> int:
    from omegaconf import OmegaConf

    from recurlen.commands.export import ExportSettings, export, export_plan

    with user_input():
        settings_words = w.settings() + ([f"format={w.paths['format']}"] if "format" in w.paths else [])
        check_dotlist(settings_words, ExportSettings)
        settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ExportSettings),
                                                       OmegaConf.from_dotlist(settings_words)))
        if len(w.positional()) != 1:
            raise UserError(f"name one run directory, .ckpt or pretrained directory to export; got {w.positional()}")
        if "out" not in w.paths:
            raise UserError("--out DIR is required: where the weights, the tokenizer and README.md go")
        plan = export_plan(w.positional()[0], w.paths["out"], settings, w.paths.get("eval"))
    if w.dry_run:
        return _dry(plan)
    set_threads(None, setting="OMP_NUM_THREADS")
    command = [*w.positional(), "--out", w.paths["out"], *settings_words,
               *(["--eval", w.paths["eval"]] if "eval" in w.paths else [])]
    export(w.positional()[0], w.paths["out"], settings, eval_path=w.paths.get("eval"), command=command)
    return 0


# ---- help --------------------------------------------------------------------------------------------------


def _experiment_help(command: str, default: str) -> Callable[[Words], str]:
    def render(w: Words) -> str:
        from recurlen.training.experiments.compose import available, compose
        from recurlen.training.experiments.schema import GROUPS

        schema = _schema(command)
        try:
            cfg, note = compose(w.words, default_experiment=default, schema=schema), "this experiment's value"
        except (ValueError, FileNotFoundError) as err:
            cfg, note = None, f"defaults; the given overrides do not compose: {one_line(err)}"
        chosen = {g: str(cfg[g].get("name", "")) for g in GROUPS} if cfg is not None else {}
        groups = [f"  {g:13s} {' | '.join(available(g))}" + (f"   (here: {chosen[g]})" if chosen.get(g) else "")
                  for g in GROUPS]
        return render_help(
            f"recurlen {command} {EXPERIMENT_USAGE} [--dry-run]", COMMANDS[command].summary + ".",
            [(f"experiment=NAME  an experiment file of experiments/ (default {default}): "
              f"{', '.join(available(pipelines=False))}", []),
             ("groups (GROUP=CHOICE loads experiments/GROUP/CHOICE.yaml; a model is a row of the model table, "
              "recurlen.models.table, or a file of experiments/model/ARCHITECTURE/ over one; the experiment's "
              "values, then KEY=VALUE overrides, go on top):", groups),
             (f"settings (KEY=VALUE; shown: type = {note}):", settings_help(schema, cfg))],
            COMMANDS[command].path_flags)

    return render


def _settings_help(command: str, usage: str, cls_path: str, *, skip: tuple[str, ...] = (),
                   extra: tuple[tuple[str, list[str]], ...] = (),
                   values: Callable[[Words], object] | None = None) -> Callable[[Words], str]:
    def render(w: Words) -> str:
        import importlib

        module, name = cls_path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        shown = values(w) if values else None
        title = f"settings (KEY=VALUE; shown: type = {'current value' if shown is not None else 'default'}):"
        return render_help(f"recurlen {command} {usage}", COMMANDS[command].summary + ".",
                           [*extra, (title, settings_help(cls, shown, skip=skip))], COMMANDS[command].path_flags)

    return render


def _demo_values(w: Words):
    from recurlen.commands.demo import load_demo_config

    try:
        return load_demo_config(w.words)
    except ValueError:
        return None


def _arbiter_values(w: Words):
    from recurlen.commands.arbiter import load_arbiter_config

    try:
        return load_arbiter_config(w.words)
    except ValueError:
        return None


@dataclass(frozen=True)
class Command:
    run: Callable[[Words], int]
    summary: str
    help: Callable[[Words], str]
    path_flags: dict[str, str] = field(default_factory=dict)


_EVAL_EXTRA = (("checkpoints: [LABEL=]PATH words: run directories, .ckpt files, pretrained directories, hub ids",
                []),
               ("held-out data: data=GROUP (experiments/data/), data.KEY=VALUE (DataConfig fields); default: the "
                "first run's own data", []))

COMMANDS: dict[str, Command] = {
    "finetune": Command(cmd_finetune, "post-train (or pre-train) a model with an initial-state intervention",
                        _experiment_help("finetune", "finetune")),
    "train": Command(cmd_finetune, "alias of finetune", _experiment_help("train", "finetune")),
    "config": Command(cmd_config, "print the resolved experiment config", _experiment_help("config", "finetune")),
    "fit-noise": Command(cmd_fit_noise, "fit the fitted-noise statistics on training batches",
                         _experiment_help("fit-noise", "finetune"),
                         {"--out": "output file (default <run_dir>/fitted_noise.pt)"}),
    "eval": Command(cmd_eval, "position-wise loss, reset control, state norms and EffRem of checkpoints",
                    _settings_help("eval", "[LABEL=]CHECKPOINT ... [KEY=VALUE ...] [data=GROUP] [--out DIR]",
                                   "recurlen.evaluation.runner.EvalConfig", skip=("checkpoints", "output_dir"),
                                   extra=_EVAL_EXTRA),
                    {"--out": "output directory (default runs/eval)"}),
    "report": Command(cmd_report, "Markdown report with verdicts and plots from results.json files",
                      _settings_help("report", "RESULTS ... --out DIR [title=TEXT]",
                                     "recurlen.commands.cli.ReportSettings"),
                      {"--out": "directory for report.md, the merged results.json and the plots"}),
    "demo": Command(cmd_demo, "the CPU demo: failure past T and its fix, with a report (make demo)",
                    _settings_help("demo", "[KEY=VALUE ...]", "recurlen.commands.demo.DemoConfig", skip=("pipeline",),
                                   values=_demo_values)),
    "arbiter": Command(cmd_arbiter, "a base that retrieves and is a language model: its post-trainings and the "
                       "training-free fixes judged by the loss and by retrieval (make arbiter)",
                       _settings_help("arbiter", "[KEY=VALUE ...]", "recurlen.commands.arbiter.ArbiterConfig",
                                      skip=("pipeline",), values=_arbiter_values)),
    "generate": Command(cmd_generate, "greedy continuation from a prompt",
                        _settings_help("generate", "[--checkpoint PATH] [KEY=VALUE ...]",
                                       "recurlen.evaluation.generation.GenerateConfig"),
                        {"--checkpoint": "run directory, .ckpt, pretrained directory or hub id (default: model=)"}),
    "export": Command(cmd_export, "write a model in its official or transformers' format, with a model card",
                      _settings_help("export", "RUN_OR_CKPT --out DIR [--eval DIR] [format=official|transformers] "
                                     "[KEY=VALUE ...]", "recurlen.commands.export.ExportSettings"),
                      {"--out": "directory for the weights, the tokenizer's files and README.md (the model card)",
                       "--eval": "an evaluation of the run (`recurlen eval`'s --out or its results.json) for the card; "
                                 "default: the newest under the run directory",
                       "--format": "the same as format=..."}),
    "passkey": Command(_task("passkey"), "passkey retrieval: a key hidden in long prompts",
                       _experiment_help("passkey", "passkey")),
    "babilong": Command(_task("babilong"), "BABILong: reasoning over facts hidden in long text",
                        _experiment_help("babilong", "babilong")),
    "copying": Command(_task("copying"), "synthetic copying: copy a string after training on shorter ones",
                       _experiment_help("copying", "copying")),
    "niah": Command(_task("niah"), "needle in a haystack (recurlen's tasks after RULER's): values hidden at depths of "
                    "long prompts",
                    _experiment_help("niah", "niah")),
}


def overview() -> str:
    lines = ["usage: recurlen COMMAND [KEY=VALUE ...] [--help] [--dry-run] [--debug]", "",
             __doc__.strip().split("\n\n")[1], "", "commands:"]
    lines += [f"  {name:10s} {c.summary}" for name, c in COMMANDS.items()]
    lines += ["", "`recurlen COMMAND --help` lists what a command accepts; `recurlen --version` prints the version."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        _out(overview())
        return 0
    if argv[0] in ("-V", "--version"):
        from recurlen.util.version import installed_version

        _out(f"recurlen {installed_version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        sys.stderr.write(f"recurlen: unknown command {name!r}{suggest(name, COMMANDS)}; allowed: {list(COMMANDS)}\n")
        return 2
    command = COMMANDS[name]
    from recurlen.util.threads import wait_passively_when_busy

    wait_passively_when_busy()  # before anything imports torch
    _setup_logging()
    try:
        words = split_words(rest, path_flags=command.path_flags)
        if words.help:
            _out(command.help(words))
            return 0
        return command.run(words)
    except Interrupted as err:  # stopped on a signal after writing a checkpoint: resumable, not a success
        if not getattr(err, "elsewhere", False):  # one line per run: rank 0's
            sys.stderr.write(f"recurlen {name}: {err}\n")
        return err.exit_code
    except UserError as err:
        if debug_requested(argv):
            raise
        if not getattr(err, "elsewhere", False):  # one line per run, from the rank where it happened
            sys.stderr.write(f"recurlen {name}: error: {one_line(err)}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
