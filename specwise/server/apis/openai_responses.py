"""OpenAI's Responses API (``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``) over the one chat
path (:mod:`specwise.server.chat`), for Codex CLI, the OpenAI Agents SDK and the ``openai`` client's
``responses.create`` / ``responses.stream``.

A request's input items (messages, function calls and their outputs, custom tool calls, reasoning) become a chat
conversation, its flat tools chat tools (a ``custom`` tool a function of one string parameter ``input``), its
``text.format`` a ``response_format``: the result is a :class:`~specwise.server.protocol.ChatCompletionRequest`,
run by :func:`~specwise.server.chat.prepare_chat` and read by :func:`~specwise.server.chat.reply_pieces`, whose
pieces are written here as output items (reasoning, message, function or custom tool call), whole or as events.
Greedy output is the same, token for token, as chat completions' for the same conversation. Errors name the
Responses field at fault (``input[2].call_id``, ``tools[0].parameters``, ``text.format``).

Responses are kept in memory, the last :data:`STORED_RESPONSES` (least recently used first out), so that
``previous_response_id`` continues a conversation: the stored conversation is the request's input items and its
output items (not its instructions, as at OpenAI).

One file because an API is one adapter: its request model, its translation into the chat request, its stored
responses and its events change together, and adding an API touches this file and its tests only (docs/DESIGN.md).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from specwise.extras import missing_extra

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field, ValidationError
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

from specwise.server import keepalive
from specwise.server.chat import ReplyEnd, prepare_chat, reply_pieces
from specwise.server.errors import APIError, as_api_error
from specwise.server.protocol import ChatCompletionRequest, ErrorResponse
from specwise.server.responses import CLIENT_CLOSED
from specwise.server.state import server_state
from specwise.tools import ArgumentsPiece, CallStart, ContentPiece, ReasoningPiece

__all__ = ["ResponseStore", "ResponsesRequest", "add_routes", "chat_request"]

STORED_RESPONSES = 256  # responses kept for previous_response_id and GET /v1/responses/{id}
# tools the server cannot run (OpenAI's hosted tools, Codex's local shell and namespaces): left out, as reference
# servers do
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "computer_use_preview",
        "computer",
        "code_interpreter",
        "image_generation",
        "local_shell",
        "shell",
        "mcp",
        "namespace",
        "tool_search",
        "apply_patch",
    }
)
TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}  # type -> its field
MEDIA_PARTS = frozenset({"input_image", "input_file", "input_audio"})
ROLES = frozenset({"user", "assistant", "system", "developer"})
_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429)}


class ResponsesRequest(BaseModel):
    """POST /v1/responses. Unknown fields are refused, as at OpenAI; unknown fields inside input items and tools are
    ignored (clients resend what earlier answers held)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(description="any model name: it is echoed back (the server serves one model)")
    input: str | list[Any] | None = Field(None, description="a user message, or a list of input items")
    instructions: str | None = Field(None, description="a system message put first")
    previous_response_id: str | None = Field(None, description="continue the conversation of a stored response")
    tools: list[Any] | None = Field(None, description="function and custom tools (hosted tools are left out)")
    tool_choice: str | dict | None = Field(None, description='"auto", "none", "required" or {"type", "name"}')
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1, description="new tokens at most")
    max_tool_calls: int | None = Field(None, ge=1, description="accepted, not enforced")
    temperature: float | None = Field(None, ge=0, le=2, description="0 is greedy (default: 1)")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="specwise's extension, as in chat completions")
    min_p: float | None = Field(None, ge=0, lt=1, description="specwise's extension, as in chat completions")
    seed: int | None = Field(None, description="specwise's extension, as in chat completions")
    grammar: str | None = Field(None, description="specwise's extension, as in chat completions")
    regex: str | None = Field(None, description="specwise's extension, as in chat completions")
    chat_template_kwargs: dict | None = Field(None, description="specwise's extension, as in chat completions")
    ignore_eos: bool | None = Field(None, description="specwise's extension, as in chat completions")
    top_logprobs: int | None = Field(None, ge=0, le=0, description="only 0: log-probabilities are not returned")
    text: dict | None = Field(None, description='{"format": {"type": "text" | "json_object" | "json_schema", ...}}')
    reasoning: dict | None = Field(None, description="accepted, not used")
    store: bool | None = Field(None, description="keep the response for previous_response_id (default: true)")
    include: list[str] | None = Field(None, description="accepted, not used")
    stream: bool | None = False
    stream_options: dict | None = None
    background: bool | None = Field(None, description="only false")
    truncation: Literal["auto", "disabled"] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    client_metadata: dict | None = Field(None, description="sent by Codex; not used")


