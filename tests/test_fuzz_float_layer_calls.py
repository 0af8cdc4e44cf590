"""The float32 layer kernel's entry point (``specwise_llama_layers``) called with structs that do not fit: a work
buffer too small for the call, a count out of range, positions outside the caches or the rotary tables, a missing
pointer. Each is refused with its status of ``specwise.h`` before anything is written (x and the caches keep their
bytes), and none crashes.

The call is made as the package makes it (the structs a native model's layer kernel fills), with buffers of the
exact sizes the call needs (numpy arrays), then one field is set wrong at a time. The model is the float32 native
model (the hf extra: skipped without it).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from conftest import needs_hf, tiny_llama
from specwise.models import kernels

needs_hf()  # the whole module: the structs are a float32 native model's
if not kernels.small_gemm_available():
    pytest.skip(f"the float kernels are unavailable: {kernels.kernel_error()}", allow_module_level=True)

from struct_calls import assert_refused_unwritten, copy_struct, edited, pointers, same_bytes  # noqa: E402

from specwise.models.kernels.layers import FRows, QWork, addr  # noqa: E402
from specwise.models.native import NativeModel  # noqa: E402

OK, EHEAD, EFIT, EWORK, EBUFFER = 0, 1, 5, 6, 7  # specwise.h's statuses
MAX_ROWS = 1024  # specwise.h's QL_MAX_ROWS
START, K, CAP = 5, 3, 12


@pytest.fixture(scope="module")
def model():
    m = NativeModel(tiny_llama(seed=5), capacity=CAP)
    m.set_gemm(default="kernel")
    assert m._fused is not None  # the float32 layer kernel serves it
    m.forward(np.array([1, 5, 7, 9, 11]))  # START positions cached
    return m


class Call:
    """One pass of the model's layer kernel over K rows at START, its shape and weights copied from the kernel's
    structs; ``status(**fields)`` calls the entry point with fields of the copies set wrong."""

    def __init__(self, model: NativeModel) -> None:
        kernel = model._fused
        self.lib = kernel._lib
        self.k_cache, self.v_cache = model.k_cache.numpy().copy(), model.v_cache.numpy().copy()
        self.x = np.random.default_rng(1).standard_normal((K, model.hidden), dtype=np.float32)
        self.cos, self.sin = model._cos[: START + K].numpy().copy(), model._sin[: START + K].numpy().copy()
        self.shape, self.layers = copy_struct(kernel._dims), copy_struct(kernel._layers)
        self.rows = FRows(
            self.x.ctypes.data, self.x.size, K, START, self.k_cache.ctypes.data, self.v_cache.ctypes.data, CAP,
            self.cos.ctypes.data, self.sin.ctypes.data, START + K,
        )  # fmt: skip
        scratch = int(self.lib.specwise_qllama_scratch_floats(addr(self.shape), K))
        self.scratch = np.zeros(scratch, dtype=np.float32)
        self.scores = np.zeros(model.n_heads * K * (START + K), dtype=np.float32)
        self.work = QWork(self.scratch.ctypes.data, scratch, self.scores.ctypes.data, self.scores.size)
        self.run = copy_struct(kernel._run)
        self.run.threads = 1

    def snapshot(self) -> list[np.ndarray]:
        return [a.copy() for a in (self.x, self.k_cache, self.v_cache)]

    def status(self, **fields) -> int:
        """The status with ``fields`` (``struct__field`` = value, or ``struct`` = None for a NULL pointer) set on
        copies of the call's structs."""
        order = ("shape", "layers", "rows", "work", "run")
        structs = edited({name: getattr(self, name) for name in order}, fields)
        return self.lib.specwise_llama_layers(*pointers(structs, order))


