"""How many tokens to draft next: a fixed gamma, or an adaptive choice that maximises expected tokens per second.

The adaptive schedule keeps, per request, an estimate of the acceptance probability at each draft position (given
that the previous positions were accepted) and the measured time of a target pass over k tokens and of drafting
one token. Before each step it picks the gamma (0 included: a plain step) with the largest

    E[tokens](gamma) / (gamma * t_draft + t_verify(gamma + 1)),   E[tokens](gamma) = 1 + sum_j prod_{i<=j} a_i

A drafter may also propose nothing when asked (prompt lookup without a match, a head below its confidence
threshold), and asking can cost time (the head runs its layer to find out). The schedule learns how often that
happens and what an empty ask costs, so a drafter that keeps declining stops being asked (until the next probe)
instead of slowing every plain step down.

Several drafters at once (``ngram+head``): every drafter is a separate *source* with its own acceptance per
position, drafting time and empty-ask rate (prompt lookup is accepted differently from a trained head, and costs
nothing to ask); the passes of the target are shared. A combined drafter asks the schedule for each source's best
gamma and expected rate, and drafts with the source expected to give the most tokens per second.

Any gamma chosen from the past keeps the output exact: the rejection rule is exact for every gamma.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["Schedule", "FixedGamma", "AdaptiveGamma", "make_schedule"]


class Schedule(ABC):
    """Chooses the number of tokens to draft; told the outcome of every step."""

    max_gamma: int

    def begin(self) -> None:
        """A new request starts."""

    @abstractmethod
    def choose(self, limit: int, source: int = 0) -> int:
        """Tokens to draft in the next step with drafter ``source``, at most ``limit``."""

    def observe(
        self,
        drafted: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        asked: int | None = None,
        source: int = 0,
    ) -> None:
        """The outcome of the step: tokens drafted and accepted, the time spent drafting and verifying, and how
        many tokens were asked for (``None``: as many as were drafted), from drafter ``source``."""
        asked = drafted if asked is None else asked
        if asked > 0:
            self.observe_ask(asked, drafted, draft_seconds, source=source)
        self.observe_pass(drafted, accepted, verify_seconds, source=source)

    def observe_ask(self, asked: int, drafted: int, seconds: float, source: int = 0) -> None:
        """Drafter ``source`` was asked for ``asked`` tokens and proposed ``drafted`` in ``seconds``."""

    def observe_pass(self, drafted: int, accepted: int, seconds: float, source: int = 0) -> None:
        """A target pass verified ``drafted`` tokens of drafter ``source`` (0 tokens: a plain step), kept
        ``accepted``, and took ``seconds`` (sampling and acceptance included)."""

    def min_confidence(self, source: int = 0) -> float:
        """Below which estimated probability of the draft so far being accepted a drafter should stop (0: never)."""
        return 0.0

    def calibrating(self) -> bool:
        """Whether the next step is a plain one taken to measure a 1-token pass (False: never)."""
        return False


class FixedGamma(Schedule):
    """Always draft ``gamma`` tokens (fewer near the end of the budget)."""

    def __init__(self, gamma: int) -> None:
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
            raise ValueError(f"gamma must be an integer >= 0 or 'auto', got {gamma!r}")
        self.max_gamma = gamma

    def choose(self, limit: int, source: int = 0) -> int:
        return min(self.max_gamma, limit)


def _clip(sample: float, around: float) -> float:
    """``sample`` limited to [1/2, 2] times the current estimate ``around``: one pause of the machine moves an
    estimate by a bounded step."""
    return min(max(sample, 0.5 * around), 2.0 * around)


def _smooth(old: float | None, sample: float, weight: float = 0.2) -> float:
    """Exponential smoothing of a time, the sample clipped first."""
    if old is None or old <= 0:
        return sample
    return (1.0 - weight) * old + weight * _clip(sample, old)


class AdaptiveGamma(Schedule):
    """Pick gamma per step from online estimates of acceptance per position and of the costs.

    max_gamma: the largest gamma considered.
    cost_curve: optional prior c(k) = time(forward of k) / time(forward of 1), e.g. from `specwise profile`;
        a pass over k tokens is estimated as (smoothed time of a 1-token pass) * ratio(k), where ratio(k) starts
        at c(k) and moves towards the measured ratios as they come in.
    draft_cost: optional prior for the time of drafting one token, relative to a 1-token target pass.
    prior: the acceptance probability assumed at the first position before anything is observed, with
        ``prior_weight`` pseudo-observations (later positions start from the estimate of the one before);
        ``decay`` (< 1) forgets old observations so the estimate follows the text.
    probe_every: after this many plain steps in a row, draft one token anyway, so a drafter that became useful
        is noticed.
    margin: drafting is chosen only when its expected rate beats a plain step's by this fraction. Near the
        break-even the estimates cannot tell a small gain from a small loss; a plain step there costs nothing
        in expectation and keeps speculation from ever being measurably slower than plain decoding.
    carry: what a new request keeps from the ones before (one schedule serves an engine's requests one after
        the other). Measured times (passes over k tokens, drafting a token, an empty ask) describe the machine
        and are kept whole; the drafting time of a request's first ask is not used (the drafter then also takes
        in the whole prompt, a one-off cost that would make every later token look dear). Acceptance describes
        the text, so the observations are kept as a prior worth at most ``carry`` observations per draft position
        (0: each request starts from ``prior`` again): a drafter seen to be rarely accepted is not trusted at 50%
        at the start of the next request, and one seen to be accepted often drafts long from its first step.
    """

    RATIO_PRIOR = 2.0  # the cost curve's weight, in observations, in the estimate of a pass over k tokens
    RATIO_DECAY = 0.9  # measured ratios: recent passes count more (the context grows)

    def __init__(
        self,
        max_gamma: int = 8,
        cost_curve: dict[int, float] | None = None,
        draft_cost: float = 0.0,
        prior: float = 0.5,
        prior_weight: float = 2.0,
        decay: float = 0.95,
        probe_every: int = 8,
        margin: float = 0.03,
        carry: float = 4.0,
    ) -> None:
        if max_gamma < 1:
            raise ValueError(f"max_gamma must be >= 1, got {max_gamma}")
        self.max_gamma = max_gamma
        self.prior_curve = dict(cost_curve or {})
        self.prior_draft_cost = draft_cost
        self.prior = prior
        self.prior_weight = prior_weight
        self.decay = decay
        self.probe_every = probe_every
        self.margin = margin
        if carry < 0:
            raise ValueError(f"carry must be >= 0, got {carry}")
        self.carry = carry
        self._reset()

    def begin(self) -> None:
        """A new request: keep the measured times, shrink each source's acceptance and empty-ask counts to
        ``carry``."""
        for arm in self._arms:
            arm.begin(self.carry)

    def _reset(self) -> None:
        # a pass over k tokens is estimated as scale * ratio(k): the scale (seconds of a 1-token pass) follows
        # the plain steps' passes, so it tracks the machine's speed and the growing context; the ratios start
        # from the cost curve and learn from the passes over k tokens actually measured. An estimate that is updated
        # only by the choices it drives cannot get stuck on one slow measurement: a ratio moves by a fraction of
        # each observation, and every observation is clipped to [1/2, 2] times the current estimate.
        self._scale: float | None = None
        self._scale_provisional = False  # True while the scale comes from passes over k > 1 tokens only
        self._since_plain = 0  # passes since the last 1-token pass (a plain step)
        self._ratios: dict[int, list[float]] = {}  # k >= 2 -> [decayed sum of measured ratios, decayed count]
        self._arms: list[_Source] = []  # per drafter: acceptance, drafting time, empty asks

    def _arm(self, source: int) -> _Source:
        if source < 0:
            raise ValueError(f"source must be >= 0, got {source}")
        while len(self._arms) <= source:
            self._arms.append(_Source(self.max_gamma))
        return self._arms[source]

    # ---- estimates -------------------------------------------------------------------------------------------

    def acceptance(self, source: int = 0) -> list[float]:
        """Estimated P(position i accepted | positions < i accepted), i = 0 .. max_gamma - 1, for drafter
        ``source``.

        Each position's prior is the estimate of the position before it, so positions rarely drafted so far
        inherit what was seen just before them (and a drafter that is always right gets to draft longer).
        """
        arm = self._arm(source)
        w, prior, out = self.prior_weight, self.prior, []
        for a, r in zip(arm.accepted, arm.reached):
            prior = (a + w * prior) / (r + w)
            out.append(prior)
        return out

    def _prior_c(self, k: int) -> float:
        """The cost curve as a prior, made non-decreasing from c(1) = 1: a pass over more tokens never costs less
        (a measured curve can dip, e.g. c(2) = 0.98 after a short context, where extra rows are nearly free; at
        answer lengths they are not, and a prior below 1 would make every 2-token pass look free)."""
        return max([1.0] + [self.prior_curve.get(j, 1.0 + 0.1 * (j - 1)) for j in range(2, k + 1)])

    def _ratio(self, k: int) -> float:
        """Estimated time of a pass over k tokens relative to one token: the cost curve's c(k) worth
        ``RATIO_PRIOR`` observations, then the measured ratios."""
        if k <= 1:
            return 1.0
        total, count = self._ratios.get(k, (0.0, 0.0))
        return (total + self.RATIO_PRIOR * self._prior_c(k)) / (count + self.RATIO_PRIOR)

    def _verify_time(self, k: int) -> float:
        """Estimated seconds of a target pass over k tokens (relative units before anything was measured)."""
        return (1.0 if self._scale is None else self._scale) * self._ratio(k)

    def _draft_time(self, source: int = 0) -> float:
        arm = self._arm(source)
        if arm.draft_per_token is not None:
            return arm.draft_per_token
        return self.prior_draft_cost * self._verify_time(1)

    def draft_probability(self, source: int = 0) -> float:
        """Estimated probability that asking drafter ``source`` yields a draft (half a pseudo-observation of
        "yes")."""
        arm = self._arm(source)
        return (arm.asks - arm.empty + 0.5) / (arm.asks + 0.5)

    def _expected_tokens(self, gamma: int, source: int) -> float:
        tokens, reach = 1.0, 1.0
        for a in self.acceptance(source)[:gamma]:
            reach *= a
            tokens += reach
        return tokens

    def expected_rate(self, gamma: int, source: int = 0) -> float:
        """Expected tokens per second when asking drafter ``source`` for ``gamma`` tokens now: with the estimated
        probability that a draft comes, its expected accepted tokens and cost; otherwise a plain step after an
        empty ask."""
        tokens = self._expected_tokens(gamma, source)
        drafted = gamma * self._draft_time(source) + self._verify_time(gamma + 1)
        if gamma == 0:
            return tokens / drafted
        p = self.draft_probability(source)
        empty = (self._arm(source).empty_seconds or 0.0) + self._verify_time(1)
        return (p * tokens + (1.0 - p)) / (p * drafted + (1.0 - p) * empty)

    def draft_rate(self, drafted: int, source: int = 0) -> float:
        """Expected tokens per second of verifying a draft of ``drafted`` tokens from ``source`` that is already
        in hand (its drafting time is spent)."""
        return self._expected_tokens(drafted, source) / self._verify_time(drafted + 1)

    def worth_drafting(self, rate: float) -> bool:
        """Whether an expected rate beats a plain step's by the margin."""
        return rate >= (1.0 + self.margin) * self.expected_rate(0)

    def min_confidence(self, source: int = 0) -> float:
        """Break-even for one more drafted token: its cost (drafting it, and the longer target pass) over the time
        of a plain step, which is what an accepted token saves. A drafter stops once the probability that its
        draft so far is all accepted falls below this."""
        extra = self._draft_time(source) + max(self._verify_time(2) - self._verify_time(1), 0.0)
        return min(extra / self._verify_time(1), 1.0)

    # ---- the contract ----------------------------------------------------------------------------------------

    def calibrating(self) -> bool:
        """Whether the next step should be a plain one, to measure a 1-token pass: none has been measured yet and
        ``probe_every`` passes over more tokens have. Every pass is estimated relative to a 1-token pass; measured
        from longer passes through the cost curve, that unit is off by as much as the curve is, and a schedule that
        drafts on every step would never correct it (with the curve too low, a plain step looks dearer than it is
        and drafting keeps looking worth it). Once measured, the unit follows the plain steps; if none come (a
        drafter that always pays) it grows stale, and the stale unit is too low as the context grows, which makes
        drafting look less worth it, not more."""
        return self._scale_provisional and self._since_plain >= self.probe_every

    def choose(self, limit: int, source: int = 0) -> int:
        top = min(self.max_gamma, limit)
        if top <= 0 or self.calibrating():
            self._arm(source).probing = False
            return 0
        rates = [self.expected_rate(g, source) for g in range(top + 1)]
        best = max(range(top + 1), key=rates.__getitem__)
        if not self.worth_drafting(rates[best]):
            best = 0
        arm = self._arm(source)
        arm.probing = best == 0 and arm.plain_run >= self.probe_every
        return 1 if arm.probing else best

    def probing(self, source: int = 0) -> bool:
        """Whether the last ``choose`` for ``source`` was a probe (one token drafted to keep its record current,
        not because drafting was expected to pay): a probe's draft should be verified, or nothing is learnt."""
        return self._arm(source).probing

    def observe_ask(self, asked: int, drafted: int, seconds: float, source: int = 0) -> None:
        if asked <= 0:
            return
        arm = self._arm(source)
        arm.asked_now = True
        timed, arm.time_asks = arm.time_asks, True
        arm.asks = self.decay * arm.asks + 1.0
        arm.empty = self.decay * arm.empty + (1.0 if drafted == 0 else 0.0)
        if not timed:
            return
        if drafted == 0:
            arm.empty_seconds = _smooth(arm.empty_seconds, seconds)
        else:
            arm.draft_per_token = _smooth(arm.draft_per_token, seconds / drafted)

    def observe_pass(self, drafted: int, accepted: int, seconds: float, source: int = 0) -> None:
        k = drafted + 1
        ratio = self._ratio(k)
        self._since_plain = 0 if k == 1 else self._since_plain + 1
        if k == 1:  # the scale follows plain-step passes, and the ratios are measured against it
            if self._scale_provisional:  # the first 1-token pass: re-express the ratios measured so far
                for entry in self._ratios.values():
                    entry[0] *= self._scale / seconds
                self._scale, self._scale_provisional = seconds, False
            else:
                self._scale = _smooth(self._scale, seconds)
        elif self._scale is None or self._scale_provisional:  # no 1-token pass yet: from the cost curve
            self._scale = _smooth(self._scale, seconds / ratio)
            self._scale_provisional = True
        if k >= 2:
            total, count = self._ratios.get(k, (0.0, 0.0))
            sample = _clip(seconds / self._scale, ratio)
            self._ratios[k] = [self.RATIO_DECAY * total + sample, self.RATIO_DECAY * count + 1.0]
        for arm in self._arms:  # steps since each drafter was last asked
            arm.plain_run = 0 if arm.asked_now else arm.plain_run + 1
            arm.asked_now = False
        if drafted == 0:
            return
        arm = self._arm(source)
        for i in range(min(drafted, self.max_gamma)):
            arm.reached[i] = self.decay * arm.reached[i] + 1.0
            arm.accepted[i] = self.decay * arm.accepted[i] + (1.0 if i < accepted else 0.0)
            if i >= accepted:
                break  # positions after the first rejection were not judged


