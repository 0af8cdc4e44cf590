"""The tokenizer of a GGUF file built from its metadata, without transformers.

A GGUF file carries its tokenizer as metadata (llama.cpp's keys, https://github.com/ggml-org/ggml/blob/master/docs/
gguf.md): the vocabulary ``tokenizer.ggml.tokens``, each token's type ``token_type`` (1 normal, 2 unknown,
3 control, 4 user-defined, 5 unused, 6 byte), the BPE ``merges`` or the SentencePiece ``scores``, the kind of
tokenizer ``tokenizer.ggml.model`` and, for BPE, the name of its pre-tokenizer ``tokenizer.ggml.pre``, the special
token ids, ``add_bos_token`` / ``add_eos_token`` / ``add_space_prefix`` and the chat template. From these
:func:`build` makes a ``tokenizers.Tokenizer`` (the ``tokenizer.json`` of the ``tokenizers`` library) and the
``tokenizer_config.json`` settings that :class:`specwise.models.tokenizer.LightTokenizer` reads, so that text is
split as llama.cpp splits it for the same file:

- ``gpt2``: byte-level BPE (SmolLM2, Llama 3, Qwen2/Qwen3, ...). Text is cut by the pre-tokenizer's regular
  expressions, named by ``tokenizer.ggml.pre`` (:data:`PRE_TOKENIZERS`: the expressions each model's own tokenizer
  was trained with; ``smollm`` and the StarCoder family split digits one by one first, Llama 3 cuts numbers in runs
  of three, Qwen2 one digit at a time, ...), each piece written in the GPT-2 byte alphabet and merged by the file's
  merges (for the Llama 3 family a piece that is itself a token is kept whole, as llama.cpp does).
- ``llama``: SentencePiece-style BPE with byte fallback (Gemma 3, Phi-3, Llama 2, ...). Spaces are written ``▁``,
  one is put before the text where ``add_space_prefix`` (default on; Gemma's files turn it off) and after every
  special or user-defined token in it, as llama.cpp does; characters outside the vocabulary become ``<0xNN>`` byte
  tokens. Merges are the file's, or derived from the vocabulary: every split of a token into two tokens, ranked by
  the token's score (Gemma: by its place in the file, which its scores do not follow), longer left part first. Gemma
  files store runs of spaces as tokens of real spaces: they are written back as runs of ``▁``.

Control tokens (and the unknown token) are special added tokens, user-defined tokens plain added tokens: both are
matched whole in text. Phi-3 files (by their name, as llama.cpp decides it) strip the whitespace after their
special tokens.

Where this differs from transformers' own GGUF conversion, it is on purpose and follows llama.cpp and the model's
original ``tokenizer.json``: transformers gives SmolLM2 and the StarCoder family GPT-2's split without the digit
split (``"a  1"`` becomes ``a``, ``Ġ``, ``Ġ``, ``1`` rather than ``a``, ``ĠĠ``, ``1``), keeps merges for the Llama 3
family, and prefixes ``▁`` only at the start of a Llama-style SentencePiece text (and there only if it does not
start with a space). ``tests/test_gguf_tokenizer.py`` checks every other id against transformers and these cases
against llama.cpp. Two of llama.cpp's own rules are not followed: it turns a token written ``</s>`` (and a few
other end-of-turn names) into a control token by its name even where the file marks it normal (Qwen2.5's
vocabulary; its own tokenizer keeps it plain text), and it ranks Gemma's runs of ``▁`` by their score of -1000
where transformers and this module rank them by their place in the file (which matters only for text that holds
the character ``▁`` itself).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from specwise.models.gguf_file import GGUFError, GGUFFile

__all__ = ["GGUFVocab", "PRE_TOKENIZERS", "read_vocab", "build", "build_json", "tokenizer_config", "byte_alphabet"]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # ▁, SentencePiece's space

# ---- pre-tokenizers of byte-level BPE vocabularies ------------------------------------------------------------

# The regular expressions each family's tokenizer was trained with (as its tokenizer.json and llama.cpp state them).
# Each is applied in turn to the pieces the previous one left, keeping both the matches and the text between them.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff"  # CJK ideographs, U+0800 to them, Hangul
_DEEPSEEK_LLM = (
    "[\r\n]",
    # letters of the Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee and other cased scripts (as DeepSeek
    # LLM's tokenizer.json lists them; written as code points: several are changed by Unicode normalization)
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",  # ASCII and full-width punctuation
    "\\s+$",
    f"[{_CJK}]+",
    "\\p{N}+",
)
_DEEPSEEK_CODER = ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", f"[{_CJK}]+", "\\p{N}")
_DEEPSEEK3 = (
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",  # CJK ideographs, hiragana, katakana
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
_FALCON = ("[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2, "[0-9][0-9][0-9]")
_BLOOM = (" ?[^(\\s|.,!?…。，、।۔،)]+",)


@dataclass(frozen=True)
class PreTokenizer:
    """How a byte-level vocabulary's text is cut before merging: regular expressions applied in turn (``gpt2``:
    GPT-2's own, as the byte-level step applies it), whether a piece that is a token is kept whole
    (``ignore_merges``), and whether a BOS token is added when the file does not say."""

    splits: tuple[str, ...] = ()
    digits: bool = False  # every digit a piece of its own before the other expressions
    gpt2: bool = False
    ignore_merges: bool = False
    add_bos: bool = False


_GPT2_PRE = PreTokenizer(gpt2=True)
_DIGITS_PRE = PreTokenizer(digits=True, gpt2=True)
_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_PRE = PreTokenizer((_QWEN2,))

#: ``tokenizer.ggml.pre`` -> its pre-tokenizer (the names llama.cpp reads). A name not listed (or none) is cut as
#: GPT-2 cuts text, with a warning for a name that is not ``default``.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **dict.fromkeys(
        (
            "default",
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "jina-v1-en",
            "jina-v2-es",
            "jina-v2-de",
            "jina-v2-code",
            "gigachat",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
        ),
        _GPT2_PRE,
    ),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"), _DIGITS_PRE
    ),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
        _LLAMA3_PRE,
    ),
    "dbrx": PreTokenizer((_LLAMA3,)),
    "smaug-bpe": PreTokenizer((_LLAMA3,)),
    **dict.fromkeys(("chatglm-bpe", "glm4", "glm5"), PreTokenizer((_LLAMA3,), ignore_merges=True)),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"), _QWEN2_PRE
    ),
    "qwen35": PreTokenizer((_QWEN35,)),
    "tekken": PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), PreTokenizer((_GPT4O,))),
    "deepseek-llm": PreTokenizer(_DEEPSEEK_LLM),
    "deepseek-coder": PreTokenizer(_DEEPSEEK_CODER),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), PreTokenizer(_DEEPSEEK3)),
    "falcon": PreTokenizer(_FALCON),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), PreTokenizer(_BLOOM)),
    "viking": PreTokenizer((*_BLOOM, "\\p{N}")),
}

# SentencePiece-style files whose merges follow the vocabulary's order rather than its scores, and which store
# runs of spaces as real spaces
_GEMMA = ("gemma", "gemma2", "gemma3", "gemma3n")


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte alphabet: each byte as a printable character (the printable Latin-1 bytes as themselves, the
    others as the characters from U+0100 on, in order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(0x100, 0x200))
    return {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}


# ---- what the file says ---------------------------------------------------------------------------------------


@dataclass
class GGUFVocab:
    """A GGUF file's tokenizer metadata, checked."""

    name: str  # the file's name, for messages
    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str | None
    architecture: str
    model_name: str  # general.name
    tokens: list[str]
    types: np.ndarray  # int32, one per token (1 where the file gives none)
    scores: np.ndarray | None  # float32
    merges: list[str] | None
    special_ids: dict[str, int | None]  # bos_token, eos_token, unk_token, pad_token
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None
    chat_templates: dict[str, str] = field(default_factory=dict)  # named ones: tokenizer.chat_template.NAME


