"""The engine: exactness end to end (joint distributions, greedy identity), boundaries, rollback, stop."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import needs_hf
from specwise.drafters import Draft, Drafter, ModelDrafter, NgramDrafter, NoDrafter
from specwise.engine import Engine, LogprobOptions, StopText, token_logprobs
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams, probs_from_logits

VOCAB = 4
LENGTH = 3

# The engine's exactness on real decoders (a KV cache rolled back after rejections) runs on two kinds of models:
# tiny GGUF files through the quantized native model (the core install) and tiny Hugging Face Llamas (the hf extra)
KINDS = ("gguf", "hf")


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """Two tiny GGUF Llamas of one vocabulary (100 tokens): the target's and an unrelated draft's."""
    pytest.importorskip("gguf")
    from specwise.models.kernels import quant

    if not quant.quantized_available():
        pytest.skip("the native quantized kernels are not built")
    from test_quantized_model import VARIANTS, write_gguf

    folder = tmp_path_factory.mktemp("engine")
    target, draft = folder / "target.gguf", folder / "draft.gguf"
    write_gguf(target, VARIANTS["llama-Q8_0"])
    write_gguf(draft, VARIANTS["llama-Q4_0"])
    return target, draft


@pytest.fixture(params=KINDS)
def models(request):
    """A target, an unrelated draft model of its vocabulary and a second instance of the target (draft = target),
    as tiny GGUF files on the quantized model or tiny Hugging Face Llamas."""
    if request.param == "hf":
        needs_hf()
        get = request.getfixturevalue
        return SimpleNamespace(target=get("tiny_target"), draft=get("tiny_draft"), twin=get("tiny_target_twin"))
    from specwise.models.quantized import QuantizedModel

    target, draft = request.getfixturevalue("gguf_files")
    return SimpleNamespace(target=QuantizedModel(target), draft=QuantizedModel(draft), twin=QuantizedModel(target))


def exact_joint(model: ToyModel, prompt: list[int], params: SamplingParams, length: int) -> dict:
    """P(x_1..x_length | prompt) under the toy model, by enumeration."""
    out = {}
    for seq in itertools.product(range(model.vocab_size), repeat=length):
        ctx, prob = list(prompt), 1.0
        for tok in seq:
            p = probs_from_logits(model.next_logits(len(ctx) - 1, ctx[-1]), params)
            prob *= float(p[tok])
            ctx.append(tok)
        out[seq] = prob
    return out


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X chi-square with ``df`` degrees of freedom: the regularized upper incomplete gamma function
    Q(df / 2, x / 2), by its power series below a + 1 and its continued fraction (modified Lentz) above, where each
    converges quickly (checked against scipy where it is installed)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0.0:
        return 1.0
    front = math.exp(a * math.log(z) - z - math.lgamma(a))  # z^a e^-z / Gamma(a)
    if z < a + 1.0:  # P(a, z) = front * sum_n z^n / (a (a + 1) ... (a + n))
        term = total = 1.0 / a
        n = a
        while term > total * 1e-16:
            n += 1.0
            term *= z / n
            total += term
        return max(0.0, 1.0 - front * total)
    tiny = 1e-300  # Q(a, z) = front / (b_0 + a_1 / (b_1 + a_2 / (b_2 + ...))), a_i = -i (i - a), b_i = z + 2i + 1 - a
    b = z + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    fraction = d
    for i in range(1, 100_000):
        an, b = -i * (i - a), b + 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        fraction *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return front * fraction


def chisquare(observed, expected) -> float:
    """Pearson's goodness-of-fit test: the p-value of the counts ``observed`` against ``expected``."""
    observed, expected = np.asarray(observed, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return chi2_sf(float(((observed - expected) ** 2 / expected).sum()), len(observed) - 1)


def chi2_pvalue(counts: dict, probs: dict, n: int) -> float:
    """Chi-square goodness of fit; cells with zero probability must never be observed."""
    for seq, c in counts.items():
        assert probs[seq] > 0 or c == 0, f"sequence {seq} has probability 0 but was emitted {c} times"
    keys = [k for k in probs if probs[k] * n >= 5]
    rest = [k for k in probs if 0 < probs[k] * n < 5]
    obs = [counts.get(k, 0) for k in keys]
    exp = [probs[k] * n for k in keys]
    if rest:
        obs.append(sum(counts.get(k, 0) for k in rest))
        exp.append(sum(probs[k] for k in rest) * n)
    exp = np.array(exp) * (sum(obs) / sum(exp))
    return chisquare(obs, exp)


@pytest.mark.parametrize("df", [1, 2, 3, 7, 30, 63, 200])
def test_chi2_sf_equals_scipys(df):
    stats = pytest.importorskip("scipy.stats")
    for x in (0.0, 0.01, 0.5, df / 2, df - 1.0, df, df + 1.5, 2.0 * df, df + 10.0 * math.sqrt(df), 5.0 * df + 40.0):
        want = float(stats.chi2.sf(x, df))
        assert chi2_sf(x, df) == pytest.approx(want, rel=1e-9, abs=1e-300), (x, df)
    observed, expected = [18, 25, 31, 26], [25.0, 25.0, 25.0, 25.0]
    assert chisquare(observed, expected) == pytest.approx(stats.chisquare(observed, expected).pvalue, rel=1e-9)


class RepeatDrafter(Drafter):
    """Proposes a fixed token k times (one-hot q): deterministic and independent of p."""

    name = "repeat"

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, context, k, params, generator, stop=0.0) -> Draft:
        return Draft(np.full(k, self.token, dtype=np.int64))


