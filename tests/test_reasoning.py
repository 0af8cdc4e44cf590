"""A thinking model's reasoning apart from its answer, on Qwen3's real vocabulary and chat template (a tiny random
model around tests/fixtures/qwen2.5-coder.vocab.gguf.gz with Qwen3's four added tokens, ``<think>`` among them):
the splitter alone, the grammar of tool calls after thinking, and the server's chat completions (streamed and not,
``--reasoning-format none``, ``chat_template_kwargs``). The output is forced by a grammar naming the tags by id, so
that a random model writes a known reply."""

# ruff: noqa: E402
from __future__ import annotations

import json

import pytest

for _module in ("fastapi", "uvicorn", "httpx", "openai", "llguidance"):
    pytest.importorskip(
        _module, reason="needs the server and constrained extras and openai: pip install 'specwise[dev]'"
    )

import httpx
from test_server import live_server
from test_tools import accepts
from vocab_models import QWEN3_TOKENS, qwen3_template, tiny_vocab_gguf

from specwise.models import load_model
from specwise.runtime import build_runtime
from specwise.server.app import create_app
from specwise.tools import FORMATS, CallStart, ContentPiece, ReasoningPiece, ReplyReader, tool_request
from specwise.tools.reasoning import ReasoningSplitter, ThinkingTags, thinking_tags

MODEL = "m"
THINK, END = 151667, 151668
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# the reply forced on the random model: thinking, then the answer
FORCED = f'start: <[{THINK}]> "\\nThe user greets me.\\n" <[{END}]> "\\n\\nHello there!"'
R1_TEMPLATE = qwen3_template().replace(
    "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}"
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def qwen3_gguf(tmp_path_factory):
    return tiny_vocab_gguf(
        tmp_path_factory.mktemp("qwen3") / "tiny-qwen3.gguf", template=qwen3_template(), set_tokens=QWEN3_TOKENS
    )


@pytest.fixture(scope="module")
def qwen3(qwen3_gguf):
    return load_model(str(qwen3_gguf))


def served(target, **options):
    app = create_app(build_runtime(str(target), "ngram", 4, "cpu"), model_name=MODEL, default_max_tokens=48, **options)
    with live_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def server(qwen3_gguf):
    yield from served(qwen3_gguf)


def chat(url: str, **body) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, **body}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def stream(url: str, **body) -> tuple[str, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "stream": True, **body}
    reasoning = content = ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                reasoning += choice["delta"].get("reasoning_content") or ""
                content += choice["delta"].get("content") or ""
    return reasoning, content


def test_the_tags_are_found_in_qwen3s_template_and_vocabulary(qwen3):
    tags = thinking_tags(qwen3.tokenizer)
    assert tags == ThinkingTags("<think>", "</think>", THINK, END)
    assert qwen3.tokenizer.decode([THINK, END]) == "<think></think>"  # added tokens that decoding writes


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_the_splitter_gives_the_same_split_whatever_the_pieces(size):
    tags = ThinkingTags("<think>", "</think>", THINK, END)
    cases = [
        (False, "<think>\nStep one.\nStep two.\n</think>\n\nThe answer.", "Step one.\nStep two.", "The answer."),
        (False, "\n<think>\n\n</think>\n\nA", "", "A"),
        (False, "No thinking here.", "", "No thinking here."),
        (False, "<thinking is a word", "", "<thinking is a word"),
        (True, "Still thinking.\n</think>\n\nDone.", "Still thinking.", "Done."),
        (True, "Cut short, never closed", "Cut short, never closed", ""),
    ]
    for inside, text, reasoning, answer in cases:
        splitter, got = ReasoningSplitter(tags, inside), ["", ""]
        for i in range(0, len(text), size):
            r, a = splitter.feed(text[i : i + size], i + size >= len(text))
            got[0], got[1] = got[0] + r, got[1] + a
        assert got == [reasoning, answer], text


