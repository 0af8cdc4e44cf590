"""Predicted outputs: the prediction drafter (alignment, re-synchronisation after lines inserted, deleted or
changed), the output unchanged with any prediction (greedy token for token, seeded sampling token for token, and
the emitted distribution), long runs under the adaptive planner (counted in target passes), the batch engine, and
the server's ``prediction`` through the official openai client."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_engine import LENGTH, VOCAB, chi2_pvalue, exact_joint

from specwise.acceptance import acceptance
from specwise.batch import BatchEngine, Request
from specwise.costs import PassCosts
from specwise.drafters import NgramDrafter, NoDrafter, PredictionDrafter
from specwise.engine import Engine
from specwise.metrics import SpecStats
from specwise.models.toy import ToyModel
from specwise.planner import AdaptivePlanner, FixedPlanner
from specwise.sampling import SamplingParams

GREEDY = SamplingParams()
NL = 0  # the "newline" of the drafter's unit tests
A, B, C = [11, 12, NL], [21, 22, NL], [31, 32, NL]  # three "lines"
PROMPT = [5, 6, 7]


def draft(drafter: PredictionDrafter, output: list[int], k: int = 3):
    """The drafter's proposal after ``output`` (a continuation of what it saw), as (tokens, kind)."""
    d = drafter.propose(PROMPT + output, k, GREEDY, None)
    return d.ids, d.kind


def started(prediction: list[int]) -> PredictionDrafter:
    drafter = PredictionDrafter(prediction)
    drafter.begin(PROMPT)
    return drafter


# ---- the drafter ---------------------------------------------------------------------------------------------


def test_the_pointer_follows_the_emitted_tokens():
    d = started(A + B + C)
    assert draft(d, []) == ([11, 12, NL], None)
    assert draft(d, [11, 12]) == ([NL, 21, 22], None)
    assert draft(d, [11, 12, NL, 21], k=8) == ([22, NL, 31, 32, NL], None)  # up to the prediction's end
    assert draft(d, A + B + C) == ([], None)  # all of it emitted: nothing left


def test_after_an_inserted_line_it_drafts_the_line_that_follows():
    d = started(A + B + C)
    assert draft(d, A) == (B, None)
    assert draft(d, A + [41]) == ([], None)  # the inserted line's tokens are nowhere in the prediction
    assert draft(d, A + [41, 42]) == ([], None)
    # its newline: the nearest newline at or after the pointer (the start of B) is A's own, so B comes next
    assert draft(d, A + [41, 42, NL]) == (B, 1)
    assert draft(d, A + [41, 42, NL] + B) == (C, None)  # B followed: aligned again


def test_after_a_deleted_line_it_drafts_past_it():
    d = started(A + B + C)
    assert draft(d, A) == (B, None)
    assert draft(d, A + [31]) == ([32, NL], 2)  # [NL, 31] ends in the prediction after B
    assert draft(d, A + [31, 32]) == ([NL], None)


def test_after_a_changed_line_it_drafts_the_next_one():
    d = started(A + B + C)
    assert draft(d, A + [21]) == ([22, NL, 31], None)
    assert draft(d, A + [21, 99]) == ([], None)  # changed from here
    assert draft(d, A + [21, 99, NL]) == (C, 1)  # the nearest newline after the pointer ends B


def test_the_nearest_occurrence_after_the_pointer_is_preferred_else_the_nearest_before():
    line = [7, 8, NL]
    d = started(line + [1] + line + [2] + line + [3])
    assert draft(d, line + [1], k=1) == ([7], None)
    # departed at the second line: of the three, the one after the pointer (not the first, not the last)
    assert draft(d, line + [1, 9, 7, 8, NL], k=1) == ([2], 3)
    other = started(line + [1] + line + [2])
    assert draft(other, line + [1] + line + [2, 9, 7, 8, NL], k=1) == ([2], 3)  # none after: the nearest before


