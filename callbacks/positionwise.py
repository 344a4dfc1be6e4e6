"""Position-wise perplexity of held-out long sequences during validation, with the reset control.

Logs `{prefix}/loss@[kT,2kT)`, `{prefix}/ppl@[kT,2kT)` and `{prefix}/full_minus_reset@[kT,2kT)` for the
bins [0,T), [T,2T), [2T,4T), ... (T = the training context; with bins="log" the log-spaced bins,
named in tokens, e.g. `{prefix}/ppl@[0128,0256)`), and two figures (perplexity by position over the
log-spaced bins, full - reset) under `{prefix}/figures/`. Tag names are zero-padded so that they sort in
position order (`[01T,02T)` ... `[16T,32T)`); full - reset of [0,T) (always 0) is not logged. The
custom-scalars layout has one chart per bin, in which every run is a line. With the reset control and bins in
multiples of T, each bin's 95% paired-bootstrap interval over the held-out sequences is logged too
(`{prefix}/full_minus_reset_lo@...` and `_hi@...`: the steps-to-hold curve reads them from metrics.csv).
"""

from __future__ import annotations

import re

import lightning.pytorch as pl
import torch
from recurlen.callbacks.diagnostic import (
    DiagnosticCallback,
    log_figures,
    rank_share,
    register_custom_scalars,
    synced_sums,
)

from recurlen.diagnostics.bins import bin_summary, bin_sums, context_bins, log_bins
from recurlen.diagnostics.intervals import paired_bootstrap
from recurlen.diagnostics.plots import plot_full_minus_reset, plot_positionwise
from recurlen.diagnostics.positionwise import POSITION_CONVENTION, evaluate_positionwise
from recurlen.util.tensorboard import bin_width, sortable_bin

SCALAR_BINS = ("multiples", "log")


