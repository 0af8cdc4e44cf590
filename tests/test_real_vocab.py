"""Tool calls, stop tokens and fill-in-the-middle on the vocabulary users run for code: a tiny random model around
Qwen2.5-Coder's real tokenizer metadata (tests/fixtures/qwen2.5-coder.vocab.gguf.gz: its 151,936 tokens, types,
merges, special ids and chat template), through the server with the official openai client; and the real
Qwen2.5-Coder-1.5B file where ``$SPECWISE_TEST_GGUF_DIR`` holds it (the weather example of OpenAI's docs).

On that vocabulary ``<tool_call>`` is one added token that ordinary decoding writes as text but the grammar engine
holds special: the grammar must name it by id, or a forced call ends before it starts.
"""

# ruff: noqa: E402
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

for _module in ("fastapi", "uvicorn", "httpx", "openai", "llguidance"):
    pytest.importorskip(
        _module, reason="needs the server and constrained extras and openai: pip install 'specwise[dev]'"
    )

import openai
from test_server import live_server
from vocab_models import GEMMA_TEMPLATE, GEMMA_VOCAB, tiny_vocab_gguf

from specwise.models import load_model
from specwise.runtime import build_runtime, eos_ids
from specwise.server.app import create_app
from specwise.tools import FORMATS, ReplyReader, tool_request
from specwise.tools.loose import matches_schema

MODEL = "m"
GGUF_DIR = Path(os.environ.get("SPECWISE_TEST_GGUF_DIR", "~/.cache/specwise/gguf")).expanduser()
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get current temperature for a given location.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia"}},
            "required": ["location"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}},
    },
}
# for the random model: arguments it can finish within a few tokens
CITY = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "enum": ["Paris, France", "Rome, Italy"]}},
            "required": ["location"],
            "additionalProperties": False,
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def qwen_vocab_gguf(tmp_path_factory) -> Path:
    return tiny_vocab_gguf(tmp_path_factory.mktemp("vocab") / "tiny-qwen-coder.gguf")


def serve(target: str, drafter: str = "ngram"):
    app = create_app(build_runtime(target, drafter, 4, "cpu"), model_name=MODEL, default_max_tokens=64)
    with live_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def qwen(qwen_vocab_gguf):
    yield from serve(str(qwen_vocab_gguf))


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=300.0, max_retries=0)


def calls_of(reply) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in reply.choices[0].message.tool_calls or []]


def streamed_calls(url: str, **kw) -> tuple[str, list[tuple[str, dict]], str]:
    content, calls, finish = "", {}, None
    stream = client(url).chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, stream=True, **kw)
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"name": delta.function.name, "arguments": ""})
            entry["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [(c["name"], json.loads(c["arguments"])) for c in calls.values()], finish


def test_the_vocabulary_is_qwens(qwen_vocab_gguf):
    loaded = load_model(str(qwen_vocab_gguf))
    tokenizer = loaded.tokenizer
    assert loaded.model.vocab_size == 151936
    assert tokenizer.encode("<tool_call>", add_special_tokens=False) == [151657]
    assert tokenizer.decode([151657]) == "<tool_call>"  # an added token that decoding writes
    assert eos_ids(loaded) == {151643, 151645}  # <|endoftext|> ends a reply too, as Qwen writes it after calls
    constraint = FORMATS["hermes"].constraint(tool_request([WEATHER], "required", None), tokenizer)
    assert "<[151657]>" in constraint.lark and "<[151658]>" in constraint.lark


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_come_back_as_calls(qwen, choice):
    reply = client(qwen).chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[CITY, CLOCK], tool_choice=choice, temperature=0, max_tokens=64
    )
    assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None
    calls = calls_of(reply)
    assert calls and reply.usage.completion_tokens > 0
    if isinstance(choice, dict):
        assert {name for name, _ in calls} == {"get_weather"}
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (CITY, CLOCK)}
    assert all(matches_schema(arguments, schemas[name]) for name, arguments in calls)


def test_a_streamed_forced_call_is_the_unstreamed_one(qwen):
    kw = {"tools": [CITY], "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 64}
    whole = client(qwen).chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, **kw)
    content, calls, finish = streamed_calls(qwen, **kw)
    assert calls == calls_of(whole) and finish == whole.choices[0].finish_reason and content == ""


def test_speculative_calls_equal_plain_ones(qwen_vocab_gguf, qwen):
    kw = {"tools": [CITY, CLOCK], "tool_choice": "required", "temperature": 0, "max_tokens": 48}
    speculative = client(qwen).chat.completions.create(model=MODEL, messages=QUESTION, **kw)
    for url in serve(str(qwen_vocab_gguf), "none"):
        plain = client(url).chat.completions.create(model=MODEL, messages=QUESTION, **kw)
    assert [(c.function.name, c.function.arguments) for c in speculative.choices[0].message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in plain.choices[0].message.tool_calls
    ]


FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "location": "Paris, France"\n  }\n}\n```'


@pytest.mark.parametrize(
    "text, calls",
    [
        (FENCED, [("get_weather", {"location": "Paris, France"})]),
        ('{"name": "get_weather", "arguments": {"location": "Rome"}}', [("get_weather", {"location": "Rome"})]),
        ('{{"name": "get_weather", "arguments": {"location": "Rome"}}', [("get_weather", {"location": "Rome"})]),
        ('{{"name": "get_weather", "arguments": {"location": "Rome"}}}', [("get_weather", {"location": "Rome"})]),
        ('{{"name": "get_weather", "arguments": {"location": "Rome"}}}}', [("get_weather", {"location": "Rome"})]),
        ('{{"name": "get_weather", "arguments": {"location": "Rome"}}} Done', []),
        ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', [("get_time", {})]),
        ('```json\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n```', []),  # not its schema: content
        ('```json\n{"name": "send_mail", "arguments": {}}\n```', []),  # not a listed function
        ("```python\nprint('hi')\n```", []),
        ("Sunny in Paris.", []),
    ],
)
def test_auto_reads_every_form_qwen_writes_a_call_in(qwen_vocab_gguf, text, calls):
    """Under ``auto`` Qwen2.5-Coder often writes its call as a fenced JSON block; a reply that is only such a block
    (or a bare object, or its own tags) naming a listed function with arguments of its schema is a call, whatever
    the pieces the tokens arrive in; anything else is content, unchanged."""
    tokenizer = load_model(str(qwen_vocab_gguf)).tokenizer
    request = tool_request([WEATHER, CLOCK], "auto", None)
    ids = tokenizer.encode(text, add_special_tokens=False)
    for size in (1, 3, len(ids)):
        reader = ReplyReader(FORMATS["hermes"].parser(request), tokenizer, set(), [])
        content = ""
        for i in range(0, len(ids), size):
            piece = ids[i : i + size]
            pieces = reader.feed(tokenizer.decode(piece), piece, i + size >= len(ids))
            content += "".join(getattr(p, "text", "") for p in pieces if type(p).__name__ == "ContentPiece")
        got = [(c.name, json.loads(c.arguments)) for c in reader.calls]
        assert got == calls, size
        assert content == ("" if calls else text), size


def test_fill_in_the_middle_uses_qwens_fim_tokens(qwen):
    reply = client(qwen).completions.create(
        model=MODEL, prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n", max_tokens=8, temperature=0
    )
    assert reply.usage.prompt_tokens > 3 and reply.choices[0].finish_reason in ("stop", "length")


# ------------------------------------------------------------------------- Gemma 3's vocabulary: the generic format


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory) -> Path:
    return tiny_vocab_gguf(tmp_path_factory.mktemp("gemma") / "tiny-gemma3.gguf", GEMMA_VOCAB, GEMMA_TEMPLATE)


@pytest.fixture(scope="module")
def gemma(gemma_gguf):
    yield from serve(str(gemma_gguf))


def test_gemmas_vocabulary_ends_turns_and_has_no_tool_tags(gemma_gguf):
    loaded = load_model(str(gemma_gguf))
    assert loaded.model.vocab_size == 262144
    assert eos_ids(loaded) == {1, 106}  # <eos> and <end_of_turn>
    assert FORMATS["generic"] is __import__("specwise.tools", fromlist=["detect_format"]).detect_format(GEMMA_TEMPLATE)


def test_gemma_calls_in_the_generic_format(gemma):
    reply = client(gemma).chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[CITY], tool_choice="required", parallel_tool_calls=False,
        temperature=0, max_tokens=64,
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "tool_calls"
    assert [name for name, _ in calls_of(reply)] == ["get_weather"]
    assert all(matches_schema(args, CITY["function"]["parameters"]) for _, args in calls_of(reply))


def test_gemma_has_no_fim_tokens(gemma):
    with pytest.raises(openai.BadRequestError) as err:
        client(gemma).completions.create(model=MODEL, prompt="def f(", suffix="\n", max_tokens=4)
    assert err.value.status_code == 400 and "suffix" in str(err.value)


# ---------------------------------------------------------------------------------- the real file, when present


def real_qwen() -> Path:
    found = sorted(GGUF_DIR.glob("*[Qq]wen2.5-[Cc]oder-1.5[Bb]-[Ii]nstruct*.gguf")) if GGUF_DIR.is_dir() else []
    if not found:
        pytest.skip(f"no Qwen2.5-Coder-1.5B-Instruct GGUF in {GGUF_DIR} (set SPECWISE_TEST_GGUF_DIR)")
    return found[0]


@pytest.fixture(scope="module")
def real(request):
    yield from serve(str(real_qwen()), "none")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}, "auto"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_real_file_calls_the_weather_tool(real, choice, stream):
    kw = {"tools": [WEATHER], "tool_choice": choice, "max_tokens": 80}
    if stream:
        content, calls, finish = streamed_calls(real, **kw)
    else:
        reply = client(real).chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, **kw)
        calls, finish = calls_of(reply), reply.choices[0].finish_reason
    assert finish == "tool_calls" and [name for name, _ in calls] == ["get_weather"]
    assert matches_schema(calls[0][1], WEATHER["function"]["parameters"]) and "Paris" in calls[0][1]["location"]


def test_schema_keywords_the_grammar_cannot_enforce_do_not_refuse_the_tool(qwen):
    """Agents' tool schemas use keywords llguidance does not implement (Claude Code's ``propertyNames``,
    ``uniqueItems``): they are left unchecked, the rest of the schema constrains the call."""
    edit = {
        "type": "function",
        "function": {
            "name": "edit",
            "parameters": {
                "type": "object",
                "properties": {
                    "paths": {"type": "array", "items": {"type": "string", "enum": ["a.py"]}, "uniqueItems": True},
                    "opts": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "maxProperties": 0},
                },
                "required": ["paths"],
                "additionalProperties": False,
            },
        },
    }
    reply = client(qwen).chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[edit], tool_choice="required", parallel_tool_calls=False,
        temperature=0, max_tokens=48,
    )  # fmt: skip
    name, arguments = calls_of(reply)[0]
    assert name == "edit" and set(arguments) <= {"paths", "opts"} and set(arguments["paths"]) <= {"a.py"}
