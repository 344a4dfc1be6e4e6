"""The model card of an exported model: README.md in the Hugging Face Hub's format (YAML front matter, Markdown).

What it holds: the model and how to load it, the intervention and its settings, the post-training steps and
tokens, and the evidence of length generalization from the run's latest evaluation (the position-wise table with
full - reset per bin in units of T, the plots, EffRem, the long-context tasks' results where present), with the
commands that reproduce them. Without an evaluation it says so, and how to make one.

The evidence is read from results.json files (`recurlen eval`, `recurlen report`, the demo's eval/): the one given
with `--eval`, else the newest under the run directory that evaluated this run.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from recurlen.commands.preflight import looks_like_hub_id
from recurlen.commands.report import read_results, run_verdict
from recurlen.diagnostics.plots import PLOT_NAMES, RESULTS_NAME, write_plots
from recurlen.evaluation.evidence import bins_of
from recurlen.evaluation.tasks.report import is_task_result, task_sections
from recurlen.models import table
from recurlen.training.run_dir import ARCHIVE_DIR, RunDir, checkpoint_step, run_config, run_dir_of
from recurlen.util.arguments import format_value
from recurlen.util.atomic_files import write_text
from recurlen.util.errors import UserError

log = logging.getLogger(__name__)

CARD_NAME = "README.md"


@dataclass
class Evidence:
    """One run's entry of an evaluation, with the evaluation it belongs to."""

    path: Path
    """The results.json it was read from."""
    results: dict
    """That file's contents (its config: how the evaluation ran)."""
    entry: dict
    """This checkpoint's run entry (bins, EffRem, state norms)."""
    runs: list[dict]
    """Every run of that evaluation (the comparison the plots draw)."""


