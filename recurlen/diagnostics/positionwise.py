"""Position-wise loss / perplexity of held-out long sequences, in constant memory in the length.

A batch of sequences runs chunk by chunk with the recurrent state carried, so L = 131072 needs
no more memory than one chunk. Split invariance makes the chunked NLL equal to one long forward's.

Position convention (see recurlen.diagnostics.bins): a sequence of L tokens gives L - 1 predictions;
position p predicts x[p+1] from x[0..p]. The target of a chunk's last position is the first token
of the next chunk, read from the sequence, so no prediction is dropped at chunk boundaries.

Reset control: the same tokens scored again with the state zeroed at every multiple of the
training context T, so every prediction has at most T tokens of context (always in-distribution)
and the content of each position is the same as in the full pass. full - reset per bin isolates
the effect of the longer context: > 0 means it hurts, <= 0 means the model length-generalizes.

Legend: N sequences, B batch rows, L tokens, P = L - 1 predictions, V vocabulary, D d_model.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from recurlen.diagnostics.bins import bin_summary, bin_sums, context_bins, log_bins, log_points, split_points
from recurlen.diagnostics.intervals import BOOTSTRAP_SEED, LEVEL, RESAMPLES, paired_bootstrap
from recurlen.diagnostics.model_access import autocast, eval_mode, model_device, require_state_api, select_sequences
from recurlen.diagnostics.state_stats import StateCurves, state_statistics

log = logging.getLogger(__name__)

# Logits per LM-head call: 64 MiB in float32 (333 positions of a 50k vocabulary). The head's logits and
# their log-softmax are the largest tensors of an evaluation; a slice much smaller than a chunk keeps
# them the same size for every sequence length. With 512 MiB slices the head took a whole chunk at
# once, and since the state-sampling points make the chunks short early in a sequence, a 4k-token
# evaluation peaked ~0.8 GB below a long one at the 130m shape.
HEAD_ELEMENTS = 1 << 24

# Tokens x lanes x d_model per forward call: a chunk longer than this runs as consecutive calls with the state
# carried (split invariance keeps the NLL the same up to float rounding). The scan's activations grow with the
# call's length, and the state-sampling points cut a short sequence into short chunks, so without a cap a long
# evaluation's calls (whole chunks of 2048) peaked far above a short one's: at the 130m shape a 128k-token
# evaluation took 1.52x the memory of a 4k one, 1.05x with this cap (CPU only, see forward_tokens_per_call).
# 2^19 is 512 tokens of the 130m model per lane and leaves the demo's calls (16 lanes x 256 x d_model 128) whole.
FORWARD_ELEMENTS = 1 << 19
FORWARD_MULTIPLE = 64
"""Capped calls are a multiple of this many tokens (whole chunks of the scan's usual chunk sizes)."""


def forward_tokens_per_call(model: nn.Module, batch: int) -> int | None:
    """The most tokens per lane one forward call reads (None: no cap, or the model does not say its width).

    CPU only: there the activations are a visible share of the process's memory, while on a GPU a whole
    chunk's are small next to the device's memory and shorter calls would only add kernel launches."""
    # The embedding's width: every architecture has one (StatefulLM.embedding), whatever its config calls it.
    embedding = getattr(model, "embedding", None)
    width = getattr(embedding, "embedding_dim", None)
    if not width or FORWARD_ELEMENTS <= 0 or model_device(model).type != "cpu":
        return None
    tokens = FORWARD_ELEMENTS // (batch * width)
    return max(FORWARD_MULTIPLE, tokens - tokens % FORWARD_MULTIPLE)

POSITION_CONVENTION = "position p is the prediction of token p+1 from tokens 0..p; L tokens give L-1 positions"


@torch.no_grad()
def score_positions(model: nn.Module, ids_BL: torch.Tensor, *, ends: Sequence[int], reset_every: int | None = None,
                    sample_state: bool = False, with_nll: bool = True, bf16: bool = False,
                    on_chunk: Callable[[int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """NLL (B, L-1) float32 of every prediction, running ids[:, ends[i-1]:ends[i]] with the state carried.

    reset_every: zero the state before every position that is a multiple of it (the reset control);
    those positions must be in `ends`. sample_state: also return the state statistics after each
    chunk, (F, K, B, len(ends)) float64 (see recurlen.diagnostics.state_stats). with_nll=False skips the
    LM head (a large part of the cost for a 50k vocabulary) when only the state is wanted; the NLL is NaN.
    """
    batch, length = ids_BL.shape
    if not ends or ends[-1] != length or list(ends) != sorted(set(ends)):
        raise ValueError(f"ends must increase strictly and finish at the sequence length {length}; "
                         f"got {list(ends)[:8]}")
    if reset_every is not None:
        end_set = set(ends)
        missing = [m for m in range(reset_every, length, reset_every) if m not in end_set]
        if missing:
            raise ValueError(f"reset_every={reset_every} needs a chunk end at every multiple of it; "
                             f"missing {missing[:4]}")
    device = ids_BL.device
    vocab = getattr(getattr(model, "config", None), "vocab_size", None) or 65536  # only sizes the head slices
    nll_BP = torch.full((batch, length - 1), float("nan"), dtype=torch.float32, device=device)
    per_call = forward_tokens_per_call(model, batch) or length
    # The LM head in slices of at most HEAD_ELEMENTS logits: (batch, chunk, 50k) floats would otherwise
    # dominate memory (6.6 GB for 4 x 8192 tokens of the Pile models) and make the peak follow the longest
    # chunk rather than stay constant.
    head_step = max(1, HEAD_ELEMENTS // (batch * vocab))
    stats = []
    state = None
    start = 0
    for end in ends:
        if reset_every is not None and start % reset_every == 0:
            state = None  # zero state: this position starts a fresh, in-distribution context
        for c0 in range(start, end, per_call):
            c1 = min(c0 + per_call, end)
            with autocast(device, bf16=bf16):
                hidden_BlD, state = model.forward_hidden(ids_BL[:, c0:c1], state)
            stop = min(c1, length - 1) if with_nll else c0  # the very last token has no target
            for s0 in range(c0, stop, head_step):
                s1 = min(s0 + head_step, stop)
                with autocast(device, bf16=bf16):
                    logits_BsV = model.logits_from_hidden(hidden_BlD[:, s0 - c0:s1 - c0])
                # float32 log-softmax: bf16 logits would round the NLL of confident predictions to zero.
                nll_BP[:, s0:s1] = F.cross_entropy(logits_BsV.float().transpose(1, 2), ids_BL[:, s0 + 1:s1 + 1],
                                                   reduction="none")
            del hidden_BlD
        if sample_state:
            stats.append(state_statistics(state))
        if on_chunk is not None:
            on_chunk(batch * (end - start))
        start = end
    return nll_BP, (torch.stack(stats, dim=-1) if sample_state else None)


@dataclass
class PositionwiseResult:
    """Sums over sequences (so that ranks can add them) of the position-wise NLL and state statistics, and each
    sequence's mean NLL per context bin (the unit an interval resamples)."""

    train_len: int
    seq_len: int
    num_sequences: int
    nll_sum_P: torch.Tensor
    """(L-1,) float64: sum over sequences of the NLL at each prediction position."""
    reset_nll_sum_P: torch.Tensor | None
    """(L-1,) float64, the same with the state reset every train_len positions (None if not run)."""
    state: StateCurves | None
    """State statistics of the full pass at increasing positions (None if not run)."""
    seq_loss_NK: torch.Tensor | None = None
    """(N, K) float64: each sequence's mean NLL in each context bin [0,T), [T,2T), ... (None if not kept)."""
    seq_reset_loss_NK: torch.Tensor | None = None
    """(N, K) float64, the same with the reset control (None if it was not run)."""
    sequences_digest: str | None = None
    """A hash of the scored token ids: two runs with the same digest were scored on the same sequences, so their
    per-sequence scores can be paired."""

    def count_P(self) -> torch.Tensor:
        return torch.full((self.seq_len - 1,), float(self.num_sequences), dtype=torch.float64)

    def summary(self, *, num_log_bins: int = 24, seed: int = BOOTSTRAP_SEED) -> dict:
        """JSON-ready per-bin loss / ppl (/ full - reset), context-multiple bins and log-spaced bins; with the
        per-sequence losses kept, each context bin's full - reset gets its 95% paired-bootstrap interval
        (`full_minus_reset_ci`) and the entry keeps those losses ("per_sequence") so that anyone can recompute it."""
        num_positions = self.seq_len - 1
        out: dict = {"train_len": self.train_len, "seq_len": self.seq_len, "num_sequences": self.num_sequences,
                     "convention": POSITION_CONVENTION}
        for key, bins in (("bins", context_bins(self.train_len, num_positions)),
                          ("log_bins", log_bins(num_positions, num_log_bins) if num_log_bins else [])):
            reset = None if self.reset_nll_sum_P is None else bin_sums(self.reset_nll_sum_P, bins) if bins else None
            out[key] = bin_summary(bins, bin_sums(self.nll_sum_P, bins), bin_sums(self.count_P(), bins), reset) \
                if bins else []
        if self.seq_loss_NK is not None:
            out.update(self._per_sequence(out["bins"], seed=seed))
        return out

    def _per_sequence(self, rows: list[dict], *, seed: int) -> dict:
        return per_sequence_section(rows, self.seq_loss_NK.numpy(), None if self.seq_reset_loss_NK is None
                                    else self.seq_reset_loss_NK.numpy(), digest=self.sequences_digest, seed=seed)


def per_sequence_section(rows: list[dict], loss_NK, reset_NK=None, *, digest: str | None = None,
                         seed: int = BOOTSTRAP_SEED) -> dict:
    """The summary's per-sequence part: each sequence's loss (and reset loss) per context bin, and with the reset
    control each bin's full - reset interval written into its row (`full_minus_reset_ci`), as results.json keeps
    them. rows: the context bins' summary rows, in the columns' order."""
    loss_NK = np.asarray(loss_NK, dtype=np.float64)
    per_seq = {"bins": [r["name"] for r in rows], "loss": loss_NK.tolist()}
    extra: dict = {"per_sequence": per_seq, "sequences_digest": digest}
    if reset_NK is None:
        return extra
    reset_NK = np.asarray(reset_NK, dtype=np.float64)
    per_seq["reset_loss"] = reset_NK.tolist()
    diff_NK = loss_NK - reset_NK
    if diff_NK.shape[0] >= 2 and np.isfinite(diff_NK).all():
        lo_K, hi_K = paired_bootstrap(diff_NK, seed=seed)
        for row, lo, hi in zip(rows, lo_K, hi_K):
            row["full_minus_reset_ci"] = [float(lo), float(hi)]
    extra["interval"] = {"method": "paired bootstrap over held-out sequences (percentile)", "level": LEVEL,
                         "resamples": RESAMPLES, "seed": seed, "sequences": diff_NK.shape[0]}
    return extra


def sequences_digest(seqs_NL: torch.Tensor) -> str:
    """A short hash of the token ids (their shape included): equal digests, the same scored sequences."""
    data = seqs_NL.to(torch.int64).contiguous().cpu().numpy()
    return hashlib.sha256(str(data.shape).encode() + data.tobytes()).hexdigest()[:16]


def _bin_means(nll_BP: torch.Tensor, bins: Sequence) -> torch.Tensor:
    """(B, K) float64 mean NLL of each row in each bin."""
    return torch.stack([nll_BP[:, b.start:b.end].double().mean(dim=1) for b in bins], dim=1).cpu()


def evaluation_ends(seq_len: int, *, train_len: int, chunk_len: int, state_points: int = 0) -> list[int]:
    """Chunk ends: the chunk grid, every multiple of T (reset control, state at T, 2T, 4T, ...) and
    `state_points` log-spaced points, so that state curves are dense at small positions too."""
    extra = list(range(train_len, seq_len, train_len))
    if state_points:
        extra += log_points(seq_len, state_points)
    return split_points(seq_len, chunk_len=chunk_len, extra=extra)


def evaluate_positionwise(model: nn.Module, sequences: torch.Tensor | Sequence[torch.Tensor], *, train_len: int,
                          seq_len: int | None = None, num_sequences: int | None = None, chunk_len: int = 2048,
                          batch_size: int = 8, reset_control: bool = True, state_stats: bool = True,
                          state_points: int = 48, with_nll: bool = True, bf16: bool = False,
                          progress: bool | str = False, require_beyond_context: bool = True) -> PositionwiseResult:
    """Position-wise NLL (full pass, and the reset control), with state statistics from the full pass.

    sequences: held-out token ids, (num, >= seq_len) or a list of 1-D tensors; the first
    `num_sequences` long enough ones are used, cut to `seq_len` (default: all, at their length).
    Memory is O(batch_size * chunk_len) for activations plus O(seq_len) for the NLL sums.
    with_nll=False (state statistics only) skips the LM head and the reset control.
    progress: a progress bar; a str is its label (a caller says what the pass is part of).
    """
    require_state_api(model)
    if train_len < 1:
        raise ValueError(f"train_len must be a positive integer; got {train_len}")
    if seq_len is None:
        seq_len = sequences.shape[-1] if isinstance(sequences, torch.Tensor) else max(len(s) for s in sequences)
    if require_beyond_context and seq_len <= train_len:
        raise ValueError(f"position-wise evaluation: seq_len={seq_len} must be larger than the training context "
                         f"train_len={train_len}, otherwise nothing beyond the context is measured")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    seqs_NL = select_sequences(sequences, length=seq_len, num=num_sequences, what="position-wise evaluation",
                               vocab_size=vocab)
    device = model_device(model)
    ends = evaluation_ends(seq_len, train_len=train_len, chunk_len=chunk_len,
                           state_points=state_points if state_stats else 0)
    num = seqs_NL.shape[0]
    reset_control = reset_control and with_nll
    nll_sum_P = torch.zeros(seq_len - 1, dtype=torch.float64)
    reset_sum_P = torch.zeros(seq_len - 1, dtype=torch.float64) if reset_control else None
    curves = StateCurves.empty(ends, model.zero_state(1).n_layer) if state_stats else None
    ctx_bins = context_bins(train_len, seq_len - 1)
    seq_loss, seq_reset = [], []
    passes = 2 if reset_control else 1
    with eval_mode(model), tqdm(total=num * seq_len * passes, disable=not progress,
                                desc=progress if isinstance(progress, str) else "position-wise",
                                unit="tok", unit_scale=True, leave=False) as bar:
        for first in range(0, num, batch_size):
            ids_BL = seqs_NL[first:first + batch_size].to(device)
            nll_BP, stats_FKBS = score_positions(model, ids_BL, ends=ends, sample_state=state_stats,
                                                 with_nll=with_nll, bf16=bf16, on_chunk=bar.update)
            nll_sum_P += nll_BP.double().sum(dim=0).cpu()
            seq_loss.append(_bin_means(nll_BP, ctx_bins))
            if curves is not None:
                curves.sums_FKS += stats_FKBS.sum(dim=2).cpu()
                curves.count += ids_BL.shape[0]
            if reset_sum_P is not None:
                reset_BP, _ = score_positions(model, ids_BL, ends=ends, reset_every=train_len, bf16=bf16,
                                              on_chunk=bar.update)
                reset_sum_P += reset_BP.double().sum(dim=0).cpu()
                seq_reset.append(_bin_means(reset_BP, ctx_bins))
    result = PositionwiseResult(train_len, seq_len, num, nll_sum_P, reset_sum_P, curves,
                                seq_loss_NK=torch.cat(seq_loss) if with_nll and seq_loss else None,
                                seq_reset_loss_NK=torch.cat(seq_reset) if seq_reset else None,
                                sequences_digest=sequences_digest(seqs_NL))
    if with_nll and not math.isfinite(float(nll_sum_P.sum())):
        # Worth a loud note: a non-finite NLL usually means a diverged checkpoint, not an eval bug.
        log.warning("position-wise NLL is not finite (diverged model or bf16 overflow?)")
    return result
