"""The generic tool-call format, for any chat template that does not render tools (SmolLM2, Gemma 3, ...), as
llama.cpp's server has it: the tools are described in a system message, and the reply is one JSON object holding
the calls, ``{"tool_calls": [{"name": ..., "arguments": {...}}]}``, or the text, ``{"response": "..."}``.
Earlier calls and tool results are written into the conversation as that JSON. It is the format a template gets
when no other format detects it.
"""

from __future__ import annotations

import json
import re

from specwise.constraints import Constraint, JsonSchema
from specwise.tools.formats.base import LAYOUT, ToolFormat, arguments_object, call_schema, one_of
from specwise.tools.parse import CALL_NAME, CallParser, Piece
from specwise.tools.spec import ToolRequest

__all__ = ["GENERIC_CALLS", "GENERIC_TEXT", "GENERIC_TOOLS", "Generic", "GenericParser"]

GENERIC_TOOLS = "You can call these functions (tools), described as JSON schemas:\n{tools}\n\n"
GENERIC_CALLS = '{{"tool_calls": [{{"name": "<function name>", "arguments": {{<its arguments>}}}}]}} to call {which}'
GENERIC_TEXT = '{{"response": "<your answer>"}} to answer directly'


class Generic(ToolFormat):
    name = "generic"
    order = 90
    fallback = True
    native = False

    def prompt(self, messages: list[dict], request: ToolRequest | None) -> tuple[list[dict], list[dict] | None]:
        out = _generic_history(messages)
        if request is None or request.choice.mode == "none":
            return out, None
        text = self.instructions(request)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
        return out, None

    @staticmethod
    def instructions(request: ToolRequest) -> str:
        """The system message's description of the tools and of the reply's JSON."""
        tools = "\n".join(json.dumps(f.openai()["function"], ensure_ascii=False) for f in request.functions)
        if request.choice.mode == "function":
            which = f"the function {request.choice.name}"
        else:
            which = "one or more of them" if request.parallel else "one of them"
        reply = GENERIC_CALLS.format(which=which)
        if not request.choice.calls_only:
            reply += ", or " + GENERIC_TEXT.format()
        return GENERIC_TOOLS.format(tools=tools) + f"Reply with one JSON object: {reply}."

    def constraint(self, request: ToolRequest | None, tokenizer, thinking=None) -> Constraint | None:
        if request is None or request.choice.mode == "none":
            return None
        calls = {"type": "array", "items": one_of([call_schema(f, "arguments") for f in request.callable])}
        calls["minItems"] = 1
        if not request.parallel:
            calls["maxItems"] = 1
        branches = [_object({"tool_calls": calls})]
        if not request.choice.calls_only:
            branches.append(_object({"response": {"type": "string"}}))
        return JsonSchema({**one_of(branches), "x-guidance": LAYOUT})

    def parser(self, request: ToolRequest | None) -> CallParser | None:
        return None if request is None or request.choice.mode == "none" else GenericParser()


def _object(properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _generic_history(messages: list[dict]) -> list[dict]:
    """Messages for a template without tools: an assistant's calls become its content, the JSON it would have
    written (``{"tool_calls": [...]}``); tool results become a user message (consecutive ones merged), each a line
    ``{"tool_response": {"id", "name", "content"}}``."""
    out: list[dict] = []
    names: dict[str, str] = {}
    results = False  # whether out[-1] is a user message of tool results
    for message in messages:
        role = message["role"]
        if role == "tool":
            call_id = message.get("tool_call_id")
            line = {"tool_response": {"id": call_id, "name": names.get(call_id), "content": message.get("content")}}
            text = json.dumps(line, ensure_ascii=False)
            if results:
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text})
            results = True
            continue
        results = False
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                names[call["id"]] = call["function"]["name"]
                args = arguments_object(call["function"]["arguments"])
                calls.append({"name": call["function"]["name"], "arguments": args})
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
            continue
        out.append({"role": role, "content": message.get("content") or ""})
    return out


class GenericParser(CallParser):
    """The generic format: the reply is ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`` or
    ``{"response": "..."}`` (its string is the content). Anything else comes back as content."""

    RESPONSE = re.compile(r'\s*\{\s*"response"\s*:\s*"')
    CALLS = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[')
    HEAD = re.compile(r"\s*" + CALL_NAME + r'"arguments"\s*:\s*(?=\S)')
    TAIL = re.compile(r"\s*\}\s*([,\]])")
    OPENERS = ('{"response":"', '{"tool_calls":[')

    def __init__(self) -> None:
        super().__init__()
        self.raw = ""  # the whole reply, given back as content if it is neither form

    def feed(self, text: str, final: bool = False) -> list[Piece]:
        self.raw += text
        return super().feed(text, final)

    def _start(self) -> bool:
        for pattern, state in ((self.RESPONSE, "response"), (self.CALLS, "head")):
            match = pattern.match(self.buf)
            if match:
                self.buf, self.state = self.buf[match.end() :], state
                return True
        compact = "".join(self.buf.split())
        if not self.final and any(opener.startswith(compact) for opener in self.OPENERS):
            return False
        self.state = "raw"
        return True

    def _raw(self) -> bool:
        self._emit_content(self.buf, hold=False)
        self.buf = ""
        return False

    def _response(self) -> bool:
        try:
            text, used, closed = _json_string_prefix(self.buf)
        except ValueError:  # a broken escape: the rest comes back as written
            text, used, closed = self.buf, len(self.buf), True
        self._emit_content(text, hold=False)
        self.buf = self.buf[used:]
        if closed:
            self.state = "end"
        return closed

    def _head(self) -> bool:
        return self._open_call()

    def _tail(self) -> bool:
        match = self.TAIL.match(self.buf)
        if match is None:
            return False
        self.buf = self.buf[match.end() :]
        self.state = "head" if match.group(1) == "," else "end"
        return True

    def _end(self) -> bool:
        self.buf = ""
        return False

    def _finish(self) -> None:
        if not self.calls and self.state in ("start", "head"):  # neither form: the reply is the content
            self.content = ""
            self._emit_content(self.raw, hold=False)


def _json_string_prefix(text: str) -> tuple[str, int, bool]:
    """The decoded text of the longest whole part of a JSON string's body at the start of ``text`` (escapes
    complete, surrogate pairs together): (decoded, characters used, whether the closing quote was reached, the
    quote counted as used)."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return json.loads(f'"{text[:i]}"'), i + 1, True
        if ch != "\\":
            i += 1
            continue
        if i + 1 >= len(text):
            break
        if text[i + 1] != "u":
            i += 2
            continue
        if i + 6 > len(text):
            break
        high = 0xD800 <= int(text[i + 2 : i + 6], 16) <= 0xDBFF
        if high and i + 12 > len(text):
            break
        i += 12 if high else 6
    return json.loads(f'"{text[:i]}"'), i, False
