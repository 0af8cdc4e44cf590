"""The engine: exactness end to end (joint distributions, greedy identity), boundaries, rollback, stop."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specwise.drafters import Draft, Drafter, ModelDrafter, NgramDrafter, NoDrafter
from specwise.engine import Engine, StopText
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams, probs_from_logits

VOCAB = 4
LENGTH = 3


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
    return chisquare(obs, exp).pvalue


class RepeatDrafter(Drafter):
    """Proposes a fixed token k times (one-hot q): deterministic and independent of p."""

    name = "repeat"

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, context, k, params, generator, stop=0.0) -> Draft:
        return Draft(torch.full((k,), self.token, dtype=torch.int64))


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
def test_greedy_identity_tiny_llama(tiny_target, tiny_draft, tiny_target_twin, gamma):
    prompts = [[1, 5, 9, 2], [7], [3, 3, 3, 3, 3, 3, 40, 41, 42, 3, 3]]
    for prompt in prompts:
        plain = greedy_ids(Engine(tiny_target, NoDrafter()), prompt, 40)
        same = Engine(tiny_target, ModelDrafter(tiny_target_twin), gamma=gamma)
        other = Engine(tiny_target, ModelDrafter(tiny_draft), gamma=gamma)
        ngram = Engine(tiny_target, NgramDrafter(), gamma=gamma)
        assert greedy_ids(same, prompt, 40) == plain
        assert greedy_ids(other, prompt, 40) == plain
        assert greedy_ids(ngram, prompt, 40) == plain


def test_plain_greedy_matches_transformers_generate(tiny_target):
    prompt = [1, 5, 9, 2]
    ours = greedy_ids(Engine(tiny_target, NoDrafter()), prompt, 24)
    ref = tiny_target.model.generate(
        torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0
    )
    assert ours == ref[0, len(prompt) :].tolist()


def test_draft_equal_to_target_accepts_everything(tiny_target, tiny_target_twin):
    result = Engine(tiny_target, ModelDrafter(tiny_target_twin), gamma=4).generate(
        [1, 2, 3], SamplingParams(), max_new_tokens=41, eos_token_ids=[]
    )
    stats = result.stats
    assert stats.acceptance_rate == 1.0
    assert stats.target_passes == 9  # 8 steps of 4 + 1, then one more token
    assert stats.mean_accepted_length == pytest.approx(41 / 9)
    assert stats.acceptance_by_position == [1.0, 1.0, 1.0, 1.0]


def test_random_draft_is_rarely_accepted(tiny_target, tiny_draft):
    result = Engine(tiny_target, ModelDrafter(tiny_draft), gamma=4).generate(
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


def test_stops_exactly_at_eos_inside_an_accepted_draft(tiny_target, tiny_target_twin):
    prompt = [1, 5, 9, 2]
    plain = greedy_ids(Engine(tiny_target, NoDrafter()), prompt, 30)
    eos = plain[10]
    first = plain.index(eos)
    result = Engine(tiny_target, ModelDrafter(tiny_target_twin), gamma=4).generate(
        prompt, SamplingParams(), max_new_tokens=30, eos_token_ids=[eos]
    )
    assert result.token_ids == plain[: first + 1]
    assert result.finish_reason == "stop"
    assert result.stats.new_tokens == first + 1


@pytest.mark.parametrize("max_new", [1, 2, 5, 7, 13])
def test_max_new_tokens_is_exact(tiny_target, tiny_target_twin, max_new):
    plain = greedy_ids(Engine(tiny_target, NoDrafter()), [4, 4], max_new)
    result = Engine(tiny_target, ModelDrafter(tiny_target_twin), gamma=4).generate(
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


def test_seeded_sampling_repeats_exactly(tiny_target, tiny_draft):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=123)
    engine = Engine(tiny_target, ModelDrafter(tiny_draft), gamma=3)
    a = engine.generate([1, 2], params, max_new_tokens=30, eos_token_ids=[])
    b = engine.generate([1, 2], params, max_new_tokens=30, eos_token_ids=[])
    c = engine.generate([1, 2], SamplingParams(temperature=0.9, top_p=0.95, seed=124), 30, eos_token_ids=[])
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_rollback_keeps_target_cache_equal_to_context(tiny_target, tiny_draft):
    engine = Engine(tiny_target, ModelDrafter(tiny_draft), gamma=4)
    prompt = [1, 2, 3]
    emitted = []
    for event in engine.stream(prompt, SamplingParams(), max_new_tokens=20, eos_token_ids=[]):
        emitted += event.token_ids
        assert tiny_target.length == len(prompt) + len(emitted) - 1
    fresh_logits = _logits_of(tiny_target, prompt + emitted)
    tiny_target.rollback(len(prompt) + len(emitted) - 1)
    cached = tiny_target.forward(torch.tensor(emitted[-1:]))
    torch.testing.assert_close(cached[-1], fresh_logits[-1], atol=1e-5, rtol=1e-5)


def _logits_of(model, ids):
    model.reset()
    return model.forward(torch.tensor(ids))


def test_invalid_requests_raise(tiny_target):
    engine = Engine(tiny_target, None)
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.generate([], max_new_tokens=3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([1], max_new_tokens=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([10_000], max_new_tokens=3)
    with pytest.raises(ValueError, match="context"):
        engine.generate([1] * 600, max_new_tokens=3)
    with pytest.raises(ValueError, match="gamma"):
        Engine(tiny_target, None, gamma=-1)
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


def test_stop_string_through_engine(tiny_target):
    tok = _CharTokenizer()
    engine = Engine(tiny_target, NgramDrafter(), gamma=3, tokenizer=tok)
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


def test_engine_default_eos_ids_and_request_override(tiny_target):
    plain = greedy_ids(Engine(tiny_target, NoDrafter()), [1, 5, 9, 2], 20)
    eos = plain[5]
    engine = Engine(tiny_target, NgramDrafter(), gamma=3, eos_token_ids=[eos])
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
