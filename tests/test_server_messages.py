"""Anthropic's Messages API through the server, over HTTP with the official anthropic client: text, system prompts,
stop sequences, token limits, streams (the same message as unstreamed), tools with every tool_choice, a two-turn
tool use, token counting, ``x-api-key``, bad bodies refused with a 400 in Anthropic's error shape, and the same
greedy answer as chat completions, token for token. The model is a tiny random GGUF with Qwen2.5's template (the
native Hermes tool format).
"""

# ruff: noqa: E402
from __future__ import annotations

import asyncio
import json

import pytest

# the server extra (fastapi, uvicorn) and the clients the tests speak through (httpx, openai, anthropic: dev tools)
for _module in ("fastapi", "uvicorn", "httpx", "openai", "anthropic"):
    pytest.importorskip(_module, reason="needs the server extra and the dev tools: pip install 'specwise[server,dev]'")

import anthropic
import httpx
import openai
from test_server import live_server, wait_until
from test_tools import QWEN_TEMPLATE, WEATHER, tiny_tool_gguf

from specwise.runtime import build_runtime
from specwise.server.apis.anthropic import (
    ContentBlocks,
    Reply,
    anthropic_error,
    field_path,
    stream_events,
    tool_use_id,
    without_vacuous_keywords,
)
from specwise.server.app import create_app
from specwise.server.errors import APIError
from specwise.tools import ArgumentsPiece, CallStart, ContentPiece, ReasoningPiece

MODEL = "m"
CLIENT_MODEL = "claude-sonnet-4-5"  # what Claude Code sends: any name is served by the one model
KEY = "sk-test-messages"
TIMEOUT = 120.0
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
SYSTEM = "You are a terse weather assistant."


def anthropic_tool(tool: dict) -> dict:
    """An OpenAI tool (``test_tools``) as Anthropic writes it."""
    function = tool["function"]
    out = {"name": function["name"], "input_schema": function["parameters"]}
    return out | ({"description": function["description"]} if "description" in function else {})


TIME = {  # no arguments: the tiny model would write keys without end where any are allowed
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
}
A_WEATHER, A_TIME = anthropic_tool(WEATHER), anthropic_tool(TIME)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A live server of the tiny model with Qwen2.5's template, with and without an API key: yields (url, keyed url)."""
    target = str(tiny_tool_gguf(tmp_path_factory.mktemp("messages") / "qwen.gguf", QWEN_TEMPLATE))
    runtime = build_runtime(target, "ngram", 4, "cpu")
    keyed = build_runtime(target, "none", 4, "cpu")
    with (
        live_server(create_app(runtime, model_name=MODEL, default_max_tokens=80)) as url,
        live_server(create_app(keyed, model_name=MODEL, api_key=KEY)) as keyed_url,
    ):
        yield url, keyed_url


@pytest.fixture(scope="module")
def url(qwen) -> str:
    return qwen[0]


def client(url: str, **kw) -> anthropic.Anthropic:
    kw = {"api_key": "unused"} | kw
    return anthropic.Anthropic(base_url=url, timeout=TIMEOUT, max_retries=0, **kw)


def greedy(kw: dict) -> dict:
    """``kw`` with temperature 0 (the client no longer takes sampling settings: they go in the body as they are)."""
    return {"max_tokens": 24} | kw | {"extra_body": {"temperature": 0} | kw.get("extra_body", {})}


def create(url: str, messages=QUESTION, **kw):
    return client(url).messages.create(model=CLIENT_MODEL, messages=messages, **greedy(kw))


def stream(url: str, messages=QUESTION, **kw):
    """The streamed message as the client puts it together, and the events' types."""
    with client(url).messages.stream(model=CLIENT_MODEL, messages=messages, **greedy(kw)) as events:
        types = [event.type for event in events]
        return events.get_final_message(), types


def same_message(a, b) -> None:
    """Two messages alike but for their ids and the prompt cache's share of the input."""
    assert [block.model_dump() for block in a.content] == [block.model_dump() for block in b.content]
    assert (a.stop_reason, a.stop_sequence, a.model, a.role) == (b.stop_reason, b.stop_sequence, b.model, b.role)
    assert a.usage.output_tokens == b.usage.output_tokens
    assert (
        a.usage.input_tokens + a.usage.cache_read_input_tokens == b.usage.input_tokens + b.usage.cache_read_input_tokens
    )


