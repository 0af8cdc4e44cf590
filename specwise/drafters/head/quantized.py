"""The head drafter's products on the quantized kernels: its weights in Q8_0, activations in 8 bits.

A drafted token of the head reads its layer, its input projection and the output layer over the draft vocabulary
(8,192 rows for the shipped head): 18 MB in float16, 9.5 MB in Q8_0. On a CPU bound by memory that halves the
cost of a drafted token. A drafter need not be exact (the rejection rule keeps the output exact, verification uses
the q a draft was drawn from), so the head's own numerics are free to change; its acceptance is measured
(``docs/DISTILL.md``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from specwise.models.kernels.layers import DecoderStack, QHead, QLogits, QRun, QStep, QWork, addr
from specwise.models.kernels.library import native_library
from specwise.models.kernels.quant import QTensor, quantized_available
from specwise.models.threads import get_num_threads

__all__ = ["QuantizedHeadLayer", "HeadEnds", "quantize_rows", "head_quantization_available"]

GGML_Q8_0 = 8


def head_quantization_available() -> bool:
    try:
        import gguf.quants  # noqa: F401
    except ImportError:
        return False
    return quantized_available()


def quantize_rows(weight, name: str = "", shape: tuple[int, int] | None = None) -> QTensor:
    """A float matrix ``[out, in]`` (in a multiple of 32) as a Q8_0 QTensor, quantized a slice of rows at a time
    (no float32 copy of the whole matrix). weight: a numpy array (float16 or float32), or a function
    ``(first, count) -> rows`` (float arrays) with ``shape`` given."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if callable(weight):
        block, (out, n_in) = weight, shape
    else:
        if not isinstance(weight, np.ndarray) or weight.ndim != 2 or weight.dtype.kind != "f":
            got = f"{weight.dtype} {weight.shape}" if isinstance(weight, np.ndarray) else type(weight).__name__
            raise ValueError(f"{name or 'a weight'}: quantize_rows takes a 2-D float numpy array, got {got}")
        out, n_in = weight.shape

        def block(first: int, count: int) -> np.ndarray:
            return weight[first : first + count]

    def rows(first: int, count: int) -> np.ndarray:
        pieces = []
        for lo in range(first, first + count, 256):  # numpy's quantization makes several copies of its input
            w = np.ascontiguousarray(block(lo, min(256, first + count - lo)), dtype=np.float32)
            if w.shape != (min(256, first + count - lo), n_in):
                raise ValueError(f"{name or 'a weight'}: rows of shape {w.shape}, expected [..., {n_in}]")
            pieces.append(np.ascontiguousarray(quantize(w, GGMLQuantizationType.Q8_0)).reshape(-1))
        return np.concatenate(pieces)

    return QTensor(GGML_Q8_0, rows, out, n_in, name=name)


@dataclass
class HeadEnds:
    """The head's weights around its layer as the native step takes them (``qhead``), and the tensors its pointers
    point into (kept alive beside it)."""

    struct: QHead
    keep: tuple


def _vector(value, n: int, what: str) -> np.ndarray:
    """A float vector as the native code reads it: a C-contiguous float32 copy of ``[n]`` values."""
    value = np.ascontiguousarray(value, dtype=np.float32)
    if value.shape != (n,):
        raise ValueError(f"the head's {what} must hold {n} values, got shape {list(value.shape)}")
    return value


def _floats(a, shape: tuple | None = None) -> bool:
    """Whether ``a`` is a C-contiguous float32 numpy array (of ``shape`` when given)."""
    ok = isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous
    return ok and (shape is None or a.shape == shape)