# ------------------------------------------------------------------------------------------------- the request


@dataclass
class ChatPlan:
    """A Responses request as a chat request, with where each chat message and tool came from (to name the
    Responses field of an error) and the names of the custom tools (their calls are ``custom_tool_call`` items)."""

    chat: ChatCompletionRequest
    message_sources: list[list[str]]  # message i -> [its item's path, then each of its tool calls' items' paths]
    tool_sources: list[str]
    custom: frozenset[str]

    def renamed(self, err: APIError) -> APIError:
        """``err`` naming the Responses fields instead of the chat fields, in ``param`` and in its message."""
        return _renamed(err, self.message_sources, self.tool_sources)


_CHAT_FIELDS = {
    "messages": "input",
    "response_format": "text.format",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
}
_CHAT_PARAM = re.compile(
    r"messages\[\d+\](?:\.tool_calls\[\d+\])?(?:\.tool_call_id)?|tools\[\d+\](?:\.function)?(?:\.\w+)?|"
    r"\b(?:response_format|max_completion_tokens)\b"
)
_MESSAGE_PARAM = re.compile(r"^messages\[(\d+)\](?:\.tool_calls\[(\d+)\])?(.*)$")
_TOOL_PARAM = re.compile(r"^tools\[(\d+)\](?:\.function)?(.*)$")


def _responses_param(param: str | None, messages: list[list[str]], tools: list[str]) -> str | None:
    """The Responses field of a chat request's field (``messages[3].tool_call_id`` -> ``input[5].call_id``)."""
    if param is None:
        return None
    found = _MESSAGE_PARAM.match(param)
    if found and int(found[1]) < len(messages):
        sources = messages[int(found[1])]
        if found[2] is not None and int(found[2]) + 1 < len(sources):
            return sources[int(found[2]) + 1]
        tool_result = found[3] == ".tool_call_id" and sources[0].startswith("input[")
        return f"{sources[0]}.call_id" if tool_result else sources[0]
    found = _TOOL_PARAM.match(param)
    if found and int(found[1]) < len(tools):
        return tools[int(found[1])] + found[2]
    return _CHAT_FIELDS.get(re.split(r"[.\[]", param, maxsplit=1)[0], param)


def _renamed(err: APIError, messages: list[list[str]], tools: list[str]) -> APIError:
    """``err`` naming the Responses fields instead of the chat fields (see :func:`_responses_param`)."""
    err.param = _responses_param(err.param, messages, tools)
    err.message = _CHAT_PARAM.sub(lambda found: _responses_param(found[0], messages, tools) or "", err.message)
    return err


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


