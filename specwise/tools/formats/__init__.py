"""The tool-call formats, one module each: how a conversation with tools is rendered for the model, the grammar its
calls must follow and the parser that reads them out of its reply (:class:`~.base.ToolFormat`), side by side.

- :mod:`.hermes`: ``<tool_call>`` tags around JSON calls (Qwen2.5, Qwen3);
- :mod:`.llama_json`: the reply is one JSON call (Llama 3.1, 3.2, 3.3);
- :mod:`.generic`: any other template: the tools described in a system message, the reply a JSON object holding the
  calls or the text, as llama.cpp's server does for such models.

Which one a model uses is read from its chat template (:func:`detect_format`): the formats are asked in their
``order``, and a template that none of them detects gets the fallback format (the generic one). A new format is a
module here holding its ``ToolFormat`` subclass (with its ``name`` and ``order``) and its parser: every module of
this package but ``base`` is looked through for them (``REGISTERED``), so adding a format touches that module only.
"""

from __future__ import annotations

import importlib
import pkgutil

from specwise.tools.formats.base import ToolFormat, ToolGrammar
from specwise.tools.tokens import special_token_id

__all__ = ["FALLBACK", "FORMATS", "REGISTERED", "ToolFormat", "ToolGrammar", "detect_format", "special_token_id"]


def _registered() -> list[type[ToolFormat]]:
    """The ToolFormat subclasses defined in this package's modules (``base`` aside), in their ``order``."""
    found: list[type[ToolFormat]] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found += [
            cls
            for cls in vars(module).values()
            if isinstance(cls, type) and issubclass(cls, ToolFormat) and cls.__module__ == module.__name__
        ]
    return sorted(found, key=lambda cls: (cls.order, cls.name))


REGISTERED: list[type[ToolFormat]] = _registered()  # the order detect_format asks them in
FALLBACK = next(cls.name for cls in REGISTERED if cls.fallback)  # a template that no format detects
FORMATS: dict[str, ToolFormat] = {cls.name: cls() for cls in REGISTERED}


def detect_format(template: str | None) -> ToolFormat:
    """The tool-call format of a chat template: the first of ``REGISTERED`` that detects it (Hermes where it
    renders tools and ``<tool_call>`` tags, Llama's JSON where it renders tools and calls with ``"parameters"`` in
    Llama 3's headers), else the generic format."""
    if template:
        for fmt in FORMATS.values():
            if fmt.detects(template):
                return fmt
    return FORMATS[FALLBACK]
