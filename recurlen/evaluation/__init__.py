"""Evaluating checkpoints: the `recurlen eval` runner and its held-out data, generation, and the long-context
tasks (passkey, BABILong, copying)."""
