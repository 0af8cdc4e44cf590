"""Tests for specwise.rejection: forced outcomes, the greedy rule, and statistical exactness of the stochastic rule.

Convention (DESIGN.md): p is the target's distribution, q the draft's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_engine import chisquare

from specwise import rejection
from specwise.rejection import Verification, residual_distribution, verify_greedy, verify_stochastic
from specwise.sampling import SamplingParams, make_generator, probs_from_logits

NINF = float("-inf")
N_TRIALS = 100_000
PVALUE = 1e-4  # per chi-square test; fixed seeds make every case deterministic
MIN_EXPECTED = 5.0  # chi-square categories with a smaller expected count are merged


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


def gen(seed):
    return make_generator(seed)


def randn(g, *shape):
    return g.standard_normal(shape, dtype=np.float32)


def expand(x, *shape):
    """``x`` broadcast to ``shape`` (a read-only view, no copy)."""
    return np.broadcast_to(x, shape)


def draw(probs, n, g):
    """``n`` independent draws from ``probs`` ([vocab]) by numpy's own sampler (not the one under test)."""
    probs = np.asarray(probs, dtype=np.float64)
    return g.choice(probs.shape[-1], size=n, p=probs / probs.sum())


def merge_small(observed, expected):
    """Merge categories (smallest expected first) until every bin expects >= MIN_EXPECTED."""
    bins_obs, bins_exp = [], []
    acc_obs = acc_exp = 0.0
    for i in np.argsort(expected, kind="stable"):
        acc_obs += observed[i]
        acc_exp += expected[i]
        if acc_exp >= MIN_EXPECTED:
            bins_obs.append(acc_obs)
            bins_exp.append(acc_exp)
            acc_obs = acc_exp = 0.0
    if acc_exp > 0 or acc_obs > 0:  # a leftover below the minimum joins the largest bin
        if bins_obs:
            bins_obs[-1] += acc_obs
            bins_exp[-1] += acc_exp
        else:
            bins_obs.append(acc_obs)
            bins_exp.append(acc_exp)
    return np.array(bins_obs), np.array(bins_exp)


def gof_pvalue(counts, probs):
    """Chi-square goodness-of-fit p-value of ``counts`` against ``probs`` (both [vocab]).

    Any observation on a token with probability exactly 0 is an outright failure (p-value 0).
    """
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    if counts[probs == 0].sum() > 0:
        return 0.0
    support = probs > 0
    observed = counts[support]
    expected = observed.sum() * probs[support] / probs[support].sum()
    observed, expected = merge_small(observed, expected)
    if len(observed) < 2:
        return 1.0  # a single category: the support check above is the whole test
    return float(chisquare(observed, expected))


def assert_follows(tokens, probs, label):
    """The sample ``tokens`` (1-D) follows ``probs`` ([vocab])."""
    assert_counts_follow(np.bincount(tokens, minlength=probs.shape[-1]), probs, label)


def assert_counts_follow(counts, probs, label):
    """Token ``counts`` ([vocab]) are a sample of ``probs`` ([vocab])."""
    impossible = counts[probs == 0]
    assert impossible.sum() == 0, f"{label}: tokens with p == 0 were emitted: {np.flatnonzero(impossible)}"
    pvalue = gof_pvalue(counts, probs)
    assert pvalue > PVALUE, f"{label}: chi-square p-value {pvalue:.3g} (n={int(counts.sum())})\n{counts}\n{probs}"


def log(probs):
    """Logits whose softmax is ``probs`` (zeros become -inf)."""
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(probs, dtype=np.float32))


def to_probs(probs):
    """Probabilities given as lists, shaped by probs_from_logits (temperature 1) from their logits."""
    return probs_from_logits(log(probs), SamplingParams(temperature=1.0))


def one_hot(token, vocab):
    return [1.0 if i == token else 0.0 for i in range(vocab)]


