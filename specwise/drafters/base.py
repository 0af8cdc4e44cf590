"""The Drafter contract: propose up to k tokens that continue a context."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from specwise.sampling import SamplingParams

__all__ = ["Draft", "Drafter", "common_prefix"]


def common_prefix(a: list[int], b: list[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (counting at most ``limit`` items)."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    if a[:n] == b[:n]:  # the usual case, compared at C speed
        return n
    return next(i for i in range(n) if a[i] != b[i])


@dataclass
class Draft:
    """Proposed tokens and the distribution each was drawn from.

    tokens: ``[k]`` int64 (k may be smaller than asked, even 0).
    probs: ``[k, vocab]`` q for each token, or None when the drafter proposes single tokens (q is one-hot).
    alternatives: ``(i, token)`` pairs, greedy drafts only: ``token`` is another candidate for position i (a
    sibling of ``tokens[i]``, a leaf of a draft tree). A target that verifies trees scores them in the same pass;
    when ``tokens[i]`` is rejected and an alternative is the target's choice there, that alternative is kept
    and the target's next token after it comes free. Others ignore them.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    alternatives: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> Draft:
        return cls(torch.empty(0, dtype=torch.int64, device=device))

    def __len__(self) -> int:
        return int(self.tokens.numel())


class Drafter(ABC):
    """Proposes continuations; the engine verifies them against the target.

    A drafter serves one sequence at a time: ``begin`` starts it, then the context only grows by the
    tokens the engine emits.
    """

    name: str = "drafter"
    needs_features: bool = False  # the engine makes the target keep its features (Model.features) when True
    # Set by the engine from the schedule before each proposal: a drafter that can estimate the probability that
    # all its tokens so far will be accepted stops drafting once that falls below this (0: never stop early).
    min_confidence: float = 0.0
    # Set by propose: True when the drafter had a proposal but held it back for confidence below min_confidence
    # (the engine then counts the plain step under "low_confidence" rather than "no_draft").
    declined: bool = False

    def begin(self, prompt: list[int]) -> None:
        """Start a new sequence (drop any state from the previous one)."""

    @abstractmethod
    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None) -> Draft:
        """Propose up to ``k`` tokens continuing ``context`` (prompt and everything emitted so far).

        Under sampling, a drafter that returns ``probs`` must draw each token from ``probs`` shaped by
        ``params`` with ``generator``; one that returns None proposes deterministic tokens.
        """

    def source_name(self) -> str:
        """The name of the drafter that made the last proposal (a part of a combined drafter, or this one)."""
        return self.name

    def observe(self, num_accepted: int) -> None:
        """Feedback after verification: how many of the last proposal's tokens were kept."""
