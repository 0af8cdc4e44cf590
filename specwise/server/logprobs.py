"""Log-probabilities in OpenAI's two wire formats, and each token's text and bytes.

The engine records, for every emitted token, the target's log-probability and the most likely alternatives
(``specwise.engine.TokenLogprob``); this module writes them out: chat's ``logprobs.content`` (token, logprob,
bytes, top_logprobs) and the legacy completions object (tokens, token_logprobs, top_logprobs, text_offset).

A token's ``bytes`` are exact: the byte-level BPE alphabet mapped back to bytes, SentencePiece's ``<0xNN>`` byte
tokens, a special token's own text. A token that is not whole UTF-8 on its own (part of a character) is written
``bytes:\\xNN...`` as OpenAI writes it; its ``bytes`` hold the part.
"""

from __future__ import annotations

import codecs

from specwise.engine import TokenLogprob
from specwise.server.encoding import lock_free_backend

__all__ = ["LOGPROB_FLOOR", "TextOffsets", "TokenTexts", "chat_logprobs", "completion_logprobs"]

LOGPROB_FLOOR = -9999.0  # what is written for a log-probability of -inf (JSON has no infinity), as at OpenAI


def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's): each byte's printable stand-in -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


class TokenTexts:
    """Token id -> (text, bytes), remembered once computed. Safe to use beside the generation thread: it only
    reads the tokenizer (``id_to_token``, ``decode``)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._backend = lock_free_backend(tokenizer)
        self._byte_level = self._backend is not None and type(self._backend.decoder).__name__ == "ByteLevel"
        self._alphabet = _byte_level_alphabet() if self._byte_level else {}
        self._added = self._added_tokens()
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def _added_tokens(self) -> dict[int, str]:
        """Added (special) tokens' ids -> their text, which no byte alphabet encodes."""
        added = getattr(self._backend, "get_added_tokens_decoder", None)
        return {i: token.content for i, token in added().items()} if added is not None else {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        """The token's text (``bytes:\\xNN`` for part of a character) and its UTF-8 bytes."""
        found = self._cache.get(token_id)
        if found is None:
            raw = self._bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            found = self._cache[token_id] = (text, list(raw))
        return found

    def _bytes(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        piece = self._backend.id_to_token(token_id) if self._backend is not None else None
        if piece is not None and self._byte_level and all(c in self._alphabet for c in piece):
            return bytes(self._alphabet[c] for c in piece)
        if piece is not None and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])  # SentencePiece's byte fallback
            except ValueError:
                pass
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")


def _finite(logprob: float) -> float:
    return logprob if logprob > LOGPROB_FLOOR else LOGPROB_FLOOR


def chat_logprobs(entries: list[TokenLogprob], texts: TokenTexts, top: int) -> dict:
    """Chat's ``choice.logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}], "refusal": None}``."""
    content = []
    for entry in entries:
        text, raw = texts(entry.token_id)
        alternatives = []
        for token_id, logprob in entry.top[:top]:
            alt_text, alt_raw = texts(token_id)
            alternatives.append({"token": alt_text, "logprob": _finite(logprob), "bytes": alt_raw})
        content.append({"token": text, "logprob": _finite(entry.logprob), "bytes": raw, "top_logprobs": alternatives})
    return {"content": content, "refusal": None}


class TextOffsets:
    """Where each token of a choice begins in its text, in characters: the characters that the bytes of the
    tokens before it decode to (a character split over tokens begins where its first part does)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._chars = 0

    def next(self, raw: list[int]) -> int:
        """The offset of a token of bytes ``raw`` that follows those given so far."""
        at = self._chars
        self._chars += len(self._decoder.decode(bytes(raw)))
        return at


def completion_logprobs(entries: list[TokenLogprob], texts: TokenTexts, top: int, offsets: TextOffsets) -> dict:
    """The legacy completions ``choice.logprobs`` (``top_logprobs``: the ``top`` most likely tokens and the
    emitted one, as OpenAI gave them); ``offsets`` follows the choice's text from one call to the next."""
    tokens, token_logprobs, tops, text_offset = [], [], [], []
    for entry in entries:
        text, raw = texts(entry.token_id)
        tokens.append(text)
        token_logprobs.append(_finite(entry.logprob))
        alternatives = {texts(token_id)[0]: _finite(logprob) for token_id, logprob in entry.top[:top]}
        alternatives.setdefault(text, _finite(entry.logprob))
        tops.append(alternatives)
        text_offset.append(offsets.next(raw))
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": text_offset}
