"""Requests with one prompt (a request's n choices) prefill it once: the others copy its cache
(``Model.copy_prefix``), and every request's output is the one it gets alone."""

from __future__ import annotations

import numpy as np
import pytest

from specwise.batch import BatchEngine, Request
from specwise.models.toy import ToyModel
from specwise.runtime import build_runtime, encode_prompt
from specwise.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "Write a short note about the sea, the wind and the boats that sail between the islands."


@pytest.fixture(scope="module")
def runtime(tiny_dir):
    return build_runtime(tiny_dir, "ngram", 4, "cpu")


def _copy_matches_feeding(model, prompt: list[int], more: list[int]) -> None:
    """A sequence that copied ``model``'s prefix gives the logits of one that fed it."""
    other, fed = model.sequence(), model.sequence()
    model.reset()
    model.forward(prompt + [more[0]], num_logits=0)  # the source holds more than the prefix
    other.copy_prefix(model, len(prompt))
    fed.forward(np.array(prompt, dtype=np.int64), num_logits=0)
    assert other.length == len(prompt)
    a, b = other.forward(more), fed.forward(np.array(more, dtype=np.int64))
    np.testing.assert_array_equal(a, b)


def test_a_copied_prefix_equals_a_fed_one_on_the_native_model(runtime):
    ids = encode_prompt(runtime.tokenizer, PROMPT, chat=True)
    _copy_matches_feeding(runtime.engine.target, ids, ids[:5])


def test_a_copied_prefix_equals_a_fed_one_on_the_default_model(smollm):
    ids = smollm.tokenizer.encode(PROMPT * 3)  # longer than the first cache: the copy grows it
    _copy_matches_feeding(smollm.model, ids, ids[:5])


def test_copy_prefix_refuses_another_model_and_a_length_past_the_source():
    toy = ToyModel.random(6)
    toy.forward([1, 2, 3])
    with pytest.raises(ValueError, match="same model"):
        ToyModel.random(6, seed=1).copy_prefix(toy, 2)
    with pytest.raises(ValueError, match="holds 3 tokens"):
        toy.sequence().copy_prefix(toy, 4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_n_choices_prefill_once_and_answer_as_alone(runtime, temperature):
    """Four requests of one prompt (seeds 7 .. 10, as the server seeds a request's choices): the prompt is fed
    once and copied three times; each answer equals the same request run alone."""
    engine = runtime.engine
    ids = encode_prompt(runtime.tokenizer, PROMPT, chat=True)
    params = [SamplingParams(temperature=temperature, seed=7 + i) for i in range(4)]
    alone = [engine.generate(ids, p, 24).token_ids for p in params]
    batch = BatchEngine(engine, max_batch=4, prefill_chunk=8)  # several chunks: the others wait for all of them
    events = batch.run_all([Request(ids, p, 24) for p in params])
    together = [[t for e in evs for t in e.token_ids] for evs in events]
    assert together == alone
    prefill = len(ids) - 1  # the prompt's last token is fed with the first step
    assert batch.prefill_fed == prefill
    assert batch.prefill_copied == 3 * prefill


def test_different_prompts_prefill_their_own(runtime):
    engine = runtime.engine
    prompts = [encode_prompt(runtime.tokenizer, text, chat=True) for text in (PROMPT, PROMPT + " Be brief.")]
    batch = BatchEngine(engine, max_batch=2)
    batch.run_all([Request(ids, SamplingParams(), 8) for ids in prompts])
    assert batch.prefill_copied == 0
    assert batch.prefill_fed == sum(len(ids) - 1 for ids in prompts)


def test_a_later_request_copies_a_running_one(runtime):
    """A request that joins while another with its prompt is decoding copies that one's prompt cache (positions
    before the prompt's end never change while it runs)."""
    engine = runtime.engine
    ids = encode_prompt(runtime.tokenizer, PROMPT, chat=True)
    alone = engine.generate(ids, SamplingParams(), 16).token_ids
    batch = BatchEngine(engine, max_batch=2)
    first = batch.submit(Request(ids, SamplingParams(), 32))
    out: dict[int, list[int]] = {first: []}
    for _ in range(4):  # the first prefills and decodes a few steps
        for rid, event in batch.step().events:
            out[rid].extend(event.token_ids)
    second = batch.submit(Request(ids, SamplingParams(), 16))
    out[second] = []
    while batch.has_work():
        for rid, event in batch.step().events:
            out[rid].extend(event.token_ids)
    assert out[second] == alone
    assert batch.prefill_copied == len(ids) - 1


def test_a_model_that_cannot_copy_prefills_each_request(tiny_dir):
    """The Hugging Face adapter has no copy_prefix: each request feeds its own prompt, at once (none waits)."""
    runtime = build_runtime(tiny_dir, "none", 4, "cpu", impl="hf")
    ids = encode_prompt(runtime.tokenizer, PROMPT, chat=True)
    alone = runtime.engine.generate(ids, SamplingParams(), 8).token_ids
    batch = BatchEngine(runtime.engine, max_batch=2)
    events = batch.run_all([Request(ids, SamplingParams(), 8) for _ in range(2)])
    assert [[t for e in evs for t in e.token_ids] for evs in events] == [alone, alone]
    assert batch.prefill_copied == 0 and batch.prefill_fed == 2 * (len(ids) - 1)
