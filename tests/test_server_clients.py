"""Chat completions as real clients send them (coding agents and agent frameworks: opencode, qwen-code, Continue,
aider, smolagents, pydantic-ai, langchain-openai, llm, litellm, instructor, the OpenAI Agents SDK), over HTTP with
the official openai client and httpx: content as arrays of text parts in every role, ``max_completion_tokens``,
``stream_options.include_usage``, strict functions and closed schemas, ``tool_choice: "required"`` with a
``final_answer`` tool, the fields sent by default that change nothing (each gives the same greedy answer as the
plain request), the ones that cannot be honoured (a 400 naming the field and the fix), a first request of 15 tools
and a long system prompt, and schemas nested too deeply (a 400, the connection kept).

The model is a tiny random Llama GGUF with the default model's vocabulary and Qwen2.5's chat template (the native
tool-call format), its context raised to a long-context model's so that a coding agent's first prompt fits.
"""

# ruff: noqa: E402
from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

# the server extra (fastapi, uvicorn) and the clients the tests speak through (httpx, openai: the dev tools)
for _module in ("fastapi", "uvicorn", "httpx", "openai"):
    pytest.importorskip(_module, reason="needs the server extra and httpx, openai: pip install 'specwise[server,dev]'")

import httpx
import openai
from test_server import live_server
from test_tools import QWEN_TEMPLATE, WEATHER, tiny_tool_gguf

from specwise.runtime import build_runtime
from specwise.server.app import create_app
from specwise.server.limits import default_max_body_bytes
from specwise.tools.spec import MAX_SCHEMA_DEPTH, MAX_SCHEMA_VALUES, _cached_schema_problem

MODEL = "m"
TIMEOUT = 120.0
CONTEXT = 32_768  # Qwen2.5's: a coding agent's first request (8-17k tokens) fits
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A live server of the tiny Qwen-template model with a 32k context; yields (base URL, app)."""
    path = tiny_tool_gguf(tmp_path_factory.mktemp("clients") / "qwen.gguf", QWEN_TEMPLATE)
    runtime = build_runtime(str(path), "ngram", 4, "cpu")
    runtime.engine.target.max_length = CONTEXT  # the file says 1024; the weights do not care
    app = create_app(runtime, model_name=MODEL, default_max_tokens=16)
    with live_server(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def url(served) -> str:
    return served[0]


def api(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def create(url: str, messages=QUESTION, **kw):
    kw.setdefault("max_tokens", 8)
    return api(url).chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def post(url: str, **body) -> httpx.Response:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 0} | body
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT)


def reply(response: httpx.Response) -> tuple:
    """What the model answered: content and calls (names and arguments) of the first choice."""
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    return message["content"], calls


def parts(text: str, **extra) -> list[dict]:
    return [{"type": "text", "text": text, **extra}]


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def history(assistant_content, as_parts: bool = False) -> list[dict]:
    """A conversation through a tool call and its result; ``as_parts``: every content as text parts."""
    wrap = parts if as_parts else (lambda text: text)
    return [
        {"role": "system", "content": wrap("You are a helpful assistant.")},
        {"role": "user", "content": wrap("What is the weather in Paris?")},
        {"role": "assistant", "content": assistant_content, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": wrap("sunny, 21 C")},
    ]


# ------------------------------------------------------------------------------------------- message content


def test_content_as_text_parts_in_every_role_is_the_same_as_strings(url):
    """qwen-code and smolagents send every message's content as text parts, system and tool messages included."""
    plain = reply(post(url, messages=history(None), tools=[WEATHER]))
    assert reply(post(url, messages=history(None, as_parts=True), tools=[WEATHER])) == plain
    split = [{"type": "text", "text": "What is the "}, {"type": "text", "text": "weather in Paris?"}]
    assert reply(post(url, messages=[{"role": "user", "content": split}])) == reply(post(url))


def test_cache_control_on_a_part_is_ignored(url):
    marked = [{"role": "user", "content": parts(QUESTION[0]["content"], cache_control={"type": "ephemeral"})}]
    assert reply(post(url, messages=marked)) == reply(post(url))
    other = [{"role": "user", "content": parts("hi", colour="red")}]  # any other key is still refused
    response = post(url, messages=other)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages[0].content[0].colour"