def check_layout(out, draft_tokens):
    """Verification invariants: accepted drafts, then one emitted token, then -1 padding."""
    batch, gamma = draft_tokens.shape
    assert out.tokens.shape == (batch, gamma + 1)
    assert out.num_accepted.shape == (batch,)
    assert ((out.num_accepted >= 0) & (out.num_accepted <= gamma)).all()
    assert out.tokens.dtype == out.num_accepted.dtype == np.int64
    positions = np.arange(gamma + 1)
    accepted = positions[None, :gamma] < out.num_accepted[:, None]  # [B, gamma]
    assert ((out.tokens[:, :gamma] == draft_tokens) | ~accepted).all()
    last = np.take_along_axis(out.tokens, out.num_accepted[:, None], 1)[:, 0]
    assert (last >= 0).all()
    padding = positions[None] > out.num_accepted[:, None]  # [B, gamma + 1]
    assert ((out.tokens == -1) | ~padding).all()


# ---------------------------------------------------------------------------------------------------------------
# Shape validation
# ---------------------------------------------------------------------------------------------------------------

BAD_SHAPES = [
    ((4,), (4, 2, 8), "expected draft_tokens"),  # draft_tokens not 2-D
    ((4, 1), (4, 8), "expected draft_tokens"),  # target not 3-D
    ((4, 1), (3, 2, 8), "target must have shape"),  # batch mismatch
    ((4, 2), (4, 2, 8), "target must have shape"),  # gamma + 1 mismatch
    ((4, 2), (4, 4, 8), "target must have shape"),
]


@pytest.mark.parametrize(("draft_shape", "target_shape", "message"), BAD_SHAPES)
def test_wrong_shapes_raise(draft_shape, target_shape, message):
    draft = np.zeros(draft_shape, dtype=np.int64)
    target = np.full(target_shape, 1.0 / target_shape[-1], dtype=np.float32)
    with pytest.raises(ValueError, match=message):
        verify_greedy(draft, target)
    with pytest.raises(ValueError, match=message):
        verify_stochastic(draft, None, target, gen(0))


@pytest.mark.parametrize("draft_probs_shape", [(4, 2, 7), (4, 1, 8), (3, 2, 8), (4, 2), (4, 3, 8)])
def test_wrong_draft_probs_shape_raises(draft_probs_shape):
    draft = np.zeros((4, 2), dtype=np.int64)
    target = np.full((4, 3, 8), 1.0 / 8, dtype=np.float32)
    draft_probs = np.full(draft_probs_shape, 0.1, dtype=np.float32)
    with pytest.raises(ValueError, match="draft_probs must have shape"):
        verify_stochastic(draft, draft_probs, target, gen(0))


# ---------------------------------------------------------------------------------------------------------------
# Greedy rule
# ---------------------------------------------------------------------------------------------------------------


def greedy_reference(draft_tokens, target):
    """Token-by-token loop: accept while the draft equals the argmax, then emit the argmax."""
    out, accepted = [], []
    for drafts, logits in zip(draft_tokens.tolist(), target):
        best = logits.argmax(-1).tolist()
        row = []
        for d, b in zip(drafts, best):
            if d != b:
                break
            row.append(d)
        accepted.append(len(row))
        row.append(best[len(row)])
        out.append(row + [-1] * (len(drafts) + 1 - len(row)))
    return np.array(out), np.array(accepted)