def test_the_longest_suffix_wins_over_nearer_shorter_ones():
    d = started([1, NL, 3, 4, NL, 5, 6, 4, NL, 8])
    assert draft(d, [1, 99, 6, 4, NL], k=1) == ([8], 3)  # [6, 4, NL] matches once, far from the pointer


def test_a_resynchronisation_no_token_confirms_does_not_move_the_pointer():
    d = started([1, 2, 3, NL, 4, 5, 9, 9, 9, NL, 6])
    assert draft(d, [1, 2, 9], k=1) == ([9], 1)  # a weak guess: 9 first appears after 5
    # the guess was wrong (7 is not 9): the pointer is back where the output departed (at 3), so the newline
    # nearest after it is the first, not the one after the guess
    assert draft(d, [1, 2, 9, 7, NL], k=2) == ([4, 5], 1)


def test_a_prediction_source_of_its_own_per_fork_and_per_request():
    d = started(A + B)
    assert draft(d, A) == (B, None)
    d.begin([1, 2])  # a new request: the pointer starts again
    assert d.propose([1, 2], 2, GREEDY, None).ids == [11, 12]
    forked = d.fork(None)
    forked.begin([1])
    assert forked.propose([1, 11], 2, GREEDY, None).ids == [12, NL]
    assert d.propose([1, 2, 11, 12, NL], 2, GREEDY, None).ids == [21, 22]  # the original kept its own pointer


# ---- through the engine: exact, whatever the prediction --------------------------------------------------------


def greedy(engine: Engine, prompt: list[int], n: int, prediction=None, params=GREEDY):
    return engine.generate(prompt, params, max_new_tokens=n, eos_token_ids=[], prediction=prediction)


def edited(tokens: list[int]) -> list[int]:
    """``tokens`` with a stretch changed, one deleted and one inserted."""
    out = list(tokens)
    out[10:14] = [3, 3, 3]
    del out[30:36]
    out[50:50] = [1, 2, 3, 4, 5]
    return out


@pytest.mark.parametrize("gamma", [4, "auto"])
@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_greedy_output_is_unchanged_by_any_prediction(gamma, drafter):
    target = ToyModel.random(40, seed=5)
    plain = greedy(Engine(target, None, gamma=0), [1, 2], 80).token_ids
    engine = Engine(target, NgramDrafter() if drafter == "ngram" else None, gamma=gamma)
    rng = np.random.default_rng(0)
    predictions = {"perfect": plain, "edited": edited(plain), "random": rng.integers(0, 40, 90).tolist()}
    for name, prediction in predictions.items():
        result = greedy(engine, [1, 2], 80, prediction)
        assert result.token_ids == plain, name
        counts = result.stats.by_drafter.get("prediction", {"drafted": 0, "accepted": 0})
        assert result.stats.accepted_prediction_tokens == counts["accepted"]
        assert result.stats.rejected_prediction_tokens == counts["drafted"] - counts["accepted"]
    assert greedy(engine, [1, 2], 80).token_ids == plain  # and without one, after requests with one


def test_a_perfect_prediction_is_all_accepted_and_a_random_one_rarely():
    target = ToyModel.random(40, seed=5)
    engine = Engine(target, None, gamma=4)
    plain = greedy(engine, [1, 2], 60).token_ids
    good = greedy(engine, [1, 2], 60, plain).stats
    assert good.accepted_prediction_tokens == good.accepted and good.rejected_prediction_tokens == 0
    assert good.target_passes == math.ceil(60 / 5) and good.accepted == 60 - good.target_passes
    bad = greedy(engine, [1, 2], 60, [(t + 1) % 40 for t in plain]).stats
    assert bad.accepted_prediction_tokens <= 3 and bad.rejected_prediction_tokens > 0


