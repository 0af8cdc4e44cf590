"""The batch's prompts: slices chosen by what they cost (a step beside decoding sequences stays within its budget,
a prompt alone goes in whole calls of the layer kernel), prefixes copied from another slot's cache, and the bound on
the memory that the slots' caches hold. None of it changes an output."""

from __future__ import annotations

import gc
import types
import weakref

import numpy as np
import pytest

import specwise.engine as engine_module
from specwise.batch import MAX_STEP_SECONDS, BatchEngine, Request
from specwise.drafters import NgramDrafter
from specwise.engine import Engine
from specwise.models.toy import ToyModel
from specwise.prefill import PrefillCosts, default_cache_memory, kernel_rows, position_bytes
from specwise.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = SamplingParams(temperature=0.0)


# ---- a model whose passes take time on the test's clock ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class Timed(ToyModel):
    """A toy model whose passes take time on a clock of the test's: a pass reads the weights (``WEIGHTS`` seconds)
    and each row costs ``ROW`` seconds and ``SLOPE`` more per position before it (its attention)."""

    WEIGHTS, ROW, SLOPE = 0.010, 0.001, 4e-7

    def __init__(self, table: np.ndarray, clock: Clock, max_length: int | None = None) -> None:
        super().__init__(table, max_length)
        self.clock = clock

    def sequence(self) -> Timed:
        return Timed(self.table, self.clock, self.max_length)

    def _tick(self, spans: list[tuple[int, int]]) -> None:
        rows = sum(k * self.ROW + self.SLOPE * (start * k + k * (k - 1) / 2) for start, k in spans)
        self.clock.now += self.WEIGHTS + rows

    def forward(self, tokens, num_logits=None):
        self._tick([(self.length, len(tokens))])
        return super().forward(tokens, num_logits)

    def forward_batch(self, items, num_logits=None):
        keeps = list(num_logits) if num_logits is not None else [None] * len(items)
        self._tick([(seq.length, len(tokens)) for seq, tokens in items])
        return [ToyModel.forward(seq, tokens, keep) for (seq, tokens), keep in zip(items, keeps)]


@pytest.fixture
def clock(monkeypatch):
    """The engine's clock is the test's: a step's seconds are what its passes took on it."""
    now = Clock()
    monkeypatch.setattr(engine_module, "time", types.SimpleNamespace(perf_counter=now.perf_counter))
    return now


