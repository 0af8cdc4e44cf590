"""Reading an index directory of the `suffix` drafter, untrusted input, and the target it was built for.

Index directory format: ``index.json`` (format, the target's identity, how it was built), ``tokens.npy`` (the
token ids of every sequence, each followed by a separator, uint16 where the vocabulary allows) and ``sa.npy``
(int32 suffix array, sorted to ``depth`` tokens), as :meth:`SuffixIndex.save` writes them. :func:`load_index`
checks every field, dtype, shape and size against the files, the token ids against the vocabulary and the suffix
array against the text (every entry in range, one per token, the order spot-checked) before native code searches
it, and refuses a bad index with one :class:`IndexFileError` line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from specwise.artifacts import ArtifactError, read_npy
from specwise.artifacts import shown as _shown
from specwise.drafters.suffix.index import (
    DEFAULT_PRIORS,
    DEPTH,
    FORMAT,
    FORMAT_VERSION,
    REBUILD,
    SEP,
    IndexFileError,
    IndexNotFoundError,
    IndexTargetMismatchError,
    SuffixIndex,
)

__all__ = [
    "check_index_target",
    "index_identity",
    "load_index",
    "read_array",
    "read_index_info",
    "refuse",
]

MAX_META_BYTES = 1 << 20  # an index.json is a few KB
MAX_DEPTH = 1024
MAX_FINGERPRINT = 64
SPOT_PAIRS = 256  # adjacent pairs of the suffix array whose order a load checks (all of them in a smaller index)
SPOT_WIDTH = 32  # tokens compared per pair (at most the index's depth)
MAX_TOKENS = (1 << 31) - 1024  # positions are int32 (the suffix array's dtype), with room for offsets
TOKEN_DTYPES = (np.dtype(np.uint16), np.dtype(np.uint32))
SA_DTYPES = (np.dtype(np.int32),)
_SPOT_FRACTIONS = (np.arange(SPOT_PAIRS) * 0.6180339887498949) % 1.0  # golden-ratio steps: spread over [0, 1)
_COLUMNS = np.arange(max(SPOT_PAIRS, SPOT_WIDTH), dtype=np.int32)
_PAIR = np.array([[0], [1]], dtype=np.int32)  # a pair's first entry and the next


def refuse(path: Path | str, what: str, fix: str = REBUILD) -> NoReturn:
    """Raise IndexFileError ``"<path>: <what>: <fix>"`` (one line)."""
    raise IndexFileError(f"{path}: {what}: {fix}")


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


def read_array(path: Path, dtypes: tuple[np.dtype, ...]) -> np.ndarray:
    """A one-dimensional array of one of ``dtypes`` from an .npy file of an index, checked before it is read
    (:func:`specwise.artifacts.read_npy`); a bad file is an IndexFileError, a missing one an IndexNotFoundError."""
    try:
        return read_npy(path, dtypes)
    except (FileNotFoundError, NotADirectoryError):
        raise IndexNotFoundError(f"{path}: missing: {REBUILD}") from None
    except ArtifactError as err:
        refuse(path, err.what)


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
    """Read an index directory written by :meth:`SuffixIndex.save`, checking it first (see this module's docstring).

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
    if target.hf_model is not None:
        from specwise.drafters.head.format import target_identity

        return target_identity(target.hf_model, target.name)
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
