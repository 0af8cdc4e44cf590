"""The layer kernels' entry points (``specwise_qllama_rows``, ``specwise_qllama_forward``, ``specwise_head_step``,
``specwise_qllama_scratch_floats``) called with structs that do not fit: a work buffer too small for the call, a
count out of range, a position outside its cache or rotary tables, a missing pointer. Each is refused with its
status of ``specwise.h`` before anything is written (x, the caches and the outputs keep their bytes), and none
crashes; ``make sanitize`` runs this file under AddressSanitizer like the other fuzz tests.

The calls are made as the package makes them (the structs a model or a head layer fills), then one field is set
wrong at a time.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from gguf_raw import HIDDEN, tiny_model

from specwise.models.kernels import quant

if not quant.quantized_available():
    pytest.skip("the native quantized kernels are not built", allow_module_level=True)

from struct_calls import assert_refused_unwritten, copy_struct, edited, pointers, same_bytes  # noqa: E402

from specwise.models.kernels.layers import (  # noqa: E402
    QPass,
    QRows,
    QRun,
    QShape,
    QWork,
    addr,
    inverse_frequencies,
    rotary_tables,
)
from specwise.models.quantized import QuantizedModel  # noqa: E402

OK, EHEAD, EIDS, EFIT, EWORK, EBUFFER = 0, 1, 2, 5, 6, 7  # specwise.h's statuses
MAX_ROWS = 1024  # specwise.h's QL_MAX_ROWS


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "base.gguf"
    path.write_bytes(tiny_model().bytes())
    m = QuantizedModel(path, precision="q8", capacity=16, huge_pages=False)
    m.forward([1, 5, 7])  # fills the stack's structs as a pass leaves them
    return m


class Call:
    """One pass of the model's stack, its structs copied from what the last forward filled, with buffers of the
    exact sizes the call needs; ``status(**fields)`` calls an entry point with fields of the copies set wrong."""

    def __init__(self, model: QuantizedModel, k: int = 2) -> None:
        stack = model._stack
        self.lib = model._lib
        self.model = model
        start = model.length
        self.k_cache, self.v_cache = model.k_cache, model.v_cache
        cap = self.k_cache.shape[2]
        cos, sin = model._tables(start + k)
        self.x = np.zeros((k, HIDDEN), dtype=np.float32)
        self.k_rows = (ctypes.c_void_p * k)(*[self.k_cache.ctypes.data] * k)
        self.v_rows = (ctypes.c_void_p * k)(*[self.v_cache.ctypes.data] * k)
        self.caps = (ctypes.c_int64 * k)(*[cap] * k)
        self.pos = (ctypes.c_int64 * k)(*range(start, start + k))
        self.shape, self.layers = copy_struct(stack.shape), copy_struct(stack.weights)
        self.rows = QRows(
            self.x.ctypes.data, self.x.size, k, addr(self.k_rows), addr(self.v_rows), addr(self.caps),
            addr(self.pos), cos.ctypes.data, sin.ctypes.data, None, None, start + k, 0,
        )  # fmt: skip
        scratch = int(self.lib.specwise_qllama_scratch_floats(addr(self.shape), k))
        self.scratch = np.zeros(scratch, dtype=np.float32)
        self.scores = np.zeros(stack.n_heads * k * (start + k), dtype=np.float32)
        self.work = QWork(self.scratch.ctypes.data, scratch, self.scores.ctypes.data, self.scores.size)
        self.run = QRun(1, 1)
        self.ids = np.array([3, 4][:k] + [5] * (k - 2), dtype=np.int64)
        self.logits = np.zeros((k, model.vocab_size), dtype=np.float32)
        self.features = np.zeros((k, HIDDEN), dtype=np.float32)
        self.pass_ = QPass(
            self.ids.ctypes.data, k, self.features.ctypes.data, self.features.size, self.logits.ctypes.data,
            self.logits.size,
        )  # fmt: skip
        self.ends = copy_struct(model._model_struct)

    def snapshot(self) -> list[np.ndarray]:
        return [a.copy() for a in (self.x, self.k_cache, self.v_cache, self.logits, self.features)]

    def status(self, entry: str, **fields) -> int:
        """The status of ``entry`` ("rows" or "forward") with ``fields`` (``struct__field`` = value, or
        ``struct`` = None for a NULL pointer) set on copies of the call's structs."""
        own = {name: getattr(self, name) for name in ("shape", "layers", "rows", "work", "run")}
        structs = edited(own | {"outs": self.pass_, "ends": self.ends}, fields)
        ptrs = pointers(structs, ("shape", "layers", "rows", "work", "run"))
        if entry == "rows":
            return self.lib.specwise_qllama_rows(*ptrs)
        return self.lib.specwise_qllama_forward(*ptrs, *pointers(structs, ("ends", "outs")))


