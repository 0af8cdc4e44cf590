"""OpenAI's Responses API (``/v1/responses``) over HTTP with the official openai client: string and item input,
instructions and developer messages, function tools with every tool_choice, a two-turn function call, custom tools,
``text.format``, ``max_output_tokens``, stored responses and ``previous_response_id``, streaming (the final streamed
response equals the unstreamed one), bad bodies refused with a 400 in OpenAI's error shape, and the key property:
greedy output through ``/v1/responses`` equals ``/v1/chat/completions``' for the same conversation, text and calls.

The models: a tiny random GGUF with Qwen2.5's template (the native Hermes format) and, marked slow, the default
model (the generic format).
"""

# ruff: noqa: E402
from __future__ import annotations

import json
import re

import pytest

for _module in ("fastapi", "uvicorn", "httpx", "openai"):
    pytest.importorskip(_module, reason="needs the server extra and httpx, openai: pip install 'specwise[server,dev]'")

import httpx
import openai
from test_server import ThrottledDrafter, live_server
from test_tools import QUESTION, QWEN_TEMPLATE, TIME, WEATHER, tiny_tool_gguf
from vocab_models import QWEN3_TOKENS, qwen3_template, tiny_vocab_gguf

from specwise.runtime import build_runtime
from specwise.server.apis.openai_responses import _CustomInput
from specwise.server.app import create_app

MODEL = "m"
CODEX_MODEL = "gpt-5-codex"  # any name is accepted and echoed
TIMEOUT = 120.0
FLAT = [{"type": "function", **tool["function"]} for tool in (WEATHER, TIME)]  # the Responses' flat tools
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit a file",
    "format": {"type": "grammar", "syntax": "regex", "definition": "[a-z]{3,8}"},
}

THINK, END = 151667, 151668  # Qwen3's thinking tags
# the reply forced on the random model: thinking, then the answer
FORCED = f'start: <[{THINK}]> "\\nThe user greets me.\\n" <[{END}]> "\\n\\nHello there!"'

pytestmark = pytest.mark.usefixtures("one_thread")


def serve(target: str, throttled: list | None = None):
    """A live server of ``target`` (its drafter wrapped in a ThrottledDrafter, appended to ``throttled``, when
    given); yields its base URL."""
    runtime = build_runtime(target, "ngram", 4, "cpu")
    if throttled is not None:
        throttled.append(ThrottledDrafter(runtime.engine.drafters[0]))
        runtime.engine.drafters = throttled[-1:]
    app = create_app(runtime, model_name=MODEL, default_max_tokens=40)
    with live_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def qwen_served(tmp_path_factory):
    """The tiny model with Qwen2.5's template (the native tool format), its drafter throttle-able; yields (base URL,
    drafter)."""
    throttled: list = []
    path = tiny_tool_gguf(tmp_path_factory.mktemp("responses") / "qwen.gguf", QWEN_TEMPLATE)
    for url in serve(str(path), throttled):
        yield url, throttled[0]


@pytest.fixture(scope="module")
def qwen(qwen_served):
    return qwen_served[0]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """A tiny model around Qwen3's vocabulary and template: a thinking model."""
    path = tmp_path_factory.mktemp("responses") / "qwen3.gguf"
    yield from serve(str(tiny_vocab_gguf(path, template=qwen3_template(), set_tokens=QWEN3_TOKENS)))


@pytest.fixture(scope="module")
def smol():
    """The default model, whose template has no tools: the generic format."""
    yield from serve("default")


def api(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def respond(url: str, **kw):
    return api(url).responses.create(model=CODEX_MODEL, temperature=0, **kw)


def chat(url: str, messages: list, **kw) -> dict:
    """A greedy chat completion as (content, calls)."""
    reply = api(url).chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)
    message = reply.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    finish = reply.choices[0].finish_reason
    return {"content": message.content or "", "calls": calls, "finish": finish, "prompt": reply.usage.prompt_tokens}


def answer(response) -> dict:
    """A response as (content, calls), with chat's finish reason."""
    calls = [(item.name, item.arguments) for item in response.output if item.type == "function_call"]
    if response.status == "incomplete":
        finish = "length"
    else:
        finish = "tool_calls" if calls else "stop"
    return {"content": response.output_text, "calls": calls, "finish": finish, "prompt": response.usage.input_tokens}


def shape(response) -> list[dict]:
    """A response's output items without their ids (new for each response)."""
    return [item.model_dump(exclude={"id", "call_id"}, exclude_none=True) for item in response.output]


