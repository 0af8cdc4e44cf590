"""`/health` latency of `specwise serve` while hostile bodies arrive: 5 MB bodies refused (HTTP 413), declared and
chunked; and bodies just within the limit that cost the most to refuse: a long prompt (tokenized, then refused as
longer than the context), a conversation of as many tiny messages as fit, and a prompt of as many nested arrays;
tool and response_format schemas nested 300 levels deep (refused: 400); 128 tools of as many properties as fit
(refused at once: past the request's budget of schema values); and 128 tools whose schemas fill that budget, each
distinct (each checked and compiled, on the event loop, before the request runs).

Starts `specwise serve` (default model and drafter) as its own process on 127.0.0.1, or uses --url. Each scenario
posts its bodies one after another from a thread while the main thread polls `/health` on a kept-alive
connection; the latencies of the polls answered while the posting ran are recorded (median, p90, max), beside a
quiet baseline. The goal: `/health` under 100 ms throughout. Writes JSON with the command.

    python benchmarks/hostile_body.py --out benchmarks/results/hostile_body_default.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

import httpx

from specwise.lab.bench.runner import emit_json
from specwise.machine import cpu_name

MB = 1024 * 1024
GOAL_SECONDS = 0.1
SERVE_MAX_BATCH = 16  # `specwise serve`'s default
LONG_PROMPT = "Hello world, this is a long prompt. "  # repeated to --prompt-kb
DEEP_LEVELS = 300  # nested objects in the deep schemas (600 levels of JSON: within the parser's limit)
MAX_TOOLS = 128


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="an already running server (default: start one on 127.0.0.1)")
    p.add_argument("--target", default="default")
    p.add_argument("--drafter", default="auto")
    p.add_argument("--gamma", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--impl", default="auto", choices=["auto", "native", "hf"])
    p.add_argument("--threads", type=int, default=2, help="the server's torch threads (default: 2)")
    p.add_argument("--body-mb", type=float, default=5.0, help="size of the refused bodies (default: 5 MB)")
    p.add_argument("--prompt-kb", type=int, default=900, help="the long prompt, within the limit (default: 900)")
    p.add_argument("--posts", type=int, default=10, help="hostile bodies per scenario, one after another")
    p.add_argument("--baseline-polls", type=int, default=200, help="/health polls with nothing else (default 200)")
    p.add_argument("--scenarios", default=None, help="comma-separated scenarios to run (default: all)")
    p.add_argument("--out", default=None, help="JSON file (default: print the JSON)")
    return p.parse_args(argv)


def quantiles(seconds: list[float]) -> dict:
    """Median, p90 and max in milliseconds (None when nothing was measured)."""
    if not seconds:
        return {"polls": 0, "median_ms": None, "p90_ms": None, "max_ms": None}
    ms = sorted(s * 1000.0 for s in seconds)
    p90 = ms[min(len(ms) - 1, round(0.9 * (len(ms) - 1)))]
    return {"polls": len(ms), "median_ms": statistics.median(ms), "p90_ms": p90, "max_ms": ms[-1]}


def poll(client: httpx.Client, url: str) -> float:
    """One /health request's latency in seconds (it must answer 200)."""
    start = time.perf_counter()
    response = client.get(f"{url}/health")
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed


def health_while(url: str, hostile: Callable[[], list[int]]) -> tuple[list[float], list[int], float]:
    """Poll /health while ``hostile()`` runs on a thread: (latencies of the polls answered meanwhile, the hostile
    requests' status codes, the hostile part's wall time)."""
    statuses: list[int] = []
    thread = threading.Thread(target=lambda: statuses.extend(hostile()), daemon=True)
    latencies: list[float] = []
    with httpx.Client(timeout=60) as client:
        poll(client, url)  # the connection is open before the clock starts
        start = time.perf_counter()
        thread.start()
        while thread.is_alive():
            latency = poll(client, url)
            if thread.is_alive():
                latencies.append(latency)
        wall = time.perf_counter() - start
    thread.join()
    return latencies, statuses, wall


def chat_body(model: str, size: int) -> bytes:
    content = "x" * size
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1}).encode()


