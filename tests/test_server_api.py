"""What API users ask for, through the official openai client over HTTP: API keys, log-probabilities (the target's,
the same with and without speculation) and several choices per request (``n``).

The model is a tiny random Llama with the default model's tokenizer (a 512-token context), run on one thread.
Every live server listens on 127.0.0.1 only.
"""

# ruff: noqa: E402
from __future__ import annotations

import asyncio
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

# the server extra (fastapi, uvicorn) and the clients the tests speak through (httpx, openai: the dev tools)
for _module in ("fastapi", "uvicorn", "httpx", "openai"):
    pytest.importorskip(_module, reason="needs the server extra and httpx, openai: pip install 'specwise[server,dev]'")

import httpx
import numpy as np
import openai
from test_server import live_server

from conftest import needs_hf
from specwise.runtime import build_runtime, encode_chat
from specwise.sampling import SamplingParams, probs_from_logits
from specwise.server.app import choice_seed, create_app
from specwise.server.auth import bearer_token, exposure_warning, is_loopback
from specwise.server.logprobs import LOGPROB_FLOOR, TokenTexts

MODEL = "tiny"
KEY = "sk-test-0123456789"
TIMEOUT = 60.0
TOLERANCE = 1e-5  # log-probabilities with and without speculation
CHAT = [{"role": "user", "content": "Count: one two three one two three one two"}]


pytestmark = pytest.mark.usefixtures("one_thread")


def serve(tiny_dir: str, drafter: str, **options) -> Iterator[tuple[str, object]]:
    """A live server of the tiny model with ``drafter``; yields (base URL, app)."""
    app = create_app(build_runtime(tiny_dir, drafter, 4, "cpu"), model_name=MODEL, **options)
    with live_server(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def plain(tiny_dir):
    """No speculation: the reference for every answer."""
    yield from serve(tiny_dir, "none")


@pytest.fixture(scope="module")
def ngram(tiny_dir):
    """The default drafter of a model without a shipped index or head."""
    yield from serve(tiny_dir, "auto")


@pytest.fixture(scope="module")
def twin(tiny_dir):
    """The target drafting for itself: every draft accepted, so most tokens come from drafted positions."""
    yield from serve(tiny_dir, f"model:{tiny_dir}")


@pytest.fixture(scope="module")
def keyed(tiny_dir):
    """A server that requires KEY."""
    yield from serve(tiny_dir, "ngram", api_key=KEY)


def api(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, timeout=TIMEOUT, max_retries=0)


def chat(url: str, **kw):
    return api(url).chat.completions.create(model=MODEL, messages=CHAT, **kw)


def chat_logprobs(reply, index: int = 0) -> list:
    return reply.choices[index].logprobs.content


def assert_same_logprobs(a: list, b: list) -> None:
    """Token for token the same tokens and alternatives, log-probabilities within TOLERANCE."""
    assert [t.token for t in a] == [t.token for t in b]
    for x, y in zip(a, b):
        assert abs(x.logprob - y.logprob) <= TOLERANCE
        assert [t.token for t in x.top_logprobs] == [t.token for t in y.top_logprobs]
        assert all(abs(s.logprob - t.logprob) <= TOLERANCE for s, t in zip(x.top_logprobs, y.top_logprobs))


def token_bytes(token: str) -> bytes:
    """The bytes of a token's text as the server writes it (``bytes:\\xNN...`` for part of a character)."""
    if token.startswith("bytes:"):
        return bytes(int(h, 16) for h in token.removeprefix("bytes:").split("\\x")[1:])
    return token.encode("utf-8")


def sample(app, name: str, **labels) -> float:
    return app.state.server.metrics.registry.get_sample_value(name, labels) or 0.0


def shared_passes(app) -> float:
    """Target passes so far that more than one sequence shared."""
    return sample(app, "specwise_batch_size_count") - sample(app, "specwise_batch_size_bucket", le="1.0")


# ------------------------------------------------------------------------------------------------ API keys


def test_the_right_key_opens_every_endpoint(keyed):
    url, _ = keyed
    client = api(url, KEY)
    assert [m.id for m in client.models.list().data] == [MODEL]
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens >= 1
    streamed = list(client.completions.create(model=MODEL, prompt="Once", max_tokens=4, stream=True))
    assert streamed[-1].choices[0].finish_reason in {"stop", "length"}
    metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT)
    assert metrics.status_code == 200 and "specwise_requests_total" in metrics.text
    lower = httpx.get(f"{url}/v1/models", headers={"authorization": f"bearer {KEY}"}, timeout=TIMEOUT)
    assert lower.status_code == 200  # the scheme in any case, as RFC 7235 has it


