"""Constrained decoding: outputs match their schema, speculation keeps the constrained target's output exactly
(greedy token for token, sampled in distribution), the grammar rolls back with rejected drafts, the server's
response_format."""

# ruff: noqa: E402
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

for _name, _extra in (("llguidance", "constrained"), ("fastapi", "server"), ("openai", "dev")):
    pytest.importorskip(_name, reason=f"needs the {_extra} extra: pip install 'specwise[{_extra}]'")

import openai  # noqa: E402
from test_engine import chi2_pvalue  # noqa: E402
from test_server import live_server  # noqa: E402

from specwise.batch import BatchEngine, Request
from specwise.constraints import (
    ConstraintError,
    Grammar,
    GrammarState,
    JsonObject,
    JsonSchema,
    Regex,
    constrain_logits,
    constrain_probs,
    max_json_bytes,
)
from specwise.costs import PassCosts
from specwise.drafters import ModelDrafter, NgramDrafter
from specwise.engine import Engine
from specwise.lab.bench.schemas import EXTRACTION, SUITE
from specwise.models.toy import ToyModel
from specwise.planner import AdaptivePlanner
from specwise.runtime import build_runtime, encode_prompt
from specwise.sampling import SamplingParams, make_generator, probs_from_logits

jsonschema = pytest.importorskip("jsonschema")

