"""A small, fast reader of GGUF files: metadata, tensor infos and memory-mapped tensor data.

`gguf.GGUFReader` parses every metadata array into Python objects (2.4 s for the default model's 49,152-token
vocabulary); this reader skips the arrays it is not asked for and maps the data, so opening a file takes
milliseconds. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (version 2 and 3).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["GGUFFile", "TensorInfo", "GGUFError", "TYPE_SIZES"]

# GGML type id -> (elements per block, bytes per block)
TYPE_SIZES = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 36),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    30: (1, 2),  # BF16
}
TYPE_NAMES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    15: "Q8_K",
    30: "BF16",
}

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A file that is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: rows first ([out, in] for a matrix)
    type: int
    offset: int  # from the start of the file

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, f"type {self.type}")

    @property
    def nbytes(self) -> int:
        block, size = TYPE_SIZES[self.type]
        return int(np.prod(self.shape)) // block * size


class GGUFFile:
    """Metadata and tensors of a GGUF file. Arrays of metadata are read only when asked for by key."""

    def __init__(self, path: str | Path, keep_arrays: tuple[str, ...] = ()) -> None:
        self.path = Path(path)
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._header = memoryview(self._data)  # plain buffer reads: struct on it is several times faster than slices
        self._pos = 0
        self.metadata: dict[str, object] = {}
        self._array_at: dict[str, int] = {}
        if bytes(self._data[:4]) != b"GGUF":
            raise GGUFError(f"{self.path}: not a GGUF file (no GGUF magic)")
        self._pos = 4
        version = self._scalar("<I")
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = self._scalar("<Q"), self._scalar("<Q")
        for _ in range(n_kv):
            key = self._string()
            kind = self._scalar("<I")
            if kind == _ARRAY:
                self._array_at[key] = self._pos
                if key in keep_arrays:
                    self.metadata[key] = self._array()
                else:
                    self._skip_array()
            else:
                self.metadata[key] = self._value(kind)
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = [self._scalar("<Q") for _ in range(self._scalar("<I"))]
            kind = self._scalar("<I")
            offset = self._scalar("<Q")
            infos.append((name, tuple(reversed(dims)), kind, offset))
        align = int(self.metadata.get("general.alignment", 32))
        start = (self._pos + align - 1) // align * align
        self.tensors = {n: TensorInfo(n, s, k, start + o) for n, s, k, o in infos}

    # ---- parsing -----------------------------------------------------------------------------------------

    def _scalar(self, fmt: str):
        size = struct.calcsize(fmt)
        value = struct.unpack_from(fmt, self._header, self._pos)[0]
        self._pos += size
        return value

    def _string(self) -> str:
        n = self._scalar("<Q")
        text = str(self._header[self._pos : self._pos + n], "utf-8", errors="replace")
        self._pos += n
        return text

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            return self._array()
        if kind not in _SCALARS:
            raise GGUFError(f"{self.path}: unknown metadata type {kind}")
        return self._scalar(_SCALARS[kind])

    def _array(self) -> list | np.ndarray:
        kind, n = self._scalar("<I"), self._scalar("<Q")
        if kind in _SCALARS and kind != 7:
            dtype = np.dtype(_SCALARS[kind])
            values = np.frombuffer(self._data, dtype=dtype, count=n, offset=self._pos).copy()
            self._pos += n * dtype.itemsize
            return values
        return [self._value(kind) for _ in range(n)]

    def _skip_array(self) -> None:
        kind, n = self._scalar("<I"), self._scalar("<Q")
        if kind in _SCALARS:
            self._pos += n * struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:
            unpack, data, pos = struct.Struct("<Q").unpack_from, self._header, self._pos
            for _ in range(n):
                pos += 8 + unpack(data, pos)[0]
            self._pos = pos
        else:
            for _ in range(n):
                self._value(kind)

    # ---- access ------------------------------------------------------------------------------------------

    def array(self, key: str):
        """A metadata array read on demand (None when absent)."""
        if key in self.metadata:
            return self.metadata[key]
        if key not in self._array_at:
            return None
        self._pos = self._array_at[key]
        self.metadata[key] = self._array()
        return self.metadata[key]

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def raw(self, name: str) -> np.ndarray:
        """The bytes of tensor ``name`` as the file stores them (a read-only view of the mapped file)."""
        info = self.tensors[name]
        return self._data[info.offset : info.offset + info.nbytes]

    def read(self, name: str, first_row: int = 0, rows: int | None = None) -> np.ndarray:
        """A copy of the bytes of tensor ``name`` (or of ``rows`` of its rows from ``first_row``), read with a plain
        file read: unlike the mapped view, the pages read do not stay in the process's resident memory."""
        info = self.tensors[name]
        n_rows = info.shape[0] if len(info.shape) > 1 else 1
        row_bytes = info.nbytes // n_rows
        rows = n_rows - first_row if rows is None else rows
        size = rows * row_bytes
        out = np.empty(size, dtype=np.uint8)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(info.offset + first_row * row_bytes)
            view = memoryview(out)
            done = 0
            while done < size:
                n = f.readinto(view[done:])
                if not n:
                    raise GGUFError(f"{self.path}: the file ends inside tensor {name}")
                done += n
        return out

    def floats(self, name: str) -> np.ndarray:
        """A float32 copy of a small F32 / F16 / BF16 tensor (norms, biases)."""
        info = self.tensors[name]
        raw = self.raw(name)
        if info.type == 0:
            values = raw.view(np.float32)
        elif info.type == 1:
            values = raw.view(np.float16).astype(np.float32)
        elif info.type == 30:
            values = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            from gguf.quants import dequantize

            values = dequantize(np.asarray(raw), info.type).reshape(-1)
        return np.array(values, dtype=np.float32).reshape(info.shape)
