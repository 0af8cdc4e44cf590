"""Quantized GGUF weights for the native kernels (``quant.c``; the decoder layers over them: ``layers.py``).

A :class:`QTensor` holds one GGUF matrix ``[out, in]`` re-packed at load time from the file's own block format
into the kernels' tiles (16 output rows per tile; 4-bit, 8-bit or float32 values with the file's scales, the
K-quants' kept as their byte sub-scales and float16 super-block factors), so it takes about the file's bytes in
memory. :func:`q_gemm` multiplies a few rows by one or several of them (their
outputs side by side) in one of two modes:

- ``exact``: float32 activations and accumulation: the numbers of the dequantized float32 model up to the order
  of summation;
- ``q8``: activations quantized to 8 bits per block of 32 and integer dot products (AVX-512 VNNI, AVX2
  ``vpmaddubsw``), the way llama.cpp evaluates GGUF files: faster, and lossy against the float32 reference.

In both, a row's result never depends on how many rows share the pass, and the portable, AVX2 and AVX-512 paths
agree bit for bit. Buffers are numpy arrays (the kernels read and write them by address).
"""

from __future__ import annotations

import contextlib
import ctypes

import numpy as np

from specwise.models.gguf_file import TYPE_NAMES
from specwise.models.kernels.abi import QJob, QMat, QPack
from specwise.models.kernels.library import kernel_error, native_library
from specwise.models.threads import get_num_threads

__all__ = [
    "MODES",
    "ISAS",
    "QTensor",
    "repack_jobs",
    "q_gemm",
    "isa",
    "set_isa",
    "attention_bf16_supported",
    "supported_types",
    "quantized_available",
    "QMat",
    "FloatRows",
    "MAX_ROWS",
]

MODES = ("exact", "q8")
MAX_ROWS = 64  # rows per call of the layer kernel; more rows run in slices, which gives the same results
ISAS = ("portable", "avx2", "avx512")

# GGML type ids (the GGUF file format) that the kernels take
_TYPES = {t: TYPE_NAMES[t] for t in (0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30)}
GGML_Q4_0 = 2


# status codes of quant.h (SW_*)
SW_OK, SW_EARG, SW_ENOMEM, SW_ERANGE = 0, -1, -2, -3
QMAX_DIM = 1 << 30  # quant.h: the most output rows or inputs of one matrix


def _lib():
    lib = native_library()
    if lib is None:
        raise RuntimeError(f"the quantized kernels are unavailable: {kernel_error()}")
    return lib


def quantized_available() -> bool:
    """Whether the native library (and with it the quantized kernels) is loaded."""
    return native_library() is not None


def supported_types() -> dict[int, str]:
    """GGML type id -> name for the formats the kernels re-pack."""
    return dict(_TYPES)


def isa() -> str:
    """The instruction path in use: ``avx512`` (with VNNI), ``avx2`` (with FMA and F16C) or ``portable``."""
    return ISAS[_lib().specwise_q_isa()]


def attention_bf16_supported() -> bool:
    """Whether the layers' bfloat16 attention runs here: the path in use is ``avx512`` and the CPU has
    AVX512_BF16."""
    return bool(_lib().specwise_attention_bf16_supported())


def set_isa(name: str | None) -> str:
    """Use the path ``name`` (lowered to what the CPU supports; None: the best); returns the path in use."""
    if name is not None and name not in ISAS:
        raise ValueError(f"unknown instruction path {name!r}: use one of {', '.join(ISAS)}")
    return ISAS[_lib().specwise_q_set_isa(-1 if name is None else ISAS.index(name))]


def _mode_id(mode: str) -> int:
    if mode not in MODES:
        raise ValueError(f"unknown precision {mode!r}: use one of {', '.join(MODES)}")
    return MODES.index(mode)


KIND_ROWS = 5  # quant.h: a qmat of float rows as they are (float32, or float16 with half)