@pytest.mark.parametrize("content", [None, "", []], ids=["null", "empty", "no-parts"])
def test_assistant_content_null_or_empty_beside_tool_calls(url, content):
    assert reply(post(url, messages=history(content), tools=[WEATHER])) == reply(
        post(url, messages=history(None), tools=[WEATHER])
    )


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_an_earlier_replys_thinking_sent_back_is_taken(url, field):
    """Clients send the reasoning of an earlier reply back with it: reasoning_content as this server writes it
    (the template renders it or not), reasoning as others do (ignored)."""
    messages = history(None)
    messages[2][field] = "The user wants the weather: call the tool."
    assert post(url, messages=messages, tools=[WEATHER]).status_code == 200


def test_an_earlier_reply_sent_back_as_the_openai_client_returned_it(url):
    """Agents append the reply's message as the client parsed it: refusal, annotations, audio and function_call
    come back null."""
    message = create(url).choices[0].message.model_dump()
    assert {"refusal", "annotations", "audio", "function_call"} <= message.keys()
    response = post(url, messages=[*QUESTION, message, {"role": "user", "content": "And in Rome?"}])
    assert response.status_code == 200, response.text


# ------------------------------------------------------------------------------------------ budget and usage


def test_max_completion_tokens_bounds_the_reply(url):
    answer = create(url, max_tokens=None, max_completion_tokens=3, stop=None)
    assert answer.usage.completion_tokens <= 3
    assert answer.choices[0].finish_reason in ("length", "stop")


