"""Fill in the middle through the server: ``suffix`` in /v1/completions with the official openai client and
llama.cpp's ``/infill`` with httpx, against live servers on 127.0.0.1; greedy middles with a drafter equal to plain
decoding; a middle drafted from the suffix; llama.cpp's answer fields and stream; the 400s.

Models: the tiny random Qwen2 GGUF with Qwen's FIM tokens of ``test_fim.py``, and a table model over its tokenizer
whose greedy middle is ``abcde`` and then ``<|fim_pad|>``.
"""

# ruff: noqa: E402
from __future__ import annotations

import json
import re

import pytest

# the server extra (fastapi, uvicorn) and the clients the tests speak through (httpx, openai: the dev tools)
for _module in ("fastapi", "uvicorn", "httpx", "openai"):
    pytest.importorskip(_module, reason="needs the server extra and httpx, openai: pip install 'specwise[server,dev]'")

import httpx
import numpy as np
import openai
from fastapi.testclient import TestClient
from test_fim import CONTEXT, FIRST_SPECIAL, VOCAB, special_id, write_fim_gguf
from test_server import live_server

from specwise.drafters import NgramDrafter
from specwise.engine import Engine
from specwise.fim import fim_prompt, fim_stop_ids, fim_tokens
from specwise.models.loader import LoadedModel
from specwise.models.toy import ToyModel
from specwise.runtime import Runtime, build_runtime
from specwise.sampling import SamplingParams
from specwise.server.app import create_app

MODEL = "tiny-fim"
TIMEOUT = 60.0
PREFIX, SUFFIX = "def add(a, b):\n    return a", "\n\nprint(add(1, 2))\n"
EXTRA = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b"}]
GREEDY = SamplingParams(temperature=0.0)
PAD, MID = special_id("<|fim_pad|>"), special_id("<|fim_middle|>")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def fim_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECWISE_CACHE", str(tmp_path_factory.mktemp("fim-cache")))
        yield write_fim_gguf(tmp_path_factory.mktemp("fim") / "tiny-fim.gguf")


def serve(path, drafter: str):
    with live_server(create_app(build_runtime(str(path), drafter, 4, "cpu"), model_name=MODEL)) as url:
        yield url


@pytest.fixture(scope="module")
def plain(fim_gguf):
    yield from serve(fim_gguf, "none")


@pytest.fixture(scope="module")
def ngram(fim_gguf):
    yield from serve(fim_gguf, "ngram")


def api(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=TIMEOUT)


def events(url: str, body: dict) -> list[dict]:
    """The JSON objects of /infill's event stream (every ``data:`` line must be one)."""
    with httpx.stream("POST", f"{url}/infill", json=body | {"stream": True}, timeout=TIMEOUT) as reply:
        assert reply.status_code == 200
        lines = [line for line in reply.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    return [json.loads(line.removeprefix("data: ")) for line in lines]


# ---- exactness --------------------------------------------------------------------------------------------------


def library_middle(path, prefix, suffix, extra=(), max_tokens=32) -> tuple[list[int], str]:
    """The middle as the library decodes it plainly (token ids, text)."""
    from specwise.models import load_model

    loaded = load_model(str(path))
    fim = fim_tokens(loaded)
    prompt = fim_prompt(loaded.tokenizer, fim, prefix, suffix, extra=extra)
    engine = Engine(loaded.model, None, gamma=0, tokenizer=loaded.tokenizer)
    result = engine.generate(prompt, GREEDY, max_tokens, eos_token_ids=fim_stop_ids(fim, {FIRST_SPECIAL}))
    return result.token_ids, result.text


def test_openai_suffix_fills_in_the_middle_as_plain_decoding_does(fim_gguf, plain, ngram):
    texts = []
    for url in (plain, ngram):
        reply = api(url).completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=32, temperature=0)
        streamed = api(url).completions.create(
            model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=32, temperature=0, stream=True
        )
        assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == reply.choices[0].text
        texts.append((reply.choices[0].text, reply.choices[0].finish_reason, reply.usage.completion_tokens))
    ids, text = library_middle(fim_gguf, PREFIX, SUFFIX)
    assert texts == [(text, "stop" if len(ids) < 32 else "length", len(ids))] * 2


