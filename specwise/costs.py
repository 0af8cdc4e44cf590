"""What the machine's target passes and drafts cost, as the adaptive planner estimates them.

:class:`PassCosts` is the planner's cost model, shared by every sequence it plans for (the text's acceptance is
per sequence: ``specwise/acceptance.py``; the choices: ``specwise/planner.py``).

- A target pass over k tokens is estimated as ``scale * ratio(k)``: the scale (seconds of a 1-token pass) follows
  the plain steps' passes, so it tracks the machine's speed and the growing context; the ratios start from the
  cost curve c(k) (``specwise profile``) and learn from the passes over k tokens actually measured. An estimate
  that is updated only by the choices it drives cannot get stuck on one slow measurement: a ratio moves by a
  fraction of each observation, and every observation is clipped to [1/2, 2] times the current estimate.
- A pass shared by several sequences (each reading its own cache) costs more than as many rows of one: it is
  estimated apart, as the estimate for one sequence plus what sharing adds, a line in the pass's rows fitted to the
  shared passes measured, and used when planning for a shared pass (:class:`Shared`). One line, not a ratio per row
  count: a batch's passes come in few sizes (all plain, or all drafting), and what a plan weighs is the size it has
  not tried.
- The pass estimates are kept per thread count: a busy machine moves the target between two threads and one
  (``models/threads.py``), whose passes cost differently, and a pass tried on the other count must not move the
  estimates of the count in use.
- A pass over k tokens not measured yet is estimated along the cost curve from the nearest k below it that was
  measured (its measured ratio plus the curve's rise from there), not from the curve alone: a curve that is off
  for the machine (the default one, or a profile taken on another thread count) would otherwise keep the planner
  from ever trying the longer drafts whose passes it overprices, and so from ever measuring them.
- Per source: what an ask costs, a line in the tokens it drafted (a fixed part, the draft model's pass over the
  tokens the context gained, and a part per drafted token: the drafting time of a longer draft grows by the
  per-token part only), of an ask that got nothing, and per context token taken in.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import NamedTuple

from specwise.estimates import Line, Rate, clip, smooth

__all__ = ["Shared", "ALONE", "PassCosts"]


class Shared(NamedTuple):
    """What the other sequences put in the pass being planned: their rows, and the tokens they are expected to
    emit (the plan then weighs the whole pass's tokens per second)."""

    rows: int = 0
    tokens: float = 0.0


ALONE = Shared()  # a sequence alone in its pass


class PassCosts:
    """The cost model: estimated seconds of target passes and of drafting, learnt from measured times.

    cost_curve: optional prior c(k) = time(forward of k) / time(forward of 1);
    draft_cost: optional prior for the time of drafting one token, relative to a 1-token target pass.
    """

    RATIO_PRIOR = 2.0  # the cost curve's weight, in observations, in the estimate of a pass over k tokens
    RATIO_DECAY = 0.9  # measured ratios: recent passes count more (the context grows)
    ASK_PRIOR = 0.1  # the weight, in asks, of the prior that an ask's time is proportional to its drafted tokens
    ASK_DECAY = 0.9  # asks: recent ones count more
    ANSWERS = 15  # answers whose lengths make the typical one (their median)
    _PASS_ESTIMATES = ("_scale", "provisional", "since_plain", "_ratios", "_shared")

    def __init__(self, cost_curve: dict[int, float] | None = None, draft_cost: float = 0.0) -> None:
        self.prior_curve = dict(cost_curve or {})
        self.prior_draft_cost = draft_cost
        self._scale: float | None = None
        self.provisional = False  # True while the scale comes from passes over k > 1 tokens only
        self.since_plain = 0  # passes since the last 1-token pass (a plain step)
        self._ratios: dict[int, Rate] = {}  # k >= 2 -> measured ratios, with c(k) as the prior
        self._known: dict[int, float] = {}  # ratio(k) as computed since the ratios last changed
        self._shared: Line | None = None  # what sharing adds to the ratio, against the rows of shared passes
        self._asks: dict[int, Line] = {}  # per source: an ask's seconds against the tokens it drafted
        self._empty_seconds: dict[int, float] = {}  # per source: smoothed seconds of an ask that got nothing
        self._intake_seconds: dict[int, float] = {}  # per source: smoothed seconds per context token taken in
        self._answers: deque[int] = deque(maxlen=self.ANSWERS)  # the lengths of the last answers, in tokens
        self._threads: int | None = None
        self._by_threads: dict[int, tuple] = {}

    # ---- configuration -----------------------------------------------------------------------------------------

    def use_threads(self, threads: int | None) -> None:
        """The target's passes run on ``threads`` threads from now on (None: unknown, nothing changes)."""
        if threads is None or threads == self._threads:
            return
        if self._threads is not None:
            self._by_threads[self._threads] = tuple(getattr(self, name) for name in self._PASS_ESTIMATES)
            saved = self._by_threads.get(threads, (None, False, 0, {}, None))  # a new count: from the priors
            for name, value in zip(self._PASS_ESTIMATES, saved):
                setattr(self, name, value)
            self._known = {}
        self._threads = threads

    def with_cost_curve(self, cost_curve: dict[int, float] | None) -> None:
        """The target's measured c(k) as the prior of the k-token passes not estimated yet."""
        if cost_curve:
            self.prior_curve = dict(cost_curve)
            self._known = {}

    # ---- estimates ---------------------------------------------------------------------------------------------

    @property
    def scale(self) -> float | None:
        """Seconds of a 1-token pass (None before any pass)."""
        return self._scale

    def prior_c(self, k: int) -> float:
        """The cost curve as a prior, made non-decreasing from c(1) = 1: a pass over more tokens never costs less
        (a measured curve can dip, e.g. c(2) = 0.98 after a short context, where extra rows are nearly free; at
        answer lengths they are not, and a prior below 1 would make every 2-token pass look free). Beyond the
        curve's last point (a batch's passes hold many rows) it goes on along the slope of the curve's second
        half, not flat: rows past the measured ones are not free."""
        curve = self.prior_curve
        last = max(curve) if curve else 0
        if last >= 2 and k > last:  # beyond the measured curve: on along the slope of its second half
            mid = max(1, last // 2)
            slope = max(0.0, (curve[last] - curve.get(mid, 1.0)) / (last - mid))
            return self.prior_c(last) + slope * (k - last)
        return max([1.0] + [curve.get(j, 1.0 + 0.1 * (j - 1)) for j in range(2, k + 1)])

    def _ratio_rate(self, k: int) -> Rate:
        rate = self._ratios.get(k)
        if rate is None:
            rate = self._ratios[k] = Rate(self.prior_c(k), self.RATIO_PRIOR, self.RATIO_DECAY)
        return rate

    def ratio(self, k: int) -> float:
        """Estimated time of a pass over k tokens relative to one token: a prior worth ``RATIO_PRIOR``
        observations, then the measured ratios. The prior is the cost curve's c(k) anchored at the nearest k below
        with measured passes (its estimate plus the curve's rise from there to k; c(k) itself where none is)."""
        if k <= 1:
            return 1.0
        known = self._known.get(k)
        if known is not None:
            return known
        rate = self._ratio_rate(k)
        value = None
        for j in range(k - 1, 1, -1):
            below = self._ratios.get(j)
            if below is not None and below.count > 0:
                value = rate.value(self.ratio(j) + self.prior_c(k) - self.prior_c(j))
                break
        value = self._known[k] = rate.value() if value is None else value
        return value

    def _shared_line(self) -> Line:
        if self._shared is None:  # starts from nothing added: a pass of one sequence over as many rows
            last = max([2, *self.prior_curve])
            self._shared = Line([(1.0, 0.0), (float(last), 0.0)], self.RATIO_PRIOR, self.RATIO_DECAY)
        return self._shared

    def shared_ratio(self, k: int) -> float:
        """Estimated time of a pass over k rows of several sequences relative to a 1-token pass of one."""
        return max(1.0, self.ratio(k) + self._shared_line().value(k))

    def verify_time(self, k: int, shared: Shared = ALONE) -> float:
        """Estimated seconds of a target pass over k tokens (relative units before anything was measured): of
        this sequence alone, or, planning for a pass ``shared`` with other sequences, of a pass shared by several
        sequences (each reads its own cache, so k rows of several cost more than k rows of one)."""
        scale = 1.0 if self._scale is None else self._scale
        if shared.rows and k >= 2:
            return scale * self.shared_ratio(k)
        return scale * self.ratio(k)

    def _ask_line(self, source: int) -> tuple[float, float] | None:
        """(fixed seconds, seconds per drafted token) of ``source``'s asks (None before one is measured): the
        least-squares line, or the line through the origin where that one would cross below it (a few longer asks
        timed while the machine was busy must not make each drafted token look dearer than the average one)."""
        line = self._asks.get(source)
        if line is None:
            return None
        fixed = line.value(0.0)
        if fixed >= 0.0 or line.sxx <= 0.0:
            return max(0.0, fixed), max(0.0, line.value(1.0) - fixed)
        return 0.0, max(0.0, line.sxy / line.sxx)

    def draft_time(self, source: int = 0) -> float:
        """Estimated seconds that one more drafted token adds to an ask of ``source`` (the slope of its asks' line)."""
        fit = self._ask_line(source)
        return self.prior_draft_cost * self.verify_time(1) if fit is None else fit[1]

    def ask_time(self, source: int = 0) -> float:
        """Estimated seconds of an ask of ``source`` besides its drafted tokens (the line's value at none: a draft
        model's pass over what the context gained since its last ask; 0 before an ask is measured)."""
        fit = self._ask_line(source)
        return 0.0 if fit is None else fit[0]

    def drafting_measured(self, source: int) -> bool:
        return source in self._asks

    def empty_time(self, source: int) -> float:
        """Estimated seconds of an ask of ``source`` that gets nothing (0 before one is measured)."""
        return self._empty_seconds.get(source, 0.0)

    def answer_tokens(self) -> int | None:
        """The typical length of an answer here: the median of the last ``ANSWERS`` (None before one ended)."""
        if not self._answers:
            return None
        return int(statistics.median(self._answers))

    def intake_time(self, source: int) -> float | None:
        """Estimated seconds per context token ``source`` takes in (None before one is measured)."""
        return self._intake_seconds.get(source)

    # ---- observations ------------------------------------------------------------------------------------------

    def observe_ask(self, source: int, drafted: int, seconds: float) -> None:
        """An ask of ``source`` gave ``drafted`` tokens in ``seconds`` (a typical ask: nothing else taken in)."""
        if drafted == 0:
            self._empty_seconds[source] = smooth(self._empty_seconds.get(source), seconds)
            return
        line = self._asks.get(source)
        if line is None:  # the prior: no fixed part (through the origin), worth ASK_PRIOR asks
            line = self._asks[source] = Line([(0.0, 0.0)], self.ASK_PRIOR, self.ASK_DECAY)
        else:  # one pause of the machine moves the line by a bounded step
            seconds = clip(seconds, max(self.ask_time(source) + drafted * self.draft_time(source), 1e-9))
        line.add(float(drafted), seconds)

    def observe_answer(self, tokens: int) -> None:
        """A request's answer ended after ``tokens`` tokens (an agent's turns: a few dozen; a chat's: hundreds)."""
        self._answers.append(int(tokens))

    def observe_intake(self, source: int, seconds: float, tokens: int) -> None:
        """``source`` spent ``seconds`` taking in ``tokens`` tokens of context (besides drafting)."""
        self._intake_seconds[source] = smooth(self._intake_seconds.get(source), seconds / tokens)

    def observe_pass(self, k: int, seconds: float) -> None:
        """A target pass over ``k`` tokens of one sequence took ``seconds``."""
        ratio = self.ratio(k)
        self._known = {}
        self.since_plain = 0 if k == 1 else self.since_plain + 1
        if k == 1:  # the scale follows plain-step passes, and the ratios are measured against it
            if self.provisional:  # the first 1-token pass: re-express the ratios measured so far
                for rate in self._ratios.values():
                    rate.total *= self._scale / seconds
                self._scale, self.provisional = seconds, False
            else:
                self._scale = smooth(self._scale, seconds)
        elif self._scale is None or self.provisional:  # no 1-token pass yet: from the cost curve
            self._scale = smooth(self._scale, seconds / ratio)
            self.provisional = True
        if k >= 2:
            self._ratio_rate(k).add(clip(seconds / self._scale, ratio))

    def observe_shared_pass(self, rows: int, seconds: float) -> None:
        """A target pass over ``rows`` rows shared by several sequences took ``seconds``."""
        if self._scale is None or self.provisional or rows < 2:  # nothing to measure it against yet
            self.observe_pass(rows, seconds)
            return
        self._shared_line().add(rows, clip(seconds / self._scale, self.shared_ratio(rows)) - self.ratio(rows))