def streamed(url: str, **kw):
    """A response through ``responses.stream``, checking the events on the way; returns the final response (of
    ``response.completed``, or of ``response.incomplete``, which the client's final response does not take)."""
    events = []
    with api(url).responses.stream(model=CODEX_MODEL, temperature=0, **kw) as stream:
        events = list(stream)
        final = stream.get_final_response() if events[-1].type == "response.completed" else events[-1].response
    types = [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == f"response.{final.status}"
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == len(final.output)
    return final


def post(url: str, **body) -> httpx.Response:
    body = {"model": CODEX_MODEL, "input": "hi", "max_output_tokens": 4} | body
    return httpx.post(f"{url}/v1/responses", json=body, timeout=TIMEOUT)


# ----------------------------------------------------------------------------------------------------- text


def test_a_string_input_gets_a_message(qwen):
    response = respond(qwen, input="Say hello.", max_output_tokens=8)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == CODEX_MODEL
    assert response.status in ("completed", "incomplete") and response.error is None
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and message.content[0].text == response.output_text
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 8
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0 and usage.output_tokens_details.reasoning_tokens == 0
    assert answer(response) == chat(qwen, [{"role": "user", "content": "Say hello."}], max_tokens=8)


def test_instructions_and_item_messages_equal_chat(qwen):
    items = [
        {"type": "message", "role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Red."}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # dropped from the prompt
        {"role": "user", "content": [{"type": "input_text", "text": "Another"}, {"type": "input_text", "text": "?"}]},
    ]
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another?"},
    ]
    response = respond(qwen, instructions="You are terse.", input=items, max_output_tokens=12)
    assert response.instructions == "You are terse."
    assert answer(response) == chat(qwen, messages, max_tokens=12)


def test_max_output_tokens_leaves_the_response_incomplete(qwen):
    response = respond(qwen, input="Tell me a long story.", max_output_tokens=2)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 2 and response.output[-1].status == "incomplete"
    final = streamed(qwen, input="Tell me a long story.", max_output_tokens=2)
    assert final.status == "incomplete" and shape(final) == shape(response)


def test_a_streamed_response_equals_the_unstreamed_one(qwen):
    kw = {
        "input": [{"role": "user", "content": "Write one line."}],
        "instructions": "Be nice.",
        "max_output_tokens": 12,
    }
    whole = respond(qwen, **kw)
    final = streamed(qwen, **kw)
    assert shape(final) == shape(whole) and final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_the_raw_events_follow_openais_order(qwen):
    body = {"model": CODEX_MODEL, "input": "hi", "max_output_tokens": 6, "temperature": 0, "stream": True}
    events = []
    with httpx.stream("POST", f"{qwen}/v1/responses", json=body, timeout=TIMEOUT) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for block in response.read().decode().split("\n\n"):
            if block:
                name, data = block.split("\n", 1)
                event = json.loads(data.removeprefix("data: "))
                assert name == f"event: {event['type']}"
                events.append(event)
    kinds = [e["type"] for e in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert events[-1]["response"]["output_text"] == text == events[-4]["text"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []


def test_an_error_after_the_headers_fails_the_response(qwen_served):
    url, drafter = qwen_served
    body = {"model": CODEX_MODEL, "input": "hi", "max_output_tokens": 60, "stream": True, "ignore_eos": True}
    drafter.delay = 0.05
    try:
        with httpx.stream("POST", f"{url}/v1/responses", json=body | {"temperature": 0}, timeout=TIMEOUT) as response:
            lines = response.iter_lines()
            assert next(lines) == "event: response.created"  # the first target pass is done
            drafter.throttle.fail = RuntimeError("the drafter broke")
            events = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    finally:
        drafter.delay, drafter.throttle.fail = 0.0, None
    error, failed = events[-2:]
    assert error["type"] == "error" and error["message"] == "generation failed: RuntimeError: the drafter broke"
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["message"] == error["message"]
    assert respond(url, input="hi", max_output_tokens=2).status == "incomplete"  # the server goes on


# ----------------------------------------------------------------------------------------------------- tools


@pytest.mark.parametrize(
    ("choice", "chat_choice"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"type": "function", "name": "get_time"}, {"type": "function", "function": {"name": "get_time"}}),
    ],
)
def test_function_tools_equal_chat_for_every_tool_choice(qwen, choice, chat_choice):
    kw = {"tool_choice": choice, "parallel_tool_calls": False, "max_output_tokens": 40}
    response = respond(qwen, input=QUESTION, tools=FLAT, **kw)
    expected = chat(
        qwen, QUESTION, tools=[WEATHER, TIME], tool_choice=chat_choice, parallel_tool_calls=False, max_tokens=40
    )
    assert answer(response) == expected
    calls = [item for item in response.output if item.type == "function_call"]
    assert bool(calls) == (choice != "none") or choice == "auto"
    for call in calls:
        assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    if calls:  # a call cut short by the token limit is incomplete, as the response is
        assert calls[-1].status == ("completed" if response.status == "completed" else "incomplete")
    assert shape(streamed(qwen, input=QUESTION, tools=FLAT, **kw)) == shape(response)