def _field(item: dict, name: str, path: str, kind: type = str) -> Any:
    """``item[name]``, which must be of type ``kind``: a 400 naming ``path.name`` otherwise."""
    if name not in item:
        raise _bad(f"{path}.{name}", f"Missing required parameter: '{path}.{name}'")
    value = item[name]
    if not isinstance(value, kind):
        raise _bad(f"{path}.{name}", f"Invalid '{path}.{name}': expected a {kind.__name__}, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _part_text(part: object, path: str) -> str:
    """The text of one content part (text, output text or refusal); media parts are refused."""
    if not isinstance(part, dict):
        raise _bad(path, f"Invalid '{path}': a content part is an object, got {_kind(part)}")
    kind = part.get("type")
    if kind in MEDIA_PARTS:
        raise _bad(f"{path}.type", f"'{kind}' is not supported: this server serves a text model; send text parts")
    if kind not in TEXT_PARTS:
        known = ", ".join(sorted(k for k in TEXT_PARTS if k != "text"))
        raise _bad(f"{path}.type", f"Invalid '{path}.type': {kind!r} is not a content part type here ({known})")
    return _field(part, TEXT_PARTS[kind], path)


def _content_text(content: object, path: str) -> str:
    """A message's or a tool output's content (a string or a list of text parts) as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(path, f"Invalid '{path}': expected a string or a list of content parts, got {_kind(content)}")
    return "".join(_part_text(part, f"{path}[{j}]") for j, part in enumerate(content))


@dataclass
class _Conversation:
    """Chat messages built from input items, with each one's sources (see :class:`ChatPlan`)."""

    messages: list[dict] = field(default_factory=list)
    sources: list[list[str]] = field(default_factory=list)
    reasoning: str | None = None  # a reasoning item's text, for the assistant message after it

    def add(self, message: dict, source: str) -> None:
        if self.reasoning is not None and message["role"] == "assistant":
            message["reasoning_content"] = self.reasoning
        self.reasoning = None
        self.messages.append(message)
        self.sources.append([source])

    def add_call(self, call_id: str, name: str, arguments: str, source: str) -> None:
        """An assistant's tool call: joins the assistant message just before (its text, or its other calls), as
        chat completions hold a reply of text and calls in one message."""
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        if not self.messages or self.messages[-1]["role"] != "assistant":
            self.add({"role": "assistant", "content": None}, source)
        elif self.reasoning is not None:
            self.messages[-1].setdefault("reasoning_content", self.reasoning)
            self.reasoning = None
        self.messages[-1].setdefault("tool_calls", []).append(call)
        self.sources[-1].append(source)

    def add_item(self, item: object, path: str) -> None:
        """One input item (a 400 naming ``path`` when it is not a known one)."""
        if not isinstance(item, dict):
            raise _bad(path, f"Invalid '{path}': an input item is an object, got {_kind(item)}")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(item, path)
        elif kind in ("function_call", "custom_tool_call"):
            name = _field(item, "name", path)
            if kind == "function_call":
                arguments = _field(item, "arguments", path)
            else:
                arguments = json.dumps({"input": _field(item, "input", path)}, ensure_ascii=False)
            self.add_call(_field(item, "call_id", path), name, arguments, path)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = _content_text(item.get("output"), f"{path}.output") if "output" in item else None
            if output is None:
                raise _bad(f"{path}.output", f"Missing required parameter: '{path}.output'")
            self.add({"role": "tool", "tool_call_id": _field(item, "call_id", path), "content": output}, path)
        elif kind == "reasoning":
            self._reasoning(item, path)
        elif kind is None:
            raise _bad(f"{path}.type", f"Missing required parameter: '{path}.type'")
        else:
            raise _bad(
                f"{path}.type",
                f"Invalid '{path}.type': {kind!r} is not supported here: give message, function_call, "
                "function_call_output, custom_tool_call, custom_tool_call_output or reasoning items",
            )

    def _reasoning(self, item: dict, path: str) -> None:
        """A reasoning item's text (its ``reasoning_text`` parts; summaries and encrypted content are left out) goes
        back with the assistant message after it, as chat's ``reasoning_content``: the template renders it or not
        (Qwen3's does within a round of tool calls)."""
        content = item.get("content")
        if not isinstance(content, list):
            return
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "reasoning_text"]
        text = "".join(t for t in texts if isinstance(t, str))
        if text:
            self.reasoning = (self.reasoning or "") + text

    def _message(self, item: dict, path: str) -> None:
        role = _field(item, "role", path)
        if role not in ROLES:
            raise _bad(f"{path}.role", f"Invalid '{path}.role': {role!r} is not one of {', '.join(sorted(ROLES))}")
        self.add({"role": role, "content": _content_text(item.get("content"), f"{path}.content")}, path)


def _input_items(body: ResponsesRequest) -> list[Any]:
    """The request's input as a list of items (a string is one user message)."""
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    return list(body.input or [])


