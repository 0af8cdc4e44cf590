"""Checks of a head directory, an untrusted input: ``config.json``'s fields (type and range) and
``model.safetensors``' tensors (names, dtypes, shapes and values) against the configuration, all before the
head's weights reach a native kernel.

A refused head raises :class:`HeadFileError` (a ValueError) with one line naming the file, the field or tensor,
what was expected and what to do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

__all__ = [
    "HeadFileError",
    "HeadNotFoundError",
    "check_config",
    "read_config",
    "read_safetensors",
    "read_tensors",
    "write_safetensors",
]

REMAKE = "use a head written by `specwise distill`, or train one with `specwise distill --out DIR`"
MAX_CONFIG_BYTES = 1 << 20  # a head's config.json is about 1 KB
MAX_HIDDEN = 1 << 16
MAX_INTERMEDIATE = 1 << 20
MAX_HEADS = 1024
MAX_HEAD_DIM = 512  # the native layer kernels' limit
MAX_VOCAB = (1 << 31) - 1  # token ids are 32-bit in the native code
MAX_LAYERS = 1 << 16
MAX_FINGERPRINT = 64
MAX_TEXT = 4096  # a target's name may be a path

TARGET_KEYS = ("name", "architecture", "vocab_size", "hidden_size", "num_layers", "fingerprint")
# the file's dtypes as safetensors names them: trained weights (all one dtype), the rotary table, the ids
WEIGHT_DTYPES = ("F16", "BF16", "F32")
FIXED_DTYPES = {"inv_freq": "F32", "vocab_ids": "I64"}
# every dtype of the safetensors format: its element size, and the numpy dtype this reader gives it (None: read
# nowhere here; such a tensor is refused by name, never read)
SAFETENSORS_DTYPES = {
    "BOOL": (1, None), "U8": (1, "u1"), "I8": (1, "i1"), "F8_E5M2": (1, None), "F8_E4M3": (1, None),
    "I16": (2, "<i2"), "U16": (2, "<u2"), "F16": (2, "<f2"), "BF16": (2, "<u2"), "I32": (4, "<i4"),
    "U32": (4, "<u4"), "F32": (4, "<f4"), "F64": (8, "<f8"), "I64": (8, "<i8"), "U64": (8, "<u8"),
}  # fmt: skip
NUMPY_NAMES = {np.dtype("<f2"): "F16", np.dtype("<f4"): "F32", np.dtype("<f8"): "F64", np.dtype("<i8"): "I64",
               np.dtype("<i4"): "I32", np.dtype("<i2"): "I16", np.dtype("i1"): "I8", np.dtype("u1"): "U8"}  # fmt: skip
MAX_HEADER_BYTES = 1 << 24  # a head's header is about 1.5 KB (safetensors itself allows 100 MB)


class HeadFileError(ValueError):
    """A head directory that cannot be used: a file missing or malformed, or inconsistent with its configuration
    or its target."""


class HeadNotFoundError(FileNotFoundError, HeadFileError):
    """A head directory without one of its files (also a FileNotFoundError)."""


def refuse(path: Path | str, what: str, fix: str = REMAKE) -> NoReturn:
    """Raise HeadFileError ``"<path>: <what>: <fix>"`` (one line)."""
    raise HeadFileError(f"{path}: {what}: {fix}")


def _shown(value: Any) -> str:
    """A value as a message quotes it, cut to 40 characters (a hostile file's strings can be long)."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."


def _detail(error: Exception) -> str:
    """A parser's error in a few words: its first line, without safetensors' prefix, cut to 80 characters."""
    text = (str(error).splitlines() or [type(error).__name__])[0]
    text = text.removeprefix("Error while deserializing header: ")
    return text if len(text) <= 80 else text[:77] + "..."


# ---- config.json --------------------------------------------------------------------------------------------


def read_config(path: Path) -> dict:
    """``config.json`` parsed as a JSON object (not yet checked field by field: :func:`check_config`)."""
    if not path.is_file():
        raise HeadNotFoundError(
            f"{path.parent} is not a head directory (no config.json): train one with `specwise distill --out DIR`"
        )
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            refuse(path, f"{size} bytes, expected a config of at most {MAX_CONFIG_BYTES}")
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        refuse(path, f"not valid JSON ({_detail(e)})")
    except OSError as e:
        refuse(path, f"cannot be read ({e.strerror or e})")
    if not isinstance(data, dict):
        refuse(path, f"holds a JSON {type(data).__name__}, expected an object with the head's fields")
    return data


def _integer(path: Path, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        refuse(path, f"{key} is {_shown(value)}, expected an integer in {low}..{high}")
    if not low <= value <= high:
        refuse(path, f"{key} is {value}, expected an integer in {low}..{high}")
    return value


def _number(path: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        refuse(path, f"{key} is {_shown(value)}, expected a finite number")
    return float(value)


def _text(path: Path, key: str, value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT:
        refuse(path, f"{key} is {_shown(value)}, expected a string of 1 to {MAX_TEXT} characters")
    return value


def _keys(path: Path, where: str, data: dict, known: tuple[str, ...] | set[str]) -> None:
    """Refuse missing and unknown keys of a JSON object (a field this specwise does not know is not ignored)."""
    missing = [k for k in sorted(known) if k not in data]
    if missing:
        refuse(path, f"{where}has no {missing[0]!r}, expected the fields {', '.join(sorted(known))}")
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        refuse(path, f"{where}has an unknown field {_shown(unknown[0])}", f"upgrade specwise, or {REMAKE}")


def _check_target(path: Path, target: Any, hidden_size: int) -> dict:
    """The ``target`` object: the identity of the model the head was trained for."""
    if not isinstance(target, dict):
        refuse(path, f"target is {_shown(target)}, expected an object ({', '.join(TARGET_KEYS)})")
    _keys(path, "target ", target, TARGET_KEYS)
    _text(path, "target.name", target["name"])
    _text(path, "target.architecture", target["architecture"])
    _integer(path, "target.vocab_size", target["vocab_size"], 1, MAX_VOCAB)
    _integer(path, "target.num_layers", target["num_layers"], 1, MAX_LAYERS)
    if target["hidden_size"] != hidden_size:
        got = _shown(target["hidden_size"])
        refuse(path, f"target.hidden_size is {got}, expected the head's hidden_size {hidden_size}")
    fingerprint = target["fingerprint"]
    if not isinstance(fingerprint, list) or not 1 <= len(fingerprint) <= MAX_FINGERPRINT:
        refuse(path, f"target.fingerprint is {_shown(fingerprint)}, expected a list of 1 to {MAX_FINGERPRINT} numbers")
    for i, value in enumerate(fingerprint):
        if _number(path, f"target.fingerprint[{i}]", value) < 0:
            refuse(path, f"target.fingerprint[{i}] is {value}, expected a mean absolute value (>= 0)")
    return target


def check_config(path: Path, data: dict, fields: tuple[str, ...], fmt: str, version: int) -> dict:
    """The fields of a head's ``config.json`` (``data``), each of its type and in its range, and consistent with
    each other; returns the dataclass's ``fields`` (the format and its version checked and dropped)."""
    _keys(path, "", data, {"format", "format_version", *fields})
    if data["format"] != fmt:
        refuse(path, f"format is {_shown(data['format'])}, expected {fmt!r} (not a specwise head config)")
    got = data["format_version"]
    if type(got) is int and got > version:
        refuse(path, f"format_version is {got}, newer than this specwise reads ({version})", "upgrade specwise")
    _integer(path, "format_version", data["format_version"], 1, version)
    hidden = _integer(path, "hidden_size", data["hidden_size"], 1, MAX_HIDDEN)
    heads = _integer(path, "num_heads", data["num_heads"], 1, MAX_HEADS)
    kv = _integer(path, "num_kv_heads", data["num_kv_heads"], 1, heads)
    if heads % kv:
        refuse(path, f"num_heads {heads} is not a multiple of num_kv_heads {kv}, expected groups of query heads")
    head_dim = _integer(path, "head_dim", data["head_dim"], 2, MAX_HEAD_DIM)
    if head_dim % 2:
        refuse(path, f"head_dim is {head_dim}, expected an even size (rotary pairs)")
    _integer(path, "intermediate_size", data["intermediate_size"], 1, MAX_INTERMEDIATE)
    eps = _number(path, "rms_eps", data["rms_eps"])
    if not 0 < eps < 1:
        refuse(path, f"rms_eps is {eps}, expected a small positive number (such as 1e-6)")
    target = _check_target(path, data["target"], hidden)
    _integer(path, "draft_vocab_size", data["draft_vocab_size"], 1, target["vocab_size"])
    if not isinstance(data["training"], dict):
        refuse(path, f"training is {_shown(data['training'])}, expected an object")
    return {k: data[k] for k in fields}


# ---- model.safetensors --------------------------------------------------------------------------------------


class _Invalid(Exception):
    """What makes a file not a valid safetensors file (raised inside the reader, refused with the path)."""


def _entry(name: str, entry) -> tuple[str, tuple[int, ...], int, int]:
    """One tensor of the header: (dtype, shape, first byte, end byte), each checked against the others."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise _Invalid(f"tensor {_shown(name)} is not an object of dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise _Invalid(f"tensor {_shown(name)} has an unknown dtype {_shown(dtype)}")
    ok = isinstance(shape, list) and len(shape) <= 8
    ok = ok and all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
    if not ok:
        raise _Invalid(f"tensor {_shown(name)} has the shape {_shown(shape)}")
    ok = isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)
    if not ok or offsets[0] > offsets[1]:
        raise _Invalid(f"tensor {_shown(name)} has the data offsets {_shown(offsets)}")
    if offsets[1] - offsets[0] != math.prod(shape) * SAFETENSORS_DTYPES[dtype][0]:
        raise _Invalid(f"tensor {_shown(name)}'s data offsets do not hold its shape")
    return dtype, tuple(shape), offsets[0], offsets[1]


def read_safetensors(path: Path, max_bytes: int) -> tuple[dict[str, tuple[str, tuple[int, ...]]], object]:
    """A safetensors file's header checked against the format, before any tensor is read: ``({name: (dtype,
    shape)}, reader)`` where ``reader(name)`` is that tensor as a new numpy array (its own aligned, writable copy;
    BF16 widened to float32, exactly). The file is untrusted: its length, the header's length, JSON, every entry's
    dtype, shape and offsets (the tensors' bytes one after the other, covering the data exactly, as the format
    requires) are checked; ``max_bytes`` bounds the whole file. Raises HeadFileError naming ``path``."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise _Invalid(f"{size} bytes, more than the {max_bytes} its tensors need")
        data = path.read_bytes()
        if len(data) < 8:
            raise _Invalid(f"{len(data)} bytes, shorter than a header")
        n = int.from_bytes(data[:8], "little")
        if not 2 <= n <= min(MAX_HEADER_BYTES, len(data) - 8):
            raise _Invalid(f"a header of {n} bytes in a file of {len(data)}")
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
        if not isinstance(header, dict):
            raise _Invalid("the header is not a JSON object")
        metadata = header.pop("__metadata__", {})
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise _Invalid("__metadata__ is not an object of strings")
        entries = {name: _entry(name, entry) for name, entry in header.items()}
        body = memoryview(data)[8 + n :]
        at = 0
        for _, _, first, end in sorted(entries.values(), key=lambda e: (e[2], e[3])):
            if first != at:
                raise _Invalid("the tensors' data overlap or leave a gap")
            at = end
        if at != len(body):
            raise _Invalid(f"the tensors hold {at} bytes of data, the file {len(body)}")
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        refuse(path, f"not a valid safetensors file (header: {_detail(e)})")
    except _Invalid as e:
        refuse(path, f"not a valid safetensors file ({e})")
    except OSError as e:
        refuse(path, f"cannot be read ({e.strerror or e})")

    def reader(name: str) -> np.ndarray:
        dtype, shape, first, end = entries[name]
        kind = SAFETENSORS_DTYPES[dtype][1]
        if kind is None:
            raise ValueError(f"{path}: tensor {name!r} is {dtype}, which this reader does not read")
        value = np.frombuffer(body[first:end], dtype=kind).reshape(shape).copy()  # aligned, owned, writable
        if dtype == "BF16":  # the upper half of a float32
            value = (value.astype(np.uint32) << 16).view(np.float32)
        return value

    return {name: (e[0], e[1]) for name, e in entries.items()}, reader


def write_safetensors(
    path: Path, tensors: dict[str, np.ndarray], kinds: dict[str, str] | None = None, metadata: dict | None = None
) -> None:
    """Write ``tensors`` (numpy arrays of the dtypes in ``NUMPY_NAMES``) as a safetensors file at ``path``: the
    header (names sorted, offsets one after the other, padded with spaces to 8 bytes), then the little-endian data.
    kinds: a tensor's dtype as the file names it where numpy has none (``"BF16"``: its bits as uint16)."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    kinds = kinds or {}
    blobs, at = [], 0
    for name in sorted(tensors):
        value = np.asarray(tensors[name])
        little = value.dtype.newbyteorder("<") if value.dtype.itemsize > 1 else value.dtype
        kind = kinds.get(name) or NUMPY_NAMES.get(little)
        if kind not in SAFETENSORS_DTYPES or SAFETENSORS_DTYPES[kind][0] != value.dtype.itemsize:
            raise ValueError(f"tensor {name!r} is {value.dtype}, which a safetensors file here does not hold")
        raw = np.ascontiguousarray(value, dtype=little).tobytes()
        header[name] = {"dtype": kind, "shape": list(value.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for raw in blobs:
            f.write(raw)


def _header(
    path: Path, found: dict[str, tuple[str, tuple[int, ...]]], expected: dict[str, tuple[tuple[int, ...], str | None]]
) -> None:
    """The names, dtypes and shapes in the file's header (``found``: name -> (dtype name, shape)) against
    ``expected`` (name -> (shape, dtype name, or None for one of the weight dtypes)), before any tensor is read."""
    missing = [name for name in expected if name not in found]
    if missing:
        refuse(path, f"no tensor {missing[0]!r}, expected {len(expected)} tensors ({', '.join(expected)})")
    unknown = sorted(name for name in found if name not in expected)
    if unknown:
        refuse(path, f"unknown tensor {_shown(unknown[0])}, expected only {', '.join(expected)}")
    weight_dtypes = set()
    for name, (shape, dtype) in expected.items():
        got_dtype, got_shape = found[name]
        if tuple(got_shape) != tuple(shape):
            refuse(path, f"tensor {name!r} has shape {list(got_shape)}, expected {list(shape)} from config.json")
        want = dtype or "F16, BF16 or F32"
        if (dtype is not None and got_dtype != dtype) or (dtype is None and got_dtype not in WEIGHT_DTYPES):
            refuse(path, f"tensor {name!r} is {got_dtype}, expected {want}")
        if dtype is None:
            weight_dtypes.add(got_dtype)
    if len(weight_dtypes) > 1:
        refuse(path, f"the weights mix dtypes {', '.join(sorted(weight_dtypes))}, expected one")


def _finite(value: np.ndarray) -> bool:
    """Whether every element is finite, from one sum (NaN and infinities carry through it; a float16 sum cannot
    overflow float32, a wider one cannot overflow float64): several times faster than isfinite on float16."""
    total = value.sum(dtype=np.float32 if value.dtype == np.float16 else np.float64)
    return bool(np.isfinite(total))


def _values(path: Path, tensors: dict[str, np.ndarray], vocab_size: int) -> None:
    """Finite weights, a positive rotary table, and draft-vocabulary ids sorted, distinct and in the target's
    vocabulary."""
    for name, value in tensors.items():
        if value.dtype.kind == "f" and not _finite(value):
            refuse(path, f"tensor {name!r} holds NaN or infinite values, expected finite weights")
    if not bool((tensors["inv_freq"] > 0).all()):
        refuse(path, "tensor 'inv_freq' holds values <= 0, expected the rotary frequencies (positive)")
    ids = tensors["vocab_ids"]
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        low, high = int(ids.min()), int(ids.max())
        refuse(path, f"tensor 'vocab_ids' holds ids {low}..{high}, expected ids in the target's 0..{vocab_size - 1}")
    if ids.size > 1 and not bool((ids[1:] > ids[:-1]).all()):
        refuse(path, "tensor 'vocab_ids' is not strictly increasing, expected sorted distinct token ids")


def read_tensors(path: Path, expected: dict[str, tuple[tuple[int, ...], str | None]], vocab_size: int) -> dict:
    """The tensors of ``model.safetensors`` as numpy arrays, checked: the file against the format
    (:func:`read_safetensors`), its header against ``expected`` (see :func:`_header`), then the values
    (:func:`_values`; ``vocab_size``: the target's). BF16 weights come as float32 (the same values)."""
    if not path.is_file():
        raise HeadNotFoundError(f"{path.parent} has no model.safetensors: {REMAKE}")
    # the largest file these tensors make: 8 bytes per element (their widest dtype), and the header
    elements = sum(math.prod(shape) for shape, _ in expected.values())
    found, read = read_safetensors(path, 8 + MAX_HEADER_BYTES + 8 * elements)
    _header(path, found, expected)
    tensors = {name: read(name) for name in expected}
    _values(path, tensors, vocab_size)
    return tensors