def named_alike(message, other):
    """``message`` with ``other``'s call ids (each message names its calls anew)."""
    for block, model in zip(message.content, other.content):
        if block.type == model.type == "tool_use":
            block.id = model.id
    return message


def text(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def calls(message) -> list[dict]:
    return [{"name": b.name, "input": b.input} for b in message.content if b.type == "tool_use"]


# ------------------------------------------------------------------------------------------------------ text


def test_a_message_answers_with_text(url):
    message = create(url)
    assert message.type == "message" and message.role == "assistant" and message.model == CLIENT_MODEL
    assert message.id.startswith("msg_") and message.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in message.content] == ["text"] and text(message)
    assert message.usage.output_tokens <= 24 and message.usage.input_tokens > 0
    assert message.usage.cache_creation_input_tokens == 0 and message.usage.cache_read_input_tokens is not None


def test_the_system_prompt_is_read(url):
    plain = create(url)
    assert create(url, system=SYSTEM).usage.input_tokens != plain.usage.input_tokens
    blocks = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    same_message(create(url, system=blocks), create(url, system=SYSTEM))


def test_max_tokens_ends_the_message(url):
    message = create(url, max_tokens=3)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3 and message.stop_sequence is None


def test_a_stop_sequence_ends_the_message_and_is_named(url):
    whole = text(create(url, max_tokens=30))
    stop = whole.split()[2][:3]  # a piece of the greedy answer's third word: it ends the answer there
    message = create(url, max_tokens=30, stop_sequences=["never-said", stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert text(message) == whole[: whole.index(stop)]
    streamed, _ = stream(url, max_tokens=30, stop_sequences=["never-said", stop])
    same_message(streamed, message)


def test_a_stream_puts_together_the_same_message(url):
    message = create(url, system=SYSTEM)
    streamed, types = stream(url, system=SYSTEM)
    same_message(streamed, message)
    assert types[:2] == ["message_start", "content_block_start"] and types[-2:] == ["message_delta", "message_stop"]


def raw_stream(url: str, **body) -> list[dict]:
    """The events of a streamed message as Claude Code reads them (``/v1/messages?beta=true``), each checked to be
    ``event: <type>`` and ``data: <json of that type>``."""
    body = {"model": CLIENT_MODEL, "messages": QUESTION, "stream": True, "temperature": 0} | body
    with httpx.stream("POST", f"{url}/v1/messages?beta=true", json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = []
    for chunk in raw.strip().split("\n\n"):
        name, data = chunk.split("\n")
        events.append(json.loads(data.removeprefix("data: ")))
        assert name == f"event: {events[-1]['type']}"
    return events


def test_the_raw_stream_has_anthropics_events(url):
    data = raw_stream(url, max_tokens=5)
    names = [item["type"] for item in data]
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-1] == "message_stop"
    start = data[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    delta = data[-2]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 5 and "speculative" in delta["usage"]


def test_a_stream_closed_early_cancels_its_job(url):
    body = {"model": CLIENT_MODEL, "messages": QUESTION, "max_tokens": 900, "stream": True}
    with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=TIMEOUT) as response:
        lines = response.iter_lines()
        assert next(lines) == "event: message_start"
    wait_until(lambda: httpx.get(f"{url}/health", timeout=TIMEOUT).json()["requests_running"] == 0)
    metrics = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    assert 'specwise_requests_total{endpoint="messages",outcome="cancelled"}' in metrics
    assert create(url, max_tokens=2).usage.output_tokens == 2


# ------------------------------------------------------------------------------------------------------ tools


@pytest.mark.parametrize(
    "choice",
    [{"type": "any"}, {"type": "tool", "name": "get_time"}, {"type": "any", "disable_parallel_tool_use": True}],
)
def test_tools_are_called(url, choice):
    kw = {"tools": [A_WEATHER, A_TIME], "tool_choice": choice, "max_tokens": 80}
    message = create(url, **kw)
    assert calls(message) and message.stop_reason in ("tool_use", "max_tokens")  # parallel calls run on
    if message.stop_reason == "tool_use":
        assert [block.type for block in message.content] == ["tool_use"] * len(message.content)
    for block in message.content:
        assert block.type == "text" or (block.id.startswith("toolu_") and isinstance(block.input, dict))
    if choice["type"] == "tool":
        assert {call["name"] for call in calls(message)} == {"get_time"}
    if choice.get("disable_parallel_tool_use"):
        assert len(calls(message)) == 1
    streamed, types = stream(url, **kw)
    assert "content_block_delta" in types
    same_message(named_alike(streamed, message), message)


@pytest.mark.parametrize("choice", [{"type": "auto"}, {"type": "none"}])
def test_auto_and_none_answer_the_same_streamed_or_not(url, choice):
    kw = {"tools": [A_WEATHER], "tool_choice": choice, "max_tokens": 40}
    message = create(url, **kw)
    if choice["type"] == "none":
        assert not calls(message) and "<tool_call>" not in text(message)
    streamed, _ = stream(url, **kw)
    same_message(named_alike(streamed, message), message)


def test_server_tools_are_dropped_and_unknown_fields_ignored(url):
    server_tools = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]
    server_tools.append({"type": "bash_20250124", "name": "bash"})
    extra = {"context_management": {"edits": []}, "betas": ["x"], "service_tier": "auto", "container": None}
    message = create(
        url,
        tools=[*server_tools, A_WEATHER | {"type": "custom", "cache_control": {"type": "ephemeral"}}],
        tool_choice={"type": "any"},
        metadata={"user_id": "u"},
        thinking={"type": "disabled"},
        max_tokens=60,
        extra_body=extra,
    )
    assert {call["name"] for call in calls(message)} == {"get_weather"}
    only = create(url, tools=server_tools, tool_choice={"type": "auto"}, max_tokens=8)  # no tools left: plain text
    same_message(only, create(url, max_tokens=8))


def test_a_two_turn_tool_use(url):
    tools = [A_WEATHER]
    choice = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    first = create(url, tools=tools, tool_choice=choice, max_tokens=60)
    assert first.stop_reason == "tool_use"
    [use] = [block for block in first.content if block.type == "tool_use"]
    results = [{"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "sunny, 21 C"}]}]
    history = [*QUESTION, {"role": "assistant", "content": first.content}]
    second = create(url, [*history, {"role": "user", "content": results}], tools=tools, max_tokens=20)
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    failed = [{"type": "tool_result", "tool_use_id": use.id, "content": "timeout", "is_error": True}]
    with_text = [*failed, {"type": "text", "text": "Try again?"}]
    for content in (failed, with_text):
        reply = create(url, [*history, {"role": "user", "content": content}], tools=tools, max_tokens=4)
        assert reply.usage.output_tokens > 0
    thinking = [{"type": "thinking", "thinking": "hmm", "signature": "sig"}, {"type": "redacted_thinking", "data": "x"}]
    history = [*QUESTION, {"role": "assistant", "content": thinking + [block.model_dump() for block in first.content]}]
    same_message(create(url, [*history, {"role": "user", "content": results}], tools=tools, max_tokens=20), second)


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}


def test_output_config_format_gives_json_of_the_schema(url):
    output = {"format": {"type": "json_schema", "schema": CITY}, "effort": "low"}
    message = create(url, max_tokens=60, extra_body={"output_config": output})
    assert message.stop_reason == "end_turn" and set(json.loads(text(message))) == {"city"}
    reply = chat(
        url,
        QUESTION,
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": CITY}},
    )
    assert reply.message.content == text(message)
    streamed, _ = stream(url, max_tokens=60, extra_body={"output_config": output})
    same_message(streamed, message)


@pytest.mark.parametrize(
    "thinking", [{"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}, {"type": "adaptive"}]
)
def test_thinking_is_accepted(url, thinking):
    """Qwen2.5's template has no thinking switch: the same answer whatever is asked."""
    same_message(create(url, max_tokens=8, extra_body={"thinking": thinking}), create(url, max_tokens=8))


DRAFT = "https://json-schema.org/draft/2020-12/schema"
CLAUDE_CODE_TOOLS = [  # in the shape Claude Code sends its tools (schemas from zod: $schema, propertyNames)
    {
        "name": "Bash",
        "description": "Runs a command.",
        "input_schema": {
            "$schema": DRAFT,
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number", "exclusiveMinimum": 0}},
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {
        "name": "AskUserQuestion",
        "description": "Asks the user.",
        "input_schema": {
            "$schema": DRAFT,
            "type": "object",
            "properties": {
                "answers": {
                    "type": "object",
                    "propertyNames": {"type": "string"},
                    "additionalProperties": {"type": "string"},
                }
            },
            "additionalProperties": False,
        },
    },
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
]


def test_a_request_as_claude_code_sends_it(url):
    """Claude Code's shape: ?beta=true, beta headers, system blocks and user text blocks with cache_control, its
    tools, metadata, thinking, context_management, a max_tokens past the context (cut to the room), a stream."""
    reminder = {"type": "text", "text": "<system-reminder>Be brief.</system-reminder>"}
    body = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "stream": True,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [reminder, {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            }
        ],
        "tools": CLAUDE_CODE_TOOLS,
        "metadata": {"user_id": "user_0_account__session_1"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "temperature": 0,
    }
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    }
    with httpx.stream("POST", f"{url}/v1/messages?beta=true", json=body, headers=headers, timeout=TIMEOUT) as response:
        assert response.status_code == 200, response.read()
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "message_stop"
    assert events[-2]["delta"]["stop_reason"] in ("end_turn", "tool_use", "model_context_window_exceeded")
    counted = httpx.post(f"{url}/v1/messages/count_tokens?beta=true", json=body, headers=headers, timeout=TIMEOUT)
    assert counted.json()["input_tokens"] == events[0]["message"]["usage"]["input_tokens"]


# ---------------------------------------------------------------------------------------- the same as chat


FINISH = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}  # chat's finish -> stop_reason


def chat(url: str, messages: list, **kw):
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    return api.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw).choices[0]


def test_greedy_answers_equal_chat_completions(url):
    message = create(url, system=SYSTEM, max_tokens=30)
    reply = chat(url, [{"role": "system", "content": SYSTEM}, *QUESTION], max_tokens=30)
    assert text(message) == reply.message.content and message.stop_reason == FINISH[reply.finish_reason]


def test_system_messages_in_the_conversation_stay_where_they_are(url):
    """Claude Code sends system messages after the first turn (``mid-conversation-system``): they stay in place;
    those before the first turn join the system prompt."""
    note = {"role": "system", "content": "Agents: none."}
    message = create(url, [note, *QUESTION, note], system=SYSTEM, max_tokens=20)
    history = [{"role": "system", "content": f"{SYSTEM}\nAgents: none."}, *QUESTION, note]
    assert text(message) == chat(url, history, max_tokens=20).message.content


NAMED = {"type": "function", "function": {"name": "get_weather"}}
ONE = {"parallel_tool_calls": False}


@pytest.mark.parametrize(
    ("choice", "openai_choice"),
    [
        ({"type": "any", "disable_parallel_tool_use": True}, {"tool_choice": "required"} | ONE),
        ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, {"tool_choice": NAMED} | ONE),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "none"}, {"tool_choice": "none"}),
    ],
)
def test_greedy_answers_with_tools_equal_chat_completions(url, choice, openai_choice):
    """The same text and calls, token for token (the calls' arguments as JSON text: the input is that text read)."""
    message = create(url, tools=[A_WEATHER, A_TIME], tool_choice=choice, max_tokens=80)
    reply = chat(url, QUESTION, tools=[WEATHER, TIME], max_tokens=80, **openai_choice)
    assert text(message) == (reply.message.content or "") and message.stop_reason == FINISH[reply.finish_reason]
    arguments = [(c.function.name, c.function.arguments) for c in reply.message.tool_calls or []]
    assert [(call["name"], call["input"]) for call in calls(message)] == [(n, json.loads(a)) for n, a in arguments]
    if choice.get("disable_parallel_tool_use"):
        assert len(arguments) == 1 and message.stop_reason == "tool_use"
    streamed = {}  # each tool_use block's name and its arguments' text as streamed
    for event in raw_stream(url, tools=[A_WEATHER, A_TIME], tool_choice=choice, max_tokens=80):
        if event["type"] == "content_block_start" and event["content_block"]["type"] == "tool_use":
            streamed[event["index"]] = (event["content_block"]["name"], "")
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "input_json_delta":
            name, text_so_far = streamed[event["index"]]
            streamed[event["index"]] = (name, text_so_far + event["delta"]["partial_json"])
    assert list(streamed.values()) == arguments


