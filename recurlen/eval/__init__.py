"""Length-generalization diagnostics: position-wise perplexity (with the reset-every-T control),
state statistics by position, Effective Remembrance, plots, and the `recurlen eval` runner."""

from recurlen.eval.bins import PositionBin, bin_summary, bin_sums, context_bins, log_bins
from recurlen.eval.effrem import EffRemResult, default_t_grid, effective_remembrance, effrem_batch
from recurlen.eval.plots import (
    figures_for,
    load_runs,
    plot_effrem,
    plot_full_minus_reset,
    plot_positionwise,
    plot_state,
    write_plots,
)
from recurlen.eval.positionwise import PositionwiseResult, evaluate_positionwise, score_positions
from recurlen.eval.runner import EvalConfig, run_eval
from recurlen.eval.state_stats import STATE_STATS, StateCurves, state_statistics

__all__ = [
    "STATE_STATS", "EffRemResult", "EvalConfig", "PositionBin", "PositionwiseResult", "StateCurves", "bin_sums",
    "bin_summary", "context_bins", "default_t_grid", "effective_remembrance", "effrem_batch", "evaluate_positionwise",
    "figures_for", "load_runs", "log_bins", "plot_effrem", "plot_full_minus_reset", "plot_positionwise", "plot_state",
    "run_eval", "score_positions", "state_statistics", "write_plots",
]