def test_usage_in_a_non_streamed_reply(url):
    usage = create(url).usage
    assert usage.prompt_tokens > 5 and 1 <= usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_stream_options_include_usage_ends_with_a_usage_chunk(url):
    chunks = list(create(url, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = create(url)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_as_a_list(url):
    free = create(url, max_tokens=12).choices[0].message.content
    assert free, "the tiny model says something"
    stop = free[len(free) // 2 :][:3] or free
    answer = create(url, max_tokens=12, stop=[stop, "\n\nUser:"]).choices[0]
    assert answer.message.content == free[: free.index(stop)] and answer.finish_reason == "stop"


# ------------------------------------------------------------------------------------------- tools and formats

FINAL_ANSWER = {
    "type": "function",
    "function": {
        "name": "final_answer",
        "description": "Give the final answer to the task.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "maxLength": 20}},
            "required": ["answer"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
STRICT_WEATHER = {"type": "function", "function": WEATHER["function"] | {"strict": True}}


def test_required_with_a_strict_final_answer_tool(url):
    """smolagents' ToolCallingAgent: tool_choice required, a final_answer tool, strict functions, closed schemas."""
    answer = create(url, tools=[STRICT_WEATHER, FINAL_ANSWER], tool_choice="required", max_tokens=60)
    calls = answer.choices[0].message.tool_calls
    assert calls and answer.choices[0].message.content is None
    for call in calls if answer.choices[0].finish_reason == "tool_calls" else []:
        arguments = json.loads(call.function.arguments)
        expected = {"answer"} if call.function.name == "final_answer" else {"city"}
        assert set(arguments) == expected  # additionalProperties false: no other key


@pytest.mark.parametrize("parallel", [False, True])
def test_parallel_tool_calls(url, parallel):
    answer = create(
        url, tools=[WEATHER, FINAL_ANSWER], tool_choice="required", parallel_tool_calls=parallel, max_tokens=80
    )
    calls = answer.choices[0].message.tool_calls
    assert calls
    if not parallel:
        assert len(calls) == 1


def test_response_format_json_schema_strict(url):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "weather", "strict": True, "schema": schema}}
    answer = create(url, response_format=response_format, max_tokens=40)
    if answer.choices[0].finish_reason == "stop":
        assert set(json.loads(answer.choices[0].message.content)) == {"city", "sunny"}


# ----------------------------------------------------------------------------------- fields that change nothing

IGNORED = {
    "store": False,
    "metadata": {"session": "abc", "client": "agent"},
    "reasoning_effort": "low",
    "service_tier": "auto",
    "prompt_cache_key": "session-abc",
    "prompt_cache_retention": "24h",
    "safety_identifier": "user-1234",
    "user": "someone",
    "logit_bias": {},
    "n": 1,
    "modalities": ["text"],
    "frequency_penalty": 0,
    "presence_penalty": 0.0,
    "verbosity": "medium",
    "audio": None,
    "functions": None,
    "function_call": None,
    "stream_options": {"include_usage": True, "include_obfuscation": False},
}


@pytest.mark.parametrize(("field", "value"), IGNORED.items(), ids=IGNORED.keys())
def test_a_field_sent_by_default_changes_nothing(url, field, value):
    assert reply(post(url, **{field: value})) == reply(post(url))


def test_all_the_ignored_fields_at_once_through_the_openai_client(url):
    kw = {k: v for k, v in IGNORED.items() if k not in ("audio", "functions", "function_call", "stream_options")}
    answer = create(url, **kw)
    assert answer.choices[0].message.content == create(url).choices[0].message.content


# ---------------------------------------------------------------------------------- fields refused, with the fix

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
REFUSED = {
    "a bias on tokens": ({"logit_bias": {"1234": 5}}, "logit_bias", "send {}"),
    "audio output": ({"modalities": ["text", "audio"]}, "modalities", '["text"]'),
    "audio settings": ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio", "text only"),
    "legacy functions": ({"functions": [WEATHER["function"]]}, "functions", "send tools="),
    "legacy function_call": ({"function_call": "auto"}, "function_call", "tool_choice"),
    "web search": ({"web_search_options": {}}, "web_search_options", "leave web_search_options out"),
    "an image part": (
        {"messages": [{"role": "user", "content": [*parts("What is this?"), IMAGE]}]},
        "messages[0].content",
        "content[1] is a part of type 'image_url'",
    ),
    "a legacy function message": (
        {"messages": [*QUESTION, {"role": "function", "name": "get_weather", "content": "sunny"}]},
        "messages[1].role",
        '"role": "tool"',
    ),
    "a legacy function_call in the history": (
        {"messages": [*QUESTION, {"role": "assistant", "content": None, "function_call": CALL["function"]}]},
        "messages[1].function_call",
        "tool_calls",
    ),
    "a penalty": ({"frequency_penalty": 0.5}, "frequency_penalty", "use 0"),
}


@pytest.mark.parametrize(("body", "param", "fix"), REFUSED.values(), ids=REFUSED.keys())
def test_what_cannot_be_honoured_gets_a_400_naming_the_field_and_the_fix(url, body, param, fix):
    response = post(url, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert fix in error["message"], error


def test_the_openai_client_sees_a_bad_request_naming_the_field(url):
    with pytest.raises(openai.BadRequestError) as caught:
        create(url, functions=[WEATHER["function"]], function_call="auto")
    assert caught.value.body["param"] == "functions"


# ------------------------------------------------------------------------------ a coding agent's first request


def tool(name: str, description: str, properties: dict, required: list[str], **extra) -> dict:
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters | extra},
    }


def text(description: str, **extra) -> dict:
    return {"type": "string", "description": description, **extra}


def agent_tools() -> list[dict]:
    """Fifteen tools in the shapes coding agents write (zod's and pydantic's JSON schemas: $schema, enums, nullable
    unions, $defs and $ref, numbers with bounds, arrays of objects), each with a long description."""
    todo = {"type": "object", "properties": {"content": text("the task"), "status": {"enum": ["pending", "done"]}}}
    todo |= {"required": ["content", "status"], "additionalProperties": False}
    edit = {"type": "object", "properties": {"old": text("text to replace"), "new": text("its replacement")}}
    edit |= {"required": ["old", "new"]}
    tools = [
        tool(
            "bash",
            "Run a shell command.",
            {"command": text("the command"), "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 600000}},
            ["command"],
            **{"$schema": "http://json-schema.org/draft-07/schema#"},
        ),  # noqa: E501
        tool(
            "read",
            "Read a file.",
            {
                "path": text("absolute path"),
                "offset": {"type": ["integer", "null"]},
                "limit": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}], "default": None},
            },
            ["path"],
        ),  # noqa: E501
        tool(
            "write",
            "Write a file.",
            {"path": text("absolute path"), "content": text("the whole file")},
            ["path", "content"],
        ),  # noqa: E501
        tool(
            "edit",
            "Replace text in a file.",
            {
                "path": text("absolute path"),
                "old_string": text("exact text"),
                "new_string": text("replacement"),
                "replace_all": {"type": "boolean", "default": False},
            },
            ["path", "old_string", "new_string"],
        ),  # noqa: E501
        tool(
            "multi_edit",
            "Several edits of one file.",
            {
                "path": text("absolute path"),
                "edits": {"type": "array", "items": {"$ref": "#/$defs/Edit"}, "minItems": 1},
            },
            ["path", "edits"],
            **{"$defs": {"Edit": edit}},
        ),  # noqa: E501
        tool("glob", "Find files by pattern.", {"pattern": text("a glob"), "path": text("where to look")}, ["pattern"]),
        tool(
            "grep",
            "Search file contents.",
            {
                "pattern": text("a regular expression"),
                "include": text("file glob"),
                "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
            },
            ["pattern"],
        ),  # noqa: E501
        tool(
            "list",
            "List a directory.",
            {"path": text("absolute path"), "ignore": {"type": "array", "items": {"type": "string"}}},
            [],
        ),  # noqa: E501
        tool("todo_write", "Update the task list.", {"todos": {"type": "array", "items": todo}}, ["todos"]),
        tool("todo_read", "Read the task list.", {}, []),
        tool(
            "web_fetch",
            "Fetch a URL.",
            {"url": text("the address", format="uri"), "format": {"enum": ["text", "markdown", "html"]}},
            ["url", "format"],
        ),  # noqa: E501
        tool(
            "task",
            "Start a sub-agent on a task.",
            {"description": text("3-5 words"), "prompt": text("the task"), "subagent_type": text("which agent")},
            ["description", "prompt", "subagent_type"],
        ),  # noqa: E501
        tool("patch", "Apply a unified diff.", {"diff": text("the patch", pattern="^---")}, ["diff"]),
        tool(
            "ask_user",
            "Ask the user a question.",
            {
                "question": text("the question"),
                "options": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            },
            ["question"],
        ),  # noqa: E501
        FINAL_ANSWER,
    ]
    guidance = " ".join(
        f"Usage note {i}: prefer the dedicated tool over the shell for this kind of work." for i in range(12)
    )  # noqa: E501
    for entry in tools:
        entry["function"]["description"] += " " + guidance
    return tools


SYSTEM_PROMPT = "You are a coding agent working in a repository. " + " ".join(
    f"Rule {i}: keep answers short, read files before editing them, and run the tests after each change."
    for i in range(400)
)


def test_a_first_request_with_15_tools_and_a_long_system_prompt(served):
    """An agent's first request: 8-17k tokens of system prompt and tool schemas, text parts, streamed with
    usage. Within the default body limit of any context, and answered."""
    url, app = served
    messages = [{"role": "system", "content": parts(SYSTEM_PROMPT)}, {"role": "user", "content": parts("Fix the bug.")}]
    body = {"model": MODEL, "messages": messages, "tools": agent_tools(), "tool_choice": "auto", "max_tokens": 4}
    body |= {"stream": True, "stream_options": {"include_usage": True}, "parallel_tool_calls": True, "store": False}
    size = len(json.dumps(body))
    assert size < default_max_body_bytes(None) == default_max_body_bytes(8192) == app.state.server.max_body_bytes
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200, response.read()
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert 8_000 <= usage["prompt_tokens"] <= 17_000, usage
    print(f"a coding agent's first request: {size} bytes, {usage['prompt_tokens']} tokens")


def test_a_long_first_request_past_a_small_context_is_a_400_not_a_413(served):
    url, app = served
    target = app.state.server.runtime.engine.target
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Fix the bug."}]
    target.max_length = 8192  # the default model's context
    try:
        response = post(url, messages=messages, tools=agent_tools())
    finally:
        target.max_length = CONTEXT
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded", error
    assert error["param"] == "messages" and "the model's context is 8192" in error["message"]


# --------------------------------------------------------------------------------------- schemas nested deeply


def nested(depth: int) -> dict:
    """An object schema nesting objects and arrays exactly ``depth`` levels deep (the schema itself is level 1)."""
    inner: dict = {"type": "string"}
    for _ in range(depth - 3):
        inner = {"type": "array", "items": inner}
    return {"type": "object", "properties": {"a": inner}}


def deep_tool(depth: int) -> list[dict]:
    return [{"type": "function", "function": {"name": "deep", "parameters": nested(depth)}}]


def deep_format(depth: int) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "deep", "schema": nested(depth)}}


