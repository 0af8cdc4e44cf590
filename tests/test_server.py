"""The OpenAI-compatible server: the official openai client against a live server on 127.0.0.1, streaming,
speculative statistics in usage, exactness, errors, continuous batching (every answer equal to the one the same
request gets alone), disconnects, metrics, CLI and a schema fuzz.

The model is a tiny random Llama with the default model's tokenizer and a 128-token context, run on one
thread here (the machines are shared and small). Every live server listens on 127.0.0.1 only.
"""

# ruff: noqa: E402
from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

# the server extra (fastapi, uvicorn) and the clients the tests speak through (httpx, openai: the dev tools)
for _module in ("fastapi", "uvicorn", "httpx", "openai"):
    pytest.importorskip(_module, reason="needs the server extra and httpx, openai: pip install 'specwise[server,dev]'")

import httpx
import openai
import uvicorn
from fastapi.testclient import TestClient

from conftest import tiny_llama
from specwise.cli import main
from specwise.drafters import Drafter, NgramDrafter, NoDrafter
from specwise.engine import Engine
from specwise.runtime import Runtime, build_runtime, encode_chat, encode_prompt
from specwise.sampling import SamplingParams
from specwise.server.app import create_app, sampling_params
from specwise.server.metrics import ServerMetrics
from specwise.server.protocol import ChatCompletionRequest
from specwise.server.worker import GenerationWorker, Job, ServerStopping
from specwise.step import Request

MODEL = "tiny"
CONTEXT = 128
TIMEOUT = 60.0
SPECULATIVE_FIELDS = {"drafter", "gamma", "drafted", "accepted", "acceptance_rate", "mean_accepted_length"}
SPECULATIVE_FIELDS |= {"target_passes", "acceptance_by_position", "new_tokens", "prompt_tokens"}
CHATS = ["Say something.", "Name three primary colors.", "Count: one two three one two three"]
IGNORE_EOS = {"extra_body": {"ignore_eos": True}}  # for the openai client: the whole budget, a known length


# ------------------------------------------------------------------------------------------------ fixtures


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_server_dir(tmp_path_factory, smollm) -> str:
    """A tiny random Llama with the default model's tokenizer and a 128-token context, saved as a directory."""
    path = tmp_path_factory.mktemp("tiny-server")
    model = tiny_llama(seed=3, vocab=smollm.model.vocab_size, hidden=16, layers=1)
    model.config.max_position_embeddings = CONTEXT
    model.save_pretrained(path)
    smollm.tokenizer.save_pretrained(path)
    return str(path)


class Throttle:
    """What the ThrottledDrafter of a server and all its forks share: a delay per proposal, and a failure to raise."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.fail: Exception | None = None  # raised by the next proposal (once)


class ThrottledDrafter(Drafter):
    """Wraps a drafter; ``delay`` seconds per proposal make generations long enough to interrupt."""

    def __init__(self, inner: Drafter) -> None:
        self.inner, self.name, self.throttle = inner, inner.name, Throttle()

    @property
    def delay(self) -> float:
        return self.throttle.delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        self.throttle.delay = seconds

    def _forked(self, target) -> None:
        self.inner = self.inner.fork(target)  # the throttle stays shared

    def begin(self, prompt: list[int]) -> None:
        self.inner.begin(prompt)

    def propose(self, context, k, params, generator, stop=0.0):
        time.sleep(self.throttle.delay)
        fail, self.throttle.fail = self.throttle.fail, None
        if fail is not None:
            raise fail
        return self.inner.propose(context, k, params, generator, stop)


@contextmanager
def live_server(app, **config) -> Iterator[str]:
    """Run ``app`` with uvicorn on 127.0.0.1 (a free port) in a thread; yields its base URL. ``config``: more
    ``uvicorn.Config`` arguments."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = {"log_level": "warning", "timeout_graceful_shutdown": 2} | config
    server = uvicorn.Server(uvicorn.Config(app, **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), timeout=30)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


def throttled_runtime(tiny_server_dir) -> tuple[Runtime, ThrottledDrafter]:
    runtime = build_runtime(tiny_server_dir, "ngram", 4, "cpu")
    [inner] = runtime.engine.drafters
    drafter = ThrottledDrafter(inner)
    runtime.engine.drafters = [drafter]
    return runtime, drafter


@pytest.fixture(scope="module")
def served(tiny_server_dir):
    """A live server with the ngram drafter (throttle-able) batching up to 8 requests; yields (base URL, app,
    drafter)."""
    runtime, drafter = throttled_runtime(tiny_server_dir)
    app = create_app(runtime, model_name=MODEL)
    with live_server(app) as url:
        yield url, app, drafter


