"""Continuous batching: each request's output is the one it gets alone, whatever shares its passes."""

from __future__ import annotations

import numpy as np
import pytest
from test_engine import chi2_pvalue, exact_joint

from specwise.batch import BatchEngine, Request
from specwise.drafters import Draft, Drafter, NgramDrafter, NoDrafter
from specwise.engine import Engine
from specwise.models.quantized import QuantizedModel
from specwise.models.toy import ToyModel
from specwise.planner import AdaptivePlanner, Shared
from specwise.sampling import SamplingParams

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    pytest.importorskip("gguf")
    from specwise.models.kernels import quant

    if not quant.quantized_available():
        pytest.skip("the native quantized kernels are not built")
    from test_quantized_model import VARIANTS, write_gguf

    path = tmp_path_factory.mktemp("batch") / "tiny.gguf"
    write_gguf(path, VARIANTS["llama-Q4_1"])
    return path


def prompts(n: int, vocab: int = 100, seed: int = 0) -> list[list[int]]:
    """Prompts of different lengths, some repetitive (prompt lookup drafts there)."""
    gen = np.random.default_rng(seed)
    out = []
    for i in range(n):
        base = gen.integers(0, vocab, 3 + i % 4).tolist()
        out.append((base * (1 + i % 3))[: 2 + 3 * i])
    return out


def solo(engine: Engine, request: Request) -> list[int]:
    return engine.generate(request.prompt_ids, request.params, request.max_new_tokens, request.stop).token_ids


def batched(engine: Engine, requests: list[Request], max_batch: int = 8, **kw) -> list[list[int]]:
    events = BatchEngine(engine, max_batch=max_batch, **kw).run_all(requests)
    return [[t for e in evs for t in e.token_ids] for evs in events]


@pytest.mark.parametrize("precision", ["exact", "q8"])
@pytest.mark.parametrize("gamma", [0, 3, "auto"])
def test_greedy_batch_equals_solo(gguf_path, precision, gamma):
    model = QuantizedModel(gguf_path, precision=precision)
    drafter = NoDrafter() if gamma == 0 else NgramDrafter()
    engine = Engine(model, drafter, gamma=gamma)
    requests = [Request(p, GREEDY, max_new_tokens=12 + 3 * i) for i, p in enumerate(prompts(6))]
    want = [solo(Engine(QuantizedModel(gguf_path, precision=precision), NgramDrafter(), 2), r) for r in requests]
    assert batched(engine, requests) == want
    # fewer slots than requests: the rest wait and join as slots free
    assert batched(Engine(model, drafter, gamma=gamma), requests, max_batch=2, prefill_chunk=3) == want


@pytest.mark.parametrize("gamma", [0, 2, 4, "auto"])
def test_seeded_sampling_batch_equals_solo_and_plain(gguf_path, gamma):
    """Under the coupled rule a seeded request's tokens are those of plain seeded sampling, whatever gamma, the
    drafts or the batch."""
    model = QuantizedModel(gguf_path)
    params = [SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=s) for s in range(5)]
    requests = [Request(p, params[i], max_new_tokens=16) for i, p in enumerate(prompts(5, seed=1))]
    plain = Engine(QuantizedModel(gguf_path), NoDrafter(), gamma=0)
    want = [solo(plain, r) for r in requests]
    engine = Engine(model, NoDrafter() if gamma == 0 else NgramDrafter(), gamma=gamma)
    assert [solo(engine, r) for r in requests] == want
    assert batched(engine, requests, max_batch=3) == want


def test_sampled_batch_is_in_distribution():
    """A batch's sampled outputs follow the target's joint distribution (toy model, enumerated)."""
    model = ToyModel.random(4, seed=3)
    params = SamplingParams(temperature=1.0)
    prompt, length, n = [1, 2], 3, 3000
    engine = Engine(model, NgramDrafter(max_ngram=2), gamma=2)
    counts: dict = {}
    batch = BatchEngine(engine, max_batch=8)
    for out in batch.run_all([Request(prompt, params, max_new_tokens=length) for _ in range(n)]):
        seq = tuple(t for e in out for t in e.token_ids)
        counts[seq] = counts.get(seq, 0) + 1
    assert chi2_pvalue(counts, exact_joint(model, prompt, params, length), n) > 1e-3