def _tokens(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


def stream_and_long_prompt(stream_tokens: int, seed: int) -> tuple[np.ndarray, Request, Request, list[list[int]]]:
    """A toy model's table, a client's short request of ``stream_tokens`` new tokens, a 1,500-token prompt (drawn
    with ``seed``) asking 3, and the answers each gets alone."""
    table = ToyModel.random(50, seed=3).table
    stream = Request([1, 2, 3, 4, 5], GREEDY, stream_tokens, eos_token_ids=[])
    long = Request([int(t) for t in np.random.default_rng(seed).integers(0, 50, 1500)], GREEDY, 3, eos_token_ids=[])
    alone = Engine(ToyModel(table), None, gamma=0)
    want = [
        alone.generate(r.prompt_ids, r.params, r.max_new_tokens, eos_token_ids=[]).token_ids for r in (stream, long)
    ]
    return table, stream, long, want


def test_a_step_beside_a_stream_keeps_its_budget_and_a_prompt_alone_goes_in_whole_calls(clock):
    """A client streams while another's 1,500-token prompt is read: every step stays within the budget (up to the
    estimates' error), the stream keeps more than half of its rate alone (prefill_share 0.4: about 60%), the
    prompt's slices beside it fill whole calls of the layer kernel, and once the stream is done the prompt goes in
    whole calls within the budget. Both answers are those of the same requests alone."""
    table, stream, long, want = stream_and_long_prompt(150, seed=1)

    batch = BatchEngine(Engine(Timed(table, clock), None, gamma=0), max_batch=2, max_step_seconds=0.5)
    got: dict[int, list[int]] = {}
    first = batch.submit(stream)
    began = clock.now
    for _ in range(6):  # the stream alone
        for rid, event in batch.step().events:
            got.setdefault(rid, []).extend(event.token_ids)
    solo_rate = len(got[first]) / (clock.now - began)
    second = batch.submit(long)
    beside: list[tuple[float, int]] = []  # (seconds, tokens streamed) of the steps while the prompt is read
    passes: list[int] = []  # the rows of the passes in which the prompt was fed beside the stream
    slices: list[int] = []  # the prompt's rows in the steps it has alone
    streaming = True
    while batch.has_work():
        step = batch.step()
        assert step.seconds <= 0.5 * 1.05  # (the costs are estimates)
        reading = not got.get(second)
        if reading and streaming:
            beside.append((step.seconds, sum(len(e.token_ids) for rid, e in step.events if rid == first)))
            if step.prefill_fed:
                passes.append(step.rows)
        elif reading and step.prefill_fed:
            slices.append(step.prefill_fed)
        for rid, event in step.events:
            got.setdefault(rid, []).extend(event.token_ids)
            streaming = streaming and not (rid == first and event.finish_reason is not None)
    assert [got[first], got[second]] == want
    seconds, tokens = sum(s for s, _ in beside), sum(n for _, n in beside)
    assert len(beside) > 50 and tokens / seconds >= 0.5 * solo_rate
    call = kernel_rows()
    assert passes and all(rows % call == 0 for rows in passes)  # whole calls of the kernel beside the stream too
    assert slices and all(n % call == 0 for n in slices[:-1]) and max(slices) >= 2 * call


class Steep(Timed):
    """Rows deep in a prompt cost several times one near its start (long attention: 5 times at position 1,500, as
    Qwen2.5-Coder-1.5B's at 16k): 64 rows there about 1.9 s."""

    ROW, SLOPE = 0.006, 1.6e-5

    def sequence(self) -> Steep:
        return Steep(self.table, self.clock, self.max_length)


def test_the_last_rows_of_a_long_prompt_are_sliced_where_they_would_overrun_the_budget(clock):
    """A long prompt whose last rows fit one call of the layer kernel but cost more than the step's budget (rows
    deep in it) is sliced to its end like the rest, beside a stream and alone: no step takes much over the budget
    (0.5 s; the estimates still learn this steep a model: 0.67 s at most here, where a whole last call took 1.9 s);
    the answers are those of the requests alone."""
    table, stream, long, want = stream_and_long_prompt(400, seed=2)
    for with_stream in (True, False):
        batch = BatchEngine(Engine(Steep(table, clock), None, gamma=0), max_batch=2, max_step_seconds=0.5)
        first = batch.submit(stream) if with_stream else None
        for _ in range(4):
            batch.step()
        second = batch.submit(long)
        got: dict[int, list[int]] = {}
        tail: list[int] = []  # the prompt's rows in its last steps
        while batch.has_work():
            step = batch.step()
            assert step.seconds <= 0.8, (with_stream, step.seconds, step.prefill_fed)  # (estimates still learning)
            if step.prefill_fed and not got.get(second):
                tail = (tail + [step.prefill_fed])[-3:]
            for rid, event in step.events:
                got.setdefault(rid, []).extend(event.token_ids)
        assert got[second] == want[1]
        if first is not None:
            assert want[0][-len(got[first]) :] == got[first]
        assert max(tail) < kernel_rows()  # sliced to the end: no whole call of its last rows


def test_costs_learn_a_row_by_its_position():
    costs = PrefillCosts()
    assert costs.rows_within(1.0, 0, 1000, decoding=True) is None  # nothing measured: the caller's first slice

    def row(position):
        return 0.002 + 2e-6 * position

    for start in range(0, 8000, 200):
        costs.observe_prefill(64, start + 32, 64 * row(start + 32), decoding=False)
    assert costs.row_seconds(4000, decoding=False) == pytest.approx(row(4000), rel=0.05)
    near, far = costs.rows_within(0.5, 100, 10_000, False), costs.rows_within(0.5, 7000, 10_000, False)
    assert far < near and near * row(100 + near / 2) <= 0.55  # (a line fitted to rows at 0 .. 8,000)
    assert costs.row_seconds(4000, decoding=True) == costs.row_seconds(4000, decoding=False)  # the other kind's
    costs.observe_decode(0.05)
    costs.observe_prefill(4, 4000, 0.05 + 4 * 0.001, decoding=True)  # beside decoding: what the rows added
    assert costs.row_seconds(4000, decoding=True) < row(4000)


def test_engine_step_takes_a_limit_per_slot():
    engine = Engine(ToyModel.random(20, seed=1), None, gamma=0)
    from specwise.step import Slot

    slots = [Slot(engine.target, engine.planner.new_state(engine.drafters))]
    engine.begin(slots[0], engine.check_request(Request(list(range(12)), GREEDY, 2)))
    assert engine.step(slots, [5]).prefill_fed == 5
    with pytest.raises(ValueError, match="prefill limits must be >= 1"):
        engine.step(slots, [0])
    with pytest.raises(ValueError, match="1 slots need 1 prefill limits"):
        engine.step(slots, [1, 2])


def test_a_prompt_read_in_slices_has_its_room_reserved_before_its_first_slice():
    reserved = []

    class Reserving(ToyModel):
        def reserve(self, length: int) -> None:
            reserved.append((length, self.length))

    engine = Engine(Reserving(ToyModel.random(20, seed=1).table), None, gamma=0)
    from specwise.step import Slot

    slots = [Slot(engine.target, engine.planner.new_state(engine.drafters))]
    engine.begin(slots[0], engine.check_request(Request(list(range(12)), GREEDY, 2)))
    for _ in range(3):
        engine.step(slots, [5])
    assert reserved == [(13, 0)]  # once, before the first slice: the prompt and the token after it


def test_options_are_checked():
    engine = Engine(ToyModel.random(8), None, gamma=0)
    with pytest.raises(ValueError, match="max_step_seconds"):
        BatchEngine(engine, max_step_seconds=0)
    with pytest.raises(ValueError, match="prefill_share"):
        BatchEngine(engine, prefill_share=1.0)
    with pytest.raises(ValueError, match="cache_memory"):
        BatchEngine(engine, cache_memory=-1)
    default = default_cache_memory()
    assert default is None or default > 0
    assert BatchEngine(engine).cache_memory == default


# ---- on the quantized model ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny quantized model with a context of 2,048 (the test files' own say 256)."""
    gguf = pytest.importorskip("gguf")
    from specwise.models.kernels import quant

    if not quant.quantized_available():
        pytest.skip("the native quantized kernels are not built")
    from test_quantized_model import VARIANTS, write_gguf

    spec = VARIANTS["llama-Q8_0"]
    path = tmp_path_factory.mktemp("batch_prefill") / "tiny.gguf"
    add = gguf.GGUFWriter.add_context_length
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf.GGUFWriter, "add_context_length", lambda writer, n: add(writer, 2048))
        write_gguf(path, spec)
    return path, spec


