"""Models behind the Model contract and their loaders."""

from specwise.models.base import Model
from specwise.models.hf import HFModel
from specwise.models.loader import DEFAULT_MODEL, LoadedModel, cache_dir, load_model
from specwise.models.native import NativeModel

__all__ = ["DEFAULT_MODEL", "HFModel", "LoadedModel", "Model", "NativeModel", "cache_dir", "load_model"]
