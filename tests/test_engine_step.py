"""The one step: a single stream is a batch of one over ``Engine.step``, and what a step reads from the model (its
thread count, whether it keeps features) goes through the Model contract."""

from __future__ import annotations

import pytest

from specwise.batch import BatchEngine, Request
from specwise.drafters import NgramDrafter, NoDrafter
from specwise.engine import Engine, Slot, StepPlan
from specwise.models.base import PassThreads
from specwise.models.threads import ThreadGovernor
from specwise.models.toy import ToyModel
from specwise.planner import AdaptivePlanner
from specwise.sampling import SamplingParams

VOCAB = 50


def _tokens(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


@pytest.mark.parametrize("gamma", [0, 3, "auto"])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9, seed=5)])
def test_a_stream_is_a_batch_of_one(gamma, params):
    """``Engine.stream`` and a batch of one slot run the same step: the same events, token for token."""
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    alone = Engine(ToyModel.random(VOCAB, seed=2), NgramDrafter(), gamma=gamma)
    want = list(alone.stream(prompt, params, max_new_tokens=40, eos_token_ids=[]))
    engine = Engine(ToyModel.random(VOCAB, seed=2), NgramDrafter(), gamma=gamma)
    (got,) = BatchEngine(engine, max_batch=1).run_all([Request(prompt, params, 40, eos_token_ids=[])])
    assert _tokens(got) == _tokens(want) and len(_tokens(want)) == 40
    if gamma == 3:  # the same passes too: a fixed plan does not depend on the timing
        assert [(e.token_ids, e.num_from_draft) for e in got] == [(e.token_ids, e.num_from_draft) for e in want]


def test_step_returns_its_plan_and_result_as_values():
    """``plan`` gives the pass's tokens and what verifying them needs; ``finish_step`` the event and the accepted
    count; nothing rides on the run between them."""
    engine = Engine(ToyModel.random(VOCAB, seed=1), NgramDrafter(), gamma=3)
    slot = Slot(engine.target, engine.planner.new_state(engine.drafters))
    run = engine.begin(slot, engine.check_request(Request([4, 5, 6, 4, 5, 6, 4, 5], max_new_tokens=10)))
    first = engine.step([slot])  # the prompt's prefill: no event
    assert first.events == [] and first.prefill_fed == 7 and run.prefill_done
    plan = engine.plan(run)
    assert isinstance(plan, StepPlan) and plan.tokens[0] == run.context[-1]
    assert plan.tokens[1:] == plan.proposal.draft.ids and plan.forced == [] and plan.masks is None
    logits = run.target.forward(plan.tokens, plan.logits_kept)
    result = engine.finish_step(run, plan, logits, 0.0)
    assert 0 <= result.accepted <= len(plan.proposal.draft)
    assert result.event.token_ids == run.context[8:] and len(result.event.token_ids) == result.accepted + 1
    assert not hasattr(run, "jumped") and not hasattr(run, "masks") and not hasattr(run, "last_accepted")


class _Governed(ToyModel):
    """A toy model with a governor whose choices are scripted: passes in use on 3 threads, the last on 1."""

    def __init__(self, table, **kw) -> None:
        super().__init__(table, **kw)
        self.governor = ThreadGovernor(fixed=True)

    def pass_threads(self) -> PassThreads | None:
        return PassThreads(3, 1 if self.length else None)


class _Spy(AdaptivePlanner):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int | None] = []

    def use_threads(self, threads: int | None) -> None:
        self.threads.append(threads)
        super().use_threads(threads)


def test_the_planner_learns_the_thread_count_through_the_model_contract():
    model = _Governed(ToyModel.random(VOCAB, seed=1).table)
    planner = _Spy()
    engine = Engine(model, NoDrafter(), gamma=planner)
    engine.generate([1, 2, 3], max_new_tokens=3, eos_token_ids=[])
    # before each pass the count in use, after it the one the pass ran on
    assert planner.threads[:2] == [3, 1] and set(planner.threads) == {3, 1}
    batch = BatchEngine(engine, max_batch=1)
    batch.submit(Request([1, 2, 3], max_new_tokens=2, eos_token_ids=[]))
    steps = []
    while batch.has_work():
        steps.append(batch.step())
    assert steps[-1].threads == 1 and steps[-1].pass_seconds > 0
    model.fix_threads(False)
    assert not model.governor.fixed  # the contract's method, not the governor's attribute set from outside


class _NeedsFeatures(NoDrafter):
    needs_features = True


def test_the_engine_asks_the_target_for_features_through_the_contract():
    calls: list[bool] = []

    class Recording(ToyModel):
        def set_keep_features(self, keep: bool) -> None:
            calls.append(keep)
            super().set_keep_features(keep)

    target = Recording(ToyModel.random(VOCAB, seed=1).table)
    Engine(target, _NeedsFeatures(), gamma=0).generate([1, 2], max_new_tokens=2)
    Engine(target, NoDrafter(), gamma=0).generate([1, 2], max_new_tokens=2)
    assert calls == [True, False] and not target.keep_features
