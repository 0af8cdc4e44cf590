"""Model.sequence and the default Model.forward_batch on the toy, native and Hugging Face models: sequences of one
model share its weights, not their caches, and each gives the logits it would give alone.

(The quantized model's own batched pass is tested in test_quantized_batch.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import tiny_llama
from specwise.models.toy import ToyModel

KINDS = ("toy", "native", "hf")
A = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
B = [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5]
JUNK = [11, 11, 12]


@pytest.fixture(scope="module")
def hf_module():
    return tiny_llama(seed=1)  # skips where the hf extra is not installed


@pytest.fixture
def make(kind, request):
    """Makes a fresh model of ``kind`` (the toy table and the Hugging Face weights are the same for every call);
    the torch-based kinds need the hf extra, the toy runs everywhere."""
    if kind == "toy":
        return lambda: ToyModel.random(16, seed=0)
    hf_module = request.getfixturevalue("hf_module")
    from specwise.models import HFModel, NativeModel

    return lambda: NativeModel(hf_module) if kind == "native" else HFModel(hf_module)


def ids(tokens: list[int]) -> np.ndarray:
    return np.array(tokens, dtype=np.int64)


def apply(model, op):
    """One operation on a model: ("forward", tokens, num_logits) returns logits, ("rollback", length) None."""
    if op[0] == "forward":
        return model.forward(ids(op[1]), op[2])
    model.rollback(op[1])
    return None


# two sequences' operations: prefill, decode, a verification pass, a rejection (rollback), continuation
OPS_A = [("forward", A[:5], None), ("forward", A[5:6], 1), ("forward", A[6:9], None), ("rollback", 7),
         ("forward", A[7:10], 2), ("forward", A[10:], 0)]  # fmt: skip
OPS_B = [("forward", B[:3], 1), ("forward", B[3:7], None), ("forward", JUNK, None), ("rollback", 7),
         ("forward", B[7:8], None), ("forward", B[8:], 3)]  # fmt: skip


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_interleaved_sequences_give_each_its_own_logits(kind, make):
    """Two sequences of one model, fed in turn (with rollbacks), give bit for bit what a fresh model fed each one
    alone gives. The Hugging Face model is bitwise too: the same module runs the same operators on the same
    shapes for a sequence whether or not another one has its own cache beside it."""
    first = make()
    first.forward(ids([6, 6]))  # a sequence made from a model with tokens in its cache starts empty
    first.reset()
    second = first.sequence()
    assert second.length == 0 and second.vocab_size == first.vocab_size
    got_a, got_b = [], []
    for op_a, op_b in zip(OPS_A, OPS_B):
        got_a.append(apply(first, op_a))
        length_a = first.length
        got_b.append(apply(second, op_b))
        assert first.length == length_a  # the other's forward or rollback leaves this one alone
    assert (first.length, second.length) == (len(A), len(B))
    for ops, got in ((OPS_A, got_a), (OPS_B, got_b)):
        alone = make()
        for op, logits in zip(ops, got):
            want = apply(alone, op)
            if want is not None:
                assert_same(logits, want)


@pytest.mark.parametrize("kind", KINDS)
def test_sequences_share_the_weights_not_the_cache(kind, make):
    model = make()
    other = model.sequence()
    assert type(other) is type(model) and other is not model
    if kind == "toy":
        assert other.table is model.table and other.tokens is not model.tokens
    elif kind == "native":
        assert other.layers is model.layers and other.embed is model.embed and other.lm_head is model.lm_head
        assert other._fused is model._fused
        assert other.k_cache.data_ptr() != model.k_cache.data_ptr()
        assert other._features.data_ptr() != model._features.data_ptr()
    else:
        assert other.model is model.model and other._cache is not model._cache


@pytest.mark.parametrize("kind", KINDS)
def test_default_forward_batch_equals_separate_forwards(kind, make):
    model = make()
    seqs = [model, model.sequence(), model.sequence()]
    first = model.forward_batch([(seqs[0], ids(A[:6])), (seqs[1], ids(B[:2])), (seqs[2], ids(A[:1]))], [None, 1, 0])
    then = model.forward_batch([(s, ids(t)) for s, t in zip(seqs, ([7], B[2:6], A[1:3]))])
    alone = [make() for _ in seqs]
    want_first = [m.forward(ids(t), n) for m, t, n in zip(alone, (A[:6], B[:2], A[:1]), (None, 1, 0))]
    want_then = [m.forward(ids(t)) for m, t in zip(alone, ([7], B[2:6], A[1:3]))]
    for got, want in zip(first + then, want_first + want_then):
        assert_same(got, want)
    assert [s.length for s in seqs] == [7, 6, 3]
    with pytest.raises(ValueError, match="3 sequences need 3 num_logits, got 2"):
        model.forward_batch([(s, ids([1])) for s in seqs], [1, 1])


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_features_are_kept_per_sequence(kind, make):
    model = make()
    model.keep_features = True
    other = model.sequence()
    assert not other.keep_features  # a new sequence keeps none until asked
    model.forward(ids(A[:6]))
    other.forward(ids(B[:4]))
    with pytest.raises(RuntimeError, match="keep_features"):
        other.features(0, 1)
    alone = make()
    alone.keep_features = True
    alone.forward(ids(A[:6]))
    assert_same(model.features(0, 6), alone.features(0, 6))
    other.keep_features = True
    other.forward(ids(B[4:]))
    model.forward(ids(A[6:]))
    alone.forward(ids(A[6:]))
    assert_same(model.features(0, len(A)), alone.features(0, len(A)))
    alone_b = make()
    alone_b.forward(ids(B[:4]))
    alone_b.keep_features = True
    alone_b.forward(ids(B[4:]))
    assert_same(other.features(4, len(B)), alone_b.features(4, len(B)))
