"""Fill in the middle as a library: finding a model's FIM tokens (GGUF metadata, checked against the vocabulary, else
names), the prompt's layout, drafting from the suffix, greedy FIM output with drafters equal to plain decoding (a
table model whose middle runs into the suffix, and a tiny random Qwen2 GGUF with FIM tokens), and
``specwise generate --suffix``.

The tiny GGUF files are written here: ``gguf_write``'s byte-level vocabulary with the FIM tokens (control tokens)
put in after the bytes, and optionally ``tokenizer.ggml.fim_*`` metadata.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import needs_hf
from specwise.drafters import NgramDrafter
from specwise.engine import Engine
from specwise.fim import STYLES, FimTokens, FimUnsupported, fim_prompt, fim_stop_ids, fim_tokens, require_fim
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
QWEN = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>"]
QWEN.append("<|file_sep|>")
FIRST_SPECIAL = 257  # after the 256 bytes and the one merged token
VOCAB = 288
CONTEXT = 256

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- tiny GGUF files with FIM tokens ------------------------------------------------------------------------


def special_id(name: str, names: list[str] = QWEN) -> int:
    return FIRST_SPECIAL + names.index(name)


def _vocab_writer(names: list[str], metadata: dict[str, int]):
    """A replacement for gguf_write's minimal vocabulary: the bytes, one merge, ``names`` as control tokens (the
    first is the end-of-sequence token), padding; plus ``metadata`` (uint32 keys)."""
    from specwise.models import gguf_write

    def write(writer, config) -> None:
        import gguf

        alphabet = [chr(c) for c in gguf_write._byte_alphabet()]
        tokens = [*alphabet, alphabet[0] * 2, *names]
        kinds = [gguf.TokenType.NORMAL] * FIRST_SPECIAL + [gguf.TokenType.CONTROL] * len(names)
        tokens += [f"[PAD{i}]" for i in range(len(tokens), config.vocab_size)]
        kinds += [gguf.TokenType.UNUSED] * (config.vocab_size - len(kinds))
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(kinds)
        writer.add_token_merges([f"{alphabet[0]} {alphabet[0]}"])
        writer.add_eos_token_id(FIRST_SPECIAL)
        for key, value in metadata.items():
            writer.add_uint32(key, value)

    return write


def write_fim_gguf(path: Path, names: list[str] = QWEN, metadata: dict[str, int] | None = None, seed: int = 0) -> Path:
    """A tiny random Qwen2 (Q8_0) whose vocabulary holds ``names`` from id 257 on (written from a Hugging Face model:
    needs the hf extra)."""
    torch = needs_hf()
    import transformers

    from specwise.models import gguf_write

    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        eos_token_id=FIRST_SPECIAL,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf_write, "_write_minimal_vocab", _vocab_writer(names, metadata or {}))
        return gguf_write.write_gguf(model, None, path, types="Q8_0", name=path.stem)


@pytest.fixture(scope="module")
def fim_cache(tmp_path_factory):
    """A tokenizer cache of the module's own (the GGUF tokenizers are built into it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECWISE_CACHE", str(tmp_path_factory.mktemp("fim-cache")))
        yield


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory, fim_cache) -> Path:
    pytest.importorskip("gguf")
    return write_fim_gguf(tmp_path_factory.mktemp("fim") / "tiny-fim.gguf")


@pytest.fixture(scope="module")
def qwen_loaded(qwen_gguf):
    from specwise.models import load_model

    return load_model(str(qwen_gguf))


# ---- finding the tokens ---------------------------------------------------------------------------------------


class VocabTokenizer:
    """A tokenizer with a vocabulary only (and characters as tokens 0..255 for encoding)."""

    bos_token_id = None

    def __init__(self, names: list[str], start: int = 1000) -> None:
        self.vocab = {chr(i): i for i in range(256)} | {name: start + i for i, name in enumerate(names)}

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self.encode(text)}


STARCODER = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<repo_name>", "<file_sep>", "<|endoftext|>"]
CODELLAMA = ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"]