def test_seeded_sampling_gives_the_same_tokens_with_any_prediction():
    """Single-token drafts are verified by the coupled rule, whose output does not depend on the draft: a seeded
    request gives the tokens it gives without a prediction."""
    target = ToyModel.random(40, seed=5)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    plain = greedy(Engine(target, None, gamma=0), [1], 60, params=params).token_ids
    engine = Engine(target, NgramDrafter(), gamma="auto")
    for prediction in (plain, edited(plain), [3] * 50):
        result = greedy(engine, [1], 60, prediction, params)
        assert result.token_ids == plain
    assert result.stats.by_drafter["prediction"]["drafted"] > 0


@pytest.mark.parametrize(
    ("gamma", "prediction", "drafter"), [(3, [2, 0, 1], None), (4, [1, 1, 3, 2, 1], "ngram"), (2, [3], None)]
)
def test_the_emitted_distribution_is_the_targets_with_a_prediction(gamma, prediction, drafter):
    """The first three emitted tokens, through the engine with a prediction source (alone, or before prompt
    lookup), follow the target's joint distribution (the check's power: test_engine's
    test_joint_check_has_power)."""
    params = SamplingParams(temperature=1.0)
    target = ToyModel.random(VOCAB, seed=11)
    engine = Engine(target, NgramDrafter(max_ngram=2) if drafter else None, gamma=gamma)
    n, counts, drafted = 6000, {}, 0
    for i in range(n):
        run = SamplingParams(params.temperature, seed=1000 + i)
        result = engine.generate([1], run, max_new_tokens=LENGTH, eos_token_ids=[], prediction=prediction)
        ids = tuple(result.token_ids)
        counts[ids] = counts.get(ids, 0) + 1
        drafted += result.stats.by_drafter.get("prediction", {}).get("drafted", 0)
    assert drafted >= n  # the prediction was drafted on every request
    pvalue = chi2_pvalue(counts, exact_joint(target, [1], params, LENGTH), n)
    assert pvalue > 1e-4, f"emitted sequences do not follow p (chi-square p-value {pvalue:.2e})"


def test_a_prediction_outside_the_vocabulary_is_refused_by_the_engine_and_the_batch():
    target = ToyModel.random(40, seed=5)
    engine = Engine(target, None, gamma=4)
    errors = []
    with pytest.raises(ValueError) as single:
        engine.generate([1], max_new_tokens=4, prediction=[3, 40])
    errors.append(str(single.value))
    batch = BatchEngine(engine, max_batch=2)
    with pytest.raises(ValueError) as batched:
        batch.submit(Request([1], max_new_tokens=4, prediction=[3, 40]))
    errors.append(str(batched.value))
    assert errors[0] == errors[1] and "prediction token id 40 is outside the vocabulary (0..39)" in errors[0]
    assert batch.waiting == 0
    with pytest.raises(ValueError, match="prediction token id -1"):
        engine.generate([1], max_new_tokens=4, prediction=[-1])
    with pytest.raises(ValueError, match="prediction must be a list of token ids"):
        engine.generate([1], max_new_tokens=4, prediction=[1.5])


def test_the_batch_gives_each_request_its_own_prediction():
    target = ToyModel.random(40, seed=5)
    engine = Engine(target, NgramDrafter(), gamma="auto")
    prompts = [[1, 2], [3], [4, 5, 6]]
    plain = [greedy(Engine(target, None, gamma=0), p, 50).token_ids for p in prompts]
    predictions = [plain[0], edited(plain[1]), None]
    batch = BatchEngine(engine, max_batch=3)
    requests = [Request(p, max_new_tokens=50, eos_token_ids=[], prediction=q) for p, q in zip(prompts, predictions)]
    outputs = batch.run_all(requests)
    for events, expected, prediction in zip(outputs, plain, predictions):
        assert [t for e in events for t in e.token_ids] == expected
        stats = events[-1].stats
        assert (stats.accepted_prediction_tokens > 0) == (prediction is not None)
    assert outputs[0][-1].stats.rejected_prediction_tokens == 0  # its prediction was the output itself


# ---- long runs ---------------------------------------------------------------------------------------------


