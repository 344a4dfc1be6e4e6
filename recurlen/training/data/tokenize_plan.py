"""The dry run's line on tokenization: how much of the source the run will tokenize and about how long it takes,
from the token cache's state and a rate measured on the source's first documents (tokenize='needed')."""

from __future__ import annotations

from recurlen.training.data.config import DataConfig


def tokenize_plan(cfg: DataConfig, *, steps: int, num_global_lanes: int) -> str | None:
    """'~N tokens (~D documents) ..., ~S s at R tokens/s x W processes'; None when the run tokenizes the whole
    source (tokenize='all', or 'auto' on the embedded corpus, a small local source, a hub dataset)."""
    from recurlen.training.data.prefix_cache import PrefixCache, default_workers, sample_rate, tokenize_needed
    from recurlen.training.data.source_lanes import (
        MARGIN_FRACTION,
        MARGIN_STEPS,
        estimate_tokens,
        missing_tokens,
        steps_to_cover,
    )
    from recurlen.util.tokenizers import load_tokenizer

    if not tokenize_needed(cfg):
        return None
    tokenizer = load_tokenizer(cfg.tokenizer)
    cache = PrefixCache(cfg, tokenizer)
    corpus = cache.corpus()
    want = estimate_tokens(cfg, steps=steps, num_global_lanes=num_global_lanes)
    how = (f"{steps} steps x {cfg.seq_len} tokens x {num_global_lanes} lanes + held-out, margin "
           f"{MARGIN_FRACTION:.0%} + {MARGIN_STEPS} steps")
    if corpus.num_documents:
        todo = missing_tokens(corpus, cfg, steps=steps_to_cover(steps), num_global_lanes=num_global_lanes)
        if todo == 0:
            return (f"needed: cached already ({corpus.num_documents} documents, {corpus.num_tokens} tokens cover "
                    f"{how})")
        want = max(todo, want - corpus.num_tokens)
    workers = default_workers(cfg)
    rate, per_doc = sample_rate(cfg, tokenizer, cache.source, workers=workers)
    if per_doc == 0:  # the sample reads on until 2 MB of text: it read every row, and none has a token
        raise ValueError(f"source={cfg.source!r} is empty: none of its rows has any text")
    cached = f", {corpus.num_tokens} cached" if corpus.num_documents else ""
    who = f"{workers} worker{'s' if workers > 1 else ''}"
    return (f"needed: ~{want:,} tokens (~{round(want / per_doc):,} documents{cached}) for {how}; ~{want / rate:.0f} s "
            f"at {rate:,.0f} tokens/s ({who}, measured on the source's first 2 MB)")


__all__ = ["tokenize_plan"]
