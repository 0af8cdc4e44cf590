"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) over the one chat path
(:mod:`specwise.server.chat`), for Claude Code (``ANTHROPIC_BASE_URL``) and Anthropic's clients.

A Messages body is validated (a 400 naming the field as Anthropic does: ``messages.0.content.1.type``), translated
into a chat-completions request (system prompt, text, tool uses and tool results, tools and tool choice), run through
:func:`~specwise.server.chat.prepare_chat` and :func:`~specwise.server.chat.reply_pieces`, and the reply's pieces
written as Anthropic's content blocks (``thinking``, ``text``, ``tool_use``), whole or as Anthropic's server-sent
events. Any model name is accepted (clients send their own ids) and the one loaded model answers. ``thinking``
switches the template's ``enable_thinking``; ``output_config.format`` constrains the reply to a JSON schema. Fields
that change nothing in the answer (``metadata``, ``cache_control``, ``context_management``, ...) are ignored; images
and documents are refused. Errors have Anthropic's shape ``{"type": "error", "error": {"type",
"message"}}``.

One file because it is one API's adapter, read against Anthropic's documentation: the body's models, their
translation, the reply's blocks and events and the errors all speak its field names.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Literal

from specwise.extras import missing_extra

try:
    from fastapi import Body, FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field, ValidationError
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

from specwise.server import keepalive
from specwise.server.chat import ChatJob, ReplyEnd, prepare_chat, reply_pieces
from specwise.server.errors import APIError, as_api_error, error_shape
from specwise.server.protocol import ChatCompletionRequest
from specwise.server.responses import CLIENT_CLOSED
from specwise.server.state import server_state
from specwise.tools import ArgumentsPiece, CallStart, ContentPiece, ReasoningPiece

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from specwise.server.state import ServerState

__all__ = [
    "ContentBlocks",
    "CountTokensRequest",
    "MessagesRequest",
    "Reply",
    "add_routes",
    "anthropic_error",
    "chat_request",
    "field_path",
    "stream_events",
    "tool_use_id",
    "without_vacuous_keywords",
]

log = logging.getLogger(__name__)

MAX_ERRORS_READ = 32  # of a validation error's list, for the message (the deepest names the field)
BLOCK_JOIN = "\n"  # between the text blocks of one message (and of the system prompt)
ERROR_PREFIX = "Error: "  # before the content of a tool result with is_error
CUSTOM_TOOL_TYPES = (None, "custom")  # tools with another type are Anthropic's server tools: dropped

# ------------------------------------------------------------------------------------------------ the request

_LIST = Field(fail_fast=True)  # a list's validation stops at its first bad item


class _Part(BaseModel):
    """A part of a Messages body. Fields it does not know are ignored: Anthropic adds them often (``cache_control``,
    ``citations``, ...) and none of them changes what the model is asked."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class TextBlock(_Part):
    type: Literal["text"]
    text: str


class MediaBlock(_Part):
    """An image or a document: accepted by the validation, refused with a clear message (the models read text)."""

    type: Literal["image", "document"]


class ToolUseBlock(_Part):
    """A call of the assistant's in the history; ``input`` is the call's arguments."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


class ToolResultBlock(_Part):
    """The result of the call ``tool_use_id``; ``is_error``: the call failed (its content says why)."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | Annotated[list[Annotated[TextBlock | MediaBlock, Field(discriminator="type")]], _LIST] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Part):
    """The assistant's thinking in the history: dropped (chat templates leave out earlier turns' thinking)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Part):
    type: Literal["redacted_thinking"]
    data: str | None = None


Block = Annotated[
    TextBlock | MediaBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class MessageParam(_Part):
    """A message of the conversation; a ``system`` one (Claude Code sends them) holds text only."""

    role: Literal["user", "assistant", "system"]
    content: str | Annotated[list[Block], _LIST]


class ToolParam(_Part):
    """A tool: a custom one (no type, or ``custom``) with its ``input_schema``, or one of Anthropic's server tools
    (``web_search_20250305``, ``bash_20250124``, ...), which this server drops."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict | None = None


class ToolChoiceParam(_Part):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingParam(_Part):
    """``enabled`` or ``disabled`` sets the chat template's ``enable_thinking`` (Qwen3's switch; templates without
    one ignore it); ``adaptive`` leaves the template's default. A model that thinks writes thinking blocks."""

    type: str
    budget_tokens: int | None = None  # not enforced: the thinking counts toward max_tokens