def shown(path: str | os.PathLike | None) -> str:
    """A path as a user of this directory would type it: relative to the working directory when inside it."""
    if path is None:
        return ""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _same(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _belongs(entry: dict, source: str, run: RunDir | None) -> bool:
    """Is this evaluation entry of the exported checkpoint, or of another checkpoint of its run?"""
    where = str(entry.get("source", ""))
    if not where:
        return False
    if _same(where, source):
        return True
    other = run_dir_of(where)
    return run is not None and other is not None and _same(other.path, run.path)


def find_evidence(source: str, run: RunDir | None, eval_path: str | None) -> Evidence | None:
    """This checkpoint's latest evaluation: in `eval_path` (a results.json or its directory; it must hold one),
    else the newest results.json under the run directory (its archive left out) that evaluated it."""
    if eval_path is not None:
        candidates = [Path(eval_path) / RESULTS_NAME if Path(eval_path).is_dir() else Path(eval_path)]
        if not candidates[0].is_file():
            raise UserError(f"--eval {eval_path}: no {RESULTS_NAME} there (give `recurlen eval`'s --out directory)")
    elif run is not None:
        found = [p for p in run.path.rglob(RESULTS_NAME) if ARCHIVE_DIR not in p.relative_to(run.path).parts]
        candidates = sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
    else:
        candidates = []
    for path in candidates:
        try:
            results = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        runs = results.get("runs") if isinstance(results, dict) else None
        mine = [r for r in runs or [] if _belongs(r, source, run)]
        if mine:
            exact = [r for r in mine if _same(r.get("source", ""), source)]
            return Evidence(path, results, (exact or mine)[-1], runs)
        if eval_path is not None:
            found = ", ".join(f"{r.get('label')}={r.get('source')}" for r in runs or []) or "no runs"
            raise UserError(f"--eval {eval_path}: {path} holds no evaluation of {source} (it has {found})")
    return None


def find_tasks(run: RunDir | None, eval_path: str | None) -> list[dict]:
    """Task results (passkey, BABILong, copying) under the run directory or given with --eval."""
    paths = [p for p in run.path.rglob(RESULTS_NAME)] if run is not None else []
    if eval_path is not None:
        paths.append(Path(eval_path) / RESULTS_NAME if Path(eval_path).is_dir() else Path(eval_path))
    tasks = []
    for p in dict.fromkeys(paths):
        try:
            if p.is_file() and is_task_result(json.loads(p.read_text())):
                tasks += read_results([p])[1]
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            log.warning("%s: not a readable task result; left out of the model card", p)
    return tasks


# ---- the commands that reproduce a run and its evaluation ---------------------------------------------------


def _leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix[:-1]: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def _word(key: str, value: Any) -> str:
    return shlex.quote(f"{key}={format_value(value)}")


def finetune_words(cfg: dict[str, Any], *, paths: dict[str, str]) -> list[str]:
    """`recurlen finetune` words that compose to the run's resolved config: its experiment, model and intervention
    choices, and every setting that differs from what they give. paths: how to show path-valued settings."""
    from omegaconf import OmegaConf

    from recurlen.training.experiments.compose import available, compose

    words = [f"experiment={cfg['name']}"] if cfg.get("name") in available(pipelines=False) else []
    words.append(f"intervention={cfg['intervention']['name']}")
    model = cfg["model"]["name"]
    if model in available("model") and compose(words).model.name != model:
        words.insert(len(words) - 1, f"model={model}")
    base = _leaves(OmegaConf.to_container(compose(words), resolve=True))
    for key, value in _leaves(cfg).items():
        if key != "resume" and (key not in base or base[key] != value):
            words.append(_word(key, paths.get(key, value)))
    return words


def eval_words(evidence: Evidence) -> list[str]:
    """`recurlen eval` words of that evaluation: its runs (by run directory where a run's last checkpoint was
    evaluated), its settings that are not the defaults, its output directory."""
    from recurlen.evaluation.runner import EvalConfig

    cfg = evidence.results.get("config") or {}
    words = []
    for r in evidence.runs:
        where = Path(str(r["source"]))
        run = run_dir_of(where)
        if run is not None and where.name == "last.ckpt":
            where = run.path
        words.append(shlex.quote(f"{r['label']}={shown(where)}"))
    skip = ("checkpoints", "output_dir", "progress", "num_threads", "device", "backend")
    defaults = EvalConfig(checkpoints=["x"])
    for f in fields(EvalConfig):
        if f.name not in skip and f.name in cfg and cfg[f.name] != getattr(defaults, f.name):
            words.append(_word(f.name, cfg[f.name]))
    return [*words, "--out", shlex.quote(shown(cfg.get("output_dir") or evidence.path.parent))]


# ---- the card ------------------------------------------------------------------------------------------------


def _f(x: Any, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


@dataclass
class Lineage:
    """Where a run started, back to an official checkpoint, a hub id or a training from scratch."""

    lines: list[str]
    """Each step back, as the card shows it."""
    base_model: str | None
    """The hub id it started from (the card's base_model), if any."""
    runs: list[tuple[dict, RunDir | None]]
    """The run itself and the recurlen runs it started from, newest first (their configs and directories)."""


def lineage(cfg: dict, run: RunDir | None) -> Lineage:
    out = Lineage([], None, [(cfg, run)])
    seen: set[str] = set()
    while True:
        start = (cfg.get("model") or {}).get("pretrained")
        if not start:
            out.lines.append("trained from scratch")
            return out
        row = table.official(start)
        if row is not None or looks_like_hub_id(start):
            out.base_model = row.hub_id if row is not None else start
            out.lines.append(f"{out.base_model} ({f'official {row.name}' if row else 'from the Hugging Face hub'})")
            return out
        parent = run_config(start) if Path(start).exists() and start not in seen else None
        seen.add(start)
        name = ((parent or {}).get("intervention") or {}).get("name")
        out.lines.append(shown(start) + (f" (a recurlen run, intervention {name})" if name else ""))
        if parent is None:
            return out
        cfg = parent
        out.runs.append((cfg, run_dir_of(start)))


def _front_matter(*, base_model: str | None, library: str, arch: str, intervention: str | None,
                  datasets: Sequence[str]) -> list[str]:
    lines = ["---"] + ([f"base_model: {base_model}"] if base_model else [])
    lines += [f"library_name: {library}", "pipeline_tag: text-generation", "tags:", "- recurlen",
              "- length-generalization", f"- {arch}"] + ([f"- {intervention}"] if intervention else [])
    if datasets:
        lines += ["datasets:"] + [f"- {d}" for d in datasets]
    return lines + ["---", ""]


def _evidence_lines(ev: Evidence, out: Path, source: str, *, tensorboard: bool) -> list[str]:
    e = ev.entry
    pw = e.get("positionwise") or {}
    T, L = e.get("train_len"), e.get("seq_len")
    lines = ["## Evidence: length generalization", "",
             f"From `{shown(ev.path)}`: {pw.get('num_sequences', '?')} held-out sequences of L = {L} tokens "
             f"({(L or 0) // max(T or 1, 1)}T) scored from a zero initial state, T = {T} being the training context. "
             "*full - reset* compares each token's loss with the full context to its loss with the state zeroed "
             "every T tokens: at or below 0 in every bin, the longer context never hurts.", ""]
    if not _same(e["source"], source):
        lines += [f"The evaluated checkpoint is `{shown(e['source'])}`, another checkpoint of this run.", ""]
    lines += [f"**Verdict:** {run_verdict(e)['text']}", ""]
    if bins_of(e):
        lines += ["| positions | loss (nats/token) | perplexity | full - reset |", "|---|---|---|---|"]
        lines += [f"| {b['name']} | {_f(b.get('loss'), '.3f')} | {_f(b.get('ppl'), '.2f')} | "
                  f"{_f(b.get('full_minus_reset'), '+.3f')} |" for b in bins_of(e)]
        lines += [""]
    others = [r for r in ev.runs if r is not e and bins_of(r)]
    if others:
        names = [b["name"] for b in bins_of(e)]
        lines += ["full - reset of every run of that evaluation (this one in bold):", "",
                  "| run | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for r in ev.runs:
            values = {b["name"]: b.get("full_minus_reset") for b in bins_of(r)}
            label = f"**{r['label']}**" if r is e else r["label"]
            lines.append(f"| {label} | " + " | ".join(_f(values.get(n), "+.3f") for n in names) + " |")
        lines += [""]
    eff = e.get("effrem")
    if eff:
        lines += [f"Effective Remembrance over N = {eff['T']} tokens, EffRem(t) = TV(q(.|x[0:N]), q(.|x[t:N])): "
                  "how much the prediction at N still depends on the first t tokens (near 0: they barely matter):",
                  "", "| t | " + " | ".join(str(t) for t in eff["t"]) + " |", "|---" * (len(eff["t"]) + 1) + "|",
                  "| EffRem | " + " | ".join(_f(v, ".3f") for v in eff["effrem"]) + " |", ""]
    plots = write_plots(ev.runs, out, tensorboard=tensorboard)
    lines += [f"![{kind}]({PLOT_NAMES[kind]})" for kind in plots] + [""]
    return lines


def write_card(out: Path, *, source: str, loaded: Any, arch: Any, format_name: str, library: str, loading: str,
               weights: str, dtype: str, tokenizer_note: str, evidence: Evidence | None, eval_path: str | None,
               export_words: list[str], tensorboard: bool = False, progress: Any = None) -> Path:
    """README.md in `out`, from the exported checkpoint, its run (where it is one) and its evaluation (`evidence`,
    find_evidence's; task results are looked up under the run and in eval_path). tensorboard: also write the
    comparison's TensorBoard run next to the plots; progress: the checkpoint's step against the run's max_steps
    (recurlen.commands.export.TrainingProgress), said where the card gives the steps and the commands."""
    run = run_dir_of(source)
    cfg = run_config(source) if run is not None or str(source).endswith(".ckpt") else None
    intervention = (cfg or {}).get("intervention") or {}
    history = lineage(cfg, run) if cfg is not None else Lineage([], None, [])
    data = (cfg or {}).get("data") or {}
    datasets = [data["source"][3:]] if str(data.get("source", "")).startswith("hf:") else []
    tasks = find_tasks(run, eval_path)
    model = loaded.model
    title = run.path.name if run is not None else Path(str(source)).name
    lines = _front_matter(base_model=history.base_model, library=library, arch=arch.name,
                          intervention=intervention.get("name"), datasets=datasets)
    lines += [f"# {title}", "",
              f"A {arch.title} language model" + (f" post-trained with recurlen's **{intervention['name']}** "
                                                  "intervention" if intervention else "") +
              f", exported by recurlen from `{shown(loaded.source)}`.", ""]
    lines += ["## Model", "", f"- {arch.describe(model.config)}, {model.num_parameters() / 1e6:.2f}M parameters",
              f"- training context T = {loaded.train_seq_len or 'not recorded'} tokens",
              f"- format: {format_name} ({weights}, {dtype}); tokenizer: {tokenizer_note}", "",
              "```python", loading.replace("DIR", '"DIR"'), "```", "",
              "recurlen loads this directory wherever it takes a checkpoint: `recurlen eval DIR`, "
              "`recurlen finetune model.pretrained=DIR`.", ""]
    if cfg is not None:
        lines += _training_lines(cfg, run, loaded.source, history.lines, progress)
    if evidence is not None:
        lines += _evidence_lines(evidence, out, str(loaded.source), tensorboard=tensorboard)
    else:
        lines += ["## Evidence: length generalization", "",
                  "No evaluation of this checkpoint was found" + (f" under `{shown(run.path)}`" if run else "") +
                  ": none is claimed. Measure it with `recurlen eval RUN --out DIR` and export again with "
                  "`--eval DIR`.", ""]
    lines += task_sections(tasks, out)
    lines += _reproduce_lines(history, evidence, export_words, progress)
    lines += ["## Sharing", "", "recurlen never uploads. To put this directory on the Hugging Face Hub:", "",
              "```bash", "huggingface-cli upload YOUR_NAME/MODEL_NAME DIR", "```", ""]
    return write_text(out / CARD_NAME, "\n".join(lines))


def _training_lines(cfg: dict, run: RunDir | None, checkpoint: str, lineage: list[str], progress: Any) -> list[str]:
    """Where the run started, its steps and tokens (as the checkpoint holds them), its data, its intervention."""
    step = checkpoint_step(checkpoint) if str(checkpoint).endswith(".ckpt") else None
    t, d, intervention = cfg.get("trainer") or {}, cfg.get("data") or {}, cfg.get("intervention") or {}
    world, accumulate = _world_size(run), int(t.get("accumulate_grad_batches", 1))
    per_step = int(d.get("batch_size", 0)) * int(d.get("seq_len", 0)) * accumulate * world
    total = f": {step * per_step:,} tokens" if step is not None else ""
    lines = ["## Training", "", f"- started from: {' <- '.join(lineage)}",
             f"- {step if step is not None else '?'} optimizer steps of {per_step:,} tokens ({d.get('batch_size')} "
             f"lanes x {d.get('seq_len')} tokens x {accumulate} accumulated x {world} rank{'s' if world > 1 else ''})"
             f"{total}" + (f" ({progress.describe()})" if progress is not None and progress.partial else ""),
             f"- data: {d.get('source')} (tokenizer {d.get('tokenizer')}), learning rate "
             f"{(cfg.get('optim') or {}).get('lr')}", "",
             f"Intervention **{intervention.get('name')}** with its settings:", "", "| setting | value |", "|---|---|"]
    return lines + [f"| {k} | {format_value(v)} |" for k, v in intervention.items() if k != "name"] + [""]


def _world_size(run: RunDir | None) -> int:
    summary = run.rank_summary(0) if run is not None else None
    if summary is not None and summary.is_file():
        return int(json.loads(summary.read_text()).get("world_size", 1))
    return 1


def _reproduce_lines(history: Lineage, evidence: Evidence | None, export_words: list[str],
                     progress: Any = None) -> list[str]:
    """The trainings (the runs it started from first), the evaluation and the export, as commands; where the
    exported checkpoint is not the run's last step, a comment after the run's command says which step it is."""
    commands = []
    for cfg, run in reversed(history.runs):
        paths = {"run_dir": shown(run.path if run else cfg.get("run_dir"))}
        if cfg["model"].get("pretrained"):
            paths["model.pretrained"] = shown(cfg["model"]["pretrained"])
        commands.append(" ".join(["recurlen finetune", *finetune_words(cfg, paths=paths)]))
    if progress is not None and progress.partial and history.runs:
        why = "the run was still training when it was exported" if progress.live else "the run stopped there"
        commands.append(f"# the exported checkpoint is step {progress.step} of the {progress.max_steps} steps the "
                        f"command above trains ({why})")
    if evidence is not None:
        commands.append(" ".join(["recurlen eval", *eval_words(evidence)]))
    commands.append(" ".join(["recurlen export", *_shown_export_words(export_words)]))
    return ["## Reproduce", "", "```bash", *commands, "```", ""]


def _shown_export_words(words: list[str]) -> list[str]:
    """The export's words with its paths as typed from the working directory; --out, where it lies elsewhere, is
    DIR (this directory, as the rest of the card calls it): an absolute path names someone's machine, not the model."""
    out = []
    for i, word in enumerate(words):
        option = words[i - 1] if i > 0 else None
        if option == "--out":
            word = shown(word) if not Path(shown(word)).is_absolute() else "DIR"
        elif option == "--eval" or (i == 0 and Path(word).exists()):
            word = shown(word)
        out.append(shlex.quote(word) if word != "DIR" else word)
    return out


__all__ = ["CARD_NAME", "Evidence", "Lineage", "eval_words", "find_evidence", "finetune_words", "lineage", "shown",
           "write_card"]
