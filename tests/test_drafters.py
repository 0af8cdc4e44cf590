"""Drafters: prompt lookup, the model drafter's cache syncing, and the vocabulary check."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import needs_hf
from specwise.drafters import (
    Drafter,
    ModelDrafter,
    NgramDrafter,
    NoDrafter,
    VocabularyMismatchError,
    check_same_vocabulary,
    make_drafter,
)
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams, make_generator

GREEDY = SamplingParams()


def propose(drafter, context, k=4):
    return drafter.propose(context, k, GREEDY, None).tokens.tolist()


def test_draft_holds_ids_as_a_list_and_tokens_as_an_int64_array():
    from specwise.drafters import Draft

    listed = Draft([3, 1, 4], confidence=[0.9, 0.8, 0.7], kind=2)
    assert listed.ids == [3, 1, 4] and len(listed) == 3
    assert isinstance(listed.tokens, np.ndarray) and listed.tokens.dtype == np.int64
    assert listed.tokens.tolist() == [3, 1, 4]
    q = np.full((3, 5), 0.2, dtype=np.float32)
    arrayed = Draft(np.array([3, 1, 4], dtype=np.int32), q)
    assert arrayed.tokens.dtype == np.int64 and arrayed.ids == [3, 1, 4] and all(type(t) is int for t in arrayed.ids)
    cut = arrayed.prefix(2)
    assert cut.ids == [3, 1] and cut.probs.shape == (2, 5) and cut.tokens.dtype == np.int64
    assert listed.prefix(1).confidence == [0.9] and listed.prefix(1).kind == 2
    empty = Draft.empty()
    assert len(empty) == 0 and empty.ids == [] and empty.tokens.shape == (0,) and empty.tokens.dtype == np.int64
    assert len(Draft(np.zeros(0, dtype=np.int64))) == 0
    for bad in (np.array([1.0, 2.0]), np.array([[1, 2]])):
        with pytest.raises(ValueError, match="1-D array of integer ids"):
            Draft(bad)


def test_ngram_proposes_continuation_of_longest_recent_match():
    d = NgramDrafter(max_ngram=3)
    d.begin([])
    ctx = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    # suffix [1, 2, 3] occurred at 0..2, followed by 4, 5, 9, 2
    assert propose(d, ctx) == [4, 5, 9, 2]
    ctx += [4, 5]
    # suffix [3, 4, 5]: latest earlier occurrence ends at index 5 -> continuation 9, 2, 3, 7
    assert propose(d, ctx) == [9, 2, 3, 7]


def test_ngram_prefers_most_recent_occurrence_and_falls_back_to_shorter():
    d = NgramDrafter(max_ngram=2)
    d.begin([])
    ctx = [5, 1, 6, 5, 1, 7, 0, 1]
    # no earlier [0, 1]; the latest earlier [1] is at index 4, followed by 7, 0, 1
    assert propose(d, ctx, k=3) == [7, 0, 1]
    assert propose(d, ctx + [8], k=3) == []  # 8 never seen: no draft


def test_ngram_truncates_to_available_tokens_and_respects_k():
    d = NgramDrafter()
    d.begin([])
    assert propose(d, [1, 2, 1], k=5) == [2, 1]
    assert propose(d, [1, 2, 1, 2], k=1) == [1]
    assert propose(d, [1, 2, 1, 2], k=0) == []


def test_ngram_restarts_on_a_new_shorter_context():
    d = NgramDrafter()
    assert propose(d, [1, 2, 3, 1, 2]) == [3, 1, 2]
    assert propose(d, [9, 9]) == [9]  # a new sequence without begin(): the index restarts


def test_ngram_rejects_bad_sizes():
    with pytest.raises(ValueError, match="ngram sizes"):
        NgramDrafter(max_ngram=0)


def test_ngram_labels_a_draft_with_its_match_length():
    """The planner measures acceptance per match length (Draft.kind); the drafter itself keeps no estimate."""
    d = NgramDrafter(max_ngram=3)
    assert d.propose([7, 1, 2, 8, 2], 4, GREEDY, None).kind == 1
    d.begin([])
    assert d.propose([4, 5, 6, 9, 4, 5, 6], 4, GREEDY, None).kind == 3
    assert d.propose([4, 5, 6, 9, 4, 5, 6], 4, GREEDY, None, stop=0.99).tokens.tolist() == [9, 4, 5, 6]


def test_no_drafter_proposes_nothing():
    assert propose(NoDrafter(), [1, 2, 3]) == []


def test_model_drafter_greedy_follows_its_model_and_resyncs():
    model = ToyModel.random(8, seed=4)
    drafter = ModelDrafter(model)
    drafter.begin([1])
    first = propose(drafter, [1], k=3)
    # the draft is the toy model's own greedy continuation
    ctx = [1]
    for tok in first:
        assert tok == int(model.next_logits(len(ctx) - 1, ctx[-1]).argmax())
        ctx.append(tok)
    # the target kept one token and then emitted a different one: the drafter rolls back and resyncs
    other = (first[1] + 1) % 8
    second = propose(drafter, [1, first[0], other], k=2)
    assert model.tokens == [1, first[0], other, second[0]]


def test_model_drafter_greedy_confidence_stops_drafting_at_the_stop_level():
    """Greedy with a stop level: each drafted token carries the draft model's probability of it, and drafting stops
    at the first token where their product falls below the level (that token is the last drafted, with no pass
    after it); without a level, no confidences and the whole draft."""
    table = np.zeros((1, 4, 4), dtype=np.float32)
    for token, (nxt, logit) in enumerate([(1, 4.0), (2, 3.0), (3, 0.5), (0, 4.0)]):
        table[0, token, nxt] = logit  # token -> nxt with probability e^logit / (e^logit + 3)
    p = [float(np.exp(table[0, t].max()) / np.exp(table[0, t]).sum()) for t in range(4)]
    drafter = ModelDrafter(ToyModel(table))
    drafter.begin([0])
    whole = drafter.propose([0], 4, GREEDY, None)
    assert whole.ids == [1, 2, 3, 0] and whole.confidence is None
    passes = drafter.model.passes
    stop = p[0] * p[1] * p[2] * 1.01  # the third token's product falls just below it
    cut = drafter.propose([0], 4, GREEDY, None, stop=stop)
    assert cut.ids == [1, 2, 3]
    assert cut.confidence == pytest.approx(p[:3])
    assert drafter.model.passes - passes == 3  # the context's pass, then one per drafted token but the last
    # a token whose product clears the level by less than the lookahead's guess of the next probability ends the
    # draft: no pass is spent to see a next token the level would likely cut
    from specwise.drafters.model import LOOKAHEAD

    passes = drafter.model.passes
    reach = p[0] * p[1] * p[2]
    short = drafter.propose([0], 4, GREEDY, None, stop=reach * LOOKAHEAD * 1.01)
    assert short.ids == [1, 2, 3] and short.confidence == pytest.approx(p[:3])
    assert drafter.model.passes - passes == 3  # the context's pass and the passes for tokens 2 and 3: none after
    # at a level the whole draft clears with the lookahead's margin, the same draft as without one
    whole_again = drafter.propose([0], 4, GREEDY, None, stop=reach * p[3] * LOOKAHEAD * 0.99)
    assert whole_again.ids == [1, 2, 3, 0]


def test_model_drafter_lookup_drafts_the_same_tokens_in_fewer_passes():
    """Greedy drafting that checks lookup continuations in the draft model's passes (lookup=N) gives exactly the
    token-by-token draft at every step of a repetitive context, resyncing after rejections, with fewer passes."""
    table = np.full((1, 6, 6), -5.0, dtype=np.float32)
    for token in range(6):  # the toy model continues 0 1 2 3 4 0 1 2 ... (5 sends it back to 0)
        table[0, token, (token + 1) % 5] = 5.0
    plain, staged = ModelDrafter(ToyModel(table)), ModelDrafter(ToyModel(table), lookup=3)
    context = [0, 1, 2, 3, 4, 0, 1]
    for drafter in (plain, staged):
        drafter.begin(context)
    for step in range(12):
        k = 2 + step % 5
        want = propose(plain, context, k)
        assert propose(staged, context, k) == want, step
        assert staged.model.tokens == (context + want)[: len(staged.model.tokens)]  # no unchecked guess kept
        # the target keeps part of the draft, then writes a token of its own (a 5 now and then: a rejection)
        keep = step % 3
        context = context + want[:keep] + [5 if step % 4 == 3 else (want[keep - 1] + 1) % 5 if keep else 0]
    assert staged.model.passes < plain.model.passes


def test_model_drafter_lookup_option_is_checked():
    from specwise.drafters.vocab import lookup_option, parse_model_spec

    assert parse_model_spec("b.gguf?lookup=3&vocab=8") == ("b.gguf", {"lookup": "3", "vocab": "8"})
    assert lookup_option({}) == 0 and lookup_option({"lookup": "3"}) == 3
    for bad in ("0", "9", "x"):
        with pytest.raises(ValueError, match="lookup="):
            lookup_option({"lookup": bad})


def test_model_drafter_sampling_returns_q_rows():
    drafter = ModelDrafter(ToyModel.random(8, seed=4))
    drafter.begin([1])
    draft = drafter.propose([1, 2], 3, SamplingParams(temperature=1.0, top_k=4), make_generator(0))
    assert isinstance(draft.probs, np.ndarray) and draft.probs.dtype == np.float32 and draft.probs.shape == (3, 8)
    assert isinstance(draft.tokens, np.ndarray) and draft.tokens.dtype == np.int64
    np.testing.assert_allclose(draft.probs.sum(-1), np.ones(3), rtol=1e-5)
    assert all(draft.probs[i, t] > 0 for i, t in enumerate(draft.tokens.tolist()))
    assert ((draft.probs > 0).sum(-1) <= 4).all()


class _Tok:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_vocabulary_size_mismatch_is_a_clear_error():
    with pytest.raises(VocabularyMismatchError, match=r"draft vocabulary \(32000\) differs from target's \(49152\)"):
        check_same_vocabulary(49152, 32000)


def test_vocabulary_string_mismatch_names_the_token():
    a = _Tok({"a": 0, "b": 1, "c": 2})
    b = _Tok({"a": 0, "x": 1, "c": 2})
    with pytest.raises(VocabularyMismatchError, match="token id 1"):
        check_same_vocabulary(3, 3, a, b)
    check_same_vocabulary(3, 3, a, _Tok({"a": 0, "b": 1, "c": 2}))


def test_make_drafter_specs_and_errors():
    [none] = make_drafter("none", None)  # one drafter: a list of one
    assert isinstance(none, NoDrafter)
    assert make_drafter("ngram:5", None)[0].max_ngram == 5
    assert make_drafter("ngram:4:2", None)[0].min_ngram == 2
    with pytest.raises(ValueError, match="unknown drafter"):
        make_drafter("magic", None)
    with pytest.raises(ValueError, match="ngram takes integers"):
        make_drafter("ngram:x", None)


def test_the_catalogue_maps_each_method_to_its_builder(monkeypatch):
    """A spec's method is looked up in the catalogue (``DRAFTERS``) and its builder gets the argument after the
    method's separator; a new method is one row, and what matches no row is refused naming the methods."""
    from specwise import drafters
    from specwise.drafters import DRAFTERS, DrafterSpec, Method, parse_spec

    assert set(DRAFTERS) == {"none", "ngram", "model", "head", "suffix", "self"}
    assert parse_spec("ngram:3:2") == DrafterSpec("ngram:3:2", "ngram", "3:2")
    assert parse_spec("self?vocab=64") == DrafterSpec("self?vocab=64", "self", "vocab=64")
    assert parse_spec("head") == DrafterSpec("head", "head", None)
    assert parse_spec("model:a.gguf?vocab=8").arg == "a.gguf?vocab=8"
    for bad in ("self:x", "model", "model:", "none:x", "ngramx", "magic:1"):
        with pytest.raises(ValueError, match="unknown drafter") as err:
            make_drafter(bad, None)
        assert "ngram[:MAX_N[:MIN_N]]" in str(err.value)  # the spec's forms, from DRAFTER_HELP
    seen = []
    new = Method(lambda spec, build: seen.append((spec.arg, build.device)) or NoDrafter(build.device), separator="/")
    monkeypatch.setitem(drafters.DRAFTERS, "echo", new)
    [built] = make_drafter("ngram+echo/x", None, device="cpu")[1:]
    assert isinstance(built, NoDrafter) and seen == [("x", "cpu")]


