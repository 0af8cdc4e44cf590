"""A compact tokenizer for SentencePiece-style GGUF vocabularies (``tokenizer.ggml.model`` ``llama``: Gemma 3, Phi-3,
Llama 2), encoded and decoded by the native library (``kernels/spm.c``).

:class:`SentencePieceTokenizer` gives the ids and text that the ``tokenizers.Tokenizer`` built by
:func:`specwise.models.gguf_tokenizer.build` gives for the same file (the same added tokens split out of the text,
Phi-3's whitespace rule, the ``▁`` written for spaces and put before each piece where the file asks, the merges that
file's tokenizer uses, byte fallback, BOS / EOS, and decoding), from the vocabulary alone: the tokens' bytes one
after another with their offsets, an open-addressing table from a token's bytes to its id, a byte of flags per
token, and for a file that carries merges a table of its pairs. Gemma 3's 262,144 tokens take 5.5 MiB of arrays,
where the ``tokenizers`` object holds about 91 MiB (two maps of the tokens and 514,906 merges derived from them).

It implements the part of ``tokenizers.Tokenizer``'s API that specwise calls (``encode``, ``encode_batch``,
``decode``, ``decode_batch``, ``token_to_id``, ``id_to_token``, ``get_vocab``, ``get_vocab_size``,
``get_added_tokens_decoder``, ``decoder``, ``to_str``). Whatever else is asked of it (a pair of texts, offsets,
the normalizer or model objects, ...) is answered by the real ``tokenizers.Tokenizer``, built from the
``tokenizer.json`` on first use (:attr:`SentencePieceTokenizer.tokenizer`): its memory is paid only by the features
that need it. Constrained decoding (llguidance) and transformers read the ``tokenizer.json`` text (:meth:`to_str`),
which the loader builds from the file and caches the first time it is asked for.

Encoding releases Python's global lock while it runs (a ctypes call), as the ``tokenizers`` library's batch call
does. The tokenizer is immutable once built: copies share it.
"""

from __future__ import annotations

import ctypes
import functools
import operator
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from specwise.models.gguf_file import GGUFError, GGUFFile
from specwise.models.gguf_tokenizer import (
    _GEMMA,
    SPACE,
    GGUFVocab,
    _added_tokens,
    _split_merge,
    read_vocab,
    spelled_tokens,
)
from specwise.models.kernels.abi import SpmVocab
from specwise.models.kernels.library import kernel_error, native_library

__all__ = ["SentencePieceTokenizer", "SentencePieceDecoder", "Encoding", "Unsupported", "compact_available"]

ADDED, SPECIAL, RSTRIP = 1, 2, 4  # spm.c's SPM_* bits
_SHORT, _MEMORY = -3, -2
_MAX_TOKEN_BYTES = 65535
_MAX_TEXT_BYTES = (1 << 31) // 4 - 1  # spm.c's limit on one text (INT32_MAX / 4)


class Unsupported(ValueError):
    """A vocabulary the compact tokenizer does not take (the ``tokenizers`` library serves it instead)."""


def compact_available() -> str | None:
    """None where the compact tokenizer can be built, else why not (the native library is not there)."""
    return None if native_library() is not None else (kernel_error() or "the native library is not loaded")


def _lib():
    lib = native_library()
    if lib is None:
        raise Unsupported(f"the compact tokenizer needs the native library: {compact_available()}")
    return lib


def _address(array: np.ndarray | None) -> int | None:
    return None if array is None else array.ctypes.data


def _strings(items: list[bytes]) -> tuple[bytes, np.ndarray]:
    """Byte strings one after another, and their int64 offsets (len + 1)."""
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, items), dtype=np.int64, count=len(items)), out=offsets[1:])
    return b"".join(items), offsets


def _table_size(n: int) -> int:
    """A power of two at least twice n (open addressing at most half full)."""
    return 1 << max(4, (2 * n - 1).bit_length())


