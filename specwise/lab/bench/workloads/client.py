"""One workload request sent to a server as a new user sends it, streamed, and what its chunks' arrival times say.

Chat requests go through the official ``openai`` client (``/v1/chat/completions``, streaming, usage in the last
chunk). FIM requests go to ``/v1/completions`` with ``suffix`` (specwise), or to llama.cpp's ``/infill`` (its
OpenAI endpoint has no ``suffix``), read as server-sent events with ``httpx``. A recorded request (an agent's turn)
goes to its own route as it was recorded, streamed, read with ``httpx`` in that API's events (:func:`replay`).

:func:`stream_figures` is the arithmetic, on arrival times alone, so that it is tested on fake streams:

- total seconds: from sending the request to the last chunk;
- time to first token: from sending to the first chunk that carries output (text or a tool call's delta);
- decode tokens/s: (completion tokens − 1) ÷ (last output chunk − first output chunk): the tokens after the first,
  over the time they took to arrive (the time per output token of vLLM's serving benchmark, inverted), so that the
  prompt's prefill is not in it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from specwise.lab.bench.workloads import Request

__all__ = [
    "MODEL",
    "Sampling",
    "StreamEvent",
    "recorded_body",
    "replay",
    "send",
    "server_decode_rate",
    "stream_figures",
]

MODEL = "bench"  # the model id the benchmark's servers serve (llama.cpp takes any)
TRACE_TIMEOUT = 3600.0  # an agent's first turn is 6-17 k tokens: minutes on a CPU


@dataclass(frozen=True)
class Sampling:
    """What every request asks for: temperature (0: greedy), the token budget, the seed."""

    temperature: float
    max_tokens: int
    seed: int


@dataclass(frozen=True)
class StreamEvent:
    """A chunk's arrival: its time (``time.perf_counter``) and the output it carried."""

    time: float
    text: str


def stream_figures(start: float, events: Iterable[StreamEvent], end: float, completion_tokens: int | None) -> dict:
    """The figures of one streamed request: ``seconds`` (start to end), ``ttft_seconds``, ``decode_seconds`` (first
    to last output chunk), ``completion_tokens`` (the usage's, else one per output chunk), ``tokens_per_second``
    (tokens ÷ seconds) and ``decode_tokens_per_second`` ((tokens − 1) ÷ decode seconds; null for fewer than 2
    tokens or a single chunk)."""
    output = [e for e in events if e.text]
    tokens = completion_tokens if completion_tokens is not None else len(output)
    seconds = end - start
    first = output[0].time if output else None
    decode = output[-1].time - first if output else None
    return {
        "seconds": seconds,
        "ttft_seconds": None if first is None else first - start,
        "decode_seconds": decode,
        "completion_tokens": tokens,
        "tokens_per_second": tokens / seconds if seconds > 0 else None,
        "decode_tokens_per_second": (tokens - 1) / decode if decode and tokens > 1 else None,
        "output_chunks": len(output),
        "text": "".join(e.text for e in output),
    }


STREAMED_CHUNKS = 3  # fewer output chunks than this: the reply came at once, its decode rate is the server's


def with_server_rate(figures: dict, rate: float | None) -> dict:
    """``figures`` with the server's decode rate beside the stream's, and the decode rate the comparisons use
    (``decode_tokens_per_second``, ``decode_measured_by``): the stream's where the reply was streamed, the server's
    where it came in fewer than :data:`STREAMED_CHUNKS` chunks (a tool call parsed from the whole output is sent at
    the end: its first and last chunks a moment apart would give an absurd rate). A reply of one token has none."""
    streamed = figures.get("output_chunks", 0) >= STREAMED_CHUNKS
    if (figures.get("completion_tokens") or 0) < 2:
        rate = None  # one token has no decoding to time (the server's figure is its overhead, not a rate)
    return {
        **figures,
        "stream_decode_tokens_per_second": figures["decode_tokens_per_second"],
        "decode_tokens_per_second": figures["decode_tokens_per_second"] if streamed else rate,
        "decode_measured_by": "stream" if streamed else ("server" if rate is not None else None),
        "server_decode_tokens_per_second": rate,
    }