def test_schemas_at_the_depth_limit_are_taken(url):
    assert post(url, tools=deep_tool(MAX_SCHEMA_DEPTH), tool_choice="required").status_code == 200
    assert post(url, response_format=deep_format(MAX_SCHEMA_DEPTH)).status_code == 200


DEEP = {
    "tool 65 levels": ({"tools": deep_tool(MAX_SCHEMA_DEPTH + 1)}, "tools[0].function.parameters"),
    "tool 400 levels": ({"tools": deep_tool(400)}, "tools[0].function.parameters"),
    "second tool 400 levels": ({"tools": [WEATHER, *deep_tool(400)]}, "tools[1].function.parameters"),
    "response_format 65 levels": ({"response_format": deep_format(MAX_SCHEMA_DEPTH + 1)}, "response_format"),
    "response_format 400 levels": ({"response_format": deep_format(400)}, "response_format"),
}


@pytest.mark.parametrize(("body", "param"), DEEP.values(), ids=DEEP.keys())
def test_a_schema_nested_too_deeply_is_a_400_and_the_connection_serves_on(url, body, param):
    parts_ = urlsplit(url)
    connection = http.client.HTTPConnection(parts_.hostname, parts_.port, timeout=TIMEOUT)
    try:
        payload = json.dumps({"model": MODEL, "messages": QUESTION, "max_tokens": 2} | body)
        connection.request("POST", "/v1/chat/completions", payload, {"content-type": "application/json"})
        response = connection.getresponse()
        error = json.loads(response.read())["error"]
        assert response.status == 400 and error["param"] == param, error
        assert f"more than {MAX_SCHEMA_DEPTH} levels deep" in error["message"]
        assert response.getheader("connection") != "close"
        sock = connection.sock
        plain = json.dumps({"model": MODEL, "messages": QUESTION, "max_tokens": 2})
        connection.request("POST", "/v1/chat/completions", plain, {"content-type": "application/json"})
        again = connection.getresponse()
        assert again.status == 200 and json.loads(again.read())["choices"]
        assert connection.sock is sock  # the same connection answered
    finally:
        connection.close()