class QuantizedHeadLayer:
    """One Llama decoder layer (no biases) run by the quantized layer kernel, with the caller's KV cache.

    Weights are numpy arrays (float16 or float32; ``qkv`` ``[(heads + 2 kv_heads) * head_dim, hidden]``, ``o``,
    ``gate_up`` ``[2 intermediate, hidden]``, ``down``), quantized to Q8_0 here; the norms float vectors."""

    STEP_ROWS = 64  # positions per native step

    def __init__(
        self,
        hidden: int,
        n_heads: int,
        n_kv: int,
        head_dim: int,
        intermediate: int,
        eps: float,
        attn_norm: np.ndarray,
        qkv: np.ndarray,
        o: np.ndarray,
        mlp_norm: np.ndarray,
        gate_up: np.ndarray,
        down: np.ndarray,
    ) -> None:
        self.hidden, self.n_heads, self.n_kv, self.head_dim = hidden, n_heads, n_kv, head_dim
        self.intermediate, self.eps = intermediate, float(eps)
        q_rows, kv_rows = n_heads * head_dim, n_kv * head_dim
        self.weights = [
            quantize_rows(qkv[:q_rows], "head.q"),
            quantize_rows(qkv[q_rows : q_rows + kv_rows], "head.k"),
            quantize_rows(qkv[q_rows + kv_rows :], "head.v"),
            quantize_rows(o, "head.o"),
            quantize_rows(gate_up[:intermediate], "head.gate"),
            quantize_rows(gate_up[intermediate:], "head.up"),
            quantize_rows(down, "head.down"),
        ]
        self._stack = DecoderStack(
            [self.weights],
            [_vector(attn_norm, hidden, "attention norm")],
            [_vector(mlp_norm, hidden, "MLP norm")],
            [None],
            n_heads,
            n_kv,
            head_dim,
            eps,
        )
        # the native step's buffers: its fused input and x for STEP_ROWS rows, then the layer kernel's scratch
        # (which, once the layer has run, also holds a copy of the logits)
        self._lib = native_library()  # loaded: the stack needs it
        self._layer_floats = int(self._lib.specwise_qllama_scratch_floats(addr(self._stack.shape), self.STEP_ROWS))
        self._inputs_floats = 3 * self.STEP_ROWS * hidden
        self._scratch = np.empty(0, dtype=np.float32)
        self._scores = np.empty(0, dtype=np.float32)
        self._best, self._top = (ctypes.c_int64 * 1)(), (ctypes.c_float * 1)()
        # the structs of a step (specwise.h), filled once; a call sets the fields that change
        self._work, self._run, self._step, self._out = QWork(), QRun(1, 1), QStep(), QLogits()  # mode 1: q8
        self._out.best = addr(self._best)
        self._addrs = (addr(self._stack.shape), addr(self._stack.weights))
        self._work_addrs = (addr(self._step), addr(self._work), addr(self._run), addr(self._out))

    def ends(self, norms: tuple[np.ndarray, np.ndarray, np.ndarray], fc: QTensor) -> HeadEnds:
        """The head's weights around this layer (the feature, embedding and out norms, C-contiguous float32
        ``[hidden]`` numpy arrays, and ``fc`` ``[hidden, 2 hidden]``) as :meth:`step` takes them: built once per
        drafter."""
        if fc.shape != (self.hidden, 2 * self.hidden):
            raise ValueError(f"the head's fc is {list(fc.shape)}, expected [{self.hidden}, {2 * self.hidden}]")
        for t in norms:
            if not _floats(t, (self.hidden,)):
                raise ValueError(f"the head's norms must be C-contiguous float32 numpy arrays [{self.hidden}]")
        return HeadEnds(QHead(norms[0].ctypes.data, norms[1].ctypes.data, addr(fc.struct), norms[2].ctypes.data),
                        (norms, fc))  # fmt: skip

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.weights)

    def _check_step(
        self,
        features: np.ndarray,
        emb: np.ndarray,
        start: int,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
    ) -> None:
        """The native step's buffers against the layer's shape (the C code takes bare pointers and sizes): numpy
        arrays, features and emb ``[n, hidden]``, C-contiguous float32 caches ``[kv_heads, capacity, head_dim]``
        with room for positions ``start .. start + n - 1``, and C-contiguous float32 rotary tables
        ``[>= start + n, head_dim]``."""
        arrays = (features, emb, k_cache, v_cache, cos, sin)
        if not all(isinstance(a, np.ndarray) for a in arrays):
            got = ", ".join(type(a).__name__ for a in arrays)
            raise ValueError(f"the head's native step takes numpy arrays, got {got}")
        shape, cache, hd = features.shape, k_cache.shape, self.head_dim
        n, cap = shape[0] if shape else 0, cache[1] if len(cache) == 3 else -1
        ok = len(shape) == 2 and shape == emb.shape and shape[1] == self.hidden and n > 0
        ok = ok and cache == v_cache.shape == (self.n_kv, cap, hd) and cos.shape == sin.shape
        ok = ok and all(_floats(a) for a in (k_cache, v_cache, cos, sin))
        ok = ok and cos.size == cos.shape[0] * hd and cos.shape[0] >= start + n
        if not ok or not 0 <= start <= cap - n:
            raise ValueError(
                f"the head's native step got features {list(features.shape)}, embeddings {list(emb.shape)}, a cache "
                f"{list(k_cache.shape)} at position {start}: expected [n, {self.hidden}] and [{self.n_kv}, >= "
                f"{start} + n, {hd}] (C-contiguous float32)"
            )

    def step(
        self,
        features: np.ndarray,
        emb: np.ndarray,
        start: int,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        ends: HeadEnds,
        output=None,
        confidence: bool = False,
    ) -> tuple[np.ndarray, int | None, float | None, np.ndarray | None]:
        """The head's whole step in native calls of up to ``STEP_ROWS`` positions (``specwise_head_step``): the
        fused input of ``features`` and ``emb`` ``[n, hidden]`` (float32) under the feature and embedding norms,
        ``fc`` (both in ``ends``, see :meth:`ends`), this layer at positions ``start ..`` of the caches
        ``[kv_heads, capacity, head_dim]``, the out norm. Returns (predicted features ``[n, hidden]``, then for the
        last row with ``output`` (a one-element QMat array): the argmax over the output layer, its softmax
        probability when ``confidence``, and the logits). Arrays are numpy (features and emb any float dtype,
        converted to C-contiguous float32 where they are not)."""
        self._check_step(features, emb, start, k_cache, v_cache, cos, sin)
        n, hidden = features.shape
        pred = np.empty((n, hidden), dtype=np.float32)
        work, step, out = self._work, self._step, self._out
        need = self.n_heads * min(n, self.STEP_ROWS) * (start + n)
        if self._scores.size < need:
            self._scores = np.empty(max(need, 4096), dtype=np.float32)
            work.scores, work.scores_floats = self._scores.ctypes.data, self._scores.size
        size = self._inputs_floats + max(self._layer_floats, output[0].out if output is not None else 0)
        if self._scratch.size < size:
            self._scratch = np.empty(size, dtype=np.float32)
            work.scratch, work.scratch_floats = self._scratch.ctypes.data, self._scratch.size
        features = np.ascontiguousarray(features, dtype=np.float32)
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        logits = None
        self._run.threads = get_num_threads()
        step.k_cache, step.v_cache, step.cap = k_cache.ctypes.data, v_cache.ctypes.data, k_cache.shape[1]
        step.cos, step.sin, step.table_rows = cos.ctypes.data, sin.ctypes.data, cos.shape[0]
        f_at, e_at, p_at, row = features.ctypes.data, emb.ctypes.data, pred.ctypes.data, 4 * hidden
        head = addr(ends.struct)
        for lo in range(0, n, self.STEP_ROWS):
            hi = min(n, lo + self.STEP_ROWS)
            last = hi == n and output is not None
            step.features, step.emb, step.pred = f_at + lo * row, e_at + lo * row, p_at + lo * row
            step.n, step.start = hi - lo, start + lo
            if last:
                logits = np.empty(output[0].out, dtype=np.float32)
                out.out_w, out.logits, out.logits_floats = addr(output), logits.ctypes.data, logits.size
                out.top_prob = addr(self._top) if confidence else None
            else:
                out.out_w = None
            status = self._lib.specwise_head_step(*self._addrs, head, *self._work_addrs)
            if status != 0:
                raise RuntimeError(f"the head's native step failed (status {status})")
        if output is None:
            return pred, None, None, None
        return pred, int(self._best[0]), float(self._top[0]) if confidence else None, logits