@pytest.fixture(scope="module")
def solo(tiny_server_dir):
    """The same server running one request at a time (max_batch 1): the answers requests get alone."""
    runtime, drafter = throttled_runtime(tiny_server_dir)
    app = create_app(runtime, model_name=MODEL, max_batch=1)
    with live_server(app) as url:
        yield url, app, drafter


@pytest.fixture(scope="module")
def url(served) -> str:
    return served[0]


@pytest.fixture(scope="module")
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def plain_app(tiny_server_dir):
    """The same model without speculation (drafter none), in-process."""
    app = create_app(build_runtime(tiny_server_dir, "none", 4, "cpu"), model_name=MODEL)
    with TestClient(app) as test_client:
        yield test_client


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for a condition")
        time.sleep(0.02)


def sample(app, name: str, **labels) -> float:
    return app.state.server.metrics.registry.get_sample_value(name, labels) or 0.0


def chat_body(content: str, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


def async_api(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


async def answer(api: openai.AsyncOpenAI, body: dict, on_first: Callable[[], None] | None = None) -> tuple:
    """(text, completion tokens, finish reason) of a chat request through the openai client, streamed (``stream``
    in ``body``) or not; ``on_first`` is called when the first chunk arrives."""
    if not body.get("stream"):
        reply = await api.chat.completions.create(**body)
        return reply.choices[0].message.content, reply.usage.completion_tokens, reply.choices[0].finish_reason
    chunks = []
    async for chunk in await api.chat.completions.create(**body, stream_options={"include_usage": True}):
        if not chunks and on_first is not None:
            on_first()
        chunks.append(chunk)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
    return text, chunks[-1].usage.completion_tokens, finish


def solo_answers(url: str, bodies: list[dict]) -> list[tuple]:
    """Each request's answer when it is sent alone (one after another)."""

    async def run() -> list[tuple]:
        async with async_api(url) as api:
            return [await answer(api, body) for body in bodies]

    return asyncio.run(run())


def shared_passes(app) -> float:
    """Target passes so far that more than one sequence shared."""
    return sample(app, "specwise_batch_size_count") - sample(app, "specwise_batch_size_bucket", le="1.0")


# ------------------------------------------------------------------------------- the openai client, live


def test_models_and_health(client, url):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(f"{url}/health", timeout=TIMEOUT).json()
    assert health["status"] == "ok" and health["model"] == MODEL and health["context"] == CONTEXT
    assert health["drafter"] == "ngram" and health["gamma"] == 4
    assert health["max_batch"] == 16 and health["requests_running"] == 0 and health["requests_waiting"] == 0
    assert health["max_body_bytes"] == 1024 * 1024  # the least default (a 128-token context asks for less)


def test_chat_completion_carries_speculative_usage(client, plain_app):
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": CHATS[0]}], max_tokens=24, temperature=0
    )
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == MODEL
    assert choice.message.role == "assistant" and choice.finish_reason in {"stop", "length"}
    spec = reply.usage.speculative
    assert set(spec) >= SPECULATIVE_FIELDS and spec["drafter"] == "ngram"
    assert reply.usage.completion_tokens == spec["new_tokens"] <= 24
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    # the same as the engine run directly (the in-process app is idle)
    runtime = plain_app.app.state.server.runtime
    ids = encode_chat(runtime.tokenizer, [{"role": "user", "content": CHATS[0]}])
    assert reply.usage.prompt_tokens == len(ids)
    assert choice.message.content == runtime.engine.generate(ids, SamplingParams(), 24).text


def test_text_completion_with_a_string_and_with_token_ids(client, plain_app):
    first = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0)
    assert first.object == "text_completion" and first.usage.completion_tokens <= 12
    assert set(first.usage.speculative) >= SPECULATIVE_FIELDS
    ids = encode_prompt(plain_app.app.state.server.runtime.tokenizer, "Once upon a time", chat=False)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == first.choices[0].text
    default = client.completions.create(model=MODEL, prompt="Once upon a time", temperature=0)
    assert default.usage.completion_tokens <= 16  # OpenAI's default max_tokens for completions


def test_streaming_chat_equals_non_streaming_and_ends_with_usage(client):
    kw = {"model": MODEL, "messages": [{"role": "user", "content": CHATS[1]}], "max_tokens": 30}
    kw |= {"temperature": 0.9, "top_p": 0.95, "seed": 11}
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert final.choices[0].finish_reason == whole.choices[0].finish_reason
    assert final.usage.completion_tokens == whole.usage.completion_tokens
    assert set(final.usage.speculative) >= SPECULATIVE_FIELDS
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks if c.choices and not c.choices[0].finish_reason)


