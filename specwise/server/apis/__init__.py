"""The APIs that are adapters over the one chat path (``server/chat.py``), one module each: Anthropic's Messages
(:mod:`.anthropic`), OpenAI's Responses (:mod:`.openai_responses`). Each translates its body into the chat path's
request and the chat path's pieces into its answers, and adds its routes (``add_routes(app)``). A new API is a module
here: every module of this package is one (:data:`ADAPTERS`, in name order), so adding one touches that module and
its tests only."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

__all__ = ["ADAPTERS"]


def _adapters() -> tuple[ModuleType, ...]:
    """Every module of this package, imported, in name order."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    return tuple(importlib.import_module(f"{__name__}.{name}") for name in names)


ADAPTERS = _adapters()
