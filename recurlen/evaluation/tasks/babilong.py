"""BABILong (Kuratov et al., 2024): bAbI questions whose facts hide in long text. Loader, prompt, metric.

Records have the fields of the public release (HF dataset RMT-team/babilong; configurations are lengths
'0k', '1k', '2k', '4k', ..., '128k', ..., splits are tasks 'qa1'..'qa20'):
    input     the context: facts hidden in background text
    question  e.g. "Where is Mary?"
    target    e.g. "kitchen"

Sources (task.babilong.source):
  'generate'          the offline generator of recurlen.evaluation.tasks.babilong_gen (qa1-qa3)
  a local directory   any of these layouts, looked up in this order for (length L, task t):
                        <dir>/<L>/<t>.jsonl | <t>.json | <t>.parquet | <t>-*.parquet   (a hub snapshot)
                        <dir>/<t>/<L>.jsonl | <L>.json | <L>.parquet, also under <dir>/data/ (train sets)
                        <dir>/<L>/  saved with DatasetDict.save_to_disk, splits named by task
                      .json holds a list of records (or {"data": [...]}), .jsonl one record per line
  'hf:<name>'         datasets.load_dataset(<name>, L, split=t): the local HF cache, or the hub when online

Prompt (for base and fine-tuned LMs; the release's instruction/examples preamble is for chat models):
    <context>\\n{input}\\n</context>\\n\\nQuestion: {question}\\nAnswer:     -> " {target}" EOS

Metric (the release's `compare_answers`, babilong/metrics.py): lower-case the output, keep its first
sentence (up to the first '.'), find which labels of the task's label set occur in it, drop those that
also occur in the question; correct iff the target is among them and is the only one.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from recurlen.evaluation.tasks.babilong_prompts import PLAIN, prompt_template
from recurlen.evaluation.tasks.common import TaskExample, greedy_answers, length_label
from recurlen.evaluation.tasks.config import BABILONG_TASKS, BabilongConfig
from recurlen.models.interface import RecurrentLM
from recurlen.util.atomic_files import write_text
from recurlen.util.tokenizers import Tokenizer

if TYPE_CHECKING:
    from recurlen.evaluation.tasks.babilong_gen import Haystack

log = logging.getLogger(__name__)

FIELDS = ("input", "question", "target")
PROMPT = PLAIN
ANSWER = " {target}"
# The label sets of the BABILong release (babilong/metrics.py; the lm-evaluation-harness copy lists all 20).
TASK_LABELS: dict[str, tuple[str, ...]] = {
    **{t: ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office") for t in ("qa1", "qa2", "qa3", "qa4",
                                                                                       "qa11", "qa12", "qa13")},
    "qa5": ("Bill", "Fred", "Jeff", "Mary", "apple", "football", "milk"),
    "qa6": ("no", "yes"), "qa7": ("none", "one", "three", "two"), "qa8": ("apple", "football", "milk", "nothing"),
    "qa9": ("no", "yes"), "qa10": ("maybe", "no", "yes"),
    "qa14": ("bedroom", "cinema", "kitchen", "office", "park", "school"), "qa15": ("cat", "mouse", "sheep", "wolf"),
    "qa16": ("gray", "green", "white", "yellow"), "qa17": ("no", "yes"), "qa18": ("no", "yes"),
    "qa19": ("e,e", "e,n", "e,s", "n,e", "n,n", "n,w", "s,e", "s,s", "s,w", "w,n", "w,s", "w,w"),
    "qa20": ("bedroom", "bored", "garden", "hungry", "kitchen", "thirsty", "tired"),
}


# ------------------------------------------------------------------ metric
def preprocess_output(output: str) -> str:
    output = output.lower().split(".")[0]  # the first sentence only
    for marker in ("<context>", "<example>", "question"):  # a model that runs on into another example
        output = output.split(marker)[0]
    return output


def babilong_correct(output: str, target: str, question: str, labels: tuple[str, ...] | list[str]) -> bool:
    """The release's label-set match: the target is the only label in the answer (labels in the question ignored)."""
    if not labels:
        raise ValueError("the label set is empty; the BABILong metric needs the task's labels")
    out = preprocess_output(output)
    labels_lc = {label.lower() for label in labels}
    in_question = {label for label in labels_lc if label in question.lower()}
    in_output = {label for label in labels_lc if label in out} - in_question
    return target.lower() in in_output and len(in_output) == 1


def task_labels(task: str, records: list[dict] | None = None) -> tuple[str, ...]:
    """The release's label set of `task`; for a task it does not list, the targets seen in `records`."""
    if task in TASK_LABELS:
        return TASK_LABELS[task]
    if not records:
        raise ValueError(f"BABILong task {task!r} has no known label set and no records to derive one from; known: "
                         f"{sorted(TASK_LABELS)}")
    return tuple(sorted({r["target"] for r in records}))


