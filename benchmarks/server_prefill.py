"""Prompt reading through the servers: ``specwise serve`` against llama.cpp's ``llama-server`` on one GGUF file, a
prompt of N tokens sent as token ids to ``/v1/completions`` (specwise) and ``/completion`` (llama.cpp) with one token
to generate, the request's wall time measured by the client (what an agent waits for before its first token).

Each length runs ``--repeats`` times per server (on specwise each followed by an untimed short answer,
``--answer-tokens``, so that prompts are read after decoding steps as in an agent's turns), the servers one after
the other (never both at once); every request
starts from a cache that holds none of the prompt (specwise: a different first token per repeat and length, so
neither its prompt cache nor a copied prefix helps; llama-server runs with ``--cache-ram 0`` and the same change).
With ``--drafter`` several specwise servers are run, one per drafter (``none``, ``auto``, ...): ``auto`` shows what
a drafter that reads the prompt too adds. The in-process library's rate on the same prompts comes from
``benchmarks/prefill_lengths.py``.

    python benchmarks/server_prefill.py --target qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --corpus tinyshakespeare.txt --lengths 1024 4096 --drafter none auto --llama-cpp --out server_prefill.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefill_lengths import corpus_tokens, lscpu  # noqa: E402
from server_load import _wait_ready, free_port, stop  # noqa: E402

from specwise.lab.bench.environment import emit_json, load_average, script_header  # noqa: E402


def post(url: str, payload: dict, timeout: float) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def prompts(ids: list[int], n: int, repeats: int, salt: int) -> list[list[int]]:
    """``repeats`` prompts of n tokens: the corpus's first n tokens, each with another first token (so that no
    repeat finds an earlier one's prefix cached)."""
    return [[ids[(salt * 131 + r * 17) % 1000 + 1000]] + ids[1:n] for r in range(repeats)]


def run_specwise(args, drafter: str, ids: list[int]) -> dict:
    port = free_port()
    command = [sys.executable, "-m", "specwise", "serve", "--target", args.target, "--drafter", drafter]
    command += ["--port", str(port), "--threads", str(args.threads), "--log-level", "warning"]
    command += ["--served-model-name", "specwise"]
    proc = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        _wait_ready(url, proc, timeout=600)
        post(
            f"{url}/v1/completions",
            {"model": "specwise", "prompt": ids[:8], "max_tokens": 2, "temperature": 0},
            args.timeout,
        )
        for i, n in enumerate(args.lengths):
            for prompt in prompts(ids, n, args.repeats, i):
                began = time.perf_counter()
                out = post(
                    f"{url}/v1/completions",
                    {"model": "specwise", "prompt": prompt, "max_tokens": 1, "temperature": 0},
                    args.timeout,
                )
                seconds = time.perf_counter() - began
                usage = out.get("usage", {})
                rows.append(
                    {
                        "tokens": n,
                        "seconds": seconds,
                        "tokens_per_s": n / seconds,
                        "prompt_tokens": usage.get("prompt_tokens"),
                        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                        "load_average": load_average(),
                    }
                )
                print(f"specwise {drafter} {n}: {n / seconds:.1f} tok/s", flush=True)
                if args.answer_tokens:  # an answer between prompts, as an agent's turn has (untimed)
                    answer = {
                        "model": "specwise",
                        "prompt": ids[:32],
                        "max_tokens": args.answer_tokens,
                        "ignore_eos": True,
                    }
                    post(f"{url}/v1/completions", answer | {"temperature": 0}, args.timeout)
    finally:
        stop(proc)
    return {"command": shlex.join(command), "requests": rows}


def run_llama(args, ids: list[int]) -> dict:
    from specwise.lab.bench.llamacpp import LlamaServer

    context = max(args.lengths) + 64
    server = LlamaServer(args.target, threads=args.threads, ctx_size=context, request_timeout=args.timeout)
    rows = []
    with server:
        for i, n in enumerate(args.lengths):
            for prompt in prompts(ids, n, args.repeats, i):
                began = time.perf_counter()
                out = server.complete(prompt, 1)
                seconds = time.perf_counter() - began
                timings = out.get("timings", {})
                rows.append(
                    {
                        "tokens": n,
                        "seconds": seconds,
                        "tokens_per_s": n / seconds,
                        "server_prompt_per_second": timings.get("prompt_per_second"),
                        "server_prompt_n": timings.get("prompt_n"),
                        "load_average": load_average(),
                    }
                )
                print(f"llama-server {n}: {n / seconds:.1f} tok/s", flush=True)
        command = shlex.join(server.command())
    return {"command": command, "requests": rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a .gguf file")
    ap.add_argument("--corpus", required=True, help="a text file the prompts are cut from")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", nargs="+", default=["none"], help="one specwise server per drafter")
    ap.add_argument("--llama-cpp", action="store_true", help="also llama-server on the same file")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument(
        "--answer-tokens",
        type=int,
        default=64,
        help="specwise: a short request generating this many tokens after each prompt (untimed), as an agent's turns "
        "alternate reading and answering (0: none)",
    )
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    header = script_header(argv)
    header["lscpu"] = lscpu()

    from specwise.models import load_model

    tokenizer = load_model(args.target, precision="q8").tokenizer
    ids = corpus_tokens(tokenizer, Path(args.corpus), max(args.lengths) + 2000)
    servers = {f"specwise {d}": run_specwise(args, d, ids) for d in args.drafter}
    if args.llama_cpp:
        servers["llama-server"] = run_llama(args, ids)
    summary = {}
    for name, run in servers.items():
        for n in args.lengths:
            rates = [r["tokens_per_s"] for r in run["requests"] if r["tokens"] == n]
            summary.setdefault(str(n), {})[name] = {"median_tokens_per_s": statistics.median(rates), "runs": rates}
    header["machine"]["load_average_end"] = load_average()
    emit_json({**header, "target": Path(args.target).name, "servers": servers, "summary": summary}, args.out)


if __name__ == "__main__":
    main()
