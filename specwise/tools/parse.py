"""Reading tool calls out of a reply as it streams: the pieces of an answer (content text, the start of a call with
its id and name, pieces of a call's arguments as JSON text) and :class:`CallParser`, the base of every format's
parser (each in its format's module of :mod:`specwise.tools.formats`), fed the reply's text in pieces and giving
back the answer's pieces. The whole answer is the same pieces put together, so a streamed answer and an
unstreamed one are the same by construction.

Text that opens a call but is not one (a call the model wrote wrongly) comes back as content; a call cut short by
the token limit keeps the arguments written so far (as OpenAI's answers do), incomplete.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

__all__ = [
    "CALL_NAME",
    "ArgumentsPiece",
    "CallParser",
    "CallStart",
    "ContentPiece",
    "JsonScanner",
    "Piece",
    "ReasoningPiece",
    "ToolCall",
    "call_from_json",
    "held_prefix",
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


def call_from_json(text: str, keys: tuple[str, ...]) -> tuple[str, str] | None:
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


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker`` (text to hold back: it may open a call)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


# the start of a call written as JSON: its name first, then the key of its arguments (a format's HEAD adds the key)
CALL_NAME = r'\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*'
