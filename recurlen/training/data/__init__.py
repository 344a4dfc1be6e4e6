"""Data: corpus loading and token cache, lanes whose position is a pure function of the step, validation data."""

from recurlen.training.data.config import LAYOUTS, VAL_MODES, DataConfig
from recurlen.training.data.corpus import Corpus, load_corpus
from recurlen.training.data.datamodule import RecurlenDataModule

__all__ = ["LAYOUTS", "VAL_MODES", "Corpus", "DataConfig", "RecurlenDataModule", "load_corpus"]
