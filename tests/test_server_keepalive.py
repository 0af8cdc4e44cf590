"""A streamed answer whose first piece is long in coming (a long prompt read on a CPU) starts its stream and beats
until the piece comes: chat completions and Responses with SSE comment lines, Messages with ``ping`` events. The
official clients read those streams as they read any other (the same answer as unstreamed), and an error that comes
instead of the first piece is the API's error event in the stream.
"""

# ruff: noqa: E402
from __future__ import annotations

import asyncio
import json
import time

import pytest

for _module in ("fastapi", "uvicorn", "httpx", "openai", "anthropic"):
    pytest.importorskip(_module, reason="needs the server extra and the dev tools: pip install 'specwise[server,dev]'")

import anthropic
import httpx
import openai
from test_server import live_server, wait_until
from test_tools import QWEN_TEMPLATE, tiny_tool_gguf

from specwise.runtime import build_runtime
from specwise.server import keepalive
from specwise.server.app import create_app
from specwise.server.errors import APIError
from specwise.server.worker import JobGroup

MODEL = "m"
TIMEOUT = 120.0
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
DELAY = 0.3  # seconds the first event is held back
FIRST_WAIT = 0.05
BEAT = 0.02

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    target = str(tiny_tool_gguf(tmp_path_factory.mktemp("keepalive") / "qwen.gguf", QWEN_TEMPLATE))
    with live_server(create_app(build_runtime(target, "ngram", 4, "cpu"), model_name=MODEL)) as base:
        yield base


@pytest.fixture
def slow_first(monkeypatch):
    """The first event of every request comes DELAY seconds late (a long prompt being read), the stream starts after
    FIRST_WAIT and beats every BEAT seconds; ``fail[0]`` set: an error comes instead of the first event."""
    fail: list = [None]
    events = JobGroup.events

    async def late(self, is_disconnected=None):
        await asyncio.sleep(DELAY)
        if fail[0] is not None:
            raise fail[0]
        async for pair in events(self, is_disconnected):
            yield pair

    monkeypatch.setattr(JobGroup, "events", late)
    monkeypatch.setattr(keepalive, "FIRST_WAIT", FIRST_WAIT)
    monkeypatch.setattr(keepalive, "BEAT_SECONDS", BEAT)
    return fail


def raw(url: str, path: str, body: dict) -> str:
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        return response.read().decode()


def test_beats_until_the_task_is_done_and_a_closed_stream_cancels_it():
    async def main():
        task = asyncio.ensure_future(asyncio.sleep(0.1, result="piece"))
        got = [beat async for beat in keepalive.beats(task, "b", every=0.02)]
        assert 2 <= len(got) <= 6 and set(got) == {"b"} and task.result() == "piece"
        pending = asyncio.ensure_future(asyncio.sleep(10))
        stream = keepalive.beats(pending, "b", every=0.01)
        assert await anext(stream) == "b"
        await stream.aclose()
        await asyncio.sleep(0)
        assert pending.cancelled()

    asyncio.run(main())


def test_a_slow_chat_stream_beats_and_reads_as_the_unstreamed_answer(url, slow_first):
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=TIMEOUT)
    kw = {"model": MODEL, "messages": QUESTION, "max_tokens": 12, "temperature": 0}
    whole = api.chat.completions.create(**kw).choices[0].message.content
    text = "".join(
        c.choices[0].delta.content or "" for c in api.chat.completions.create(stream=True, **kw) if c.choices
    )
    assert text == whole
    body = raw(url, "/v1/chat/completions", kw | {"stream": True})
    assert body.startswith(keepalive.COMMENT) and body.count(keepalive.COMMENT) >= 2
    assert body.rstrip().endswith("data: [DONE]")