def test_the_second_turn_equals_chat_completions(url):
    """A history of a call and its result, each in its API's shape: the same prompt, the same answer."""
    arguments = {"city": "Paris"}
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": arguments}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    messages = [*QUESTION, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    call = {
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(arguments)},
    }
    history = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}]
    history.append({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
    message = create(url, messages, tools=[A_WEATHER], max_tokens=30)
    reply = chat(url, history, tools=[WEATHER], max_tokens=30).message
    assert text(message) == (reply.content or "") and not reply.tool_calls
    counted = client(url).messages.count_tokens(model=CLIENT_MODEL, messages=messages, tools=[A_WEATHER])
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


# --------------------------------------------------------------------------------------- counting, keys


def test_count_tokens_is_the_prompts_length(url):
    counted = client(url).messages.count_tokens(model=CLIENT_MODEL, messages=QUESTION, system=SYSTEM)
    message = create(url, system=SYSTEM, max_tokens=1)
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens
    with_tools = client(url).messages.count_tokens(model=CLIENT_MODEL, messages=QUESTION, tools=[A_WEATHER])
    assert (
        with_tools.input_tokens > client(url).messages.count_tokens(model=CLIENT_MODEL, messages=QUESTION).input_tokens
    )


def test_the_key_is_taken_as_x_api_key_or_bearer(qwen):
    _, keyed = qwen
    assert client(keyed, api_key=KEY).messages.create(model=CLIENT_MODEL, messages=QUESTION, max_tokens=2).content
    bearer = client(keyed, api_key=None, auth_token=KEY)
    assert bearer.messages.count_tokens(model=CLIENT_MODEL, messages=QUESTION).input_tokens > 0
    for kw in ({"api_key": "wrong"}, {"api_key": None, "auth_token": "wrong"}):
        with pytest.raises(anthropic.AuthenticationError) as caught:
            client(keyed, **kw).messages.create(model=CLIENT_MODEL, messages=QUESTION, max_tokens=2)
        assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "authentication_error"
    response = httpx.post(f"{keyed}/v1/messages", json={}, timeout=TIMEOUT)
    assert response.status_code == 401 and "x-api-key" in response.json()["error"]["message"]
    chat_response = httpx.post(f"{keyed}/v1/chat/completions", json={}, headers={"x-api-key": KEY}, timeout=TIMEOUT)
    assert chat_response.status_code == 401 and "error" in chat_response.json()  # OpenAI's routes: a bearer token


# ------------------------------------------------------------------------------------------------ bad bodies


def nested(depth: int) -> dict:
    schema: dict = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


BODY = {"model": CLIENT_MODEL, "messages": QUESTION, "max_tokens": 4}
BAD = [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "hi"}]}, "messages.0.role"),
    (
        {
            "messages": [
                *QUESTION,
                {"role": "system", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            ]
        },
        "messages.1.content.0",
    ),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "video"}]}]},
        "messages.0.content.1.type",
    ),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "messages.0.content.0.text"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "AA=="}}]}]},
        "messages.0.content.0",
    ),
    ({"messages": [*QUESTION, {"role": "assistant", "content": "Sure"}]}, "messages.1"),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}
            ]
        },
        "messages.0.content.0.tool_use_id",
    ),
    ({"system": 5}, "system"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"stop_sequences": ["x"] * 40}, "stop_sequences"),
    ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "tools.0.input_schema"),
    ({"tools": [{"name": "bad name!", "input_schema": {"type": "object"}}]}, "tools.0.name"),
    ({"tools": [{"name": "f", "input_schema": nested(200)}]}, "tools.0.input_schema"),
    ({"tools": [A_WEATHER], "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"tools": [A_WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": [A_WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
    ({"output_config": {"format": {"type": "xml", "schema": {}}}}, "output_config.format.type"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "bogus"}}}}, "output_config.format"),
    (
        {"tools": [A_WEATHER], "output_config": {"format": {"type": "json_schema", "schema": CITY}}},
        "output_config.format",
    ),
    ({"thinking": {"budget_tokens": 5}}, "thinking.type"),
]


