"""Whether ``--drafter auto`` drafts across vocabularies with the embedded default model (SmolLM2-135M), decided from
the two GGUF files' headers alone: the bytes a pass of each reads, and the share of the draft's vocabulary that the
target's spells alike.

The rule, and what it stands on (Spec-Bench questions, 128 new tokens, ``--gamma auto``, 2 threads on an AMD EPYC
shared with other processes; ``docs/FIGURES.md``, "A draft model of another vocabulary"):

- SmolLM2-135M's pass reads 97 MB. For Qwen2.5-Coder-1.5B Q4_K_M (980 MB a pass: 0.099 of it) it gave 1.43×
  plain decoding greedy on coding (α 0.76, τ 2.29) and 1.19× over 13 categories (α 0.59, τ 1.74); for Gemma-3-270M
  Q4_K_M (247 MB: 0.39) 0.97× (the planner drafted on few steps, τ 1.02).
- From the Qwen runs, a step cost 1.60 target passes for 1.70 drafted tokens on coding (1.46 for 1.25 over the
  categories): after the longer verifying pass, a drafted token cost about 0.3 of a target pass, three times the
  bytes' share (SLEM's re-tokenizing and the draft's own steps add to its bytes). At that rate the pair breaks even
  where the draft reads 0.17 (the categories' acceptance) to 0.23 (coding's) of the target's bytes.
- So ``auto`` drafts with the default model where its pass reads at most DRAFT_SHARE = 0.15 of the target's, that
  is for targets reading about 650 MB a pass or more (Qwen2.5-Coder-1.5B and larger at 4 bits; not Qwen2.5-0.5B or
  Gemma-3-270M), and where at least MIN_OVERLAP of its vocabulary is the target's too (SmolLM2 shares 80% with
  Qwen2.5 and 94% with Gemma 3; the bound keeps out pairs whose tokenizers cut text too differently, where neither
  method was measured).

Prompt lookup comes with it (``ngram+model:default``), as with a same-vocabulary sibling: the planner asks each
source by its own record and values a lookup draft by the measured acceptance of its match length.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = [
    "AUTO_DRAFT",
    "DRAFT_SHARE",
    "MIN_OVERLAP",
    "auto_cross_vocab_spec",
    "file_overlap",
    "pass_bytes",
    "token_texts",
]

AUTO_DRAFT = "default"  # the draft model `auto` drafts across vocabularies with (a model: ID)
DRAFT_SHARE = 0.15  # the most of a target pass's bytes the draft's pass may read
MIN_OVERLAP = 0.5  # the least share of the draft's vocabulary the target's must spell alike

_NORMAL, _UNKNOWN, _CONTROL, _USER, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6  # GGUF token types
_PLAIN = b"\n\t !\"#%&'()*+,-./0123456789:;<=>?@AZaz[]_{}~"  # bytes a vocabulary must spell alone (TokenSpace's)


def pass_bytes(meta) -> int:
    """Bytes of weights one pass of the GGUF model ``meta`` (a GGUFFile) reads: every tensor but the token embedding,
    of which a pass reads a row a token, unless the output layer is the embedding (tied)."""
    total = sum(info.nbytes for info in meta.tensors.values())
    embedding = meta.tensors.get("token_embd.weight")
    if embedding is not None and "output.weight" in meta.tensors:
        total -= embedding.nbytes
    return total


def token_texts(meta) -> list[bytes | None] | None:
    """Each token's bytes from a GGUF file's token list (None for a control, unknown or unused token), for byte-level
    BPE (``gpt2``) and SentencePiece-style (``llama``) vocabularies; None for any other tokenizer model."""
    from specwise.drafters.cross_vocab.vocabulary import _byte_level_alphabet, _spm_byte

    model = meta.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        return None
    tokens = meta.array("tokenizer.ggml.tokens")
    if tokens is None:
        return None
    types = meta.array("tokenizer.ggml.token_type")
    kinds = np.full(len(tokens), _NORMAL) if types is None or len(types) != len(tokens) else np.asarray(types)
    # the byte-level alphabet's characters as the Latin-1 characters of their bytes: a token's bytes in one
    # translate and encode (a character outside the alphabet fails the encoding: the token is text as it is)
    table = {ord(c): b for c, b in _byte_level_alphabet().items()} if model == "gpt2" else {}
    out: list[bytes | None] = []
    for token, kind in zip(tokens, kinds.tolist()):
        if kind in (_CONTROL, _UNKNOWN, _UNUSED):
            out.append(None)
        elif model == "gpt2":
            try:
                out.append(token.encode("utf-8") if kind == _USER else token.translate(table).encode("latin-1"))
            except UnicodeEncodeError:
                out.append(token.encode("utf-8"))
        else:
            byte = _spm_byte(token) if kind == _BYTE else None
            out.append(bytes([byte]) if byte is not None else token.replace("\u2581", " ").encode("utf-8"))
    return out


def file_overlap(draft_meta, target_meta) -> float | None:
    """The share of the draft's token texts that the target's vocabulary has too, from the two files' token lists;
    None where either vocabulary is of another tokenizer model, or cannot spell plain text byte by byte."""
    draft, target = token_texts(draft_meta), token_texts(target_meta)
    if draft is None or target is None:
        return None
    d, t = {x for x in draft if x}, {x for x in target if x}
    if not d or any(bytes([b]) not in s for s in (d, t) for b in _PLAIN):
        return None
    return len(d & t) / len(d)


def _draft_path(draft: str) -> Path | None:
    if draft != "default":
        return Path(draft)
    from specwise.models.loader import default_gguf_path

    try:
        return default_gguf_path()
    except FileNotFoundError:
        return None


def auto_cross_vocab_spec(target_path: Path | str, draft: str | None = None) -> str | None:
    """``ngram+model:DRAFT`` for the GGUF target at ``target_path`` where the draft model ``draft`` (a ``model:`` ID:
    ``default`` or a GGUF file; None: AUTO_DRAFT), of another vocabulary, pays by the module's rule; else None."""
    from specwise.models.gguf_file import GGUFError, GGUFFile

    draft = AUTO_DRAFT if draft is None else draft
    path = _draft_path(draft)
    if path is None or Path(path).resolve() == Path(target_path).resolve():
        return None
    try:
        target, meta = GGUFFile(target_path), GGUFFile(path)
        if pass_bytes(meta) > DRAFT_SHARE * pass_bytes(target):
            return None
        same = target.array_length("tokenizer.ggml.tokens") == meta.array_length("tokenizer.ggml.tokens")
        if same and list(target.array("tokenizer.ggml.tokens")) == list(meta.array("tokenizer.ggml.tokens")):
            return None  # the target's own vocabulary: a sibling's case (specwise.drafters.sibling)
        overlap = file_overlap(meta, target)
    except (GGUFError, OSError, ValueError):
        return None
    if overlap is None or overlap < MIN_OVERLAP:
        return None
    return f"ngram+model:{draft}"
