"""Agent traces replayed through the servers: each recorded request of a coding agent's run (its system prompt, tool
schemas, tool results, turn by turn, as ``benchmarks/agents_e2e.py --trace-dir`` saved them) sent in order to
``specwise serve`` and to llama.cpp's ``llama-server`` on the same GGUF file; per turn the time to first token, the
whole turn's time, the prompt and cached tokens; per trace the total time, and the ratio of the two servers.

Each turn is sent as it was recorded but streamed (to time its first token), greedy, with at most ``--max-tokens``
new tokens and the served model's name; the next turn is the recorded one (the agent's own history, not this
server's answer), so a turn's prompt shares with the one before it what the agent kept. Both servers keep their
prompt cache between turns (llama-server: one slot, ``cache_prompt`` on, its default). Turns on a route
llama-server does not serve (``/v1/responses``) are replayed on specwise only and left out of the ratio.

    python benchmarks/agent_traces.py --target qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --traces benchmarks/traces/opencode-read benchmarks/traces/qwen-read --llama-cpp --out traces.json

The traces in ``benchmarks/traces/`` were recorded from the agents named in their folder names (licences and
versions in ``benchmarks/traces/README.md``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefill_lengths import lscpu  # noqa: E402
from server_load import _wait_ready, free_port  # noqa: E402

from specwise.lab.bench.environment import emit_json, load_average, script_header  # noqa: E402

LLAMA_ROUTES = {"/v1/chat/completions", "/v1/messages"}  # what llama-server serves of the agents' routes


def load_trace(folder: Path) -> list[dict]:
    turns = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not turns:
        raise SystemExit(f"error: {folder} holds no recorded turns (*.json)")
    return turns


def prepared(turn: dict, model: str, max_tokens: int) -> dict:
    """The recorded body, streamed, greedy, its new tokens capped, asking for the served model."""
    body = dict(turn["body"])
    body |= {"model": model, "stream": True, "temperature": 0}
    route = turn["route"]
    if route == "/v1/responses":
        body["max_output_tokens"] = min(int(body.get("max_output_tokens") or max_tokens), max_tokens)
    else:
        body.pop("max_completion_tokens", None)
        body["max_tokens"] = min(int(turn["body"].get("max_tokens") or max_tokens), max_tokens)
    if route == "/v1/chat/completions":
        body["stream_options"] = {"include_usage": True}
    return body


def first_output(route: str, data: dict) -> bool:
    """Whether a streamed event carries the answer's first output (text, reasoning or a tool call)."""
    if route == "/v1/chat/completions":
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
                return True
        return False
    if route == "/v1/messages":
        return data.get("type") == "content_block_delta"
    return str(data.get("type", "")).endswith(".delta")


def usage_of(route: str, data: dict, usage: dict) -> None:
    """Collects prompt, cached and completion tokens from the events that carry them (each server's way)."""
    if route == "/v1/chat/completions" and data.get("usage"):
        u = data["usage"]
        usage["prompt_tokens"] = u.get("prompt_tokens")
        usage["completion_tokens"] = u.get("completion_tokens")
        details = u.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            usage["cached_tokens"] = details["cached_tokens"]
    if data.get("timings"):  # llama-server
        usage["cached_tokens"] = data["timings"].get("cache_n")
        usage["prompt_read"] = data["timings"].get("prompt_n")
    if route == "/v1/messages" and data.get("type") == "message_start":
        u = data["message"].get("usage") or {}
        usage["prompt_tokens"] = (u.get("input_tokens") or 0) + (u.get("cache_read_input_tokens") or 0)
    if route == "/v1/messages" and data.get("type") == "message_delta":
        u = data.get("usage") or {}
        usage["completion_tokens"] = u.get("output_tokens")
        if u.get("cache_read_input_tokens") is not None:
            usage["cached_tokens"] = u["cache_read_input_tokens"]
    if route == "/v1/responses" and data.get("type") in ("response.completed", "response.incomplete"):
        u = data["response"].get("usage") or {}
        usage["prompt_tokens"] = u.get("input_tokens")
        usage["completion_tokens"] = u.get("output_tokens")
        usage["cached_tokens"] = (u.get("input_tokens_details") or {}).get("cached_tokens")