# ------------------------------------------------------------------ loading
def check_records(records: list[dict], *, where: str) -> list[dict]:
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise ValueError(f"{where}: record {i} is a {type(r).__name__}, not a mapping with fields {list(FIELDS)}")
        missing = [f for f in FIELDS if f not in r]
        if missing:
            raise ValueError(f"{where}: record {i} is missing field(s) {missing}; BABILong records need "
                             f"{list(FIELDS)} (has {sorted(r)})")
        for f in FIELDS:
            if not isinstance(r[f], str):
                raise ValueError(f"{where}: record {i} field {f!r} is a {type(r[f]).__name__}, not text")
    return [{f: r[f] for f in FIELDS} for r in records]


def _read_file(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "data" in data:
            data = data["data"]
        if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):  # column layout
            keys = list(data)
            return [dict(zip(keys, row)) for row in zip(*data.values())]
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a list of records (or {{'data': [...]}}); got {type(data).__name__}")
        return data
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _candidates(root: Path, length: str, task: str) -> list[Path]:
    out = []
    for folder, stem in ((root / length, task), (root / task, length), (root / "data" / task, length)):
        out += [folder / f"{stem}{ext}" for ext in (".jsonl", ".json", ".parquet")]
        out += sorted(folder.glob(f"{stem}-*.parquet")) if folder.is_dir() else []
    return out


def load_babilong(source: str, *, task: str, length: str) -> list[dict]:
    """Records of (length configuration, task) from a local directory or 'hf:<name>'."""
    if task not in BABILONG_TASKS:
        raise ValueError(f"BABILong task {task!r} does not exist; allowed: {list(BABILONG_TASKS)}")
    if source.startswith("hf:"):
        from datasets import load_dataset

        ds = load_dataset(source[3:], length, split=task)
        return check_records(list(ds), where=f"{source} {length}/{task}")
    root = Path(source).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"BABILong source {source!r} is not a directory; use 'generate', a directory or "
                                "'hf:RMT-team/babilong'")
    files = [p for p in _candidates(root, length, task) if p.is_file()]
    parquet_shards = [p for p in files if p.name.startswith(f"{task}-")]
    if parquet_shards:
        return check_records([r for p in parquet_shards for r in _read_file(p)], where=str(parquet_shards[0]))
    if files:
        return check_records(_read_file(files[0]), where=str(files[0]))
    saved = root / length
    if (saved / "dataset_dict.json").is_file():
        from datasets import load_from_disk

        dd = load_from_disk(str(saved))
        if task not in dd:
            raise FileNotFoundError(f"{saved} (a saved DatasetDict) has no split {task!r}; it has {sorted(dd)}")
        return check_records(list(dd[task]), where=f"{saved}[{task}]")
    raise FileNotFoundError(f"no BABILong data for length {length!r}, task {task!r} under {root}; looked for "
                            f"{root}/{length}/{task}.jsonl|.json|.parquet|-*.parquet, {root}/{task}/{length}.*, and a "
                            f"saved DatasetDict at {saved}")


def write_babilong_dir(root: str | Path, records: dict[tuple[str, str], list[dict]]) -> list[Path]:
    """Write {(length label, task): records} as <root>/<length>/<task>.jsonl (the layout load_babilong reads)."""
    paths = []
    for (length, task), recs in records.items():
        path = Path(root) / length / f"{task}.jsonl"
        lines = [json.dumps({f: r[f] for f in FIELDS}) + "\n" for r in check_records(recs, where=str(path))]
        paths.append(write_text(path, "".join(lines)))
    return paths


# ------------------------------------------------------------------ prompts and examples
def prompt_text(record: dict, template: str = PROMPT) -> str:
    return template.format(input=record["input"], question=record["question"])


def generate_records(tokenizer: Tokenizer, *, task: str, length: int, num: int, seed: int, num_facts: int,
                     haystack: Haystack, prompt: str = "plain") -> list[dict]:
    """`num` generated records whose prompts (in style `prompt`) are `length` tokens (0: the facts alone, as in
    '0k': the prompt is then the facts and the prompt's own text)."""
    from recurlen.evaluation.tasks.babilong_gen import hide_facts, make_story, worst_case_tokens

    template = prompt_template(task, prompt)
    need = worst_case_tokens(tokenizer, template, num_facts=num_facts)
    if length and length < need:
        raise ValueError(f"BABILong length {length} is too short: a prompt with {num_facts} facts can take {need} "
                         f"tokens with this tokenizer; use lengths >= {need} (or 0 for the facts alone)")
    rng = np.random.default_rng([seed, length, int(task[2:])])
    records = []
    for _ in range(num):
        story = make_story(rng, task, num_facts=num_facts)
        shell = len(tokenizer.encode(template.format(input="", question=story.question)))
        n_ctx = 0 if length == 0 else length - shell
        ctx = hide_facts(rng, story.facts, n_tokens=n_ctx, haystack=haystack)
        records.append({"input": tokenizer.decode(ctx), "question": story.question, "target": story.answer})
    return records


