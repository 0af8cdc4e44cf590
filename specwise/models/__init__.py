"""Models behind the Model contract and their loaders.

The names below are imported on first use, so that importing one part of the package (``specwise.models.kernels``,
say) does not import the others: the kernels sit below the models, the loader above them. Importing the package, or
the loader, loads no torch: ``HFModel`` and ``NativeModel`` are torch code (the ``hf`` extra), imported only when
asked for (without torch they raise MissingExtraError naming the extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from specwise.models.base import Model

if TYPE_CHECKING:
    from specwise.files import cache_dir
    from specwise.models.hf import HFModel
    from specwise.models.loader import DEFAULT_MODEL, LoadedModel, load_model
    from specwise.models.native import NativeModel

__all__ = ["DEFAULT_MODEL", "HFModel", "LoadedModel", "Model", "NativeModel", "cache_dir", "load_model"]

_HOMES = {
    "DEFAULT_MODEL": "specwise.models.loader",
    "HFModel": "specwise.models.hf",
    "LoadedModel": "specwise.models.loader",
    "NativeModel": "specwise.models.native",
    "cache_dir": "specwise.files",
    "load_model": "specwise.models.loader",
}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