def server_decode_rate(speculative: dict | None, timings: dict | None) -> float | None:
    """The server's own decode tokens/s, where it reports one: specwise's usage statistics (new tokens over the
    seconds after the prompt's pass) or llama.cpp's ``timings.predicted_per_second``. It stands where the stream
    cannot measure (a reply sent in one chunk, as a tool call parsed from the whole output is)."""
    if speculative and speculative.get("total_seconds"):
        decode = speculative["total_seconds"] - (speculative.get("prefill_seconds") or 0.0)
        tokens = speculative.get("new_tokens") or 0
        return tokens / decode if decode > 0 and tokens else None
    if timings and timings.get("predicted_per_second"):
        return float(timings["predicted_per_second"])
    return None


def _delta_text(choice: Any) -> str:
    """A chat chunk's output: its content and its tool calls' names and argument pieces."""
    delta = choice.delta
    parts = [delta.content or ""]
    for call in delta.tool_calls or []:
        if call.function is not None:
            parts += [call.function.name or "", call.function.arguments or ""]
    return "".join(parts)


def _usage_fields(usage: Any) -> dict:
    """The usage's counts: prompt, completion, cached prompt and accepted prediction tokens (null when absent)."""
    if usage is None:
        return {}
    details = getattr(usage, "completion_tokens_details", None)
    prompt_details = getattr(usage, "prompt_tokens_details", None)
    extra = getattr(usage, "model_extra", None) or {}
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": getattr(prompt_details, "cached_tokens", None),
        "accepted_prediction_tokens": getattr(details, "accepted_prediction_tokens", None),
        "rejected_prediction_tokens": getattr(details, "rejected_prediction_tokens", None),
        "speculative": extra.get("speculative"),
    }


def _sampling_body(sampling: Sampling, peer: str) -> dict:
    """Fields beyond OpenAI's: llama.cpp's own sampler chain narrowed to what specwise does (no top-k, no min-p),
    so that both sample from the same distribution."""
    return {"top_k": 0, "min_p": 0.0} if peer == "llama.cpp" and sampling.temperature > 0 else {}


def chat(client: Any, model: str, request: Request, sampling: Sampling, *, prediction: bool, peer: str) -> dict:
    """``request`` (a chat) through ``client.chat.completions.create(stream=True)``; its figures and usage."""
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": request.messages,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "seed": sampling.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        kwargs["tools"] = request.tools
    if prediction and request.prediction is not None:
        kwargs["prediction"] = {"type": "content", "content": request.prediction}
    if body := _sampling_body(sampling, peer):
        kwargs["extra_body"] = body
    return _consume(lambda: client.chat.completions.create(**kwargs), _delta_text)


def completion(client: Any, model: str, request: Request, sampling: Sampling) -> dict:
    """``request`` (FIM) through ``client.completions.create(prompt=prefix, suffix=suffix, stream=True)``."""

    def create():
        return client.completions.create(
            model=model,
            prompt=request.prefix,
            suffix=request.suffix,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            seed=sampling.seed,
            stream=True,
            stream_options={"include_usage": True},
        )

    return _consume(create, lambda choice: choice.text or "")


def _consume(create: Callable[[], Any], text_of: Callable[[Any], str]) -> dict:
    """Send, read the stream to its end, and measure."""
    events, usage, finish, extra = [], None, None, {}
    start = time.perf_counter()
    for chunk in create():
        now = time.perf_counter()
        for choice in chunk.choices or []:
            events.append(StreamEvent(now, text_of(choice)))
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
        extra.update({k: v for k, v in (chunk.model_extra or {}).items() if k == "timings"})
    end = time.perf_counter()
    counts = _usage_fields(usage)
    figures = stream_figures(start, events, end, counts.get("completion_tokens"))
    timings = extra.get("timings")
    rate = server_decode_rate(counts.get("speculative"), timings)
    return {
        **with_server_rate(figures, rate),
        **counts,
        "finish_reason": finish,
        "server_timings": timings,
    }