NAME = {"type": "string", "maxLength": 8}
SCHEMAS = {
    "flat": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {"first": NAME, "last": NAME},
                "required": ["first", "last"],
                "additionalProperties": False,
            },
            "ok": {"type": "boolean"},
        },
        "required": ["person", "ok"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2, 3]}},
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "object",
        "properties": {
            "price": {"type": "number", "minimum": 0, "maximum": 100},
            "count": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["price", "count"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_runtimes(tiny_dir):
    """The tiny random Llama (the default model's tokenizer) without and with prompt lookup."""
    return build_runtime(tiny_dir, "none", 4, "cpu"), build_runtime(tiny_dir, "ngram", 4, "cpu")


def _generate(runtime, text: str, params: SamplingParams, max_new: int = 200):
    prompt = encode_prompt(runtime.tokenizer, text, chat=True)
    return runtime.engine.generate(prompt, params, max_new)


# ---- the constraints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("constraint", "match"),
    [
        (lambda: JsonSchema({"type": "bogus"}), "invalid JSON schema: .*bogus"),
        (lambda: JsonSchema("{not json"), "not JSON"),
        (lambda: JsonSchema([1, 2]), "expected an object"),
        (lambda: Regex("a("), "invalid regex"),
        (lambda: Grammar("start: foo("), "invalid grammar"),
    ],
)
def test_invalid_constraints_are_refused_in_one_line(constraint, match):
    with pytest.raises(ConstraintError, match=match) as info:
        constraint().check()
    assert "\n" not in str(info.value)


def test_a_constraint_is_part_of_the_sampling_params():
    params = SamplingParams(constraint=JsonSchema({"type": "object"}))
    assert params == SamplingParams(constraint=JsonSchema('{"type": "object"}'))
    hash(params)
    with pytest.raises(ValueError, match="constraint must be"):
        SamplingParams(constraint={"type": "object"})


def test_rollback_equals_a_fresh_matcher_fed_the_accepted_prefix(smol_tokenizer):
    """The masks for verifying a draft are a fresh matcher's after each prefix, and the state after them is
    unchanged; a forbidden draft token cuts the draft."""
    constraint = JsonSchema(SCHEMAS["nested"])
    text = json.dumps({"person": {"first": "Ann", "last": "Lee"}, "ok": True})
    tokens = smol_tokenizer.encode(text, add_special_tokens=False)
    vocab, eos = len(smol_tokenizer), {smol_tokenizer.eos_token_id}

    def fresh(prefix: list[int]) -> np.ndarray:
        state = GrammarState(constraint, smol_tokenizer, vocab, eos)
        state.advance(prefix)
        return state.mask()

    state = GrammarState(constraint, smol_tokenizer, vocab, eos)
    done = 0
    for at in (0, 3, 9):
        state.advance(tokens[done:at])
        done = at
        masks, n = state.draft_masks(tokens[at : at + 4])
        assert n == 4
        assert masks.dtype == np.bool_ and masks.shape == (5, vocab)
        for i in range(5):
            np.testing.assert_array_equal(masks[i], fresh(tokens[: at + i]), err_msg=f"{at} {i}")
        np.testing.assert_array_equal(state.mask(), fresh(tokens[:at]))  # rolled back
    bad = smol_tokenizer.encode("]", add_special_tokens=False)[0]
    masks, n = state.draft_masks(tokens[9:11] + [bad] + tokens[11:13])
    assert n == 2 and masks.shape[0] == 3
    np.testing.assert_array_equal(state.mask(), fresh(tokens[:9]))


def test_each_state_mask_is_computed_once(smol_tokenizer):
    """A step's draft masks serve the next step: the state after the accepted prefix (one the grammar accepts in,
    so that the end check reads its mask too) is not computed again, and every mask equals a fresh matcher's."""
    constraint = Regex("[a-z ]{1,60}")
    tokens = smol_tokenizer.encode("the cat sat on the mat and the dog", add_special_tokens=False)
    vocab, eos = len(smol_tokenizer), {smol_tokenizer.eos_token_id}

    def fresh(prefix: list[int]) -> np.ndarray:
        other = GrammarState(constraint, smol_tokenizer, vocab, eos)
        other.advance(prefix)
        return other.mask()

    state = GrammarState(constraint, smol_tokenizer, vocab, eos)
    masks, n = state.draft_masks(tokens[:4])  # the states after 0 .. 4 tokens
    assert n == 4 and state.masks == 5
    state.advance(tokens[:2])  # two accepted, then a recovered token equal to the third drafted
    assert not state.done  # accepting: the end check reads the mask, known from the draft
    state.advance(tokens[2:3])
    np.testing.assert_array_equal(state.mask(), fresh(tokens[:3]))
    masks, n = state.draft_masks(tokens[3:6])  # the state after 4 tokens is known; after 5 and 6 are new
    assert n == 3 and state.masks == 7
    for i in range(4):
        np.testing.assert_array_equal(masks[i], fresh(tokens[: 3 + i]))


def test_a_forbidden_token_is_never_emitted_even_when_the_target_prefers_it():
    logits = np.array([[5.0, 1.0, 0.0, -1.0]], dtype=np.float32)
    allowed = np.array([False, True, True, False])
    masked = constrain_logits(logits, allowed)
    assert masked.dtype == np.float32 and masked[0, 0] == float("-inf") and masked[0, 1] == 1.0
    assert logits[0, 0] == 5.0  # a new array
    for params in (SamplingParams(), SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=2.0)):
        p = probs_from_logits(masked, params)
        assert float(p[0, 0]) == 0.0 and float(p[0, 3]) == 0.0 and float(p[0, 1]) > 0


def test_constrain_probs_and_a_sampled_draft_follow_the_masks():
    """q with the forbidden tokens at 0, renormalised (a row left without mass is all 0); a sampled draft keeps the
    tokens the grammar allows, redraws a forbidden one from the masked q and ends there."""
    probs = np.array([[0.5, 0.2, 0.2, 0.1], [0.9, 0.0, 0.0, 0.1]], dtype=np.float32)
    q = constrain_probs(probs, np.array([False, True, True, False]))
    assert q.dtype == np.float32
    np.testing.assert_allclose(q[0], [0.0, 0.5, 0.5, 0.0])
    assert (q[1] == 0).all()
    state = GrammarState(Regex("[abc]{1,3}"), ToyTokenizer(), 6, {0})  # <eos> a b c ab ca
    drafted = np.full((4, 6), 1 / 6, dtype=np.float32)
    tokens, q, masks = state.sampled_draft([1, 2, 3, 1], drafted, make_generator(0))
    assert tokens == [1, 2, 3, 0]  # after "abc" only the end is allowed: the fourth "a" is redrawn as it
    assert q.shape == (4, 6) and q.dtype == np.float32 and masks.shape == (5, 6) and masks.dtype == np.bool_
    np.testing.assert_array_equal(q[3], [1, 0, 0, 0, 0, 0])
    assert not masks[0, 0] and masks[3].tolist() == [True] + [False] * 5
    np.testing.assert_array_equal(state.mask(), masks[0])  # the matcher is left as it was
    assert state.mask().flags.writeable is False  # a known mask is shared: read-only


