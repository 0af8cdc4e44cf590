"""The `ngram` drafter (prompt lookup): no model, the context itself proposes.

The longest recent n-gram of the context that matched earlier proposes the tokens that followed that earlier
occurrence. Useful when answers copy from the prompt (summaries, code edits, retrieval).
"""

from __future__ import annotations

import torch

from specwise.drafters.base import Draft, Drafter
from specwise.sampling import SamplingParams


class NgramDrafter(Drafter):
    """Prompt lookup with an incremental index: each proposal costs O(max_ngram), not O(context).

    max_ngram, min_ngram: the suffix lengths tried, longest first.

    Confidence: per request, the drafter keeps the acceptance rate of its first drafted token for each match
    length (decayed counts, starting from ``prior`` with ``prior_weight`` pseudo-observations). When that estimate
    for the match in hand is below ``min_confidence`` (set by the schedule: the break-even acceptance of a drafted
    token) it proposes nothing and the step is a plain one. A one-token match that keeps failing is skipped, a
    three-token match that keeps copying is drafted.
    """

    name = "ngram"

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        device: torch.device | str = "cpu",
        prior: float = 0.5,
        prior_weight: float = 2.0,
        decay: float = 0.9,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.device = device
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        # _last[n][gram] = end index (exclusive) of the latest occurrence of gram, among ends < len(context)
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._indexed_until = 0  # ends 1 .. _indexed_until - 1 are in the index
        self._tries = dict.fromkeys(self._last, 0.0)  # decayed proposals by match length
        self._hits = dict.fromkeys(self._last, 0.0)  # ... whose first token was accepted
        self._pending: int | None = None  # match length of the last proposal, until observed
        self.skipped = 0  # matches not drafted for low confidence, this request

    def confidence(self, n: int) -> float:
        """Estimated probability that the first token drafted from a match of length ``n`` is accepted."""
        w = self.prior_weight
        return (self._hits[n] + w * self.prior) / (self._tries[n] + w)

    def _index(self, context: list[int]) -> None:
        end_limit = len(context)  # the current suffix (end == len) is looked up, not indexed
        for end in range(max(self._indexed_until, 1), end_limit):
            for n, table in self._last.items():
                if end >= n:
                    table[tuple(context[end - n : end])] = end
        self._indexed_until = max(self._indexed_until, end_limit)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator) -> Draft:
        if len(context) < self._indexed_until:
            self.begin([])  # the context is not a continuation of the indexed one: start over
        self._index(context)
        self._pending = None  # a proposal not verified (another drafter's was chosen) teaches nothing
        self.declined = False
        if k <= 0:
            return Draft.empty(self.device)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) < n:
                continue
            end = self._last[n].get(tuple(context[-n:]))
            if end is not None:
                if self.confidence(n) < self.min_confidence:
                    self.skipped += 1
                    self.declined = True
                    return Draft.empty(self.device)
                self._pending = n
                continuation = context[end : end + k]
                return Draft(torch.tensor(continuation, dtype=torch.int64, device=self.device))
        return Draft.empty(self.device)

    def observe(self, num_accepted: int) -> None:
        n, self._pending = self._pending, None
        if n is None:
            return
        self._tries[n] = self.decay * self._tries[n] + 1.0
        self._hits[n] = self.decay * self._hits[n] + (1.0 if num_accepted > 0 else 0.0)
