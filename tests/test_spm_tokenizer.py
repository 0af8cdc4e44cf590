"""The compact SentencePiece-style tokenizer (specwise.models.spm_tokenizer, kernels/spm.c) against the
``tokenizers.Tokenizer`` that specwise.models.gguf_tokenizer.build makes of the same GGUF file.

Tiny files of each kind (Llama-style with a space before each piece, Phi-3 named and not, Gemma-3-like with its
user-defined runs of whitespace, a file that carries its merges in an order of its own): every id, every token,
the vocabulary, the added tokens and every decoded text equal the reference's, on the project's corpus line by line
and whole, random strings of many scripts and whitespace, text with the added tokens inside, and random id
sequences (byte tokens out of order, special tokens, ids past the vocabulary). Real files: the SentencePiece-style
``.gguf`` files in ``$SPECWISE_TEST_GGUF_DIR`` (Gemma 3), when it is set. The loader uses the compact tokenizer for
these files, and what needs the ``tokenizer.json`` still gets it.
"""

from __future__ import annotations

import copy
import os
import random
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")

from test_gguf_tokenizer import (  # noqa: E402
    CORPUS,
    CORPUS_FILE,
    SPACE,
    TEXTS,
    gemma_file,
    sentencepiece_file,
    sentencepiece_vocab,
)
from test_gguf_tokenizer import write_gguf as write_gguf_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from specwise.models.gguf_file import GGUFError, GGUFFile  # noqa: E402
from specwise.models.gguf_tokenizer import _derived_merges, build, read_vocab  # noqa: E402
from specwise.models.spm_tokenizer import SentencePieceTokenizer, Unsupported, compact_available  # noqa: E402

if compact_available() is not None:
    pytest.skip(f"the compact tokenizer needs the native library: {compact_available()}", allow_module_level=True)

ENV_DIR = os.environ.get("SPECWISE_TEST_GGUF_DIR")


def merges_file(path: Path) -> Path:
    """A Llama-style file that carries merges: the ones its scores imply, in an order of their own (shuffled), so
    that ranks come from the list and not from the scores."""
    sentencepiece_file(path, "llama")
    vocab = read_vocab(GGUFFile(path))
    merges = [f"{a} {b}" for a, b in _derived_merges(vocab.tokens, vocab.scores.astype(np.float64))]
    random.Random(3).shuffle(merges)
    merges.append(merges[5])  # a pair given twice keeps its last rank
    return write_gguf_file(
        path,
        "llama",
        vocab.tokens,
        vocab.types,
        merges=merges,
        scores=vocab.scores,
        model="llama",
        bos_token_id=1,
        eos_token_id=2,
        unk_token_id=0,
        add_eos_token=True,  # and EOS after each text
    )