def run_many(engine: Engine, params: SamplingParams, n: int) -> dict:
    counts: dict = {}
    for i in range(n):
        run_params = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed=1000 + i)
        ids = tuple(engine.generate([1], run_params, max_new_tokens=LENGTH, eos_token_ids=[]).token_ids)
        counts[ids] = counts.get(ids, 0) + 1
    return counts


SETTINGS = {
    "t1": SamplingParams(temperature=1.0),
    "t07-topk3": SamplingParams(temperature=0.7, top_k=3),
    "topp-minp": SamplingParams(temperature=1.3, top_p=0.8, min_p=0.1),
}


@pytest.mark.parametrize(
    ("drafter_kind", "gamma", "setting"),
    [
        ("model", 2, "t1"),
        ("model", 3, "t07-topk3"),
        ("target", 4, "topp-minp"),
        ("ngram", 2, "t1"),
        ("repeat", 3, "topp-minp"),
    ],
)
def test_joint_distribution_of_emitted_sequence_equals_target(drafter_kind, gamma, setting):
    """The first three emitted tokens, through the whole engine, follow the target's joint distribution."""
    params = SETTINGS[setting]
    target = ToyModel.random(VOCAB, seed=11)
    drafter = {
        "model": lambda: ModelDrafter(ToyModel.random(VOCAB, seed=12)),
        "target": lambda: ModelDrafter(ToyModel.random(VOCAB, seed=11)),
        "ngram": lambda: NgramDrafter(max_ngram=2),
        "repeat": lambda: RepeatDrafter(2),
    }[drafter_kind]()
    engine = Engine(target, drafter, gamma=gamma)
    n = 6000
    counts = run_many(engine, params, n)
    pvalue = chi2_pvalue(counts, exact_joint(target, [1], params, LENGTH), n)
    assert pvalue > 1e-4, f"emitted sequences do not follow p (chi-square p-value {pvalue:.2e})"


def test_joint_check_has_power():
    """The same check rejects a sampler that emits the draft's distribution instead of the target's."""
    params = SETTINGS["t1"]
    target = ToyModel.random(VOCAB, seed=11)
    wrong = ToyModel.random(VOCAB, seed=12)
    n = 6000
    counts = run_many(Engine(wrong, None, gamma=0), params, n)
    assert chi2_pvalue(counts, exact_joint(target, [1], params, LENGTH), n) < 1e-6


# ---- greedy identity ---------------------------------------------------------------------------------------


def greedy_ids(engine: Engine, prompt: list[int], n: int) -> list[int]:
    return engine.generate(prompt, SamplingParams(temperature=0.0), max_new_tokens=n, eos_token_ids=[]).token_ids


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_identity(models, gamma):
    prompts = [[1, 5, 9, 2], [7], [3, 3, 3, 3, 3, 3, 40, 41, 42, 3, 3]]
    target = models.target
    for prompt in prompts:
        plain = greedy_ids(Engine(target, NoDrafter()), prompt, 40)
        same = Engine(target, ModelDrafter(models.twin), gamma=gamma)
        other = Engine(target, ModelDrafter(models.draft), gamma=gamma)
        ngram = Engine(target, NgramDrafter(), gamma=gamma)
        assert greedy_ids(same, prompt, 40) == plain
        assert greedy_ids(other, prompt, 40) == plain
        assert greedy_ids(ngram, prompt, 40) == plain