# ---- outputs match their schema ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(SCHEMAS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_outputs_are_valid_against_their_schema(tiny_runtimes, shape, temperature):
    schema = SCHEMAS[shape]
    for runtime in tiny_runtimes:
        params = SamplingParams(temperature=temperature, seed=7, constraint=JsonSchema(schema))
        result = _generate(runtime, f"Answer in JSON ({shape}).", params)
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), schema)


def test_json_object_and_regex(tiny_runtimes):
    runtime = tiny_runtimes[1]
    result = _generate(runtime, "Some JSON.", SamplingParams(constraint=JsonObject()), 300)
    if result.finish_reason == "stop":
        assert isinstance(json.loads(result.text), dict)
    else:
        assert result.text.lstrip().startswith("{")
    result = _generate(runtime, "A code.", SamplingParams(temperature=1.0, seed=1, constraint=Regex("[a-c]{2}-[0-9]")))
    assert result.finish_reason == "stop"
    assert len(result.text) == 4 and result.text[2] == "-" and result.text[3].isdigit()


# ---- the schema suite: bounded shapes end complete within their bound ------------------------------------------


def test_max_json_bytes_is_the_longest_answer_and_none_when_unbounded():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"type": "number", "minimum": -5, "maximum": 10}},
        "additionalProperties": False,
    }
    schema["properties"]["b"]["multipleOf"] = 0.25
    longest = json.dumps({"a": "\x01\x01\x01", "b": -4.75})  # escapes are the longest characters
    assert max_json_bytes(schema) >= len(longest.encode())
    assert max_json_bytes(schema) - len(longest.encode()) <= 2  # "10.00" is the widest number the bound allows
    assert max_json_bytes({"type": "array", "items": {"enum": ["x", "yy"]}, "maxItems": 3}) == len('["yy", "yy", "yy"]')
    for unbounded in (
        {"type": "string"},
        {"type": "number", "minimum": 0, "maximum": 1},  # 0.3333... has no end
        {"type": "integer", "minimum": 0},
        {"type": "array", "items": {"type": "boolean"}},
        {"type": "object", "properties": {"a": {"type": "boolean"}}},  # other properties allowed
    ):
        assert max_json_bytes(unbounded) is None, unbounded


def test_the_suite_has_twenty_bounded_shapes():
    assert len(SUITE) == 20
    seen = set()
    for name, (schema, prompt) in SUITE.items():
        JsonSchema(schema).check()
        assert max_json_bytes(schema) is not None, name
        assert prompt
        seen |= {
            key
            for key in ("anyOf", "enum", "pattern", "$ref", "multipleOf", "const", "format", "minItems")
            if key in json.dumps(schema)
        }
    assert seen == {"anyOf", "enum", "pattern", "$ref", "multipleOf", "const", "format", "minItems"}
    assert max_json_bytes(EXTRACTION) is not None


