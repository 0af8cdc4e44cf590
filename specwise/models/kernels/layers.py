"""The decoder layers' native calls (``qllama.c``: one layer for every native model, its matrices quantized
:class:`~specwise.models.kernels.quant.QTensor` or float :class:`~specwise.models.kernels.quant.FloatRows`):
:class:`DecoderStack`, which fills the layer kernels' argument structs (their ctypes mirrors are ``abi.py``'s).

What is fixed for a model (its shape and weights) is filled once when the stack is built; a call sets only its
rows' fields, so a pass's interpreted cost does not grow with the number of arguments. Every count and size is
64-bit, and the C side checks them against each other before it touches memory (the statuses in ``specwise.h``).
Buffers are numpy arrays; :func:`rotary_tables` makes the tables the layers rotate with.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import numpy as np

from specwise.models.kernels.abi import (
    QArch,
    QHead,
    QLayers,
    QLogits,
    QModel,
    QPass,
    QRows,
    QRun,
    QShape,
    QStep,
    QWork,
    pointer_to,
)
from specwise.models.kernels.quant import MAX_ROWS, QMat, QTensor, _lib, _mode_id
from specwise.models.threads import get_num_threads

__all__ = [
    "DecoderStack",
    "LayerVariant",
    "QArch",
    "QShape",
    "QLayers",
    "QRows",
    "QWork",
    "QRun",
    "QModel",
    "QPass",
    "QHead",
    "QStep",
    "QLogits",
    "layer_status",
    "rotary_tables",
    "inverse_frequencies",
    "sin_cos",
]


def inverse_frequencies(head_dim: int, base: float) -> np.ndarray:
    """Rotary inverse frequencies ``base^(-2i / head_dim)`` for i < head_dim / 2: computed in float64, rounded to
    float32 (as llama.cpp and transformers keep them)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    return (1.0 / (float(base) ** exponent)).astype(np.float32)


def _pi_half_parts(bits: int = 26, parts: int = 4) -> tuple[float, ...]:
    """pi / 2 as a sum of doubles: ``parts`` of ``bits`` significant bits each (so that k * part is exact for
    k < 2^(53 - bits)), then the rest rounded."""
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        ctx.prec = 80
        rest = Decimal("1.57079632679489661923132169163975144209858469968755291048747229615390820314310449931")
        out = []
        for _ in range(parts):
            mantissa, exponent = math.frexp(float(rest))
            chunk = math.ldexp(math.floor(mantissa * 2**bits), exponent - bits)
            out.append(chunk)
            rest -= Decimal(chunk)
        out.append(float(rest))
    return tuple(out)


_PI_HALF = _pi_half_parts()
_TWO_OVER_PI = 0.63661977236758134308
_SIN = tuple((-1) ** i / math.factorial(2 * i + 1) for i in range(1, 9))  # x^3 .. x^17
_COS = tuple((-1) ** i / math.factorial(2 * i) for i in range(1, 10))  # x^2 .. x^18