class JsonOutputFormat(_Part):
    type: Literal["json_schema"]
    schema_: dict = Field(alias="schema")


class OutputConfig(_Part):
    """``format``: the reply is JSON matching the schema (structured outputs); ``effort`` is ignored."""

    format: JsonOutputFormat | None = None
    effort: str | None = None


class CountTokensRequest(_Part):
    """``POST /v1/messages/count_tokens``: the conversation and its tools."""

    model: str
    messages: Annotated[list[MessageParam], Field(fail_fast=True, min_length=1)]
    system: str | Annotated[list[TextBlock], _LIST] | None = None
    tools: Annotated[list[ToolParam], _LIST] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stop_sequences: Annotated[list[str], _LIST] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict | None = None


_ignored_seen: set[str] = set()  # top-level fields already logged as ignored


def parse(model: type[CountTokensRequest], body: dict) -> CountTokensRequest:
    """``body`` validated as ``model``; unknown top-level fields are ignored (logged once each). Raises APIError
    naming the field at fault as Anthropic does (``messages.0.content.1.type: ...``)."""
    for name in sorted(body.keys() - model.model_fields.keys() - _ignored_seen):
        _ignored_seen.add(name)
        log.info("Anthropic Messages: ignoring the field %r (not used by this server)", name)
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise _validation_error(err.errors(include_url=False)[:MAX_ERRORS_READ], body) from err


_UNION_STEP = re.compile(r"^(str|int|float|bool|none|[\w-]+\[.*\])$")  # pydantic's union members in a location


def field_path(loc: tuple, data: object) -> str:
    """A validation error's location as Anthropic names fields (``messages.0.content.1.text``), read against the
    body ``data``: the steps pydantic adds for union members and for a block's type tag are left out."""
    parts: list[str] = []
    tag_read = False  # the current object's type tag was passed over
    for i, step in enumerate(loc):
        if isinstance(step, int):
            parts.append(str(step))
            data = data[step] if isinstance(data, list) and -len(data) <= step < len(data) else None
            tag_read = False
        elif isinstance(data, dict) and step == data.get("type") and not tag_read and i < len(loc) - 1:
            tag_read = True
        elif isinstance(data, dict) and step in data:
            parts.append(step)
            data, tag_read = data[step], False
        elif not _UNION_STEP.match(step):
            parts.append(step)
            data = None
    return ".".join(parts)


def _validation_error(errors: list[dict], body: dict) -> APIError:
    """The 400 of a body's validation errors: the deepest field named (the union member that got furthest), with
    every message about it."""
    found = []
    for error in errors:
        path = field_path(tuple(error.get("loc", ())), body)
        if error.get("type") in ("union_tag_invalid", "union_tag_not_found"):
            path = f"{path}.type" if path else "type"
        found.append((path, _message(error)))
    path = max((path for path, _ in found), key=_depth)  # the first of the deepest
    message = " or ".join(dict.fromkeys(msg for p, msg in found if p == path))
    return APIError(400, f"{path}: {message}" if path else message, param=path or None)


def _message(error: dict) -> str:
    """A pydantic error's message without pydantic's ``Value error, `` before a validator's own words."""
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")


def _depth(path: str) -> int:
    return path.count(".") + 1 if path else 0


# ------------------------------------------------------------------------------------ to a chat-completions request