class SentencePieceTokenizer:
    """A SentencePiece-style BPE vocabulary encoded and decoded natively; built by :meth:`from_vocab` or
    :meth:`from_gguf`. ``tokenizer_json``: what gives the ``tokenizer.json`` (its text, or the path of the file)
    when a caller needs it (:meth:`to_str`, :attr:`tokenizer`); ``source``: the GGUF file, for copies that are
    rebuilt (pickles)."""

    def __init__(self) -> None:
        raise TypeError("build a SentencePieceTokenizer with from_vocab or from_gguf")

    # ---- building ------------------------------------------------------------------------------------------

    @classmethod
    def from_gguf(
        cls, path: str | Path, meta: GGUFFile | None = None, tokenizer_json: Callable[[], str | Path] | None = None
    ) -> SentencePieceTokenizer:
        """The compact tokenizer of a GGUF file; ``tokenizer_json``: as :class:`SentencePieceTokenizer` (default:
        built from the file each time it is asked for). Raises :class:`Unsupported` for a vocabulary it does not
        take, GGUFError for one that cannot be built."""
        path = Path(path)
        vocab = read_vocab(meta if meta is not None else GGUFFile(path))
        if tokenizer_json is None:
            tokenizer_json = functools.partial(_json_from_file, path)
        return cls.from_vocab(vocab, tokenizer_json=tokenizer_json, source=path)

    @classmethod
    def from_vocab(
        cls,
        vocab: GGUFVocab,
        spelled: tuple[list[str], set[int]] | None = None,
        tokenizer_json: Callable[[], str | Path] | None = None,
        source: Path | None = None,
    ) -> SentencePieceTokenizer:
        """The compact tokenizer of a GGUF file's vocabulary (:func:`~specwise.models.gguf_tokenizer.read_vocab`);
        ``spelled``: its :func:`~specwise.models.gguf_tokenizer.spelled_tokens`, where already known. Raises
        :class:`Unsupported` for a vocabulary it does not take (not SentencePiece-style, a token repeated, a token
        over 65,535 bytes, no native library), GGUFError for merges that name no token."""
        lib = _lib()
        if vocab.model != "llama":
            raise Unsupported(f"{vocab.name}: not a SentencePiece-style vocabulary ({vocab.model})")
        tokens, respelled = spelled if spelled is not None else spelled_tokens(vocab)
        n = len(tokens)
        if not 1 <= n < (1 << 31) - 1:
            raise Unsupported(f"{vocab.name}: {n:,} tokens")
        self = cls.__new__(cls)
        self.name = vocab.name
        self.source = None if source is None else Path(source)
        self._json = tokenizer_json
        blob, offsets = _strings([t.encode("utf-8") for t in tokens])
        lengths = np.diff(offsets)
        if len(blob) >= 1 << 32 or int(lengths.max()) > _MAX_TOKEN_BYTES:
            raise Unsupported(f"{vocab.name}: a token over {_MAX_TOKEN_BYTES:,} bytes, or over 4 GiB of tokens")
        self._blob = blob
        self._offsets = offsets.astype(np.uint32)
        self._n = n

        self._kinds = kinds = _kinds(vocab, tokens, respelled)
        self._added_lengths, added_max = _added_lengths(kinds, blob, offsets)
        self._table = np.empty(_table_size(n), dtype=np.int32)
        self._byte_ids = np.full(256, -1, dtype=np.int32)
        self._groups = None
        if vocab.merges is None and vocab.architecture not in _GEMMA:
            # the merges derived from the vocabulary rank by score, highest first (Gemma: by place, the id itself)
            priority = vocab.scores.astype(np.float64)
            self._groups = np.unique(-priority, return_inverse=True)[1].astype(np.int32).reshape(-1)
        self._pair_keys = self._pair_values = None
        unk = vocab.special_ids["unk_token"]
        self._struct = SpmVocab(
            bytes=ctypes.cast(ctypes.c_char_p(blob), ctypes.c_void_p),
            offsets=_address(self._offsets),
            n=n,
            longest=int(lengths.max()),
            table=_address(self._table),
            table_size=len(self._table),
            kinds=_address(kinds),
            groups=_address(self._groups),
            pair_keys=None,
            pair_values=None,
            pairs_size=0,
            added_lengths=_address(self._added_lengths),
            added_max=added_max,
            byte_ids=_address(self._byte_ids),
            unk=-1 if unk is None else unk,
            space_prefix=int(vocab.add_space_prefix),
        )
        self._ref = ctypes.byref(self._struct)
        repeated = lib.specwise_spm_index(self._ref, self._table.ctypes.data)
        if repeated != 0:
            raise Unsupported(
                f"{vocab.name}: {repeated:,} tokens repeat another's text"
                if repeated > 0
                else f"{vocab.name}: the vocabulary is out of the compact tokenizer's range"
            )
        self._byte_ids[:] = self._lookup([f"<0x{b:02X}>".encode() for b in range(256)])
        if unk is not None and self._lookup([tokens[unk].encode("utf-8")])[0] != unk:
            raise Unsupported(f"{vocab.name}: the unknown token is not found by its text")
        if vocab.merges is not None:
            self._set_merges(vocab)
        self.bos_id = vocab.special_ids["bos_token"] if vocab.add_bos else None
        self.eos_id = vocab.special_ids["eos_token"] if vocab.add_eos else None
        self.space_prefix = bool(vocab.add_space_prefix)
        self.decoder = SentencePieceDecoder(self.space_prefix)
        return self

    def _lookup(self, strings: list[bytes]) -> np.ndarray:
        """The ids of byte strings (-1 for those that are no token)."""
        blob, offsets = _strings(strings)
        ids = np.empty(len(strings), dtype=np.int32)
        status = _lib().specwise_spm_lookup(self._ref, blob, offsets.ctypes.data, len(strings), ids.ctypes.data)
        if status != 0:
            raise RuntimeError("the compact tokenizer refused a lookup")
        return ids

    def _set_merges(self, vocab: GGUFVocab) -> None:
        """The file's merges as pairs of ids, ranked by their place."""
        lefts: list[bytes] = []
        rights: list[bytes] = []
        for merge in vocab.merges:
            parts = _split_merge(merge)
            if parts is None:
                raise GGUFError(f"{vocab.name}: merge {merge!r} is not two tokens separated by a space")
            lefts.append(parts[0].encode("utf-8"))
            rights.append(parts[1].encode("utf-8"))
        joined = [a + b for a, b in zip(lefts, rights)]
        left, right, merged = self._lookup(lefts), self._lookup(rights), self._lookup(joined)
        for ids, texts in ((left, lefts), (right, rights), (merged, joined)):
            missing = np.flatnonzero(ids < 0)
            if missing.size:
                i = int(missing[0])
                raise GGUFError(
                    f"{vocab.name}: merge {vocab.merges[i]!r} names {texts[i].decode('utf-8')!r}, which is no token"
                )
        m = len(left)
        size = _table_size(m + 1)
        self._pair_keys = np.empty(size, dtype=np.int64)
        self._pair_values = np.empty(size, dtype=np.int64)
        self._struct.pair_keys = _address(self._pair_keys)
        self._struct.pair_values = _address(self._pair_values)
        self._struct.pairs_size = size
        status = _lib().specwise_spm_pairs(
            self._ref,
            left.ctypes.data,
            right.ctypes.data,
            merged.ctypes.data,
            m,
            self._pair_keys.ctypes.data,
            self._pair_values.ctypes.data,
        )
        if status != 0:
            raise Unsupported(f"{vocab.name}: the merges are out of the compact tokenizer's range")

    # ---- encoding ------------------------------------------------------------------------------------------

    def _encode(self, text, spans: bool = False) -> tuple[list[int], np.ndarray | None]:
        """The ids of a text (no BOS or EOS), and with ``spans`` each one's byte span in the text where it is an
        added token matched there ((-1, -1) for the others)."""
        if not isinstance(text, str):
            raise TypeError(f"the text to encode must be a str, not {type(text).__name__}")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(
                f"the text to encode is not valid Unicode ({err.reason} at character {err.start})"
            ) from None
        n = len(data)
        if n > _MAX_TEXT_BYTES:
            raise ValueError(f"a text of {n:,} bytes is longer than the tokenizer takes ({_MAX_TEXT_BYTES:,})")
        lib = _lib()
        for cap in (2 * n + 8, 4 * n + 8):
            ids = np.empty(cap, dtype=np.int32)
            where = np.empty((cap, 2), dtype=np.int64) if spans else None
            count = lib.specwise_spm_encode(self._ref, data, n, ids.ctypes.data, cap, _address(where))
            if count != _SHORT:
                break
        if count == _MEMORY:
            raise MemoryError(f"encoding a text of {n:,} bytes ran out of memory")
        if count < 0:
            raise RuntimeError(f"the compact tokenizer failed ({count}) on a text of {n:,} bytes")
        return ids[:count].tolist(), None if where is None else where[:count]

    def encode(self, sequence, pair=None, is_pretokenized: bool = False, add_special_tokens: bool = True) -> Encoding:
        """The :class:`Encoding` of a text (BOS / EOS added as the file asks, with ``add_special_tokens``); a pair
        of texts or pre-tokenized input is the ``tokenizers`` library's (:attr:`tokenizer`)."""
        if pair is not None or is_pretokenized:
            return self.tokenizer.encode(sequence, pair, is_pretokenized, add_special_tokens)
        ids, _ = self._encode(sequence)
        head = [self.bos_id] if add_special_tokens and self.bos_id is not None else []
        tail = [self.eos_id] if add_special_tokens and self.eos_id is not None else []
        if head or tail:
            ids = head + ids + tail
        return Encoding(self, ids, sequence, len(head), len(tail))

    def encode_batch(self, input, is_pretokenized: bool = False, add_special_tokens: bool = True) -> list[Encoding]:
        """:meth:`encode` of each text (pairs and pre-tokenized input: the ``tokenizers`` library's)."""
        if is_pretokenized or not isinstance(input, (list, tuple)):
            return self.tokenizer.encode_batch(input, is_pretokenized, add_special_tokens)
        if any(not isinstance(text, str) for text in input):
            if all(isinstance(text, (str, tuple, list)) for text in input):
                return self.tokenizer.encode_batch(input, is_pretokenized, add_special_tokens)
            bad = next(text for text in input if not isinstance(text, (str, tuple, list)))
            raise TypeError(f"the texts to encode must be str, not {type(bad).__name__}")
        return [self.encode(text, add_special_tokens=add_special_tokens) for text in input]

    def _tokens(self, encoding: Encoding) -> list[str]:
        """The tokens of an encoding: each id's token, an added token as the text it matched."""
        _, spans = self._encode(encoding.text, spans=True)
        text = encoding.text.encode("utf-8")
        out = [self.id_to_token(i) for i in encoding.ids]
        for k, (start, stop) in enumerate(spans.tolist()):
            if start >= 0:
                out[encoding.n_head + k] = text[start:stop].decode("utf-8")
        return out

    # ---- decoding ------------------------------------------------------------------------------------------

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The text of token ids (ids outside the vocabulary are left out; special tokens too with
        ``skip_special_tokens``, the default, as in the ``tokenizers`` library)."""
        array = _id_array(ids)
        lib = _lib()
        cap = 8 * len(array) + 64
        while True:
            out = np.empty(cap, dtype=np.uint8)
            size = lib.specwise_spm_decode(
                self._ref, array.ctypes.data, len(array), int(bool(skip_special_tokens)), out.ctypes.data, cap
            )
            if size == _MEMORY:
                raise MemoryError(f"decoding {len(array):,} ids ran out of memory")
            if size < 0:
                raise RuntimeError(f"the compact tokenizer failed ({size}) decoding {len(array):,} ids")
            if size <= cap:
                return out[:size].tobytes().decode("utf-8")
            cap = size

    def decode_batch(self, sequences, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    # ---- the vocabulary ------------------------------------------------------------------------------------

    def token_to_id(self, token: str) -> int | None:
        if not isinstance(token, str):
            raise TypeError(f"a token is a str, not {type(token).__name__}")
        found = int(self._lookup([token.encode("utf-8", "surrogatepass")])[0])
        return None if found < 0 else found

    def id_to_token(self, id: int) -> str | None:
        i = operator.index(id)
        if i < 0:
            raise OverflowError("a token id cannot be negative")
        if i >= self._n:
            return None
        return self._blob[int(self._offsets[i]) : int(self._offsets[i + 1])].decode("utf-8")

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        """Every token by its text (the added tokens are tokens of the vocabulary already)."""
        blob, bounds = self._blob, self._offsets.tolist()
        return {blob[a:b].decode("utf-8"): i for i, (a, b) in enumerate(zip(bounds, bounds[1:]))}

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return self._n

    def get_added_tokens_decoder(self) -> dict:
        """The added tokens by id, as ``tokenizers.AddedToken``s."""
        from tokenizers import AddedToken

        return {
            i: AddedToken(
                self.id_to_token(i),
                single_word=False,
                lstrip=False,
                rstrip=bool(kind & RSTRIP),
                normalized=False,
                special=bool(kind & SPECIAL),
            )
            for i, kind in zip(np.flatnonzero(self._kinds & ADDED).tolist(), self._kinds[self._kinds & ADDED > 0])
        }

    # ---- the tokenizer.json and the tokenizers library -----------------------------------------------------

    def to_str(self, pretty: bool = False) -> str:
        """The ``tokenizer.json`` of this vocabulary (built from the GGUF file, or read from the cache)."""
        if self._json is None:
            raise ValueError(f"{self.name}: this compact tokenizer was built without a way to its tokenizer.json")
        found = self._json()
        text = found.read_text(encoding="utf-8") if isinstance(found, Path) else found
        if pretty:
            import json

            return json.dumps(json.loads(text), ensure_ascii=False, indent=2)
        return text

    @functools.cached_property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` of the same vocabulary, built from its ``tokenizer.json`` on first use (about
        91 MiB for Gemma 3: only what the compact tokenizer does not do pays for it)."""
        from tokenizers import Tokenizer

        found = self._json() if self._json is not None else None
        if isinstance(found, Path):
            return Tokenizer.from_file(str(found))
        return Tokenizer.from_str(self.to_str() if found is None else found)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    # ---- copies ----------------------------------------------------------------------------------------------

    def __copy__(self) -> SentencePieceTokenizer:
        return self  # immutable: copies share it

    def __deepcopy__(self, memo) -> SentencePieceTokenizer:
        return self

    def __reduce__(self):
        if self.source is None:
            raise TypeError(f"{self.name}: a compact tokenizer built from a vocabulary in memory cannot be serialized")
        return (_rebuild, (str(self.source), self._json))

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({self.name!r}, vocab={self._n})"