# ---- forks: one drafter per sequence of a batch --------------------------------------------------------------

SAMPLE = SamplingParams(temperature=1.0, top_k=6)
CTX_A = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3, 4, 5, 9, 2]
CTX_B = [6, 6, 7, 0, 6, 6, 7, 1, 4, 0, 6, 6, 7, 0, 2]
# each sequence's contexts step by step: growing by 1 to 3 tokens, then a new request (a shorter context)
STEPS_A = [CTX_A[:n] for n in (4, 6, 7, 10, 13, 14, 17)] + [CTX_B[:5], CTX_B[:8]]
STEPS_B = [CTX_B[:n] for n in (3, 4, 7, 9, 11, 12, 15)] + [CTX_A[:6], CTX_A[:9]]


def summary(draft) -> tuple:
    probs = None if draft.probs is None else draft.probs.tolist()
    return draft.tokens.tolist(), probs, draft.confidence, draft.kind


def drafts_in_turn(drafters, steps, params=GREEDY, seeds=None, before=None, k=4, stop=0.0):
    """Each drafter proposes for its own sequence's contexts (``steps[i]``), the drafters taking turns step by step;
    ``before[i](context)`` runs before drafter i is asked (its target's pass). Returns each one's drafts."""
    seeds = seeds or list(range(len(drafters)))
    gens = [make_generator(100 + s) for s in seeds]
    out = [[] for _ in drafters]
    for step in range(max(map(len, steps))):
        for i, drafter in enumerate(drafters):
            if step < len(steps[i]):
                if before is not None:
                    before[i](steps[i][step])
                draft = drafter.propose(steps[i][step], k, params, gens[i], stop)
                out[i].append(summary(draft))
    return out