def pieces(body: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    """The body as a generator: httpx sends it chunked, with no Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def poster(url: str, path: str, make_body: Callable[[], object], posts: int) -> Callable[[], list[int]]:
    """What the hostile thread does: ``posts`` POSTs of fresh bodies, one after another; their status codes."""

    def run() -> list[int]:
        codes = []
        with httpx.Client(timeout=120) as client:
            for _ in range(posts):
                try:
                    body = make_body()
                    response = client.post(f"{url}{path}", content=body, headers={"content-type": "application/json"})
                    codes.append(response.status_code)
                except httpx.TransportError:  # the server closed the connection on a refused body
                    codes.append(0)
        return codes

    return run


def fill(make: Callable[[int], dict], limit: int) -> bytes:
    """The JSON of ``make(n)`` for about the largest ``n`` whose body stays within ``limit`` bytes."""
    one = len(json.dumps(make(2))) - len(json.dumps(make(1)))  # bytes per item
    n = (limit - len(json.dumps(make(0)))) // one - 16
    return json.dumps(make(n)).encode()


def largest(make: Callable[[int], dict], limit: int) -> bytes:
    """The JSON of ``make(n)`` for the largest ``n`` whose body stays within ``limit`` bytes (found by bisection:
    for bodies whose items grow with their index)."""
    low, high = 0, 1
    while len(json.dumps(make(high))) <= limit:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if len(json.dumps(make(mid))) <= limit else (low, mid)
    return json.dumps(make(low)).encode()


def deep_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def deep_schema_bodies(model: str) -> list[bytes]:
    """A chat request whose tool's parameters nest DEEP_LEVELS objects, and one whose response_format does."""
    base = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    tool = {"type": "function", "function": {"name": "f", "parameters": deep_schema(DEEP_LEVELS)}}
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": deep_schema(DEEP_LEVELS)}}
    return [json.dumps(base | {"tools": [tool]}).encode(), json.dumps(base | {"response_format": schema}).encode()]


def wide_tools(model: str, properties: int, distinct: bool = False) -> dict:
    """MAX_TOOLS tools of ``properties`` string properties each (``distinct``: each tool's own names, so that no
    schema is the same as another)."""

    def props(i: int) -> dict:
        return {f"p{i}_{j}" if distinct else f"p{j}": {"type": "string"} for j in range(properties)}

    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object", "properties": props(i)}}}
        for i in range(MAX_TOOLS)
    ]
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tools": tools}


def tools_at_the_budget(model: str) -> Callable[[], bytes]:
    """Fresh bodies (no schema seen before: the server checks each schema once) of MAX_TOOLS tools whose schemas
    hold just under the server's budget of schema values."""
    from specwise.tools.spec import MAX_SCHEMA_VALUES

    per_tool = (MAX_SCHEMA_VALUES // MAX_TOOLS - 4) // 2  # each property: its name's object and its type

    def make() -> bytes:
        body = wide_tools(model, per_tool, distinct=True)
        salt = uuid.uuid4().hex  # new to the server, run after run
        for tool in body["tools"]:
            tool["function"]["parameters"]["description"] = f"round {salt}"
        return json.dumps(body).encode()

    return make


def scenarios(url: str, model: str, limit: int, args: argparse.Namespace) -> dict[str, Callable[[], list[int]]]:
    big = chat_body(model, int(args.body_mb * MB))
    prompt = (LONG_PROMPT * (args.prompt_kb * 1024 // len(LONG_PROMPT) + 1))[: args.prompt_kb * 1024]
    long_prompt = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()
    message = {"role": "user", "content": ""}
    messages = fill(lambda n: {"model": model, "messages": [message] * n, "max_tokens": 1}, limit)
    nested = fill(lambda n: {"model": model, "prompt": [[1]] * n, "max_tokens": 1}, limit)
    deep = deep_schema_bodies(model)
    turn = iter(range(1 << 30))
    wide = largest(lambda n: wide_tools(model, n), limit)
    budget = tools_at_the_budget(model)
    chat, completions = "/v1/chat/completions", "/v1/completions"
    return {
        "refused_declared": poster(url, chat, lambda: big, args.posts),
        "refused_chunked": poster(url, chat, lambda: pieces(big), args.posts),
        "long_prompt_within_limit": poster(url, completions, lambda: long_prompt, args.posts),
        "tiny_messages_within_limit": poster(url, chat, lambda: messages, args.posts),
        "nested_arrays_within_limit": poster(url, completions, lambda: nested, args.posts),
        "deep_schemas_refused": poster(url, chat, lambda: deep[next(turn) % 2], args.posts),
        "wide_tools_within_limit": poster(url, chat, lambda: wide, args.posts),
        "tools_at_the_schema_budget": poster(url, chat, budget, args.posts),
    }


def measure(url: str, health: dict, args: argparse.Namespace) -> dict:
    """The baseline and every scenario, in turn."""
    model, limit = health["model"], health["max_body_bytes"]
    with httpx.Client(timeout=60) as client:
        baseline = [poll(client, url) for _ in range(args.baseline_polls)]
    results = {"baseline": quantiles(baseline)}
    chosen = None if args.scenarios is None else set(args.scenarios.split(","))
    for name, hostile in scenarios(url, model, limit, args).items():
        if chosen is not None and name not in chosen:
            continue
        latencies, statuses, wall = health_while(url, hostile)
        results[name] = quantiles(latencies) | {"hostile_statuses": statuses, "hostile_seconds": wall}
        print(f"{name}: {json.dumps(results[name])}", file=sys.stderr)
    worst = max(r["max_ms"] or 0.0 for r in results.values())
    results["goal"] = {"max_ms_under": GOAL_SECONDS * 1000, "met": worst < GOAL_SECONDS * 1000, "worst_ms": worst}
    return results


def environment() -> dict:
    import platform

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "python": platform.python_version(), "load_average": load}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.url:
        server = nullcontext({"url": args.url.rstrip("/"), "command": None})
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from server_load import specwise_server  # the same `specwise serve` process the load test starts

        server = specwise_server(args, args.drafter, SERVE_MAX_BATCH)
    with server as info:
        health = httpx.get(f"{info['url']}/health", timeout=60).json()
        results = measure(info["url"], health, args)
    report = {
        "command": "python " + shlex.join(sys.argv if argv is None else ["benchmarks/hostile_body.py", *argv]),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": vars(args),
        "server": {"command": info["command"], "health": health},
        "environment": environment(),
        "results": results,
    }
    emit_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
