"""Load test of `specwise serve` beside llama.cpp's `llama-server`: throughput and latency with concurrent clients.

Every server runs as its own process on 127.0.0.1 with the same threads: `specwise serve` once per --drafter (with
--max-batch), and with --llama-cpp, `llama-server -np MAX_BATCH` on the same GGUF file. Every level sends the same
--requests streamed chat requests (Spec-Bench questions with --questions, else the project's own prompts, in turn;
greedy, --max-tokens each) with the official openai client, split over that many concurrent clients, each sending
its share one after another. Every (server, level) pair runs once per round, interleaved over --rounds, so that drift
in the machine's load hits them alike. Records per request: time to first token, end-to-end latency, tokens and
(for specwise) the speculative statistics from `usage`; per level and round: wall time, aggregate tokens/s and
requests/s. Writes JSON (with the command that made it) and prints a Markdown table of medians.

    python benchmarks/server_load.py --target default --drafter auto --max-batch 8 --llama-cpp \
        --concurrency 1 8 --questions question.jsonl --requests 16 --rounds 3 \
        --max-tokens 128 --threads 2 --out benchmarks/results/server_load/server_load.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="an already running server (default: start them on 127.0.0.1)")
    p.add_argument("--target", default="default")
    p.add_argument("--drafter", nargs="+", default=["auto"], help="one specwise server per drafter, interleaved")
    p.add_argument("--gamma", default="auto")
    p.add_argument("--max-batch", type=int, default=8, help="specwise --max-batch, llama-server -np (default 8)")
    p.add_argument("--llama-cpp", action="store_true", help="also llama-server -np MAX_BATCH on the same GGUF")
    p.add_argument("--solo", action="store_true", help="also the first drafter's server with --max-batch 1")
    p.add_argument("--device", default="cpu")
    p.add_argument("--impl", default="auto", choices=["auto", "native", "hf"], help="model implementation")
    p.add_argument("--threads", type=int, default=2, help="threads of every server (default: 2)")
    p.add_argument("--ctx-size", type=int, default=1024, help="llama-server's context per slot (default: 1024)")
    p.add_argument(
        "--questions",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts)",
    )
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--requests", type=int, default=16, help="requests per level and round (default: 16)")
    p.add_argument("--rounds", type=int, default=2, help="passes over all levels, interleaved (default: 2)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed per request")
    p.add_argument("--out", default="benchmarks/results/server_load.json")
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server at {url} exited during startup (status {proc.returncode})")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the server at {url} did not start in {timeout:.0f} s")


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """End a server process: terminate, then kill it if it has not exited within ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def specwise_server(args: argparse.Namespace, drafter: str, max_batch: int):
    """`specwise serve` in its own process on a free port; yields its url, model id and command."""
    import httpx

    port = free_port()
    command = [sys.executable, "-m", "specwise", "serve", "--target", args.target, "--drafter", drafter]
    command += ["--gamma", str(args.gamma), "--device", args.device, "--impl", args.impl, "--port", str(port)]
    command += ["--threads", str(args.threads), "--max-batch", str(max_batch), "--log-level", "warning"]
    proc = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        yield {"url": url, "model": model, "command": shlex.join(command), "kind": "specwise"}
    finally:
        stop(proc)


@contextmanager
def llama_server(args: argparse.Namespace):
    """`llama-server -np MAX_BATCH` on the target's GGUF file, same threads; yields its url and command."""
    from specwise.lab.bench.llamacpp import LlamaServer
    from specwise.models.loader import gguf_source

    path = gguf_source(args.target)
    if path is None:
        raise SystemExit(f"--llama-cpp needs a GGUF target (default or a .gguf path), got {args.target!r}")
    log = Path(args.out).with_suffix(".llama-server.log")  # kept: what llama-server said, should it fail
    log.parent.mkdir(parents=True, exist_ok=True)
    server = LlamaServer(path, threads=args.threads, ctx_size=args.ctx_size, parallel=args.max_batch, log_path=log)
    with server:
        yield {"url": server.url, "model": path.stem, "command": shlex.join(server.command()), "kind": "llama.cpp"}


async def one_request(api, model: str, prompt: str, args: argparse.Namespace) -> dict:
    """One streamed chat request: timings, tokens and the speculative statistics of its usage."""
    start = time.perf_counter()
    first = None
    final = None
    stream = await api.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        if chunk.usage is not None:
            final = chunk
    end = time.perf_counter()
    spec = getattr(final.usage, "speculative", None) or {"drafted": 0, "accepted": 0, "target_passes": 0}
    return {
        "prompt": prompt,
        "start": start,
        "ttft_seconds": (first or end) - start,
        "latency_seconds": end - start,
        "completion_tokens": final.usage.completion_tokens,
        "drafted": spec["drafted"],
        "accepted": spec["accepted"],
        "target_passes": spec["target_passes"],
    }