def test_a_two_turn_function_call_equals_chat(qwen):
    first = respond(
        qwen, input=QUESTION, tools=FLAT[:1], tool_choice="required", parallel_tool_calls=False, max_output_tokens=60
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"]
    items = [
        *QUESTION,
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ]
    second = respond(qwen, input=items, tools=FLAT[:1], max_output_tokens=20)
    tool_call = {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [tool_call]}]
    messages.append({"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 C"})
    assert answer(second) == chat(qwen, messages, tools=[WEATHER], max_tokens=20)
    parts = [{"type": "input_text", "text": "sunny, "}, {"type": "input_text", "text": "21 C"}]
    as_parts = [*items[:2], {"type": "function_call_output", "call_id": call.call_id, "output": parts}]
    assert answer(respond(qwen, input=as_parts, tools=FLAT[:1], max_output_tokens=20)) == answer(second)


def test_hosted_tools_are_left_out(qwen):
    hosted = [{"type": "web_search"}, {"type": "local_shell"}, {"type": "namespace", "name": "mcp", "tools": []}]
    response = respond(qwen, input="Hello.", tools=hosted, tool_choice="auto", max_output_tokens=8)
    assert answer(response) == chat(qwen, [{"role": "user", "content": "Hello."}], max_tokens=8)
    assert [tool.type for tool in response.tools] == ["web_search", "local_shell", "namespace"]


def test_a_custom_tool_is_called_with_its_input(qwen):
    kw = {"input": "Patch it.", "tools": [PATCH], "tool_choice": {"type": "custom", "name": "apply_patch"}}
    kw["parallel_tool_calls"] = False
    response = respond(qwen, max_output_tokens=60, **kw)
    [call] = response.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.call_id.startswith("call_")
    assert re.fullmatch("[a-z]{3,8}", call.input), call.input  # the regex constrains the input
    assert shape(streamed(qwen, max_output_tokens=60, **kw)) == shape(response)
    items = [
        {"role": "user", "content": "Patch it."},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch", "input": call.input},
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"},
    ]
    lark = PATCH | {"format": {"type": "grammar", "syntax": "lark", "definition": 'start: "a"+'}}
    follow_up = respond(qwen, input=items, tools=[lark, *FLAT], max_output_tokens=10)
    assert follow_up.status in ("completed", "incomplete")


def test_custom_input_decoding_in_pieces():
    arguments = json.dumps({"input": 'a "quoted" line\nand é \\ 😀 end'})
    for size in (1, 2, 3, 7):
        reader = _CustomInput()
        text = "".join(reader.feed(arguments[i : i + size]) for i in range(0, len(arguments), size))
        assert text + reader.rest() == json.loads(arguments)["input"]
    odd = _CustomInput()
    assert odd.feed('{"input" : "x\\u0041"}') == "xA" and odd.rest() == ""
    spaced = _CustomInput()
    assert spaced.feed('{"\\u0069nput": "yes"}') == "" and spaced.rest() == "yes"


# ------------------------------------------------------------------------------------------------ reasoning


def test_a_thinking_models_reasoning_is_a_reasoning_item(qwen3):
    kw = {"input": "Hi", "extra_body": {"grammar": FORCED}}
    response = respond(qwen3, **kw)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [part.text for part in reasoning.content] == ["The user greets me."]
    assert message.type == "message" and response.output_text == "Hello there!"
    assert shape(streamed(qwen3, **kw)) == shape(response)


def test_reasoning_sent_back_reaches_the_template_as_chat_s(qwen3):
    """Within a round of tool calls Qwen3's template renders the reasoning of the calls' message."""
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Rome"}'}
    thought = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}]}
    result = {"type": "function_call_output", "call_id": "call_1", "output": "cloudy"}
    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
    }
    assistant = {"role": "assistant", "content": None, "tool_calls": [tool_call], "reasoning_content": "Hm."}
    messages = [*QUESTION, assistant, {"role": "tool", "tool_call_id": "call_1", "content": "cloudy"}]
    with_thought = respond(qwen3, input=[*QUESTION, thought, call, result], max_output_tokens=3)
    assert answer(with_thought) == chat(qwen3, messages, max_tokens=3)
    without = respond(qwen3, input=[*QUESTION, call, result], max_output_tokens=3)
    assert without.usage.input_tokens < with_thought.usage.input_tokens