def test_streaming_completion(client):
    kw = {"model": MODEL, "prompt": "The weather today", "max_tokens": 20, "temperature": 0}
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage.speculative["new_tokens"] == whole.usage.completion_tokens


def test_sampling_parameters_seed_and_stop(client):
    kw = {"model": MODEL, "messages": [{"role": "user", "content": CHATS[2]}], "max_tokens": 40, "seed": 5}
    kw |= {"temperature": 0.8, "top_p": 0.9, "extra_body": {"top_k": 50, "min_p": 0.05, "ignore_eos": True}}
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content  # seeded runs repeat
    text = a.choices[0].message.content
    assert a.usage.completion_tokens == 40 and len(text) > 12  # ignore_eos: the whole budget
    stop = text[8:12]
    cut = client.chat.completions.create(**kw | {"stop": [stop, "\x00never"]})
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].message.content and text.startswith(cut.choices[0].message.content)


def test_a_vanishing_top_p_keeps_only_the_top_token(client):
    """A fuzzer's top_p of 1e-200 once became 0 in float32, dropped every token and failed with HTTP 500."""
    kw = {"model": MODEL, "messages": [{"role": "user", "content": CHATS[0]}], "max_tokens": 16}
    greedy = client.chat.completions.create(**kw, temperature=0)
    tiny = client.chat.completions.create(**kw, temperature=0.7, top_p=1e-200, seed=1)
    assert tiny.choices[0].message.content == greedy.choices[0].message.content


