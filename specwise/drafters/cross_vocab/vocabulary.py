"""Two vocabularies side by side, as byte strings: what a draft model of another vocabulary than the target's needs
to show the target's text to the draft and the draft's to the target (:mod:`specwise.drafters.cross_vocab`).

Text is compared as a stream of bytes in which a marker (a special token of a role both vocabularies have) is an
escape sequence (``\\x00\\x02`` and two bytes of the marker's number) and a NUL byte of text ``\\x00\\x01``: both
vocabularies' tokens spell the same stream for the same text, so that a draft model's cache and the target's context
are compared byte for byte. A special token of one vocabulary only spells nothing.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["TokenSpace", "VocabularyPair"]

# Special tokens of different names that mark the same thing: a marker of one vocabulary is shown to the other's
# draft, and proposed for the other's target, as the other's marker of the same role. Text-start markers are never
# shown (each model's own is put first as its tokenizer puts it).
_ROLES = {
    "<|im_start|>": "turn-start",
    "<start_of_turn>": "turn-start",
    "<|start_header_id|>": "header-start",
    "<|end_header_id|>": "header-end",
    "<|im_end|>": "turn-end",
    "<end_of_turn>": "turn-end",
    "<|eot_id|>": "turn-end",
    "<|end|>": "turn-end",
    "<|endoftext|>": "text-end",
    "<|end_of_text|>": "text-end",
    "<eos>": "text-end",
    "</s>": "text-end",
    "<bos>": "text-start",
    "<s>": "text-start",
    "<|begin_of_text|>": "text-start",
    "<|fim_prefix|>": "fim-prefix",
    "<fim_prefix>": "fim-prefix",
    "<|fim_suffix|>": "fim-suffix",
    "<fim_suffix>": "fim-suffix",
    "<|fim_middle|>": "fim-middle",
    "<fim_middle>": "fim-middle",
}
_TEXT_START = "text-start"
_WORDY = re.compile(rb"[A-Za-z0-9\x80-\xff]")
_INVALID = re.compile("([\udc80-\udcff]+)")  # bytes that are not UTF-8, as `surrogateescape` decodes them


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


def _spm_byte(token: str) -> int | None:
    """The byte of SentencePiece's byte-fallback token ``<0xNN>``, else None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def _escape(text: bytes) -> bytes:
    return text.replace(b"\x00", b"\x00\x01")


def _marker(index: int) -> bytes:
    return b"\x00\x02" + index.to_bytes(2, "big")


def _runs(stream: bytes):
    """The stream's pieces in order: ``(text, None)`` for a run of text bytes, ``(None, index)`` for a marker."""
    at, text = 0, bytearray()
    while True:
        nul = stream.find(b"\x00", at)
        if nul < 0:
            text += stream[at:]
            break
        text += stream[at:nul]
        if stream[nul + 1] == 1:
            text.append(0)
            at = nul + 2
            continue
        if text:
            yield bytes(text), None
            text.clear()
        yield None, int.from_bytes(stream[nul + 2 : nul + 4], "big")
        at = nul + 4
    if text:
        yield bytes(text), None


