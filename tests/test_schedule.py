"""The schedule: fixed and adaptive gamma, on synthetic acceptance and costs, and exactness with gamma=auto."""

from __future__ import annotations

import pytest
import torch

from specwise.drafters import Draft, Drafter, ModelDrafter, NgramDrafter, NoDrafter
from specwise.engine import Engine
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams
from specwise.schedule import AdaptiveGamma, FixedGamma, make_schedule


def feed(schedule, steps, accept_prob_fn, verify_cost, draft_cost=0.0, limit=8):
    """Drive a schedule with a synthetic drafter: position i accepted when accept_prob_fn(i) says so."""
    chosen = []
    for _ in range(steps):
        g = schedule.choose(limit)
        chosen.append(g)
        accepted = 0
        while accepted < g and accept_prob_fn(accepted):
            accepted += 1
        schedule.observe(g, accepted, g * draft_cost, verify_cost(g + 1))
    return chosen


def pass_times(schedule) -> list[float]:
    """The schedule's estimated seconds of a pass over 1 .. 8 tokens."""
    return [schedule._verify_time(k) for k in range(1, 9)]


def cost(k):
    return 1.0 + 0.15 * (k - 1)  # a pass over k tokens, relative to one


def test_never_accepted_drafter_leads_to_plain_steps():
    s = AdaptiveGamma(max_gamma=6, probe_every=1000)
    chosen = feed(s, 60, lambda i: False, cost)
    assert chosen[-40:] == [0] * 40


def test_never_accepted_drafter_is_still_probed_now_and_then():
    s = AdaptiveGamma(max_gamma=6, probe_every=8)
    chosen = feed(s, 200, lambda i: False, cost)
    tail = chosen[100:]
    assert set(tail) <= {0, 1}
    assert 0 < tail.count(1) <= len(tail) // 8 + 1


def test_a_schedule_that_always_drafts_still_measures_a_plain_pass():
    """The first steps draft (prior 0.5): without a 1-token pass the schedule's unit comes from longer passes and
    the cost curve (here c(2) = 1.1 assumed, 1.5 true), which makes a plain step look dearer than it is and keeps
    drafting looking worth it. A plain step is taken to measure it, and the drafter (35% accepted, below its
    break-even) is then left alone but for probes."""
    import random

    rng = random.Random(3)
    near = lambda k: 1.0 + 0.5 * (k - 1)  # noqa: E731
    s = AdaptiveGamma(max_gamma=6, probe_every=8, cost_curve={2: 1.1})
    chosen = feed(s, 400, lambda i: rng.random() < 0.35, near)
    assert 0 in chosen[:20]
    assert s._verify_time(1) == pytest.approx(1.0, rel=0.05)
    assert chosen[-100:].count(0) > 80


def test_perfect_drafter_leads_to_the_largest_gamma():
    s = AdaptiveGamma(max_gamma=6)
    chosen = feed(s, 40, lambda i: True, cost)
    assert chosen[-20:] == [6] * 20


def test_gamma_follows_the_cost_of_verification():
    """With acceptance 0.7 per position, cheap verification favours long drafts and expensive verification short."""
    import random

    rng = random.Random(0)
    cheap = feed(AdaptiveGamma(max_gamma=8), 300, lambda i: rng.random() < 0.7, lambda k: 1.0 + 0.02 * (k - 1))
    dear = feed(AdaptiveGamma(max_gamma=8), 300, lambda i: rng.random() < 0.7, lambda k: 1.0 + 0.6 * (k - 1))
    assert sum(cheap[100:]) / 200 > sum(dear[100:]) / 200 + 1.5


def test_costly_drafter_drafts_less():
    s_free = AdaptiveGamma(max_gamma=8)
    s_dear = AdaptiveGamma(max_gamma=8)
    free = feed(s_free, 100, lambda i: i < 3, cost, draft_cost=0.0)
    dear = feed(s_dear, 100, lambda i: i < 3, cost, draft_cost=2.0)
    assert sum(dear[50:]) < sum(free[50:])


