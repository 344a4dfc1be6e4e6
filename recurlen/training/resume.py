"""Whether and how a run continues: the resume decision, made before anything in the run directory changes.

`run_finetune` asks `decide` before it writes anything. The decision
  - picks the checkpoint: with resume=auto the furthest-trained one (by the step it holds) that is intact,
    i.e. that loads with weights_only=True (and passes its zip CRC checks, so a flipped bit is caught), has the
    keys recurlen writes, holds only finite weights, and fits the model being trained. A damaged one is renamed aside
    (`last.ckpt.damaged`, never deleted) with one warning, and the next furthest is tried; when every one is
    damaged the run stops with one error instead of silently starting over;
  - compares the settings asked for with the ones the checkpoint's run used (its hyperparameters). A FIXED
    setting (the model, the intervention and its settings, the data and its lanes, the seed) defines what the
    checkpoint holds: a difference is refused, naming each one and how to start a new run instead. A
    CHANGEABLE setting (steps, learning rate and schedule, checkpoint and validation cadence, diagnostics,
    devices) is applied and named in one notice;
  - refuses resume=never in a directory that holds a run, and with resume=archive moves that run into
    archive/<time>/ first.
Only then does `record` write config.yaml (what the run now uses) and append to config_history.yaml.
"""

from __future__ import annotations

import logging
import shutil
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from recurlen.models import registry
from recurlen.training.run_dir import DAMAGED_SUFFIX, RUN_META_KEY, RunDir
from recurlen.util.atomic_files import remove_stale_temporaries, write_text
from recurlen.util.errors import UserError, load_error

log = logging.getLogger(__name__)

IGNORED = ("run_dir", "resume")
"""Not settings of the run: where it lives and how this invocation resumes it."""
FIXED = (
    "seed", "model.name", "model.architecture", "model.pretrained", "model.arch", "intervention",
    "data.source", "data.hf_config", "data.split", "data.text_field", "data.id_field", "data.tokenizer",
    "data.seq_len", "data.batch_size", "data.layout", "data.seed", "data.val_fraction", "data.max_documents",
    "data.streaming", "trainer.accumulate_grad_batches", "task.name", "task.passkey", "task.babilong",
    "task.copying",
)
"""What the checkpoint's weights, carried lane states and data position were made with (prefixes)."""
CHANGEABLE = (
    "name", "model.backend", "model.default_data", "model.pretrain_lr", "optim", "trainer", "diagnostics",
    "data.val_segments", "data.val_length", "data.val_sequences", "data.val_mode", "data.num_workers",
    "data.num_proc", "data.cache_dir", "data.pin_memory", "task",
    "task.passkey.max_new_tokens", "task.babilong.source", "task.babilong.tasks", "task.babilong.max_new_tokens",
    "task.babilong.prompt", "task.copying.interventions", "task.copying.seeds", "task.copying.headline_factor",
    "task.copying.parallel", "task.copying.stream_factor", "task.copying.stream_trials",
)
"""What only steers how training goes on or what is measured (prefixes; the most specific prefix of either list
wins, and a key neither list covers counts as fixed: never mixed silently)."""

REQUIRED_KEYS = ("state_dict", "global_step", "optimizer_states", "lr_schedulers", "loops", RUN_META_KEY)
"""What every checkpoint recurlen's trainer writes holds."""


def kind_of(key: str) -> str:
    """'ignored', 'fixed' or 'changeable' for a dotted config key."""
    best, kind = -1, "fixed"
    for prefixes, name in ((IGNORED, "ignored"), (FIXED, "fixed"), (CHANGEABLE, "changeable")):
        for prefix in prefixes:
            if (key == prefix or key.startswith(prefix + ".")) and len(prefix) > best:
                best, kind = len(prefix), name
    return kind


@dataclass(frozen=True)
class Difference:
    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {_show(self.old)} -> {_show(self.new)}"