async def run_level(url: str, model: str, concurrency: int, args: argparse.Namespace) -> dict:
    """The level's requests over ``concurrency`` clients; client i sends requests i, i + c, i + 2c, ... in turn."""
    import openai

    pool = args.prompt_texts
    prompts = [pool[i % len(pool)] for i in range(args.requests)]

    async def client(index: int) -> list[dict]:
        api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=args.timeout, max_retries=2)
        async with api:
            return [await one_request(api, model, prompt, args) for prompt in prompts[index::concurrency]]

    before = batch_counters(url)
    start = time.perf_counter()
    results = await asyncio.gather(*(client(i) for i in range(concurrency)))
    wall = time.perf_counter() - start
    after = batch_counters(url)
    requests = [r | {"start": r["start"] - start} for rs in results for r in rs]
    tokens = sum(r["completion_tokens"] for r in requests)
    level = {
        "wall_seconds": wall,
        "completion_tokens": tokens,
        "tokens_per_second": tokens / wall,
        "requests": requests,
    }
    if before is not None and after is not None:
        level["batch"] = {name: after[name] - before[name] for name in BATCH_COUNTERS}
    return level


# what `specwise serve` says at /metrics about its batch steps: how many, how long, how much of it in the target's
# pass (the rest is each sequence's planning, drafting and verification around it), sequences and rows per pass
BATCH_COUNTERS = {
    "steps": "specwise_batch_passes_total",
    "step_seconds": "specwise_batch_step_seconds_total",
    "pass_seconds": "specwise_batch_pass_seconds_total",
    "sequences": "specwise_batch_size_sum",
    "rows": "specwise_batch_rows_sum",
}


def batch_counters(url: str) -> dict[str, float] | None:
    """The batch counters of a specwise server (None for another server, or one without them)."""
    import httpx

    try:
        text = httpx.get(f"{url}/metrics", timeout=30).text
    except httpx.HTTPError:
        return None
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        values[name] = value
    try:
        return {key: float(values[name]) for key, name in BATCH_COUNTERS.items()}
    except (KeyError, ValueError):
        return None


def batch_split(rounds: list[dict]) -> dict | None:
    """Where the level's batch steps spent their time, over its rounds."""
    parts = [rnd["batch"] for rnd in rounds if "batch" in rnd]
    if not parts:
        return None
    total = {name: sum(p[name] for p in parts) for name in BATCH_COUNTERS}
    steps = total["steps"] or 1
    return {
        "steps": int(total["steps"]),
        "sequences_per_step": total["sequences"] / steps,
        "rows_per_pass": total["rows"] / steps,
        "pass_ms_per_step": 1000 * total["pass_seconds"] / steps,
        "other_ms_per_step": 1000 * (total["step_seconds"] - total["pass_seconds"]) / steps,
        "pass_share": total["pass_seconds"] / total["step_seconds"] if total["step_seconds"] else 0.0,
    }


def _quantiles(values: list[float]) -> dict:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {"median": statistics.median(ordered), "p90": p90, "max": ordered[-1]}


def summarize(concurrency: int, rounds: list[dict]) -> dict:
    """A level over its rounds: median throughput, latency quantiles over every request, α and τ."""
    requests = [r for rnd in rounds for r in rnd["requests"]]
    tokens = sum(r["completion_tokens"] for r in requests)
    drafted, accepted = sum(r["drafted"] for r in requests), sum(r["accepted"] for r in requests)
    passes = sum(r["target_passes"] for r in requests)
    return {
        "concurrency": concurrency,
        "requests": len(requests),
        "throughput_tokens_per_second": statistics.median(rnd["tokens_per_second"] for rnd in rounds),
        "requests_per_second": statistics.median(len(rnd["requests"]) / rnd["wall_seconds"] for rnd in rounds),
        "latency_seconds": _quantiles([r["latency_seconds"] for r in requests]),
        "ttft_seconds": _quantiles([r["ttft_seconds"] for r in requests]),
        "per_request_tokens_per_second": _quantiles([r["completion_tokens"] / r["latency_seconds"] for r in requests]),
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_accepted_length": tokens / passes if passes else 0.0,
        "batch_steps": batch_split(rounds),
        "rounds": rounds,
    }


def environment(args: argparse.Namespace) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from specwise.machine import cpu_name, vector_flags

    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = None

    return {
        "cpu": cpu_name(),
        "cpu_flags": vector_flags(),
        "python": platform.python_version(),
        "torch": torch,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
    }