# what each wrong field is refused with, by both entry points (rows and forward)
ROWS_CASES = {
    "scratch one float short": ({"work__scratch_floats": lambda n: n["scratch"] - 1}, EWORK),
    "scores one float short": ({"work__scores_floats": lambda n: n["scores"] - 1}, EWORK),
    "no scores": ({"work__scores_floats": 0}, EWORK),
    "negative scratch size": ({"work__scratch_floats": -1}, EWORK),
    "x one row short": ({"rows__x_floats": lambda n: HIDDEN * (n["k"] - 1)}, EBUFFER),
    "rotary tables one row short": ({"rows__table_rows": lambda n: n["start"] + n["k"] - 1}, EBUFFER),
    "negative row count": ({"rows__rows": -1}, EFIT),
    "more rows than a call takes": ({"rows__rows": MAX_ROWS + 1}, EFIT),
    "a row count past int": ({"rows__rows": (1 << 32) + 2}, EFIT),
    "zero layers": ({"shape__layers": 0}, EFIT),
    "more layers than weights": ({"shape__layers": 3}, EFIT),
    "a weight count that is not 7 per layer": ({"layers__n_weights": 13}, EFIT),
    "a hidden width past 2^30": ({"shape__hidden": 1 << 40}, EFIT),
    "a hidden width that is truncated to the real one by an int": ({"shape__hidden": (1 << 32) + HIDDEN}, EFIT),
    "no key-value heads": ({"shape__kv_heads": 0}, EFIT),
    "heads not in whole groups": ({"shape__kv_heads": 3}, EFIT),
    "an odd head width": ({"shape__head_dim": 15}, EFIT),
    "a head width over 512": ({"shape__head_dim": 514}, EHEAD),
    "an intermediate width the weights do not have": ({"shape__inter": 64}, EFIT),
    "no threads": ({"run__threads": 0}, EFIT),
    "threads past int": ({"run__threads": 1 << 33}, EFIT),
    "an unknown mode": ({"run__mode": 2}, EFIT),
    "a kv_half that is not 0 or 1": ({"rows__kv_half": 2}, EFIT),
    "no shape": ({"shape": None}, EFIT),
    "no weights": ({"layers": None}, EFIT),
    "no rows": ({"rows": None}, EFIT),
    "no work buffers": ({"work": None}, EFIT),
    "no run options": ({"run": None}, EFIT),
    "no x": ({"rows__x": None}, EFIT),
    "no positions": ({"rows__pos": None}, EFIT),
    "no scratch": ({"work__scratch": None}, EFIT),
    "no rotary table": ({"rows__sin": None}, EFIT),
    "a local cos table without its sin": ({"rows__cos_local": 1 << 20}, EFIT),
}


def _resolve(fields: dict, sizes: dict) -> dict:
    """The fields' values, those given as functions of the call's sizes computed."""
    return {key: v(sizes) if callable(v) else v for key, v in fields.items()}


@pytest.mark.parametrize("entry", ["rows", "forward"])
@pytest.mark.parametrize("case", sorted(ROWS_CASES))
def test_a_call_that_does_not_fit_is_refused_before_anything_is_written(model, entry, case):
    call = Call(model)
    fields, expected = ROWS_CASES[case]
    sizes = {"k": call.rows.rows, "start": model.length, "scratch": call.work.scratch_floats,
             "scores": call.work.scores_floats}  # fmt: skip
    assert_refused_unwritten(call, expected, entry, **_resolve(fields, sizes))
    assert call.status(entry) == OK  # the same call with the right fields runs


