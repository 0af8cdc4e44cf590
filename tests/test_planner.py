"""The planner: fixed and adaptive gamma, the choice among sources, where drafting stops, and exactness with
gamma=auto. The adaptive planner's estimates are driven with synthetic acceptance and costs."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from test_engine import gguf_files, models  # noqa: F401 (fixtures: tiny GGUF and Hugging Face models)

from specwise.costs import PassCosts
from specwise.drafters import Draft, Drafter, ModelDrafter, NgramDrafter, NoDrafter
from specwise.engine import Engine
from specwise.models.toy import ToyModel
from specwise.planner import AdaptivePlanner, FixedPlanner, Proposal, Rate, Shared, make_planner
from specwise.sampling import SamplingParams

GREEDY = SamplingParams()


def draft_of(n: int) -> Draft:
    return Draft(np.zeros(n, dtype=np.int64))


def start(planner, sources: int = 1):
    """A planner's state for a sequence with ``sources`` drafters (never asked here: the steps are synthetic)."""
    state = planner.new_state([NoDrafter() for _ in range(sources)])
    planner.begin(state)
    return state


def observe(planner, state, drafted, accepted, draft_seconds, verify_seconds, asked=None, source=0):
    """One synthetic step: ``source`` was asked for ``asked`` tokens (default: ``drafted``) and proposed ``drafted``
    in ``draft_seconds``; the target's pass kept ``accepted`` and took ``verify_seconds``."""
    asked = drafted if asked is None else asked
    if asked > 0:
        planner._observe_ask(state, source, drafted, draft_seconds)
    planner.observe(state, Proposal(draft_of(drafted), source), accepted, verify_seconds)


def feed(planner, state, steps, accept_prob_fn, verify_cost, draft_cost=0.0, limit=8):
    """Drive a planner with a synthetic drafter: position i accepted when accept_prob_fn(i) says so."""
    chosen = []
    for _ in range(steps):
        g = planner.choose(state, limit)
        chosen.append(g)
        accepted = 0
        while accepted < g and accept_prob_fn(accepted):
            accepted += 1
        observe(planner, state, g, accepted, g * draft_cost, verify_cost(g + 1))
    return chosen


def pass_times(planner) -> list[float]:
    """The planner's estimated seconds of a pass over 1 .. 8 tokens."""
    return [planner.verify_time(k) for k in range(1, 9)]


def cost(k):
    return 1.0 + 0.15 * (k - 1)  # a pass over k tokens, relative to one


def test_rate_is_a_decayed_mean_with_a_prior():
    r = Rate(prior=0.5, weight=2.0, decay=0.5)
    assert r.value() == 0.5 and r.value(prior=0.9) == pytest.approx(0.9)
    r.add(1.0)
    assert r.value() == pytest.approx((1.0 + 1.0) / (1.0 + 2.0))
    r.add(0.0)  # the first observation now counts half
    assert (r.total, r.count) == (0.5, 1.5)
    r.add(3.0, count=4.0)  # accepted tokens over drafted ones
    assert (r.total, r.count) == (3.25, 4.75)
    r.scale(0.5)
    assert r.count == pytest.approx(2.375) and r.value() == pytest.approx((1.625 + 1.0) / (2.375 + 2.0))


def test_never_accepted_drafter_leads_to_plain_steps():
    s = AdaptivePlanner(max_gamma=6, probe_every=1000)
    chosen = feed(s, start(s), 60, lambda i: False, cost)
    assert chosen[-40:] == [0] * 40


def test_never_accepted_drafter_is_still_probed_now_and_then():
    s = AdaptivePlanner(max_gamma=6, probe_every=8)
    chosen = feed(s, start(s), 200, lambda i: False, cost)
    tail = chosen[100:]
    assert set(tail) <= {0, 1}
    assert 0 < tail.count(1) <= len(tail) // 8 + 1


def test_a_source_not_worth_asking_is_weighed_again_only_every_few_steps():
    """Once a source is found not worth asking, the next REUSE steps take that answer without weighing every gamma
    again (nothing it is judged on changes while it is not asked); the choices, probes included, are those of a
    planner that weighs every step."""
    s = AdaptivePlanner(max_gamma=6, probe_every=8)
    s.REUSE = 3
    every = AdaptivePlanner(max_gamma=6, probe_every=8)
    every.REUSE = 0
    chosen = feed(s, start(s), 200, lambda i: False, cost)
    assert chosen == feed(every, start(every), 200, lambda i: False, cost)
    assert chosen[100:].count(1) > 0  # still probed
    weighed = []
    inner = s._rates
    s._rates = lambda *a: weighed.append(1) or inner(*a)
    state = start(s)
    feed(s, state, 40, lambda i: False, cost)  # a new request: the first steps draft on the carried prior
    weighed.clear()
    tail = feed(s, state, 80, lambda i: False, cost)
    assert tail.count(0) > 60 and len(weighed) <= 80 // 4 + tail.count(1) + 2


def test_a_planner_that_always_drafts_still_measures_a_plain_pass():
    """The first steps draft (prior 0.5): without a 1-token pass the planner's unit comes from longer passes and
    the cost curve (here c(2) = 1.1 assumed, 1.5 true), which makes a plain step look dearer than it is and keeps
    drafting looking worth it. A plain step is taken to measure it, and the drafter (35% accepted, below its
    break-even) is then left alone but for probes."""
    import random

    rng = random.Random(3)
    near = lambda k: 1.0 + 0.5 * (k - 1)  # noqa: E731
    s = AdaptivePlanner(max_gamma=6, probe_every=8, cost_curve={2: 1.1})
    chosen = feed(s, start(s), 400, lambda i: rng.random() < 0.35, near)
    assert 0 in chosen[:20]
    assert s.verify_time(1) == pytest.approx(1.0, rel=0.05)
    assert chosen[-100:].count(0) > 80


def test_perfect_drafter_leads_to_the_largest_gamma():
    s = AdaptivePlanner(max_gamma=6)
    chosen = feed(s, start(s), 40, lambda i: True, cost)
    assert chosen[-20:] == [6] * 20


def test_gamma_follows_the_cost_of_verification():
    """With acceptance 0.7 per position, cheap verification favours long drafts and expensive verification short."""
    import random

    rng = random.Random(0)
    s_cheap, s_dear = AdaptivePlanner(max_gamma=8), AdaptivePlanner(max_gamma=8)
    cheap = feed(s_cheap, start(s_cheap), 300, lambda i: rng.random() < 0.7, lambda k: 1.0 + 0.02 * (k - 1))
    dear = feed(s_dear, start(s_dear), 300, lambda i: rng.random() < 0.7, lambda k: 1.0 + 0.6 * (k - 1))
    assert sum(cheap[100:]) / 200 > sum(dear[100:]) / 200 + 1.5


def test_costly_drafter_drafts_less():
    s_free = AdaptivePlanner(max_gamma=8)
    s_dear = AdaptivePlanner(max_gamma=8)
    free = feed(s_free, start(s_free), 100, lambda i: i < 3, cost, draft_cost=0.0)
    dear = feed(s_dear, start(s_dear), 100, lambda i: i < 3, cost, draft_cost=2.0)
    assert sum(dear[50:]) < sum(free[50:])


