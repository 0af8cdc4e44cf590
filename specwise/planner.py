"""Each step, which source drafts, how many tokens, and the confidence at which drafting stops.

Drafters are pure proposers; the planner decides and owns every estimate. Its sources are the drafters of a
sequence (one drafter, or several such as ``ngram+head``: prompt lookup is accepted differently from a trained
head, and costs nothing to ask). Each step the planner asks one or more sources for tokens
(:meth:`Planner.draft`), and after verification it is told how many were accepted and how long the target's pass
took (:meth:`Planner.observe`). One file because the fixed and the adaptive planner are one choice among sources (asking
in turn, cutting at the stop level, judging the drafts that lost) with two ways of valuing a draft; the costs and the
acceptance records it reads are modules of their own.

The planner is three parts:

- the machine's costs (a target pass over k tokens, drafting a token, an ask that got nothing):
  :class:`specwise.costs.PassCosts`, one per planner, shared by every sequence it plans for;
- the text's acceptance (by draft position and source, how often a source has nothing, by position for each
  kind of draft): a :class:`specwise.acceptance.PlanState` per sequence;
- the choice (this module): each step, from those two and the batch context the engine passes in (what other
  sequences put in a shared pass, :class:`specwise.costs.Shared`), with no state of its own between calls.

So one planner can later plan for several sequences sharing one target pass, each with its own state.

Planners:

- :class:`FixedPlanner` (``--gamma N``): always ask for N tokens (fewer near the end of the budget). With several
  sources, they are asked in turn, cheapest first as listed, and a later one only if it could do better than the
  draft in hand: source s with token acceptance a_s and a draft of n tokens is expected to have
  a_s + a_s^2 + ... + a_s^n of them accepted. A sampled draft is used as soon as it is drawn.
- :class:`AdaptivePlanner` (``--gamma auto``): before each step, for each source, the gamma (0 included: a plain
  step) with the largest expected tokens per second

      E[tokens](gamma) / (t_ask + gamma * t_draft + t_verify(gamma + 1)),   E[tokens](gamma) = 1 + sum_j prod_{i<=j} a_i

  (t_ask: what an ask costs besides its drafted tokens, a draft model's pass over what the context gained; each
  drafted token adds t_draft)

  weighed by the estimated probability that the source has a draft at all (an empty ask costs time too: the head
  runs its layer to find out), so that a source that keeps having nothing stops being asked (until the next
  probe). Sources are asked in the order listed; a later one only when its expected rate beats that of the draft
  in hand, and a draft in hand is used only when it beats a plain step or is a probe. Gamma goes up to
  ``max_gamma`` (8), or ``long_gamma`` (32) for a source of deterministic copies (a prediction, prompt lookup)
  whose record says such long runs are accepted.

A request may bring a source of its own, its predicted output (:meth:`Planner.for_request`): it is asked first,
the sequence's drafters after it, each with its record.

Drafting stops at a confidence: a drafter may give each drafted token a confidence (``Draft.confidence``, the
estimated probability that it is accepted when the ones before it are), and prompt lookup labels a draft with
the length of its match (``Draft.kind``), whose acceptance the planner measures. The planner cuts a
draft at the first token where the product of the confidences so far falls below the break-even of one more
token (:meth:`AdaptivePlanner.stop_level`); the stop level is also passed to ``propose``, so that a drafter
that drafts token by token (the head) stops there instead of drafting tokens that would be cut.
A draft in hand of a known kind is weighed against the other sources' with its kind's measured acceptance by
position in place of the source's (the source's as its prior), and cut to its best prefix first: prompt lookup's
record is made by its long matches, and a one-token match in code is accepted far less often, at its first token
and after it. The drafts of copies that lost to another source's are judged against what the target emitted, one
token past the kept ones: a deterministic draft is accepted exactly where it agrees with the target's choice
(greedy, or sampled under the coupled rule), so its records follow the text at any temperature.

Every choice depends only on the context, past outcomes and deterministic drafts, never on what a sampled draft
contains, and the rejection rule is exact for every gamma: the output stays exact.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from specwise.acceptance import PlanState, SourceRecord, acceptance, expected_accepted_iid, kind_acceptance
from specwise.costs import ALONE, PassCosts, Shared
from specwise.drafters.base import Draft, Drafter, common_prefix
from specwise.estimates import Rate
from specwise.sampling import SamplingParams

REQUEST_KEY = -1  # the cost key of a request's own source (the sequence's drafters' are their indices)

__all__ = [
    "REQUEST_KEY",
    "Rate",
    "Proposal",
    "PlanState",
    "Planner",
    "FixedPlanner",
    "AdaptivePlanner",
    "make_planner",
    "Shared",
    "ALONE",
]


@dataclass
class Proposal:
    """The outcome of planning a step: the draft to verify and the source that made it, or an empty draft and
    ``reason``, why the step is a plain one: ``budget`` (no room for a draft), ``schedule`` (drafting not worth
    it), ``calibrate`` (a plain pass measured on purpose), ``no_draft`` (asked, nothing proposed) or
    ``low_confidence`` (a proposal held back below the stop level)."""

    draft: Draft
    source: int = 0
    reason: str | None = None
    # the drafts of the other sources of copies (a prediction, prompt lookup) asked this step, as (source, token
    # ids, Draft.kind): judged against the tokens the target emitted, so that a source whose draft lost to an equal
    # one (two sources copying the same text), or to a draft model's, still learns how far it was right, and how far
    # the drafts of its kind are
    alternatives: list[tuple[int, list[int], object]] = field(default_factory=list)


class Planner(ABC):
    """Decides every step of a sequence; told the outcome of each.

    gamma: how ``--gamma`` names this planner (an integer, or ``auto``).
    """

    gamma: int | str
    max_gamma: int = 8
    prior_weight: float = 2.0
    decay: float = 0.95
    carry: float = 0.0
    prior: float = 0.5  # the acceptance assumed at a source's first position before anything is observed

    def with_cost_curve(self, cost_curve: dict[int, float] | None) -> Planner:
        """This planner, given the target's measured cost curve c(k) as its prior (known once the target is
        loaded; a fixed gamma has no use for it). Returns self."""
        return self

    def use_threads(self, threads: int | None) -> None:
        """The target's passes run on ``threads`` threads from now on (None: unknown): what a pass costs is
        estimated apart for each thread count (a planner that does not estimate costs ignores it)."""

    def gamma_limit(self, drafter: Drafter) -> int:
        """The most tokens ``drafter`` is asked for in one step."""
        return self.max_gamma

    def new_record(self, drafter: Drafter) -> SourceRecord:
        """What this planner knows of ``drafter`` as a new source: nothing yet."""
        return SourceRecord(self.gamma_limit(drafter), self.prior_weight, self.decay)

    def new_state(self, drafters: list[Drafter]) -> PlanState:
        """The state of a new sequence drafted by ``drafters`` (its sources: one drafter is a list of one)."""
        if not drafters:
            raise ValueError("give at least one drafter (NoDrafter for plain decoding)")
        sources = list(drafters)
        return PlanState(sources, [self.new_record(d) for d in sources])

    def for_request(self, state: PlanState, first: Drafter | None) -> PlanState:
        """The state of one request on ``state``'s sequence: ``state`` itself, or, when the request brings a source
        of its own (``first``: its prediction), that source asked before the sequence's drafters. The drafters'
        records are shared, so what they learn carries to the next request; ``first`` gets the sequence's record
        of request sources (``PlanState.request_record``), carried from request to request as the others are
        (:meth:`begin`: a prior worth at most ``carry`` observations) and its costs under a key of their own."""
        if first is None:
            return state
        record = state.request_record
        if record is None or len(record.positions) != self.gamma_limit(first):
            record = state.request_record = self.new_record(first)
        return PlanState(
            [first, *state.sources], [record, *state.known], [REQUEST_KEY, *state.keys], answer=state.answer
        )

    def begin(self, state: PlanState) -> None:
        """A new request on ``state``'s sequence: what describes the text is kept as a prior worth at most
        ``carry`` observations (the measured times are the machine's and are kept whole)."""
        for source in state.known:
            source.begin(self.carry)

    @abstractmethod
    def draft(
        self,
        state: PlanState,
        context: list[int],
        limit: int,
        params: SamplingParams,
        generator: np.random.Generator | None,
        batch: tuple[int, float] | None = None,
    ) -> Proposal:
        """Ask the sources for at most ``limit`` tokens continuing ``context``; the draft to verify.

        batch: when other sequences share the pass, (rows they put in it, tokens they are expected to emit):
        the plan then maximises the whole pass's tokens per second, so that drafting fades out as the pass over
        all rows grows dear (None: the sequence is alone)."""

    def observe(
        self,
        state: PlanState,
        proposal: Proposal,
        accepted: int,
        seconds: float | None,
        forced: int = 0,
        following: int | None = None,
    ) -> None:
        """The target verified ``proposal`` (an empty draft: a plain step), kept ``accepted`` tokens and took
        ``seconds`` (sampling and acceptance included; None when the pass was shared by other sequences and is
        told by :meth:`observe_pass`); ``forced``: tokens a grammar forced, fed before the draft in the same pass
        (rows of the pass too); ``following``: the token the target chose after the kept ones (the recovered or
        the bonus token; None: not told), by which the drafts that lost are judged."""
        drafted = len(proposal.draft)
        if not drafted:
            return
        known = state.known[proposal.source]
        known.tokens.add(accepted, drafted)
        kind = proposal.draft.kind
        if kind is not None:
            _judge(known.kind(kind), drafted, accepted)

    def observe_pass(self, rows: int, seconds: float) -> None:
        """A target pass over ``rows`` rows shared by several sequences took ``seconds`` (a pass of one sequence
        is told by :meth:`observe`)."""

    def expected_gain(self, state: PlanState, proposal: Proposal) -> float:
        """Accepted tokens expected of ``proposal``'s draft."""
        if not len(proposal.draft):
            return 0.0
        return expected_accepted_iid(state.known[proposal.source].tokens.value(), len(proposal.draft))

    def kind_acceptance(self, state: PlanState, source: int, kind: object) -> list[float]:
        """Estimated P(position i accepted | positions < i accepted) of a draft of ``kind`` (``Draft.kind``) from
        ``source``: the kind's own record, each position with the source's estimate there as its prior, so that a
        kind not seen yet is valued as the source's drafts are (at any temperature), and one seen is valued by what
        became of its own drafts: prompt lookup's one-token matches in code are accepted far less often than the
        long ones that make its record, at their first token and after it."""
        return kind_acceptance(state.known[source], kind, self.prior)

    def _ask(
        self,
        state: PlanState,
        source: int,
        context: list[int],
        k: int,
        params: SamplingParams,
        generator: np.random.Generator | None,
        stop: float,
    ) -> tuple[Draft, bool]:
        """Ask ``source`` for up to ``k`` tokens; cut its draft where its confidence falls below ``stop``.
        Returns (the draft, whether a proposal was cut to nothing)."""
        drafter = state.sources[source]
        draft = drafter.propose(context, k, params, generator, stop)
        if len(draft) > k:
            raise RuntimeError(f"drafter {drafter.name!r} proposed {len(draft)} tokens when asked for {k}")
        if stop <= 0 or not len(draft):
            return draft, False
        reach = 1.0  # estimated probability that the draft so far is accepted
        if draft.kind is not None:
            reach = self.kind_acceptance(state, source, draft.kind)[0]
        confidence = draft.confidence or []
        for i in range(len(draft)):
            if i < len(confidence):
                reach *= confidence[i]
            if reach < stop:
                return draft.prefix(i), i == 0
            if i + 1 >= len(confidence):
                break  # no confidences after this token: the rest of the draft stands with it
        return draft, False


class FixedPlanner(Planner):
    """Always ask for ``gamma`` tokens (fewer near the end of the budget).

    stop: the confidence at which drafting stops (0: never; a fixed gamma drafts exactly gamma tokens).
    """

    def __init__(self, gamma: int, stop: float = 0.0) -> None:
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
            raise ValueError(f"gamma must be an integer >= 0 or 'auto', got {gamma!r}")
        self.gamma = gamma
        self.max_gamma = max(gamma, 1)
        self.stop = stop

    def draft(self, state, context, limit, params, generator, batch=None) -> Proposal:
        k = min(self.gamma, limit)
        if k <= 0:
            return Proposal(Draft.empty(), reason="budget" if limit <= 0 else "schedule")
        best: tuple[float, int, Draft] | None = None  # (expected accepted tokens, source, draft)
        held = False
        for i in range(len(state.sources)):
            alpha = state.known[i].tokens.value()
            if best is not None and expected_accepted_iid(alpha, k) <= best[0]:
                continue  # cannot beat the draft in hand even with all k tokens
            draft, cut = self._ask(state, i, context, k, params, generator, self.stop)
            if not len(draft):
                held = held or cut
                continue
            if draft.probs is not None:
                # a sampled draft is used as soon as it is drawn: choosing among drafts by what was sampled
                # would bias its tokens away from q and break exactness
                best = (0.0, i, draft)
                break
            value = expected_accepted_iid(alpha, len(draft))
            if best is None or value > best[0]:
                best = (value, i, draft)
        if best is None:
            return Proposal(Draft.empty(), reason="low_confidence" if held else "no_draft")
        return Proposal(best[2], best[1])


class AdaptivePlanner(Planner):
    """Pick the source and gamma per step from online estimates of acceptance per position and of the costs.

    max_gamma: the largest gamma considered.
    long_gamma: the largest gamma considered for a source of deterministic copies (``Drafter.copies``: a prediction,
        prompt lookup), which where it keeps being right is right for long runs: each position's acceptance starts
        from the one before it, so such a source drafts past ``max_gamma`` only once its record says the longer
        draft pays (a pass over more rows, ``PassCosts.ratio``, against the tokens it is expected to keep).
    cost_curve: optional prior c(k) = time(forward of k) / time(forward of 1), e.g. from `specwise profile`;
        a pass over k tokens is estimated as (smoothed time of a 1-token pass) * ratio(k), where ratio(k) starts
        at c(k) and moves towards the measured ratios as they come in.
    draft_cost: optional prior for the time of drafting one token, relative to a 1-token target pass.
    prior: the acceptance probability assumed at the first position before anything is observed, with
        ``prior_weight`` pseudo-observations (later positions start from the estimate of the one before);
        ``decay`` (< 1) forgets old observations so the estimate follows the text.
    probe_every: after this many steps in a row without asking a source, ask it for one token anyway (and verify
        that draft), so a drafter that became useful is noticed. In a pass shared with others, 1 + the tokens the
        others are expected to emit times that many steps (about as many times as the pass holds sequences): a
        probe's row then costs every sequence's step.
    margin: drafting is chosen only when its expected rate beats a plain step's by this fraction. Near the
        break-even the estimates cannot tell a small gain from a small loss; a plain step there costs nothing
        in expectation and keeps speculation from ever being measurably slower than plain decoding.
    carry: what a new request keeps from the ones before. Measured times (passes over k tokens, drafting a token,
        an empty ask) describe the machine and are kept whole; the drafting time of a request's first ask is not
        used (the drafter then also takes in the whole prompt, a one-off cost that would make every later token
        look dear). Acceptance describes the text, so the observations are kept as a prior worth at most
        ``carry`` observations per draft position (0: each request starts from ``prior`` again): a drafter seen
        to be rarely accepted is not trusted at 50% at the start of the next request, and one seen to be
        accepted often drafts long from its first step.
    """

    gamma = "auto"
    CATCH_UP = 2  # a draft whose drafter took in more context tokens than this first is not timed (Draft.intake)
    PROBE_INTAKE = 0.1  # a probe may take in context costing this share of the plain decoding of what is left
    # What is still to come of an answer, for weighing a drafter's intake (a draft model must read the whole prompt
    # before its first draft): the typical answer's length less what was produced, or as much as was produced (an
    # answer that ran long tends to run on), at least MIN_TO_COME, at most the tokens left; PRIOR_ANSWER before any
    # answer here ended. An agent's turns answer in a few dozen tokens after prompts of thousands: a 0.5B draft
    # model reading a 1,024-token prompt took 2.6 s before a 32-token answer that plain decoding gave in 1.5 s
    # (Qwen2.5-Coder-1.5B, Zen 4), so what max_tokens allows is no measure of what drafting will save.
    PRIOR_ANSWER = 128
    MIN_TO_COME = 16
    # A context token's intake before one is measured, in 1-token target passes: Qwen2.5-Coder-0.5B reads a prompt at
    # about 0.08 of a Qwen2.5-Coder-1.5B pass per token on Zen 4 (smaller drafters and larger targets read for less)
    UNMEASURED_INTAKE = 0.1
    # A source found not worth asking is not weighed again for this many steps (until its probe is due): what it is
    # judged on (its acceptance, its asks) does not change while it is not asked, and the machine's costs drift
    # slowly, while weighing every gamma costs tens of microseconds of interpreted code right after a pass.
    REUSE = 3

    def __init__(
        self,
        max_gamma: int = 8,
        cost_curve: dict[int, float] | None = None,
        draft_cost: float = 0.0,
        long_gamma: int = 32,
        prior: float = 0.5,
        prior_weight: float = 2.0,
        decay: float = 0.95,
        probe_every: int = 8,
        margin: float = 0.03,
        carry: float = 4.0,
    ) -> None:
        if max_gamma < 1:
            raise ValueError(f"max_gamma must be >= 1, got {max_gamma}")
        if carry < 0:
            raise ValueError(f"carry must be >= 0, got {carry}")
        self.max_gamma = max_gamma
        self.long_gamma = max(long_gamma, max_gamma)
        self.prior = prior
        self.prior_weight = prior_weight
        self.decay = decay
        self.probe_every = probe_every
        self.margin = margin
        self.carry = carry
        self.costs = PassCosts(cost_curve, draft_cost)  # the machine's costs, shared by every sequence

    def use_threads(self, threads: int | None) -> None:
        self.costs.use_threads(threads)

    def gamma_limit(self, drafter: Drafter) -> int:
        return self.long_gamma if drafter.copies else self.max_gamma

    def with_cost_curve(self, cost_curve: dict[int, float] | None) -> Planner:
        self.costs.with_cost_curve(cost_curve)
        return self

    # ---- estimates -------------------------------------------------------------------------------------------

    def acceptance(self, state: PlanState, source: int = 0) -> list[float]:
        """Estimated P(position i accepted | positions < i accepted), i = 0 .. gamma_limit - 1, for ``source``
        (``acceptance.acceptance``: each position's prior is the estimate of the one before it)."""
        return acceptance(state.known[source], self.prior)

    def verify_time(self, k: int, shared: Shared = ALONE) -> float:
        """Estimated seconds of a target pass over k tokens (``PassCosts.verify_time``)."""
        return self.costs.verify_time(k, shared)

    def draft_time(self, source: int = 0) -> float:
        """Estimated seconds that one more drafted token adds to an ask of ``source`` (a cost key,
        ``PlanState.keys``: a sequence's drafter's index, or REQUEST_KEY)."""
        return self.costs.draft_time(source)

    def ask_time(self, source: int = 0) -> float:
        """Estimated seconds of an ask of ``source`` besides its drafted tokens (``PassCosts.ask_time``)."""
        return self.costs.ask_time(source)

    def draft_probability(self, state: PlanState, source: int = 0) -> float:
        """Estimated probability that asking ``source`` yields a draft."""
        return state.known[source].asks.value()

    def _expected_tokens(self, state: PlanState, gamma: int, source: int, kind: object = None) -> float:
        """Tokens a step emits when ``source`` drafts ``gamma``; ``kind``: the draft's ``Draft.kind``, valued by its
        kind's record (:meth:`kind_acceptance`; None: by the source's)."""
        accept = self.acceptance(state, source) if kind is None else self.kind_acceptance(state, source, kind)
        tokens = _tokens_by_length(accept[:gamma])
        return tokens[-1] if tokens else 1.0

    def plain_rate(self, shared: Shared = ALONE) -> float:
        """Expected tokens per second of a plain step (of the whole pass, when others share it)."""
        return (shared.tokens + 1.0) / self.verify_time(shared.rows + 1, shared)

    def expected_rate(self, state: PlanState, gamma: int, source: int = 0, shared: Shared = ALONE) -> float:
        """Expected tokens per second when asking ``source`` for ``gamma`` tokens now: with the estimated
        probability that a draft comes, its expected accepted tokens and cost; otherwise a plain step after an
        empty ask."""
        if gamma == 0:
            return self.plain_rate(shared)
        others, rows = shared.tokens, shared.rows
        tokens = self._expected_tokens(state, gamma, source)
        key = state.keys[source]
        drafted = self.ask_time(key) + gamma * self.draft_time(key) + self.verify_time(rows + gamma + 1, shared)
        p = self.draft_probability(state, source)
        empty = self.costs.empty_time(key) + self.verify_time(rows + 1, shared)
        return (others + p * tokens + (1.0 - p)) / (p * drafted + (1.0 - p) * empty)

    def _rates(self, state: PlanState, top: int, source: int, shared: Shared = ALONE) -> list[float]:
        """``expected_rate(state, g, source, shared)`` for g = 0 .. top, the same numbers computed in one pass."""
        others, rows = shared.tokens, shared.rows
        p = self.draft_probability(state, source)
        key = state.keys[source]
        per_token, fixed = self.draft_time(key), self.ask_time(key)
        empty = self.costs.empty_time(key) + self.verify_time(rows + 1, shared)
        rates = [self.plain_rate(shared)]
        for gamma, tokens in enumerate(_tokens_by_length(self.acceptance(state, source)[:top]), start=1):
            drafted = fixed + gamma * per_token + self.verify_time(rows + gamma + 1, shared)
            rates.append((others + p * tokens + (1.0 - p)) / (p * drafted + (1.0 - p) * empty))
        return rates

    def draft_rate(
        self, state: PlanState, drafted: int, source: int = 0, shared: Shared = ALONE, kind: object = None
    ) -> float:
        """Expected tokens per second of verifying a draft of ``drafted`` tokens from ``source`` that is already
        in hand (its drafting time is spent). ``kind``: the draft's ``Draft.kind``, whose measured acceptance then
        stands for the source's (:meth:`kind_acceptance`)."""
        tokens = shared.tokens + self._expected_tokens(state, drafted, source, kind)
        return tokens / self.verify_time(shared.rows + drafted + 1, shared)

    def best_prefix(self, state: PlanState, source: int, draft: Draft, shared: Shared = ALONE) -> Draft:
        """The prefix of a deterministic draft in hand with the highest :meth:`draft_rate` (its length was chosen
        before its kind was known: a weak match is verified over fewer rows)."""
        if draft.kind is None or len(draft) <= 1:
            return draft
        accept = self.kind_acceptance(state, source, draft.kind)[: len(draft)]
        rates = [  # rates[n - 1]: draft_rate of the first n tokens, all from one pass over the positions
            (shared.tokens + tokens) / self.verify_time(shared.rows + n + 1, shared)
            for n, tokens in enumerate(_tokens_by_length(accept), start=1)
        ]
        n = 1 + max(range(len(rates)), key=rates.__getitem__)
        return draft if n == len(draft) else draft.prefix(n)

    def worth_drafting(self, rate: float, shared: Shared = ALONE) -> bool:
        """Whether an expected rate beats a plain step's by the margin."""
        return rate >= (1.0 + self.margin) * self.plain_rate(shared)

    def stop_level(self, source: int = 0, shared: Shared = ALONE) -> float:
        """Break-even for one more drafted token: its cost (drafting it, and the longer target pass) over the time
        of a plain step, which is what an accepted token saves. Drafting stops once the probability that the
        draft so far is all accepted falls below this (``source``: a cost key, as for :meth:`draft_time`)."""
        one, two = self.verify_time(shared.rows + 1, shared), self.verify_time(shared.rows + 2, shared)
        extra = self.draft_time(source) + max(two - one, 0.0)
        per_token = one / (shared.tokens + 1.0)  # what a plain token of the pass costs
        return min(extra / per_token, 1.0)

    def calibrating(self, shared: Shared = ALONE) -> bool:
        """Whether the next step should be a plain one, to measure a 1-token pass: none has been measured yet and
        ``probe_every`` passes over more tokens have. Every pass is estimated relative to a 1-token pass; measured
        from longer passes through the cost curve, that unit is off by as much as the curve is, and a planner that
        drafts on every step would never correct it (with the curve too low, a plain step looks dearer than it is
        and drafting keeps looking worth it). Once measured, the unit follows the plain steps; if none come (a
        drafter that always pays) it grows stale, and the stale unit is too low as the context grows, which makes
        drafting look less worth it, not more."""
        costs = self.costs
        return not shared.rows and costs.provisional and costs.since_plain >= self.probe_every

    # ---- choices ---------------------------------------------------------------------------------------------

    def choose(self, state: PlanState, limit: int, source: int = 0, shared: Shared = ALONE) -> int:
        """Tokens to ask of ``source`` in the next step, at most ``limit`` (0: do not ask it)."""
        known = state.known[source]
        top = min(len(known.positions), limit)
        if top <= 0 or self.calibrating(shared):
            known.chose(probing=False, skip=known.skip)
            return 0
        alone = not shared.rows  # a shared pass's plan depends on the others' rows: weighed every time
        if alone and known.skip > 0 and known.plain_run < self.probe_every:
            known.skipped()  # a smaller limit only removes choices: still not worth it
            return 0
        rates = self._rates(state, top, source, shared)
        best = max(range(top + 1), key=rates.__getitem__)
        if not self.worth_drafting(rates[best], shared):
            best = 0
        # a probe (one token, to learn the acceptance anew) every probe_every plain steps alone; in a shared pass its
        # row costs the whole batch, so each sequence probes about as many times less often as sequences share it
        # (1 + the tokens the others are expected to emit)
        probing = best == 0 and known.plain_run >= self.probe_every * (1.0 + shared.tokens)
        known.chose(probing, self.REUSE if alone and best == 0 and not probing else 0)
        return 1 if probing else best

    def draft(self, state, context, limit, params, generator, batch=None) -> Proposal:
        return self._draft(state, context, limit, params, generator, ALONE if batch is None else Shared(*batch))

    def expected_gain(self, state: PlanState, proposal: Proposal) -> float:
        if not len(proposal.draft):
            return 0.0
        return self._expected_tokens(state, len(proposal.draft), proposal.source) - 1.0

    def _draft(self, state, context, limit, params, generator, shared: Shared) -> Proposal:
        if limit <= 0:
            return Proposal(Draft.empty(), reason="budget")
        best: tuple[float, int, Draft] | None = None  # (expected tokens/s, source, draft)
        copies: list[tuple[int, list[int]]] = []  # deterministic drafts in hand: (source, ids)
        asked = held = False
        alone = len(state.sources) == 1  # the only source's draft is verified as it comes
        for i in range(len(state.sources)):
            gamma = self.choose(state, limit, i, shared)
            if gamma <= 0 or (best is not None and self.expected_rate(state, gamma, i, shared) <= best[0]):
                continue
            if not self._intake_pays(state, i, context, gamma, limit, shared):
                continue
            t0 = time.perf_counter()
            key = state.keys[i]
            # a probe drafts its token whatever the stop level: cut to nothing it would be an empty ask, which
            # never times a drafted token, and a drafting time measured under load would then never come down
            stop = 0.0 if state.known[i].probing else self.stop_level(key, shared)
            draft, cut = self._ask(state, i, context, gamma, params, generator, stop)
            seconds = time.perf_counter() - t0
            intake = draft.intake
            if intake > self.CATCH_UP:
                # it also took in tokens of steps it was not asked in (or the prompt): not a draft's cost, but the
                # cost of taking in context, per token
                spent = seconds - len(draft) * self.draft_time(key) if self.costs.drafting_measured(key) else seconds
                self.costs.observe_intake(key, max(0.0, spent), intake)
                seconds = None
            self._observe_ask(state, i, len(draft), seconds)
            asked = True
            if not len(draft):
                held = held or cut
                continue
            if alone or draft.probs is not None or state.known[i].probing:
                # sampled: used as drawn (see FixedPlanner.draft); a probe: verified, so that its record follows
                # the text
                best = (float("inf"), i, draft)
                break
            if draft.probs is None and state.sources[i].copies:
                copies.append((i, draft.ids, draft.kind))
            draft = self.best_prefix(state, i, draft, shared)
            rate = self.draft_rate(state, len(draft), i, shared, draft.kind)
            if self.worth_drafting(rate, shared) and (best is None or rate > best[0]):
                best = (rate, i, draft)
        if best is not None:
            return Proposal(best[2], best[1], alternatives=[c for c in copies if c[0] != best[1]])
        if asked:
            return Proposal(Draft.empty(), reason="low_confidence" if held else "no_draft")
        return Proposal(Draft.empty(), reason="calibrate" if self.calibrating(shared) else "schedule")

    # ---- observations ----------------------------------------------------------------------------------------

    def to_come(self, state: PlanState, limit: int) -> int:
        """Tokens the answer in progress is expected still to produce (at most ``limit``, the tokens left): see
        ``PRIOR_ANSWER``."""
        typical = self.costs.answer_tokens()
        produced = state.answer.produced
        typical = self.PRIOR_ANSWER if typical is None else typical
        return min(limit, max(typical - produced, produced, self.MIN_TO_COME))

    def _intake_pays(
        self, state: PlanState, source: int, context: list[int], gamma: int, limit: int, shared: Shared
    ) -> bool:
        """Whether asking ``source`` now is worth the context it must first take in (a draft model before its first
        draft of a request takes in the prompt): what it costs, at the measured seconds per token
        (``UNMEASURED_INTAKE`` of a pass before one is measured), against what drafting with it saves over the
        tokens the answer is expected still to produce (:meth:`to_come`)."""
        n = state.sources[source].pending(context)
        if n <= self.CATCH_UP:
            return True
        scale = self.costs.scale
        if scale is None:  # no pass measured yet: the next step's plain pass will be
            return False
        key = state.keys[source]
        rate = self.costs.intake_time(key)
        rate = self.UNMEASURED_INTAKE * scale if rate is None else rate
        to_come = self.to_come(state, limit)
        if state.known[source].probing:  # a probe learns the acceptance: allowed while its intake is small
            return n * rate <= self.PROBE_INTAKE * to_come * self.verify_time(1, shared)
        saving = to_come * (1.0 / self.plain_rate(shared) - 1.0 / self.expected_rate(state, gamma, source, shared))
        return n * rate < saving

    def _observe_ask(self, state: PlanState, source: int, drafted: int, seconds: float | None) -> None:
        """``source`` was asked for tokens and proposed ``drafted`` (after cutting) in ``seconds`` (None: not a
        typical ask's time)."""
        known = state.known[source]
        timed = known.asked()
        known.asks.add(1.0 if drafted else 0.0)
        if timed and seconds is not None:
            self.costs.observe_ask(state.keys[source], drafted, seconds)

    def begin(self, state: PlanState) -> None:
        super().begin(state)
        if state.answer.produced:  # the sequence's last answer ended: its length is one of the typical answers
            self.costs.observe_answer(state.answer.produced)
        state.answer.produced = 0

    def observe(self, state, proposal, accepted, seconds, forced=0, following=None) -> None:
        super().observe(state, proposal, accepted, seconds, forced, following)
        state.answer.produced += accepted + 1 + forced
        drafted = len(proposal.draft)
        if seconds is not None:  # the pass fed the last token, the forced ones and the draft
            self.costs.observe_pass(drafted + 1 + forced, seconds)
        for known in state.known:  # steps since each source was last asked
            known.stepped()
        _judge(state.known[proposal.source].positions, drafted, accepted)
        chosen = proposal.draft.ids if drafted else []
        for source, ids, kind in proposal.alternatives:
            judged, right = _judged_alternative(ids, chosen, accepted, following)
            if judged:
                _judge(state.known[source].positions, judged, right)
                state.known[source].tokens.add(right, judged)
                if kind is not None:
                    _judge(state.known[source].kind(kind), judged, right)

    def observe_pass(self, rows: int, seconds: float) -> None:
        self.costs.observe_shared_pass(rows, seconds)


def _tokens_by_length(accept: list[float]) -> list[float]:
    """Tokens a step emits, expected, when it verifies a draft of 1, 2, ... len(accept) tokens whose positions are
    accepted with the conditional probabilities ``accept``: 1 (the target's own token) plus the probability of
    reaching each drafted position."""
    tokens, reach, out = 1.0, 1.0, []
    for a in accept:
        reach *= a
        tokens += reach
        out.append(tokens)
    return out


def _judge(positions: list[Rate], drafted: int, accepted: int) -> None:
    """Record a verified draft of ``drafted`` tokens whose first ``accepted`` were kept: each position up to the
    first rejection (the positions after it were not judged)."""
    for i in range(min(drafted, len(positions))):
        positions[i].add(1.0 if i < accepted else 0.0)
        if i >= accepted:
            break


def _judged_alternative(
    ids: list[int], chosen: list[int], accepted: int, following: int | None = None
) -> tuple[int, int]:
    """How much of a deterministic draft ``ids`` the verification of ``chosen`` (``accepted`` of its tokens kept,
    then ``following``, the target's own token) judged, and how many of those were right. A deterministic draft is
    accepted where it agrees with what the target emitted: greedy, its argmax; sampled, the coupled rule's token,
    which does not depend on the draft (under the stochastic rule, a sampled draft's, the emitted token follows p:
    it agrees with a token x with probability p(x), x's acceptance). So its tokens that agree with the emitted ones
    are right, the first that differs is wrong, and past the emitted tokens nothing is known. Without
    ``following``, a token that differs from the rejected one is not known either (only one that repeats it is
    wrong). Returns (judged positions, right ones)."""
    emitted = chosen[:accepted] if following is None else [*chosen[:accepted], following]
    agree = common_prefix(ids, emitted)
    if agree < min(len(ids), len(emitted)):  # differs from an emitted token
        return agree + 1, agree
    if following is None and agree == accepted < min(len(ids), len(chosen)) and ids[agree] == chosen[agree]:
        return accepted + 1, accepted  # repeats the rejected token
    return agree, agree  # right as far as it or the emitted tokens go; what follows is unknown


def make_planner(gamma: int | str | Planner, max_gamma: int = 8, cost_curve: dict[int, float] | None = None) -> Planner:
    """``gamma``: an integer (fixed), ``"auto"`` (adaptive, up to ``max_gamma``, with the saved ``cost_curve``
    as its prior), or a Planner (used as is)."""
    if isinstance(gamma, Planner):
        return gamma
    if gamma == "auto":
        return AdaptivePlanner(max_gamma=max_gamma, cost_curve=cost_curve)
    if isinstance(gamma, str):
        try:
            gamma = int(gamma)
        except ValueError:
            raise ValueError(f"gamma must be an integer >= 0 or 'auto', got {gamma!r}") from None
    return FixedPlanner(gamma)
