"""Sampling settings and the one function that turns logits into probabilities.

The same function shapes the target's distribution ``p`` and every drafter's ``q``: speculative decoding
is exact only when both are shaped by the same settings.
"""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specwise.constraints import Constraint

__all__ = [
    "SamplingParams",
    "PositionUniforms",
    "probs_from_logits",
    "sample",
    "sample_with",
    "check_logits",
    "argmax",
    "greedy_choices",
    "log_probs",
]


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
            from specwise.constraints import Constraint

            if not isinstance(self.constraint, Constraint):
                raise ValueError(f"constraint must be a specwise.constraints.Constraint, got {self.constraint!r}")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax (temperature 0)."""
        return self.temperature == 0.0

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A torch.Generator seeded with ``seed`` (or a fresh random seed)."""
        gen = torch.Generator(device=device)
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(self.seed)
        return gen

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


def _scanner(logits: torch.Tensor):
    """The native scan of the logits (``specwise_logits_scan``) where it can read them (CPU float32, contiguous,
    not empty), else None."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or not logits.is_contiguous():
        return None
    if logits.dim() == 0 or logits.numel() == 0:
        return None
    return _native("specwise_logits_scan")


def _scan(logits: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """(argmax over the last dim, flags) from one native pass over CPU float32 logits; None where it cannot run.
    Flags: 1 NaN seen (argmax not set for that row), 2 +inf seen, 4 a row entirely -inf."""
    fn = _scanner(logits)
    if fn is None:
        return None
    n = logits.shape[-1]
    out = torch.empty(logits.shape[:-1], dtype=torch.int64)
    flags = fn(logits.data_ptr(), logits.numel() // n, n, out.data_ptr())
    return out, flags


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` (the first largest value), in one native pass where it can run."""
    fast = _scan(logits)
    if fast is not None and not fast[1] & 1:
        return fast[0]
    return logits.argmax(dim=-1)


def _raise_flags(flags: int) -> None:
    if flags & 1:
        raise ValueError("logits contain NaN: the model produced invalid output (check its weights and dtype)")
    if flags & 2:
        raise ValueError("logits contain +inf: the model produced invalid output (check its weights and dtype)")
    if flags & 4:
        raise ValueError("a row of logits is entirely -inf: no token can be chosen")


_CHOICES = {"rows": 0, "buffer": None}  # greedy_choices' output buffer, grown as needed


def greedy_choices(logits: torch.Tensor) -> list[int]:
    """The checks of :func:`check_logits` and the argmax of each row of ``logits`` ``[rows, vocab]``, as a list:
    one native pass over CPU float32 logits and no tensor made (a greedy step's whole verification input)."""
    fn = _scanner(logits) if logits.dim() == 2 else None
    if fn is not None:
        rows = logits.shape[0]
        if _CHOICES["rows"] < rows:
            _CHOICES["rows"], _CHOICES["buffer"] = rows, (ctypes.c_int64 * rows)()
        out = _CHOICES["buffer"]
        _raise_flags(fn(logits.data_ptr(), rows, logits.shape[1], out))
        return out[:rows]
    check_logits(logits)
    return argmax(logits).tolist()


