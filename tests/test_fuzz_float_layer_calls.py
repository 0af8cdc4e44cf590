"""The one layer kernel (``specwise_qllama_rows``) over float rows (the float32 models' weights: KIND_ROWS qmats)
called with structs that do not fit: a work buffer too small for the call, a count out of range, positions outside
the caches or the rotary tables, a missing pointer, a float matrix of another shape, of an unknown element width or
without its rows. Each is refused with its status of ``specwise.h`` before anything is written (x and the caches keep
their bytes), and none crashes.

The call is made as the package makes it (the structs a float layer kernel fills: ``kernels.layer_kernel``, which the
float32 native model and the head drafter use), with buffers of the exact sizes the call needs (numpy arrays), then
one field is set wrong at a time. No torch: the weights are numpy arrays.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from specwise.models import kernels

if not kernels.small_gemm_available():
    pytest.skip(f"the native kernels are unavailable: {kernels.kernel_error()}", allow_module_level=True)

from struct_calls import assert_refused_unwritten, copy_struct, edited, pointers, same_bytes  # noqa: E402

from specwise.models.kernels.abi import QMat, QRows, QRun, QWork  # noqa: E402
from specwise.models.kernels.layers import addr, inverse_frequencies, rotary_tables  # noqa: E402

OK, EHEAD, EFIT, EWORK, EBUFFER = 0, 1, 5, 6, 7  # specwise.h's statuses
MAX_ROWS = 1024  # specwise.h's QL_MAX_ROWS
START, K, CAP = 5, 3, 12
LAYERS, HIDDEN, HEADS, KV, HEAD_DIM, INTER = 2, 32, 4, 2, 8, 48


def weights(dtype=np.float32) -> dict:
    rng = np.random.default_rng(4)

    def mat(*shape):
        return (0.2 * rng.standard_normal(shape, dtype=np.float32)).astype(dtype)

    def vec(n):
        return 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)

    qkv = (HEADS + 2 * KV) * HEAD_DIM
    return dict(
        attn_norm=[vec(HIDDEN) for _ in range(LAYERS)],
        qkv=[mat(qkv, HIDDEN) for _ in range(LAYERS)],
        qkv_bias=[vec(qkv) for _ in range(LAYERS)],
        o=[mat(HIDDEN, HEADS * HEAD_DIM) for _ in range(LAYERS)],
        o_bias=[vec(HIDDEN) for _ in range(LAYERS)],
        mlp_norm=[vec(HIDDEN) for _ in range(LAYERS)],
        gate_up=[mat(2 * INTER, HIDDEN) for _ in range(LAYERS)],
        down=[mat(HIDDEN, INTER) for _ in range(LAYERS)],
    )


@pytest.fixture(scope="module", params=["float32", "float16"])
def kernel(request):
    k = kernels.layer_kernel(HIDDEN, HEADS, KV, HEAD_DIM, INTER, 1e-5, **weights(np.dtype(request.param)))
    assert k is not None
    return k


class Call:
    """One pass of the kernel's stack over K rows at START, its shape and weights copied from the stack's structs;
    ``status(**fields)`` calls the entry point with fields of the copies set wrong."""

    def __init__(self, kernel) -> None:
        stack = kernel._stack
        self.stack, self.lib = stack, stack._lib
        rng = np.random.default_rng(1)
        self.k_cache = rng.standard_normal((LAYERS, KV, CAP, HEAD_DIM), dtype=np.float32)
        self.v_cache = rng.standard_normal((LAYERS, KV, CAP, HEAD_DIM), dtype=np.float32)
        self.x = rng.standard_normal((K, HIDDEN), dtype=np.float32)
        self.cos, self.sin = rotary_tables(inverse_frequencies(HEAD_DIM, 10000.0), START + K)
        self.k_rows = (ctypes.c_void_p * K)(*[self.k_cache.ctypes.data] * K)
        self.v_rows = (ctypes.c_void_p * K)(*[self.v_cache.ctypes.data] * K)
        self.caps = (ctypes.c_int64 * K)(*[CAP] * K)
        self.pos = (ctypes.c_int64 * K)(*range(START, START + K))
        self.shape, self.layers = copy_struct(stack.shape), copy_struct(stack.weights)
        self.rows = QRows(
            self.x.ctypes.data, self.x.size, K, addr(self.k_rows), addr(self.v_rows), addr(self.caps),
            addr(self.pos), self.cos.ctypes.data, self.sin.ctypes.data, None, None, START + K, 0,
        )  # fmt: skip
        scratch = int(self.lib.specwise_qllama_scratch_floats(addr(self.shape), K))
        self.scratch = np.zeros(scratch, dtype=np.float32)
        self.scores = np.zeros(HEADS * K * (START + K), dtype=np.float32)
        self.work = QWork(self.scratch.ctypes.data, scratch, self.scores.ctypes.data, self.scores.size)
        self.run = QRun(1, 0)

    def snapshot(self) -> list[np.ndarray]:
        return [a.copy() for a in (self.x, self.k_cache, self.v_cache)]

    def status(self, **fields) -> int:
        """The status with ``fields`` (``struct__field`` = value, or ``struct`` = None for a NULL pointer) set on
        copies of the call's structs."""
        order = ("shape", "layers", "rows", "work", "run")
        structs = edited({name: getattr(self, name) for name in order}, fields)
        return self.lib.specwise_qllama_rows(*pointers(structs, order))

    def with_matrix(self, index: int, **values) -> int:
        """The status with matrix ``index`` of the weights (7 per layer: q, k, v, o, gate, up, down) changed."""
        table = (QMat * (7 * LAYERS))(*self.layers.weights[: 7 * LAYERS])
        for name, value in values.items():
            setattr(table[index], name, value)
        self._table = table  # alive through the call
        return self.status(layers__weights=table)


