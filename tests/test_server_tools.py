"""Tool calls through the server, over HTTP with the official openai client: tools and every tool_choice, streamed
calls (the same answer as unstreamed), bad requests refused with a 400 naming the field, and a real agent loop
(call, tool result, final answer) on the default model (the generic format) and on a tiny GGUF with Qwen2.5's
template (the native Hermes format), with ``<tool_call>`` as text and as a special token.
"""

# ruff: noqa: E402
from __future__ import annotations

import json

import pytest

# the server extra (fastapi, uvicorn) and the clients the tests speak through (httpx, openai: the dev tools)
for _module in ("fastapi", "uvicorn", "httpx", "openai"):
    pytest.importorskip(_module, reason="needs the server extra and httpx, openai: pip install 'specwise[server,dev]'")

import httpx
import openai
from test_server import live_server
from test_tools import NAMED, QUESTION, QWEN_TEMPLATE, TIME, WEATHER, tiny_tool_gguf

from specwise.runtime import build_runtime
from specwise.server.app import create_app

MODEL = "m"
TIMEOUT = 120.0
CITY_WEATHER = {"Paris": "sunny, 21 C", "Rome": "cloudy, 17 C"}

pytestmark = pytest.mark.usefixtures("one_thread")


def serve(target: str, drafter: str = "ngram"):
    app = create_app(build_runtime(target, drafter, 4, "cpu"), model_name=MODEL, default_max_tokens=80)
    with live_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """The tiny model with Qwen2.5's template: the native format, ``<tool_call>`` written as text."""
    yield from serve(str(tiny_tool_gguf(tmp_path_factory.mktemp("tools") / "qwen.gguf", QWEN_TEMPLATE)))


@pytest.fixture(scope="module")
def qwen_special(tmp_path_factory):
    """The same with ``<tool_call>`` and ``</tool_call>`` special tokens (dropped by ordinary decoding)."""
    yield from serve(str(tiny_tool_gguf(tmp_path_factory.mktemp("tools") / "qwen-special.gguf", QWEN_TEMPLATE, True)))


@pytest.fixture(scope="module")
def smol():
    """The default model, whose template has no tools: the generic format."""
    yield from serve("default")


def api(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def create(url: str, messages=QUESTION, **kw):
    return api(url).chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def streamed(url: str, messages=QUESTION, **kw) -> dict:
    """A streamed answer put together as the openai client's users do: content, calls by index, finish reason;
    checks OpenAI's shape of the call deltas on the way."""
    content, calls, finish = "", {}, None
    for chunk in create(url, messages, stream=True, **kw):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:  # a call's first chunk: id, type, name and empty arguments
                assert delta.id.startswith("call_") and delta.type == "function"
                assert delta.function.name and delta.function.arguments == ""
                calls[delta.index] = {"name": delta.function.name, "arguments": ""}
            else:
                assert delta.id is None and delta.function.name is None
                calls[delta.index]["arguments"] += delta.function.arguments
        finish = choice.finish_reason or finish
    return {"content": content or None, "calls": [calls[i] for i in sorted(calls)], "finish": finish}


def whole(reply) -> dict:
    message = reply.choices[0].message
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
    for call in message.tool_calls or []:
        assert call.type == "function" and call.id.startswith("call_") and len(call.id) == 29
    return {"content": message.content, "calls": calls, "finish": reply.choices[0].finish_reason}


def get_weather(city: str) -> str:
    return CITY_WEATHER.get(city, "unknown")


def agent_loop(url: str, tools: list, first_choice, turns: int = 3) -> tuple[list, object]:
    """Call the model, run the tools it calls, send their results back, until it answers with text (the last
    turn with tool_choice none). Returns the conversation and the final reply."""
    messages = list(QUESTION)
    for turn in range(turns):
        choice = first_choice if turn == 0 else ("none" if turn == turns - 1 else "auto")
        reply = create(url, messages, tools=tools, tool_choice=choice, parallel_tool_calls=False, max_tokens=60)
        message = reply.choices[0].message
        if not message.tool_calls:
            return messages, reply
        assert reply.choices[0].finish_reason == "tool_calls"
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            result = get_weather(arguments["city"]) if call.function.name == "get_weather" else "12:00"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    raise AssertionError("the last turn (tool_choice none) must answer with text")


# ------------------------------------------------------------------------------------------------ generic format


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", NAMED])
def test_the_default_model_calls_a_tool_in_the_generic_format(smol, choice):
    answer = whole(create(smol, tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=False))
    assert answer["finish"] == "tool_calls" and answer["content"] is None and len(answer["calls"]) == 1
    name = "get_time" if choice == NAMED else answer["calls"][0]["name"]
    assert answer["calls"][0]["name"] == name
    arguments = json.loads(answer["calls"][0]["arguments"])
    if name == "get_weather":
        assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 12  # the schema's maxLength
    assert streamed(smol, tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=False) == answer


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["auto", "none"])
def test_auto_and_none_answer_the_same_streamed_or_not(smol, choice):
    kw = {"tools": [WEATHER], "tool_choice": choice, "max_tokens": 40}
    messages = [{"role": "user", "content": "Say hello to me in one short sentence."}]
    answer = whole(create(smol, messages, **kw))
    assert answer["content"] or answer["calls"]
    assert streamed(smol, messages, **kw) == answer