@pytest.mark.parametrize("gamma", [0, 1, 4])
def test_greedy_truncates_after_first_mismatch(gamma):
    batch, vocab = 64, 12
    logits = randn(gen(gamma), batch, gamma + 1, vocab)
    best = logits.argmax(-1)
    mismatch = gen(100 + gamma).integers(0, gamma + 1, batch)  # gamma: all accepted
    draft = best[:, :gamma].copy()
    for b, m in enumerate(mismatch.tolist()):
        if m < gamma:
            draft[b, m] = (best[b, m] + 1 + b % (vocab - 1)) % vocab  # anything but the argmax
        if m + 1 < gamma:  # later positions: random, may or may not match
            draft[b, m + 1 :] = gen(b).integers(0, vocab, gamma - m - 1)
    out = verify_greedy(draft, logits)
    check_layout(out, draft)
    np.testing.assert_array_equal(out.num_accepted, mismatch)
    ref_tokens, ref_accepted = greedy_reference(draft, logits)
    np.testing.assert_array_equal(out.tokens, ref_tokens)
    np.testing.assert_array_equal(out.num_accepted, ref_accepted)
    # the emitted tokens are the argmax sequence, truncated after the first mismatch
    for b in range(batch):
        n = int(mismatch[b]) + 1
        assert out.tokens[b, :n].tolist() == best[b, :n].tolist()


def test_greedy_on_probs_equals_greedy_on_logits():
    logits = randn(gen(1), 32, 4, 10)
    draft = gen(2).integers(0, 10, (32, 3))
    draft[:16] = logits[:16, :3].argmax(-1)
    on_logits = verify_greedy(draft, logits)
    on_probs = verify_greedy(draft, probs_from_logits(logits, SamplingParams(temperature=1.0)))
    np.testing.assert_array_equal(on_logits.tokens, on_probs.tokens)
    np.testing.assert_array_equal(on_logits.num_accepted, on_probs.num_accepted)
    on_lists = verify_greedy(draft.tolist(), logits.tolist())  # anything np.asarray takes
    np.testing.assert_array_equal(on_lists.tokens, on_logits.tokens)
    assert (on_logits.num_accepted[:16] == 3).all()


# ---------------------------------------------------------------------------------------------------------------
# Forced outcomes of the stochastic rule
# ---------------------------------------------------------------------------------------------------------------


def test_zero_target_mass_on_draft_token_rejects():
    # V = 4; p_0 puts no mass on the draft token 0; q_0 is one-hot on it
    p = to_probs([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])[None]  # [1, 2, 4]
    q = to_probs([one_hot(0, 4)])[None]  # [1, 1, 4]
    draft = np.array([[0]])
    for seed in range(20):
        out = verify_stochastic(draft, q, p, gen(seed))
        assert out.num_accepted.item() == 0
        assert out.tokens[0, 0].item() in (1, 2)
        assert out.tokens[0, 1].item() == -1


@pytest.mark.parametrize("with_probs", [True, False])
def test_q_equals_one_hot_p_accepts_and_bonus_from_last_position(with_probs):
    gamma, vocab = 3, 6
    drafted = [4, 0, 2]
    p = expand(to_probs([one_hot(t, vocab) for t in drafted] + [one_hot(5, vocab)]), 50, gamma + 1, vocab)
    q = expand(to_probs([one_hot(t, vocab) for t in drafted]), 50, gamma, vocab) if with_probs else None
    draft = expand(np.array([drafted]), 50, gamma)
    out = verify_stochastic(draft, q, p, gen(0))
    assert (out.num_accepted == gamma).all()
    assert (out.tokens == np.array(drafted + [5])).all()