def test_sampling_params_map_onto_sampling_params():
    def params(**kw) -> SamplingParams:
        return sampling_params(ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": "x"}], **kw))

    assert params() == SamplingParams(temperature=1.0)  # OpenAI's default temperature
    assert params(temperature=0.5, top_p=0.9, top_k=7, min_p=0.1, seed=3) == SamplingParams(0.5, 7, 0.9, 0.1, 3)
    assert params(temperature=0, top_k=-1).top_k == 0 and params(temperature=0).greedy


def test_default_chat_budget_is_the_rest_of_the_context(client):
    kw = {"model": MODEL, "messages": [{"role": "user", "content": CHATS[0]}], "temperature": 0}
    reply = client.chat.completions.create(**kw, extra_body={"ignore_eos": True})
    assert reply.usage.total_tokens == CONTEXT and reply.choices[0].finish_reason == "length"


# ---------------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("content", CHATS)
def test_speculation_does_not_change_greedy_output(client, plain_app, content):
    body = chat_body(content, max_tokens=48, temperature=0)
    plain = plain_app.post("/v1/chat/completions", json=body).json()
    spec = client.chat.completions.create(**body)
    assert spec.choices[0].message.content == plain["choices"][0]["message"]["content"]
    assert spec.usage.completion_tokens == plain["usage"]["completion_tokens"]
    assert plain["usage"]["speculative"]["drafted"] == 0


def test_a_drafter_equal_to_the_target_is_always_accepted_and_changes_nothing(tiny_server_dir, plain_app):
    body = chat_body(CHATS[1], max_tokens=32, temperature=0)
    app = create_app(build_runtime(tiny_server_dir, f"model:{tiny_server_dir}", 3, "cpu"), model_name=MODEL)
    with TestClient(app) as same:
        reply = same.post("/v1/chat/completions", json=body).json()
    spec = reply["usage"]["speculative"]
    assert spec["drafted"] > 0 and spec["acceptance_rate"] == 1.0 and spec["mean_accepted_length"] > 1
    plain = plain_app.post("/v1/chat/completions", json=body).json()
    assert reply["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]


# ------------------------------------------------------------------------------------------------- errors

BAD_REQUESTS = [
    ("chat", chat_body("hi") | {"model": "gpt-4"}, "model"),
    ("chat", {"model": MODEL}, "messages"),
    ("chat", {"model": MODEL, "messages": []}, "messages"),
    ("chat", {"model": MODEL, "messages": [{"role": "user"}]}, "messages[0].content"),
    ("chat", {"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ("chat", {"model": MODEL, "messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ("chat", chat_body("hi", max_tokens=0), "max_tokens"),
    ("chat", chat_body("hi", max_tokens=-3), "max_tokens"),
    ("chat", chat_body("hi", max_tokens=CONTEXT), "max_tokens"),
    ("chat", chat_body("hi", max_completion_tokens=10**30), "max_completion_tokens"),
    ("chat", chat_body("hi", temperature=-0.1), "temperature"),
    ("chat", chat_body("hi", top_p=0), "top_p"),
    ("chat", chat_body("hi", top_p=1.5), "top_p"),
    ("chat", chat_body("hi", min_p=1), "min_p"),
    ("chat", chat_body("hi", top_k=-2), "top_k"),
    ("chat", chat_body("hi", seed=2**64), "seed"),
    ("chat", chat_body("hi", n=17), "n"),
    ("chat", chat_body("hi", presence_penalty=0.5), "presence_penalty"),
    ("chat", chat_body("hi", stop=["x"] * 17), "stop"),
    ("chat", chat_body("word " * CONTEXT), "messages"),
    ("chat", chat_body("hi", temperatur=0.5), "temperatur"),
    ("completions", {"model": MODEL, "prompt": "word " * CONTEXT}, "prompt"),
    ("completions", {"model": MODEL, "prompt": ""}, "prompt"),
    ("completions", {"model": MODEL, "prompt": [1, 2, 10**6]}, "prompt"),
    ("completions", {"model": MODEL, "prompt": ["a", "b"]}, "prompt"),
    ("completions", {"model": MODEL, "prompt": 5}, "prompt"),
    ("completions", {"model": MODEL, "prompt": "hi", "echo": True}, "echo"),
    ("completions", {"model": "nope", "prompt": "hi"}, "model"),
]


@pytest.mark.parametrize(("endpoint", "body", "param"), BAD_REQUESTS, ids=[p for *_, p in BAD_REQUESTS])
def test_bad_requests_get_400_naming_the_field(plain_app, endpoint, body, param):
    response = plain_app.post(f"/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.parametrize(
    ("content", "headers"),
    [(b'{"model": "tiny", "messages": [', {"content-type": "application/json"}), (b"[1, 2]", {}), (b"", {})]
    + [(b"\xff\xfe", {"content-type": "application/json"}), (b'{"model": NaN}', {"content-type": "application/json"})],
)
def test_malformed_bodies_get_400(plain_app, content, headers):
    response = plain_app.post("/v1/chat/completions", content=content, headers=headers)
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_unknown_routes_and_methods_get_openai_style_errors(plain_app):
    assert plain_app.get("/v1/nothing").json()["error"]["message"] == "Not Found: GET /v1/nothing"
    response = plain_app.get("/v1/chat/completions")
    assert response.status_code == 405 and "error" in response.json()
    assert plain_app.get("/v1/models/other").status_code == 404


def test_errors_through_the_openai_client_and_the_server_keeps_serving(client):
    cases = [
        ({"model": "gpt-4o"}, "model"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 2}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10_000}, "max_tokens"),
        ({"messages": []}, "messages"),
    ]
    for change, param in cases:
        kw = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4} | change
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(**kw)
        assert info.value.status_code == 400 and info.value.param == param
        with pytest.raises(openai.BadRequestError):
            list(client.chat.completions.create(**kw, stream=True))
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert reply.usage.completion_tokens >= 1


# ----------------------------------------------------------------------------------------------- concurrency


def test_eight_concurrent_clients_share_passes_and_each_get_their_solo_answer(served, solo):
    """Greedy and seeded sampled, streamed and not: every answer is the one the same request gets alone."""
    url, app, drafter = served
    bodies = []
    for i in range(8):
        sampled = {"temperature": 0.9, "seed": i} if i >= 4 else {"temperature": 0}
        bodies.append(chat_body(CHATS[i % 3], max_tokens=16 + 2 * i, stream=i % 2 == 1, **sampled))
    alone = solo_answers(solo[0], bodies)

    async def together() -> list[tuple]:
        async with async_api(url) as api:
            return await asyncio.wait_for(asyncio.gather(*(answer(api, body) for body in bodies)), TIMEOUT)

    shared = shared_passes(app)
    drafter.delay = 0.005  # long enough for all eight to overlap
    try:
        assert asyncio.run(together()) == alone
    finally:
        drafter.delay = 0.0
    assert shared_passes(app) > shared  # the requests did share target passes
    assert len({text for text, *_ in alone}) > 2  # the requests differ, so mixed-up answers would show
    assert solo_answers(url, bodies) == alone  # and sent alone to the batching server


def test_requests_join_and_leave_a_running_batch(served, solo):
    """A request joins while others stream and a streaming client hangs up; the others finish as if alone."""
    url, app, drafter = served
    bodies = [
        chat_body(CHATS[0], max_tokens=40, temperature=0, stream=True, **IGNORE_EOS),
        chat_body(CHATS[1], max_tokens=30, temperature=0.9, seed=7, **IGNORE_EOS),
        chat_body(CHATS[2], max_tokens=16, temperature=0.9, seed=3, stream=True),  # joins the two above
    ]
    leaving = chat_body(CHATS[2], max_tokens=80, temperature=0, stream=True, **IGNORE_EOS)
    alone = solo_answers(solo[0], bodies)
    cancelled = sample(app, "specwise_requests_total", endpoint="chat", outcome="cancelled")

    async def leave(api: openai.AsyncOpenAI) -> None:
        stream = await api.chat.completions.create(**leaving)
        chunks = 0
        async for _ in stream:
            chunks += 1
            if chunks == 3:
                break
        await stream.close()  # hang up mid-stream

    async def scenario() -> list[tuple]:
        async with async_api(url) as api:
            streaming = asyncio.Event()
            first = asyncio.create_task(answer(api, bodies[0], on_first=streaming.set))
            others = [asyncio.create_task(answer(api, bodies[1])), asyncio.create_task(leave(api))]
            await streaming.wait()
            assert not first.done()
            joining = asyncio.create_task(answer(api, bodies[2]))
            return await asyncio.wait_for(asyncio.gather(first, others[0], joining, others[1]), TIMEOUT)

    drafter.delay = 0.02
    try:
        got = asyncio.run(scenario())
    finally:
        drafter.delay = 0.0
    assert got[:3] == alone
    wait_until(lambda: sample(app, "specwise_requests_total", endpoint="chat", outcome="cancelled") > cancelled)
    wait_until(lambda: app.state.server.worker.running == 0)


def test_a_bad_request_while_others_stream_gets_its_400_and_they_finish(served, solo):
    url, app, drafter = served
    worker, vocab = app.state.server.worker, app.state.server.runtime.engine.target.vocab_size
    bodies = [
        chat_body(CHATS[0], max_tokens=30, temperature=0, stream=True, **IGNORE_EOS),
        chat_body(CHATS[1], max_tokens=30, temperature=0.9, seed=2, stream=True, **IGNORE_EOS),
    ]
    alone = solo_answers(solo[0], bodies)
    errors = sample(app, "specwise_requests_total", endpoint="completions", outcome="error")

    async def scenario() -> tuple:
        async with async_api(url) as api:
            streaming = asyncio.Event()
            tasks = [asyncio.create_task(answer(api, bodies[0], on_first=streaming.set))]
            tasks.append(asyncio.create_task(answer(api, bodies[1])))
            await streaming.wait()
            with pytest.raises(openai.BadRequestError) as bad_token:
                await api.completions.create(model=MODEL, prompt=[1, 2, vocab], max_tokens=4)
            with pytest.raises(openai.BadRequestError) as too_long:
                await api.completions.create(model=MODEL, prompt="word " * CONTEXT, max_tokens=4, stream=True)
            # a request that fails only once in the batch (its logits overflow at this temperature) fails alone
            with pytest.raises(openai.BadRequestError) as overflow:
                await api.chat.completions.create(**chat_body("hi", max_tokens=4, temperature=1e-160))
            # past the HTTP layer's checks, the engine's own: the error comes back on the job at once
            job = Job(Request([1] * CONTEXT, SamplingParams(), 4))
            worker.submit(job)
            with pytest.raises(ValueError, match=f"the prompt has {CONTEXT} tokens but the model's context is"):
                _ = [event async for event in job.events()]
            assert not any(task.done() for task in tasks)
            errors = bad_token.value, too_long.value, overflow.value
            return *errors, await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT)

    drafter.delay = 0.02
    try:
        bad_token, too_long, overflow, got = asyncio.run(scenario())
    finally:
        drafter.delay = 0.0
    assert got == alone
    assert bad_token.status_code == 400 and bad_token.param == "prompt"
    assert bad_token.body["message"] == f"token id {vocab} is outside the vocabulary (0..{vocab - 1})"
    assert too_long.status_code == 400 and too_long.code == "context_length_exceeded"
    assert too_long.body["message"].endswith(f"but the model's context is {CONTEXT}: shorten the prompt")
    assert overflow.status_code == 400
    assert overflow.body["message"] == "logits overflow at temperature 1e-160: use a larger temperature"
    assert sample(app, "specwise_requests_total", endpoint="completions", outcome="error") == errors + 1


