"""Estimates that learn from observations: a decayed mean with a prior, and smoothed times.

Shared by the planner's cost model (``specwise/costs.py``) and its acceptance record (``specwise/acceptance.py``).
"""

from __future__ import annotations

__all__ = ["Rate", "clip", "smooth"]


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


def clip(sample: float, around: float) -> float:
    """``sample`` limited to [1/2, 2] times the current estimate ``around``: one pause of the machine moves an
    estimate by a bounded step."""
    return min(max(sample, 0.5 * around), 2.0 * around)


def smooth(old: float | None, sample: float, weight: float = 0.2) -> float:
    """Exponential smoothing of a time, the sample clipped first."""
    if old is None or old <= 0:
        return sample
    return (1.0 - weight) * old + weight * clip(sample, old)