@pytest.mark.slow
def test_an_agent_loop_on_the_default_model(smol):
    messages, final = agent_loop(smol, [WEATHER], "required")
    assert [m["role"] for m in messages[:3]] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason in ("stop", "length")


# ------------------------------------------------------------------------------------------------ native format


@pytest.mark.parametrize("server", ["qwen", "qwen_special"])
@pytest.mark.parametrize("choice", ["required", NAMED])
def test_the_native_format_calls_a_tool(request, server, choice):
    url = request.getfixturevalue(server)
    kw = {"tools": [WEATHER, TIME], "tool_choice": choice, "max_tokens": 120}
    answer = whole(create(url, **kw))
    assert answer["calls"] and answer["content"] is None
    assert answer["finish"] in ("tool_calls", "length")
    if answer["finish"] == "tool_calls":
        for call in answer["calls"]:
            json.loads(call["arguments"])
    if choice == NAMED:
        assert {c["name"] for c in answer["calls"]} == {"get_time"}
    assert streamed(url, **kw) == answer


@pytest.mark.parametrize("server", ["qwen", "qwen_special"])
def test_auto_on_the_native_format_answers_the_same_streamed_or_not(request, server):
    url = request.getfixturevalue(server)
    for choice in ("auto", "none"):
        kw = {"tools": [WEATHER], "tool_choice": choice, "max_tokens": 50}
        answer = whole(create(url, **kw))
        assert streamed(url, **kw) == answer
        if choice == "none":
            assert not answer["calls"] and "<tool_call>" not in (answer["content"] or "")


@pytest.mark.parametrize("server", ["qwen", "qwen_special"])
def test_an_agent_loop_on_the_native_format(request, server):
    url = request.getfixturevalue(server)
    named = {"type": "function", "function": {"name": "get_weather"}}
    messages, final = agent_loop(url, [WEATHER], named)
    assert [m["role"] for m in messages[:3]] == ["user", "assistant", "tool"]
    assert messages[1].get("content") is None
    assert final.choices[0].message.content is not None and not final.choices[0].message.tool_calls


# ------------------------------------------------------------------------------------------------ bad requests


def post(url: str, **body) -> httpx.Response:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4} | body
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT)


BAD = [
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}]},
        "tools[0].function.parameters",
    ),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": "sometimes", "tools": [WEATHER]}, "tool_choice"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [WEATHER], "regex": "a+"}, "regex"),
    ({"tools": [{"type": "function", "function": {"name": "f", "colour": "red"}}]}, "tools[0].function.colour"),
    ({"tools": [{"type": "function", "function": {"name": "f"}, "extra": 1}]}, "tools[0].extra"),
    (
        {"messages": [*QUESTION, {"role": "tool", "tool_call_id": "call_x", "content": "hi"}]},
        "messages[1].tool_call_id",
    ),
    ({"messages": [*QUESTION, {"role": "tool", "content": "hi"}]}, "messages[1].tool_call_id"),
    ({"messages": [*QUESTION, {"role": "assistant"}]}, "messages[1].content"),
    ({"messages": [{"role": "user", "content": "hi", "tool_call_id": "c"}]}, "messages[0].tool_call_id"),
    (
        {
            "messages": [
                *QUESTION,
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]},
            ]
        },
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        {
            "messages": [
                *QUESTION,
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}", "x": 1}}],
                },
            ]
        },
        "messages[1].tool_calls[0].function.x",
    ),
]


@pytest.mark.parametrize(("body", "param"), BAD)
def test_bad_tool_requests_get_a_400_naming_the_field(qwen, body, param):
    response = post(qwen, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_history_with_calls_and_results_is_accepted(qwen):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}]
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": "cloudy"})
    response = post(qwen, messages=messages, tools=[WEATHER])
    assert response.status_code == 200, response.text
    assert post(qwen, messages=messages).status_code == 200  # tools need not be given again