def test_a_failing_step_fails_its_batch_and_the_server_goes_on(served, solo):
    url, app, drafter = served
    worker = app.state.server.worker
    streamed = chat_body(CHATS[0], max_tokens=60, temperature=0, stream=True, ignore_eos=True)
    whole = chat_body(CHATS[1], max_tokens=60, temperature=0, ignore_eos=True)
    errors = sample(app, "specwise_requests_total", endpoint="chat", outcome="error")

    async def scenario() -> tuple[list[str], httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as http:
            other = asyncio.create_task(http.post("/v1/chat/completions", json=whole))
            async with http.stream("POST", "/v1/chat/completions", json=streamed) as response:
                lines = response.aiter_lines()
                data = [await anext(lines)]  # the role chunk: the request's first pass is done
                await asyncio.to_thread(wait_until, lambda: worker.running == 2)
                health = (await http.get("/health")).json()
                assert health["requests_running"] == 2 and health["max_batch"] == 16
                drafter.throttle.fail = RuntimeError("the drafter broke")
                data += [line async for line in lines if line.startswith("data:")]
            return data, await other

    drafter.delay = 0.02
    try:
        data, other = asyncio.run(scenario())
    finally:
        drafter.delay, drafter.throttle.fail = 0.0, None
    message = "generation failed: RuntimeError: the drafter broke"
    error = json.loads(data[-2].removeprefix("data: "))["error"]
    assert error["message"] == message and error["type"] == "server_error" and data[-1] == "data: [DONE]"
    assert other.status_code == 500 and other.json()["error"]["message"] == message
    assert sample(app, "specwise_requests_total", endpoint="chat", outcome="error") == errors + 2
    wait_until(lambda: worker.running == 0)
    body = chat_body(CHATS[2], max_tokens=20, temperature=0.9, seed=4)
    assert solo_answers(url, [body, body | {"temperature": 0}]) == solo_answers(
        solo[0], [body, body | {"temperature": 0}]
    )


def test_a_client_that_disconnects_mid_stream_frees_its_work(served):
    url, app, drafter = served
    before = sample(app, "specwise_requests_total", endpoint="chat", outcome="cancelled")
    tokens_before = sample(app, "specwise_generation_tokens_total")
    drafter.delay = 0.05  # about 5 s for the whole budget
    try:
        body = chat_body(CHATS[0], temperature=0, stream=True, ignore_eos=True)
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as response:
            data = []
            for line in response.iter_lines():
                data += [line] if line.startswith("data:") else []
                if len(data) >= 3:  # the role chunk and two pieces of text: then hang up
                    break
        started = time.monotonic()
        wait_until(lambda: sample(app, "specwise_requests_total", endpoint="chat", outcome="cancelled") > before)
        wait_until(lambda: app.state.server.worker.running == 0)
        assert time.monotonic() - started < 2.0
        room = CONTEXT - len(encode_chat(app.state.server.encoder.tokenizer, body["messages"]))
        assert sample(app, "specwise_generation_tokens_total") - tokens_before < room / 2
    finally:
        drafter.delay = 0.0
    reply = httpx.post(f"{url}/v1/chat/completions", json=chat_body("hi", max_tokens=4), timeout=TIMEOUT)
    assert reply.status_code == 200


def test_a_non_streaming_client_that_times_out_frees_its_work(served):
    url, app, drafter = served
    before = sample(app, "specwise_requests_total", endpoint="completions", outcome="cancelled")
    drafter.delay = 0.05
    try:
        body = {"model": MODEL, "prompt": "Once", "max_tokens": 100, "temperature": 0, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json=body, timeout=0.5)
        wait_until(lambda: sample(app, "specwise_requests_total", endpoint="completions", outcome="cancelled") > before)
        wait_until(lambda: app.state.server.worker.running == 0)
    finally:
        drafter.delay = 0.0


def test_one_at_a_time_with_max_batch_1_and_a_full_queue_answers_429_then_recovers(solo):
    url, app, drafter = solo
    worker = app.state.server.worker
    body = {"model": MODEL, "prompt": "Once", "max_tokens": 60, "temperature": 0, "ignore_eos": True}

    async def scenario() -> httpx.Response:
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as http:
            running = asyncio.create_task(http.post("/v1/completions", json=body))
            await asyncio.to_thread(wait_until, lambda: worker.running == 1)
            waiting = asyncio.create_task(http.post("/v1/completions", json=body))
            await asyncio.to_thread(wait_until, lambda: worker.waiting == 1)
            refused = await http.post("/v1/completions", json=body)
            running.cancel()
            waiting.cancel()
            await asyncio.gather(running, waiting, return_exceptions=True)
            return refused

    drafter.delay, worker.max_queue = 0.05, 1
    try:
        refused = asyncio.run(scenario())
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
        wait_until(lambda: worker.running == 0 and worker.waiting == 0)
    finally:
        drafter.delay, worker.max_queue = 0.0, 64
    ok = httpx.post(f"{url}/v1/completions", json=body | {"max_tokens": 2}, timeout=TIMEOUT)
    assert ok.status_code == 200
    assert httpx.get(f"{url}/health", timeout=TIMEOUT).json()["max_batch"] == 1
    assert sample(app, "specwise_batch_size_count") > 0 and shared_passes(app) == 0  # never two in a pass


def test_stopping_fails_the_running_and_the_queued_jobs(tiny_server_dir):
    runtime, drafter = throttled_runtime(tiny_server_dir)
    drafter.delay = 0.05
    worker = GenerationWorker(runtime.engine, ServerMetrics(), max_queue=4, max_batch=1)

    async def scenario() -> None:
        jobs = [Job(Request([1, 2, 3], SamplingParams(), 100, eos_token_ids=[])) for _ in range(2)]
        for job in jobs:
            worker.submit(job)
        running = jobs[0].events()
        await anext(running)
        assert worker.running == 1 and worker.waiting == 1
        await asyncio.to_thread(worker.stop)
        assert not worker.alive
        for events in [running, jobs[1].events()]:
            with pytest.raises(ServerStopping, match="shutting down"):
                _ = [event async for event in events]

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT))