def infill(base_url: str, request: Request, sampling: Sampling, timeout: float = 1800.0) -> dict:
    """``request`` (FIM) through llama.cpp's ``/infill``, streamed (its server-sent events: ``content`` pieces,
    the last one with ``stop`` and ``timings``)."""
    import httpx

    body = {
        "input_prefix": request.prefix,
        "input_suffix": request.suffix,
        "n_predict": sampling.max_tokens,
        "temperature": sampling.temperature,
        "seed": sampling.seed,
        "stream": True,
        **({"top_k": 0, "min_p": 0.0} if sampling.temperature > 0 else {}),
    }
    events, last = [], {}
    start = time.perf_counter()
    with httpx.stream("POST", base_url + "/infill", json=body, timeout=timeout) as response:
        if response.status_code != 200:
            raise RuntimeError(f"llama-server /infill answered {response.status_code}: {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = json.loads(line[len("data: ") :])
            events.append(StreamEvent(time.perf_counter(), data.get("content") or ""))
            last = data
    end = time.perf_counter()
    timings = last.get("timings") or {}
    tokens = timings.get("predicted_n", last.get("tokens_predicted"))
    figures = stream_figures(start, events, end, None if tokens is None else int(tokens))
    finish = "length" if last.get("stop_type") == "limit" else "stop"
    return {
        **with_server_rate(figures, server_decode_rate(None, timings)),
        "prompt_tokens": timings.get("prompt_n"),
        "cached_tokens": timings.get("cache_n"),
        "finish_reason": finish,
        "server_timings": timings,
    }


def recorded_body(request: Request, sampling: Sampling, model: str, peer: str) -> dict:
    """The recorded body, streamed, asking for the served ``model`` with ``sampling``'s temperature and seed, its new
    tokens capped at ``sampling.max_tokens`` (or fewer, where the agent asked for fewer)."""
    route, body = request.route, dict(request.body or {})
    body |= {"model": model, "stream": True, "temperature": sampling.temperature, "seed": sampling.seed}
    body |= _sampling_body(sampling, peer)
    key = "max_output_tokens" if route == "/v1/responses" else "max_tokens"
    if route == "/v1/chat/completions":
        asked = body.pop("max_completion_tokens", None) or body.get("max_tokens")
        body["stream_options"] = {"include_usage": True}
    else:
        asked = body.get(key)
    body[key] = min(int(asked or sampling.max_tokens), sampling.max_tokens)
    return body


def _event_text(route: str, data: dict) -> str:
    """The output one event of ``route``'s stream carries: text, reasoning, a tool call's name and argument pieces."""
    if route == "/v1/chat/completions":
        parts = []
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            parts += [delta.get("content") or "", delta.get("reasoning_content") or ""]
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                parts += [function.get("name") or "", function.get("arguments") or ""]
        return "".join(parts)
    if route == "/v1/messages":
        if data.get("type") == "content_block_start":  # a tool call's name comes with its block
            return (data.get("content_block") or {}).get("name") or ""
        delta = data.get("delta") or {} if data.get("type") == "content_block_delta" else {}
        return delta.get("text") or delta.get("partial_json") or delta.get("thinking") or ""
    kind = str(data.get("type", ""))  # Responses: response.output_text.delta, ...function_call_arguments.delta
    if kind == "response.output_item.added":
        return (data.get("item") or {}).get("name") or ""
    delta = data.get("delta")
    return delta if kind.endswith(".delta") and isinstance(delta, str) else ""


def _event_usage(route: str, data: dict, usage: dict) -> None:
    """Collects the prompt, cached and completion tokens, speculative statistics and llama.cpp's timings from the
    events that carry them (each API's way)."""
    found = None
    if route == "/v1/chat/completions":
        found = data.get("usage")
    elif route == "/v1/messages" and data.get("type") in ("message_start", "message_delta"):
        found = (data.get("message") or {}).get("usage") if data["type"] == "message_start" else data.get("usage")
    elif route == "/v1/responses" and data.get("type") in ("response.completed", "response.incomplete"):
        found = (data.get("response") or {}).get("usage")
    if found:
        prompt = found.get("prompt_tokens", found.get("input_tokens"))
        if route == "/v1/messages" and prompt is not None:  # Messages counts what was read apart from the cache
            prompt += found.get("cache_read_input_tokens") or 0
        details = found.get("prompt_tokens_details") or found.get("input_tokens_details") or {}
        cached = details.get("cached_tokens", found.get("cache_read_input_tokens"))
        fields = {
            "prompt_tokens": prompt,
            "completion_tokens": found.get("completion_tokens", found.get("output_tokens")),
            "cached_tokens": cached,
            "speculative": found.get("speculative"),
        }
        usage.update({k: v for k, v in fields.items() if v is not None})
    if data.get("timings"):  # llama-server: what it read and what it found in its cache
        usage["timings"] = data["timings"]
        usage["cached_tokens"] = data["timings"].get("cache_n", usage.get("cached_tokens"))


def _event_finish(route: str, data: dict) -> str | None:
    if route == "/v1/chat/completions":
        return next((c["finish_reason"] for c in data.get("choices") or [] if c.get("finish_reason")), None)
    if route == "/v1/messages" and data.get("type") == "message_delta":
        return (data.get("delta") or {}).get("stop_reason")
    return {"response.completed": "stop", "response.incomplete": "length"}.get(str(data.get("type")))


def _event_error(data: dict) -> str | None:
    """The error an event reports in the middle of a stream (every API has its shape), or None."""
    if data.get("type") in ("error", "response.failed"):
        return json.dumps(data)[:500]
    return json.dumps(data["error"])[:500] if data.get("error") else None


def replay(
    peer: str,
    base_url: str,
    request: Request,
    sampling: Sampling,
    *,
    model: str = MODEL,
    timeout: float = TRACE_TIMEOUT,
) -> dict:
    """A recorded request (``request.route``, ``request.body``) to its route, streamed (:func:`recorded_body`); the
    figures of :func:`stream_figures` with the usage (``cached_tokens``: the prompt tokens the server found in its
    cache), the finish reason and the server's own decode rate. A refusal raises, naming the status and the body."""
    import httpx

    route, usage, finish, events = request.route, {}, None, []
    body = recorded_body(request, sampling, model, peer)
    start = time.perf_counter()
    with httpx.stream("POST", base_url + route, json=body, timeout=timeout) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{route} answered {response.status_code}: {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            try:
                data = json.loads(line[len("data:") :])
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            if error := _event_error(data):
                raise RuntimeError(f"{route} failed in its stream: {error}")
            events.append(StreamEvent(time.perf_counter(), _event_text(route, data)))
            _event_usage(route, data, usage)
            finish = _event_finish(route, data) or finish
    end = time.perf_counter()
    figures = stream_figures(start, events, end, usage.get("completion_tokens"))
    timings = usage.get("timings")
    return {
        **with_server_rate(figures, server_decode_rate(usage.get("speculative"), timings)),
        "route": route,
        "prompt_tokens": usage.get("prompt_tokens", (timings or {}).get("prompt_n")),
        "cached_tokens": usage.get("cached_tokens"),
        "finish_reason": finish,
        "server_timings": timings,
    }


def send(
    peer: str, base_url: str, request: Request, sampling: Sampling, *, prediction: bool = False, model: str = MODEL
) -> dict:
    """``request`` to the server of ``peer`` (``specwise`` or ``llama.cpp``) at ``base_url`` serving ``model``: the
    figures of :func:`stream_figures` with the usage and the finish reason."""
    from openai import OpenAI

    if request.body is not None:
        return replay(peer, base_url, request, sampling, model=model)
    if request.is_fim and peer == "llama.cpp":
        return infill(base_url, request, sampling)
    client = OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, timeout=1800.0)
    if request.is_fim:
        return completion(client, model, request, sampling)
    return chat(client, model, request, sampling, prediction=prediction, peer=peer)