@pytest.mark.parametrize(
    "names, source, stops",
    [
        (QWEN, "qwen", {"<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|endoftext|>"}),
        (STARCODER, "starcoder", {"<fim_pad>", "<repo_name>", "<file_sep>", "<|endoftext|>"}),
        (CODELLAMA, "codellama", {"▁<EOT>"}),
    ],
)
def test_fim_tokens_are_found_by_their_names(names, source, stops):
    tokenizer = VocabTokenizer(names)
    ids = tokenizer.vocab
    fim = fim_tokens(tokenizer)
    style = STYLES[source]
    assert fim.source == source
    assert (fim.prefix, fim.suffix, fim.middle) == (ids[style.prefix], ids[style.suffix], ids[style.middle])
    assert fim.stop_ids() == {ids[n] for n in stops}
    assert fim.repo_level == (source != "codellama")
    assert fim_stop_ids(fim, [7]) == {7} | fim.stop_ids()


def test_a_model_without_fim_tokens_has_none_and_is_refused_by_name():
    tokenizer = VocabTokenizer(["<|endoftext|>", "<|im_start|>", "<|fim_prefix|>"])  # no suffix nor middle
    assert fim_tokens(tokenizer) is None
    with pytest.raises(FimUnsupported, match="no fill-in-the-middle tokens"):
        require_fim(tokenizer)


def test_a_named_token_past_the_model_vocabulary_is_not_the_models():
    tokenizer = VocabTokenizer(QWEN, start=1000)
    assert fim_tokens(tokenizer, vocab_size=1003) is None  # the middle (1003) lies past the embedding
    assert fim_tokens(tokenizer, vocab_size=1004).pad is None


def test_metadata_wins_and_names_fill_in_what_it_does_not_give():
    tokenizer = VocabTokenizer(QWEN)
    fim = fim_tokens(tokenizer, {"prefix": 5, "suffix": 6, "middle": 7})
    assert (fim.prefix, fim.suffix, fim.middle, fim.source) == (5, 6, 7, "metadata")
    assert fim.pad == tokenizer.vocab["<|fim_pad|>"] and fim.ends == (tokenizer.vocab["<|endoftext|>"],)
    partial = fim_tokens(tokenizer, {"prefix": 5})  # without suffix and middle the metadata is not used
    assert partial.source == "qwen"


# ---- the prompt -------------------------------------------------------------------------------------------------

FIM = FimTokens(prefix=1000, suffix=1001, middle=1002, pad=1003, repo=1004, file_sep=1005)


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_the_prompt_is_prefix_suffix_middle():
    tokenizer = VocabTokenizer([])
    ids = fim_prompt(tokenizer, FIM, "ab", "cd", "e")
    assert ids == [1000, *chars("ab"), 1001, *chars("cd"), 1002, *chars("e")]
    assert fim_prompt(None, FIM, [5, 6], [7], []) == [1000, 5, 6, 1001, 7, 1002]  # token ids as they are


def test_files_of_context_use_the_repository_layout_where_the_model_has_it():
    tokenizer = VocabTokenizer([])
    ids = fim_prompt(tokenizer, FIM, "p", "s", extra=[("a.py", "x = 1"), ("b.py", "y\n")], repo_name="r", filename="c")
    expected = [1004, *chars("r\n"), 1005, *chars("a.py\nx = 1\n"), 1005, *chars("b.py\ny\n"), 1005, *chars("c\n")]
    assert ids == expected + [1000, *chars("p"), 1001, *chars("s"), 1002]
    plain = FimTokens(prefix=1000, suffix=1001, middle=1002)  # no repository tokens: the texts go first
    assert fim_prompt(tokenizer, plain, "p", "s", extra=[("a.py", "x")]) == [*chars("x\n"), 1000, 112, 1001, 115, 1002]


def test_the_prompt_starts_with_bos_where_the_tokenizer_adds_it():
    class WithBos(VocabTokenizer):
        bos_token_id = 1

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": ([1] if add_special_tokens else []) + self.encode(text)}

    assert fim_prompt(WithBos([]), FIM, "a", "b")[:2] == [1, 1000]