@pytest.mark.parametrize(("change", "where"), BAD)
def test_bad_bodies_get_a_400_in_anthropics_shape(url, change, where):
    body = {key: value for key, value in (BODY | change).items() if value is not None}
    response = httpx.post(f"{url}/v1/messages", json=body, timeout=TIMEOUT)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    assert error["error"]["message"].startswith(where), error
    if "image" in json.dumps(change):
        assert "images are not supported by this model" in error["error"]["message"]
    assert "Value error" not in error["error"]["message"] and "[" not in error["error"]["message"].split(":")[0]


@pytest.mark.parametrize("raw", [b"[1, 2]", b'{"model": ', b"null", b"\xff"])
def test_bodies_that_are_no_object_get_a_400(url, raw):
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = httpx.post(
            f"{url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=TIMEOUT
        )
        assert response.status_code == 400 and response.json()["type"] == "error", response.text


def test_the_client_raises_a_bad_request_error(url):
    with pytest.raises(anthropic.BadRequestError) as caught:
        create(url, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}])
    assert "images are not supported" in caught.value.message


def test_a_prompt_too_long_is_named_as_anthropic_names_it(url):
    long = [{"role": "user", "content": "weather " * 1100}]
    response = httpx.post(f"{url}/v1/messages", json=BODY | {"messages": long}, timeout=TIMEOUT)
    assert response.status_code == 400 and response.json()["error"]["message"].startswith("prompt is too long:")
    message = create(url, max_tokens=100_000)  # more than the context leaves: cut to the room
    assert message.stop_reason in ("end_turn", "model_context_window_exceeded")


