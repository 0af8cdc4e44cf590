"""The Drafter contract: propose up to k tokens that continue a context."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from specwise.sampling import SamplingParams

if TYPE_CHECKING:
    from specwise.models.base import Model

__all__ = ["Draft", "Drafter", "common_prefix"]


def common_prefix(a: list[int], b: list[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (counting at most ``limit`` items)."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    if a[:n] == b[:n]:  # the usual case, compared at C speed
        return n
    return next(i for i in range(n) if a[i] != b[i])


class Draft:
    """Proposed tokens and the distribution each was drawn from.

    tokens: the ``k`` token ids as a list of ints or an integer array (k may be smaller than asked, even 0: nothing
        to propose); ``tokens`` is always an int64 array ``[k]`` and ``ids`` the list, each made from the other when
        first asked for (a drafter that has a list passes it, and a greedy step never makes the array).
    probs: float32 ``[k, vocab]`` (a numpy array): q for each token, or None when the drafter proposes single
        tokens (q is one-hot).
    confidence: optional, per token: the drafter's estimate of the probability that token i is accepted when the
        tokens before it are. The planner cuts the draft where their product falls below its stop level.
    kind: optional label of what the draft was drawn from, when that predicts its acceptance (prompt lookup: the
        length of the matched n-gram). The planner measures the first token's acceptance per kind and uses it as
        that token's confidence.
    intake: tokens of context the drafter took in before drafting it (a draft model catching up after steps it
        was not asked in, or on the prompt): such a draft's time is not what drafting a token costs, and the planner
        prices it apart (a drafter asked every step takes in one or two: the bonus token and its own last draft).
    device: where the drafter ran ("cpu", "cuda:0"), a label only: the arrays are numpy, in host memory.
    """

    __slots__ = ("_tokens", "_ids", "probs", "confidence", "kind", "device", "intake")

    def __init__(
        self,
        tokens: np.ndarray | Sequence[int],
        probs: np.ndarray | None = None,
        confidence: list[float] | None = None,
        kind: int | None = None,
        device: str = "cpu",
        intake: int = 0,
    ) -> None:
        if isinstance(tokens, np.ndarray):
            if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
                raise ValueError(f"draft tokens must be a 1-D array of integer ids, got {tokens.dtype} {tokens.shape}")
            self._tokens, self._ids = tokens.astype(np.int64, copy=False), None
        else:
            self._tokens, self._ids = None, [int(t) for t in tokens]
        self.probs, self.confidence, self.kind, self.device, self.intake = probs, confidence, kind, device, intake

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = np.array(self._ids, dtype=np.int64)
        return self._tokens

    @property
    def ids(self) -> list[int]:
        if self._ids is None:
            self._ids = self._tokens.tolist()
        return self._ids

    @classmethod
    def empty(cls, device: str = "cpu") -> Draft:
        return cls([], device=device)

    def __len__(self) -> int:
        return len(self._ids) if self._ids is not None else self._tokens.shape[0]

    def __repr__(self) -> str:
        return f"Draft({self.ids}, probs={None if self.probs is None else tuple(self.probs.shape)}, kind={self.kind})"

    def prefix(self, n: int) -> Draft:
        """The first ``n`` tokens of this draft."""
        probs = None if self.probs is None else self.probs[:n]
        confidence = None if self.confidence is None else self.confidence[:n]
        tokens = self._ids[:n] if self._ids is not None else self._tokens[:n]
        return Draft(tokens, probs, confidence, self.kind, self.device, self.intake)


class Drafter(ABC):
    """Proposes continuations; a planner decides what to ask and the engine verifies them against the target.

    A drafter serves one sequence at a time: ``begin`` starts it, then the context only grows by the tokens the
    engine emits.
    """

    name: str = "drafter"
    needs_features: bool = False  # the engine makes the target keep its features (Model.features) when True
    # proposes deterministic copies of text it was given (a prediction, the prompt): where they keep being accepted,
    # the adaptive planner lets it draft long runs (AdaptivePlanner.long_gamma)
    copies: bool = False

    def begin(self, prompt: list[int]) -> None:
        """Start a new sequence (drop any state from the previous one)."""

    def pending(self, context: list[int]) -> int:
        """Tokens of ``context`` this drafter would take in before drafting (what its draft's ``intake`` would
        be): 0 for drafters with nothing to catch up on."""
        return 0

    def fork(self, target: Model) -> Drafter:
        """A drafter of the same kind and configuration for another sequence, whose target sequence is ``target``
        (a Model from the target's ``sequence()``): it shares everything heavy (weights, global indexes) and none
        of the per-sequence state, so that the two can draft for different sequences in turn.

        This default is a shallow copy (everything shared) whose per-sequence state :meth:`_forked` then replaces.
        """
        other = copy.copy(self)
        other._forked(target)
        return other

    def _forked(self, target: Model) -> None:
        """Called on a shallow copy made by :meth:`fork`: give it new objects for every piece of per-sequence state
        (never clear a shared one in place), reading the target's features from ``target`` where it reads them."""
        raise NotImplementedError(
            f"{type(self).__name__} does not say which of its state is per sequence: implement _forked (or fork)"
        )

    @abstractmethod
    def propose(
        self,
        context: list[int],
        k: int,
        params: SamplingParams,
        generator: np.random.Generator | None,
        stop: float = 0.0,
    ) -> Draft:
        """Propose up to ``k`` tokens continuing ``context`` (prompt and everything emitted so far).

        Under sampling, a drafter that returns ``probs`` must draw each token from ``probs`` shaped by
        ``params`` with ``generator``; one that returns None proposes deterministic tokens.
        stop: the planner cuts the draft at the first token where the product of ``Draft.confidence`` falls below
        this; a drafter that drafts token by token may stop there instead of drafting tokens that would be cut
        (0: no stop; drafters without a confidence ignore it).
        """
