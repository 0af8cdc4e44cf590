"""Tests for specwise.sampling: parameter validation, logits checks, each filter against a slow reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specwise.sampling import SamplingParams, check_logits, probs_from_logits, sample

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
        (torch.tensor([[0.0, float("nan"), 1.0]]), "NaN"),
        (torch.tensor([[0.0, float("inf"), 1.0]]), r"\+inf"),
        (torch.tensor([[0.0, 1.0, 2.0], [float("-inf")] * 3]), "entirely -inf"),
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
    ninf = float("-inf")
    logits = torch.tensor([[ninf, 1.0, ninf, 0.5, 2.0], [3.0, ninf, ninf, ninf, ninf]])
    probs = probs_from_logits(logits, params)
    assert torch.isfinite(probs).all()
    assert (probs[torch.isinf(logits)] == 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))
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
    flat = logits.reshape(-1, logits.shape[-1]).double().tolist()
    out = np.array([reference_probs(row, params) for row in flat])
    return torch.from_numpy(out).reshape(logits.shape)


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
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen) * scale


@pytest.mark.parametrize("params", FILTER_PARAMS, ids=repr)
@pytest.mark.parametrize(("seed", "shape"), [(0, (3, 5, 8)), (1, (4, 17)), (2, (2, 3, 32)), (3, (24,))])
def test_filters_match_reference(params, seed, shape):
    logits = random_logits(seed, shape)
    probs = probs_from_logits(logits, params)
    assert probs.shape == logits.shape
    assert probs.dtype == torch.float32
    expected = reference_batch(logits, params)
    torch.testing.assert_close(probs.double(), expected, atol=1e-6, rtol=1e-5)
    # the filters keep exactly the reference's support
    assert torch.equal(probs > 0, expected > 0)
    torch.testing.assert_close(probs.sum(-1).double(), torch.ones(shape[:-1], dtype=torch.float64))


@pytest.mark.parametrize("params", FILTER_PARAMS[:3] + FILTER_PARAMS[-4:], ids=repr)
def test_filters_match_reference_with_neg_inf(params):
    logits = random_logits(7, (6, 16))
    mask = torch.rand((6, 16), generator=torch.Generator().manual_seed(8)) < 0.5
    mask[:, 0] = False  # at least one finite logit per row
    mask[5, 1:] = True  # a row with a single finite logit
    logits = logits.masked_fill(mask, float("-inf"))
    probs = probs_from_logits(logits, params)
    torch.testing.assert_close(probs.double(), reference_batch(logits, params), atol=1e-6, rtol=1e-5)
    assert (probs[mask] == 0).all()
    assert probs[5, 0] == 1.0


def test_top_k_keeps_exactly_k_largest():
    logits = random_logits(11, (5, 20))
    for k in (1, 2, 5, 19):
        probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=k))
        assert ((probs > 0).sum(-1) == k).all()
        top = torch.topk(logits, k, dim=-1).indices
        assert (probs.gather(-1, top) > 0).all()


def test_top_p_keeps_smallest_set_reaching_mass():
    # probabilities 0.5, 0.3, 0.15, 0.05 (logits are their logs)
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
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
    expected = torch.zeros_like(probs).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
    assert torch.equal(probs, expected)


def test_min_p_threshold_relative_to_max():
    # probabilities 0.5, 0.25, 0.2, 0.05: min_p 0.4 keeps p >= 0.2
    logits = torch.tensor([0.5, 0.25, 0.2, 0.05]).log()
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, min_p=0.39))
    assert (probs > 0).tolist() == [True, True, True, False]
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.25, 0.2, 0.0]) / 0.95)


@pytest.mark.parametrize("shape", [(8,), (3, 5, 8), (2, 4, 32)])
def test_temperature_zero_is_one_hot_argmax(shape):
    logits = random_logits(13, shape)
    for params in (SamplingParams(), SamplingParams(temperature=0.0, top_k=3, top_p=0.5, min_p=0.2)):
        probs = probs_from_logits(logits, params)
        expected = torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
        assert torch.equal(probs, expected)
        torch.testing.assert_close(probs.double(), reference_batch(logits, params))


def test_temperature_zero_ties_go_to_first_index():
    ninf = float("-inf")
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [ninf, 2.0, 2.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
    probs = probs_from_logits(logits, SamplingParams())
    assert probs.argmax(-1).tolist() == [1, 1, 0]
    assert torch.equal(probs.sum(-1), torch.ones(3))
    assert ((probs == 0) | (probs == 1)).all()


def test_float16_and_float64_logits_give_float32_probs():
    logits = random_logits(14, (3, 12))
    params = SamplingParams(temperature=0.8, top_p=0.9)
    ref = probs_from_logits(logits, params)
    for dtype in (torch.float16, torch.float64):
        probs = probs_from_logits(logits.to(dtype), params)
        assert probs.dtype == torch.float32
        torch.testing.assert_close(probs, probs_from_logits(logits.to(dtype).float(), params))
    torch.testing.assert_close(probs_from_logits(logits.double(), params), ref)


# ---------------------------------------------------------------------------------------------------------------
# sample
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(16,), (7, 16), (3, 5, 16)])
def test_sample_shape_and_dtype(shape):
    probs = probs_from_logits(random_logits(15, shape), SamplingParams(temperature=1.0))
    tokens = sample(probs, torch.Generator().manual_seed(0))
    assert tokens.shape == shape[:-1]
    assert tokens.dtype == torch.int64
    assert ((tokens >= 0) & (tokens < shape[-1])).all()


def test_sample_is_reproducible_with_seeded_generator():
    probs = probs_from_logits(random_logits(16, (4, 50, 32)), SamplingParams(temperature=1.0))
    first = sample(probs, torch.Generator().manual_seed(123))
    second = sample(probs, torch.Generator().manual_seed(123))
    other = sample(probs, torch.Generator().manual_seed(124))
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_params_generator_is_seeded():
    probs = probs_from_logits(random_logits(17, (100, 32)), SamplingParams(temperature=1.0))
    params = SamplingParams(temperature=1.0, seed=5)
    assert torch.equal(sample(probs, params.generator()), sample(probs, params.generator()))


def test_sample_respects_support():
    """Zero-probability tokens are never drawn; a one-hot row always gives its token."""
    logits = random_logits(18, (2000, 16))
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=3))
    tokens = sample(probs, torch.Generator().manual_seed(1))
    assert (probs.gather(-1, tokens[:, None]) > 0).all()
    one_hot = torch.zeros(10, 16).scatter(-1, torch.arange(10)[:, None], 1.0)
    assert sample(one_hot, torch.Generator().manual_seed(2)).tolist() == list(range(10))


def test_tiny_top_p_keeps_the_most_likely_token():
    """A top_p that rounds to 0 in float32 keeps the argmax instead of dropping every token (found by fuzzing)."""
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=1e-215))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_p_widens_past_the_first_candidates_on_a_large_flat_vocabulary():
    """A flat distribution needs hundreds of tokens for top_p = 0.9: the partial sort must widen and agree."""
    logits = random_logits(19, (3, 3000), scale=0.3)
    for top_p in (0.5, 0.9, 0.999):
        params = SamplingParams(temperature=1.0, top_p=top_p)
        probs = probs_from_logits(logits, params)
        expected = reference_batch(logits, params)
        assert torch.equal(probs > 0, expected > 0), top_p
        assert int((probs[0] > 0).sum()) > 64  # more than the first topk window
        torch.testing.assert_close(probs.double(), expected, atol=1e-6, rtol=1e-4)


def test_top_p_keeps_every_token_tied_with_the_last_kept_one():
    """Ties never depend on sort order: tokens as likely as the least likely kept token are all kept."""
    logits = torch.tensor([[1.0, 0.0, 1.0, 1.0, -2.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.4))
    assert (probs > 0).tolist() == [[True, False, True, True, False]]
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))


def test_sample_follows_the_distribution_on_a_large_vocabulary():
    """Inverse-CDF sampling: chi-square goodness of fit, zero-probability tokens never drawn."""
    from scipy.stats import chisquare

    vocab = 49152
    ids = torch.tensor([3, 17, 1000, 20000, 49151])
    weights = torch.tensor([0.05, 0.4, 0.15, 0.1, 0.3])
    probs = torch.zeros(vocab).index_put_((ids,), weights)
    n = 20000
    tokens = sample(probs.expand(n, vocab), torch.Generator().manual_seed(3))
    assert bool(torch.isin(tokens, ids).all())
    counts = torch.stack([(tokens == i).sum() for i in ids]).double()
    expected = weights.double() / weights.double().sum() * counts.sum()
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-4


def test_sample_accepts_unnormalised_rows_and_rejects_invalid_ones():
    tokens = sample(torch.tensor([[0.0, 3.0, 0.0], [2.0, 0.0, 0.0]]), torch.Generator().manual_seed(0))
    assert tokens.tolist() == [1, 0]
    for bad in ([0.0, 0.0, 0.0], [0.5, float("nan"), 0.5], [1.0, -0.5, 0.5], [float("inf"), 0.0, 1.0]):
        with pytest.raises(ValueError, match="cannot sample"):
            sample(torch.tensor(bad), None)


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


def test_native_argmax_matches_torch(scan_isa):
    from specwise.sampling import _scan, argmax

    g = torch.Generator().manual_seed(0)
    for n in (1, 7, 8, 15, 16, 17, 100, 49152, 151936):
        x = torch.randn(3, n, generator=g)
        assert _scan(x) is not None
        assert torch.equal(argmax(x), x.argmax(dim=-1)), n
    ties = torch.zeros(2, 40)
    ties[0, [3, 17, 33]] = 1.0  # several maxima: the first, as torch.argmax
    ties[1, [39, 20]] = 5.0
    assert argmax(ties).tolist() == [3, 20] == ties.argmax(dim=-1).tolist()
    x = torch.full((1, 33), float("-inf"))
    x[0, 32] = -1e30
    assert argmax(x).tolist() == [32]
    batched = torch.randn(2, 3, 50, generator=g)  # [B, rows, vocab] as verify_greedy passes it
    assert torch.equal(argmax(batched), batched.argmax(dim=-1))


def test_native_check_logits_finds_every_invalid_value(scan_isa):
    for n in (5, 64, 1003):
        for at in (0, n // 2, n - 1):
            x = torch.randn(2, n)
            x[1, at] = float("nan")
            with pytest.raises(ValueError, match="NaN"):
                check_logits(x)
            x = torch.randn(2, n)
            x[0, at] = float("inf")
            with pytest.raises(ValueError, match=r"\+inf"):
                check_logits(x)
        x = torch.randn(2, n)
        x[1] = float("-inf")
        with pytest.raises(ValueError, match="entirely -inf"):
            check_logits(x)
        x = torch.randn(2, n)
        x[0, : n - 1] = float("-inf")  # -inf forbids tokens: allowed while one stays finite
        check_logits(x)


def test_greedy_choices_check_and_choose_in_one_pass(scan_isa):
    from specwise.sampling import greedy_choices

    g = torch.Generator().manual_seed(1)
    for rows in (1, 3, 9, 2):  # the output buffer grows, then is reused
        x = torch.randn(rows, 1003, generator=g)
        x[0, 5] = x[0].max() + 1.0
        assert greedy_choices(x) == x.argmax(dim=-1).tolist()
    ties = torch.zeros(1, 40)
    ties[0, [17, 3]] = 2.0
    assert greedy_choices(ties) == [3]  # the first largest value, as torch.argmax
    for bad, match in ((float("nan"), "NaN"), (float("inf"), r"\+inf")):
        x = torch.randn(2, 64)
        x[1, 10] = bad
        with pytest.raises(ValueError, match=match):
            greedy_choices(x)
    x = torch.randn(2, 64)
    x[0] = float("-inf")
    with pytest.raises(ValueError, match="entirely -inf"):
        greedy_choices(x)
    y = torch.randn(3, 40)[:, ::2]  # not contiguous: checked and chosen by torch
    assert greedy_choices(y) == y.argmax(dim=-1).tolist()
    y[2, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        greedy_choices(y)


def test_argmax_with_nan_falls_back_to_torch():
    from specwise.sampling import argmax

    x = torch.randn(2, 20)
    x[1, 4] = float("nan")
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    y = torch.randn(4, 30)[:, ::2]  # not contiguous: torch's argmax
    assert torch.equal(argmax(y), y.argmax(dim=-1))


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


def _torch_probs(s, logits, params):
    saved, s._NATIVE["specwise_probs"] = s._native("specwise_probs"), False
    try:
        return probs_from_logits(logits, params)
    finally:
        s._NATIVE["specwise_probs"] = saved


@pytest.mark.parametrize("params", NATIVE_SETTINGS, ids=lambda p: f"t{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_native_probs_match_the_torch_definition(params):
    s, _ = _native()
    g = torch.Generator().manual_seed(3)
    for vocab in (13, 1000, 49152):
        logits = torch.randn(4, vocab, generator=g) * 4  # peaked like a language model's
        logits[1, :5] = float("-inf")
        fast = probs_from_logits(logits, params)
        ref = _torch_probs(s, logits, params)
        assert fast.shape == ref.shape and fast.dtype == torch.float32
        assert torch.equal(fast > 0, ref > 0)  # the same tokens kept
        torch.testing.assert_close(fast, ref, atol=2e-6, rtol=1e-4)
        torch.testing.assert_close(fast.double().sum(-1), torch.ones(4, dtype=torch.float64), atol=1e-5, rtol=0)


def test_native_probs_keep_ties_and_the_top_token():
    _native()
    logits = torch.tensor([[2.0, 5.0, 5.0, 1.0, 5.0, 0.0]])
    p = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))  # ties with the 2nd largest kept
    assert (p[0] > 0).tolist() == [False, True, True, False, True, False]
    p = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=1e-9))  # one tie group: all kept
    assert (p[0] > 0).tolist() == [False, True, True, False, True, False]
    p = probs_from_logits(torch.tensor([[0.0, 3.0, 1.0]]), SamplingParams(temperature=2.0, top_p=1e-200))
    assert p[0].tolist() == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="overflow at temperature"):
        probs_from_logits(torch.tensor([[3e38, 0.0]]), SamplingParams(temperature=0.01))


def test_native_probs_are_the_same_on_every_path_and_for_any_row_count():
    """Every instruction path the CPU runs (the library's one choice, quant.set_isa) gives the same bits, and a row's
    probabilities do not depend on the rows beside it; widths around the loops' lanes and chunks, and a vocabulary's."""
    from specwise.models.kernels import quant

    _native()
    g = torch.Generator().manual_seed(5)
    best = quant.set_isa(None)
    try:
        for n in (5003, 7, 256, 49152):
            logits = torch.randn(5, n, generator=g) * 3
            quant.set_isa("portable")
            want = [probs_from_logits(logits, params) for params in NATIVE_SETTINGS]
            for r in range(5):
                for params, together in zip(NATIVE_SETTINGS, want):
                    assert torch.equal(probs_from_logits(logits[r : r + 1], params)[0], together[r])
            for name in quant.ISAS[1 : quant.ISAS.index(best) + 1]:
                assert quant.set_isa(name) == name
                for params, together in zip(NATIVE_SETTINGS, want):
                    assert torch.equal(probs_from_logits(logits, params), together), (name, n, params)
    finally:
        quant.set_isa(None)


def test_native_sample_draws_what_the_torch_path_draws():
    s, _ = _native()
    g = torch.Generator().manual_seed(11)
    probs = torch.softmax(torch.randn(3, 3000, generator=g) * 3, dim=-1)
    probs[1, ::2] = 0.0  # zeros in the middle: never drawn
    fast_gen, ref_gen = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    fast = torch.stack([sample(probs, fast_gen) for _ in range(300)])
    saved, s._NATIVE["specwise_sample"] = s._native("specwise_sample"), False
    try:
        ref = torch.stack([sample(probs, ref_gen) for _ in range(300)])
    finally:
        s._NATIVE["specwise_sample"] = saved
    assert torch.equal(fast, ref)
    assert bool((probs[1][fast[:, 1]] > 0).all())


def test_native_sample_edges():
    _native()
    one = torch.zeros(1, 1000)
    one[0, 999] = 0.25  # unnormalised, only the last token
    assert sample(one, torch.Generator().manual_seed(0)).tolist() == [999]
    first = torch.zeros(2, 700)
    first[0, 0] = 1.0
    first[1, 300] = 2.0
    assert sample(first, torch.Generator().manual_seed(0)).tolist() == [0, 300]
    for bad in (torch.zeros(1, 10), torch.tensor([[0.5, -0.1, 0.6]]), torch.tensor([[0.5, float("nan")]])):
        with pytest.raises(ValueError, match="cannot sample"):
            sample(bad, torch.Generator().manual_seed(0))