def test_calls_after_thinking_are_read_and_allowed_by_the_grammar(qwen3):
    tokenizer = qwen3.tokenizer
    tags = thinking_tags(tokenizer)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    text = f"<think>\nI should look it up.\n</think>\n\n{call}"
    for choice in ("auto", "required"):
        request = tool_request([WEATHER], choice, None)
        reader = ReplyReader(FORMATS["hermes"].parser(request), tokenizer, set(), [], ReasoningSplitter(tags))
        ids = tokenizer.encode(text, add_special_tokens=False)
        pieces = [
            p for i in range(len(ids)) for p in reader.feed(tokenizer.decode([ids[i]]), [ids[i]], i == len(ids) - 1)
        ]
        assert "".join(p.text for p in pieces if isinstance(p, ReasoningPiece)) == "I should look it up."
        assert [p.name for p in pieces if isinstance(p, CallStart)] == ["get_weather"]
        assert not [p for p in pieces if isinstance(p, ContentPiece)]
        constraint = FORMATS["hermes"].constraint(request, tokenizer, tags)
        assert accepts(constraint, tokenizer, text) and accepts(constraint, tokenizer, call)
        assert accepts(constraint, tokenizer, "I should look it up.\n</think>\n\n" + call)  # a template opened it
    assert not accepts(FORMATS["hermes"].constraint(tool_request([WEATHER], "required", None), tokenizer, tags),
                       tokenizer, "<think>\nhm\n</think>\n\nNo call.")  # fmt: skip


def test_chat_gives_the_reasoning_apart(server):
    message = chat(server, grammar=FORCED)["choices"][0]["message"]
    assert message["reasoning_content"] == "The user greets me." and message["content"] == "Hello there!"
    assert stream(server, grammar=FORCED) == ("The user greets me.", "Hello there!")


def test_reasoning_format_none_leaves_it_inline(qwen3_gguf):
    for url in served(qwen3_gguf, reasoning_format="none"):
        message = chat(url, grammar=FORCED)["choices"][0]["message"]
        assert "reasoning_content" not in message
        assert message["content"] == "<think>\nThe user greets me.\n</think>\n\nHello there!"


def test_a_template_that_opens_the_thinking(tmp_path):
    """DeepSeek-R1's distills and Qwen3's thinking models: the prompt ends with ``<think>``, the reply starts
    inside it."""
    target = tiny_vocab_gguf(tmp_path / "r1.gguf", template=R1_TEMPLATE, set_tokens=QWEN3_TOKENS)
    for url in served(target):
        forced = f'start: "I think so." <[{END}]> "\\n\\nYes."'
        message = chat(url, grammar=forced)["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == ("I think so.", "Yes.")


def test_chat_template_kwargs_reach_the_template(server):
    """Qwen3's ``enable_thinking: false`` writes an empty thinking block into the prompt."""
    plain = chat(server, max_tokens=1)["usage"]["prompt_tokens"]
    quiet = chat(server, max_tokens=1, chat_template_kwargs={"enable_thinking": False})["usage"]["prompt_tokens"]
    assert quiet > plain
    bad = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"tools": 1}},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"


def test_an_earlier_replys_reasoning_is_taken_back(server):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."},
        {"role": "user", "content": "Again"},
    ]
    assert chat(server, messages=messages, max_tokens=2)["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.fixture
def forced(monkeypatch):
    """Every chat job constrained to FORCED (the Messages API has no grammar field of its own)."""
    from dataclasses import replace

    from specwise.constraints import Grammar
    from specwise.server import chat

    tools = chat.chat_tools

    def forced_tools(state, body):
        return replace(tools(state, body), constraint=Grammar(FORCED))

    monkeypatch.setattr(chat, "chat_tools", forced_tools)


def test_messages_give_thinking_blocks(server, forced):
    body = {"model": "any", "max_tokens": 48, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
    reply = httpx.post(f"{server}/v1/messages", json=body, timeout=120).json()
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in reply["content"]] == [
        ("thinking", "The user greets me."),
        ("text", "Hello there!"),
    ]
    deltas = {"thinking_delta": "", "text_delta": ""}
    with httpx.stream("POST", f"{server}/v1/messages", json={**body, "stream": True}, timeout=120) as events:
        for line in events.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                delta = event.get("delta", {})
                if delta.get("type") in deltas:
                    deltas[delta["type"]] += delta.get("thinking", delta.get("text", ""))
    assert deltas == {"thinking_delta": "The user greets me.", "text_delta": "Hello there!"}