def _show(value: Any) -> str:
    return "null" if value is None else str(value)


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def config_differences(old: dict, new: dict) -> tuple[list[Difference], list[Difference]]:
    """(fixed, changeable) differences between the config a run used and the one asked for now.

    A key the old config lacks (written by an earlier recurlen that had no such setting) is not a difference."""
    a, b = _flatten(old), _flatten(new)
    diffs = [Difference(k, a[k], b[k]) for k in sorted(set(a) & set(b)) if a[k] != b[k]]
    # A key only the old run has: a section emptied now (model.arch: {d_model: 64} -> {}), one filled now
    # (model.arch: {} -> {d_model: 64}: the old leaf is the empty section), or a setting this recurlen no longer
    # has. A key only the new config has is a setting the old run's recurlen did not have yet (or is covered by
    # its emptied parent above): not a difference.
    for key in sorted(set(a) - set(b)):
        now = _lookup(new, key)
        diffs.append(Difference(key, a[key], "(not set)" if now is _MISSING else now))
    fixed = [d for d in diffs if kind_of(d.key) == "fixed"]
    changeable = [d for d in diffs if kind_of(d.key) == "changeable"]
    return fixed, changeable


_MISSING = object()


def _lookup(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return _MISSING
        d = d[part]
    return d



# ---------------------------------------------------------------------------------------------------- checkpoints


class Damaged(Exception):
    """A checkpoint that cannot be resumed from; the message says why."""


class ModelMismatch(UserError):
    """A checkpoint of another model than the one this run builds (a fixed setting changed)."""


def validate_checkpoint(path: str | Path, model: torch.nn.Module | None = None) -> dict:
    """The checkpoint, loaded, if a run can resume from it; Damaged (why) if not; ModelMismatch if it is intact but
    holds another model than `model`."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise Damaged(f"cannot be read ({err.strerror or err})") from err
    if size == 0:
        raise Damaged("is empty")
    try:  # torch does not check the CRC of tensor data; zipfile does, so a flipped bit is found here
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
        if bad is not None:
            raise Damaged(f"fails its checksum (record {bad})")
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise Damaged(f"is not a complete checkpoint file ({type(err).__name__}: {err})") from err
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - every way a file fails to load makes it damaged
        raise Damaged(str(load_error(path, err)).split(" cannot be loaded: ", 1)[-1]) from err
    if not isinstance(ckpt, dict):
        raise Damaged(f"holds a {type(ckpt).__name__}, not a checkpoint")
    missing = [k for k in REQUIRED_KEYS if k not in ckpt]
    if missing:
        raise Damaged(f"lacks {missing} (not a checkpoint recurlen's trainer wrote)")
    meta = ckpt[RUN_META_KEY]
    if not isinstance(meta, dict) or "model_config" not in meta:
        raise Damaged(f"its {RUN_META_KEY!r} entry has no model_config")
    weights = ckpt["state_dict"]
    bad = next((k for k, v in weights.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
                and not torch.isfinite(v).all()), None)
    if bad is not None:
        raise Damaged(f"holds non-finite weights ({bad})")
    if model is not None:
        _check_model(path, meta, weights, model)
    return ckpt


def _check_model(path: Path, meta: dict, weights: dict, model: torch.nn.Module) -> None:
    name = meta.get("architecture", registry.DEFAULT)
    mine = registry.of_model(model).name
    want = model.config.to_dict()
    if name != mine:
        raise ModelMismatch(f"{path} holds a {name} model, this run builds a {mine} model")
    if meta["model_config"] != want:
        diffs = [f"{k} {_show(meta['model_config'].get(k))} -> {_show(v)}" for k, v in want.items()
                 if meta["model_config"].get(k) != v]
        raise ModelMismatch(f"{path} holds another model ({', '.join(diffs)})")
    expected = {f"model.{k}": tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in weights.items() if k.startswith("model.")}
    if got != expected:
        wrong = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
        raise Damaged(f"its weights do not fit its own model config ({', '.join(wrong[:4])})")


def move_aside(path: Path) -> Path:
    """Rename a damaged file out of the way of resume discovery (never delete: it may still be salvaged)."""
    target = path.with_name(path.name + DAMAGED_SUFFIX)
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}{DAMAGED_SUFFIX}-{n}")
        n += 1
    path.rename(target)
    return target


def checkpoint_to_read(run: RunDir) -> Path:
    """The checkpoint that evaluates run (`recurlen eval RUN`): the one a resume would continue from, found by the
    same checks (`validate_checkpoint`, furthest-trained first), without moving anything (a reader never changes a
    run directory).

    That is last.ckpt when it is intact and the furthest. When last.ckpt is damaged, the furthest intact checkpoint
    is used only if it holds the run's last step (trainer.max_steps of its config.yaml: the same weights as the
    last.ckpt of a finished run); an earlier one would be another model than the one the run ended with, which is a
    one-line error naming it. A step checkpoint further than an intact last.ckpt (a write of last.ckpt was cut
    short) is the further-trained model, with a warning."""
    last = run.last_checkpoint
    damaged: dict[Path, str] = {}
    chosen, step = None, 0
    for path in run.checkpoint_candidates():
        try:
            step = int(validate_checkpoint(path)["global_step"])
        except Damaged as why:
            damaged[path] = str(why)
            continue
        chosen = path
        break
    if chosen is None:
        raise UserError(f"no intact checkpoint in {run.path}: "
                        f"{'; '.join(f'{p.name} {why}' for p, why in damaged.items())}; nothing to evaluate")
    if chosen == last:
        return chosen
    if last not in damaged:
        log.warning("evaluating %s (step %d): it is further trained than %s (a write of %s was interrupted)", chosen,
                    step, last.name, last.name)
        return chosen
    max_steps = ((run.read_config() or {}).get("trainer") or {}).get("max_steps")
    if max_steps is not None and step >= int(max_steps):
        log.warning("%s %s: evaluating %s instead, the intact checkpoint of the same step (%d, the run's "
                    "trainer.max_steps)", last, damaged[last], chosen.name, step)
        return chosen
    raise UserError(f"{last} {damaged[last]}, and the furthest intact checkpoint, {chosen}, holds step {step}, not "
                    f"the run's last (trainer.max_steps={max_steps}): evaluating it would measure another model than "
                    f"the one the run ended with; evaluate it by name (recurlen eval {chosen}) or resume the run to "
                    "finish it")


def newest_finite_checkpoint(run: RunDir) -> tuple[str, int] | None:
    """(path, global step) of the furthest-trained checkpoint of the run that loads and holds only finite weights."""
    for path in run.checkpoint_candidates():
        try:
            ckpt = validate_checkpoint(path)
        except Damaged:
            continue
        return str(path), int(ckpt["global_step"])
    return None


# ---------------------------------------------------------------------------------------------------- the decision


@dataclass
class Decision:
    checkpoint: str | None = None
    """The checkpoint to resume from; None starts a new run."""
    loaded: dict | None = None
    """That checkpoint, already loaded (the trainer takes it instead of reading the file again)."""
    step: int = 0
    changed: list[Difference] = field(default_factory=list)
    """Changeable settings that differ from the checkpoint's run: applied from now on."""
    moved_aside: list[str] = field(default_factory=list)
    archived_to: str | None = None
    finished: bool = False
    """The checkpoint already reached trainer.max_steps: nothing to train (and nothing is changed)."""


