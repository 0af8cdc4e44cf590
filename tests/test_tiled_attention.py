"""The attention of the layer kernel alone (``specwise_qllama_attention``): random queries, keys and values, the
tiled loops (each block of keys and values read once for every row and query head of a tile) against the per-row
loops, bit for bit.

A row's numbers must not depend on how many rows share its pass, nor on the instruction path: a decoding step (one
row), a prompt slice (many rows) and a verification pass (a few) give the same bits, so greedy speculative decoding
equals plain decoding. Checked here for long caches (3,000 positions), grouped query heads (1, 3 and 6 query heads per
key-value head), heads of 64 and 128 (and 80, 96, 256), float32 and float16 caches, a sliding window, a batch of
rows from several caches, every cut of a pass into slices, every thread count from 1 to 3, and every instruction path
the CPU has (portable included); and against a float64 reference to float32 accuracy.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from specwise.models.kernels import quant

if not quant.quantized_available():
    pytest.skip("the native quantized kernels are not built", allow_module_level=True)

from specwise.models.kernels.abi import QRows, QRun, QShape, QWork  # noqa: E402

OFF, ON, AUTO = 0, 1, -1  # the call's tiling: the per-row loops, the tiled loops, the layers' own choice
F32, BF16 = 0, 1  # the call's attention: float32, or bfloat16 products (qrun's ATTN_*)
LONG = 3000  # positions of the long caches


def paths() -> list[str]:
    """Every instruction path this CPU runs, portable first."""
    best = quant.set_isa(None)
    return list(quant.ISAS[: quant.ISAS.index(best) + 1])


@pytest.fixture
def isa_reset():
    yield
    quant.set_isa(None)


class Caches:
    """Random key and value caches ``[layers, kv_heads, cap, hd]`` of a few sequences, and random queries."""

    def __init__(self, heads: int, kv_heads: int, hd: int, caps: list[int], half: bool, seed: int, layers: int = 2):
        rng = np.random.default_rng(seed)
        self.heads, self.kv_heads, self.hd, self.layers, self.half = heads, kv_heads, hd, layers, half
        dtype = np.float16 if half else np.float32
        # keys of about 2 / sqrt(hd) per element against queries of about 1: scores of a few units, so that the
        # softmax is sharp enough for positions to matter and spread enough for many to count
        self.k = [(rng.standard_normal((layers, kv_heads, c, hd)) * 2.0 / np.sqrt(hd)).astype(dtype) for c in caps]
        self.v = [rng.standard_normal((layers, kv_heads, c, hd)).astype(dtype) for c in caps]
        self.rng = rng
        self.width = (heads + 2 * kv_heads) * hd

    def queries(self, n: int) -> np.ndarray:
        """Random rows of qkv ``[n, (heads + 2 kv_heads) hd]`` (only the queries are read)."""
        return self.rng.standard_normal((n, self.width)).astype(np.float32)

    def attend(
        self,
        qkv: np.ndarray,
        rows: list[tuple[int, int]],
        tiling: int,
        threads: int = 2,
        layer: int = 1,
        window: int = 0,
        attention: int = F32,
    ) -> np.ndarray:
        """The native attention of ``rows`` ((sequence, position) each, in one pass) with queries qkv: float32
        ``[rows, heads * hd]``."""
        k = len(rows)
        shape = QShape(self.layers, max(32, self.heads * self.hd), self.heads, self.kv_heads, self.hd, 64, 1e-5)
        k_rows = (ctypes.c_void_p * k)(*[self.k[s].ctypes.data for s, _ in rows])
        v_rows = (ctypes.c_void_p * k)(*[self.v[s].ctypes.data for s, _ in rows])
        caps = (ctypes.c_int64 * k)(*[self.k[s].shape[2] for s, _ in rows])
        pos = (ctypes.c_int64 * k)(*[p for _, p in rows])
        qrows = QRows()
        qrows.rows, qrows.kv_half = k, int(self.half)
        qrows.k_rows, qrows.v_rows = ctypes.addressof(k_rows), ctypes.addressof(v_rows)
        qrows.cap, qrows.pos = ctypes.addressof(caps), ctypes.addressof(pos)
        end = max(p for _, p in rows) + 1
        scores = np.full(self.heads * k * end, np.nan, dtype=np.float32)
        work = QWork(None, 0, scores.ctypes.data, scores.size)
        attn = np.full((k, self.heads * self.hd), np.nan, dtype=np.float32)
        qkv = np.ascontiguousarray(qkv, dtype=np.float32)
        assert qkv.shape == (k, self.width)
        scale = float(1.0 / np.sqrt(self.hd))
        status = quant._lib().specwise_qllama_attention(
            ctypes.byref(shape), ctypes.byref(qrows), layer, window, scale, qkv.ctypes.data, attn.ctypes.data,
            ctypes.byref(work), ctypes.byref(QRun(threads, 0, attention)), tiling,
        )  # fmt: skip
        assert status == 0
        return attn

    def reference(self, qkv: np.ndarray, rows: list[tuple[int, int]], layer: int = 1, window: int = 0) -> np.ndarray:
        """The same attention in float64."""
        group, hd = self.heads // self.kv_heads, self.hd
        out = np.empty((len(rows), self.heads * hd))
        for i, (s, p) in enumerate(rows):
            first = max(0, p + 1 - window) if window else 0
            for h in range(self.heads):
                g = h // group
                keys = self.k[s][layer, g, first : p + 1].astype(np.float64)
                vals = self.v[s][layer, g, first : p + 1].astype(np.float64)
                sc = keys @ qkv[i, h * hd : (h + 1) * hd].astype(np.float64) / np.sqrt(hd)
                e = np.exp(sc - sc.max())
                out[i, h * hd : (h + 1) * hd] = (e / e.sum()) @ vals
        return out


def bits(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert a.shape == b.shape, what
    assert not np.isnan(a).any(), f"{what}: NaN outputs (an element left unwritten)"
    same = a.view(np.uint32) == b.view(np.uint32)
    if not same.all():
        bad = np.argwhere(~same)[0]
        raise AssertionError(
            f"{what}: {(~same).sum()} elements differ, first at {tuple(bad)}: {a[tuple(bad)]!r} vs {b[tuple(bad)]!r}"
        )


def sliced(c: Caches, qkv: np.ndarray, rows: list[tuple[int, int]], cut: int, tiling: int, **kw) -> np.ndarray:
    """The rows in passes of ``cut`` rows."""
    return np.concatenate(
        [c.attend(qkv[i : i + cut], rows[i : i + cut], tiling, **kw) for i in range(0, len(rows), cut)]
    )


# (query heads, key-value heads, head width, float16 cache): the default model's groups of 3 with heads of 64,
# Qwen2.5-Coder-1.5B's 12 over 2 with heads of 128, and no grouping
SHAPES = {
    "grouped-3-hd64": (9, 3, 64, False),
    "grouped-6-hd128": (12, 2, 128, False),
    "grouped-3-hd64-f16": (6, 2, 64, True),
    "grouped-6-hd128-f16": (6, 1, 128, True),
    "ungrouped-hd128": (2, 2, 128, False),
}


@pytest.mark.parametrize("name", SHAPES)
def test_a_prompt_slice_equals_its_rows_one_at_a_time_on_every_path(name, isa_reset):
    """A slice of 40 rows at the end of a 3,000-position cache: the tiled loops give the per-row loops' bits for
    the whole slice, for every row alone, for slices of 7, 13 and 40 rows, on 1 to 3 threads, and every path gives
    the portable path's bits; the numbers are the float64 reference's to float32 accuracy."""
    heads, kv, hd, half = SHAPES[name]
    c = Caches(heads, kv, hd, [LONG], half, seed=hash(name) % 1000)
    n = 40
    rows = [(0, p) for p in range(LONG - n, LONG)]
    qkv = c.queries(n)
    want = None
    for path in paths():
        assert quant.set_isa(path) == path
        per_row = c.attend(qkv, rows, OFF)
        if want is None:
            want = per_row
            ref = c.reference(qkv, rows)
            assert np.abs(want - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
        bits(per_row, want, f"{path}: the per-row loops against the portable path's")
        bits(c.attend(qkv, rows, ON), want, f"{path}: one tiled pass")
        bits(c.attend(qkv, rows, AUTO), want, f"{path}: the layers' choice")
        if path == paths()[-1] or path == "avx2":  # every cut on the vector paths (the portable one is slow)
            for cut in (1, 7, 13):
                bits(sliced(c, qkv, rows, cut, ON), want, f"{path}: tiled passes of {cut} rows")
            for threads in (1, 3):
                bits(c.attend(qkv, rows, ON, threads=threads), want, f"{path}: tiled on {threads} threads")
        else:
            bits(sliced(c, qkv, rows, 1, ON), want, f"{path}: each row in a tiled pass of its own")


def test_a_whole_prompt_from_position_zero(isa_reset):
    """A prompt read from the start in slices of 64 rows (the tiles' rows attend to different numbers of positions,
    the first to one) equals its rows decoded one at a time, and a verification pass of 5 rows after it."""
    c = Caches(12, 2, 128, [400], False, seed=11)
    rows = [(0, p) for p in range(300)]
    qkv = c.queries(len(rows))
    for path in paths()[1:] or paths():
        quant.set_isa(path)
        want = sliced(c, qkv, rows, 1, OFF)
        bits(sliced(c, qkv, rows, 64, ON), want, f"{path}: slices of 64")
        bits(sliced(c, qkv, rows, 64, AUTO), want, f"{path}: slices of 64, the layers' choice")
        bits(sliced(c, qkv, rows, 5, AUTO), want, f"{path}: passes of 5")
        bits(c.attend(qkv, rows, ON, threads=3), want, f"{path}: one pass of 300 on 3 threads")


@pytest.mark.parametrize("hd", [80, 96, 256])
def test_other_head_widths(hd, isa_reset):
    """Widths that take the values' narrower vector parts (80, 96) or a smaller block of positions (256)."""
    c = Caches(4, 2, hd, [700], False, seed=hd)
    rows = [(0, p) for p in range(640, 700)]
    qkv = c.queries(len(rows))
    want = None
    for path in paths():
        quant.set_isa(path)
        if want is None:
            want = sliced(c, qkv, rows, 1, OFF)
        bits(c.attend(qkv, rows, OFF), want, f"{path}: per-row loops, hd {hd}")
        bits(c.attend(qkv, rows, ON), want, f"{path}: tiled, hd {hd}")
        bits(sliced(c, qkv, rows, 9, ON), want, f"{path}: tiled passes of 9, hd {hd}")


