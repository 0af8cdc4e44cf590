"""The OpenAI wire format: request bodies (validated by pydantic) and the JSON of responses and stream chunks.

Requests are strict about names (an unknown field is an error, as at OpenAI) and lenient about what common
clients send by default (zero penalties, ``user``, ``response_format`` of type ``text``, an empty ``logit_bias``,
``store``, ``metadata``, ``reasoning_effort``, ``service_tier``, ``prompt_cache_key``, ``safety_identifier``,
``modalities: ["text"]``, ``cache_control`` on text parts: accepted and ignored, with no effect on the output). What
cannot be honoured is refused with a 400 naming the field and the fix (a bias on tokens, audio, images, the legacy
``functions``). The sampling extensions ``top_k``, ``min_p`` and ``ignore_eos`` follow vLLM, ``logprobs_mode`` is
specwise's (with the openai client, pass them in ``extra_body``).

Validation stops at the first error of a list and at the first unknown field: the work of refusing a body never
grows with the number of things wrong in it (a megabyte of bad list items would otherwise cost a second of the
event loop, each error written out in turn).
"""

from __future__ import annotations

from typing import Annotated, Literal

from specwise.constraints import Constraint, Grammar, JsonObject, JsonSchema, Regex
from specwise.engine import LogprobOptions
from specwise.extras import missing_extra
from specwise.server.shapes import (  # noqa: F401 (the answers' shapes, named here as before)
    ChatFormat,
    Choice,
    CompletionFormat,
    ErrorDetail,
    ErrorResponse,
    ResponseFormat,
    error_body,
    usage,
)
from specwise.tools.spec import schema_depth_error

try:
    from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
    from pydantic_core import PydanticCustomError
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

__all__ = [
    "ChatCompletionRequest",
    "ChatFormat",
    "ChatMessage",
    "Choice",
    "CompletionFormat",
    "CompletionRequest",
    "ErrorResponse",
    "ResponseFormat",
    "SamplingRequest",
    "error_body",
    "usage",
]

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # each stop string's length: the generation thread looks for every one after each pass
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # any 64-bit seed, signed or not (make_generator takes it modulo 2**64)
MAX_N = 16  # choices per request
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as at OpenAI
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' logprobs, as at OpenAI
LOGPROBS_MODES = {"raw": False, "sampled": True}  # logprobs_mode -> LogprobOptions.sampled


_FAIL_FAST = Field(fail_fast=True)  # a list's validation stops at its first bad item


def _first_unknown(data: object, names: frozenset[str] | dict, where: str = "") -> str | None:
    """The path (``where`` + ``.key``) of the first key of ``data``, a dict, not in ``names`` (None: none)."""
    if isinstance(data, dict):
        for key in data:
            if key not in names:
                return f"{where}.{key}" if where else str(key)
    return None


def _unknown_field(path: str) -> PydanticCustomError:
    """The error of an unknown field; ``ctx["field"]`` is its path from the error's location."""
    return PydanticCustomError("extra_forbidden", "Extra inputs are not permitted", {"field": path})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Checked(_Strict):
    """A model that refuses its first unknown field before validating any (``extra="forbid"`` reports every
    one). Not used for messages, which are many: ChatCompletionRequest checks them in one pass."""

    @model_validator(mode="before")
    @classmethod
    def _first_unknown_field(cls, data: object) -> object:
        path = _first_unknown(data, cls.model_fields)
        if path is not None:
            raise _unknown_field(path)
        return data


class StreamOptions(_Checked):
    """``include_usage``: also send a last chunk with empty ``choices`` and the usage (as OpenAI does)."""

    include_usage: bool = False
    include_obfuscation: bool | None = Field(None, description="ignored: the chunks carry no padding")


def _only_null(value: object, message: str) -> None:
    """Refuse a field that only null may fill here (``message``: why, and what to send instead)."""
    if value is not None:
        raise PydanticCustomError("unsupported", message)


