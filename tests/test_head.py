"""The head drafter: target features, training-time unrolling equal to inference, exactness, files, errors.

Most tests draft on a tiny GGUF target (``gguf_raw.tiny_model``: the quantized model, no torch) with a random
numpy head; those that compare against the torch training module (:class:`EagleHead`) or a Hugging Face target
need the hf extra (``needs_hf``).
"""

from __future__ import annotations

import gc
import itertools
import weakref
from pathlib import Path

import numpy as np
import pytest
from gguf_raw import ARRAY, HIDDEN, STRING, VOCAB, q8_0, tiny_model
from test_engine import chi2_pvalue

from conftest import needs_hf, tiny_llama
from specwise.drafters import make_drafter
from specwise.drafters.base import common_prefix
from specwise.drafters.head import HeadConfig, HeadDrafter, HeadWeights, TargetMismatchError, check_target, read_head
from specwise.drafters.head.format import head_tensor_shapes, target_identity, write_head
from specwise.drafters.head.quantized import head_quantization_available
from specwise.engine import Engine
from specwise.metrics import SpecStats
from specwise.models import kernels
from specwise.models.loader import LoadedModel
from specwise.models.quantized import QuantizedModel, TargetWeights
from specwise.models.toy import ToyModel
from specwise.planner import FixedPlanner
from specwise.sampling import SamplingParams, make_generator, probs_from_logits

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = SamplingParams(temperature=0.0)
BACKENDS = ["quantized", "kernel", "numpy"]  # the quantized kernels, the float kernels, numpy alone


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    """A tiny Llama GGUF file (hidden 64, 4 heads, 2 key-value heads, 96 tokens, Q8_0 matrices)."""
    path = tmp_path_factory.mktemp("target") / "tiny.gguf"
    path.write_bytes(tiny_model(seed=0).bytes())
    return path


@pytest.fixture(scope="module")
def gguf5(tmp_path_factory) -> Path:
    """The tiny GGUF model with a vocabulary of 5 tokens (its sampled output can be checked against exact p): its
    embedding, tied to the output layer, scaled down to logits of a few units (flat enough that every sequence of 3
    tokens is drawn)."""
    g = tiny_model(seed=4)
    embed = g.tensor("token_embd.weight")
    blocks = np.frombuffer(q8_0(5, HIDDEN, np.random.default_rng(9)), dtype=np.uint8).reshape(-1, 34).copy()
    blocks[:, :2] = np.full(len(blocks), 0.004, dtype=np.float16).view(np.uint8).reshape(-1, 2)  # Q8_0 scales
    embed.dims, embed.data = [HIDDEN, 5], blocks.tobytes()
    g.set("tokenizer.ggml.tokens", ARRAY, (STRING, [f"t{i}" for i in range(5)]))
    path = tmp_path_factory.mktemp("target5") / "tiny5.gguf"
    path.write_bytes(g.bytes())
    return path


def _target(path: Path) -> QuantizedModel:
    return QuantizedModel(path, name="tiny")


def _config(model: QuantizedModel, draft_vocab: int, name: str = "tiny") -> HeadConfig:
    c = model.config
    return HeadConfig(
        hidden_size=c.hidden_size,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        intermediate_size=2 * c.hidden_size,
        rms_eps=1e-5,
        draft_vocab_size=draft_vocab,
        target=target_identity(TargetWeights(model), name),
    )


def _tensors(config: HeadConfig, vocab_ids, seed: int = 0) -> dict[str, np.ndarray]:
    """A random head's tensors with peaked outputs (every weight and norm normal with std 0.3)."""
    rng = np.random.default_rng(seed)
    tensors = {name: rng.normal(0, 0.3, shape).astype(np.float32) for name, shape in head_tensor_shapes(config).items()}
    tensors["vocab_ids"] = np.asarray(vocab_ids, dtype=np.int64)
    hd = config.head_dim
    tensors["inv_freq"] = (1.0 / 10000.0 ** (np.arange(0, hd, 2) / hd)).astype(np.float32)
    return tensors