def _model(tiny):
    from specwise.models.quantized import QuantizedModel

    return QuantizedModel(tiny[0])


def _ids(spec, n: int, seed: int) -> list[int]:
    from test_quantized_model import sequence

    return sequence(spec, n, seed=seed)


def _fresh(tiny, prompt: list[int], n: int, params=GREEDY) -> list[int]:
    return Engine(_model(tiny), NgramDrafter(), gamma=4).generate(prompt, params, n, eos_token_ids=[]).token_ids


LIMITS = [
    {"max_step_seconds": None, "prefill_chunk": 7},
    {"max_step_seconds": 1e-6},
    {"max_step_seconds": 0.5},
    {"max_step_seconds": 60.0, "prefill_share": 0.9},
]


@pytest.fixture(scope="module")
def mixed(tiny):
    """Prompts of several lengths (one of 700 tokens) and their answers alone."""
    spec = tiny[1]
    shapes = [(700, 8), (9, 24), (300, 12), (40, 16)]
    requests = [Request(_ids(spec, n, 40 + i), GREEDY, m, eos_token_ids=[]) for i, (n, m) in enumerate(shapes)]
    return requests, [_fresh(tiny, r.prompt_ids, r.max_new_tokens) for r in requests]


@pytest.mark.parametrize("limits", LIMITS, ids=["fixed-7", "tiny-budget", "default", "large-budget"])
def test_greedy_outputs_do_not_depend_on_the_slices(tiny, mixed, limits):
    requests, want = mixed
    batch = BatchEngine(Engine(_model(tiny), NgramDrafter(), gamma="auto"), max_batch=3, **limits)
    assert [_tokens(events) for events in batch.run_all(requests)] == want
    assert batch.prefill_fed == sum(len(r.prompt_ids) - 1 for r in requests)  # every prompt token fed once


