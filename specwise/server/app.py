"""The HTTP API (FastAPI): OpenAI's completions, chat completions and Responses (``apis/openai_responses.py``),
Anthropic's Messages (``apis/anthropic.py``), llama.cpp's ``/infill``, models, health and metrics. Every chat API is an
adapter over one request path (``chat.py``).

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

import time
from contextlib import asynccontextmanager

from specwise.extras import missing_extra

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

from specwise.batch import MAX_STEP_SECONDS, PREFILL_SHARE
from specwise.runtime import Runtime
from specwise.server.apis import ADAPTERS
from specwise.server.auth import APIKeyMiddleware
from specwise.server.chat import prepare_chat
from specwise.server.encoding import PromptEncoder
from specwise.server.errors import APIError, add_error_handlers
from specwise.server.infill import encode_fim_completion, fim_end_tokens, infill
from specwise.server.limits import BodyLimitMiddleware, default_max_body_bytes
from specwise.server.logprobs import TokenTexts
from specwise.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from specwise.server.parsing import (
    check_model,
    choice_requests,
    choice_seed,
    encode_completion,
    encode_prediction,
    generation_request,
    sampling_params,
)
from specwise.server.protocol import (
    ChatCompletionRequest,
    ChatFormat,
    CompletionFormat,
    CompletionRequest,
    ErrorResponse,
    ResponseFormat,
    SamplingRequest,
)
from specwise.server.responses import CLIENT_CLOSED, Tally, answer, collect, queue, sse
from specwise.server.state import ServerState, server_state
from specwise.server.worker import GenerationWorker
from specwise.step import Request as GenerationRequest
from specwise.tools import ReplyReader

__all__ = ["APIError", "ServerState", "choice_seed", "create_app", "sampling_params", "serving_app"]

_ERRORS = {400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 429: {"model": ErrorResponse}}
_ERRORS[401] = {"model": ErrorResponse}


def create_app(
    runtime: Runtime,
    *,
    model_name: str | None = None,
    max_queue: int = 64,
    default_max_tokens: int | None = None,
    max_batch: int = 16,
    max_body_bytes: int | None = None,
    api_key: str | None = None,
    reasoning_format: str = "auto",
    max_step_seconds: float | None = MAX_STEP_SECONDS,
    prefill_share: float = PREFILL_SHARE,
    cache_memory: int | None = None,
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
    reasoning_format: ``auto`` gives a thinking model's reasoning (Qwen3's ``<think>``) apart from its answer
        (``reasoning_content``, Responses' reasoning items, Messages' thinking blocks); ``none`` leaves it inline.
    max_step_seconds: the time a step in which requests decode may take while a joining prompt is read (None:
        prompts in fixed slices of 256 tokens); prefill_share: the share of the time the prompt takes meanwhile.
    cache_memory: bytes the batch's caches may hold, the finished requests' least recently used dropped past it
        (None: a quarter of the machine's memory).
    """
    if reasoning_format not in ("auto", "none"):
        raise ValueError(f"reasoning_format must be auto or none, got {reasoning_format!r}")
    if runtime.tokenizer is None:
        raise ValueError("the server needs a tokenizer: load a target that has one")
    if default_max_tokens is not None and default_max_tokens < 1:
        raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
    if max_body_bytes is None:
        max_body_bytes = default_max_body_bytes(runtime.engine.target.max_length)
    metrics = ServerMetrics()
    worker = GenerationWorker(
        runtime.engine,
        metrics,
        max_queue,
        max_batch,
        max_step_seconds=max_step_seconds,
        prefill_share=prefill_share,
        cache_memory=cache_memory,
    )
    name = model_name or runtime.target.name
    encoder = PromptEncoder(runtime.tokenizer)
    texts = TokenTexts(runtime.tokenizer)
    created = int(time.time())
    state = ServerState(
        runtime, name, worker, metrics, default_max_tokens, encoder, max_body_bytes, created, texts, reasoning_format
    )

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
    add_error_handlers(app)
    _add_routes(app)
    _document_model_name(app, name)
    return app


# ----------------------------------------------------------------------------------------------------- routes


