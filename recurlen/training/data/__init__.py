"""Data: corpus loading and token cache, lanes whose position is a pure function of the step, validation data."""

from recurlen.training.data.config import LAYOUTS, VAL_MODES, DataConfig

# The corpus and the DataModule import Lightning and datasets (seconds on a loaded machine): loaded on first use, so
# that composing and checking a config (DataConfig) does not pay for them.
_LAZY = {"Corpus": "corpus", "load_corpus": "corpus", "RecurlenDataModule": "datamodule"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LAYOUTS", "VAL_MODES", "Corpus", "DataConfig", "RecurlenDataModule", "load_corpus"]
