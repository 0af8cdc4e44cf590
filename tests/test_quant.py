"""The quantized kernels (kernels/quant.py over quant.c): re-packing GGUF block formats, dequantization, and the
multi-row products in both modes on every instruction path.

Claims tested:
1. ``dequantize()`` (and ``row``) equals ``gguf.quants.dequantize`` of the same bytes bit for bit (up to the sign
   of zero), for weights quantized by gguf and for random bytes (every bit pattern of every block, with finite
   float16 scales).
2. ``exact`` products are within ``EXACT_BOUND * u * sum|w||x|`` (u = 2^-24) of float64 ``x @ W.T`` (measured:
   at most 3.0 u sum|w||x| over these shapes; the worst case of two float32 accumulators over n inputs is about
   (n / 2 + 2) u sum|w||x|, 258 u for n = 512). ``q8`` products are within the rigorous bound of rounding each
   activation to its block's step dx = max|x| / 127, ``0.5 dx sum_block |w|`` (plus float rounding), and, with 512
   or more inputs, within the measured ``Q8_TYPICAL`` = 0.25 of it (measured: at most 0.15; 0.26 at 96 inputs).
3. Row independence: a row's result does not depend on how many rows share the pass (k = 1..32) or on the
   thread count, for every format, mode and available instruction path.
4. The portable, AVX2 and AVX-512 paths agree bit for bit.
5. Several parts side by side equal the separate products concatenated; the bias is added.
6. Clear errors for what the kernels do not take.
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from specwise.models import threads as thread_count  # noqa: E402
from specwise.models.kernels import quant  # noqa: E402

if not quant.quantized_available():
    pytest.skip("the native quantized kernels are not built", allow_module_level=True)

FLOATS = (T.F32, T.F16, T.BF16)
LEGACY = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
KQUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
TYPES = FLOATS + LEGACY + KQUANTS
# byte offsets of the float16 scale fields (d, and m / dmin) in one block
SCALE_FIELDS = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
}

U = 2.0**-24  # float32 unit roundoff
EXACT_BOUND = 8.0  # exact mode: |y - y64| <= 8 u sum|w||x| (measured max 3.0)
Q8_RIGOROUS = 0.5 * (1 + 2.0**-10)  # q8: |y - y64| <= 0.5 dx sum_block|w| (+ float rounding): always
Q8_TYPICAL = 0.25  # q8, 512+ inputs: measured max 0.15 of the rigorous bound (errors of random sign cancel)
OUT = 40  # two full tiles of 16 and a partial one
IN = 512  # a multiple of 256 (the K-quants' super-block)


@pytest.fixture(autouse=True)
def restore_isa():
    quant.set_isa(None)
    yield
    quant.set_isa(None)


def use_isa(name: str) -> None:
    """Switch to instruction path ``name`` or skip the test when this CPU lacks it."""
    got = quant.set_isa(name)
    if got != name:
        pytest.skip(f"this CPU does not run the {name} path (set_isa gives {got})")


def f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(rng, t, out: int, n_in: int, scales=None) -> np.ndarray:
    """Random bytes as ``t`` blocks ``[out, row bytes]`` (every pattern of quants and packed sub-block scales),
    the float16 scale fields set from ``scales(n)`` (finite values)."""
    block, size = gguf.GGML_QUANT_SIZES[t]
    blocks = rng.integers(0, 256, size=(out * n_in // block, size), dtype=np.uint8)
    n = blocks.shape[0]
    for offset in SCALE_FIELDS[t]:
        blocks[:, offset : offset + 2] = f16_bytes(scales(n))
    return blocks.reshape(out, -1)


def any_finite_f16(rng, n: int) -> np.ndarray:
    """Random float16 bit patterns (normal, subnormal, zero, either sign), non-finite ones replaced."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0x83FF  # exponent all ones (inf, nan) -> a subnormal
    return bits.view(np.float16)


def make(rng, t, out: int = OUT, n_in: int = IN, std: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """(raw bytes [out, row bytes], dequantized float32 [out, in]): gguf-quantized normal weights for the formats
    gguf quantizes, random blocks with small scales for the K-quants."""
    if t in KQUANTS:
        raw = random_blocks(rng, t, out, n_in, lambda n: rng.uniform(0.001, 0.01, size=n))
    else:
        w = (rng.standard_normal((out, n_in)) * std).astype(np.float32)
        raw = gguf.quants.quantize(w, t)
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(out, -1)
    return raw, reference(raw, t, out, n_in)


def reference(raw: np.ndarray, t, out: int, n_in: int) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(raw.reshape(out, -1), t), dtype=np.float32).reshape(out, n_in)