# ------------------------------------------------------------------------------------------------ units


def test_content_blocks_from_pieces():
    blocks = ContentBlocks()
    events = blocks.add([ReasoningPiece("hm"), ContentPiece("a"), ContentPiece("b"), CallStart(0, "call_ab", "f")])
    events += blocks.add([ArgumentsPiece(0, '{"x"'), ArgumentsPiece(0, ": 1}")]) + blocks.close()
    assert [e["type"] for e in events] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    assert events[4]["delta"] == {"type": "text_delta", "text": "ab"}
    assert events[7]["delta"] == {"type": "input_json_delta", "partial_json": '{"x": 1}'}
    assert blocks.content() == [
        {"type": "thinking", "thinking": "hm", "signature": ""},
        {"type": "text", "text": "ab"},
        {"type": "tool_use", "id": tool_use_id("call_ab"), "name": "f", "input": {"x": 1}},
    ]


def test_an_error_after_the_headers_is_an_error_event():
    async def pieces():
        yield [ContentPiece("Hi")]
        raise APIError(429, "the server is busy", code="queue_full", type_="server_busy")

    async def read() -> list[dict]:
        stream = pieces()
        first = await anext(stream)
        return [
            json.loads(chunk.split("data: ")[1])
            async for chunk in stream_events(None, stream, first, Reply("m", [], 3, False))
        ]

    events = asyncio.run(read())
    assert [e["type"] for e in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "error",
    ]
    assert events[-1]["error"] == {"type": "overloaded_error", "message": "the server is busy"}


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
    ]
    + [(429, "rate_limit_error"), (500, "api_error"), (503, "overloaded_error")],
)
def test_errors_have_anthropics_types(status, kind):
    body = anthropic_error(APIError(status, "bad", param="max_tokens"))
    assert body == {"type": "error", "error": {"type": kind, "message": "max_tokens: bad"}}


def test_only_vacuous_property_names_are_dropped():
    record = {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "string"}}
    named = {"type": "object", "propertyNames": {"pattern": "^a"}}
    schema = {"type": "object", "properties": {"propertyNames": {"type": "string"}, "r": record, "n": named}}
    schema["anyOf"] = [record]
    assert without_vacuous_keywords(schema) == {
        "type": "object",
        "properties": {
            "propertyNames": {"type": "string"},
            "r": {"type": "object", "additionalProperties": {"type": "string"}},
            "n": named,
        },
        "anyOf": [{"type": "object", "additionalProperties": {"type": "string"}}],
    }


def test_field_paths_leave_out_pydantics_union_steps():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}
    loc = ("messages", 0, "content", "list[tagged-union[TextBlock,MediaBlock]]", 0, "text", "text")
    assert field_path(loc, body) == "messages.0.content.0.text"
    assert field_path(("messages", 0, "content", "str"), body) == "messages.0.content"
    assert field_path(("system", "list[TextBlock]", 0, "text"), {"system": [{}]}) == "system.0.text"