@pytest.mark.parametrize("shape", sorted(SUITE))
def test_suite_answers_are_valid_and_complete_within_their_bound(tiny_runtimes, shape):
    """Given max_json_bytes(schema) tokens, every answer ends complete and valid (sampled: the random model writes
    long strings); greedy speculative output equals plain output."""
    schema, prompt = SUITE[shape]
    bound = max_json_bytes(schema)
    sampled = _generate(
        tiny_runtimes[1], prompt, SamplingParams(temperature=1.0, seed=5, constraint=JsonSchema(schema)), bound
    )
    assert sampled.finish_reason == "stop"
    assert len(sampled.text.encode()) <= bound
    jsonschema.validate(json.loads(sampled.text), schema)
    params = SamplingParams(constraint=JsonSchema(schema))
    plain, spec = (_generate(r, prompt, params, bound) for r in tiny_runtimes)
    assert plain.finish_reason == "stop"
    jsonschema.validate(json.loads(plain.text), schema)
    assert spec.token_ids == plain.token_ids


# ---- greedy: speculative output equals plain output ------------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(SCHEMAS))
def test_greedy_speculative_equals_plain_on_the_tiny_model(tiny_runtimes, shape):
    params = SamplingParams(constraint=JsonSchema(SCHEMAS[shape]))
    plain, spec = (_generate(r, f"Repeat: {json.dumps(SCHEMAS[shape])}", params) for r in tiny_runtimes)
    assert spec.token_ids == plain.token_ids


def test_greedy_speculative_equals_plain_under_a_regex(tiny_runtimes):
    """A regex accepts after every character, so the end check reads the mask each step (from the draft's masks); a
    drafter equal to the target drafts every step and is accepted."""
    plain_runtime = tiny_runtimes[0]
    target = plain_runtime.engine.target
    twin = Engine(target, ModelDrafter(target.sequence()), gamma=3, tokenizer=plain_runtime.tokenizer)
    params = SamplingParams(constraint=Regex("[^\\n]{1,80}"))
    prompt = encode_prompt(plain_runtime.tokenizer, "Say something.", chat=True)
    plain = plain_runtime.engine.generate(prompt, params, 60)
    spec = twin.generate(prompt, params, 60)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted > 0 and spec.stats.target_passes < plain.stats.target_passes


@pytest.mark.slow
def test_greedy_speculative_equals_plain_on_the_default_model():
    """The default model with the default drafter and with prompt lookup, extraction-style prompts."""
    runtime = build_runtime("default", "auto")
    engine = runtime.engine
    default = engine.drafters
    drafters = {"plain": None, "default": default, "ngram": [NgramDrafter()]}
    prompts = [
        ("Extract the person as JSON: Maria Lopez, 34, lives in Madrid and likes chess.", "flat"),
        ("Give the colour and size of a big blue box as JSON.", "enum"),
        ("The product code is AB-123. Give it as JSON.", "pattern"),
    ]
    for text, shape in prompts:
        params = SamplingParams(constraint=JsonSchema(SCHEMAS[shape]))
        out = {}
        for name, drafter in drafters.items():
            engine.drafters = drafter if drafter is not None else [NoDrafterFor(engine)]
            out[name] = _generate(runtime, text, params, 120)
        engine.drafters = default
        assert out["default"].token_ids == out["plain"].token_ids, text
        assert out["ngram"].token_ids == out["plain"].token_ids, text
        if out["plain"].finish_reason == "stop":
            jsonschema.validate(json.loads(out["plain"].text), SCHEMAS[shape])


def NoDrafterFor(engine):  # noqa: N802 - reads as a drafter's name
    from specwise.drafters import NoDrafter

    return NoDrafter(engine.target.device)


# ---- jump-forward: forced tokens are rows of the pass, not drafts ---------------------------------------------


class RecordingCosts(PassCosts):
    """The planner's cost model, recording the size of every pass it is told of."""

    def __init__(self) -> None:
        super().__init__()
        self.passes: list[int] = []

    def observe_pass(self, k: int, seconds: float) -> None:
        self.passes.append(k)
        super().observe_pass(k, seconds)