def feed_declining(schedule, steps, draft_prob_fn, ask_cost, limit=8):
    """A drafter that, when asked, proposes a draft only when draft_prob_fn() says so (always accepted then);
    an empty ask costs ``ask_cost`` (relative to a 1-token pass of cost 1)."""
    chosen = []
    for _ in range(steps):
        g = schedule.choose(limit)
        chosen.append(g)
        if g > 0 and draft_prob_fn():
            schedule.observe(g, g, 0.0, cost(g + 1), asked=g)
        else:
            schedule.observe(0, 0, ask_cost if g > 0 else 0.0, cost(1), asked=g)
    return chosen


def test_a_drafter_that_keeps_declining_costly_asks_is_rarely_asked():
    """A head-like drafter that declines 98% of asks, each empty ask costing 20% of a pass: asking does not pay, so
    the schedule takes plain steps and only probes now and then."""
    import random

    rng = random.Random(1)
    chosen = feed_declining(AdaptiveGamma(max_gamma=6, probe_every=8), 400, lambda: rng.random() < 0.02, 0.2)
    asked = sum(g > 0 for g in chosen[100:])
    assert asked <= 300 // 8 + 5


def test_a_drafter_whose_empty_asks_are_free_is_still_asked():
    """Prompt lookup without a match costs nothing to ask: a drafter that drafts (and is accepted) 30% of the
    time keeps being asked every step."""
    import random

    rng = random.Random(2)
    chosen = feed_declining(AdaptiveGamma(max_gamma=6), 300, lambda: rng.random() < 0.3, 0.0)
    assert all(g > 0 for g in chosen[50:])


def test_limit_and_fixed_gamma():
    assert AdaptiveGamma(max_gamma=6).choose(0) == 0
    assert AdaptiveGamma(max_gamma=6).choose(2) <= 2
    assert FixedGamma(4).choose(10) == 4 and FixedGamma(4).choose(2) == 2
    assert isinstance(make_schedule("auto"), AdaptiveGamma)
    assert make_schedule("3").choose(10) == 3
    for bad in (-1, "x", 1.5):
        with pytest.raises(ValueError, match="gamma must be"):
            make_schedule(bad)


def test_greedy_identity_with_gamma_auto(tiny_target, tiny_target_twin, tiny_draft):
    prompt = [1, 5, 9, 2]
    plain = Engine(tiny_target, NoDrafter()).generate(prompt, SamplingParams(), 40, eos_token_ids=[])
    for drafter in (ModelDrafter(tiny_target_twin), ModelDrafter(tiny_draft), NgramDrafter()):
        spec = Engine(tiny_target, drafter, gamma="auto").generate(prompt, SamplingParams(), 40, eos_token_ids=[])
        assert spec.token_ids == plain.token_ids
        assert sum(spec.stats.plain_step_reasons.values()) == spec.stats.gamma_histogram.get(0, 0)
    # one engine serving requests one after the other (its schedule carries what it learnt): still exact
    prompts = [prompt, [3, 3, 7], [1, 5, 9, 2, 8, 8]]
    plains = [Engine(tiny_target, NoDrafter()).generate(p, SamplingParams(), 30, eos_token_ids=[]) for p in prompts]
    engine = Engine(tiny_target, NgramDrafter(), gamma="auto")
    for p, expected in zip(prompts * 2, plains * 2):
        assert engine.generate(p, SamplingParams(), 30, eos_token_ids=[]).token_ids == expected.token_ids


class OracleDrafter(Drafter):
    """Proposes the toy target's own greedy continuation by table lookup: always right, almost free."""

    def __init__(self, model: ToyModel) -> None:
        self.model = model

    def propose(self, context, k, params, generator) -> Draft:
        ctx = list(context)
        for _ in range(k):
            ctx.append(int(self.model.next_logits(len(ctx) - 1, ctx[-1]).argmax()))
        return Draft(torch.tensor(ctx[len(context) :], dtype=torch.int64))


class SyntheticTimes(AdaptiveGamma):
    """The adaptive schedule fed fixed costs instead of wall-clock times (a toy model's passes take microseconds,
    so measured times are mostly noise and would make the choice depend on the machine's load)."""

    def observe_ask(self, asked, drafted, seconds, source=0):
        super().observe_ask(asked, drafted, 1e-4 * drafted, source)

    def observe_pass(self, drafted, accepted, seconds, source=0):
        super().observe_pass(drafted, accepted, 0.01 * cost(drafted + 1), source)


