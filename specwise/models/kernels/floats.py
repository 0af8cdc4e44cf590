"""The float32 models' native calls: ``small_gemm`` (a few rows by a float32 or float16 weight, read in place) and
``layer_kernel`` (the decoder layers of a Llama-family model on a few rows in one call), both on the library's one
layer kernel and products (``qllama.c``, ``smallgemm.c``) with the weights as float rows (:class:`FloatRows`). Every
binding takes and returns numpy arrays (C-contiguous, of the dtype it names; a torch caller passes
``tensor.numpy()``, a view of the same memory).
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from specwise.models.kernels.layers import DecoderStack
from specwise.models.kernels.library import _load, kernel_error
from specwise.models.kernels.quant import FloatRows
from specwise.models.threads import get_num_threads

__all__ = ["small_gemm", "small_gemm_available", "LayerKernel", "layer_kernel"]


def small_gemm_available() -> bool:
    """True when the native library is loaded (the float kernels run on every instruction path)."""
    return _load() is not None


def small_gemm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, threads: int | None = None
) -> np.ndarray:
    """``x @ weight.T (+ bias)``: x float32 ``[k, in]``, weight ``[out, in]`` C-contiguous float32 or float16 (read
    as float16, computed in float32: half the memory traffic, for drafters), bias float32 ``[out]`` or None; returns
    a new float32 ``[k, out]`` array. threads: None for :func:`specwise.models.threads.get_num_threads`."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"small_gemm is unavailable: {kernel_error()}")
    arrays = all(isinstance(a, np.ndarray) for a in (x, weight) + (() if bias is None else (bias,)))
    ok = arrays and x.ndim == 2 and weight.ndim == 2 and x.dtype == np.float32
    ok = ok and weight.dtype in (np.float32, np.float16) and weight.flags.c_contiguous
    ok = ok and weight.shape[1] == x.shape[1] and weight.shape[0] >= 1 and weight.shape[1] >= 1
    ok = ok and (bias is None or (bias.dtype == np.float32 and bias.size == weight.shape[0]))
    if not ok:
        raise ValueError(
            "small_gemm takes numpy arrays: float32 x [k, in], a C-contiguous float32 or float16 weight [out, in] "
            f"and a float32 bias [out] or None, got x {_describe(x)}, weight {_describe(weight)}, "
            f"bias {_describe(bias)}"
        )
    x = np.ascontiguousarray(x)
    bias = None if bias is None else np.ascontiguousarray(bias)
    y = np.empty((x.shape[0], weight.shape[0]), dtype=np.float32)
    if x.shape[0] == 0:
        return y
    status = lib.specwise_q_gemm(
        _float_rows(weight),
        1,
        x.ctypes.data,
        None if bias is None else bias.ctypes.data,
        y.ctypes.data,
        x.shape[0],
        0,  # MODE_EXACT (float rows are float32 products in any mode)
        threads or get_num_threads(),
    )
    if status != 0:
        raise RuntimeError(f"small_gemm failed (status {status}): a shape past the kernels' 2^30 rows or inputs")
    return y


_rows_of: dict[int, tuple] = {}  # id(weight) -> (a weak reference to it, its qmat by reference)


def _float_rows(weight: np.ndarray):
    """The qmat of a weight as float rows, by reference: made once per weight array (a model's weights are the same
    arrays at every call, and making the struct costs more than a small product's call)."""
    entry = _rows_of.get(id(weight))
    if entry is not None and entry[0]() is weight:
        return entry[1]
    matrix = FloatRows(weight)
    key = id(weight)
    ref = weakref.ref(weight, lambda _, key=key, cache=_rows_of: cache.pop(key, None))  # alive at shutdown too
    _rows_of[key] = (ref, ctypes.byref(matrix.struct))  # the struct only: the weight itself is not kept alive
    return _rows_of[key][1]


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


class LayerKernel:
    """Llama-family decoder layers on up to ``MAX_ROWS`` rows of one sequence, by the one layer kernel of the
    library (``specwise_qllama_rows``, ``qllama.c``), its matrices float rows; built by :func:`layer_kernel`.

    Holds a :class:`~specwise.models.kernels.layers.DecoderStack` over the weights (numpy arrays, kept alive: the
    kernel reads them by address): q, k and v are row ranges of the fused q/k/v weight, gate and up of the fused
    gate/up weight. The product weights are float32, or float16 (a drafter's copies); norms, biases, caches, rotary
    tables and x are float32.
    """

    MAX_ROWS = 32

    def __init__(self, shape: tuple[int, int, int, int, int], eps: float, weights: list[list]):
        hidden, heads, kv_heads, head_dim, inter = shape
        attn_norm, qkv, qkv_bias, o, o_bias, mlp_norm, gate_up, down = weights
        q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
        layers = [
            [
                FloatRows(qkv[i], 0, q_rows, "q"),
                FloatRows(qkv[i], q_rows, kv_rows, "k"),
                FloatRows(qkv[i], q_rows + kv_rows, kv_rows, "v"),
                FloatRows(o[i], name="o"),
                FloatRows(gate_up[i], 0, inter, "gate"),
                FloatRows(gate_up[i], inter, inter, "up"),
                FloatRows(down[i], name="down"),
            ]
            for i in range(len(qkv))
        ]
        self._shape = shape
        self._stack = DecoderStack(layers, attn_norm, mlp_norm, qkv_bias, heads, kv_heads, head_dim, eps,
                                   o_biases=o_bias)  # fmt: skip
        self._cache_floats = len(qkv) * kv_heads * head_dim  # per position of the caches

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
        cache = self._cache_floats * capacity
        _floats(x, "x", k * self._shape[0])
        for name, a in (("k_cache", k_cache), ("v_cache", v_cache), ("cos", cos), ("sin", sin)):
            _floats(a, name)
        if k_cache.size < cache or v_cache.size < cache or cos.size != sin.size:
            raise ValueError(
                f"the layer kernel's caches hold {k_cache.size} and {v_cache.size} floats and its rotary tables "
                f"{cos.size} and {sin.size}: {capacity} positions need {cache} floats each, tables alike"
            )
        self._stack.run_sequence(x, k_cache, v_cache, capacity, start, cos, sin, "exact", threads)


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
    cannot serve them: kernels unavailable, head_dim > 512 or odd, heads not a multiple of kv_heads, hidden below
    32, or weights that are not numpy arrays, of other dtypes (products float32 or float16, all alike; norms and
    biases float32) or not C-contiguous."""
    lib = _load()
    if lib is None or head_dim > 512 or head_dim % 2 or heads % kv_heads or hidden < 32:
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
    return LayerKernel(shape, eps, weights)
