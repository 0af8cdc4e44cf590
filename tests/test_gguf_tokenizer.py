"""The tokenizer built from a GGUF file's metadata (specwise.models.gguf_tokenizer) against transformers' own GGUF
conversion and llama.cpp.

Tiny GGUF files cover each family: byte-level BPE under several pre-tokenizer names (vocabularies trained here
with the tokenizers library), SentencePiece-style BPE with scores and byte fallback (Llama-style, Phi-3 and a
Gemma-3-like file with its user-defined tokens and runs of spaces stored as spaces). On the project's corpus
(``fixtures/tokenizer_corpus.txt``: many scripts, CJK, emoji, accents, code with tabs and indentation, runs of
spaces and newlines, numbers) every id and every decoded text equals transformers'. Where transformers' conversion
differs from the file's own tokenizer and llama.cpp, on purpose (:data:`REFERENCE_FIXES`), the reference is
transformers' tokenizer with that one part set as the model's tokenizer.json states it; llama.cpp's own ids for
those cases are checked too. Real files: the default model always, and the ``.gguf`` files in
``$SPECWISE_TEST_GGUF_DIR`` (default ``~/.cache/specwise/gguf``) when there are any.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers  # noqa: E402

from specwise.models.gguf_file import GGUFError, GGUFFile  # noqa: E402
from specwise.models.gguf_tokenizer import PRE_TOKENIZERS, build, byte_alphabet, read_vocab  # noqa: E402
from specwise.models.tokenizer import LightTokenizer  # noqa: E402

CORPUS_FILE = Path(__file__).parent / "fixtures" / "tokenizer_corpus.txt"
CORPUS = CORPUS_FILE.read_text(encoding="utf-8").split("\n----8<----\n")
# cases the file cannot hold reliably (edges of whitespace), written here
EXTRA = [
    "",
    "  hi",
    "a  1",
    "x   2024  7 and 3.5  6",
    "ends with spaces   ",
    "\n\n\n",
    "\t\tindented\n\t\t\tmore\r\n",
    "a  b   c    d",
    "<s>  after a control token",
    "hello<|im_end|>  world<|im_start|>\n",
    "<start_of_turn>user\n  hi<end_of_turn>\n",
    "<|user|>\nhi<|end|>\n<|assistant|>\n",
]
TEXTS = CORPUS + EXTRA
SPACE = "\u2581"
GGUF_DIR = Path(os.environ.get("SPECWISE_TEST_GGUF_DIR", "~/.cache/specwise/gguf")).expanduser()


# ---- writing tiny GGUF files ----------------------------------------------------------------------------------


def _trained(tokenizer: Tokenizer, size: int, **options) -> tuple[list[str], list[str]]:
    trainer = trainers.BpeTrainer(vocab_size=size, show_progress=False, **options)
    tokenizer.train_from_iterator(CORPUS * 2, trainer)
    data = json.loads(tokenizer.to_str())
    tokens = [t for t, _ in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return tokens, merges


@functools.cache  # trained once a run: the trainer may break ties differently from one run to the next
def byte_level_vocab(size: int = 700) -> tuple[list[str], list[str]]:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return _trained(tokenizer, size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


@functools.cache
def sentencepiece_vocab(size: int = 600) -> list[str]:
    """Word pieces with ▁ for spaces, over 150 characters (the others fall back to bytes)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(SPACE, "merged_with_next")
    return _trained(tokenizer, size, limit_alphabet=150)[0]