def assert_forks_draft_alone(make, fork, params=GREEDY, stop=0.0, steps=(STEPS_A, STEPS_B)):
    """A drafter and its fork (``fork(drafter)``), asked in turn for two sequences, propose exactly what a fresh
    drafter (``make()``) asked for each sequence alone proposes."""
    first = make()
    second = fork(first)
    assert type(second) is type(first) and second is not first
    together = drafts_in_turn([first, second], list(steps), params)
    for i, seq_steps in enumerate(steps):
        assert together[i] == drafts_in_turn([make()], [seq_steps], params, seeds=[i])[0]


def test_forks_of_the_ngram_drafter_keep_their_own_index():
    assert_forks_draft_alone(lambda: NgramDrafter(max_ngram=3), lambda d: d.fork(None))
    d = NgramDrafter(max_ngram=4, min_ngram=2)
    d.propose(CTX_A, 4, GREEDY, None)
    f = d.fork(None)
    assert (f.max_ngram, f.min_ngram) == (4, 2) and f._last is not d._last and f._last[2] == {}


def test_fork_of_no_drafter_proposes_nothing():
    fork = NoDrafter().fork(None)
    assert isinstance(fork, NoDrafter) and propose(fork, [1, 2, 1]) == []


@pytest.mark.parametrize("params", [GREEDY, SAMPLE], ids=["greedy", "sampling"])
def test_forks_of_the_model_drafter_draft_on_their_own_sequence(params):
    table = ToyModel.random(10, seed=5).table
    assert_forks_draft_alone(lambda: ModelDrafter(ToyModel(table)), lambda d: d.fork(None), params)
    d = ModelDrafter(ToyModel(table))
    f = d.fork(ToyModel(table).sequence())
    assert f.model is not d.model and f.model.table is d.model.table and f._fed is not d._fed
    assert_forks_draft_alone(lambda: ModelDrafter(ToyModel(table), lookup=2), lambda d: d.fork(None), params)
    staged = ModelDrafter(ToyModel(table), lookup=2)
    forked = staged.fork(None)
    assert forked.lookup is not staged.lookup and forked.lookup.max_ngram == 2


