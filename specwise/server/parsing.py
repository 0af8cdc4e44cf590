"""A request's parts as the engine takes them: the model checked, the prompt encoded (on the encoder's thread),
the sampling settings and constraint checked (:func:`sampling_params`, the one place a body's settings become
:class:`~specwise.sampling.SamplingParams`), the token budget against the context, and the step's one
:class:`~specwise.step.Request` (:func:`generation_request`), then one per choice (choice i seeded ``seed + i``).
Every problem is an :class:`~specwise.server.errors.APIError` naming its parameter."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from specwise.constraints import Constraint, ConstraintError
from specwise.sampling import SamplingParams
from specwise.server.errors import APIError
from specwise.server.protocol import SEED_MAX, ChatCompletionRequest, ChatMessage, SamplingRequest
from specwise.step import Request
from specwise.tools import (
    ReplyReader,
    ToolError,
    ToolFormat,
    ToolRequest,
    check_history,
    detect_format,
    special_token_id,
    tool_request,
)
from specwise.tools.reasoning import ReasoningSplitter, ThinkingTags, thinking_tags

if TYPE_CHECKING:
    from specwise.server.state import ServerState

__all__ = [
    "ChatTools",
    "chat_tools",
    "check_model",
    "choice_requests",
    "choice_seed",
    "encode_chat",
    "encode_completion",
    "encode_prediction",
    "generation_request",
    "predicted_text",
    "sampling_params",
]

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
UNKNOWN_CONTEXT_MAX_TOKENS = 256  # chat's default budget when the model's context size is unknown


def check_model(state: ServerState, model: str) -> None:
    if model != state.model_name:
        raise APIError(
            400,
            f"The model '{model}' does not exist: this server serves '{state.model_name}' (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )


_RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "tokenize", "chat_template"})


def encode_chat(
    state: ServerState, messages: list[ChatMessage], tools: ChatTools | None = None, template_kwargs: dict | None = None
) -> list[int]:
    """The conversation's token ids (on the encoder's thread), with the request's tools rendered in the model's
    tool-call format (``tools``: see :func:`chat_tools`) and ``template_kwargs`` given to the template (a
    request's ``chat_template_kwargs``, e.g. Qwen3's ``enable_thinking``)."""
    extra = dict(template_kwargs or {})
    bad = sorted(k for k in extra if k in _RESERVED_TEMPLATE_KWARGS or not k.isidentifier())
    if bad:
        raise APIError(400, f"chat_template_kwargs may not set {bad[0]!r}", param="chat_template_kwargs")
    dicts = [m.template_dict() for m in messages]
    try:
        if tools is None:
            return state.encoder.chat(dicts, None, extra)
        return state.encoder.chat(*tools.format.prompt(dicts, tools.request), extra)
    except Exception as err:  # the template may reject a conversation (e.g. roles that do not alternate)
        raise APIError(400, f"the chat template rejected these messages: {err}", param="messages") from err


@dataclass(frozen=True)
class ChatTools:
    """A chat request's tools for the served model: the model's tool-call format, the checked tools (None: none),
    the grammar of the reply (None: unconstrained) and the model's thinking tags where its reasoning is split
    from the answer (None: it is not)."""

    format: ToolFormat
    request: ToolRequest | None
    constraint: Constraint | None
    thinking: ThinkingTags | None = None

    def readers(self, tokenizer, stop: list[str], n: int, prompt_ids: list[int] = ()) -> list[ReplyReader] | None:
        """A reader for each of ``n`` choices (None: the replies are all content)."""
        parser = self.format.parser(self.request)
        if parser is None and self.thinking is None:
            return None
        markers = self.format.markers(tokenizer)
        inside = False
        if self.thinking is not None:
            inside = self.thinking.starts_inside(tokenizer, list(prompt_ids))
            markers |= {special_token_id(tokenizer, t) for t in (self.thinking.open, self.thinking.close)} - {None}
        return [
            ReplyReader(
                self.format.parser(self.request),
                tokenizer,
                markers,
                stop,
                None if self.thinking is None else ReasoningSplitter(self.thinking, inside),
            )
            for _ in range(n)
        ]


_NOT_WITH_TOOLS = ("response_format", "grammar", "regex")


def chat_tools(state: ServerState, body: ChatCompletionRequest) -> ChatTools:
    """The request's tools, tool choice and tool messages checked (a 400 naming the field), the model's format and
    the reply's grammar."""
    try:
        request = tool_request(body.tools_json(), body.tool_choice_json(), body.parallel_tool_calls)
        check_history([m.template_dict() for m in body.messages])
    except ToolError as err:
        raise APIError(400, str(err), param=err.param) from err
    tokenizer = state.runtime.tokenizer
    fmt = detect_format(getattr(tokenizer, "chat_template", None))
    thinking = thinking_tags(tokenizer) if state.reasoning_format == "auto" else None
    if request is None:
        return ChatTools(fmt, None, None, thinking)
    for name in _NOT_WITH_TOOLS:
        value = getattr(body, name)
        if value is not None and value != {"type": "text"}:
            message = f"tools cannot be combined with {name}: the tool choice decides the reply's form; leave one out"
            raise APIError(400, message, param=name)
    constraint = fmt.constraint(request, tokenizer, thinking_tags(tokenizer))
    try:
        if constraint is not None:
            constraint.check()
    except ConstraintError as err:
        raise APIError(400, f"the tools cannot constrain the reply: {err}", param="tools") from err
    return ChatTools(fmt, request, constraint, thinking)