def _add_routes(app: FastAPI) -> None:
    app.post("/v1/completions", responses=_ERRORS, summary="Text completion")(completions)
    app.post("/v1/chat/completions", responses=_ERRORS, summary="Chat completion")(chat_completions)
    app.post("/infill", responses=_ERRORS, summary="Fill in the middle (llama.cpp's /infill)")(infill)
    app.get("/v1/models", summary="The served model")(list_models)
    app.get("/v1/models/{model_id}", responses={404: {"model": ErrorResponse}}, summary="One model")(get_model)
    app.get("/health", summary="Liveness and queue state")(health)
    app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)(root)  # a probe (Claude Code: HEAD /)
    app.get("/metrics", summary="Prometheus metrics", response_class=Response)(metrics)
    for adapter in ADAPTERS:
        adapter.add_routes(app)


async def completions(body: CompletionRequest, request: Request) -> Response:
    """OpenAI ``POST /v1/completions``: a string or token-id prompt, streamed or not."""
    state = server_state(request)
    check_model(state, body.model)
    if body.suffix:  # fill in the middle (infill.py): the prompt is the text before the cursor, the suffix after
        prompt_ids = await state.encoder.run(encode_fim_completion, state, body)
    else:
        prompt_ids = await state.encoder.run(encode_completion, state, body.prompt)
    prediction = None if body.prediction is None else await state.encoder.run(encode_prediction, state, body.prediction)
    end = fim_end_tokens(state) if body.suffix else None  # a middle ends at the FIM stop tokens too
    generation = generation_request(
        state, body, prompt_ids, body.max_tokens, "completions", prediction=prediction, end_tokens=end
    )
    fmt = CompletionFormat(state.model_name, state.token_texts, body.top_logprobs_count())
    return await _generate(state, request, generation, "completions", fmt, body)


async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI ``POST /v1/chat/completions``: the conversation through the chat template, streamed or not."""
    state = server_state(request)
    check_model(state, body.model)
    job = await prepare_chat(state, body)
    fmt = ChatFormat(state.model_name, state.token_texts, body.top_logprobs_count())
    return await _generate(state, request, job.request, job.endpoint, fmt, body, job.readers(state))


async def list_models(request: Request) -> dict:
    """OpenAI ``GET /v1/models``: the one model this server serves."""
    return {"object": "list", "data": [_model_card(server_state(request))]}


async def get_model(model_id: str, request: Request) -> dict:
    """OpenAI ``GET /v1/models/{model}``."""
    state = server_state(request)
    if model_id != state.model_name:
        raise APIError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    return _model_card(state)


async def root(request: Request) -> dict:
    """``GET /`` and ``HEAD /``: 200 with the served model, for clients that probe the base URL before their first
    request (Claude Code sends ``HEAD /``)."""
    return {"status": "ok", "model": server_state(request).model_name}


async def health(request: Request) -> dict:
    """Liveness, the model and drafter served, the batch and the queue."""
    state = server_state(request)
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
    return Response(server_state(request).metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "specwise"}


async def _generate(
    state: ServerState,
    request: Request,
    generation: GenerationRequest,
    endpoint: str,
    fmt: ResponseFormat,
    body: SamplingRequest,
    readers: list[ReplyReader] | None = None,
):
    """Queue the request's choices (``generation``, one per choice) and answer: a JSON response, or (once the first
    tokens are out) an event stream. ``readers``: each choice's tool-call reader (None: the text is all content)."""
    group = queue(state, choice_requests(generation, body.n), endpoint)
    events = group.events(request.is_disconnected)
    tally = Tally(state, body.n, len(generation.prompt_ids), generation.logprobs is not None, readers)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return await answer(
        group,
        events,
        body.stream,
        lambda first: sse(tally, fmt, first, events, include_usage),
        lambda first: collect(tally, fmt, first, events),
    )


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


def serving_app(runtime, options, key: str | None):
    """The server's app for ``runtime`` with the serving options of ``specwise serve`` (``options``: its parsed
    arguments, or anything with the same attributes), shared by one server and the replicas of ``--ray``."""
    return create_app(
        runtime,
        model_name=options.served_model_name,
        max_queue=options.max_queue,
        default_max_tokens=options.default_max_tokens,
        max_batch=options.max_batch,
        max_body_bytes=options.max_body_bytes,
        api_key=key,
        reasoning_format=getattr(options, "reasoning_format", "auto"),
        max_step_seconds=getattr(options, "max_step_seconds", MAX_STEP_SECONDS),
        prefill_share=getattr(options, "prefill_share", PREFILL_SHARE),
        cache_memory=getattr(options, "cache_memory", None),
    )
