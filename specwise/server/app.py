"""The OpenAI-compatible HTTP API (FastAPI): completions, chat completions, models, health and metrics.

``create_app(runtime)`` builds the app around a Runtime; run it with uvicorn (``specwise serve``) or test it
in-process. A body over the size limit is refused before it is parsed (``limits.py``); the rest are validated on
the event loop, encoded on the encoder's thread (``encoding.py``: the event loop never tokenizes), then queued for
the one generation thread, which batches them (see ``worker.py``); responses carry the request's speculative
statistics in ``usage.speculative``. A request for ``n`` choices runs as ``n`` requests of the batch (choice i
seeded ``seed + i``); log-probabilities are the target's, recorded by the engine from the pass that verified each
token (``logprobs.py``). With an API key, every route but ``/health`` needs it (``auth.py``).
Every error is an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``: a bad request gets a 4xx,
never a 5xx.
"""

from __future__ import annotations

import json
import re
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from specwise.extras import missing_extra

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

from specwise.metrics import SpecStats
from specwise.runtime import Runtime
from specwise.sampling import SamplingParams
from specwise.server.auth import APIKeyMiddleware
from specwise.server.encoding import PromptEncoder
from specwise.server.limits import BodyLimitMiddleware, default_max_body_bytes
from specwise.server.logprobs import TokenTexts
from specwise.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from specwise.server.protocol import (
    SEED_MAX,
    ChatCompletionRequest,
    ChatFormat,
    ChatMessage,
    Choice,
    CompletionFormat,
    CompletionRequest,
    ErrorResponse,
    ResponseFormat,
    SamplingRequest,
    error_body,
    usage,
)
from specwise.server.worker import (
    BatchFailed,
    ClientDisconnected,
    GenerationWorker,
    JobGroup,
    JobSpec,
    QueueFullError,
    ServerStopping,
)

__all__ = ["APIError", "ServerState", "choice_seed", "create_app", "sampling_params"]

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
UNKNOWN_CONTEXT_MAX_TOKENS = 256  # chat's default budget when the model's context size is unknown
CLIENT_CLOSED = 499  # the status logged for a request whose client went away (nobody reads it)
_ERRORS = {400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 429: {"model": ErrorResponse}}
_ERRORS[401] = {"model": ErrorResponse}


class APIError(Exception):
    """An error returned to the client as an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type_: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


@dataclass
class ServerState:
    """What the routes share: the runtime, the generation worker, the metrics and the serving options."""

    runtime: Runtime
    model_name: str
    worker: GenerationWorker
    metrics: ServerMetrics
    default_max_tokens: int | None
    encoder: PromptEncoder  # prompts -> token ids on a thread of its own (the worker thread decodes)
    max_body_bytes: int
    created: int
    token_texts: TokenTexts  # token ids -> text and bytes, for log-probabilities

    @property
    def context(self) -> int | None:
        """The target's context size in tokens (None when unknown)."""
        return self.runtime.engine.target.max_length


def create_app(
    runtime: Runtime,
    *,
    model_name: str | None = None,
    max_queue: int = 64,
    default_max_tokens: int | None = None,
    max_batch: int = 16,
    max_body_bytes: int | None = None,
    api_key: str | None = None,
) -> FastAPI:
    """Build the FastAPI app serving ``runtime``.

    model_name: the id clients must send as ``model`` (default: the target's name).
    max_queue: requests that may wait for a place in the batch before new ones get HTTP 429.
    max_batch: requests generated together, sharing each target pass (1: one at a time).
    default_max_tokens: the token budget when a request gives none (default: the rest of the context for chat,
        16 for completions, as at OpenAI).
    max_body_bytes: larger request bodies get HTTP 413 unread (default: 1 MiB, or 16 bytes per token of context
        where that is more).
    api_key: when set, every route but ``/health`` requires ``Authorization: Bearer <api_key>`` (HTTP 401 without).
    """
    if runtime.tokenizer is None:
        raise ValueError("the server needs a tokenizer: load a target that has one")
    if default_max_tokens is not None and default_max_tokens < 1:
        raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
    if max_body_bytes is None:
        max_body_bytes = default_max_body_bytes(runtime.engine.target.max_length)
    metrics = ServerMetrics()
    worker = GenerationWorker(runtime.engine, metrics, max_queue, max_batch)
    name = model_name or runtime.target.name
    encoder = PromptEncoder(runtime.tokenizer)
    texts = TokenTexts(runtime.tokenizer)
    created = int(time.time())
    state = ServerState(runtime, name, worker, metrics, default_max_tokens, encoder, max_body_bytes, created, texts)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        yield
        worker.stop()
        encoder.close()

    app = FastAPI(title="specwise", summary="OpenAI-compatible exact speculative decoding", lifespan=lifespan)
    app.state.server = state
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)  # inside the metrics: 413s are counted
    if api_key is not None:  # outside the body limit: a request without the key gets 401, its body unread
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    app.add_middleware(HTTPMetricsMiddleware, metrics=metrics)
    _add_error_handlers(app)
    _add_routes(app)
    _document_model_name(app, name)
    return app