def training_example_fn(cfg: BabilongConfig, tokenizer: Tokenizer, *, seq_len: int):
    """rng -> TaskExample at data.seq_len: a generated story (uniform over cfg.tasks) hidden in haystack text,
    or a record of train_source at train_length that fits. The loss is on the answer and its EOS."""
    eos = tokenizer.eos_id
    templates = {t: prompt_template(t, cfg.prompt) for t in cfg.tasks}
    if cfg.train_source == "generate":
        from recurlen.evaluation.tasks.babilong_gen import Haystack, hide_facts, make_story, worst_case_tokens

        need = max(worst_case_tokens(tokenizer, tpl + ANSWER, num_facts=cfg.num_facts) for tpl in templates.values())
        need += 1  # EOS
        if seq_len + 1 < need:
            raise ValueError(f"data.seq_len={seq_len} is too short for BABILong fine-tuning with {cfg.num_facts} "
                             f"facts and the {cfg.prompt} prompt: an example can take {need} tokens; need "
                             f"data.seq_len >= {need - 1}")
        haystack = Haystack(tokenizer, cfg.haystack, min_tokens=seq_len)

        def generated(rng: np.random.Generator) -> TaskExample:
            task = cfg.tasks[int(rng.integers(len(cfg.tasks)))]
            story = make_story(rng, task, num_facts=cfg.num_facts)
            head, tail = templates[task].split("{input}")
            head = head.replace("{{", "{").replace("}}", "}")
            head_ids, tail_ids = tokenizer.encode(head), tokenizer.encode(tail.format(question=story.question))
            answer = tokenizer.encode(ANSWER.format(target=story.answer)) + [eos]
            n_ctx = seq_len + 1 - len(head_ids) - len(tail_ids) - len(answer)
            prompt = head_ids + hide_facts(rng, story.facts, n_tokens=n_ctx, haystack=haystack) + tail_ids
            return TaskExample(ids=prompt + answer, answer_start=len(prompt))

        return generated
    fitting = []
    for task in cfg.tasks:
        for r in load_babilong(cfg.train_source, task=task, length=cfg.train_length):
            prompt = tokenizer.encode(prompt_text(r, templates[task]))
            ids = prompt + tokenizer.encode(ANSWER.format(target=r["target"])) + [eos]
            if len(ids) <= seq_len + 1:
                fitting.append(TaskExample(ids=ids, answer_start=len(prompt)))
    if not fitting:
        raise ValueError(f"no BABILong record of {cfg.train_source} at {cfg.train_length} fits data.seq_len={seq_len}; "
                         "raise data.seq_len or pick a shorter train_length")
    log.info("BABILong fine-tuning on %d records of %s at %s", len(fitting), cfg.train_source, cfg.train_length)
    return lambda rng: fitting[int(rng.integers(len(fitting)))]


# ------------------------------------------------------------------ evaluation
def evaluate_babilong(model: RecurrentLM, tokenizer: Tokenizer, cells: dict[tuple[str, int], list[dict]], *,
                      batch_size: int, chunk_len: int, max_new_tokens: int, prompt: str = "plain",
                      progress: bool = True) -> dict:
    """Accuracy per (task, length) with the release's metric; `cells` maps (task, length) to records, asked
    in prompt style `prompt`."""
    results = []
    for i, ((task, length), records) in enumerate(cells.items()):
        labels = task_labels(task, records)
        template = prompt_template(task, prompt)
        prompts = [tokenizer.encode(prompt_text(r, template)) for r in records]
        desc = f"babilong {task} {length_label(length)} ({i + 1}/{len(cells)})"
        outs = greedy_answers(model, prompts, max_new_tokens=max_new_tokens, stop_id=tokenizer.eos_id,
                              batch_size=batch_size, chunk_len=chunk_len, desc=desc if progress else None)
        texts = [tokenizer.decode(o) for o in outs]
        correct = [babilong_correct(t, r["target"], r["question"], labels) for t, r in zip(texts, records)]
        results.append({"task": task, "length": length, "label": length_label(length), "n": len(records),
                        "correct": int(sum(correct)), "accuracy": float(np.mean(correct)),
                        "mean_prompt_tokens": float(np.mean([len(p) for p in prompts])),
                        "examples": [{"question": r["question"], "target": r["target"], "output": t}
                                     for r, t in zip(records[:3], texts[:3])]})
        log.info("babilong %s %s: accuracy %.3f (%d/%d)", task, length_label(length), results[-1]["accuracy"],
                 results[-1]["correct"], len(records))
    tasks = list(dict.fromkeys(t for t, _ in cells))
    lengths = list(dict.fromkeys(n for _, n in cells))
    acc = {(c["task"], c["length"]): c["accuracy"] for c in results}
    return {"tasks": tasks, "lengths": lengths, "labels": [length_label(n) for n in lengths], "cells": results,
            "accuracy": [[acc.get((t, n), float("nan")) for n in lengths] for t in tasks],
            "mean_accuracy_by_length": {str(n): float(np.nanmean([acc.get((t, n), np.nan) for t in tasks]))
                                        for n in lengths}}


__all__ = ["ANSWER", "FIELDS", "PROMPT", "TASK_LABELS", "babilong_correct", "check_records", "evaluate_babilong",
           "generate_records", "load_babilong", "preprocess_output", "prompt_text", "task_labels",
           "training_example_fn", "write_babilong_dir"]
