"""The arbiter: a model that retrieves within its training context, judged by the loss and by retrieval.

    judge.py    one model (a run, or a run with a training-free fix applied), both verdicts on the same weights:
                full - reset on held-out text (as `recurlen eval`) and passkey accuracy by length, every trial kept
    verdict.py  the two verdicts side by side, and what they say together ("holds the loss by forgetting")
    table.py    the Markdown table per base
"""
