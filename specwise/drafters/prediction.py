"""The `prediction` drafter: a request's predicted output (OpenAI's Predicted Outputs) as a draft source.

A client that knows most of the answer (a file to edit, a document to revise) sends it as the prediction; its
tokens are drafted and the target verifies them, so the unchanged parts cost a pass per many tokens. The answer
may depart from the prediction (lines inserted, deleted or changed): the drafter keeps a pointer into the
prediction that advances while the emitted tokens follow it; after a departure it finds the longest recent suffix
of the output (an n-gram, longest first) in the prediction, preferring the nearest occurrence at or after the
pointer (the answer goes on further down the prediction), else the nearest before it, and drafts from there.

The drafts are deterministic copies (``probs`` None, q one-hot): the rejection rule keeps the output exact
whatever the prediction holds.
"""

from __future__ import annotations

from bisect import bisect_left

from specwise.drafters.base import Draft, Drafter
from specwise.metrics import PREDICTION
from specwise.sampling import SamplingParams

__all__ = ["PredictionDrafter"]


class PredictionDrafter(Drafter):
    """Drafts the continuation of a predicted output, re-synchronising after the answer departs from it.

    prediction: the predicted output's token ids (plain text, no special tokens).
    max_ngram, min_ngram: the output suffixes tried when re-synchronising, longest first.

    A draft that follows the pointer has ``kind`` None (its acceptance is the source's by position); a draft
    after a re-synchronisation has ``kind`` the length of the suffix matched, whose first-token acceptance the
    planner measures (a one-token match that keeps failing is held back, a long one drafted).
    """

    name = PREDICTION  # its drafted and accepted tokens: SpecStats.by_drafter["prediction"]
    copies = True  # deterministic copies of known text: the planner may let it draft long runs

    def __init__(self, prediction: list[int], max_ngram: int = 8, min_ngram: int = 1, device: str = "cpu") -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.prediction = [int(t) for t in prediction]
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.device = device
        self._ends: dict[int, dict[tuple[int, ...], list[int]]] | None = None  # built at the first departure
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        self._seen = len(prompt)  # context tokens taken in (the prompt is not output)
        self._start = len(prompt)  # where the output begins in the context
        self.pointer = 0  # the prediction token expected next
        self.aligned = True  # whether the output so far follows the prediction up to the pointer
        self._anchor: int | None = None  # the pointer before a re-synchronisation no emitted token has confirmed

    def _forked(self, target) -> None:
        self.begin([])

    def propose(self, context: list[int], k: int, params: SamplingParams, generator, stop: float = 0.0) -> Draft:
        self._follow(context)
        if k <= 0:
            return Draft.empty(self.device)
        kind = None
        if not self.aligned:
            found = self._resync(context)
            if found is None:
                return Draft.empty(self.device)
            self._anchor = self.pointer if self._anchor is None else self._anchor
            (self.pointer, kind), self.aligned = found, True
        tokens = self.prediction[self.pointer : self.pointer + k]
        return Draft(tokens, kind=kind, device=self.device) if tokens else Draft.empty(self.device)

    def _follow(self, context: list[int]) -> None:
        """Take in the tokens emitted since the last ask: the pointer advances while they follow the prediction."""
        if len(context) < self._seen:  # not a continuation of what was seen: re-synchronise on the output's suffix
            self.aligned = False
        prediction, pointer = self.prediction, self.pointer
        for token in context[self._seen :]:
            if not self.aligned:
                break
            if pointer < len(prediction) and prediction[pointer] == token:
                pointer, self._anchor = pointer + 1, None
            else:  # a departure (a re-synchronisation that no token confirmed does not move the pointer)
                if self._anchor is not None:
                    pointer, self._anchor = self._anchor, None
                self.aligned = False
        self.pointer, self._seen = pointer, len(context)

    def _resync(self, context: list[int]) -> tuple[int, int] | None:
        """Where to draft from after a departure, and the length of the suffix matched: the end of the longest
        suffix of the output found in the prediction with something after it, the occurrence nearest at or after
        the pointer, else the nearest before it (None: no such suffix)."""
        ends, size = self._index(), len(self.prediction)
        output = len(context) - self._start
        for n in range(min(self.max_ngram, output), self.min_ngram - 1, -1):
            found = ends[n].get(tuple(context[-n:]))
            if not found:
                continue
            i = bisect_left(found, self.pointer)  # found[i:]: at or after the pointer (only the last may be the end)
            if i < len(found) and found[i] < size:
                return found[i], n
            if i > 0:
                return found[i - 1], n
        return None

    def _index(self) -> dict[int, dict[tuple[int, ...], list[int]]]:
        """For each n-gram length, the ends (exclusive, ascending) of every occurrence of each n-gram of the
        prediction."""
        if self._ends is None:
            pred = self.prediction
            self._ends = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
            for n, table in self._ends.items():
                for end in range(n, len(pred) + 1):
                    table.setdefault(tuple(pred[end - n : end]), []).append(end)
        return self._ends