def test_plain_greedy_matches_transformers_generate(request):
    torch = needs_hf()
    tiny_target = request.getfixturevalue("tiny_target")
    prompt = [1, 5, 9, 2]
    ours = greedy_ids(Engine(tiny_target, NoDrafter()), prompt, 24)
    ref = tiny_target.model.generate(
        torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0
    )
    assert ours == ref[0, len(prompt) :].tolist()


def test_draft_equal_to_target_accepts_everything(models):
    result = Engine(models.target, ModelDrafter(models.twin), gamma=4).generate(
        [1, 2, 3], SamplingParams(), max_new_tokens=41, eos_token_ids=[]
    )
    stats = result.stats
    assert stats.acceptance_rate == 1.0
    assert stats.target_passes == 9  # 8 steps of 4 + 1, then one more token
    assert stats.mean_accepted_length == pytest.approx(41 / 9)
    assert stats.acceptance_by_position == [1.0, 1.0, 1.0, 1.0]


def test_random_draft_is_rarely_accepted(models):
    result = Engine(models.target, ModelDrafter(models.draft), gamma=4).generate(
        [1, 2, 3], SamplingParams(), max_new_tokens=40, eos_token_ids=[]
    )
    assert result.stats.acceptance_rate < 0.3


def test_all_accepted_then_sampling_still_exact_in_toy():
    """After an all-accepted step the drafter feeds its own unfed last draft before drafting again."""
    target = ToyModel.random(VOCAB, seed=5)
    drafter = ModelDrafter(ToyModel.random(VOCAB, seed=5))
    engine = Engine(target, drafter, gamma=3)
    result = engine.generate([1], SamplingParams(), max_new_tokens=13, eos_token_ids=[])
    # three all-accepted steps of 3 + 1 tokens, then one plain step for the last token
    assert result.stats.accepted == result.stats.drafted == 9
    assert result.stats.target_passes == 4
    plain = Engine(ToyModel.random(VOCAB, seed=5), None).generate([1], max_new_tokens=13, eos_token_ids=[])
    assert result.token_ids == plain.token_ids


# ---- boundaries -------------------------------------------------------------------------------------------


def test_stops_exactly_at_eos_inside_an_accepted_draft(models):
    prompt = [1, 5, 9, 2]
    plain = greedy_ids(Engine(models.target, NoDrafter()), prompt, 30)
    eos = plain[10]
    first = plain.index(eos)
    result = Engine(models.target, ModelDrafter(models.twin), gamma=4).generate(
        prompt, SamplingParams(), max_new_tokens=30, eos_token_ids=[eos]
    )
    assert result.token_ids == plain[: first + 1]
    assert result.finish_reason == "stop"
    assert result.stats.new_tokens == first + 1


@pytest.mark.parametrize("max_new", [1, 2, 5, 7, 13])
def test_max_new_tokens_is_exact(models, max_new):
    plain = greedy_ids(Engine(models.target, NoDrafter()), [4, 4], max_new)
    result = Engine(models.target, ModelDrafter(models.twin), gamma=4).generate(
        [4, 4], SamplingParams(), max_new_tokens=max_new, eos_token_ids=[]
    )
    assert len(plain) == max_new
    assert result.token_ids == plain
    assert result.finish_reason == "length"
    assert result.stats.new_tokens == max_new


def test_context_limit_ends_with_length():
    target = ToyModel.random(VOCAB, seed=3, max_length=10)
    result = Engine(target, ModelDrafter(ToyModel.random(VOCAB, seed=3)), gamma=4).generate(
        [1, 2, 3], max_new_tokens=100, eos_token_ids=[]
    )
    assert result.finish_reason == "length"
    assert len(result.token_ids) == 10 - 3 + 1  # the last token need not be fed