CASES = {
    "scratch one float short": ({"work__scratch_floats": lambda c: c.work.scratch_floats - 1}, EWORK),
    "scores one float short": ({"work__scores_floats": lambda c: c.work.scores_floats - 1}, EWORK),
    "negative scratch size": ({"work__scratch_floats": -1}, EWORK),
    "x one row short": ({"rows__x_floats": lambda c: c.x.shape[1] * (K - 1)}, EBUFFER),
    "rotary tables one row short": ({"rows__table_rows": START + K - 1}, EBUFFER),
    "the last row past the caches": ({"rows__cap": START + K - 1}, EFIT),
    "a start past the caches": ({"rows__start": CAP}, EFIT),
    "a negative start": ({"rows__start": -1}, EFIT),
    "a start that wraps start + rows": ({"rows__start": (1 << 63) - 2}, EFIT),
    "no capacity": ({"rows__cap": 0}, EFIT),
    "a capacity past 2^30": ({"rows__cap": (1 << 30) + 1}, EFIT),
    "a capacity truncated to the real one by an int": ({"rows__cap": (1 << 32) + CAP}, EFIT),
    "negative row count": ({"rows__rows": -1}, EFIT),
    "more rows than a call takes": ({"rows__rows": MAX_ROWS + 1}, EFIT),
    "a row count past int": ({"rows__rows": (1 << 32) + K}, EFIT),
    "zero layers": ({"shape__layers": 0}, EFIT),
    "more layers than weights": ({"shape__layers": 3}, EFIT),
    "weight tables of another length": ({"layers__entries": 1}, EFIT),
    "a half that is not 0 or 1": ({"layers__half": 2}, EFIT),
    "a hidden width past 2^30": ({"shape__hidden": 1 << 40}, EFIT),
    "a hidden width that is truncated to the real one by an int": ({"shape__hidden": (1 << 32) + 32}, EFIT),
    "an intermediate width past 2^30 / 2": ({"shape__inter": (1 << 29) + 1}, EFIT),
    "no key-value heads": ({"shape__kv_heads": 0}, EFIT),
    "heads not in whole groups": ({"shape__kv_heads": 3}, EFIT),
    "(head, row) pairs past int": (
        {"shape__heads": 1 << 28, "shape__kv_heads": 1 << 26, "shape__head_dim": 2, "rows__rows": 8, "rows__start": 0},
        EFIT,  # 2^31 pairs; else x is refused as too short (EBUFFER)
    ),
    "an odd head width": ({"shape__head_dim": 7}, EFIT),
    "a head width over 512": ({"shape__head_dim": 514}, EHEAD),
    "no threads": ({"run__threads": 0}, EFIT),
    "threads past int": ({"run__threads": 1 << 33}, EFIT),
    "a mode other than exact": ({"run__mode": 1}, EFIT),
    "no shape": ({"shape": None}, EFIT),
    "no weights": ({"layers": None}, EFIT),
    "no rows": ({"rows": None}, EFIT),
    "no work buffers": ({"work": None}, EFIT),
    "no run options": ({"run": None}, EFIT),
    "no x": ({"rows__x": None}, EFIT),
    "no key cache": ({"rows__k_cache": None}, EFIT),
    "no value cache": ({"rows__v_cache": None}, EFIT),
    "no cos table": ({"rows__cos": None}, EFIT),
    "no sin table": ({"rows__sin": None}, EFIT),
    "no scratch": ({"work__scratch": None}, EFIT),
    "no scores": ({"work__scores": None}, EFIT),
    "no attention norms": ({"layers__attn_norm": None}, EFIT),
    "no fused qkv weights": ({"layers__qkv_w": None}, EFIT),
    "no output weights": ({"layers__o_w": None}, EFIT),
    "no feed-forward norms": ({"layers__mlp_norm": None}, EFIT),
    "no gate/up weights": ({"layers__gate_up_w": None}, EFIT),
    "no down weights": ({"layers__down_w": None}, EFIT),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_call_that_does_not_fit_is_refused_before_anything_is_written(model, case):
    call = Call(model)
    fields, expected = CASES[case]
    before = call.snapshot()
    assert_refused_unwritten(call, expected, **{key: v(call) if callable(v) else v for key, v in fields.items()})
    assert call.status() == OK  # the same call with the right fields runs
    assert not same_bytes(before, call.snapshot())


def test_a_layer_without_one_of_its_weights_is_refused(model):
    call = Call(model)
    before = call.snapshot()
    table = (ctypes.c_void_p * 2)(*ctypes.cast(call.layers.down_w, ctypes.POINTER(ctypes.c_void_p))[:2])
    table[1] = None  # the second layer's down weights missing
    assert call.status(layers__down_w=ctypes.addressof(table)) == EFIT
    assert same_bytes(before, call.snapshot())
    assert call.status(rows__rows=0) == OK  # no rows: nothing to do, nothing written
    assert same_bytes(before, call.snapshot())


def test_the_structs_run_the_same_layers_as_the_model(model):
    """The call built here from the kernel's structs computes what the model's own pass does, bit for bit."""
    call = Call(model)
    x = call.x.copy()
    assert call.status() == OK
    other = model.sequence()
    other.copy_prefix(model, START)
    kernel = other._fused
    caches = other.k_cache.numpy(), other.v_cache.numpy()
    kernel.run(x, START, *caches, other._capacity, other._cos.numpy(), other._sin.numpy())
    assert x.tobytes() == call.x.tobytes()


def test_the_layer_kernel_refuses_caches_smaller_than_their_capacity(model):
    kernel = model._fused
    x = np.zeros((1, model.hidden), dtype=np.float32)
    with pytest.raises(ValueError, match="caches hold"):
        kernel.run(x, 0, model.k_cache[:1].numpy(), model.v_cache.numpy(), model._capacity, *_tables(model))


def _tables(model: NativeModel) -> tuple[np.ndarray, np.ndarray]:
    return model._cos.numpy(), model._sin.numpy()