def test_a_request_copies_a_system_prompt_that_a_running_slot_holds(tiny):
    """A second request sharing a 300-token system prompt with a conversation that another slot is answering reads
    only its own tokens: the shared prefix is copied, reported as cached, and its answer is the one read afresh."""
    spec = tiny[1]
    system = _ids(spec, 300, seed=1)
    first = system + _ids(spec, 40, seed=2)
    second = system + [(first[300] + 1) % spec.vocab] + _ids(spec, 29, seed=3)  # differs right after the system
    batch = BatchEngine(Engine(_model(tiny), NgramDrafter(), gamma="auto"), max_batch=3)
    a = batch.submit(Request(first, GREEDY, 30, eos_token_ids=[]))
    got: dict[int, list] = {a: []}
    while not got[a]:  # the first is answering
        for rid, event in batch.step().events:
            got[rid].append(event)
    fed = batch.prefill_fed
    b = batch.submit(Request(second, GREEDY, 16, eos_token_ids=[]))
    got[b] = []
    while batch.has_work():
        for rid, event in batch.step().events:
            got[rid].append(event)
    assert got[b][-1].stats.cached_tokens == 300
    assert batch.prefill_fed - fed == len(second) - 1 - 300
    assert batch.prefill_copied == 300
    assert _tokens(got[b]) == _fresh(tiny, second, 16)
    assert _tokens(got[a]) == _fresh(tiny, first, 30)


@pytest.mark.parametrize(
    "params", [GREEDY, SamplingParams(temperature=0.8, top_p=0.95, seed=5)], ids=["greedy", "seeded"]
)
def test_a_request_copies_a_prefix_from_a_free_slot(tiny, params):
    """A conversation another client left in its slot (a long one: the new prompt does not continue it) gives the
    new request its system prompt; the new request takes a slot of its own and answers as a fresh engine does."""
    spec = tiny[1]
    system = _ids(spec, 300, seed=4)
    long_chat = system + _ids(spec, 400, seed=5)
    batch = BatchEngine(Engine(_model(tiny), NgramDrafter(), gamma="auto"), max_batch=3)
    batch.run_all([Request(long_chat, params, 8, eos_token_ids=[])])
    other = system + [(long_chat[300] + 1) % spec.vocab] + _ids(spec, 19, seed=6)
    (events,) = batch.run_all([Request(other, params, 16, eos_token_ids=[])])
    assert events[-1].stats.cached_tokens == 300
    assert _tokens(events) == _fresh(tiny, other, 16, params)
    assert len([s for s in batch._slots if s.cache is not None]) == 2  # the long chat kept its own slot


