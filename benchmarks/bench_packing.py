"""Padding and useful tokens per second: data.layout=documents (TBTT over documents: one document per lane, its last
segment padded) against data.layout=packed (documents packed into rows, the state reset where each starts), side by
side, on the demo's corpus (T = 32) and on a Pile-like distribution of document lengths (T = 2048).

    .venv/bin/python benchmarks/bench_packing.py            # both corpora
    .venv/bin/python benchmarks/bench_packing.py --quick    # fewer steps and repeats (make bench)

Measured through the real samplers (RecurlenDataModule): the share of a step's target positions that are not scored
(documents: a tail's padding; packed: the one target per document that is the next document's first token, and the
end), over consecutive steps of every lane; then a Mamba-2 training step (forward with the layout's resets, masked
loss, backward, AdamW) on each layout's batches, timed interleaved on one thread, and the scored tokens per CPU second
of the step (on a shared machine the wall time is mostly waiting for a core). Read the ratio, not the absolute speed.

The Pile-like lengths: a mixture over the Pile's 22 components with the mean document size of each (Gao et al.
2020, "The Pile: An 800GB Dataset of Diverse Text for Language Modeling", arXiv:2101.00027, Table 1). A document
comes from component c with probability proportional to c's weight (its share of the training bytes) over its mean
document size, and is log-normal within it with sigma = 1 (the table gives means only; sigma is this script's
assumption) and the component's mean, converted at 4 bytes per token (a BPE tokenizer on English; also assumed).
The documents are random letters read by the byte tokenizer, so a document of n tokens is n bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import _common
import numpy as np
import torch

from recurlen.models import registry
from recurlen.training.data import DataConfig, RecurlenDataModule
from recurlen.training.lit_module import token_loss

# The Pile, Table 1 of arXiv:2101.00027: component -> (weight in the training mix %, mean document size KiB).
PILE_COMPONENTS = {
    "Pile-CC": (18.11, 4.33), "PubMed Central": (14.40, 30.55), "Books3": (12.07, 538.36),
    "OpenWebText2": (10.01, 3.85), "ArXiv": (8.96, 46.61), "Github": (7.59, 5.25), "FreeLaw": (6.12, 15.06),
    "StackExchange": (5.13, 2.16), "USPTO Backgrounds": (3.65, 4.08), "PubMed Abstracts": (3.07, 1.30),
    "Gutenberg (PG-19)": (2.17, 398.73), "OpenSubtitles": (1.55, 30.48), "Wikipedia (en)": (1.53, 1.11),
    "DM Mathematics": (1.24, 8.00), "Ubuntu IRC": (0.88, 545.48), "BookCorpus2": (0.75, 369.87),
    "EuroParl": (0.73, 68.87), "HackerNews": (0.62, 4.92), "YoutubeSubtitles": (0.60, 22.55),
    "PhilPapers": (0.38, 73.37), "NIH ExPorter": (0.30, 2.11), "Enron Emails": (0.14, 1.78),
}
BYTES_PER_TOKEN = 4.0
SIGMA = 1.0


def pile_like_lengths(n: int, *, seed: int = 0) -> np.ndarray:
    """n document lengths in tokens drawn from the mixture in the module docstring."""
    names = list(PILE_COMPONENTS)
    weight = np.array([PILE_COMPONENTS[c][0] for c in names])
    mean_tokens = np.array([PILE_COMPONENTS[c][1] * 1024 / BYTES_PER_TOKEN for c in names])
    p = weight / mean_tokens
    rng = np.random.default_rng(seed)
    comp = rng.choice(len(names), size=n, p=p / p.sum())
    mu = np.log(mean_tokens[comp]) - SIGMA**2 / 2  # log-normal with the component's mean
    return np.maximum(1, rng.lognormal(mu, SIGMA)).astype(np.int64)


def write_corpus(path: Path, lengths: np.ndarray, *, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz ", dtype=np.uint8)
    with open(path, "w") as f:
        for n in lengths.tolist():
            f.write(json.dumps({"text": letters[rng.integers(0, len(letters), size=n)].tobytes().decode()}) + "\n")


def data_module(source: str, cache: str, *, layout: str, seq_len: int, batch: int, **extra) -> RecurlenDataModule:
    cfg = DataConfig(source=source, cache_dir=cache, seq_len=seq_len, batch_size=batch, layout=layout,
                     val_segments=0, val_sequences=0, num_proc=1, **extra)
    return RecurlenDataModule(cfg)


def unscored_share(dm: RecurlenDataModule, steps: int) -> tuple[float, float, list[dict]]:
    """(share of unscored target positions over `steps` steps, seconds per batch built, the batches)."""
    start = time.perf_counter()
    batches = [dm.train_batch(s) for s in range(steps)]
    per_batch = (time.perf_counter() - start) / steps
    scored = sum(int(b["loss_mask"].sum()) for b in batches)
    total = sum(b["loss_mask"].numel() for b in batches)
    return 1.0 - scored / total, per_batch, batches


def train_step(model, opt, batch: dict) -> tuple[float, float]:
    """One training step on the batch (its layout's resets, after column 0 as the training step passes them): its
    wall seconds and the process's CPU seconds."""
    start, cpu = time.perf_counter(), time.process_time()
    resets = batch.get("resets")
    extra = {}
    if resets is not None:
        resets = resets.clone()
        resets[:, 0] = False
        extra["resets"] = resets
    hidden, _ = model.forward_hidden(batch["input_ids"], None, **extra)
    loss = token_loss(model.logits_from_hidden(hidden), batch["targets"], batch["loss_mask"])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - start, time.process_time() - cpu


def compare(title: str, source: str, cache: str, *, seq_len: int, batch: int, steps: int, repeats: int,
            model_name: str, results: str | None, **extra) -> None:
    print(f"\n## {title}: T = {seq_len}, {batch} lanes, {steps} steps, model {model_name}")
    shares, per_batch, batches = {}, {}, {}
    for layout in ("documents", "packed"):
        dm = data_module(source, cache, layout=layout, seq_len=seq_len, batch=batch, **extra)
        shares[layout], per_batch[layout], batches[layout] = unscored_share(dm, steps)
    arch = registry.get("mamba2")
    torch.manual_seed(0)
    model = arch.build(arch.preset(model_name), backend="torch").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    wall, cpu = {layout: [] for layout in batches}, {layout: [] for layout in batches}
    for r in range(repeats + 1):  # round 0 warms up; the order alternates between rounds
        order = ("documents", "packed") if r % 2 else ("packed", "documents")
        for layout in order:
            seconds, cpu_seconds = train_step(model, opt, batches[layout][r % steps])
            if r:
                wall[layout].append(seconds)
                cpu[layout].append(cpu_seconds)
    # On a shared machine the wall time is mostly waiting: the step's CPU time is the steadier measure.
    print("| layout | unscored targets | scored tokens / step | step CPU s (median) | useful tokens / CPU s | "
          "step wall s (median) | batch build ms |")
    print("|---|---|---|---|---|---|---|")
    useful = {}
    for layout in ("documents", "packed"):
        scored = (1.0 - shares[layout]) * batch * seq_len
        step = statistics.median(cpu[layout])
        useful[layout] = scored / step
        print(f"| {layout} | {shares[layout]:.2%} | {scored:,.0f} | {step:.3f} | {useful[layout]:,.0f} | "
              f"{statistics.median(wall[layout]):.3f} | {per_batch[layout] * 1e3:.1f} |")
    ratio = useful["packed"] / useful["documents"]
    step_ratio = statistics.median(cpu["packed"]) / statistics.median(cpu["documents"])
    share_ratio = (1 - shares["packed"]) / (1 - shares["documents"])
    print(f"packed / documents: useful tokens per CPU second {ratio:.2f}x (scored share {share_ratio:.2f}x, step CPU "
          f"time {step_ratio:.2f}x)")
    _common.record(results, benchmark=f"packed rows vs documents ({title})", shape=f"{model_name} {batch}x{seq_len}",
                   unit="useful tokens/CPU s", recurlen=useful["packed"], peers={"documents": useful["documents"]},
                   ratios={"documents": ratio}, target="packed >= documents")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--corpus", choices=("demo", "pile", "both"), default="both")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: CPU time is then the "
                        "step's own, whatever else the machine runs)")
    parser.add_argument("--pile-documents", type=int, default=4000, help="documents of the Pile-like corpus")
    _common.add_results_option(parser)
    args = parser.parse_args()
    threads = _common.set_threads(args.threads)
    _common.print_environment("packed rows (resets inside a row) vs one document per lane (padded tails)", threads)
    repeats = 2 if args.quick else 10
    with tempfile.TemporaryDirectory() as tmp:
        if args.corpus in ("demo", "both"):
            # The demo's data: the embedded corpus, T = 32, 64 lanes (experiments/demo-pretrain.yaml).
            compare("demo corpus", "embedded", tmp, seq_len=32, batch=64, steps=50 if args.quick else 200,
                    repeats=repeats, model_name="tiny", results=args.results, val_fraction=0.1)
        if args.corpus in ("pile", "both"):
            lengths = pile_like_lengths(args.pile_documents)
            path = Path(tmp) / "pile-like.jsonl"
            write_corpus(path, lengths)
            T = 2048
            print(f"\n# Pile-like lengths ({len(lengths)} documents, tokens): mean {lengths.mean():,.0f}, median "
                  f"{np.median(lengths):,.0f}, {np.mean(lengths < T):.1%} shorter than T = {T}; expected unscored "
                  f"share, documents {1 - lengths.sum() / (np.ceil(lengths / T).sum() * T):.1%}, packed "
                  f"{len(lengths) / (lengths + 1).sum():.2%}")
            compare("Pile-like lengths", str(path), tmp, seq_len=T, batch=4, steps=20 if args.quick else 60,
                    repeats=repeats, model_name="tiny", results=args.results, val_fraction=0.01)


if __name__ == "__main__":
    main()