def _state(request: Request) -> ServerState:
    return request.app.state.server


# ----------------------------------------------------------------------------------------------------- routes


def _add_routes(app: FastAPI) -> None:
    app.post("/v1/completions", responses=_ERRORS, summary="Text completion")(completions)
    app.post("/v1/chat/completions", responses=_ERRORS, summary="Chat completion")(chat_completions)
    app.get("/v1/models", summary="The served model")(list_models)
    app.get("/v1/models/{model_id}", responses={404: {"model": ErrorResponse}}, summary="One model")(get_model)
    app.get("/health", summary="Liveness and queue state")(health)
    app.get("/metrics", summary="Prometheus metrics", response_class=Response)(metrics)


async def completions(body: CompletionRequest, request: Request) -> Response:
    """OpenAI ``POST /v1/completions``: a string or token-id prompt, streamed or not."""
    state = _state(request)
    _check_model(state, body.model)
    prompt_ids = await state.encoder.run(_encode_completion, state, body.prompt)
    spec = _job_spec(state, body, prompt_ids, body.max_tokens, "completions")
    fmt = CompletionFormat(state.model_name, state.token_texts, body.top_logprobs_count())
    return await _generate(state, request, spec, fmt, body)


async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI ``POST /v1/chat/completions``: the conversation through the chat template, streamed or not."""
    state = _state(request)
    _check_model(state, body.model)
    prompt_ids = await state.encoder.run(_encode_chat, state, body.messages)
    max_tokens = body.max_completion_tokens or body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    spec = _job_spec(state, body, prompt_ids, max_tokens, "chat", param)
    fmt = ChatFormat(state.model_name, state.token_texts, body.top_logprobs_count())
    return await _generate(state, request, spec, fmt, body)


async def list_models(request: Request) -> dict:
    """OpenAI ``GET /v1/models``: the one model this server serves."""
    return {"object": "list", "data": [_model_card(_state(request))]}


async def get_model(model_id: str, request: Request) -> dict:
    """OpenAI ``GET /v1/models/{model}``."""
    state = _state(request)
    if model_id != state.model_name:
        raise APIError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    return _model_card(state)


async def health(request: Request) -> dict:
    """Liveness, the model and drafter served, the batch and the queue."""
    state = _state(request)
    return {
        "status": "ok",
        "model": state.model_name,
        "drafter": state.runtime.drafter_spec,
        "gamma": state.runtime.engine.gamma,
        "context": state.context,
        "max_batch": state.worker.max_batch,
        "max_body_bytes": state.max_body_bytes,
        "requests_running": state.worker.running,
        "requests_waiting": state.worker.waiting,
    }


async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    return Response(_state(request).metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "specwise"}


# ----------------------------------------------------------------------------------- requests -> engine jobs


def _check_model(state: ServerState, model: str) -> None:
    if model != state.model_name:
        raise APIError(
            400,
            f"The model '{model}' does not exist: this server serves '{state.model_name}' (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )


def _encode_chat(state: ServerState, messages: list[ChatMessage]) -> list[int]:
    """The conversation's token ids (on the encoder's thread)."""
    try:
        return state.encoder.chat([m.template_dict() for m in messages])
    except Exception as err:  # the template may reject a conversation (e.g. roles that do not alternate)
        raise APIError(400, f"the chat template rejected these messages: {err}", param="messages") from err


def _encode_completion(state: ServerState, prompt: str | list[int] | list[str]) -> list[int]:
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


def sampling_params(body: SamplingRequest) -> SamplingParams:
    """The request's SamplingParams (OpenAI's defaults: temperature 1, top_p 1; top_k -1 or 0 disables)."""
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
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


def _job_spec(
    state: ServerState,
    body: SamplingRequest,
    prompt_ids: list[int],
    max_tokens: int | None,
    endpoint: str,
    max_tokens_param: str = "max_tokens",
) -> JobSpec:
    prompt_param = "messages" if endpoint == "chat" else "prompt"
    if not prompt_ids:
        raise APIError(400, "the prompt is empty: give at least one token", param=prompt_param)
    context, n = state.context, len(prompt_ids)
    if context is not None and n >= context:
        message = f"the prompt has {n} tokens but the model's context is {context}: shorten the prompt"
        raise APIError(400, message, param=prompt_param, code="context_length_exceeded")
    room = None if context is None else context - n
    params = sampling_params(body)
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
    eos = [] if body.ignore_eos else None
    options = body.logprob_options()
    return JobSpec(prompt_ids, params, max_tokens, body.stop_list(), eos, endpoint, options)


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice ``index`` of a request seeded ``seed``: ``seed + index`` (past the largest seed, it
    wraps around modulo 2**64); None stays None (each choice draws its own)."""
    if seed is None:
        return None
    seed += index
    return seed - 2**64 if seed > SEED_MAX else seed