def test_a_wrong_key_raises_authentication_error(keyed):
    url, app = keyed
    client = api(url, "sk-wrong")
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    assert info.value.body["type"] == "invalid_request_error" and "Incorrect API key" in info.value.body["message"]
    with pytest.raises(openai.AuthenticationError):
        list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, stream=True))
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    with pytest.raises(openai.AuthenticationError):
        api(url, KEY[:-1]).models.list()
    with pytest.raises(openai.AuthenticationError):
        api(url, KEY + "0").models.list()
    assert app.state.server.worker.running == 0 and sample(app, "specwise_requests_total", endpoint="chat") == 0


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": ""}, {"Authorization": "Bearer"}]
    + [{"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}, {"X-API-Key": KEY}],
)
def test_no_key_gets_401_with_an_openai_error(keyed, headers):
    url, _ = keyed
    for method, path in [("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/metrics")]:
        body = {"model": MODEL, "messages": CHAT} if method == "POST" else None
        response = httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=TIMEOUT)
        assert response.status_code == 401, (path, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        assert error["message"].startswith("Missing API key")
        assert response.headers["www-authenticate"].startswith("Bearer")
    for path in ["/openapi.json", "/docs", "/v1/nothing"]:
        assert httpx.get(f"{url}{path}", headers=headers, timeout=TIMEOUT).status_code == 401


def test_health_is_open_without_a_key(keyed):
    url, _ = keyed
    health = httpx.get(f"{url}/health", timeout=TIMEOUT)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    # Claude Code probes the base URL with HEAD / before its first request (a 404 there was counted as an error)
    assert httpx.head(f"{url}/", timeout=TIMEOUT).status_code == 200
    root = httpx.get(f"{url}/", timeout=TIMEOUT)
    assert root.status_code == 200 and root.json()["status"] == "ok" and root.json()["model"]


def test_a_refused_request_is_not_read(keyed):
    """A body over the size limit without the key gets 401, not 413: the key is checked first."""
    url, _ = keyed
    response = httpx.post(f"{url}/v1/completions", content=b"x" * (2 * 1024 * 1024), timeout=TIMEOUT)
    assert response.status_code == 401


def test_bearer_token_parsing():
    assert bearer_token([(b"authorization", b"Bearer abc")]) == b"abc"
    assert bearer_token([(b"Authorization", b"  bearer   abc  ")]) == b"abc"
    assert bearer_token([(b"authorization", b"Basic abc")]) is None
    assert bearer_token([(b"authorization", b"Bearer")]) is None
    assert bearer_token([(b"x-api-key", b"abc")]) is None


def test_a_server_open_beyond_loopback_warns():
    assert all(is_loopback(host) for host in ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"])
    assert not any(is_loopback(host) for host in ["0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "example.com"])
    assert exposure_warning("127.0.0.1", 8000, None) is None
    assert exposure_warning("0.0.0.0", 8000, KEY) is None
    warning = exposure_warning("0.0.0.0", 8000, None)
    assert "WARNING" in warning and "0.0.0.0:8000" in warning and "--api-key" in warning


def test_an_empty_api_key_is_refused(capsys):
    from specwise.cli import main

    assert main(["serve", "--api-key", " "]) == 2
    assert "--api-key must not be empty" in capsys.readouterr().err
    with pytest.raises(ValueError, match="must not be empty"):
        from specwise.server.auth import APIKeyMiddleware

        APIKeyMiddleware(None, "")


def test_specwise_serve_takes_the_key_from_the_environment(tiny_dir):
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "SPECWISE_API_KEY": KEY}
    command = [sys.executable, "-m", "specwise.cli", "serve", "--target", tiny_dir, "--drafter", "ngram"]
    command += ["--host", "127.0.0.1", "--port", "0", "--served-model-name", MODEL, "--device", "cpu", "--threads", "1"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    seen: list[str] = []
    try:
        base, deadline = None, time.monotonic() + 90
        while base is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            found = re.search(r"running on (http://127\.0\.0\.1:\d+)", seen[-1])
            base = found.group(1) if found else None
        assert base, f"specwise serve did not report its address: {seen}"
        assert any("API key required" in line for line in seen) and not any("WARNING" in line for line in seen)
        assert not any(KEY in line for line in seen)  # the key is never printed
        with pytest.raises(openai.AuthenticationError):
            api(base).models.list()
        assert api(base, KEY).models.list().data[0].id == MODEL
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -------------------------------------------------------------------------------------- log-probabilities


@pytest.mark.parametrize("top", [0, 5, 20])
def test_chat_logprobs_are_the_same_with_and_without_speculation(plain, ngram, twin, top):
    kw = {"max_tokens": 32, "temperature": 0, "logprobs": True, "top_logprobs": top}
    reference = chat(plain[0], **kw)
    entries = chat_logprobs(reference)
    assert len(entries) == reference.usage.completion_tokens and all(len(e.top_logprobs) == top for e in entries)
    for url, _ in [ngram, twin]:
        spec = chat(url, **kw)
        assert spec.choices[0].message.content == reference.choices[0].message.content
        assert_same_logprobs(chat_logprobs(spec), entries)
    assert chat(twin[0], **kw).usage.speculative["accepted"] > 0  # drafted positions were scored


def test_logprobs_are_the_targets_own(plain, tiny_dir):
    """Each logprob is log_softmax of the target's logits at its position: a Hugging Face forward pass over the
    prompt and the output gives the same values; greedy, the emitted token is the top alternative."""
    torch = needs_hf()
    from transformers import AutoModelForCausalLM

    reply = chat(plain[0], max_tokens=24, temperature=0, logprobs=True, top_logprobs=3)
    entries = chat_logprobs(reply)
    app = plain[1]
    tokenizer = app.state.server.runtime.tokenizer
    prompt = encode_chat(tokenizer, CHAT)
    texts = TokenTexts(tokenizer)
    vocab = {bytes(texts(i)[1]): i for i in reversed(range(len(tokenizer)))}
    output = [vocab[bytes(e.bytes)] for e in entries]
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits.double(), dim=-1)
    for i, entry in enumerate(entries):
        assert abs(entry.logprob - float(expected[i, output[i]])) < 1e-4
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert bytes(entry.bytes) == token_bytes(entry.token)


def test_sampled_answers_have_the_plain_answers_logprobs(plain, ngram):
    """Seeded sampling with a drafter of single tokens gives the plain tokens, so the same log-probabilities."""
    kw = {"max_tokens": 40, "temperature": 0.8, "top_p": 0.95, "seed": 3, "logprobs": True, "top_logprobs": 4}
    kw["extra_body"] = {"ignore_eos": True}
    reference, spec = chat(plain[0], **kw), chat(ngram[0], **kw)
    assert spec.choices[0].message.content == reference.choices[0].message.content
    assert spec.usage.speculative["drafted"] > 0
    assert_same_logprobs(chat_logprobs(spec), chat_logprobs(reference))


def test_logprobs_mode_sampled_is_the_distribution_drawn_from(plain, ngram):
    """logprobs_mode "sampled": at temperature 1 with nothing cut it equals the raw mode; greedy, the emitted
    token is certain; with top_k 2 only two tokens have any probability, and they sum to 1."""
    kw = {"max_tokens": 16, "logprobs": True, "top_logprobs": 5, "seed": 1}
    raw = chat(plain[0], temperature=1.0, **kw)
    same = chat(plain[0], temperature=1.0, **kw, extra_body={"logprobs_mode": "sampled"})
    assert_same_logprobs(chat_logprobs(same), chat_logprobs(raw))
    greedy = chat(ngram[0], temperature=0, **kw, extra_body={"logprobs_mode": "sampled"})
    for entry in chat_logprobs(greedy):
        assert entry.logprob == 0.0 and [t.token for t in entry.top_logprobs] == [entry.token]
    cut = {"logprobs_mode": "sampled", "top_k": 2}
    for url, _ in [plain, ngram]:
        reply = chat(url, temperature=0.7, **kw, extra_body=cut)
        for entry in chat_logprobs(reply):
            assert len(entry.top_logprobs) <= 2 and entry.token in [t.token for t in entry.top_logprobs]
            assert abs(sum(math.exp(t.logprob) for t in entry.top_logprobs) - 1.0) < 1e-4
    assert_same_logprobs(
        chat_logprobs(chat(ngram[0], temperature=0.7, **kw, extra_body=cut)),
        chat_logprobs(chat(plain[0], temperature=0.7, **kw, extra_body=cut)),
    )


def test_sampled_mode_is_probs_from_logits():
    """The engine's "sampled" log-probabilities are log(probs_from_logits): what the token was drawn from."""
    from specwise.engine import LogprobOptions, token_logprobs

    logits = (np.random.default_rng(0).standard_normal((3, 50)) * 3).astype(np.float32)
    params = SamplingParams(temperature=0.6, top_p=0.8)
    probs = probs_from_logits(logits, params)
    tokens = [int(probs[i].argmax()) for i in range(3)]
    entries = token_logprobs(logits, tokens, LogprobOptions(top=50, sampled=True), params)
    for row, entry in enumerate(entries):
        assert abs(entry.logprob - math.log(float(probs[row, tokens[row]]))) < 1e-6
        assert len(entry.top) == int((probs[row] > 0).sum())  # tokens of probability 0 are not listed
    raw = token_logprobs(logits, tokens, LogprobOptions(top=2), params)
    row = logits[0].astype(np.float64)
    log_softmax = row - row.max() - np.log(np.exp(row - row.max()).sum())
    assert raw[0].logprob == pytest.approx(float(log_softmax[tokens[0]]), abs=1e-6)
    with pytest.raises(ValueError, match="top"):
        LogprobOptions(top=-1)


def test_the_engine_records_logprobs_alone_and_in_a_batch(tiny_dir):
    """Engine.generate (one sequence) and BatchEngine (the server's path) record the same log-probabilities, with
    and without a drafter that is always accepted; without the option nothing is recorded."""
    from specwise.batch import BatchEngine, Request
    from specwise.engine import LogprobOptions

    options, prompt = LogprobOptions(top=3), list(range(5, 25))
    plain = build_runtime(tiny_dir, "none", 4, "cpu").engine
    twin = build_runtime(tiny_dir, f"model:{tiny_dir}", 4, "cpu").engine
    reference = plain.generate(prompt, SamplingParams(), 24, eos_token_ids=[], logprobs=options)
    assert len(reference.logprobs) == 24 and reference.to_dict()["logprobs"][0]["top"]
    spec = twin.generate(prompt, SamplingParams(), 24, eos_token_ids=[], logprobs=options)
    assert spec.stats.accepted > 10 and spec.token_ids == reference.token_ids
    request = Request(prompt, SamplingParams(), 24, eos_token_ids=[], logprobs=options)
    batched = BatchEngine(twin, 2).run_all([request, Request(prompt[:7], max_new_tokens=9, eos_token_ids=[])])
    for got in [spec.logprobs, [t for event in batched[0] for t in event.logprobs]]:
        assert [t.token_id for t in got] == reference.token_ids
        assert all(abs(a.logprob - b.logprob) <= TOLERANCE for a, b in zip(got, reference.logprobs))
        assert all([i for i, _ in a.top] == [i for i, _ in b.top] for a, b in zip(got, reference.logprobs))
    assert all(event.logprobs is None for event in batched[1])
    assert plain.generate(prompt, SamplingParams(), 4).logprobs is None


def test_streamed_logprobs_equal_the_whole_response(ngram):
    url, _ = ngram
    kw = {"max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    whole = chat(url, **kw)
    chunks = list(chat(url, **kw, stream=True))
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert_same_logprobs(streamed, chat_logprobs(whole))
    assert sum(1 for c in chunks if c.choices and c.choices[0].logprobs) > 1  # per chunk, not all at the end
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


def test_completion_logprobs_in_the_legacy_form(plain, ngram):
    kw = {"model": MODEL, "prompt": "one two three one two three", "max_tokens": 20, "temperature": 0}
    kw |= {"logprobs": 3, "extra_body": {"ignore_eos": True}}
    reference = api(plain[0]).completions.create(**kw)
    for url, _ in [plain, ngram]:
        reply = api(url).completions.create(**kw)
        lp = reply.choices[0].logprobs
        assert reply.choices[0].text == reference.choices[0].text
        assert len(lp.tokens) == 20
        assert b"".join(map(token_bytes, lp.tokens)).decode("utf-8", "replace") == reply.choices[0].text
        text = reply.choices[0].text
        assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0 and lp.text_offset[-1] < len(text)
        whole = [i for i, t in enumerate(lp.tokens) if not t.startswith("bytes:")]
        assert len(whole) > 10 and all(text[lp.text_offset[i] :].startswith(lp.tokens[i]) for i in whole)
        for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            assert len(top) <= 4 and top[token] == logprob and max(top.values()) == logprob  # greedy: the top
        ref = reference.choices[0].logprobs
        assert all(abs(a - b) <= TOLERANCE for a, b in zip(lp.token_logprobs, ref.token_logprobs))
    streamed = list(api(ngram[0]).completions.create(**kw, stream=True))
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in streamed if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == reference.choices[0].logprobs.tokens and offsets == reference.choices[0].logprobs.text_offset
    only = api(ngram[0]).completions.create(**kw | {"logprobs": 0})
    assert all(
        list(top) == [t] for t, top in zip(only.choices[0].logprobs.tokens, only.choices[0].logprobs.top_logprobs)
    )


def test_no_logprobs_unless_asked(ngram):
    reply = chat(ngram[0], max_tokens=4)
    assert reply.choices[0].logprobs is None
    assert chat(ngram[0], max_tokens=4, logprobs=False).choices[0].logprobs is None
    text = api(ngram[0]).completions.create(model=MODEL, prompt="x", max_tokens=4)
    assert text.choices[0].logprobs is None


@pytest.mark.parametrize(
    ("change", "param"),
    [({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"top_logprobs": 3}, "top_logprobs")]
    + [({"logprobs": True, "extra_body": {"logprobs_mode": "processed"}}, "logprobs_mode")]
    + [({"n": 17}, "n"), ({"n": 0}, "n"), ({"response_format": {"type": "xml"}}, "response_format")]
    + [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
            "response_format",
        )
    ],
)
def test_bad_chat_requests_name_the_field(ngram, change, param):
    with pytest.raises(openai.BadRequestError) as info:
        chat(ngram[0], max_tokens=4, **change)
    assert info.value.status_code == 400 and info.value.param == param


@pytest.mark.parametrize(("change", "param"), [({"logprobs": 6}, "logprobs"), ({"n": 2, "best_of": 3}, "best_of")])
def test_bad_completion_requests_name_the_field(ngram, change, param):
    with pytest.raises(openai.BadRequestError) as info:
        api(ngram[0]).completions.create(model=MODEL, prompt="x", max_tokens=4, **change)
    assert info.value.status_code == 400 and info.value.param == param


def test_response_format_text_is_accepted(ngram):
    reply = chat(ngram[0], max_tokens=4, temperature=0, response_format={"type": "text"})
    assert reply.choices[0].message.content == chat(ngram[0], max_tokens=4, temperature=0).choices[0].message.content


def test_token_texts_are_exact_bytes(plain):
    tokenizer = plain[1].state.server.runtime.tokenizer
    texts = TokenTexts(tokenizer)
    ids = tokenizer("héllo wörld ✓ 日本", add_special_tokens=False)["input_ids"]
    assert b"".join(bytes(texts(i)[1]) for i in ids) == "héllo wörld ✓ 日本".encode()
    partial = [i for i in ids if texts(i)[0].startswith("bytes:")]
    assert partial and all(re.fullmatch(r"bytes:(\\x[0-9a-f]{2})+", texts(i)[0]) for i in partial)
    eos = tokenizer.eos_token_id
    assert texts(eos) == (tokenizer.eos_token, list(tokenizer.eos_token.encode()))
    assert LOGPROB_FLOOR == -9999.0


# --------------------------------------------------------------------------------------------- n choices


def test_n_choices_are_the_requests_seeded_seed_plus_i(ngram):
    url, app = ngram
    kw = {"max_tokens": 20, "temperature": 0.9, "seed": 40, "extra_body": {"ignore_eos": True}}
    shared = shared_passes(app)
    copied = sample(app, "specwise_prompt_tokens_copied_total")
    cached = sample(app, "specwise_prompt_tokens_cached_total")
    reply = chat(url, n=3, **kw)
    assert shared_passes(app) > shared  # the choices shared target passes
    # and one prefill: two choices copied the first one's prompt cache (all but the prompt's last token), but for
    # what their own slots' caches kept from earlier requests (the chat template's system prompt)
    prefill = reply.usage.prompt_tokens - 1
    copied = sample(app, "specwise_prompt_tokens_copied_total") - copied
    cached = sample(app, "specwise_prompt_tokens_cached_total") - cached
    assert copied > 0 and copied + cached >= 2 * prefill
    assert cached == reply.usage.speculative["cached_tokens"]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    alone = [chat(url, **kw | {"seed": 40 + i}) for i in range(3)]
    assert [c.message.content for c in reply.choices] == [a.choices[0].message.content for a in alone]
    assert len({c.message.content for c in reply.choices}) == 3
    assert reply.usage.completion_tokens == 60 == sum(a.usage.completion_tokens for a in alone)
    assert reply.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 60
    assert reply.usage.speculative["new_tokens"] == 60


def test_greedy_n_gives_identical_choices_with_logprobs(ngram, plain):
    kw = {"max_tokens": 16, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    reply = chat(ngram[0], n=4, **kw)
    single = chat(plain[0], **kw)
    assert len(reply.choices) == 4
    for i, choice in enumerate(reply.choices):
        assert choice.index == i and choice.message.content == single.choices[0].message.content
        assert_same_logprobs(choice.logprobs.content, chat_logprobs(single))


def test_streamed_n_choices_carry_their_index(ngram):
    url, _ = ngram
    kw = {"max_tokens": 12, "temperature": 0.9, "seed": 7, "n": 3, "extra_body": {"ignore_eos": True}}
    whole = chat(url, **kw)
    chunks = list(chat(url, **kw, stream=True, stream_options={"include_usage": True}))
    texts, finished = ["", "", ""], {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert texts == [c.message.content for c in whole.choices]
    assert finished == {0: "length", 1: "length", 2: "length"}
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1, 2]
    with_usage = [c for c in chunks if c.usage is not None]
    assert len(with_usage) == 2 and chunks[-1].choices == []  # the last choice's end, then the usage chunk
    assert all(c.usage.completion_tokens == 36 for c in with_usage)


def test_completions_n_with_logprobs(plain, ngram):
    kw = {"model": MODEL, "prompt": "one two", "max_tokens": 10, "temperature": 0.8, "seed": 2, "logprobs": 2}
    kw["extra_body"] = {"ignore_eos": True}
    reply = api(ngram[0]).completions.create(n=2, **kw)
    assert [c.index for c in reply.choices] == [0, 1] and reply.usage.completion_tokens == 20
    for i, choice in enumerate(reply.choices):
        alone = api(plain[0]).completions.create(**kw | {"seed": 2 + i}).choices[0]
        assert choice.text == alone.text and choice.logprobs.tokens == alone.logprobs.tokens
        assert all(
            abs(a - b) <= TOLERANCE for a, b in zip(choice.logprobs.token_logprobs, alone.logprobs.token_logprobs)
        )


def test_sixteen_choices_at_most(ngram):
    reply = chat(ngram[0], n=16, max_tokens=2, temperature=1.0)
    assert [c.index for c in reply.choices] == list(range(16))


def test_choice_seeds():
    assert choice_seed(None, 3) is None
    assert choice_seed(5, 0) == 5 and choice_seed(5, 2) == 7 and choice_seed(-3, 2) == -1
    assert choice_seed(2**64 - 1, 1) == 0  # wraps around past the largest seed


def test_a_client_leaving_an_n_stream_cancels_every_choice(ngram):
    url, app = ngram
    worker = app.state.server.worker

    async def leave() -> None:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        async with client:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=CHAT,
                n=4,
                max_tokens=400,
                temperature=0.9,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    break
            await stream.close()

    asyncio.run(leave())
    deadline = time.monotonic() + 10
    while worker.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.running == 0


# ------------------------------------------------------------------------------------------ the real model


@pytest.mark.slow
def test_real_model_logprobs_are_the_same_with_the_default_drafter():
    """The default model with its default drafter and with none: greedy answers and their logprobs agree."""
    replies = []
    for drafter in ["none", "auto"]:
        app = create_app(build_runtime("default", drafter, 4, "cpu"), model_name=MODEL)
        with live_server(app) as url:
            body = {"messages": [{"role": "user", "content": "Name three primary colors."}], "max_tokens": 40}
            reply = api(url).chat.completions.create(model=MODEL, temperature=0, logprobs=True, top_logprobs=5, **body)
        replies.append(reply)
    plain, spec = replies
    assert spec.usage.speculative["drafter"] != "none" and spec.usage.speculative["accepted"] > 0
    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert_same_logprobs(chat_logprobs(spec), chat_logprobs(plain))
