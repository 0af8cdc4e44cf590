"""The light tokenizer gives what the transformers tokenizer of the same directory gives, and needs no
transformers for what decoding uses (encode, decode, tokens, special tokens, chat templates with tools)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from specwise.models.tokenizer import LightTokenizer

TEXTS = [
    "Name three primary colors.",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\n\nlines\r\n",
    "Unicode: café, naïve, 日本語のテキスト, emoji 🙂🚀, math ∑∫√",
    "def f(x):\n    return x ** 2  # a comment\n",
    "<|im_start|>user\nspecial tokens written as text<|im_end|>",
    "",
    "1234567890 3.14159 -42 1e-9, and  1  2   3",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Name three primary colors."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why is the sky blue?"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Write a haiku about rain."},
    ],
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,  # as OpenAI's API sends it: dropped before rendering
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": '{"temperature": 21}'},
]
QWEN_TEMPLATE = (
    (Path(__file__).parent / "fixtures" / "qwen2.5-coder-chat-template.jinja")
    .read_text(encoding="utf-8")
    .split("-#}\n", 1)[1]
)
# a template using what transformers gives templates: extra variables, documents, namespace, dict, loop controls,
# generation blocks, reasoning under its names, special tokens, raise_exception
FEATURES_TEMPLATE = (
    "{%- set ns = namespace(n=0) -%}{{ bos_token }}[{{ greeting | default('none') }}]"
    "{%- for d in documents or [] %}<doc {{ d.title }}>{{ d.text }}</doc>{% endfor -%}"
    "{%- for m in messages %}{% set ns.n = ns.n + 1 %}{% if m.role == 'skip' %}{% continue %}{% endif %}"
    "<{{ m.role }}>{% if m.reasoning_content %}(think: {{ m.reasoning_content }}/{{ m.thinking }}){% endif %}"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
    "{% else %}{{ m.content }}{% endif %}"
    "{{ dict(a=1) | tojson }}</{{ m.role }}>{% endfor -%}"
    "{{ ns.n }}{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token if flag else '' }}"
    "{% if messages | length > 5 %}{{ raise_exception('too long') }}{% endif %}"
)


def _full(directory: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def _check_same(light, full):
    """Every part of the API the core uses gives the same as transformers."""
    assert light.get_vocab() == full.get_vocab()
    assert len(light) == len(full) and light.vocab_size == full.vocab_size
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(light, name) == getattr(full, name), name
        assert getattr(light, f"{name}_id") == getattr(full, f"{name}_id"), name
    assert light.special_tokens_map == full.special_tokens_map
    assert set(light.all_special_tokens) == set(full.all_special_tokens)
    assert set(light.all_special_ids) == set(full.all_special_ids)
    assert light.added_tokens_encoder == full.added_tokens_encoder
    assert {i: t.content for i, t in light.added_tokens_decoder.items()} == {
        i: t.content for i, t in full.added_tokens_decoder.items()
    }
    assert light.chat_template == full.chat_template
    for text in TEXTS:
        for special in (True, False):
            ids = full(text, add_special_tokens=special)["input_ids"]
            assert light(text, add_special_tokens=special)["input_ids"] == ids, (text, special)
            assert light.encode(text, add_special_tokens=special) == ids
        assert light.tokenize(text) == full.tokenize(text)
        ids = full(text)["input_ids"]
        for skip in (True, False):
            assert light.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
        tokens = full.convert_ids_to_tokens(ids)
        assert light.convert_ids_to_tokens(ids) == tokens
        assert light.convert_ids_to_tokens(ids, skip_special_tokens=True) == full.convert_ids_to_tokens(
            ids, skip_special_tokens=True
        )
        assert light.convert_tokens_to_ids(tokens) == ids
        assert light.convert_tokens_to_string(tokens) == full.convert_tokens_to_string(tokens)
    assert light(TEXTS)["input_ids"] == full(TEXTS)["input_ids"]
    rows = [full(t)["input_ids"] for t in TEXTS]
    assert light.batch_decode(rows) == full.batch_decode(rows)
    assert light.convert_tokens_to_ids("no such token here") == full.convert_tokens_to_ids("no such token here")
    for conversation in CONVERSATIONS:
        for gen in (True, False):
            expected = full.apply_chat_template(conversation, tokenize=False, add_generation_prompt=gen)
            assert light.apply_chat_template(conversation, tokenize=False, add_generation_prompt=gen) == expected
            for tools in ([WEATHER], None):
                expected = full.apply_chat_template(
                    conversation, tools=tools, tokenize=False, add_generation_prompt=gen
                )
                got = light.apply_chat_template(conversation, tools=tools, tokenize=False, add_generation_prompt=gen)
                assert got == expected
        ids = full.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False)
        assert light.apply_chat_template(conversation, add_generation_prompt=True) == ids
    # a split multi-byte character decodes as transformers decodes it (the engine holds such text back)
    ids = full("🙂", add_special_tokens=False)["input_ids"]
    assert light.decode(ids[:1]) == full.decode(ids[:1])


def _default_dir() -> Path:
    from specwise.models.loader import default_gguf_path, gguf_tokenizer

    tokenizer = gguf_tokenizer(default_gguf_path())
    assert isinstance(tokenizer, LightTokenizer)
    return tokenizer.directory


def _with_template(tmp_path: Path, template: str | list, name: str = "tokenizer") -> Path:
    """A copy of the default model's tokenizer directory with another chat template."""
    source = _default_dir()
    target = tmp_path / name
    target.mkdir()
    (target / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = template
    (target / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return target


@pytest.mark.slow
def test_default_model_tokenizer_matches_transformers():
    from conftest import needs_hf

    needs_hf()
    directory = _default_dir()
    _check_same(LightTokenizer(directory), _full(directory))


@pytest.mark.slow
def test_tool_template_renders_as_transformers_renders_it(tmp_path):
    """Qwen2.5's template (tools, tool calls and tool answers) on the default model's vocabulary."""
    from conftest import needs_hf

    needs_hf()
    directory = _with_template(tmp_path, QWEN_TEMPLATE)
    light, full = LightTokenizer(directory), _full(directory)
    for conversation in [*CONVERSATIONS, TOOL_TURNS]:
        for tools in ([WEATHER], [WEATHER, {"type": "function", "function": {"name": "now"}}], None):
            expected = full.apply_chat_template(conversation, tools=tools, tokenize=False, add_generation_prompt=True)
            assert light.apply_chat_template(conversation, tools=tools, tokenize=False, add_generation_prompt=True) == (
                expected
            )


@pytest.mark.slow
def test_template_features_render_as_transformers_renders_them(tmp_path):
    """Extra variables, documents, namespace, dict, loop controls, generation blocks, reasoning fields, None
    values, continue_final_message, batches, objects as messages and named templates."""
    from conftest import needs_hf

    needs_hf()

    @dataclass
    class Message:
        role: str
        content: str

    directory = _with_template(tmp_path, FEATURES_TEMPLATE)
    light, full = LightTokenizer(directory), _full(directory)
    chat = [
        {"role": "user", "content": "Hi", "name": None},
        {"role": "skip", "content": "hidden"},
        {"role": "assistant", "content": "Hello", "reasoning": "greet back"},
    ]
    docs = [{"title": "a", "text": "first"}, {"title": "b", "text": "second"}]
    cases = [
        {"add_generation_prompt": True},
        {"greeting": "hey", "flag": True},
        {"documents": docs},
        {"continue_final_message": True},
        {"greeting": ["a", {"b": 1}]},
    ]
    for options in cases:
        expected = full.apply_chat_template(chat, tokenize=False, **options)
        assert light.apply_chat_template(chat, tokenize=False, **options) == expected, options
    assert light.apply_chat_template([chat, chat[:1]], tokenize=False) == full.apply_chat_template(
        [chat, chat[:1]], tokenize=False
    )
    objects = [Message("user", "Hi"), Message("assistant", "Hello")]
    assert light.apply_chat_template(objects, tokenize=False) == full.apply_chat_template(objects, tokenize=False)
    expected = full.apply_chat_template(chat, tokenize=True, return_dict=True)
    assert light.apply_chat_template(chat, return_dict=True) == {k: list(v) for k, v in expected.items()}
    import jinja2

    for tokenizer in (light, full):
        with pytest.raises(jinja2.exceptions.TemplateError, match="too long"):
            tokenizer.apply_chat_template(chat * 2, tokenize=False)

    templates = [
        {"name": "default", "template": "plain {{ messages[0].content }}"},
        {"name": "tool_use", "template": "tools"},
    ]
    named = _with_template(tmp_path, templates, name="named")
    light, full = LightTokenizer(named), _full(named)
    for kwargs in ({}, {"tools": [WEATHER]}, {"chat_template": "tool_use"}, {"chat_template": "{{ 'inline' }}"}):
        assert light.apply_chat_template(chat, tokenize=False, **kwargs) == full.apply_chat_template(
            chat, tokenize=False, **kwargs
        ), kwargs
    assert light.chat_template == "plain {{ messages[0].content }}" and set(light.chat_templates) == {"tool_use"}


@pytest.mark.slow
def test_genuinely_transformers_calls_are_handed_over_or_name_the_extra(monkeypatch):
    from specwise.extras import MissingExtraError

    light = LightTokenizer(_default_dir())
    assert "_full" not in light.__dict__
    light("Name three colors.")
    light.all_special_ids, light.added_tokens_decoder, light.backend_tokenizer  # noqa: B018 (done here)
    assert "_full" not in light.__dict__
    with pytest.raises(AttributeError):
        light._no_such_private_attribute  # noqa: B018
    monkeypatch.setitem(sys.modules, "transformers", None)  # as on the core install
    for call in (
        lambda: light("Name three colors.", truncation=True, max_length=2),
        lambda: light("x", return_tensors="pt"),
        lambda: light.apply_chat_template(CONVERSATIONS[0], tools=[lambda city: city]),
        lambda: light.pad,
    ):
        with pytest.raises(MissingExtraError, match=r"specwise\[hf\]"):
            call()
    monkeypatch.undo()
    from conftest import needs_hf

    needs_hf()
    ids = light("Name three primary colors.", truncation=True, max_length=2)["input_ids"]
    assert ids == light("Name three primary colors.")["input_ids"][:2] and "_full" in light.__dict__


@pytest.mark.slow
def test_numpy_inputs_and_outputs():
    import numpy as np

    light = LightTokenizer(_default_dir())
    ids = light("Name three primary colors.")["input_ids"]
    out = light(["Name three primary colors."], return_tensors="np")
    assert out["input_ids"].dtype == np.int64 and out["input_ids"].tolist() == [ids]
    assert light.decode(np.array(ids)) == light.decode(ids) == "Name three primary colors."
    assert light.convert_ids_to_tokens(np.int64(ids[0])) == light.convert_ids_to_tokens(ids[0])
    assert light.batch_decode(np.array([ids, ids])) == ["Name three primary colors."] * 2
    assert "attention_mask" not in light("x", return_attention_mask=False)


@pytest.mark.slow
def test_copies_and_pickles_work_after_a_template_was_rendered():
    import copy
    import pickle

    light = LightTokenizer(_default_dir())
    expected = light.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=True)
    for clone in (copy.deepcopy(light), pickle.loads(pickle.dumps(light))):
        assert clone.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=True) == expected
        assert clone("Name three primary colors.")["input_ids"] == light("Name three primary colors.")["input_ids"]