class TokenSpace:
    """A vocabulary as byte strings: each id's text (None for a special token, a marker), the special tokens'
    contents, the ids its tokenizer puts before a text (``head``: a beginning-of-text token), and text -> ids.

    encoder: the tokenizer's text -> ids (``str -> list[int]``, no beginning-of-text token); None: the longest
    tokens that match, left to right. ``is_byte``: ids that are byte-fallback tokens (a token of the same text
    is preferred to them). :meth:`from_tokenizer` reads a tokenizer's."""

    def __init__(
        self,
        text: list[bytes | None],
        special: dict[int, str] | None = None,
        head: list[int] | None = None,
        encoder=None,
        is_byte=None,
    ) -> None:
        self.size = len(text)
        self.text = list(text)  # each id's bytes, None for a special token or an id without a token
        self.special = dict(special or {})  # special token id -> its content
        self.head = list(head or [])
        self.encoder = encoder
        byte_first = np.zeros(self.size, dtype=bool) if is_byte is None else np.asarray(is_byte, dtype=bool)
        # text -> its id: a normal token before a byte token spelling the same, then the lowest id
        self.by_bytes: dict[bytes, int] = {}
        for i in np.argsort(byte_first, kind="stable").tolist():
            piece = self.text[i]
            if piece is not None and piece not in self.by_bytes:
                self.by_bytes[piece] = i
        self.byte_ids: list[int | None] = [self.by_bytes.get(bytes([b])) for b in range(256)]
        # bytes no token spells alone (byte-level vocabularies leave out control characters no text had): left out
        # of the text either side shows the other
        self.missing = bytes(b for b in range(256) if self.byte_ids[b] is None)
        self.longest = max((len(t) for t in self.by_bytes), default=1)

    @classmethod
    def from_tokenizer(cls, tokenizer, what: str = "draft") -> TokenSpace:
        """The vocabulary of a LightTokenizer or a transformers fast tokenizer (its ``backend_tokenizer``: the
        ``tokenizers`` library's object or specwise's compact SentencePiece tokenizer). Byte-level BPE vocabularies
        (GPT-2's alphabet) and SentencePiece-style ones (``▁`` for a space, ``<0xNN>`` byte tokens) are read; one
        that cannot spell plain text byte by byte is refused (text the target writes could not be shown to the
        draft). ``what``: which model's it is, for the error."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(
                f"the {what} model's tokenizer is not a fast tokenizer (no backend_tokenizer): a draft model of "
                "another vocabulary needs both tokenizers' token texts; use a GGUF file or a model directory with a "
                "tokenizer.json"
            )
        size = int(backend.get_vocab_size(with_added_tokens=True))
        added = {int(i): t for i, t in backend.get_added_tokens_decoder().items()}
        byte_level = type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"
        alphabet = _byte_level_alphabet() if byte_level else {}
        text: list[bytes | None] = [None] * size
        special: dict[int, str] = {}
        is_byte = np.zeros(size, dtype=bool)  # SentencePiece's <0xNN> tokens
        for i in range(size):
            token = added.get(i)
            if token is not None:
                if token.special:
                    special[i] = token.content
                else:
                    text[i] = token.content.encode("utf-8")
                continue
            piece = backend.id_to_token(i)
            if piece is None:
                continue
            if byte_level:
                known = all(c in alphabet for c in piece)
                text[i] = bytes(alphabet[c] for c in piece) if known else piece.encode("utf-8")
                continue
            byte = _spm_byte(piece)
            if byte is not None:
                text[i] = bytes([byte])
                is_byte[i] = True
            else:
                text[i] = piece.replace("\u2581", " ").encode("utf-8")
        plain = backend.encode("a", add_special_tokens=False).ids
        full = backend.encode("a", add_special_tokens=True).ids
        head = full[: len(full) - len(plain)] if full[len(full) - len(plain) :] == plain else []

        def encoder(part: str) -> list[int]:
            return backend.encode(part, add_special_tokens=False).ids

        space = cls(text, special, head, encoder, is_byte)
        unspelled = [b for b in b"\n\t !\"#%&'()*+,-./0123456789:;<=>?@AZaz[]_{}~" if space.byte_ids[b] is None]
        if unspelled:
            raise ValueError(
                f"the {what} model's vocabulary cannot spell plain text (no token for byte 0x{unspelled[0]:02X}): "
                "a draft model of another vocabulary needs byte-level BPE or byte fallback"
            )
        return space

    def encode(self, text: bytes) -> list[int]:
        """Ids spelling ``text`` exactly: the tokenizer's tokens of each run of UTF-8 (no beginning-of-text token),
        byte tokens for bytes that are not UTF-8. Where the tokenizer's tokens do not spell the run back (a
        normalizer, a space put before the text, a special token matched in it) the run is spelled by the
        longest tokens that match, left to right."""
        out: list[int] = []
        for part in _INVALID.split(text.decode("utf-8", "surrogateescape")):
            if not part:
                continue
            if "\udc80" <= part[0] <= "\udcff":
                out.extend(i for i in (self.byte_ids[ord(c) - 0xDC00] for c in part) if i is not None)
                continue
            raw = part.encode("utf-8")
            ids = self.encoder(part) if self.encoder is not None else None
            pieces = [self.text[i] if 0 <= i < self.size else None for i in ids] if ids is not None else [None]
            if None in pieces or b"".join(pieces) != raw:
                ids = self._longest(raw)
            out.extend(ids)
        return out

    def _longest(self, raw: bytes) -> list[int]:
        ids, at = [], 0
        while at < len(raw):
            for n in range(min(self.longest, len(raw) - at), 0, -1):
                found = self.by_bytes.get(raw[at : at + n])
                if found is not None:
                    ids.append(found)
                    at += n
                    break
            else:  # a byte no token spells: left out
                at += 1
        return ids


class VocabularyPair:
    """A target's and a draft's vocabularies side by side: each token's piece of the text stream (the target's and
    the draft's tokens spell the same stream for the same text), the tokens both share (for TLI), and streams
    tokenized by either side.

    target_rows / draft_rows: the widths of the models' logits (ids at or past them are never proposed; ids past a
    tokenizer's tokens have no text)."""

    def __init__(self, target: TokenSpace, draft: TokenSpace, target_rows: int, draft_rows: int) -> None:
        self.target, self.draft = target, draft
        t_roles = self._roles(target)
        d_roles = self._roles(draft)
        shared_roles = sorted((set(t_roles) & set(d_roles)) - {_TEXT_START})
        self._role_index = {role: i for i, role in enumerate(shared_roles)}
        self._target_marker = [t_roles[r] for r in shared_roles]  # marker index -> the target's id
        self._draft_marker = [d_roles[r] for r in shared_roles]
        self.target_piece = self._pieces(target)
        self.draft_piece = self._pieces(draft)
        # TLI's shared tokens: the same bytes (each side's preferred id for them), or markers of the same role
        d_ids, t_ids = [], []
        for text, d in draft.by_bytes.items():
            t = target.by_bytes.get(text)
            if t is not None and t < target_rows and d < draft_rows:
                d_ids.append(d)
                t_ids.append(t)
        for t, d in zip(self._target_marker, self._draft_marker):
            if t < target_rows and d < draft_rows:
                d_ids.append(d)
                t_ids.append(t)
        order = np.argsort(np.asarray(d_ids, dtype=np.int64), kind="stable")
        self.shared_draft = np.asarray(d_ids, dtype=np.int64)[order]  # [n] draft ids
        self.shared_target = np.asarray(t_ids, dtype=np.int64)[order]  # [n] the target's id of each
        self.target_rows, self.draft_rows = int(target_rows), int(draft_rows)
        spelled = sum(t is not None for t in draft.text[:draft_rows]) + len(shared_roles)
        self.overlap = len(d_ids) / max(1, spelled)  # share of the draft's vocabulary the target has too
        # a lone byte of a character that is not whole: the draft token before the first byte the context changed
        # is re-tokenized too while it is one (its character may be completed by the next target token)
        self._extensions: dict[int, np.ndarray] | None = None  # built when first asked for
        self._healed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._target_by_piece: dict[bytes, int] | None = None
        self._target_grows: np.ndarray | None = None  # built when first asked for
        self.partial = np.zeros(draft.size, dtype=bool)
        for i, text in enumerate(draft.text):
            if text is not None and len(text) == 1 and text[0] >= 0x80:
                self.partial[i] = True

    def extensions(self, d: int) -> np.ndarray | None:
        """The draft ids whose text begins with draft token ``d``'s (``d`` first), where some longer one does;
        else None."""
        if self._extensions is None:
            self._extensions = self._build_extensions()
        return self._extensions.get(d)

    def grows(self, t: int) -> bool:
        """Whether some longer token of the target's begins with target token ``t``'s text: text written after
        ``t`` may then join it into another token, so that ``t`` is not known whole until that text is known. A
        marker, a token without text and an id past the target's tokens never grow."""
        if self._target_grows is None:
            self._target_grows = self._build_grows()
        return bool(0 <= t < len(self._target_grows) and self._target_grows[t])

    def _build_grows(self) -> np.ndarray:
        """[target_rows] bool: :meth:`grows` of each id. The tokens beginning with a text follow it directly in
        the sorted order of the texts, so each text is compared with the next one only."""
        pieces = self.target_piece[: self.target_rows]
        texts = sorted({p for p in pieces if p and not p.startswith(b"\x00\x02")})
        growing = {a for a, b in zip(texts, texts[1:]) if b.startswith(a)}
        return np.fromiter((p in growing for p in pieces), dtype=bool, count=len(pieces))

    def healed(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """The longer draft tokens beginning with draft token ``d``'s text whose rest is a token of the target's
        (``[n]`` draft ids), and that token of each (``[n]`` target ids): TLI's first token after a held-back
        ``d``. Remembered per ``d``."""
        found = self._healed.get(d)
        if found is None:
            if self._target_by_piece is None:
                pieces = self.target_piece
                by_piece: dict[bytes, int] = {}
                for t in self.target.by_bytes.values():  # each text's preferred id
                    if t < self.target_rows and pieces[t]:
                        by_piece.setdefault(pieces[t], t)
                self._target_by_piece = by_piece
            cut = len(self.draft_piece[d])
            drafts, targets = [], []
            longer = self.extensions(d)
            for e in longer[1:].tolist() if longer is not None else ():
                t = self._target_by_piece.get(self.draft_piece[e][cut:])
                if t is not None:
                    drafts.append(e)
                    targets.append(t)
            found = self._healed[d] = (np.asarray(drafts, dtype=np.int64), np.asarray(targets, dtype=np.int64))
        return found

    def _build_extensions(self) -> dict[int, np.ndarray]:
        """Every draft token that begins another one -> those tokens (itself first): each token's text is cut at
        every byte, and the cuts that are tokens get it."""
        pieces = self.draft_piece
        rows = min(self.draft_rows, len(pieces))
        by_piece: dict[bytes, int] = {}
        for i in range(rows):
            piece = pieces[i]
            if piece and not piece.startswith(b"\x00\x02"):
                by_piece.setdefault(piece, i)
        longer: dict[int, list[int]] = {}
        for piece, i in by_piece.items():
            for n in range(1, len(piece)):
                shorter = by_piece.get(piece[:n])
                if shorter is not None and not _WORDY.search(piece[:n]):
                    longer.setdefault(shorter, [shorter]).append(i)
        return {d: np.asarray(ids, dtype=np.int64) for d, ids in longer.items()}

    @staticmethod
    def _roles(space: TokenSpace) -> dict[str, int]:
        """Each special token's role (its content where no other name is known) -> the lowest id in that role."""
        roles: dict[str, int] = {}
        for i, content in sorted(space.special.items()):
            roles.setdefault(_ROLES.get(content, content), i)
        return roles

    def _pieces(self, space: TokenSpace) -> list[bytes]:
        """Each id's piece of the stream: its text escaped (without the bytes the draft cannot spell), a marker, or
        nothing (a special token without a counterpart, or a text-start token)."""
        pieces = [b""] * space.size
        missing = self.draft.missing
        for i, text in enumerate(space.text):
            if text is not None:
                pieces[i] = _escape(text.translate(None, missing) if missing else text)
        for i, content in space.special.items():
            index = self._role_index.get(_ROLES.get(content, content))
            if index is not None:
                pieces[i] = _marker(index)
        return pieces

    def to_draft(self, stream: bytes) -> list[int]:
        """The draft's ids of a stream."""
        return self._tokenize(stream, self.draft, self._draft_marker)

    def to_target(self, stream: bytes) -> list[int]:
        """The target's ids of a stream."""
        return self._tokenize(stream, self.target, self._target_marker)

    @staticmethod
    def _tokenize(stream: bytes, space: TokenSpace, markers: list[int]) -> list[int]:
        out: list[int] = []
        for text, marker in _runs(stream):
            if text is not None:
                out.extend(space.encode(text))
            else:
                out.append(markers[marker])
        return out

    def stream(self, ids: list[int], pieces: list[bytes]) -> bytes:
        return b"".join(pieces[i] if 0 <= i < len(pieces) else b"" for i in ids)
