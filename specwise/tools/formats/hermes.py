"""The Hermes tool-call format (Qwen2.5, Qwen3): the chat template renders ``tools``, and each call is
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, with text around the calls.

In ``auto`` mode the grammar lets the model write text freely and takes over once it opens a call: the text before a
call is a lazy lexeme that ends at the first ``<tool_call>`` (llguidance's ``lazy``; text after the last call may
not hold the tag), so every call that opens is made to match a function's schema. ``required`` and a named function
allow only calls (of that function); ``none`` forbids the opener. Where the vocabulary has a tag as a special token,
the grammar names that token rather than its text. Without a grammar (``auto``), a reply that is a bare or fenced
JSON call of a requested function is read as one (:class:`~specwise.tools.loose.LooseCalls`).
"""

from __future__ import annotations

import re

from specwise.constraints import Constraint
from specwise.tools.formats.base import ToolFormat, ToolGrammar, call_schema, lark_json, one_of, thinking_rules
from specwise.tools.loose import LooseCalls
from specwise.tools.parse import CALL_NAME, CallParser, call_from_json, held_prefix
from specwise.tools.spec import ToolRequest
from specwise.tools.tokens import grammar_tag, special_token_id

__all__ = ["Hermes", "HermesParser"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class Hermes(ToolFormat):
    name = "hermes"
    order = 10

    def detects(self, template: str) -> bool:
        return "tools" in template and OPEN in template

    def markers(self, tokenizer) -> set[int]:
        found = (special_token_id(tokenizer, OPEN), special_token_id(tokenizer, CLOSE))
        return {t for t in found if t is not None}

    def constraint(self, request: ToolRequest | None, tokenizer, thinking=None) -> Constraint | None:
        if request is None:
            return None
        opener, special = grammar_tag(tokenizer, OPEN)
        closer, _ = grammar_tag(tokenizer, CLOSE)
        schema = one_of([call_schema(f, "arguments") for f in request.callable])
        rules = [f'body: "\\n" fn "\\n" {closer}', f"fn: {lark_json(schema)}"]
        if special:  # text cannot hold a special token: the opener ends it
            rules.append("TEXT: /(?s:.+)/")
            text_only = "start: TEXT?"
        else:
            rules.append(f"TAIL: /(?s:.*)/ & ~/(?s:.*){OPEN}(?s:.*)/")
            text_only = "start: TAIL"
        mode, many = request.choice.mode, request.parallel
        if mode == "none":
            start = [text_only]
        elif request.choice.calls_only:
            # the model may end its line after the last call before it ends the reply
            start = ['start: call ("\\n" call)* "\\n"?' if many else 'start: call "\\n"?', f"call: {opener} body"]
        elif special:
            start = [f"start: TEXT? (call TEXT?){'*' if many else '?'}", f"call: {opener} body"]
        else:
            head = f"head[lazy]: /(?s:.*)/ {opener}"
            start = ["start: (head body)* TAIL" if many else "start: TAIL | head body TAIL", head]
        if thinking is not None:
            start = [line.replace("start:", "reply:", 1) for line in start] + thinking_rules(tokenizer, thinking)
        return ToolGrammar("\n".join(start + rules) + "\n")

    def parser(self, request: ToolRequest | None) -> CallParser | None:
        if request is None or request.choice.mode == "none":
            return None
        if request.choice.calls_only:  # the grammar writes the calls in their tags
            return HermesParser()
        functions = {f.name: f.parameters for f in request.callable}
        return HermesParser(LooseCalls(functions, request.parallel))


class HermesParser(CallParser):
    """Calls tagged ``<tool_call>`` ... ``</tool_call>``, each holding ``{"name": ..., "arguments": {...}}``;
    text around them is content."""

    OPEN, CLOSE = OPEN, CLOSE
    HEAD = re.compile(r"\s*" + CALL_NAME + r'"arguments"\s*:\s*(?=\S)')
    TAIL = re.compile(r"\s*\}\s*" + re.escape(CLOSE))

    def __init__(self, loose: LooseCalls | None = None) -> None:
        super().__init__()
        self.loose = loose  # the request's functions, for a reply that is a bare or fenced JSON call (auto)
        self._opening = loose is not None  # whether the reply's opening is still to be judged

    def _start(self) -> bool:  # text
        if self._opening:
            verdict = self.loose.may_open(self.buf)
            if verdict is None and not self.final:
                return False  # too little to tell: hold it
            self._opening = False
            if verdict:
                self.state = "loose"
                return True
        return self._text()

    def _loose(self) -> bool:
        """A reply that opened as a loose call: held whole, then calls if it is one, else content."""
        if not self.final:
            return False
        calls = self.loose.calls(self.buf)
        if calls is None:
            self._emit_content(self.buf, hold=False)
        for name, arguments in calls or ():
            self._whole_call(name, arguments)
        self.buf, self.state = "", "start"
        return False

    def _text(self) -> bool:
        i = self.buf.find(self.OPEN)
        if i >= 0:
            self._emit_content(self.buf[:i])
            self.buf, self.state = self.buf[i + len(self.OPEN) :], "head"
            return True
        keep = 0 if self.final else held_prefix(self.buf, self.OPEN)
        self._emit_content(self.buf[: len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep :]
        return False

    def _head(self) -> bool:
        if self._open_call():
            return True
        end = self.buf.find(self.CLOSE)
        if end < 0 and not self.final:
            return False
        body = self.buf if end < 0 else self.buf[:end]
        call = call_from_json(body.strip(), ("arguments", "parameters"))
        if call is not None:
            self._whole_call(*call)
        else:  # not a call: the text comes back as it was written
            self._emit_content(self.OPEN + body + ("" if end < 0 else self.CLOSE))
        self.buf = "" if end < 0 else self.buf[end + len(self.CLOSE) :]
        self.state = "start"
        return bool(self.buf)

    def _tail(self) -> bool:
        match = self.TAIL.match(self.buf)
        if match:
            self.buf, self.state = self.buf[match.end() :], "start"
            return True
        rest = self.buf.lstrip()
        if not self.final and (not rest or (rest[0] == "}" and self.CLOSE.startswith(rest[1:].lstrip()))):
            return False
        self.state = "start"  # the call's arguments are whole; what follows them is text
        return True