@pytest.mark.parametrize("half", [False, True])
def test_a_sliding_window(half, isa_reset):
    """With a window, each row attends to its own last positions: the rows of a tile start at different positions
    (blocks that some rows of the tile skip)."""
    c = Caches(6, 2, 64, [LONG], half, seed=5)
    rows = [(0, p) for p in range(LONG - 70, LONG)]
    qkv = c.queries(len(rows))
    want = None
    for path in paths():
        quant.set_isa(path)
        if want is None:
            want = c.attend(qkv, rows, OFF, window=37)
            ref = c.reference(qkv, rows, window=37)
            assert np.abs(want - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
        bits(c.attend(qkv, rows, OFF, window=37), want, f"{path}: per-row loops, window")
        bits(c.attend(qkv, rows, ON, window=37), want, f"{path}: tiled, window")
        bits(sliced(c, qkv, rows, 11, ON, window=37), want, f"{path}: tiled passes of 11, window")


def test_a_batch_of_sequences(isa_reset):
    """One pass over rows of three sequences (a long prefill slice, a decoding row, a verification pass): each
    sequence's rows make their own tiles, and every row has the bits it has alone."""
    c = Caches(12, 2, 128, [LONG, 900, 50], False, seed=7)
    rows = [(0, p) for p in range(LONG - 30, LONG)] + [(1, 899)] + [(2, p) for p in range(45, 50)]
    rows = rows[:10] + rows[30:31] + rows[10:30] + rows[31:]  # a sequence's rows in order, sequences interleaved
    qkv = c.queries(len(rows))
    for path in paths()[1:] or paths():
        quant.set_isa(path)
        want = sliced(c, qkv, rows, 1, OFF)
        for tiling in (ON, AUTO):
            bits(c.attend(qkv, rows, tiling), want, f"{path}: the batch's pass, tiling {tiling}")
            bits(c.attend(qkv, rows, tiling, threads=3), want, f"{path}: on 3 threads, tiling {tiling}")


class OneRow:
    """One row at position 9 of a 10-position cache (4 query heads over 2 key-value heads of 64, 2 layers), its
    output pre-filled with 7 so that a refused call is seen to write nothing: ``call`` runs the attention entry point
    on it (``pos[0]``: the row's position, to make it out of range)."""

    def __init__(self) -> None:
        self.caches = c = Caches(4, 2, 64, [10], False, seed=1)  # kept: the rows below point into its arrays
        self.shape = QShape(2, 256, 4, 2, 64, 64, 1e-5)
        self.k_rows = (ctypes.c_void_p * 1)(c.k[0].ctypes.data)
        self.v_rows = (ctypes.c_void_p * 1)(c.v[0].ctypes.data)
        self.caps, self.pos = (ctypes.c_int64 * 1)(10), (ctypes.c_int64 * 1)(9)
        self.rows = QRows()
        self.rows.rows, self.rows.k_rows = 1, ctypes.addressof(self.k_rows)
        self.rows.v_rows, self.rows.cap = ctypes.addressof(self.v_rows), ctypes.addressof(self.caps)
        self.rows.pos = ctypes.addressof(self.pos)
        self.scores = np.zeros(4 * 10, dtype=np.float32)
        self.qkv = c.queries(1)
        self.attn = np.full((1, 256), 7.0, dtype=np.float32)

    def call(self, layer=1, window=0, tiling=ON, floats=None, threads=2, attention=0) -> int:
        work = QWork(None, 0, self.scores.ctypes.data, self.scores.size if floats is None else floats)
        return quant._lib().specwise_qllama_attention(
            ctypes.byref(self.shape), ctypes.byref(self.rows), layer, window, 0.125, self.qkv.ctypes.data,
            self.attn.ctypes.data, ctypes.byref(work), ctypes.byref(QRun(threads, 0, attention)), tiling,
        )  # fmt: skip


def test_refusals():
    """Arguments that do not fit are refused before anything is written."""
    one = OneRow()
    call, scores, pos, attn = one.call, one.scores, one.pos, one.attn

    assert call(layer=2) == 5 and call(layer=-1) == 5 and call(window=-1) == 5
    assert call(tiling=2) == 5 and call(threads=0) == 5
    assert call(floats=scores.size - 1) == 6
    pos[0] = 10
    assert call() == 5
    assert (attn == 7.0).all()
    pos[0] = 9
    assert call() == 0 and not (attn == 7.0).any()


# ---- the bfloat16 attention (AVX512_BF16): the same rule, its own numbers ----

bf16 = pytest.mark.skipif(
    not quant.attention_bf16_supported(), reason="the CPU has no AVX512_BF16 (the bfloat16 attention is refused)"
)

# (query heads, key-value heads, head width, float16 cache): the float32 loops' shapes, and widths that are
# multiples of 16 but not of 64
BF16_SHAPES = {
    **SHAPES,
    "hd80": (4, 2, 80, False),
    "hd96": (4, 2, 96, False),
    "hd256": (4, 2, 256, False),
}


def bf16_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    """The bfloat16 attention against the float64 reference: within 2^-6 of the outputs' scale (max |ref|).
    bfloat16 keeps 8 significant bits, so each query, key, probability and value is off by at most 2^-9 of itself;
    a score carries two such errors and a probability its score's and the sum's, which mostly cancel over many
    positions: about 2^-9 of the scale is what these caches give (0.3%), and 2^-6 leaves room for four times that,
    while a wrong pairing of positions or widths is off by the outputs' own size."""
    err, scale = np.abs(got - ref).max(), np.abs(ref).max()
    assert err <= 2.0**-6 * scale, f"{what}: {err} from the float64 reference (max |ref| {scale})"


@bf16
@pytest.mark.parametrize("name", BF16_SHAPES)
def test_bf16_a_prompt_slice_equals_its_rows_one_at_a_time(name):
    """Under the bfloat16 attention every pass runs its tiled loops: a slice of 40 rows at the end of a
    3,000-position cache gives, whatever the call's tiling, the thread count (1-3) and the cut into slices, the
    bits of each row decoded alone; and the float64 reference's numbers to bfloat16's accuracy."""
    heads, kv, hd, half = BF16_SHAPES[name]
    c = Caches(heads, kv, hd, [LONG], half, seed=hash(name) % 1000)
    n = 40
    rows = [(0, p) for p in range(LONG - n, LONG)]
    qkv = c.queries(n)
    want = sliced(c, qkv, rows, 1, AUTO, attention=BF16)
    bf16_close(want, c.reference(qkv, rows), name)
    assert not np.array_equal(want, c.attend(qkv, rows, AUTO)), "the float32 loops ran, not bfloat16"
    for tiling in (OFF, ON, AUTO):
        bits(c.attend(qkv, rows, tiling, attention=BF16), want, f"{name}: one pass, tiling {tiling}")
    for cut in (7, 13):
        bits(sliced(c, qkv, rows, cut, AUTO, attention=BF16), want, f"{name}: passes of {cut} rows")
    for threads in (1, 3):
        bits(c.attend(qkv, rows, AUTO, threads=threads, attention=BF16), want, f"{name}: {threads} threads")


@bf16
def test_bf16_a_whole_prompt_a_window_and_a_batch():
    """A prompt read from position 0 in slices of 64 (rows of a tile attending to odd and even numbers of
    positions), a sliding window (rows starting at odd positions), and a batch of three sequences' rows: each row
    has the bits it has alone."""
    c = Caches(12, 2, 128, [300], False, seed=11)
    rows = [(0, p) for p in range(300)]
    qkv = c.queries(len(rows))
    want = sliced(c, qkv, rows, 1, AUTO, attention=BF16)
    bits(sliced(c, qkv, rows, 64, AUTO, attention=BF16), want, "slices of 64")
    bits(sliced(c, qkv, rows, 5, AUTO, attention=BF16), want, "passes of 5")
    bits(c.attend(qkv, rows, AUTO, threads=3, attention=BF16), want, "one pass of 300 on 3 threads")
    for half in (False, True):
        c = Caches(6, 2, 64, [LONG], half, seed=5)
        rows = [(0, p) for p in range(LONG - 70, LONG)]
        qkv = c.queries(len(rows))
        want = sliced(c, qkv, rows, 1, AUTO, window=37, attention=BF16)
        bf16_close(want, c.reference(qkv, rows, window=37), f"window, float16 cache {half}")
        bits(c.attend(qkv, rows, AUTO, window=37, attention=BF16), want, f"window, float16 cache {half}")
        bits(sliced(c, qkv, rows, 11, AUTO, window=37, attention=BF16), want, f"window, passes of 11, {half}")
    c = Caches(12, 2, 128, [LONG, 900, 50], False, seed=7)
    rows = [(0, p) for p in range(LONG - 30, LONG)] + [(1, 899)] + [(2, p) for p in range(45, 50)]
    rows = rows[:10] + rows[30:31] + rows[10:30] + rows[31:]
    qkv = c.queries(len(rows))
    want = sliced(c, qkv, rows, 1, AUTO, attention=BF16)
    bits(c.attend(qkv, rows, AUTO, attention=BF16), want, "the batch's pass")
    bits(c.attend(qkv, rows, AUTO, threads=3, attention=BF16), want, "the batch's pass on 3 threads")


@bf16
def test_bf16_head_widths_it_does_not_take_keep_float32():
    """Head widths not a multiple of 16 (here 72) keep the float32 loops under the option: the same bits."""
    c = Caches(4, 2, 72, [300], False, seed=3)
    rows = [(0, p) for p in range(250, 300)]
    qkv = c.queries(len(rows))
    bits(c.attend(qkv, rows, AUTO, attention=BF16), c.attend(qkv, rows, AUTO), "hd 72")


def test_bf16_refused_where_it_does_not_run(isa_reset):
    """The bfloat16 attention is refused (5, nothing written) on a path or CPU without AVX512_BF16, and an
    attention other than 0 and 1 everywhere; the model refuses it in one line."""
    one = OneRow()
    attn = one.attn

    def call(attention):
        return one.call(tiling=AUTO, attention=attention)

    assert call(2) == 5 and call(-1) == 5
    for path in paths():
        quant.set_isa(path)
        if not quant.attention_bf16_supported():
            assert call(BF16) == 5 and (attn == 7.0).all(), path
    quant.set_isa(None)
    if quant.attention_bf16_supported():
        assert call(BF16) == 0 and not (attn == 7.0).any()
    from specwise.models.kernels.layers import DecoderStack

    with pytest.raises(ValueError, match="attention must be one of"):
        DecoderStack([], [], [], [], 4, 2, 64, 1e-5, attention="bf8")
