"""The `suffix` drafter: the target's own earlier answers propose how the current one goes on.

Two kinds of index are searched for the longest suffix of the context (up to ``max_match`` tokens):

- a **global index** (:class:`SuffixIndex`) of answers the target wrote, built offline by ``specwise index``: a
  suffix array over the concatenated token ids, searched by bisection in native code (``kernels/suffix.c``);
- **counts** (:class:`NgramCounts`) kept as text arrives: the request's own prompt and output so far, and an
  optional overlay of recently served answers (:meth:`SuffixDrafter.add_answer`, bounded, in memory).

From a match, the draft follows the most frequent continuation, token by token, and each token's confidence is
``count(token | pattern) / (count(pattern) + smooth)``: in the global index the pattern grows with the draft (the
suffix array's range narrows); in the counts it is the last ``n`` tokens (an order-``n`` Markov chain, ``n`` the
match length). Among the sources' drafts the one with the most tokens expected to be accepted (the sum of the
running products of confidences) is proposed. Proposals are deterministic (``probs=None``), exact under the
rejection rule at any temperature.

Index directory format: ``index.json`` (format, the target's identity, how it was built), ``tokens.npy`` (the
token ids of every sequence, each followed by a separator, uint16 where the vocabulary allows) and ``sa.npy``
(int32 suffix array, sorted to ``depth`` tokens). An index directory is untrusted input: :func:`load_index` checks
every field, dtype, shape and size against the files, the token ids against the vocabulary and the suffix array
against the text (every entry in range, one per token, the order spot-checked) before native code searches it,
and refuses a bad index with one :class:`IndexFileError` line.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import shutil
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from specwise.drafters.base import Draft, Drafter
from specwise.sampling import SamplingParams

__all__ = [
    "AnswerOverlay",
    "IndexFileError",
    "IndexNotFoundError",
    "IndexTargetMismatchError",
    "NgramCounts",
    "SuffixDrafter",
    "SuffixIndex",
    "build_suffix_array",
    "check_index_target",
    "index_identity",
    "load_index",
    "read_array",
    "read_index_info",
    "shipped_index_dir",
]

FORMAT = "specwise-suffix-index"
FORMAT_VERSION = 1
SEP = 0xFFFFFFFF  # separator after each sequence in memory (uint32); 0xFFFF in a uint16 file
DEPTH = 64  # suffixes are sorted by their first DEPTH tokens: matches and drafts together stay within it
LEAD = 8  # prompt tokens kept before each answer, so that the answer's first tokens have a context to match
SCAN = 32  # continuations counted exactly in ranges up to this size; larger ranges are sampled this many times
SUFFIX_ABI = 2  # the native entry points' signatures (kernels/suffix.c's SUFFIX_ABI)


class IndexTargetMismatchError(ValueError):
    """The index was built from another target's answers."""


class IndexFileError(ValueError):
    """An index directory that cannot be used: a file malformed, or inconsistent with the others or the target."""


class IndexNotFoundError(FileNotFoundError, IndexFileError):
    """An index directory without one of its files (also a FileNotFoundError)."""


def confidence(count: int, total: int, length: int, smooth: float, half: float) -> float:
    """The estimated acceptance of a token that followed a pattern of ``length`` tokens ``count`` times out of
    ``total``: ``(count + smooth * prior) / (total + smooth)``, with the prior ``length / (length + half)`` (a
    longer match goes on the same way more often; a pattern seen once gives ``(1 + prior) / 2``)."""
    return (count + smooth * length / (length + half)) / (total + smooth)


# ---- the suffix array ----------------------------------------------------------------------------------------


def build_suffix_array(text: np.ndarray, depth: int = DEPTH) -> np.ndarray:
    """Start positions of the suffixes of ``text`` (uint32, separators SEP) that begin with a token, sorted by their
    first ``depth`` tokens (prefix doubling: each round sorts by twice as many tokens, O(n log n log depth))."""
    n = len(text)
    if n == 0:
        return np.empty(0, dtype=np.int32)
    _, rank = np.unique(text, return_inverse=True)
    rank = rank.astype(np.int64)
    h = 1
    while h < depth and int(rank.max()) < n - 1:
        after = np.zeros(n, dtype=np.int64)  # 0: past the end, sorts first
        after[: n - h] = rank[h:] + 1
        key = rank * (n + 1) + after
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.concatenate([[0], np.cumsum(sorted_key[1:] != sorted_key[:-1])])
        h *= 2
    order = np.argsort(rank, kind="stable")
    return order[text[order] != SEP].astype(np.int32)