def _head(model: QuantizedModel, vocab_ids=None, seed: int = 0) -> HeadWeights:
    """A random head for ``model``'s weights, attached to them."""
    weights = TargetWeights(model)
    vocab_ids = np.arange(model.vocab_size) if vocab_ids is None else np.asarray(vocab_ids)
    config = _config(model, len(vocab_ids))
    head = HeadWeights(config, _tensors(config, vocab_ids, seed))
    head.attach_target(weights)
    return head


def _drafter(head: HeadWeights, target, backend: str, monkeypatch=None, **options) -> HeadDrafter:
    """A drafter on ``backend``: quantized (skipped without the quantized kernels), kernel (the float kernels:
    skipped without them) or numpy (the float kernels hidden)."""
    if backend == "quantized" and not head_quantization_available():
        pytest.skip("the quantized kernels are unavailable here")
    if backend == "kernel" and not kernels.small_gemm_available():
        pytest.skip(f"the float kernels are unavailable here: {kernels.kernel_error()}")
    if backend == "numpy":
        assert monkeypatch is not None
        monkeypatch.setattr("specwise.drafters.head.drafter.small_gemm_available", lambda: False)
    drafter = HeadDrafter(head, target, quantized=backend == "quantized", **options)
    assert drafter._backend == backend and drafter.quantized == (backend == "quantized")
    return drafter