def write_gguf(path: Path, arch: str, tokens, types, *, merges=None, scores=None, model="gpt2", pre=None, **keys):
    """A GGUF file holding a tokenizer (and a token embedding, so that loaders take it for a model)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(list(tokens))
    writer.add_token_types([int(t) for t in types])
    if merges is not None:
        writer.add_token_merges(list(merges))
    if scores is not None:
        writer.add_token_scores([float(s) for s in scores])
    for key, value in keys.items():
        if key.startswith(
            "kv_"
        ):  # a raw key: kv_tokenizer__chat_template__tool_use -> tokenizer.chat_template.tool_use
            writer.add_string(key[3:].replace("__", "."), value)
        else:
            getattr(writer, f"add_{key}")(value)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_file(path: Path, arch: str, pre: str | None, **keys) -> Path:
    trained, merges = byte_level_vocab()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]
    tokens = specials + trained + ["<tool_call>", "</tool_call>", "[PAD1]", "[PAD2]"]
    types = [3] * len(specials) + [1] * len(trained) + [4, 4, 5, 5]
    keys = {"bos_token_id": 3, "eos_token_id": 2, "pad_token_id": 0, "chat_template": CHATML, **keys}
    return write_gguf(path, arch, tokens, types, merges=merges, pre=pre, **keys)


def sentencepiece_file(path: Path, arch: str, **keys) -> Path:
    """Llama / Phi-3 style: <unk>, <s>, </s>, byte tokens, user-defined chat tokens, pieces scored by rank."""
    head = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    head += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    users = ["<|user|>", "<|assistant|>", "<|end|>"]
    head += users
    types += [4] * len(users)
    pieces = [t for t in sentencepiece_vocab() if t not in set(head)]
    tokens = head + pieces + ["<|endoftext|>"]
    types += [1] * len(pieces) + [3]
    scores = [0.0] * len(head) + [-float(i) for i in range(len(pieces))] + [0.0]
    keys = {"bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0, "pad_token_id": len(tokens) - 1, **keys}
    return write_gguf(path, arch, tokens, types, scores=scores, model="llama", **keys)


def gemma_file(path: Path, **keys) -> Path:
    """Gemma-3-like: no space prefix, runs of newlines, tabs and spaces (stored as spaces) as user-defined
    tokens, control tokens, bytes, pieces scored in file order, no merges."""
    head = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]"]
    types = [3, 3, 3, 3, 3, 4]
    runs = ["\n" * n for n in range(1, 6)] + [" " * n for n in range(2, 9)] + ["\t" * n for n in range(1, 4)]
    head += runs
    types += [4] * len(runs)
    head += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    head += ["<start_of_turn>", "<end_of_turn>"]
    types += [3, 3]
    pieces = [t for t in sentencepiece_vocab() if t not in set(head)]
    tokens = head + pieces + ["<unused0>", "<unused1>"]
    types += [1] * len(pieces) + [3, 3]
    scores = [-1000.0] * len(head) + [-float(i) for i in range(len(pieces))] + [-1000.0, -1000.0]
    for i, token in enumerate(head):
        if token.startswith("<0x"):
            scores[i] = 0.0
    keys = {
        "bos_token_id": 2,
        "eos_token_id": 1,
        "unk_token_id": 3,
        "pad_token_id": 0,
        "add_bos_token": True,
        "add_eos_token": False,
        "add_space_prefix": False,
        "chat_template": "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}"
        "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
        **keys,
    }
    return write_gguf(path, "gemma3", tokens, types, scores=scores, model="llama", **keys)


def _with_digits(ref: dict) -> dict:
    ref["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, ref["pre_tokenizer"]],
    }
    return ref


def _keep_whole_words(ref: dict) -> dict:
    ref["model"]["ignore_merges"] = True
    return ref


def _prefix_after_every_added_token(ref: dict) -> dict:
    ref["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": SPACE},
            {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        ],
    }
    ref["pre_tokenizer"] = None
    return ref


#: where transformers' conversion differs from the file's own tokenizer (and llama.cpp), the part of the reference
#: set as that tokenizer states it: SmolLM2 and the StarCoder family split digits one by one before GPT-2's
#: expression; the Llama 3 family keeps a piece that is a token whole; a Llama-style SentencePiece vocabulary puts ▁
#: before its text and after each added token (llama.cpp; Llama 2's and Phi-3's tokenizer.json), also before a
#: text that starts with a space
REFERENCE_FIXES = {
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"), _with_digits),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken"), _keep_whole_words),
    "spm-llama": _prefix_after_every_added_token,
}

FIXTURES = {
    # name: (writer, arguments, keys, the REFERENCE_FIXES key)
    "smollm": (byte_level_file, ("llama", "smollm"), {}, "smollm"),
    "llama-bpe": (byte_level_file, ("llama", "llama-bpe"), {"add_bos_token": True}, "llama-bpe"),
    "qwen2": (byte_level_file, ("qwen2", "qwen2"), {"add_bos_token": False}, None),
    "qwen3": (byte_level_file, ("qwen3", "qwen2"), {}, None),
    "gpt-2": (byte_level_file, ("llama", "gpt-2"), {"add_eos_token": True}, None),
    "no-pre": (byte_level_file, ("llama", None), {}, None),
    "spm-llama": (sentencepiece_file, ("llama",), {}, "spm-llama"),
    "spm-phi3": (sentencepiece_file, ("phi3",), {}, None),
    "gemma3": (gemma_file, (), {}, None),
}


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf-tokenizers")
    for name, (writer, args, keys, _) in FIXTURES.items():
        writer(folder / f"{name}.gguf", *args, **keys)
    return folder


def ours(path: Path) -> LightTokenizer:
    text, config = build(GGUFFile(path))
    return LightTokenizer.from_json(text, config)


def reference(path: Path, fix: str | None):
    """transformers' GGUF conversion of the file (with REFERENCE_FIXES[fix] applied) and its tokenizer."""
    from transformers import AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    full = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    backend = full.backend_tokenizer
    if fix is not None:
        backend = Tokenizer.from_str(json.dumps(REFERENCE_FIXES[fix](json.loads(backend.to_str()))))
    return backend, full


