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

    A draft's ``kind`` is the length of its match: the planner measures the first token's acceptance per match
    length, so that a one-token match that keeps failing is held back while a three-token match that keeps
    copying is drafted.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, device: torch.device | str = "cpu") -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.device = device
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        # _last[n][gram] = end index (exclusive) of the latest occurrence of gram, among ends < len(context)
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._indexed_until = 0  # ends 1 .. _indexed_until - 1 are in the index

    def _forked(self, target) -> None:
        self.begin([])  # new tables: the index is all per-sequence state

    def _index(self, context: list[int]) -> None:
        end_limit = len(context)  # the current suffix (end == len) is looked up, not indexed
        for end in range(max(self._indexed_until, 1), end_limit):
            for n, table in self._last.items():
                if end >= n:
                    table[tuple(context[end - n : end])] = end
        self._indexed_until = max(self._indexed_until, end_limit)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator, stop: float = 0.0) -> Draft:
        if len(context) < self._indexed_until:
            self.begin([])  # the context is not a continuation of the indexed one: start over
        self._index(context)
        if k <= 0:
            return Draft.empty(self.device)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) < n:
                continue
            end = self._last[n].get(tuple(context[-n:]))
            if end is not None:
                continuation = context[end : end + k]
                return Draft(list(continuation), kind=n, device=self.device)
        return Draft.empty(self.device)
