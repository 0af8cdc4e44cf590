"""Tool calls without the server: the tools checked, the format read from the chat template, the conversation
rendered, the grammars (what they accept and refuse), the parsers (the same answer whatever the pieces the text
comes in), special marker tokens kept, and speculation keeping the constrained target's greedy output exactly.

The native format's model is a tiny random GGUF written here with the default model's vocabulary and Qwen2.5's
chat template (tests/fixtures), in which ``<tool_call>`` is plain text; a second file adds ``<tool_call>`` and
``</tool_call>`` as special tokens, which ordinary decoding drops.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specwise.constraints import GrammarState
from specwise.sampling import SamplingParams
from specwise.tools import (
    FORMATS,
    ArgumentsPiece,
    CallStart,
    ContentPiece,
    MarkedText,
    ToolError,
    check_history,
    detect_format,
    render_chat,
    special_token_id,
    tool_request,
)
from specwise.tools.formats.generic import GenericParser
from specwise.tools.formats.hermes import HermesParser
from specwise.tools.formats.llama_json import LlamaJsonParser

gguf = pytest.importorskip("gguf")
pytest.importorskip("llguidance")

FIXTURE = Path(__file__).parent / "fixtures" / "qwen2.5-coder-chat-template.jinja"
QWEN_TEMPLATE = FIXTURE.read_text(encoding="utf-8").split("-#}\n", 1)[1]  # after the source comment
LLAMA_TEMPLATE = (  # the parts of Llama 3.1's template that name its format
    "{%- if tools %}<|start_header_id|>user<|end_header_id|>Given the following functions, respond with a JSON "
    'for a function call: {"name": function name, "parameters": dictionary of argument name and its value}'
    "{%- endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMED = {"type": "function", "function": {"name": "get_time"}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def template_text() -> str:
    return QWEN_TEMPLATE


def tiny_tool_gguf(path: Path, template: str, special_tags: bool = False, seed: int = 0, hidden: int = 32) -> Path:
    """A tiny random Llama GGUF with the default model's vocabulary and merges and ``template`` as its chat
    template; ``special_tags``: ``<tool_call>`` and ``</tool_call>`` added as special (control) tokens."""
    from specwise.models.loader import default_gguf_path

    source = gguf.GGUFReader(default_gguf_path())

    def field(key: str):
        return source.fields[key].contents()

    tokens, types = list(field("tokenizer.ggml.tokens")), list(field("tokenizer.ggml.token_type"))
    if special_tags:
        tokens += ["<tool_call>", "</tool_call>"]
        types += [gguf.TokenType.CONTROL] * 2
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-tools")
    writer.add_block_count(1)
    writer.add_context_length(1024)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // 4)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model(field("tokenizer.ggml.model"))
    writer.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(field("tokenizer.ggml.merges")))
    writer.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))
    writer.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
    writer.add_pad_token_id(int(field("tokenizer.ggml.padding_token_id")))
    writer.add_chat_template(template)
    rng = np.random.default_rng(seed)
    h, kv = hidden, hidden // 2
    shapes = {"token_embd.weight": (len(tokens), h), "output.weight": (len(tokens), h)}
    shapes |= {f"blk.0.attn_{x}.weight": (h if x in "q output" else kv, h) for x in ("q", "k", "v", "output")}
    shapes |= {"blk.0.ffn_gate.weight": (2 * h, h), "blk.0.ffn_up.weight": (2 * h, h)}
    shapes["blk.0.ffn_down.weight"] = (h, 2 * h)
    for name, shape in shapes.items():
        std = 0.5 if name in ("token_embd.weight", "output.weight") else 1 / np.sqrt(shape[1])
        writer.add_tensor(name, (rng.standard_normal(shape) * std).astype(np.float32))
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        writer.add_tensor(name, np.ones(h, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def qwen_gguf(tmp_path_factory) -> Path:
    return tiny_tool_gguf(tmp_path_factory.mktemp("tools") / "tiny-qwen.gguf", QWEN_TEMPLATE)


@pytest.fixture(scope="session")
def qwen_special_gguf(tmp_path_factory) -> Path:
    return tiny_tool_gguf(tmp_path_factory.mktemp("tools") / "tiny-qwen-special.gguf", QWEN_TEMPLATE, True)


@pytest.fixture(scope="module")
def runtimes(qwen_gguf):
    """The tiny Qwen-template model plain and with the n-gram drafter."""
    from specwise.runtime import build_runtime

    return build_runtime(str(qwen_gguf), "none", 4, "cpu"), build_runtime(str(qwen_gguf), "ngram", 4, "cpu")


@pytest.fixture(scope="module")
def special_runtime(qwen_special_gguf):
    from specwise.runtime import build_runtime

    return build_runtime(str(qwen_special_gguf), "ngram", 4, "cpu")


# ------------------------------------------------------------------------------------------------ checking


def test_tools_are_checked_and_name_the_field():
    request = tool_request([WEATHER, TIME], NAMED, False)
    assert [f.name for f in request.callable] == ["get_time"] and not request.parallel
    assert request.choice.calls_only and request.functions[1].parameters == {"type": "object", "properties": {}}
    bad_schema = {"type": "object", "minProperties": -1}
    cases = [
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        (None, "auto", "tool_choice"),
        ([], None, "tools"),
        ([WEATHER, WEATHER], None, "tools"),
        ([{"type": "function", "function": {"name": "bad name"}}], None, "tools[0].function.name"),
        ([TIME, {"type": "function", "function": {"name": "f", "parameters": bad_schema}}], None, "tools[1]"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}], None, "tools[0]"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], None, "tools[0]"),
    ]
    for tools, choice, param in cases:
        with pytest.raises(ToolError) as info:
            tool_request(tools, choice, None)
        if param.endswith("]"):
            assert info.value.param == f"{param}.function.parameters", info.value
        else:
            assert info.value.param == param, info.value


def test_a_tool_message_must_answer_an_earlier_call():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    good = [*QUESTION, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_1"}]
    check_history(good)
    with pytest.raises(ToolError) as info:
        check_history([*QUESTION, {"role": "tool", "tool_call_id": "call_1"}, good[1]])
    assert info.value.param == "messages[1].tool_call_id"


def test_the_format_is_read_from_the_template(smol_tokenizer):
    assert detect_format(QWEN_TEMPLATE).name == "hermes"
    assert detect_format(LLAMA_TEMPLATE).name == "llama3_json"
    assert detect_format(smol_tokenizer.chat_template).name == "generic"
    assert detect_format(None).name == "generic"


# ------------------------------------------------------------------------------------------------ rendering


def test_each_format_is_one_module_holding_its_rendering_grammar_and_parser():
    """A format is one module of specwise.tools.formats, found there (REGISTERED): its ToolFormat (rendering,
    grammar) and the parser it hands out live side by side, and detect_format asks the formats in their order before
    the fallback."""
    from specwise.tools import formats

    request = tool_request([WEATHER], None, None)
    assert [cls.name for cls in formats.REGISTERED] == list(FORMATS) == ["hermes", "llama3_json", "generic"]
    for fmt in FORMATS.values():
        module = type(fmt).__module__
        assert module.startswith("specwise.tools.formats.") and module != "specwise.tools.formats.base"
        assert type(fmt.parser(request)).__module__ == module
    assert not FORMATS[formats.FALLBACK].detects(QWEN_TEMPLATE)  # the fallback is what no format detects


def test_native_rendering_uses_the_templates_tools_and_history(runtimes):
    tokenizer = runtimes[0].tokenizer
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}]
    history.append({"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"})
    text = render_chat(tokenizer, history, tool_request([WEATHER], None, None))
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")


def test_generic_rendering_describes_the_tools_in_the_system_message(smol_tokenizer):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [{"role": "system", "content": "Be brief."}, *QUESTION]
    history += [
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sun"},
    ]
    messages, tools = FORMATS["generic"].prompt(history, tool_request([WEATHER], None, None))
    assert tools is None and [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("Be brief.\n\nYou can call these functions")
    assert json.loads(messages[2]["content"]) == {
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    }
    result = json.loads(messages[3]["content"])["tool_response"]
    assert result == {"id": "call_1", "name": "get_weather", "content": "sun"}
    assert (
        "You can call"
        not in FORMATS["generic"].prompt(QUESTION, tool_request([WEATHER], "none", None))[0][0]["content"]
    )
    render_chat(smol_tokenizer, history, tool_request([WEATHER], None, None))  # the template takes it


# ------------------------------------------------------------------------------------------------ grammars


def accepts(constraint, tokenizer, text: str) -> bool:
    """Whether the grammar allows ``text`` (as the tokenizer splits it) and may end after it."""
    state = GrammarState(constraint, tokenizer, len(tokenizer), {tokenizer.eos_token_id})
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not bool(state.mask()[token]):
            return False
        state.advance([token])
    return state.matcher.is_accepting()


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("choice", "parallel", "texts"),
    [
        (None, True, {"Hi": True, "So:\n" + CALL: True, CALL + "\n" + CALL: True, "a <tool_call> b": False}),
        (None, False, {CALL: True, CALL + "\n" + CALL: False, CALL.replace("Paris", "P" * 20): False}),
        ("required", True, {"Hi": False, CALL: True, CALL + "\n" + CALL: True}),
        (NAMED, True, {CALL: False, CALL.replace("get_weather", "get_time").replace('{"city": "Paris"}', "{}"): True}),
        ("none", True, {"Hi": True, CALL: False}),
    ],
)
def test_the_hermes_grammar(smol_tokenizer, choice, parallel, texts):
    constraint = FORMATS["hermes"].constraint(tool_request([WEATHER, TIME], choice, parallel), smol_tokenizer)
    assert {text: accepts(constraint, smol_tokenizer, text) for text in texts} == texts


def test_the_llama_and_generic_grammars(smol_tokenizer):
    call = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    llama = {
        c: FORMATS["llama3_json"].constraint(tool_request([WEATHER], c, None), smol_tokenizer)
        for c in ("auto", "required", "none")
    }
    assert [accepts(llama[c], smol_tokenizer, call) for c in llama] == [True, True, False]
    assert [accepts(llama[c], smol_tokenizer, "Hi") for c in llama] == [True, False, True]
    assert not accepts(llama["auto"], smol_tokenizer, '{"other": 1}')
    generic = FORMATS["generic"]
    calls = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
    auto = generic.constraint(tool_request([WEATHER], None, None), smol_tokenizer)
    required = generic.constraint(tool_request([WEATHER], "required", None), smol_tokenizer)
    assert accepts(auto, smol_tokenizer, calls) and accepts(auto, smol_tokenizer, '{"response": "Hi"}')
    assert accepts(required, smol_tokenizer, calls) and not accepts(required, smol_tokenizer, '{"response": "Hi"}')
    assert generic.constraint(tool_request([WEATHER], "none", None), smol_tokenizer) is None


# ------------------------------------------------------------------------------------------------ parsers


def answer(parser, text: str, sizes: list[int]) -> tuple[str, list[tuple[str, str]], list]:
    """Feed ``text`` in pieces of the given sizes (cycled); return (content, [(name, arguments)], pieces)."""
    pieces, i, k = [], 0, 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        pieces += parser.feed(text[i : i + n], final=i + n >= len(text))
        i, k = i + n, k + 1
    if not text:
        pieces += parser.feed("", final=True)
    content = "".join(p.text for p in pieces if isinstance(p, ContentPiece))
    calls = {p.index: [p.name, ""] for p in pieces if isinstance(p, CallStart)}
    for p in pieces:
        if isinstance(p, ArgumentsPiece):
            calls[p.index][1] += p.text
    assert content == parser.content
    assert [(c.name, c.arguments) for c in parser.calls] == [tuple(v) for v in calls.values()]
    return content, [tuple(v) for v in calls.values()], pieces


SPLITS = [[10_000], [1], [2], [3, 1, 7], [5, 11]]
PARSER_CASES = [
    (HermesParser, "Just text.\n", "Just text.\n", []),
    (
        HermesParser,
        "Let me look.\n" + CALL + "\n" + CALL.replace("Paris", "Rome"),
        "Let me look.",
        [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')],
    ),
    (HermesParser, '<tool_call>\n{"arguments": {"a": 1}, "name": "f"}\n</tool_call>', "", [("f", '{"a": 1}')]),
    (HermesParser, "x <tool_call> not a call </tool_call> y", "x <tool_call> not a call </tool_call> y", []),
    (HermesParser, "a < b <tool_ca", "a < b <tool_ca", []),
    (LlamaJsonParser, '{"name": "get_time", "parameters": {"tz": "UTC"}}', "", [("get_time", '{"tz": "UTC"}')]),
    (LlamaJsonParser, "No call {here}", "No call {here}", []),
    (LlamaJsonParser, '{"not": "a call"}', '{"not": "a call"}', []),
    (
        GenericParser,
        '{"tool_calls": [{"name": "f", "arguments": {"s": "}]\\""}}, {"name": "g", "arguments": {}}]}',
        "",
        [("f", '{"s": "}]\\""}'), ("g", "{}")],
    ),
    (GenericParser, '{"response": "Line\\none \\"q\\" \\u00e9 \\ud83d\\ude00 end"}', 'Line\none "q" é 😀 end', []),
    (GenericParser, "plain words", "plain words", []),
]


@pytest.mark.parametrize(("cls", "text", "content", "calls"), PARSER_CASES)
def test_parsers_give_the_same_answer_whatever_the_pieces(cls, text, content, calls):
    for sizes in SPLITS:
        got_content, got_calls, pieces = answer(cls(), text, sizes)
        assert (got_content, got_calls) == (content, calls), sizes
        starts = [p for p in pieces if isinstance(p, CallStart)]
        assert all(p.id.startswith("call_") and len(p.id) == 29 for p in starts)


def test_a_call_cut_short_keeps_its_arguments_incomplete():
    parser = HermesParser()
    _, calls, _ = answer(parser, CALL[: CALL.index("ris")], [4])
    assert calls == [("get_weather", '{"city": "Pa')] and not parser.calls[0].complete


# ------------------------------------------------------------------------------------------------ special markers


def test_special_marker_tokens_are_kept_in_the_text(special_runtime):
    tokenizer = special_runtime.tokenizer
    open_id, close_id = special_token_id(tokenizer, "<tool_call>"), special_token_id(tokenizer, "</tool_call>")
    assert open_id is not None and close_id is not None
    assert FORMATS["hermes"].markers(tokenizer) == {open_id, close_id}
    ids = tokenizer.encode(CALL + "<|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True).startswith("\n{")  # decoding drops the tags
    marked = MarkedText(tokenizer, {open_id, close_id}, stop=["never"])
    text = "".join(marked.feed(ids[i : i + 3], i + 3 >= len(ids)) for i in range(0, len(ids), 3))
    assert text == CALL
    constraint = FORMATS["hermes"].constraint(tool_request([WEATHER], "required", None), tokenizer)
    assert f"<[{open_id}]>" in constraint.lark and '"<tool_call>"' not in constraint.lark  # the special token


def test_a_special_opener_forced_by_the_grammar_gives_a_call(special_runtime):
    tokenizer = special_runtime.tokenizer
    request = tool_request([WEATHER], "required", False)
    prompt = tokenizer.encode(render_chat(tokenizer, QUESTION, request), add_special_tokens=False)
    params = SamplingParams(constraint=FORMATS["hermes"].constraint(request, tokenizer))
    result = special_runtime.engine.generate(prompt, params, 60)
    assert result.token_ids[0] == special_token_id(tokenizer, "<tool_call>")
    marked = MarkedText(tokenizer, FORMATS["hermes"].markers(tokenizer))
    parser = HermesParser()
    parser.feed(marked.feed(result.token_ids, True), final=True)
    assert [c.name for c in parser.calls] == ["get_weather"] and parser.content == ""
    json.loads(parser.calls[0].arguments)


# ------------------------------------------------------------------------------------------------ exactness


def greedy_pair(runtimes, prompt: list[int], constraint, n: int = 80):
    params = SamplingParams(constraint=constraint)
    return [r.engine.generate(prompt, params, n) for r in runtimes]


@pytest.mark.parametrize("choice", [None, "required", NAMED, "none"])
def test_speculation_keeps_the_native_formats_greedy_output(runtimes, choice):
    """Drafting (n-gram) under the tools' grammar gives plain decoding's tokens, token for token."""
    tokenizer = runtimes[0].tokenizer
    request = tool_request([WEATHER, TIME], choice, None)
    history = [{"role": "user", "content": "Weather in Paris and Paris and Paris? " * 3}]
    prompt = tokenizer.encode(render_chat(tokenizer, history, request), add_special_tokens=False)
    plain, spec = greedy_pair(runtimes, prompt, FORMATS["hermes"].constraint(request, tokenizer))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0


@pytest.mark.slow
@pytest.mark.parametrize("choice", [None, "required"])
def test_speculation_keeps_the_generic_formats_greedy_output(choice):
    from specwise.runtime import build_runtime

    runtimes = [build_runtime("default", drafter, 4, "cpu") for drafter in ("none", "ngram")]
    tokenizer = runtimes[0].tokenizer
    request = tool_request([WEATHER, TIME], choice, None)
    prompt = tokenizer.encode(render_chat(tokenizer, QUESTION, request), add_special_tokens=False)
    plain, spec = greedy_pair(runtimes, prompt, FORMATS["generic"].constraint(request, tokenizer), 60)
    assert spec.token_ids == plain.token_ids
    parser = GenericParser()
    parser.feed(plain.text, final=True)
    assert parser.calls or choice is None