@dataclass
class Origins:
    """Where the parts of a translated chat-completions request came from in the Messages body, to name the
    Messages field of an error about them: each chat message's field and each tool's index."""

    messages: list[str] = field(default_factory=list)
    tools: list[int] = field(default_factory=list)

    def field(self, loc: tuple) -> str:
        """The Messages field of a chat-completions location (``("tools", 0, "function", "parameters")`` ->
        ``tools.2.input_schema``)."""
        head, rest = loc[0], loc[1:]
        if head == "messages" and rest and isinstance(rest[0], int) and rest[0] < len(self.messages):
            where = self.messages[rest[0]]
            return f"{where}.tool_use_id" if rest[1:2] == ("tool_call_id",) else where
        if head == "tools" and rest and isinstance(rest[0], int) and rest[0] < len(self.tools):
            name = {"parameters": "input_schema"}.get(str(rest[2]), str(rest[2])) if len(rest) > 2 else None
            return ".".join(["tools", str(self.tools[rest[0]])] + ([name] if name else []))
        renamed = {
            "stop": "stop_sequences",
            "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
            "response_format": "output_config.format",
            "chat_template_kwargs": "thinking",
        }
        return renamed.get(str(head), str(head))

    def translate(self, err: APIError) -> APIError:
        """A chat-path error with its field named as the Messages body has it (Claude Code reads ``prompt is too
        long`` as the sign to compact the conversation)."""
        if err.param is None:
            return err
        too_long = re.match(r"the prompt has (\d+) tokens but the model's context is (\d+)", err.message)
        if too_long and err.code == "context_length_exceeded":  # Anthropic's words
            message = f"prompt is too long: {too_long[1]} tokens > {too_long[2]} maximum"
            return APIError(err.status, message, None, err.code, err.type)
        where = self.field(openai_loc(err.param))
        message = err.message.replace(err.param, where)
        message = message if message.startswith(where) else f"{where}: {message}"
        return APIError(err.status, message, where, err.code, err.type)


def openai_loc(param: str) -> tuple:
    """``"tools[0].function.parameters"`` -> ``("tools", 0, "function", "parameters")``."""
    return tuple(int(step) if step.isdigit() else step for step in re.findall(r"[^.\[\]]+", param))


def chat_request(body: CountTokensRequest, model: str) -> tuple[ChatCompletionRequest, Origins]:
    """The chat-completions request of a Messages body (served as ``model``) and where its parts came from. Raises
    APIError naming the Messages field at fault."""
    origins = Origins()
    openai: dict = {"model": model, "messages": _messages(body, origins)}
    tools = _tools(body.tools or [], origins)
    choice = body.tool_choice
    if tools:
        openai["tools"] = tools
    if choice is not None and (tools or choice.type in ("any", "tool")):
        openai["tool_choice"] = _tool_choice(choice)
        if choice.disable_parallel_tool_use is not None:
            openai["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    if body.thinking is not None and body.thinking.type in ("enabled", "disabled"):
        openai["chat_template_kwargs"] = {"enable_thinking": body.thinking.type == "enabled"}
    output = body.output_config.format if body.output_config is not None else None
    if output is not None:
        openai["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": output.schema_}}
    if isinstance(body, MessagesRequest):
        sampling = {"stop": body.stop_sequences or None, "temperature": body.temperature, "top_p": body.top_p}
        openai |= {name: value for name, value in sampling.items() if value is not None}
        if body.top_k is not None:
            openai["top_k"] = body.top_k
    try:
        return ChatCompletionRequest.model_validate(openai), origins
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = origins.field(tuple(first.get("loc", ())) or ("messages",))
        raise APIError(400, f"{where}: {_message(first)}", param=where) from err


def _text(blocks: list[TextBlock]) -> str:
    return BLOCK_JOIN.join(block.text for block in blocks)