def _array(meta: GGUFFile, key: str):
    """A metadata array read for this build only (the file object does not keep it: a large vocabulary's strings
    would stay in memory with the model)."""
    kept = key in meta.metadata
    value = meta.array(key)
    if not kept:
        meta.metadata.pop(key, None)
    return value


def _special_ids(meta: GGUFFile, name: str, model: str, tokens: list[str]) -> dict[str, int | None]:
    """The ids of the BOS, EOS, unknown and padding tokens (None where the file gives none, or one that is not a
    token id, with a warning); a SentencePiece vocabulary's unknown token is ``<unk>`` where the file names none."""
    n = len(tokens)
    special_ids: dict[str, int | None] = {}
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        if value is None or isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
            if value is not None:
                warnings.warn(
                    f"{name}: tokenizer.ggml.{key}_token_id {value!r} is not a token id (0..{n - 1}): ignored",
                    stacklevel=3,
                )
            value = None
        special_ids[f"{role}_token"] = value
    if model == "llama" and special_ids["unk_token"] is None and "<unk>" in tokens:
        special_ids["unk_token"] = tokens.index("<unk>")
    return special_ids


def _chat_templates(meta: GGUFFile) -> tuple[str | None, dict[str, str]]:
    """The file's chat template (None where it has none) and its named ones (``tokenizer.chat_template.NAME``)."""
    template = meta.get("tokenizer.chat_template")
    named = {
        key.removeprefix("tokenizer.chat_template."): value
        for key, value in meta.metadata.items()
        if key.startswith("tokenizer.chat_template.") and isinstance(value, str) and value
    }
    return (template if isinstance(template, str) and template else None), named