def test_positions_outside_their_cache_are_refused(model):
    call = Call(model)
    before = call.snapshot()
    cap = call.caps[0]
    for pos, caps in (([cap, cap + 1], [cap, cap]), ([-1, 0], [cap, cap]), ([0, 1], [0, cap]), ([1, 2], [1, cap]),
                      ([0, 1], [cap, 1 << 31])):  # fmt: skip
        call.pos[:] = pos
        call.caps[:] = caps
        for entry in ("rows", "forward"):
            assert call.status(entry) == EFIT, (pos, caps)
    call.k_rows[1] = None  # a row without its cache
    call.pos[:], call.caps[:] = [0, 1], [cap, cap]
    assert call.status("rows") == EFIT
    assert same_bytes(before, call.snapshot())


FORWARD_CASES = {
    "logits one float short": ({"outs__logits_floats": lambda n: n["logits"] - 1}, EBUFFER),
    "no logits": ({"outs__logits": None}, EBUFFER),
    "features one float short": ({"outs__features_floats": lambda n: n["features"] - 1}, EBUFFER),
    "keep past the rows": ({"outs__keep": lambda n: n["k"] + 1}, EFIT),
    "a negative keep": ({"outs__keep": -1}, EFIT),
    "no ids": ({"outs__ids": None}, EFIT),
    "no final norm": ({"ends__final_norm": None}, EFIT),
    "no embedding": ({"ends__embed": None}, EFIT),
    "no output layer": ({"ends__head": None}, 4),
    "no model": ({"ends": None}, EFIT),
    "no pass": ({"outs": None}, EFIT),
}


@pytest.mark.parametrize("case", sorted(FORWARD_CASES))
def test_a_forward_whose_outputs_do_not_fit_is_refused_before_anything_is_written(model, case):
    call = Call(model)
    fields, expected = FORWARD_CASES[case]
    fields = _resolve(fields, {"k": call.rows.rows, "logits": call.logits.size, "features": call.features.size})
    assert_refused_unwritten(call, expected, "forward", **fields)


def test_a_forward_with_an_id_outside_the_embedding_writes_nothing(model):
    call = Call(model)
    before = call.snapshot()
    call.ids[1] = model.embed.shape[0]
    assert call.status("forward") == EIDS
    call.ids[1] = -1
    assert call.status("forward") == EIDS
    assert same_bytes(before, call.snapshot())


def test_the_scratch_size_is_refused_for_a_shape_or_row_count_out_of_range():
    lib = quant._lib()
    shape = QShape(2, 64, 4, 2, 16, 128, 1e-5)
    per_row = 2 * 64 + (4 + 2 * 2) * 16 + 4 * 16 + 3 * 128
    assert lib.specwise_qllama_scratch_floats(addr(shape), 3) == 3 * per_row
    assert lib.specwise_qllama_scratch_floats(addr(shape), 0) == 0
    assert lib.specwise_qllama_scratch_floats(addr(shape), -1) == -1
    assert lib.specwise_qllama_scratch_floats(addr(shape), MAX_ROWS + 1) == -1
    assert lib.specwise_qllama_scratch_floats(None, 1) == -1
    for field, value in (("hidden", 0), ("heads", -4), ("kv_heads", 1 << 31), ("inter", 1 << 62)):
        bad = QShape.from_buffer_copy(shape)
        setattr(bad, field, value)
        assert lib.specwise_qllama_scratch_floats(addr(bad), 1) == -1, field


# ---- the head drafter's step -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def head():
    from specwise.drafters.head.quantized import QuantizedHeadLayer, head_quantization_available, quantize_rows

    if not head_quantization_available():
        pytest.skip("the head's quantization needs the gguf package")
    g = np.random.default_rng(0)
    h, heads, kv, hd, inter = 64, 2, 1, 32, 96

    def w(*shape):
        return (g.standard_normal(shape) * 0.1).astype(np.float32)

    layer = QuantizedHeadLayer(h, heads, kv, hd, inter, 1e-5, 1 + w(h), w((heads + 2 * kv) * hd, h), w(h, heads * hd),
                               1 + w(h), w(2 * inter, h), w(h, inter))  # fmt: skip
    norms = tuple(1 + w(h) for _ in range(3))
    fc = quantize_rows(w(h, 2 * h), "fc")
    output = quantize_rows(w(40, h), "out")
    return layer, layer.ends(norms, fc), (quant.QMat * 1)(output.struct), output  # the matrix kept alive