def _rebuild(path: str, tokenizer_json) -> SentencePieceTokenizer:
    return SentencePieceTokenizer.from_gguf(path, tokenizer_json=tokenizer_json)


def _json_from_file(path: Path) -> str:
    from specwise.models.gguf_tokenizer import build

    return build(GGUFFile(path))[0]


def _id_array(ids) -> np.ndarray:
    """Token ids as an int64 array; raises TypeError for what is not integers, OverflowError for ids outside
    0 .. 2^32 - 1 (as the tokenizers library)."""
    if isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, not {ids.dtype}")
        array = ids.astype(np.int64).reshape(-1)
    else:
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(f"token ids must be a sequence of integers, not {type(ids).__name__}")
        values = [operator.index(i) for i in ids]
        if values and (min(values) < 0 or max(values) > 0xFFFFFFFF):
            raise OverflowError("token ids must be between 0 and 2^32 - 1")
        return np.array(values, dtype=np.int64)
    if array.size and (int(array.min()) < 0 or int(array.max()) > 0xFFFFFFFF):
        raise OverflowError("token ids must be between 0 and 2^32 - 1")
    return np.ascontiguousarray(array)


class Encoding:
    """One text's encoding, as the ``tokenizers`` library's ``Encoding`` gives it: ``ids``, ``tokens`` (computed
    when asked for), ``attention_mask``, ``type_ids``, ``special_tokens_mask``."""

    __slots__ = ("ids", "text", "n_head", "n_tail", "_owner", "_tokens")

    def __init__(self, owner: SentencePieceTokenizer, ids: list[int], text: str, n_head: int, n_tail: int) -> None:
        self.ids = ids
        self.text = text
        self.n_head = n_head
        self.n_tail = n_tail
        self._owner = owner
        self._tokens = None

    @property
    def tokens(self) -> list[str]:
        if self._tokens is None:
            self._tokens = self._owner._tokens(self)
        return self._tokens

    @property
    def attention_mask(self) -> list[int]:
        return [1] * len(self.ids)

    @property
    def type_ids(self) -> list[int]:
        return [0] * len(self.ids)

    @property
    def special_tokens_mask(self) -> list[int]:
        n = len(self.ids)
        return [1 if i < self.n_head or i >= n - self.n_tail else 0 for i in range(n)]

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Encoding(num_tokens={len(self.ids)})"


