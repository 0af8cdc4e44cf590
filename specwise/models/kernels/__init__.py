"""specwise's native kernels, compiled by ``pip install`` (``setup.py``) into one shared library loaded here.

``small_gemm`` multiplies a few rows by a large weight (decoding and verification); ``layer_kernel`` runs the
decoder layers of a Llama-family model on a few rows in one call (see ``llama.c``). Every kernel of the library runs
on one instruction path, chosen at run time by the library (AVX-512, AVX2 or portable: the best the CPU supports,
or the one :func:`specwise.models.kernels.quant.set_isa` sets); the float kernels have AVX2 code only and refuse
below that path, where everything falls back to torch. ``SPECWISE_NO_KERNELS=1`` disables them all;
``SPECWISE_NATIVE_LIB=path`` loads another build of them (the sanitizer build of ``make sanitize``).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from pathlib import Path

import torch

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


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    from specwise.models.kernels import quant

    quant.declare(lib)
    if not hasattr(lib, "specwise_small_gemm"):  # not x86-64: only the quantized kernels (portable path) exist
        return lib
    fn = lib.specwise_small_gemm
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    half = lib.specwise_small_gemm_f16
    half.restype = ctypes.c_int
    half.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    layers = lib.specwise_llama_layers  # (qshape *, flayers *, frows *, qwork *, qrun *): see layers.py
    layers.restype = ctypes.c_int
    layers.argtypes = [ctypes.c_void_p] * 5
    return lib


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
                _lib = _declare(ctypes.CDLL(str(path)))
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


def small_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` for float32 CPU tensors; x ``[k, in]``, weight ``[out, in]`` contiguous, float32
    or float16 (read as float16, computed in float32: half the memory traffic, for drafters)."""
    lib = _load()
    if lib is None or not _float_kernels_run():
        raise RuntimeError(f"small_gemm is unavailable: {_error or _below_avx2()}")
    x = x.contiguous()
    k, n_in = x.shape
    n_out = weight.shape[0]
    ok = x.dtype == torch.float32 and weight.dtype in (torch.float32, torch.float16)
    ok = ok and x.device.type == weight.device.type == "cpu" and (bias is None or bias.dtype == torch.float32)
    if not ok or not weight.is_contiguous() or weight.shape[1] != n_in or (bias is not None and bias.numel() != n_out):
        raise ValueError(
            f"small_gemm takes a float32 CPU tensor x [k, in] and a contiguous float32 or float16 weight [out, in], "
            f"got x {tuple(x.shape)} {x.dtype} {x.device}, weight {tuple(weight.shape)} {weight.dtype} {weight.device}"
        )
    y = torch.empty((k, n_out), dtype=torch.float32)
    fn = lib.specwise_small_gemm_f16 if weight.dtype == torch.float16 else lib.specwise_small_gemm
    status = fn(
        x.data_ptr(),
        weight.data_ptr(),
        bias.data_ptr() if bias is not None else None,
        y.data_ptr(),
        k,
        n_in,
        n_out,
        torch.get_num_threads(),
    )
    if status != 0:  # SW_EISA: the path was lowered since the check above
        raise RuntimeError(f"small_gemm is unavailable: {_below_avx2()}")
    return y


def _below_avx2() -> str:
    return "the instruction path in use is below AVX2 (the float kernels have AVX2 code only)"