def feed_declining(planner, steps, draft_prob_fn, ask_cost, limit=8):
    """A drafter that, when asked, proposes a draft only when draft_prob_fn() says so (always accepted then);
    an empty ask costs ``ask_cost`` (relative to a 1-token pass of cost 1)."""
    state = start(planner)
    chosen = []
    for _ in range(steps):
        g = planner.choose(state, limit)
        chosen.append(g)
        if g > 0 and draft_prob_fn():
            observe(planner, state, g, g, 0.0, cost(g + 1), asked=g)
        else:
            observe(planner, state, 0, 0, ask_cost if g > 0 else 0.0, cost(1), asked=g)
    return chosen


def test_a_drafter_that_keeps_declining_costly_asks_is_rarely_asked():
    """A head-like drafter that declines 98% of asks, each empty ask costing 20% of a pass: asking does not pay, so
    the planner takes plain steps and only probes now and then."""
    import random

    rng = random.Random(1)
    chosen = feed_declining(AdaptivePlanner(max_gamma=6, probe_every=8), 400, lambda: rng.random() < 0.02, 0.2)
    asked = sum(g > 0 for g in chosen[100:])
    assert asked <= 300 // 8 + 5


def test_a_drafter_whose_empty_asks_are_free_is_still_asked():
    """Prompt lookup without a match costs nothing to ask: a drafter that drafts (and is accepted) 30% of the
    time keeps being asked every step."""
    import random

    rng = random.Random(2)
    chosen = feed_declining(AdaptivePlanner(max_gamma=6), 300, lambda: rng.random() < 0.3, 0.0)
    assert all(g > 0 for g in chosen[50:])


def test_limit_and_make_planner():
    s = AdaptivePlanner(max_gamma=6)
    assert s.choose(start(s), 0) == 0
    assert s.choose(start(s), 2) <= 2
    assert isinstance(make_planner("auto"), AdaptivePlanner) and make_planner("auto").gamma == "auto"
    assert make_planner("3").gamma == 3 and make_planner(4).gamma == 4
    assert make_planner(s) is s
    for bad in (-1, "x", 1.5):
        with pytest.raises(ValueError, match="gamma must be"):
            make_planner(bad)


def test_greedy_identity_with_gamma_auto(models):  # noqa: F811 (the fixture)
    target = models.target
    prompt = [1, 5, 9, 2]
    plain = Engine(target, NoDrafter()).generate(prompt, SamplingParams(), 40, eos_token_ids=[])
    for drafter in (ModelDrafter(models.twin), ModelDrafter(models.draft), NgramDrafter()):
        spec = Engine(target, drafter, gamma="auto").generate(prompt, SamplingParams(), 40, eos_token_ids=[])
        assert spec.token_ids == plain.token_ids
        assert sum(spec.stats.plain_step_reasons.values()) == spec.stats.gamma_histogram.get(0, 0)
    # one engine serving requests one after the other (its schedule carries what it learnt): still exact
    prompts = [prompt, [3, 3, 7], [1, 5, 9, 2, 8, 8]]
    plains = [Engine(target, NoDrafter()).generate(p, SamplingParams(), 30, eos_token_ids=[]) for p in prompts]
    engine = Engine(target, NgramDrafter(), gamma="auto")
    for p, expected in zip(prompts * 2, plains * 2):
        assert engine.generate(p, SamplingParams(), 30, eos_token_ids=[]).token_ids == expected.token_ids


class OracleDrafter(Drafter):
    """Proposes the toy target's own greedy continuation by table lookup: always right, almost free."""

    name = "oracle"

    def __init__(self, model: ToyModel) -> None:
        self.model = model

    def propose(self, context, k, params, generator, stop=0.0) -> Draft:
        ctx = list(context)
        for _ in range(k):
            ctx.append(int(self.model.next_logits(len(ctx) - 1, ctx[-1]).argmax()))
        return Draft(np.array(ctx[len(context) :], dtype=np.int64))


class WrongDrafter(Drafter):
    """Proposes k tokens the toy target never emits next (deterministic, like prompt lookup gone wrong)."""

    name = "wrong"

    def __init__(self, model: ToyModel) -> None:
        self.model = model

    def propose(self, context, k, params, generator, stop=0.0) -> Draft:
        best = int(self.model.next_logits(len(context) - 1, context[-1]).argmax())
        return Draft([(best + 1) % self.model.vocab_size] * k)


class Scripted(Drafter):
    """Proposes what ``script(context, k)`` returns: a Draft (or None: nothing); counts the asks."""

    def __init__(self, name: str, script) -> None:
        self.name, self.script, self.asks = name, script, 0

    def propose(self, context, k, params, generator, stop=0.0) -> Draft:
        self.asks += 1
        return self.script(context, k) or Draft.empty()


class SyntheticCosts(PassCosts):
    """Fixed costs instead of wall-clock times (a toy model's passes take microseconds, so measured times are
    mostly noise and would make the choice depend on the machine's load)."""

    def observe_ask(self, source, drafted, seconds):
        super().observe_ask(source, drafted, 1e-4 * drafted)

    def observe_pass(self, k, seconds):
        super().observe_pass(k, 0.01 * cost(k))


