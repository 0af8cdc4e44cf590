"""Drafters: prompt lookup, the model drafter's cache syncing, and the vocabulary check."""

from __future__ import annotations

import pytest
import torch

from specwise.drafters import (
    ModelDrafter,
    NgramDrafter,
    NoDrafter,
    VocabularyMismatchError,
    check_same_vocabulary,
    make_drafter,
)
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams

GREEDY = SamplingParams()


def propose(drafter, context, k=4):
    return drafter.propose(context, k, GREEDY, None).tokens.tolist()


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


def test_model_drafter_sampling_returns_q_rows():
    drafter = ModelDrafter(ToyModel.random(8, seed=4))
    drafter.begin([1])
    draft = drafter.propose([1, 2], 3, SamplingParams(temperature=1.0, top_k=4), torch.Generator().manual_seed(0))
    assert draft.probs.shape == (3, 8)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(3))
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
    assert isinstance(make_drafter("none", None), NoDrafter)
    assert make_drafter("ngram:5", None).max_ngram == 5
    assert make_drafter("ngram:4:2", None).min_ngram == 2
    with pytest.raises(ValueError, match="unknown drafter"):
        make_drafter("magic", None)
    with pytest.raises(ValueError, match="ngram takes integers"):
        make_drafter("ngram:x", None)
