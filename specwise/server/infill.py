"""Fill in the middle over HTTP: ``suffix`` in ``/v1/completions`` (OpenAI's: the prompt is the text before the
cursor, the suffix the text after it) and ``POST /infill``, llama.cpp's code-infilling endpoint.

Both lay out the model's FIM prompt with :func:`specwise.fim.fim_prompt` on the encoder's thread, end the middle at
the model's end-of-sequence and FIM stop tokens, and refuse a model without FIM tokens with a 400 naming the field.
``/infill`` takes llama.cpp's request (``input_prefix``, ``input_suffix``, ``input_extra`` as a list of
``{"filename", "text"}`` files of context, ``prompt``: the start of the middle, ``n_predict`` and the sampling
fields, with llama.cpp's defaults) and answers as llama.cpp's ``/completion`` does: one JSON object (``content``,
``stop``, ``tokens_predicted``, ``tokens_evaluated``, ``stop_type`` ...), or with ``stream`` server-sent events of
``{"content": ...}`` objects, the last one with ``"stop": true`` and the whole summary.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Annotated

from specwise.extras import missing_extra
from specwise.fim import FimTokens, engine_eos, fim_prompt, fim_stop_ids, fim_tokens

try:
    from fastapi import Request
    from fastapi.responses import Response
    from pydantic import Field, ValidationInfo, field_validator
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

from specwise.constraints import Constraint, JsonSchema
from specwise.server.errors import APIError, as_api_error
from specwise.server.parsing import check_model, encode_completion, generation_request
from specwise.server.protocol import _FAIL_FAST, CompletionRequest, SamplingRequest, _Checked
from specwise.server.responses import _data, answer, queue
from specwise.server.state import ServerState, server_state
from specwise.server.worker import ClientDisconnected

if TYPE_CHECKING:
    from specwise.step import Request as GenerationRequest

__all__ = ["ExtraFile", "InfillRequest", "encode_fim_completion", "fim_end_tokens", "infill"]

RANDOM_SEEDS = (-1, 0xFFFFFFFF)  # llama.cpp's "pick a random seed"
_NOT_FIM = (
    "this model has no fill-in-the-middle tokens (no tokenizer.ggml.fim_* metadata, and none of <|fim_prefix|>, "
    "<fim_prefix> or ▁<PRE> in its vocabulary): serve a code model trained for infilling, such as Qwen2.5-Coder"
)
_FIM_BY_ENCODER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # PromptEncoder -> FimTokens | None


class ExtraFile(_Checked):
    """A file of context for ``/infill`` (llama.cpp's ``input_extra`` item)."""

    filename: str = Field("", description="the file's name or path (one line)")
    text: str = Field(description="the file's text")

    @field_validator("filename")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\n" in value or "\r" in value:
            raise ValueError("a filename must be one line (it is written on a line of its own)")
        return value


class InfillRequest(SamplingRequest):
    """POST /infill: llama.cpp's infill request. Sampling defaults are llama.cpp's (temperature 0.8, top_k 40,
    top_p 0.95, min_p 0.05, a random seed); ``n_predict`` -1 (the default) generates up to the context's end."""

    model: str | None = Field(None, description="the served model's id (optional)")
    input_prefix: str = Field("", description="the text before the gap")
    input_suffix: str = Field("", description="the text after the gap")
    input_extra: Annotated[list[ExtraFile], _FAIL_FAST] = Field(
        default_factory=list, description='files of context: [{"filename": ..., "text": ...}, ...]'
    )
    prompt: str = Field("", description="the start of the middle, written after the middle token")
    repo_name: str = Field("project", description="the repository's name in the repository-level layout")
    filename: str = Field("file", description="the current file's name in the repository-level layout")
    n_predict: int | None = Field(None, ge=-1, description="new tokens at most (-1: up to the context's end)")
    temperature: float | None = Field(0.8, ge=0, description="0 is greedy (default: 0.8)")
    top_k: int | None = Field(40, ge=-1, description="keep the k most likely tokens (0: disabled; default 40)")
    top_p: float | None = Field(0.95, gt=0, le=1, description="nucleus sampling mass (default: 0.95)")
    min_p: float | None = Field(0.05, ge=0, lt=1, description="drop tokens below min_p x the top one (default 0.05)")
    seed: int | None = Field(-1, description="seed for sampling (-1: random)")
    n: int = Field(1, ge=1, le=1, description="one completion per request")
    json_schema: dict | None = Field(None, description="constrain the middle to JSON valid against this schema")
    return_tokens: bool = Field(False, description="also return the middle's token ids in tokens")
    # llama.cpp options that change nothing here (caching and timing are the server's own): accepted, ignored
    cache_prompt: bool | None = None
    id_slot: int | None = None
    n_indent: int | None = None
    n_keep: int | None = None
    n_cache_reuse: int | None = None
    t_max_prompt_ms: int | None = None
    t_max_predict_ms: int | None = None
    samplers: list[str] | str | None = None
    response_fields: list[str] | None = None
    timings_per_token: bool | None = None
    # llama.cpp options that would change the target's distribution: only their neutral values
    repeat_penalty: float | None = Field(None, description="only 1 is supported")
    typical_p: float | None = Field(None, description="only 1 is supported")
    mirostat: int | None = Field(None, description="only 0 is supported")
    n_probs: int | None = Field(None, description="only 0 is supported (use /v1/completions with logprobs)")

    @field_validator("seed")
    @classmethod
    def _random_seed(cls, value: int | None) -> int | None:
        return None if value in RANDOM_SEEDS else value

    @field_validator("n_predict")
    @classmethod
    def _some_tokens(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("0 (only evaluate the prompt) is not supported: ask for at least 1, or -1")
        return value

    @field_validator("repeat_penalty", "typical_p")
    @classmethod
    def _one(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and value != 1:
            raise ValueError(f"{info.field_name} would change the target's distribution: only 1 is supported")
        return value

    @field_validator("mirostat", "n_probs")
    @classmethod
    def _zero(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value:
            raise ValueError(f"{info.field_name} is not supported: use 0 (or leave it out)")
        return value

    def _constraints(self) -> list[tuple[str, Constraint | None]]:
        schema = None if self.json_schema is None else JsonSchema(self.json_schema)
        return [("json_schema", schema), *super()._constraints()]

    def budget(self) -> tuple[int | None, str]:
        """The token budget asked for (None: the rest of the context) and the field that asked."""
        if self.n_predict is not None:
            return (None if self.n_predict < 0 else self.n_predict), "n_predict"
        return self.max_tokens, "max_tokens"


# ------------------------------------------------------------------------------------------------ the FIM prompt


def server_fim(state: ServerState) -> FimTokens | None:
    """The served model's FIM tokens (looked up once, on the encoder's thread)."""
    encoder = state.encoder
    if encoder not in _FIM_BY_ENCODER:
        metadata = state.runtime.target.fim_token_ids
        _FIM_BY_ENCODER[encoder] = fim_tokens(encoder.tokenizer, metadata, state.runtime.engine.target.vocab_size)
    return _FIM_BY_ENCODER[encoder]


def _require(state: ServerState, param: str) -> FimTokens:
    fim = server_fim(state)
    if fim is None:
        raise APIError(400, f"{param} needs fill-in-the-middle, but {_NOT_FIM}", param=param, code="fim_not_supported")
    return fim


def _text_encoder(state: ServerState):
    return lambda text: state.encoder.text(text, add_special_tokens=False)


def encode_fim_completion(state: ServerState, body: CompletionRequest) -> list[int]:
    """The FIM prompt of a completion with ``suffix`` (on the encoder's thread). A token-id prompt is the prefix's
    ids as they are, unless it holds FIM tokens already (then it is a whole FIM prompt, and a suffix cannot be
    added: 400)."""
    fim = _require(state, "suffix")
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        prompt = encode_completion(state, prompt)  # checked against the vocabulary
        held = sorted(set(prompt) & fim.special_ids())
        if held:
            raise APIError(
                400,
                f"the prompt's token ids hold the FIM token {held[0]} already: send a whole FIM prompt without "
                "suffix, or the text (or ids) before the cursor as prompt with suffix",
                param="suffix",
            )
    elif isinstance(prompt, list):
        if len(prompt) != 1:
            raise APIError(400, "batches of prompts are not supported: send one prompt per request", param="prompt")
        prompt = prompt[0]
    ids = fim_prompt(state.encoder.tokenizer, fim, prompt, body.suffix or "", encode=_text_encoder(state))
    check_context(state, len(ids), body.max_tokens, "the prompt and suffix", "suffix", "max_tokens")
    return ids


def encode_infill(state: ServerState, body: InfillRequest) -> tuple[list[int], str]:
    """An /infill request's FIM prompt: its token ids and its text (on the encoder's thread)."""
    fim = _require(state, "input_suffix")
    extra = [(chunk.filename, chunk.text) for chunk in body.input_extra]
    ids = fim_prompt(
        state.encoder.tokenizer,
        fim,
        body.input_prefix,
        body.input_suffix,
        body.prompt,
        extra=extra,
        repo_name=body.repo_name,
        filename=body.filename,
        encode=_text_encoder(state),
    )
    return ids, state.encoder.tokenizer.decode(ids)


def check_context(state: ServerState, n: int, max_tokens: int | None, what: str, param: str, budget: str) -> None:
    """A 400 (``context_length_exceeded``) when the FIM prompt (``n`` tokens) and the budget do not fit."""
    context = state.context
    if context is None:
        return
    if n >= context:
        message = f"{what} take {n} tokens but the model's context is {context}: shorten them"
        raise APIError(400, message, param=param, code="context_length_exceeded")
    if max_tokens is not None and n + max_tokens > context:
        message = (
            f"{budget} is {max_tokens} but the model's context is {context} tokens and {what} take {n}: ask for "
            f"at most {context - n}"
        )
        raise APIError(400, message, param=budget, code="context_length_exceeded")


def fim_end_tokens(state: ServerState) -> list[int]:
    """The tokens a middle ends at: the model's end-of-sequence tokens and the FIM stop tokens (a request with
    ``ignore_eos`` ends at none of them: :func:`~specwise.server.parsing.generation_request` sees to it)."""
    return sorted(fim_stop_ids(server_fim(state), engine_eos(state.runtime.engine)))


# ------------------------------------------------------------------------------------------------ /infill


async def infill(body: InfillRequest, request: Request) -> Response:
    """llama.cpp's ``POST /infill``: the middle between ``input_prefix`` and ``input_suffix``, streamed or not."""
    state = server_state(request)
    if body.model is not None:
        check_model(state, body.model)
    if getattr(body, "prediction", None) is not None:
        message = "prediction is not supported by /infill: use /v1/completions with suffix and prediction"
        raise APIError(400, message, param="prediction")
    prompt_ids, prompt_text = await state.encoder.run(encode_infill, state, body)
    max_tokens, budget = body.budget()
    what = "input_extra, input_prefix, input_suffix and prompt"
    check_context(state, len(prompt_ids), max_tokens, what, "input_prefix", budget)
    end = fim_end_tokens(state)
    generation = generation_request(state, body, prompt_ids, max_tokens, "infill", budget, end_tokens=end)
    return await _answer(state, request, generation, InfillAnswer(state, body, generation, prompt_text))


async def _answer(state: ServerState, request: Request, generation: GenerationRequest, reply: InfillAnswer) -> Response:
    """Queue the job and answer: one JSON object, or (once the first tokens are out) an event stream."""
    group = queue(state, [generation], "infill")
    events = _events(group.events(request.is_disconnected))
    streamed = lambda first: _stream(reply, first, events)  # noqa: E731
    return await answer(group, events, reply.body.stream, streamed, lambda first: _whole(reply, first, events))


async def _events(events):
    """The job's events without their choice index (an infill has one choice)."""
    async for _, event in events:
        yield event


async def _whole(reply: InfillAnswer, first, events) -> dict:
    """The whole answer as one JSON object."""
    reply.add(first)
    async for event in events:
        reply.add(event)
    return await reply.summary()


async def _stream(reply: InfillAnswer, event, events):
    """Server-sent events as llama.cpp sends them: ``{"content", "tokens", "stop": false, ...}`` per target pass
    with new text, then the summary with ``"stop": true`` (no ``[DONE]``)."""
    try:
        while True:
            reply.add(event)
            if event.text or event.token_ids:
                yield _data(reply.chunk(event))
            if event.finish_reason is not None:
                yield _data(await reply.summary(streamed=True))
                return
            event = await anext(events)
    except ClientDisconnected:
        return
    except Exception as err:  # after the headers: the error goes in the stream
        yield _data(as_api_error(err).body())


class InfillAnswer:
    """An /infill answer as its events come in, and its JSON in llama.cpp's shape (plus ``speculative``)."""

    def __init__(
        self, state: ServerState, body: InfillRequest, generation: GenerationRequest, prompt_text: str
    ) -> None:
        self.state, self.body, self.generation, self.prompt_text = state, body, generation, prompt_text
        self.texts: list[str] = []
        self.tokens: list[int] = []
        self.finish: str | None = None
        self.stats = None

    def add(self, event) -> None:
        self.texts.append(event.text)
        self.tokens.extend(event.token_ids)
        if event.finish_reason is not None:
            self.finish, self.stats = event.finish_reason, event.stats

    def chunk(self, event) -> dict:
        """A streamed piece: the new text and token ids."""
        return {
            "index": 0,
            "content": event.text,
            "tokens": list(event.token_ids),
            "stop": False,
            "tokens_predicted": len(self.tokens),
            "tokens_evaluated": len(self.generation.prompt_ids),
        }

    async def summary(self, streamed: bool = False) -> dict:
        """The whole answer (``content`` empty when the text was streamed)."""
        stop_type, word = await self._stop()
        stats = self.stats
        predicted_ms = 1000 * max(0.0, stats.total_seconds - stats.prefill_seconds)
        prompt_ms = 1000 * stats.prefill_seconds
        runtime = self.state.runtime
        return {
            "index": 0,
            "content": "" if streamed else "".join(self.texts),
            "tokens": self.tokens if self.body.return_tokens and not streamed else [],
            "stop": True,
            "model": self.state.model_name,
            "prompt": self.prompt_text,
            "tokens_predicted": len(self.tokens),
            "tokens_evaluated": len(self.generation.prompt_ids),
            "tokens_cached": min(stats.cached_tokens, len(self.generation.prompt_ids)),
            "truncated": False,  # the prompt is never cut: what does not fit is refused
            "stop_type": stop_type,
            "stopping_word": word,
            "stopped_eos": stop_type == "eos",
            "stopped_word": stop_type == "word",
            "stopped_limit": stop_type == "limit",
            "generation_settings": self._settings(),
            "timings": {
                "prompt_n": len(self.generation.prompt_ids) - stats.cached_tokens,
                "prompt_ms": prompt_ms,
                "predicted_n": len(self.tokens),
                "predicted_ms": predicted_ms,
                "predicted_per_second": 1000 * len(self.tokens) / predicted_ms if predicted_ms > 0 else None,
            },
            "speculative": {"drafter": runtime.drafter_spec, "gamma": runtime.engine.gamma, **stats.to_dict()},
        }

    async def _stop(self) -> tuple[str, str]:
        """llama.cpp's stop_type (``eos``, ``word`` or ``limit``) and the stop string that ended the middle."""
        if self.finish != "stop":
            return "limit", ""
        if self.tokens and self.tokens[-1] in set(self.generation.eos_token_ids or ()):
            return "eos", ""
        stops = self.generation.stop
        whole = await self.state.encoder.run(_decode, self.state, self.tokens)
        after = whole[len("".join(self.texts)) :]
        found = [(after.find(s), s) for s in stops if s and s in after]
        return "word", min(found)[1] if found else ""

    def _settings(self) -> dict:
        params = self.generation.params
        return {
            "n_predict": self.generation.max_new_tokens,
            "n_ctx": self.state.context,
            "model": self.state.model_name,
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
            "min_p": params.min_p,
            "seed": params.seed,
            "stop": list(self.generation.stop),
            "ignore_eos": self.body.ignore_eos,
            "stream": self.body.stream,
        }


def _decode(state: ServerState, ids: list[int]) -> str:
    return state.encoder.tokenizer.decode(ids, skip_special_tokens=True)
