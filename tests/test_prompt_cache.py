"""Prompt caching in Engine: a request keeps the part of the target's cache the previous request left that its
prompt shares (a system prompt, the earlier turns of a chat), and its output is what a fresh cache gives."""

from __future__ import annotations

import pytest

from specwise.drafters import NgramDrafter
from specwise.engine import Engine
from specwise.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

gguf = pytest.importorskip("gguf")
from test_quantized_model import VARIANTS, sequence, write_gguf  # noqa: E402

from specwise.models.quantized import QuantizedModel  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module", params=["exact", "q8"])
def model_path(request, tmp_path_factory):
    spec = VARIANTS["llama-Q8_0"]
    path = tmp_path_factory.mktemp("prompt_cache") / "tiny.gguf"
    write_gguf(path, spec)
    return path, spec, request.param


class Recording:
    """Wraps a model's forward to record how many tokens each pass fed."""

    def __init__(self, model) -> None:
        self.fed: list[int] = []
        forward = model.forward

        def recording(tokens, num_logits=None):
            self.fed.append(len(tokens))
            return forward(tokens, num_logits)

        model.forward = recording


def answer(engine: Engine, prompt: list[int], params=GREEDY, n: int = 24):
    return engine.generate(prompt, params, max_new_tokens=n, eos_token_ids=[])


def test_a_chat_keeps_its_cache_and_answers_as_a_fresh_engine_does(model_path):
    path, spec, precision = model_path
    system = sequence(spec, 20, seed=1)
    turns = [sequence(spec, 6, seed=s) for s in (2, 3, 4)]
    for drafter in (None, NgramDrafter()):
        kept = Engine(QuantizedModel(path, precision=precision), drafter, gamma=4)
        fed = Recording(kept.target).fed
        prompt: list[int] = list(system)
        for i, turn in enumerate(turns):
            prompt = prompt + turn
            fed.clear()
            out = answer(kept, prompt)
            fresh = answer(Engine(QuantizedModel(path, precision=precision), drafter and NgramDrafter(), 4), prompt)
            assert out.token_ids == fresh.token_ids, (drafter, i)
            if i == 0:
                assert fed[0] == len(prompt) - 1  # the first request feeds its whole prompt but the last token
            else:
                assert fed[0] <= len(turn) + 1  # only the new turn (and the previous answer's last token)
            prompt = prompt + out.token_ids


def test_a_cache_written_by_anyone_else_is_not_kept(model_path):
    path, spec, precision = model_path
    prompt = sequence(spec, 30, seed=5)
    engine = Engine(QuantizedModel(path, precision=precision), None, gamma=4)
    first = answer(engine, prompt)
    # someone feeds the target between two requests: same length, other tokens
    engine.target.rollback(10)
    engine.target.forward(sequence(spec, len(prompt) - 11, seed=6), num_logits=0)
    fed = Recording(engine.target).fed
    again = answer(engine, prompt)
    assert again.token_ids == first.token_ids
    assert fed[0] == len(prompt) - 1  # fed again from the start
    # the same prompt again: everything but its last token is kept
    fed.clear()
    assert answer(engine, prompt).token_ids == first.token_ids
    assert fed == [1] * len(first.token_ids)  # no prefill: one token a pass (plain decoding), the prompt's last first


def test_sampled_answers_with_a_kept_cache_are_the_fresh_engines(model_path):
    path, spec, precision = model_path
    prompt = sequence(spec, 25, seed=7)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    kept = Engine(QuantizedModel(path, precision=precision), NgramDrafter(), gamma=4)
    answer(kept, prompt[:-3], params)
    fed = Recording(kept.target).fed
    out = answer(kept, prompt, params)
    fresh = answer(Engine(QuantizedModel(path, precision=precision), NgramDrafter(), gamma=4), prompt, params)
    assert out.token_ids == fresh.token_ids
    assert fed[0] <= 3


def test_the_batch_engine_keeps_each_conversations_cache_in_its_slot(model_path):
    """Two chats take turns through a batch engine (as the server's clients do): each turn lands in the slot that
    holds its conversation, feeds only what the turn adds, reports those tokens as cached, and answers as a fresh
    engine does. The second chat's first turn takes a slot of its own and copies the system prompt from the first
    chat's. A request sharing nothing takes the slot that finished longest ago."""
    from specwise.batch import BatchEngine, Request

    path, spec, precision = model_path
    batch = BatchEngine(Engine(QuantizedModel(path, precision=precision), NgramDrafter(), gamma=4), max_batch=3)
    system = sequence(spec, 16, seed=11)
    chats = {name: list(system) + sequence(spec, 5, seed=seed) for name, seed in (("a", 12), ("b", 13))}
    for turn in range(3):
        for name in ("a", "b"):
            before = batch.prefill_fed
            prompt = chats[name]
            events = batch.run_all([Request(prompt, GREEDY, 12, eos_token_ids=[])])[0]
            tokens = [t for e in events for t in e.token_ids]
            fresh = answer(Engine(QuantizedModel(path, precision=precision), NgramDrafter(), gamma=4), prompt, n=12)
            assert tokens == fresh.token_ids, (turn, name)
            cached = events[-1].stats.cached_tokens
            assert batch.prefill_fed - before == len(prompt) - 1 - cached
            if turn == 0 and name == "a":
                assert cached == 0
            elif turn == 0:
                # a slot of its own, not the other chat's, with the system prompt copied from the other chat's slot
                assert cached == len(system)
            else:
                assert cached >= len(prompt) - 8  # its earlier turns and answers: only the new turn is fed
            chats[name] = prompt + tokens + sequence(spec, 4, seed=20 + turn)
    # two unrelated requests: the third slot (never used), then, the batch full, the slot that finished longest
    # ago ("a"'s), so "b" keeps its conversation
    for seed in (30, 31):
        batch.run_all([Request(sequence(spec, 9, seed=seed), GREEDY, 4, eos_token_ids=[])])
    assert len(batch._slots) == 3
    events = batch.run_all([Request(chats["b"], GREEDY, 4, eos_token_ids=[])])[0]
    assert events[-1].stats.cached_tokens >= len(chats["b"]) - 5
    events = batch.run_all([Request(chats["a"], GREEDY, 4, eos_token_ids=[])])[0]
    # its slot went to the second unrelated request; it takes the one that finished longest ago (the first's), and
    # copies the system prompt from "b"'s
    assert events[-1].stats.cached_tokens == len(system)