class SamplingRequest(_Checked):
    """Fields common to chat and text completions."""

    model: str = Field(description="the served model's id, as listed by GET /v1/models")
    max_tokens: int | None = Field(None, ge=1, description="new tokens at most (default: see the server docs)")
    temperature: float | None = Field(None, ge=0, description="0 is greedy (default: 1)")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling mass (default: 1, disabled)")
    top_k: int | None = Field(None, ge=-1, description="keep the k most likely tokens (0 or -1: disabled)")
    min_p: float | None = Field(None, ge=0, lt=1, description="drop tokens below min_p x the top probability")
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, description="seed for sampling (default: random)")
    stop: str | Annotated[list[str], _FAIL_FAST] | None = Field(
        None, description=f"up to {MAX_STOP_STRINGS} stop strings of up to {MAX_STOP_CHARS} characters each"
    )
    ignore_eos: bool = Field(False, description="keep generating past the end-of-sequence token")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_N, description=f"choices to generate (1..{MAX_N}); choice i is seeded seed + i")
    logprobs_mode: Literal["raw", "sampled"] = Field(
        "raw",
        description="raw: log-probabilities of the model's own distribution (temperature 1, nothing cut); "
        "sampled: of the distribution each token was drawn from (temperature, top_k, top_p, min_p applied)",
    )
    grammar: str | None = Field(None, description="constrain the output to a Lark (or GBNF) grammar")
    regex: str | None = Field(None, description="constrain the output to match a regular expression")
    prediction: dict | None = Field(
        None,
        description='the output expected for the most part (a file to edit): {"type": "content", "content": "..."} '
        '(or content as [{"type": "text", "text": "..."}]); its tokens are drafted, the output is unchanged',
    )
    presence_penalty: float | None = Field(None, description="only 0 is supported")
    frequency_penalty: float | None = Field(None, description="only 0 is supported")
    logit_bias: dict[str, float] | None = Field(None, description="only an empty one ({}) is supported")
    user: str | None = Field(None, description="ignored")

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are supported, got {len(value)}")
        longest = max(map(len, [value] if isinstance(value, str) else value or []), default=0)
        if longest > MAX_STOP_CHARS:
            raise ValueError(f"a stop string may have at most {MAX_STOP_CHARS} characters, got one of {longest}")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("penalties are not supported (they would change the target's distribution): use 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict | None) -> dict | None:
        if value:
            raise PydanticCustomError(
                "unsupported",
                "a bias on tokens is not supported (it would change the target's distribution): send {} or leave "
                "logit_bias out; to forbid or force text, use grammar, regex or response_format",
            )
        return value

    def constraint(self) -> tuple[Constraint, str] | None:
        """The grammar the output must match and the field that asked for it (None: unconstrained); raises
        ValueError when more than one asks."""
        asked = [(name, value) for name, value in self._constraints() if value is not None]
        if len(asked) > 1:
            raise ValueError(
                f"give at most one of response_format (JSON), grammar and regex, got {asked[0][0]} and {asked[1][0]}"
            )
        if not asked:
            return None
        name, value = asked[0]
        return value, name

    def _constraints(self) -> list[tuple[str, Constraint | None]]:
        return [
            ("grammar", None if self.grammar is None else Grammar(self.grammar)),
            ("regex", None if self.regex is None else Regex(self.regex)),
        ]

    def stop_list(self) -> list[str]:
        """The stop strings as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def top_logprobs_count(self) -> int | None:
        """Alternatives per token to return (None: no log-probabilities asked for); set by each endpoint."""
        return None

    def logprob_options(self) -> LogprobOptions | None:
        """What the engine must record of each emitted token (None: nothing)."""
        top = self.top_logprobs_count()
        if top is None:
            return None
        return LogprobOptions(top, LOGPROBS_MODES[self.logprobs_mode])


class TextPart(_Strict):
    """One text part of a message's content. ``cache_control`` (Anthropic's prompt-caching mark, which some
    clients put on parts) is ignored: the server reuses the longest cached prefix of every prompt anyway."""

    type: Literal["text"]
    text: str
    cache_control: dict[str, str | int | None] | None = None


def _content_parts_are_text(value: object) -> None:
    """Refuse content parts that are not text (images, audio, files) in words that say so, before the union of
    str and text parts reports its type mismatch."""
    if not isinstance(value, list):
        return
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind != "text":
            raise PydanticCustomError(
                "unsupported_content",
                f"content[{j}] is a part of type {kind[:40]!r}: the served model reads text only; send text parts "
                '({"type": "text", "text": "..."}) or a string',
            )


class FunctionCall(_Checked):
    """The function an assistant's tool call names and its arguments (JSON text)."""

    name: str
    arguments: str