def compare(path: Path, fix: str | None, texts=TEXTS) -> None:
    """Every id and decoded text of ours equals the reference's; decoding gives the text back."""
    light = ours(path)
    ref, full = reference(path, fix)
    mine = light.backend_tokenizer
    assert light.get_vocab() == full.get_vocab()
    assert len(light) == len(full)
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(light, f"{name}_id") == getattr(full, f"{name}_id"), name
    assert light.chat_template == full.chat_template
    added = [t.content for t in mine.get_added_tokens_decoder().values()]
    for text in texts:
        for special in (True, False):
            ids = mine.encode(text, add_special_tokens=special).ids
            expected = ref.encode(text, add_special_tokens=special).ids
            assert ids == expected, (path.name, text, special, mine.encode(text).tokens, ref.encode(text).tokens)
        ids = mine.encode(text, add_special_tokens=False).ids
        for skip in (True, False):
            assert mine.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text
        lossless = light.backend_tokenizer.model.unk_token is None or not any(t in text for t in added)
        if lossless:  # the space before a SentencePiece text comes off at its start only, not after an added token
            assert light.decode(ids) == text, (path.name, text)


# ---- against transformers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(FIXTURES))
def test_tiny_files_match_transformers(fixture_dir, name):
    from conftest import needs_hf

    needs_hf()
    compare(fixture_dir / f"{name}.gguf", FIXTURES[name][3])


@pytest.mark.slow
def test_default_model_matches_transformers():
    from conftest import needs_hf

    needs_hf()
    from specwise.models.loader import default_gguf_path

    compare(default_gguf_path(), "smollm")


@pytest.mark.slow
def test_default_model_chat_template_renders_as_transformers_renders_it():
    """Through the loader's tokenizer (cached), with and without tools, and the ids of the rendered text."""
    from conftest import needs_hf

    needs_hf()
    from specwise.models.loader import default_gguf_path, gguf_tokenizer

    path = default_gguf_path()
    light, (_, full) = gguf_tokenizer(path), reference(path, None)
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
    chats = [
        [{"role": "user", "content": "Name three primary colors."}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2 + 2?"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "?"},
        ],
    ]
    for chat in chats:
        for options in ({}, {"tools": tools}, {"add_generation_prompt": True}, {"tools": tools, "extra": 1}):
            expected = full.apply_chat_template(chat, tokenize=False, **options)
            assert light.apply_chat_template(chat, tokenize=False, **options) == expected, options
            ids = full.apply_chat_template(chat, tokenize=True, return_dict=False, **options)
            assert light.apply_chat_template(chat, **options) == ids


def _real_files() -> list[Path]:
    return sorted(GGUF_DIR.glob("*.gguf")) if GGUF_DIR.is_dir() else []


@pytest.mark.slow
@pytest.mark.parametrize("path", _real_files() or [None], ids=lambda p: p.name if p else "none")
def test_real_files_match_transformers(path):
    """Qwen2.5-Coder, Gemma 3 and any other file in $SPECWISE_TEST_GGUF_DIR (skipped where there is none)."""
    if path is None:
        pytest.skip(f"no .gguf files in {GGUF_DIR} (set SPECWISE_TEST_GGUF_DIR)")
    from conftest import needs_hf

    needs_hf()
    pre = GGUFFile(path).get("tokenizer.ggml.pre")
    compare(path, pre if pre in REFERENCE_FIXES else None)


# ---- against llama.cpp -----------------------------------------------------------------------------------------

