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
(int32 suffix array, sorted to ``depth`` tokens).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import tempfile
from collections import deque
from pathlib import Path

import numpy as np
import torch

from specwise.drafters.base import Draft, Drafter
from specwise.sampling import SamplingParams

__all__ = [
    "AnswerOverlay",
    "IndexTargetMismatchError",
    "NgramCounts",
    "SuffixDrafter",
    "SuffixIndex",
    "build_suffix_array",
    "check_index_target",
    "index_identity",
    "load_index",
    "shipped_index_dir",
]

FORMAT = "specwise-suffix-index"
FORMAT_VERSION = 1
SEP = 0xFFFFFFFF  # separator after each sequence in memory (uint32); 0xFFFF in a uint16 file
DEPTH = 64  # suffixes are sorted by their first DEPTH tokens: matches and drafts together stay within it
LEAD = 8  # prompt tokens kept before each answer, so that the answer's first tokens have a context to match
SCAN = 32  # continuations counted exactly in ranges up to this size; larger ranges are sampled this many times


class IndexTargetMismatchError(ValueError):
    """The index was built from another target's answers."""


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
    if lib is None or not hasattr(lib, "specwise_suffix_match"):
        return None
    if not getattr(lib, "_suffix_declared", False):
        p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        lib.specwise_suffix_match.argtypes = [p, p, i64, p, i, i, p, p]
        lib.specwise_suffix_match.restype = i
        d = ctypes.c_double
        lib.specwise_suffix_draft.argtypes = [p, p, i64, i64, i, i, i, d, d, d, i, p, p, p]
        lib.specwise_suffix_draft.restype = i
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
        length = self._lib.specwise_suffix_match(text, sa, len(self.sa), self._ctx_ptr, len(tail), min_len, lo, hi)
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
            text, sa, lo, hi, length, self.depth, k, stop, smooth, half, SCAN, *self._out_ptr
        )  # fmt: skip
        pairs = counts[: 2 * n].tolist()
        return tokens[:n].tolist(), conf[:n].tolist(), list(zip(pairs[::2], pairs[1::2]))

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


def load_index(directory: Path | str, native: bool = True) -> SuffixIndex:
    """Read an index directory written by :meth:`SuffixIndex.save`."""
    directory = Path(directory)
    meta_path = directory / "index.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"{directory} holds no suffix index (no index.json): build one with `specwise index --out {directory}`"
        )
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path} is not a specwise suffix index (format {meta.get('format')!r})")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"suffix index format version {meta['format_version']} is newer than this specwise ({FORMAT_VERSION}): "
            "upgrade specwise"
        )
    tokens = np.load(directory / "tokens.npy")
    text = tokens.astype(np.uint32)
    if tokens.dtype == np.uint16:
        text[tokens == 0xFFFF] = SEP
    sa = np.load(directory / "sa.npy")
    depth = int(meta.pop("depth", DEPTH))
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
    root = Path(__file__).resolve().parent.parent / "indexes"
    for meta in sorted(root.glob("*/index.json")):
        if json.loads(meta.read_text()).get("target", {}).get("name") == target_name:
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


def expected_accepted(confidence: list[float]) -> float:
    """Tokens of a draft expected to be accepted: the sum of the running products of its confidences."""
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
                    best = max(best, (expected_accepted(conf), n, tokens, conf), key=lambda b: (b[0], b[1]))
        if self.index is not None:
            match = self.index.match(context, self.max_match, self.min_match)
            if match[0]:
                tokens, conf, _ = self.index.draft(match, k, stop, *self.priors["index"])
                if tokens:
                    best = max(best, (expected_accepted(conf), match[0], tokens, conf), key=lambda b: (b[0], b[1]))
        if not best[2]:
            return Draft.empty(self.device)
        return Draft(best[2], confidence=best[3], device=self.device)


def make_suffix_drafter(arg: str, target, device="cpu") -> SuffixDrafter:
    """The drafter of spec ``suffix[:DIR]`` for ``target`` (a LoadedModel): the index in DIR, else the one shipped
    for the target if any, else the request's own tokens and the overlay only."""
    directory = Path(arg) if arg else shipped_index_dir(target.name)
    index = None
    if directory is not None:
        index = load_index(directory)
        check_index_target(index.info, target)
    fitted = (index.info.get("calibration") or {}) if index is not None else {}
    priors = {source: (fit["smooth"], fit["half"]) for source, fit in fitted.items() if source in DEFAULT_PRIORS}
    return SuffixDrafter(index, priors=priors, device=device)