def test_joins_between_steps_and_cancel(gguf_path):
    model = QuantizedModel(gguf_path)
    engine = Engine(model, NgramDrafter(), gamma=3)
    reference = Engine(QuantizedModel(gguf_path), NoDrafter(), gamma=0)
    ps = prompts(4, seed=2)
    batch = BatchEngine(engine, max_batch=4)
    got: dict[int, list[int]] = {}
    first = batch.submit(Request(ps[0], GREEDY, 20))
    doomed = batch.submit(Request(ps[1], GREEDY, 20))
    ids = {first: 0, doomed: 1}
    steps = 0
    while batch.has_work():
        if steps == 2:  # a request joins while others are mid-answer
            ids[batch.submit(Request(ps[2], GREEDY, 20))] = 2
        if steps == 3:
            batch.cancel(doomed)
        for rid, event in batch.step().events:
            got.setdefault(rid, []).extend(event.token_ids)
        steps += 1
        assert steps < 200
    assert got[first] == solo(reference, Request(ps[0], GREEDY, 20))
    late = next(r for r, i in ids.items() if i == 2)
    assert got[late] == solo(reference, Request(ps[2], GREEDY, 20))
    assert len(got.get(doomed, [])) < 20  # stopped early
    assert batch.running == 0 and batch.waiting == 0


def test_cancel_a_queued_request_and_bad_requests(gguf_path):
    engine = Engine(QuantizedModel(gguf_path), NgramDrafter(), gamma=2)
    batch = BatchEngine(engine, max_batch=1)
    a = batch.submit(Request([1, 2, 3], GREEDY, 5))
    b = batch.submit(Request([4, 5, 6], GREEDY, 5))
    assert batch.waiting == 2
    batch.cancel(b)
    assert batch.waiting == 1
    with pytest.raises(ValueError, match="prompt is empty"):
        batch.submit(Request([], GREEDY, 5))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        batch.submit(Request([10**6], GREEDY, 5))
    with pytest.raises(ValueError, match="max_new_tokens"):
        batch.submit(Request([1], GREEDY, 0))
    done = [rid for rid, e in _drain(batch) if e.finish_reason is not None]
    assert done == [a]
    with pytest.raises(ValueError, match="max_batch"):
        BatchEngine(engine, max_batch=0)


def _drain(batch: BatchEngine):
    while batch.has_work():
        yield from batch.step().events


class Always(Drafter):
    """Proposes the token 1, k times."""

    name = "always"

    def propose(self, context, k, params, generator, stop=0.0) -> Draft:
        return Draft(np.ones(k, dtype=np.int64))


def test_planner_drafts_less_when_the_batch_makes_the_pass_dear():
    """With a pass cost flat for a few rows and steep (compute-bound) after, a sequence alone drafts long; in a
    pass that seven other sequences fill, the same sequence drafts less."""
    steep = {k: 1.0 + 0.02 * (k - 1) if k <= 6 else 1.0 + 0.5 * (k - 1) for k in range(1, 80)}
    planner = AdaptivePlanner(cost_curve=steep, prior=0.8)
    state = planner.new_state([Always()])
    planner.begin(state)
    alone = len(planner.draft(state, [1, 2], 16, GREEDY, None).draft)
    full = len(planner.draft(state, [1, 2], 16, GREEDY, None, batch=(7, 7.0)).draft)
    assert alone >= 4 and full < alone
    assert len(planner.draft(state, [1, 2], 16, GREEDY, None, batch=(1, 1.0)).draft) >= 2  # a thin batch


def test_step_reports_its_pass(gguf_path):
    engine = Engine(QuantizedModel(gguf_path), NgramDrafter(), gamma=3)
    batch = BatchEngine(engine, max_batch=4, prefill_chunk=4)
    for p in prompts(4, seed=5):
        batch.submit(Request(p, GREEDY, 8))
    first = batch.step()
    assert first.sequences == 4 and first.rows >= 4 and first.seconds > 0
    while batch.has_work():
        step = batch.step()
        assert step.rows >= step.sequences >= len(step.events)


class Picky(Drafter):
    """Drafts nothing, and fails (a ValueError, as a drafter does for settings it cannot sample) for prompts that
    start with the token 99."""

    name = "picky"

    def _forked(self, target) -> None:
        pass

    def propose(self, context, k, params, generator, stop=0.0) -> Draft:
        if context[0] == 99:
            raise ValueError("cannot draft for this request")
        return Draft.empty()