def test_free_caches_past_the_memory_budget_are_dropped_least_recently_used_first(tiny):
    """Three conversations of about 60 positions each under a budget of 140: the third drops the first's cache
    (the least recently used), whose sequence and memory go; the second's next turn keeps its cache, the first's
    reads everything again (and drops the third's), each answering as a fresh engine does."""
    spec = tiny[1]
    per = position_bytes(_model(tiny))
    assert per == 2 * 2 * 2 * (spec.hidden // spec.heads) * 4  # layers x (k, v) x kv heads x head dim x float32
    budget = 140 * per
    batch = BatchEngine(Engine(_model(tiny), NgramDrafter(), gamma="auto"), max_batch=4, cache_memory=budget)
    chats = [_ids(spec, 50, seed=10 + i) for i in range(3)]
    outs = []
    for chat in chats[:2]:
        (events,) = batch.run_all([Request(chat, GREEDY, 10, eos_token_ids=[])])
        outs.append(_tokens(events))
    assert batch.caches_dropped == 0 and 100 * per <= batch.cache_bytes <= budget
    oldest = weakref.ref(next(s for s in batch._slots if s.cache is not None).target)  # the first chat's
    batch.run_all([Request(chats[2], GREEDY, 10, eos_token_ids=[])])  # a third conversation: past the budget
    assert batch.caches_dropped == 1 and batch.cache_bytes <= budget
    gc.collect()
    assert oldest() is None  # the first conversation's sequence is gone, its memory with it
    turns = [chats[i] + outs[i] + _ids(spec, 4, seed=20 + i) for i in range(2)]
    second = batch.run_all([Request(turns[1], GREEDY, 4, eos_token_ids=[])])[0]
    assert second[-1].stats.cached_tokens >= len(turns[1]) - 6 and batch.caches_dropped == 1
    first = batch.run_all([Request(turns[0], GREEDY, 4, eos_token_ids=[])])[0]
    assert first[-1].stats.cached_tokens == 0 and batch.caches_dropped == 2  # the third's cache went
    assert batch.cache_bytes <= budget
    assert _tokens(first) == _fresh(tiny, turns[0], 4) and _tokens(second) == _fresh(tiny, turns[1], 4)
    nothing = BatchEngine(Engine(_model(tiny), NgramDrafter(), gamma="auto"), max_batch=2, cache_memory=0)
    nothing.run_all([Request(chats[0], GREEDY, 4, eos_token_ids=[])])
    assert nothing.cache_bytes == 0 and nothing.caches_dropped == 1


# ---- the server's options ------------------------------------------------------------------------------------------


def test_serve_takes_the_options_and_the_worker_passes_them_on():
    pytest.importorskip("prometheus_client")
    import argparse

    from specwise.server import cli
    from specwise.server.metrics import ServerMetrics
    from specwise.server.worker import GenerationWorker

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--max-step-seconds", "0.2", "--prefill-share", "0.3", "--cache-memory", "2G"])
    assert (args.max_step_seconds, args.prefill_share, args.cache_memory) == (0.2, 0.3, 2 << 30)
    defaults = parser.parse_args(["serve"])
    assert (defaults.max_step_seconds, defaults.prefill_share, defaults.cache_memory) == (MAX_STEP_SECONDS, 0.4, None)
    engine = Engine(ToyModel.random(8), None, gamma=0)
    worker = GenerationWorker(
        engine, ServerMetrics(), max_batch=2, max_step_seconds=0.2, prefill_share=0.3, cache_memory=1 << 20
    )
    for batch in (worker._batch, worker._new_batch()):
        assert (batch.max_step_seconds, batch.prefill_share, batch.cache_memory) == (0.2, 0.3, 1 << 20)


@pytest.mark.parametrize("max_batch", [1, 3])
def test_a_prompt_given_up_mid_read_is_not_read_again(tiny, max_batch):
    """A client that gives up waiting for a long prompt's first token and sends it again (agents retry after their
    timeout) finds the part already read in the cache: only the rest is fed, and the answer is the one read afresh."""
    spec = tiny[1]
    prompt = _ids(spec, 400, seed=30)
    batch = BatchEngine(
        Engine(_model(tiny), NgramDrafter(), gamma="auto"), max_batch=max_batch, max_step_seconds=None, prefill_chunk=64
    )
    rid = batch.submit(Request(prompt, GREEDY, 8, eos_token_ids=[]))
    for _ in range(3):  # three slices of 64 read
        assert not batch.step().events
    batch.cancel(rid)
    batch.step()
    assert batch.prefill_fed == 192 and batch.running == 0
    (events,) = batch.run_all([Request(prompt, GREEDY, 8, eos_token_ids=[])])
    assert events[-1].stats.cached_tokens == 192
    assert batch.prefill_fed == len(prompt) - 1
    assert _tokens(events) == _fresh(tiny, prompt, 8)
