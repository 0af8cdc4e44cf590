"""The `none` drafter: proposes nothing, so the engine decodes plainly (the baseline for every speedup)."""

from __future__ import annotations

from specwise.drafters.base import Draft, Drafter
from specwise.sampling import SamplingParams


class NoDrafter(Drafter):
    """Plain autoregressive decoding through the same engine: one target pass per token."""

    name = "none"

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def _forked(self, target) -> None:
        pass  # no per-sequence state

    def propose(self, context: list[int], k: int, params: SamplingParams, generator, stop: float = 0.0) -> Draft:
        return Draft.empty(self.device)