def sin_cos(x: np.ndarray, block: int = 1 << 14) -> tuple[np.ndarray, np.ndarray]:
    """sin and cos of float64 angles ``x`` (|x| < 2^26), to a float64 ulp or two, from additions, multiplications
    and rounding only: the same bits on every machine (the math library's sin and cos differ between builds and
    instruction sets). Rounded to float32 they are the correctly rounded values but for angles within a few
    float64 ulps of a float32 rounding boundary, alike everywhere. Computed ``block`` values at a time (in cache)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size and not np.abs(x).max() < 2.0**26:
        raise ValueError("sin_cos takes angles below 2^26 in magnitude")
    flat = x.reshape(-1)
    sin, cos = np.empty_like(flat), np.empty_like(flat)
    for lo in range(0, flat.size, block):
        xs = flat[lo : lo + block]
        k = np.rint(xs * _TWO_OVER_PI)  # the nearest multiple of pi / 2
        r = xs - k * _PI_HALF[0]  # exact: k * part has at most 53 bits, and x is close to it
        for part in _PI_HALF[1:]:
            r -= k * part
        z = r * r
        p = np.full_like(z, _SIN[-1])
        for c in reversed(_SIN[:-1]):
            p *= z
            p += c
        s = r * z
        s *= p
        s += r  # r + r z (c3 + z (c5 + ...))
        p.fill(_COS[-1])
        for c in reversed(_COS[:-1]):
            p *= z
            p += c
        p *= z
        p += 1.0  # 1 + z (c2 + z (c4 + ...))
        quadrant = k.astype(np.int64) & 3
        odd = (quadrant & 1).astype(bool)
        out_sin, out_cos = sin[lo : lo + block], cos[lo : lo + block]
        np.copyto(out_sin, np.where(odd, p, s))
        np.copyto(out_cos, np.where(odd, s, p))
        np.negative(out_sin, out=out_sin, where=quadrant >= 2)
        np.negative(out_cos, out=out_cos, where=(quadrant == 1) | (quadrant == 2))
    return sin.reshape(x.shape), cos.reshape(x.shape)


def rotary_tables(inv_freq: np.ndarray, positions, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables ``[n, head_dim]`` (float32, C-contiguous) for rotate-half rotary embeddings at
    ``positions`` (an int n: positions 0 .. n - 1, or an array of them), with the rotate-half sign folded into the
    sine table: rotate_half(x) = cat(-x2, x1), so sin's first half is negated.

    The angles are position * frequency in float32 (as transformers forms them); their sine and cosine are
    :func:`sin_cos`'s rounded to float32: the same tables on every machine."""
    inv = np.asarray(inv_freq, dtype=np.float32).reshape(-1)
    pos = np.arange(positions) if isinstance(positions, (int, np.integer)) else np.asarray(positions).reshape(-1)
    angles = np.outer(pos.astype(np.float32), inv)  # [n, head_dim / 2], products rounded to float32
    sin, cos = sin_cos(angles.astype(np.float64))
    sin, cos = sin.astype(np.float32), cos.astype(np.float32)
    if scale != 1.0:
        cos *= np.float32(scale)
        sin *= np.float32(scale)
    return np.concatenate([cos, cos], axis=1), np.concatenate([-sin, sin], axis=1)


_LAYER_ERRORS = {
    1: "a head width over 512",
    2: "a row id outside the embedding",
    3: "NaN logits",
    4: "an output layer the kernels cannot read",
    5: "a shape, weight or row position that does not fit the others",
    6: "a scratch or scores buffer smaller than the call needs",
    7: "an x, features, logits buffer or rotary table smaller than the call needs",
}


def layer_status(status: int) -> None:
    """Raise for a status of the layer kernel (specwise_qllama_rows / _forward / specwise_head_step)."""
    if status != 0:
        raise ValueError(f"the native layer kernel refused {_LAYER_ERRORS.get(status, f'its call ({status})')}")


def addr(obj):
    """What the kernels take for a ctypes object: a typed pointer to a struct (or to the first of an array of
    structs), as their struct arguments and struct-pointer fields are declared (``abi.py``), and the address of any
    other object (an array of data pointers, of int64 or of floats). The object must stay alive meanwhile."""
    if isinstance(obj, ctypes.Structure) or (
        isinstance(obj, ctypes.Array) and issubclass(obj._type_, ctypes.Structure)
    ):
        return pointer_to(obj)
    return ctypes.addressof(obj)