class SyntheticTimes(AdaptivePlanner):
    """The adaptive planner on SyntheticCosts."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.costs = SyntheticCosts()


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


def test_stop_level_is_the_break_even_of_one_more_token():
    """(draft time + extra verify time of one more token) / plain step time, from what was measured."""
    s = AdaptivePlanner(max_gamma=4)
    feed(s, start(s), 30, lambda i: i < 2, lambda k: 0.030 + 0.003 * (k - 1), draft_cost=0.0015)
    assert s.stop_level() == pytest.approx((0.0015 + 0.003) / 0.030, rel=0.05)
    assert FixedPlanner(4).stop == 0.0  # a fixed gamma drafts exactly gamma tokens
    dear = AdaptivePlanner(max_gamma=4)
    feed(dear, start(dear), 30, lambda i: i < 2, lambda k: 0.030 + 0.003 * (k - 1), draft_cost=0.1)
    assert dear.stop_level() == 1.0


def test_the_rates_of_every_gamma_in_one_pass_equal_expected_rate():
    """choose() computes the expected rate of every gamma in one pass: the same numbers as expected_rate, alone
    and while planning for a shared pass."""
    s = AdaptivePlanner(max_gamma=6, cost_curve={2: 1.1, 4: 1.3, 6: 1.6})
    state = start(s)
    feed(s, state, 40, lambda i: i < 3, lambda k: 0.030 + 0.004 * (k - 1), draft_cost=0.001)
    for rows, tokens in ((0, 0.0), (3, 2.5)):
        s._rows, s._tokens = rows, tokens
        for top in (1, 4, 6):
            assert s._rates(state, top, 0) == [s.expected_rate(state, g, 0) for g in range(top + 1)]
    s._rows, s._tokens = 0, 0.0


def test_a_new_request_keeps_the_measured_times_and_a_bounded_acceptance_prior():
    """begin(): times are kept whole; acceptance counts shrink to `carry` observations per position, so the next
    request starts from what the drafter did (not from 0.5) and still follows new evidence quickly."""
    s = AdaptivePlanner(max_gamma=6, probe_every=8, carry=4.0)
    state = start(s)
    feed(s, state, 80, lambda i: False, cost)
    times = pass_times(s)
    s.begin(state)
    assert pass_times(s) == times  # the machine did not change
    assert state.known[0].positions[0].count == pytest.approx(4.0) and s.acceptance(state)[0] < 0.2
    assert s.choose(state, 8) == 0  # a drafter never accepted is not asked at the start of the next request
    # ... but a drafter that turns perfect is noticed at the next probe and trusted soon after
    assert feed(s, state, 40, lambda i: True, cost)[-5:] == [6] * 5
    s.begin(state)
    assert s.acceptance(state)[0] > 0.7 and s.choose(state, 8) >= 4  # and drafts long from the first step

    fresh = AdaptivePlanner(max_gamma=6, probe_every=1000, carry=0.0)
    state = start(fresh)
    feed(fresh, state, 80, lambda i: False, cost)
    times = pass_times(fresh)
    fresh.begin(state)
    assert fresh.acceptance(state)[0] == pytest.approx(fresh.prior) and pass_times(fresh) == times
    with pytest.raises(ValueError, match="carry"):
        AdaptivePlanner(carry=-1)


def test_the_engine_gives_the_planner_the_cost_curve():
    curve = {1: 1.0, 2: 1.02, 3: 1.05}
    engine = Engine(ToyModel(np.zeros((1, 16, 16))), NgramDrafter(), gamma="auto", cost_curve=curve)
    assert engine.planner.costs.prior_curve == curve
    assert engine.planner.verify_time(3) == pytest.approx(1.05)  # before any pass is measured
    assert Engine(ToyModel(np.zeros((1, 16, 16))), NgramDrafter(), gamma="auto").planner.verify_time(3) == 1.2


def test_the_runtime_hands_the_saved_cost_curve_to_the_planner(tmp_path, monkeypatch, tiny_dir):
    """`specwise profile` saves c(k) per model, device and implementation; build_runtime reads it for the planner
    (the Model carries no cost curve). A profile of another implementation, or a broken one, is not used."""
    from specwise.artifacts import profile_path, save_profile, saved_cost_curve
    from specwise.runtime import build_runtime

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path / "cache"))
    path = profile_path(tiny_dir, "cpu")
    save_profile(path, {"implementation": "NativeModel", "cost_curve": {"1": 1.0, "2": 1.01, "3": 1.3}})
    runtime = build_runtime(tiny_dir, "ngram", "auto", "cpu")
    assert runtime.engine.planner.costs.prior_curve == {1: 1.0, 2: 1.01, 3: 1.3}
    assert not hasattr(runtime.target.model, "cost_curve")
    assert saved_cost_curve(tiny_dir, "cpu", "HFModel") is None
    save_profile(path, {"implementation": "NativeModel", "cost_curve": {"1": 1.0, "2": -1}})
    assert saved_cost_curve(tiny_dir, "cpu") is None
    path.write_text(json.dumps({"cost_curve": "x"}))
    assert saved_cost_curve(tiny_dir, "cpu") is None


def test_the_runtime_decides_gamma_and_the_drafter_once(tmp_path, monkeypatch, tiny_dir):
    """Following the CLI's arguments down: the planner is made once (checked before loading, given the cost curve
    after) and the drafter spec resolved once (``auto`` -> a concrete spec, then built)."""
    import specwise.drafters as drafters
    from specwise.runtime import build_runtime

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path / "cache"))
    made, resolved = [], []
    init, resolve = AdaptivePlanner.__init__, drafters.resolve_drafter_spec

    def counting_init(self, *args, **kwargs):
        made.append(self)
        init(self, *args, **kwargs)

    def counting_resolve(spec, target):
        resolved.append(spec)
        return resolve(spec, target)

    monkeypatch.setattr(AdaptivePlanner, "__init__", counting_init)
    monkeypatch.setattr(drafters, "resolve_drafter_spec", counting_resolve)
    runtime = build_runtime(tiny_dir, "auto", "auto", "cpu")
    assert made == [runtime.engine.planner] and resolved == ["auto"]
    with pytest.raises(ValueError, match="gamma"):
        build_runtime(tiny_dir, "ngram", "-1", "cpu")


def test_the_first_ask_of_a_request_does_not_set_the_drafting_time():
    """The first ask also takes in the prompt (a head runs its layer over every prompt position): that one-off time
    must not make every later drafted token look as dear as a target pass."""
    s = AdaptivePlanner(max_gamma=4)
    state = start(s)
    observe(s, state, 2, 1, 0.030, 0.032)  # first ask: 30 ms of drafting, most of it the prompt
    assert s.draft_time() == pytest.approx(0.0)  # not measured yet (prior 0)
    observe(s, state, 2, 1, 0.004, 0.032)  # the next ask: 2 ms per token
    assert s.draft_time() == pytest.approx(0.002)
    s.begin(state)
    observe(s, state, 0, 0, 0.050, 0.030, asked=2)  # an empty first ask of the next request is not timed either
    assert 0 not in s.costs._empty_seconds and s.draft_time() == pytest.approx(0.002)
    assert s.stop_level() < 0.5


def test_one_slow_pass_does_not_stick_in_the_estimates():
    """A pass over 2 tokens that once took three times as long (the machine paused) moves the estimate by a bounded
    step, and the times of passes over 1 token keep the scale current."""
    s = AdaptivePlanner(max_gamma=4, cost_curve={1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4})
    state = start(s)
    for _ in range(5):
        observe(s, state, 0, 0, 0.0, 0.030)
    observe(s, state, 1, 1, 0.002, 0.099)  # true: 0.033
    assert s.verify_time(2) < 1.6 * 0.033
    for _ in range(5):
        observe(s, state, 1, 1, 0.002, 0.033)
    assert s.verify_time(2) == pytest.approx(0.033, rel=0.15)
    for _ in range(20):  # the context grows: 1-token passes slow down, and so does the estimate for 2 tokens
        observe(s, state, 0, 0, 0.0, 0.045)
    assert s.verify_time(1) == pytest.approx(0.045, rel=0.05) and s.verify_time(2) > 0.045


def test_the_cost_curve_prior_never_decreases():
    """A profile measured after a short context can dip (c(2) < c(1)); as a prior it is made non-decreasing."""
    s = AdaptivePlanner(max_gamma=4, cost_curve={1: 1.0, 2: 0.98, 3: 1.22, 4: 1.19, 5: 1.40})
    assert [s.costs.prior_c(k) for k in range(1, 6)] == [1.0, 1.0, 1.22, 1.22, 1.40]


def test_the_cost_curve_prior_goes_on_past_its_last_point():
    """A batch's pass holds more rows than the profile measured: past the curve's end the prior follows the slope
    of its second half instead of staying flat (rows past the measured ones are not free)."""
    s = AdaptivePlanner(cost_curve={1: 1.0, 2: 1.1, 4: 1.5, 8: 2.5})
    assert s.costs.prior_c(8) == 2.5
    assert s.costs.prior_c(16) == pytest.approx(2.5 + 0.25 * 8)
    assert s.costs.prior_c(12) < s.costs.prior_c(16) < s.costs.prior_c(32)


def test_each_source_has_its_own_acceptance_and_drafting_time():
    """Two drafters behind one planner: one never accepted and dear, one always accepted and cheap. Each gets the
    gamma its own record calls for; the target's pass times are shared."""
    s = AdaptivePlanner(max_gamma=6, probe_every=1000)
    state = start(s, sources=2)
    for step in range(60):
        source = step % 2
        g = s.choose(state, 8, source=source) or 1  # keep both drafting, to record both
        accepted = g if source == 1 else 0
        observe(s, state, g, accepted, g * (0.004 if source == 0 else 0.0001), 0.030 * cost(g + 1), source=source)
    assert s.acceptance(state, 0)[0] < 0.1 and s.acceptance(state, 1)[0] > 0.9
    assert s.draft_time(0) == pytest.approx(0.004, rel=0.2) and s.draft_time(1) < 0.001
    assert s.choose(state, 8, source=0) == 0 and s.choose(state, 8, source=1) == 6
    assert s.stop_level(0) > s.stop_level(1)
    assert s.expected_rate(state, 6, source=1) > s.expected_rate(state, 0) > s.expected_rate(state, 1, source=0)


