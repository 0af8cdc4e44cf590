"""Sampling settings and the one function that turns logits into probabilities.

The same function shapes the target's distribution ``p`` and every drafter's ``q``: speculative decoding
is exact only when both are shaped by the same settings. Arrays are numpy's: logits and probabilities float32
``[..., vocab]``, tokens int64; randomness is a ``numpy.random.Generator`` over Philox (:func:`make_generator`).
"""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from specwise.grammars import Constraint

__all__ = [
    "SamplingParams",
    "PositionUniforms",
    "make_generator",
    "probs_from_logits",
    "sample",
    "sample_with",
    "check_logits",
    "argmax",
    "greedy_choices",
    "log_probs",
]


def make_generator(seed: int | None) -> np.random.Generator:
    """A ``numpy.random.Generator`` over Philox (counter-based: the same stream on every machine) seeded with
    ``seed``, or with a fresh seed from the operating system when ``seed`` is None. Negative seeds are taken
    modulo 2**64."""
    if seed is None:
        return np.random.Generator(np.random.Philox())
    return np.random.Generator(np.random.Philox(int(seed) & _MASK))


@dataclass(frozen=True)
class SamplingParams:
    """How to turn the model's logits into a distribution.

    temperature: 0 means greedy (the argmax); otherwise logits are divided by it.
    top_k: keep the k most likely tokens, and any tied with the k-th (0 disables).
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1 disables).
    min_p: keep tokens whose probability is at least min_p times the largest one (0 disables).
    seed: seeds the random generator of a run; None draws a fresh seed.
    constraint: a grammar the output must match (specwise.constraints: JsonSchema, JsonObject, Grammar, Regex):
        the tokens it forbids get probability 0 in p and q alike, before the transforms above; None: no constraint.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        _check_number("min_p", self.min_p)
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1) (0 disables it), got {self.min_p}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.constraint is not None:
            from specwise.grammars import Constraint

            if not isinstance(self.constraint, Constraint):
                raise ValueError(f"constraint must be a specwise.constraints.Constraint, got {self.constraint!r}")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax (temperature 0)."""
        return self.temperature == 0.0

    def generator(self, device: str = "cpu") -> np.random.Generator:
        """The run's generator: :func:`make_generator` of ``seed`` (a fresh random seed when None). Draws are made on
        the CPU whatever the model's ``device`` (accepted for callers that name it)."""
        return make_generator(self.seed)

    def uniforms(self) -> PositionUniforms:
        """The run's uniforms by output position, from ``seed`` (or a fresh random seed)."""
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(8), "little")
        return PositionUniforms(seed)


_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finalizer: a bijection of 64-bit integers whose outputs look independent."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class PositionUniforms:
    """One uniform in [0, 1) per output position, a pure function of (seed, position): the token sampled at a
    position does not depend on how many draws came before it, so it is the same whatever was drafted, whatever
    shared the pass, and however the steps fell."""

    __slots__ = ("_key",)

    def __init__(self, seed: int) -> None:
        self._key = _mix64(seed & _MASK)

    def __call__(self, position: int) -> float:
        return (_mix64(self._key ^ _mix64(position)) >> 11) * (1.0 / (1 << 53))


