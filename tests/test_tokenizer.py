"""The light tokenizer gives what the transformers tokenizer of the same directory gives."""

from __future__ import annotations

import os
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
    "1234567890 3.14159 -42 1e-9",
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


def _pair(directory: Path):
    from transformers import AutoTokenizer

    return LightTokenizer(directory), AutoTokenizer.from_pretrained(directory)


def _check_same(light, full):
    assert light.get_vocab() == full.get_vocab()
    assert len(light) == len(full) and light.vocab_size == full.vocab_size
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(light, name) == getattr(full, name), name
    assert light.chat_template == full.chat_template
    for text in TEXTS:
        for special in (True, False):
            assert (
                light(text, add_special_tokens=special)["input_ids"]
                == full(text, add_special_tokens=special)["input_ids"]
            ), (text, special)
        ids = full(text)["input_ids"]
        for skip in (True, False):
            assert light.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
    for conversation in CONVERSATIONS:
        for gen in (True, False):
            expected = full.apply_chat_template(conversation, tokenize=False, add_generation_prompt=gen)
            assert light.apply_chat_template(conversation, tokenize=False, add_generation_prompt=gen) == expected
    # a split multi-byte character decodes as transformers decodes it (the engine holds such text back)
    ids = full("🙂", add_special_tokens=False)["input_ids"]
    assert light.decode(ids[:1]) == full.decode(ids[:1])


def _default_dir() -> Path:
    from specwise.models.loader import default_gguf_path, gguf_tokenizer

    tokenizer = gguf_tokenizer(default_gguf_path())
    assert isinstance(tokenizer, LightTokenizer)  # the cached copy loads without transformers
    return tokenizer.directory


@pytest.mark.slow
def test_default_model_tokenizer_matches_transformers():
    light, full = _pair(_default_dir())
    _check_same(light, full)


@pytest.mark.slow
def test_other_attributes_come_from_transformers():
    light = LightTokenizer(_default_dir())
    assert "_full" not in light.__dict__
    assert light.all_special_ids  # not implemented here: handed to the transformers tokenizer
    assert "_full" in light.__dict__
    with pytest.raises(AttributeError):
        light._no_such_private_attribute  # noqa: B018


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
def test_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    from specwise.models.loader import default_gguf_path, gguf_tokenizer

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path))
    first = gguf_tokenizer(default_gguf_path())
    assert isinstance(first, LightTokenizer) and str(first.directory).startswith(str(tmp_path))
    (first.directory / "tokenizer.json").write_text("{ not json")
    again = gguf_tokenizer(default_gguf_path())
    assert again("Name three primary colors.")["input_ids"] == first("Name three primary colors.")["input_ids"]


def test_the_chat_template_runs_sandboxed(tmp_path):
    """Templates are untrusted code: attribute tricks fail as they do in transformers' sandbox."""
    import jinja2

    from specwise.models.tokenizer import _compile

    with pytest.raises(jinja2.exceptions.SecurityError):
        _compile("{{ messages.__class__.__mro__ }}").render(messages=[])
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system"):
        _compile("{{ raise_exception('no system') }}").render()
    assert _compile("{{ x | tojson }}").render(x={"a": "é<"}) == '{"a": "é<"}'


@pytest.mark.skipif(not os.environ.get("SPECWISE_QWEN_GGUF"), reason="set SPECWISE_QWEN_GGUF to a Qwen2.5 GGUF")
def test_qwen_tokenizer_matches_transformers():
    from specwise.models.loader import gguf_tokenizer

    light = gguf_tokenizer(Path(os.environ["SPECWISE_QWEN_GGUF"]))
    _check_same(*_pair(light.directory))


@pytest.mark.slow
def test_compact_merges_keeps_every_encoding(tmp_path):
    """The cached tokenizer.json holds BPE merges as "a b" strings (faster to read); written as pairs, the same
    tokenizer encodes and decodes every text and every vocabulary entry identically, and compact_merges turns the
    pairs back into the strings."""
    import json

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
    import json

    from specwise.models.loader import compact_merges

    spaced = {"model": {"type": "BPE", "vocab": {}, "merges": [["a", "b"], ["a b", "c"]]}}
    for content in (json.dumps(spaced), json.dumps({"model": {"type": "Unigram", "vocab": []}}), "{ not json"):
        path = tmp_path / "tokenizer.json"
        path.write_text(content, encoding="utf-8")
        assert not compact_merges(path)
        assert path.read_text(encoding="utf-8") == content


@pytest.mark.slow
def test_an_earlier_cache_is_upgraded_in_place(tmp_path, monkeypatch):
    """A tokenizer cached by an earlier version (merges as pairs, no version in its name) is copied to the current
    name with compact merges, not rebuilt, and encodes as before."""
    import json

    from specwise.models.loader import default_gguf_path, gguf_tokenizer

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path))
    built = gguf_tokenizer(default_gguf_path())
    expected = built("Name three primary colors.")["input_ids"]
    old = built.directory.with_name(built.directory.name.rsplit("-v", 1)[0])
    built.directory.rename(old)
    data = json.loads((old / "tokenizer.json").read_text(encoding="utf-8"))
    data["model"]["merges"] = [m.split(" ") for m in data["model"]["merges"]]
    (old / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    (old / "marker").write_text("the old cache's own file")
    again = gguf_tokenizer(default_gguf_path())
    assert again.directory == built.directory and (again.directory / "marker").is_file() and not old.exists()
    assert isinstance(json.loads((again.directory / "tokenizer.json").read_text())["model"]["merges"][0], str)
    assert again("Name three primary colors.")["input_ids"] == expected