def _refuse_another_models_checkpoints(run: RunDir, candidates: list[Path], model: torch.nn.Module) -> None:
    """Every checkpoint of the run directory must hold the model this run builds, not only the one a resume picks:
    a checkpoint of another model put there (a copied last.ckpt) was otherwise skipped when an own checkpoint was
    further trained, and then overwritten by the next last.ckpt without a word. Each file's model is read from its
    metadata (memory-mapped: the weights are not read); damaged files are the resume loop's business."""
    mine, foreign = 0, []
    for path in candidates:
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            meta, weights = ckpt[RUN_META_KEY], ckpt["state_dict"]
            _check_model(path, meta, weights, model)
        except ModelMismatch as err:
            foreign.append((path, err))
        except Exception:  # noqa: BLE001 - damaged or not recurlen's: examined (and moved aside) by the resume loop
            continue
        else:
            mine += 1
    if not foreign:
        return
    path, err = foreign[0]
    if not mine:  # the model asked for differs from the run's (a fixed setting changed)
        raise UserError(f"{err}: the model is fixed for a run; {_new_run_hint(run)}")
    raise UserError(f"{err}, while its other checkpoints hold this run's model: a run directory holds one model's "
                    f"checkpoints (the next {path.name} written would replace it); move it out of {path.parent} if it "
                    f"does not belong to this run, or {_new_run_hint(run)}")


