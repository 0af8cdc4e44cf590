"""The `self` drafter: the target's layers and part of its output layer, in the target's own cache; the cache's
reuse of positions a rollback left (QuantizedModel.reusable); exactness through the engine, alone, with prompt
lookup and in a batch; the drafter spec."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")

from test_head import _assert_follows_target, gguf5  # noqa: E402, F401  (gguf5: a fixture)
from test_quantized_model import VARIANTS, assert_bits, sequence, write_gguf  # noqa: E402

from specwise.artifacts import DraftVocabError, write_ranking  # noqa: E402
from specwise.batch import BatchEngine, Request  # noqa: E402
from specwise.drafters import NgramDrafter, NoDrafter, make_drafter  # noqa: E402
from specwise.drafters.self_draft import SelfDrafter  # noqa: E402
from specwise.engine import Engine  # noqa: E402
from specwise.models.loader import LoadedModel  # noqa: E402
from specwise.models.quantized import QuantizedModel  # noqa: E402
from specwise.models.toy import ToyModel  # noqa: E402
from specwise.sampling import SamplingParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module", params=["llama-K", "qwen2-Q5_1", "llama-Q4_1"])
def tiny(request, tmp_path_factory):
    """(path, spec) of a tiny GGUF model: K-quants, Qwen2's biases, an output layer of its own (not tied)."""
    spec = VARIANTS[request.param]
    path = tmp_path_factory.mktemp("self") / f"{request.param}.gguf"
    write_gguf(path, spec)
    return path, spec


def counting(model: QuantizedModel) -> list[int]:
    """Record the number of rows each pass runs through the decoder layers (appended to the returned list): the
    batch pass's and the single-sequence decoding pass's (one native call)."""
    rows: list[int] = []
    stack = model._stack
    run, forward_one = stack.run, stack.forward_one

    def counted_run(x, caches, positions, *args, **kw):
        rows.append(len(positions))
        return run(x, caches, positions, *args, **kw)

    def counted_forward_one(x, ids, *args, **kw):
        rows.append(len(ids))
        return forward_one(x, ids, *args, **kw)

    stack.run, stack.forward_one = counted_run, counted_forward_one
    return rows


def fresh_logits(path, precision: str, tokens: list[int], keep: int) -> np.ndarray:
    model = QuantizedModel(path, precision=precision)
    return model.forward(np.asarray(tokens, dtype=np.int64))[-keep:]


# ---- the cache keeps what a rollback left ----------------------------------------------------------------------


def fed_with_features(path, tokens: list[int], length: int) -> QuantizedModel:
    """A model that kept its features while fed ``tokens`` in one pass, rolled back to ``length``."""
    model = QuantizedModel(path)
    model.set_keep_features(True)
    model.forward(np.asarray(tokens, dtype=np.int64), num_logits=0)
    model.rollback(length)
    return model


@pytest.mark.parametrize("precision", ["exact", "q8"])
def test_a_pass_over_tokens_fed_before_a_rollback_reuses_them(tiny, precision):
    """Drafted tokens fed one by one (layers only), rolled back, then fed again in one pass: only the rows not
    fed before run the layers, and the logits are a fresh model's, bit for bit."""
    path, spec = tiny
    tokens = sequence(spec, 30, seed=3)
    prefix, drafted = tokens[:20], tokens[20:26]
    model = QuantizedModel(path, precision=precision)
    model.set_keep_features(True)
    model.forward(np.asarray(prefix, dtype=np.int64), num_logits=0)
    for token in drafted[:-1]:
        model.forward(np.asarray([token], dtype=np.int64), num_logits=0)
    model.rollback(len(prefix))
    ids = np.asarray(drafted, dtype=np.int64)
    assert model.reusable(ids) == len(drafted) - 1
    rows = counting(model)
    got = model.forward(ids)
    assert rows == [1]  # the last drafted token alone
    assert model.length == 26
    assert_bits(got, fresh_logits(path, precision, prefix + drafted, len(drafted)))
    np.testing.assert_array_equal(model.features(20, 26), _features(path, precision, prefix + drafted)[20:26])


