"""The `ngram` drafter (prompt lookup): no model, the context itself proposes.

The longest recent n-gram of the context that matched earlier proposes the tokens that followed that earlier
occurrence. Useful when answers copy from the prompt (summaries, code edits, retrieval).
"""

from __future__ import annotations

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
    copies = True  # copies of the context: long runs where they keep being accepted

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, device: str = "cpu") -> None:
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

    def index(self, context: list[int]) -> None:
        """Bring the index up to ``context`` (started over when it is not a continuation of the indexed one)."""
        if len(context) < self._indexed_until:
            self.begin([])
        self._index(context)

    def lookup(self, sequence: list[int], k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens that followed the longest indexed match of ``sequence``'s suffix, and the match's
        length (0: none). ``sequence`` may run past the indexed context (a draft's own tokens): only its suffix is
        looked up, so the continuation always starts inside the indexed part."""
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(sequence) < n:
                continue
            end = self._last[n].get(tuple(sequence[-n:]))
            if end is not None:
                return list(sequence[end : end + k]), n
        return [], 0

    def propose(self, context: list[int], k: int, params: SamplingParams, generator, stop: float = 0.0) -> Draft:
        self.index(context)
        if k <= 0:
            return Draft.empty(self.device)
        continuation, n = self.lookup(context, k)
        return Draft(continuation, kind=n, device=self.device) if continuation else Draft.empty(self.device)