def _choice_specs(spec: JobSpec, n: int) -> list[JobSpec]:
    """The JobSpecs of a request's ``n`` choices: ``spec`` with choice i's seed."""
    if n == 1:
        return [spec]
    return [replace(spec, params=replace(spec.params, seed=choice_seed(spec.params.seed, i))) for i in range(n)]


# ------------------------------------------------------------------------------------------------- responses


async def _generate(state: ServerState, request: Request, spec: JobSpec, fmt: ResponseFormat, body: SamplingRequest):
    """Queue the request's choices and answer: a JSON response, or (once the first tokens are out) an event
    stream."""
    group = JobGroup(_choice_specs(spec, body.n))
    try:
        state.worker.submit_all(group.jobs)
    except QueueFullError as err:
        raise APIError(429, f"the server is busy ({err}): retry later", code="queue_full", type_="server_busy") from err
    events = group.events(request.is_disconnected)
    tally = Tally(state, body.n, len(spec.prompt_ids), spec.logprobs is not None)
    handed_over = False
    try:
        first = await anext(events)  # a bad request fails here, before any byte of the response is sent
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            handed_over = True  # the streaming response cancels the choices when it ends
            return JobStreamingResponse(group, _sse(tally, fmt, first, events, include_usage))
        return JSONResponse(await _collect(tally, fmt, first, events))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    except Exception as err:
        raise _as_api_error(err) from err
    finally:
        if not handed_over:
            group.cancel()  # a no-op when they finished; stops them when the handler failed or was cancelled


class Tally:
    """A response's choices as their events come in: texts, log-probabilities, finish reasons, and the usage of
    them all (completion tokens and speculative statistics summed over the choices, the prompt counted once)."""

    def __init__(self, state: ServerState, n: int, prompt_tokens: int, logprobs: bool) -> None:
        self.state, self.n, self.prompt_tokens = state, n, prompt_tokens
        self.texts: list[list[str]] = [[] for _ in range(n)]
        self.logprobs = [[] if logprobs else None for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.stats = SpecStats()

    def add(self, index: int, event) -> None:
        """Take choice ``index``'s next event."""
        self.texts[index].append(event.text)
        if self.logprobs[index] is not None:
            self.logprobs[index].extend(event.logprobs or [])
        if event.finish_reason is not None:
            self.finish[index] = event.finish_reason
            self.stats.merge(event.stats)

    @property
    def done(self) -> bool:
        """Whether every choice has finished."""
        return all(reason is not None for reason in self.finish)

    def usage(self) -> dict:
        stats = self.stats
        stats.prompt_tokens = self.prompt_tokens
        return usage(stats, self.state.runtime.drafter_spec, self.state.runtime.engine.gamma, self.prompt_tokens)

    def choices(self) -> list[Choice]:
        return [Choice(i, "".join(self.texts[i]), self.finish[i], self.logprobs[i]) for i in range(self.n)]


async def _collect(tally: Tally, fmt: ResponseFormat, first: tuple, events) -> dict:
    tally.add(*first)
    async for index, event in events:
        tally.add(index, event)
    return fmt.response(tally.choices(), tally.usage())


async def _sse(tally: Tally, fmt: ResponseFormat, pair: tuple, events, include_usage: bool):
    """Server-sent events: a chunk per target pass and choice with new text (or log-probabilities), a chunk
    ending each choice (the last with the usage), the usage chunk if asked for, then [DONE]."""
    for chunk in fmt.first_chunks(tally.n):
        yield _data(chunk)
    try:
        while True:
            index, event = pair
            tally.add(index, event)
            if event.text or event.logprobs:
                yield _data(fmt.text_chunk(index, event.text, event.logprobs))
            if event.finish_reason is not None:
                stats = tally.usage() if tally.done else None
                yield _data(fmt.final_chunk(index, event.finish_reason, stats))
                if tally.done:
                    if include_usage:
                        yield _data(fmt.usage_chunk(stats))
                    break
            pair = await anext(events)
    except ClientDisconnected:
        return
    except Exception as err:  # after the headers: the error goes in the stream, as OpenAI does
        yield _data(_as_api_error(err).body())
    yield "data: [DONE]\n\n"


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class JobStreamingResponse(StreamingResponse):
    """An event stream that cancels its job (a Job or a JobGroup) however it ends (finished, client gone, server
    stopping)."""

    def __init__(self, job: JobGroup, content) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


def _as_api_error(err: Exception) -> APIError:
    if isinstance(err, APIError):
        return err
    if isinstance(err, ValueError):  # the engine's validation: a bad request
        return APIError(400, str(err))
    if isinstance(err, ServerStopping):
        return APIError(503, str(err), type_="server_error", code="shutting_down")
    if isinstance(err, BatchFailed):
        return APIError(500, f"generation failed: {err}", type_="server_error")
    return APIError(500, f"generation failed: {type(err).__name__}: {err}", type_="server_error")


# ---------------------------------------------------------------------------------------------------- errors

MAX_ERRORS_READ = 32  # of a validation error's list, for the message (the first names the field)
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|.*\[.*\])$")  # pydantic's union-member steps in a location