class PositionwisePerplexity(DiagnosticCallback):
    """Loss / perplexity by position, beyond the training context, summed over ranks."""

    @property
    def title(self) -> str:
        return "position-wise loss + reset control" if self.reset_control else "position-wise loss"

    def __init__(self, *, seq_len: int | None = None, num_sequences: int | None = None, train_len: int | None = None,
                 bins: str = "multiples", log_bins: int = 16, reset_control: bool = True,
                 chunk_len: int | None = None, batch_size: int = 4, sequences: torch.Tensor | None = None,
                 bf16: bool = False, every_n_val_epochs: int = 1, log_figures: bool = True,
                 prefix: str = "val") -> None:
        """seq_len: L (default: the held-out sequences' length); train_len: T (default pl_module.train_seq_len);
        bins: which bins get scalars, "multiples" of T or "log" (the figures always use the log bins);
        log_bins: number of log-spaced bins; chunk_len: tokens per call (default 4 x T);
        sequences: held-out ids (num, >= L) instead of trainer.datamodule.long_validation_sequences()."""
        super().__init__(num_sequences=num_sequences, train_len=train_len, chunk_len=chunk_len, batch_size=batch_size,
                         sequences=sequences, bf16=bf16, every_n_val_epochs=every_n_val_epochs,
                         log_figures=log_figures, prefix=prefix)
        if bins not in SCALAR_BINS:
            raise ValueError(f"bins={bins!r} is unknown; allowed: {list(SCALAR_BINS)}")
        if log_bins < 0 or (bins == "log" and log_bins == 0):
            raise ValueError(f"log_bins must be >= 0 (>= 1 with bins='log'); got {log_bins}")
        self.bins = bins
        self.seq_len = seq_len
        self.num_log_bins = log_bins
        self.reset_control = reset_control
        self.tags: list[str] = []
        """The scalar tags of the latest evaluation (the [0,T) loss first)."""

    def layout(self) -> tuple[str, dict[str, list[str]]]:
        return "", {}  # per-bin charts, registered once the bins are known (first evaluation)

    def bin_layout(self, tags: list[str]) -> list[tuple[str, dict[str, list[str]]]]:
        """One chart per position bin, each run a line: runs compare directly, bin by bin."""
        out = []
        for kind, short, category in (
                ("ppl", "ppl", "perplexity by position bin"),
                ("full_minus_reset", "full - reset", "full - reset by position bin (> 0: longer context hurts)")):
            prefix = f"{self.prefix}/{kind}@"
            charts = {f"{short} {t[len(prefix):]}": [f"^{re.escape(t)}$"] for t in tags if t.startswith(prefix)}
            if charts:
                out.append((f"recurlen: {category}", charts))
        return out

    def hparam_metrics(self) -> list[str]:
        """Loss in [0,T) and full - reset per bin: the HParams table's columns."""
        return [t for t in self.tags if "/full_minus_reset@" in t or t == self.tags[0]] if self.tags else []

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model, train_len, chunk_len = self.model_and_lengths(pl_module)
        seqs_NL = self.held_out(trainer, self.seq_len, train_len)
        seq_len = seqs_NL.shape[1]
        ctx_bins = context_bins(train_len, seq_len - 1)
        fine_bins = log_bins(seq_len - 1, self.num_log_bins) if self.num_log_bins else []
        bins = ctx_bins + fine_bins
        names = ("nll", "count", "reset") if self.reset_control else ("nll", "count")
        local = {name: torch.zeros(len(bins), dtype=torch.float64) for name in names}
        # Each sequence's full - reset per context bin, at its own row: the rows of other ranks stay 0, so the sum
        # over ranks is the whole matrix (ranks share the sequences round-robin, rank_share).
        local["per_sequence"] = torch.zeros(seqs_NL.shape[0], len(ctx_bins), dtype=torch.float64)
        share_NL = rank_share(seqs_NL, trainer)
        if share_NL.shape[0]:
            res = evaluate_positionwise(model, share_NL, train_len=train_len, chunk_len=chunk_len,
                                        batch_size=self.batch_size, reset_control=self.reset_control,
                                        state_stats=False, bf16=self.bf16,
                                        progress=self.show_progress(trainer, share_NL.shape[0]))
            local["nll"] = bin_sums(res.nll_sum_P, bins)
            local["count"] = bin_sums(res.count_P(), bins)
            if self.reset_control:
                local["reset"] = bin_sums(res.reset_nll_sum_P, bins)
                local["per_sequence"][trainer.global_rank::trainer.world_size] = \
                    res.seq_loss_NK - res.seq_reset_loss_NK
        totals = synced_sums(pl_module, local)
        rows = bin_summary(bins, totals["nll"], totals["count"], totals.get("reset"))
        ctx_rows, fine_rows = rows[:len(ctx_bins)], rows[len(ctx_bins):]
        scalars = {}
        rows_logged = ctx_rows if self.bins == "multiples" else fine_rows
        width = bin_width(seq_len // train_len if self.bins == "multiples" else seq_len)
        for row in rows_logged:
            name = sortable_bin(row["name"], width)
            scalars[f"{self.prefix}/loss@{name}"] = row["loss"]
            scalars[f"{self.prefix}/ppl@{name}"] = row["ppl"]
            if self.reset_control and row["end"] > train_len:  # within [0,T) the reset changes nothing: always 0
                scalars[f"{self.prefix}/full_minus_reset@{name}"] = row["full_minus_reset"]
        if self.reset_control and self.bins == "multiples" and seqs_NL.shape[0] >= 2:
            lo_K, hi_K = paired_bootstrap(totals["per_sequence"].numpy())
            for row, lo, hi in zip(ctx_rows, lo_K, hi_K):
                if row["end"] > train_len:
                    name = sortable_bin(row["name"], width)
                    scalars[f"{self.prefix}/full_minus_reset_lo@{name}"] = float(lo)
                    scalars[f"{self.prefix}/full_minus_reset_hi@{name}"] = float(hi)
        self.log_scalars(pl_module, scalars)
        if not self.tags:
            for category, charts in self.bin_layout(list(scalars)):
                register_custom_scalars(trainer, category, charts)
        self.tags = list(scalars)
        self.last_results = {
            "label": f"step {trainer.global_step}", "train_len": train_len, "seq_len": seq_len,
            "positionwise": {"train_len": train_len, "seq_len": seq_len, "num_sequences": seqs_NL.shape[0],
                             "convention": POSITION_CONVENTION, "bins": ctx_rows, "log_bins": fine_rows},
        }
        if self.log_figures:
            figures = {f"{self.prefix}/figures/ppl_by_position": plot_positionwise([self.last_results])}
            if self.reset_control:
                figures[f"{self.prefix}/figures/full_minus_reset"] = plot_full_minus_reset([self.last_results])
            log_figures(trainer, figures)
