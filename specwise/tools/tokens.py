"""A format's tags in a model's vocabulary: whether a tag (``<tool_call>``, ``<think>``) is one token of the
vocabulary, one special token (which decoding drops), and how a grammar names it."""

from __future__ import annotations

import json

__all__ = ["grammar_tag", "single_token_id", "special_token_id"]


def special_token_id(tokenizer, text: str) -> int | None:
    """The id of ``text`` when the vocabulary has it as one special token (which decoding drops), else None."""
    token = single_token_id(tokenizer, text)
    if token is None:
        return None
    return token if tokenizer.decode([token], skip_special_tokens=True) == "" else None


def grammar_tag(tokenizer, text: str) -> tuple[str, bool]:
    """How a grammar names a format's tag ``text``, and whether the grammar reads it as a special token: the token
    by its id (``<[id]>``) where the vocabulary has the tag as one token that the grammar engine holds special
    (Qwen2.5's ``<tool_call>`` is an added token: ordinary decoding writes it, but the grammar engine never spells
    it from bytes), else the tag's text as a string."""
    token = single_token_id(tokenizer, text)
    if token is not None and _grammar_special(tokenizer, token):
        return f"<[{token}]>", True
    return json.dumps(text), False


def single_token_id(tokenizer, text: str) -> int | None:
    """The id of ``text`` where the vocabulary encodes it as one token of that text, else None."""
    if tokenizer is None:
        return None
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1 or tokenizer.decode(ids, skip_special_tokens=False) != text:
        return None
    return ids[0]


def _grammar_special(tokenizer, token: int) -> bool:
    """Whether the grammar engine's tokenizer for ``tokenizer`` holds ``token`` special (None tokenizer: no)."""
    from specwise.constraints import grammar_tokenizer

    try:
        return bool(grammar_tokenizer(tokenizer).is_special_token(token))
    except Exception:  # no grammar engine, or a tokenizer it cannot read: the tag is text
        return False