# ------------------------------------------------------------------------------------------------ text.format


def test_json_schema_output_matches_the_schema(qwen):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    response = respond(qwen, input="Is it fine? Answer in JSON.", text=text, max_output_tokens=30)
    assert response.status == "completed"
    assert isinstance(json.loads(response.output_text)["ok"], bool)
    assert response.text.format.type == "json_schema"
    as_chat = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    messages = [{"role": "user", "content": "Is it fine? Answer in JSON."}]
    assert answer(response) == chat(qwen, messages, response_format=as_chat, max_tokens=30)
    obj = respond(qwen, input="JSON please.", text={"format": {"type": "json_object"}, "verbosity": "low"})
    assert isinstance(json.loads(obj.output_text), dict) if obj.status == "completed" else obj.output_text


# ------------------------------------------------------------------------------------------------ the store


def test_previous_response_id_continues_the_stored_conversation(qwen):
    first = respond(qwen, input="Name a fruit.", max_output_tokens=6)
    assert first.store is True
    follow = respond(qwen, previous_response_id=first.id, input="And another?", max_output_tokens=6)
    assert follow.previous_response_id == first.id
    items = [
        {"role": "user", "content": "Name a fruit."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
        {"role": "user", "content": "And another?"},
    ]
    assert answer(follow) == answer(respond(qwen, input=items, max_output_tokens=6))
    third = respond(qwen, previous_response_id=follow.id, input="Thanks.", max_output_tokens=4)
    assert third.status in ("completed", "incomplete")
    fetched = api(qwen).responses.retrieve(first.id)
    assert fetched.id == first.id and shape(fetched) == shape(first)
    api(qwen).responses.delete(first.id)
    gone = httpx.get(f"{qwen}/v1/responses/{first.id}", timeout=TIMEOUT)
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "invalid_request_error"


def test_unstored_responses_cannot_be_continued(qwen):
    unstored = respond(qwen, input="hi", store=False, max_output_tokens=2)
    assert unstored.store is False
    response = post(qwen, previous_response_id=unstored.id)
    assert response.status_code == 400 and response.json()["error"]["param"] == "previous_response_id"
    assert httpx.get(f"{qwen}/v1/responses/{unstored.id}", timeout=TIMEOUT).status_code == 404


def test_a_streamed_response_is_stored(qwen):
    final = streamed(qwen, input="hi", max_output_tokens=3)
    assert shape(api(qwen).responses.retrieve(final.id)) == shape(final)


# ------------------------------------------------------------------------------------------------ bad bodies


def deep_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


BAD = [
    ({"input": 5}, "input"),
    ({"input": [5]}, "input[0]"),
    ({"input": [{"type": "message", "role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"type": "telepathy"}]}, "input[0].type"),
    ({"input": [{"content": "no role or type"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
    ({"background": True}, "background"),
    ({"temperature": "hot"}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tools": "all"}, "tools"),
    ({"tools": [{"type": "teleporter"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "bogus"}}]}, "tools[0].parameters"),
    ({"tools": [{"type": "function", "name": "f", "parameters": deep_schema(200)}]}, "tools[0].parameters"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    (
        {"tools": [PATCH | {"format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]},
        "tools[0].format.syntax",
    ),
    ({"tools": FLAT, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tools": FLAT, "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}}, "text.format"),
    ({"tools": FLAT, "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"colour": "red"}, "colour"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"input": []}, "input"),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_bad_bodies_get_a_400_naming_the_field(qwen, body, param):
    response = post(qwen, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error.keys() == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_the_openai_client_raises_on_a_bad_request(qwen):
    with pytest.raises(openai.BadRequestError, match="not supported"):
        respond(qwen, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}])


# ------------------------------------------------------------------------------------------------ default model


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "name": "get_time"}])
def test_the_generic_format_equals_chat(smol, choice):
    chat_choice = choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice["name"]}}
    kw = {"parallel_tool_calls": False}
    response = respond(smol, input=QUESTION, tools=FLAT, tool_choice=choice, max_output_tokens=40, **kw)
    expected = chat(smol, QUESTION, tools=[WEATHER, TIME], tool_choice=chat_choice, max_tokens=40, **kw)
    assert answer(response) == expected
    assert shape(streamed(smol, input=QUESTION, tools=FLAT, tool_choice=choice, max_output_tokens=40, **kw)) == shape(
        response
    )


@pytest.mark.slow
def test_plain_text_on_the_default_model_equals_chat(smol):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    response = respond(smol, instructions="Be brief.", input="What is 2 + 2?", max_output_tokens=24)
    assert answer(response) == chat(smol, messages, max_tokens=24)