@dataclass
class LayerVariant:
    """What a family's decoder layers do beyond Llama's (quant.h's ``qarch``); every list has one entry per layer.

    q_norms, k_norms: RMS norms of each query / key head ``[head_dim]`` before rotary (Qwen3, Gemma 3);
    post_attn_norms, post_mlp_norms: RMS norms of the attention's and the feed-forward's outputs before their
    residuals (Gemma 3); windows: each layer's sliding window (0: attends to every position), whose layers use the
    rotary tables passed as ``local``; attn_scale: the scores' scale (0: 1 / sqrt(head_dim)); embed_scale: the
    embedding rows' factor (0: none); gelu: GeGLU with tanh GELU instead of SwiGLU."""

    q_norms: list[np.ndarray] | None = None
    k_norms: list[np.ndarray] | None = None
    post_attn_norms: list[np.ndarray] | None = None
    post_mlp_norms: list[np.ndarray] | None = None
    windows: list[int] | None = None
    attn_scale: float = 0.0
    embed_scale: float = 0.0
    gelu: bool = False

    def struct(self, n_layers: int) -> tuple[QArch, list]:
        """The C struct, and the arrays its pointers point into (to be kept alive beside it)."""
        keep: list = []

        def pointers(arrays):
            if arrays is None:
                return None
            if len(arrays) != n_layers:
                raise ValueError(f"a layer variant needs one entry per layer ({n_layers}), got {len(arrays)}")
            array = (ctypes.c_void_p * n_layers)(*[_address(a, "a variant's norm") for a in arrays])
            keep.append(array)
            return ctypes.cast(array, ctypes.c_void_p)

        windows = None
        if self.windows is not None:
            array = (ctypes.c_int * n_layers)(*self.windows)
            keep.append(array)
            windows = ctypes.cast(array, ctypes.c_void_p)
        arch = QArch(
            pointers(self.q_norms), pointers(self.k_norms), pointers(self.post_attn_norms),
            pointers(self.post_mlp_norms), windows, self.attn_scale, self.embed_scale, int(self.gelu),
        )  # fmt: skip
        return arch, keep


def _address(a: np.ndarray, what: str, dtype=np.float32) -> int:
    """The address of a C-contiguous numpy array of ``dtype`` (what the kernels read or write by address)."""
    if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous:
        got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"{what} must be a C-contiguous {np.dtype(dtype).name} numpy array, got {got}")
    return a.ctypes.data


def model_struct(embed: QTensor, final_norm: np.ndarray, final_eps: float, head) -> tuple[QModel, tuple]:
    """The ``qmodel`` of a model's embedding, final norm (float32) and output layer (a one-element QMat array), and
    what its pointers point into (to be kept alive beside it)."""
    struct = QModel(addr(embed.struct), _address(final_norm, "the final norm"), final_eps, addr(head))
    return struct, (embed, final_norm, head)


# the attention's arithmetic, by qrun's ATTN_* (specwise.h)
ATTENTIONS = ("float32", "bfloat16")