@pytest.mark.slow
def test_save_pretrained_writes_a_folder_both_tokenizers_load(tmp_path):
    light = LightTokenizer(_default_dir())
    light.save_pretrained(tmp_path / "saved")
    again = LightTokenizer(tmp_path / "saved")
    assert again.get_vocab() == light.get_vocab() and again.chat_template == light.chat_template
    assert again("Name three primary colors.")["input_ids"] == light("Name three primary colors.")["input_ids"]
    from conftest import needs_hf

    needs_hf()
    _check_same(again, _full(tmp_path / "saved"))


@pytest.mark.slow
def test_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    from specwise.models.loader import default_gguf_path, gguf_tokenizer

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path))
    first = gguf_tokenizer(default_gguf_path())
    assert isinstance(first, LightTokenizer) and str(first.directory).startswith(str(tmp_path))
    (first.directory / "tokenizer.json").write_text("{ not json")
    again = gguf_tokenizer(default_gguf_path())
    assert again("Name three primary colors.")["input_ids"] == first("Name three primary colors.")["input_ids"]


@pytest.mark.slow
def test_an_unwritable_cache_keeps_the_tokenizer_in_memory(tmp_path, monkeypatch):
    import copy

    import specwise.models.loader as loader

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path))

    def refuse(*args, **kwargs):
        raise PermissionError("read-only")

    monkeypatch.setattr(loader.tempfile, "mkdtemp", refuse)
    held = loader.gguf_tokenizer(loader.default_gguf_path())
    assert isinstance(held, LightTokenizer) and held.directory is None
    clone = copy.deepcopy(held)
    assert clone("Name three primary colors.")["input_ids"] == held("Name three primary colors.")["input_ids"]
    assert clone.apply_chat_template(CONVERSATIONS[0], tokenize=False) == held.apply_chat_template(
        CONVERSATIONS[0], tokenize=False
    )


