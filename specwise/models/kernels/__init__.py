"""specwise's native kernels, compiled by ``pip install`` (``setup.py``) into one shared library loaded here.

``small_gemm`` multiplies a few rows by a large weight (decoding and verification); ``layer_kernel`` runs the
decoder layers of a Llama-family model on a few rows in one call (see ``llama.c``). Every kernel of the library runs
on one instruction path, chosen at run time by the library (AVX-512, AVX2 or portable: the best the CPU supports,
or the one :func:`specwise.models.kernels.quant.set_isa` sets); the float kernels have AVX2 code only and refuse
below that path, where their torch callers fall back to torch. ``SPECWISE_NO_KERNELS=1`` disables them all;
``SPECWISE_NATIVE_LIB=path`` loads another build of them (the sanitizer build of ``make sanitize``).

Every binding takes and returns numpy arrays (C-contiguous, of the dtype it names; a torch caller passes
``tensor.numpy()``, a view of the same memory).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from pathlib import Path

import numpy as np

from specwise.models.threads import get_num_threads

__all__ = [
    "small_gemm",
    "small_gemm_available",
    "kernel_error",
    "LayerKernel",
    "layer_kernel",
    "native_library",
    "library_path",
]

_lib = None
_error: str | None = None
_tried = False


# the library's instruction paths (quant.h ISA_*) and the status of a float kernel refused below ISA_AVX2 (SW_EISA)
_ISA_AVX2 = 1
_EISA = -4


def _float_kernels_run() -> bool:
    """Whether the float kernels (smallgemm.c, llama.c: AVX2, FMA and F16C code only) run: built (x86-64) and the
    library's instruction path in use at least AVX2 (the library's own choice; never read from the CPU here)."""
    lib = _load()
    return lib is not None and hasattr(lib, "specwise_small_gemm") and lib.specwise_q_isa() >= _ISA_AVX2


def library_path() -> Path | None:
    """The kernels' shared library built by ``pip install`` (``_native*.so`` beside this file), if it exists;
    ``SPECWISE_NATIVE_LIB`` names another build of the same sources (``make sanitize``'s)."""
    other = os.environ.get("SPECWISE_NATIVE_LIB")
    if other:
        return Path(other) if Path(other).is_file() else None
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_native{suffix}"
        if path.is_file():
            return path
    return None


def _load():
    global _lib, _error, _tried
    if not _tried:
        _tried = True
        path = library_path()
        if os.environ.get("SPECWISE_NO_KERNELS") == "1":
            _error = "disabled by SPECWISE_NO_KERNELS=1"
        elif path is None:
            _error = (
                "the native kernels were not built when specwise was installed (no C compiler?): "
                "install gcc and reinstall specwise (pip install -e .)"
            )
        else:
            try:
                from specwise.models.kernels.abi import declare

                _lib = declare(ctypes.CDLL(str(path)))
            except (OSError, AttributeError) as err:
                _error = f"loading the native kernels failed: {err}"
    return _lib


def native_library() -> ctypes.CDLL | None:
    """The loaded kernels library, or None (see :func:`kernel_error`)."""
    return _load()


def small_gemm_available() -> bool:
    """True when the float kernel is built and runs on the instruction path in use (AVX2 or AVX-512)."""
    return _load() is not None and _float_kernels_run()


def kernel_error() -> str | None:
    """Why the kernel is unavailable (None when it is available or was not tried)."""
    _load()
    return _error


def small_gemm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, threads: int | None = None
) -> np.ndarray:
    """``x @ weight.T (+ bias)``: x float32 ``[k, in]``, weight ``[out, in]`` C-contiguous float32 or float16 (read
    as float16, computed in float32: half the memory traffic, for drafters), bias float32 ``[out]`` or None; returns
    a new float32 ``[k, out]`` array. threads: None for :func:`specwise.models.threads.get_num_threads`."""
    lib = _load()
    if lib is None or not _float_kernels_run():
        raise RuntimeError(f"small_gemm is unavailable: {_error or _below_avx2()}")
    arrays = all(isinstance(a, np.ndarray) for a in (x, weight) + (() if bias is None else (bias,)))
    ok = arrays and x.ndim == 2 and weight.ndim == 2 and x.dtype == np.float32
    ok = ok and weight.dtype in (np.float32, np.float16) and weight.flags.c_contiguous
    ok = ok and weight.shape[1] == x.shape[1]
    ok = ok and (bias is None or (bias.dtype == np.float32 and bias.size == weight.shape[0]))
    if not ok:
        raise ValueError(
            "small_gemm takes numpy arrays: float32 x [k, in], a C-contiguous float32 or float16 weight [out, in] "
            f"and a float32 bias [out] or None, got x {_describe(x)}, weight {_describe(weight)}, "
            f"bias {_describe(bias)}"
        )
    x = np.ascontiguousarray(x)
    bias = None if bias is None else np.ascontiguousarray(bias)
    k, n_in = x.shape
    n_out = weight.shape[0]
    y = np.empty((k, n_out), dtype=np.float32)
    fn = lib.specwise_small_gemm_f16 if weight.dtype == np.float16 else lib.specwise_small_gemm
    status = fn(
        x.ctypes.data,
        weight.ctypes.data,
        None if bias is None else bias.ctypes.data,
        y.ctypes.data,
        k,
        n_in,
        n_out,
        threads or get_num_threads(),
    )
    if status != 0:  # SW_EISA: the path was lowered since the check above
        raise RuntimeError(f"small_gemm is unavailable: {_below_avx2()}")
    return y