def test_a_slow_messages_stream_pings_and_reads_as_the_unstreamed_message(url, slow_first):
    api = anthropic.Anthropic(base_url=url, api_key="x", timeout=TIMEOUT)
    kw = {"model": "claude-sonnet-4-5", "messages": QUESTION, "max_tokens": 12}
    greedy = {"extra_body": {"temperature": 0}}  # the client no longer takes sampling settings
    whole = api.messages.create(**kw, **greedy)
    with api.messages.stream(**kw, **greedy) as events:
        types = [event.type for event in events]
        streamed = events.get_final_message()
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    assert types[-1] == "message_stop"
    names = [
        json.loads(chunk.split("\n")[1][6:])["type"]
        for chunk in raw(url, "/v1/messages", kw | {"stream": True, "temperature": 0}).strip().split("\n\n")
    ]
    assert names[:2] == ["message_start", "ping"] and names.count("ping") >= 3 and names[-1] == "message_stop"


def test_a_slow_responses_stream_beats_and_reads_as_the_unstreamed_response(url, slow_first):
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=TIMEOUT)
    kw = {"model": "gpt-5-codex", "input": "Write one line.", "max_output_tokens": 12, "temperature": 0}
    whole = api.responses.create(**kw)
    with api.responses.stream(**kw) as stream:
        events = list(stream)
    final = events[-1].response  # response.completed, or response.incomplete at the token limit
    assert events[-1].type == f"response.{whole.status}" and final.output_text == whole.output_text
    body = raw(url, "/v1/responses", kw | {"stream": True})
    assert body.startswith("event: response.created") and body.count(keepalive.COMMENT) >= 2
    assert f"event: response.{whole.status}" in body


def test_an_error_instead_of_the_first_piece_is_an_error_event(url, slow_first):
    slow_first[0] = APIError(400, "the prompt is too long for this test", param="messages")
    body = raw(url, "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "stream": True})
    assert "the prompt is too long for this test" in body and body.rstrip().endswith("data: [DONE]")
    kw = {"model": "c", "messages": QUESTION, "max_tokens": 5, "stream": True}
    events = [json.loads(c.split("\n")[1][6:]) for c in raw(url, "/v1/messages", kw).strip().split("\n\n")]
    assert events[-1]["type"] == "error" and "too long for this test" in events[-1]["error"]["message"]
    body = raw(url, "/v1/responses", {"model": "c", "input": "hi", "stream": True})
    assert "event: error" in body and "event: response.failed" in body


def test_a_quick_first_piece_keeps_the_plain_stream(url):
    """Without a wait the stream starts with the first piece, and a bad request is still an HTTP error."""
    body = raw(url, "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "stream": True, "max_tokens": 3})
    assert keepalive.COMMENT not in body and body.startswith("data: ")
    bad = httpx.post(
        f"{url}/v1/chat/completions", json={"model": MODEL, "messages": [], "stream": True}, timeout=TIMEOUT
    )
    assert bad.status_code == 400


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/messages", {"model": "c", "messages": QUESTION, "max_tokens": 50, "stream": True}),
        ("/v1/responses", {"model": "c", "input": "hi", "max_output_tokens": 50, "stream": True}),
        ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 50, "stream": True}),
    ],
)
def test_a_client_gone_while_the_prompt_is_read_cancels_cleanly(url, slow_first, monkeypatch, caplog, path, body):
    """Claude Code drops a request after 5 minutes of waiting: the stream ends without an error in the server's
    log, the request is cancelled, and the server answers the next one."""
    monkeypatch.setattr(keepalive, "BEAT_SECONDS", 0.01)
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        next(response.iter_bytes())  # the stream has started; the first piece is still held back
    wait_until(lambda: httpx.get(f"{url}/health", timeout=TIMEOUT).json()["requests_running"] == 0)
    time.sleep(DELAY + 0.1)  # the held-back piece's time has passed
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [r.getMessage() for r in caplog.records]
    text = openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=TIMEOUT).chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=3, temperature=0
    )
    assert text.choices[0].message.content is not None