class SentencePieceDecoder:
    """The decoder of a SentencePiece-style tokenizer for token texts (``convert_tokens_to_string``): ``▁`` as a
    space, runs of ``<0xXX>`` byte tokens as their bytes (a run that is not UTF-8: U+FFFD a byte), and where the
    vocabulary puts a ``▁`` before its text, one leading space removed."""

    def __init__(self, space_prefix: bool) -> None:
        self.space_prefix = space_prefix

    def decode(self, tokens: list[str]) -> str:
        parts: list[str] = []
        run = bytearray()

        def flush() -> None:
            if run:
                try:
                    parts.append(run.decode("utf-8"))
                except UnicodeDecodeError:
                    parts.append("\ufffd" * len(run))
                run.clear()

        for token in tokens:
            token = token.replace(SPACE, " ")
            byte = _byte_token(token)
            if byte is not None:
                run.append(byte)
                continue
            flush()
            parts.append(token)
        flush()
        text = "".join(parts)
        return text[1:] if self.space_prefix and text.startswith(" ") else text


def _byte_token(token: str) -> int | None:
    """The byte of a token ``<0xXX>`` (XX read as Rust's ``u8::from_str_radix`` reads it), else None."""
    if len(token.encode("utf-8")) != 6 or not token.startswith("<0x") or not token.endswith(">"):
        return None
    digits = token[3:-1]
    if digits.startswith("+"):
        digits = digits[1:]
        if len(digits) != 1:
            return None
    if not all(c in "0123456789abcdefABCDEF" for c in digits):
        return None
    return int(digits, 16)