class RecordingPlanner(AdaptivePlanner):
    """The adaptive planner on RecordingCosts (``passes``: the size of every pass it was told of)."""

    def __init__(self) -> None:
        super().__init__()
        self.costs = RecordingCosts()

    @property
    def passes(self) -> list[int]:
        return self.costs.passes


def test_forced_tokens_are_timed_as_rows_of_their_pass_and_counted_apart(tiny_runtimes, monkeypatch):
    """The planner times each pass by the rows the target was fed (the forced tokens' included), and the statistics
    count forced tokens as emitted, never as drafted or accepted."""
    runtime = tiny_runtimes[0]
    target = runtime.engine.target
    fed: list[int] = []
    forward = target.forward

    def recording(tokens, num_logits=None):
        if num_logits != 0:  # not the prefill
            fed.append(int(np.asarray(tokens).size))
        return forward(tokens, num_logits)

    monkeypatch.setattr(target, "forward", recording)
    planner = RecordingPlanner()
    engine = Engine(target, NgramDrafter(), gamma=planner, tokenizer=runtime.tokenizer)
    params = SamplingParams(constraint=JsonSchema(SCHEMAS["nested"]))
    prompt = encode_prompt(runtime.tokenizer, "A person as JSON.", chat=True)
    stats = engine.generate(prompt, params, 200).stats
    assert stats.forced > 0 and max(fed) > 1
    assert planner.passes == fed
    # each pass emits its forced tokens, its accepted draft and one token of its own (but the last, when the forced
    # tokens completed the output)
    assert stats.new_tokens - stats.forced - stats.accepted in (stats.target_passes, stats.target_passes - 1)
    assert stats.to_dict()["forced"] == stats.forced


def test_without_jump_forward_each_token_has_its_own_pass_and_the_answer_is_the_same(tiny_runtimes):
    """jump_forward=False (the benchmarks' reference decoder) gives the same greedy answer, plainly and under
    speculation, with the forced tokens decoded one pass each instead of fed free."""
    runtime = tiny_runtimes[0]
    target = runtime.engine.target
    params = SamplingParams(constraint=JsonSchema(SCHEMAS["nested"]))
    prompt = encode_prompt(runtime.tokenizer, "A person as JSON.", chat=True)
    out = {}
    for name, drafter, jump in (("plain", None, True), ("per_token", None, False), ("spec", NgramDrafter(), False)):
        engine = Engine(target, drafter, gamma=4, tokenizer=runtime.tokenizer, jump_forward=jump)
        out[name] = engine.generate(prompt, params, 200)
    assert out["plain"].stats.forced > 0
    assert out["per_token"].token_ids == out["plain"].token_ids == out["spec"].token_ids
    per_token = out["per_token"].stats
    assert per_token.forced == 0 and out["spec"].stats.forced == 0
    assert per_token.target_passes == per_token.new_tokens
    assert out["plain"].stats.target_passes < per_token.target_passes


def test_a_batch_counts_forced_tokens_as_rows_of_its_pass(tiny_runtimes, monkeypatch):
    runtime = tiny_runtimes[1]
    model = type(runtime.engine.target)
    fed: list[int] = []
    forward, forward_batch, inside = model.forward, model.forward_batch, [0]

    def recording_batch(self, items, num_logits=None):  # a pass over several sequences
        fed.append(sum(int(np.asarray(tokens).size) for _, tokens in items))
        inside[0] += 1
        try:
            return forward_batch(self, items, num_logits)
        finally:
            inside[0] -= 1

    def recording(self, tokens, num_logits=None):  # a pass of one sequence (or one inside a batch's pass)
        if not inside[0]:
            fed.append(int(np.asarray(tokens).size))
        return forward(self, tokens, num_logits)

    monkeypatch.setattr(model, "forward_batch", recording_batch)
    monkeypatch.setattr(model, "forward", recording)
    batch = BatchEngine(runtime.engine, max_batch=2)
    params = SamplingParams(constraint=JsonSchema(SCHEMAS["nested"]))
    for text in ("A person as JSON.", "Another person as JSON."):
        batch.submit(Request(encode_prompt(runtime.tokenizer, text, chat=True), params, 200))
    rows, forced = [], 0
    while batch.has_work():
        step = batch.step()
        rows.append(step.rows)
        forced += sum(event.stats.forced for _, event in step.events if event.stats is not None)
    assert forced > 0
    assert rows == fed