def test_seeded_sampling_repeats_exactly(models):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=123)
    engine = Engine(models.target, ModelDrafter(models.draft), gamma=3)
    a = engine.generate([1, 2], params, max_new_tokens=30, eos_token_ids=[])
    b = engine.generate([1, 2], params, max_new_tokens=30, eos_token_ids=[])
    c = engine.generate([1, 2], SamplingParams(temperature=0.9, top_p=0.95, seed=124), 30, eos_token_ids=[])
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_rollback_keeps_target_cache_equal_to_context(models):
    target = models.target
    engine = Engine(target, ModelDrafter(models.draft), gamma=4)
    prompt = [1, 2, 3]
    emitted = []
    for event in engine.stream(prompt, SamplingParams(), max_new_tokens=20, eos_token_ids=[]):
        emitted += event.token_ids
        assert target.length == len(prompt) + len(emitted) - 1
    fresh_logits = _logits_of(target, prompt + emitted)
    target.rollback(len(prompt) + len(emitted) - 1)
    cached = target.forward(np.array(emitted[-1:], dtype=np.int64))
    np.testing.assert_allclose(cached[-1], fresh_logits[-1], atol=1e-5, rtol=1e-5)


def _logits_of(model, ids):
    model.reset()
    return model.forward(ids)


def test_invalid_requests_raise():
    engine = Engine(ToyModel.random(96, max_length=512), None)
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.generate([], max_new_tokens=3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([1], max_new_tokens=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([96], max_new_tokens=3)
    with pytest.raises(ValueError, match="context"):
        engine.generate([1] * 600, max_new_tokens=3)
    with pytest.raises(ValueError, match="gamma"):
        Engine(engine.target, None, gamma=-1)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.generate([1], max_new_tokens=3, stop=["x"])


class _CharTokenizer:
    """Decodes token i to chr(ord('a') + i % 26); enough for stop-string tests."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_stop_text_never_emits_a_stop_string_or_past_it():
    st = StopText(_CharTokenizer(), stop=["cde"])
    out = []
    out.append(st.feed([0, 1], final=False))  # "ab"
    out.append(st.feed([2, 3], final=False))  # "abcd": "cd" may start the stop string: held back
    assert "".join(o[0] for o in out) == "ab"
    text, kept, stopped = st.feed([4, 5, 6], final=False)  # "abcdefg": stop at "cde"
    assert stopped and text == "" and kept == [4]
    assert st.token_ids == [0, 1, 2, 3, 4]


def test_stop_string_through_engine(models):
    tok = _CharTokenizer()
    engine = Engine(models.target, NgramDrafter(), gamma=3, tokenizer=tok)
    full = engine.generate([1, 5], max_new_tokens=30, eos_token_ids=[])
    stop = full.text[7:9]
    cut = full.text.index(stop)
    result = engine.generate([1, 5], max_new_tokens=30, stop=[stop], eos_token_ids=[])
    assert result.finish_reason == "stop"
    assert result.text == full.text[:cut]
    assert stop not in result.text
    assert tok.decode(result.token_ids).endswith(stop) or stop in tok.decode(result.token_ids)
    assert len(result.token_ids) == len(tok.decode(result.token_ids))
    assert result.stats.new_tokens == len(result.token_ids)


def test_engine_default_eos_ids_and_request_override(models):
    plain = greedy_ids(Engine(models.target, NoDrafter()), [1, 5, 9, 2], 20)
    eos = plain[5]
    engine = Engine(models.target, NgramDrafter(), gamma=3, eos_token_ids=[eos])
    assert engine.generate([1, 5, 9, 2], max_new_tokens=20).token_ids == plain[: plain.index(eos) + 1]
    assert engine.generate([1, 5, 9, 2], max_new_tokens=20, eos_token_ids=[]).token_ids == plain


class _CountingTokenizer(_CharTokenizer):
    def __init__(self):
        self.decoded = 0

    def decode(self, ids, skip_special_tokens=True):
        self.decoded += len(ids)
        return super().decode(ids, skip_special_tokens)


def test_stop_text_decodes_only_the_new_tokens():
    tok = _CountingTokenizer()
    st = StopText(tok)
    pieces = [st.feed([i % 26], final=False)[0] for i in range(400)]
    assert "".join(pieces) == _CharTokenizer().decode([i % 26 for i in range(400)])
    assert tok.decoded < 400 * 2 * (StopText.OVERLAP + 1)  # a full decode each step would be 80,000 tokens


@pytest.mark.slow
def test_stop_text_incremental_equals_full_decode(smol_tokenizer):
    """Random pieces of real text and random token ids (multi-byte characters split across feeds included)."""
    import random

    rng = random.Random(0)
    samples = ["Grüße aus Köln: 日本語のテキスト 🙂🚀 and ∑∫√ — done.\n\n```python\nprint('x')\n```"] * 3
    ids_list = [smol_tokenizer(s, add_special_tokens=False)["input_ids"] for s in samples]
    ids_list += [[rng.randrange(smol_tokenizer.vocab_size) for _ in range(300)] for _ in range(3)]
    for ids in ids_list:
        st = StopText(smol_tokenizer)
        out, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 6)
            final = i + n >= len(ids)
            out.append(st.feed(ids[i : i + n], final=final)[0])
            i += n
            assert st._base_text == smol_tokenizer.decode(ids[: st._base], skip_special_tokens=True)
        assert "".join(out) == smol_tokenizer.decode(ids, skip_special_tokens=True)


# ---- log-probabilities ------------------------------------------------------------------------------------


def _reference_top(row: np.ndarray, top: int) -> list[tuple[int, float]]:
    """The ``top`` most likely finite entries, largest first, equal values by the lowest id: a full sort."""
    order = sorted(range(row.shape[0]), key=lambda i: (-row[i], i))
    return [(i, float(row[i])) for i in order[:top] if row[i] != -np.inf]


def test_token_logprobs_lists_the_most_likely_first_and_ties_by_the_lowest_id():
    logits = np.array([[0.0, 2.0, 1.0, 2.0, -np.inf, 1.0], [5.0] * 6], dtype=np.float32)
    out = token_logprobs(logits, [2, 3], LogprobOptions(top=3), SamplingParams())
    lp = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    assert [t.token_id for t in out] == [2, 3]
    assert [t.logprob for t in out] == pytest.approx([lp[0, 2], lp[1, 3]], abs=1e-6)
    assert [i for i, _ in out[0].top] == [1, 3, 2]  # 2 and 5 tie for the third place: the lower id
    assert [i for i, _ in out[1].top] == [0, 1, 2]
    assert all(isinstance(i, int) and isinstance(v, float) for t in out for i, v in t.top)
    everything = token_logprobs(logits, [2, 3], LogprobOptions(top=10), SamplingParams())
    assert [i for i, _ in everything[0].top] == [1, 3, 2, 5, 0]  # probability 0 (id 4) is never listed
    assert [i for i, _ in everything[1].top] == list(range(6))
    assert token_logprobs(logits, [2, 3], LogprobOptions(top=0), SamplingParams())[0].top == []
    assert token_logprobs(logits[:0], [], LogprobOptions(top=3), SamplingParams()) == []


def test_token_logprobs_of_the_sampled_distribution_leave_out_what_it_cut():
    logits = np.array([[0.0, 2.0, 1.0, 2.0, -1.0, 1.0]], dtype=np.float32)
    out = token_logprobs(logits, [3], LogprobOptions(top=4, sampled=True), SamplingParams(temperature=1.0, top_k=2))
    assert [i for i, _ in out[0].top] == [1, 3]  # top-k 2 keeps the two tied tokens, nothing else
    assert [v for _, v in out[0].top] == pytest.approx([np.log(0.5)] * 2, abs=1e-6)
    assert out[0].logprob == pytest.approx(np.log(0.5), abs=1e-6)


@pytest.mark.parametrize("top", [1, 3, 17, 64])
def test_token_logprobs_top_equals_a_full_sort(top):
    """Random rows with many equal values (small integers) and some -inf: the partition's choice at the boundary
    equals a full sort's."""
    rng = np.random.default_rng(top)
    logits = rng.integers(-3, 3, size=(6, 40)).astype(np.float32)
    logits[rng.random((6, 40)) < 0.2] = -np.inf
    tokens = [int(np.flatnonzero(row > -np.inf)[0]) for row in logits]
    out = token_logprobs(logits, tokens, LogprobOptions(top=top), SamplingParams())
    lp = [row - np.float32(np.log(np.exp(row[row > -np.inf]).sum())) for row in logits]
    for entry, row in zip(out, lp):
        want = _reference_top(row, top)
        assert [i for i, _ in entry.top] == [i for i, _ in want]
        assert [v for _, v in entry.top] == pytest.approx([v for _, v in want], abs=1e-5)
