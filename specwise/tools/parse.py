"""Reading tool calls out of a reply as it streams: one parser per output format, each fed the reply's text in
pieces and giving back pieces of the answer: content text, the start of a call (its id and name), and pieces
of a call's arguments (JSON text). The whole answer is the same pieces put together, so a streamed answer and
an unstreamed one are the same by construction.

- :class:`HermesParser`: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Qwen2.5, Qwen3);
- :class:`LlamaJsonParser`: the reply is one JSON object ``{"name": ..., "parameters": {...}}`` (Llama 3.x);
- :class:`GenericParser`: the reply is ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` or
  ``{"response": "..."}`` (models whose template has no tools).

Text that opens a call but is not one (a call the model wrote wrongly) comes back as content; a call cut short by
the token limit keeps the arguments written so far (as OpenAI's answers do), incomplete.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from specwise.tools.loose import LooseCalls

__all__ = [
    "ArgumentsPiece",
    "CallParser",
    "CallStart",
    "ContentPiece",
    "GenericParser",
    "HermesParser",
    "LlamaJsonParser",
    "ReasoningPiece",
    "ToolCall",
    "new_call_id",
]


def new_call_id() -> str:
    """A call id as OpenAI writes them: ``call_`` and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ContentPiece:
    text: str


@dataclass
class ReasoningPiece:
    """Text of the model's thinking (between its thinking tags), apart from the answer."""

    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class ArgumentsPiece:
    index: int
    text: str


Piece = ContentPiece | ReasoningPiece | CallStart | ArgumentsPiece


@dataclass
class ToolCall:
    """One call of a reply: id, function name, arguments (JSON text) and whether the reply finished it."""

    id: str
    name: str
    arguments: str = ""
    complete: bool = False

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class JsonScanner:
    """Finds where a JSON value written in pieces ends: feed text, get how much of it belongs to the value."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = self.escaped = self.started = False
        self.done = False

    def feed(self, text: str) -> int:
        """Characters of ``text`` that belong to the value (all of it while it goes on); sets ``done``."""
        for i, ch in enumerate(text):
            if not self.started:
                if ch.isspace():
                    continue
                self.started = True
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return self._end(i + 1)
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    return self._end(i + 1)
            elif self.depth == 0 and ch in ",\n ":  # a bare scalar ends at a separator
                return self._end(i)
        return len(text)

    def _end(self, n: int) -> int:
        self.done = True
        return n


def _call_from_json(text: str, keys: tuple[str, ...]) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a call written as a JSON object in any key order, else None."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = next((obj[k] for k in keys if k in obj), None)
    if isinstance(args, str):
        return obj["name"], args
    if isinstance(args, dict):
        return obj["name"], json.dumps(args, ensure_ascii=False)
    return None


class CallParser:
    """Base of the parsers: ``feed(text, final)`` returns the answer's new pieces; ``calls`` and ``content``
    hold the answer so far. Subclasses write a method ``_<state>`` per state of their state machine (one move;
    False: wait for more text), which :meth:`_step` calls."""

    def __init__(self) -> None:
        self.buf = ""  # text received and not yet given out
        self.state = "start"
        self.calls: list[ToolCall] = []
        self.content = ""
        self._held = ""  # whitespace after content, given out only when more content follows
        self._out: list[Piece] = []
        self._scanner: JsonScanner | None = None
        self.final = False

    def feed(self, text: str, final: bool = False) -> list[Piece]:
        """Take the reply's next text (``final``: the reply ended) and return the answer's new pieces."""
        self.buf += text
        self.final = final
        while self._step():
            pass
        if final:
            self._finish()
            held, self._held = self._held, ""
            if held and not self.calls:
                self._emit_content(held, hold=False)
        out, self._out = self._out, []
        return out

    def _step(self) -> bool:
        """One move of the parser: the method of its state (``_start``, ``_head``, ``_args``, ...); True when it
        may move again on what the buffer holds."""
        return getattr(self, f"_{self.state}")()

    def _open_call(self) -> bool:
        """Start a call where the buffer begins with its head (``HEAD``: the name, then the arguments' key), and
        go on to its arguments; False when it does not (yet)."""
        match = self.HEAD.match(self.buf)
        if match is None:
            return False
        self._start_call(match.group(1))
        self.buf, self.state = self.buf[match.end() :], "args"
        return True

    def _args(self) -> bool:
        """A call's arguments: given out as they come, then the call's tail."""
        if not self._arguments():
            return False
        self.state = "tail"
        return True

    def _finish(self) -> None:
        """At the reply's end, whatever the buffer still holds."""

    # the answer's pieces

    def _emit_content(self, text: str, hold: bool = True) -> None:
        """Content text; whitespace at its end is held until more content follows (whitespace around calls is
        dropped)."""
        text = self._held + text
        body = text.rstrip() if hold else text
        self._held = text[len(body) :]
        if body:
            self.content += body
            self._out.append(ContentPiece(body))

    def _start_call(self, name: str) -> None:
        self._held = ""
        call = ToolCall(new_call_id(), name)
        self.calls.append(call)
        self._out.append(CallStart(len(self.calls) - 1, call.id, name))
        self._scanner = JsonScanner()

    def _emit_arguments(self, text: str) -> None:
        if text:
            self.calls[-1].arguments += text
            self._out.append(ArgumentsPiece(len(self.calls) - 1, text))

    def _whole_call(self, name: str, arguments: str) -> None:
        self._start_call(name)
        self._emit_arguments(arguments)
        self.calls[-1].complete = True

    def _arguments(self) -> bool:
        """Give out the arguments' text up to the end of their JSON value; True once it ended."""
        n = self._scanner.feed(self.buf)
        self._emit_arguments(self.buf[:n])
        self.buf = self.buf[n:]
        if self._scanner.done:
            self.calls[-1].complete = True
        return self._scanner.done


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker`` (text to hold back: it may open a call)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


_NAME = r'\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*'


class HermesParser(CallParser):
    """Calls tagged ``<tool_call>`` ... ``</tool_call>``, each holding ``{"name": ..., "arguments": {...}}``;
    text around them is content."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    HEAD = re.compile(r"\s*" + _NAME + r'"arguments"\s*:\s*(?=\S)')
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
        keep = 0 if self.final else _held_prefix(self.buf, self.OPEN)
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
        call = _call_from_json(body.strip(), ("arguments", "parameters"))
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


class LlamaJsonParser(CallParser):
    """A reply that begins with ``{`` is one call ``{"name": ..., "parameters": {...}}``; any other reply is
    content."""

    HEAD = re.compile(_NAME + r'"(?:parameters|arguments)"\s*:\s*(?=\S)')
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
        call = _call_from_json(self.buf.strip(), ("parameters", "arguments"))
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


class GenericParser(CallParser):
    """The generic format: the reply is ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`` or
    ``{"response": "..."}`` (its string is the content). Anything else comes back as content."""

    RESPONSE = re.compile(r'\s*\{\s*"response"\s*:\s*"')
    CALLS = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[')
    HEAD = re.compile(r"\s*" + _NAME + r'"arguments"\s*:\s*(?=\S)')
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
