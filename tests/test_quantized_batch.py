"""QuantizedModel.sequence and forward_batch on the tiny GGUF files of test_quantized_model.py: several sequences
in one pass give bit for bit the logits (and features) each gives alone, in both precisions."""

from __future__ import annotations

import numpy as np
import pytest
from test_quantized_model import VARIANTS, assert_bits, ids, sequence, write_gguf

from specwise.models.kernels.quant import MAX_ROWS
from specwise.models.quantized import QuantizedModel
from specwise.models.toy import ToyModel

# the plain Llama formats, the K-quants (a wider model) and Qwen2 (QKV biases)
BATCH_VARIANTS = ("llama-Q4_0", "llama-K", "qwen2-Q5_1")


@pytest.fixture(scope="module", params=BATCH_VARIANTS)
def tiny(request, tmp_path_factory):
    """(path, spec) of one tiny GGUF model."""
    spec = VARIANTS[request.param]
    path = tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf"
    write_gguf(path, spec)
    return path, spec


@pytest.fixture(params=("exact", "q8"))
def precision(request):
    return request.param


def streams(spec, n: int = 3) -> list[list[int]]:
    """Each sequence's tokens: the first has a prefill of more than MAX_ROWS rows."""
    return [sequence(spec, MAX_ROWS + 30, seed=20 + i) for i in range(n)]


# Steps of a batch of three sequences: per sequence (tokens taken from its stream, num_logits), or a rollback to a
# length. Ragged: one sequence in a long prefill (its rows cross the kernel's slices of MAX_ROWS) beside others
# decoding (1 row) or verifying (4, 2 rows); a pass whose slice boundary falls between two sequences' rows; keeps
# of 0.
STEPS = [
    [(MAX_ROWS + 6, None), (1, 1), (2, 0)],  # 73 rows: the first slice ends inside the first sequence
    [(1, 1), (4, None), (2, 2)],
    [("rollback", MAX_ROWS + 5), ("rollback", 3), None],  # drafts rejected (the third sits this step out)
    [(1, 1), (40, 0), (30, 5)],  # 71 rows: the slice boundary falls inside the third sequence
    [(4, 4), (2, 1), (1, None)],
]


def run_steps(model: QuantizedModel, seqs: list[QuantizedModel], tokens: list[list[int]]):
    """Run STEPS in batches; returns per sequence the logits of each of its forwards (in order)."""
    out: list[list[np.ndarray]] = [[] for _ in seqs]
    fed = [0] * len(seqs)  # tokens of each stream fed (rolled-back ones are fed again)
    for step in STEPS:
        items, keeps, who = [], [], []
        for i, action in enumerate(step):
            if action is None:
                continue
            if action[0] == "rollback":
                seqs[i].rollback(action[1])
                fed[i] = action[1]
                continue
            count, keep = action
            items.append((seqs[i], ids(tokens[i][fed[i] : fed[i] + count])))
            keeps.append(keep)
            who.append(i)
            fed[i] += count
        if items:
            for i, logits in zip(who, model.forward_batch(items, keeps)):
                out[i].append(logits)
    return out


def alone(tiny, precision: str, i: int, tokens: list[int], keep_features: bool = False):
    """Sequence ``i``'s steps on a fresh model of its own, one forward per step."""
    model = QuantizedModel(tiny[0], precision=precision)
    model.keep_features = keep_features
    out, fed = [], 0
    for step in STEPS:
        action = step[i]
        if action is None:
            continue
        if action[0] == "rollback":
            model.rollback(action[1])
            fed = action[1]
            continue
        count, keep = action
        out.append(model.forward(ids(tokens[fed : fed + count]), keep))
        fed += count
    return model, out


def test_a_batch_gives_each_sequence_its_own_logits(tiny, precision):
    _, spec = tiny
    tokens = streams(spec)
    model = QuantizedModel(tiny[0], precision=precision)
    seqs = [model, model.sequence(), model.sequence()]
    got = run_steps(model, seqs, tokens)
    for i, seq in enumerate(seqs):
        single, want = alone(tiny, precision, i, tokens[i])
        assert len(got[i]) == len(want)
        for g, w in zip(got[i], want):
            assert_bits(g, w)
        assert seq.length == single.length