def _param(loc: tuple) -> str | None:
    """``("body", "messages", 0, "content", "str")`` -> ``"messages[0].content"``."""
    parts: list[str] = []
    for item in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not _TYPE_TAG.match(str(item)):
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or None


def _validation_message(errors: list[dict]) -> tuple[str, str | None]:
    first = errors[0]
    kind, param = first.get("type"), _param(tuple(first.get("loc", ())))
    unknown = first.get("ctx", {}).get("field") if kind == "extra_forbidden" else None
    if unknown is not None:  # found before the fields were validated: ctx has its path from the error's location
        param = f"{param or ''}{'' if unknown.startswith('[') or not param else '.'}{unknown}"
        return f"Unrecognized request argument supplied: {param}", param
    if kind == "json_invalid":
        return f"Malformed JSON body: {first.get('ctx', {}).get('error', 'could not parse it')}", None
    if param is None:
        return "The request body must be a JSON object (send it with Content-Type: application/json)", None
    if kind == "missing":
        return f"Missing required parameter: '{param}'", param
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}", param
    same = [e["msg"] for e in errors[:MAX_ERRORS_READ] if _param(tuple(e.get("loc", ()))) == param]
    return f"Invalid '{param}': {' or '.join(dict.fromkeys(same))}", param


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = _validation_message(list(exc.errors()) or [{"loc": ()}])
    return JSONResponse(APIError(400, message, param).body(), status_code=400)


async def _on_api_error(request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _unparsed_body_message(cause: BaseException | None) -> str | None:
    """What was wrong with a body that FastAPI could not read as JSON, beyond a syntax error (None: unknown)."""
    if isinstance(cause, RecursionError):
        return "Malformed JSON body: it nests arrays or objects too deeply"
    if isinstance(cause, ValueError) and "digits" in str(cause):  # Python's limit on the digits of an integer
        return "Malformed JSON body: a number has too many digits"
    if isinstance(cause, UnicodeDecodeError):
        return f"Malformed JSON body: it is not UTF-8 ({cause.reason} at byte {cause.start})"
    return None


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    message = f"{detail}: {request.method} {request.url.path}" if exc.status_code in (404, 405) else detail
    if exc.status_code == 400:
        message = _unparsed_body_message(exc.__cause__) or message
    body = APIError(exc.status_code, message, type_=kind).body()
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    body = APIError(500, f"internal error: {type(exc).__name__}: {exc}", type_="server_error").body()
    return JSONResponse(body, status_code=500)


def _add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected_error)


# ---------------------------------------------------------------------------------------------- plumbing


class HTTPMetricsMiddleware:
    """Counts HTTP requests by route template and status (a pure ASGI middleware: streams pass untouched)."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]  # an exception before the response: counted as a server error
        answered = [False]

        async def send_and_note(message) -> None:
            if message["type"] == "http.response.start":
                status[0], answered[0] = message["status"], True
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
            if not answered[0]:  # the client went away before its request could be answered
                status[0] = CLIENT_CLOSED
        finally:
            route = getattr(scope.get("route"), "path", "other")
            self.metrics.http_requests.labels(route, str(status[0])).inc()


def _document_model_name(app: FastAPI, name: str) -> None:
    """Make the OpenAPI document list the served model as the one allowed value of ``model``."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            for request_model in ("ChatCompletionRequest", "CompletionRequest"):
                prop = schema["components"]["schemas"][request_model]["properties"]["model"]
                prop["enum"] = [name]
        return app.openapi_schema

    app.openapi = openapi