def _describe(a) -> str:
    if a is None:
        return "None"
    if isinstance(a, np.ndarray):
        return f"{a.shape} {a.dtype}" + ("" if a.flags.c_contiguous else " (not C-contiguous)")
    return f"a {type(a).__module__}.{type(a).__name__} (pass a numpy array: tensor.numpy())"


def _floats(a, name: str, size: int | None = None) -> int:
    """The address of a C-contiguous float32 numpy array (of at least ``size`` floats when given)."""
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
        raise ValueError(f"{name} must be a C-contiguous float32 numpy array, got {_describe(a)}")
    if size is not None and a.size < size:
        raise ValueError(f"{name} holds {a.size} floats, fewer than the {size} needed")
    return a.ctypes.data


def _below_avx2() -> str:
    return "the instruction path in use is below AVX2 (the float kernels have AVX2 code only)"


class LayerKernel:
    """Llama-family decoder layers run by ``specwise_llama_layers`` (``llama.c``) on up to ``MAX_ROWS`` rows.

    Holds the structs of the call (``specwise.h``: the shape and the weights' tables, filled once; the rows, work
    buffers and run options, whose fields each call sets), the weights (numpy arrays, kept alive: the kernel reads
    them by address), the scratch space and the attention-score buffer; built by :func:`layer_kernel`. The product
    weights are float32, or float16 (a drafter's copies); norms, biases, caches, rotary tables and x are float32.
    """

    MAX_ROWS = 32

    def __init__(self, lib, shape: tuple[int, int, int, int, int], eps: float, weights: list[list], half: bool):
        from specwise.models.kernels.abi import FLayers, FRows, QRun, QShape, QWork, pointer_to

        self._lib = lib
        self._shape = shape  # hidden, heads, kv_heads, head_dim, intermediate
        self._weights = weights  # per kind, per layer: kept alive, the kernel reads them by address
        n_layers = len(weights[0])
        # one table of addresses per kind (a bias table of all None is passed as NULL: no layer has one)
        self._tables = [
            None
            if all(t is None for t in items)
            else (ctypes.c_void_p * n_layers)(*[0 if t is None else t.ctypes.data for t in items])
            for items in weights
        ]
        tables = [None if t is None else ctypes.addressof(t) for t in self._tables]
        self._dims = QShape(n_layers, *shape, eps)
        self._layers = FLayers(n_layers, *tables, int(half))
        size = lib.specwise_qllama_scratch_floats(ctypes.byref(self._dims), self.MAX_ROWS)  # the same layout
        if size < 0:
            raise ValueError(f"the float32 layer kernel does not take the shape {shape}")
        self._scratch = np.empty(int(size), dtype=np.float32)
        self._scores = np.empty(0, dtype=np.float32)
        self._rows = FRows()
        self._work = QWork(self._scratch.ctypes.data, int(size), None, 0)
        self._run = QRun(1, 0)  # MODE_EXACT
        self._addresses = [pointer_to(s) for s in (self._dims, self._layers, self._rows, self._work, self._run)]
        self._cache_floats = n_layers * shape[2] * shape[3]  # per position of the caches

    def run(
        self,
        x: np.ndarray,
        start: int,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        capacity: int,
        cos: np.ndarray,
        sin: np.ndarray,
        threads: int | None = None,
    ) -> None:
        """All layers on x ``[k, hidden]`` (float32, C-contiguous, updated in place) at positions ``start ..``;
        writes the caches ``[layers, kv_heads, capacity, head_dim]`` (float32, C-contiguous). cos and sin:
        ``[positions, head_dim]`` float32 tables (any shape of that many floats). threads: None for
        :func:`specwise.models.threads.get_num_threads`."""
        k = x.shape[0]
        heads, head_dim = self._shape[1], self._shape[3]
        cache = self._cache_floats * capacity
        x_ptr = _floats(x, "x", k * self._shape[0])
        k_ptr, v_ptr = _floats(k_cache, "k_cache"), _floats(v_cache, "v_cache")
        cos_ptr, sin_ptr = _floats(cos, "cos"), _floats(sin, "sin")
        if k_cache.size < cache or v_cache.size < cache or cos.size != sin.size:
            raise ValueError(
                f"the layer kernel's caches hold {k_cache.size} and {v_cache.size} floats and its rotary tables "
                f"{cos.size} and {sin.size}: {capacity} positions need {cache} floats each, tables alike"
            )
        need = heads * k * (start + k)
        if self._scores.size < need:
            self._scores = np.empty(max(need, 2 * self._scores.size), dtype=np.float32)
            self._work.scores, self._work.scores_floats = self._scores.ctypes.data, self._scores.size
        rows = self._rows
        rows.x, rows.x_floats, rows.rows, rows.start = x_ptr, x.size, k, start
        rows.k_cache, rows.v_cache, rows.cap = k_ptr, v_ptr, capacity
        rows.cos, rows.sin, rows.table_rows = cos_ptr, sin_ptr, cos.size // head_dim
        self._run.threads = threads or get_num_threads()
        status = self._lib.specwise_llama_layers(*self._addresses)
        if status == _EISA:
            raise RuntimeError(f"the native layer kernel is unavailable: {_below_avx2()}")
        if status != 0:
            from specwise.models.kernels.layers import _LAYER_ERRORS

            reason = _LAYER_ERRORS.get(status, f"its call ({status})")
            raise RuntimeError(f"the native layer kernel refused {reason} (status {status})")