def read_vocab(meta: GGUFFile) -> GGUFVocab:
    """The tokenizer metadata of a GGUF file, checked; raises GGUFError naming what is wrong."""
    name = meta.path.name

    def fail(what: str):
        raise GGUFError(f"{name}: {what}")

    model = meta.get("tokenizer.ggml.model")
    if model is None:
        fail("the file has no tokenizer (no tokenizer.ggml.model)")
    if model not in ("gpt2", "llama"):
        fail(f"tokenizer.ggml.model {model!r} is not supported (gpt2: byte-level BPE; llama: SentencePiece-style BPE)")
    tokens = _array(meta, "tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        fail("tokenizer.ggml.tokens is missing, empty or not a list of strings")
    n = len(tokens)
    types = _array(meta, "tokenizer.ggml.token_type")
    if types is None:
        types = np.full(n, NORMAL, dtype=np.int32)
    elif not isinstance(types, np.ndarray) or types.dtype.kind not in "iu" or types.shape != (n,):
        fail(f"tokenizer.ggml.token_type is not {n:,} integers (one per token)")
    scores = _array(meta, "tokenizer.ggml.scores")
    if scores is not None and (not isinstance(scores, np.ndarray) or scores.dtype.kind != "f" or scores.shape != (n,)):
        fail(f"tokenizer.ggml.scores is not {n:,} numbers (one per token)")
    merges = _array(meta, "tokenizer.ggml.merges")
    if merges is not None and (not isinstance(merges, list) or not all(isinstance(m, str) for m in merges)):
        fail("tokenizer.ggml.merges is not a list of strings")
    if model == "gpt2" and merges is None:
        fail("a byte-level BPE vocabulary (tokenizer.ggml.model gpt2) needs tokenizer.ggml.merges")
    if model == "llama" and merges is None and scores is None:
        fail("a SentencePiece vocabulary needs tokenizer.ggml.scores or tokenizer.ggml.merges")

    special_ids = _special_ids(meta, name, model, tokens)

    def flag(key: str, default: bool) -> bool:
        value = meta.get(f"tokenizer.ggml.{key}")
        return bool(value) if isinstance(value, (bool, int)) else default

    pre = meta.get("tokenizer.ggml.pre")
    pre = pre if isinstance(pre, str) and pre else None
    architecture = str(meta.get("general.architecture") or "")
    if model == "gpt2":
        add_bos_default = PRE_TOKENIZERS.get(pre or "default", _GPT2_PRE).add_bos
        space_default = False
    else:
        add_bos_default = True
        space_default = architecture not in _GEMMA
    template, named = _chat_templates(meta)
    return GGUFVocab(
        name=name,
        model=model,
        pre=pre,
        architecture=architecture,
        model_name=str(meta.get("general.name") or ""),
        tokens=tokens,
        types=np.asarray(types, dtype=np.int64).astype(np.int32),
        scores=None if scores is None else np.asarray(scores, dtype=np.float32),
        merges=merges,
        special_ids=special_ids,
        add_bos=flag("add_bos_token", add_bos_default),
        add_eos=flag("add_eos_token", False),
        add_space_prefix=flag("add_space_prefix", space_default) if model == "llama" else False,
        chat_template=template,
        chat_templates=named,
    )


# ---- the tokenizer ----------------------------------------------------------------------------------------------


def _split_merge(merge: str) -> tuple[str, str] | None:
    """A merge "a b" as its two parts: the first space after the first character separates them (so that a merge
    of a space token, " b", reads as llama.cpp reads it)."""
    at = merge.find(" ", 1)
    if at <= 0 or at == len(merge) - 1:
        return None
    return merge[:at], merge[at + 1 :]


def _derived_merges(tokens: list[str], priority: np.ndarray) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies: every split of a token into two tokens of the vocabulary,
    ranked by the token's priority (highest first), then the longer left part, then the longer right part, then
    the token's place in the vocabulary."""
    vocab = {t: i for i, t in enumerate(tokens)}
    order: dict[str, float] = {}
    for token, value in zip(tokens, priority.tolist()):
        order[token] = value  # the first place of a token repeated in the file, its last priority
    lefts: list[str] = []
    rights: list[str] = []
    ranks: list[float] = []
    places: list[int] = []
    cuts: list[int] = []
    tails: list[int] = []
    for place, (token, value) in enumerate(order.items()):
        n = len(token)
        for k in range(1, n):
            left = token[:k]
            if left in vocab:
                right = token[k:]
                if right in vocab:
                    lefts.append(left)
                    rights.append(right)
                    ranks.append(value)
                    places.append(place)
                    cuts.append(k)
                    tails.append(n - k)
    if not lefts:
        return []
    keys = (np.array(places), -np.array(tails), -np.array(cuts), -np.array(ranks, dtype=np.float64))
    index = np.lexsort(keys)  # the last key sorts first
    return [(lefts[i], rights[i]) for i in index.tolist()]


def _added(content: str, token_id: int, special: bool, rstrip: bool = False) -> dict:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": rstrip,
        "normalized": False,
        "special": special,
    }


