"""The server against untrusted input: oversized bodies (HTTP 413 before parsing, declared or chunked), malformed
and hostile JSON (a 4xx error body each, never a 5xx or a traceback in the log), schemas of tools and
response_format nested past the limit (a 400 naming the field, and the connection serves the next request),
prompts longer than the context (400 before any decoding), and ``/health`` answering while a 5 MB body is refused
or a long prompt is tokenized.

The model is a tiny random Llama with the default model's tokenizer (a 512-token context), run on one
thread. ``benchmarks/hostile_body.py`` measures ``/health``'s latency under the same load against the real model.
"""

# ruff: noqa: E402
from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest

# the server extra (fastapi, uvicorn) and the clients the tests speak through (httpx, openai: the dev tools)
for _module in ("fastapi", "uvicorn", "httpx", "openai"):
    pytest.importorskip(_module, reason="needs the server extra and httpx, openai: pip install 'specwise[server,dev]'")

import httpx
from fastapi.testclient import TestClient
from test_server import live_server

from specwise.models.tokenizer import LightTokenizer
from specwise.runtime import build_runtime
from specwise.server.app import create_app
from specwise.server.cli import parse_size
from specwise.server.limits import DEFAULT_MAX_BODY_BYTES, default_max_body_bytes
from specwise.tools.spec import MAX_SCHEMA_DEPTH

MODEL = "tiny"
TIMEOUT = 60.0
JSON = {"content-type": "application/json"}
FIVE_MB = 5 * 1024 * 1024


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runtime(tiny_dir):
    """The tiny model with specwise's own tokenizer, as the default model has: its plain ``encode`` holds the
    interpreter's lock (a megabyte takes a second), so a server that called it would stall ``/health``."""
    runtime = build_runtime(tiny_dir, "ngram", 4, "cpu")
    runtime.target.tokenizer = runtime.engine.tokenizer = LightTokenizer(tiny_dir)
    return runtime


@pytest.fixture(scope="module")
def served(runtime) -> Iterator[tuple[str, object]]:
    """A live server with the default body limit whose log reaches pytest (uvicorn's logging left alone)."""
    app = create_app(runtime, model_name=MODEL)
    with live_server(app, log_config=None) as url:
        yield url, app


@pytest.fixture(scope="module")
def url(served) -> str:
    return served[0]


@pytest.fixture(scope="module")
def small_limit(runtime) -> Iterator[TestClient]:
    """The same model in process with a 4 kB body limit."""
    with TestClient(create_app(runtime, model_name=MODEL, max_body_bytes=4096)) as client:
        yield client


def chat(content: str = "hi", **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2, **kw}


def raw_chat(field: str, literal: str) -> bytes:
    """A chat body with ``"field": literal`` spliced in as written (JSON the json module would not write)."""
    return json.dumps(chat())[:-1].encode() + f', "{field}": {literal}}}'.encode()


def big_body(size: int = FIVE_MB) -> bytes:
    """A well-formed chat request of about ``size`` bytes."""
    return json.dumps(chat("x" * size)).encode()