# ---- sampled: the emitted distribution is the constrained target's ----------------------------------------------


class ToyTokenizer:
    """Six tokens: <eos> a b c ab ca (byte-level BPE), for llguidance and the engine's text."""

    eos_token_id = 0

    def __init__(self) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        vocab = {t: i for i, t in enumerate(["<eos>", "a", "b", "c", "ab", "ca"])}
        self.backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("c", "a")]))
        self.backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.backend.decoder = decoders.ByteLevel()

    def to_str(self) -> str:
        return self.backend.to_str()

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode([i for i in ids if i != 0])


def constrained_joint(model: ToyModel, tokenizer, constraint, prompt: list[int], params: SamplingParams) -> dict:
    """P(output | prompt) of the constrained target by enumeration: each step p with the grammar's mask (from a
    fresh matcher fed the prefix), until the end token or the grammar's end."""
    out: dict[tuple, float] = {}

    def walk(seq: tuple, prob: float) -> None:
        state = GrammarState(constraint, tokenizer, model.vocab_size, {0})
        state.advance(list(seq))
        if state.done:
            out[seq] = out.get(seq, 0.0) + prob
            return
        ctx = prompt + list(seq)
        p = probs_from_logits(constrain_logits(model.next_logits(len(ctx) - 1, ctx[-1])[None], state.mask()), params)
        for tok, pt in enumerate(p[0].tolist()):
            if pt > 0:
                if tok == 0:
                    out[seq + (0,)] = out.get(seq + (0,), 0.0) + prob * pt
                else:
                    walk(seq + (tok,), prob * pt)

    walk((), 1.0)
    return out


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_sampled_constrained_output_follows_the_constrained_target(drafter):
    tokenizer = ToyTokenizer()
    constraint = Regex("[abc]{1,3}")
    target = ToyModel.random(6, seed=11)
    prompt = [1, 3, 1]
    params = SamplingParams(temperature=1.0, top_p=0.95)
    # the draft model proposes forbidden tokens often (its own table, no grammar): they are redrawn or cut
    source = ModelDrafter(ToyModel.random(6, seed=12)) if drafter == "model" else NgramDrafter()
    engine = Engine(target, source, gamma=3, tokenizer=tokenizer)
    exact = constrained_joint(target, tokenizer, constraint, prompt, params)
    assert abs(sum(exact.values()) - 1.0) < 1e-5
    n = 3000
    counts: Counter = Counter()
    drafted = 0
    for seed in range(n):
        run = SamplingParams(temperature=1.0, top_p=0.95, seed=seed, constraint=constraint)
        result = engine.generate(prompt, run, max_new_tokens=8, eos_token_ids=[0])
        assert result.finish_reason == "stop"
        counts[tuple(result.token_ids)] += 1
        drafted += result.stats.drafted
    assert drafted > n // 2
    assert set(counts) <= {k for k, v in exact.items() if v > 0}
    assert chi2_pvalue(counts, exact, n) > 1e-3


# ---- the server --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers(tiny_runtimes):
    from specwise.server.app import create_app

    plain_app, spec_app = (create_app(r, model_name="tiny") for r in tiny_runtimes)
    with live_server(plain_app) as plain, live_server(spec_app) as spec:
        yield plain, spec


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60.0, max_retries=0)


