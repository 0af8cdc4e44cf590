"""The head drafter: target features, training-time unrolling equal to inference, exactness, files, errors."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_engine import chi2_pvalue

from conftest import tiny_llama
from specwise.drafters import TargetMismatchError, make_drafter
from specwise.drafters.base import common_prefix
from specwise.drafters.head import HeadDrafter, load_head, new_head, save_head
from specwise.engine import Engine
from specwise.metrics import SpecStats
from specwise.models import HFModel
from specwise.models.loader import LoadedModel
from specwise.models.native import NativeModel
from specwise.models.toy import ToyModel
from specwise.planner import FixedPlanner
from specwise.sampling import SamplingParams, probs_from_logits


def _head(hf, vocab_ids=None, seed=0):
    vocab_ids = torch.arange(hf.config.vocab_size) if vocab_ids is None else vocab_ids
    head = new_head(hf, "tiny", vocab_ids, seed=seed)
    for p in head.parameters():  # a random head with peaked outputs (not an identity-like init)
        p.data.normal_(0, 0.3)
    return head.eval()


@pytest.mark.parametrize("impl", ["native", "hf"])
def test_features_are_the_final_normed_hidden_states_and_roll_back(impl):
    hf = tiny_llama(seed=1)
    model = NativeModel(hf) if impl == "native" else HFModel(hf)
    model.keep_features = True
    ids = torch.tensor([3, 7, 1, 9, 4, 4, 2, 8])
    model.forward(ids[:5], num_logits=0)
    model.forward(ids[5:])
    with torch.no_grad():
        ref = hf.model(input_ids=ids[None]).last_hidden_state[0]
    torch.testing.assert_close(model.features(0, 8), ref, atol=1e-5, rtol=1e-5)
    model.rollback(3)
    model.forward(torch.tensor([5, 6]))
    with torch.no_grad():
        ref2 = hf.model(input_ids=torch.tensor([[3, 7, 1, 5, 6]])).last_hidden_state[0]
    torch.testing.assert_close(model.features(0, 5), ref2, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="outside the cache"):
        model.features(0, 6)


def test_features_need_keep_features():
    model = NativeModel(tiny_llama(seed=1))
    model.forward(torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="keep_features"):
        model.features(0, 1)


@pytest.mark.parametrize("layer_kernel", [True, False])
def test_unrolled_training_forward_equals_drafting_with_the_cache(layer_kernel):
    """Step s of the training forward at position t is what the drafter computes for the s-th draft token, with
    the head's layer run by the native layer kernel or by torch operators."""
    hf = tiny_llama(seed=1)
    head = _head(hf)
    target = NativeModel(hf)
    drafter = HeadDrafter(head, target, half_weights=False)
    if layer_kernel and drafter._fused is None:
        pytest.skip("the native layer kernel is unavailable here")
    if not layer_kernel:
        drafter._fused = None
    ids = torch.tensor([5, 9, 2, 7, 7, 1, 3, 8, 6, 4])
    target.keep_features = True
    target.forward(ids)
    feats = target.features(0, 10)
    nxt = torch.cat([ids[1:], ids[:1]])
    with torch.no_grad():
        preds = head(feats[None], nxt[None], steps=3)
    L = 6  # the cache holds true positions 0..L-1; drafting continues at L, L+1 with the true next tokens
    with torch.no_grad():
        out = drafter._step(feats[:L], nxt[:L], 0)
        torch.testing.assert_close(out[-1], preds[0][0, L - 1], atol=1e-5, rtol=1e-4)
        out2 = drafter._step(out[-1:], nxt[L : L + 1], L)
        torch.testing.assert_close(out2[-1], preds[1][0, L], atol=1e-5, rtol=1e-4)
        out3 = drafter._step(out2[-1:], nxt[L + 1 : L + 2], L + 1)
        torch.testing.assert_close(out3[-1], preds[2][0, L + 1], atol=1e-5, rtol=1e-4)