def few_bytes_file(path: Path, unk: bool = True) -> Path:
    """A Llama-style file with byte tokens for ASCII only (and without an unknown token where ``unk`` is False):
    other characters out of the vocabulary become the unknown token, runs of them fused (or are left out)."""
    head = (["<unk>"] if unk else []) + ["<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(128)]
    types = ([2] if unk else []) + [3, 3] + [6] * 128
    pieces = [t for t in sentencepiece_vocab() if t not in set(head)]
    tokens = head + pieces + ["<|end|>"]
    types += [1] * len(pieces) + [3]
    scores = [0.0] * len(head) + [-float(i) for i in range(len(pieces))] + [0.0]
    keys = {"bos_token_id": head.index("<s>"), "eos_token_id": head.index("</s>")}
    return write_gguf_file(path, "llama", tokens, types, scores=scores, model="llama", **keys)


FILES = {
    "spm-llama": lambda p: sentencepiece_file(p, "llama"),
    "spm-phi3": lambda p: sentencepiece_file(p, "phi3", name="Phi-3 Mini Instruct"),
    "spm-phi3-unnamed": lambda p: sentencepiece_file(p, "phi3"),
    "gemma3": gemma_file,
    "spm-merges": merges_file,
    "spm-unknown": few_bytes_file,
    "spm-no-unknown": lambda p: few_bytes_file(p, unk=False),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("spm-tokenizers")
    return {name: make(folder / f"{name}.gguf") for name, make in FILES.items()}


def pair(path: Path) -> tuple[SentencePieceTokenizer, Tokenizer]:
    """The compact tokenizer of a file and the reference (the tokenizers object built from the same file)."""
    return SentencePieceTokenizer.from_gguf(path), Tokenizer.from_str(build(GGUFFile(path))[0])


# ---- texts -------------------------------------------------------------------------------------------------------

PIECES = [
    "a", "Z", "hello", "the", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\u200b",
    "\u0085", "\x00", "\x1f", "é", "e\u0301", "ß", "Ω", "Ж", "ע", "ب", "क्षि", "中文", "日本語", "한국어", "ไทย",
    "😀", "👩‍👩‍👧", "🇫🇷", "\U0001f9ff", "\U000e0041", "\U0010fffd", "\ue000", "\ufffd", "\ufeff", SPACE, SPACE * 3,
    "<0x41>", "<0x", "0x41>", "<", ">", "<<", "</s", "<s", "<|", "|>", "<|end", "12345", "3.14", "-", "'s", "'",
    "def f(x):\n    return x", "{\"a\": [1, 2]}", "\\", "`", "~~~",
]  # fmt: skip


def random_texts(added: list[str], count: int, seed: int) -> list[str]:
    """Strings of many scripts, whitespace and punctuation, with the added tokens (and parts of them) inside."""
    rng = random.Random(seed)
    pool = PIECES + added + [t[: max(1, len(t) // 2)] for t in added]
    out = []
    for _ in range(count):
        parts = [rng.choice(pool) for _ in range(rng.randint(1, 24))]
        if rng.random() < 0.3:  # code points drawn from the whole range (no surrogates)
            ranges = [(0x20, 0x2FF), (0x300, 0xD7FF), (0xE000, 0x10FFFF)]
            parts += [chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 8))]
            rng.shuffle(parts)
        out.append("".join(parts))
    return out


def added_contents(reference: Tokenizer) -> list[str]:
    return [t.content for t in reference.get_added_tokens_decoder().values()]


# ---- the comparison ------------------------------------------------------------------------------------------------


def check_texts(compact: SentencePieceTokenizer, reference: Tokenizer, texts, tokens: bool = True) -> None:
    for text in texts:
        for special in (True, False):
            got = compact.encode(text, add_special_tokens=special)
            expected = reference.encode(text, add_special_tokens=special)
            assert got.ids == expected.ids, (text, special, expected.tokens)
            if tokens:
                assert got.tokens == expected.tokens, (text, special)
        ids = reference.encode(text, add_special_tokens=False).ids
        for skip in (True, False):
            assert compact.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)


def check_vocabulary(compact: SentencePieceTokenizer, reference: Tokenizer) -> None:
    assert compact.get_vocab() == reference.get_vocab(with_added_tokens=True)
    assert compact.get_vocab(with_added_tokens=False) == reference.get_vocab(with_added_tokens=False)
    for flag in (True, False):
        assert compact.get_vocab_size(with_added_tokens=flag) == reference.get_vocab_size(with_added_tokens=flag)
    n = reference.get_vocab_size()
    assert [compact.id_to_token(i) for i in range(n + 2)] == [reference.id_to_token(i) for i in range(n + 2)]
    for token in ["<unk>", "<bos>", "<s>", "<0x0A>", SPACE, "no such token", "", "a"]:
        assert compact.token_to_id(token) == reference.token_to_id(token), token

    def described(decoder: dict) -> dict:
        return {i: (t.content, t.special, t.rstrip, t.lstrip, t.single_word, t.normalized) for i, t in decoder.items()}

    assert described(compact.get_added_tokens_decoder()) == described(reference.get_added_tokens_decoder())


def check_random_ids(compact: SentencePieceTokenizer, reference: Tokenizer, seed: int) -> None:
    """Decoding any ids: byte tokens in any order (runs that are not UTF-8), special tokens, ids past the end."""
    rng = np.random.default_rng(seed)
    n = reference.get_vocab_size()
    byte_ids = [i for i in (reference.token_to_id(f"<0x{b:02X}>") for b in range(256)) if i is not None]
    special = list(reference.get_added_tokens_decoder())
    for _ in range(200):
        pool = [rng.integers(0, n + 5, 6), rng.choice(byte_ids, 6), rng.choice(special, 2)]
        ids = [int(i) for i in rng.permutation(np.concatenate(pool))[: rng.integers(0, 14)]]
        for skip in (True, False):
            assert compact.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
        tokens = [t for t in (reference.id_to_token(i) for i in ids) if t is not None]
        assert compact.decoder.decode(tokens) == reference.decoder.decode(tokens), tokens


@pytest.mark.parametrize("name", list(FILES))
def test_tiny_files_encode_and_decode_as_the_tokenizers_library(files, name):
    compact, reference = pair(files[name])
    check_vocabulary(compact, reference)
    check_texts(compact, reference, TEXTS + CORPUS_FILE.read_text(encoding="utf-8").splitlines())
    check_texts(compact, reference, random_texts(added_contents(reference), 300, seed=len(name)))
    check_random_ids(compact, reference, seed=len(name))
    assert (
        compact.encode_batch(CORPUS[:3], add_special_tokens=False)[2].ids
        == reference.encode(CORPUS[2], add_special_tokens=False).ids
    )


def test_random_small_vocabularies(tmp_path):
    """Vocabularies of a few letters with random pieces and scores (many equal: the ties between merges that the
    longer left part, then the longer right part, then the place decide), derived merges or the file's in a random
    order, with and without a space prefix: every id of random texts equals the reference's."""
    rng = random.Random(7)
    for case in range(40):
        letters = "abc▁" if case % 2 else "abcd"
        pieces = set(letters)
        while len(pieces) < 24:
            pieces.add("".join(rng.choice(letters) for _ in range(rng.randint(2, 5))))
        pieces = sorted(pieces, key=lambda p: (len(p), rng.random()))
        tokens = ["<unk>", "<s>", "</s>", *pieces]
        types = [2, 3, 3] + [1] * len(pieces)
        scores = [0.0, 0.0, 0.0] + [float(-rng.randint(0, 6)) for _ in pieces]
        keys = {"bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0, "add_space_prefix": bool(case % 3)}
        merges = None
        if case % 4 == 3:
            merges = [f"{a} {b}" for a, b in _derived_merges(tokens, np.array(scores))]
            rng.shuffle(merges)
        path = write_gguf_file(
            tmp_path / f"v{case}.gguf", "llama", tokens, types, scores=scores, merges=merges, model="llama", **keys
        )
        compact, reference = pair(path)
        texts = ["".join(rng.choice(letters + " x") for _ in range(rng.randint(0, 30))) for _ in range(60)]
        check_texts(compact, reference, texts, tokens=False)


def test_the_whole_corpus_as_one_text(files):
    corpus = CORPUS_FILE.read_text(encoding="utf-8")
    for path in files.values():
        compact, reference = pair(path)
        check_texts(compact, reference, [corpus, corpus * 3])


def test_phi3_files_take_the_whitespace_after_their_special_tokens(files):
    compact, reference = pair(files["spm-phi3"])
    texts = ["<|user|> \u3000\n\thi<|end|>\u2028x", "<|end|>   <|end|>", "<|endoftext|>  x", "<s> a", "a<|user|>"]
    texts += [f"<|end|>{space}x" for space in "\u0085\u00a0\u1680\u2000\u200a\u2029\u202f\u205f\u200b\u180e\ufeff"]
    check_texts(compact, reference, texts)
    assert compact.encode("<|user|>\n hi", add_special_tokens=False).tokens[0] == "<|user|>\n "


def test_long_added_tokens(tmp_path):
    """Added tokens of 63, 64 and 70 bytes (the search reads lengths from 64 bytes on as one class)."""
    long = ["<" + "x" * 61 + ">", "<" + "x" * 62 + ">", "<" + "x" * 68 + ">", "<" + "x" * 69 + ">"]
    tokens = ["<unk>", "<s>", "</s>", "<", ">", "x", "xx", "xxxx", *long]
    types = [2, 3, 3, 1, 1, 1, 1, 1, 4, 3, 4, 3]
    path = write_gguf_file(tmp_path / "l.gguf", "llama", tokens, types, scores=[0.0] * 12, model="llama")
    compact, reference = pair(path)
    texts = [a + b for a in long for b in long] + [t[:-1] for t in long] + ["a" + t[1:] + t for t in long]
    check_texts(compact, reference, texts)


def test_byte_tokens_decode_as_the_tokenizers_library_reads_them(tmp_path):
    """``<0xXX>`` is a byte where XX is two hex digits in either case, or ``+`` and one (Rust's reading)."""
    tokens = [
        "<unk>",
        "<s>",
        "</s>",
        "<0x0A>",
        "<0x0a>",
        "<0x+A>",
        "<0x-A>",
        "<0xé>",
        "<0xC3>",
        "<0xA9>",
        "<0xZZ>",
        "a",
    ]
    path = write_gguf_file(tmp_path / "b.gguf", "llama", tokens, [2, 3, 3] + [1] * 9, scores=[0.0] * 12, model="llama")
    compact, reference = pair(path)
    for ids in ([3, 4, 5, 6], [8, 9], [9, 8, 11], [7, 10, 5], [8, 11, 9], [5, 5, 8, 9, 4], [1, 8]):
        assert compact.decode(ids) == reference.decode(ids), ids


def test_copies_share_the_tokenizer_and_it_is_immutable(files):
    compact, _ = pair(files["gemma3"])
    assert copy.deepcopy(compact) is compact and copy.copy(compact) is compact


# ---- bad input -----------------------------------------------------------------------------------------------------


def test_bad_input_is_refused_clearly(files):
    compact, _ = pair(files["gemma3"])
    for bad in (None, 12, b"bytes", ["a"]):
        with pytest.raises(TypeError, match="must be a str"):
            compact.encode(bad)
    with pytest.raises(TypeError, match="must be str"):
        compact.encode_batch(["a", 3])
    with pytest.raises(ValueError, match="not valid Unicode"):
        compact.encode("a\ud800b")
    with pytest.raises(TypeError, match="integers"):
        compact.decode("abc")
    with pytest.raises(TypeError):
        compact.decode([1.5])
    with pytest.raises(OverflowError):
        compact.decode([-1])
    with pytest.raises(OverflowError):
        compact.decode([1 << 32])
    with pytest.raises(OverflowError):
        compact.id_to_token(-1)
    with pytest.raises(TypeError, match="a str"):
        compact.token_to_id(3)
    assert compact.decode(np.array([5, 6], dtype=np.int32)) == compact.decode([5, 6])
    with pytest.raises(TypeError, match="from_vocab or from_gguf"):
        SentencePieceTokenizer()


def test_the_native_calls_refuse_arguments_out_of_range(files):
    """Each entry point checks the sizes it reads by before it reads (-1), whatever Python passes."""
    import ctypes

    from specwise.models.kernels import native_library

    lib = native_library()
    compact, _ = pair(files["gemma3"])
    good = compact._struct
    ids, out, text = np.zeros(64, dtype=np.int32), np.zeros(64, dtype=np.uint8), b"hello"

    def changed(**fields) -> ctypes.Structure:
        struct = type(good).from_buffer_copy(good)
        for name, value in fields.items():
            setattr(struct, name, value)
        return struct

    for fields in ({"table_size": 1000}, {"table_size": 4}, {"n": 0}, {"n": -5}, {"unk": 10**6}, {"longest": 70000},
                   {"added_max": 10**6}, {"offsets": None}, {"pairs_size": 8}):  # fmt: skip
        struct = changed(**fields)
        assert lib.specwise_spm_encode(ctypes.byref(struct), text, 5, ids.ctypes.data, 64, None) == -1, fields
        assert lib.specwise_spm_decode(ctypes.byref(struct), ids.ctypes.data, 3, 0, out.ctypes.data, 64) == -1, fields
    ref = ctypes.byref(good)
    assert lib.specwise_spm_encode(ref, text, -1, ids.ctypes.data, 64, None) == -1
    assert lib.specwise_spm_encode(ref, text, 5, ids.ctypes.data, 1, None) == -3  # the room given is too small
    assert lib.specwise_spm_decode(ref, ids.ctypes.data, -1, 0, out.ctypes.data, 64) == -1
    assert lib.specwise_spm_index(ref, np.zeros(4, dtype=np.int32).ctypes.data) == -1  # not the vocabulary's table
    lengths = np.array([0, 3, 1], dtype=np.int64)  # offsets that go backwards
    assert lib.specwise_spm_lookup(ref, b"abc", lengths.ctypes.data, 2, ids.ctypes.data) == -1


def test_vocabularies_it_does_not_take_are_refused(tmp_path):
    from test_gguf_tokenizer import byte_level_file

    with pytest.raises(Unsupported, match="not a SentencePiece-style"):
        SentencePieceTokenizer.from_gguf(byte_level_file(tmp_path / "b.gguf", "qwen2", "qwen2"))
    tokens = ["<unk>", "a", "b", "ab", "a"]  # a token repeated
    path = write_gguf_file(tmp_path / "r.gguf", "llama", tokens, [2, 1, 1, 1, 1], scores=[0, -1, -2, -3, -4],
                           model="llama")  # fmt: skip
    with pytest.raises(Unsupported, match="repeat"):
        SentencePieceTokenizer.from_gguf(path)
    path = write_gguf_file(tmp_path / "m.gguf", "llama", tokens[:4], [2, 1, 1, 1], merges=["a c"], model="llama")
    with pytest.raises(GGUFError, match="no token"):
        SentencePieceTokenizer.from_gguf(path)


# ---- the loader and LightTokenizer ---------------------------------------------------------------------------------


def test_the_loader_uses_it_and_builds_the_tokenizer_json_only_when_asked(files, tmp_path, monkeypatch):
    from specwise.models.loader import gguf_tokenizer
    from specwise.models.tokenizer import LightTokenizer
    from specwise.server.encoding import lock_free_backend

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path / "cache"))
    path = files["gemma3"]
    light = gguf_tokenizer(path)
    assert isinstance(light.backend_tokenizer, SentencePieceTokenizer)
    assert not (tmp_path / "cache" / "tokenizers").exists()  # nothing written: the compact one needs no cache
    text, config = build(GGUFFile(path))
    reference = LightTokenizer.from_json(text, config)
    chat = [{"role": "user", "content": "hi  there"}, {"role": "assistant", "content": "\tok\n"}]
    for sample in TEXTS:
        assert light.encode(sample) == reference.encode(sample)
        assert light(sample)["input_ids"] == reference(sample)["input_ids"]
        assert light.tokenize(sample) == reference.tokenize(sample)
        ids = reference.encode(sample)
        assert light.decode(ids) == reference.decode(ids)
        assert light.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
    assert light(TEXTS[:4])["input_ids"] == reference(TEXTS[:4])["input_ids"]
    assert light.apply_chat_template(chat, add_generation_prompt=True) == reference.apply_chat_template(
        chat, add_generation_prompt=True
    )
    for name in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "vocab_size", "all_special_ids"):
        assert getattr(light, name) == getattr(reference, name), name
    assert len(light) == len(reference) and light.get_vocab() == reference.get_vocab()
    assert {i: t.content for i, t in light.added_tokens_decoder.items()} == {
        i: t.content for i, t in reference.added_tokens_decoder.items()
    }
    pieces = light.convert_ids_to_tokens(reference.encode("a  b\u00e9"))
    assert light.convert_tokens_to_string(pieces) == reference.convert_tokens_to_string(pieces)
    assert lock_free_backend(light) is light.backend_tokenizer  # the server encodes with it off the lock

    twin = copy.deepcopy(light)  # the server's copy for its request thread: the backend shared
    assert twin.backend_tokenizer is light.backend_tokenizer and twin.encode(TEXTS[0]) == light.encode(TEXTS[0])

    # what needs the tokenizer.json (constraints, transformers, the tokenizers object) gets it, built and cached
    assert light.backend_tokenizer.to_str() == text
    assert list((tmp_path / "cache" / "tokenizers").glob("*/tokenizer.json"))
    full = light.backend_tokenizer.tokenizer
    assert isinstance(full, Tokenizer) and full.encode(TEXTS[0]).ids == light.encode(TEXTS[0])
    assert light.backend_tokenizer.model.unk_token == "<unk>"  # anything else: the tokenizers object's
    saved = light.save_pretrained(tmp_path / "saved")
    assert LightTokenizer(tmp_path / "saved").encode(TEXTS[0]) == light.encode(TEXTS[0]), saved


