"""Llama 3's JSON tool-call format (Llama 3.1, 3.2, 3.3): the chat template renders ``tools``, and a call is the
whole reply, one JSON object ``{"name": ..., "parameters": {...}}`` (after ``<|python_tag|>`` where the model
writes it). A reply that starts with ``{`` must be a call; any other reply is content.
"""

from __future__ import annotations

import re

from specwise.constraints import Constraint
from specwise.tools.formats.base import ToolFormat, ToolGrammar, call_schema, lark_json, one_of
from specwise.tools.parse import CALL_NAME, CallParser, call_from_json
from specwise.tools.spec import ToolRequest

__all__ = ["LlamaJson", "LlamaJsonParser"]


class LlamaJson(ToolFormat):
    name = "llama3_json"
    order = 20

    def detects(self, template: str) -> bool:
        return "tools" in template and "<|start_header_id|>" in template and '"parameters"' in template

    def constraint(self, request: ToolRequest | None, tokenizer, thinking=None) -> Constraint | None:
        if request is None:
            return None
        schema = one_of([call_schema(f, "parameters") for f in request.callable])
        text = "TEXT: /[^{](?s:.*)/"
        if request.choice.mode == "none":
            start = "start: TEXT?"
        elif request.choice.calls_only:
            start = "start: call"
        else:
            start = "start: TEXT? | call"
        return ToolGrammar(f"{start}\ncall: {lark_json(schema)}\n{text}\n")

    def parser(self, request: ToolRequest | None) -> CallParser | None:
        return None if request is None or request.choice.mode == "none" else LlamaJsonParser()


class LlamaJsonParser(CallParser):
    """A reply that begins with ``{`` is one call ``{"name": ..., "parameters": {...}}``; any other reply is
    content."""

    HEAD = re.compile(CALL_NAME + r'"(?:parameters|arguments)"\s*:\s*(?=\S)')
    TAIL = re.compile(r"\s*\}")

    def _start(self) -> bool:
        self.buf = self.buf.removeprefix("<|python_tag|>")
        if not self.buf:
            return False
        self.state = "head" if self.buf[0] == "{" else "text"
        return True

    def _text(self) -> bool:
        self._emit_content(self.buf)
        self.buf = ""
        return False

    def _head(self) -> bool:
        if self._open_call():
            return True
        if not self.final:
            return False
        call = call_from_json(self.buf.strip(), ("parameters", "arguments"))
        if call is not None:
            self._whole_call(*call)
        else:
            self._emit_content(self.buf)
        self.buf, self.state = "", "text"
        return False

    def _tail(self) -> bool:
        match = self.TAIL.match(self.buf)
        if match is None and not self.final and not self.buf.strip():
            return False
        self.buf = self.buf[match.end() :] if match else self.buf
        self.state = "text"
        return True