def _conversation(body: ResponsesRequest, history: list[Any], items: list[Any]) -> _Conversation:
    conversation = _Conversation()
    if body.instructions:
        conversation.add({"role": "system", "content": body.instructions}, "instructions")
    for item in history:
        conversation.add_item(item, "previous_response_id")
    where = "input" if isinstance(body.input, str) else None
    for i, item in enumerate(items):
        conversation.add_item(item, where or f"input[{i}]")
    return conversation


def _custom_parameters(tool: dict, path: str) -> tuple[dict, str | None]:
    """A custom tool's parameters (one string, ``input``, matching the tool's regex where it gives one) and the
    note on its grammar for the description (None: free text)."""
    fmt = tool.get("format") or {"type": "text"}
    string: dict = {"type": "string"}
    note = None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise _bad(f"{path}.format", f'Invalid \'{path}.format\': use {{"type": "text"}} or {{"type": "grammar", ...}}')
    if fmt["type"] == "grammar":
        syntax = _field(fmt, "syntax", f"{path}.format")
        definition = _field(fmt, "definition", f"{path}.format")
        if syntax not in ("lark", "regex"):
            raise _bad(f"{path}.format.syntax", f"Invalid '{path}.format.syntax': use lark or regex, got {syntax!r}")
        if syntax == "regex":  # the whole input matches it (JSON schema patterns would match anywhere)
            string["pattern"] = f"^(?:{definition})$"
        note = f"Its input follows this {syntax} grammar:\n{definition}"
    schema = {"type": "object", "properties": {"input": string}, "required": ["input"], "additionalProperties": False}
    return schema, note