class HeadCall:
    """A head step at position 3 of a cache of 8 over 2 positions, filled by the layer's own step first."""

    def __init__(self, head, n: int = 2, start: int = 3, cap: int = 8) -> None:
        layer, self.ends, self.output, _ = head
        g = np.random.default_rng(1)
        self.layer = layer
        self.features = g.standard_normal((n, 64)).astype(np.float32)
        self.emb = g.standard_normal((n, 64)).astype(np.float32)
        self.k_cache, self.v_cache = np.zeros((1, cap, 32), np.float32), np.zeros((1, cap, 32), np.float32)
        self.cos, self.sin = rotary_tables(inverse_frequencies(32, 10000.0), cap)
        self.pred, best, top, self.logits = layer.step(
            self.features, self.emb, start, self.k_cache, self.v_cache, self.cos, self.sin, self.ends, self.output,
            True,
        )  # fmt: skip
        assert best is not None and 0 < top <= 1
        self.structs = {
            "step": copy_struct(layer._step), "work": copy_struct(layer._work), "run": copy_struct(layer._run),
            "out": copy_struct(layer._out), "head": copy_struct(self.ends.struct),
        }  # fmt: skip

    def snapshot(self) -> list[np.ndarray]:
        return [a.copy() for a in (self.k_cache, self.v_cache, self.pred, self.logits)]

    def status(self, **fields) -> int:
        own = self.structs | {"shape": self.layer._stack.shape, "layers": self.layer._stack.weights}
        structs = edited(own, fields)
        order = ("shape", "layers", "head", "step", "work", "run", "out")
        return self.layer._lib.specwise_head_step(*pointers(structs, order))


HEAD_CASES = {
    "no positions": ({"step__n": 0}, EIDS),
    "more positions than a step takes": ({"step__n": 65}, EIDS),
    "a count past int": ({"step__n": (1 << 32) + 2}, EIDS),
    "scratch short of the inputs": ({"work__scratch_floats": 3 * 64 * 64 - 1}, EWORK),
    "scratch short of the layer": ({"work__scratch_floats": 3 * 64 * 64 + 1}, EWORK),
    "scores one float short": ({"work__scores_floats": 2 * 2 * 5 - 1}, EWORK),
    "logits one float short": ({"out__logits_floats": 39}, EBUFFER),
    "rotary tables one row short": ({"step__table_rows": 4}, EBUFFER),
    "positions past the cache": ({"step__start": 7}, EFIT),
    "a negative start": ({"step__start": -1}, EFIT),
    "a cache past 2^30 positions": ({"step__cap": 1 << 31}, EFIT),
    "two layers": ({"shape__layers": 2}, EFIT),
    "a head width over 512": ({"shape__head_dim": 1024}, EHEAD),
    "no threads": ({"run__threads": 0}, EFIT),
    "no fc": ({"head__fc": None}, EFIT),
    "no out norm": ({"head__out_norm": None}, EFIT),
    "no prediction buffer": ({"step__pred": None}, EFIT),
    "no cache": ({"step__v_cache": None}, EFIT),
    "no argmax": ({"out__best": None}, EFIT),
    "no step": ({"step": None}, EFIT),
    "no work buffers": ({"work": None}, EFIT),
    "no shape": ({"shape": None}, EFIT),
}


@pytest.mark.parametrize("case", sorted(HEAD_CASES))
def test_a_head_step_that_does_not_fit_is_refused_before_anything_is_written(head, case):
    call = HeadCall(head)
    fields, expected = HEAD_CASES[case]
    assert_refused_unwritten(call, expected, **fields)
    assert call.status() == OK


def test_a_head_step_through_copied_structs_gives_the_layers_bits(head):
    """The step's own numbers: run again through the copied structs, the same bits as the layer's step."""
    call = HeadCall(head)
    pred, logits = call.pred.copy(), call.logits.copy()
    assert call.status() == OK
    np.testing.assert_array_equal(call.pred, pred)
    np.testing.assert_array_equal(call.logits, logits)
    assert np.isfinite(call.logits).all()