class _Source:
    """What the adaptive schedule knows about one drafter: acceptance by position, drafting time, empty asks."""

    def __init__(self, max_gamma: int) -> None:
        self.reached = [0.0] * max_gamma  # decayed count of steps that drafted position i
        self.accepted = [0.0] * max_gamma  # ... and accepted it
        self.draft_per_token: float | None = None  # smoothed seconds per drafted token
        self.time_asks = False  # False for the first ask of a request (it also absorbs the prompt: not typical)
        self.plain_run = 0  # steps since this drafter was last asked
        self.asked_now = False  # asked during the current step
        self.probing = False  # the last choice for this drafter was a probe
        self.asks = 0.0  # decayed count of steps that asked the drafter for tokens
        self.empty = 0.0  # ... and got none
        self.empty_seconds: float | None = None  # smoothed time of an ask that got nothing

    def begin(self, carry: float) -> None:
        self.plain_run = 0
        self.time_asks = False
        self.asked_now = False
        scale = min(1.0, carry / self.reached[0]) if self.reached[0] > 0 else 1.0  # carry 0: all to 0
        self.reached = [r * scale for r in self.reached]
        self.accepted = [a * scale for a in self.accepted]
        scale = min(1.0, carry / self.asks) if self.asks > 0 else 1.0
        self.asks *= scale
        self.empty *= scale


def make_schedule(gamma: int | str, max_gamma: int = 8, cost_curve: dict[int, float] | None = None) -> Schedule:
    """``gamma``: an integer (fixed) or ``"auto"`` (adaptive, up to ``max_gamma``)."""
    if gamma == "auto":
        return AdaptiveGamma(max_gamma=max_gamma, cost_curve=cost_curve)
    if isinstance(gamma, str):
        try:
            gamma = int(gamma)
        except ValueError:
            raise ValueError(f"gamma must be an integer >= 0 or 'auto', got {gamma!r}") from None
    return FixedGamma(gamma)