class ToolCall(_Checked):
    """One tool call of an assistant message in the history."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    """One message of a conversation; ``developer`` is taken as ``system``. An assistant message may hold tool
    calls (its content then optional); a ``tool`` message is the result of the call ``tool_call_id``."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], _FAIL_FAST] | None = None
    tool_call_id: str | None = Field(None, validate_default=True)
    # what clients send back of an earlier reply's message, as the openai client returned it: ignored when null
    # (a legacy function_call refused before content, whose absence it would explain)
    refusal: str | None = None
    annotations: list | None = None
    reasoning: str | None = None  # an earlier reply's thinking as other servers write it: ignored
    audio: dict | None = None
    function_call: dict | None = None
    # an earlier reply's reasoning, as this server returned it: the template may render it (Qwen3's does)
    reasoning_content: str | None = None
    # validated after the tool fields: only an assistant message with tool_calls may leave it out
    content: str | Annotated[list[TextPart], _FAIL_FAST] | None = Field(None, validate_default=True)

    @field_validator("role", mode="before")
    @classmethod
    def _no_function_role(cls, value: object) -> object:
        if value == "function":
            raise PydanticCustomError(
                "unsupported",
                "the function role is the legacy form of a tool result: send it as a tool message "
                '({"role": "tool", "tool_call_id": ..., "content": ...}) answering a call of an earlier assistant '
                "message's tool_calls",
            )
        return value

    @field_validator("audio")
    @classmethod
    def _no_audio(cls, value: dict | None) -> None:
        _only_null(value, "audio is not supported: the served model reads and writes text only; leave it out")

    @field_validator("function_call")
    @classmethod
    def _no_legacy_call(cls, value: dict | None) -> None:
        _only_null(
            value,
            "function_call is the legacy form of a call: send the assistant message's calls as tool_calls "
            '([{"id": ..., "type": "function", "function": {"name": ..., "arguments": ...}}])',
        )

    @field_validator("tool_calls")
    @classmethod
    def _calls_from_the_assistant(cls, value: list | None, info: ValidationInfo) -> list | None:
        if value is not None and info.data.get("role") != "assistant":
            raise ValueError(f"only assistant messages hold tool_calls, not {info.data.get('role')} messages")
        return value

    @field_validator("tool_call_id")
    @classmethod
    def _tool_call_id_on_tool_messages(cls, value: str | None, info: ValidationInfo) -> str | None:
        role = info.data.get("role")
        if value is not None and role != "tool":
            raise ValueError("only tool messages hold tool_call_id: it names the call a tool message answers")
        if value is None and role == "tool":
            raise PydanticCustomError("missing", "Field required")
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _text_content(cls, value: object) -> object:
        _content_parts_are_text(value)
        return value

    @field_validator("content")
    @classmethod
    def _content_unless_calls(cls, value, info: ValidationInfo):
        if value is None and not (info.data.get("role") == "assistant" and info.data.get("tool_calls")):
            raise PydanticCustomError("missing", "Field required")
        return value

    def template_dict(self) -> dict:
        """The message as the chat template expects it: a role and one string (None: an assistant message of tool
        calls without text), and its tool calls or the id of the call it answers."""
        text = self.content
        if isinstance(text, list):
            text = "".join(part.text for part in text)
        out = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
            if self.name is not None:
                out["name"] = self.name
        if self.reasoning_content is not None and self.role == "assistant":
            out["reasoning_content"] = self.reasoning_content
        return out