# ------------------------------------------------------------------------- schemas that point into themselves

NODE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 1},
    },  # noqa: E501
    "required": ["name", "children"],
    "additionalProperties": False,
}
EDIT = {
    "type": "object",
    "properties": {"old": {"type": "string", "maxLength": 6}, "new": {"type": "string", "maxLength": 6}},
}  # noqa: E501
EDIT |= {"required": ["old", "new"], "additionalProperties": False}
POINTING = {
    "type": "function",
    "function": {
        "name": "apply",
        "parameters": {
            "type": "object",
            "properties": {
                "edits": {"type": "array", "items": {"$ref": "#/$defs/Edit"}, "maxItems": 2},
                "tree": {"$ref": "#/$defs/Node"},
            },  # noqa: E501
            "required": ["edits", "tree"],
            "additionalProperties": False,
            "$defs": {"Edit": EDIT, "Node": NODE},
        },
    },
}


def test_a_schema_with_defs_and_refs_as_pydantic_writes_it(url):
    """pydantic (pydantic-ai, instructor, the Agents SDK) names nested models in $defs and points to them, a tree
    to itself: the call's grammar still resolves them, and the call follows them."""
    named = {"type": "function", "function": {"name": "apply"}}
    answer = create(url, tools=[WEATHER, POINTING], tool_choice=named, max_tokens=200)
    [call] = answer.choices[0].message.tool_calls
    assert call.function.name == "apply"
    head = '{"edits": '  # the random model may nest the tree until the budget ends: read the edits alone
    assert call.function.arguments.startswith(head), call.function.arguments
    edits, end = json.JSONDecoder().raw_decode(call.function.arguments[len(head) :])
    assert edits and all(set(edit) == {"old", "new"} for edit in edits)
    assert call.function.arguments[len(head) + end :].startswith(', "tree": {"name": ')


def test_the_prompt_shows_the_schema_as_given():
    from specwise.tools import tool_request

    [function] = tool_request([POINTING], None, None).functions
    assert function.openai()["function"]["parameters"] == POINTING["function"]["parameters"]
    assert function.parameters == {"$id": "urn:specwise:tool:apply", **POINTING["function"]["parameters"]}


# ------------------------------------------------------------------------------------- the work of checking tools


def test_tools_past_the_schema_budget_are_a_400_before_any_is_checked(url):
    """128 tools of 200 properties (within the body limit): each schema costs tens of milliseconds to check, so
    a request's schemas are bounded in all, and counted before any is checked."""
    properties = {f"p{i}": {"type": "string"} for i in range(200)}
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object", "properties": properties}}}
        for i in range(128)
    ]
    response = post(url, tools=tools)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "tools", error
    assert f"more than {MAX_SCHEMA_VALUES} JSON values" in error["message"] and "tools[" in error["message"]


def test_the_same_tools_are_checked_once(url):
    """Agents send the same tools every turn: a schema checked once is not checked again."""
    tools = agent_tools()
    assert post(url, tools=tools).status_code == 200
    before = _cached_schema_problem.cache_info()
    assert post(url, tools=tools).status_code == 200
    after = _cached_schema_problem.cache_info()
    assert after.misses == before.misses and after.hits >= before.hits + len(tools)