def _chat_tool(tool: object, path: str) -> dict | None:
    """A Responses tool as a chat tool (None: a tool the server cannot run, left out)."""
    if not isinstance(tool, dict):
        raise _bad(path, f"Invalid '{path}': a tool is an object, got {_kind(tool)}")
    kind = tool.get("type")
    if kind in HOSTED_TOOLS:
        return None
    if kind not in ("function", "custom"):
        raise _bad(f"{path}.type", f"Invalid '{path}.type': {kind!r} is not a tool type this server can run")
    function = {"name": tool.get("name")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    if kind == "custom":
        function["parameters"], note = _custom_parameters(tool, path)
        if note is not None:
            function["description"] = f"{function.get('description') or ''}\n\n{note}".lstrip()
    else:
        for key in ("parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
    return {"type": "function", "function": function}


def _tools(body: ResponsesRequest) -> tuple[list[dict], list[str], frozenset[str]]:
    """The chat tools, the path of each, and the names of the custom tools."""
    tools, sources, custom = [], [], set()
    for j, tool in enumerate(body.tools or []):
        converted = _chat_tool(tool, f"tools[{j}]")
        if converted is not None:
            tools.append(converted)
            sources.append(f"tools[{j}]")
            if tool["type"] == "custom":
                custom.add(converted["function"]["name"])
    return tools, sources, frozenset(custom)


def _tool_choice(choice: str | dict | None, tools: list[dict]) -> str | dict | None:
    """The chat ``tool_choice`` (``auto`` and ``none`` dropped when no tool is left: Codex always sends ``auto``)."""
    if choice is None or (choice in ("auto", "none") and not tools):
        return None
    if isinstance(choice, str):
        return choice
    if choice.get("type") not in ("function", "custom") or not isinstance(choice.get("name"), str):
        message = (
            'Invalid \'tool_choice\': use "auto", "none", "required", {"type": "function", "name": ...} or '
            '{"type": "custom", "name": ...} (allowed_tools and hosted tools are not supported)'
        )
        raise _bad("tool_choice", message)
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(text: dict | None) -> dict | None:
    """``text.format`` as chat's ``response_format`` (None: free text)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _bad("text.format", f"Invalid 'text.format': expected an object, got {_kind(fmt)}")
    if fmt.get("type") == "json_schema":
        _field(fmt, "schema", "text.format", dict)
        spec = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": spec}
    if fmt.get("type") in ("text", "json_object"):
        return None if fmt["type"] == "text" else {"type": "json_object"}
    raise _bad("text.format.type", f"Invalid 'text.format.type': use text, json_object or json_schema, got {fmt!r}")


def _check_unsupported(body: ResponsesRequest) -> None:
    if body.background:
        raise _bad("background", "background responses are not supported: leave background out or false")
    if body.input is None and body.previous_response_id is None:
        raise _bad("input", "Missing required parameter: 'input'")


_EXTENSIONS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "grammar",
    "regex",
    "chat_template_kwargs",
    "ignore_eos",
)


def chat_request(body: ResponsesRequest, history: list[Any]) -> ChatPlan:
    """``body`` (after the conversation ``history`` of its previous response) as a chat request. Raises
    APIError naming the Responses field at fault."""
    _check_unsupported(body)
    conversation = _conversation(body, history, _input_items(body))
    if not conversation.messages:
        raise _bad("input", "the conversation is empty: give at least one input item (or instructions)")
    tools, tool_sources, custom = _tools(body)
    chat = {
        "model": body.model,
        "messages": conversation.messages,
        "tools": tools or None,
        "tool_choice": _tool_choice(body.tool_choice, tools),
        "parallel_tool_calls": body.parallel_tool_calls if tools else None,
        "max_completion_tokens": body.max_output_tokens,
        "response_format": _response_format(body.text),
        **{key: getattr(body, key) for key in _EXTENSIONS},
    }
    try:
        request = ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})
    except ValidationError as err:
        raise _validation_error(err, conversation.sources, tool_sources) from None
    return ChatPlan(request, conversation.sources, tool_sources, custom)


def _validation_error(err: ValidationError, messages: list[list[str]], tools: list[str]) -> APIError:
    """The chat request's first validation error, naming the Responses field."""
    first = err.errors(include_url=False)[0]
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.get("loc", ()))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    param = loc.lstrip(".") or "messages"
    return _renamed(_bad(param, f"Invalid '{param}': {message}"), messages, tools)


# -------------------------------------------------------------------------------------------------- the reply


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _decoded_prefix(body: str) -> tuple[str, int, bool]:
    """The decoded text of the longest whole part of a JSON string's body at the start of ``body`` (no escape or
    surrogate pair cut in two): (text, characters read, whether the closing quote was reached, read too)."""
    i = 0
    while i < len(body) and body[i] != '"':
        if body[i] != "\\":
            i += 1
            continue
        size = 6 if body[i + 1 : i + 2] == "u" else 2
        if size == 6 and body[i + 2 : i + 4].lower() in ("d8", "d9", "da", "db"):
            size = 12  # a high surrogate is decoded with the low one after it
        if i + size > len(body):
            break
        i += size
    closed = i < len(body) and body[i] == '"'
    try:
        return json.loads(f'"{body[:i]}"'), i + closed, closed
    except ValueError:  # not JSON after all: the whole arguments are read at the end (_CustomInput.rest)
        return "", 0, False


class _CustomInput:
    """The ``input`` string of a custom tool call, decoded as its arguments' JSON text (``{"input": "..."}``)
    comes in pieces."""

    HEAD = re.compile(r'\s*\{\s*"input"\s*:\s*"')

    def __init__(self) -> None:
        self.raw, self.read, self.closed, self.text = "", None, False, ""

    def feed(self, piece: str) -> str:
        """The new decoded text of ``piece``."""
        self.raw += piece
        if self.read is None:
            head = self.HEAD.match(self.raw)
            if head is None:
                return ""
            self.read = head.end()
        if self.closed:
            return ""
        text, used, self.closed = _decoded_prefix(self.raw[self.read :])
        self.read += used
        self.text += text
        return text

    def rest(self) -> str:
        """What the whole arguments hold beyond the text decoded so far (the reply may have written them in another
        form than the pieces could be read in)."""
        try:
            value = json.loads(self.raw).get("input")
        except (ValueError, AttributeError):
            return ""
        return value[len(self.text) :] if isinstance(value, str) and value.startswith(self.text) else ""


class OutputWriter:
    """A reply's output items, built from its pieces, and the events that stream them (each with its
    ``sequence_number``): the same items, streamed or not."""

    def __init__(self, custom: frozenset[str]) -> None:
        self.custom = custom
        self.items: list[dict] = []
        self.sequence = 0
        self._open: dict | None = None  # the item being written
        self._calls: dict[int, int] = {}  # the reply's call index -> its output index
        self._inputs: dict[int, _CustomInput] = {}  # output index of a custom tool call -> its input decoder

    def event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def feed(self, pieces: list) -> list[dict]:
        """The events of the reply's next pieces."""
        events: list[dict] = []
        for piece in pieces:
            if isinstance(piece, ContentPiece) and piece.text:
                events += self._text("message", piece.text)
            elif isinstance(piece, ReasoningPiece) and piece.text:
                events += self._text("reasoning", piece.text)
            elif isinstance(piece, CallStart):
                events += self._start_call(piece)
            elif isinstance(piece, ArgumentsPiece):
                events += self._arguments(piece)
        return events

    def end(self, finished: bool) -> list[dict]:
        """The events that close the last item (``finished``: the reply ended by itself, not at the token limit);
        an empty reply is an empty message."""
        events = [] if self.items else self._open_text("message")
        return events + self._close("completed" if finished else "incomplete")

    @property
    def output_text(self) -> str:
        return "".join(part["text"] for item in self.items if item["type"] == "message" for part in item["content"])

    def _index(self) -> int:
        return len(self.items) - 1

    def _text(self, kind: str, text: str) -> list[dict]:
        events = []
        if self._open is None or self._open["type"] != kind:
            events = self._close("completed") + self._open_text(kind)
        part = self._open["content"][0]
        part["text"] += text
        delta = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra = {"logprobs": []} if kind == "message" else {}
        where = {"item_id": self._open["id"], "output_index": self._index(), "content_index": 0}
        return [*events, self.event(delta, **where, delta=text, **extra)]

    def _open_text(self, kind: str) -> list[dict]:
        if kind == "message":
            item = {"id": _new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant"}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"id": _new_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        item["content"] = []
        events = self._add(item)
        item["content"].append(part)
        where = {"item_id": item["id"], "output_index": self._index(), "content_index": 0}
        return [*events, self.event("response.content_part.added", **where, part=dict(part))]

    def _add(self, item: dict) -> list[dict]:
        self.items.append(item)
        self._open = item
        return [self.event("response.output_item.added", output_index=self._index(), item=_copy(item))]

    def _start_call(self, piece: CallStart) -> list[dict]:
        events = self._close("completed")
        if piece.name in self.custom:
            item = {"id": _new_id("ctc"), "type": "custom_tool_call", "status": "in_progress", "call_id": piece.id}
            item |= {"name": piece.name, "input": ""}
            self._inputs[len(self.items)] = _CustomInput()
        else:
            item = {"id": _new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": piece.id}
            item |= {"name": piece.name, "arguments": ""}
        self._calls[piece.index] = len(self.items)
        return events + self._add(item)

    def _arguments(self, piece: ArgumentsPiece) -> list[dict]:
        index = self._calls.get(piece.index)
        if index is None:
            return []
        item = self.items[index]
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            item["arguments"] += piece.text
            return [self.event("response.function_call_arguments.delta", **where, delta=piece.text)]
        text = self._inputs[index].feed(piece.text)
        item["input"] += text
        return [self.event("response.custom_tool_call_input.delta", **where, delta=text)] if text else []

    def _close(self, status: str) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = self._index()  # the open item is the last one
        item["status"] = status
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            done = {"name": item["name"], "arguments": item["arguments"]}
            events = [self.event("response.function_call_arguments.done", **where, **done)]
        elif item["type"] == "custom_tool_call":
            events = self._close_input(item, index)
        else:
            events = self._close_text(item, where)
        return [*events, self.event("response.output_item.done", output_index=index, item=_copy(item))]

    def _close_input(self, item: dict, index: int) -> list[dict]:
        where = {"item_id": item["id"], "output_index": index}
        rest = self._inputs[index].rest()
        item["input"] += rest
        events = [self.event("response.custom_tool_call_input.delta", **where, delta=rest)] if rest else []
        return [*events, self.event("response.custom_tool_call_input.done", **where, input=item["input"])]

    def _close_text(self, item: dict, where: dict) -> list[dict]:
        part = item["content"][0]
        where = {**where, "content_index": 0}
        if item["type"] == "message":
            done = self.event("response.output_text.done", **where, text=part["text"], logprobs=[])
        else:
            done = self.event("response.reasoning_text.done", **where, text=part["text"])
        return [done, self.event("response.content_part.done", **where, part=dict(part))]


def _copy(item: dict) -> dict:
    return json.loads(json.dumps(item))


def responses_usage(chat_usage: dict) -> dict:
    """Chat completions' usage in the Responses' names (the speculative statistics kept as they are)."""
    prompt, completion = chat_usage["prompt_tokens"], chat_usage["completion_tokens"]
    cached = chat_usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    reasoning = chat_usage.get("completion_tokens_details", {}).get("reasoning_tokens", 0)
    out = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }
    if "speculative" in chat_usage:
        out["speculative"] = chat_usage["speculative"]
    return out


@dataclass
class ResponseDraft:
    """One response being written: the request's settings echoed back and its output as it comes."""

    body: ResponsesRequest
    writer: OutputWriter
    id: str = field(default_factory=lambda: _new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def json(self, status: str, usage: dict | None = None, error: dict | None = None) -> dict:
        """The response object in state ``status`` (``in_progress``, ``completed``, ``incomplete``, ``failed``)."""
        body = self.body
        text = {"format": {"type": "text"}} | (body.text or {})
        parallel = True if body.parallel_tool_calls is None else body.parallel_tool_calls
        done = status in ("completed", "incomplete")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": body.max_tool_calls,
            "model": body.model,
            "output": _copy(self.writer.items) if done or status == "failed" else [],
            "output_text": self.writer.output_text if done else "",
            "parallel_tool_calls": parallel,
            "previous_response_id": body.previous_response_id,
            "prompt_cache_key": body.prompt_cache_key,
            "reasoning": {"effort": None, "summary": None} | (body.reasoning or {}),
            "safety_identifier": body.safety_identifier,
            "service_tier": body.service_tier or "default",
            "store": True if body.store is None else body.store,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": text,
            "tool_choice": "auto" if body.tool_choice is None else body.tool_choice,
            "tools": body.tools or [],
            "top_logprobs": body.top_logprobs or 0,
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": body.truncation or "disabled",
            "usage": usage,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    def finished(self, end: ReplyEnd) -> tuple[list[dict], dict]:
        """The closing events of the output and the whole response, ``completed`` or (at the token limit)
        ``incomplete``."""
        done = end.engine_reason != "length"
        events = self.writer.end(done)
        return events, self.json("completed" if done else "incomplete", responses_usage(end.usage))


# ------------------------------------------------------------------------------------------------- the store


class ResponseStore:
    """The last ``size`` stored responses and their conversations (input items then output items), least recently
    used first out."""

    def __init__(self, size: int = STORED_RESPONSES) -> None:
        self.size = size
        self._entries: OrderedDict[str, tuple[dict, list]] = OrderedDict()

    def put(self, response: dict, conversation: list) -> None:
        self._entries[response["id"]] = (response, conversation)
        self._entries.move_to_end(response["id"])
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> tuple[dict, list]:
        """The response ``response_id`` and its conversation; a 404 (400 naming ``param`` when given) if unknown."""
        found = self._entries.get(response_id)
        if found is None:
            message = f"Response with id '{response_id}' not found (this server keeps the last {self.size} stored)"
            status = 404 if param is None else 400
            raise APIError(status, message, param=param, code="previous_response_not_found" if param else None)
        self._entries.move_to_end(response_id)
        return found

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._entries[response_id]


# ------------------------------------------------------------------------------------------------- the routes


def add_routes(app: FastAPI) -> None:
    """Add the Responses routes to ``app`` (and its store of responses)."""
    app.state.openai_responses = ResponseStore()
    app.post("/v1/responses", responses=_ERRORS, summary="Create a response (OpenAI's Responses API)")(create_response)
    found = {404: {"model": ErrorResponse}}
    app.get("/v1/responses/{response_id}", responses=found, summary="A stored response")(get_response)
    app.delete("/v1/responses/{response_id}", responses=found, summary="Delete a stored response")(delete_response)


def _store(request: Request) -> ResponseStore:
    return request.app.state.openai_responses


async def get_response(response_id: str, request: Request) -> dict:
    """OpenAI ``GET /v1/responses/{id}``: a stored response."""
    return _store(request).get(response_id)[0]


async def delete_response(response_id: str, request: Request) -> dict:
    """OpenAI ``DELETE /v1/responses/{id}``."""
    _store(request).delete(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


async def create_response(body: ResponsesRequest, request: Request) -> Response:
    """OpenAI ``POST /v1/responses``: the input items through the chat path, answered as output items, whole or
    as server-sent events."""
    state = server_state(request)
    store = _store(request)
    history = []
    if body.previous_response_id is not None:
        history = store.get(body.previous_response_id, "previous_response_id")[1]
    plan = chat_request(body, history)
    try:
        job = await prepare_chat(state, plan.chat)
    except APIError as err:
        raise plan.renamed(err) from None
    pieces = reply_pieces(state, request, job)
    draft = ResponseDraft(body, OutputWriter(plan.custom))
    conversation = [*history, *_input_items(body)]
    if body.stream:  # a long prompt: the stream starts after keepalive.FIRST_WAIT, beating until the first pieces
        task = await keepalive.first_piece(pieces)
        if not task.done():
            events = _events(draft, task, pieces, store, conversation)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        first_pieces = task.result
    else:
        first_pieces = None
    try:
        first = first_pieces() if first_pieces else await anext(pieces)
    except StopAsyncIteration:  # the client went away
        return Response(status_code=CLIENT_CLOSED)
    except APIError as err:
        await pieces.aclose()
        raise plan.renamed(err) from None
    if body.stream:
        events = _events(draft, first, pieces, store, conversation)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _whole(draft, first, pieces, store, conversation)


def _keep(store: ResponseStore, draft: ResponseDraft, response: dict, conversation: list) -> None:
    if draft.body.store is not False:
        store.put(response, [*conversation, *_copy(draft.writer.items)])


async def _whole(draft: ResponseDraft, first, pieces: AsyncIterator, store: ResponseStore, conversation) -> Response:
    try:
        piece = first
        while not isinstance(piece, ReplyEnd):
            draft.writer.feed(piece)
            piece = await anext(pieces)
    except StopAsyncIteration:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        await pieces.aclose()
    _, response = draft.finished(piece)
    _keep(store, draft, response, conversation)
    return JSONResponse(response)


def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def _events(draft: ResponseDraft, first, pieces: AsyncIterator, store: ResponseStore, conversation):
    """The response as server-sent events: created, in progress, each item's events, then completed (or
    incomplete); an error after the headers ends the stream with an ``error`` event and ``response.failed``."""
    writer = draft.writer
    yield _sse(writer.event("response.created", response=draft.json("in_progress")))
    yield _sse(writer.event("response.in_progress", response=draft.json("in_progress")))
    task = first if isinstance(first, asyncio.Task) else None
    try:
        if task is not None:  # still reading the prompt: comment lines until the first pieces
            async for beat in keepalive.beats(task, keepalive.COMMENT):
                yield beat
            first = task.result()
        piece = first
        while not isinstance(piece, ReplyEnd):
            for event in writer.feed(piece):
                yield _sse(event)
            piece = await anext(pieces)
        events, response = draft.finished(piece)
        for event in events:
            yield _sse(event)
        _keep(store, draft, response, conversation)
        yield _sse(writer.event(f"response.{response['status']}", response=response))
    except StopAsyncIteration:  # the client went away
        return
    except Exception as err:  # after the headers: the error goes in the stream
        error = as_api_error(err)
        yield _sse(writer.event("error", code=error.code or error.type, message=error.message, param=error.param))
        failed = draft.json("failed", error={"code": error.code or "server_error", "message": error.message})
        yield _sse(writer.event("response.failed", response=failed))
    finally:
        await keepalive.close(pieces, task)
