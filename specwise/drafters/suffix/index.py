"""The global index of the `suffix` drafter: the target's earlier answers in one suffix array, built from
sequences of token ids, searched for the longest match of a context and drafted from (in native code,
``kernels/suffix.c``, or by the Python reference of the same choices), and saved as an index directory (read back,
checked, by :mod:`specwise.drafters.suffix.load`)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import NoReturn

import numpy as np

__all__ = [
    "DEFAULT_PRIORS",
    "DEPTH",
    "LEAD",
    "SEP",
    "IndexFileError",
    "IndexNotFoundError",
    "IndexTargetMismatchError",
    "SfxDraft",
    "SfxIndex",
    "SfxOut",
    "SuffixIndex",
    "build_suffix_array",
    "confidence",
]

FORMAT = "specwise-suffix-index"
FORMAT_VERSION = 1
SEP = 0xFFFFFFFF  # separator after each sequence in memory (uint32); 0xFFFF in a uint16 file
DEPTH = 64  # suffixes are sorted by their first DEPTH tokens: matches and drafts together stay within it
LEAD = 8  # prompt tokens kept before each answer, so that the answer's first tokens have a context to match
SCAN = 32  # continuations counted exactly in ranges up to this size; larger ranges are sampled this many times
SUFFIX_ABI = 3  # the native entry points' signatures (kernels/suffix.c's SUFFIX_ABI)

REBUILD = "rebuild the index with `specwise index --target MODEL --out DIR`"
DEFAULT_PRIORS = {"index": (1.0, 2.0), "counts": (1.0, 2.0)}  # (smooth, half) where an index has no calibration


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


class SfxIndex(ctypes.Structure):
    """The C ``sfxindex`` of ``specwise.h``: an index's text and suffix array with their lengths."""

    _fields_ = [("text", ctypes.c_void_p), ("n", ctypes.c_int64), ("sa", ctypes.c_void_p), ("m", ctypes.c_int64)]


class SfxDraft(ctypes.Structure):
    """The C ``sfxdraft``: how a draft continues a match."""

    _fields_ = [
        ("depth", ctypes.c_int64),
        ("max_depth", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("stop", ctypes.c_double),
        ("smooth", ctypes.c_double),
        ("half", ctypes.c_double),
        ("scan", ctypes.c_int64),
    ]


class SfxOut(ctypes.Structure):
    """The C ``sfxout``: a draft's tokens, confidences and counts, and the tokens they hold."""

    _fields_ = [("tokens", ctypes.c_void_p), ("conf", ctypes.c_void_p), ("counts", ctypes.c_void_p),
                ("capacity", ctypes.c_int64)]  # fmt: skip


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
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        # (text, n, sa, m, ctx, plen, min_len, lo, hi) -> match length, or -1 for arguments out of bounds
        lib.specwise_suffix_match.argtypes = [p, i64, p, i64, p, i64, i64, p, p]
        lib.specwise_suffix_match.restype = i64
        # (sfxindex *, lo, hi, sfxdraft *, sfxout *) -> drafted, or -1 for arguments out of bounds
        ptr = ctypes.POINTER
        lib.specwise_suffix_draft.argtypes = [ptr(SfxIndex), i64, i64, ptr(SfxDraft), ptr(SfxOut)]
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
        self._ctx_ptr = None
        # the draft's structs: the index filled once, the outputs when they grow, the options per call
        self._index = SfxIndex(self._ptr[0], len(self.text), self._ptr[1], len(self.sa))
        self._draft_opts = SfxDraft(scan=SCAN)
        self._draft_out = SfxOut()
        self._draft_ptrs = (ctypes.pointer(self._index), ctypes.pointer(self._draft_opts),
                            ctypes.pointer(self._draft_out))  # fmt: skip

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
            self._draft_out.tokens, self._draft_out.conf, self._draft_out.counts = (a.ctypes.data for a in self._out)
            self._draft_out.capacity = k
        tokens, conf, counts = self._out
        opts = self._draft_opts
        opts.depth, opts.max_depth, opts.k = length, self.depth, k
        opts.stop, opts.smooth, opts.half = stop, smooth, half
        index, opts_ptr, out_ptr = self._draft_ptrs
        n = self._lib.specwise_suffix_draft(index, lo, hi, opts_ptr, out_ptr)
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
