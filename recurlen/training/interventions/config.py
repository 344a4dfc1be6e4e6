"""The intervention section of an experiment: which intervention, and its settings."""

from __future__ import annotations

from dataclasses import dataclass

from recurlen.training.interventions.noise_groups import DEFAULT_GROUP_COUNT, FIT_GROUPS
from recurlen.training.interventions.noise_refresh import REFRESH_MODES

INTERVENTIONS = ("none", "random_noise", "fitted_noise", "state_passing", "tbptt")
LAYOUT_FOR = {"none": "independent", "random_noise": "independent", "fitted_noise": "independent",
              "state_passing": "independent", "tbptt": "documents"}
"""The data layout each intervention walks unless data.layout is set (tbptt: see TBPTT_LAYOUT)."""
TBPTT_OVER = ("documents", "stream")
TBPTT_LAYOUT = {"documents": "documents", "stream": "contiguous"}
"""tbptt_over -> data.layout."""
DEFAULT_RESET_PROB = {"state_passing": 0.1, "tbptt": 0.0}
"""reset_prob when none is given (interventions without a carried state ignore it)."""


@dataclass
class InterventionConfig:
    name: str = "none"
    """One of none, random_noise, fitted_noise, state_passing, tbptt."""
    noise_std: float = 1.0
    """random_noise: std of the i.i.d. Gaussian (the paper gives none; ~ the state's scale early in a sequence)."""
    reset_prob: float | None = None
    """state_passing / tbptt: per lane and step, the chance of starting from zeros instead of the carried state.
    None: the intervention's own default (DEFAULT_RESET_PROB): 0.1 for state_passing (recurlen's choice), 0 for
    tbptt (the paper's TBTT has no random resets), so a config built in Python gets the same as the yaml files."""
    tbptt_over: str = "documents"
    """tbptt: what a lane's long sequence is. documents (the paper): one document, split into segments of T; the
    next document starts from zeros. stream: the lane's stream of documents joined by EOS, never reset at a
    document's end (with tbptt_segments=8: the window form, long sequences of 8T cut from the stream)."""
    tbptt_segments: int | None = None
    """tbptt: the most segments of T a long sequence has; the state restarts from zeros after it. documents: at
    every multiple of it within a document; stream: at every step that is a multiple of it. None: no limit (a
    whole document, or one endless stream per lane)."""
    pass_conv: bool = False
    """state_passing / tbptt: carry the whole state, the conv window (and any other window part) too, or only the
    recurrent part (false, the default for both: the paper's pseudocode). The paper's two arms differ only in
    their data, so they carry the same parts here (recurlen's state passing also restarts lanes from zeros at
    random, reset_prob, and TBTT does not); carrying the window makes TBTT an exact continuation of its document
    (measured in docs/demo.md)."""
    fit_batches: int = 8
    """fitted_noise: training batches whose final states the statistics are fitted on."""
    fit_stats: str | None = None
    """fitted_noise: a file written by `recurlen fit-noise`; None fits automatically at the start of training."""
    fit_refresh: str = "none"
    """fitted_noise: none keeps the statistics fitted before training; every / ema update them from the final
    states seen in training (all ranks), at the end of every fit_refresh_every steps: every replaces them by
    those steps' statistics, ema blends those in (moments <- fit_ema x old + (1 - fit_ema) x new)."""
    fit_refresh_every: int = 10
    """fitted_noise with fit_refresh: training batches per refresh, whose final states one refresh pools (the
    data's steps: micro-batches under gradient accumulation, so every rank refreshes at the same batch)."""
    fit_ema: float = 0.9
    """fitted_noise with fit_refresh=ema: the weight the old moments keep at each refresh, in [0, 1)."""
    fit_groups: str = "default"
    """fitted_noise: the groups one mean and std is fitted over, per layer. default: the architecture's own (per
    (layer, head) where the state has heads; per layer for Mamba-1, whose channels have their own decays). blocks:
    fit_group_count equal blocks of consecutive entries of a layer's state (Mamba-1: blocks of d_inner channels).
    decay: a layer's entries sorted by their decay rate at zero input (Mamba-1: softplus(dt bias) x |A| per
    (channel, state) entry; Mamba-2: per head), cut into fit_group_count equal quantile groups; only where the
    decays are parameters (Mamba-1, Mamba-2). The grouping is fixed at the first fit and saved with the statistics
    (recurlen.training.interventions.noise_groups)."""
    fit_group_count: int | None = None
    """fitted_noise with fit_groups blocks / decay: groups per layer; it must divide a layer's entries of the state
    (Mamba-1: d_inner x d_state). None: DEFAULT_GROUP_COUNT (8) for blocks / decay; must stay None for default."""

    def __post_init__(self) -> None:
        if self.name not in INTERVENTIONS:
            raise ValueError(f"intervention.name={self.name!r} is unknown; allowed: {list(INTERVENTIONS)}")
        if not self.noise_std > 0:
            raise ValueError(f"intervention.noise_std must be > 0; got {self.noise_std}")
        if self.reset_prob is None:
            self.reset_prob = DEFAULT_RESET_PROB.get(self.name, 0.0)
        if not 0.0 <= self.reset_prob <= 1.0:
            raise ValueError(f"intervention.reset_prob must be in [0, 1]; got {self.reset_prob}")
        if self.tbptt_segments is not None and (isinstance(self.tbptt_segments, bool)
                                                or not isinstance(self.tbptt_segments, int) or self.tbptt_segments < 1):
            raise ValueError(f"intervention.tbptt_segments={self.tbptt_segments!r} is not allowed; need an integer "
                             ">= 1 (segments per long sequence) or null (one endless sequence per lane)")
        if self.tbptt_over not in TBPTT_OVER:
            raise ValueError(f"intervention.tbptt_over={self.tbptt_over!r} is unknown; allowed: {list(TBPTT_OVER)}")
        if self.fit_batches < 1:
            raise ValueError(f"intervention.fit_batches must be >= 1; got {self.fit_batches}")
        if self.fit_refresh not in REFRESH_MODES:
            raise ValueError(f"intervention.fit_refresh={self.fit_refresh!r} is unknown; "
                             f"allowed: {list(REFRESH_MODES)}")
        if self.fit_refresh_every < 1:
            raise ValueError(f"intervention.fit_refresh_every must be >= 1; got {self.fit_refresh_every}")
        if not 0.0 <= self.fit_ema < 1.0:
            raise ValueError(f"intervention.fit_ema must be in [0, 1); got {self.fit_ema}")
        if self.fit_groups not in FIT_GROUPS:
            raise ValueError(f"intervention.fit_groups={self.fit_groups!r} is unknown; allowed: {list(FIT_GROUPS)}")
        if self.fit_groups == "default":
            if self.fit_group_count is not None:
                raise ValueError(f"intervention.fit_group_count={self.fit_group_count!r} applies to fit_groups "
                                 f"{list(FIT_GROUPS[1:])} only; with fit_groups=default leave it null")
        elif self.fit_group_count is None:
            self.fit_group_count = DEFAULT_GROUP_COUNT
        elif (isinstance(self.fit_group_count, bool) or not isinstance(self.fit_group_count, int)
              or self.fit_group_count < 1):
            raise ValueError(f"intervention.fit_group_count={self.fit_group_count!r} is not allowed; need an integer "
                             ">= 1 (groups per layer) or null (8)")

    @property
    def layout(self) -> str:
        """The data layout this intervention walks."""
        return layout_for(self.name, self.tbptt_over)


def layout_for(name: str, tbptt_over: str = "documents") -> str:
    """The data layout intervention `name` walks (tbptt: the one its tbptt_over names)."""
    return TBPTT_LAYOUT.get(tbptt_over, "documents") if name == "tbptt" else LAYOUT_FOR.get(name, "independent")