class FunctionDefinition(_Checked):
    """A function the model may call: ``parameters`` is a JSON schema of its arguments (an object)."""

    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = Field(None, description="ignored: the arguments always match the schema")

    @field_validator("parameters")
    @classmethod
    def _not_too_deep(cls, value: dict | None) -> dict | None:
        too_deep = None if value is None else schema_depth_error(value, "the parameters schema")
        if too_deep is not None:
            raise PydanticCustomError("schema_too_deep", too_deep)
        return value


class ToolDefinition(_Checked):
    """One entry of ``tools``."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Checked):
    name: str


class NamedToolChoice(_Checked):
    """``{"type": "function", "function": {"name": ...}}``: the reply calls that function."""

    type: Literal["function"]
    function: NamedFunction


_MESSAGE_FIELDS = frozenset(ChatMessage.model_fields)
_PART_FIELDS = frozenset(TextPart.model_fields)


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], _FAIL_FAST] = Field(
        min_length=1, description="the conversation so far (at least one message)"
    )
    max_completion_tokens: int | None = Field(None, ge=1, description="the newer name of max_tokens; wins over it")
    logprobs: bool | None = Field(None, description="return each output token's log-probability")
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="most likely alternatives per token (needs logprobs true)"
    )
    response_format: dict | None = Field(
        None, description='{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": ...}'
    )
    tools: Annotated[list[ToolDefinition], _FAIL_FAST] | None = Field(
        None, description="functions the model may call (see the server docs: Tool calls)"
    )
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = Field(
        None, description='"auto" (default), "none", "required" or {"type": "function", "function": {"name": ...}}'
    )
    parallel_tool_calls: bool | None = Field(None, description="whether one reply may call several functions")
    chat_template_kwargs: dict | None = Field(
        None,
        description='variables for the chat template, e.g. {"enable_thinking": false} for Qwen3 (as vLLM and '
        "llama.cpp take them)",
    )
    # sent by common clients; accepted and ignored, with no effect on the output
    store: bool | None = Field(None, description="ignored: nothing is stored")
    metadata: dict[str, str] | None = Field(None, description="ignored")
    reasoning_effort: str | None = Field(None, description="ignored: the served model takes no reasoning budget")
    verbosity: str | None = Field(None, description="ignored")
    service_tier: str | None = Field(None, description="ignored: one tier")
    prompt_cache_key: str | None = Field(
        None, description="ignored: every prompt reuses the longest prefix the server has cached"
    )
    prompt_cache_retention: str | None = Field(None, description="ignored")
    prompt_cache_options: dict | None = Field(None, description="ignored")
    safety_identifier: str | None = Field(None, description="ignored")
    modalities: list[str] | None = Field(None, description='only ["text"] is supported')
    # refused unless null: they ask for what the server cannot do (or in a form it does not take)
    audio: dict | None = Field(None, description="not supported (only null)")
    functions: list | None = Field(None, description="the legacy form of tools: not supported (only null)")
    function_call: str | dict | None = Field(
        None, description="the legacy form of tool_choice: not supported (only null)"
    )
    web_search_options: dict | None = Field(None, description="not supported (only null)")

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(kind != "text" for kind in value):
            raise PydanticCustomError(
                "unsupported", 'the served model writes text only: send ["text"] or leave modalities out'
            )
        return value

    @field_validator("audio")
    @classmethod
    def _no_audio(cls, value: dict | None) -> None:
        _only_null(value, "audio output is not supported: the served model writes text only; leave audio out")

    @field_validator("functions")
    @classmethod
    def _no_functions(cls, value: list | None) -> None:
        _only_null(
            value,
            'functions is the legacy form of tools: send tools=[{"type": "function", "function": {"name": ..., '
            '"description": ..., "parameters": {...}}}] instead (and tool_choice instead of function_call)',
        )

    @field_validator("function_call")
    @classmethod
    def _no_function_call(cls, value: str | dict | None) -> None:
        _only_null(
            value,
            'function_call is the legacy form of tool_choice: send tool_choice ("auto", "none", "required" or '
            '{"type": "function", "function": {"name": ...}}) with tools instead',
        )

    @field_validator("web_search_options")
    @classmethod
    def _no_web_search(cls, value: dict | None) -> None:
        _only_null(value, "web search is not available on this server: leave web_search_options out")

    def tools_json(self) -> list[dict] | None:
        """``tools`` as OpenAI's JSON has them (None: no tools)."""
        return None if self.tools is None else [tool.model_dump(exclude_none=True) for tool in self.tools]

    def tool_choice_json(self) -> str | dict | None:
        """``tool_choice`` as OpenAI's JSON has it."""
        choice = self.tool_choice
        return choice.model_dump() if isinstance(choice, NamedToolChoice) else choice

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, value: dict | None) -> dict | None:
        if value is not None:
            response_format_constraint(value)  # raises ValueError naming what is wrong
        return value

    def _constraints(self) -> list[tuple[str, Constraint | None]]:
        found = None if self.response_format is None else response_format_constraint(self.response_format)
        return [("response_format", found), *super()._constraints()]

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: set logprobs to true")
        return value

    def top_logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("messages", mode="before")
    @classmethod
    def _first_unknown_message_field(cls, value: object) -> object:
        """The first unknown field of any message or content part, found in one pass over them (a validator per
        message would cost more than validating the message)."""
        if isinstance(value, list):
            for i, message in enumerate(value):
                path = _unknown_in_message(i, message)
                if path is not None:
                    raise _unknown_field(path)
        return value