def test_server_json_schema_through_the_openai_client(servers):
    schema = SCHEMAS["nested"]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    replies = [
        _client(url).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "A person as JSON."}],
            response_format=fmt,
            temperature=0,
            max_tokens=200,
        )
        for url in servers
    ]
    for reply in replies:
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
        assert reply.usage.speculative["forced"] > 0  # the keys and punctuation: appended without passes
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content


def test_server_json_object_regex_and_grammar(servers):
    client = _client(servers[1])
    messages = [{"role": "user", "content": "JSON please."}]
    reply = client.chat.completions.create(
        model="tiny", messages=messages, response_format={"type": "json_object"}, temperature=0, max_tokens=300
    )
    content = reply.choices[0].message.content
    assert content.lstrip().startswith("{")
    reply = client.completions.create(
        model="tiny", prompt="code:", max_tokens=20, temperature=0, extra_body={"regex": "[A-Z]{2}-[0-9]{3}"}
    )
    assert reply.choices[0].finish_reason == "stop" and len(reply.choices[0].text) == 6
    lark = 'start: "yes" | "no"'
    reply = client.chat.completions.create(
        model="tiny", messages=messages, extra_body={"grammar": lark}, temperature=1, seed=3, max_tokens=5
    )
    assert reply.choices[0].message.content in ("yes", "no")


def test_server_a_constrained_reply_cut_by_max_tokens_ends_with_length(servers):
    """max_tokens below what the answer needs: finish_reason "length" and the start of the answer (not valid JSON
    yet); with max_json_bytes(schema) tokens the same answer ends complete."""
    schema = SUITE["flat"][0]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    kw = {"model": "tiny", "messages": [{"role": "user", "content": "A person."}], "response_format": fmt}
    client = _client(servers[1])
    whole = client.chat.completions.create(temperature=0, max_tokens=max_json_bytes(schema), **kw).choices[0]
    assert whole.finish_reason == "stop"
    jsonschema.validate(json.loads(whole.message.content), schema)
    cut = client.chat.completions.create(temperature=0, max_tokens=6, **kw)
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 6
    assert whole.message.content.startswith(cut.choices[0].message.content)
    with pytest.raises(ValueError):
        json.loads(cut.choices[0].message.content)


def test_server_a_constrained_completion_without_max_tokens_can_finish(servers):
    """A completion's default budget is 16 tokens, but a constrained one gets the rest of the context."""
    reply = _client(servers[0]).completions.create(
        model="tiny", prompt="x", temperature=0, extra_body={"regex": "(ab ){30}"}
    )
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].text == "ab " * 30
    assert reply.usage.completion_tokens > 16


@pytest.mark.parametrize(
    ("change", "param", "match"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "bogus"}}}},
            "response_format",
            "bogus",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        ({"extra_body": {"regex": "a("}}, "regex", "invalid regex"),
        ({"extra_body": {"grammar": "start: (", "regex": "a"}}, "response_format", "at most one"),
    ],
)
def test_server_refuses_bad_constraints_with_a_400(servers, change, param, match):
    with pytest.raises(openai.BadRequestError, match=match) as info:
        _client(servers[1]).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4, **change
        )
    assert info.value.status_code == 400 and info.value.param == param


@pytest.mark.slow
def test_the_cli_takes_a_json_schema_file(tmp_path):
    """``specwise generate --json-schema FILE`` on the default model: the reply is JSON valid against the file's
    schema; a file that is not a schema is refused in one line before anything loads."""
    import subprocess
    import sys

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    schema["additionalProperties"] = False
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    command = [sys.executable, "-m", "specwise", "generate", "Is the sky blue? Answer in JSON.", "--json"]
    run = subprocess.run(
        [*command, "--json-schema", str(path), "--max-new-tokens", "24"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    reply = json.loads(json.loads(run.stdout)["text"])
    assert set(reply) == {"ok"} and isinstance(reply["ok"], bool)
    path.write_text('{"type": "bogus"}')
    run = subprocess.run([*command, "--json-schema", str(path)], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "invalid" in run.stderr, run.stderr