def test_a_token_id_prompt_is_the_prefix(plain, fim_gguf):
    from specwise.models import load_model

    ids = load_model(str(fim_gguf)).tokenizer.encode(PREFIX, add_special_tokens=False)
    by_text = api(plain).completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=16, temperature=0)
    by_ids = api(plain).completions.create(model=MODEL, prompt=ids, suffix=SUFFIX, max_tokens=16, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens


def test_infill_answers_as_llama_cpp_and_as_plain_decoding(fim_gguf, plain, ngram):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "n_predict": 32}
    body |= {"temperature": 0, "return_tokens": True, "cache_prompt": True, "samplers": ["top_k", "top_p"]}
    ids, text = library_middle(fim_gguf, PREFIX, SUFFIX, [(f["filename"], f["text"]) for f in EXTRA])
    answers = []
    for url in (plain, ngram):
        reply = post(url, "/infill", body)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert (answer["content"], answer["tokens"], answer["stop"]) == (text, ids, True)
        assert answer["tokens_predicted"] == len(ids) and answer["model"] == MODEL
        assert answer["prompt"].startswith("<|repo_name|>project\n<|file_sep|>util.py\ndef sub(a, b):")
        assert answer["prompt"].endswith(
            f"<|file_sep|>file\n<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
        )
        limited = len(ids) == 32
        assert answer["stop_type"] == ("limit" if limited else "eos")
        assert (answer["stopped_limit"], answer["stopped_eos"], answer["stopped_word"]) == (limited, not limited, False)
        assert answer["generation_settings"]["n_predict"] == 32 and answer["timings"]["predicted_n"] == len(ids)
        chunks = events(url, body)
        assert all(not c["stop"] for c in chunks[:-1]) and chunks[-1]["stop"] is True
        assert "".join(c["content"] for c in chunks) == text
        assert [t for c in chunks[:-1] for t in c["tokens"]] == ids
        answers.append({k: answer[k] for k in ("tokens_evaluated", "stop_type", "stopping_word")})
    assert answers[0] == answers[1]


def test_an_infill_middle_can_be_constrained(plain):
    body = {"input_prefix": "x = ", "input_suffix": "\n", "n_predict": 16, "temperature": 0}
    number = post(plain, "/infill", body | {"regex": "[0-9]{3}"}).json()
    assert re.fullmatch("[0-9]{3}", number["content"]), number
    schema = post(plain, "/infill", body | {"n_predict": 64, "json_schema": {"type": "boolean"}}).json()
    assert json.loads(schema["content"]) in (True, False), schema


# ---- the middle drafted from the suffix --------------------------------------------------------------------------


def table_runtime(path, drafter) -> Runtime:
    """A table model over the GGUF's tokenizer: greedy writes ``abcde`` after the middle token, then the padding
    token; every other token is followed by ``q``."""
    from specwise.models import load_model

    tokenizer = load_model(str(path)).tokenizer
    table = np.full((1, VOCAB, VOCAB), -8.0, dtype=np.float32)
    table[0, :, ord("q")] = 8.0
    for token, after in {MID: "a", **{c: n for c, n in zip("abcd", "bcde")}}.items():
        token = ord(token) if isinstance(token, str) else token
        table[0, token, :] = -8.0
        table[0, token, ord(after)] = 8.0
    table[0, ord("e"), :] = -8.0
    table[0, ord("e"), PAD] = 8.0
    model = ToyModel(table, max_length=CONTEXT)
    engine = Engine(model, drafter, gamma=4 if drafter else 0, tokenizer=tokenizer, eos_token_ids={FIRST_SPECIAL})
    return Runtime(engine, LoadedModel(model, tokenizer, "table"), "ngram" if drafter else "none", "cpu")


@pytest.fixture(scope="module")
def table_clients(fim_gguf):
    fast = TestClient(create_app(table_runtime(fim_gguf, NgramDrafter()), model_name=MODEL))
    slow = TestClient(create_app(table_runtime(fim_gguf, None), model_name=MODEL))
    with fast, slow:
        yield fast, slow


def test_the_middle_runs_into_the_suffix_and_is_drafted_from_it(table_clients):
    fast, slow = table_clients
    body = {"model": MODEL, "prompt": "x = ", "suffix": "bcde\n", "max_tokens": 20, "temperature": 0}
    replies = [client.post("/v1/completions", json=body).json() for client in (fast, slow)]
    for reply in replies:
        assert (reply["choices"][0]["text"], reply["choices"][0]["finish_reason"]) == ("abcde", "stop")
    assert replies[0]["usage"]["speculative"]["accepted"] >= 3  # c, d, e: drafted from the suffix
    assert replies[1]["usage"]["speculative"]["accepted"] == 0
    without = fast.post("/v1/completions", json=body | {"suffix": "zz"}).json()
    assert without["choices"][0]["text"] == "abcde" and without["usage"]["speculative"]["accepted"] == 0


def test_infill_says_why_it_stopped(table_clients):
    fast, _ = table_clients
    body = {"input_prefix": "x = ", "input_suffix": "bcde\n", "temperature": 0}
    cases = [({}, "abcde", "eos", ""), ({"stop": ["cd"]}, "ab", "word", "cd"), ({"n_predict": 2}, "ab", "limit", "")]
    for extra, content, stop_type, word in cases:
        answer = fast.post("/infill", json=body | extra).json()
        assert (answer["content"], answer["stop_type"], answer["stopping_word"]) == (content, stop_type, word)
    assert fast.post("/infill", json=body | {"ignore_eos": True, "n_predict": 8}).json()["content"].startswith("abcde")