@pytest.mark.slow
def test_earlier_caches_are_removed_and_rebuilt(tmp_path, monkeypatch):
    """Tokenizers cached by earlier versions (built by transformers, which splits some texts differently) are
    removed and the tokenizer is built anew."""
    from specwise.models.loader import _TOKENIZER_VERSION, default_gguf_path, gguf_tokenizer

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path))
    built = gguf_tokenizer(default_gguf_path())
    stem = built.directory.name.rsplit("-v", 1)[0]
    olds = [built.directory.with_name(stem)] + [
        built.directory.with_name(f"{stem}-v{n}") for n in range(2, _TOKENIZER_VERSION)
    ]
    for old in olds:
        old.mkdir()
        (old / "tokenizer_config.json").write_text("{}")
    again = gguf_tokenizer(default_gguf_path())
    assert again.directory == built.directory and not any(old.exists() for old in olds)
    assert again("a  1")["input_ids"] == [81, 256, 33]  # llama.cpp's ids (transformers' conversion: 81, 216, 216, 33)


def test_the_chat_template_runs_sandboxed():
    """Templates are untrusted code: attribute tricks fail as they do in transformers' sandbox."""
    import jinja2

    from specwise.models.tokenizer import _compile

    with pytest.raises(jinja2.exceptions.SecurityError):
        _compile("{{ messages.__class__.__mro__ }}").render(messages=[])
    with pytest.raises(jinja2.exceptions.SecurityError):
        _compile("{% set ns = namespace(_x=1) %}").render()
    with pytest.raises(jinja2.exceptions.SecurityError):
        _compile("{% set ns = namespace() %}{% set ns._y = 2 %}").render()
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system"):
        _compile("{{ raise_exception('no system') }}").render()
    assert _compile("{{ x | tojson }}").render(x={"a": "é<"}) == '{"a": "é<"}'
    assert _compile("{% set ns = namespace(n=1) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}").render() == "2"
    assert _compile("{{ dict(a=1) | tojson }}{% generation %}x{% endgeneration %}").render() == '{"a": 1}x'