class LayerKernel:
    """Llama-family decoder layers run by ``specwise_llama_layers`` (``llama.c``) on up to ``MAX_ROWS`` rows.

    Holds the structs of the call (``specwise.h``: the shape and the weights' tables, filled once; the rows, work
    buffers and run options, whose fields each call sets), the weights (kept alive: the kernel reads them by
    address), the scratch space and the attention-score buffer; built by :func:`layer_kernel`. The product weights
    are float32, or float16 (a drafter's copies); norms, biases, caches, rotary tables and x are float32.
    """

    MAX_ROWS = 32

    def __init__(self, lib, shape: tuple[int, int, int, int, int], eps: float, weights: list[list], half: bool):
        from specwise.models.kernels.layers import FLayers, FRows, QRun, QShape, QWork

        self._lib = lib
        self._shape = shape  # hidden, heads, kv_heads, head_dim, intermediate
        self._weights = weights  # per kind, per layer: kept alive, the kernel reads them by address
        n_layers = len(weights[0])
        # one table of addresses per kind (a bias table of all None is passed as NULL: no layer has one)
        self._tables = [
            None
            if all(t is None for t in items)
            else (ctypes.c_void_p * n_layers)(*[0 if t is None else t.data_ptr() for t in items])
            for items in weights
        ]
        tables = [None if t is None else ctypes.addressof(t) for t in self._tables]
        self._dims = QShape(n_layers, *shape, eps)
        self._layers = FLayers(n_layers, *tables, int(half))
        size = lib.specwise_qllama_scratch_floats(ctypes.byref(self._dims), self.MAX_ROWS)  # the same layout
        if size < 0:
            raise ValueError(f"the float32 layer kernel does not take the shape {shape}")
        self._scratch = torch.empty(int(size), dtype=torch.float32)
        self._scores = torch.empty(0, dtype=torch.float32)
        self._rows = FRows()
        self._work = QWork(self._scratch.data_ptr(), int(size), None, 0)
        self._run = QRun(1, 0)  # MODE_EXACT
        self._addresses = [ctypes.addressof(s) for s in (self._dims, self._layers, self._rows, self._work, self._run)]
        self._cache_floats = n_layers * shape[2] * shape[3]  # per position of the caches

    def run(
        self,
        x: torch.Tensor,
        start: int,
        k_cache,
        v_cache,
        capacity: int,
        cos,
        sin,
    ) -> None:
        """All layers on x ``[k, hidden]`` (contiguous, updated in place) at positions ``start ..``; writes the
        caches ``[layers, kv_heads, capacity, head_dim]``. cos and sin: ``[positions, head_dim]`` tables (any
        shape of that many floats)."""
        k = x.shape[0]
        heads, head_dim = self._shape[1], self._shape[3]
        cache = self._cache_floats * capacity
        if k_cache.numel() < cache or v_cache.numel() < cache or cos.numel() != sin.numel():
            raise ValueError(
                f"the layer kernel's caches hold {k_cache.numel()} and {v_cache.numel()} floats and its rotary tables "
                f"{cos.numel()} and {sin.numel()}: {capacity} positions need {cache} floats each, tables alike"
            )
        need = heads * k * (start + k)
        if self._scores.numel() < need:
            self._scores = torch.empty(max(need, 2 * self._scores.numel()), dtype=torch.float32)
            self._work.scores, self._work.scores_floats = self._scores.data_ptr(), self._scores.numel()
        rows = self._rows
        rows.x, rows.x_floats, rows.rows, rows.start = x.data_ptr(), x.numel(), k, start
        rows.k_cache, rows.v_cache, rows.cap = k_cache.data_ptr(), v_cache.data_ptr(), capacity
        rows.cos, rows.sin, rows.table_rows = cos.data_ptr(), sin.data_ptr(), cos.numel() // head_dim
        self._run.threads = torch.get_num_threads()
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
    attn_norm: list,
    qkv: list,
    qkv_bias: list,
    o: list,
    o_bias: list,
    mlp_norm: list,
    gate_up: list,
    down: list,
) -> LayerKernel | None:
    """A :class:`LayerKernel` over per-layer weight lists (biases may be None), or None where it cannot serve
    them: kernels unavailable, head_dim > 512, heads not a multiple of kv_heads, or weights of other dtypes or not
    contiguous."""
    lib = _load()
    if lib is None or not _float_kernels_run() or head_dim > 512 or heads % kv_heads:
        return None
    products = [*qkv, *o, *gate_up, *down]
    dtype = products[0].dtype
    floats = [*attn_norm, *mlp_norm, *(b for b in (*qkv_bias, *o_bias) if b is not None)]
    ok = dtype in (torch.float32, torch.float16) and all(w.dtype == dtype for w in products)
    ok = ok and all(t.dtype == torch.float32 for t in floats)
    ok = ok and all(t.device.type == "cpu" and t.is_contiguous() for t in (*products, *floats))
    if not ok:
        return None
    weights = [attn_norm, qkv, qkv_bias, o, o_bias, mlp_norm, gate_up, down]
    shape = (hidden, heads, kv_heads, head_dim, intermediate)
    return LayerKernel(lib, shape, eps, weights, half=dtype == torch.float16)