def _features(path, precision, tokens):
    model = QuantizedModel(path, precision=precision)
    model.set_keep_features(True)
    model.forward(np.asarray(tokens, dtype=np.int64), num_logits=0)
    return model.features(0, len(tokens)).copy()


def test_reuse_stops_at_the_first_token_that_differs(tiny):
    path, spec = tiny
    tokens = sequence(spec, 30, seed=4)
    model = fed_with_features(path, tokens[:24], 18)
    feed = tokens[18:20] + [(tokens[20] + 1) % spec.vocab, tokens[21]]  # the third differs
    ids = np.asarray(feed, dtype=np.int64)
    assert model.reusable(ids) == 2
    got = model.forward(ids)
    assert_bits(got, fresh_logits(path, "q8", tokens[:18] + feed, 4))
    # what lay past the rows just written is stale: feeding the old tokens there runs them again
    model.rollback(20)
    assert model.reusable(np.asarray(tokens[20:24], dtype=np.int64)) == 0


def test_a_changed_context_is_never_reused(tiny):
    """Positions past a rollback are reused only while everything before them is what they were computed after."""
    path, spec = tiny
    tokens = sequence(spec, 30, seed=5)
    model = fed_with_features(path, tokens[:25], 15)
    changed = (tokens[15] + 1) % spec.vocab
    model.forward(np.asarray([changed], dtype=np.int64), num_logits=0)  # position 15 rewritten
    assert model.reusable(np.asarray(tokens[16:25], dtype=np.int64)) == 0
    got = model.forward(np.asarray(tokens[16:25], dtype=np.int64))
    assert_bits(got, fresh_logits(path, "q8", tokens[:15] + [changed] + tokens[16:25], 9))


def test_no_reuse_without_features_or_after_they_are_switched(tiny):
    path, spec = tiny
    tokens = np.asarray(sequence(spec, 12, seed=6), dtype=np.int64)
    model = QuantizedModel(path)
    model.forward(tokens)
    model.rollback(6)
    assert model.reusable(tokens[6:]) == 0  # no features were kept: the rows' logits could not be made
    model.set_keep_features(True)
    model.forward(tokens[6:])
    model.rollback(6)
    assert model.reusable(tokens[6:]) == 6
    model.set_keep_features(False)
    model.set_keep_features(True)
    assert model.reusable(tokens[6:]) == 0


def test_a_batch_reuses_each_sequences_own_rows(tiny):
    path, spec = tiny
    a, b = sequence(spec, 20, seed=7), sequence(spec, 16, seed=8)
    model = QuantizedModel(path)
    other = model.sequence()
    for seq, tokens in ((model, a), (other, b)):
        seq.set_keep_features(True)
        seq.forward(np.asarray(tokens, dtype=np.int64), num_logits=0)
    model.rollback(14)  # six rows to reuse
    other.rollback(10)
    b2 = b[:10] + [(b[10] + 1) % spec.vocab] + b[11:]  # nothing to reuse: the first row differs
    rows = counting(model)
    got_a, got_b = model.forward_batch(
        [(model, np.asarray(a[14:], dtype=np.int64)), (other, np.asarray(b2[10:], dtype=np.int64))], [3, None]
    )
    assert rows == [6]  # b's six rows; a's were all in the cache
    assert_bits(got_a, fresh_logits(path, "q8", a, 3))
    assert_bits(got_b, fresh_logits(path, "q8", b2, 6))
    # a pass whose rows are all reused runs no layer
    model.rollback(14)
    rows.clear()
    got = model.forward_batch([(model, np.asarray(a[14:], dtype=np.int64))], [2])[0]
    assert rows == [] and model.length == 20
    assert_bits(got, fresh_logits(path, "q8", a, 2))


# ---- the drafter -----------------------------------------------------------------------------------------------


def self_drafter(model: QuantizedModel, ids) -> SelfDrafter:
    ids = np.asarray(ids, dtype=np.int64)
    return SelfDrafter.for_target(model, ids)


def greedy(engine: Engine, prompt: list[int], n: int = 40):
    return engine.generate(prompt, GREEDY, max_new_tokens=n, eos_token_ids=[])