class FloatRows:
    """Rows ``first .. first + count - 1`` of a float32 or float16 matrix ``[out, in]`` (a C-contiguous numpy array,
    read in place: kept alive here) as the kernels' ``qmat`` of kind KIND_ROWS: the float32 models' weights in the
    one decoder layer (``qllama.c``) and in :func:`q_gemm`, computed in float32 (float16 weights converted as they
    are read) on the library's instruction path, every path giving the same bits."""

    def __init__(self, weight: np.ndarray, first: int = 0, count: int | None = None, name: str = "weight"):
        ok = isinstance(weight, np.ndarray) and weight.ndim == 2 and weight.dtype in (np.float32, np.float16)
        if not ok or not weight.flags.c_contiguous:
            got = f"{weight.dtype} {weight.shape}" if isinstance(weight, np.ndarray) else type(weight).__name__
            raise ValueError(f"{name} must be a C-contiguous float32 or float16 numpy array [out, in], got {got}")
        out, n_in = weight.shape
        count = out - first if count is None else count
        if first < 0 or count < 1 or first + count > out or n_in < 1 or max(count, n_in) > QMAX_DIM:
            raise ValueError(f"{name}: rows {first} .. {first + count - 1} of a [{out}, {n_in}] matrix do not fit")
        self.array, self.name, self.shape = weight, name, (count, n_in)
        half = int(weight.dtype == np.float16)
        at = weight.ctypes.data + first * n_in * weight.itemsize
        self.struct = QMat(KIND_ROWS, 0, 0, 0, half, count, n_in, at, None, None, 0, None, None)

    def __repr__(self) -> str:
        return f"FloatRows({self.name}, {self.array.dtype}, {list(self.shape)})"