# what llama.cpp's llama-server answers for the default model, where transformers' conversion differs
LLAMA_CPP_IDS = {
    "a  1": [81, 256, 33],
    "x   2024  7": [104, 333, 34, 32, 34, 36, 256, 39],
    "Numbers  123  4": [39006, 256, 33, 34, 35, 256, 36],
    "  hi  there\n\n  42": [216, 15876, 216, 665, 39892, 36, 34],
}


@pytest.mark.slow
def test_default_model_splits_digits_as_llama_cpp_does():
    from specwise.models.loader import default_gguf_path

    tokenizer = ours(default_gguf_path())
    for text, ids in LLAMA_CPP_IDS.items():
        assert tokenizer.encode(text) == ids, text


def _llama_server():
    try:
        from specwise.lab.bench.llamacpp import find_llama_cpp
    except ImportError:
        return None
    folder = find_llama_cpp()
    return folder / "llama-server" if folder is not None and (folder / "llama-server").is_file() else None


def _post(port: int, route: str, body: dict):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/{route}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


@pytest.mark.slow
@pytest.mark.parametrize("path", [None, *_real_files()], ids=lambda p: p.name if p else "default")
def test_llama_cpp_tokenizes_as_we_do(path, tmp_path):
    """llama.cpp's own tokenizer (llama-server's /tokenize and /detokenize) on the corpus, where its binaries are
    installed. Left out: text naming ``</s>``, which llama.cpp turns into a control token by its name in files
    that mark it normal (Qwen's vocabulary), unlike the model's own tokenizer."""
    server = _llama_server()
    if server is None:
        pytest.skip("llama.cpp's llama-server is not installed (specwise.lab.bench.llamacpp.find_llama_cpp)")
    if path is None:
        from specwise.models.loader import default_gguf_path

        path = default_gguf_path()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "llama-server.log").open("w")
    command = [str(server), "-m", str(path), "--port", str(port), "-c", "256", "-t", "1", "--no-warmup"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"llama-server did not start: {(tmp_path / 'llama-server.log').read_text()[-2000:]}")
            time.sleep(0.3)
        tokenizer = ours(path)
        for text in TEXTS:
            if "</s>" in text:
                continue
            for special in (True, False):
                expected = _post(port, "tokenize", {"content": text, "add_special": special, "parse_special": True})
                assert tokenizer.encode(text, add_special_tokens=special) == expected["tokens"], (text, special)
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert tokenizer.decode(ids) == _post(port, "detokenize", {"tokens": ids})["content"], text
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


# ---- what the builder does, without a reference -----------------------------------------------------------------


def _pieces(pre: str, text: str) -> list[str]:
    """The pieces the pre-tokenizer named ``pre`` cuts ``text`` into, as text."""
    from specwise.models.gguf_tokenizer import _pre_tokenizer

    step = Tokenizer.from_str(
        json.dumps(
            {
                "version": "1.0",
                "model": {"type": "BPE", "vocab": {}, "merges": []},
                "pre_tokenizer": _pre_tokenizer(PRE_TOKENIZERS[pre]),
            }
        )
    ).pre_tokenizer
    back = {c: b for b, c in byte_alphabet().items()}
    return [bytes(back[c] for c in piece).decode("utf-8") for piece, _ in step.pre_tokenize_str(text)]


def test_pre_tokenizers_split_as_their_families_do():
    text = "abc  12345 don't\n\n  x"
    assert _pieces("gpt-2", text) == ["abc", " ", " 12345", " don", "'t", "\n\n ", " x"]
    assert _pieces("smollm", text) == ["abc", "  ", "1", "2", "3", "4", "5", " don", "'t", "\n\n ", " x"]
    assert _pieces("llama-bpe", text) == ["abc", " ", " ", "123", "45", " don", "'t", "\n\n", " ", " x"]
    assert _pieces("qwen2", text) == ["abc", " ", " ", "1", "2", "3", "4", "5", " don", "'t", "\n\n", " ", " x"]
    assert _pieces("llama-bpe", "DON'T Stop") == ["DON", "'T", " Stop"]  # contractions in any case
    assert _pieces("deepseek-coder", "ab中文12") == ["ab", "中文", "1", "2"]
    assert _pieces("deepseek-llm", "ab 中文123\n") == ["ab", " ", "中文", "123", "\n"]
    assert _pieces("deepseek-v3", "ab 中文12345") == ["ab", " ", "中文", "123", "45"]
    assert _pieces("gpt-4o", "HelloWorld's 12345") == ["Hello", "World's", " ", "123", "45"]
    for name in PRE_TOKENIZERS:  # every expression compiles and keeps the text whole
        assert "".join(_pieces(name, CORPUS[11] + CORPUS[8])) == CORPUS[11] + CORPUS[8], name