def test_max_batch_must_be_at_least_1(plain_app):
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1, got 0"):
        create_app(plain_app.app.state.server.runtime, model_name=MODEL, max_batch=0)


# ------------------------------------------------------------------------------------------------- metrics


def test_metrics_count_requests_tokens_speculation_and_latency(plain_app, served, client):
    url, app, _ = served
    names = ["specwise_batch_passes_total", "specwise_batch_rows_sum", "specwise_batch_step_seconds_total"]
    before = {name: sample(app, name) for name in [*names, "specwise_batch_pass_seconds_total"]}
    reply = client.chat.completions.create(**chat_body(CHATS[2], max_tokens=16, temperature=0))
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    for name in [
        'specwise_requests_total{endpoint="chat",outcome=',
        'specwise_http_requests_total{route="/v1/chat/completions",status="200"}',
        "specwise_prompt_tokens_total",
        "specwise_generation_tokens_total",
        "specwise_drafted_tokens_total",
        "specwise_accepted_tokens_total",
        'specwise_drafted_tokens_by_position_total{position="0"}',
        'specwise_accepted_tokens_by_position_total{position="0"}',
        'specwise_acceptance_rate_by_position{position="0"}',
        "specwise_acceptance_rate ",
        "specwise_mean_accepted_length ",
        'specwise_request_latency_seconds_bucket{endpoint="chat",le="0.5"}',
        "specwise_time_to_first_token_seconds_count",
        "specwise_time_per_output_token_seconds_count",
        "specwise_queue_time_seconds_count",
        "specwise_requests_waiting",
        "specwise_requests_running",
        "specwise_batch_passes_total",
        'specwise_batch_size_bucket{le="1.0"}',
        'specwise_batch_rows_bucket{le="8.0"}',
        "specwise_batch_sequences_running",
    ]:
        assert name in text, name
    # alone in the batch: a pass for the prompt (but what an earlier request's cache held: the chat template's
    # system prompt), then the request's own passes with their drafted rows
    spec = reply.usage.speculative
    cached = spec["cached_tokens"]
    assert reply.usage.prompt_tokens_details.cached_tokens == cached
    prefill = spec["prompt_tokens"] - 1 - cached
    passes = sample(app, "specwise_batch_passes_total") - before["specwise_batch_passes_total"]
    rows = sample(app, "specwise_batch_rows_sum") - before["specwise_batch_rows_sum"]
    assert passes == (prefill > 0) + spec["target_passes"]
    assert rows == prefill + spec["target_passes"] + spec["drafted"]
    assert sample(app, "specwise_batch_sequences_running") == 0
    # where the steps' time went: in the passes, and around them in each sequence's planning and verification
    step = sample(app, "specwise_batch_step_seconds_total") - before["specwise_batch_step_seconds_total"]
    in_pass = sample(app, "specwise_batch_pass_seconds_total") - before["specwise_batch_pass_seconds_total"]
    assert 0 < in_pass < step
    drafted = float(re.search(r"^specwise_drafted_tokens_total (\S+)$", text, re.M).group(1))
    assert drafted > 0
    plain_app.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 0})
    plain = plain_app.get("/metrics").text
    assert 'specwise_http_requests_total{route="/v1/completions",status="400"}' in plain