class FixedCosts(PassCosts):
    """Costs that do not depend on the clock: a pass over k tokens takes 10 ms x (1 + 0.05 (k - 1)), drafting is
    nearly free (so the planner's choices, and the pass counts, are the same on every machine)."""

    def observe_ask(self, source, drafted, seconds):
        super().observe_ask(source, drafted, 1e-6 * drafted)

    def observe_intake(self, source, seconds, tokens):
        super().observe_intake(source, 1e-6 * tokens, tokens)

    def observe_pass(self, k, seconds):
        super().observe_pass(k, 0.01 * (1.0 + 0.05 * (k - 1)))

    def observe_shared_pass(self, rows, seconds):
        super().observe_shared_pass(rows, 0.01 * (1.0 + 0.05 * (rows - 1)))


def clockless(**kwargs) -> AdaptivePlanner:
    planner = AdaptivePlanner(**kwargs)
    planner.costs = FixedCosts()
    return planner


def test_a_perfect_prediction_of_100_tokens_takes_far_fewer_passes_than_gamma_8_allows():
    target = ToyModel.random(40, seed=5)
    plain = greedy(Engine(target, None, gamma=0), [1, 2], 100).token_ids
    fixed = greedy(Engine(target, None, gamma=8), [1, 2], 100, plain).stats
    assert fixed.target_passes == math.ceil(100 / 9) and max(fixed.gamma_histogram) == 8  # fixed gamma: unchanged
    short = greedy(Engine(target, None, gamma=clockless(long_gamma=8)), [1, 2], 100, plain)
    long = greedy(Engine(target, None, gamma=clockless()), [1, 2], 100, plain)
    assert long.token_ids == short.token_ids == plain
    assert short.stats.target_passes >= math.ceil(100 / 9)
    assert long.stats.target_passes <= 7 and max(long.stats.gamma_histogram) == 32
    assert long.stats.rejected_prediction_tokens == 0


def test_prompt_lookup_drafts_long_runs_too():
    target = ToyModel.random(40, seed=5)
    text = greedy(Engine(target, None, gamma=0), [1, 2], 60).token_ids
    prompt = [1, 2, *text, 1, 2]  # the answer repeats the prompt
    plain = greedy(Engine(target, None, gamma=0), prompt, 60).token_ids
    result = greedy(Engine(target, NgramDrafter(), gamma=clockless()), prompt, 60)
    assert result.token_ids == plain
    assert max(result.stats.gamma_histogram) > 8


def test_other_sources_keep_their_record_across_requests_and_the_prediction_has_its_own():
    """The engine's drafters learn across requests whether or not a request brings a prediction; the prediction's
    record is carried from one request with a prediction to the next, and its costs are kept apart."""
    target = ToyModel.random(40, seed=5)
    planner = clockless()
    engine = Engine(target, NgramDrafter(), gamma=planner)
    plain = greedy(engine, [1, 2], 60).token_ids
    state = engine._state
    ngram_record = state.known[0]
    greedy(engine, [1, 2], 60, plain)
    assert engine._state is state and state.known[0] is ngram_record  # the same record, shared
    record = state.request_record
    assert record is not None and len(record.positions) == planner.long_gamma
    assert acceptance(record, planner.prior)[0] > 0.8  # the prediction was always right
    greedy(engine, [1, 2], 60, edited(plain))
    assert state.request_record is record
    assert set(planner.costs._asks) <= {-1, 0}  # the prediction's key is apart from the ngram's


def test_the_cost_model_covers_long_passes_past_the_measured_curve():
    costs = PassCosts({2: 1.1, 4: 1.3, 8: 1.7, 16: 2.5})
    ratios = [costs.ratio(k) for k in range(1, 34)]
    assert all(b >= a for a, b in zip(ratios, ratios[1:]))
    slope = (2.5 - 1.7) / (16 - 8)
    assert ratios[32] == pytest.approx(2.5 + slope * (33 - 16))  # c(33): on along the curve's last points
    assert PassCosts().ratio(33) == pytest.approx(1.0 + 0.1 * 32)  # no curve: the default's slope