def test_an_asks_fixed_cost_is_told_from_its_cost_per_drafted_token():
    """A draft model's ask first takes in what the context gained (one pass, whatever the draft's length), then
    spends a pass per drafted token: the planner learns the two apart, so that a longer draft is priced by what it
    adds, not by the average cost of the short drafts a confidence cut leaves."""
    s = AdaptivePlanner(max_gamma=8, cost_curve={k: 1.0 + 0.05 * (k - 1) for k in range(1, 10)})
    state = start(s)
    observe(s, state, 0, 0, 0.0, 0.030)
    observe(s, state, 1, 1, 0.5, 0.030)  # a request's first ask: not timed
    for step in range(40):
        n = 1 + step % 3  # drafts of 1, 2 and 3 tokens: 6 ms, then 4 ms a token
        observe(s, state, n, n, 0.006 + 0.004 * n, 0.030 * (1.0 + 0.05 * n))
    assert s.ask_time() == pytest.approx(0.006, rel=0.25)
    assert s.draft_time() == pytest.approx(0.004, rel=0.25)
    assert s.stop_level() < (0.006 + 0.004 * 2) / 2 / 0.030  # the next token costs the slope, not the average
    # the expected rate prices the fixed part once per ask
    fixed, per_token = s.ask_time(), s.draft_time()
    tokens = s._expected_tokens(state, 6, 0)
    p = s.draft_probability(state)
    drafted = fixed + 6 * per_token + s.verify_time(7)
    empty = s.costs.empty_time(0) + s.verify_time(1)
    assert s.expected_rate(state, 6) == pytest.approx((p * tokens + 1 - p) / (p * drafted + (1 - p) * empty))


def test_proportional_asks_have_no_fixed_cost():
    s = AdaptivePlanner(max_gamma=4)
    state = start(s)
    observe(s, state, 1, 1, 0.5, 0.030)  # a request's first ask: not timed
    for step in range(12):
        n = 1 + step % 4
        observe(s, state, n, n, 0.002 * n, 0.030)
    assert s.ask_time() == pytest.approx(0.0, abs=1e-6) and s.draft_time() == pytest.approx(0.002)


def test_longer_asks_timed_while_the_machine_was_busy_do_not_make_drafting_dear():
    """Asks of one token at 20 ms and a few of two tokens timed at 60 ms (the machine busy): the least-squares line
    would cross zero below the origin and charge 40 ms a drafted token; the line through the origin is used."""
    s = AdaptivePlanner(max_gamma=4)
    state = start(s)
    observe(s, state, 1, 1, 0.5, 0.030)  # a request's first ask: not timed
    for step in range(12):
        n = 2 if step % 4 == 3 else 1
        observe(s, state, n, n, 0.020 if n == 1 else 0.060, 0.030)
    assert s.ask_time() == 0.0
    assert s.draft_time() < 0.030  # at most the average per drafted token, not the slope of 40 ms


def test_an_unmeasured_pass_is_priced_from_the_measured_ones_below_it():
    """Passes over 2 to 4 tokens measured at the price of one (a memory-bound machine): a pass over 5 is priced from
    them along the curve, not at the curve's own c(5), which would keep the planner from ever trying it."""
    s = AdaptivePlanner(max_gamma=8)  # no profile: the default curve, 0.1 a row
    state = start(s)
    assert s.costs.ratio(5) == pytest.approx(1.4)
    for _ in range(10):
        observe(s, state, 0, 0, 0.0, 0.030)
        for g in (1, 2, 3):
            observe(s, state, g, g, 0.0, 0.030)
    assert s.costs.ratio(4) == pytest.approx(1.0, abs=0.1)
    assert s.costs.ratio(5) == pytest.approx(s.costs.ratio(4) + 0.1)
    assert s.costs.ratio(6) == pytest.approx(s.costs.ratio(4) + 0.2)
    for _ in range(20):  # then measured at 2.0: its own measurements win
        observe(s, state, 4, 4, 0.0, 0.060)
    assert s.costs.ratio(5) > 1.8 and s.costs.ratio(6) == pytest.approx(s.costs.ratio(5) + 0.1)


def test_two_sources_with_gamma_auto_draft_with_the_source_that_pays():
    """ngram-like drafter first, always wrong; an oracle second. With gamma auto the first is judged on its own
    record and stops being used (probes aside), the oracle drafts long; the output equals plain decoding."""
    target = ToyModel.random(6, seed=3)
    sources = [WrongDrafter(ToyModel.random(6, seed=3)), OracleDrafter(ToyModel.random(6, seed=3))]
    plain = Engine(target, NoDrafter()).generate([1], max_new_tokens=600, eos_token_ids=[])
    result = Engine(target, sources, gamma=SyntheticTimes(max_gamma=8)).generate(
        [1], max_new_tokens=600, eos_token_ids=[]
    )
    assert result.token_ids == plain.token_ids
    by = result.stats.by_drafter
    assert by["oracle"]["accepted"] == by["oracle"]["drafted"] > 450
    assert by.get("wrong", {"steps": 0})["steps"] <= 3
    assert result.stats.gamma_histogram.get(8, 0) >= 0.7 * result.stats.target_passes
    assert "by drafter: oracle" in result.stats.summary()


# ---- the fixed planner, drafts cut at a confidence, empty drafts ---------------------------------------------