# ----------------------------------------------------------------------------------------------- fuzzing


def fuzz(operation, mode, url: str, examples: int = 25) -> list[int]:
    """Send ``examples`` schemathesis cases for one operation; fail on a 5xx; return the status codes seen."""
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    seen: list[int] = []

    # derandomized: the same cases every run (the schema's many optional fields make a 200 among random cases a matter
    # of luck; a fixed draw either finds one or fails every time)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        response = case.call(base_url=url, timeout=TIMEOUT)
        seen.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    run()
    return seen


@pytest.fixture
def hypothesis_home(tmp_path):
    """Keep Hypothesis's cache out of the working tree."""
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(tmp_path / "hypothesis")
    yield
    set_hypothesis_home_dir(None)


def test_schema_driven_fuzzing_finds_no_server_error(url, hypothesis_home):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis.errors import Unsatisfiable

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", timeout=TIMEOUT)
    statuses: dict[str, list[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]:
            try:
                statuses[f"{operation.method.upper()} {operation.path} {mode.value}"] = fuzz(operation, mode, url)
            except Unsatisfiable:  # nothing to break in an operation without a body (GET /health, DELETE by id)
                assert mode is schemathesis.GenerationMode.NEGATIVE and operation.method.upper() in ("GET", "DELETE")
    posts = {key: codes for key, codes in statuses.items() if key.startswith("POST")}
    assert len(posts) >= 6 and all(len(codes) >= 10 for codes in posts.values()), statuses  # each route, 2 modes
    assert any(200 in codes for codes in posts.values()) and any(400 in codes for codes in posts.values())
    assert not [code for codes in statuses.values() for code in codes if code >= 500]
    assert httpx.get(f"{url}/health", timeout=TIMEOUT).json()["status"] == "ok"
    print({key: sorted(set(codes)) for key, codes in statuses.items()})


# ----------------------------------------------------------------------------------------------------- CLI


def test_specwise_serve_starts_answers_and_stops(tiny_server_dir):
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "specwise.cli", "serve", "--target", tiny_server_dir, "--drafter", "ngram"]
    command += ["--host", "127.0.0.1", "--port", "0", "--served-model-name", MODEL, "--device", "cpu", "--threads", "1"]
    command += ["--max-batch", "3", "--max-body-bytes", "64k"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        base, deadline = None, time.monotonic() + 90
        while base is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                found = re.search(r"running on (http://127\.0\.0\.1:\d+)", lines.get(timeout=1))
            except queue.Empty:
                continue
            base = found.group(1) if found else None
        assert base, "specwise serve did not report its address"
        api = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        reply = api.chat.completions.create(**chat_body("hi", max_tokens=5, temperature=0))
        assert reply.usage.speculative["drafter"] == "ngram"
        health = httpx.get(f"{base}/health", timeout=TIMEOUT).json()
        assert health["max_batch"] == 3 and health["max_body_bytes"] == 64 * 1024
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--port", "70000"], "--port must be in 0..65535"), (["--max-queue", "0"], "--max-queue must be >= 1")]
    + [(["--max-batch", "0"], "--max-batch must be >= 1")]
    + [(["--default-max-tokens", "0"], "--default-max-tokens must be >= 1"), (["--gamma", "-1"], "--gamma")]
    + [(["--threads", "0"], "--threads must be >= 1"), (["--max-body-bytes", "0"], "must be at least 1 byte")]
    + [(["--max-body-bytes", "1.5M"], "must be a number of bytes such as 1048576, 512k or 4M")],
)
def test_serve_rejects_bad_arguments(capsys, flags, message):
    try:
        code = main(["serve", *flags])
    except SystemExit as exit_:  # argparse rejects badly typed values itself
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ the real model