def _kinds(vocab: GGUFVocab, tokens: list[str], respelled: set[int]) -> np.ndarray:
    """One byte of flags per token: ADDED, SPECIAL and RSTRIP for the added tokens (as tokenizer.json lists them)."""
    kinds = np.zeros(len(tokens), dtype=np.uint8)
    for token in _added_tokens(vocab, tokens, respelled):
        kinds[token["id"]] = ADDED | (SPECIAL if token["special"] else 0) | (RSTRIP if token["rstrip"] else 0)
    return kinds


def _added_lengths(kinds: np.ndarray, blob: bytes, offsets: np.ndarray) -> tuple[np.ndarray, int]:
    """Per first byte, the lengths of the added tokens that start with it (bit k - 1 for k bytes, k < 64), and the
    longest added token's length (0: none)."""
    added = np.flatnonzero(kinds & ADDED)
    starts, sizes = offsets[added], np.diff(offsets)[added]
    masks = np.zeros(256, dtype=np.uint64)
    if added.size:
        first = np.frombuffer(blob, dtype=np.uint8)[starts]
        bits = np.left_shift(np.uint64(1), np.minimum(sizes, 64).astype(np.uint64) - np.uint64(1))
        np.bitwise_or.at(masks, first, bits)
    return masks.view(np.int64), int(sizes.max()) if added.size else 0
