"""What a planner knows of the text: per sequence and source, how often drafts are accepted.

A :class:`PlanState` is one sequence as the planner sees it: its sources (drafters) and, per source, a
:class:`SourceRecord`: the acceptance of each draft position, how often an ask gets a draft, the acceptance by
position of each kind of draft, and when the source was last asked. The machine's costs are the planner's own
(``specwise/costs.py``); the choices are made in ``specwise/planner.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specwise.drafters.base import Drafter
from specwise.estimates import Rate

__all__ = ["SourceRecord", "PlanState", "acceptance", "kind_acceptance", "expected_accepted_iid"]


class SourceRecord:
    """What a planner knows about one source of one sequence."""

    def __init__(self, max_gamma: int, prior_weight: float, decay: float) -> None:
        # P(position i accepted | positions < i accepted); each position's prior is the estimate before it
        self.positions = [Rate(0.0, prior_weight, decay) for _ in range(max_gamma)]
        self._weight, self._decay = prior_weight, decay
        self.asks = Rate(1.0, 0.5, decay)  # asks that got a draft (half a pseudo-observation of "yes")
        self.tokens = Rate(0.5, 4.0, 0.9)  # accepted / drafted tokens this request (a fixed gamma's choice)
        self.kinds: dict[object, list[Rate]] = {}  # by Draft.kind: the acceptance by position of that kind's drafts
        self.time_asks = False  # False for a request's first ask (it also takes in the prompt: not typical)
        self.plain_run = 0  # steps since this source was last asked
        self.asked_now = False  # asked during the current step
        self.probing = False  # the last choice for this source was a probe
        self.skip = 0  # steps for which the last "not worth asking" still stands (AdaptivePlanner.REUSE)

    def kind(self, kind: object) -> list[Rate]:
        """The record by position of this source's drafts of ``kind`` (``Draft.kind``), kept as ``positions`` is:
        each position's prior is the source's estimate there (:func:`kind_acceptance`)."""
        record = self.kinds.get(kind)
        if record is None:
            record = self.kinds[kind] = [Rate(0.0, self._weight, self._decay) for _ in self.positions]
        return record

    def chose(self, probing: bool, skip: int = 0) -> None:
        """The planner's choice for this source this step: whether it is a probe, and for how many steps a choice
        not to ask it stands."""
        self.probing, self.skip = probing, skip

    def skipped(self) -> None:
        """A step for which the last choice not to ask this source stood."""
        self.skip -= 1
        self.probing = False

    def asked(self) -> bool:
        """This source was asked in the current step. Returns whether its asks are timed (a request's first ask
        also takes in the prompt: not a typical ask's time)."""
        self.asked_now = True
        timed, self.time_asks = self.time_asks, True
        return timed

    def stepped(self) -> None:
        """The step is over: count the steps since this source was last asked."""
        self.plain_run = 0 if self.asked_now else self.plain_run + 1
        self.asked_now = False

    def begin(self, carry: float) -> None:
        """A new request: what describes the text (acceptance by position, of the source and of each kind of its
        drafts, and how often an ask gets a draft) is kept as a prior worth at most ``carry`` observations."""
        self.plain_run = 0
        self.skip = 0
        self.time_asks = False
        self.asked_now = False
        self.tokens.reset()
        for record in (self.positions, *self.kinds.values()):
            _carry(record, carry)
        if self.asks.count > 0:
            self.asks.scale(min(1.0, carry / self.asks.count))


def _carry(record: list[Rate], carry: float) -> None:
    """Scale a record by position so that its first position is worth at most ``carry`` observations (0: all to 0)."""
    first = record[0].count if record else 0.0
    factor = min(1.0, carry / first) if first > 0 else 1.0
    for rate in record:
        rate.scale(factor)


@dataclass
class AnswerLength:
    """The tokens the sequence's request in progress has produced so far (shared by the states of one sequence's
    requests, :meth:`Planner.for_request`)."""

    produced: int = 0


@dataclass
class PlanState:
    """One sequence as a planner sees it: its drafters (the sources) and what was learnt about them.

    keys: per source, the key of its costs in the planner's cost model (default: its index). A request's own
    source (a prediction, ``Planner.for_request``) is asked before the sequence's drafters and keeps a key of its
    own, so the drafters keep theirs whether or not a request brings one.
    request_record: the record of the request sources of this sequence, carried from request to request as the
    others are (None until a request brings one).
    answer: the length of the answer in progress (what the planner expects still to come rests on it).
    """

    sources: list[Drafter]
    known: list[SourceRecord] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)
    request_record: SourceRecord | None = None
    answer: AnswerLength = field(default_factory=lambda: AnswerLength())

    def __post_init__(self) -> None:
        if not self.keys:
            self.keys = list(range(len(self.sources)))


def acceptance(record: SourceRecord, prior: float) -> list[float]:
    """Estimated P(position i accepted | positions < i accepted) for one source, i = 0 .. max_gamma - 1.

    Each position's prior is the estimate of the position before it (the first's: ``prior``), so positions
    rarely drafted so far inherit what was seen just before them (and a drafter that is always right gets to
    draft longer).
    """
    out = []
    for rate in record.positions:
        prior = rate.value(prior)
        out.append(prior)
    return out


def kind_acceptance(record: SourceRecord, kind: object, prior: float) -> list[float]:
    """Estimated P(position i accepted | positions < i accepted) of the drafts of ``kind`` from ``record``'s source:
    the kind's own observations, each position with the source's estimate there (:func:`acceptance`) as its prior,
    so that a kind not seen yet is valued as the source's drafts are, and one seen by what became of its own."""
    return [rate.value(p) for rate, p in zip(record.kind(kind), acceptance(record, prior))]


def expected_accepted_iid(alpha: float, n: int) -> float:
    """Accepted tokens expected of a draft of ``n`` when each is accepted with probability ``alpha``."""
    return sum(alpha**i for i in range(1, n + 1))