@pytest.mark.slow
def test_real_model_chat_through_the_server_equals_plain_decoding(smollm):
    runtime = Runtime(Engine(smollm.model, NgramDrafter(), 4, smollm.tokenizer), smollm, "ngram", "cpu")
    body = {"model": smollm.name, "messages": [{"role": "user", "content": "Name three primary colors."}]}
    with TestClient(create_app(runtime)) as test_client:
        reply = test_client.post("/v1/chat/completions", json=body | {"max_tokens": 24, "temperature": 0}).json()
    ids = encode_chat(smollm.tokenizer, body["messages"])
    plain = Engine(smollm.model, NoDrafter(), 0, smollm.tokenizer).generate(ids, SamplingParams(), 24)
    assert reply["choices"][0]["message"]["content"] == plain.text
    assert reply["usage"]["completion_tokens"] == len(plain.token_ids)
    assert json.dumps(reply["usage"]["speculative"])  # serialisable


def test_a_chats_next_turn_reuses_its_cache_and_says_so(client, plain_app):
    """The second turn of a conversation goes to the slot holding the first: usage reports the prompt tokens it did
    not feed again (OpenAI's prompt_tokens_details.cached_tokens), and the answer is the greedy one."""
    messages = [{"role": "user", "content": "Count: one two three"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Again."},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens - 2 <= cached < second.usage.prompt_tokens
    assert cached == second.usage.speculative["cached_tokens"]
    alone = plain_app.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 8,
                                                         "temperature": 0})  # fmt: skip
    assert second.choices[0].message.content == alone.json()["choices"][0]["message"]["content"]