# ---- bad requests ------------------------------------------------------------------------------------------------

BAD = [
    ("/infill", {"input_extra": [{"filename": "a.py"}]}, "input_extra[0].text", None),
    ("/infill", {"input_extra": ["a.py"]}, "input_extra[0]", None),
    ("/infill", {"input_extra": [{"filename": "a.py", "text": "x", "lang": "py"}]}, "input_extra[0].lang", None),
    ("/infill", {"input_extra": [{"filename": "a\nb.py", "text": "x"}]}, "input_extra[0].filename", None),
    ("/infill", {"input_extra": {"filename": "a.py", "text": "x"}}, "input_extra", None),
    ("/infill", {"input_prefix": "x" * CONTEXT}, "input_prefix", "context_length_exceeded"),
    ("/infill", {"input_prefix": "x", "n_predict": CONTEXT}, "n_predict", "context_length_exceeded"),
    ("/infill", {"n_predict": 0}, "n_predict", None),
    ("/infill", {"repeat_penalty": 1.1}, "repeat_penalty", None),
    ("/infill", {"mirostat": 2}, "mirostat", None),
    ("/infill", {"n": 2}, "n", None),
    ("/infill", {"model": "other"}, "model", "model_not_found"),
    ("/infill", {"input_prefix": "x", "dry_multiplier": 0.5}, "dry_multiplier", None),
    ("/infill", {"prediction": {"type": "content", "content": "abc"}}, "prediction", None),
    ("/v1/completions", {"prompt": "x" * 200, "suffix": "y" * 60}, "suffix", "context_length_exceeded"),
    ("/v1/completions", {"prompt": "x", "suffix": "y", "max_tokens": CONTEXT}, "max_tokens", "context_length_exceeded"),
    ("/v1/completions", {"prompt": [MID, 100], "suffix": "y"}, "suffix", None),
    ("/v1/completions", {"prompt": [VOCAB], "suffix": "y"}, "prompt", None),
    ("/v1/completions", {"prompt": ["a", "b"], "suffix": "y"}, "prompt", None),
]


@pytest.mark.parametrize("path, body, param, code", BAD, ids=[f"{p}:{param}" for p, _, param, _ in BAD])
def test_bad_fim_requests_get_a_400_naming_the_field(table_clients, path, body, param, code):
    fast, _ = table_clients
    body = ({"model": MODEL} if path == "/v1/completions" else {}) | body
    reply = fast.post(path, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.slow
def test_the_default_model_has_no_fim_tokens(smollm):
    engine = Engine(smollm.model, None, gamma=0, tokenizer=smollm.tokenizer)
    with TestClient(create_app(Runtime(engine, smollm, "none", "cpu"), model_name=MODEL)) as client:
        body = {"model": MODEL, "prompt": "def f(", "suffix": "\n", "max_tokens": 4}
        for path, request, param in (("/v1/completions", body, "suffix"), ("/infill", {"input_prefix": "a"}, None)):
            reply = client.post(path, json=request)
            assert reply.status_code == 400
            error = reply.json()["error"]
            assert error["code"] == "fim_not_supported" and "no fill-in-the-middle tokens" in error["message"]
            assert error["param"] == (param or "input_suffix")
        plain = client.post("/v1/completions", json=body | {"suffix": ""})  # an empty suffix: a plain completion
        assert plain.status_code == 200


@pytest.fixture(scope="module")
def self_drafted(fim_gguf, tmp_path_factory):
    """The target drafting for itself over a small draft vocabulary (a ranking written here: the tiny vocabulary has
    none shipped) and the request's own tokens."""
    from specwise.drafters.vocab import write_ranking
    from specwise.models import load_model

    ranking = tmp_path_factory.mktemp("self") / "ranking.npy"
    vocab = int(load_model(str(fim_gguf)).model.vocab_size)
    write_ranking(ranking, np.random.default_rng(0).permutation(vocab))
    yield from serve(fim_gguf, f"self?vocab=64&ranking={ranking}")


def test_self_drafting_through_the_openai_client_is_plain_decoding(fim_gguf, plain, self_drafted):
    """Greedy fill-in-the-middle and completion through the official client: the same text, finish and token count
    with the target drafting for itself as without speculation, streamed or not."""
    replies = []
    for url in (plain, self_drafted):
        fim = api(url).completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=32, temperature=0)
        text = api(url).completions.create(model=MODEL, prompt=PREFIX, max_tokens=24, temperature=0)
        streamed = api(url).completions.create(model=MODEL, prompt=PREFIX, max_tokens=24, temperature=0, stream=True)
        joined = "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)
        replies.append((fim.choices[0].text, fim.choices[0].finish_reason, text.choices[0].text, joined))
        if url == self_drafted:
            speculative = text.usage.model_extra["speculative"]
            assert speculative["drafter"].startswith("self") and speculative["drafted"] > 0
    assert replies[0] == replies[1]
