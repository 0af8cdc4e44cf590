"""Verification of a draft against the target: the rejection rule and the greedy rule.

Pure functions, batched over a leading dimension ``B``; randomness comes in as a ``numpy.random.Generator``
(:func:`specwise.sampling.make_generator`); arrays are numpy's.

Stochastic rule (Leviathan et al. 2023; Chen et al. 2023): draft token ``x_i`` is accepted with probability
``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection a *recovered* token is drawn from
``norm(max(0, p_i - q_i))``; when all ``gamma`` drafts are accepted a *bonus* token is drawn from
``p_gamma``. The emitted tokens then follow the target's distribution ``p`` exactly.

Coupled rule, for drafts of single tokens (q one-hot on ``x_i``): sample ``y_i`` from ``p_i`` with the
position's own uniform and accept ``x_i`` when ``y_i == x_i``; the first ``y_i`` that differs is the recovered
token. This is the stochastic rule for a one-hot q (accepted with probability ``p_i(x_i)``, and a rejection
draws from p without ``x_i``, which is ``norm(max(0, p_i - q_i))``), and the emitted token at every position is
the one plain sampling with the same uniforms gives: the output does not depend on what was drafted.

Greedy rule: accept while the draft equals the target's argmax; the first mismatch (or the position after
the last draft) emits the target's argmax. The output equals plain greedy decoding token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specwise.sampling import (
    SamplingParams,
    argmax,
    check_logits,
    greedy_choices,
    make_generator,
    probs_from_logits,
    sample,
    sample_with,
)

__all__ = [
    "Verification",
    "verify",
    "verify_greedy",
    "verify_stochastic",
    "verify_coupled",
    "residual_distribution",
]

# Below this residual mass the residual is float noise (p and q agree); p itself is used instead.
# Rejection then happens with probability of the same order, so the choice does not bias the output.
_RESIDUAL_EPS = 1e-9


@dataclass
class Verification:
    """Result of verifying a batch of drafts.

    tokens: ``[B, gamma + 1]`` int64 emitted tokens; row b holds ``num_accepted[b] + 1`` valid tokens (the
        accepted drafts, then the recovered or bonus token), padded with -1.
    num_accepted: ``[B]`` int64 drafted tokens kept per row.
    """

    tokens: np.ndarray
    num_accepted: np.ndarray


def _check_shapes(draft_tokens: np.ndarray, target: np.ndarray) -> int:
    if draft_tokens.ndim != 2 or target.ndim != 3:
        raise ValueError(
            f"expected draft_tokens [B, gamma] and target [B, gamma + 1, vocab], "
            f"got {tuple(draft_tokens.shape)} and {tuple(target.shape)}"
        )
    batch, gamma = draft_tokens.shape
    if target.shape[0] != batch or target.shape[1] != gamma + 1:
        raise ValueError(
            f"target must have shape [B, gamma + 1, vocab] = [{batch}, {gamma + 1}, vocab], got {tuple(target.shape)}"
        )
    return gamma


def _emit(draft_tokens: np.ndarray, num_accepted: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Accepted drafts, then ``last`` at index num_accepted, then -1. Returns int64 ``[B, gamma + 1]``."""
    batch, gamma = draft_tokens.shape
    out = np.full((batch, gamma + 1), -1, dtype=np.int64)
    accepted = np.arange(gamma)[None, :] < num_accepted[:, None]  # [B, gamma]
    np.copyto(out[:, :gamma], draft_tokens, where=accepted)
    out[np.arange(batch), num_accepted] = last
    return out


def _accepted_prefix(accept: np.ndarray) -> np.ndarray:
    """Length of the leading run of True per row: ``[B, gamma]`` bool -> ``[B]`` int64."""
    return np.cumprod(accept, axis=1, dtype=np.int64).sum(axis=1, dtype=np.int64)


def verify_greedy(draft_tokens: np.ndarray, target: np.ndarray) -> Verification:
    """Greedy rule. ``draft_tokens`` ``[B, gamma]``; ``target`` ``[B, gamma + 1, vocab]`` logits or probabilities
    (only the argmax matters)."""
    draft_tokens = np.asarray(draft_tokens, dtype=np.int64)
    target = np.asarray(target)
    gamma = _check_shapes(draft_tokens, target)
    best = argmax(target)  # [B, gamma + 1]
    num_accepted = _accepted_prefix(draft_tokens == best[:, :gamma])
    last = best[np.arange(best.shape[0]), num_accepted]
    return Verification(_emit(draft_tokens, num_accepted, last), num_accepted)