@pytest.mark.parametrize("gamma", [1, 2, 5])
@pytest.mark.parametrize("with_probs", [True, False])
def test_first_rejection_at_j(gamma, with_probs):
    """Accept is certain before j, reject certain at j; the recovered token follows the residual."""
    vocab, batch = 8, 10_000
    x = [(3 * i + 1) % vocab for i in range(gamma)]  # drafted tokens
    for j in range(gamma):
        p_rows, q_rows = [], []
        for i in range(gamma + 1):
            if i < j:  # p == q one-hot on the draft: certain accept
                p_rows.append(one_hot(x[i], vocab))
                q_rows.append(one_hot(x[i], vocab))
            elif i == j:  # p(x_j) = 0: certain reject
                p_rows.append([0.0] * vocab)
                q_rows.append([0.0] * vocab)
                a, b, c = [t for t in range(vocab) if t != x[j]][:3]
                p_rows[i][a], p_rows[i][b], p_rows[i][c] = 0.5, 0.3, 0.2
                q_rows[i][a], q_rows[i][x[j]] = 0.6, 0.4  # p - q <= 0 at a and at x_j
            else:
                p_rows.append([1.0 / vocab] * vocab)
                q_rows.append([1.0 / vocab] * vocab)
        p = to_probs(p_rows)
        q = to_probs(q_rows[:gamma])
        draft = expand(np.array([x]), batch, gamma)
        draft_probs = expand(q, batch, gamma, vocab) if with_probs else None
        out = verify_stochastic(draft, draft_probs, expand(p, batch, gamma + 1, vocab), gen(j))
        check_layout(out, draft)
        assert (out.num_accepted == j).all()
        assert (out.tokens[:, j + 1 :] == -1).all()
        recovered = out.tokens[:, j]
        q_at = q[j] if with_probs else np.array(one_hot(x[j], vocab), dtype=np.float32)
        residual = np.maximum(p[j] - q_at, 0)
        assert (residual[recovered] > 0).all(), "recovered a token where p - q <= 0"
        assert_follows(recovered, residual / residual.sum(), f"recovered token, j={j}")


def test_one_hot_drafter_p_zero_rejects_and_recovers_from_p():
    p = expand(to_probs([[0.0, 0.7, 0.2, 0.1], [0.25] * 4]), 20_000, 2, 4)
    draft = np.zeros((20_000, 1), dtype=np.int64)
    out = verify_stochastic(draft, None, p, gen(3))
    assert (out.num_accepted == 0).all()
    assert_follows(out.tokens[:, 0], p[0, 0], "recovered token")


@pytest.mark.parametrize("with_probs", [True, False])
def test_gamma_zero_samples_from_p0(with_probs):
    batch, vocab = 50_000, 10
    p = probs_from_logits(randn(gen(4), 1, 1, vocab), SamplingParams(temperature=1.0))
    draft = np.zeros((batch, 0), dtype=np.int64)
    draft_probs = np.zeros((batch, 0, vocab), dtype=np.float32) if with_probs else None
    out = verify_stochastic(draft, draft_probs, expand(p, batch, 1, vocab), gen(5))
    assert out.tokens.shape == (batch, 1)
    assert (out.num_accepted == 0).all()
    assert_follows(out.tokens[:, 0], p[0, 0], "gamma=0")
    greedy = verify_greedy(draft, expand(p, batch, 1, vocab))
    assert (greedy.tokens[:, 0] == p[0, 0].argmax()).all()


# ---------------------------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_probs", [True, False])
def test_seeded_generator_is_deterministic(with_probs):
    batch, gamma, vocab = 256, 4, 16
    params = SamplingParams(temperature=1.0)
    p = probs_from_logits(randn(gen(6), batch, gamma + 1, vocab), params)
    q = probs_from_logits(randn(gen(7), batch, gamma, vocab), params)
    g = gen(8)
    draft = np.array([draw(row, 1, g)[0] for row in q.reshape(-1, vocab)]).reshape(batch, gamma)
    draft_probs = q if with_probs else None
    runs = [verify_stochastic(draft, draft_probs, p, gen(seed)) for seed in (9, 9, 10)]
    assert isinstance(runs[0], Verification)
    np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)
    np.testing.assert_array_equal(runs[0].num_accepted, runs[1].num_accepted)
    assert not np.array_equal(runs[0].tokens, runs[2].tokens)
    check_layout(runs[0], draft)


def test_generator_none_uses_global_rng():
    p = np.full((8, 3, 5), 0.2, dtype=np.float32)
    out = verify_stochastic(np.zeros((8, 2), dtype=np.int64), None, p, None)
    assert out.tokens.shape == (8, 3)


