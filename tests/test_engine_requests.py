"""A request is checked once: ``Engine`` and ``BatchEngine`` refuse the same bad requests at once, with the same
error, before any step (a request one refuses must never fail inside the other's step, taking the batch with it)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from specwise.batch import BatchEngine, Request
from specwise.constraints import ConstraintError, Grammar, JsonSchema, Regex
from specwise.engine import Engine, LogprobOptions
from specwise.models.toy import ToyModel
from specwise.sampling import SamplingParams

VOCAB = 96
CONTEXT = 64


class _CharTokenizer:
    """Decodes token i to a letter: enough for stop strings, not for a grammar (llguidance cannot read it)."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i % 26) for i in ids)


def _grammar_tokenizer():
    """A byte-level tokenizer of VOCAB tokens (the last one an end token) that llguidance reads."""
    pytest.importorskip("llguidance")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())[: VOCAB - 1]
    vocab = {c: i for i, c in enumerate(alphabet)} | {"<eos>": VOCAB - 1}
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>"])
    return tok


def _bad_sampling_params() -> SamplingParams:
    """SamplingParams whose temperature its own check would refuse (built past the check, as a caller that edits a
    frozen instance could)."""
    params = SamplingParams()
    object.__setattr__(params, "temperature", -1.0)
    return params


# (name, tokenizer kind, request, the error's message as a pattern)
BAD = [
    ("empty prompt", None, Request([]), "prompt is empty"),
    ("prompt not ids", None, Request(["a", "b"]), "the prompt must be a list of token ids"),
    ("token outside the vocabulary", None, Request([VOCAB]), "outside the vocabulary"),
    ("negative token", None, Request([-1]), "outside the vocabulary"),
    ("bad sampling params", None, Request([1], params=_bad_sampling_params()), "temperature must be >= 0"),
    ("prompt fills the context", None, Request([1] * CONTEXT), "context is 64: shorten the prompt"),
    ("max_new_tokens 0", None, Request([1], max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    ("max_new_tokens float", None, Request([1], max_new_tokens=2.0), "max_new_tokens must be an integer >= 1"),
    ("max_new_tokens bool", None, Request([1], max_new_tokens=True), "max_new_tokens must be an integer >= 1"),
    ("params not SamplingParams", None, Request([1], params={"temperature": 1}), "params must be a specwise"),
    ("logprobs not LogprobOptions", None, Request([1], logprobs=3), "logprobs must be a LogprobOptions"),
    ("stop is a string", "chars", Request([1], stop="ab"), "stop must be a list of strings"),
    ("stop not strings", "chars", Request([1], stop=[1]), "stop must be a list of strings"),
    ("stop without a tokenizer", None, Request([1], stop=["x"]), "stop strings need a tokenizer"),
    ("eos not ids", None, Request([1], eos_token_ids=["x"]), "eos_token_ids must be a list of token ids"),
    ("prediction not ids", None, Request([1], prediction=[1.5]), "prediction must be a list of token ids"),
    ("prediction outside the vocabulary", None, Request([1], prediction=[VOCAB]), "prediction token id 96"),
    (
        "constraint without a tokenizer",
        None,
        Request([1], SamplingParams(constraint=Regex("a+"))),
        "a constraint needs a tokenizer",
    ),
    (
        "constraint on a tokenizer llguidance cannot read",
        "chars",
        Request([1], SamplingParams(constraint=Regex("a+"))),
        "constrained decoding needs",
    ),
    ("invalid regex", "grammar", Request([1], SamplingParams(constraint=Regex("a("))), "invalid regex"),
    ("invalid grammar", "grammar", Request([1], SamplingParams(constraint=Grammar("start: foo("))), "invalid grammar"),
    (
        "invalid JSON schema",
        "grammar",
        Request([1], SamplingParams(constraint=JsonSchema({"type": "bogus"}))),
        "invalid JSON schema",
    ),
]


def _engine(tokenizer: str | None) -> Engine:
    tok = {None: lambda: None, "chars": _CharTokenizer, "grammar": _grammar_tokenizer}[tokenizer]()
    return Engine(ToyModel.random(VOCAB, seed=1, max_length=CONTEXT), None, gamma=0, tokenizer=tok)


def _error(call) -> BaseException:
    with pytest.raises(ValueError) as info:
        call()
    return info.value


@pytest.mark.parametrize(("name", "tokenizer", "request_", "message"), BAD, ids=[b[0] for b in BAD])
def test_both_engines_refuse_a_bad_request_alike(name, tokenizer, request_, message):
    if tokenizer == "chars" and request_.params.constraint is not None:
        pytest.importorskip("llguidance")  # without it the message names the missing extra instead
    engine = _engine(tokenizer)
    fields = {f.name: getattr(request_, f.name) for f in dataclasses.fields(request_)}
    alone = _error(lambda: engine.generate(**fields))
    batch = BatchEngine(engine, max_batch=2)
    queued = _error(lambda: batch.submit(request_))
    assert (type(alone), str(alone)) == (type(queued), str(queued))
    assert re.search(message, str(alone)), str(alone)
    assert not batch.has_work()  # nothing was queued
    if tokenizer == "grammar":
        assert isinstance(alone, ConstraintError)


def test_a_refused_request_leaves_the_batch_running():
    """A request refused at submit never reaches a step: the requests already running finish as they would alone."""
    engine = Engine(ToyModel.random(VOCAB, seed=1, max_length=CONTEXT), None, gamma=0)
    want = engine.generate([1, 2, 3], max_new_tokens=8, eos_token_ids=[]).token_ids
    batch = BatchEngine(engine, max_batch=2)
    rid = batch.submit(Request([1, 2, 3], max_new_tokens=8, eos_token_ids=[]))
    first = batch.step()
    with pytest.raises(ValueError, match="a constraint needs a tokenizer"):
        batch.submit(Request([1], SamplingParams(constraint=Regex("a+"))))
    got = [t for r, e in first.events if r == rid for t in e.token_ids]
    while batch.has_work():
        step = batch.step()
        assert not step.errors
        got += [t for r, e in step.events if r == rid for t in e.token_ids]
    assert got == want


def test_a_good_request_passes_both_checks_with_the_same_result():
    engine = Engine(ToyModel.random(VOCAB, seed=1, max_length=CONTEXT), None, gamma=0, tokenizer=_CharTokenizer())
    request = Request([1, 2], SamplingParams(temperature=0.5, seed=3), 5, ["zz"], [0], LogprobOptions(top=2), [4])
    checked = engine.check_request(request)
    assert checked.prompt_ids == [1, 2] and checked.eos == {0} and checked.prediction == [4]
    assert checked.stop == ["zz"] and checked.grammar is None
    batch = BatchEngine(engine, max_batch=2)
    batch.submit(request)
    assert batch.waiting == 1