def encode_completion(state: ServerState, prompt: str | list[int] | list[str]) -> list[int]:
    """The prompt's token ids, checked against the vocabulary (on the encoder's thread)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "batches of prompts are not supported: send one prompt per request", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return state.encoder.text(prompt)
    vocab = state.runtime.engine.target.vocab_size
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt")
    return list(prompt)


def predicted_text(value: dict) -> str:
    """The text of an OpenAI ``prediction``: ``{"type": "content", "content": str | [{"type": "text", "text": str},
    ...]}`` (parts joined). Raises ValueError naming what is wrong."""
    kind = value.get("type")
    if kind != "content":
        raise ValueError(f'prediction type {kind!r} is not supported: use {{"type": "content", "content": "..."}}')
    unknown = sorted(value.keys() - {"type", "content"})
    if unknown:
        raise ValueError(f"prediction has an unknown field {unknown[0]!r}: give only type and content")
    content = value.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError('prediction content must be a string or a list of {"type": "text", "text": "..."} parts')
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f'prediction content[{i}] is not a text part: give {{"type": "text", "text": "..."}}')
        if part.keys() != {"type", "text"}:
            raise ValueError(f"prediction content[{i}] has an unknown field: give only type and text")
        texts.append(part["text"])
    return "".join(texts)


def encode_prediction(state: ServerState, prediction: dict | None) -> list[int] | None:
    """The predicted output's token ids, as plain text without special tokens (on the encoder's thread); None
    without a prediction or with an empty one. A prediction of another shape is a 400 naming ``prediction``."""
    if prediction is None:
        return None
    try:
        text = predicted_text(prediction)
    except ValueError as err:
        raise APIError(400, str(err), param="prediction") from err
    return state.encoder.text(text, add_special_tokens=False) or None


def sampling_params(body: SamplingRequest, constraint: Constraint | None = None) -> SamplingParams:
    """The request's SamplingParams (OpenAI's defaults: temperature 1, top_p 1; top_k -1 or 0 disables), with its
    constraint: ``constraint`` where given (the grammar of a request's tools), else the body's own (response_format,
    grammar or regex), checked."""
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
    if constraint is None:
        constraint = _constraint(body)
    try:
        return SamplingParams(
            temperature=1.0 if body.temperature is None else float(body.temperature),
            top_k=top_k,
            top_p=1.0 if body.top_p is None else float(body.top_p),
            min_p=0.0 if body.min_p is None else float(body.min_p),
            seed=body.seed,
            constraint=constraint,
        )
    except ValueError as err:
        raise APIError(400, str(err), param=str(err).split(" ", 1)[0]) from err


def _constraint(body: SamplingRequest):
    """The request's constraint (response_format, grammar or regex), checked: a 400 naming the problem."""
    try:
        found = body.constraint()
    except ValueError as err:
        raise APIError(400, str(err), param="response_format") from err
    if found is None:
        return None
    constraint, param = found
    try:
        constraint.check()
    except ValueError as err:
        raise APIError(400, str(err), param=param) from err
    return constraint


def generation_request(
    state: ServerState,
    body: SamplingRequest,
    prompt_ids: list[int],
    max_tokens: int | None,
    endpoint: str,
    max_tokens_param: str = "max_tokens",
    prediction: list[int] | None = None,
    constraint: Constraint | None = None,
    end_tokens: list[int] | None = None,
) -> Request:
    """The step's Request of a body whose prompt is ``prompt_ids``: its sampling settings (:func:`sampling_params`,
    ``constraint``: the tools' grammar), its budget checked against the context (None: the endpoint's default),
    its stop strings, predicted output and log-probabilities, and the tokens it ends at (``end_tokens``; None: the
    engine's end-of-sequence tokens; nothing with ``ignore_eos``). ``endpoint`` (``chat``, ``completions``,
    ``infill``) names the prompt's field in errors and picks the default budget."""
    prompt_param = "messages" if endpoint == "chat" else "prompt"
    if not prompt_ids:
        raise APIError(400, "the prompt is empty: give at least one token", param=prompt_param)
    context, n = state.context, len(prompt_ids)
    if context is not None and n >= context:
        message = f"the prompt has {n} tokens but the model's context is {context}: shorten the prompt"
        raise APIError(400, message, param=prompt_param, code="context_length_exceeded")
    room = None if context is None else context - n
    params = sampling_params(body, constraint)
    if max_tokens is None:
        # a constrained completion gets the rest of the context, as chat does, so that its grammar can finish
        short = endpoint == "completions" and params.constraint is None
        default = COMPLETION_DEFAULT_MAX_TOKENS if short else room or UNKNOWN_CONTEXT_MAX_TOKENS
        max_tokens = state.default_max_tokens or default
        max_tokens = max_tokens if room is None else min(max_tokens, room)
    elif room is not None and max_tokens > room:
        message = (
            f"{max_tokens_param} is {max_tokens} but the model's context is {context} tokens and the prompt "
            f"takes {n}: ask for at most {room}"
        )
        raise APIError(400, message, param=max_tokens_param, code="context_length_exceeded")
    if prediction and room is not None and len(prediction) > room:
        message = (
            f"the prediction has {len(prediction)} tokens but the model's context is {context} tokens and the prompt "
            f"takes {n}: predict at most {room} tokens"
        )
        raise APIError(400, message, param="prediction", code="context_length_exceeded")
    eos = [] if body.ignore_eos else end_tokens
    return Request(prompt_ids, params, max_tokens, body.stop_list(), eos, body.logprob_options(), prediction)


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice ``index`` of a request seeded ``seed``: ``seed + index`` (past the largest seed, it
    wraps around modulo 2**64); None stays None (each choice draws its own)."""
    if seed is None:
        return None
    seed += index
    return seed - 2**64 if seed > SEED_MAX else seed


def choice_requests(request: Request, n: int) -> list[Request]:
    """The Requests of a request's ``n`` choices: ``request`` with choice i's seed."""
    if n == 1:
        return [request]
    params = request.params
    return [replace(request, params=replace(params, seed=choice_seed(params.seed, i))) for i in range(n)]