class DecoderStack:
    """Llama-family decoder layers, run by one native call per pass (``qllama.c``).

    layers: per layer the seven weights q, k, v, o, gate, up, down (QTensors, or FloatRows: anything with a
    ``qmat`` in ``.struct`` and ``.shape`` ``(out, in)``); attn_norms, mlp_norms: float32 ``[hidden]``
    per layer; qkv_biases: per layer float32 ``[q + k + v outputs]`` or None (numpy arrays). The caller owns the
    caches and the rotary tables; :meth:`run` takes, per row, the sequence's caches and the row's position, so one
    pass can score several sequences' rows (a batch) and a row's result is the same in any pass. The caches are
    float32, or float16 (``run`` sees their dtype): keys and values rounded to float16 as they are written, as
    llama.cpp keeps them by default, which halves what attention reads.

    The shape and weights structs (``shape``, ``weights``) are filled here once; each call fills the rows struct
    and the per-row arrays it points to (room for ``MAX_ROWS``), and the work and run structs where they change.
    """

    def __init__(
        self,
        layers,
        attn_norms,
        mlp_norms,
        qkv_biases,
        n_heads: int,
        n_kv: int,
        head_dim: int,
        eps: float,
        variant: LayerVariant | None = None,
        o_biases=None,
        attention: str = "float32",
    ):
        """variant: what the layers do beyond Llama's (None: the Llama layer); o_biases: per layer float32
        ``[hidden]`` or None, the output product's bias (None: no layer has one); attention: ``float32`` (the
        default), or ``bfloat16``: the attention's products in bfloat16, summed in float32 (AVX512_BF16 only:
        refused elsewhere)."""
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        self._lib = _lib()
        self.variant = variant
        self._arch, self._arch_keep = variant.struct(len(layers)) if variant is not None else (None, [])
        self.n_layers = len(layers)
        self.hidden = layers[0][0].shape[1]
        self.intermediate = layers[0][4].shape[0]
        self.n_heads, self.n_kv, self.head_dim, self.eps = n_heads, n_kv, head_dim, float(eps)
        self._keep = (layers, attn_norms, mlp_norms, qkv_biases, o_biases)  # the pointers below point into these
        flat = [w.struct for layer in layers for w in layer]
        self._weights = (QMat * len(flat))(*flat)
        self._attn = (ctypes.c_void_p * len(attn_norms))(*[_address(t, "a norm") for t in attn_norms])
        self._mlp = (ctypes.c_void_p * len(mlp_norms))(*[_address(t, "a norm") for t in mlp_norms])
        biases = [0 if b is None else _address(b, "a bias") for b in qkv_biases]
        self._bias = (ctypes.c_void_p * len(qkv_biases))(*biases)
        self._o_bias = None
        if o_biases is not None and any(b is not None for b in o_biases):
            o_table = [0 if b is None else _address(b, "a bias") for b in o_biases]
            self._o_bias = (ctypes.c_void_p * len(o_biases))(*o_table)
        self.shape = QShape(self.n_layers, self.hidden, n_heads, n_kv, head_dim, self.intermediate, self.eps)
        self.weights = QLayers(
            addr(self._attn), addr(self._weights), len(flat), addr(self._bias),
            None if self._o_bias is None else addr(self._o_bias), addr(self._mlp),
            None if self._arch is None else addr(self._arch),
        )  # fmt: skip
        size = self._lib.specwise_qllama_scratch_floats(addr(self.shape), MAX_ROWS)
        if size < 0:
            raise ValueError(f"a decoder stack of shape {self.describe()} is not one the native kernels take")
        self._scratch = np.empty(int(size), dtype=np.float32)
        self._scores = np.empty(0, dtype=np.float32)
        self.work = QWork(self._scratch.ctypes.data, self._scratch.size, None, 0)
        if attention == "bfloat16" and not self._lib.specwise_attention_bf16_supported():
            raise ValueError(
                "the bfloat16 attention needs a CPU with AVX512_BF16 and the avx512 path in use "
                "(this CPU or path has not): use attention='float32'"
            )
        self.attention = attention
        self.options = QRun(1, 0, ATTENTIONS.index(attention))
        # the rows of a call: their caches, capacities and positions (room for MAX_ROWS)
        self._k_rows, self._v_rows = (ctypes.c_void_p * MAX_ROWS)(), (ctypes.c_void_p * MAX_ROWS)()
        self._caps, self._pos = (ctypes.c_int64 * MAX_ROWS)(), (ctypes.c_int64 * MAX_ROWS)()
        self.rows = QRows()
        self.rows.k_rows, self.rows.v_rows = addr(self._k_rows), addr(self._v_rows)
        self.rows.cap, self.rows.pos = addr(self._caps), addr(self._pos)
        self.pass_ = QPass()
        self._held = (None, None, None, 0)  # the caches and x the row arrays hold, for how many rows
        self._tables = (None, None)  # the rotary tables the rows struct points to (cos, local)
        self._addrs = tuple(addr(s) for s in (self.shape, self.weights, self.rows, self.work, self.options))
        self._pass_addr = addr(self.pass_)

    def describe(self) -> str:
        return (
            f"{self.n_layers} layers, hidden {self.hidden}, {self.n_heads} heads of {self.head_dim} "
            f"({self.n_kv} key-value), intermediate {self.intermediate}"
        )

    def forward_one(
        self,
        x: np.ndarray,
        ids: np.ndarray,
        cache: tuple[np.ndarray, np.ndarray],
        start: int,
        cos: np.ndarray,
        sin: np.ndarray,
        mode: str,
        model: QModel,
        keep: int,
        features: int | None,
        features_floats: int,
        logits: np.ndarray,
        local: tuple[np.ndarray, np.ndarray] | None = None,
        threads: int | None = None,
    ) -> None:
        """One sequence's whole pass in one native call (``specwise_qllama_forward``): the embedding rows of
        ``ids`` (int64, C-contiguous, at most ``MAX_ROWS``), the layers at positions ``start ..`` of ``cache``, the
        final norm (of every row into the float32 buffer at address ``features``, ``features_floats`` floats,
        when given, else of the last ``keep``), and the output layer of ``model`` (its ``qmodel``, see
        :func:`model_struct`) into ``logits`` ``[keep, out]`` (float32, C-contiguous). x: float32 scratch
        ``[>= k, hidden]``. The numbers are those of :meth:`run` followed by the same norm and output layer (what a
        batch's pass computes). The arrays are the caller's (a model's own buffers, checked when it made them)."""
        k = ids.size
        k_cache, v_cache = cache
        rows = self.rows
        if k > MAX_ROWS:
            raise ValueError(f"a pass of one call takes at most {MAX_ROWS} rows, got {k}")
        if ids.dtype != np.int64 or not ids.flags.c_contiguous or logits.dtype != np.float32:
            raise ValueError("forward_one takes C-contiguous int64 ids and float32 logits")
        if k_cache is not self._held[0] or v_cache is not self._held[1] or x is not self._held[2] or k > self._held[3]:
            # the rows' caches and x, as the last call of this sequence left them (filled again only when they change)
            half = _cache_half(k_cache, v_cache)
            self._k_rows[:k] = [k_cache.ctypes.data] * k
            self._v_rows[:k] = [v_cache.ctypes.data] * k
            self._caps[:k] = [k_cache.shape[2]] * k
            rows.x, rows.x_floats, rows.kv_half = _address(x, "x"), x.size, half
            self._held = (k_cache, v_cache, x, k)
        if k == 1:
            self._pos[0] = start
        else:
            self._pos[:k] = range(start, start + k)
        rows.rows = k
        if cos is not self._tables[0] or local is not self._tables[1]:
            self._set_tables(cos, sin, local)
        if self.n_heads * k * (start + k) > self.work.scores_floats:
            self._grow_scores(self.n_heads * k * (start + k))
        self.options.threads, self.options.mode = threads or get_num_threads(), _mode_id(mode)
        p = self.pass_
        p.ids, p.keep, p.features, p.features_floats = ids.ctypes.data, keep, features, features_floats
        p.logits, p.logits_floats = logits.ctypes.data, logits.size
        status = self._lib.specwise_qllama_forward(*self._addrs, ctypes.byref(model), self._pass_addr)
        if status == 2:
            raise IndexError(f"row ids outside the embedding (its {model.embed.contents.out} rows)")
        layer_status(status)

    def run_sequence(
        self,
        x: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        capacity: int,
        start: int,
        cos: np.ndarray,
        sin: np.ndarray,
        mode: str,
        threads: int | None = None,
    ) -> None:
        """The layers on one sequence's rows (``specwise_qllama_rows``): x ``[k, hidden]`` (float32, C-contiguous,
        k <= ``MAX_ROWS``, updated in place) at positions ``start ..`` of the float32 caches ``[layers, n_kv,
        capacity, head_dim]`` (C-contiguous, of at least that many floats; the kernel checks every size). cos, sin:
        float32 tables of ``[positions, head_dim]`` floats (any shape). The numbers are :meth:`run`'s with those
        caches and positions."""
        k = x.shape[0]
        rows = self.rows
        if k > MAX_ROWS:
            raise ValueError(f"a pass of one call takes at most {MAX_ROWS} rows, got {k}")
        held = self._held
        if k_cache is not held[0] or v_cache is not held[1] or capacity != held[2] or k > held[3]:
            self._k_rows[:k] = [_address(k_cache, "k_cache")] * k
            self._v_rows[:k] = [_address(v_cache, "v_cache")] * k
            self._caps[:k] = [capacity] * k
            rows.kv_half = 0
            self._held = (k_cache, v_cache, capacity, k)  # (forward_one keeps x third: the two never share a stack)
        if k == 1:
            self._pos[0] = start
        else:
            self._pos[:k] = range(start, start + k)
        rows.x, rows.x_floats, rows.rows = _address(x, "x"), x.size, k
        if cos is not self._tables[0] or self._tables[1] is not None:
            self._set_tables(cos, sin, None)
        if self.n_heads * k * (start + k) > self.work.scores_floats:
            self._grow_scores(self.n_heads * k * (start + k))
        self.options.threads, self.options.mode = threads or get_num_threads(), _mode_id(mode)
        layer_status(self._lib.specwise_qllama_rows(*self._addrs))

    def _set_tables(self, cos: np.ndarray, sin: np.ndarray, local) -> None:
        """The rows' rotary tables (float32 ``[n, head_dim]``; local: the windowed layers' own, of as many rows, or
        None)."""
        rows = self.rows
        rows.cos, rows.sin, rows.table_rows = _address(cos, "cos"), _address(sin, "sin"), cos.size // self.head_dim
        if local is None:
            rows.cos_local = rows.sin_local = None
        else:
            rows.cos_local, rows.sin_local = _address(local[0], "local cos"), _address(local[1], "local sin")
        self._tables = (cos, local)

    def _grow_scores(self, need: int) -> None:
        """The scores' buffer grown to ``need`` floats at least."""
        self._scores = np.empty(max(need, 2 * self._scores.size), dtype=np.float32)
        self.work.scores, self.work.scores_floats = self._scores.ctypes.data, self._scores.size

    def run(
        self,
        x: np.ndarray,
        caches: list[tuple[np.ndarray, np.ndarray]],
        positions: list[int],
        cos: np.ndarray,
        sin: np.ndarray,
        mode: str,
        threads: int | None = None,
        local: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """The layers on x ``[k, hidden]`` (float32, C-contiguous, updated in place).

        caches: per row, (k_cache, v_cache) ``[layers, n_kv, capacity, head_dim]`` of the row's sequence (C-contiguous,
        all float32 or all float16); positions: per row, its position there (a sequence's rows in order; its earlier
        positions cached or among the rows before). cos, sin: float32 ``[>= max position + 1, head_dim]``.
        """
        k = x.shape[0]
        if len(caches) != k or len(positions) != k:
            raise ValueError(f"{k} rows need {k} caches and positions, got {len(caches)} and {len(positions)}")
        halves = {_cache_half(*c) for c in {id(c): c for c in caches}.values()}  # each sequence's pair checked once
        if len(halves) > 1:
            raise ValueError("the caches of one pass must all be float32 or all float16")
        if (
            not isinstance(x, np.ndarray)
            or x.dtype != np.float32
            or not x.flags.c_contiguous
            or x.size != k * self.hidden
        ):
            raise ValueError(f"x must be a C-contiguous float32 [{k}, {self.hidden}] array")
        self.options.threads, self.options.mode = threads or get_num_threads(), _mode_id(mode)
        rows = self.rows
        for lo in range(0, k, MAX_ROWS):
            hi = min(k, lo + MAX_ROWS)
            n = hi - lo
            self._k_rows[:n] = [caches[r][0].ctypes.data for r in range(lo, hi)]
            self._v_rows[:n] = [caches[r][1].ctypes.data for r in range(lo, hi)]
            self._caps[:n] = [caches[r][0].shape[2] for r in range(lo, hi)]
            self._pos[:n] = positions[lo:hi]
            rows.x, rows.x_floats, rows.rows = x[lo:hi].ctypes.data, n * self.hidden, n
            rows.kv_half = halves == {True}
            self._held = (None, None, None, 0)  # the arrays no longer hold one sequence's rows
            self._set_tables(cos, sin, local)
            need = self.n_heads * n * (max(positions[lo:hi]) + 1)
            if need > self.work.scores_floats:
                self._grow_scores(need)
            layer_status(self._lib.specwise_qllama_rows(*self._addrs))


def _cache_half(k_cache: np.ndarray, v_cache: np.ndarray) -> bool:
    """Whether a sequence's caches are float16 (else float32); both C-contiguous numpy arrays of one dtype, which
    the kernels index as ``[layers, n_kv, capacity, head_dim]``."""
    for c in (k_cache, v_cache):
        if not isinstance(c, np.ndarray) or c.dtype not in (np.float32, np.float16) or not c.flags.c_contiguous:
            got = f"{c.dtype} {c.shape}" if isinstance(c, np.ndarray) else type(c).__name__
            raise ValueError(f"a KV cache must be a C-contiguous float32 or float16 numpy array, got {got}")
    if k_cache.dtype != v_cache.dtype or k_cache.shape != v_cache.shape or k_cache.ndim != 4:
        raise ValueError(
            f"a sequence's key and value caches differ: {k_cache.shape} {k_cache.dtype}, "
            f"{v_cache.shape} {v_cache.dtype}"
        )
    return k_cache.dtype == np.float16