def test_num_logits_per_sequence(tiny, precision):
    _, spec = tiny
    tokens = streams(spec)
    model = QuantizedModel(tiny[0], precision=precision)
    seqs = [model, model.sequence(), model.sequence()]
    counts, keeps = (MAX_ROWS + 6, 4, 2), (0, None, 1)
    out = model.forward_batch([(s, ids(t[:c])) for s, t, c in zip(seqs, tokens, counts)], list(keeps))
    assert [o.shape for o in out] == [(0, spec.vocab), (4, spec.vocab), (1, spec.vocab)]
    assert [s.length for s in seqs] == list(counts)
    for o, t, c in zip(out, tokens, counts):
        whole = QuantizedModel(tiny[0], precision=precision).forward(ids(t[:c]))
        assert_bits(o, whole[c - o.shape[0] :])
    none = model.forward_batch([(s, ids(t[c : c + 1])) for s, t, c in zip(seqs, tokens, counts)], [0, 0, 0])
    assert all(o.shape == (0, spec.vocab) for o in none)


def test_features_are_kept_for_the_sequence_that_asks(tiny, precision):
    _, spec = tiny
    tokens = streams(spec)
    model = QuantizedModel(tiny[0], precision=precision)
    model.keep_features = True
    seqs = [model.sequence(), model.sequence(), model.sequence()]
    assert not any(s.keep_features for s in seqs)  # a new sequence keeps none until asked
    seqs[1].keep_features = True
    run_steps(model, seqs, tokens)
    single, _ = alone(tiny, precision, 1, tokens[1], keep_features=True)
    assert_bits(seqs[1].features(0, seqs[1].length), single.features(0, single.length))
    for other in (seqs[0], seqs[2]):
        with pytest.raises(RuntimeError, match="keep_features"):
            other.features(0, 1)


def test_sequences_share_the_weights_not_the_cache(tiny):
    model = QuantizedModel(tiny[0], precision="exact")
    model.forward(ids([1, 2, 3]))
    other = model.sequence()
    assert other.length == 0 and model.length == 3
    assert other._stack is model._stack and other.layers is model.layers and other.embed is model.embed
    assert not np.shares_memory(other.k_cache, model.k_cache)
    assert not np.shares_memory(other._features, model._features)


def test_a_batch_takes_lists_of_ids_and_an_empty_batch_is_empty(tiny):
    model = QuantizedModel(tiny[0], precision="exact")
    other = model.sequence()
    assert model.forward_batch([]) == []
    got = model.forward_batch([(model, [1, 2, 3]), (other, (4, 5))], [None, 1])
    assert all(isinstance(g, np.ndarray) and g.dtype == np.float32 and g.flags.c_contiguous for g in got)
    assert_bits(got[0], QuantizedModel(tiny[0], precision="exact").forward(ids([1, 2, 3])))
    assert_bits(got[1], QuantizedModel(tiny[0], precision="exact").forward(ids([4, 5]))[1:])


def test_bad_batches_are_refused_and_change_nothing(tiny):
    model = QuantizedModel(tiny[0], precision="exact")
    other = model.sequence()
    model.forward(ids([1, 2]))
    with pytest.raises(ValueError, match="twice"):
        model.forward_batch([(other, ids([1])), (model, ids([3])), (other, ids([2]))])
    stranger = QuantizedModel(tiny[0], precision="exact")  # the same file, but other weights in memory
    with pytest.raises(ValueError, match="sequences of this model"):
        model.forward_batch([(model, ids([3])), (stranger, ids([1]))])
    with pytest.raises(ValueError, match="sequences of this model"):
        model.forward_batch([(ToyModel.random(8), ids([1]))])
    with pytest.raises(ValueError, match="2 sequences need 2 num_logits, got 3"):
        model.forward_batch([(model, ids([3])), (other, ids([1]))], [1, 1, 1])
    with pytest.raises(ValueError, match="num_logits"):
        model.forward_batch([(model, ids([3])), (other, ids([1]))], [2, 1])
    assert (model.length, other.length, stranger.length) == (2, 0, 0)