def test_fixed_gamma_asks_for_gamma_tokens_within_the_limit():
    calls = []
    drafter = Scripted("s", lambda context, k: calls.append(k) or draft_of(k))
    p = FixedPlanner(4)
    state = p.new_state([drafter])
    assert len(p.draft(state, [1], 10, GREEDY, None).draft) == 4
    assert len(p.draft(state, [1], 2, GREEDY, None).draft) == 2
    assert calls == [4, 2]
    assert p.draft(state, [1], 0, GREEDY, None).reason == "budget"
    assert FixedPlanner(0).draft(state, [1], 5, GREEDY, None).reason == "schedule"
    assert calls == [4, 2]  # neither asks the drafter
    with pytest.raises(ValueError, match="gamma must be"):
        FixedPlanner(-1)


def test_fixed_gamma_chooses_between_two_sources_by_their_measured_acceptance():
    """Both propose; the source whose drafts were accepted more drafts; a later source is not even asked when it
    cannot beat the draft in hand with all k tokens."""
    first, second = Scripted("a", lambda c, k: draft_of(k)), Scripted("b", lambda c, k: draft_of(k))
    p = FixedPlanner(4)
    state = p.new_state([first, second])
    p.begin(state)
    proposal = p.draft(state, [1], 10, GREEDY, None)
    assert proposal.source == 0 and second.asks == 0  # same prior: b cannot do better than a's 4 tokens
    for _ in range(8):
        p.observe(state, Proposal(draft_of(4), 0), 0, 0.01)  # a's drafts all rejected
    proposal = p.draft(state, [1], 10, GREEDY, None)
    assert proposal.source == 1 and second.asks == 1
    p.begin(state)  # a new request starts from the prior again
    assert p.draft(state, [1], 10, GREEDY, None).source == 0


def test_a_sampled_draft_is_used_as_drawn():
    """Choosing among sampled drafts by what they contain would bias them away from q: a sampled draft is taken as
    soon as it is drawn, even when a later source has the better record."""
    sampled = Draft(np.array([1, 2]), np.full((2, 4), 0.25, dtype=np.float32))
    first, second = Scripted("a", lambda c, k: sampled), Scripted("b", lambda c, k: draft_of(k))
    p = FixedPlanner(4)
    state = p.new_state([first, second])
    for _ in range(8):
        p.observe(state, Proposal(draft_of(4), 0), 0, 0.01)  # a's drafts rejected: b could do better
    proposal = p.draft(state, [1], 10, SamplingParams(temperature=1.0), None)
    assert proposal.source == 0 and proposal.draft is sampled and second.asks == 0


def test_empty_drafts_are_counted_as_no_draft():
    nothing = Scripted("nothing", lambda c, k: None)
    for planner in (FixedPlanner(3), AdaptivePlanner(max_gamma=4)):
        state = planner.new_state([nothing, Scripted("also", lambda c, k: Draft.empty())])
        planner.begin(state)
        proposal = planner.draft(state, [1, 2], 5, GREEDY, None)
        assert len(proposal.draft) == 0 and proposal.reason == "no_draft"
    target = ToyModel.random(6, seed=3)
    result = Engine(target, nothing, gamma=3).generate([1], max_new_tokens=5, eos_token_ids=[])
    assert result.stats.plain_step_reasons == {"no_draft": 4, "budget": 1}


def test_a_draft_is_cut_where_its_confidence_falls_below_the_stop_level():
    confident = Draft([5, 6, 7, 8], confidence=[0.9, 0.8, 0.5, 0.9])
    drafter = Scripted("c", lambda c, k: confident)
    p = FixedPlanner(4, stop=0.5)
    state = p.new_state([drafter])
    assert p.draft(state, [1], 10, GREEDY, None).draft.tokens.tolist() == [5, 6]  # 0.9 * 0.8 * 0.5 < 0.5
    assert FixedPlanner(4).draft(state, [1], 10, GREEDY, None).draft is confident  # stop 0: never cut
    sure = FixedPlanner(4, stop=0.95)
    proposal = sure.draft(state, [1], 10, GREEDY, None)
    assert len(proposal.draft) == 0 and proposal.reason == "low_confidence"


def test_prompt_lookup_is_held_back_by_the_measured_acceptance_of_its_match_length():
    """The planner measures the first token's acceptance per Draft.kind (the n-gram's match length): a match length
    whose first token keeps being rejected falls below the stop level and is held back; a longer one with a good
    record is still drafted; each request starts again from the prior."""
    d = NgramDrafter(max_ngram=3)
    p = FixedPlanner(4, stop=0.3)
    state = p.new_state([d])
    p.begin(state)
    one = [7, 1, 2, 8, 2]  # suffix [2] matches (one token), [8, 2] and [1, 8, 2] do not
    three = [4, 5, 6, 9, 4, 5, 6]  # suffix [4, 5, 6] matches
    proposal = p.draft(state, one, 4, GREEDY, None)
    assert proposal.draft.tokens.tolist() == [8, 2] and proposal.draft.kind == 1
    p.observe(state, proposal, 0, 0.01)
    assert p.draft(state, one, 4, GREEDY, None).draft.tokens.tolist() == [8, 2]  # 1/3 is still above 0.3
    p.observe(state, proposal, 0, 0.01)
    held = p.draft(state, one, 4, GREEDY, None)
    assert len(held.draft) == 0 and held.reason == "low_confidence"
    p.observe(state, held, 0, 0.01)  # nothing was verified: nothing to learn
    assert len(p.draft(state, one, 4, GREEDY, None).draft) == 0
    d.begin([])  # another context, same request: the record of one-token matches stands
    assert p.draft(state, three, 4, GREEDY, None).draft.tokens.tolist() == [9, 4, 5, 6]
    p.begin(state)
    assert p.draft(state, one, 4, GREEDY, None).draft.tokens.tolist() == [8, 2]


def test_low_confidence_plain_steps_are_counted_and_output_is_unchanged(models):  # noqa: F811 (the fixture)
    prompt = [1, 5, 9, 2, 1, 5, 9, 2, 1, 5]
    plain = Engine(models.target, NoDrafter()).generate(prompt, GREEDY, 24, eos_token_ids=[])
    strict = Engine(models.target, NgramDrafter(), gamma=FixedPlanner(4, stop=0.99))  # above the prior: held back
    result = strict.generate(prompt, GREEDY, 24, eos_token_ids=[])
    assert result.token_ids == plain.token_ids
    assert result.stats.drafted == 0
    assert result.stats.plain_step_reasons.get("low_confidence", 0) > 0


def test_the_adaptive_planner_passes_its_stop_level_to_the_drafter():
    seen = []

    class Listening(Drafter):
        name = "listening"

        def propose(self, context, k, params, generator, stop=0.0) -> Draft:
            seen.append(stop)
            return draft_of(k)

    p = AdaptivePlanner(max_gamma=4)
    state = start(p)
    state = p.new_state([Listening()])
    p.begin(state)
    p.draft(state, [1], 8, GREEDY, None)
    assert seen == [pytest.approx(p.stop_level())] and 0 < seen[0] < 1


