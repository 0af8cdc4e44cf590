"""One workload request sent to a server as a new user sends it, streamed, and what its chunks' arrival times say.

Chat requests go through the official ``openai`` client (``/v1/chat/completions``, streaming, usage in the last
chunk). FIM requests go to ``/v1/completions`` with ``suffix`` (specwise), or to llama.cpp's ``/infill`` (its
OpenAI endpoint has no ``suffix``), read as server-sent events with ``httpx``.

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

__all__ = ["MODEL", "Sampling", "StreamEvent", "send", "server_decode_rate", "stream_figures"]

MODEL = "bench"  # the model id the benchmark's servers serve (llama.cpp takes any)


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
        "text": "".join(e.text for e in output),
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
        **figures,
        **counts,
        "finish_reason": finish,
        "server_timings": timings,
        "server_decode_tokens_per_second": rate,
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
        **figures,
        "prompt_tokens": timings.get("prompt_n"),
        "cached_tokens": timings.get("cache_n"),
        "finish_reason": finish,
        "server_timings": timings,
        "server_decode_tokens_per_second": server_decode_rate(None, timings),
    }


def send(
    peer: str, base_url: str, request: Request, sampling: Sampling, *, prediction: bool = False, model: str = MODEL
) -> dict:
    """``request`` to the server of ``peer`` (``specwise`` or ``llama.cpp``) at ``base_url`` serving ``model``: the
    figures of :func:`stream_figures` with the usage and the finish reason."""
    from openai import OpenAI

    if request.is_fim and peer == "llama.cpp":
        return infill(base_url, request, sampling)
    client = OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, timeout=1800.0)
    if request.is_fim:
        return completion(client, model, request, sampling)
    return chat(client, model, request, sampling, prediction=prediction, peer=peer)