def _fed(path: Path, positions: int) -> tuple[QuantizedModel, np.ndarray, np.ndarray]:
    """(target, features, next tokens): the target after taking in ``positions`` tokens, with its features."""
    target = _target(path)
    target.keep_features = True
    ids = np.array([5, 9, 2, 7, 7, 1, 3, 8, 6, 4] * (positions // 10), dtype=np.int64)
    target.forward(ids, num_logits=0)
    return target, target.features(0, positions), np.concatenate([ids[1:], ids[:1]])


# ---- the step: its implementations agree ----------------------------------------------------------------------


def test_the_float_layer_kernel_and_numpy_compute_the_same_step(gguf, monkeypatch):
    """The head's layer run by the float layer kernel (in calls of at most 32 rows), by numpy over the kernel's
    products, and by numpy alone give the same predictions, over a catch-up of 40 positions and two drafting steps."""
    target, feats, nxt = _fed(gguf, 40)
    head = _head(target)
    runs = []
    for backend, fused in (("kernel", True), ("kernel", False), ("numpy", False)):
        drafter = _drafter(head, target, backend, monkeypatch, half_weights=False)
        if fused and drafter._fused is None:
            pytest.skip("the float layer kernel is unavailable here")
        if not fused:
            drafter._fused = None
        first = drafter._step(feats, nxt, 0)
        second = drafter._step(first[-1:], nxt[:1], 40)
        third = drafter._step(second[-1:], nxt[1:2], 41)
        runs.append((first, second, third, drafter._logits(third[-1])))
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-4)


def test_half_weight_drafting_matches_float32_on_a_float16_head(gguf):
    """The drafter's float16 weight copies (kernel path) give the float32 drafter's predictions when the head's
    weights are float16 values (as a shipped head's are); only the output layer's rows are rounded."""
    if not kernels.small_gemm_available():
        pytest.skip(f"kernel unavailable: {kernels.kernel_error()}")
    target, feats, nxt = _fed(gguf, 10)
    head = _head(target)
    for name, value in head.tensors.items():
        if value.dtype == np.float32 and name != "inv_freq":
            head.tensors[name] = value.astype(np.float16).astype(np.float32)
    full = HeadDrafter(head, target, half_weights=False)
    half = HeadDrafter(head, target)
    assert half._qkv.weight.dtype == np.float16 and full._qkv.weight.dtype == np.float32
    assert half._fused is not None  # the layer kernel reading float16 weights
    a, b = full._step(feats, nxt, 0), half._step(feats, nxt, 0)
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(half._lm(b), full._lm(a), atol=2e-2, rtol=1e-2)  # output rows rounded to float16
    many = np.random.default_rng(0).standard_normal((40, feats.shape[1])).astype(np.float32)
    np.testing.assert_allclose(half._qkv(many), full._qkv(many), atol=1e-4, rtol=1e-4)


def test_the_native_head_step_in_slices_and_its_choice(gguf):
    """The quantized head's native step: 100 positions (two slices of at most 64) give the bits of 60 then 40; the
    choice it computes with its step is the one the output layer gives on its own, with the softmax's probability."""
    from specwise.models.kernels.quant import q_gemm

    target, feats, nxt = _fed(gguf, 100)
    head = _head(target)
    one, two = _drafter(head, target, "quantized"), _drafter(head, target, "quantized")
    whole = one._step(feats, nxt, 0, confidence=True)
    parts = np.concatenate([two._step(feats[:60], nxt[:60], 0), two._step(feats[60:], nxt[60:], 60)])
    np.testing.assert_array_equal(whole, parts)
    logits = q_gemm(one._q[2], whole[-1:].copy(), mode="q8")[0]
    token, q, confidence = one._choose(whole[-1], GREEDY, None, stop=0.1)  # from the step's own output layer
    assert q is None and token == int(one._vocab_ids[int(np.argmax(logits))])
    e = np.exp(logits.astype(np.float64) - logits.max())
    assert confidence == pytest.approx(float(e.max() / e.sum()), rel=1e-4)
    again = one._choose(whole[-1], GREEDY, None, stop=0.1)  # the step's result is used once: now computed anew
    assert again[0] == token and again[2] == pytest.approx(confidence, rel=1e-4)


@pytest.mark.parametrize("backend", ["kernel", "numpy"])
def test_the_quantized_head_computes_what_the_float_head_computes_up_to_8_bits(gguf, monkeypatch, backend):
    target, feats, nxt = _fed(gguf, 50)  # 50 positions: more than one call of 32 rows
    head = _head(target)
    full = _drafter(head, target, backend, monkeypatch, half_weights=False)
    monkeypatch.undo()
    q8 = _drafter(head, target, "quantized")
    assert not hasattr(q8, "_qkv")  # no float copies kept
    a, b = full._step(feats, nxt, 0), q8._step(feats, nxt, 0)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert float(cos.min()) > 0.98  # 8-bit weights and activations: close, not equal
    # a row's result does not depend on how many rows share the call (the kernels' contract)
    np.testing.assert_array_equal(q8._step(feats[:1], nxt[:1], 0), b[:1])


# ---- drafting through the engine: exact ------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_identity_with_a_head_drafter(gguf, monkeypatch, gamma, backend):
    plain = Engine(_target(gguf), None, gamma=0)
    target = _target(gguf)
    drafter = _drafter(_head(target, np.arange(0, 96, 2)), target, backend, monkeypatch)
    engine = Engine(target, drafter, gamma=gamma)
    for prompt in ([4], [1, 2, 3], [9, 9, 9, 9, 9, 30, 31]):
        want = plain.generate(prompt, GREEDY, max_new_tokens=24, eos_token_ids=[]).token_ids
        got = engine.generate(prompt, GREEDY, max_new_tokens=24, eos_token_ids=[])
        assert got.token_ids == want
        assert got.stats.drafted > 0
    assert target.keep_features  # the engine turned features on for the head ...
    Engine(target, None, gamma=0).generate([4], max_new_tokens=2)
    assert not target.keep_features  # ... and off for plain decoding


def test_a_long_context_is_caught_up_on_its_sinks_and_last_window(gguf, monkeypatch):
    """With window W and S sinks, a new context longer than S + W feeds the head its first S positions and its
    last W only (RoPE is relative: as if those positions were the whole sequence); later asks continue the cache."""
    ids = [5, 9, 2, 7, 7, 1, 3, 8, 6, 4, 11, 12, 13]
    target = _target(gguf)
    target.keep_features = True
    target.forward(ids[:11], num_logits=0)  # features for positions 0..10; ids[11] is the newest
    head = _head(target)
    drafter = _drafter(head, target, "numpy", monkeypatch, window=4, sinks=2)
    params = SamplingParams(temperature=1.0)

    def expected_q(positions: list[int]) -> np.ndarray:
        """q of a fresh drafter fed only ``positions`` (at cache positions 0, 1, ...)."""
        fresh = HeadDrafter(head, target, window=None)
        feats = target.features(0, target.length)[positions]
        pred = fresh._step(feats, [ids[i + 1] for i in positions], 0)[-1]
        return probs_from_logits(fresh._logits(pred), params)

    drafter.begin(ids[:12])
    first = drafter.propose(ids[:12], 1, params, make_generator(0))
    np.testing.assert_allclose(first.probs[0][head.vocab_ids], expected_q([0, 1, 7, 8, 9, 10]), atol=1e-6)
    assert not drafter.k_cache[:, 6:].any()  # six positions fed, not eleven
    target.forward([ids[11]], num_logits=0)
    second = drafter.propose(ids, 1, params, make_generator(0))
    np.testing.assert_allclose(second.probs[0][head.vocab_ids], expected_q([0, 1, 7, 8, 9, 10, 11]), atol=1e-6)
    whole = HeadDrafter(head, target, window=None)
    whole.begin(ids)
    got = whole.propose(ids, 1, params, make_generator(0)).probs[0][head.vocab_ids]
    np.testing.assert_allclose(got, expected_q(list(range(12))), atol=1e-6)
    with pytest.raises(ValueError, match="window"):
        HeadDrafter(head, target, window=0)


@pytest.mark.parametrize("window", [None, 3])
def test_greedy_identity_with_a_windowed_head(gguf, window):
    plain = Engine(_target(gguf), None, gamma=0)
    target = _target(gguf)
    engine = Engine(target, HeadDrafter(_head(target), target, window=window, sinks=1), gamma=3)
    for prompt in ([4, 8, 15, 16, 23, 42, 7, 7, 1], [2] * 12, [4]):
        want = plain.generate(prompt, GREEDY, max_new_tokens=20, eos_token_ids=[]).token_ids
        assert engine.generate(prompt, GREEDY, max_new_tokens=20, eos_token_ids=[]).token_ids == want


def _feeder(target):
    """What the engine leaves in the target before a proposal: the context but its newest token, with features."""
    target.keep_features = True
    fed: list[int] = []

    def feed(context: list[int]) -> None:
        common = common_prefix(fed, context[:-1])
        target.rollback(common)
        del fed[common:]
        if len(context) - 1 > common:
            target.forward(context[common:-1], num_logits=0)
            fed.extend(context[common:-1])

    return feed


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("backend", ["quantized", "kernel"])
def test_forks_draft_from_their_own_target_sequence(gguf, backend, window, params):
    """A head drafter and its fork, on two sequences of one target asked in turn, propose what a fresh drafter on
    a fresh target proposes for each sequence alone; the fork shares the head's weights and kernels."""
    from test_drafters import STEPS_A, STEPS_B, drafts_in_turn

    head = _head(_target(gguf), np.arange(0, 96, 2))

    def drafter(target) -> HeadDrafter:
        return _drafter(head, target, backend, window=window, sinks=1)

    target = _target(gguf)
    first = drafter(target)
    second_target = target.sequence()
    second = first.fork(second_target)
    assert second.target is second_target and first.target is target
    assert second._embed is first._embed and second._vocab_ids is first._vocab_ids and second._q is first._q
    if backend == "kernel":
        assert second._qkv is first._qkv and second._lm is first._lm and second._fused is first._fused
    assert not np.shares_memory(second.k_cache, first.k_cache) and second._fed is not first._fed
    before = [_feeder(target), _feeder(second_target)]
    steps = [STEPS_A, STEPS_B]
    together = drafts_in_turn([first, second], steps, params, before=before, stop=1e-3)  # confidences below 1
    for i in range(2):
        alone_target = _target(gguf)
        want = drafts_in_turn([drafter(alone_target)], [steps[i]], params, [i], [_feeder(alone_target)], stop=1e-3)
        assert together[i] == want[0]
    with pytest.raises(ValueError, match="fork for a sequence of the same target"):
        first.fork(ToyModel.random(8))


def test_drafts_stay_in_the_draft_vocabulary_and_q_is_zero_outside(gguf):
    target = _target(gguf)
    vocab = np.arange(10, 60)
    drafter = HeadDrafter(_head(target, vocab), target)
    target.keep_features = True
    target.forward([1, 2, 3], num_logits=0)
    drafter.begin([1, 2, 3, 4])
    draft = drafter.propose([1, 2, 3, 4], 5, SamplingParams(temperature=1.0), make_generator(0))
    assert len(draft) == 5 and all(10 <= t < 60 for t in draft.ids)
    assert draft.probs.dtype == np.float32 and draft.probs.shape == (5, VOCAB)
    outside = np.ones(VOCAB, dtype=bool)
    outside[vocab] = False
    assert float(draft.probs[:, outside].sum()) == 0.0
    np.testing.assert_allclose(draft.probs.sum(-1), np.ones(5), rtol=1e-5)


def _exact_joint(model: QuantizedModel, prompt: list[int], params: SamplingParams, length: int) -> dict:
    out = {}
    for seq in itertools.product(range(model.vocab_size), repeat=length):
        model.rollback(0)
        logits = model.forward(prompt + list(seq))
        prob = 1.0
        for i, tok in enumerate(seq):
            prob *= float(probs_from_logits(logits[len(prompt) - 1 + i], params)[tok])
        out[seq] = prob
    return out


def _assert_follows_target(engine: Engine, path: Path, prompt: list[int], n: int, seed: int) -> SpecStats:
    """n samples of 3 tokens after ``prompt`` at temperature 1 through ``engine`` follow p of the model at
    ``path``."""
    counts: dict = {}
    stats = SpecStats()
    for i in range(n):
        run = SamplingParams(temperature=1.0, seed=seed + i)
        result = engine.generate(prompt, run, max_new_tokens=3, eos_token_ids=[])
        ids = tuple(result.token_ids)
        counts[ids] = counts.get(ids, 0) + 1
        stats.merge(result.stats)
    pvalue = chi2_pvalue(counts, _exact_joint(_target(path), prompt, SamplingParams(temperature=1.0), 3), n)
    assert pvalue > 1e-4, f"emitted sequences do not follow p (chi-square p-value {pvalue:.2e})"
    return stats


def test_sampled_output_with_a_head_follows_the_target(gguf5):
    """Through the engine, with a reduced draft vocabulary (q zero elsewhere), emitted sequences follow p."""
    target = _target(gguf5)
    engine = Engine(target, HeadDrafter(_head(target, [0, 2, 3], seed=1), target), gamma=3)
    stats = _assert_follows_target(engine, gguf5, [1, 4], 4000, seed=5000)
    assert stats.drafted > 0 and 0 < stats.accepted < stats.drafted


def test_low_confidence_stops_drafting_and_output_is_unchanged(gguf):
    target = _target(gguf)
    drafter = HeadDrafter(_head(target), target)
    ref = Engine(_target(gguf), None, gamma=0).generate([2, 5], GREEDY, max_new_tokens=16, eos_token_ids=[])
    full = Engine(target, drafter, gamma=4).generate([2, 5], GREEDY, max_new_tokens=16, eos_token_ids=[])
    strict_planner = FixedPlanner(4, stop=0.999999)  # a random head is never this sure
    strict = Engine(target, drafter, gamma=strict_planner).generate([2, 5], GREEDY, 16, eos_token_ids=[])
    assert strict.token_ids == full.token_ids == ref.token_ids
    assert full.stats.drafted > 0 and strict.stats.drafted == 0
    assert strict.stats.plain_step_reasons.get("low_confidence", 0) > 0
    # sampling: q's largest probability does not estimate acceptance (alpha = sum min(p, q)), so the threshold does
    # not hold a sampled draft back; the planner's measured acceptance decides its length
    sampled = Engine(target, drafter, gamma=strict_planner).generate(
        [2, 5], SamplingParams(temperature=1.0, seed=0), max_new_tokens=16, eos_token_ids=[]
    )
    assert sampled.stats.drafted > 0 and "low_confidence" not in sampled.stats.plain_step_reasons


def test_ngram_and_head_as_two_sources_are_exact(gguf):
    """ngram+head with a fixed gamma: the planner chooses between the two sources; the output is plain decoding's."""
    from specwise.drafters import NgramDrafter

    target = _target(gguf)
    sources = [NgramDrafter(), HeadDrafter(_head(target), target)]
    plain = Engine(_target(gguf), None, gamma=0)
    engine = Engine(target, sources, gamma=4)
    prompt = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]  # repetitive: prompt lookup has matches
    want = plain.generate(prompt, max_new_tokens=30, eos_token_ids=[]).token_ids
    result = engine.generate(prompt, max_new_tokens=30, eos_token_ids=[])
    assert result.token_ids == want
    assert sum(c["steps"] for c in result.stats.by_drafter.values()) > 0