# ---------------------------------------------------------------------------------------------------------------
# residual_distribution
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(16,), (5, 16), (3, 4, 16)])
def test_residual_is_normalised_positive_part(shape):
    params = SamplingParams(temperature=1.0, top_k=8)
    p = probs_from_logits(randn(gen(11), *shape), params)
    q = probs_from_logits(randn(gen(12), *shape), params)
    residual = residual_distribution(p, q)
    assert residual.shape == p.shape and residual.dtype == np.float32
    positive = np.maximum(0.0, p.astype(np.float64) - q.astype(np.float64))
    expected = positive / positive.sum(-1, keepdims=True)
    np.testing.assert_allclose(residual, expected, atol=1e-6)
    assert (residual[p <= q] == 0).all()
    np.testing.assert_allclose(residual.sum(-1), np.ones(shape[:-1]), rtol=1e-5)


def test_residual_falls_back_to_p_when_p_equals_q():
    p = probs_from_logits(randn(gen(13), 4, 12), SamplingParams(temperature=1.0))
    residual = residual_distribution(p, p.copy())
    assert not np.isnan(residual).any()
    np.testing.assert_array_equal(residual, p)
    one = np.array([[0.0, 1.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(residual_distribution(one, one), one)
    # a mix of rows: only the equal one falls back
    q = np.stack([p[0], np.roll(p[1], 1)])
    mixed = residual_distribution(p[:2], q)
    np.testing.assert_array_equal(mixed[0], p[0])
    assert not np.array_equal(mixed[1], p[1])


def test_residual_of_one_hot_q_removes_the_token():
    p = np.array([0.1, 0.6, 0.3], dtype=np.float32)
    residual = residual_distribution(p, np.array([0.0, 1.0, 0.0], dtype=np.float32))
    np.testing.assert_allclose(residual, [0.25, 0.0, 0.75], rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Statistical exactness: the emitted tokens follow p
# ---------------------------------------------------------------------------------------------------------------

PARAMS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7-topk": SamplingParams(temperature=0.7, top_k=6),
    "topp0.8": SamplingParams(temperature=1.0, top_p=0.8),
    "minp0.1": SamplingParams(temperature=1.0, min_p=0.1),
    "combo": SamplingParams(temperature=0.8, top_k=12, top_p=0.9, min_p=0.05),
}
Q_KINDS = ["same", "random", "disjoint", "onehot-fixed", "onehot-random"]
GAMMAS = [1, 3, 8]


def make_case(gamma, q_kind, params, seed, trials=N_TRIALS):
    """Target p [gamma + 1, V] (different per position) and drafts for ``trials`` independent rows.

    Returns (p, q, draft_tokens [trials, gamma], draft_probs [trials, gamma, V] or None) where q [gamma, V] is
    the draft distribution (one-hot drafters: None).
    """
    g = gen(seed)
    vocab = int(g.integers(8, 33))
    p_logits = randn(g, gamma + 1, vocab) * 2.0
    q_logits = randn(g, gamma, vocab) * 2.0
    if q_kind == "disjoint":  # p lives on a random half of the vocabulary, q on the other half
        in_p = g.random((gamma + 1, vocab)).argsort(-1) < vocab // 2  # a random permutation
        p_logits[~in_p] = NINF
        q_logits[in_p[:gamma]] = NINF
    p = probs_from_logits(p_logits, params)
    if q_kind == "same":
        q = probs_from_logits(p_logits[:gamma], params)
    elif q_kind in ("random", "disjoint"):
        q = probs_from_logits(q_logits, params)
    else:
        q = None
    if q is not None:
        draft = np.stack([draw(row, trials, g) for row in q], axis=1)  # [trials, gamma]
        draft_probs = expand(q, trials, gamma, vocab)
    elif q_kind == "onehot-fixed":
        draft = expand(np.array([(5 * j + 3) % vocab for j in range(gamma)]), trials, gamma)
        draft_probs = None
    elif q_kind == "onehot-argmax":  # a deterministic drafter that guesses p's mode (power tests only)
        draft = expand(p[:gamma].argmax(-1), trials, gamma)
        draft_probs = None
    else:  # onehot-random: uniform tokens, independent of p
        draft = g.integers(0, vocab, (trials, gamma))
        draft_probs = None
    return p, q, np.ascontiguousarray(draft, dtype=np.int64), draft_probs


def acceptance_theory(p, q, q_kind, draft):
    """Probability of accepting position j given it is reached: sum(min(p_j, q_j)) (one-hot q: p_j(x_j))."""
    gamma = draft.shape[1]
    if q is not None:
        return np.minimum(p[:gamma], q).sum(-1, dtype=np.float64)
    if q_kind == "onehot-fixed":
        return p[np.arange(gamma), draft[0]].astype(np.float64)
    return p[:gamma].astype(np.float64).mean(-1)  # a uniform token: mean of p_j


def position_counts(out, vocab):
    """``[gamma + 1, vocab]`` counts of the emitted token at each position (padding -1 skipped)."""
    positions = out.tokens.shape[1]
    keys = np.arange(positions) * vocab + out.tokens  # [B, gamma + 1]
    keys = keys[out.tokens >= 0]
    return np.bincount(keys, minlength=positions * vocab).reshape(positions, vocab)


def run_case(gamma, q_kind, params, seed):
    p, q, draft, draft_probs = make_case(gamma, q_kind, params, seed)
    out = verify_stochastic(draft, draft_probs, expand(p, N_TRIALS, *p.shape), gen(seed + 1))
    return p, q, draft, out


CASES = [
    pytest.param(gamma, q_kind, name, 1000 * gamma + 10 * qi + pi, id=f"g{gamma}-{q_kind}-{name}")
    for gamma in GAMMAS
    for qi, q_kind in enumerate(Q_KINDS)
    for pi, name in enumerate(PARAMS)
]


@pytest.mark.parametrize(("gamma", "q_kind", "params_name", "seed"), CASES)
def test_emitted_tokens_follow_target(gamma, q_kind, params_name, seed):
    """The token at position j, among trials that emitted at least j + 1 tokens, follows p_j.

    (The toy p_j does not depend on earlier tokens, so this holds for every j, bonus position included.)
    """
    p, q, draft, out = run_case(gamma, q_kind, PARAMS[params_name], seed)
    check_layout(out, draft)
    counts = position_counts(out, p.shape[-1])  # [gamma + 1, vocab]
    for j in range(gamma + 1):
        if counts[j].sum() < 50:
            break
        assert_counts_follow(counts[j], p[j], f"position {j}")

    # acceptance matches theory, position by position
    if q_kind == "same":
        assert (out.num_accepted == gamma).all()
    if q_kind == "disjoint":
        assert (out.num_accepted == 0).all()
    alpha = acceptance_theory(p, q, q_kind, draft)
    reached = counts.sum(-1)  # [gamma + 1]: trials that reached position j
    for j in range(gamma):
        n = int(reached[j])
        if n < 100:
            break
        rate = int(reached[j + 1]) / n  # reaching j + 1 <=> accepting the draft at j
        a = min(max(float(alpha[j]), 0.0), 1.0)
        tolerance = 5 * math.sqrt(a * (1 - a) / n) + 1e-6
        assert abs(rate - a) <= tolerance, f"position {j}: acceptance {rate:.4f}, theory {a:.4f} (n={n})"


def test_first_position_acceptance_is_overlap():
    """Mean acceptance of the first draft is sum(min(p_0, q_0)) within a few standard errors."""
    p, q, draft, out = run_case(3, "random", PARAMS["t1"], seed=77)
    alpha = float(np.minimum(p[0], q[0]).sum())
    rate = float((out.num_accepted >= 1).mean())
    assert 0.05 < alpha < 0.95
    assert abs(rate - alpha) <= 4 * math.sqrt(alpha * (1 - alpha) / N_TRIALS)


# ---------------------------------------------------------------------------------------------------------------
# Power: the same check rejects deliberately wrong samplers
# ---------------------------------------------------------------------------------------------------------------


def test_gof_helper_on_known_samples():
    probs = np.array([0.5, 0.3, 0.2, 0.0, 1e-6])
    counts = np.bincount(draw(probs, 50_000, gen(20)), minlength=5)
    assert gof_pvalue(counts, probs) > PVALUE
    assert gof_pvalue(counts + np.array([0, 0, 0, 1, 0]), probs) == 0.0  # a p == 0 token observed
    skewed = draw([0.48, 0.32, 0.2], 50_000, gen(21))
    assert gof_pvalue(np.bincount(skewed, minlength=5), probs) < PVALUE
    obs, exp = merge_small(np.array([3.0, 1.0, 10.0, 0.0]), np.array([2.0, 2.0, 10.0, 0.5]))
    assert obs.sum() == 14 and exp.sum() == 14.5 and (exp >= MIN_EXPECTED).all()


def first_token_pvalue(p, out):
    counts = np.bincount(out.tokens[:, 0], minlength=p.shape[-1])
    return gof_pvalue(counts, p[0])


@pytest.mark.parametrize(
    ("q_kind", "params_name"), [("random", "t1"), ("random", "t0.7-topk"), ("onehot-argmax", "t1")]
)
def test_check_rejects_recovering_from_p(monkeypatch, q_kind, params_name):
    """Bug: at a rejection, sample from p instead of the residual norm(max(0, p - q))."""
    p, q, draft, _ = make_case(3, q_kind, PARAMS[params_name], seed=31)
    q0 = q[0] if q is not None else np.array(one_hot(int(draft[0, 0]), p.shape[-1]), dtype=np.float32)
    overlap = np.minimum(p[0], q0)
    wrong = overlap + (1 - overlap.sum()) * p[0]  # what the bug emits first
    assert np.abs(wrong - p[0]).sum() / 2 > 0.01, "the case must be able to show the bias"
    monkeypatch.setattr(rejection, "residual_distribution", lambda p, q: p)
    p, _, _, out = run_case(3, q_kind, PARAMS[params_name], seed=31)
    assert first_token_pvalue(p, out) < PVALUE


def swapped_residual(p, q):
    residual = np.maximum(q - p, 0)
    return residual / np.maximum(residual.sum(-1, keepdims=True), 1e-9)


def test_check_rejects_swapped_residual(monkeypatch):
    """Bug: residual norm(max(0, q - p)) (p and q swapped)."""
    monkeypatch.setattr(rejection, "residual_distribution", swapped_residual)
    p, _, _, out = run_case(3, "random", PARAMS["t1"], seed=32)
    assert first_token_pvalue(p, out) < PVALUE


@pytest.mark.parametrize("q_kind", ["random", "onehot-random"])
def test_check_rejects_unconditional_draft(q_kind):
    """Bug: the draft token is emitted unconditionally."""
    gamma = 3
    p, q, draft, out = run_case(gamma, q_kind, PARAMS["t1"], seed=33)
    wrong = Verification(np.concatenate([draft, out.tokens[:, -1:]], axis=1), np.full_like(out.num_accepted, gamma))
    assert first_token_pvalue(p, wrong) < PVALUE


def test_check_rejects_swapped_p_and_q():
    """Bug: the roles of p and q swapped in the acceptance test (accept with min(1, q/p))."""
    gamma = 3
    p, q, draft, _ = run_case(gamma, "random", PARAMS["t1"], seed=34)
    swapped_target = expand(np.concatenate([q, p[gamma:]]), N_TRIALS, *p.shape)
    out = verify_stochastic(draft, expand(p[:gamma], N_TRIALS, *q.shape), swapped_target, gen(35))
    assert first_token_pvalue(p, out) < PVALUE


def test_check_rejects_bonus_from_wrong_position():
    """Bug: the bonus token drawn from p_{gamma - 1} instead of p_gamma (only later positions are biased)."""
    gamma = 3
    p, _, draft, out = run_case(gamma, "same", PARAMS["t1"], seed=36)
    assert (out.num_accepted == gamma).all()
    shifted = expand(np.concatenate([p[:gamma], p[gamma - 1 : gamma]]), N_TRIALS, *p.shape)
    wrong = verify_stochastic(draft, expand(p[:gamma], N_TRIALS, gamma, p.shape[-1]), shifted, gen(37))
    counts = np.bincount(wrong.tokens[:, gamma], minlength=p.shape[-1])
    assert gof_pvalue(counts, p[gamma]) < PVALUE
    assert gof_pvalue(counts, p[gamma - 1]) > PVALUE


def test_coupled_rule_computes_rows_only_as_far_as_the_first_rejection():
    from specwise.rejection import verify_coupled
    from specwise.sampling import PositionUniforms

    logits = randn(gen(3), 4, 50) * 2  # [gamma + 1, vocab]
    params = SamplingParams(temperature=0.8, top_p=0.9)
    p = probs_from_logits(logits, params)
    uniforms = PositionUniforms(7)
    for draft in ([], [5], [1, 2, 3], [int(np.argmax(p[0])), int(np.argmax(p[1])), 9]):
        asked: list[int] = []

        def rows(i: int, asked: list[int] = asked) -> np.ndarray:
            asked.append(i)
            return probs_from_logits(logits[i : i + 1], params)

        lazy = verify_coupled(draft, rows, uniforms)
        assert lazy == verify_coupled(draft, p[: len(draft) + 1], uniforms)  # the same tokens as from all rows
        assert asked == list(range(len(lazy)))  # no row after the first rejection (or the bonus)
    with pytest.raises(ValueError, match="gamma"):
        verify_coupled([1, 2], p, uniforms)


def test_verify_is_each_rule_for_its_case():
    """rejection.verify, the engine's one entry point, gives what each rule gives: greedy the argmax prefix
    (verify_greedy), single tokens the coupled rule, drafts with q the stochastic rule (same generator state)."""
    from specwise.rejection import verify, verify_coupled
    from specwise.sampling import PositionUniforms

    g = gen(11)
    logits = randn(g, 4, 60) * 3  # [gamma + 1, vocab]
    best = logits.argmax(-1).tolist()
    params = SamplingParams(temperature=0.9, top_k=30)
    uniforms = PositionUniforms(5)
    q = probs_from_logits(randn(g, 3, 60), params)  # [gamma, vocab]
    for draft in ([best[0], best[1], best[2]], [best[0], 7 if best[1] != 7 else 8, best[2]], [3, 4, 5]):
        want = verify_greedy(np.array([draft]), logits[None])
        n = int(want.num_accepted[0])
        assert verify(draft, None, logits, SamplingParams()) == want.tokens[0, : n + 1].tolist()
        p = probs_from_logits(logits, params)
        assert verify(draft, None, logits, params, uniforms=uniforms) == verify_coupled(draft, p, uniforms)
        got = verify(draft, q, logits, params, generator=gen(4))
        ref = verify_stochastic(np.array([draft]), q[None], p[None], gen(4))
        assert got == ref.tokens[0, : int(ref.num_accepted[0]) + 1].tolist()
    with pytest.raises(ValueError, match="k \\+ 1"):
        verify([1, 2], None, logits, SamplingParams())
    bad = logits.copy()
    bad[1, 3] = float("nan")
    for p_, q_ in ((SamplingParams(), None), (params, None), (params, q)):
        with pytest.raises(ValueError):
            verify([best[0], best[1], best[2]], q_, bad, p_, generator=gen(0), uniforms=uniforms)