def replay_turn(url: str, turn: dict, body: dict, timeout: float) -> dict:
    import httpx

    route = turn["route"]
    began = time.perf_counter()
    first = None
    usage: dict = {}
    status = None
    with httpx.stream("POST", url + route, json=body, timeout=timeout) as response:
        status = response.status_code
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                data = json.loads(line[6:])
            except ValueError:
                continue
            if first is None and first_output(route, data):
                first = time.perf_counter() - began
            usage_of(route, data, usage)
    seconds = time.perf_counter() - began
    return {"route": route, "status": status, "ttft_s": first, "seconds": seconds, **usage}


def replay(url: str, model: str, traces: dict[str, list[dict]], args, routes: set[str] | None) -> dict:
    out = {}
    for name, turns in traces.items():
        rows = []
        for i, turn in enumerate(turns):
            if routes is not None and turn["route"] not in routes:
                rows.append({"route": turn["route"], "skipped": "route not served"})
                continue
            row = replay_turn(url, turn, prepared(turn, model, args.max_tokens), args.timeout)
            rows.append(row | {"load_average": load_average()})
            ttft = row["ttft_s"]
            print(f"{name} turn {i}: {row['status']} ttft {ttft if ttft is None else round(ttft, 1)} s, "
                  f"{row['seconds']:.1f} s, cached {row.get('cached_tokens')}", flush=True)  # fmt: skip
        out[name] = {"turns": rows, "total_s": sum(r.get("seconds", 0.0) for r in rows)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a .gguf file")
    ap.add_argument("--traces", nargs="+", required=True, help="folders of recorded turns (000.json, 001.json, ...)")
    ap.add_argument("--drafter", default="auto", help="specwise's drafter")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256, help="the most new tokens of a turn")
    ap.add_argument("--llama-cpp", action="store_true", help="also llama-server on the same file")
    ap.add_argument("--context", type=int, default=32768, help="llama-server's context")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    header = script_header(argv)
    header["lscpu"] = lscpu()
    traces = {Path(t).name: load_trace(Path(t)) for t in args.traces}
    servers = {}

    port = free_port()
    command = [sys.executable, "-m", "specwise", "serve", "--target", args.target, "--drafter", args.drafter]
    command += ["--port", str(port), "--threads", str(args.threads), "--served-model-name", "specwise"]
    command += ["--log-level", "warning"]
    proc = subprocess.Popen(command)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc, timeout=600)
        result = replay(f"http://127.0.0.1:{port}", "specwise", traces, args, None)
        servers["specwise"] = {"command": shlex.join(command), "traces": result}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if args.llama_cpp:
        from specwise.lab.bench.llamacpp import LlamaServer

        server = LlamaServer(
            args.target, threads=args.threads, ctx_size=args.context, extra_args=["--jinja"], prompt_cache=True
        )
        with server:
            result = replay(server.url, "specwise", traces, args, LLAMA_ROUTES)
            servers["llama-server"] = {"command": shlex.join(server.command()), "traces": result}
    summary = {}
    for name in traces:
        row = {s: servers[s]["traces"][name]["total_s"] for s in servers}
        if "llama-server" in servers:  # the turns both served
            ours, theirs = (servers[s]["traces"][name]["turns"] for s in ("specwise", "llama-server"))
            both = [(a, b) for a, b in zip(ours, theirs) if "seconds" in a and "seconds" in b]
            if both:
                row["ratio_specwise_over_llama"] = sum(a["seconds"] for a, _ in both) / sum(
                    b["seconds"] for _, b in both
                )
        summary[name] = row
    header["machine"]["load_average_end"] = load_average()
    emit_json({**header, "target": Path(args.target).name, "servers": servers, "summary": summary}, args.out)


if __name__ == "__main__":
    main()