def _split(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _pre_tokenizer(pre: PreTokenizer) -> dict:
    steps = [{"type": "Digits", "individual_digits": True}] if pre.digits else []
    steps += [_split(pattern) for pattern in pre.splits]
    steps.append(_byte_level(pre.gpt2))
    return steps[0] if len(steps) == 1 else {"type": "Sequence", "pretokenizers": steps}


def _template(vocab: GGUFVocab, tokens: list[str]) -> dict | None:
    """The post-processor adding BOS / EOS as the file asks (None: nothing to add)."""
    bos = vocab.special_ids["bos_token"] if vocab.add_bos else None
    eos = vocab.special_ids["eos_token"] if vocab.add_eos else None
    if bos is None and eos is None:
        return None

    def seq(part: str, type_id: int) -> list[dict]:
        items = [{"SpecialToken": {"id": tokens[bos], "type_id": type_id}}] if bos is not None else []
        items.append({"Sequence": {"id": part, "type_id": type_id}})
        if eos is not None:
            items.append({"SpecialToken": {"id": tokens[eos], "type_id": type_id}})
        return items

    specials = {tokens[i]: {"id": tokens[i], "ids": [i], "tokens": [tokens[i]]} for i in (bos, eos) if i is not None}
    return {
        "type": "TemplateProcessing",
        "single": seq("A", 0),
        "pair": seq("A", 0) + seq("B", 1),
        "special_tokens": specials,
    }


def _is_phi3(vocab: GGUFVocab) -> bool:
    name = vocab.model_name.lower()
    return "phi-3" in name or "phi3" in name


def spelled_tokens(vocab: GGUFVocab) -> tuple[list[str], set[int]]:
    """The tokens as the tokenizer's vocabulary spells them, and the ids respelled that are not added tokens.

    Byte-level: a normal token written as plain text (not in the byte alphabet) is respelled in it. Gemma: a token
    of spaces is written as the run of ``▁`` the normalized text holds (and reached by merges, not matched whole).
    """
    tokens = list(vocab.tokens)
    respelled: set[int] = set()
    if vocab.model == "gpt2":
        alphabet = byte_alphabet()
        letters = set(alphabet.values())
        types = vocab.types
        for i, token in enumerate(tokens):
            if types[i] == NORMAL and not letters.issuperset(token):
                tokens[i] = "".join(alphabet[b] for b in token.encode("utf-8"))
    elif vocab.architecture in _GEMMA:
        for i, token in enumerate(tokens):
            if " " in token and not token.strip():
                tokens[i] = SPACE * len(token)
                respelled.add(i)
    return tokens, respelled


def _file_merges(vocab: GGUFVocab) -> list:
    """The file's merges as tokenizer.json holds them: the "a b" string where it reads the same way there (one
    space, inside), else the pair."""
    out: list = []
    for merge in vocab.merges or ():
        at = merge.find(" ", 1)
        if 0 < at < len(merge) - 1 and merge.find(" ", at + 1) < 0:
            out.append(merge)
            continue
        parts = _split_merge(merge)
        if parts is None:
            raise GGUFError(f"{vocab.name}: merge {merge!r} is not two tokens separated by a space")
        out.append(list(parts))
    return out


def _json_merges(merges: list[tuple[str, str]]) -> list:
    if all(" " not in a and " " not in b for a, b in merges):
        return [f"{a} {b}" for a, b in merges]
    return [[a, b] for a, b in merges]


def _byte_level_parts(vocab: GGUFVocab) -> tuple[list, dict | None, dict | None, dict, dict]:
    """A byte-level BPE vocabulary's merges, normalizer, pre-tokenizer, decoder and model settings."""
    merges = _file_merges(vocab)
    pre_name = vocab.pre or "default"
    pre = PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        warnings.warn(
            f"{vocab.name}: pre-tokenizer {pre_name!r} is not known to specwise: text is split as GPT-2 splits it",
            stacklevel=3,
        )
        pre = _GPT2_PRE
    decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    model = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": pre.ignore_merges,
    }
    return merges, None, _pre_tokenizer(pre), decoder, model


