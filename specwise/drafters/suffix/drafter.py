"""The `suffix` drafter: drafts from the global index (:mod:`specwise.drafters.suffix.index`), from counts of
the request's own tokens kept as text arrives, and from an overlay of served answers; the one of the three with
the most tokens expected to be accepted is proposed."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from specwise.artifacts import shipped_index_dir
from specwise.drafters.base import Draft, Drafter
from specwise.drafters.suffix.index import DEFAULT_PRIORS, DEPTH, LEAD, SuffixIndex, confidence
from specwise.drafters.suffix.load import load_index
from specwise.sampling import SamplingParams

__all__ = [
    "LOCAL_ORDERS",
    "AnswerOverlay",
    "NgramCounts",
    "SuffixDrafter",
    "chained_accepted",
    "make_suffix_drafter",
]


class NgramCounts:
    """For each n-gram (n in ``orders``) of the text added, how often each token followed it.

    ``add``/``remove`` a whole sequence; ``extend`` a growing one (the request's context) from where it was.
    """

    def __init__(self, orders: tuple[int, ...]) -> None:
        self.orders = tuple(sorted(set(orders), reverse=True))
        self.table: dict[tuple[int, ...], dict[int, int]] = {}  # gram -> {next token: count, -1: total}

    def _update(self, seq: list[int], start: int, end: int, delta: int) -> None:
        table = self.table
        for i in range(max(start, 1), end):  # the gram ends at i, the token seq[i] follows it
            nxt = seq[i]
            for n in self.orders:
                if n > i:
                    continue
                gram = tuple(seq[i - n : i])
                row = table.get(gram)
                if row is None:
                    row = table[gram] = {-1: 0}
                row[nxt] = row.get(nxt, 0) + delta
                row[-1] += delta
                if delta < 0:
                    if row[nxt] <= 0:
                        del row[nxt]
                    if row[-1] <= 0:
                        del table[gram]

    def add(self, seq: list[int]) -> None:
        self._update(seq, 1, len(seq), 1)

    def remove(self, seq: list[int]) -> None:
        self._update(seq, 1, len(seq), -1)

    def extend(self, seq: list[int], done: int) -> None:
        """Count the grams of ``seq`` followed by tokens at positions ``done .. len(seq) - 1``."""
        self._update(seq, done, len(seq), 1)

    def draft(self, context: list[int], k: int, max_len: int, min_len: int, stop: float, smooth: float, half: float):
        """(n, tokens, confidences, counts): the longest n-gram ending the context that has followed text, and up to
        ``k`` tokens drafted from it, each the most frequent follower of the last n tokens so far; counts: (times
        the token followed, times the n tokens before it occurred) per token."""
        table = self.table
        for n in self.orders:
            if n > max_len or n < min_len or n > len(context):
                continue
            row = table.get(tuple(context[-n:]))
            if row is None:
                continue
            window = list(context[-n:])
            tokens, conf, counts = [], [], []
            reach = 1.0
            while row is not None and len(tokens) < k:
                total = row[-1]
                best, count = max(((t, c) for t, c in row.items() if t >= 0), key=lambda tc: (tc[1], -tc[0]))
                q = confidence(count, total, n, smooth, half)
                if reach * q < stop:
                    break
                reach *= q
                tokens.append(best)
                conf.append(q)
                counts.append((count, total))
                window = window[1:] + [best]
                row = table.get(tuple(window))
            return n, tokens, conf, counts
        return 0, [], [], []


class AnswerOverlay:
    """Served answers kept in memory (the latest ``max_tokens`` tokens; the oldest answers leave first) and their
    n-gram counts: what later requests draft from, shared by a drafter and its forks."""

    def __init__(self, orders: tuple[int, ...], max_tokens: int) -> None:
        self.counts = NgramCounts(orders)
        self.max_tokens = max_tokens
        self.answers: deque[list[int]] = deque()  # oldest first
        self.size = 0  # tokens in ``answers``

    def add(self, answer: list[int], prompt: list[int] | None = None) -> None:
        """Add an answer after the last ``LEAD`` tokens of its prompt (nothing when the answer is empty, or when
        the two alone are over the bound)."""
        seq = list((prompt or [])[-LEAD:]) + list(answer)
        if not answer or len(seq) > self.max_tokens:
            return
        self.counts.add(seq)
        self.answers.append(seq)
        self.size += len(seq)
        while self.size > self.max_tokens:
            old = self.answers.popleft()
            self.counts.remove(old)
            self.size -= len(old)


LOCAL_ORDERS = (1, 2, 3, 4, 6, 8, 12, 16, 24)


def chained_accepted(confidence: list[float]) -> float:
    """Tokens of a draft expected to be accepted from its per-token confidences: the sum of their running products
    (the planner's :func:`specwise.acceptance.expected_accepted_iid` is the same for one rate at every position)."""
    total, reach = 0.0, 1.0
    for c in confidence:
        reach *= c
        total += reach
    return total


class SuffixDrafter(Drafter):
    """Drafts from the target's earlier answers (a global :class:`SuffixIndex`, an overlay of served answers) and
    from the request's own tokens; see :mod:`specwise.drafters.suffix`.

    max_match, min_match: the suffix lengths of the context searched (longest first); shorter matches than
        ``min_match`` propose nothing.
    priors: (smooth, half) of the confidences (:func:`confidence`) of the global index's drafts (``"index"``) and
        of the counts' (``"counts"``): the weight of the prior and the match length whose prior is 1/2. An index
        built by ``specwise index`` holds the values fitted on held-out answers of the target (``calibration`` in
        its ``index.json``), which :func:`make_suffix_drafter` uses.
    overlay_tokens: the most tokens the overlay of served answers holds (the oldest answers leave first).
    """

    name = "suffix"

    def __init__(
        self,
        index: SuffixIndex | None = None,
        max_match: int = 24,
        min_match: int = 2,
        priors: dict[str, tuple[float, float]] | None = None,
        overlay_tokens: int = 100_000,
        device: str = "cpu",
    ) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"match lengths must satisfy 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.index = index
        self.max_match, self.min_match = max_match, min_match
        self.priors = {**DEFAULT_PRIORS, **(priors or {})}
        self.device = device
        orders = tuple(n for n in LOCAL_ORDERS if n <= max_match) + (max_match,)
        self.overlay = AnswerOverlay(orders, overlay_tokens)
        self._orders = orders
        self.begin([])

    @property
    def overlay_tokens(self) -> int:
        """The most tokens the overlay of served answers holds."""
        return self.overlay.max_tokens

    def begin(self, prompt: list[int]) -> None:
        self.local = NgramCounts(self._orders)
        self._indexed = 0  # positions of the context whose preceding grams are counted

    def _forked(self, target) -> None:
        # Shared with the fork: the global index (its native calls' scratch buffers too: one thread steps every
        # sequence, so no two searches run at once) and the overlay of served answers (an answer added by one
        # sequence is drafted from by all). Its own: the request's counts.
        self.begin([])

    def add_answer(self, answer: list[int], prompt: list[int] | None = None) -> None:
        """Add a finished answer (with the last tokens of its ``prompt``) to the overlay: later requests draft from
        it. The overlay lives in memory and keeps the latest ``overlay_tokens`` tokens; :meth:`save` writes it."""
        self.overlay.add(answer, prompt)

    def save(self, directory: Path | str) -> None:
        """Write the global index with the overlay's answers added, as a new index directory."""
        base = self.index.sequences() if self.index is not None else []
        info = dict(self.index.info) if self.index is not None else {}
        answers = list(self.overlay.answers)
        info["overlay_sequences"] = info.get("overlay_sequences", 0) + len(answers)
        depth = self.index.depth if self.index is not None else DEPTH
        SuffixIndex.from_sequences(base + answers, depth, info).save(directory)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator, stop: float = 0.0) -> Draft:
        if len(context) < self._indexed:
            self.begin([])  # not a continuation of the counted context: start over
        self.local.extend(context, self._indexed)
        self._indexed = len(context)
        if k <= 0 or len(context) < self.min_match:
            return Draft.empty(self.device)
        best: tuple[float, int, list[int], list[float]] = (0.0, 0, [], [])
        args = (context, k, self.max_match, self.min_match, stop, *self.priors["counts"])
        for counts in (self.local, self.overlay.counts):
            if counts.table:
                n, tokens, conf, _ = counts.draft(*args)
                if tokens:
                    best = max(best, (chained_accepted(conf), n, tokens, conf), key=lambda b: (b[0], b[1]))
        if self.index is not None:
            match = self.index.match(context, self.max_match, self.min_match)
            if match[0]:
                tokens, conf, _ = self.index.draft(match, k, stop, *self.priors["index"])
                if tokens:
                    best = max(best, (chained_accepted(conf), match[0], tokens, conf), key=lambda b: (b[0], b[1]))
        if not best[2]:
            return Draft.empty(self.device)
        return Draft(best[2], confidence=best[3], device=self.device)


def make_suffix_drafter(arg: str, target, device="cpu") -> SuffixDrafter:
    """The drafter of spec ``suffix[:DIR]`` for ``target`` (a LoadedModel): the index in DIR, else the one shipped
    for the target if any, else the request's own tokens and the overlay only."""
    directory = Path(arg) if arg else shipped_index_dir(target.name)
    index = None
    if directory is not None:
        index = load_index(directory, target=target)
    fitted = (index.info.get("calibration") or {}) if index is not None else {}
    priors = {source: (fit["smooth"], fit["half"]) for source, fit in fitted.items() if source in DEFAULT_PRIORS}
    return SuffixDrafter(index, priors=priors, device=device)