def test_shared_passes_are_measured_apart_from_passes_of_one_sequence():
    """Rows of several sequences (each reading its own cache) cost more than as many rows of one: what shared
    passes measure moves the estimate used when planning for a shared pass, not the one used alone."""
    s = AdaptivePlanner(cost_curve={1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3})
    s.costs.observe_pass(1, 0.010)  # a plain step alone: the unit
    alone = s.verify_time(3)
    for _ in range(30):
        s.observe_pass(3, 0.020)  # shared passes of 3 rows: twice a plain step
    assert s.verify_time(3) == pytest.approx(alone)
    assert s.verify_time(3, Shared(rows=2)) == pytest.approx(0.020, rel=0.1)  # planning for a shared pass


def test_an_ask_that_catches_up_on_the_context_is_not_timed(monkeypatch):
    """A draft model asked after plain steps first takes in the tokens of those steps (its Draft.intake): that
    ask's time is not what a drafted token costs, and counting it made a draft model look too dear to ask again (so
    it caught up on more tokens the next time: on Qwen2.5-Coder-1.5B with its 0.5B sibling, 27 ms per drafted token
    measured against 16-19 ms)."""
    import specwise.planner as planner_module

    clock = [0.0]
    monkeypatch.setattr(planner_module.time, "perf_counter", lambda: clock[0])

    class Timed(Drafter):
        name = "timed"

        def __init__(self):
            self.cost, self.catch_up = 0.0, 0

        def _forked(self, target):
            pass

        def propose(self, context, k, params, generator, stop=0.0):
            clock[0] += self.cost
            return Draft(np.zeros(k, dtype=np.int64), intake=self.catch_up)

    drafter = Timed()
    s = AdaptivePlanner(max_gamma=2)
    state = s.new_state([drafter])
    s.begin(state)
    params = SamplingParams()
    for cost, catch_up in ((0.5, 200), (0.002, 2), (0.080, 40)):  # the prompt, a typical ask, a catch-up
        drafter.cost, drafter.catch_up = cost, catch_up
        proposal = s.draft(state, [1, 2, 3], 2, params, None)
        assert len(proposal.draft) == 2
        s.observe(state, proposal, 2, 0.01)
    assert s.draft_time() == pytest.approx(0.001)  # only the typical ask: 2 ms for 2 tokens


def test_the_model_drafter_reports_what_it_caught_up_on():
    drafter = ModelDrafter(ToyModel(np.random.default_rng(0).standard_normal((1, 16, 16))))
    context = list(range(10))
    drafter.begin(context)
    first = drafter.propose(context, 3, SamplingParams(), None)
    assert first.intake == 10  # the prompt
    context += first.ids + [5]  # all accepted, then the bonus token
    assert drafter.propose(context, 3, SamplingParams(), None).intake == 2  # its own last draft and the bonus
    context += [15, 14, 13, 12]  # four plain steps it was not asked in (it may have drafted the first of them)
    assert drafter.propose(context, 3, SamplingParams(), None).intake >= 4 > AdaptivePlanner.CATCH_UP
    assert drafter.propose(context, 3, SamplingParams(), None).prefix(1).intake == 1  # a cut draft keeps it


def test_a_source_whose_intake_costs_more_than_it_saves_is_not_asked(monkeypatch):
    """A draft model must take in the prompt before its first draft of a request. Once the cost of taking in a token
    is measured, the planner skips the source while taking in what it lacks would cost more than drafting with it
    saves over the tokens left (a long prompt, a short answer), and probes it only while that intake is small."""
    import specwise.planner as planner_module

    clock = [0.0]
    monkeypatch.setattr(planner_module.time, "perf_counter", lambda: clock[0])

    class Lagging(Drafter):
        name = "lagging"

        def __init__(self):
            self.fed, self.asks = 0, 0

        def _forked(self, target):
            pass

        def pending(self, context):
            return len(context) - self.fed

        def propose(self, context, k, params, generator, stop=0.0):
            intake = len(context) - self.fed
            clock[0] += 0.002 * intake + 0.001 * k  # 2 ms a token taken in, 1 ms a drafted token
            self.fed, self.asks = len(context) + k - 1, self.asks + 1  # as a draft model: all but its last draft
            return Draft(np.zeros(k, dtype=np.int64), intake=intake)

    drafter = Lagging()
    s = AdaptivePlanner(max_gamma=3)
    state = s.new_state([drafter])
    s.begin(state)
    params = SamplingParams()
    context = list(range(20))
    for _ in range(30):  # a short prompt: drafted from, everything accepted, 10 ms a pass
        proposal = s.draft(state, context, 100, params, None)
        s.observe(state, proposal, len(proposal.draft), 0.010)
        context += [0] * len(proposal.draft) + [1]  # the drafts (zeros) accepted, then the bonus token
    assert drafter.asks >= 25 and s.costs._intake_seconds[0] == pytest.approx(0.002, rel=0.3)
    asks = drafter.asks
    context += list(range(3000))  # 3,000 tokens to take in (6 s) for 10 tokens left: not worth it
    for _ in range(10):
        proposal = s.draft(state, context, 10, params, None)
        assert not len(proposal.draft)
        s.observe(state, proposal, 0, 0.010)
        context.append(1)
    assert drafter.asks == asks
    # 5,000 tokens allowed say nothing of what will come: the answer so far is a typical one, and it is not asked
    proposal = s.draft(state, context, 5000, params, None)
    assert not len(proposal.draft) and drafter.asks == asks
    produced = state.answer.produced
    for _ in range(3000):  # the answer runs on: once what it produced outweighs the intake, the drafter is asked
        s.observe(state, proposal, 0, 0.010)
        context.append(1)
        proposal = s.draft(state, context, 5000, params, None)
        if len(proposal.draft):
            break
    assert len(proposal.draft) and drafter.asks == asks + 1
    assert 500 < state.answer.produced - produced < 3000


def test_the_answer_to_come_is_the_typical_answer_or_as_long_as_the_answer_so_far():
    """What a drafter's intake is weighed against: the median of the last answers' lengths less what the answer in
    progress produced, or as much as it produced, never more than the tokens left; the lengths are counted per
    request (a request with a prediction shares its sequence's count)."""
    s = AdaptivePlanner(max_gamma=3)
    state = start(s)
    assert s.to_come(state, 10_000) == AdaptivePlanner.PRIOR_ANSWER  # nothing ended yet
    for answer in (30, 40, 50):
        s.begin(state)
        for _ in range(answer):
            observe(s, state, 0, 0, 0.0, 0.010)
        assert state.answer.produced == answer
    s.begin(state)  # the third answer ended too
    assert s.costs.answer_tokens() == 40 and state.answer.produced == 0
    assert s.to_come(state, 10_000) == 40 and s.to_come(state, 25) == 25
    for _ in range(30):
        observe(s, state, 0, 0, 0.0, 0.010)
    assert s.to_come(state, 10_000) == 30  # as much as it produced, past the typical answer's rest (10)
    for _ in range(40):
        observe(s, state, 0, 0, 0.0, 0.010)
    assert s.to_come(state, 10_000) == 70
    with_prediction = s.for_request(state, NoDrafter())
    assert with_prediction.answer is state.answer