def test_gamma_auto_with_a_perfect_cheap_draft_drafts_the_most():
    target = ToyModel.random(6, seed=3)
    result = Engine(target, OracleDrafter(ToyModel.random(6, seed=3)), gamma=SyntheticTimes(max_gamma=8)).generate(
        [1], max_new_tokens=600, eos_token_ids=[]
    )
    hist = result.stats.gamma_histogram
    assert result.stats.acceptance_rate == 1.0
    assert hist.get(8, 0) >= 0.8 * result.stats.target_passes
    # one plain step measured the unit pass (only longer passes had been measured), and the stats say why
    assert result.stats.plain_step_reasons.get("calibrate") == 1


def test_min_confidence_is_the_break_even_of_one_more_token():
    """(draft time + extra verify time of one more token) / plain step time, from what was measured."""
    s = AdaptiveGamma(max_gamma=4)
    feed(s, 30, lambda i: i < 2, lambda k: 0.030 + 0.003 * (k - 1), draft_cost=0.0015)
    assert s.min_confidence() == pytest.approx((0.0015 + 0.003) / 0.030, rel=0.05)
    assert FixedGamma(4).min_confidence() == 0.0  # a fixed gamma drafts exactly gamma tokens
    dear = AdaptiveGamma(max_gamma=4)
    feed(dear, 30, lambda i: i < 2, lambda k: 0.030 + 0.003 * (k - 1), draft_cost=0.1)
    assert dear.min_confidence() == 1.0


def test_a_new_request_keeps_the_measured_times_and_a_bounded_acceptance_prior():
    """begin(): times are kept whole; acceptance counts shrink to `carry` observations per position, so the next
    request starts from what the drafter did (not from 0.5) and still follows new evidence quickly."""
    s = AdaptiveGamma(max_gamma=6, probe_every=8, carry=4.0)
    feed(s, 80, lambda i: False, cost)
    times = pass_times(s)
    s.begin()
    assert pass_times(s) == times  # the machine did not change
    assert s._arm(0).reached[0] == pytest.approx(4.0) and s.acceptance()[0] < 0.2
    assert s.choose(8) == 0  # a drafter never accepted is not asked at the start of the next request
    # ... but a drafter that turns perfect is noticed at the next probe and trusted soon after
    assert feed(s, 40, lambda i: True, cost)[-5:] == [6] * 5
    s.begin()
    assert s.acceptance()[0] > 0.7 and s.choose(8) >= 4  # and drafts long from the first step of the next one

    fresh = AdaptiveGamma(max_gamma=6, probe_every=1000, carry=0.0)
    feed(fresh, 80, lambda i: False, cost)
    times = pass_times(fresh)
    fresh.begin()
    assert fresh.acceptance()[0] == pytest.approx(fresh.prior) and pass_times(fresh) == times
    with pytest.raises(ValueError, match="carry"):
        AdaptiveGamma(carry=-1)


def test_the_engine_gives_the_schedule_the_model_s_measured_cost_curve():
    target = ToyModel(torch.zeros(1, 16, 16))
    target.cost_curve = {1: 1.0, 2: 1.02, 3: 1.05}
    engine = Engine(target, NgramDrafter(), gamma="auto")
    assert engine.schedule.prior_curve == target.cost_curve
    assert engine.schedule._verify_time(3) == pytest.approx(1.05)  # before any pass is measured


def test_the_first_ask_of_a_request_does_not_set_the_drafting_time():
    """The first ask also takes in the prompt (a head runs its layer over every prompt position): that one-off time
    must not make every later drafted token look as dear as a target pass."""
    s = AdaptiveGamma(max_gamma=4)
    s.begin()
    s.observe(2, 1, 0.030, 0.032)  # first ask: 30 ms of drafting, most of it the prompt
    assert s._draft_time() == pytest.approx(0.0)  # not measured yet (prior 0)
    s.observe(2, 1, 0.004, 0.032)  # the next ask: 2 ms per token
    assert s._draft_time() == pytest.approx(0.002)
    s.begin()
    s.observe(0, 0, 0.050, 0.030, asked=2)  # an empty first ask of the next request is not timed either
    assert s._arm(0).empty_seconds is None and s._draft_time() == pytest.approx(0.002)
    assert s.min_confidence() < 0.5