def _unknown_in_message(i: int, message: object) -> str | None:
    """The path of the first unknown field of message ``i`` or of its content parts (None: none)."""
    if not isinstance(message, dict):
        return None
    if not message.keys() <= _MESSAGE_FIELDS:
        return _first_unknown(message, _MESSAGE_FIELDS, f"[{i}]")
    content = message.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):  # a part that is not text is refused as such (ChatMessage)
            if isinstance(part, dict) and part.get("type") == "text" and not part.keys() <= _PART_FIELDS:
                return _first_unknown(part, _PART_FIELDS, f"[{i}].content[{j}]")
    return None


_JSON_SCHEMA_FIELDS = frozenset({"name", "schema", "strict", "description"})


def response_format_constraint(value: dict) -> Constraint | None:
    """The constraint of an OpenAI ``response_format``: ``text`` (None), ``json_object`` (any JSON object) or
    ``json_schema`` (``{"json_schema": {"name", "schema", "strict", "description"}}``; strict or not, the output
    matches the schema). Raises ValueError naming what is wrong."""
    kind = value.get("type")
    if kind == "text" and len(value) == 1:
        return None
    if kind == "json_object" and len(value) == 1:
        return JsonObject()
    if kind == "json_schema" and value.keys() <= {"type", "json_schema"}:
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}')
        unknown = sorted(spec.keys() - _JSON_SCHEMA_FIELDS)
        if unknown:
            raise ValueError(f"response_format.json_schema has an unknown field {unknown[0]!r}")
        too_deep = schema_depth_error(spec["schema"], "response_format.json_schema.schema")
        if too_deep is not None:
            raise ValueError(too_deep)
        return JsonSchema(spec["schema"])
    raise ValueError(
        f"response_format {kind!r} is not supported: use text, json_object or json_schema (with only the type "
        'and "json_schema" fields)'
    )


class CompletionRequest(SamplingRequest):
    """POST /v1/completions. ``prompt`` is a string or a list of token ids (a list of one string is accepted)."""

    prompt: str | Annotated[list[int], _FAIL_FAST] | Annotated[list[str], _FAIL_FAST] = Field(
        description="one prompt: a string or a list of token ids"
    )
    echo: bool = Field(False, description="not supported (only false)")
    suffix: str | None = Field(
        None,
        description="fill in the middle: the text after the completion (the prompt is the text before it); needs a "
        "model with FIM tokens (empty or null: a plain completion)",
    )
    best_of: int | None = Field(None, ge=1, le=MAX_N, description="only n (or null) is supported")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_COMPLETION_LOGPROBS,
        description="return each output token's log-probability and this many most likely alternatives",
    )

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if value is not None and value != n:
            raise ValueError(f"best_of is not supported: leave it out or set it to n ({n})")
        return value

    def top_logprobs_count(self) -> int | None:
        return self.logprobs

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported: the response holds the completion only")
        return value