def test_greedy_self_drafting_equals_plain_and_drafts_the_targets_choice(tiny):
    path, spec = tiny
    plain = Engine(QuantizedModel(path), NoDrafter())
    for prompt in ([1, 5, 9, 2], sequence(spec, 20, seed=11)):
        want = greedy(plain, prompt).token_ids
        # the whole vocabulary: the draft is the target's own greedy choice, every token accepted
        target = QuantizedModel(path)
        everything = greedy(Engine(target, self_drafter(target, np.arange(spec.vocab)), gamma=4), prompt)
        assert everything.token_ids == want
        assert everything.stats.drafted > 0 and everything.stats.acceptance_rate == 1.0
        # a third of the vocabulary (shuffled): tokens outside it are never drafted; the output is plain's
        target = QuantizedModel(path)
        part = np.random.default_rng(5).permutation(spec.vocab)[: spec.vocab // 3]
        drafter = self_drafter(target, part)
        run = greedy(Engine(target, drafter, gamma=4), prompt)
        assert run.token_ids == want
        assert run.stats.drafted > 0
        assert target.length == len(prompt) + len(want) - 1  # drafting left the cache where the engine keeps it
        # drafted: the third of the vocabulary and the request's own tokens
        fresh = QuantizedModel(path)
        fresh.set_keep_features(True)
        probe = self_drafter(fresh, part)
        probe.begin(prompt)
        draft = probe.propose(list(prompt), 4, GREEDY, None)
        assert len(draft) == 4 and set(draft.ids) <= set(part.tolist()) | set(prompt)


@pytest.mark.parametrize("gamma", [3, "auto"])
def test_self_with_prompt_lookup_equals_plain(tiny, gamma):
    path, spec = tiny
    target = QuantizedModel(path)
    sources = [NgramDrafter(), self_drafter(target, np.arange(spec.vocab // 2))]
    engine = Engine(target, sources, gamma=gamma)
    plain = Engine(QuantizedModel(path), NoDrafter())
    drafted = 0
    for prompt in ([7, 8, 9, 10, 7, 8, 9, 10, 7, 8], sequence(spec, 12, seed=2), sequence(spec, 9, seed=3)):
        want = greedy(plain, prompt).token_ids
        result = greedy(engine, prompt)
        assert result.token_ids == want
        drafted += result.stats.by_drafter.get("self", {}).get("drafted", 0)
    assert drafted > 0  # (where prompt lookup finds nothing, self is the only source)


def test_a_batch_with_self_drafting_gives_each_request_its_own_output(tiny):
    path, spec = tiny
    prompts = [sequence(spec, 5 + 3 * i, seed=30 + i) for i in range(4)]
    requests = [Request(p, GREEDY, max_new_tokens=14 + 2 * i) for i, p in enumerate(prompts)]
    plain = Engine(QuantizedModel(path), NoDrafter())
    want = [plain.generate(r.prompt_ids, r.params, r.max_new_tokens).token_ids for r in requests]
    target = QuantizedModel(path)
    engine = Engine(target, self_drafter(target, np.arange(spec.vocab // 2)), gamma=3)
    events = BatchEngine(engine, max_batch=3).run_all(requests)
    assert [[t for e in evs for t in e.token_ids] for evs in events] == want


@pytest.mark.parametrize(("prompt", "vocab"), [([0, 2], [0, 2, 3]), ([1, 4, 1], [0])])
def test_sampled_output_with_self_drafting_follows_the_target(gguf5, prompt, vocab):  # noqa: F811
    """Through the engine, over a draft vocabulary of some of the five tokens (and, in the second case, the prompt's
    own tokens beside it): emitted sequences follow p."""
    target = QuantizedModel(gguf5, name="tiny")
    engine = Engine(target, self_drafter(target, vocab), gamma=3)
    stats = _assert_follows_target(engine, gguf5, prompt, 4000, seed=7000)
    assert stats.drafted > 0 and 0 < stats.accepted < stats.drafted


def test_sampled_q_is_the_targets_p_over_the_draft_vocabulary(gguf5):  # noqa: F811
    from specwise.sampling import probs_from_logits

    target = QuantizedModel(gguf5, name="tiny")
    target.set_keep_features(True)
    drafter = self_drafter(target, [0, 2, 3])
    params = SamplingParams(temperature=0.8, seed=0)
    draft = drafter.propose([0, 2], 2, params, np.random.default_rng(0))
    assert draft.probs.shape == (2, 5) and float(draft.probs[:, [1, 4]].sum()) == 0.0
    assert target.length == 0  # rolled back to where it was: the pending tokens are the verification pass's
    assert target.reusable(np.asarray([0, 2, draft.ids[0]], dtype=np.int64)) == 3
    p = probs_from_logits(QuantizedModel(gguf5).forward([0, 2])[-1][[0, 2, 3]], params)
    np.testing.assert_allclose(draft.probs[0, [0, 2, 3]], p, rtol=1e-5)


def test_the_requests_own_tokens_are_drafted_beside_the_draft_vocabulary(gguf5):  # noqa: F811
    """Tokens of the prompt outside the draft vocabulary get columns of their own (their output rows dequantized):
    q is about p over the vocabulary and them; a new request forgets them."""
    from specwise.sampling import probs_from_logits

    target = QuantizedModel(gguf5, name="tiny")
    target.set_keep_features(True)
    drafter = self_drafter(target, [0])
    params = SamplingParams(temperature=1.0, seed=0)
    drafter.begin([1, 4])
    draft = drafter.propose([1, 4], 1, params, np.random.default_rng(0))
    assert float(draft.probs[0, [2, 3]].sum()) == 0.0 and float(draft.probs[0, [0, 1, 4]].min()) > 0
    p = probs_from_logits(QuantizedModel(gguf5).forward([1, 4])[-1][[0, 1, 4]], params)
    np.testing.assert_allclose(draft.probs[0, [0, 1, 4]], p, rtol=2e-2)
    drafter.begin([0])
    target.rollback(0)
    assert float(drafter.propose([0], 1, params, np.random.default_rng(0)).probs[0, [1, 2, 3, 4]].sum()) == 0.0


# ---- the spec ------------------------------------------------------------------------------------------------


def loaded(path) -> LoadedModel:
    model = QuantizedModel(path)
    return LoadedModel(model, None, "tiny")


def test_the_spec_takes_a_ranking_and_a_size(tiny, tmp_path):
    path, spec = tiny
    ranking = tmp_path / "rank.npy"
    write_ranking(ranking, np.random.default_rng(1).permutation(spec.vocab))
    target = loaded(path)
    [drafter] = make_drafter(f"self?vocab=10&ranking={ranking}", target)
    assert isinstance(drafter, SelfDrafter) and drafter.vocab_ids.size == 10 and drafter.head.shape[0] == 10
    engine = Engine(target.model, [drafter], gamma=3)
    assert greedy(engine, [3, 4, 5]).token_ids == greedy(Engine(QuantizedModel(path), NoDrafter()), [3, 4, 5]).token_ids


def test_bad_specs_are_refused_with_the_fix(tiny, tmp_path):
    path, spec = tiny
    for bad in ("self?lookup=2", "self?foo=1", "self?vocab"):
        with pytest.raises(ValueError, match="self takes vocab=N and ranking=FILE"):
            make_drafter(bad, loaded(path))
    with pytest.raises(DraftVocabError, match="python -m specwise.lab.ranking"):
        make_drafter("self", loaded(path))  # no ranking shipped for a tokenizer-less tiny model
    toy = LoadedModel(ToyModel.random(16, seed=0), None, "toy")
    with pytest.raises(ValueError, match="GGUF target on the CPU"):
        make_drafter("self?vocab=4", toy)


def test_a_new_request_does_not_reuse_an_earlier_ones_answer(tiny):
    """The same greedy request twice: the second runs every token of its answer through the layers again (what
    the first left past its prompt is discarded when a request begins), so a benchmark repeating a prompt measures
    the work, not a cache of the answer."""
    path, spec = tiny
    target = QuantizedModel(path)
    engine = Engine(target, self_drafter(target, np.arange(spec.vocab)), gamma=4)
    prompt = sequence(spec, 8, seed=40)
    rows = counting(target)
    first = greedy(engine, prompt, 20).token_ids
    fed_first = sum(rows)
    rows.clear()
    again = greedy(engine, prompt, 20).token_ids
    assert again == first
    assert sum(rows) >= len(first) - 1  # every emitted token but the last went through the layers once more
    assert fed_first >= len(prompt) + len(first) - 1


def test_auto_adds_self_where_the_output_layer_is_most_of_a_pass(tiny, tmp_path, monkeypatch):
    import specwise.artifacts as artifacts
    import specwise.drafters as drafters
    from specwise.drafters import resolve_drafter_spec, self_pays

    path, spec = tiny
    target = loaded(path)
    monkeypatch.setattr(drafters, "_auto_sibling", lambda t: None)  # no sibling in the fetch cache
    ranking = tmp_path / "rank.npy"
    write_ranking(ranking, range(spec.vocab))
    share = target.model.lm_head.nbytes / target.model.weight_bytes
    monkeypatch.setattr(artifacts, "shipped_ranking", lambda tokenizer: ranking)
    monkeypatch.setattr(drafters, "SELF_OUTPUT_SHARE", share)  # at the threshold: self
    assert self_pays(target) and resolve_drafter_spec("auto", target) == "ngram+self"
    monkeypatch.setattr(drafters, "SELF_OUTPUT_SHARE", share * 1.01)  # below it: prompt lookup alone
    assert not self_pays(target) and resolve_drafter_spec("auto", target) == "ngram"
    monkeypatch.setattr(drafters, "SELF_OUTPUT_SHARE", 0.0)
    monkeypatch.setattr(artifacts, "shipped_ranking", lambda tokenizer: None)  # no ranking for its tokenizer
    assert resolve_drafter_spec("auto", target) == "ngram"
    toy = LoadedModel(ToyModel.random(16, seed=0), None, "toy")
    assert not self_pays(toy)


def test_the_profile_times_drafting_new_tokens(tiny):
    """`specwise profile` times each proposal's own work: what the previous one left in the cache is not found."""
    from specwise.lab import profile

    path, spec = tiny
    target = QuantizedModel(path)
    drafter = self_drafter(target, np.arange(spec.vocab))
    rows = counting(target)
    assert profile.drafter_cost(drafter, spec.vocab, k=3, context=16, repeats=4, target=target) > 0
    assert rows[0] == 15  # the context but its last token
    assert sum(rows[1:]) == 5 * 3  # each proposal: the last context token and two drafted ones


@pytest.mark.parametrize("precision", ["exact", "q8"])
def test_a_pass_ending_in_some_output_rows_gives_the_full_passs_logits_there(tiny, precision):
    """forward_last over rows of the output layer (the drafting pass): the full layer's logits at those ids, in one
    native call, or, where the rows were computed before, from their features."""
    path, spec = tiny
    tokens = sequence(spec, 14, seed=50)
    ids = np.random.default_rng(2).permutation(spec.vocab)[:17]
    want = fresh_logits(path, precision, tokens, 1)[:, ids]
    model = QuantizedModel(path, precision=precision)
    model.set_keep_features(True)
    output = model.output_rows(model.read_output_rows(ids))
    model.forward(np.asarray(tokens[:-3], dtype=np.int64), num_logits=0)
    got = model.forward_last(np.asarray(tokens[-3:], dtype=np.int64), output)
    assert got.shape == (1, 17) and model.length == 14
    np.testing.assert_array_equal(got, want)
    model.rollback(11)
    rows = counting(model)
    again = model.forward_last(np.asarray(tokens[-3:], dtype=np.int64), output)  # found computed
    assert rows == [] and model.length == 14
    np.testing.assert_array_equal(again, want)


def test_a_pass_ending_in_some_rows_without_features_is_refused_before_it_feeds(tiny):
    """Past one native call's rows the logits come from the kept features: without them the pass is refused and the
    cache is left as it was."""
    from specwise.models.kernels.quant import MAX_ROWS

    path, spec = tiny
    model = QuantizedModel(path)
    output = model.output_rows(model.read_output_rows(np.arange(5)))
    model.forward(np.asarray(sequence(spec, 4, seed=60), dtype=np.int64))
    with pytest.raises(RuntimeError, match="needs the features kept"):
        model.forward_last(np.asarray(sequence(spec, MAX_ROWS + 1, seed=61), dtype=np.int64), output)
    assert model.length == 4