# ---- drafting from the suffix, exactness ------------------------------------------------------------------------

TOY_VOCAB = 64
PRE, SUF, MID, PAD = 60, 61, 62, 63
TOY_FIM = FimTokens(PRE, SUF, MID, pad=PAD)


def successor_model() -> ToyModel:
    """Greedy continues 20, 21, 22, ... after the middle token and ends with the padding token after 40."""
    table = np.full((1, TOY_VOCAB, TOY_VOCAB), -8.0, dtype=np.float32)
    for token in range(TOY_VOCAB):
        table[0, token, token + 1 if token < 40 else PAD] = 8.0
    table[0, MID, :] = -8.0
    table[0, MID, 20] = 8.0
    return ToyModel(table, max_length=CONTEXT)


def test_the_ngram_drafter_proposes_from_the_suffix():
    prompt = fim_prompt(None, TOY_FIM, [1, 2, 3], [24, 25, 26, 27, 28])
    drafter = NgramDrafter()
    draft = drafter.propose(prompt + [20, 21, 22, 23, 24], 4, GREEDY, None)
    assert draft.ids == [25, 26, 27, 28]  # the middle ran into the suffix: the suffix's next tokens are drafted
    alone = NgramDrafter().propose([PRE, 1, 2, 3, MID, 20, 21, 22, 23, 24], 4, GREEDY, None)
    assert alone.ids == []


def test_greedy_fim_with_the_ngram_drafter_is_plain_decoding_and_drafts_from_the_suffix():
    prompt = fim_prompt(None, TOY_FIM, [1, 2, 3], list(range(24, 40)))
    eos = fim_stop_ids(TOY_FIM, [])
    plain = Engine(successor_model(), None, gamma=0).generate(prompt, GREEDY, 64, eos_token_ids=eos)
    fast = Engine(successor_model(), NgramDrafter(), gamma=4).generate(prompt, GREEDY, 64, eos_token_ids=eos)
    assert plain.token_ids == list(range(20, 41)) + [PAD]
    assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason == "stop"
    assert fast.stats.accepted >= 12  # 24..39 come from the suffix
    without_suffix = fim_prompt(None, TOY_FIM, [1, 2, 3], [])
    control = Engine(successor_model(), NgramDrafter(), gamma=4).generate(without_suffix, GREEDY, 64, eos_token_ids=eos)
    assert control.token_ids == plain.token_ids and control.stats.accepted == 0


def test_greedy_fim_on_a_gguf_model_with_drafters_is_plain_decoding(qwen_loaded):
    from specwise.drafters import ModelDrafter
    from specwise.models import load_model

    tokenizer = qwen_loaded.tokenizer
    fim = fim_tokens(qwen_loaded)
    prompt = fim_prompt(tokenizer, fim, "def add(a, b):\n    return a", "\n\nprint(add(1, 2))\n")
    eos = fim_stop_ids(fim, {FIRST_SPECIAL})
    model = qwen_loaded.model

    def run(drafter, gamma, stops):
        return Engine(model, drafter, gamma=gamma).generate(prompt, GREEDY, 48, eos_token_ids=stops)

    draft = load_model(str(qwen_loaded.model.path)).model  # the target drafting for itself: all accepted
    for stops in (eos, []):  # the middle's own end (a FIM stop token), and 48 tokens past it
        plain = run(None, 0, stops)
        assert (plain.finish_reason, plain.token_ids[-1] in eos) == (("stop", True) if stops else ("length", False))
        for drafter, gamma in ((NgramDrafter(), 4), (ModelDrafter(draft), 3)):
            result = run(drafter, gamma, stops)
            assert result.token_ids == plain.token_ids
        assert result.stats.accepted >= len(plain.token_ids) // 2


# ---- the GGUF metadata ------------------------------------------------------------------------------------------