def _new_run_hint(run: RunDir) -> str:
    return (f"to start a new run instead, choose another run_dir or add resume=archive (moves the run in "
            f"{run.path} to {run.archive}/<time>/)")


def _fixed_refusal(run: RunDir, fixed: list[Difference]) -> str:
    return (f"{run.path} holds a run whose fixed settings differ from those asked for: "
            f"{'; '.join(map(str, fixed))}; resuming would mix two runs; {_new_run_hint(run)}")


def resume_refusal(run: RunDir, requested: dict) -> str | None:
    """Why resume=auto would refuse to continue the run in run_dir with the settings `requested` (its config.yaml
    records other fixed settings: another model, intervention, data, ...); None when it would not. A dry run asks
    this, so that it refuses what the run would refuse once it has built the model and read the checkpoint."""
    old = run.read_config()
    fixed = config_differences(old, requested)[0] if old else []
    return _fixed_refusal(run, fixed) if fixed else None


def decide(run: RunDir, resume: str, requested: dict, model: torch.nn.Module, *, max_steps: int,
           rank: int = 0) -> Decision:
    """Decide how this invocation uses run_dir (see the module docstring). Only rank 0 moves files: the other
    ranks of a run reach the same decision without touching the directory."""
    if resume in ("never", "archive"):
        return _fresh(run, resume, rank)
    explicit = resume != "auto"
    if rank == 0:
        for directory in (run.checkpoints, run.path):
            for tmp in remove_stale_temporaries(directory):
                log.info("removed %s, the temporary of a write that was interrupted (the file it was replacing "
                         "is intact)", tmp)
    candidates = [Path(resume)] if explicit else run.checkpoint_candidates()
    if explicit and not candidates[0].is_file():
        raise UserError(f"resume={resume}: no such checkpoint file (use 'auto', 'never', 'archive' or a .ckpt path)")
    if not explicit:
        _refuse_another_models_checkpoints(run, candidates, model)
    moved: list[str] = []
    chosen, ckpt = None, None
    for path in candidates:
        try:
            ckpt = validate_checkpoint(path, model)
        except Damaged as why:
            if explicit:
                raise UserError(f"resume={resume}: {path} {why}; pick another checkpoint or resume=auto") from None
            if rank == 0 and path.exists():
                target = move_aside(path)
                moved.append(str(target))
                log.warning("checkpoint %s %s: moved aside to %s; trying the next furthest-trained checkpoint", path,
                            why, target.name)
            continue
        except ModelMismatch as err:
            raise UserError(f"{err}: the model is fixed for a run; {_new_run_hint(run)}") from None
        chosen = path
        break
    if chosen is None:
        damaged = moved or [str(p) for p in run.damaged_checkpoints()]
        if damaged:
            raise UserError(f"no intact checkpoint left in {run.path}: {', '.join(Path(d).name for d in damaged)} "
                            f"{'are' if len(damaged) > 1 else 'is'} damaged (kept, renamed *{DAMAGED_SUFFIX}); "
                            f"{_new_run_hint(run)}")
        return Decision()
    assert ckpt is not None
    old = ckpt.get("hyper_parameters") or run.read_config() or {}
    fixed, changed = config_differences(dict(old), requested)
    if fixed and explicit:  # the checkpoint named may belong to another run directory, or to none yet
        raise UserError(f"resume={resume}: that checkpoint was trained with other fixed settings than those asked "
                        f"for: {'; '.join(map(str, fixed))}; resuming it would mix two runs; keep its settings to "
                        f"continue it, or leave out resume= to start a new run in {run.path}")
    if fixed:
        raise UserError(_fixed_refusal(run, fixed))
    step = int(ckpt["global_step"])
    revalidate_pending(ckpt, due=validation_due(step, requested, max_steps=max_steps))
    decision = Decision(checkpoint=str(chosen), loaded=ckpt, step=step, changed=changed, moved_aside=moved,
                        finished=step >= max_steps)
    if explicit and rank == 0 and not decision.finished:
        decision.archived_to = _archive_later_checkpoints(run, chosen, step)
    if rank == 0:
        if decision.finished:
            log.info("%s is at step %d, trainer.max_steps=%d: nothing to train%s", chosen, step, max_steps,
                     f" (changed settings not applied: {'; '.join(map(str, changed))})" if changed else
                     "; raise trainer.max_steps to continue")
            stop = (ckpt.get("callbacks") or {}).get("Preemption") or {}
            if stop.get("stopped_after") == "step" and validation_due(step, requested, max_steps=max_steps):
                # A signal in the last step writes the checkpoint first and skips the end-of-run validation.
                log.warning("its end-of-run validation was skipped by the signal that stopped it at step %d; "
                            "measure the trained model with: recurlen eval %s --out %s", step, run.path,
                            run.path / "eval")
        elif changed:
            log.info("resuming %s at step %d with changed settings: %s", chosen, step, "; ".join(map(str, changed)))
    return decision


