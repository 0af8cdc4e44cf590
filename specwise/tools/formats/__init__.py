"""The tool-call formats, one module each: how a conversation with tools is rendered for the model, the grammar its
calls must follow and the parser that reads them out of its reply (:class:`~.base.ToolFormat`), side by side.

- :mod:`.hermes`: ``<tool_call>`` tags around JSON calls (Qwen2.5, Qwen3);
- :mod:`.llama_json`: the reply is one JSON call (Llama 3.1, 3.2, 3.3);
- :mod:`.generic`: any other template: the tools described in a system message, the reply a JSON object holding the
  calls or the text, as llama.cpp's server does for such models.

Which one a model uses is read from its chat template (:func:`detect_format`): the formats of ``REGISTERED`` are
asked in order, and a template that none of them detects gets the generic format. A new format is a module here
(its ``ToolFormat`` subclass and its parser) and its line in ``REGISTERED``.
"""

from __future__ import annotations

from specwise.tools.formats.base import ToolFormat, ToolGrammar
from specwise.tools.formats.generic import Generic
from specwise.tools.formats.hermes import Hermes
from specwise.tools.formats.llama_json import LlamaJson
from specwise.tools.tokens import special_token_id

__all__ = ["FALLBACK", "FORMATS", "REGISTERED", "ToolFormat", "ToolGrammar", "detect_format", "special_token_id"]

REGISTERED: list[type[ToolFormat]] = [Hermes, LlamaJson, Generic]  # the order detect_format asks them in
FALLBACK = Generic.name  # a template that no format detects
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