def _native():
    """The search functions of the native library, declared on first use (None without the library)."""
    from specwise.models.kernels import native_library

    lib = native_library()
    if lib is None or not hasattr(lib, "specwise_suffix_abi"):
        return None
    if not getattr(lib, "_suffix_declared", False):
        lib.specwise_suffix_abi.argtypes = []
        lib.specwise_suffix_abi.restype = ctypes.c_int
        if lib.specwise_suffix_abi() != SUFFIX_ABI:  # a library built from other sources: the Python reference
            return None
        p, i64, d = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
        # (text, n, sa, m, ctx, plen, min_len, lo, hi) -> match length, or -1 for arguments out of bounds
        lib.specwise_suffix_match.argtypes = [p, i64, p, i64, p, i64, i64, p, p]
        lib.specwise_suffix_match.restype = i64
        # (text, n, sa, m, lo, hi, depth, max_depth, k, stop, smooth, half, scan, tokens, conf, counts) -> drafted
        lib.specwise_suffix_draft.argtypes = [p, i64, p, i64, i64, i64, i64, i64, i64, d, d, d, i64, p, p, p]
        lib.specwise_suffix_draft.restype = i64
        lib._suffix_declared = True
    return lib


class SuffixIndex:
    """Sequences of token ids in one suffix array: the longest match of a context, and drafts from it.

    text: ``[n]`` uint32, each sequence followed by SEP; sa: ``[m]`` int32 (the suffixes that start with a token).
    info: the index's metadata (the target's identity, how it was built), as saved in ``index.json``.
    native: search with the native kernels when they are built (False: the Python reference).
    """

    def __init__(self, text: np.ndarray, sa: np.ndarray, depth: int = DEPTH, info: dict | None = None,
                 native: bool = True) -> None:  # fmt: skip
        self.text = np.ascontiguousarray(text, dtype=np.uint32)
        self.sa = np.ascontiguousarray(sa, dtype=np.int32)
        self.depth = depth
        self.info = dict(info or {})
        self._lib = _native() if native else None
        # buffers of the native calls, and their addresses (taken once: numpy's .ctypes is slow to ask)
        self._ctx = np.zeros(0, dtype=np.uint32)
        self._range = np.zeros(2, dtype=np.int64)
        self._out = (np.empty(0, np.int32), np.empty(0, np.float32), np.empty(0, np.int64))
        self._ptr = (self.text.ctypes.data, self.sa.ctypes.data, self._range.ctypes.data, self._range.ctypes.data + 8)
        self._sizes = (len(self.text), len(self.sa))
        self._ctx_ptr = self._out_ptr = None

    @classmethod
    def from_sequences(cls, sequences, depth: int = DEPTH, info: dict | None = None, native: bool = True):
        """An index of ``sequences`` (lists of token ids)."""
        parts = []
        for seq in sequences:
            if len(seq):
                parts.append(np.asarray(seq, dtype=np.uint32))
                parts.append(np.array([SEP], dtype=np.uint32))
        text = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
        if len(text) and int(text[text != SEP].max(initial=0)) >= SEP:
            raise ValueError("token ids must be below 2**32 - 1")
        return cls(text, build_suffix_array(text, depth), depth, info, native)

    def __len__(self) -> int:
        """Tokens indexed (separators excluded)."""
        return len(self.sa)

    def sequences(self) -> list[list[int]]:
        """The indexed sequences, in order."""
        ends = np.flatnonzero(self.text == SEP)
        starts = np.concatenate([[0], ends[:-1] + 1]) if len(ends) else []
        return [self.text[a:b].tolist() for a, b in zip(starts, ends)]

    def match(self, context: list[int], max_len: int, min_len: int) -> tuple[int, int, int]:
        """(L, lo, hi): the longest L in [min_len, max_len] such that the last L tokens of ``context`` occur, and
        the range of their occurrences in the suffix array; L = 0 when none does."""
        tail = context[-max_len:]
        if not len(self.sa) or len(tail) < min_len:
            return 0, 0, 0
        if self._lib is None:
            return self._match_py(tail, min_len)
        if len(self._ctx) < len(tail):
            self._ctx = np.zeros(max(len(tail), 32), dtype=np.uint32)
            self._ctx_ptr = self._ctx.ctypes.data
        self._ctx[: len(tail)] = tail
        text, sa, lo, hi = self._ptr
        n, m = self._sizes
        length = self._lib.specwise_suffix_match(text, n, sa, m, self._ctx_ptr, len(tail), min_len, lo, hi)
        if length < 0:
            self._refused()
        return (int(length), int(self._range[0]), int(self._range[1])) if length else (0, 0, 0)

    def draft(self, match: tuple[int, int, int], k: int, stop: float, smooth: float, half: float):
        """(tokens, confidences, counts): up to ``k`` tokens continuing a match of :meth:`match` (see
        :func:`confidence`); counts: (times the token followed, times the pattern before it occurred) per token."""
        length, lo, hi = match
        k = min(k, self.depth - length)
        if length == 0 or k <= 0:
            return [], [], []
        if self._lib is None:
            return self._draft_py(match, k, stop, smooth, half)
        if len(self._out[0]) < k:
            self._out = (np.empty(k, np.int32), np.empty(k, np.float32), np.empty(2 * k, np.int64))
            self._out_ptr = tuple(a.ctypes.data for a in self._out)
        tokens, conf, counts = self._out
        text, sa = self._ptr[:2]
        n = self._lib.specwise_suffix_draft(
            text, self._sizes[0], sa, self._sizes[1], lo, hi, length, self.depth, k, stop, smooth, half, SCAN,
            *self._out_ptr,
        )  # fmt: skip
        if n < 0:
            self._refused()
        pairs = counts[: 2 * n].tolist()
        return tokens[:n].tolist(), conf[:n].tolist(), list(zip(pairs[::2], pairs[1::2]))

    def _refused(self) -> NoReturn:
        raise IndexFileError(
            f"suffix index: the native search was refused (a suffix array entry outside the {len(self.text):,} "
            f"tokens, or a range outside its {len(self.sa):,} entries): {REBUILD}"
        )

    # the Python reference of kernels/suffix.c (the same choices, for tests and builds without a C compiler)

    def _key(self, i: int, length: int) -> list[int]:
        pos = int(self.sa[i])
        return self.text[pos : pos + length].tolist()

    def _range_py(self, pattern: list[int], lo: int, hi: int) -> tuple[int, int]:
        n = len(pattern)
        a, b = lo, hi
        while a < b:
            mid = (a + b) // 2
            if self._key(mid, n) < pattern:
                a = mid + 1
            else:
                b = mid
        first, b = a, hi
        while a < b:
            mid = (a + b) // 2
            if self._key(mid, n) <= pattern:
                a = mid + 1
            else:
                b = mid
        return first, a

    def _match_py(self, tail: list[int], min_len: int) -> tuple[int, int, int]:
        good, bad, found = 0, len(tail) + 1, (0, 0, 0)
        probe = min_len
        while bad - good > 1:
            lo, hi = self._range_py(list(tail[len(tail) - probe :]), 0, len(self.sa))
            if lo < hi:
                good, found = probe, (probe, lo, hi)
            else:
                bad = probe
                if probe == min_len:
                    return 0, 0, 0
            probe = max(good + (bad - good) // 2, min_len)
        return found

    def _next(self, i: int, depth: int) -> int:
        return int(self.text[int(self.sa[i]) + depth])

    def _draft_py(self, match, k: int, stop: float, smooth: float, half: float):
        depth, lo, hi = match
        tokens, conf, counts = [], [], []
        reach = 1.0
        while len(tokens) < k and depth < self.depth and hi > lo:
            r = hi - lo
            idx = range(lo, hi) if r <= SCAN else [lo + (r * j + r // 2) // SCAN for j in range(SCAN)]
            seen = [self._next(i, depth) for i in idx]
            best, best_n, run_tok, run_n = SEP, 0, SEP, 0
            for t in seen:
                run_n = run_n + 1 if t == run_tok else 1
                run_tok = t
                if run_n > best_n:
                    best, best_n = run_tok, run_n
            if best == SEP:
                break
            a = lo + next(j for j in range(r) if self._next(lo + j, depth) >= best)
            b = a
            while b < hi and self._next(b, depth) == best:
                b += 1
            q = float(np.float32(confidence(b - a, r, depth, smooth, half)))
            if reach * q < stop:
                break
            reach *= q
            tokens.append(best)
            conf.append(q)
            counts.append((b - a, r))
            lo, hi, depth = a, b, depth + 1
        return tokens, conf, counts

    # ---- files

    def save(self, directory: Path | str) -> None:
        """Write the index directory atomically: a reader sees the old index or the new one, never part of one."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
        try:
            small = self.info.get("target", {}).get("vocab_size", SEP) < 0xFFFF and (
                not len(self.sa) or int(self.text[self.sa].max()) < 0xFFFF
            )
            tokens = np.where(self.text == SEP, 0xFFFF, self.text).astype(np.uint16) if small else self.text
            np.save(tmp / "tokens.npy", tokens)
            np.save(tmp / "sa.npy", self.sa)
            meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **self.info, "depth": self.depth}
            meta["tokens"] = len(self)
            meta["sequences"] = int((self.text == SEP).sum())
            (tmp / "index.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            _replace_dir(tmp, directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _replace_dir(new: Path, directory: Path) -> None:
    """Put directory ``new`` in place of ``directory`` (renames only: never a half-written directory there)."""
    if not directory.exists():
        os.replace(new, directory)
        return
    if not (directory / "index.json").exists() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} exists and is not a suffix index: choose another --out")
    old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".old", dir=directory.parent))
    os.replace(directory, old / "index")
    os.replace(new, directory)
    shutil.rmtree(old, ignore_errors=True)


# ---- reading an index directory (untrusted input) ------------------------------------------------------------

REBUILD = "rebuild the index with `specwise index --target MODEL --out DIR`"
MAX_META_BYTES = 1 << 20  # an index.json is a few KB
MAX_DEPTH = 1024
MAX_FINGERPRINT = 64
SPOT_PAIRS = 256  # adjacent pairs of the suffix array whose order a load checks (all of them in a smaller index)
SPOT_WIDTH = 32  # tokens compared per pair (at most the index's depth)
MAX_TOKENS = (1 << 31) - 1024  # positions are int32 (the suffix array's dtype), with room for offsets
TOKEN_DTYPES = (np.dtype(np.uint16), np.dtype(np.uint32))
SA_DTYPES = (np.dtype(np.int32),)
# the header np.save writes for a one-dimensional integer array (others go to numpy's parser)
_NPY_1D = re.compile(rb"\{'descr': '([<>|][iu][1248])', 'fortran_order': False, 'shape': \((\d{1,18}),\), \} *\n")
_SPOT_FRACTIONS = (np.arange(SPOT_PAIRS) * 0.6180339887498949) % 1.0  # golden-ratio steps: spread over [0, 1)
_COLUMNS = np.arange(max(SPOT_PAIRS, SPOT_WIDTH), dtype=np.int32)
_PAIR = np.array([[0], [1]], dtype=np.int32)  # a pair's first entry and the next


def refuse(path: Path | str, what: str, fix: str = REBUILD) -> NoReturn:
    """Raise IndexFileError ``"<path>: <what>: <fix>"`` (one line)."""
    raise IndexFileError(f"{path}: {what}: {fix}")


def _shown(value: Any) -> str:
    """A value as a message quotes it, cut to 40 characters (a hostile file's strings can be long)."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."


def _integer(path: Path, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        refuse(path, f"{key} is {_shown(value)}, expected an integer in {low}..{high}")
    return value


def _number(path: Path, key: str, value: Any, low: float = 0.0) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= low
    if not ok:
        refuse(path, f"{key} is {_shown(value)}, expected a finite number{f' >= {low:g}' if low > -math.inf else ''}")
    return float(value)


def _object(path: Path, key: str, value: Any) -> dict:
    if not isinstance(value, dict):
        refuse(path, f"{key} is {_shown(value)}, expected a JSON object")
    return value


def _check_target(path: Path, target: dict) -> None:
    """The target's identity as :func:`check_index_target` reads it: name, vocabulary size, fingerprint."""
    if "name" in target and not isinstance(target["name"], str):
        refuse(path, f"target.name is {_shown(target['name'])}, expected a string")
    if "vocab_size" in target:
        _integer(path, "target.vocab_size", target["vocab_size"], 1, SEP - 1)
    fingerprint = target.get("fingerprint")
    if fingerprint is not None:
        if not isinstance(fingerprint, list) or len(fingerprint) > MAX_FINGERPRINT:
            refuse(path, f"target.fingerprint is {_shown(fingerprint)}, expected a list of numbers")
        for i, value in enumerate(fingerprint):
            _number(path, f"target.fingerprint[{i}]", value, -math.inf)


def _check_meta(path: Path, meta: Any) -> dict:
    """``index.json``'s fields, each of the type and in the range the loader and the drafter use."""
    if not isinstance(meta, dict):
        refuse(path, f"holds a JSON {type(meta).__name__}, expected an object with the index's fields")
    if meta.get("format") != FORMAT:
        refuse(path, f"format is {_shown(meta.get('format'))}, expected {FORMAT!r} (not a specwise suffix index)")
    version = _integer(path, "format_version", meta.get("format_version"), 1, 1 << 16)
    if version > FORMAT_VERSION:
        refuse(path, f"format version {version} is newer than this specwise's ({FORMAT_VERSION})", "upgrade specwise")
    _integer(path, "depth", meta.get("depth", DEPTH), 1, MAX_DEPTH)
    for key in ("tokens", "sequences", "overlay_sequences"):
        if key in meta:
            _integer(path, key, meta[key], 0, 1 << 62)
    for key in ("target", "build", "calibration"):
        if key in meta:
            _object(path, key, meta[key])
    _check_target(path, meta.get("target", {}))
    for source, fit in meta.get("calibration", {}).items():
        if source in DEFAULT_PRIORS:
            _object(path, f"calibration.{source}", fit)
            for key in ("smooth", "half"):
                _number(path, f"calibration.{source}.{key}", fit.get(key))
    return meta


def read_index_info(directory: Path | str) -> dict:
    """``index.json`` of an index directory, parsed and its fields checked (type and range)."""
    path = Path(directory) / "index.json"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_META_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        raise IndexNotFoundError(
            f"{path.parent} holds no suffix index (no index.json): build one with `specwise index --out {path.parent}`"
        ) from None
    except OSError as e:
        refuse(path, f"cannot be read ({e.strerror or e})")
    if len(raw) > MAX_META_BYTES:
        refuse(path, f"over {MAX_META_BYTES:,} bytes, expected an index.json of a few KB")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        refuse(path, f"not valid JSON ({_shown(str(e))})")
    return _check_meta(path, meta)


def _npy_header(path: Path, f) -> tuple[tuple, bool, np.dtype]:
    """(shape, fortran_order, dtype) from an .npy header, a literal parsed without running anything: the header
    ``np.save`` writes for a one-dimensional array by a pattern, any other by numpy's parser."""
    head = f.read(10)
    if head[:8] == b"\x93NUMPY\x01\x00":
        match = _NPY_1D.fullmatch(f.read(int.from_bytes(head[8:], "little")))
        if match:
            return (int(match[2]),), False, np.dtype(match[1].decode())
    f.seek(0)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(f)
    except Exception as e:  # numpy's parser of a hostile header raises more than ValueError (tokenize's errors...)
        refuse(path, f"not an .npy file ({_shown(str(e))})")
    refuse(path, f".npy format version {version[0]}.{version[1]}, expected 1.0 or 2.0")


def read_array(path: Path, dtypes: tuple[np.dtype, ...]) -> np.ndarray:
    """A one-dimensional array of one of ``dtypes`` from an .npy file: its header is checked (dtype, rank, order,
    the data's size against the file's) before the data is read. Never unpickles: an object array is refused by its
    header's dtype."""
    try:
        with open(path, "rb") as f:
            shape, fortran, dtype = _npy_header(path, f)
            if dtype not in dtypes:
                pickled = " (pickled Python objects, never loaded)" if dtype.hasobject else ""
                refuse(path, f"dtype {dtype}{pickled}, expected {' or '.join(str(d) for d in dtypes)}")
            if len(shape) != 1 or fortran:
                refuse(path, f"shape {shape}{' in Fortran order' if fortran else ''}, expected one dimension")
            size = os.fstat(f.fileno()).st_size - f.tell()
            if size != shape[0] * dtype.itemsize:
                cut = "truncated" if size < shape[0] * dtype.itemsize else "trailing bytes"
                refuse(path, f"{cut}: {size:,} bytes of data, expected {shape[0]:,} entries of {dtype.itemsize} bytes")
            data = np.fromfile(f, dtype=dtype, count=shape[0])
    except (FileNotFoundError, NotADirectoryError):
        raise IndexNotFoundError(f"{path}: missing: {REBUILD}") from None
    except OSError as e:
        refuse(path, f"cannot be read ({e.strerror or e})")
    if len(data) != shape[0]:
        refuse(path, f"truncated while read: {len(data):,} of {shape[0]:,} entries")
    return data


def _text(path: Path, tokens: np.ndarray, vocab: int | None) -> tuple[np.ndarray, int]:
    """(text, words) of the token ids read from ``path`` (consumed): the ids as uint32 with SEP separators, and how
    many are not separators; every id below ``vocab`` (the dtype's bound when None), the last a separator."""
    sep = int(np.iinfo(tokens.dtype).max)
    limit = sep if vocab is None else min(vocab, sep)
    if len(tokens) > MAX_TOKENS:
        refuse(path, f"{len(tokens):,} tokens, expected at most {MAX_TOKENS:,} (an int32 suffix array's reach)")
    tokens += tokens.dtype.type(1)  # in place: separators wrap to 0, id t becomes t + 1
    if len(tokens) and int(tokens.max()) > limit:
        at = int(np.argmax(tokens > limit))
        refuse(path, f"token id {int(tokens[at]) - 1:,} at {at:,} is outside the vocabulary ({limit:,} ids)")
    if len(tokens) and tokens[-1] != 0:
        refuse(path, f"ends with token id {int(tokens[-1]) - 1:,}, expected a separator ({sep:#x})")
    words = int(np.count_nonzero(tokens))
    text = tokens.astype(np.uint32) if tokens.dtype != np.uint32 else tokens
    text -= np.uint32(1)  # separators back to SEP, ids back to themselves
    return text, words


def _spot_pairs(m: int) -> np.ndarray:
    """The first entries of the adjacent pairs of a suffix array of ``m`` entries that a load checks: all of them
    up to SPOT_PAIRS, else that many spread over the array (the same ones at every load)."""
    if m - 1 <= SPOT_PAIRS:
        return np.arange(m - 1, dtype=np.int32)
    return (_SPOT_FRACTIONS * (m - 1)).astype(np.int32)


def _check_order(path: Path, text: np.ndarray, sa: np.ndarray, depth: int) -> None:
    """Adjacent entries of the suffix array (:func:`_spot_pairs`) point at distinct tokens (not separators) in order
    of their suffixes' first ``min(depth, SPOT_WIDTH)`` tokens, compared up to the first separator (what a search
    compares). sa's entries are in range, the text ends with a separator and has at most MAX_TOKENS (checked
    before)."""
    m = len(sa)
    if m < 2:
        return
    first = _spot_pairs(m)
    starts = sa[first + _PAIR]  # [2, pairs]
    at = starts[..., None] + _COLUMNS[: min(depth, SPOT_WIDTH)]  # [2, pairs, width] (int32: no overflow)
    a, b = text.take(at, mode="clip")  # past the text's end: only after its last separator
    differ = a != b
    seps = a == SEP
    col = (differ | seps).argmax(axis=1)  # the first column that differs or ends a's sequence (0: none does)
    rows = _COLUMNS[: len(first)]
    ok = np.where(differ[rows, col], a[rows, col] < b[rows, col], starts[0] != starts[1])  # else equal: distinct
    ok &= ~seps[:, 0] & (b[:, 0] != SEP)
    if not ok.all():
        i = int(first[np.argmin(ok)])
        pair = f"entries {i:,} and {i + 1:,} ({int(sa[i]):,}, {int(sa[i + 1]):,})"
        if sa[i] == sa[i + 1]:
            refuse(path, f"{pair} are the same position twice, expected each token's position once")
        if SEP in (text[sa[i]], text[sa[i + 1]]):
            refuse(path, f"{pair}: one points at a separator, expected the positions of tokens")
        refuse(path, f"{pair} are out of order, expected sorted suffixes")


def _check_sa(path: Path, sa: np.ndarray, n: int, words: int) -> None:
    """One entry per token of the text, each a position of it."""
    if len(sa) != words:
        refuse(path, f"{len(sa):,} entries, expected one per token of tokens.npy ({words:,})")
    if len(sa) and int(sa.view(np.uint32).max()) >= n:  # a negative entry is >= 2**31 as uint32
        at = int(np.argmax(sa.view(np.uint32) >= n))
        refuse(path, f"entry {int(sa[at]):,} at {at:,} is outside the {n:,} tokens of tokens.npy")


def load_index(directory: Path | str, native: bool = True, target=None) -> SuffixIndex:
    """Read an index directory written by :meth:`SuffixIndex.save`, checking it first (see the module's docstring).

    target: a LoadedModel the index must have been built for (:func:`check_index_target`, before the arrays are
    read); token ids are checked against its vocabulary, else against the one ``index.json`` records."""
    directory = Path(directory)
    meta = read_index_info(directory)
    if target is not None:
        check_index_target(meta, target)
    vocab = int(target.model.vocab_size) if target is not None else meta.get("target", {}).get("vocab_size")
    tokens_path, sa_path = directory / "tokens.npy", directory / "sa.npy"
    text, words = _text(tokens_path, read_array(tokens_path, TOKEN_DTYPES), vocab)
    sa = read_array(sa_path, SA_DTYPES)
    _check_sa(sa_path, sa, len(text), words)
    if meta.get("tokens", words) != words or meta.get("sequences", len(text) - words) != len(text) - words:
        refuse(directory / "index.json", f"records {meta.get('tokens')} tokens in {meta.get('sequences')} sequences, "
               f"tokens.npy holds {words:,} in {len(text) - words:,}")  # fmt: skip
    depth = meta.pop("depth", DEPTH)
    _check_order(sa_path, text, sa, depth)
    for key in ("format", "format_version", "tokens", "sequences"):
        meta.pop(key, None)
    return SuffixIndex(text, sa, depth, meta, native)


def index_identity(target) -> dict:
    """What an index records about its target (a LoadedModel): name, vocabulary size and, where the weights are at
    hand, the head drafter's identity of them (architecture, shape, fingerprint)."""
    hf = getattr(target, "hf_model", None)
    if hf is not None:
        from specwise.drafters.head.format import target_identity

        return target_identity(hf, target.name)
    return {"name": target.name, "vocab_size": int(target.model.vocab_size)}


def check_index_target(info: dict, target) -> None:
    """Raise IndexTargetMismatchError unless the index (its ``info``) was built from ``target``'s answers."""
    recorded = info.get("target", {})
    actual = index_identity(target)
    same = all(recorded.get(k) == actual[k] for k in actual if k != "fingerprint" and k in recorded)
    fp_a, fp_b = recorded.get("fingerprint"), actual.get("fingerprint")
    if same and fp_a is not None and fp_b is not None:
        same = len(fp_a) == len(fp_b) and all(abs(a - b) <= 1e-3 * max(abs(a), 1e-6) + 1e-5 for a, b in zip(fp_a, fp_b))
    if not same or recorded.get("vocab_size") != int(target.model.vocab_size):
        name = target.name
        raise IndexTargetMismatchError(
            f"index built for {recorded.get('name')!r}, target is {name!r}: "
            f"build one with `specwise index --target {name} --out DIR`"
        )


def shipped_index_dir(target_name: str) -> Path | None:
    """The index shipped with specwise for the model named ``target_name``, or None."""
    root = Path(__file__).resolve().parent.parent / "shipped" / "indexes"
    for meta in sorted(root.glob("*/index.json")):
        if read_index_info(meta.parent).get("target", {}).get("name") == target_name:
            return meta.parent
    return None


# ---- counts kept as text arrives -------------------------------------------------------------------------------


class NgramCounts:
    """For each n-gram (n in ``orders``) of the text added, how often each token followed it.

    ``add``/``remove`` a whole sequence; ``extend`` a growing one (the request's context) from where it was.
    """

    def __init__(self, orders: tuple[int, ...]) -> None:
        self.orders = tuple(sorted(set(orders), reverse=True))
        self.table: dict[tuple[int, ...], dict[int, int]] = {}  # gram -> {next token: count, -1: total}

    def _update(self, seq: list[int], start: int, end: int, delta: int) -> None:
        table = self.table
        for i in range(max(start, 1), end):  # the gram ends at i, the token seq[i] follows it
            nxt = seq[i]
            for n in self.orders:
                if n > i:
                    continue
                gram = tuple(seq[i - n : i])
                row = table.get(gram)
                if row is None:
                    row = table[gram] = {-1: 0}
                row[nxt] = row.get(nxt, 0) + delta
                row[-1] += delta
                if delta < 0:
                    if row[nxt] <= 0:
                        del row[nxt]
                    if row[-1] <= 0:
                        del table[gram]

    def add(self, seq: list[int]) -> None:
        self._update(seq, 1, len(seq), 1)

    def remove(self, seq: list[int]) -> None:
        self._update(seq, 1, len(seq), -1)

    def extend(self, seq: list[int], done: int) -> None:
        """Count the grams of ``seq`` followed by tokens at positions ``done .. len(seq) - 1``."""
        self._update(seq, done, len(seq), 1)

    def draft(self, context: list[int], k: int, max_len: int, min_len: int, stop: float, smooth: float, half: float):
        """(n, tokens, confidences, counts): the longest n-gram ending the context that has followed text, and up to
        ``k`` tokens drafted from it, each the most frequent follower of the last n tokens so far; counts: (times
        the token followed, times the n tokens before it occurred) per token."""
        table = self.table
        for n in self.orders:
            if n > max_len or n < min_len or n > len(context):
                continue
            row = table.get(tuple(context[-n:]))
            if row is None:
                continue
            window = list(context[-n:])
            tokens, conf, counts = [], [], []
            reach = 1.0
            while row is not None and len(tokens) < k:
                total = row[-1]
                best, count = max(((t, c) for t, c in row.items() if t >= 0), key=lambda tc: (tc[1], -tc[0]))
                q = confidence(count, total, n, smooth, half)
                if reach * q < stop:
                    break
                reach *= q
                tokens.append(best)
                conf.append(q)
                counts.append((count, total))
                window = window[1:] + [best]
                row = table.get(tuple(window))
            return n, tokens, conf, counts
        return 0, [], [], []


class AnswerOverlay:
    """Served answers kept in memory (the latest ``max_tokens`` tokens; the oldest answers leave first) and their
    n-gram counts: what later requests draft from, shared by a drafter and its forks."""

    def __init__(self, orders: tuple[int, ...], max_tokens: int) -> None:
        self.counts = NgramCounts(orders)
        self.max_tokens = max_tokens
        self.answers: deque[list[int]] = deque()  # oldest first
        self.size = 0  # tokens in ``answers``

    def add(self, answer: list[int], prompt: list[int] | None = None) -> None:
        """Add an answer after the last ``LEAD`` tokens of its prompt (nothing when the answer is empty, or when
        the two alone are over the bound)."""
        seq = list((prompt or [])[-LEAD:]) + list(answer)
        if not answer or len(seq) > self.max_tokens:
            return
        self.counts.add(seq)
        self.answers.append(seq)
        self.size += len(seq)
        while self.size > self.max_tokens:
            old = self.answers.popleft()
            self.counts.remove(old)
            self.size -= len(old)


# ---- the drafter -----------------------------------------------------------------------------------------------

LOCAL_ORDERS = (1, 2, 3, 4, 6, 8, 12, 16, 24)
DEFAULT_PRIORS = {"index": (1.0, 2.0), "counts": (1.0, 2.0)}  # (smooth, half) where an index has no calibration


def chained_accepted(confidence: list[float]) -> float:
    """Tokens of a draft expected to be accepted from its per-token confidences: the sum of their running products
    (the planner's :func:`specwise.acceptance.expected_accepted_iid` is the same for one rate at every position)."""
    total, reach = 0.0, 1.0
    for c in confidence:
        reach *= c
        total += reach
    return total


class SuffixDrafter(Drafter):
    """Drafts from the target's earlier answers (a global :class:`SuffixIndex`, an overlay of served answers) and
    from the request's own tokens; see the module's docstring.

    max_match, min_match: the suffix lengths of the context searched (longest first); shorter matches than
        ``min_match`` propose nothing.
    priors: (smooth, half) of the confidences (:func:`confidence`) of the global index's drafts (``"index"``) and
        of the counts' (``"counts"``): the weight of the prior and the match length whose prior is 1/2. An index
        built by ``specwise index`` holds the values fitted on held-out answers of the target (``calibration`` in
        its ``index.json``), which :func:`make_suffix_drafter` uses.
    overlay_tokens: the most tokens the overlay of served answers holds (the oldest answers leave first).
    """

    name = "suffix"

    def __init__(
        self,
        index: SuffixIndex | None = None,
        max_match: int = 24,
        min_match: int = 2,
        priors: dict[str, tuple[float, float]] | None = None,
        overlay_tokens: int = 100_000,
        device: torch.device | str = "cpu",
    ) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"match lengths must satisfy 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.index = index
        self.max_match, self.min_match = max_match, min_match
        self.priors = {**DEFAULT_PRIORS, **(priors or {})}
        self.device = device
        orders = tuple(n for n in LOCAL_ORDERS if n <= max_match) + (max_match,)
        self.overlay = AnswerOverlay(orders, overlay_tokens)
        self._orders = orders
        self.begin([])

    @property
    def overlay_tokens(self) -> int:
        """The most tokens the overlay of served answers holds."""
        return self.overlay.max_tokens

    def begin(self, prompt: list[int]) -> None:
        self.local = NgramCounts(self._orders)
        self._indexed = 0  # positions of the context whose preceding grams are counted

    def _forked(self, target) -> None:
        # Shared with the fork: the global index (its native calls' scratch buffers too: one thread steps every
        # sequence, so no two searches run at once) and the overlay of served answers (an answer added by one
        # sequence is drafted from by all). Its own: the request's counts.
        self.begin([])

    def add_answer(self, answer: list[int], prompt: list[int] | None = None) -> None:
        """Add a finished answer (with the last tokens of its ``prompt``) to the overlay: later requests draft from
        it. The overlay lives in memory and keeps the latest ``overlay_tokens`` tokens; :meth:`save` writes it."""
        self.overlay.add(answer, prompt)

    def save(self, directory: Path | str) -> None:
        """Write the global index with the overlay's answers added, as a new index directory."""
        base = self.index.sequences() if self.index is not None else []
        info = dict(self.index.info) if self.index is not None else {}
        answers = list(self.overlay.answers)
        info["overlay_sequences"] = info.get("overlay_sequences", 0) + len(answers)
        depth = self.index.depth if self.index is not None else DEPTH
        SuffixIndex.from_sequences(base + answers, depth, info).save(directory)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator, stop: float = 0.0) -> Draft:
        if len(context) < self._indexed:
            self.begin([])  # not a continuation of the counted context: start over
        self.local.extend(context, self._indexed)
        self._indexed = len(context)
        if k <= 0 or len(context) < self.min_match:
            return Draft.empty(self.device)
        best: tuple[float, int, list[int], list[float]] = (0.0, 0, [], [])
        args = (context, k, self.max_match, self.min_match, stop, *self.priors["counts"])
        for counts in (self.local, self.overlay.counts):
            if counts.table:
                n, tokens, conf, _ = counts.draft(*args)
                if tokens:
                    best = max(best, (chained_accepted(conf), n, tokens, conf), key=lambda b: (b[0], b[1]))
        if self.index is not None:
            match = self.index.match(context, self.max_match, self.min_match)
            if match[0]:
                tokens, conf, _ = self.index.draft(match, k, stop, *self.priors["index"])
                if tokens:
                    best = max(best, (chained_accepted(conf), match[0], tokens, conf), key=lambda b: (b[0], b[1]))
        if not best[2]:
            return Draft.empty(self.device)
        return Draft(best[2], confidence=best[3], device=self.device)


def make_suffix_drafter(arg: str, target, device="cpu") -> SuffixDrafter:
    """The drafter of spec ``suffix[:DIR]`` for ``target`` (a LoadedModel): the index in DIR, else the one shipped
    for the target if any, else the request's own tokens and the overlay only."""
    directory = Path(arg) if arg else shipped_index_dir(target.name)
    index = None
    if directory is not None:
        index = load_index(directory, target=target)
    fitted = (index.info.get("calibration") or {}) if index is not None else {}
    priors = {source: (fit["smooth"], fit["half"]) for source, fit in fitted.items() if source in DEFAULT_PRIORS}
    return SuffixDrafter(index, priors=priors, device=device)
