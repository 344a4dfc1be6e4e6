"""Length-generalization diagnostics: position-wise perplexity (with the reset-every-T control),
state statistics by position, Effective Remembrance, plots (what the callbacks and `recurlen eval` measure).

    bins.py          position bins ([0,T), [T,2T), ... or log-spaced)
    positionwise.py  loss by position, the reset control, state statistics on the way
    state_stats.py   state norm / std by position
    effrem.py        Effective Remembrance
    plots.py         the figures of a results.json
    model_access.py  how a diagnostic reaches a model: state API check, device, autocast, eval mode, sequences
"""
