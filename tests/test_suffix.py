"""The suffix drafter: its index (match, ranking, confidence, files), the counts of the request and of served
answers, the build of ``specwise index`` (atomic, resumable), the target check, and exactness through the engine."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from test_engine import gguf_files, models  # noqa: F401 (fixtures: tiny GGUF and Hugging Face models)

from conftest import needs_hf
from specwise.drafters.suffix import (
    SEP,
    IndexTargetMismatchError,
    NgramCounts,
    SuffixDrafter,
    SuffixIndex,
    check_index_target,
    confidence,
    load_index,
    make_suffix_drafter,
)
from specwise.engine import Engine
from specwise.lab.index import build_index
from specwise.models.loader import LoadedModel
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams

GREEDY = SamplingParams()
SEQS = [[1, 2, 3, 4, 5], [9, 2, 3, 4, 6, 7], [8, 2, 3, 4, 6, 7]]


def native_available() -> bool:
    from specwise.drafters.suffix import _native

    return _native() is not None


@pytest.fixture(params=[True, False], ids=["native", "python"])
def native(request):
    if request.param and not native_available():
        pytest.skip("the native kernels are not built")
    return request.param


def propose(drafter, context, k=8, stop=0.0):
    draft = drafter.propose(context, k, GREEDY, None, stop)
    return draft.tokens.tolist(), draft.confidence


# ---- the index --------------------------------------------------------------------------------------------------


def test_suffix_array_is_sorted_and_skips_separators():
    rng = random.Random(0)
    seqs = [[rng.randrange(5) for _ in range(rng.randrange(1, 30))] for _ in range(40)]
    index = SuffixIndex.from_sequences(seqs)
    assert len(index) == sum(map(len, seqs))
    text = index.text.tolist()
    keys = []
    for pos in index.sa.tolist():
        assert text[pos] != SEP
        keys.append(text[pos : text.index(SEP, pos) + 1])  # up to and with its separator: all distinct
    assert keys == sorted(keys)
    assert index.sequences() == seqs


def test_longest_match_and_most_frequent_continuation(native):
    index = SuffixIndex.from_sequences(SEQS, native=native)
    assert index.match([0, 2, 3, 4], 24, 1)[0] == 3
    assert index.match([1, 2, 3, 4], 24, 1)[0] == 4
    assert index.match([7, 7], 24, 1)[0] == 1
    assert index.match([0, 2, 3, 4], 24, 4) == (0, 0, 0)  # shorter than min_len
    # [2, 3, 4] was followed by 6 twice and by 5 once; [2, 3, 4, 6] by 7 twice (the pattern grows with the draft)
    tokens, conf, counts = index.draft(index.match([0, 2, 3, 4], 24, 1), 8, 0.0, 1.0, 2.0)
    assert tokens == [6, 7]  # then the sequences end: no more
    assert counts == [(2, 3), (2, 2)]
    assert conf == pytest.approx([confidence(2, 3, 3, 1.0, 2.0), confidence(2, 2, 4, 1.0, 2.0)], rel=1e-6)
    # the longer match decides: [1, 2, 3, 4] was followed by 5
    assert index.draft(index.match([1, 2, 3, 4], 24, 1), 8, 0.0, 1.0, 2.0)[0] == [5]


def test_confidence_formula():
    assert confidence(1, 1, 2, 1.0, 2.0) == pytest.approx((1 + 0.5) / 2)
    assert confidence(2, 3, 3, 1.0, 2.0) == pytest.approx((2 + 0.6) / 4)
    assert confidence(1, 1, 30, 1.0, 2.0) > confidence(1, 1, 2, 1.0, 2.0)  # a longer match is trusted more
    assert confidence(9, 10, 4, 1.0, 2.0) > confidence(1, 1, 4, 1.0, 2.0)  # so is a pattern seen more often


def test_native_search_equals_the_python_reference():
    if not native_available():
        pytest.skip("the native kernels are not built")
    rng = random.Random(1)
    base = [rng.randrange(40) for _ in range(60)]
    seqs = []
    for _ in range(200):
        start = rng.randrange(30)
        seqs.append(base[start : start + rng.randrange(3, 30)] + [rng.randrange(40) for _ in range(rng.randrange(9))])
    fast = SuffixIndex.from_sequences(seqs)
    slow = SuffixIndex(fast.text, fast.sa, fast.depth, native=False)
    for trial in range(500):
        seq = rng.choice(seqs)
        context = seq[: rng.randrange(1, len(seq) + 1)] if trial % 2 else [rng.randrange(40) for _ in range(5)]
        for min_len in (1, 2):
            match = fast.match(context, 24, min_len)
            assert match == slow.match(context, 24, min_len)
            stop = 0.2 if trial % 3 == 0 else 0.0
            assert fast.draft(match, 6, stop, 1.0, 2.0) == slow.draft(match, 6, stop, 1.0, 2.0)


def test_no_match_gives_an_empty_draft():
    drafter = SuffixDrafter(SuffixIndex.from_sequences(SEQS))
    drafter.begin([50, 51])
    assert propose(drafter, [50, 51]) == ([], None)
    assert propose(SuffixDrafter(None), [50, 51, 52]) == ([], None)  # no index, nothing repeated yet
    assert propose(SuffixDrafter(SuffixIndex.from_sequences([])), [1, 2]) == ([], None)


def test_stop_cuts_the_draft_where_the_running_product_falls_below():
    drafter = SuffixDrafter(SuffixIndex.from_sequences(SEQS))
    tokens, conf = propose(drafter, [0, 2, 3, 4], stop=0.0)
    assert tokens == [6, 7]
    cut, _ = propose(drafter, [0, 2, 3, 4], stop=conf[0] * conf[1] + 1e-3)
    assert cut == [6]


def test_index_round_trip(tmp_path):
    rng = random.Random(2)
    seqs = [[rng.randrange(30) for _ in range(rng.randrange(2, 40))] for _ in range(50)]
    info = {"target": {"name": "toy", "vocab_size": 30}, "build": {"note": 1}}
    index = SuffixIndex.from_sequences(seqs, info=info)
    index.save(tmp_path / "idx")
    assert np.load(tmp_path / "idx" / "tokens.npy").dtype == np.uint16  # a small vocabulary is stored in 16 bits
    loaded = load_index(tmp_path / "idx")
    assert loaded.info == info
    assert loaded.sequences() == seqs
    a, b = SuffixDrafter(index), SuffixDrafter(loaded)
    for seq in seqs[:20]:
        context = seq[: max(2, len(seq) // 2)]
        a.begin(context)
        b.begin(context)
        assert propose(a, context) == propose(b, context)
    index.save(tmp_path / "idx")  # replaces an index in place
    assert load_index(tmp_path / "idx").sequences() == seqs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no temporary directory left


def test_save_refuses_a_directory_that_is_not_an_index(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a suffix index"):
        SuffixIndex.from_sequences(SEQS).save(tmp_path / "other")


# ---- the request's counts and the overlay -----------------------------------------------------------------------


def test_counts_add_and_remove():
    counts = NgramCounts((1, 2))
    counts.add([1, 2, 3, 1, 2, 4])
    assert counts.table[(1, 2)] == {-1: 2, 3: 1, 4: 1}
    counts.remove([1, 2, 3, 1, 2, 4])
    assert counts.table == {}


def test_the_request_itself_proposes():
    drafter = SuffixDrafter(None)
    prompt = [10, 11, 12, 13, 14, 20, 10, 11]
    drafter.begin(prompt)
    tokens, conf = propose(drafter, prompt, k=3)
    assert tokens == [12, 13, 14]
    assert all(0 < c < 1 for c in conf)
    # the context grows between calls: the new tokens are counted too
    tokens, _ = propose(drafter, prompt + [12, 13, 14, 21, 12, 13], k=2)
    assert tokens == [14, 20]  # [12, 13] was followed by 14 twice; [13, 14] by 20 once and 21 once (ties: smaller)


def test_overlay_of_served_answers_is_bounded_and_saved_only_when_asked(tmp_path):
    drafter = SuffixDrafter(SuffixIndex.from_sequences(SEQS, info={"target": {"name": "toy"}}), overlay_tokens=12)
    drafter.begin([30, 31])
    assert propose(drafter, [30, 31])[0] == []
    drafter.add_answer([32, 33, 34], prompt=[5, 30, 31])
    drafter.begin([30, 31])
    assert propose(drafter, [30, 31])[0] == [32, 33, 34]
    assert list(tmp_path.iterdir()) == []  # nothing written
    drafter.add_answer([40, 41, 42, 43, 44, 45, 46, 47])  # 6 + 8 tokens > 12: the first answer leaves
    drafter.begin([30, 31])
    assert propose(drafter, [30, 31])[0] == []
    assert propose(drafter, [40, 41])[0][:2] == [42, 43]
    drafter.save(tmp_path / "grown")
    grown = load_index(tmp_path / "grown")
    assert grown.sequences() == SEQS + [[40, 41, 42, 43, 44, 45, 46, 47]]
    assert grown.info["target"] == {"name": "toy"}


def test_forks_share_the_index_and_the_overlay_but_count_their_own_request(native):
    """A drafter and its fork, asked in turn for two requests, propose what a fresh drafter over the same index
    proposes for each request alone (the index's native search buffers are shared: one thread asks)."""
    from test_drafters import CTX_A, CTX_B, assert_forks_draft_alone

    index = SuffixIndex.from_sequences([CTX_A[3:12] + [40, 41], CTX_B[2:9], [2, 3, 7, 50, 51]], native=native)
    assert_forks_draft_alone(lambda: SuffixDrafter(index, max_match=6), lambda d: d.fork(None))
    drafter = SuffixDrafter(index, max_match=6, min_match=1, overlay_tokens=50)
    drafter.propose(CTX_A, 4, GREEDY, None)
    fork = drafter.fork(None)
    assert fork.index is drafter.index and fork.overlay is drafter.overlay and fork.priors == drafter.priors
    assert fork.local is not drafter.local and fork.local.table == {} and fork.overlay_tokens == 50
    fork.add_answer([60, 61, 62], prompt=[70, 71])  # an answer served by one sequence: every one drafts from it
    assert propose(drafter, [5, 70, 71])[0] == [60, 61, 62]


# ---- the build --------------------------------------------------------------------------------------------------


class FakeTarget:
    """Answers a prompt with a function of it; can fail after a number of answers (an interruption)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls = 0
        self.fail_after = fail_after

    def __call__(self, prompt, temperature, seed):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        return [(t * 7 + 3) % 50 for t in prompt] + [int(temperature * 10), 99]


REQUESTS = [[i, i + 1, i + 2] for i in range(10)]
INFO = {"target": {"name": "toy", "vocab_size": 100}}


def test_build_is_atomic_and_resumable(tmp_path):
    data, out = tmp_path / "data", tmp_path / "index"
    with pytest.raises(KeyboardInterrupt):
        build_index(REQUESTS, FakeTarget(fail_after=5), data, out, INFO, chunk=4, progress=False)
    assert not out.exists()  # no index, not even part of one
    assert sorted(p.name for p in data.iterdir()) == ["chunk_00000.json", "manifest.json"]
    again = FakeTarget()
    report = build_index(REQUESTS, again, data, out, INFO, temperatures=(0.0,), chunk=4, progress=False)
    assert again.calls == 6  # the first chunk was kept
    fresh = FakeTarget()
    build_index(REQUESTS, fresh, tmp_path / "d2", tmp_path / "i2", INFO, chunk=4, progress=False)
    assert load_index(out).sequences() == load_index(tmp_path / "i2").sequences()
    assert report["answers"] == 10 and report["indexed_tokens"] == 10 * (3 + 5)
    assert load_index(out).info["target"] == INFO["target"]


def test_build_budget_then_a_larger_run_extends(tmp_path):
    data, out = tmp_path / "data", tmp_path / "index"
    first = build_index(REQUESTS, FakeTarget(), data, out, INFO, chunk=4, budget_tokens=12, progress=False)
    assert first["generated_tokens"] == 15  # three answers of 5 tokens: the budget is checked before each
    assert len(load_index(out).sequences()) == 3
    more = FakeTarget()
    build_index(REQUESTS, more, data, out, INFO, chunk=4, progress=False)
    assert more.calls == 7
    assert len(load_index(out).sequences()) == 10


def test_build_refuses_data_made_with_other_settings(tmp_path):
    build_index(REQUESTS, FakeTarget(), tmp_path / "d", tmp_path / "i", INFO, seed=0, chunk=4, progress=False)
    with pytest.raises(ValueError, match="other settings"):
        build_index(REQUESTS, FakeTarget(), tmp_path / "d", tmp_path / "i", INFO, seed=1, chunk=4, progress=False)


def test_build_keeps_the_index_within_its_size_limit(tmp_path):
    limit_mb = 30 * 6 / 2**20  # room for 30 tokens (2 bytes each and 4 of suffix array), separators included
    report = build_index(REQUESTS, FakeTarget(), tmp_path / "d", tmp_path / "i", INFO, max_index_mb=limit_mb,
                         progress=False)  # fmt: skip
    assert report["answers"] == 3  # 9 tokens and a separator each


def test_calibration_fits_each_source_on_held_out_answers():
    from specwise.lab.index import calibrate

    rng = random.Random(4)
    phrases = [[rng.randrange(60) for _ in range(12)] for _ in range(6)]
    answers = [sum((rng.choice(phrases) for _ in range(6)), []) for _ in range(40)]
    prompts = [[rng.randrange(60) for _ in range(5)] for _ in answers]
    fitted = calibrate(answers[:30], list(zip(prompts[30:], answers[30:])))
    assert set(fitted) == {"index", "counts"}
    for fit in fitted.values():
        assert fit["events"] >= 50 and 0 < fit["acceptance"] < 1
        assert abs(fit["mean_confidence"] - fit["acceptance"]) < 0.1  # calibrated on average


def test_the_drafter_uses_the_index_calibration(tmp_path):
    from specwise.drafters.suffix import DEFAULT_PRIORS, index_identity

    target = toy_loaded("tiny-target")
    info = {"target": index_identity(target), "calibration": {"index": {"smooth": 4.0, "half": 8.0, "events": 99}}}
    SuffixIndex.from_sequences(SEQS, info=info).save(tmp_path / "idx")
    drafter = make_suffix_drafter(str(tmp_path / "idx"), target)
    assert drafter.priors == {"index": (4.0, 8.0), "counts": DEFAULT_PRIORS["counts"]}


# ---- the target -------------------------------------------------------------------------------------------------


def tiny_loaded(hf_model, name):
    from specwise.models import HFModel

    return LoadedModel(HFModel(hf_model, name=name), None, name, hf_model)


def toy_loaded(name, vocab: int = 96):
    """A loaded target without weights at hand (its identity: name and vocabulary size)."""
    return LoadedModel(ToyModel.random(vocab), None, name)


def test_wrong_target_is_refused(tmp_path, request):
    """Names, and the weights' fingerprint where they are at hand (a Hugging Face model's)."""
    from specwise.drafters.suffix import index_identity

    needs_hf()
    tiny_target, tiny_draft = request.getfixturevalue("tiny_target"), request.getfixturevalue("tiny_draft")
    target = tiny_loaded(tiny_target.model, "tiny-target")
    other = tiny_loaded(tiny_draft.model, "tiny-draft")
    SuffixIndex.from_sequences(SEQS, info={"target": index_identity(target)}).save(tmp_path / "idx")
    assert make_suffix_drafter(str(tmp_path / "idx"), target).index is not None
    with pytest.raises(IndexTargetMismatchError) as err:
        make_suffix_drafter(str(tmp_path / "idx"), other)
    assert str(err.value) == (
        "index built for 'tiny-target', target is 'tiny-draft': "
        "build one with `specwise index --target tiny-draft --out DIR`"
    )
    same_name = tiny_loaded(tiny_draft.model, "tiny-target")  # same name and shape, other weights
    with pytest.raises(IndexTargetMismatchError):
        check_index_target(load_index(tmp_path / "idx").info, same_name)


def test_a_target_without_weights_at_hand_is_told_by_name_and_vocabulary(tmp_path):
    from specwise.drafters.suffix import index_identity

    target = toy_loaded("tiny-target")
    SuffixIndex.from_sequences(SEQS, info={"target": index_identity(target)}).save(tmp_path / "idx")
    assert make_suffix_drafter(str(tmp_path / "idx"), target).index is not None
    for other in (toy_loaded("tiny-draft"), toy_loaded("tiny-target", vocab=97)):
        with pytest.raises(IndexTargetMismatchError, match="index built for 'tiny-target'"):
            make_suffix_drafter(str(tmp_path / "idx"), other)


def test_make_drafter_knows_suffix(tmp_path):
    from specwise.drafters import make_drafter
    from specwise.drafters.suffix import index_identity

    target = toy_loaded("tiny-target")
    SuffixIndex.from_sequences(SEQS, info={"target": index_identity(target)}).save(tmp_path / "idx")
    [drafter] = make_drafter(f"suffix:{tmp_path / 'idx'}", target)
    assert isinstance(drafter, SuffixDrafter) and len(drafter.index) == sum(map(len, SEQS))
    both = make_drafter(f"ngram+suffix:{tmp_path / 'idx'}", target)
    assert [d.name for d in both] == ["ngram", "suffix"]
    assert make_drafter("suffix", target)[0].index is None  # nothing shipped for this target


# ---- exactness through the engine -------------------------------------------------------------------------------


def greedy_ids(engine, prompt, n):
    return engine.generate(prompt, GREEDY, max_new_tokens=n, eos_token_ids=[]).token_ids


@pytest.mark.parametrize("gamma", [3, "auto"])
def test_greedy_identity(models, gamma):  # noqa: F811 (the fixture)
    from specwise.drafters import NoDrafter

    tiny_target = models.target
    prompts = [[1, 5, 9, 2], [7], [3, 3, 3, 3, 3, 3, 40, 41, 42, 3, 3]]
    plain = {tuple(p): greedy_ids(Engine(tiny_target, NoDrafter()), p, 40) for p in prompts}
    # the target's own answers (a prefix of them) and unrelated text: drafts that are right and drafts that are not
    rng = random.Random(3)
    seqs = [p + plain[tuple(p)][:25] for p in prompts] + [[rng.randrange(96) for _ in range(50)] for _ in range(5)]
    engine = Engine(tiny_target, SuffixDrafter(SuffixIndex.from_sequences(seqs)), gamma=gamma)
    drafted = 0
    for prompt in prompts:
        result = engine.generate(prompt, GREEDY, max_new_tokens=40, eos_token_ids=[])
        assert result.token_ids == plain[tuple(prompt)]
        drafted += result.stats.drafted
    assert drafted > 0


def test_sampling_is_exact_with_the_suffix_drafter():
    """At temperature 1 the first emitted tokens follow the target's joint distribution (the engine tests' check)."""
    from test_engine import LENGTH, SETTINGS, VOCAB, chi2_pvalue, exact_joint, run_many

    target = ToyModel.random(VOCAB, seed=11)
    seqs = [[1, 0, 2, 1, 3], [1, 0, 2, 2], [1, 3, 3, 0], [0, 1, 1, 2, 3, 0]]
    drafter = SuffixDrafter(SuffixIndex.from_sequences(seqs), min_match=1)
    engine = Engine(target, drafter, gamma=3)
    params = SETTINGS["t1"]
    n = 6000
    counts = run_many(engine, params, n)
    pvalue = chi2_pvalue(counts, exact_joint(target, [1], params, LENGTH), n)
    assert pvalue > 1e-4, f"emitted sequences do not follow p (chi-square p-value {pvalue:.2e})"
    assert engine.generate([1], params, max_new_tokens=3, eos_token_ids=[]).stats.drafted > 0


def test_sequences_may_hold_large_token_ids(tmp_path):
    seqs = [[70_000, 70_001, 70_002], [5, 70_001, 70_002, 9]]
    index = SuffixIndex.from_sequences(seqs, info={"target": {"name": "big", "vocab_size": 151_936}})
    index.save(tmp_path / "big")
    assert np.load(tmp_path / "big" / "tokens.npy").dtype == np.uint32
    drafter = SuffixDrafter(load_index(tmp_path / "big"), min_match=1)
    assert propose(drafter, [70_001])[0] == [70_002, 9]  # then the end of one sequence, 9 in the other (a tie)
    assert json.loads((tmp_path / "big" / "index.json").read_text())["tokens"] == 7


@pytest.mark.slow
def test_real_target_greedy_identity_from_its_own_answers(smollm, tmp_path):
    """The default model answers two prompts; an index of those answers drafts them again, exactly."""
    from specwise.drafters.suffix import index_identity
    from specwise.runtime import encode_prompt

    texts = ["Name three primary colors.", "Write a Python function that reverses a string."]
    prompts = [encode_prompt(smollm.tokenizer, t, chat=True) for t in texts]
    plain_engine = Engine(smollm.model, None, gamma=0)
    plain = [plain_engine.generate(p, GREEDY, max_new_tokens=48, eos_token_ids=[]).token_ids for p in prompts]

    def answer(prompt, temperature, seed):
        return plain[prompts.index(prompt)]

    info = {"target": index_identity(smollm)}
    build_index(prompts, answer, tmp_path / "data", tmp_path / "index", info, progress=False)
    drafter = make_suffix_drafter(str(tmp_path / "index"), smollm)
    engine = Engine(smollm.model, drafter, gamma="auto")
    for prompt, expected in zip(prompts + [encode_prompt(smollm.tokenizer, "Count from one to ten.", chat=True)],
                                plain + [None]):  # fmt: skip
        result = engine.generate(prompt, GREEDY, max_new_tokens=48, eos_token_ids=[])
        if expected is None:
            expected = plain_engine.generate(prompt, GREEDY, max_new_tokens=48, eos_token_ids=[]).token_ids
        else:
            assert result.stats.accepted >= 24  # the answer is in the index
        assert result.token_ids == expected