def _check_number(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")


_NATIVE: dict[str, object] = {}  # symbol -> the native function, or False where the library is absent


def _native(symbol: str):
    """A function of the native library (looked up once), or None without it."""
    fn = _NATIVE.get(symbol)
    if fn is None:
        from specwise.models.kernels import native_library

        lib = native_library()
        fn = _NATIVE[symbol] = getattr(lib, symbol) if lib is not None else False
    return fn or None


def _readable(x: np.ndarray) -> bool:
    """Whether native code can read ``x`` as it is: float32, C-contiguous, at least one dimension, not empty."""
    return x.dtype == np.float32 and x.flags.c_contiguous and x.ndim > 0 and x.size > 0


def _scan(logits: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(argmax over the last dim, flags) from one native pass over float32 C-contiguous logits; None where it cannot
    run. Flags: 1 NaN seen (argmax not set for that row), 2 +inf seen, 4 a row entirely -inf."""
    if not isinstance(logits, np.ndarray) or not _readable(logits):
        return None
    fn = _native("specwise_logits_scan")
    if fn is None:
        return None
    n = logits.shape[-1]
    out = np.empty(logits.shape[:-1], dtype=np.int64)
    flags = fn(logits.ctypes.data, logits.size // n, n, out.ctypes.data)
    return out, flags


def argmax(logits: np.ndarray) -> np.ndarray:
    """``np.argmax(logits, axis=-1)`` (the first largest value; int64), in one native pass where it can run."""
    fast = _scan(logits)
    if fast is not None and not fast[1] & 1:
        return fast[0]
    return np.argmax(logits, axis=-1).astype(np.int64, copy=False)


def _raise_flags(flags: int) -> None:
    if flags & 1:
        raise ValueError("logits contain NaN: the model produced invalid output (check its weights and dtype)")
    if flags & 2:
        raise ValueError("logits contain +inf: the model produced invalid output (check its weights and dtype)")
    if flags & 4:
        raise ValueError("a row of logits is entirely -inf: no token can be chosen")


_CHOICES = {"rows": 0, "buffer": None}  # greedy_choices' output buffer, grown as needed


def greedy_choices(logits: np.ndarray) -> list[int]:
    """The checks of :func:`check_logits` and the argmax of each row of ``logits`` ``[rows, vocab]``, as a list:
    one native pass over float32 C-contiguous logits and no array made (a greedy step's whole verification input)."""
    if isinstance(logits, np.ndarray) and logits.ndim == 2 and _readable(logits):
        fn = _native("specwise_logits_scan")
        if fn is not None:
            rows = logits.shape[0]
            if _CHOICES["rows"] < rows:
                _CHOICES["rows"], _CHOICES["buffer"] = rows, (ctypes.c_int64 * rows)()
            out = _CHOICES["buffer"]
            _raise_flags(fn(logits.ctypes.data, rows, logits.shape[1], out))
            return out[:rows]
    check_logits(logits)
    return argmax(logits).tolist()


def check_logits(logits: np.ndarray) -> None:
    """Raise ValueError on NaN or +inf logits, or on a row with no finite logit.

    -inf is allowed: it is the usual way to forbid a token (probability 0).
    """
    fast = _scan(logits)
    if fast is not None:
        _raise_flags(fast[1])
        return
    logits = np.asarray(logits)
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(logits.sum()):  # one cheap reduction in the common case: all finite
            return
    finite = np.isfinite(logits)
    if finite.all():  # the sum overflowed, the logits are fine
        return
    if np.isnan(logits).any():
        raise ValueError("logits contain NaN: the model produced invalid output (check its weights and dtype)")
    if np.isposinf(logits).any():
        raise ValueError("logits contain +inf: the model produced invalid output (check its weights and dtype)")
    if logits.ndim and (~finite).all(axis=-1).any():
        raise ValueError("a row of logits is entirely -inf: no token can be chosen")


def probs_from_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Turn logits ``[..., vocab]`` into probabilities ``[..., vocab]`` (float32) under ``params``.

    Order: temperature, top-k, softmax, top-p, min-p, renormalise. With temperature 0 the result is
    the one-hot distribution of the argmax (ties go to the lowest token id, as np.argmax does).
    """
    check_logits(logits)
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    if params.greedy:
        probs = np.zeros_like(logits)
        np.put_along_axis(probs, argmax(logits)[..., None], 1.0, axis=-1)
        return probs
    fast = _native_probs(logits, params)
    if fast is not None:
        return fast
    with np.errstate(over="ignore"):
        logits = logits / np.float32(params.temperature)
    if np.isposinf(logits).any():
        raise ValueError(f"logits overflow at temperature {params.temperature}: use a larger temperature")
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = np.partition(logits, vocab - params.top_k, axis=-1)[..., vocab - params.top_k, None]  # [..., 1]
        logits[logits < kth] = -np.inf  # ties with the k-th are kept
    probs = _softmax(logits)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        threshold = np.float32(params.min_p) * probs.max(axis=-1, keepdims=True)
        probs[probs < threshold] = 0.0
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last dim in float32, max-subtracted; writes into ``logits`` (the caller's own array)."""
    logits -= logits.max(axis=-1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=-1, keepdims=True)
    return logits


def log_probs(logits: np.ndarray, params: SamplingParams | None = None) -> np.ndarray:
    """Log-probabilities ``[..., vocab]`` (float32) of the tokens given ``logits`` ``[..., vocab]``.

    params None: the model's own distribution, ``log_softmax(logits)`` (temperature 1, nothing cut).
    params given: the distribution a token is drawn from under them, ``log(probs_from_logits(logits, params))``:
    -inf for the tokens that top-k, top-p or min-p cut; greedy, 0 at the argmax and -inf elsewhere.
    """
    if params is not None:
        probs = probs_from_logits(logits, params)
        with np.errstate(divide="ignore"):
            return np.log(probs, out=probs)
    check_logits(logits)
    logits = np.asarray(logits, dtype=np.float32)
    shifted = logits - logits.max(axis=-1, keepdims=True)  # a new array: at most 0, so exp cannot overflow
    shifted -= np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return shifted


def _native_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray | None:
    """probs_from_logits in one native pass per row (float32), or None where the native library is absent."""
    if logits.ndim == 0 or logits.size == 0:
        return None
    fn = _native("specwise_probs")
    if fn is None:
        return None
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    n = logits.shape[-1]
    out = np.empty_like(logits)
    status = fn(
        logits.ctypes.data,
        logits.size // n,
        n,
        params.temperature,
        params.top_k,
        params.top_p,
        params.min_p,
        out.ctypes.data,
    )
    if status == 1:
        raise ValueError(f"logits overflow at temperature {params.temperature}: use a larger temperature")
    if status:
        raise MemoryError("out of memory while computing sampling probabilities")
    return out


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Nucleus filter: keep the most likely tokens until their mass reaches ``top_p`` (at least one token).

    A token is kept when the mass of the tokens ranked before it is below ``top_p``; every token exactly as
    likely as the least likely kept token is kept too, so ties never depend on sort order. Only the largest
    probabilities are sorted (a partition, widened until they hold ``top_p`` of the mass), not the whole
    vocabulary. Writes into ``probs`` (the caller's own array).
    """
    vocab = probs.shape[-1]
    k = min(64, vocab)
    while True:
        top = np.partition(probs, vocab - k, axis=-1)[..., vocab - k :]  # [..., k], the k largest
        if k == vocab or bool((top.sum(axis=-1) >= top_p).all()):
            break
        k = min(vocab, k * 8)
    top = np.flip(np.sort(top, axis=-1), axis=-1)  # descending
    mass_before = np.cumsum(top, axis=-1, dtype=np.float64).astype(np.float32) - top
    kept = np.maximum((mass_before < top_p).sum(axis=-1, keepdims=True), 1)  # the top token is always kept
    threshold = np.take_along_axis(top, kept - 1, axis=-1)  # [..., 1]: the least likely kept probability
    probs[probs < threshold] = 0.0
    return probs


def sample(probs: np.ndarray, generator: np.random.Generator | None) -> np.ndarray:
    """Draw one token per row from ``probs`` ``[..., vocab]`` (need not sum to 1); returns ``[...]`` (int64).

    Inverse-CDF sampling: one float64 uniform per row (``generator.random``; a fresh generator when None) against a
    float64 cumulative sum: a token of probability 0 is never drawn.
    """
    probs = np.asarray(probs)
    flat = probs.reshape(-1, probs.shape[-1])
    if generator is None:
        generator = make_generator(None)
    u = generator.random((flat.shape[0], 1))
    return sample_with(flat, u).reshape(probs.shape[:-1])


def sample_with(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """:func:`sample` with the uniforms given: ``probs`` ``[rows, vocab]``, ``uniforms`` float64 ``[rows, 1]``
    (or ``[rows]``); returns int64 ``[rows]``."""
    probs = np.asarray(probs)
    uniforms = np.ascontiguousarray(uniforms, dtype=np.float64).reshape(-1)
    if uniforms.shape[0] != probs.shape[0]:
        raise ValueError(f"one uniform per row: {probs.shape[0]} rows, {uniforms.shape[0]} uniforms")
    fast = _native_sample(probs, uniforms)
    if fast is not None:
        return fast
    vocab = probs.shape[-1]
    cdf = np.cumsum(probs, axis=-1, dtype=np.float64)  # [rows, vocab]
    total = cdf[:, -1]
    if not bool(((total > 0) & np.isfinite(total)).all()) or bool((probs < 0).any()):
        raise ValueError("cannot sample: probabilities must be finite, non-negative and not all zero")
    target = uniforms * total
    if cdf.shape[0] <= 64:  # first token whose cdf exceeds the target
        tokens = np.array([np.searchsorted(c, t, side="right") for c, t in zip(cdf, target)], dtype=np.int64)
    else:  # many short rows: count the cdf values not above the target, the same index
        tokens = (cdf <= target[:, None]).sum(axis=-1, dtype=np.int64)
    over = tokens >= vocab  # the target rounded up to the total: take the last token of positive probability
    if bool(over.any()):
        last = vocab - 1 - np.argmax(probs[:, ::-1] > 0, axis=-1)
        tokens = np.where(over, last, tokens)
    return tokens


def _native_sample(flat: np.ndarray, u: np.ndarray) -> np.ndarray | None:
    """sample_with() in native code for float32 rows, or None."""
    if flat.dtype != np.float32 or flat.ndim != 2 or flat.size == 0:
        return None
    fn = _native("specwise_sample")
    if fn is None:
        return None
    flat = np.ascontiguousarray(flat)
    rows, vocab = flat.shape
    out = np.empty(rows, dtype=np.int64)
    status = fn(flat.ctypes.data, rows, vocab, u.ctypes.data, out.ctypes.data)
    if status == 1:
        raise ValueError("cannot sample: probabilities must be finite, non-negative and not all zero")
    if status:
        raise MemoryError("out of memory while sampling")
    return out