def test_every_pre_tokenizer_builds_a_tokenizer(tmp_path):
    trained, merges = byte_level_vocab(300)
    for name in [*PRE_TOKENIZERS, None]:
        path = write_gguf(tmp_path / "t.gguf", "llama", trained, [1] * len(trained), merges=merges, pre=name)
        tokenizer = ours(path)
        for text in CORPUS:
            assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text, (name, text)


def test_an_unknown_pre_tokenizer_warns_and_splits_as_gpt2(tmp_path):
    trained, merges = byte_level_vocab(300)
    path = write_gguf(tmp_path / "t.gguf", "llama", trained, [1] * len(trained), merges=merges, pre="brand-new")
    with pytest.warns(UserWarning, match="brand-new"):
        odd = ours(path)
    gpt2 = ours(write_gguf(tmp_path / "g.gguf", "llama", trained, [1] * len(trained), merges=merges, pre="gpt-2"))
    for text in CORPUS:
        assert odd.encode(text) == gpt2.encode(text)


def test_bos_and_eos_as_the_file_and_llama_cpp_say(tmp_path):
    trained, merges = byte_level_vocab(300)
    tokens, types = ["<bos>", "<eos>", *trained], [3, 3] + [1] * len(trained)

    def ids(pre, **keys):
        keys = {"bos_token_id": 0, "eos_token_id": 1, **keys}
        return ours(write_gguf(tmp_path / "t.gguf", "llama", tokens, types, merges=merges, pre=pre, **keys)).encode(
            "hi"
        )

    plain = ids("gpt-2")
    assert plain[0] != 0
    assert ids("llama-bpe") == [0, *plain]  # the Llama 3 family adds BOS where the file does not say
    assert ids("llama-bpe", add_bos_token=False) == plain
    assert ids("gpt-2", add_bos_token=True, add_eos_token=True) == [0, *plain, 1]
    spm = ours(sentencepiece_file(tmp_path / "s.gguf", "llama"))  # SentencePiece: BOS unless the file says not
    assert spm.encode("hi")[0] == 1 and spm.encode("hi", add_special_tokens=False)[0] != 1


def test_phi3_files_strip_the_whitespace_after_special_tokens(tmp_path):
    """llama.cpp's rule for files named Phi-3: the whitespace after a special or user-defined token belongs to it,
    except after <unk>, <s> and <|endoftext|> (Phi-3's tokenizer.json says the same)."""
    named = ours(sentencepiece_file(tmp_path / "p.gguf", "phi3", name="Phi-3 Mini Instruct"))
    plain = ours(sentencepiece_file(tmp_path / "q.gguf", "phi3"))
    user, end = named.convert_tokens_to_ids(["<|user|>", "<|end|>"])
    assert named.encode("<|user|>\nhi<|end|>  \n", add_special_tokens=False)[0] == user
    assert named.encode("<|user|>\nhi<|end|>  \n", add_special_tokens=False)[-1] == end
    assert named.encode("<|user|>\nhi", add_special_tokens=False) == named.encode(
        "<|user|>hi", add_special_tokens=False
    )
    assert plain.encode("<|user|>\nhi", add_special_tokens=False) != plain.encode(
        "<|user|>hi", add_special_tokens=False
    )
    text = "<|endoftext|>  x"
    assert named.encode(text, add_special_tokens=False) == plain.encode(text, add_special_tokens=False)


def test_gemma_files_keep_their_whitespace_tokens(tmp_path):
    tokenizer = ours(gemma_file(tmp_path / "g.gguf"))
    vocab = GGUFFile(tmp_path / "g.gguf").array("tokenizer.ggml.tokens")
    two, three, newline = vocab.index("  "), vocab.index("   "), vocab.index("\n")
    ids = tokenizer.encode("a  b   c\nd", add_special_tokens=False)
    assert two in ids and three in ids and newline in ids
    assert tokenizer.encode("hi")[0] == 2  # <bos>
    assert tokenizer.decode(ids) == "a  b   c\nd"
    assert tokenizer.convert_ids_to_tokens(two) == SPACE * 2  # as the normalized text spells it
    assert tokenizer.special_tokens_map == {
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
    }
    assert "<start_of_turn>" in tokenizer.all_special_tokens and "[multimodal]" not in tokenizer.all_special_tokens
    assert tokenizer.decode(tokenizer.encode("<start_of_turn>x"), skip_special_tokens=True) == "x"