class QTensor:
    """A GGUF matrix ``[out, in]`` re-packed into the kernels' tiles.

    raw: the tensor's bytes as the file stores them (row-major blocks), any 1-D uint8 array-like of the right size.
    """

    def __init__(self, ggml_type: int, raw, out: int, in_features: int, name: str = "", arena=None) -> None:
        """raw: the tensor's bytes (row-major blocks), or a function ``(first_row, rows) -> bytes of those rows``
        that lets a large tensor be read a slice at a time, or None: the tiles are allocated and left for
        :func:`repack_jobs` (``self.pack`` says where they go)."""
        lib = _lib()
        self.name = name or "tensor"
        if ggml_type not in _TYPES:
            raise ValueError(
                f"{self.name}: GGML type {ggml_type} is not supported by the native kernels "
                f"(supported: {', '.join(_TYPES.values())}); use --impl hf"
            )
        kind, block, offset, has_m, half, raw_block, raw_bytes, sub = _layout(ggml_type)
        if in_features % 32 or in_features % raw_block:
            raise ValueError(
                f"{self.name}: {in_features} inputs is not a multiple of {max(32, raw_block)}, which the native "
                f"kernels need for {_TYPES[ggml_type]}; use --impl hf"
            )
        if not (0 < out <= QMAX_DIM and 0 < in_features <= QMAX_DIM):
            raise ValueError(f"{self.name}: a [{out}, {in_features}] matrix: the native kernels take 1 to 2^30 of each")
        row_bytes = in_features // raw_block * raw_bytes
        read = raw if callable(raw) else None
        n_q, n_s, n_m, n_sd, n_md = _sizes(ggml_type, out, in_features)

        def buffer(n: int) -> np.ndarray | None:
            # numpy's zeros come from calloc (pages mapped lazily, no fill pass); the C code writes every byte used
            if not n:
                return None
            return arena.take(n) if arena is not None else np.zeros(n, dtype=np.uint8)

        self.q = buffer(max(1, n_q))
        self.s = buffer(max(1, n_s))
        self.m = buffer(n_m)
        self.sd = buffer(n_sd)  # the K-quants' per-super-block factors d (and dmin) of their byte sub-scales
        self.md = buffer(n_md)
        pack = QPack(
            ggml_type, out, in_features, *(_ptr(b) for b in (self.q, self.s, self.m, self.sd, self.md)),
            *(0 if b is None else b.size for b in (self.q, self.s, self.m, self.sd, self.md)),
        )  # fmt: skip
        self.pack, self.row_bytes = pack, row_bytes
        step = out if read is None else max(16, (8 << 20) // max(1, row_bytes) // 16 * 16)  # slices of ~8 MB
        for first in range(0, out if raw is not None else 0, step):
            count = min(step, out - first)
            chunk = read(first, count) if read is not None else raw
            data = np.ascontiguousarray(np.asarray(chunk, dtype=np.uint8).reshape(-1))
            if data.size != count * row_bytes:
                raise ValueError(
                    f"{self.name}: {data.size} bytes for {count} rows of a {_TYPES[ggml_type]} [{out}, {in_features}]"
                )
            status = lib.specwise_q_repack(ctypes.byref(pack), data.ctypes.data, data.size, first, count)
            if status != SW_OK:
                raise RuntimeError(f"{self.name}: re-packing {_TYPES[ggml_type]} failed (status {status})")
        self.ggml_type = ggml_type
        self.type_name = _TYPES[ggml_type]
        self.shape = (out, in_features)
        self.struct = QMat(
            kind,
            block,
            offset,
            has_m,
            half,
            out,
            in_features,
            self.q.ctypes.data,
            self.s.ctypes.data if n_s else None,
            _ptr(self.m),
            sub,
            _ptr(self.sd),
            _ptr(self.md),
        )
        self.nbytes = n_q + n_s + n_m + n_sd + n_md

    def row(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        """Row ``index`` as float32 ``[in]`` (an embedding lookup), into ``out`` when given (a C-contiguous float32
        array of at least ``in`` values)."""
        if not 0 <= index < self.shape[0]:
            raise IndexError(f"{self.name}: row {index} outside [0, {self.shape[0]})")
        if out is None:
            out = np.empty(self.shape[1], dtype=np.float32)
        ok = isinstance(out, np.ndarray) and out.dtype == np.float32 and out.flags.c_contiguous and out.flags.writeable
        if not ok or out.size < self.shape[1]:
            raise ValueError(
                f"{self.name}: out must be a writable C-contiguous float32 array of {self.shape[1]} values"
            )
        _check(_lib().specwise_q_row(ctypes.byref(self.struct), int(index), out.ctypes.data), self.name)
        return out

    def rows(self, indices) -> np.ndarray:
        """Rows ``indices`` (integers: an array, a list or a range) as float32 ``[n, in]``."""
        if isinstance(indices, range):
            ids = np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
        else:
            ids = np.asarray(indices)
        if ids.size and ids.dtype.kind not in "iu":
            raise TypeError(f"{self.name}: row ids must be integers, got {ids.dtype}")
        ids = np.ascontiguousarray(ids.reshape(-1), dtype=np.int64)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.shape[0]):
            raise IndexError(f"{self.name}: row ids outside [0, {self.shape[0]})")
        out = np.empty((ids.size, self.shape[1]), dtype=np.float32)
        if ids.size:
            status = _lib().specwise_q_gather(ctypes.byref(self.struct), ids.ctypes.data, ids.size, out.ctypes.data)
            _check(status, self.name)
        return out

    def abs_sum(self, first: int, count: int) -> float:
        """Sum of |w| over elements ``first .. first + count - 1`` of the flattened matrix (row-major)."""
        total = float(_lib().specwise_q_abs_sum(ctypes.byref(self.struct), int(first), int(count)))
        if total == -2.0:
            raise IndexError(f"{self.name}: elements {first} .. {first + count} outside the matrix")
        if total < 0:
            raise MemoryError(f"{self.name}: out of memory summing |w|")
        return total

    def requantized_q4_0(self, arena=None) -> QTensor:
        """This matrix re-quantized to Q4_0 (the reference rule: a float16 scale and 4-bit values per block of 32),
        a slice of rows at a time: lossy, for a draft model (see ``QuantizedModel``'s ``drafting``)."""
        out, n_in = self.shape
        lib = _lib()

        def read(first: int, count: int) -> np.ndarray:
            raw = np.empty(count * (n_in // 32) * 18, dtype=np.uint8)
            status = lib.specwise_q_requantize_q4_0(ctypes.byref(self.struct), first, count, raw.ctypes.data, raw.size)
            _check(status, f"{self.name}: re-quantizing to Q4_0")
            return raw

        return QTensor(GGML_Q4_0, read, out, n_in, name=self.name, arena=arena)

    def dequantize(self) -> np.ndarray:
        """The whole matrix as float32 ``[out, in]`` (for references and tests: 4 bytes per weight)."""
        return self.rows(range(self.shape[0]))

    def __repr__(self) -> str:
        return f"QTensor({self.name}, {self.type_name}, {list(self.shape)}, {self.nbytes / 1e6:.1f} MB)"


def repack_jobs(jobs: list[tuple[QTensor, np.ndarray, np.ndarray | None]], release: bool = False) -> None:
    """Re-pack tensors made with ``raw=None`` in one native call, which holds no Python lock meanwhile (another
    thread can do Python work, e.g. read the tokenizer). Each job: the tensor, its raw blocks (row-major, e.g. a
    view of the mapped file), and None or the permutation of its rows (output row i is raw row ``rows[i]``).
    release: hand the raw views' pages back as they are done: only for views of a read-only file mapping, whose
    pages are read again from the file if touched (anonymous memory would read back as zeros)."""
    keep = []  # the arrays the C structs point into stay alive through the call
    table = (QJob * max(1, len(jobs)))()
    for i, (tensor, raw, rows) in enumerate(jobs):
        raw = np.ascontiguousarray(np.asarray(raw, dtype=np.uint8).reshape(-1))
        rows_ptr = None
        if rows is not None:
            rows = np.ascontiguousarray(np.asarray(rows, dtype=np.int64).reshape(-1))
            if rows.size != tensor.shape[0]:
                raise ValueError(f"{tensor.name}: {rows.size} row indices for {tensor.shape[0]} rows")
            rows_ptr = rows.ctypes.data
        keep.append((raw, rows))
        table[i] = QJob(tensor.pack, raw.ctypes.data, raw.size, rows_ptr, int(release))
    failed = ctypes.c_int64(-1)
    status = _lib().specwise_q_repack_jobs(table, len(jobs), ctypes.byref(failed))
    if status != SW_OK:
        tensor = jobs[failed.value][0] if 0 <= failed.value < len(jobs) else None
        what = f"{tensor.name}: re-packing {tensor.type_name}" if tensor is not None else "re-packing"
        raise RuntimeError(f"{what} failed (status {status}): its bytes do not fit its shape")


def _layout(ggml_type: int) -> tuple[int, int, int, int, int, int, int, int]:
    """(kind, block, offset, has_m, half, raw_block, raw_bytes, sub) of a supported GGML type (specwise_q_layout)."""
    fields = [ctypes.c_int() for _ in range(8)]
    if _lib().specwise_q_layout(ggml_type, *[ctypes.byref(f) for f in fields]) != 0:
        raise ValueError(f"GGML type {ggml_type} is not supported by the native kernels")
    return tuple(f.value for f in fields)


def bits_per_weight(ggml_type: int) -> float | None:
    """Bits a GGUF format stores per weight (its block's bytes * 8 / its values), None if the kernels do not take
    it."""
    if ggml_type not in _TYPES:
        return None
    *_, raw_block, raw_bytes, _ = _layout(ggml_type)
    return 8.0 * raw_bytes / raw_block


def _check(status: int, what: str) -> None:
    """Raise for a native entry point's status (quant.h's SW_*)."""
    if status == SW_ERANGE:
        raise IndexError(f"{what}: an index outside the matrix")
    if status == SW_ENOMEM:
        raise MemoryError(f"{what}: out of memory")
    if status != SW_OK:
        raise ValueError(f"{what}: the native kernels refused their arguments (status {status})")


def _sizes(ggml_type: int, out: int, in_features: int) -> tuple[int, int, int, int, int]:
    """Bytes of a QTensor's tiles q and s, m, sd, md as the kernels lay them out (0: the part is absent)."""
    sizes = [ctypes.c_int64() for _ in range(5)]
    status = _lib().specwise_q_sizes(ggml_type, out, in_features, *[ctypes.byref(s) for s in sizes])
    if status != SW_OK:
        raise ValueError(
            f"a {TYPE_NAMES.get(ggml_type, ggml_type)} [{out}, {in_features}] matrix is not one the native kernels "
            "take (1 to 2^30 rows and inputs, inputs in whole blocks)"
        )
    n_q, n_s, n_m, n_sd, n_md = (s.value for s in sizes)
    return n_q, n_s, n_m, n_sd, n_md


def tensor_bytes(ggml_type: int, out: int, in_features: int) -> int:
    """Bytes a QTensor of this type and shape allocates (its tiles, scales and factors; q and s at least one)."""
    n_q, n_s, n_m, n_sd, n_md = _sizes(ggml_type, out, in_features)
    return max(1, n_q) + max(1, n_s) + n_m + n_sd + n_md


class Arena:
    """One anonymous memory mapping that many QTensors' buffers are cut from, backed by huge pages where the
    kernel allows (``madvise(MADV_HUGEPAGE)``): a pass streams every weight, and with 4 KB pages it would walk
    tens of thousands of page-table entries per token. Pages are mapped (zeroed) when first written."""

    ALIGN = 64

    def __init__(self, size: int) -> None:
        import mmap

        self.size = max(1, size)
        self._map = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):  # an optimisation: without huge pages the buffers work the same
            with contextlib.suppress(OSError):
                self._map.madvise(mmap.MADV_HUGEPAGE)
        self._all = np.frombuffer(self._map, dtype=np.uint8)  # writable: a view of the mapping, no copy
        self._used = 0

    def take(self, n: int) -> np.ndarray:
        """``n`` bytes (a uint8 array viewing the mapping), aligned to 64 bytes."""
        start = -(-self._used // self.ALIGN) * self.ALIGN
        if start + n > self.size:
            raise MemoryError(f"arena of {self.size} bytes is full: {start + n} needed")
        self._used = start + n
        return self._all[start : start + n]


def lazy_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised C-contiguous array in an anonymous mapping of its own: its pages become resident as they
    are first written, 4 KB at a time, so a pass that writes a long prompt's rows pays only for its own rows.
    (numpy asks for huge pages under its own allocations of 4 MB or more, which would make a whole KV cache
    resident as soon as every layer's first rows are written. Huge pages asked for on purpose make attention over
    a long cache a few percent faster, 4% per decoding step at 8,192 positions on Zen 4, but each region of the
    cache then makes a fresh 2 MB page resident in the pass that first writes it: 112 at once for
    Qwen2.5-Coder-1.5B, 2-3 s in one slice where the machine backs new memory slowly, a virtual machine's
    first touch, a pause for every stream of a batch.) The mapping is unmapped with the last array viewing it."""
    import mmap

    count = int(np.prod(shape, dtype=np.int64))
    size = count * np.dtype(dtype).itemsize
    mapping = mmap.mmap(-1, max(1, size), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(mapping, dtype=dtype, count=count).reshape(shape)


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _structs(parts: list[QTensor]):
    array = (QMat * len(parts))(*[p.struct for p in parts])
    return array


def q_gemm(
    parts: QTensor | list[QTensor],
    x: np.ndarray,
    bias: np.ndarray | None = None,
    mode: str = "q8",
    threads: int | None = None,
) -> np.ndarray:
    """``x @ [W_0; W_1; ...].T (+ bias)`` for float32 x ``[k, in]`` (k >= 1) and a float32 bias ``[sum of outs]``
    or None (numpy arrays): a new float32 ``[k, sum of outs]`` array. threads: None for
    :func:`specwise.models.threads.get_num_threads`."""
    mode_id = _mode_id(mode)
    parts = [parts] if isinstance(parts, QTensor) else list(parts)
    if not parts or len(parts) > 8:
        raise ValueError(f"q_gemm takes 1 to 8 weights, got {len(parts)}")
    n_in = parts[0].shape[1]
    if any(p.shape[1] != n_in for p in parts):
        raise ValueError(f"the weights' inputs differ: {[p.shape for p in parts]}")
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != n_in or x.dtype != np.float32:
        got = f"{x.shape} {x.dtype}" if isinstance(x, np.ndarray) else type(x).__name__
        raise ValueError(f"q_gemm takes a float32 numpy array x [k, {n_in}], got {got}")
    n_out = sum(p.shape[0] for p in parts)
    if bias is not None and (not isinstance(bias, np.ndarray) or bias.size != n_out or bias.dtype != np.float32):
        raise ValueError(f"bias must be a float32 numpy array of {n_out} values")
    x = np.ascontiguousarray(x)
    y = np.empty((x.shape[0], n_out), dtype=np.float32)
    if x.shape[0] == 0:
        return y
    if bias is not None:
        bias = np.ascontiguousarray(bias)
    structs = _structs(parts)
    status = _lib().specwise_q_gemm(
        structs,
        len(parts),
        x.ctypes.data,
        None if bias is None else bias.ctypes.data,
        y.ctypes.data,
        x.shape[0],
        mode_id,
        threads or get_num_threads(),
    )
    _check(status, "q_gemm")
    return y
