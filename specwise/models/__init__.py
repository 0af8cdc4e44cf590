"""Models behind the Model contract and their loaders."""

from specwise.models.base import Model
from specwise.models.hf import HFModel
from specwise.models.loader import DEFAULT_MODEL, LoadedModel, cache_dir, load_model

__all__ = ["DEFAULT_MODEL", "HFModel", "LoadedModel", "Model", "cache_dir", "load_model"]