def _messages(body: CountTokensRequest, origins: Origins) -> list[dict]:
    """The conversation as chat messages: the system prompt, then each message's (a user message of tool results
    becomes tool messages, then a user message of its text); consecutive messages of one role are joined, as
    Anthropic joins them."""
    out: list[dict] = []
    system = body.system if isinstance(body.system, str) else _text(body.system or [])
    if system:
        out.append({"role": "system", "content": system})
        origins.messages.append("system")
    called: set[str] = set()  # the ids of the tool_use blocks so far
    for i, message in enumerate(body.messages):
        where = f"messages.{i}"
        if message.role == "assistant" and all(m.role == "system" for m in body.messages[i + 1 :]):
            raise APIError(
                400,
                f"{where}: the conversation must end with a user message: continuing an assistant message (prefill) "
                "is not supported",
                param=where,
            )
        blocks = [TextBlock(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        for chat, origin in _chat_messages(message.role, blocks, where, called):
            _append(out, origins, chat, origin)
    return out


def _append(out: list[dict], origins: Origins, message: dict, origin: str) -> None:
    """Add ``message`` to ``out``, joined to the last message when both have the same role (system messages
    before the first turn join the system prompt; later ones stay where they are)."""
    last = out[-1] if out else None
    if last is not None and last["role"] == message["role"] == "system":
        last["content"] = BLOCK_JOIN.join(text for text in (last["content"], message["content"]) if text)
        return
    if last is None or last["role"] != message["role"] or message["role"] not in ("user", "assistant"):
        out.append(message)
        origins.messages.append(origin)
        return
    texts = [text for text in (last.get("content"), message.get("content")) if text]
    calls = last.get("tool_calls", []) + message.get("tool_calls", [])
    last["content"] = BLOCK_JOIN.join(texts) if texts else (None if calls else "")
    if calls:
        last["tool_calls"] = calls


def _chat_messages(role: str, blocks: list, where: str, called: set[str]) -> list[tuple[dict, str]]:
    """One Messages message's chat messages and the field each came from (``called``: the ids of the earlier
    tool_use blocks, which a tool_result must name; this message's are added)."""
    texts: list[str] = []
    calls: list[dict] = []
    results: list[tuple[dict, str]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content.{j}"
        if isinstance(block, MediaBlock):
            _refuse_media(block, at)
        elif isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            if role != "assistant":
                raise APIError(400, f"{at}: tool_use blocks belong in assistant messages", param=at)
            called.add(block.id)
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
        elif isinstance(block, ToolResultBlock):
            if role != "user":
                raise APIError(400, f"{at}: tool_result blocks belong in user messages", param=at)
            results.append((_tool_message(block, at, called), at))
    if role == "system":  # its tool_use and tool_result blocks were refused above
        return [({"role": "system", "content": BLOCK_JOIN.join(texts)}, where)]
    if role == "assistant":
        message: dict = {"role": "assistant", "content": BLOCK_JOIN.join(texts) if texts else (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        return [(message, where)]
    if texts or not results:
        results.append(({"role": "user", "content": BLOCK_JOIN.join(texts)}, where))
    return results


def _refuse_media(block: MediaBlock, at: str) -> None:
    what = "images" if block.type == "image" else "documents"
    raise APIError(400, f"{at}: {what} are not supported by this model (it reads text only)", param=at)


def _tool_message(block: ToolResultBlock, at: str, called: set[str]) -> dict:
    """The tool message of a tool_result block, which must answer an earlier tool_use block."""
    if block.tool_use_id not in called:
        where = f"{at}.tool_use_id"
        message = f"{where}: no earlier assistant message has a tool_use block of id {block.tool_use_id!r}"
        raise APIError(400, message, param=where)
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": _result(block, at)}


def _result(block: ToolResultBlock, at: str) -> str:
    """A tool result's content as text (``Error: `` before a failed call's)."""
    content = block.content
    if isinstance(content, list):
        for k, part in enumerate(content):
            if isinstance(part, MediaBlock):
                _refuse_media(part, f"{at}.content.{k}")
        content = _text(content)
    content = content or ""
    return ERROR_PREFIX + content if block.is_error else content


def _tools(tools: list[ToolParam], origins: Origins) -> list[dict]:
    """The custom tools as chat tools (Anthropic's server tools left out, as other servers do)."""
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in CUSTOM_TOOL_TYPES:
            if f"tool:{tool.type}" not in _ignored_seen:
                _ignored_seen.add(f"tool:{tool.type}")
                log.info("Anthropic Messages: dropping the server tool %r (type %r)", tool.name, tool.type)
            continue
        if tool.input_schema is None:
            raise APIError(400, f"tools.{i}.input_schema: Field required", param=f"tools.{i}.input_schema")
        function = {"name": tool.name, "parameters": without_vacuous_keywords(tool.input_schema)}
        if tool.description is not None:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
        origins.tools.append(i)
    return out


_VACUOUS = ({}, {"type": "string"}, True)  # a propertyNames that every object's keys (strings) match
_NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems", "items")
MAX_SCHEMA_WALK = 100  # levels: deeper schemas are refused by the tools' own check (64)


def without_vacuous_keywords(schema: object, depth: int = 0) -> object:
    """``schema`` without the ``propertyNames`` that allow every name (``{"type": "string"}``, as Claude Code's
    record-typed arguments have it): the same arguments are valid, and the grammar engine has no such keyword."""
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_WALK:
        return schema
    out = {}
    for key, value in schema.items():
        if key == "propertyNames" and value in _VACUOUS:
            continue
        if key in _NAMED_SCHEMAS and isinstance(value, dict):
            value = {name: without_vacuous_keywords(sub, depth + 1) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            value = [without_vacuous_keywords(sub, depth + 1) for sub in value]
        elif isinstance(value, dict) and key not in ("enum", "const", "default", "examples"):
            value = without_vacuous_keywords(value, depth + 1)
        out[key] = value
    return out


def _tool_choice(choice: ToolChoiceParam) -> str | dict:
    if choice.type == "tool":
        if choice.name is None:
            raise APIError(400, "tool_choice.name: Field required", param="tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


# ---------------------------------------------------------------------------------------------------- the reply


def tool_use_id(call_id: str) -> str:
    """Anthropic's id of a call (``toolu_`` and the call's hex digits)."""
    return "toolu_" + call_id.removeprefix("call_")


class ContentBlocks:
    """A reply's content blocks as Anthropic writes them, built from the chat path's pieces: ``add`` returns the
    stream events of the new pieces (a block's start, its deltas, the previous block's stop), and ``content()`` the
    whole blocks: the stream and the whole answer are the same pieces put together."""

    def __init__(self) -> None:
        self.blocks: list[dict] = []
        self._open = False
        self._calls: dict[int, int] = {}  # a call's index -> its block's index
        self._arguments: dict[int, list[str]] = {}  # a tool_use block's index -> its arguments' pieces

    def add(self, pieces: list) -> list[dict]:
        events: list[dict] = []
        for piece in pieces:
            if isinstance(piece, ContentPiece) and piece.text:
                self._extend(events, "text", "text_delta", piece.text)
            elif isinstance(piece, ReasoningPiece) and piece.text:
                self._extend(events, "thinking", "thinking_delta", piece.text)
            elif isinstance(piece, CallStart):
                self._start(events, {"type": "tool_use", "id": tool_use_id(piece.id), "name": piece.name, "input": {}})
                self._calls[piece.index] = len(self.blocks) - 1
                self._arguments[len(self.blocks) - 1] = []
            elif isinstance(piece, ArgumentsPiece) and piece.text and piece.index in self._calls:
                index = self._calls[piece.index]
                self._arguments[index].append(piece.text)
                _delta(events, index, "input_json_delta", "partial_json", piece.text)
        return events

    def close(self) -> list[dict]:
        """The stop of the open block (none when none is open)."""
        if not self._open:
            return []
        self._open = False
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def content(self) -> list[dict]:
        """The whole blocks (a call's input is its arguments read as JSON; ``{}`` for a call cut short)."""
        for index, parts in self._arguments.items():
            self.blocks[index]["input"] = _input("".join(parts))
        return self.blocks

    def _extend(self, events: list[dict], kind: str, delta: str, text: str) -> None:
        """Add ``text`` to the open block of ``kind`` (``text`` or ``thinking``), opening one if needed."""
        if not (self._open and self.blocks[-1]["type"] == kind):
            self._start(events, {"type": "text", "text": ""} if kind == "text" else _thinking(""))
        self.blocks[-1][kind] += text
        _delta(events, len(self.blocks) - 1, delta, kind, text)

    def _start(self, events: list[dict], block: dict) -> None:
        events.extend(self.close())
        self.blocks.append(block)
        self._open = True
        events.append({"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)})


def _thinking(text: str) -> dict:
    return {"type": "thinking", "thinking": text, "signature": ""}  # no signature: nothing to verify it with


def _delta(events: list[dict], index: int, kind: str, key: str, text: str) -> None:
    """A block's delta, joined to the last event when that is the same block's delta (one event per pass)."""
    last = events[-1] if events else None
    if last is not None and last["type"] == "content_block_delta" and last["index"] == index:
        last["delta"][key] += text
        return
    events.append({"type": "content_block_delta", "index": index, "delta": {"type": kind, key: text}})


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class Reply:
    """What a message's envelope needs: its id, the model name to answer with, the stop sequences, the prompt's
    length, and whether the budget was cut to the context (a reply that used it all hit the context window)."""

    model: str
    stops: list[str]
    prompt_tokens: int
    clamped: bool
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex[:24]}")

    def message(self, content: list[dict], stop_reason: str | None, stop_sequence: str | None, usage: dict) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }

    def start_usage(self) -> dict:
        """The usage of ``message_start``: the prompt (the cached part is known at the end)."""
        return {
            "input_tokens": self.prompt_tokens,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }

    async def stop(self, state: ServerState, end: ReplyEnd) -> tuple[str, str | None]:
        """The stop reason and the stop sequence that ended the reply (None: none did)."""
        if end.finish_reason == "tool_calls":
            return "tool_use", None
        if end.finish_reason == "length":
            return ("model_context_window_exceeded" if self.clamped else "max_tokens"), None
        matched = None
        if end.engine_reason == "stop" and self.stops:
            matched = await state.encoder.run(_matched_stop, state.encoder.tokenizer, end.token_ids, self.stops)
        return ("end_turn" if matched is None else "stop_sequence"), matched


def _matched_stop(tokenizer, token_ids: list[int], stops: list[str]) -> str | None:
    """The stop sequence that ended a reply: the first in its text (None: it ended otherwise)."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    found = [(text.find(stop), i) for i, stop in enumerate(stops) if stop and stop in text]
    return stops[min(found)[1]] if found else None


def usage(openai: dict) -> dict:
    """Anthropic's usage of the chat path's (input tokens apart from those read from the prompt cache), with the
    speculative statistics."""
    prompt = openai["prompt_tokens"]
    cached = openai.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": openai["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "speculative": openai.get("speculative"),
    }


# ------------------------------------------------------------------------------------------------------- routes


_BODY_SCHEMA = {
    "type": "object",
    "required": ["model", "messages", "max_tokens"],
    "properties": {
        "model": {"type": "string", "description": "any name: the server's one model answers"},
        "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}},
        "max_tokens": {"type": "integer", "minimum": 1},
        "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"type": "object"},
        "stop_sequences": {"type": "array", "items": {"type": "string"}},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0},
        "stream": {"type": "boolean"},
    },
}
_COUNT_SCHEMA = _BODY_SCHEMA | {"required": ["model", "messages"]}


def _documented(schema: dict) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def add_routes(app: FastAPI) -> None:
    """Add the Messages routes to ``app``."""
    app.post("/v1/messages", summary="Anthropic Messages (Claude Code)", openapi_extra=_documented(_BODY_SCHEMA))(
        create_message
    )
    app.post("/v1/messages/count_tokens", summary="Anthropic token counting", openapi_extra=_documented(_COUNT_SCHEMA))(
        count_tokens
    )


Json = Annotated[dict, Body(description="Anthropic's Messages body")]


async def create_message(body: Json, request: Request) -> Response:
    """Anthropic ``POST /v1/messages``: the conversation through the chat path, answered whole or streamed."""
    state = server_state(request)
    message = parse(MessagesRequest, body)
    chat, origins = chat_request(message, state.model_name)
    try:
        job = await prepare_chat(state, chat)
    except APIError as err:
        raise origins.translate(err) from err
    job, clamped = _budget(state, job, message.max_tokens)
    reply = Reply(message.model, message.stop_sequences or [], job.prompt_tokens, clamped)
    pieces = reply_pieces(state, request, job)
    if message.stream:
        return await _streamed(state, pieces, reply)
    return await _whole(state, pieces, reply)


async def count_tokens(body: Json, request: Request) -> dict:
    """Anthropic ``POST /v1/messages/count_tokens``: the rendered prompt's length in tokens."""
    state = server_state(request)
    chat, origins = chat_request(parse(CountTokensRequest, body), state.model_name)
    try:
        job = await prepare_chat(state, chat)  # encoded as a message's prompt is: nothing is generated
    except APIError as err:
        raise origins.translate(err) from err
    return {"input_tokens": job.prompt_tokens}


def _budget(state: ServerState, job: ChatJob, max_tokens: int) -> tuple[ChatJob, bool]:
    """The job with ``max_tokens`` as its budget, cut to the room the context leaves (as Anthropic's newer models
    do: the reply then stops with ``model_context_window_exceeded``); whether it was cut."""
    room = None if state.context is None else state.context - job.prompt_tokens
    budget = max_tokens if room is None else min(max_tokens, room)
    request = replace(job.request, max_new_tokens=budget)
    return replace(job, request=request, endpoint="messages"), budget < max_tokens


async def _whole(state: ServerState, pieces: AsyncIterator, reply: Reply) -> Response:
    blocks, end = ContentBlocks(), None
    try:
        async for item in pieces:
            if isinstance(item, ReplyEnd):
                end = item
            else:
                blocks.add(item)
    finally:
        await pieces.aclose()
    if end is None:  # the client went away
        return Response(status_code=CLIENT_CLOSED)
    stop_reason, stop_sequence = await reply.stop(state, end)
    return JSONResponse(reply.message(blocks.content(), stop_reason, stop_sequence, usage(end.usage)))


async def _streamed(state: ServerState, pieces: AsyncIterator, reply: Reply) -> Response:
    """The event stream, once the reply's first pieces are out (an error before them is an HTTP error), or after
    ``keepalive.FIRST_WAIT`` seconds without them (a long prompt): then ``ping`` events until they come."""
    task = await keepalive.first_piece(pieces)
    if not task.done():
        return ClosingStreamingResponse(stream_events(state, pieces, task, reply))
    try:
        first = task.result()
    except StopAsyncIteration:
        return Response(status_code=CLIENT_CLOSED)
    except BaseException:
        await pieces.aclose()
        raise
    return ClosingStreamingResponse(stream_events(state, pieces, first, reply))


async def stream_events(state: ServerState, pieces: AsyncIterator, item, reply: Reply):
    """Anthropic's server-sent events: message_start, ping, each block's start, deltas and stop, message_delta
    (stop reason and usage), message_stop; an error after the headers is an ``error`` event. ``item``: the first
    pieces, or a task still taking them (a ``ping`` every ``keepalive.BEAT_SECONDS`` until they come)."""
    blocks = ContentBlocks()
    task = item if isinstance(item, asyncio.Task) else None
    yield _event({"type": "message_start", "message": reply.message([], None, None, reply.start_usage())})
    yield _event({"type": "ping"})
    try:
        if task is not None:
            async for beat in keepalive.beats(task, _event({"type": "ping"})):
                yield beat
            item = task.result()
        while not isinstance(item, ReplyEnd):
            for event in blocks.add(item):
                yield _event(event)
            item = await anext(pieces)
        for event in blocks.close():
            yield _event(event)
        stop_reason, stop_sequence = await reply.stop(state, item)
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        yield _event({"type": "message_delta", "delta": delta, "usage": usage(item.usage)})
        yield _event({"type": "message_stop"})
    except StopAsyncIteration:  # the client went away
        return
    except Exception as err:  # after the headers: the error goes in the stream, as Anthropic does
        yield _event(anthropic_error(as_api_error(err)))
    finally:
        await keepalive.close(pieces, task)


def _event(data: dict) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n"


class ClosingStreamingResponse(StreamingResponse):
    """An event stream that closes its events' generator however it ends (the reply's job is then cancelled)."""

    def __init__(self, content) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


# ------------------------------------------------------------------------------------------------------- errors

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


@error_shape("/v1/messages")
def anthropic_error(err: APIError) -> dict:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}`` (the field at fault leads the
    message, as Anthropic writes it)."""
    if err.code == "queue_full":
        kind = "overloaded_error"
    else:
        kind = _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    message = err.message
    if err.param and err.param not in message:
        message = f"{err.param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}
