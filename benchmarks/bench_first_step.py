"""Time to the first training batch on a large .jsonl.zst source with a BPE tokenizer: the whole source tokenized
first (data.tokenize=all, the only behaviour before tokenize='needed') against only what the run reads
(data.tokenize=needed), with the dry run's estimate beside the measured time.

Everything is generated here, offline and deterministically, into a temporary directory: documents of Pile-like
lengths (log-normal, median ~900 words, capped at 40k) of Zipf-distributed pseudo-words, written as one
.jsonl.zst, and a byte-level BPE tokenizer.json (vocab 8192) trained on its first documents with `tokenizers`.

    .venv/bin/python benchmarks/bench_first_step.py --gigabytes 1.5
    .venv/bin/python benchmarks/bench_first_step.py --gigabytes 0.25   # a shared machine: extrapolate 'all'
    .venv/bin/python benchmarks/bench_first_step.py --quick            # 0.05 GB, 50 steps (make bench)

'all' grows linearly with the source (one tokenization pass over every document); 'needed' depends on the run
(steps x T x lanes), not on the source's size.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import _common
import numpy as np


def generate(path: Path, gigabytes: float, seed: int = 0) -> tuple[int, int]:
    """(documents, bytes of JSON lines) written to path (.jsonl.zst)."""
    import zstandard

    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    vocab = ["".join(rng.choice(letters, size=rng.integers(1, 10))) for _ in range(20000)]
    zipf = 1.0 / np.arange(1, len(vocab) + 1)
    zipf /= zipf.sum()
    target, written, docs = int(gigabytes * 1e9), 0, 0
    with open(path, "wb") as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw) as out:
        while written < target:
            words = int(min(40000, max(20, rng.lognormal(np.log(900), 1.0))))
            ids = rng.choice(len(vocab), size=words, p=zipf)
            text = " ".join(vocab[i] for i in ids)
            line = (json.dumps({"text": text}) + "\n").encode()
            out.write(line)
            written, docs = written + len(line), docs + 1
    return docs, written


def train_tokenizer(source: Path, out: Path, *, documents: int = 2000) -> Path:
    import zstandard
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        with open(source, "rb") as raw:
            reader = zstandard.ZstdDecompressor().stream_reader(raw)
            import io

            for i, line in enumerate(io.TextIOWrapper(reader, encoding="utf-8")):
                if i >= documents:
                    break
                yield json.loads(line)["text"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer)
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path


def first_batch_seconds(cfg, *, steps: int) -> tuple[float, int]:
    """Seconds from nothing to the first training batch (a fresh cache), and the tokens the cache holds."""
    from recurlen.training.data.datamodule import RecurlenDataModule  # imported before: the same for both

    begin = time.perf_counter()
    dm = RecurlenDataModule(cfg, steps=steps)
    dm.prepare_data()
    dm.setup()
    dm.train_batch(0)
    return time.perf_counter() - begin, dm.corpus.num_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gigabytes", type=float, default=None,
                        help="uncompressed size of the generated source (default 1.5, quick 0.05)")
    parser.add_argument("--steps", type=int, default=None, help="the run's steps (default 500, quick 50)")
    parser.add_argument("--quick", action="store_true",
                        help="a 0.05 GB source and 50 steps (make bench): the ratio shrinks with the source")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--skip-all", action="store_true", help="measure tokenize=needed only")
    parser.add_argument("--out", type=Path, help="write the numbers as JSON here")
    _common.add_results_option(parser)
    args = parser.parse_args()
    args.gigabytes = args.gigabytes or (0.05 if args.quick else 1.5)
    args.steps = args.steps or (50 if args.quick else 500)

    from recurlen.training.data.config import DataConfig
    from recurlen.training.data.datamodule import RecurlenDataModule  # noqa: F401 (imported outside the timings)
    from recurlen.training.data.tokenize_plan import tokenize_plan

    with tempfile.TemporaryDirectory(prefix="recurlen-first-step-") as tmp:
        tmp = Path(tmp)
        source = tmp / "corpus.jsonl.zst"
        begin = time.perf_counter()
        docs, size = generate(source, args.gigabytes)
        print(f"source     {docs} documents, {size / 1e9:.2f} GB of JSON lines, {source.stat().st_size / 1e9:.2f} GB "
              f".zst ({time.perf_counter() - begin:.0f} s to generate)", flush=True)
        tokenizer = train_tokenizer(source, tmp)
        base = dict(source=str(source), tokenizer=str(tokenizer), seq_len=args.seq_len, batch_size=args.batch_size,
                    layout="contiguous", val_sequences=4, val_length=16 * args.seq_len, val_segments=16,
                    val_mode="pack")
        result = {"gigabytes": size / 1e9, "documents": docs, "steps": args.steps, "seq_len": args.seq_len,
                  "lanes": args.batch_size, "cores": len(os.sched_getaffinity(0))}
        needed = DataConfig(**base, tokenize="needed", cache_dir=str(tmp / "cache-needed"))
        begin = time.perf_counter()
        plan = tokenize_plan(needed, steps=args.steps, num_global_lanes=args.batch_size)
        result["dry_run_seconds"] = time.perf_counter() - begin
        result["dry_run"] = plan
        print(f"dry run    {plan} ({result['dry_run_seconds']:.1f} s)", flush=True)
        result["needed_seconds"], result["needed_tokens"] = first_batch_seconds(needed, steps=args.steps)
        print(f"needed     first batch after {result['needed_seconds']:.1f} s, {result['needed_tokens']:,} tokens "
              "cached", flush=True)
        if not args.skip_all:
            everything = DataConfig(**base, tokenize="all", cache_dir=str(tmp / "cache-all"), num_proc=result["cores"])
            result["all_seconds"], result["all_tokens"] = first_batch_seconds(everything, steps=args.steps)
            print(f"all        first batch after {result['all_seconds']:.1f} s, {result['all_tokens']:,} tokens "
                  f"cached; ratio all / needed {result['all_seconds'] / result['needed_seconds']:.1f}x", flush=True)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        all_s = result.get("all_seconds")
        _common.record(args.results, benchmark="time to the first batch, tokenize=needed",
                       shape=f"{size / 1e9:.2f} GB source, {args.steps} x {args.batch_size} x {args.seq_len}",
                       unit="s", recurlen=result["needed_seconds"],
                       peers={} if all_s is None else {"tokenize=all": all_s},
                       ratios={} if all_s is None else {"tokenize=all": all_s / result["needed_seconds"]},
                       higher_is_better=False)


if __name__ == "__main__":
    main()