_VAL_PROGRESS, _TRAIN_PROGRESS = "epoch_loop.val_loop.batch_progress", "epoch_loop.batch_progress"
_TRAIN_STATE = "epoch_loop.state_dict"


def validation_due(step: int, requested: dict, *, max_steps: int) -> bool:
    """Whether the run validates right after optimizer step `step` (the schedule recurlen.training.finetune gives
    the Trainer: every trainer.val_every_n_steps steps, or once at max_steps when that is 0)."""
    t = requested.get("trainer") or {}
    every = int(t.get("val_every_n_steps") or 0)
    every = min(every if every > 0 else max_steps, max_steps)
    return every > 0 and step > 0 and step % every == 0 and float(t.get("limit_val_batches", 1.0) or 0) > 0


def revalidate_pending(ckpt: dict, *, due: bool) -> None:
    """Make Lightning's resume from a step whose validation was due (`due`) run that validation exactly when the
    checkpoint does not include it, and log every later step at its own step.

    Lightning reads where in the loop a checkpoint was written from its progress counters:
      - at the end of a training step, before the step's validation (recurlen's periodic checkpoints). Lightning
        assumes the validation ran and skips it ("fast-forward to the end of evaluation"); when the process died
        during that validation (kill -9, a lost node) its metrics were never logged;
      - after the step's end was counted, which Lightning takes for "at the end of the validation", written before
        the logging step moves on. recurlen writes these when training ends (a stop signal, the last step): after
        the logging step moved on, so Lightning's resume, which moves it on once more, would log every later step
        one step late. And a stop signal skips a due validation so that the checkpoint comes first
        (recurlen.training.preemption records `stopped_after: step` in its callback state): it was never run.
    Either way the resumed run's logs (and the diagnostics run with each validation) would differ from the
    uninterrupted run's: a hole in the validation curve, or every later point shifted. Here the loaded checkpoint is
    made to look like one written as that validation began when it is pending (Lightning then runs it first, then
    trains on), or at its end when it ran. Running it again when it had in fact finished (a periodic checkpoint whose
    process died after the validation) is harmless: the callbacks' state in the checkpoint is from before it, and it
    logs the same values at the same step.

    Only Lightning's loop counters change, in the loaded checkpoint (the file stays as it is). Every resume first
    makes the validation counters consistent again, so the mark a validation run this way leaves in a later
    checkpoint never counts as a validation in progress."""
    loops = ckpt.get("loops")
    fit = loops.get("fit_loop") if isinstance(loops, dict) else None
    if not isinstance(fit, dict) or any(key not in fit for key in (_VAL_PROGRESS, _TRAIN_PROGRESS, _TRAIN_STATE)):
        return  # not written by a Lightning training loop this code knows: leave it as it is
    val, train = fit[_VAL_PROGRESS], fit[_TRAIN_PROGRESS]
    done = val["total"]["completed"]
    val["total"].update(ready=done, started=done, processed=done)
    t = train["total"]
    if not due or not t["started"] == t["ready"] == t["processed"]:
        return
    if t["completed"] == t["processed"] - 1:  # the end of a step: the validation is to come
        for part in ("total", "current"):  # what Lightning itself counts when it resumes from the end of a step
            train[part]["completed"] += 1
    elif t["completed"] == t["processed"]:  # training ended: the logging step has already moved on
        fit[_TRAIN_STATE]["_batches_that_stepped"] -= 1
        stopped = (ckpt.get("callbacks") or {}).get("Preemption") or {}
        if stopped.get("stopped_after") != "step":
            return  # the validation ran before the checkpoint: Lightning skips it and moves the logging step on
    else:
        return
    # One validation batch started, none processed: Lightning runs the validation, then moves the logging step on.
    val["total"].update(ready=done + 1, started=done + 1)
    val["current"].update(ready=1, started=1, processed=0, completed=0)