def test_sentencepiece_bytes_fall_back(tmp_path):
    tokenizer = ours(sentencepiece_file(tmp_path / "s.gguf", "llama"))
    ids = tokenizer.encode("𓀀", add_special_tokens=False)  # not in the vocabulary: its four bytes
    assert [tokenizer.convert_ids_to_tokens(i) for i in ids[-4:]] == ["<0xF0>", "<0x93>", "<0x80>", "<0x80>"]
    assert tokenizer.decode(ids) == "𓀀"


def test_derived_merges_rank_by_score_then_longer_left_part():
    from specwise.models.gguf_tokenizer import _derived_merges

    tokens = ["a", "b", "c", "ab", "bc", "abc", "ca"]
    scores = np.array([0, 0, 0, -1, -2, -3, -1], dtype=np.float64)
    assert _derived_merges(tokens, scores) == [("a", "b"), ("c", "a"), ("b", "c"), ("ab", "c"), ("a", "bc")]


def test_named_chat_templates_are_read(tmp_path):
    path = byte_level_file(tmp_path / "t.gguf", "qwen2", "qwen2", kv_tokenizer__chat_template__tool_use="TOOLS")
    tokenizer = ours(path)
    chat = [{"role": "user", "content": "hi"}]
    assert tokenizer.chat_templates == {"tool_use": "TOOLS"}
    assert tokenizer.apply_chat_template(chat, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
    assert tokenizer.apply_chat_template(chat, tools=[{"type": "function"}], tokenize=False) == "TOOLS"


def test_broken_vocabularies_are_refused_in_one_line(tmp_path):
    trained, merges = byte_level_vocab(300)
    types = [1] * len(trained)
    cases = {
        "no tokenizer": dict(model=None),
        "not supported": dict(model="t5"),
        "not 300 integers": dict(types=types[:-1]),
        "needs tokenizer.ggml.merges": dict(merges=None),
        "not two tokens": dict(merges=["nospace"]),
        "needs tokenizer.ggml.scores": dict(model="llama", merges=None),
    }
    for message, change in cases.items():
        args = {"tokens": trained, "types": types, "merges": merges, "model": "gpt2", **change}
        path = tmp_path / "bad.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        if args["model"] is not None:
            writer.add_tokenizer_model(args["model"])
        writer.add_token_list(args["tokens"])
        writer.add_token_types(args["types"])
        if args["merges"] is not None:
            writer.add_token_merges(args["merges"])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        with pytest.raises(GGUFError, match=message):
            build(GGUFFile(path))
    path = write_gguf(tmp_path / "ids.gguf", "llama", trained, types, merges=merges, bos_token_id=10**6)
    with pytest.warns(UserWarning, match="bos_token_id"):
        vocab = read_vocab(GGUFFile(path))
    assert vocab.special_ids["bos_token"] is None


def test_reading_the_vocabulary_leaves_the_file_object_light():
    from specwise.models.loader import default_gguf_path

    meta = GGUFFile(default_gguf_path())
    build(meta)
    assert "tokenizer.ggml.tokens" not in meta.metadata and "tokenizer.ggml.merges" not in meta.metadata


def test_the_loader_builds_it_without_transformers(tmp_path):
    """A fresh interpreter loads the tokenizer of a GGUF file (built, then from the cache) and imports neither
    transformers nor torch."""
    path = byte_level_file(tmp_path / "t.gguf", "qwen2", "qwen2")
    code = (
        "import sys\nfrom pathlib import Path\nfrom specwise.models.loader import gguf_tokenizer\n"
        f"for _ in range(2):\n    t = gguf_tokenizer(Path({str(path)!r}))\n"
        "    assert t.decode(t.encode('hi there 123')) == 'hi there 123'\n"
        "    assert t.directory is not None\n"
        "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))\n"
    )
    env = {**os.environ, "SPECWISE_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_warnings_are_not_raised_for_good_files(fixture_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in FIXTURES:
            ours(fixture_dir / f"{name}.gguf")