def test_pass_costs_are_estimated_per_thread_count():
    """A busy machine moves the target between two threads and one (models/threads.py): the planner keeps what a
    pass costs apart for each count, returns to a count's estimates when the count comes back, and a pass tried on
    the other count does not move the estimates of the count in use."""
    s = AdaptivePlanner(max_gamma=4)
    state = start(s)
    s.use_threads(2)
    for _ in range(20):
        observe(s, state, 0, 0, 0.0, 0.010)  # plain steps: 10 ms a pass on two threads
        observe(s, state, 3, 3, 0.0, 0.013)  # 4-token passes: 13 ms
    two = pass_times(s)
    assert two[0] == pytest.approx(0.010, rel=0.05) and two[3] == pytest.approx(0.013, rel=0.05)
    s.use_threads(1)  # a new count starts from the priors, not from the other count's times
    assert s.costs.scale is None
    for _ in range(20):
        observe(s, state, 0, 0, 0.0, 0.017)
        observe(s, state, 3, 3, 0.0, 0.030)  # one thread: a steeper curve
    one = pass_times(s)
    assert one[0] == pytest.approx(0.017, rel=0.05) and one[3] == pytest.approx(0.030, rel=0.05)
    s.use_threads(2)
    assert pass_times(s) == two  # the two-thread estimates, as they were
    s.use_threads(1)  # a try on one thread: its pass goes to the one-thread estimates only
    observe(s, state, 0, 0, 0.0, 0.050)
    s.use_threads(2)
    assert pass_times(s) == two
    s.use_threads(None)  # unknown (a model without a governor): nothing changes
    assert pass_times(s) == two


def test_the_engine_tells_the_planner_each_pass_thread_count():
    """The engine plans on the governor's count in use and books each pass under the count it ran on (a try of
    the other count included), in a batch too."""
    from specwise.batch import BatchEngine, Request

    class Governor:
        def __init__(self):
            self.last, self.passes = None, 0

        def in_use(self):
            return 2

    class Target(ToyModel):
        def forward(self, tokens, num_logits=None):
            out = super().forward(tokens, num_logits)
            self.governor.passes += 1
            self.governor.last = 1 if self.governor.passes % 3 == 0 else 2  # every third pass a try on one
            return out

    for batched in (False, True):
        target = Target.random(16, seed=1)
        target.governor = Governor()
        engine = Engine(target, NgramDrafter(), gamma="auto")
        seen = []
        use = engine.planner.use_threads
        engine.planner.use_threads = lambda n, use=use, seen=seen: (seen.append(n), use(n))[1]
        if batched:

            def forward_batch(items, keeps, t=target):
                out = [m.forward(tokens, keep) for (m, tokens), keep in zip(items, keeps)]
                t.governor.passes += 1
                t.governor.last = 1 if t.governor.passes % 3 == 0 else 2
                return out

            target.forward_batch = forward_batch
            BatchEngine(engine, max_batch=1).run_all([Request([1, 2, 3], SamplingParams(), 12)])
        else:
            engine.generate([1, 2, 3], SamplingParams(), max_new_tokens=12)
        assert 1 in seen and 2 in seen
        assert set(engine.planner.costs._by_threads) | {engine.planner.costs._threads} == {1, 2}


def test_a_source_of_copies_learns_from_the_draft_that_beat_it():
    """Two sources of copies proposing the same text: the one whose draft is verified learns as always, the other
    (judged against it) learns how far its own draft was right, so its record does not stay at the prior."""
    from specwise.planner import _judged_alternative

    assert _judged_alternative([1, 2, 3], [1, 2, 3, 4], 4) == (3, 3)  # shorter, all agreeing with kept tokens
    assert _judged_alternative([1, 2, 9], [1, 2, 3, 4], 4) == (3, 2)  # differs from a kept token: wrong there
    assert _judged_alternative([1, 2, 3, 4], [1, 2, 3], 1) == (2, 1)  # repeats the rejected token
    assert _judged_alternative([1, 2, 9], [1, 2, 3], 2) == (2, 2)  # differs where the target chose: unknown
    assert _judged_alternative([1, 2, 3, 4], [1, 2], 2) == (2, 2)  # past the verified draft: unknown
    assert _judged_alternative([7], [1, 2], 0) == (0, 0)  # the chosen draft's first token was rejected

    target = ToyModel.random(6, seed=3)

    class Copy(OracleDrafter):
        copies = True

    class ShortCopy(Copy):  # right, but one token at a time: the long copy after it is asked and verified
        def propose(self, context, k, params, generator, stop=0.0) -> Draft:
            return super().propose(context, min(k, 1), params, generator, stop)

    first, second = ShortCopy(ToyModel.random(6, seed=3)), Copy(ToyModel.random(6, seed=3))
    first.name, second.name = "first", "second"
    planner = SyntheticTimes(max_gamma=8)
    engine = Engine(target, [first, second], gamma=planner)
    result = engine.generate([1], max_new_tokens=200, eos_token_ids=[])
    plain = Engine(target, NoDrafter()).generate([1], max_new_tokens=200, eos_token_ids=[])
    assert result.token_ids == plain.token_ids
    state = engine._state
    assert result.stats.by_drafter["second"]["steps"] > result.stats.by_drafter.get("first", {"steps": 0})["steps"]
    for source in range(2):  # both records learned that the copies are right, whichever was verified
        assert planner.acceptance(state, source)[0] > 0.85  # the prior is 0.5


def test_a_draft_in_hand_is_valued_by_the_acceptance_of_its_kind():
    """Prompt lookup's record is made by its long matches; a one-token match (Draft.kind 1) whose first tokens keep
    being rejected is valued by its kind's record, cut to its best prefix, and loses to another source's
    draft, as on Qwen2.5-Coder-1.5B where ``ngram+model:default`` verified 11- to 25-token drafts of one-token
    matches, rejected at their first token, instead of the draft model's."""
    s = AdaptivePlanner(max_gamma=8, probe_every=1000)
    state = start(s, sources=2)
    feed(s, state, 40, lambda i: True, cost)  # source 0's record: its drafts are right
    weak = state.known[0].kind(1)
    for _ in range(20):
        weak[0].add(0.0)
    long = Draft(np.arange(8, dtype=np.int64), kind=1)
    assert s.draft_rate(state, 8, 0, kind=1) < s.draft_rate(state, 8, 0)
    cut = s.best_prefix(state, 0, long)
    assert 1 <= len(cut) < 8 and cut.kind == 1 and cut.tokens.tolist() == long.tokens.tolist()[: len(cut)]
    assert s.best_prefix(state, 0, Draft(np.arange(8, dtype=np.int64), kind=3)).tokens.tolist() == list(range(8))
    assert s.best_prefix(state, 0, draft_of(8)) is not None  # no kind: as drafted
    assert len(s.best_prefix(state, 0, draft_of(8))) == 8

    class Lookup(Scripted):
        copies = True

    lookup = Lookup("ngram", lambda c, k: Draft(np.arange(k, dtype=np.int64), kind=1))
    model = Scripted("model", lambda c, k: Draft(np.full(k, 7, dtype=np.int64)))
    state.sources[:] = [lookup, model]
    state.known[1].positions = [Rate(0.7, 10.0, 0.95) for _ in state.known[1].positions]
    proposal = s.draft(state, [1, 2, 3], 32, GREEDY, None)
    assert proposal.source == 1 and model.asks == 1  # the one-token match no longer beats the draft model
    assert [(a[0], a[2]) for a in proposal.alternatives] == [(0, 1)]