def layer_kernel(
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    eps: float,
    *,
    attn_norm: list[np.ndarray],
    qkv: list[np.ndarray],
    qkv_bias: list[np.ndarray | None],
    o: list[np.ndarray],
    o_bias: list[np.ndarray | None],
    mlp_norm: list[np.ndarray],
    gate_up: list[np.ndarray],
    down: list[np.ndarray],
) -> LayerKernel | None:
    """A :class:`LayerKernel` over per-layer weight lists of numpy arrays (biases may be None), or None where it
    cannot serve them: kernels unavailable, head_dim > 512, heads not a multiple of kv_heads, or weights that are
    not numpy arrays, of other dtypes (products float32 or float16, all alike; norms and biases float32) or not
    C-contiguous."""
    lib = _load()
    if lib is None or not _float_kernels_run() or head_dim > 512 or heads % kv_heads:
        return None
    products = [*qkv, *o, *gate_up, *down]
    floats = [*attn_norm, *mlp_norm, *(b for b in (*qkv_bias, *o_bias) if b is not None)]
    if not all(isinstance(t, np.ndarray) and t.flags.c_contiguous for t in (*products, *floats)):
        return None
    dtype = products[0].dtype
    ok = dtype in (np.float32, np.float16) and all(w.dtype == dtype for w in products)
    if not ok or not all(t.dtype == np.float32 for t in floats):
        return None
    weights = [attn_norm, qkv, qkv_bias, o, o_bias, mlp_norm, gate_up, down]
    shape = (hidden, heads, kv_heads, head_dim, intermediate)
    return LayerKernel(lib, shape, eps, weights, half=dtype == np.float16)