def table(results: dict[str, list[dict]]) -> str:
    rows = [
        "| drafter | clients | requests | tokens/s, all clients | requests/s | latency median (p90) s "
        "| TTFT median (p90) s | tokens/s per request (median) | α | τ |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for drafter, lv in ((d, lv) for d, levels in results.items() for lv in levels):
        lat, ttft = lv["latency_seconds"], lv["ttft_seconds"]
        rows.append(
            f"| {drafter} | {lv['concurrency']} | {lv['requests']} | {lv['throughput_tokens_per_second']:.1f} | "
            f"{lv['requests_per_second']:.2f} | {lat['median']:.2f} ({lat['p90']:.2f}) | "
            f"{ttft['median']:.2f} ({ttft['p90']:.2f}) | {lv['per_request_tokens_per_second']['median']:.1f} | "
            f"{lv['acceptance_rate']:.2f} | {lv['mean_accepted_length']:.2f} |"
        )
    split = [(d, lv) for d, levels in results.items() for lv in levels if lv.get("batch_steps")]
    if split:
        rows += [
            "",
            "Where the batch steps' time went (specwise): the target's pass over all rows, and the rest of each step",
            "(each sequence's planning, drafting and verification).",
            "",
            "| drafter | clients | steps | sequences/step | rows/pass | pass ms/step | other ms/step | pass share |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for drafter, lv in split:
            b = lv["batch_steps"]
            rows.append(
                f"| {drafter} | {lv['concurrency']} | {b['steps']} | {b['sequences_per_step']:.2f} | "
                f"{b['rows_per_pass']:.1f} | {b['pass_ms_per_step']:.2f} | {b['other_ms_per_step']:.2f} | "
                f"{b['pass_share']:.0%} |"
            )
    for drafter, levels in results.items():
        if len(levels) > 1 and levels[0]["throughput_tokens_per_second"] > 0:
            low, high = levels[0], levels[-1]
            ratio = high["throughput_tokens_per_second"] / low["throughput_tokens_per_second"]
            rows.append(
                f"\n{drafter}: {high['concurrency']} clients give {ratio:.2f}x the tokens/s of {low['concurrency']}"
            )
    return "\n".join(rows)


async def run_all(servers: dict[str, dict], args: argparse.Namespace) -> dict[str, list[dict]]:
    """Every (drafter, level) once per round, interleaved; returns each drafter's level summaries."""
    import openai

    for url, model in ((s["url"], s["model"]) for s in servers.values()):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=args.timeout) as api:
            await one_request(api, model, "Hello.", args)  # warm-up, not measured
    rounds: dict[tuple[str, int], list[dict]] = {(d, c): [] for d in servers for c in args.concurrency}
    for index in range(args.rounds):
        for (drafter, concurrency), done in rounds.items():
            url, model = servers[drafter]["url"], servers[drafter]["model"]
            done.append(await run_level(url, model, concurrency, args))
            speed = done[-1]["tokens_per_second"]
            print(f"round {index + 1}, {drafter}, {concurrency} clients: {speed:.1f} tokens/s", file=sys.stderr)
    return {d: [summarize(c, rounds[d, c]) for c in args.concurrency] for d in servers}


def prompt_texts(args: argparse.Namespace) -> list[str]:
    """The requests' user messages, one category after another in turn: the first turns of a Spec-Bench question
    file, or the project's own prompts."""
    from specwise.lab.bench.prompts import default_prompts, interleave_categories, load_questions

    return [
        q.text for q in interleave_categories(load_questions(args.questions) if args.questions else default_prompts())
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.prompt_texts = prompt_texts(args)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    with ExitStack() as stack:
        if args.url:
            import httpx

            url = args.url.rstrip("/")
            model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
            servers = {"server": {"url": url, "model": model, "implementation": "unknown"}}
        else:
            servers = {
                f"specwise {d}": stack.enter_context(specwise_server(args, d, args.max_batch)) for d in args.drafter
            }
            if args.solo:
                first = args.drafter[0]
                servers[f"specwise {first} max-batch 1"] = stack.enter_context(specwise_server(args, first, 1))
            if args.llama_cpp:
                servers["llama.cpp"] = stack.enter_context(llama_server(args))
        results = asyncio.run(run_all(servers, args))
    report = {
        "command": "python " + shlex.join(sys.argv if argv is None else ["benchmarks/server_load.py", *argv]),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "prompt_texts")},
        "environment": environment(args) | {"load_average_before": load_before},
        "servers": servers,
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