def _sentencepiece_parts(vocab: GGUFVocab, tokens: list[str]) -> tuple[list, dict | None, dict | None, dict, dict]:
    """A SentencePiece-style vocabulary's merges (the file's, or derived), normalizer, pre-tokenizer, decoder and
    model settings."""
    if vocab.merges is not None:
        merges = _file_merges(vocab)
    elif vocab.architecture in _GEMMA:
        merges = _json_merges(_derived_merges(tokens, -np.arange(len(tokens), dtype=np.float64)))
    else:
        merges = _json_merges(_derived_merges(tokens, vocab.scores.astype(np.float64)))
    unk = vocab.special_ids["unk_token"]
    space = [{"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]
    if vocab.add_space_prefix:  # before the text and after each added token, as llama.cpp puts it
        space.insert(0, {"type": "Prepend", "prepend": SPACE})
    normalizer = space[0] if len(space) == 1 else {"type": "Sequence", "normalizers": space}
    steps = [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if vocab.add_space_prefix:
        steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    decoder = {"type": "Sequence", "decoders": steps}
    model = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None if unk is None else tokens[unk],
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": True,
        "byte_fallback": True,
        "ignore_merges": False,
    }
    return merges, normalizer, None, decoder, model


def _added_tokens(vocab: GGUFVocab, tokens: list[str], respelled: set[int]) -> list[dict]:
    """The added tokens: control and unknown tokens special, user-defined ones plain (none respelled or empty)."""
    phi3 = _is_phi3(vocab)
    added: list[dict] = []
    for i, kind in enumerate(vocab.types.tolist()):
        if i in respelled or not tokens[i]:
            continue
        special = kind in (CONTROL, UNKNOWN)
        if special or kind == USER_DEFINED:
            # llama.cpp's Phi-3 rule: the whitespace after a special token belongs to it, but for these three
            rstrip = phi3 and tokens[i] not in ("<unk>", "<s>", "<|endoftext|>")
            added.append(_added(tokens[i], i, special, rstrip))
    return added


def build_json(vocab: GGUFVocab, spelled: tuple[list[str], set[int]] | None = None) -> dict:
    """The ``tokenizer.json`` (as a dict) of a GGUF file's vocabulary; ``spelled``: its
    :func:`spelled_tokens`, where already known."""
    tokens, respelled = spelled if spelled is not None else spelled_tokens(vocab)
    if vocab.model == "gpt2":
        merges, normalizer, pre_tokenizer, decoder, model = _byte_level_parts(vocab)
    else:
        merges, normalizer, pre_tokenizer, decoder, model = _sentencepiece_parts(vocab, tokens)
    model["vocab"] = {token: i for i, token in enumerate(tokens)}
    model["merges"] = merges  # "a b" strings read faster than pairs
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(vocab, tokens, respelled),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _template(vocab, tokens),
        "decoder": decoder,
        "model": model,
    }


def tokenizer_config(vocab: GGUFVocab, spelled: tuple[list[str], set[int]] | None = None) -> dict:
    """The ``tokenizer_config.json`` settings: special tokens, BOS / EOS, chat templates."""
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    tokens, respelled = spelled if spelled is not None else spelled_tokens(vocab)
    for role, token_id in vocab.special_ids.items():
        if token_id is not None:
            config[role] = tokens[token_id]
    named = {config[role] for role in vocab.special_ids if role in config}
    extra = [
        tokens[i]
        for i in np.flatnonzero(vocab.types == CONTROL).tolist()
        if i not in respelled and tokens[i] and tokens[i] not in named
    ]
    if extra:  # the control tokens beside the named ones (transformers' all_special_tokens lists them too)
        config["extra_special_tokens"] = list(dict.fromkeys(extra))
    config["add_bos_token"] = vocab.add_bos
    config["add_eos_token"] = vocab.add_eos
    if vocab.chat_templates:
        templates = [{"name": "default", "template": vocab.chat_template}] if vocab.chat_template else []
        templates += [{"name": k, "template": v} for k, v in vocab.chat_templates.items() if k != "default"]
        config["chat_template"] = templates
    elif vocab.chat_template:
        config["chat_template"] = vocab.chat_template
    config["specwise"] = {"source": vocab.name, "model": vocab.model, "pre": vocab.pre}
    return config


def build(meta: GGUFFile) -> tuple[str, dict]:
    """A GGUF file's tokenizer: the ``tokenizer.json`` text (for ``tokenizers.Tokenizer.from_str``) and the
    ``tokenizer_config.json`` settings. Raises GGUFError for a vocabulary that cannot be built."""
    vocab = read_vocab(meta)
    spelled = spelled_tokens(vocab)
    return json.dumps(build_json(vocab, spelled), ensure_ascii=False), tokenizer_config(vocab, spelled)