def test_forks_of_a_native_model_drafter_share_its_weights():
    needs_hf()
    from conftest import tiny_llama
    from specwise.models.native import NativeModel

    hf = tiny_llama(seed=2, layers=1)
    assert_forks_draft_alone(lambda: ModelDrafter(NativeModel(hf)), lambda d: d.fork(None), SAMPLE)
    d = ModelDrafter(NativeModel(hf))
    f = d.fork(None)
    assert f.model.layers is d.model.layers and f.model.k_cache.data_ptr() != d.model.k_cache.data_ptr()


class _Plain(Drafter):  # a Drafter that does not say what its per-sequence state is
    def propose(self, context, k, params, generator, stop=0.0):
        raise AssertionError


def test_a_drafter_without_a_fork_says_so():
    with pytest.raises(NotImplementedError, match="_Plain does not say which of its state is per sequence"):
        _Plain().fork(None)


def test_a_draft_model_with_a_narrower_padded_output_layer_drafts_for_the_wider_target(monkeypatch):
    """Converters pad a model's output layer to its own width (Qwen2.5-7B: 152,064 rows, its 0.5B sibling
    151,936): with the same tokenizer, whose ids all fit in the draft's rows, the draft model is accepted, drafts
    over its own rows (q zero on the target's padding rows), and greedy speculative output equals plain greedy.
    A tokenizer reaching past the draft's rows, or a wider draft, is refused."""
    import specwise.models.loader as loader
    from specwise.drafters import VocabularyMismatchError, check_same_vocabulary, make_drafter
    from specwise.engine import Engine

    class Tok:
        def __init__(self, n):
            self.vocab = {f"t{i}": i for i in range(n)}

        def get_vocab(self):
            return dict(self.vocab)

    class Loaded:
        def __init__(self, model, tokenizer):
            self.model, self.tokenizer, self.name, self.hf_model, self.eos_token_ids = (
                model,
                tokenizer,
                "toy",
                None,
                None,
            )

    padded = ToyModel.random(20, seed=1)
    padded.table[..., 16:] = float("-inf")  # padding rows: never written
    target = Loaded(padded, Tok(14))
    monkeypatch.setattr(loader, "load_model", lambda *a, **kw: Loaded(ToyModel.random(16, seed=2), Tok(14)))
    [drafter] = make_drafter("model:toy", target)
    assert drafter.vocab_size == 20 and drafter.vocab_ids.tolist() == list(range(16))
    params = SamplingParams(temperature=0.8)
    draft = drafter.propose([1, 2, 3], 3, params, make_generator(0))
    assert draft.probs.shape == (3, 20) and float(np.abs(draft.probs[:, 16:]).sum()) == 0.0
    plain = Engine(target.model, None, gamma=0).generate([1, 2, 3], SamplingParams(), 24, eos_token_ids=[])
    spec = Engine(target.model, make_drafter("model:toy", target), gamma=3).generate(
        [1, 2, 3], SamplingParams(), 24, eos_token_ids=[]
    )
    assert spec.token_ids == plain.token_ids
    # a target that writes a padding row anyway: the draft model, which cannot take it in, drafts nothing after it
    writes_padding = Loaded(ToyModel.random(20, seed=3), Tok(14))
    plain = Engine(writes_padding.model, None, gamma=0).generate([1, 2, 3], SamplingParams(), 40, eos_token_ids=[])
    assert max(plain.token_ids) >= 16
    spec = Engine(writes_padding.model, make_drafter("model:toy", writes_padding), gamma=3).generate(
        [1, 2, 3], SamplingParams(), 40, eos_token_ids=[]
    )
    assert spec.token_ids == plain.token_ids

    def padded(n):  # a converter pads the token list to the output layer's rows
        tok = Tok(14)
        tok.vocab.update({f"[PAD{i}]": i for i in range(14, n)})
        return tok

    check_same_vocabulary(20, 16, padded(20), padded(16))
    other = padded(16)
    other.vocab["x"] = other.vocab.pop("t3")  # a real difference below the draft's rows
    with pytest.raises(VocabularyMismatchError, match="token id 3"):
        check_same_vocabulary(20, 16, padded(20), other)
    with pytest.raises(VocabularyMismatchError, match="differs"):
        check_same_vocabulary(16, 20, Tok(14), Tok(14))
    with pytest.raises(VocabularyMismatchError, match="differs"):
        check_same_vocabulary(20, 16)  # no tokenizers to tell padding from tokens


