"""Data: corpus loading and token cache, lanes whose position is a pure function of the step, validation data."""

from recurlen.data.config import LAYOUTS, VAL_MODES, DataConfig
from recurlen.data.corpus import Corpus, load_corpus
from recurlen.data.datamodule import RecurlenDataModule

__all__ = ["LAYOUTS", "VAL_MODES", "Corpus", "DataConfig", "RecurlenDataModule", "load_corpus"]