def residual_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``norm(max(0, p - q))`` over the last dim; rows with ~0 residual mass fall back to ``p``."""
    residual = np.maximum(p - q, 0)
    mass = residual.sum(axis=-1, keepdims=True)
    safe = mass > _RESIDUAL_EPS
    return np.where(safe, residual / np.maximum(mass, _RESIDUAL_EPS), p)


def verify_stochastic(
    draft_tokens: np.ndarray,
    draft_probs: np.ndarray | None,
    target_probs: np.ndarray,
    generator: np.random.Generator | None,
) -> Verification:
    """Stochastic rejection rule.

    draft_tokens: ``[B, gamma]`` int64.
    draft_probs: ``[B, gamma, vocab]`` the full q each draft token was drawn from, or None for a drafter that
        proposes single tokens (q is then one-hot on the proposed token).
    target_probs: ``[B, gamma + 1, vocab]`` p at each drafted position plus the bonus position.
    generator: the source of randomness (float64 uniforms for acceptance, then one categorical draw per row); None:
        a fresh generator seeded by the operating system.
    """
    draft_tokens = np.asarray(draft_tokens, dtype=np.int64)
    target_probs = np.asarray(target_probs)
    gamma = _check_shapes(draft_tokens, target_probs)
    batch, _, vocab = target_probs.shape
    if draft_probs is not None:
        draft_probs = np.asarray(draft_probs)
        if draft_probs.shape != (batch, gamma, vocab):
            raise ValueError(
                f"draft_probs must have shape [B, gamma, vocab] = [{batch}, {gamma}, {vocab}], "
                f"got {tuple(draft_probs.shape)}: the drafter must share the target's vocabulary"
            )
    if generator is None:
        generator = make_generator(None)
    rows = np.arange(batch)
    p_x = np.take_along_axis(target_probs[:, :gamma], draft_tokens[..., None], axis=2)[..., 0]  # [B, gamma]
    if draft_probs is None:
        q_x = np.ones_like(p_x)
    else:
        q_x = np.take_along_axis(draft_probs, draft_tokens[..., None], axis=2)[..., 0]  # [B, gamma]
    uniforms = generator.random((batch, gamma))
    # accept with probability min(1, p/q)  <=>  u * q < p  (no division, safe when q is 0)
    num_accepted = _accepted_prefix(uniforms * q_x < p_x)  # [B]

    p_at = target_probs[rows, num_accepted]  # [B, vocab]: p at the first rejection, or the bonus p
    rejected = num_accepted < gamma  # [B]
    if gamma > 0 and bool(rejected.any()):
        j = np.minimum(num_accepted, gamma - 1)
        if draft_probs is None:
            q_at = np.zeros_like(p_at)
            q_at[rows, draft_tokens[rows, j]] = 1.0
        else:
            q_at = draft_probs[rows, j]  # [B, vocab]
        p_at = np.where(rejected[:, None], residual_distribution(p_at, q_at), p_at)
    last = sample(p_at, generator)  # [B]
    return Verification(_emit(draft_tokens, num_accepted, last), num_accepted)


def verify_coupled(draft_tokens: list[int], target_probs, uniforms) -> list[int]:
    """Coupled rule for one sequence's draft of single tokens (see the module's docstring).

    draft_tokens: the ``gamma`` drafted tokens; target_probs: ``[gamma + 1, vocab]`` p at each drafted position
    and the bonus position (an array), or a function ``row -> [1, vocab]`` that computes a row's p when it is
    needed; uniforms: a function ``row -> uniform in [0, 1)`` (the position's own).
    Returns the emitted tokens: the accepted drafts, then the recovered or bonus token. Rows are sampled one at
    a time and only as far as the first rejection (a function computes no row after it).
    """
    gamma = len(draft_tokens)
    if not callable(target_probs):
        target_probs = np.asarray(target_probs)
        if target_probs.ndim != 2 or target_probs.shape[0] != gamma + 1:
            raise ValueError(
                f"target_probs must be [gamma + 1, vocab] = [{gamma + 1}, vocab], got {tuple(target_probs.shape)}"
            )

        def row_probs(i: int) -> np.ndarray:
            return target_probs[i : i + 1]

    else:
        row_probs = target_probs
    out: list[int] = []
    u = np.empty(1, dtype=np.float64)
    for i in range(gamma + 1):
        u[0] = uniforms(i)
        y = int(sample_with(row_probs(i).reshape(1, -1), u)[0])
        out.append(y)
        if i == gamma or y != draft_tokens[i]:
            break
    return out


def verify(
    draft_ids: list[int],
    draft_probs: np.ndarray | None,
    logits: np.ndarray,
    params: SamplingParams,
    generator: np.random.Generator | None = None,
    uniforms=None,
) -> list[int]:
    """The one verification of a sequence's draft, as the engine and the batch engine make it: the emitted tokens
    (the accepted drafts, then the recovered or bonus token) for ``draft_ids`` (k tokens) judged by the target's
    ``logits`` ``[k + 1, vocab]`` (float32) under ``params``.

    greedy: the greedy rule (one native scan of the rows' argmax); a draft of single tokens (``draft_probs`` None):
    the coupled rule with ``uniforms(row)`` the uniform of that row's output position, p computed row by row only
    as far as the first rejection (every row is checked first); else the stochastic rule with ``draft_probs``
    ``[k, vocab]`` and ``generator``. Raises ValueError on logits with NaN or +inf."""
    k = len(draft_ids)
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[0] != k + 1:
        raise ValueError(f"logits must be [k + 1, vocab] = [{k + 1}, vocab], got {tuple(logits.shape)}")
    if params.greedy:  # the longest prefix of the draft that the target's argmax agrees with, then its choice
        best = greedy_choices(logits)
        accepted = 0
        while accepted < k and draft_ids[accepted] == best[accepted]:
            accepted += 1
        return list(draft_ids[:accepted]) + [best[accepted]]
    if draft_probs is None:  # single tokens: the coupled rule, whose output does not depend on the draft
        check_logits(logits)
        return verify_coupled(list(draft_ids), lambda i: probs_from_logits(logits[i : i + 1], params), uniforms)
    p = probs_from_logits(logits, params)[None]  # [1, k + 1, vocab]: every row checked by probs_from_logits
    tokens = np.array([list(draft_ids)], dtype=np.int64).reshape(1, k)
    result = verify_stochastic(tokens, np.asarray(draft_probs)[None], p, generator)
    return result.tokens[0, : int(result.num_accepted[0]) + 1].tolist()