@pytest.mark.parametrize("gamma", [3, "auto"])
def test_sampled_output_with_ngram_and_head_follows_the_target(gguf5, gamma):
    """gamma auto: each drafter is a source of the planner, asked for its own gamma."""
    from specwise.drafters import NgramDrafter

    target = _target(gguf5)
    head = HeadDrafter(_head(target, [0, 2, 3], seed=1), target)
    engine = Engine(target, [NgramDrafter(max_ngram=1), head], gamma=gamma)
    stats = _assert_follows_target(engine, gguf5, [1, 4, 1], 4000, seed=9000)
    assert {name for name, c in stats.by_drafter.items() if c["drafted"]} == {"ngram", "head"}


def test_greedy_identity_with_ngram_and_head_and_gamma_auto(gguf):
    from specwise.drafters import NgramDrafter

    target = _target(gguf)
    combined = [NgramDrafter(), HeadDrafter(_head(target), target)]
    plain = Engine(_target(gguf), None, gamma=0)
    engine = Engine(target, combined, gamma="auto")
    for prompt in ([7, 8, 9, 10, 7, 8, 9, 10, 7, 8], [3, 1, 4, 1, 5, 9, 2, 6]):
        want = plain.generate(prompt, max_new_tokens=40, eos_token_ids=[]).token_ids
        result = engine.generate(prompt, max_new_tokens=40, eos_token_ids=[])
        assert result.token_ids == want
        drafted = {name: c["drafted"] for name, c in result.stats.by_drafter.items()}
        assert sum(drafted.values()) == result.stats.drafted


