"""Tests for specwise.sampling: parameter validation, logits checks, each filter against a slow reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specwise.sampling import SamplingParams, check_logits, make_generator, probs_from_logits, sample

NINF = float("-inf")
PHILOX_42 = [0.08607763073528474, 0.14155732377913233]  # make_generator(42).random(2)


def arr(rows):
    return np.array(rows, dtype=np.float32)


# ---------------------------------------------------------------------------------------------------------------
# SamplingParams validation
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "temperature must be finite"),
        ({"temperature": float("inf")}, "temperature must be finite"),
        ({"temperature": "1.0"}, "temperature must be a number"),
        ({"temperature": True}, "temperature must be a number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": -0.1}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_p": float("nan")}, "top_p must be finite"),
        ({"min_p": -0.1}, r"min_p must be in \[0, 1\)"),
        ({"min_p": 1.0}, r"min_p must be in \[0, 1\)"),
        ({"min_p": float("nan")}, "min_p must be finite"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"top_k": 2.0}, "top_k must be an integer"),
        ({"top_k": True}, "top_k must be an integer"),
        ({"seed": 1.5}, "seed must be an integer or None"),
        ({"seed": "42"}, "seed must be an integer or None"),
        ({"seed": True}, "seed must be an integer or None"),
    ],
)
def test_invalid_params_raise_helpful_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"temperature": 0.0},
        {"temperature": 1},
        {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.05, "seed": 0},
        {"top_p": 1.0, "min_p": 0.0, "top_k": 0},
        {"top_p": 1e-6, "min_p": 0.999},
        {"seed": -3},
    ],
)
def test_valid_params_accepted(kwargs):
    SamplingParams(**kwargs)


def test_greedy_property():
    assert SamplingParams().greedy
    assert SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=0.5).greedy


# ---------------------------------------------------------------------------------------------------------------
# Invalid logits
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (arr([[0.0, float("nan"), 1.0]]), "NaN"),
        (arr([[0.0, float("inf"), 1.0]]), r"\+inf"),
        (arr([[0.0, 1.0, 2.0], [NINF] * 3]), "entirely -inf"),
        (np.array([[0.0, float("nan"), 1.0]]), "NaN"),  # float64: checked by numpy
        (np.array([[0.0, 1.0, 2.0], [NINF] * 3]), "entirely -inf"),
    ],
)
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9)])
def test_invalid_logits_raise(bad, message, params):
    with pytest.raises(ValueError, match=message):
        check_logits(bad)
    with pytest.raises(ValueError, match=message):
        probs_from_logits(bad, params)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, top_k=2, top_p=0.9, min_p=0.1)],
)
def test_neg_inf_logits_get_zero_probability(params):
    logits = arr([[NINF, 1.0, NINF, 0.5, 2.0], [3.0, NINF, NINF, NINF, NINF]])
    probs = probs_from_logits(logits, params)
    assert np.isfinite(probs).all()
    assert (probs[np.isinf(logits)] == 0).all()
    np.testing.assert_allclose(probs.sum(-1), np.ones(2), rtol=1e-6)
    assert probs[1, 0] == 1.0


# ---------------------------------------------------------------------------------------------------------------
# Filters against a slow reference
# ---------------------------------------------------------------------------------------------------------------


def reference_probs(row, params):
    """Slow, obviously correct reference for one row of logits (plain Python, float64).

    Order: temperature, top-k, softmax, top-p, min-p, renormalise; temperature 0 is the one-hot argmax
    (first index on ties).
    """
    row = [float(x) for x in row]
    vocab = len(row)
    if params.temperature == 0:
        best = max(range(vocab), key=lambda i: (row[i], -i))
        return [1.0 if i == best else 0.0 for i in range(vocab)]
    scaled = [x / params.temperature for x in row]
    keep = [not math.isinf(x) for x in scaled]
    if 0 < params.top_k < vocab:
        by_logit = sorted(range(vocab), key=lambda i: -scaled[i])
        top = set(by_logit[: params.top_k])
        keep = [keep[i] and i in top for i in range(vocab)]
    peak = max(scaled[i] for i in range(vocab) if keep[i])
    weights = [math.exp(scaled[i] - peak) if keep[i] else 0.0 for i in range(vocab)]
    total = sum(weights)
    probs = [w / total for w in weights]
    if params.top_p < 1.0:
        mass = 0.0
        kept = set()
        for i in sorted(range(vocab), key=lambda i: -probs[i]):
            if mass >= params.top_p:
                break
            kept.add(i)
            mass += probs[i]
        probs = [probs[i] if i in kept else 0.0 for i in range(vocab)]
    if params.min_p > 0:
        threshold = params.min_p * max(probs)
        probs = [x if x >= threshold else 0.0 for x in probs]
    total = sum(probs)
    return [x / total for x in probs]


def reference_batch(logits, params):
    flat = np.asarray(logits, dtype=np.float64).reshape(-1, logits.shape[-1]).tolist()
    out = np.array([reference_probs(row, params) for row in flat])
    return out.reshape(logits.shape)


FILTER_PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.3),
    SamplingParams(temperature=2.5),
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=1.0, top_k=3),
    SamplingParams(temperature=0.7, top_k=7),
    SamplingParams(temperature=1.0, top_k=1000),
    SamplingParams(temperature=1.0, top_p=0.05),
    SamplingParams(temperature=1.0, top_p=0.5),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=1.0, top_p=0.99),
    SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=1.0, min_p=0.3),
    SamplingParams(temperature=0.8, top_k=10, top_p=0.9),
    SamplingParams(temperature=1.3, top_p=0.7, min_p=0.1),
    SamplingParams(temperature=0.6, top_k=5, min_p=0.2),
    SamplingParams(temperature=0.9, top_k=12, top_p=0.85, min_p=0.05),
]


def random_logits(seed, shape, scale=2.0):
    return (make_generator(seed).standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("params", FILTER_PARAMS, ids=repr)
@pytest.mark.parametrize(("seed", "shape"), [(0, (3, 5, 8)), (1, (4, 17)), (2, (2, 3, 32)), (3, (24,))])
def test_filters_match_reference(params, seed, shape):
    logits = random_logits(seed, shape)
    probs = probs_from_logits(logits, params)
    assert probs.shape == logits.shape
    assert probs.dtype == np.float32
    expected = reference_batch(logits, params)
    np.testing.assert_allclose(probs, expected, atol=1e-6, rtol=1e-5)
    # the filters keep exactly the reference's support
    np.testing.assert_array_equal(probs > 0, expected > 0)
    np.testing.assert_allclose(probs.sum(-1, dtype=np.float64), np.ones(shape[:-1]), rtol=1e-6)


@pytest.mark.parametrize("params", FILTER_PARAMS[:3] + FILTER_PARAMS[-4:], ids=repr)
def test_filters_match_reference_with_neg_inf(params):
    logits = random_logits(7, (6, 16))
    mask = make_generator(8).random((6, 16)) < 0.5
    mask[:, 0] = False  # at least one finite logit per row
    mask[5, 1:] = True  # a row with a single finite logit
    logits[mask] = NINF
    probs = probs_from_logits(logits, params)
    np.testing.assert_allclose(probs, reference_batch(logits, params), atol=1e-6, rtol=1e-5)
    assert (probs[mask] == 0).all()
    assert probs[5, 0] == 1.0


def test_top_k_keeps_exactly_k_largest():
    logits = random_logits(11, (5, 20))
    for k in (1, 2, 5, 19):
        probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=k))
        assert ((probs > 0).sum(-1) == k).all()
        top = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
        assert (np.take_along_axis(probs, top, -1) > 0).all()


def test_top_p_keeps_smallest_set_reaching_mass():
    # probabilities 0.5, 0.3, 0.15, 0.05 (logits are their logs)
    logits = np.log(arr([0.5, 0.3, 0.15, 0.05]))
    support = {
        0.3: [True, False, False, False],  # most likely token alone reaches 0.3
        0.45: [True, False, False, False],
        0.6: [True, True, False, False],
        0.9: [True, True, True, False],
        0.96: [True, True, True, True],
    }
    for top_p, keep in support.items():
        probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=top_p))
        assert (probs > 0).tolist() == keep, top_p


def test_top_p_tiny_keeps_most_likely_token():
    logits = random_logits(12, (4, 10))
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=1e-6))
    expected = np.zeros_like(probs)
    np.put_along_axis(expected, logits.argmax(-1)[:, None], 1.0, -1)
    np.testing.assert_array_equal(probs, expected)


def test_min_p_threshold_relative_to_max():
    # probabilities 0.5, 0.25, 0.2, 0.05: min_p 0.4 keeps p >= 0.2
    logits = np.log(arr([0.5, 0.25, 0.2, 0.05]))
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, min_p=0.39))
    assert (probs > 0).tolist() == [True, True, True, False]
    np.testing.assert_allclose(probs, arr([0.5, 0.25, 0.2, 0.0]) / 0.95, rtol=1e-6)


@pytest.mark.parametrize("shape", [(8,), (3, 5, 8), (2, 4, 32)])
def test_temperature_zero_is_one_hot_argmax(shape):
    logits = random_logits(13, shape)
    for params in (SamplingParams(), SamplingParams(temperature=0.0, top_k=3, top_p=0.5, min_p=0.2)):
        probs = probs_from_logits(logits, params)
        expected = np.zeros_like(logits)
        np.put_along_axis(expected, logits.argmax(-1)[..., None], 1.0, -1)
        np.testing.assert_array_equal(probs, expected)
        np.testing.assert_array_equal(probs, reference_batch(logits, params))


def test_temperature_zero_ties_go_to_first_index():
    logits = arr([[1.0, 3.0, 3.0, 0.0], [NINF, 2.0, 2.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
    probs = probs_from_logits(logits, SamplingParams())
    assert probs.argmax(-1).tolist() == [1, 1, 0]
    np.testing.assert_array_equal(probs.sum(-1), np.ones(3))
    assert ((probs == 0) | (probs == 1)).all()


def test_float16_and_float64_logits_give_float32_probs():
    logits = random_logits(14, (3, 12))
    params = SamplingParams(temperature=0.8, top_p=0.9)
    ref = probs_from_logits(logits, params)
    for dtype in (np.float16, np.float64):
        probs = probs_from_logits(logits.astype(dtype), params)
        assert probs.dtype == np.float32
        np.testing.assert_array_equal(probs, probs_from_logits(logits.astype(dtype).astype(np.float32), params))
    np.testing.assert_array_equal(probs_from_logits(logits.astype(np.float64), params), ref)
    strided = np.repeat(logits, 2, axis=1)[:, ::2]  # not contiguous: copied, same result
    np.testing.assert_array_equal(probs_from_logits(strided, params), ref)
    np.testing.assert_array_equal(probs_from_logits(logits.tolist(), params), ref)


# ---------------------------------------------------------------------------------------------------------------
# log_probs
# ---------------------------------------------------------------------------------------------------------------


def test_log_probs_is_a_stable_log_softmax_in_float32():
    from specwise.sampling import log_probs

    logits = random_logits(21, (3, 5000), scale=8.0)
    logits[0, :100] = NINF
    logits[2] += 1e4  # large offsets: max-subtracted, nothing overflows
    lp = log_probs(logits)
    assert lp.dtype == np.float32 and lp.shape == logits.shape
    x = logits.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    ref = x - np.log(np.exp(x).sum(-1, keepdims=True))
    assert (lp[0, :100] == NINF).all()
    np.testing.assert_allclose(lp[np.isfinite(ref)], ref[np.isfinite(ref)], atol=2e-5, rtol=1e-6)
    np.testing.assert_allclose(np.exp(lp.astype(np.float64)).sum(-1), np.ones(3), rtol=1e-5)
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.9)
    cut = log_probs(logits, params)
    probs = probs_from_logits(logits, params)
    np.testing.assert_array_equal(cut == NINF, probs == 0)
    np.testing.assert_allclose(np.exp(cut[probs > 0]), probs[probs > 0], rtol=1e-6)
    greedy = log_probs(logits, SamplingParams())
    assert ((greedy == 0).sum(-1) == 1).all() and (greedy[greedy != 0] == NINF).all()
    with pytest.raises(ValueError, match="NaN"):
        log_probs(np.array([[0.0, float("nan")]], dtype=np.float32))


def test_probs_and_log_probs_agree_with_torch_within_float32_rounding():
    """The definitions these functions had on torch: the same supports and argmax, values to float32 rounding."""
    from conftest import needs_hf
    from specwise.sampling import log_probs

    torch = needs_hf()
    logits = random_logits(22, (4, 49152), scale=4.0)
    logits[1, :7] = NINF
    t = torch.from_numpy(logits)
    np.testing.assert_allclose(log_probs(logits), torch.log_softmax(t, dim=-1).numpy(), atol=2e-5, rtol=1e-6)
    np.testing.assert_array_equal(probs_from_logits(logits, SamplingParams()).argmax(-1), t.argmax(dim=-1).numpy())
    for params in (SamplingParams(temperature=0.8), SamplingParams(temperature=1.0, top_k=50)):
        probs = probs_from_logits(logits, params)
        scaled = t / params.temperature
        if params.top_k:
            kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        ref = torch.softmax(scaled, dim=-1).numpy()
        np.testing.assert_array_equal(probs > 0, ref > 0)
        np.testing.assert_allclose(probs, ref, atol=1e-7, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# sample
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(16,), (7, 16), (3, 5, 16)])
def test_sample_shape_and_dtype(shape):
    probs = probs_from_logits(random_logits(15, shape), SamplingParams(temperature=1.0))
    tokens = sample(probs, make_generator(0))
    assert tokens.shape == shape[:-1]
    assert tokens.dtype == np.int64
    assert ((tokens >= 0) & (tokens < shape[-1])).all()


def test_sample_is_reproducible_with_seeded_generator():
    probs = probs_from_logits(random_logits(16, (4, 50, 32)), SamplingParams(temperature=1.0))
    first = sample(probs, make_generator(123))
    second = sample(probs, make_generator(123))
    other = sample(probs, make_generator(124))
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, other)


def test_params_generator_is_seeded():
    probs = probs_from_logits(random_logits(17, (100, 32)), SamplingParams(temperature=1.0))
    params = SamplingParams(temperature=1.0, seed=5)
    np.testing.assert_array_equal(sample(probs, params.generator()), sample(probs, params.generator()))
    np.testing.assert_array_equal(sample(probs, params.generator()), sample(probs, make_generator(5)))
    assert not np.array_equal(sample(probs, SamplingParams(temperature=1.0).generator()), sample(probs, None))


def test_generators_are_philox_streams_fixed_by_the_seed():
    """The contract: a numpy Generator over Philox, the same stream on every machine; a seed None is fresh each time,
    a negative seed is taken modulo 2**64."""
    gen = make_generator(0)
    assert isinstance(gen, np.random.Generator) and isinstance(gen.bit_generator, np.random.Philox)
    np.testing.assert_array_equal(make_generator(0).random(4), np.random.Generator(np.random.Philox(0)).random(4))
    np.testing.assert_array_equal(make_generator(-1).random(3), make_generator(2**64 - 1).random(3))
    assert make_generator(None).random() != make_generator(None).random()
    assert isinstance(SamplingParams(seed=3).generator().bit_generator, np.random.Philox)
    # pinned: the first uniforms of seed 42 (a change here changes every seeded run's output)
    np.testing.assert_allclose(make_generator(42).random(2), PHILOX_42, rtol=0, atol=0)


def test_sample_respects_support():
    """Zero-probability tokens are never drawn; a one-hot row always gives its token."""
    logits = random_logits(18, (2000, 16))
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=3))
    tokens = sample(probs, make_generator(1))
    assert (np.take_along_axis(probs, tokens[:, None], -1) > 0).all()
    one_hot = np.eye(10, 16, dtype=np.float32)
    assert sample(one_hot, make_generator(2)).tolist() == list(range(10))


def test_tiny_top_p_keeps_the_most_likely_token():
    """A top_p that rounds to 0 in float32 keeps the argmax instead of dropping every token (found by fuzzing)."""
    logits = arr([[0.5, 2.0, -1.0, 1.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=1e-215))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_p_widens_past_the_first_candidates_on_a_large_flat_vocabulary():
    """A flat distribution needs hundreds of tokens for top_p = 0.9: the partial sort must widen and agree."""
    logits = random_logits(19, (3, 3000), scale=0.3)
    for top_p in (0.5, 0.9, 0.999):
        params = SamplingParams(temperature=1.0, top_p=top_p)
        probs = probs_from_logits(logits, params)
        expected = reference_batch(logits, params)
        np.testing.assert_array_equal(probs > 0, expected > 0, err_msg=str(top_p))
        assert int((probs[0] > 0).sum()) > 64  # more than the first partition window
        np.testing.assert_allclose(probs, expected, atol=1e-6, rtol=1e-4)


def test_top_p_keeps_every_token_tied_with_the_last_kept_one():
    """Ties never depend on sort order: tokens as likely as the least likely kept token are all kept."""
    logits = arr([[1.0, 0.0, 1.0, 1.0, -2.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.4))
    assert (probs > 0).tolist() == [[True, False, True, True, False]]
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-6)


def test_sample_follows_the_distribution_on_a_large_vocabulary():
    """Inverse-CDF sampling: chi-square goodness of fit, zero-probability tokens never drawn."""
    from test_engine import chisquare

    vocab = 49152
    ids = np.array([3, 17, 1000, 20000, 49151])
    weights = arr([0.05, 0.4, 0.15, 0.1, 0.3])
    probs = np.zeros(vocab, dtype=np.float32)
    probs[ids] = weights
    gen = make_generator(3)
    tokens = np.concatenate([sample(np.broadcast_to(probs, (1000, vocab)), gen) for _ in range(20)])  # 20,000 draws
    assert bool(np.isin(tokens, ids).all())
    counts = np.array([(tokens == i).sum() for i in ids], dtype=np.float64)
    expected = weights.astype(np.float64) / weights.astype(np.float64).sum() * counts.sum()
    assert chisquare(counts, expected) > 1e-4


def test_sample_accepts_unnormalised_rows_and_rejects_invalid_ones():
    tokens = sample(arr([[0.0, 3.0, 0.0], [2.0, 0.0, 0.0]]), make_generator(0))
    assert tokens.tolist() == [1, 0]
    assert sample(np.array([[0.0, 3.0, 0.0], [2.0, 0.0, 0.0]]), make_generator(0)).tolist() == [1, 0]  # float64
    for bad in ([0.0, 0.0, 0.0], [0.5, float("nan"), 0.5], [1.0, -0.5, 0.5], [float("inf"), 0.0, 1.0]):
        for dtype in (np.float32, np.float64):
            with pytest.raises(ValueError, match="cannot sample"):
                sample(np.array(bad, dtype=dtype), None)


# ---- the native logits scan (argmax and invalid-value check in one pass) ----------------------------------


@pytest.fixture(params=["portable", "avx2", "avx512"])
def scan_isa(request):
    from specwise.models.kernels import quant

    if not quant.quantized_available():
        pytest.skip("native kernels not built")
    used = quant.set_isa(request.param)
    if used != request.param:
        quant.set_isa(None)
        pytest.skip(f"this CPU has no {request.param} path")
    yield used
    quant.set_isa(None)


def randn(g, *shape):
    return g.standard_normal(shape, dtype=np.float32)


def test_native_argmax_matches_numpy(scan_isa):
    from specwise.sampling import _scan, argmax

    g = make_generator(0)
    for n in (1, 7, 8, 15, 16, 17, 100, 49152, 151936):
        x = randn(g, 3, n)
        assert _scan(x) is not None
        out = argmax(x)
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, x.argmax(axis=-1), err_msg=str(n))
    ties = np.zeros((2, 40), dtype=np.float32)
    ties[0, [3, 17, 33]] = 1.0  # several maxima: the first, as np.argmax
    ties[1, [39, 20]] = 5.0
    assert argmax(ties).tolist() == [3, 20] == ties.argmax(axis=-1).tolist()
    x = np.full((1, 33), NINF, dtype=np.float32)
    x[0, 32] = -1e30
    assert argmax(x).tolist() == [32]
    batched = randn(g, 2, 3, 50)  # [B, rows, vocab] as verify_greedy passes it
    np.testing.assert_array_equal(argmax(batched), batched.argmax(axis=-1))


def test_native_check_logits_finds_every_invalid_value(scan_isa):
    g = make_generator(2)
    for n in (5, 64, 1003):
        for at in (0, n // 2, n - 1):
            x = randn(g, 2, n)
            x[1, at] = float("nan")
            with pytest.raises(ValueError, match="NaN"):
                check_logits(x)
            x = randn(g, 2, n)
            x[0, at] = float("inf")
            with pytest.raises(ValueError, match=r"\+inf"):
                check_logits(x)
        x = randn(g, 2, n)
        x[1] = NINF
        with pytest.raises(ValueError, match="entirely -inf"):
            check_logits(x)
        x = randn(g, 2, n)
        x[0, : n - 1] = NINF  # -inf forbids tokens: allowed while one stays finite
        check_logits(x)


def test_greedy_choices_check_and_choose_in_one_pass(scan_isa):
    from specwise.sampling import greedy_choices

    g = make_generator(1)
    for rows in (1, 3, 9, 2):  # the output buffer grows, then is reused
        x = randn(g, rows, 1003)
        x[0, 5] = x[0].max() + 1.0
        assert greedy_choices(x) == x.argmax(axis=-1).tolist()
    ties = np.zeros((1, 40), dtype=np.float32)
    ties[0, [17, 3]] = 2.0
    assert greedy_choices(ties) == [3]  # the first largest value, as np.argmax
    for bad, match in ((float("nan"), "NaN"), (float("inf"), r"\+inf")):
        x = randn(g, 2, 64)
        x[1, 10] = bad
        with pytest.raises(ValueError, match=match):
            greedy_choices(x)
    x = randn(g, 2, 64)
    x[0] = NINF
    with pytest.raises(ValueError, match="entirely -inf"):
        greedy_choices(x)
    y = randn(g, 3, 40)[:, ::2]  # not contiguous: checked and chosen by numpy
    assert greedy_choices(y) == y.argmax(axis=-1).tolist()
    y[2, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        greedy_choices(y)
    z = randn(g, 2, 30).astype(np.float64)  # not float32: numpy
    assert greedy_choices(z) == z.argmax(axis=-1).tolist()


def test_argmax_with_nan_falls_back_to_numpy():
    from specwise.sampling import argmax

    g = make_generator(4)
    x = randn(g, 2, 20)
    x[1, 4] = float("nan")
    np.testing.assert_array_equal(argmax(x), x.argmax(axis=-1))
    y = randn(g, 4, 30)[:, ::2]  # not contiguous: numpy's argmax
    np.testing.assert_array_equal(argmax(y), y.argmax(axis=-1))


# ---- the native distribution (temperature, top-k, softmax, top-p, min-p in one pass per row) ---------------

NATIVE_SETTINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_p=0.95),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.3, top_k=7),
    SamplingParams(temperature=1.0, min_p=0.2),
    SamplingParams(temperature=0.5, top_p=1e-200),
]


def _native():
    import specwise.sampling as s
    from specwise.models.kernels import native_library

    if native_library() is None:
        pytest.skip("native kernels not built")
    return s, native_library()


def _numpy_probs(s, logits, params):
    saved, s._NATIVE["specwise_probs"] = s._native("specwise_probs"), False
    try:
        return probs_from_logits(logits, params)
    finally:
        s._NATIVE["specwise_probs"] = saved


@pytest.mark.parametrize("params", NATIVE_SETTINGS, ids=lambda p: f"t{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_native_probs_match_the_numpy_definition(params):
    s, _ = _native()
    g = make_generator(3)
    for vocab in (13, 1000, 49152):
        logits = randn(g, 4, vocab) * 4  # peaked like a language model's
        logits[1, :5] = NINF
        fast = probs_from_logits(logits, params)
        ref = _numpy_probs(s, logits, params)
        assert fast.shape == ref.shape and fast.dtype == ref.dtype == np.float32
        np.testing.assert_array_equal(fast > 0, ref > 0)  # the same tokens kept
        np.testing.assert_allclose(fast, ref, atol=2e-6, rtol=1e-4)
        np.testing.assert_allclose(fast.sum(-1, dtype=np.float64), np.ones(4), atol=1e-5, rtol=0)


def test_native_probs_keep_ties_and_the_top_token():
    _native()
    s, _ = _native()
    logits = arr([[2.0, 5.0, 5.0, 1.0, 5.0, 0.0]])
    for probs in (probs_from_logits, lambda x, params: _numpy_probs(s, x, params)):
        p = probs(logits, SamplingParams(temperature=1.0, top_k=2))  # ties with the 2nd largest kept
        assert (p[0] > 0).tolist() == [False, True, True, False, True, False]
        p = probs(logits, SamplingParams(temperature=1.0, top_p=1e-9))  # one tie group: all kept
        assert (p[0] > 0).tolist() == [False, True, True, False, True, False]
        p = probs(arr([[0.0, 3.0, 1.0]]), SamplingParams(temperature=2.0, top_p=1e-200))
        assert p[0].tolist() == [0.0, 1.0, 0.0]
        with pytest.raises(ValueError, match="overflow at temperature"):
            probs(arr([[3e38, 0.0]]), SamplingParams(temperature=0.01))


def test_native_probs_are_the_same_on_every_path_and_for_any_row_count():
    """Every instruction path the CPU runs (the library's one choice, quant.set_isa) gives the same bits, and a row's
    probabilities do not depend on the rows beside it; widths around the loops' lanes and chunks, and a vocabulary's."""
    from specwise.models.kernels import quant

    _native()
    g = make_generator(5)
    best = quant.set_isa(None)
    try:
        for n in (5003, 7, 256, 49152):
            logits = randn(g, 5, n) * 3
            quant.set_isa("portable")
            want = [probs_from_logits(logits, params) for params in NATIVE_SETTINGS]
            for r in range(5):
                for params, together in zip(NATIVE_SETTINGS, want):
                    np.testing.assert_array_equal(probs_from_logits(logits[r : r + 1], params)[0], together[r])
            for name in quant.ISAS[1 : quant.ISAS.index(best) + 1]:
                assert quant.set_isa(name) == name
                for params, together in zip(NATIVE_SETTINGS, want):
                    np.testing.assert_array_equal(probs_from_logits(logits, params), together, err_msg=f"{name} {n}")
    finally:
        quant.set_isa(None)


def test_native_sample_draws_what_the_numpy_path_draws():
    s, _ = _native()
    g = make_generator(11)
    probs = probs_from_logits(randn(g, 3, 3000) * 3, SamplingParams(temperature=1.0))
    probs[1, ::2] = 0.0  # zeros in the middle: never drawn
    fast_gen, ref_gen = make_generator(7), make_generator(7)
    fast = np.stack([sample(probs, fast_gen) for _ in range(300)])
    many = np.broadcast_to(probs, (40, 3, 3000)).reshape(120, 3000)  # more rows than the numpy path's loop takes
    fast_many = sample(many, make_generator(8))
    saved, s._NATIVE["specwise_sample"] = s._native("specwise_sample"), False
    try:
        ref = np.stack([sample(probs, ref_gen) for _ in range(300)])
        ref_many = sample(many, make_generator(8))
    finally:
        s._NATIVE["specwise_sample"] = saved
    np.testing.assert_array_equal(fast, ref)
    np.testing.assert_array_equal(fast_many, ref_many)
    assert bool((probs[1][fast[:, 1]] > 0).all())


def test_native_sample_edges():
    _native()
    one = np.zeros((1, 1000), dtype=np.float32)
    one[0, 999] = 0.25  # unnormalised, only the last token
    assert sample(one, make_generator(0)).tolist() == [999]
    first = np.zeros((2, 700), dtype=np.float32)
    first[0, 0] = 1.0
    first[1, 300] = 2.0
    assert sample(first, make_generator(0)).tolist() == [0, 300]
    for bad in (np.zeros((1, 10), dtype=np.float32), arr([[0.5, -0.1, 0.6]]), arr([[0.5, float("nan")]])):
        with pytest.raises(ValueError, match="cannot sample"):
            sample(bad, make_generator(0))
