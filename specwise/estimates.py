"""Estimates that learn from observations: a decayed mean with a prior, and smoothed times.

Shared by the planner's cost model (``specwise/costs.py``) and its acceptance record (``specwise/acceptance.py``).
"""

from __future__ import annotations

__all__ = ["Line", "Rate", "clip", "smooth"]


class Rate:
    """A decayed mean with a prior: ``(total + weight * prior) / (count + weight)``.

    ``add(sample, count)`` forgets a fraction ``1 - decay`` of what came before, then adds ``sample`` over
    ``count`` observations (an acceptance rate: 1 or 0 per try; accepted tokens over drafted ones; a mean of
    measured ratios).
    """

    __slots__ = ("prior", "weight", "decay", "total", "count")

    def __init__(self, prior: float, weight: float, decay: float) -> None:
        self.prior, self.weight, self.decay = prior, weight, decay
        self.total = 0.0
        self.count = 0.0

    def value(self, prior: float | None = None) -> float:
        """The estimate (with ``prior`` instead of the stored one, when given)."""
        prior = self.prior if prior is None else prior
        return (self.total + self.weight * prior) / (self.count + self.weight)

    def add(self, sample: float, count: float = 1.0) -> None:
        self.total = self.decay * self.total + sample
        self.count = self.decay * self.count + count

    def scale(self, factor: float) -> None:
        self.total *= factor
        self.count *= factor

    def reset(self) -> None:
        self.total = self.count = 0.0


class Line:
    """A decayed least-squares line ``y = a + b x`` (``b >= 0``) through observations and fixed prior points (what
    sharing a pass adds to its cost, against its rows: ``specwise/costs.py``).

    ``add(x, y)`` forgets a fraction ``1 - decay`` of what came before, then adds the point; the prior points keep
    their ``weight`` (shared between them), so that the line is defined before two distinct ``x`` were observed and
    a cluster of observations at one ``x`` is joined to the prior elsewhere rather than extrapolated flat. Where
    observations cover several ``x``, they outweigh the prior within a few dozen of them.
    """

    __slots__ = ("points", "weight", "decay", "n", "sx", "sy", "sxx", "sxy")

    def __init__(self, points: list[tuple[float, float]], weight: float, decay: float) -> None:
        if not points:
            raise ValueError("a Line needs at least one prior point")
        self.points, self.weight, self.decay = list(points), weight, decay
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.n = d * self.n + 1.0
        self.sx = d * self.sx + x
        self.sy = d * self.sy + y
        self.sxx = d * self.sxx + x * x
        self.sxy = d * self.sxy + x * y

    def value(self, x: float) -> float:
        w = self.weight / len(self.points)
        n, sx, sy = self.n + self.weight, self.sx, self.sy
        sxx, sxy = self.sxx, self.sxy
        for px, py in self.points:
            sx, sy, sxx, sxy = sx + w * px, sy + w * py, sxx + w * px * px, sxy + w * px * py
        det = n * sxx - sx * sx
        slope = max(0.0, (n * sxy - sx * sy) / det) if det > 1e-9 * n * n else 0.0
        return (sy - slope * sx) / n + slope * x


def clip(sample: float, around: float) -> float:
    """``sample`` limited to [1/2, 2] times the current estimate ``around``: one pause of the machine moves an
    estimate by a bounded step."""
    return min(max(sample, 0.5 * around), 2.0 * around)


def smooth(old: float | None, sample: float, weight: float = 0.2) -> float:
    """Exponential smoothing of a time, the sample clipped first."""
    if old is None or old <= 0:
        return sample
    return (1.0 - weight) * old + weight * clip(sample, old)