CASES = {
    "scratch one float short": ({"work__scratch_floats": lambda c: c.work.scratch_floats - 1}, EWORK),
    "scores one float short": ({"work__scores_floats": lambda c: c.work.scores_floats - 1}, EWORK),
    "x one row short": ({"rows__x_floats": HIDDEN * (K - 1)}, EBUFFER),
    "rotary tables one row short": ({"rows__table_rows": START + K - 1}, EBUFFER),
    "more rows than a call takes": ({"rows__rows": MAX_ROWS + 1}, EFIT),
    "zero layers": ({"shape__layers": 0}, EFIT),
    "more layers than weights": ({"shape__layers": 3}, EFIT),
    "a hidden width past 2^30": ({"shape__hidden": 1 << 40}, EFIT),
    "heads not in whole groups": ({"shape__kv_heads": 3}, EFIT),
    "an odd head width": ({"shape__head_dim": 7}, EFIT),
    "a head width over 512": ({"shape__head_dim": 514}, EHEAD),
    "no threads": ({"run__threads": 0}, EFIT),
    "no weights": ({"layers": None}, EFIT),
    "no weight table": ({"layers__weights": None}, EFIT),
    "no attention norms": ({"layers__attn_norm": None}, EFIT),
    "no feed-forward norms": ({"layers__mlp_norm": None}, EFIT),
    "no x": ({"rows__x": None}, EFIT),
    "no scratch": ({"work__scratch": None}, EFIT),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_call_that_does_not_fit_is_refused_before_anything_is_written(kernel, case):
    call = Call(kernel)
    fields, expected = CASES[case]
    before = call.snapshot()
    assert_refused_unwritten(call, expected, **{key: v(call) if callable(v) else v for key, v in fields.items()})
    assert call.status() == OK  # the same call with the right fields runs
    assert not same_bytes(before, call.snapshot())


# a float matrix that is not one the layer can read: (which of a layer's seven, its fields)
MATRIX_CASES = {
    "q without its rows": (0, {"q": None}),
    "k with another input width": (1, {"in_": HIDDEN + 1}),
    "v with another output count": (2, {"out": KV * HEAD_DIM - 1}),
    "o of an unknown element width": (3, {"half": 2}),
    "gate of an unknown kind": (4, {"kind": 6}),
    "down with no rows": (6, {"out": 0}),
}


@pytest.mark.parametrize("case", sorted(MATRIX_CASES))
def test_a_float_matrix_that_does_not_fit_is_refused(kernel, case):
    call = Call(kernel)
    index, values = MATRIX_CASES[case]
    before = call.snapshot()
    assert call.with_matrix(7 + index, **values) == EFIT  # the second layer's
    assert same_bytes(before, call.snapshot())
    assert call.with_matrix(7 + index) == OK


def test_the_structs_run_the_same_layers_as_the_kernel(kernel):
    """The call built here from the stack's structs computes what the kernel's own run does, bit for bit."""
    call = Call(kernel)
    x, k_cache, v_cache = call.x.copy(), call.k_cache.copy(), call.v_cache.copy()
    assert call.status() == OK
    kernel.run(x, START, k_cache, v_cache, CAP, call.cos, call.sin, threads=1)
    assert x.tobytes() == call.x.tobytes()
    assert k_cache.tobytes() == call.k_cache.tobytes() and v_cache.tobytes() == call.v_cache.tobytes()


def test_the_layer_kernel_refuses_caches_smaller_than_their_capacity(kernel):
    call = Call(kernel)
    with pytest.raises(ValueError, match="caches hold"):
        kernel.run(call.x, 0, call.k_cache[:1], call.v_cache, CAP, call.cos, call.sin)