@pytest.mark.parametrize("where", ["plan", "verify"])
def test_a_request_that_fails_on_its_own_leaves_and_the_others_go_on(gguf_path, where):
    """A ValueError of one request's plan (its drafter) or verification (a temperature so low that its logits
    overflow) ends that request alone, in BatchStep.errors; those sharing its passes finish as if alone."""
    if where == "plan":
        engine, bad = Engine(QuantizedModel(gguf_path), Picky(), gamma=2), SamplingParams(temperature=0.8, seed=1)
        message = "cannot draft"
    else:
        engine, bad = Engine(QuantizedModel(gguf_path), NgramDrafter(), gamma=2), SamplingParams(1e-160, seed=1)
        message = "logits overflow at temperature"
    good = [Request(p, GREEDY, max_new_tokens=10) for p in prompts(3, seed=4)[1:]]
    want = [solo(Engine(QuantizedModel(gguf_path), NoDrafter(), gamma=0), r) for r in good]
    batch = BatchEngine(engine, max_batch=4)
    ids = [batch.submit(r) for r in (good[0], Request([99, 1, 2, 99, 1], bad, 10), good[1])]
    got: dict[int, list[int]] = {rid: [] for rid in ids}
    errors = []
    while batch.has_work():
        step = batch.step()
        errors += step.errors
        for rid, event in step.events:
            got[rid] += event.token_ids
    assert [rid for rid, _ in errors] == [ids[1]] and message in str(errors[0][1])
    assert [got[ids[0]], got[ids[2]]] == want and got[ids[1]] == []
    with pytest.raises(ValueError, match=message):
        BatchEngine(engine).run_all([Request([99, 1, 2], bad, 4)])


class Unforkable(Drafter):
    """A drafter that does not say which of its state is per sequence."""

    def propose(self, context, k, params, generator, stop=0.0) -> Draft:
        return Draft.empty()


def test_a_drafter_that_cannot_fork_is_refused_when_the_batch_is_built():
    engine = Engine(ToyModel.random(4), Unforkable(), gamma=2)
    with pytest.raises(ValueError, match="cannot batch several requests.*Unforkable.*max_batch 1"):
        BatchEngine(engine, max_batch=2)
    assert BatchEngine(engine, max_batch=1).run_all([Request([1, 2], GREEDY, 3)])  # one at a time needs no fork


def test_what_shared_passes_cost_at_some_sizes_informs_the_others():
    """A batch's passes come in few sizes (all plain, or all drafting): what sharing adds, measured at those sizes,
    must reach the sizes a plan weighs and has not tried. With a cost curve of one sequence nearly flat and shared
    passes that cost half a 1-token pass a row (compute-bound), the estimate at an unmeasured size follows the
    measured ones."""
    planner = AdaptivePlanner(cost_curve={1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15})
    costs = planner.costs
    costs.observe_pass(1, 0.010)  # the unit: a plain pass of one sequence

    def true(rows):
        return 0.010 * (1.0 + 0.5 * (rows - 1))

    for _ in range(40):
        for rows in (8, 33):
            planner.observe_pass(rows, true(rows))
    for rows in (12, 20):
        assert costs.verify_time(rows, Shared(rows=7)) == pytest.approx(true(rows), rel=0.2)
    assert costs.verify_time(12) < 0.5 * true(12)  # one sequence's estimate is its own


def test_a_sequence_in_a_full_batch_probes_as_many_times_less_often():
    """A probe (one drafted token, to notice a drafter that became useful) costs a row of the whole batch's pass:
    sharing a pass with seven others, a sequence whose drafter does not pay probes about eight times less often."""
    curve = {k: 1.0 + 0.5 * (k - 1) for k in range(1, 80)}  # every row dear: drafting never pays

    def probes(batch):
        planner = AdaptivePlanner(cost_curve=curve, prior=0.1)
        state = planner.new_state([Always()])
        planner.begin(state)
        planner.costs.observe_pass(1, 0.010)
        count = 0
        for _ in range(640):
            proposal = planner.draft(state, [1, 2], 16, GREEDY, None, batch=batch)
            drafted = len(proposal.draft)
            count += drafted > 0
            planner.observe(state, proposal, 0, None)
        return count

    alone, shared = probes(None), probes((7, 7.0))
    assert alone >= 40
    assert shared <= alone / 6