def test_template_inputs_are_plain_data():
    """What a template sees is rebuilt from plain values: other objects become a placeholder naming their type."""
    import numpy as np

    from specwise.models.tokenizer import _messages, _plain

    assert _plain({"a": [np.int64(3), np.float32(0.5), np.bool_(False), (1, "x")]}) == {"a": [3, 0.5, False, (1, "x")]}
    assert _plain(object()) == "<object>"
    assert _messages([{"role": "user", "content": None, "reasoning": "r"}]) == [
        {"thinking": "r", "role": "user", "reasoning": "r", "reasoning_content": "r"}
    ]


@pytest.mark.slow
def test_compact_merges_keeps_every_encoding(tmp_path):
    """The cached tokenizer.json holds BPE merges as "a b" strings (faster to read); written as pairs, the same
    tokenizer encodes and decodes every text and every vocabulary entry identically, and compact_merges turns the
    pairs back into the strings."""
    from tokenizers import Tokenizer

    from specwise.models.loader import compact_merges

    data = json.loads((_default_dir() / "tokenizer.json").read_text(encoding="utf-8"))
    assert data["model"]["type"] == "BPE" and all(isinstance(m, str) for m in data["model"]["merges"])
    pairs = json.loads(json.dumps(data))
    pairs["model"]["merges"] = [m.split(" ") for m in data["model"]["merges"]]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(pairs), encoding="utf-8")
    assert compact_merges(path)
    assert json.loads(path.read_text(encoding="utf-8"))["model"]["merges"] == data["model"]["merges"]
    compact, original = Tokenizer.from_str(json.dumps(data)), Tokenizer.from_str(json.dumps(pairs))
    texts = TEXTS + [token for token, _ in sorted(data["model"]["vocab"].items())[::97]]
    for text in texts:
        a, b = compact.encode(text), original.encode(text)
        assert a.ids == b.ids, text
        assert compact.decode(a.ids) == original.decode(b.ids)


def test_compact_merges_leaves_ambiguous_or_other_files(tmp_path):
    """A merge whose token holds a space cannot be written as "a b": the file is left as it is; so are files that
    are not BPE tokenizers or not JSON."""
    from specwise.models.loader import compact_merges

    spaced = {"model": {"type": "BPE", "vocab": {}, "merges": [["a", "b"], ["a b", "c"]]}}
    for content in (json.dumps(spaced), json.dumps({"model": {"type": "Unigram", "vocab": []}}), "{ not json"):
        path = tmp_path / "tokenizer.json"
        path.write_text(content, encoding="utf-8")
        assert not compact_merges(path)
        assert path.read_text(encoding="utf-8") == content