# ---- files ---------------------------------------------------------------------------------------------------


def _loaded(model: QuantizedModel) -> LoadedModel:
    return LoadedModel(model, None, model.name, TargetWeights(model))


def _write(head: HeadWeights, directory: Path, dtype=np.float32) -> Path:
    tensors = {
        name: value.astype(dtype) if name not in ("vocab_ids", "inv_freq") else value
        for name, value in head.tensors.items()
    }
    write_head(directory, head.config, tensors)
    return directory


def test_write_read_and_make_drafter(gguf, tmp_path):
    """A head written and read back is the same head; `--drafter head:DIR` and `ngram+head:DIR` build on it (no
    torch on the way) and decoding stays exact."""
    target = _target(gguf)
    head = _head(target, np.arange(0, 96, 3))
    read = read_head(_write(head, tmp_path / "h"))
    assert read.config == head.config
    for name, value in head.tensors.items():
        np.testing.assert_array_equal(read.tensors[name], value, err_msg=name)
        assert read.tensors[name].dtype == value.dtype
    loaded = _loaded(target)
    [drafter] = make_drafter(f"head:{tmp_path / 'h'}", loaded)
    assert isinstance(drafter, HeadDrafter) and drafter.quantized == head_quantization_available()
    ref = Engine(_target(gguf), None, gamma=0).generate([3, 4], max_new_tokens=10, eos_token_ids=[]).token_ids
    out = Engine(target, drafter, gamma=3).generate([3, 4], max_new_tokens=10, eos_token_ids=[]).token_ids
    assert out == ref
    assert [d.name for d in make_drafter(f"ngram+head:{tmp_path / 'h'}", loaded)] == ["ngram", "head"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float16_file_drafts_the_same_without_float32_copies(gguf, tmp_path, monkeypatch, backend):
    """read_head keeps a float16 file's weights: the drafter built from them computes what it computes from the
    float32 file of the same values, and keeps neither the head nor its tensors."""
    target, feats, nxt = _fed(gguf, 40)  # 40 rows: beyond the layer kernel's 32
    head = _head(target, np.arange(0, 96, 3))
    _write(head, tmp_path / "half", np.float16)
    _write(read_head(tmp_path / "half"), tmp_path / "full", np.float32)  # the float16 values in float32
    outputs = []
    for name, dtype in (("full", np.float32), ("half", np.float16)):
        read = read_head(tmp_path / name)
        assert read.tensors["qkv.weight"].dtype == dtype
        read.attach_target(TargetWeights(target))
        drafter = _drafter(read, target, backend, monkeypatch)
        if backend == "kernel":
            assert drafter._lm.weight.dtype == np.float16
        gone = weakref.ref(read.tensors["qkv.weight"]), weakref.ref(read)
        del read
        gc.collect()
        assert gone[0]() is None and gone[1]() is None  # the drafter keeps neither the head nor its tensors
        first = drafter._step(feats, nxt, 0)
        second = drafter._step(first[-1:], nxt[:1], 40)
        outputs.append((first, second, drafter._logits(second[-1])))
    for a, b in zip(*outputs):
        np.testing.assert_array_equal(a, b)


def test_a_head_refuses_another_target(gguf, tmp_path):
    target = _target(gguf)
    head = _head(target)
    other_path = tmp_path / "other.gguf"
    other_path.write_bytes(tiny_model(seed=1).bytes())  # same shapes, other weights
    other = _target(other_path)
    with pytest.raises(TargetMismatchError, match="different weights"):
        check_target(head.config, TargetWeights(other), "other")
    _write(head, tmp_path / "h")
    with pytest.raises(TargetMismatchError, match="different weights"):
        make_drafter(f"head:{tmp_path / 'h'}", _loaded(other))
    check_target(head.config, TargetWeights(target), "tiny")  # its own target passes


def test_head_errors_are_clear(gguf, tmp_path):
    target = _loaded(_target(gguf))
    with pytest.raises(ValueError, match="no head is shipped"):
        make_drafter("head", target)
    with pytest.raises(FileNotFoundError, match="specwise distill"):
        make_drafter(f"head:{tmp_path}", target)
    unattached = HeadWeights(_head(target.model).config, _head(target.model).tensors)
    with pytest.raises(RuntimeError, match="attach a target"):
        HeadDrafter(unattached, target.model)


def test_features_need_keep_features(gguf):
    model = _target(gguf)
    model.forward([1, 2])
    with pytest.raises(RuntimeError, match="keep_features"):
        model.features(0, 1)


# ---- against the torch training module and Hugging Face targets (the hf extra) -------------------------------


def _eagle(hf, vocab_ids=None, seed=0):
    """A random EagleHead for ``hf`` with peaked outputs (not an identity-like init)."""
    from specwise.drafters.head import new_head

    torch = needs_hf()
    vocab_ids = torch.arange(hf.config.vocab_size) if vocab_ids is None else torch.as_tensor(vocab_ids)
    head = new_head(hf, "tiny", vocab_ids, seed=seed)
    for p in head.parameters():
        p.data.normal_(0, 0.3)
    return head.eval()


@pytest.mark.parametrize("impl", ["native", "hf"])
def test_features_are_the_final_normed_hidden_states_and_roll_back(impl):
    torch = needs_hf()
    from specwise.models import HFModel
    from specwise.models.native import NativeModel

    hf = tiny_llama(seed=1)
    model = NativeModel(hf) if impl == "native" else HFModel(hf)
    model.keep_features = True
    ids = [3, 7, 1, 9, 4, 4, 2, 8]
    model.forward(np.array(ids[:5]), num_logits=0)
    model.forward(np.array(ids[5:]))
    with torch.no_grad():
        ref = hf.model(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
    np.testing.assert_allclose(model.features(0, 8), ref, atol=1e-5, rtol=1e-5)
    model.rollback(3)
    model.forward(np.array([5, 6]))
    with torch.no_grad():
        ref2 = hf.model(input_ids=torch.tensor([[3, 7, 1, 5, 6]])).last_hidden_state[0].numpy()
    np.testing.assert_allclose(model.features(0, 5), ref2, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="outside the cache"):
        model.features(0, 6)


@pytest.mark.parametrize("backend", ["kernel", "numpy"])
def test_unrolled_training_forward_equals_drafting_with_the_cache(monkeypatch, backend):
    """Step s of the training forward at position t is what the drafter computes for the s-th draft token, on the
    float kernels or in numpy (the drafter's own numbers, not the training module's torch operators)."""
    torch = needs_hf()
    from specwise.models.native import NativeModel

    hf = tiny_llama(seed=1)
    head = _eagle(hf)
    target = NativeModel(hf)
    drafter = _drafter(head, target, backend, monkeypatch, half_weights=False)
    ids = [5, 9, 2, 7, 7, 1, 3, 8, 6, 4]
    target.keep_features = True
    target.forward(np.array(ids))
    feats = target.features(0, 10)
    nxt = ids[1:] + ids[:1]
    with torch.no_grad():
        preds = [p[0].numpy() for p in head(torch.from_numpy(feats)[None], torch.tensor([nxt]), steps=3)]
    L = 6  # the cache holds true positions 0..L-1; drafting continues at L, L+1 with the true next tokens
    out = drafter._step(feats[:L], nxt[:L], 0)
    np.testing.assert_allclose(out[-1], preds[0][L - 1], atol=1e-5, rtol=1e-4)
    out2 = drafter._step(out[-1:], nxt[L : L + 1], L)
    np.testing.assert_allclose(out2[-1], preds[1][L], atol=1e-5, rtol=1e-4)
    out3 = drafter._step(out2[-1:], nxt[L + 1 : L + 2], L + 1)
    np.testing.assert_allclose(out3[-1], preds[2][L + 1], atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        logits = head.logits(torch.from_numpy(out3[-1])).numpy()
    np.testing.assert_allclose(drafter._logits(out3[-1]), logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("quantized", [False, True])
def test_greedy_identity_on_a_hugging_face_target(quantized):
    """A training module over a torch target (its embedding and output rows read from torch tensors): exact."""
    needs_hf()
    from specwise.models.native import NativeModel

    if quantized and not head_quantization_available():
        pytest.skip("the quantized kernels are unavailable here")
    hf = tiny_llama(seed=1)
    plain = Engine(NativeModel(hf), None, gamma=0)
    target = NativeModel(hf)
    drafter = HeadDrafter(_eagle(hf, np.arange(0, 96, 2)), target, quantized=quantized)
    engine = Engine(target, drafter, gamma=4)
    for prompt in ([4], [1, 2, 3], [9, 9, 9, 9, 9, 30, 31]):
        want = plain.generate(prompt, GREEDY, max_new_tokens=24, eos_token_ids=[]).token_ids
        got = engine.generate(prompt, GREEDY, max_new_tokens=24, eos_token_ids=[])
        assert got.token_ids == want and got.stats.drafted > 0


def test_save_head_writes_what_read_head_and_load_head_read(tmp_path):
    """The training module's file: read_head gives its tensors as numpy arrays, load_head the module back."""
    torch = needs_hf()
    from specwise.drafters.head import load_head, save_head

    hf = tiny_llama(seed=1)
    head = _eagle(hf, np.arange(0, 96, 3))
    save_head(head, tmp_path / "h", dtype=torch.float32)
    read = read_head(tmp_path / "h")
    state = head.state_dict()
    assert set(read.tensors) == set(state) == set(head_tensor_shapes(head.config))
    for name, value in state.items():
        np.testing.assert_array_equal(read.tensors[name], value.numpy(), err_msg=name)
    loaded = load_head(tmp_path / "h")
    for (name, a), b in zip(state.items(), loaded.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    save_head(head, tmp_path / "bf16", dtype="bfloat16")  # no numpy dtype: written as BF16, read as float32
    read = read_head(tmp_path / "bf16")
    assert read.tensors["qkv.weight"].dtype == np.float32
    np.testing.assert_array_equal(read.tensors["qkv.weight"], head.qkv.weight.detach().bfloat16().float().numpy())
    assert load_head(tmp_path / "bf16", dtype=None).qkv.weight.dtype == torch.float32


def test_a_head_for_a_wider_hugging_face_target_is_refused(tmp_path):
    needs_hf()
    from specwise.drafters.head import save_head
    from specwise.models.native import NativeModel

    hf = tiny_llama(seed=1)
    save_head(_eagle(hf), tmp_path / "h")
    other = tiny_llama(seed=2)  # same shapes, other weights
    with pytest.raises(TargetMismatchError, match="different weights"):
        make_drafter(f"head:{tmp_path / 'h'}", LoadedModel(NativeModel(other, name="other"), None, "other", other))
    wider = tiny_llama(seed=1, hidden=64)
    with pytest.raises(TargetMismatchError, match="hidden_size"):
        make_drafter(f"head:{tmp_path / 'h'}", LoadedModel(NativeModel(wider, name="wide"), None, "wide", wider))