def test_a_source_of_copies_learns_its_kinds_first_token_from_the_draft_that_beat_it():
    s = AdaptivePlanner(max_gamma=4)
    state = start(s, sources=2)
    before = s.kind_acceptance(state, 0, 2)[0]
    chosen = Proposal(Draft(np.array([5, 6], dtype=np.int64)), 1, alternatives=[(0, [9, 9], 2)])
    s.observe(state, chosen, 2, 0.01)  # the target kept 5: the copy's first token (9) was wrong
    assert s.kind_acceptance(state, 0, 2)[0] < before
    right = Proposal(Draft(np.array([5, 6], dtype=np.int64)), 1, alternatives=[(0, [5, 6], 2)])
    low = s.kind_acceptance(state, 0, 2)[0]
    s.observe(state, right, 2, 0.01)
    assert s.kind_acceptance(state, 0, 2)[0] > low


def test_a_draft_that_lost_is_judged_by_the_token_the_target_chose_after_the_kept_ones():
    """A deterministic draft is accepted where it agrees with what the target emits (greedy: the argmax; sampled, the
    coupled rule: the token drawn with the position's own uniform, whatever was drafted), so a copy whose draft lost
    is judged one token past the kept ones too, by the target's own choice there (told to the planner as
    ``following``). Without it, a copy that differed from the verified draft's rejected token stayed unjudged: on
    Qwen2.5-Coder-1.5B at T 0.7 (Spec-Bench coding, three seeds) a quarter of prompt lookup's one-token matches that
    lost to the draft model went unjudged, and those judged were right 27% of the time, 24% by the emitted tokens."""
    from specwise.planner import _judged_alternative

    assert _judged_alternative([7, 8], [1, 2], 0, 7) == (1, 1)  # the target chose the copy's token: right
    assert _judged_alternative([7], [1, 2], 0, 8) == (1, 0)  # it chose another: wrong
    assert _judged_alternative([1, 2, 5, 6], [1, 2], 2, 5) == (3, 3)  # the bonus token judges one more
    assert _judged_alternative([1, 2, 3], [1, 2, 3], 1, 9) == (2, 1)  # repeats the rejected token
    assert _judged_alternative([7], [1, 2], 0) == (0, 0)  # not told: unknown, as before

    s = AdaptivePlanner(max_gamma=4)
    state = start(s, sources=2)
    lost = Proposal(Draft(np.array([5, 6], dtype=np.int64)), 1, alternatives=[(0, [9, 9], 1)])
    for _ in range(6):  # the draft model's 5 rejected, the target chose 9: the copy would have been kept
        s.observe(state, lost, 0, 0.01, following=9)
    assert s.kind_acceptance(state, 0, 1)[0] > 0.8 and s.acceptance(state, 0)[0] > 0.8

    class Told(SyntheticTimes):  # the emitted tokens, step by step, as the planner is told them
        def observe(self, state, proposal, accepted, seconds, forced=0, following=None):
            self.emitted += [*proposal.draft.ids[:accepted], following]
            super().observe(state, proposal, accepted, seconds, forced, following)

    target = ToyModel.random(6, seed=3)
    for params in (GREEDY, SamplingParams(temperature=0.8, seed=1)):
        for drafter in (OracleDrafter(ToyModel.random(6, seed=3)), WrongDrafter(ToyModel.random(6, seed=3))):
            planner = Told(max_gamma=4)
            planner.emitted = []
            result = Engine(target, drafter, gamma=planner).generate([1], params, 40, eos_token_ids=[])
            assert planner.emitted == result.token_ids


def test_a_kind_of_draft_is_valued_by_its_own_record_at_every_position():
    """A kind not seen yet is valued as its source's drafts are (prompt lookup's copies, mostly rejected under
    sampling, do not start each match length at 0.5), and a kind's record covers the positions after its first: a
    one-token match whose first token is kept and whose continuation is not (a sampled token that happens to
    recur) is valued below the source's long runs after its first token too. What a kind learnt is carried to the
    next request as the source's record is, a prior worth at most ``carry`` observations."""
    s = AdaptivePlanner(max_gamma=8, probe_every=1000, carry=4.0)
    state = start(s)
    feed(s, state, 40, lambda i: False, cost)
    first = s.acceptance(state, 0)[0]
    assert first < 0.2 and s.kind_acceptance(state, 0, 3)[0] == pytest.approx(first)

    short = Proposal(Draft(np.arange(4, dtype=np.int64), kind=1), 0)
    long = Proposal(Draft(np.arange(4, dtype=np.int64), kind=3), 0)
    for _ in range(10):
        s.observe(state, short, 1, None)  # first token kept, the second rejected (the pass not timed)
        s.observe(state, long, 4, None)  # all kept
    accept = s.kind_acceptance(state, 0, 1)
    assert accept[0] > 0.8 and accept[1] < 0.3 < s.acceptance(state, 0)[1] < 0.8 < s.kind_acceptance(state, 0, 3)[1]
    assert s.draft_rate(state, 4, 0, kind=1) < s.draft_rate(state, 4, 0) < s.draft_rate(state, 4, 0, kind=3)
    assert len(s.best_prefix(state, 0, short.draft)) <= 2
    s.begin(state)
    assert state.known[0].kinds[1][0].count == pytest.approx(4.0) and s.kind_acceptance(state, 0, 1)[1] < 0.3


def test_drafting_that_looked_dear_under_a_load_spike_is_measured_again_once_the_spike_is_over():
    """Asks timed while the machine was loaded make drafting look dearer than a plain step: the stop level reaches 1
    and the planner takes plain steps. Its probes must still draft their token whatever its confidence (a probe cut
    by the stop level would be an empty ask, which never times a drafted token), so once the load is gone the
    drafting time is measured again and drafting resumes."""
    delay = [0.015]  # per drafted token

    def script(context, k):
        if delay[0]:
            time.sleep(delay[0] * k)
        return Draft(list(range(5, 5 + k)), confidence=[0.9] * k)

    p = AdaptivePlanner(max_gamma=4, probe_every=4)
    state = p.new_state([Scripted("model", script)])
    p.begin(state)

    def step():
        proposal = p.draft(state, [1], 64, GREEDY, None)
        drafted = len(proposal.draft)
        p.observe(state, proposal, drafted, 0.01 * cost(drafted + 1))  # every drafted token accepted
        return drafted

    for _ in range(6):  # loaded: each drafted token takes 15 ms against a 10 ms pass
        step()
    assert p.stop_level() == 1.0
    delay[0] = 0.0  # the load is gone
    drafted = [step() for _ in range(200)]
    assert sum(d >= 2 for d in drafted[150:]) >= 45, drafted