def _archive_stamp(run: RunDir, prefix: str = "") -> Path:
    stamp = prefix + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    target = run.archive / stamp
    n = 1
    while target.exists():
        target = run.archive / f"{stamp}-{n}"
        n += 1
    return target


def _archive_later_checkpoints(run: RunDir, chosen: Path, step: int) -> str | None:
    """A roll-back (resume= an older checkpoint of this run): the checkpoints past it belong to the abandoned line
    and would otherwise win the next automatic resume (candidates are ordered by step). They are moved, not
    deleted, to archive/rollback-<time>/."""
    later = [p for p, held in run.checkpoint_steps() if p.resolve() != chosen.resolve() and (held or -1) > step]
    if not later:
        return None
    target = _archive_stamp(run, "rollback-")
    target.mkdir(parents=True)
    for path in later:
        shutil.move(str(path), str(target / path.name))
    log.info("rolled back to %s (step %d): the later checkpoints (%s) moved to %s", chosen.name, step,
             ", ".join(p.name for p in later), target)
    return str(target)


def _fresh(run: RunDir, resume: str, rank: int) -> Decision:
    found = run.run_files() if rank == 0 else []
    if not found:
        return Decision()
    names = ", ".join(p.name for p in found)
    if resume == "never":
        raise UserError(f"resume=never but {run.path} already holds a run ({names}); add resume=archive to move it "
                        f"to {run.archive}/<time>/ and start over, choose another run_dir, or resume=auto to continue "
                        "it")
    target = _archive_stamp(run)
    target.mkdir(parents=True)
    for path in found:
        shutil.move(str(path), str(target / path.name))
    log.info("resume=archive: moved the earlier run (%s) to %s; starting a new run", names, target)
    return Decision(archived_to=str(target))


def record(run: RunDir, resolved: dict, decision: Decision, *, note: dict | None = None) -> None:
    """After the decision: config.yaml holds what the run uses now; config_history.yaml says when it started and
    what every resume changed (and `note`, e.g. why an automatic rollback happened). Rank 0 only; nothing is
    written for a finished run that trains nothing."""
    if decision.finished:
        return
    entry: dict[str, Any] = {"time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if decision.checkpoint is None:
        entry["event"] = "start"
        if decision.archived_to:
            entry["archived_earlier_run_to"] = decision.archived_to
    elif decision.changed or decision.moved_aside or decision.archived_to:
        entry.update(event="resume", step=decision.step, checkpoint=decision.checkpoint)
        if decision.changed:
            entry["changed"] = {d.key: {"from": d.old, "to": d.new} for d in decision.changed}
        if decision.archived_to:
            entry["rolled_back_later_checkpoints_to"] = decision.archived_to
    else:
        entry = {}
    if decision.moved_aside:
        entry["moved_aside_as_damaged"] = list(decision.moved_aside)
    if note:
        entry = {"time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), **entry, **note}
    if entry:
        history = []
        if run.history_file.is_file():
            loaded = OmegaConf.to_container(OmegaConf.load(run.history_file))
            history = list(loaded) if isinstance(loaded, list) else []
        write_text(run.history_file, OmegaConf.to_yaml(OmegaConf.create(history + [entry])))
    run.save_config(resolved)


__all__ = ["CHANGEABLE", "FIXED", "Damaged", "Decision", "Difference", "ModelMismatch", "checkpoint_to_read",
           "config_differences",
           "decide", "kind_of", "move_aside", "newest_finite_checkpoint", "record", "resume_refusal",
           "revalidate_pending", "validate_checkpoint", "validation_due"]