def test_half_weight_drafting_matches_float32_on_a_float16_head():
    """The drafter's float16 weight copies (kernel path) give the float32 drafter's predictions when the head's
    weights are float16 values (as a shipped head's are); only the output layer's rows are rounded."""
    from specwise.models import kernels

    if not kernels.small_gemm_available():
        pytest.skip(f"kernel unavailable: {kernels.kernel_error()}")
    hf = tiny_llama(seed=1)
    head = _head(hf)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(p.half().float())
    target = NativeModel(hf)
    target.keep_features = True
    ids = torch.tensor([5, 9, 2, 7, 7, 1, 3, 8, 6, 4])
    target.forward(ids)
    feats, nxt = target.features(0, 10), torch.cat([ids[1:], ids[:1]])
    full = HeadDrafter(head, target, half_weights=False)
    half = HeadDrafter(head, target)
    assert half._qkv.weight.dtype == torch.float16 and full._qkv.weight.dtype == torch.float32
    assert half._fused is not None  # the layer kernel reading float16 weights
    with torch.no_grad():
        a, b = full._step(feats, nxt, 0), half._step(feats, nxt, 0)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
        la, lb = full._lm(a, "kernel"), half._lm(b, "kernel")
    torch.testing.assert_close(lb, la, atol=2e-2, rtol=1e-2)  # output rows rounded to float16
    many = torch.randn(40, feats.shape[1])  # beyond the kernel's 32 rows: torch with a float32 copy
    torch.testing.assert_close(half._qkv(many, "kernel"), full._qkv(many, "kernel"), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("quantized", [False, True])
def test_greedy_identity_with_a_head_drafter(gamma, quantized):
    from specwise.drafters.head.quantized import head_quantization_available

    if quantized and not head_quantization_available():
        pytest.skip("the quantized kernels are unavailable here")
    hf = tiny_llama(seed=1)
    plain = Engine(NativeModel(hf), None, gamma=0)
    target = NativeModel(hf)
    drafter = HeadDrafter(_head(hf, torch.arange(0, 96, 2)), target, quantized=quantized)
    assert drafter.quantized == quantized
    engine = Engine(target, drafter, gamma=gamma)
    for prompt in ([4], [1, 2, 3], [9, 9, 9, 9, 9, 30, 31]):
        greedy = SamplingParams(temperature=0.0)
        want = plain.generate(prompt, greedy, max_new_tokens=24, eos_token_ids=[]).token_ids
        got = engine.generate(prompt, greedy, max_new_tokens=24, eos_token_ids=[])
        assert got.token_ids == want
        assert got.stats.drafted > 0
    assert target.keep_features  # the engine turned features on for the head ...
    Engine(target, None, gamma=0).generate([4], max_new_tokens=2)
    assert not target.keep_features  # ... and off for plain decoding


def test_a_long_context_is_caught_up_on_its_sinks_and_last_window():
    """With window W and S sinks, a new context longer than S + W feeds the head its first S positions and its
    last W only (RoPE is relative: as if those positions were the whole sequence); later asks continue the cache."""
    hf = tiny_llama(seed=1)
    head = _head(hf)
    target = NativeModel(hf)
    drafter = HeadDrafter(head, target, half_weights=False, window=4, sinks=2)
    ids = [5, 9, 2, 7, 7, 1, 3, 8, 6, 4, 11, 12, 13]
    target.keep_features = True
    target.forward(torch.tensor(ids[:11]), num_logits=0)  # features for positions 0..10; ids[11] is the newest
    params = SamplingParams(temperature=1.0)

    def expected_q(positions):
        feats = target.features(0, target.length)[positions]
        nxt = torch.tensor([ids[i + 1] for i in positions])
        with torch.no_grad():
            pred = head(feats[None], nxt[None], steps=1)[0][0, -1]
            return probs_from_logits(head.logits(pred), params)

    drafter.begin(ids[:12])
    first = drafter.propose(ids[:12], 1, params, torch.Generator().manual_seed(0))
    torch.testing.assert_close(first.probs[0], expected_q([0, 1, 7, 8, 9, 10]), atol=1e-5, rtol=1e-4)
    assert drafter.k_cache[:, 6:].abs().sum() == 0  # six positions fed, not eleven
    target.forward(torch.tensor([ids[11]]), num_logits=0)
    second = drafter.propose(ids, 1, params, torch.Generator().manual_seed(0))
    torch.testing.assert_close(second.probs[0], expected_q([0, 1, 7, 8, 9, 10, 11]), atol=1e-5, rtol=1e-4)
    whole = HeadDrafter(head, target, half_weights=False, window=None)
    whole.begin(ids)
    torch.testing.assert_close(
        whole.propose(ids, 1, params, torch.Generator().manual_seed(0)).probs[0], expected_q(list(range(12)))
    )
    with pytest.raises(ValueError, match="window"):
        HeadDrafter(head, target, window=0)


@pytest.mark.parametrize("window", [None, 3])
def test_greedy_identity_with_a_windowed_head(window):
    hf = tiny_llama(seed=1)
    plain = Engine(NativeModel(hf), None, gamma=0)
    target = NativeModel(hf)
    engine = Engine(target, HeadDrafter(_head(hf), target, window=window, sinks=1), gamma=3)
    greedy = SamplingParams(temperature=0.0)
    for prompt in ([4, 8, 15, 16, 23, 42, 7, 7, 1], [2] * 12, [4]):
        want = plain.generate(prompt, greedy, max_new_tokens=20, eos_token_ids=[]).token_ids
        assert engine.generate(prompt, greedy, max_new_tokens=20, eos_token_ids=[]).token_ids == want


def _feeder(target: NativeModel):
    """What the engine leaves in the target before a proposal: the context but its newest token, with features."""
    target.keep_features = True
    fed: list[int] = []

    def feed(context: list[int]) -> None:
        common = common_prefix(fed, context[:-1])
        target.rollback(common)
        del fed[common:]
        if len(context) - 1 > common:
            target.forward(torch.tensor(context[common:-1]), num_logits=0)
            fed.extend(context[common:-1])

    return feed


@pytest.fixture(scope="module")
def hf_and_head():
    hf = tiny_llama(seed=1)
    return hf, _head(hf, torch.arange(0, 96, 2))


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("quantized", [False, True])
def test_forks_draft_from_their_own_target_sequence(hf_and_head, quantized, window, params):
    """A head drafter and its fork, on two sequences of one target asked in turn, propose what a fresh drafter on
    a fresh target proposes for each sequence alone; the fork shares the head's weights and kernels."""
    from test_drafters import STEPS_A, STEPS_B, drafts_in_turn

    from specwise.drafters.head.quantized import head_quantization_available

    if quantized and not head_quantization_available():
        pytest.skip("the quantized kernels are unavailable here")
    hf, head = hf_and_head

    def drafter(target: NativeModel) -> HeadDrafter:
        return HeadDrafter(head, target, window=window, sinks=1, quantized=quantized)

    target = NativeModel(hf)
    first = drafter(target)
    second_target = target.sequence()
    second = first.fork(second_target)
    assert second.target is second_target and first.target is target
    assert second._embed is first._embed and second._vocab_ids is first._vocab_ids and second._q is first._q
    if not quantized:
        assert second._qkv is first._qkv and second._lm is first._lm and second._fused is first._fused
    assert second.k_cache.data_ptr() != first.k_cache.data_ptr() and second._fed is not first._fed
    before = [_feeder(target), _feeder(second_target)]
    steps = [STEPS_A, STEPS_B]
    together = drafts_in_turn([first, second], steps, params, before=before, stop=1e-3)  # confidences below 1
    for i in range(2):
        alone_target = NativeModel(hf)
        want = drafts_in_turn([drafter(alone_target)], [steps[i]], params, [i], [_feeder(alone_target)], stop=1e-3)
        assert together[i] == want[0]
    with pytest.raises(ValueError, match="fork for a sequence of the same target"):
        first.fork(ToyModel.random(8))


def test_drafts_stay_in_the_draft_vocabulary_and_q_is_zero_outside():
    hf = tiny_llama(seed=1)
    target = NativeModel(hf)
    vocab = torch.arange(10, 60)
    drafter = HeadDrafter(_head(hf, vocab), target)
    target.keep_features = True
    target.forward(torch.tensor([1, 2, 3]), num_logits=0)
    drafter.begin([1, 2, 3, 4])
    draft = drafter.propose([1, 2, 3, 4], 5, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert len(draft) == 5 and all(10 <= t < 60 for t in draft.tokens.tolist())
    outside = torch.ones(96, dtype=torch.bool)
    outside[vocab] = False
    assert float(draft.probs[:, outside].sum()) == 0.0
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(5))


def _exact_joint(hf, prompt, params, length):
    out = {}
    vocab = hf.config.vocab_size
    for seq in itertools.product(range(vocab), repeat=length):
        ids = torch.tensor([prompt + list(seq)])
        with torch.no_grad():
            logits = hf(input_ids=ids).logits[0]
        prob = 1.0
        for i, tok in enumerate(seq):
            prob *= float(probs_from_logits(logits[len(prompt) - 1 + i], params)[tok])
        out[seq] = prob
    return out


def _assert_follows_target(engine: Engine, hf, prompt: list[int], n: int, seed: int, where: str = "") -> SpecStats:
    """n samples of 3 tokens after ``prompt`` at temperature 1 through ``engine`` follow p computed from ``hf``."""
    counts: dict = {}
    stats = SpecStats()
    for i in range(n):
        run = SamplingParams(temperature=1.0, seed=seed + i)
        result = engine.generate(prompt, run, max_new_tokens=3, eos_token_ids=[])
        ids = tuple(result.token_ids)
        counts[ids] = counts.get(ids, 0) + 1
        stats.merge(result.stats)
    pvalue = chi2_pvalue(counts, _exact_joint(hf, prompt, SamplingParams(temperature=1.0), 3), n)
    assert pvalue > 1e-4, f"emitted sequences do not follow p{where} (chi-square p-value {pvalue:.2e})"
    return stats


def test_sampled_output_with_a_head_follows_the_target():
    """Through the engine, with a reduced draft vocabulary (q zero elsewhere), emitted sequences follow p."""
    hf = tiny_llama(seed=4, vocab=5, std=0.3)
    target = NativeModel(hf)
    engine = Engine(target, HeadDrafter(_head(hf, torch.tensor([0, 2, 3]), seed=1), target), gamma=3)
    _assert_follows_target(engine, hf, [1, 4], 4000, seed=5000)


def test_save_load_and_make_drafter(tmp_path):
    hf = tiny_llama(seed=1)
    head = _head(hf, torch.arange(0, 96, 3))
    save_head(head, tmp_path / "h", dtype=torch.float32)
    loaded = load_head(tmp_path / "h")
    for (name, a), b in zip(head.state_dict().items(), loaded.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    target = LoadedModel(NativeModel(hf, name="tiny"), None, "tiny", hf)
    [drafter] = make_drafter(f"head:{tmp_path / 'h'}", target)
    assert isinstance(drafter, HeadDrafter)
    ref = Engine(NativeModel(hf), None, gamma=0).generate([3, 4], max_new_tokens=10, eos_token_ids=[]).token_ids
    out = Engine(target.model, drafter, gamma=3).generate([3, 4], max_new_tokens=10, eos_token_ids=[]).token_ids
    assert out == ref


@pytest.mark.parametrize("half", [True, False])
def test_a_float16_file_drafts_the_same_without_float32_copies(tmp_path, half):
    """load_head(dtype=None) keeps a float16 file's weights: the drafter built from them computes what it computes
    from the float32 head, and keeps neither the head nor a float32 copy of the output rows."""
    import gc
    import weakref

    hf = tiny_llama(seed=1)
    save_head(_head(hf, torch.arange(0, 96, 3)), tmp_path / "h")  # float16, as shipped
    target = NativeModel(hf)
    target.keep_features = True
    ids = torch.tensor([5, 9, 2, 7, 7, 1, 3, 8, 6, 4] * 4)  # 40 rows: beyond the layer kernel's 32
    target.forward(ids)
    feats, nxt = target.features(0, 40), torch.cat([ids[1:], ids[:1]])
    outputs = []
    for dtype in (torch.float32, None):
        head = load_head(tmp_path / "h", dtype=dtype)
        assert head.qkv.weight.dtype == (torch.float32 if dtype else torch.float16)
        head.attach_target(hf)
        drafter = HeadDrafter(head, target, half_weights=half)
        expected = torch.float16 if drafter._fused is not None else torch.float32
        assert drafter._lm.weight.dtype == (expected if half else torch.float32)
        gone = weakref.ref(head)
        del head
        gc.collect()
        assert gone() is None  # the drafter does not keep the head
        with torch.inference_mode():
            first = drafter._step(feats, nxt, 0)
            second = drafter._step(first[-1:], nxt[:1], 40)
        outputs.append((first, second, drafter._lm(second, drafter._backend)))
    for a, b in zip(*outputs):
        assert torch.equal(a, b)


def test_a_head_refuses_another_target(tmp_path):
    hf = tiny_llama(seed=1)
    save_head(_head(hf), tmp_path / "h")
    other = tiny_llama(seed=2)  # same shapes, other weights
    target = LoadedModel(NativeModel(other, name="other"), None, "other", other)
    with pytest.raises(TargetMismatchError, match="different weights"):
        make_drafter(f"head:{tmp_path / 'h'}", target)
    wider = tiny_llama(seed=1, hidden=64)
    target = LoadedModel(NativeModel(wider, name="wide"), None, "wide", wider)
    with pytest.raises(TargetMismatchError, match="hidden_size"):
        make_drafter(f"head:{tmp_path / 'h'}", target)


def test_head_errors_are_clear(tmp_path):
    hf = tiny_llama(seed=1)
    target = LoadedModel(NativeModel(hf, name="tiny"), None, "tiny", hf)
    with pytest.raises(ValueError, match="no head is shipped"):
        make_drafter("head", target)
    with pytest.raises(FileNotFoundError, match="specwise distill"):
        make_drafter(f"head:{tmp_path}", target)


def test_low_confidence_stops_drafting_and_output_is_unchanged():
    hf = tiny_llama(seed=1)
    target = NativeModel(hf)
    drafter = HeadDrafter(_head(hf), target)
    greedy = SamplingParams(temperature=0.0)
    ref = Engine(NativeModel(hf), None, gamma=0).generate([2, 5], greedy, max_new_tokens=16, eos_token_ids=[])
    full = Engine(target, drafter, gamma=4).generate([2, 5], greedy, max_new_tokens=16, eos_token_ids=[])
    strict_planner = FixedPlanner(4, stop=0.999999)  # a random head is never this sure
    strict = Engine(target, drafter, gamma=strict_planner).generate([2, 5], greedy, 16, eos_token_ids=[])
    assert strict.token_ids == full.token_ids == ref.token_ids
    assert full.stats.drafted > 0 and strict.stats.drafted == 0
    assert strict.stats.plain_step_reasons.get("low_confidence", 0) > 0
    # sampling: q's largest probability does not estimate acceptance (alpha = sum min(p, q)), so the threshold does
    # not hold a sampled draft back; the planner's measured acceptance decides its length
    sampled = Engine(target, drafter, gamma=strict_planner).generate(
        [2, 5], SamplingParams(temperature=1.0, seed=0), max_new_tokens=16, eos_token_ids=[]
    )
    assert sampled.stats.drafted > 0 and "low_confidence" not in sampled.stats.plain_step_reasons


def test_ngram_and_head_as_two_sources_are_exact(tmp_path):
    """ngram+head with a fixed gamma: the planner chooses between the two sources; the output is plain decoding's."""
    from specwise.drafters import NgramDrafter

    hf = tiny_llama(seed=1)
    target = NativeModel(hf)
    sources = [NgramDrafter(), HeadDrafter(_head(hf), target)]
    plain = Engine(NativeModel(hf), None, gamma=0)
    engine = Engine(target, sources, gamma=4)
    prompt = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]  # repetitive: prompt lookup has matches
    want = plain.generate(prompt, max_new_tokens=30, eos_token_ids=[]).token_ids
    result = engine.generate(prompt, max_new_tokens=30, eos_token_ids=[])
    assert result.token_ids == want
    assert sum(c["steps"] for c in result.stats.by_drafter.values()) > 0
    save_head(_head(hf), tmp_path / "h")
    loaded = LoadedModel(NativeModel(hf, name="tiny"), None, "tiny", hf)
    assert [d.name for d in make_drafter(f"ngram+head:{tmp_path / 'h'}", loaded)] == ["ngram", "head"]


@pytest.mark.parametrize("gamma", [3, "auto"])
def test_sampled_output_with_ngram_and_head_follows_the_target(gamma):
    """gamma auto: each drafter is a source of the planner, asked for its own gamma."""
    from specwise.drafters import NgramDrafter

    hf = tiny_llama(seed=4, vocab=5, std=0.3)
    target = NativeModel(hf)
    head = HeadDrafter(_head(hf, torch.tensor([0, 2, 3]), seed=1), target)
    combined = [NgramDrafter(max_ngram=1), head]
    engine = Engine(target, combined, gamma=gamma)
    stats = _assert_follows_target(engine, hf, [1, 4, 1], 4000, seed=9000)
    assert {name for name, c in stats.by_drafter.items() if c["drafted"]} == {"ngram", "head"}


def test_greedy_identity_with_ngram_and_head_and_gamma_auto():
    from specwise.drafters import NgramDrafter

    hf = tiny_llama(seed=1)
    target = NativeModel(hf)
    combined = [NgramDrafter(), HeadDrafter(_head(hf), target)]
    plain = Engine(NativeModel(hf), None, gamma=0)
    engine = Engine(target, combined, gamma="auto")
    for prompt in ([7, 8, 9, 10, 7, 8, 9, 10, 7, 8], [3, 1, 4, 1, 5, 9, 2, 6]):
        want = plain.generate(prompt, max_new_tokens=40, eos_token_ids=[]).token_ids
        result = engine.generate(prompt, max_new_tokens=40, eos_token_ids=[])
        assert result.token_ids == want
        drafted = {name: c["drafted"] for name, c in result.stats.by_drafter.items()}
        assert sum(drafted.values()) == result.stats.drafted


def _fed_head(seed: int, positions: int):
    """(head, target, features, next tokens): a head over a tiny target that has taken in ``positions`` tokens
    (the quantized kernels required)."""
    from specwise.drafters.head.quantized import head_quantization_available

    if not head_quantization_available():
        pytest.skip("the quantized kernels are unavailable here")
    hf = tiny_llama(seed=seed)
    head = _head(hf)
    target = NativeModel(hf)
    target.keep_features = True
    ids = torch.tensor([5, 9, 2, 7, 7, 1, 3, 8, 6, 4] * (positions // 10))
    target.forward(ids)
    return head, target, target.features(0, positions), torch.cat([ids[1:], ids[:1]])


def test_the_native_head_step_in_slices_and_its_choice():
    """The quantized head's native step: 100 positions (two slices of at most 64) give the bits of 60 then 40; the
    choice it computes with its step is the one the output layer gives on its own, with the softmax's probability."""
    from specwise.models.kernels.quant import q_gemm

    head, target, feats, nxt = _fed_head(seed=2, positions=100)
    one, two = HeadDrafter(head, target, quantized=True), HeadDrafter(head, target, quantized=True)
    assert one.quantized
    with torch.no_grad():
        whole = one._step(feats, nxt, 0, confidence=True)
        parts = torch.cat([two._step(feats[:60], nxt[:60], 0), two._step(feats[60:], nxt[60:], 60)])
    torch.testing.assert_close(whole, parts, atol=0, rtol=0)
    logits = q_gemm(one._q[2], whole[-1:].contiguous(), mode="q8")[0]
    greedy = SamplingParams(temperature=0.0)
    token, q, confidence = one._choose(whole[-1], greedy, None, stop=0.1)  # from the step's own output layer
    assert q is None and token == int(one._vocab_ids[int(logits.argmax())])
    assert confidence == pytest.approx(float(torch.softmax(logits, -1).max()), rel=1e-4)
    again = one._choose(whole[-1], greedy, None, stop=0.1)  # the step's result is used once: now computed anew
    assert again[0] == token and again[2] == pytest.approx(confidence, rel=1e-4)


def test_the_quantized_head_computes_what_the_float_head_computes_up_to_8_bits():
    head, target, feats, nxt = _fed_head(seed=1, positions=50)  # 50 positions: more than one call of 32 rows
    full = HeadDrafter(head, target, half_weights=False)
    q8 = HeadDrafter(head, target, quantized=True)
    assert q8.quantized and q8._backend == "quantized" and not hasattr(q8, "_qkv")  # no float copies kept
    with torch.no_grad():
        a, b = full._step(feats, nxt, 0), q8._step(feats, nxt, 0)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    assert float(cos.min()) > 0.98  # 8-bit weights and activations: close, not equal
    # a row's result does not depend on how many rows share the call (the kernels' contract)
    with torch.no_grad():
        alone = q8._step(feats[:1], nxt[:1], 0)
    torch.testing.assert_close(alone, b[:1], atol=0, rtol=0)