def test_the_server_and_constraints_read_it(files, tmp_path, monkeypatch):
    from specwise.models.loader import gguf_tokenizer
    from specwise.models.tokenizer import LightTokenizer
    from specwise.server.logprobs import TokenTexts

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path / "cache"))
    light = gguf_tokenizer(files["gemma3"])
    reference = LightTokenizer.from_json(*build(GGUFFile(files["gemma3"])))
    ours, theirs = TokenTexts(light), TokenTexts(reference)
    ids = [*range(len(reference)), *reference.encode("a\u00e9\U0001f600  <start_of_turn>x")]
    assert [ours(i) for i in ids] == [theirs(i) for i in ids]
    llg = pytest.importorskip("llguidance")
    from specwise.constraints import grammar_tokenizer

    built = grammar_tokenizer(light)
    assert isinstance(built, llg.LLTokenizer) and built.vocab_size == len(reference)


def test_the_loader_falls_back_to_the_tokenizers_library(tmp_path, monkeypatch):
    from specwise.models.loader import gguf_tokenizer

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path / "cache"))
    tokens = ["<unk>", "<s>", "</s>", "a", "b", "ab", "a"]  # a token repeated: the compact tokenizer refuses it
    types, scores = [2, 3, 3, 1, 1, 1, 1], [0, 0, 0, -1, -2, -3, -4]
    path = write_gguf_file(tmp_path / "r.gguf", "llama", tokens, types, scores=scores, model="llama", bos_token_id=1)
    light = gguf_tokenizer(path)
    assert isinstance(light.backend_tokenizer, Tokenizer) and light.directory is not None
    assert light.encode("ab a") == Tokenizer.from_str(build(GGUFFile(path))[0]).encode("ab a").ids


# ---- real files ----------------------------------------------------------------------------------------------------


def _real_files() -> list[Path]:
    if not ENV_DIR or not Path(ENV_DIR).expanduser().is_dir():
        return []
    found = sorted(Path(ENV_DIR).expanduser().glob("*.gguf"))
    return [p for p in found if GGUFFile(p).get("tokenizer.ggml.model") == "llama"]


@pytest.mark.parametrize("path", _real_files() or [None], ids=lambda p: p.name if p else "none")
def test_real_files_encode_and_decode_as_the_tokenizers_library(path):
    """Gemma 3 and any other SentencePiece-style file in $SPECWISE_TEST_GGUF_DIR (skipped where it is not set)."""
    if path is None:
        pytest.skip("no SentencePiece-style .gguf files: set SPECWISE_TEST_GGUF_DIR")
    compact, reference = pair(path)
    check_vocabulary(compact, reference)
    corpus = CORPUS_FILE.read_text(encoding="utf-8")
    check_texts(compact, reference, TEXTS + corpus.splitlines() + [corpus])
    added = added_contents(reference)
    check_texts(compact, reference, random_texts(added[:200] + added[-200:], 400, seed=11))
    check_random_ids(compact, reference, seed=11)
