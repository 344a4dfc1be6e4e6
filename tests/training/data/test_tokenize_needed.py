"""data.tokenize=needed: the cache covers what the run reads (and at most one chunk more), a longer run extends it
and reads what a run over the fully tokenized source reads, resume is exact, .jsonl.zst reads like .jsonl, the
dry run says how much and how long; the embedded corpus keeps the whole-source path (the demo's batches)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from recurlen.training.data import DataConfig, RecurlenDataModule, load_corpus, prefix_cache, source_rows
from recurlen.training.data.prefix_cache import PrefixCache
from recurlen.training.data.source_lanes import SourceOrderSampler, missing_tokens, steps_to_cover
from recurlen.training.data.stream import TrainSampler
from recurlen.training.data.tokenize_plan import tokenize_plan
from recurlen.util.tokenizers import ByteTokenizer

CHUNK = 8


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    # Chunks of 8 documents: the cache's overshoot past what the run needs is one chunk.
    monkeypatch.setattr(prefix_cache, "CHUNK_ROWS", CHUNK)


def texts(n: int = 600) -> list[str]:
    rng = random.Random(0)
    words = ["state", "lane", "token", "größe", "scan", "chunk", "\n"]
    return [f"doc {i}: " + " ".join(rng.choices(words, k=rng.randint(3, 60))) for i in range(n)]


def write_jsonl(path: Path, docs: list[str], *, zst: bool) -> Path:
    data = "".join(json.dumps({"text": t}) + "\n" for t in docs).encode()
    if zst:
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


@pytest.fixture
def source(tmp_path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl.zst", texts(), zst=True)


def config(source: Path, cache: Path, **overrides) -> DataConfig:
    cfg = dict(source=str(source), cache_dir=str(cache), tokenize="needed", seq_len=16, batch_size=3,
               val_fraction=0.1, val_segments=4, val_sequences=2, val_length=48, val_mode="windows", num_proc=1)
    return DataConfig(**{**cfg, **overrides})


def batches(dm: RecurlenDataModule, steps: range) -> list[dict[str, torch.Tensor]]:
    return [dm.train_batch(s) for s in steps]


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("layout", ["contiguous", "documents"])
def test_the_cache_covers_the_run_and_at_most_one_chunk_more(tmp_path, source, layout):
    cfg = config(source, tmp_path / "cache", layout=layout)
    dm = RecurlenDataModule(cfg, steps=10)
    dm.setup()
    corpus = dm.corpus
    assert isinstance(dm.sampler, SourceOrderSampler)
    assert dm.sampler.covered >= steps_to_cover(10)
    assert 0 < corpus.num_documents < 300, "a prefix of the 600 documents, not all of them"
    # One chunk fewer would not cover the run: nothing past the margin and the last chunk was tokenized.
    cut = corpus.num_documents - CHUNK
    from recurlen.training.data.corpus import Corpus

    shorter = Corpus(corpus.tokens[:corpus.offsets[cut]], corpus.offsets[:cut + 1], corpus.doc_hash[:cut])
    assert missing_tokens(shorter, cfg, steps=steps_to_cover(10), num_global_lanes=3) > 0
    assert dm.long_validation_sequences().shape == (2, 48)


@pytest.mark.parametrize("layout", ["contiguous", "documents", "independent"])
def test_a_longer_run_extends_the_cache_and_reads_what_the_whole_source_gives(tmp_path, source, layout, monkeypatch):
    short = RecurlenDataModule(config(source, tmp_path / "cache", layout=layout), steps=5)
    short.setup()
    first = short.corpus.meta["rows_read"]
    first_tokens = bytes(np.asarray(short.corpus.tokens))
    skips = []
    real = source_rows.iter_rows
    monkeypatch.setattr(prefix_cache, "iter_rows", lambda *a, skip=0: skips.append(skip) or real(*a, skip=skip))
    longer = RecurlenDataModule(config(source, tmp_path / "cache", layout=layout), steps=300)
    longer.setup()
    assert longer.corpus.meta["rows_read"] > first
    assert skips == [first], "the extension starts where the cache ends: nothing is tokenized twice"
    assert bytes(np.asarray(longer.corpus.tokens))[:len(first_tokens)] == first_tokens
    monkeypatch.setattr(prefix_cache, "iter_rows", real)

    whole_cfg = config(source, tmp_path / "whole", layout=layout)
    PrefixCache(whole_cfg, ByteTokenizer()).extend(lambda c: 1 << 40)  # every document, up front
    whole = RecurlenDataModule(whole_cfg, steps=300)
    whole.setup()
    assert whole.corpus.meta["complete"] and whole.corpus.num_documents > longer.corpus.num_documents
    assert_same(batches(longer, range(300)), batches(whole, range(300)))
    assert_same(batches(short, range(5)), batches(whole, range(5)))
    assert torch.equal(longer.long_validation_sequences(), whole.long_validation_sequences())
    val = [b["input_ids"] for b in longer.val_dataloader()]
    assert all(torch.equal(a, b["input_ids"]) for a, b in zip(val, whole.val_dataloader()))


def test_a_step_past_the_cache_extends_it_and_resume_is_exact(tmp_path, source):
    cfg = config(source, tmp_path / "cache", layout="contiguous")
    dm = RecurlenDataModule(cfg, steps=4)
    dm.setup()
    covered = dm.sampler.covered
    expected = batches(dm, range(covered + 20))  # past the cache: the sampler extends it
    assert dm.sampler.covered >= covered + 20
    resumed = RecurlenDataModule(cfg, steps=4)
    resumed.load_state_dict({**dm.state_dict(), "next_step": 7})
    resumed.setup()
    got = list(resumed.train_dataloader(num_steps=covered + 13))
    assert_same(got, expected[7:])


def test_zst_jsonl_reads_the_documents_of_plain_jsonl_and_of_the_whole_source_cache(tmp_path):
    docs = texts(80) + [""]  # an empty document is dropped, as datasets' path drops it
    plain = write_jsonl(tmp_path / "a.jsonl", docs, zst=False)
    packed = write_jsonl(tmp_path / "b.jsonl.zst", docs, zst=True)
    rows = [r for r in source_rows.iter_rows(PrefixCache(config(packed, tmp_path / "c"), ByteTokenizer()).source,
                                             config(packed, tmp_path / "c"))]
    assert [r[0] for r in rows] == docs
    needed = PrefixCache(config(packed, tmp_path / "c", num_proc=2), ByteTokenizer()).extend(lambda c: 1 << 40)
    whole = load_corpus(config(plain, tmp_path / "d", tokenize="all"), ByteTokenizer())
    assert needed.num_documents == whole.num_documents == 80
    assert np.array_equal(np.asarray(needed.tokens), np.asarray(whole.tokens))
    assert np.array_equal(needed.offsets, whole.offsets) and np.array_equal(needed.doc_hash, whole.doc_hash)


def test_the_source_ending_before_the_run_is_one_line(tmp_path):
    small = write_jsonl(tmp_path / "s.jsonl", texts(40), zst=False)
    dm = RecurlenDataModule(config(small, tmp_path / "cache", val_sequences=0, val_segments=0), steps=2)
    dm.setup()
    with pytest.raises(ValueError, match=r"the source ends before step 10000: .* data.tokenize=all"):
        dm.train_batch(10_000)


def test_needed_refuses_a_source_it_cannot_stream(tmp_path):
    csv = tmp_path / "c.csv"
    csv.write_text("text\nhello\n")
    with pytest.raises(ValueError, match=r"tokenize='needed' reads local JSON-lines, parquet or .txt sources"):
        RecurlenDataModule(config(csv, tmp_path / "cache"), steps=2).setup()


def test_the_dry_run_says_how_many_tokens_and_how_long(tmp_path, source):
    cfg = config(source, tmp_path / "cache")
    line = tokenize_plan(cfg, steps=10, num_global_lanes=3)
    assert line is not None and line.startswith("needed: ~") and "tokens/s (1 worker, measured" in line
    assert int(line.split("~")[1].split(" ")[0].replace(",", "")) > steps_to_cover(10) * 16 * 3
    RecurlenDataModule(cfg, steps=10).setup()
    assert tokenize_plan(cfg, steps=10, num_global_lanes=3).startswith("needed: cached already")
    assert tokenize_plan(config(source, tmp_path / "cache", tokenize="all"), steps=10, num_global_lanes=3) is None


def test_the_embedded_corpus_keeps_the_whole_source_batches(tmp_path):
    common = dict(source="embedded", cache_dir=str(tmp_path / "cache"), seq_len=16, batch_size=2, max_documents=30,
                  val_fraction=0.2, val_segments=2, val_sequences=0)
    auto = RecurlenDataModule(DataConfig(**common), steps=5)
    auto.setup()
    assert isinstance(auto.sampler, TrainSampler), "tokenize=auto tokenizes the embedded corpus whole"
    whole = RecurlenDataModule(DataConfig(**common, tokenize="all"), steps=5)
    whole.setup()
    assert_same(batches(auto, range(5)), batches(whole, range(5)))


def test_resuming_with_the_other_tokenize_setting_is_named(tmp_path, source, caplog):
    dm = RecurlenDataModule(config(source, tmp_path / "cache"), steps=4)
    dm.setup()
    saved = dm.state_dict()
    assert saved["tokenize"] == "needed"
    other = RecurlenDataModule(config(source, tmp_path / "cache2", tokenize="all"), steps=4)
    other.setup()
    with caplog.at_level("WARNING"):
        other.load_state_dict(saved)
    assert "'tokenize': ('needed', 'all')" in caplog.text


def test_the_held_out_plan_leaves_a_needed_source_to_the_run(tmp_path, source):
    from recurlen.training.data.heldout_fit import heldout_plan

    assert heldout_plan(config(source, tmp_path / "cache")) is None  # no whole-source cache is built for it
    assert not any(p.name.startswith("corpus-") for p in (tmp_path / "cache").glob("*"))
    assert heldout_plan(config(source, tmp_path / "cache", tokenize="all")) is not None


def test_a_trainer_run_tokenizes_for_its_max_steps_and_a_resumed_longer_run_reads_on(tmp_path, source):
    import lightning as L

    from tests.training.data.test_data_trainer import Recorder

    def fit(max_steps: int, ckpt_path=None) -> tuple[Recorder, RecurlenDataModule, L.Trainer]:
        dm = RecurlenDataModule(config(source, tmp_path / "cache", val_segments=0, val_sequences=0))
        model = Recorder()
        trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, use_distributed_sampler=False,
                            logger=False, enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False, limit_val_batches=0)
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return model, dm, trainer

    short, dm, trainer = fit(6)
    assert dm.sampler.covered >= steps_to_cover(6) and dm.corpus.num_documents < 100
    trainer.save_checkpoint(tmp_path / "six.ckpt")
    longer, dm2, _ = fit(400, ckpt_path=tmp_path / "six.ckpt")
    assert dm2.sampler.covered >= steps_to_cover(400) > dm.sampler.covered
    whole_cfg = config(source, tmp_path / "whole", val_segments=0, val_sequences=0)
    PrefixCache(whole_cfg, ByteTokenizer()).extend(lambda c: 1 << 40)
    whole = RecurlenDataModule(whole_cfg, steps=400)
    whole.setup()
    seen = short.train_seen + longer.train_seen
    assert [int(b["step"]) for b in seen] == list(range(400))
    assert_same(seen, batches(whole, range(400)))


@pytest.mark.parametrize("fmt", ["parquet", "txt", "jsonl.gz"])
def test_other_formats_read_the_documents_of_the_whole_source_cache_also_when_extended(tmp_path, fmt):
    docs = texts(70)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        src = tmp_path / "c.parquet"
        pq.write_table(pa.table({"text": docs}), src, row_group_size=16)  # skips cross row groups
    elif fmt == "txt":
        src = tmp_path / "folder"
        src.mkdir()
        for i, t in enumerate(docs):
            (src / f"{i:03d}.txt").write_text(t)
    else:
        import gzip

        src = tmp_path / "c.jsonl.gz"
        src.write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in docs).encode()))
    cache = PrefixCache(config(src, tmp_path / "c"), ByteTokenizer())
    cache.extend(lambda c: 0 if c.num_documents >= 20 else 1)  # a first piece, then the rest from where it ended
    needed = cache.extend(lambda c: 1 << 40)
    whole = load_corpus(config(src, tmp_path / "d", tokenize="all"), ByteTokenizer())
    assert needed.num_documents == whole.num_documents == 70
    assert np.array_equal(np.asarray(needed.tokens), np.asarray(whole.tokens))
    assert np.array_equal(needed.doc_hash, whole.doc_hash)


def test_the_command_dry_run_prints_the_tokenize_line_and_writes_nothing(tmp_path, source, capsys, cli_logs):
    from recurlen.commands.cli import main

    cache = tmp_path / "cache"
    args = ["finetune", f"data.source={source}", f"data.cache_dir={cache}", "data.tokenize=needed",
            "data.val_mode=pack", "data.val_length=256", "data.val_sequences=2", "trainer.max_steps=7",
            "trainer.accumulate_grad_batches=2", "trainer.devices=2", "trainer.accelerator=cpu",
            f"run_dir={tmp_path / 'run'}", "--dry-run"]
    main(args)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("tokenize"))
    # 7 optimizer steps x 2 micro-steps; 2 devices x data.batch_size lanes.
    assert re.search(r"needed: ~[\d,]+ tokens \(~[\d,]+ documents\) for 14 steps x \d+ tokens x \d+ lanes", line)
    lanes = int(re.search(r"x (\d+) lanes", line).group(1))
    assert lanes % 2 == 0 and re.search(r"~\d+ s at [\d,]+ tokens/s \(\d workers?, measured", line)
    assert not any(cache.glob("prefix-*/meta.json")) and not (tmp_path / "run").exists()