def chunks(body: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    """The body in pieces: httpx sends a generator chunked, without a Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def no_errors_logged(caplog) -> bool:
    return not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


# -------------------------------------------------------------------------------------- hostile request bodies

DEEP = 100_000  # nesting past the interpreter's recursion limit


def deep_schema(levels: int) -> dict:
    """An object schema of ``levels`` objects, each the one property of the one before (2 JSON levels each)."""
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def deep_tool(levels: int) -> dict:
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": deep_schema(levels)}}]}


def deep_format(levels: int) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": deep_schema(levels)}}}


RAW_DEEP = '{"type": "object", "properties": {"a": ' * 5000 + '{"type": "string"}' + "}}" * 5000  # as text
DEEP_SCHEMAS = {  # within the JSON parser's nesting limit, past the schemas': each a 400 naming the field
    "a tool schema 200 levels deep": (deep_tool(200), "tools[0].function.parameters"),
    "a tool schema 300 levels deep": (deep_tool(300), "tools[0].function.parameters"),
    "a response_format schema 200 levels deep": (deep_format(200), "response_format"),
    "a response_format schema 300 levels deep": (deep_format(300), "response_format"),
}
HOSTILE = {
    "truncated JSON": (b'{"model": "tiny", "messages": [', JSON, "Malformed JSON"),
    "not an object": (b"[1, 2]", JSON, "must be a JSON object"),
    "a bare string": (b'"hello"', JSON, "must be a JSON object"),
    "null": (b"null", JSON, None),
    "empty": (b"", JSON, None),
    "not UTF-8": (b'{"model": "\xff\xfe"}', JSON, None),
    "JSON sent as text/plain": (json.dumps(chat()).encode(), {"content-type": "text/plain"}, "JSON object"),
    "max_tokens 1e30": (raw_chat("max_tokens", "1e30"), JSON, "max_tokens"),
    "max_tokens of 400 digits": (raw_chat("max_tokens", "9" * 400), JSON, "max_tokens"),
    "max_tokens of 5000 digits": (raw_chat("max_tokens", "9" * 5000), JSON, "too many digits"),
    "max_tokens a word": (raw_chat("max_tokens", '"ten"'), JSON, "max_tokens"),
    "max_tokens negative": (raw_chat("max_tokens", "-5"), JSON, "max_tokens"),
    "n 10^9": (raw_chat("n", "1000000000"), JSON, "'n'"),
    "temperature negative": (raw_chat("temperature", "-1"), JSON, "temperature"),
    "temperature NaN": (raw_chat("temperature", "NaN"), JSON, "temperature"),
    "temperature 1e999": (raw_chat("temperature", "1e999"), JSON, "temperature"),
    "top_p 5": (raw_chat("top_p", "5"), JSON, "top_p"),
    "top_p Infinity": (raw_chat("top_p", "Infinity"), JSON, "top_p"),
    "min_p -Infinity": (raw_chat("min_p", "-Infinity"), JSON, "min_p"),
    "top_k 1e30": (raw_chat("top_k", "1e30"), JSON, None),  # larger than the vocabulary: no limit, a 200
    "seed 1e30": (raw_chat("seed", "1e30"), JSON, "seed"),
    "stream a word": (raw_chat("stream", '"maybe"'), JSON, "stream"),
    "stream_options a list": (raw_chat("stream_options", "[1]"), JSON, "stream_options"),
    "a 300-character stop": (raw_chat("stop", json.dumps("s" * 300)), JSON, "stop"),
    "an unknown field": (raw_chat("frobnicate", "1"), JSON, "frobnicate"),
    "deeply nested arrays": (raw_chat("user", "[" * DEEP + "]" * DEEP), JSON, "nests"),
    "deeply nested objects": (raw_chat("user", '{"a":' * DEEP + "1" + "}" * DEEP), JSON, "nests"),
    "nested under the limit": (raw_chat("user", "[" * 500 + "]" * 500), JSON, "user"),
    "messages a string": (json.dumps({"model": MODEL, "messages": "hello"}).encode(), JSON, "messages"),
    "a made-up role": (json.dumps(chat() | {"messages": [{"role": "wizard", "content": "x"}]}).encode(), JSON, "role"),
    "an unknown message field": (
        json.dumps(chat() | {"messages": [{"role": "user", "content": "x", "mood": 1}]}).encode(),
        JSON,
        "messages[0].mood",
    ),
    "an unknown content part field": (
        json.dumps(chat() | {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "y": 1}]}]}),
        JSON,
        "messages[0].content[0].y",
    ),
    "60,000 unknown fields": (json.dumps(chat() | {f"k{i}": 0 for i in range(60_000)}).encode(), JSON, "k0"),
    "60,000 unknown message fields": (
        json.dumps(chat() | {"messages": [{"role": "user", "content": "x"} | {f"k{i}": 0 for i in range(60_000)}]}),
        JSON,
        "messages[0].k0",
    ),
    "150,000 bad messages": (json.dumps(chat() | {"messages": [1] * 150_000}).encode(), JSON, "messages[0]"),
    "150,000 bad stop strings": (json.dumps(chat(stop=[1] * 150_000)).encode(), JSON, "stop"),
    "model a number": (json.dumps(chat() | {"model": 5}).encode(), JSON, "model"),
    "a prompt past the context": (json.dumps(chat("word " * 2000)).encode(), JSON, "context"),
    **{name: (json.dumps(chat(**body)).encode(), JSON, "levels deep") for name, (body, _) in DEEP_SCHEMAS.items()},
    "a tool schema nested past the JSON limit": (
        raw_chat("tools", '[{"type": "function", "function": {"name": "f", "parameters": ' + RAW_DEEP + "}}]"),
        JSON,
        "nests",
    ),
}


@pytest.mark.parametrize(("body", "headers", "fragment"), HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_chat_body_gets_a_4xx_error_and_the_server_goes_on(url, caplog, body, headers, fragment):
    caplog.set_level(logging.WARNING)
    response = httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers, timeout=TIMEOUT)
    if fragment is None and response.status_code == 200:  # accepted as a request: an answer, not a failure
        assert response.json()["choices"]
    else:
        assert 400 <= response.status_code < 500, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        assert fragment is None or fragment in error["message"], error
    assert httpx.get(f"{url}/health", timeout=TIMEOUT).json()["status"] == "ok"
    assert no_errors_logged(caplog), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(("body", "param"), DEEP_SCHEMAS.values(), ids=DEEP_SCHEMAS.keys())
def test_a_schema_nested_too_deeply_gets_400_and_the_connection_serves_on(url, caplog, body, param):
    """Once a 500 (the meta-schema check ran out of stack) that closed the connection: now a 400 naming the field,
    and the next request on the same connection is answered."""
    caplog.set_level(logging.WARNING)
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(chat(**body)), JSON)
        response = connection.getresponse()
        error = json.loads(response.read())["error"]
        assert response.status == 400 and error["param"] == param, error
        assert f"more than {MAX_SCHEMA_DEPTH} levels deep" in error["message"]
        sock = connection.sock
        connection.request("POST", "/v1/chat/completions", json.dumps(chat()), JSON)
        again = connection.getresponse()
        assert again.status == 200 and json.loads(again.read())["choices"]
        assert connection.sock is sock, "the server closed the connection"
    finally:
        connection.close()
    assert no_errors_logged(caplog), [r.getMessage() for r in caplog.records]


HOSTILE_COMPLETIONS = {
    "a token id of 1e30": ({"prompt": [1, 10**30]}, "vocabulary"),
    "a negative token id": ({"prompt": [-1]}, "vocabulary"),
    "nested token ids": ({"prompt": [[1, 2]]}, "prompt"),
    "a prompt object": ({"prompt": {"text": "hi"}}, "prompt"),
    "token ids past the context": ({"prompt": [5] * 600}, "context"),
    "150,000 nested arrays": ({"prompt": [[1]] * 150_000}, "prompt"),
    "text past the context": ({"prompt": "word " * 2000}, "context"),
    "max_tokens past the context": ({"prompt": "hi", "max_tokens": 10**30}, "max_tokens"),
}


@pytest.mark.parametrize(("change", "fragment"), HOSTILE_COMPLETIONS.values(), ids=HOSTILE_COMPLETIONS.keys())
def test_a_hostile_completion_gets_400_and_the_server_goes_on(url, caplog, change, fragment):
    caplog.set_level(logging.WARNING)
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2} | change
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]["message"]
    assert httpx.get(f"{url}/health", timeout=TIMEOUT).json()["status"] == "ok"
    assert no_errors_logged(caplog), [r.getMessage() for r in caplog.records]


def test_a_prompt_past_the_context_is_refused_before_any_decoding(served):
    url, app = served
    metrics = app.state.server.metrics.registry
    before = metrics.get_sample_value("specwise_prompt_tokens_total") or 0.0
    response = httpx.post(f"{url}/v1/chat/completions", json=chat("word " * 2000), timeout=TIMEOUT)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "the model's context is 512: shorten the prompt" in error["message"] and error["param"] == "messages"
    assert (metrics.get_sample_value("specwise_prompt_tokens_total") or 0.0) == before  # never reached the engine


# ---------------------------------------------------------------------------------------------- the body limit


def test_a_declared_body_over_the_limit_gets_413_naming_the_limit_and_the_flag(served):
    url, app = served
    response = httpx.post(f"{url}/v1/chat/completions", content=big_body(), headers=JSON, timeout=TIMEOUT)
    assert response.status_code == 413 and response.headers["connection"] == "close"
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    assert f"({len(big_body())} bytes)" in error["message"] and f"({DEFAULT_MAX_BODY_BYTES} bytes)" in error["message"]
    assert "--max-body-bytes" in error["message"]
    count = app.state.server.metrics.registry.get_sample_value
    assert count("specwise_http_requests_total", {"route": "other", "status": "413"}) >= 1


def test_a_body_over_the_limit_gets_413_in_the_shape_of_its_api(served):
    """Claude Code reads Anthropic's error shape: a Messages body over the limit gets it, with Anthropic's type."""
    url, _ = served
    response = httpx.post(f"{url}/v1/messages", content=big_body(), headers=JSON, timeout=TIMEOUT)
    assert response.status_code == 413
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "request_too_large"
    assert "--max-body-bytes" in body["error"]["message"]


def test_a_chunked_body_over_the_limit_gets_413_as_it_passes_the_limit(url):
    response = httpx.post(f"{url}/v1/chat/completions", content=chunks(big_body()), headers=JSON, timeout=TIMEOUT)
    assert response.status_code == 413
    assert "larger than this server accepts (1048576 bytes)" in response.json()["error"]["message"]
    reply = httpx.post(f"{url}/v1/chat/completions", content=chunks(json.dumps(chat()).encode(), 7), headers=JSON)
    assert reply.status_code == 200 and reply.json()["choices"]  # a chunked body within the limit is read whole


def test_the_limit_is_exact(small_limit):
    pad = "x" * 4096  # in `user`, which the server ignores
    body = json.dumps(chat(user=pad)).encode()
    fits = json.dumps(chat(user=pad[: len(pad) - (len(body) - 4096)])).encode()
    assert len(fits) == 4096
    assert small_limit.post("/v1/chat/completions", content=fits, headers=JSON).status_code == 200
    too_big = fits[:-1] + b" }"
    assert small_limit.post("/v1/chat/completions", content=too_big, headers=JSON).status_code == 413
    assert small_limit.post("/v1/chat/completions", content=chunks(too_big, 1000), headers=JSON).status_code == 413
    assert small_limit.get("/health").json()["max_body_bytes"] == 4096


def test_the_default_limit_grows_with_the_context():
    assert default_max_body_bytes(None) == default_max_body_bytes(512) == DEFAULT_MAX_BODY_BYTES == 1024 * 1024
    assert default_max_body_bytes(131072) == 16 * 131072
    assert [parse_size(s) for s in ["1048576", "512k", "4M", "1GiB"]] == [2**20, 2**19, 2**22, 2**30]


# ------------------------------------------------------------------------------------- /health under hostile load


def health_during(url: str, hostile) -> tuple[list[float], list[float], object]:
    """Run ``hostile()`` on a thread while polling /health; returns the latencies of the polls answered while
    it ran, of all polls, and what ``hostile`` returned."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(hostile()), daemon=True)
    during, every = [], []
    with httpx.Client(timeout=TIMEOUT) as client:
        client.get(f"{url}/health")  # a warm connection
        thread.start()
        while thread.is_alive():
            start = time.perf_counter()
            assert client.get(f"{url}/health").status_code == 200
            every.append(time.perf_counter() - start)
            if thread.is_alive():
                during.append(every[-1])
    thread.join(TIMEOUT)
    return during, every, result[0] if result else None


def test_health_answers_while_a_5_mb_body_is_refused(url):
    def post() -> list[int]:
        codes = []
        for round_ in range(6):  # declared and chunked in turn
            body = big_body() if round_ % 2 else chunks(big_body())
            codes.append(httpx.post(f"{url}/v1/chat/completions", content=body, headers=JSON, timeout=TIMEOUT))
        return [r.status_code for r in codes]

    during, every, codes = health_during(url, post)
    assert codes == [413] * 6
    assert every, "no /health answer"
    print(f"/health during 5 MB refusals: {len(during)} answered while posting, max {max(every) * 1000:.1f} ms")


def test_health_answers_while_a_long_prompt_is_tokenized(served):
    url, app = served
    prompt = "Hello world, this is a long prompt. " * 25_000  # about 900 kB: within the limit, a second to tokenize

    def post() -> httpx.Response:
        return httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt}, timeout=TIMEOUT)

    during, every, response = health_during(url, post)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert len(during) >= 8, f"/health answered {len(during)} times while the prompt was tokenized"
    print(f"/health during a 900 kB prompt: {len(during)} answered, max {max(every) * 1000:.1f} ms")
