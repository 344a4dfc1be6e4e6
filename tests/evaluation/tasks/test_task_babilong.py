"""BABILong: the release's file layouts and fields, its label-set metric, the offline generator, a tiny run."""

import json
import re

import numpy as np
import pytest

from recurlen.evaluation.tasks.babilong import (
    ANSWER,
    PROMPT,
    TASK_LABELS,
    babilong_correct,
    generate_records,
    load_babilong,
    prompt_text,
    write_babilong_dir,
)
from recurlen.evaluation.tasks.babilong_gen import Haystack, make_story
from recurlen.util.tokenizers import ByteTokenizer

RECORDS = [
    {"input": "Noise noise. Mary went to the kitchen. More noise.", "question": "Where is Mary?", "target": "kitchen"},
    {"input": "John got the milk there. John moved to the office.", "question": "Where is the milk?",
     "target": "office"},
]


def test_loader_reads_every_public_layout(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset, DatasetDict

    root = tmp_path / "babilong"
    (root / "1k").mkdir(parents=True)
    # jsonl, one record per line (extra fields are dropped)
    (root / "1k" / "qa1.jsonl").write_text("".join(json.dumps({**r, "extra": 1}) + "\n" for r in RECORDS))
    # the hub snapshot: <length>/<task>-00000-of-00001.parquet
    (root / "2k").mkdir()
    pq.write_table(pa.Table.from_pylist(RECORDS), root / "2k" / "qa2-00000-of-00001.parquet")
    # the train sets' task-first layout: data/<task>/<length>.json holding a list
    (root / "data" / "qa3").mkdir(parents=True)
    (root / "data" / "qa3" / "4k.json").write_text(json.dumps(RECORDS))
    # a DatasetDict saved with save_to_disk, splits named by task
    DatasetDict({"qa4": Dataset.from_list(RECORDS)}).save_to_disk(str(root / "8k"))

    for task, length in (("qa1", "1k"), ("qa2", "2k"), ("qa3", "4k"), ("qa4", "8k")):
        assert load_babilong(str(root), task=task, length=length) == RECORDS, (task, length)
    written = write_babilong_dir(tmp_path / "out", {("16k", "qa5"): RECORDS})
    assert written == [tmp_path / "out" / "16k" / "qa5.jsonl"]
    assert load_babilong(str(tmp_path / "out"), task="qa5", length="16k") == RECORDS


def test_loader_errors_name_the_problem(tmp_path):
    (tmp_path / "0k").mkdir()
    bad = [{"input": "x", "target": "kitchen"}]
    (tmp_path / "0k" / "qa1.jsonl").write_text(json.dumps(bad[0]) + "\n")
    with pytest.raises(ValueError, match=r"qa1.jsonl: record 0 is missing field\(s\) \['question'\]"):
        load_babilong(str(tmp_path), task="qa1", length="0k")
    with pytest.raises(ValueError, match="BABILong task 'qa21' does not exist; allowed: .*'qa20'"):
        load_babilong(str(tmp_path), task="qa21", length="0k")
    with pytest.raises(FileNotFoundError, match="no BABILong data for length '1k', task 'qa1'"):
        load_babilong(str(tmp_path), task="qa1", length="1k")
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_babilong(str(tmp_path / "absent"), task="qa1", length="0k")


def test_label_set_metric_matches_the_release():
    labels = TASK_LABELS["qa1"]
    assert babilong_correct(" kitchen", "kitchen", "Where is Mary?", labels)
    assert babilong_correct(" The most recent location of Mary is KITCHEN.", "kitchen", "Where is Mary?", labels)
    assert not babilong_correct(" kitchen or garden", "kitchen", "Where is Mary?", labels)  # two labels: wrong
    assert not babilong_correct(" garden", "kitchen", "Where is Mary?", labels)
    assert not babilong_correct(" ", "kitchen", "Where is Mary?", labels)
    assert babilong_correct(" garden. Then the kitchen", "garden", "Where is Mary?", labels)  # first sentence only
    # labels named in the question never count: "before the kitchen" does not make this ambiguous
    assert babilong_correct(" Before the kitchen the apple was in the garden", "garden",
                            "Where was the apple before the kitchen?", labels)
    assert not babilong_correct(" kitchen", "kitchen", "Where was the apple before the kitchen?", labels)
    with pytest.raises(ValueError, match="label set is empty"):
        babilong_correct("x", "y", "z", [])


_FACT = re.compile(r"^(Mary|John|Daniel|Sandra) (moved to|went to|journeyed to|travelled to|went back to|picked up|"
                   r"got|grabbed|took|dropped|discarded|put down|left) the (\w+)( there)?\.$")


def _rederive(facts: list[str], question: str) -> str:
    """An independent reading of a story: replay the sentences, answer the question."""
    where, holding, trail = {}, {}, {}
    for fact in facts:
        who, verb, thing, _ = _FACT.match(fact).groups()
        if verb in ("picked up", "got", "grabbed", "took"):
            holding[thing] = who
            trail.setdefault(thing, [])
            if not trail[thing] or trail[thing][-1] != where[who]:
                trail[thing].append(where[who])
        elif verb in ("dropped", "discarded", "put down", "left"):
            holding.pop(thing)
        else:
            where[who] = thing
            for obj, carrier in holding.items():
                if carrier == who and trail[obj][-1] != thing:
                    trail[obj].append(thing)
    if m := re.fullmatch(r"Where is (Mary|John|Daniel|Sandra)\?", question):
        return where[m.group(1)]
    if m := re.fullmatch(r"Where is the (\w+)\?", question):
        return trail[m.group(1)][-1]
    m = re.fullmatch(r"Where was the (\w+) before the (\w+)\?", question)
    rooms = trail[m.group(1)]
    assert rooms.count(m.group(2)) == 1, "the question must be unambiguous"
    return rooms[rooms.index(m.group(2)) - 1]


@pytest.mark.parametrize("task", ["qa1", "qa2", "qa3"])
def test_generated_answers_are_correct_by_construction(task):
    rng = np.random.default_rng(7)
    carried = 0
    for _ in range(300):
        story = make_story(rng, task, num_facts=8)
        assert len(story.facts) == 8 and all(_FACT.match(f) for f in story.facts)
        assert _rederive(story.facts, story.question) == story.answer
        carried += task != "qa1" and any(v in f for f in story.facts for v in ("got", "took", "grabbed", "picked"))
    assert task == "qa1" or carried == 300  # qa2 / qa3 stories always involve a carried object


@pytest.mark.parametrize("task", ["qa1", "qa2", "qa3"])
def test_generated_records_hide_the_facts_at_the_requested_length(task):
    tok = ByteTokenizer()
    hay = Haystack(tok, "embedded", min_tokens=4096)
    records = generate_records(tok, task=task, length=1024, num=20, seed=3, num_facts=5, haystack=hay)
    for r in records:
        assert len(tok.encode(prompt_text(r))) == 1024  # exact in tokens for the byte tokenizer
        facts = [line for line in r["input"].split("\n") if _FACT.match(line)]
        assert len(facts) == 5
        assert _rederive(facts, r["question"]) == r["target"]
        assert r["target"] in TASK_LABELS[task]
    facts_only = generate_records(tok, task=task, length=0, num=3, seed=3, num_facts=5, haystack=hay)
    assert all("\n" not in r["input"] and r["input"].count(".") == 5 for r in facts_only)  # BABILong's 0k


def test_generator_bad_inputs():
    tok = ByteTokenizer()
    hay = Haystack(tok, "filler", min_tokens=1024)
    with pytest.raises(ValueError, match=r"length 100 is too short: a prompt with 5 facts can take \d+ tokens"):
        generate_records(tok, task="qa1", length=100, num=1, seed=0, num_facts=5, haystack=hay)
    with pytest.raises(ValueError, match=r"no task 'qa4'; allowed: \['qa1', 'qa2', 'qa3'\]"):
        make_story(np.random.default_rng(0), "qa4", num_facts=5)
    with pytest.raises(ValueError, match="task qa3 needs num_facts >= 3"):
        make_story(np.random.default_rng(0), "qa3", num_facts=2)


def test_config_rejects_unknown_and_ungeneratable_tasks():
    from recurlen.evaluation.tasks.config import load_task_experiment

    with pytest.raises(ValueError, match="task.babilong.tasks has 'qa0', which does not exist"):
        load_task_experiment(["experiment=babilong", "task.babilong.tasks=[qa0]"])
    with pytest.raises(ValueError, match=r"tasks \['qa5'\] cannot be generated offline"):
        load_task_experiment(["experiment=babilong", "task.babilong.tasks=[qa1,qa5]"])
    with pytest.raises(ValueError, match=r"num_facts=2 is too few for generated \['qa1', 'qa3'\] stories; need >= 3"):
        load_task_experiment(["experiment=babilong", "task.babilong.tasks=[qa1,qa3]", "task.babilong.num_facts=2"])
    with pytest.raises(ValueError, match=r"task.name='babylon' is unknown; allowed: \['passkey', 'babilong', 'copy"):
        load_task_experiment(["experiment=babilong", "task.name=babylon"])


def test_training_examples_fit_the_context_and_score_the_answer():
    from recurlen.evaluation.tasks.babilong import training_example_fn
    from recurlen.evaluation.tasks.config import BabilongConfig

    tok = ByteTokenizer()
    make = training_example_fn(BabilongConfig(num_facts=3, haystack="filler"), tok, seq_len=300)
    for seed in range(20):
        ex = make(np.random.default_rng(seed))
        assert len(ex.ids) == 301 and ex.ids[-1] == tok.eos_id
        prompt, answer = tok.decode(ex.ids[:ex.answer_start]), tok.decode(ex.ids[ex.answer_start:-1])
        assert prompt.startswith("<context>\n") and prompt.endswith("\nAnswer:")
        assert answer.strip() in TASK_LABELS["qa1"] and ANSWER.format(target=answer.strip()) == answer
    with pytest.raises(ValueError, match=r"data.seq_len=100 is too short for BABILong fine-tuning with 3 facts"):
        training_example_fn(BabilongConfig(num_facts=3), tok, seq_len=100)
    assert PROMPT.count("{input}") == 1


def test_tiny_babilong_run_writes_results_and_the_records(tmp_path, run_tiny_task):
    path = run_tiny_task("babilong", "data.seq_len=224", "data.batch_size=2", "trainer.max_steps=2",
                         "trainer.val_every_n_steps=2", "intervention.fit_batches=1", "task.lengths=[0,224,300]",
                         "task.trials=2", "task.babilong.num_facts=3", "task.babilong.haystack=filler")
    res = json.loads(path.read_text())
    assert res["format"] == "recurlen.tasks.babilong/1" and res["tasks"] == ["qa1", "qa2", "qa3"]
    assert res["labels"] == ["0k", "224", "300"] and np.array(res["accuracy"]).shape == (3, 3)
    assert len(res["cells"]) == 9 and all(c["n"] == 2 and c["accuracy"] == c["correct"] / 2 for c in res["cells"])
    assert [c["mean_prompt_tokens"] for c in res["cells"] if c["task"] == "qa1"][1:] == [224.0, 300.0]
    means = [np.mean([c["accuracy"] for c in res["cells"] if c["length"] == n]) for n in (0, 224, 300)]
    assert [res["mean_accuracy_by_length"][k] for k in ("0", "224", "300")] == pytest.approx(means)
    assert (path.parent / res["plots"]["figure"]).read_bytes()[:4] == b"\x89PNG"
    from recurlen.commands.report import write_report

    text = write_report([path], out_dir=tmp_path / "report").read_text()
    acc = res["accuracy"][1]  # qa2
    assert f"| qa2 | {acc[0]:.2f} | {acc[1]:.2f} | {acc[2]:.2f} |" in text
    # the evaluated records were written in the release's format and read back by the loader
    again = load_babilong(str(path.parent / "data"), task="qa2", length="300")
    assert len(again) == 2 and [r["target"] for r in again] == [e["target"] for e in res["cells"][5]["examples"]]


def test_few_shot_prompt_is_the_release_format_and_fits_lengths_exactly():
    from recurlen.evaluation.tasks.babilong import training_example_fn
    from recurlen.evaluation.tasks.babilong_prompts import prompt_template
    from recurlen.evaluation.tasks.config import BabilongConfig

    tpl = prompt_template("qa1", "few_shot")
    text = tpl.format(input="CTX", question="Where is Mary?")
    assert text.startswith("I will give you context with the facts about positions of different persons")
    assert "Answer: The most recent location of Charlie is balcony.\n</example>\n\n<example>\nAlan moved" in text
    # instruction, examples and post-prompt joined by single newlines, the post-prompt's trailing space kept
    assert "use the latest location to answer the question.\n<example>" in text
    assert text.endswith("Do not write anything else after that. \n<context>\nCTX\n</context>\n"
                         "Question: Where is Mary?\nAnswer:")
    assert prompt_template("qa1", "plain") == PROMPT
    tok = ByteTokenizer()
    hay = Haystack(tok, "filler", min_tokens=4096)
    for task in ("qa1", "qa2", "qa3"):
        recs = generate_records(tok, task=task, length=2048, num=3, seed=0, num_facts=4, haystack=hay,
                                prompt="few_shot")
        assert all(len(tok.encode(prompt_text(r, prompt_template(task, "few_shot")))) == 2048 for r in recs)
    make = training_example_fn(BabilongConfig(num_facts=3, haystack="filler", prompt="few_shot"), tok, seq_len=1600)
    ex = make(np.random.default_rng(0))
    prompt = tok.decode(ex.ids[:ex.answer_start])
    assert len(ex.ids) == 1601 and "<example>" in prompt and prompt.endswith("\nAnswer:")
    with pytest.raises(ValueError, match=r"too short for BABILong fine-tuning with 3 facts and the few_shot prompt"):
        training_example_fn(BabilongConfig(num_facts=3, prompt="few_shot"), tok, seq_len=400)
    with pytest.raises(ValueError, match=r"prompt=few_shot has examples for \['qa1', 'qa2', 'qa3', 'qa4', 'qa5'\]"):
        BabilongConfig(source="hf:x", train_source="hf:x", tasks=["qa1", "qa6"], prompt="few_shot")
    with pytest.raises(ValueError, match=r"task.babilong.prompt='chat' is unknown; allowed: \['plain', 'few_shot'\]"):
        BabilongConfig(prompt="chat")


@pytest.mark.slow
def test_babilong_fine_tunes_a_corpus_post_trained_run(tmp_path, run_tiny_task, experiment):
    """The paper's flow for SP / TBTT: corpus post-training with the intervention, then the task fine-tune."""
    import torch

    from recurlen.training.finetune import run_finetune

    with pytest.raises(ValueError, match=r"follow the paper: post-train on the corpus with tbptt"):
        run_tiny_task("babilong", "intervention=tbptt")
    post = tmp_path / "post"
    run_finetune(experiment(post, "intervention=tbptt", "data.seq_len=32", "data.batch_size=2",
                            "data.max_documents=40", "data.val_sequences=0", "data.val_segments=2"))
    path = run_tiny_task("babilong", f"model.pretrained={post}", "intervention=none", "data.seq_len=224",
                         "data.batch_size=2", "trainer.max_steps=2", "trainer.val_every_n_steps=2",
                         "task.lengths=[224]", "task.trials=2", "task.babilong.num_facts=3",
                         "task.babilong.haystack=filler", "task.babilong.tasks=[qa1]")
    res = json.loads(path.read_text())
    assert res["starting_model"] == {"path": str(post), "intervention": "tbptt", "train_seq_len": 32}
    assert res["intervention"] == "none" and res["prompt"] == "plain"
    # the task fine-tune started from the post-trained weights, not from a fresh model
    start = torch.load(post / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    tuned = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert start.keys() == tuned.keys()
    drift = max((start[k] - tuned[k]).abs().max().item() for k in start)
    assert 0 < drift < 0.05