def qtensor(t, raw: np.ndarray, out: int = OUT, n_in: int = IN) -> quant.QTensor:
    return quant.QTensor(int(t), raw.reshape(-1), out, n_in, name=f"w-{t.name}")


def assert_same_floats(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit, except that a zero may have either sign (gguf's ``d * 0`` is -0.0 for a negative scale d,
    the kernels' ``fma(0, d, 0)`` +0.0; the two are equal as numbers and in every product)."""
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    nonzero = want != 0
    assert np.array_equal(got, want), np.argwhere(got != want)[:5]
    assert np.array_equal(got[nonzero].view(np.uint32), want[nonzero].view(np.uint32))


def randn(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ---- 1. dequantization ------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(1, 256), (17, 256), (OUT, IN), (33, 96)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_dequantize_equals_gguf_bit_for_bit(t, shape):
    out, n_in = shape
    if t in KQUANTS and n_in % 256:
        pytest.skip("K-quants take multiples of 256 inputs")
    rng = np.random.default_rng(hash((int(t), out, n_in)) % 2**32)
    raw, ref = make(rng, t, out, n_in)
    qt = qtensor(t, raw, out, n_in)
    assert qt.shape == (out, n_in)
    deq = qt.dequantize()
    assert isinstance(deq, np.ndarray) and deq.dtype == np.float32 and deq.shape == (out, n_in)
    assert_same_floats(deq, ref)
    for i in (0, out // 2, out - 1):
        assert_same_floats(qt.row(i), ref[i])
    assert_same_floats(qt.rows([out - 1, 0, out - 1]), ref[[out - 1, 0, out - 1]])
    assert_same_floats(qt.rows(np.array([[out - 1], [0]])), ref[[out - 1, 0]])  # any shape of ids, flattened


@pytest.mark.parametrize("t", [T.Q8_0, T.Q4_1, T.Q6_K], ids=lambda t: t.name)
def test_abs_sum_of_any_slice_equals_the_float64_reference(t):
    """abs_sum (a model's identity: the output layer's mean |w| per slice, read by every thread) over slices that
    start and end inside rows, span many rows, or are empty, on 1 and 2 threads."""
    rng = np.random.default_rng(7)
    raw, want = make(rng, t, 40, 256)
    qt = qtensor(t, raw, 40, 256)
    flat = np.abs(want.astype(np.float64)).reshape(-1)
    threads = thread_count.get_num_threads()
    try:
        for n in (1, 2):
            thread_count.set_num_threads(n)
            for first, count in ((0, flat.size), (100, 7), (250, 300), (3 * 256, 256), (1000, 9000), (5, 0)):
                got = qt.abs_sum(first, count)
                assert got == pytest.approx(float(flat[first : first + count].sum()), rel=1e-12, abs=1e-12)
    finally:
        thread_count.set_num_threads(threads)


@pytest.mark.parametrize("t", LEGACY + KQUANTS, ids=lambda t: t.name)
def test_dequantize_random_blocks_with_any_finite_scales(t):
    """Every bit pattern of quants and packed sub-block scales, scales from subnormal to 65504 of either sign."""
    rng = np.random.default_rng(int(t))
    raw = random_blocks(rng, t, OUT, IN, lambda n: any_finite_f16(rng, n))
    ref = reference(raw, t, OUT, IN)
    assert np.isfinite(ref).all()
    assert_same_floats(qtensor(t, raw).dequantize(), ref)


@pytest.mark.parametrize("t", (T.F16, T.BF16), ids=lambda t: t.name)
def test_dequantize_float_formats_any_finite_bits(t):
    """Half and bfloat16 bit patterns, subnormals included, convert exactly."""
    rng = np.random.default_rng(int(t))
    bits = rng.integers(0, 1 << 16, size=OUT * 64, dtype=np.uint16)
    exponent = 0x7C00 if t == T.F16 else 0x7F80
    bits[(bits & exponent) == exponent] &= 0x80FF  # inf, nan -> finite
    raw = bits.view(np.uint8).reshape(OUT, -1)
    ref = reference(raw, t, OUT, 64)
    assert np.isfinite(ref).all()
    deq = qtensor(t, raw, OUT, 64).dequantize()
    assert np.array_equal(deq.view(np.uint32), ref.view(np.uint32))  # signed zeros too


# bytes per weight of the re-packed tiles: quants (Q6_K in 6 bits, the 5-bit formats in 5), scales (float16 for
# the legacy formats; for the K-quants one byte per block and float16 factors per super-block of 256), whole tiles
BYTES_PER_WEIGHT = {
    T.F32: 4.0,
    T.F16: 4.0,
    T.BF16: 4.0,
    T.Q4_0: 0.5 + 2 / 32,
    T.Q4_1: 0.5 + 4 / 32,
    T.Q5_0: 0.625 + 2 / 32,
    T.Q5_1: 0.625 + 4 / 32,
    T.Q8_0: 1 + 2 / 32,
    T.Q4_K: 0.5 + 2 / 32 + 4 / 256,
    T.Q5_K: 0.625 + 2 / 32 + 4 / 256,
    T.Q6_K: 0.75 + 1 / 16 + 2 / 256,
}


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_repacked_bytes(t):
    """The K-quants keep their scales compact (sub-scale bytes and super-block factors), about the file's size."""
    rng = np.random.default_rng(int(t))
    raw, _ = make(rng, t, 32, IN)
    assert qtensor(t, raw, 32, IN).nbytes == BYTES_PER_WEIGHT[t] * 32 * IN


# ---- 2. accuracy -------------------------------------------------------------------------------------------


def error_bounds(ref: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 x @ W.T, sum|w||x|, the q8 rounding bound 0.5 sum_b dx_b sum_{i in b}|w_i|), each [k, out]."""
    w, x64 = ref.astype(np.float64), x.astype(np.float64)
    k, n_in = x.shape
    dx = np.abs(x64).reshape(k, n_in // 32, 32).max(-1) / 127  # [k, blocks]
    w_blocks = np.abs(w).reshape(w.shape[0], n_in // 32, 32).sum(-1)  # [out, blocks]
    return x64 @ w.T, np.abs(x64) @ np.abs(w).T, 0.5 * dx @ w_blocks.T


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_in", [96, IN, 1024])
def test_products_match_float64_reference(t, n_in):
    if t in KQUANTS and n_in % 256:
        pytest.skip("K-quants take multiples of 256 inputs")
    rng = np.random.default_rng(1000 + int(t) + n_in)
    raw, ref = make(rng, t, OUT, n_in)
    qt = qtensor(t, raw, OUT, n_in)
    x = randn(rng, 9, n_in)
    x[3] *= 1e-3  # a row of a different scale (q8 steps are per row and block)
    x[5, :32] = 0.0  # an all-zero block (dx = 0)
    y64, scale, q8_step = error_bounds(ref, x)
    exact = quant.q_gemm(qt, x, mode="exact").astype(np.float64)
    assert (np.abs(exact - y64) <= EXACT_BOUND * U * scale).all(), (np.abs(exact - y64) / (U * scale)).max()
    q8 = quant.q_gemm(qt, x, mode="q8").astype(np.float64)
    err = np.abs(q8 - y64)
    assert (err <= Q8_RIGOROUS * q8_step + EXACT_BOUND * U * scale).all()
    if t not in FLOATS and n_in >= 512:  # float weights have no integer path; 3 blocks cancel less (0.26)
        assert (err <= Q8_TYPICAL * q8_step + EXACT_BOUND * U * scale).all(), (err / q8_step).max()


def test_default_mode_is_q8():
    rng = np.random.default_rng(5)
    raw, _ = make(rng, T.Q4_0)
    qt, x = qtensor(T.Q4_0, raw), randn(rng, 3, IN)
    y = quant.q_gemm(qt, x)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (3, OUT) and y.flags.c_contiguous
    np.testing.assert_array_equal(y, quant.q_gemm(qt, x, mode="q8"))


# ---- 3. row independence, 4. instruction paths -------------------------------------------------------------


@pytest.fixture(scope="module")
def weights():
    """Per format: (QTensor [40, 256], x [32, 256])."""
    out = {}
    for t in TYPES:
        rng = np.random.default_rng(7 + int(t))
        raw, _ = make(rng, t, OUT, 256)
        out[t] = (qtensor(t, raw, OUT, 256), randn(rng, 32, 256))
    return out


@pytest.mark.parametrize("mode", quant.MODES)
@pytest.mark.parametrize("isa", quant.ISAS)
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_rows_independent_of_rows_in_pass(weights, t, isa, mode):
    use_isa(isa)
    qt, x = weights[t]
    single = np.concatenate([quant.q_gemm(qt, x[i : i + 1], mode=mode) for i in range(32)])  # [32, out]
    for k in range(1, 33):
        head = quant.q_gemm(qt, x[:k], mode=mode)
        np.testing.assert_array_equal(head, single[:k], err_msg=f"k={k}")
    for k in (1, 7, 16, 23, 31):
        tail = quant.q_gemm(qt, x[32 - k :], mode=mode)
        np.testing.assert_array_equal(tail, single[32 - k :], err_msg=f"k={k}")
    for threads in (1, 2, 3):
        np.testing.assert_array_equal(quant.q_gemm(qt, x[:13], mode=mode, threads=threads), single[:13])


@pytest.mark.parametrize("isa", ("avx2", "avx512"))
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_instruction_paths_agree_bit_for_bit(weights, t, isa):
    qt, x = weights[t]
    quant.set_isa("portable")
    assert quant.isa() == "portable"
    want = {mode: [quant.q_gemm(qt, x[:k], mode=mode) for k in (1, 2, 3, 5, 8, 17, 32)] for mode in quant.MODES}
    deq = qt.dequantize()
    use_isa(isa)
    assert quant.isa() == isa
    for mode in quant.MODES:
        for got, ref in zip([quant.q_gemm(qt, x[:k], mode=mode) for k in (1, 2, 3, 5, 8, 17, 32)], want[mode]):
            np.testing.assert_array_equal(got, ref, err_msg=f"{mode} {got.shape}")
    np.testing.assert_array_equal(qt.dequantize(), deq)


@pytest.mark.parametrize("isa", ("avx2", "avx512"))
def test_q6_k_products_at_the_ends_of_both_ranges_agree_with_the_portable_path(isa):
    """Q6_K weights at both ends of their range (q = 0 and 63, i.e. -32 and 31) against activations quantized to
    +-127 everywhere: the largest byte-pair products and block sums the instruction paths' narrower integer sums
    can meet, which must neither saturate nor wrap."""
    out, n_in = 32, 512
    blocks = np.zeros((out, n_in // 256, 210), dtype=np.uint8)
    blocks[..., 192:208] = 3  # the int8 sub-scales
    blocks[..., 208:210] = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)  # d
    blocks[out // 2 :, :, :192] = 0xFF  # the second half of the rows: every q = 63
    blocks[::3, 1, :192] = 0xFF  # and a few rows mixed: one super-block each way
    qt = qtensor(T.Q6_K, blocks, out, n_in)
    ones = np.ones(n_in, dtype=np.float32)
    i = np.arange(n_in)
    x = np.stack([ones, -ones, np.where(i % 2, ones, -ones), np.where(i % 32 < 16, ones, -ones)])
    x = np.concatenate([x, x[::-1], x, x])  # 16 rows: passes of many rows too
    quant.set_isa("portable")
    want = [quant.q_gemm(qt, x[:k], mode="q8") for k in (1, 3, 4, 8, 16)]
    exact = x.astype(np.float64) @ reference(blocks.reshape(out, -1), T.Q6_K, out, n_in).T.astype(np.float64)
    np.testing.assert_allclose(want[-1], exact, rtol=1e-6, atol=1e-3)  # |x| = 1 is quantized exactly
    use_isa(isa)
    for k, ref in zip((1, 3, 4, 8, 16), want):
        np.testing.assert_array_equal(quant.q_gemm(qt, x[:k], mode="q8"), ref, err_msg=f"k={k}")


def test_set_isa_clamps_and_names():
    best = quant.set_isa(None)
    assert best in quant.ISAS and quant.isa() == best
    assert quant.set_isa("portable") == "portable" == quant.isa()
    for name in quant.ISAS:  # never above the best path the CPU supports
        assert quant.ISAS.index(quant.set_isa(name)) <= quant.ISAS.index(best)
    with pytest.raises(ValueError, match="unknown instruction path"):
        quant.set_isa("sse2")
    assert quant.set_isa(None) == best


# ---- 5. parts side by side, bias --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", quant.MODES)
@pytest.mark.parametrize("isa", quant.ISAS)
def test_parts_side_by_side_and_bias(isa, mode):
    use_isa(isa)
    rng = np.random.default_rng(11)
    shapes = [(T.Q4_0, 40), (T.Q8_0, 16), (T.Q6_K, 24), (T.F16, 7), (T.Q5_1, 33), (T.Q4_K, 1)]
    parts = []
    for t, out in shapes:
        raw, _ = make(rng, t, out, IN)
        parts.append(qtensor(t, raw, out, IN))
    x = randn(rng, 11, IN)
    n_out = sum(out for _, out in shapes)
    bias = randn(rng, n_out)
    for group in (parts[:1], parts[:3], parts):
        separate = np.concatenate([quant.q_gemm(p, x, mode=mode) for p in group], axis=1)
        joint = quant.q_gemm(group, x, mode=mode)
        assert joint.shape == (11, sum(p.shape[0] for p in group))
        np.testing.assert_array_equal(joint, separate)
    with_bias = quant.q_gemm(parts, x, bias=bias, mode=mode)
    np.testing.assert_array_equal(with_bias, quant.q_gemm(parts, x, mode=mode) + bias)
    # row independence holds for the side-by-side product too
    np.testing.assert_array_equal(quant.q_gemm(parts, x[4:5], bias=bias, mode=mode), with_bias[4:5])
    # a strided x (a column slice) is taken as a C-contiguous copy
    wide = np.concatenate([x, x], axis=1)
    np.testing.assert_array_equal(quant.q_gemm(parts, wide[:, :IN], mode=mode), quant.q_gemm(parts, x, mode=mode))


# ---- 6. errors -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def q4():
    rng = np.random.default_rng(3)
    raw, _ = make(rng, T.Q4_0, OUT, 64)
    return raw, qtensor(T.Q4_0, raw, OUT, 64)


@pytest.mark.parametrize("ggml_type", [T.Q8_1, T.Q2_K, T.Q3_K, T.Q8_K, T.IQ4_NL, 4, 999, -1], ids=str)
def test_unsupported_type(ggml_type):
    with pytest.raises(ValueError, match="not supported"):
        quant.QTensor(int(ggml_type), np.zeros(1024, dtype=np.uint8), 4, 256)
    assert int(ggml_type) not in quant.supported_types()


def test_supported_types_are_the_documented_ones():
    assert set(quant.supported_types()) == {int(t) for t in TYPES}


@pytest.mark.parametrize(
    ("t", "n_in"), [(T.F32, 48), (T.F16, 16), (T.BF16, 40), (T.Q8_0, 48), (T.Q4_K, 288), (T.Q6_K, 128), (T.Q5_K, 32)]
)
def test_inputs_not_a_multiple_of_the_block(t, n_in):
    block, size = gguf.GGML_QUANT_SIZES[t]
    n_bytes = 4 * (n_in // block) * size if n_in % block == 0 else 4 * n_in * 2
    with pytest.raises(ValueError, match="not a multiple of"):
        quant.QTensor(int(t), np.zeros(n_bytes, dtype=np.uint8), 4, n_in)


@pytest.mark.parametrize("delta", [-1, 1, -18])
def test_wrong_byte_count(q4, delta):
    raw, _ = q4
    data = np.zeros(raw.size + delta, dtype=np.uint8)
    with pytest.raises(ValueError, match=r"bytes for .*Q4_0"):
        quant.QTensor(int(T.Q4_0), data, OUT, 64)


def test_wrong_x(q4):
    _, qt = q4
    for x in (
        np.zeros(64, dtype=np.float32),  # 1-D
        np.zeros((2, 63), dtype=np.float32),  # wrong inputs
        np.zeros((2, 64), dtype=np.float64),
        np.zeros((2, 64), dtype=np.float16),
        np.zeros((1, 2, 64), dtype=np.float32),
        [[0.0] * 64],  # not an array
    ):
        with pytest.raises(ValueError, match="float32 numpy array x"):
            quant.q_gemm(qt, x)


def test_wrong_bias_and_parts(q4):
    _, qt = q4
    x = np.zeros((2, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="bias"):
        quant.q_gemm(qt, x, bias=np.zeros(OUT + 1, dtype=np.float32))
    with pytest.raises(ValueError, match="bias"):
        quant.q_gemm(qt, x, bias=np.zeros(OUT, dtype=np.float64))
    with pytest.raises(ValueError, match="1 to 8"):
        quant.q_gemm([], x)
    with pytest.raises(ValueError, match="1 to 8"):
        quant.q_gemm([qt] * 9, x)
    other = qtensor(T.F32, np.zeros(4 * 96 * 4, dtype=np.uint8), 4, 96)
    with pytest.raises(ValueError, match="inputs differ"):
        quant.q_gemm([qt, other], x)


def test_unknown_mode(q4):
    _, qt = q4
    with pytest.raises(ValueError, match="unknown precision"):
        quant.q_gemm(qt, np.zeros((2, 64), dtype=np.float32), mode="int4")


def test_row_outside(q4):
    _, qt = q4
    with pytest.raises(IndexError):
        qt.row(OUT)
    with pytest.raises(IndexError):
        qt.row(-1)
    with pytest.raises(IndexError):
        qt.rows([0, OUT])
    with pytest.raises(TypeError, match="integers"):
        qt.rows(np.array([0.5]))
    with pytest.raises(ValueError, match="float32"):
        qt.row(0, out=np.empty(64, dtype=np.float64))
    out = np.empty(64, dtype=np.float32)
    assert qt.row(3, out=out) is out
    np.testing.assert_array_equal(out, qt.rows([3])[0])


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_requantized_q4_0_is_ggufs_q4_0_of_the_values(t):
    """QTensor.requantized_q4_0 (for draft models) gives the blocks gguf's Q4_0 quantization makes of the
    matrix's values: the same reference rule, float16 scales rounded alike."""
    rng = np.random.default_rng(3)
    raw, values = make(rng, t)
    qt = quant.QTensor(int(t), raw.reshape(-1).view(np.uint8), OUT, IN)
    assert np.array_equal(qt.dequantize(), values)
    narrow = qt.requantized_q4_0()
    assert narrow.type_name == "Q4_0" and narrow.shape == (OUT, IN)
    want = gguf.quants.dequantize(gguf.quants.quantize(values, T.Q4_0), T.Q4_0).reshape(OUT, IN)
    assert np.array_equal(narrow.dequantize(), want)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_repack_jobs_equal_tensors_repacked_one_by_one(t, tmp_path):
    """The loader's one-call re-packing (repack_jobs: whole tensors, in slices, the file mapping's pages released
    as they are done and read again by the next job, rows permuted) gives the tiles a tensor made from its bytes
    has, byte for byte; bytes that do not fit are refused by name."""
    rng = np.random.default_rng(100 + int(t))
    out = 600
    raw, _ = make(rng, t, out, IN)
    perm = rng.permutation(out)
    whole = quant.QTensor(int(t), raw.reshape(-1), out, IN, name="whole")
    permuted = quant.QTensor(int(t), raw[perm].reshape(-1), out, IN, name="permuted")
    path = tmp_path / "raw.bin"
    raw.reshape(-1).tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")  # as the loader's views of the GGUF file
    jobs = [quant.QTensor(int(t), None, out, IN, name=f"job{i}") for i in range(2)]
    quant.repack_jobs([(jobs[0], mapped, None), (jobs[1], mapped, perm)], release=True)
    for job, ref in zip(jobs, (whole, permuted)):
        for part in ("q", "s", "m", "sd", "md"):
            a, b = getattr(job, part), getattr(ref, part)
            assert (a is None) == (b is None) and (a is None or np.array_equal(a, b)), part
    short = quant.QTensor(int(t), None, out, IN, name="short")
    with pytest.raises(RuntimeError, match="short"):
        quant.repack_jobs([(short, raw.reshape(-1)[: raw.size - 1], None)])
    bad = perm.copy()
    bad[3] = out
    with pytest.raises(RuntimeError, match="short"):
        quant.repack_jobs([(short, raw.reshape(-1), bad)])