def test_the_loader_reads_fim_metadata_and_ignores_ids_outside_the_vocabulary(tmp_path, fim_cache, capfd):
    pytest.importorskip("gguf")
    from specwise.models import load_model

    names = ["<|endoftext|>", "<P>", "<S>", "<M>", "<|fim_pad|>"]  # names no style knows: only metadata finds them
    metadata = {
        "tokenizer.ggml.fim_pre_token_id": 258,
        "tokenizer.ggml.fim_suf_token_id": 259,
        "tokenizer.ggml.fim_mid_token_id": 260,
        "tokenizer.ggml.fim_pad_token_id": 261,
        "tokenizer.ggml.fim_sep_token_id": 9999,
    }
    loaded = load_model(str(write_fim_gguf(tmp_path / "meta.gguf", names, metadata)))
    assert (
        "metadata tokenizer.ggml.fim_sep_token_id (9999) is not a token id of the vocabulary" in capfd.readouterr().err
    )
    assert loaded.fim_token_ids == {"prefix": 258, "suffix": 259, "middle": 260, "pad": 261}
    fim = fim_tokens(loaded)
    assert (fim.prefix, fim.suffix, fim.middle, fim.pad, fim.file_sep, fim.source) == (
        258,
        259,
        260,
        261,
        None,
        "metadata",
    )
    unnamed = load_model(str(write_fim_gguf(tmp_path / "plain.gguf", names)))
    assert fim_tokens(unnamed) is None


def test_names_find_the_tokens_of_a_file_without_fim_metadata(qwen_loaded):
    fim = fim_tokens(qwen_loaded)
    assert fim.source == "qwen" and not qwen_loaded.fim_token_ids
    assert (fim.prefix, fim.middle, fim.file_sep) == (special_id("<|fim_prefix|>"), 260, special_id("<|file_sep|>"))
    assert qwen_loaded.tokenizer.decode(fim_prompt(qwen_loaded.tokenizer, fim, "a", "b")) == (
        "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>"
    )


# ---- the CLI ----------------------------------------------------------------------------------------------------


def generate(capsys, *argv: str) -> tuple[int, str, str]:
    from specwise.cli import run

    code, _ = run(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_with_a_suffix_fills_in_the_middle_exactly(qwen_gguf, qwen_loaded, capsys, tmp_path):
    prefix, suffix = "def add(a, b):\n    return a", "\n\nprint(add(1, 2))\n"
    common = ["--target", str(qwen_gguf), "--json", "--max-new-tokens", "24", "--temperature", "0"]
    answers = []
    for drafter in ("none", "ngram"):
        code, out, err = generate(capsys, prefix, "--suffix", suffix, "--drafter", drafter, *common)
        assert code == 0, err
        answers.append(json.loads(out)["token_ids"])
    (tmp_path / "suffix.txt").write_text(suffix, encoding="utf-8")
    code, out, err = generate(capsys, prefix, "--suffix-file", str(tmp_path / "suffix.txt"), *common)
    answers.append(json.loads(out)["token_ids"])
    fim = fim_tokens(qwen_loaded)
    prompt = fim_prompt(qwen_loaded.tokenizer, fim, prefix, suffix)
    eos = fim_stop_ids(fim, {FIRST_SPECIAL})
    expected = Engine(qwen_loaded.model, None, gamma=0).generate(prompt, GREEDY, 24, eos_token_ids=eos).token_ids
    assert answers == [expected] * 3


def test_generate_with_a_suffix_refuses_a_model_without_fim_tokens(tmp_path, fim_cache, capsys):
    pytest.importorskip("gguf")
    path = write_fim_gguf(tmp_path / "nofim.gguf", ["<|endoftext|>"])
    code, _, err = generate(capsys, "a", "--suffix", "b", "--target", str(path), "--drafter", "none")
    assert code != 0 and "no fill-in-the-middle tokens" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        generate(capsys, "a", "--suffix", "b", "--suffix-file", os.devnull)
    assert "not allowed with argument --suffix" in capsys.readouterr().err
    code, _, err = generate(capsys, "a", "--suffix-file", str(tmp_path / "missing.txt"), "--target", str(path))
    assert code != 0 and "cannot read --suffix-file" in err