def check_logits(logits: torch.Tensor) -> None:
    """Raise ValueError on NaN or +inf logits, or on a row with no finite logit.

    -inf is allowed: it is the usual way to forbid a token (probability 0).
    """
    fast = _scan(logits)
    if fast is not None:
        _raise_flags(fast[1])
        return
    if bool(torch.isfinite(logits.sum())):  # one cheap reduction in the common case: all finite
        return
    if bool(torch.isfinite(logits).all()):  # the sum overflowed, the logits are fine
        return
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN: the model produced invalid output (check its weights and dtype)")
    if torch.isposinf(logits).any():
        raise ValueError("logits contain +inf: the model produced invalid output (check its weights and dtype)")
    if (~torch.isfinite(logits)).all(dim=-1).any():
        raise ValueError("a row of logits is entirely -inf: no token can be chosen")


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits ``[..., vocab]`` into probabilities ``[..., vocab]`` (float32) under ``params``.

    Order: temperature, top-k, softmax, top-p, min-p, renormalise. With temperature 0 the result is
    the one-hot distribution of the argmax (ties go to the lowest token id, as torch.argmax does).
    """
    check_logits(logits)
    logits = logits.float()
    if params.greedy:
        probs = torch.zeros_like(logits)
        probs.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        return probs
    fast = _native_probs(logits, params)
    if fast is not None:
        return fast
    logits = logits / params.temperature
    if torch.isposinf(logits).any():
        raise ValueError(f"logits overflow at temperature {params.temperature}: use a larger temperature")
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        threshold = params.min_p * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def log_probs(logits: torch.Tensor, params: SamplingParams | None = None) -> torch.Tensor:
    """Log-probabilities ``[..., vocab]`` (float32) of the tokens given ``logits`` ``[..., vocab]``.

    params None: the model's own distribution, ``log_softmax(logits)`` (temperature 1, nothing cut).
    params given: the distribution a token is drawn from under them, ``log(probs_from_logits(logits, params))``:
    -inf for the tokens that top-k, top-p or min-p cut; greedy, 0 at the argmax and -inf elsewhere.
    """
    if params is not None:
        return probs_from_logits(logits, params).log()
    check_logits(logits)
    return torch.log_softmax(logits.float(), dim=-1)


def _native_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor | None:
    """probs_from_logits in one native pass per row (CPU float32), or None where the native library is absent."""
    if logits.device.type != "cpu" or logits.dim() == 0 or logits.numel() == 0:
        return None
    fn = _native("specwise_probs")
    if fn is None:
        return None
    logits = logits.contiguous()
    n = logits.shape[-1]
    out = torch.empty_like(logits)
    status = fn(
        logits.data_ptr(),
        logits.numel() // n,
        n,
        params.temperature,
        params.top_k,
        params.top_p,
        params.min_p,
        out.data_ptr(),
    )
    if status == 1:
        raise ValueError(f"logits overflow at temperature {params.temperature}: use a larger temperature")
    if status:
        raise MemoryError("out of memory while computing sampling probabilities")
    return out


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: keep the most likely tokens until their mass reaches ``top_p`` (at least one token).

    A token is kept when the mass of the tokens ranked before it is below ``top_p``; every token exactly as
    likely as the least likely kept token is kept too, so ties never depend on sort order. Only the largest
    probabilities are sorted (``topk``, widened until they hold ``top_p`` of the mass), not the whole vocabulary.
    """
    vocab = probs.shape[-1]
    k = min(64, vocab)
    while True:
        top = torch.topk(probs, k, dim=-1).values  # [..., k], descending
        if k == vocab or bool((top.sum(dim=-1) >= top_p).all()):
            break
        k = min(vocab, k * 8)
    mass_before = top.cumsum(dim=-1) - top
    kept = (mass_before < top_p).sum(dim=-1, keepdim=True).clamp_min(1)  # the top token is always kept
    threshold = top.gather(-1, kept - 1)  # [..., 1]: the least likely kept probability
    return probs.masked_fill(probs < threshold, 0.0)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row from ``probs`` ``[..., vocab]`` (need not sum to 1); returns ``[...]`` (int64).

    Inverse-CDF sampling: one uniform per row (from ``generator``) against a float64 cumulative sum. On a CPU this
    is several times faster than ``torch.multinomial`` over a large vocabulary, and a token of probability 0 is
    never drawn.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    u = torch.rand((flat.shape[0], 1), generator=generator, device=flat.device, dtype=torch.float64)
    return sample_with(flat, u).reshape(probs.shape[:-1])


def sample_with(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """:func:`sample` with the uniforms given: ``probs`` ``[rows, vocab]``, ``uniforms`` float64 ``[rows, 1]``."""
    fast = _native_sample(probs, uniforms)
    if fast is not None:
        return fast
    vocab = probs.shape[-1]
    cdf = probs.double().cumsum(dim=-1)  # [rows, vocab]
    total = cdf[:, -1:]
    if not bool(((total > 0) & torch.isfinite(total)).all()) or bool((probs < 0).any()):
        raise ValueError("cannot sample: probabilities must be finite, non-negative and not all zero")
    u = uniforms.to(cdf.device) * total
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1)  # first token whose cdf exceeds u
    over = tokens >= vocab  # u rounded up to the total: take the last token of positive probability
    if bool(over.any()):
        last = vocab - 1 - (probs.flip(-1) > 0).to(torch.int8).argmax(dim=-1)
        tokens = torch.where(over, last, tokens)
    return tokens


def _native_sample(flat: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
    """sample_with() in native code for CPU float32 rows, or None."""
    if flat.device.type != "cpu" or flat.dtype != torch.float32 or flat.numel() == 0:
        return None
    fn = _native("specwise_sample")
    if fn is None:
        return None
    flat = flat.contiguous()
    rows, vocab = flat.shape
    u = u.contiguous()
    out = torch.empty(rows, dtype=torch.int64)
    status = fn(flat.data_ptr(), rows, vocab, u.data_ptr(), out.data_ptr())
    if status == 1:
        raise ValueError("cannot sample: probabilities must be finite, non-negative and not all zero")
    if status:
        raise MemoryError("out of memory while sampling")
    return out