def test_model_spec_lookahead_option_is_checked():
    from specwise.drafters.model import LOOKAHEAD
    from specwise.drafters.vocab import lookahead_option, parse_model_spec

    _, options = parse_model_spec("d.gguf?vocab=65536&lookahead=1")
    assert lookahead_option(options) == 1.0
    assert lookahead_option(parse_model_spec("d.gguf?vocab=65536")[1]) == LOOKAHEAD
    for bad in ("0", "1.5", "x", "-0.2"):
        with pytest.raises(ValueError, match="lookahead"):
            lookahead_option(parse_model_spec(f"d.gguf?lookahead={bad}")[1])
    with pytest.raises(ValueError, match="lookahead"):
        ModelDrafter(ToyModel.random(4, seed=0), lookahead=0.0)


def test_model_drafter_keeps_the_prefix_a_new_request_shares_and_drafts_as_a_fresh_one():
    """A new request's prompt that shares a prefix with what the draft model holds (a chat's earlier turns) takes in
    only the rest; its drafts equal those of a drafter begun on an empty cache. Anything else writing the draft
    model's cache in between empties it."""
    table = ToyModel.random(12, seed=7).table
    kept, fresh = ModelDrafter(ToyModel(table)), ModelDrafter(ToyModel(table))
    first = [1, 2, 3, 4, 5, 6, 7, 8]
    kept.begin(first)
    draft = kept.propose(first, 3, GREEDY, None)
    turn = first + draft.tokens.tolist()[:2] + [9, 10, 11]  # the answer so far, then the next turn's tokens
    kept.begin(turn)
    assert kept.pending(turn) == len(turn) - len(first) - 2  # the shared prefix is not taken in again
    fresh.begin(turn)
    assert fresh.pending(turn) == len(turn)
    a, b = kept.propose(turn, 4, GREEDY, None), fresh.propose(turn, 4, GREEDY, None)
    assert a.ids == b.ids and a.intake == len(turn) - len(first) - 2 and b.intake == len(turn)
    assert kept.model.tokens[: len(turn)] == turn
    # another writer of the draft model's cache: the next request starts empty
    kept.model.forward([3])
    kept.begin(turn)
    assert kept.pending(turn) == len(turn) and kept.model.length == 0