def test_fixed_gamma_drafts_gamma_even_for_a_source_of_copies():
    p = FixedPlanner(4)
    state = p.for_request(p.new_state([NoDrafter()]), PredictionDrafter(list(range(50))))
    p.begin(state)
    for source in state.sources:
        source.begin([1])
    assert len(p.draft(state, [1], 100, GREEDY, None).draft) == 4
    assert len(state.known[0].positions) == 4


def test_usage_counts_and_summary_name_the_prediction():
    stats = SpecStats()
    stats.record_step(5, 3, 4, "prediction")
    stats.record_step(4, 4, 5, "ngram")
    assert (stats.accepted_prediction_tokens, stats.rejected_prediction_tokens) == (3, 2)
    assert (SpecStats().accepted_prediction_tokens, SpecStats().rejected_prediction_tokens) == (0, 0)
    assert "prediction 1 steps, 3/5 accepted" in stats.summary()


# ---- the default model ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_default_model_greedy_identity_with_good_and_bad_predictions(smollm):
    model, tok = smollm.model, smollm.tokenizer
    prompt = list(tok("def fibonacci(n):\n    ")["input_ids"])
    plain = Engine(model, None, gamma=0).generate(prompt, GREEDY, 100, eos_token_ids=[])
    good = plain.token_ids
    text = tok.decode(good)
    changed = list(tok(text.replace("n", "m", 3) + "\n# the end\n", add_special_tokens=False)["input_ids"])
    bad = list(tok("The quick brown fox jumps over the lazy dog. " * 6, add_special_tokens=False)["input_ids"])
    for gamma, drafter in ((4, None), ("auto", NgramDrafter())):
        engine = Engine(model, drafter, gamma=gamma)
        for prediction in (good, changed, bad, None):
            assert engine.generate(prompt, GREEDY, 100, eos_token_ids=[], prediction=prediction).token_ids == good
    long = Engine(model, NgramDrafter(), gamma=clockless()).generate(
        prompt, GREEDY, 100, eos_token_ids=[], prediction=good
    )
    assert long.token_ids == good and long.stats.target_passes <= 7
    batch = BatchEngine(Engine(model, NgramDrafter(), gamma="auto"), max_batch=2)
    outputs = batch.run_all([Request(prompt, GREEDY, 100, [], [], prediction=p) for p in (good, changed)])
    assert all([t for e in events for t in e.token_ids] == good for events in outputs)
    assert outputs[0][-1].stats.accepted_prediction_tokens >= 90


# ---- the server ----------------------------------------------------------------------------------------------

MODEL = "tiny"
CHAT = [{"role": "user", "content": "Rewrite: one two three\nfour five six\nseven eight nine"}]


def serve(tiny_dir: str, drafter: str, gamma):
    from test_server import live_server

    from specwise.runtime import build_runtime
    from specwise.server.app import create_app

    app = create_app(build_runtime(tiny_dir, drafter, gamma, "cpu"), model_name=MODEL)
    with live_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def plain_url(tiny_dir, one_thread):
    """No drafting at all (gamma 0: a prediction is not drafted either): the reference."""
    yield from serve(tiny_dir, "none", 0)


@pytest.fixture(scope="module")
def url(tiny_dir, one_thread):
    """Prompt lookup and the adaptive planner: a prediction is asked first, then prompt lookup."""
    yield from serve(tiny_dir, "ngram", "auto")


def api(url: str):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60.0, max_retries=0)


def chat(url: str, **kw):
    return api(url).chat.completions.create(model=MODEL, messages=CHAT, temperature=0, **kw)


