"""What a batch's prompt reading costs and may hold: :class:`PrefillCosts` learns, as the batch runs, the seconds of
a decoding step and of a prompt row by its position, so that the batch chooses prompt slices by their measured cost
(``specwise.batch``); :func:`default_cache_memory` and :func:`position_bytes` bound the memory of the slots' kept
caches."""

from __future__ import annotations

import contextlib
import os

from specwise.estimates import Line, clip, smooth
from specwise.models.base import CacheArrays, Model

__all__ = ["CACHE_SHARE", "PrefillCosts", "default_cache_memory", "kernel_rows", "position_bytes"]

CACHE_SHARE = 0.25  # the default share of the machine's memory that the slots' caches may hold


def default_cache_memory() -> int | None:
    """The default bound of the slots' caches: ``CACHE_SHARE`` of the machine's memory (of its cgroup's limit where
    that is less); None where neither is known."""
    sizes = []
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sizes.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 1 << 60:  # "max", or a huge number: no limit
            sizes.append(int(text))
    return int(CACHE_SHARE * min(sizes)) if sizes else None


def position_bytes(model: Model) -> int | None:
    """Bytes of keys and values that one position of ``model``'s cache takes in every layer (from its ``k_cache``
    and ``v_cache``, laid out ``[layers, kv heads, capacity, head dim]``: :class:`~specwise.models.base.CacheArrays`);
    None for a model that keeps its cache otherwise."""
    if not isinstance(model, CacheArrays):
        return None
    k, v = model.k_cache, model.v_cache
    shape = () if k is None else tuple(k.shape)
    if v is None or len(shape) != 4 or not shape[2]:
        return None
    return (int(k.nbytes) + int(v.nbytes)) // int(shape[2])


def kernel_rows() -> int:
    """Rows of one call of the native layer kernel: a pass over more runs them in calls of this many, each reading
    every weight once."""
    from specwise.models.kernels import quant

    return quant.MAX_ROWS


class PrefillCosts:
    """What feeding a prompt costs, learnt from a batch's steps: the seconds of a step in which sequences only
    decode, and the seconds per prompt row against its position (a row's attention reads every position before it,
    so that a row deep in a long prompt costs several times one near its start). Apart for the rows fed beside
    decoding sequences (what they add to a decoding step: the step's time less the decoding step's) and the rows fed
    alone (the step's whole time).

    A row's cost is a line in its position, fitted to the rows measured over a long memory (its shape), times a
    factor that follows the last measurements (a machine that others share turns slower or faster within a few
    steps). Each measurement is first clipped to [1/2, 2] times the estimate, so that one pause moves it by a
    bounded step. A line starts as if a row cost twice as much ``SPAN`` positions further (steeper than measured
    models: Qwen2.5-Coder-1.5B's rows cost about 5 times as much at 16k as at the start) until rows measured at
    several positions outweigh that. Before the first slice of a kind is measured, the other kind's estimate is
    used, and before either, the caller's first slice.
    """

    SPAN = 2048
    FIRST_ROWS = 16  # a slice before any was measured
    WEIGHT = 1.0  # the prior's weight in the line, in observations
    DECAY = 0.97  # the line's memory
    SMOOTHING = 0.3  # the factor's and the decoding step's

    def __init__(self) -> None:
        self.decode: float | None = None  # smoothed seconds of a step of decoding sequences only
        self.since_decode = 0  # steps that fed a prompt beside decoding sequences since the last that fed none
        self._lines: dict[bool, Line] = {}  # beside decoding sequences (True) or alone: seconds per row by position
        self._least: dict[bool, float] = {}  # the cheapest row measured of each kind: a floor under its line
        self._factor: dict[bool, float] = {}  # the last measurements against the line

    def observe_decode(self, seconds: float) -> None:
        """A step in which sequences only decoded took ``seconds``."""
        self.decode = smooth(self.decode, seconds, self.SMOOTHING)
        self.since_decode = 0

    def observe_prefill(self, rows: int, position: float, seconds: float, decoding: bool) -> None:
        """A step fed ``rows`` prompt rows at about ``position`` (their mean) in ``seconds``, beside decoding
        sequences (``decoding``) or alone."""
        if rows < 1:
            return
        if decoding:
            self.since_decode += 1
            if self.decode is None:
                return
            seconds -= self.decode
        per_row = max(seconds, 0.0) / rows
        line = self._lines.get(decoding)
        if line is None:
            per_row = max(per_row, 1e-7)
            points = [(position, per_row), (position + self.SPAN, 2.0 * per_row)]
            self._lines[decoding] = Line(points, self.WEIGHT, self.DECAY)
            self._least[decoding], self._factor[decoding] = per_row, 1.0
            return
        shape = self._shape(decoding, position)
        factor = self._factor[decoding]
        per_row = clip(per_row, shape * factor)
        self._factor[decoding] = smooth(factor, per_row / shape, self.SMOOTHING)
        self._least[decoding] = min(self._least[decoding], per_row)
        line.add(position, per_row)

    def _shape(self, decoding: bool, position: float) -> float:
        return max(self._lines[decoding].value(position), 0.5 * self._least[decoding])

    def row_seconds(self, position: float, decoding: bool) -> float | None:
        """Estimated seconds of one prompt row at ``position``, beside decoding sequences or alone (the other
        kind's estimate before this kind was measured; None before either)."""
        kind = decoding if decoding in self._lines else not decoding
        if kind not in self._lines:
            return None
        return self._shape(kind, position) * self._factor[kind]

    def rows_within(self, seconds: float, position: int, most: int, decoding: bool) -> int | None:
        """The most prompt rows, at most ``most``, from ``position`` on whose estimated cost fits in ``seconds``
        (None before anything was measured)."""
        if not self._lines:
            return None
        lo, hi = 0, max(most, 0)  # the cost of n rows, n * (the cost of a row at their mean), grows with n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if mid * self.row_seconds(position + 0.5 * mid, decoding) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return lo