def test_one_slow_pass_does_not_stick_in_the_estimates():
    """A pass over 2 tokens that once took three times as long (the machine paused) moves the estimate by a bounded
    step, and the times of passes over 1 token keep the scale current."""
    s = AdaptiveGamma(max_gamma=4, cost_curve={1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4})
    for _ in range(5):
        s.observe(0, 0, 0.0, 0.030)
    s.observe(1, 1, 0.002, 0.099)  # true: 0.033
    assert s._verify_time(2) < 1.6 * 0.033
    for _ in range(5):
        s.observe(1, 1, 0.002, 0.033)
    assert s._verify_time(2) == pytest.approx(0.033, rel=0.15)
    for _ in range(20):  # the context grows: 1-token passes slow down, and so does the estimate for 2 tokens
        s.observe(0, 0, 0.0, 0.045)
    assert s._verify_time(1) == pytest.approx(0.045, rel=0.05) and s._verify_time(2) > 0.045


def test_the_cost_curve_prior_never_decreases():
    """A profile measured after a short context can dip (c(2) < c(1)); as a prior it is made non-decreasing."""
    s = AdaptiveGamma(max_gamma=4, cost_curve={1: 1.0, 2: 0.98, 3: 1.22, 4: 1.19, 5: 1.40})
    assert [s._prior_c(k) for k in range(1, 6)] == [1.0, 1.0, 1.22, 1.22, 1.40]


def test_each_source_has_its_own_acceptance_and_drafting_time():
    """Two drafters behind one schedule: one never accepted and dear, one always accepted and cheap. Each gets the
    gamma its own record calls for; the target's pass times are shared."""
    s = AdaptiveGamma(max_gamma=6, probe_every=1000)
    s.begin()
    for step in range(60):
        source = step % 2
        g = s.choose(8, source=source) or 1  # keep both drafting, to record both
        accepted = g if source == 1 else 0
        s.observe(g, accepted, g * (0.004 if source == 0 else 0.0001), 0.030 * cost(g + 1), source=source)
    assert s.acceptance(0)[0] < 0.1 and s.acceptance(1)[0] > 0.9
    assert s._draft_time(0) == pytest.approx(0.004, rel=0.2) and s._draft_time(1) < 0.001
    assert s.choose(8, source=0) == 0 and s.choose(8, source=1) == 6
    assert s.min_confidence(0) > s.min_confidence(1)
    assert s.expected_rate(6, source=1) > s.expected_rate(0) > s.expected_rate(1, source=0)


class WrongDrafter(Drafter):
    """Proposes k tokens the toy target never emits next (deterministic, like prompt lookup gone wrong)."""

    name = "wrong"

    def __init__(self, model: ToyModel) -> None:
        self.model = model

    def propose(self, context, k, params, generator) -> Draft:
        best = int(self.model.next_logits(len(context) - 1, context[-1]).argmax())
        return Draft(torch.tensor([(best + 1) % self.model.vocab_size] * k, dtype=torch.int64))


def test_combined_drafter_with_gamma_auto_drafts_with_the_source_that_pays():
    """ngram-like drafter first, always wrong; an oracle second. With gamma auto the first is judged on its own
    record and stops being used (probes aside), the oracle drafts long; the output equals plain decoding."""
    from specwise.drafters.combined import CombinedDrafter

    target = ToyModel.random(6, seed=3)
    oracle = OracleDrafter(ToyModel.random(6, seed=3))
    oracle.name = "oracle"
    combined = CombinedDrafter([WrongDrafter(ToyModel.random(6, seed=3)), oracle])
    plain = Engine(target, NoDrafter()).generate([1], max_new_tokens=600, eos_token_ids=[])
    result = Engine(target, combined, gamma=SyntheticTimes(max_gamma=8)).generate(
        [1], max_new_tokens=600, eos_token_ids=[]
    )
    assert result.token_ids == plain.token_ids
    by = result.stats.by_drafter
    assert by["oracle"]["accepted"] == by["oracle"]["drafted"] > 450
    assert by.get("wrong", {"steps": 0})["steps"] <= 3
    assert result.stats.gamma_histogram.get(8, 0) >= 0.7 * result.stats.target_passes
    assert "by drafter: oracle" in result.stats.summary()