def test_the_server_drafts_the_prediction_and_answers_as_without_it(plain_url, url):
    reference = chat(plain_url, max_tokens=48)
    text = reference.choices[0].message.content
    details = reference.usage.completion_tokens_details.model_dump(exclude_none=True)
    assert details == {"reasoning_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    predicted = chat(url, max_tokens=48, prediction={"type": "content", "content": text})
    assert predicted.choices[0].message.content == text
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 24 and details.reasoning_tokens == 0
    by = predicted.usage.model_extra["speculative"]["by_drafter"]["prediction"]
    counts = (details.accepted_prediction_tokens, details.rejected_prediction_tokens)
    assert counts == (by["accepted"], by["drafted"] - by["accepted"])
    parts = [{"type": "text", "text": text[:10]}, {"type": "text", "text": text[10:]}]
    assert chat(url, max_tokens=48, prediction={"type": "content", "content": parts}).choices[0].message.content == text
    wrong = chat(url, max_tokens=48, prediction={"type": "content", "content": "zebra " * 40})
    assert wrong.choices[0].message.content == text
    assert chat(url, max_tokens=48).usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_completions_and_streams_take_a_prediction(plain_url, url):
    client = api(url)
    reference = api(plain_url).completions.create(model=MODEL, prompt="one two three", max_tokens=32, temperature=0)
    text = reference.choices[0].text
    prediction = {"type": "content", "content": text}
    reply = client.completions.create(
        model=MODEL, prompt="one two three", max_tokens=32, temperature=0, extra_body={"prediction": prediction}
    )
    assert reply.choices[0].text == text
    assert reply.usage.completion_tokens_details.accepted_prediction_tokens > 0
    chat_text = chat(plain_url, max_tokens=32).choices[0].message.content
    chunks = list(
        api(url).chat.completions.create(
            model=MODEL,
            messages=CHAT,
            temperature=0,
            max_tokens=32,
            stream=True,
            stream_options={"include_usage": True},
            prediction={"type": "content", "content": chat_text},
            n=2,
        )
    )
    for index in (0, 1):  # each choice drafts its own copy of the prediction
        pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(pieces) == chat_text
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens > 0


@pytest.mark.parametrize(
    "prediction",
    [
        {"type": "text", "content": "x"},
        {"type": "content", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]},
        {"type": "content", "content": 5},
        {"type": "content", "content": "x", "extra": 1},
        {"content": "x"},
        {},
        "x",
    ],
)
def test_bad_predictions_get_400_naming_the_field(url, prediction):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        chat(url, max_tokens=4, prediction=prediction)
    assert info.value.status_code == 400 and info.value.param == "prediction"
    assert "prediction" in info.value.message


def test_a_prediction_longer_than_the_context_left_is_refused(url):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        chat(url, max_tokens=4, prediction={"type": "content", "content": "one two three " * 300})
    assert info.value.status_code == 400 and info.value.param == "prediction"
    assert info.value.code == "context_length_exceeded" and "predict at most" in info.value.message
    assert chat(url, max_tokens=4).choices[0].finish_reason == "length"  # and the server goes on


# ---- the command line ----------------------------------------------------------------------------------------


def test_generate_takes_a_prediction_file_or_stdin(capsys, monkeypatch, tmp_path, tiny_dir, one_thread):
    import io
    import json

    from specwise.cli import main

    def run(*args) -> dict:
        assert main(["generate", "Say something.", "--target", tiny_dir, "--temperature", "0", "--json", *args]) == 0
        return json.loads(capsys.readouterr().out)

    base = ["--max-new-tokens", "24", "--drafter", "ngram"]
    plain = run(*base)
    path = tmp_path / "prediction.txt"
    path.write_text(plain["text"], encoding="utf-8")
    predicted = run(*base, "--prediction", str(path))
    assert predicted["token_ids"] == plain["token_ids"]
    assert predicted["stats"]["by_drafter"]["prediction"]["accepted"] > 0
    monkeypatch.setattr("sys.stdin", io.StringIO(plain["text"]))
    assert run(*base, "--prediction", "-")["stats"]["by_drafter"]["prediction"]["accepted"] > 0
    assert main(["generate", "hi", "--target", tiny_dir, "--prediction", str(tmp_path / "missing.txt")]) == 2
    assert "specwise: error: cannot read --prediction" in capsys.readouterr().err
