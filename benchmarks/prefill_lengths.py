"""Prompt reading (prefill) of a GGUF file by specwise at several prompt lengths, and optionally by llama.cpp's
``llama-bench`` at the same lengths.

Each prompt is the first N tokens of a text corpus (any text file, ``--corpus``), tokenized by the target's own
tokenizer. specwise reads it in process from an empty cache in the slices a prompt is read in (``MAX_ROWS`` rows per
layer call), each slice timed; the last slice's call ends in the output layer of its last row, as
``specwise generate --max-new-tokens 1`` reads a prompt (``--engine`` also times one such Engine.generate per
length, its stats' ``prefill_seconds``). The layers' time is split into products, attention and the rest by the
kernels' own timers. Every pass runs on ``--threads`` threads (the thread governor's switch to one thread on a busy
machine is off). ``llama-bench -p N -n 0 -t THREADS -r 1`` times llama.cpp's prompt processing of N tokens.

Lengths run in the order given, each ``--repeats`` times (specwise and llama-bench alternating). On a machine that
others share, a run's time includes whatever ran beside it: the JSON keeps every sample, and per length the median
and the best run's tokens/s of each program, and for specwise also the sum over slices of each slice's fastest time
across the repeats (``slice_best``: the least disturbed estimate of the same work) and the process's CPU seconds
(with ``--threads 1``, the work itself whatever else runs: tokens per CPU second); with the load averages, the
command line and the machine (``lscpu``'s model name and flags).

    python benchmarks/prefill_lengths.py --target qwen.gguf --corpus tinyshakespeare.txt --lengths 1024 4096 8192 \\
        --repeats 3 --llama-bench llama.cpp/build/bin/llama-bench --out prefill.json
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import time
from pathlib import Path

from specwise.engine import Engine
from specwise.lab.bench.environment import emit_json, load_average, script_header
from specwise.lab.bench.llamacpp import parse_llama_bench_json, summarize_bench_record
from specwise.models.threads import set_num_threads
from specwise.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def lscpu() -> dict:
    """``lscpu``'s model name, flags and caches (empty where lscpu is missing)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    wanted = ("Model name", "CPU family", "Model", "CPU(s)", "L1d cache", "L2 cache", "L3 cache", "Flags")
    return {k: fields[k] for k in wanted if k in fields}


def corpus_tokens(tokenizer, path: Path, n: int) -> list[int]:
    """The first n tokens of the corpus (read in growing pieces until it gives n tokens)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    size = 8 * n
    while True:
        ids = tokenizer.encode(text[:size], add_special_tokens=False)
        if len(ids) >= n or size >= len(text):
            break
        size *= 2
    if len(ids) < n:
        raise SystemExit(f"error: {path} gives only {len(ids)} tokens, {n} asked")
    return ids[:n]


def specwise_slices(model, ids: list[int], rows: int) -> dict:
    """One prompt read from an empty cache in slices of ``rows``, each slice one timed call (the last one's logits
    of its last row; the first after the cache's room for the prompt is reserved, as the engine does): seconds per
    slice, tokens/s and the layers' parts (seconds of products, attention, the rest)."""
    import ctypes

    lib = model._lib
    model.reset()
    lib.specwise_qllama_timings(1, None)
    times = []
    cpu = time.process_time()
    for lo in range(0, len(ids), rows):
        hi = min(len(ids), lo + rows)
        began = time.perf_counter()
        if lo == 0:  # the prompt's room in the cache, as the engine makes it before the first slice (in its time)
            model.reserve(len(ids) + 1)
        model.forward(ids[lo:hi], num_logits=1 if hi == len(ids) else 0)
        times.append(time.perf_counter() - began)
    cpu = time.process_time() - cpu
    parts = (ctypes.c_double * 3)()
    lib.specwise_qllama_timings(0, ctypes.addressof(parts))
    seconds = sum(times)
    return {
        "seconds": seconds,
        "tokens_per_s": len(ids) / seconds,
        "cpu_seconds": cpu,
        "tokens_per_cpu_s": len(ids) / cpu,
        "slice_seconds": times,
        "parts_seconds": {"products": parts[0], "attention": parts[1], "rest": parts[2]},
        "load_average": load_average(),
    }


def specwise_engine(model, ids: list[int]) -> dict:
    """One prompt read as ``generate --max-new-tokens 1`` reads it (one Engine.generate, a fresh cache): its stats'
    prefill seconds."""
    model.reset()
    stats = Engine(model, None, gamma=0).generate(ids, GREEDY, max_new_tokens=1, eos_token_ids=[]).stats
    return {"prefill_seconds": stats.prefill_seconds, "tokens_per_s": len(ids) / stats.prefill_seconds}


def attention_alone(stack, positions: int, rows: int, tiling: int, repeats: int, half: bool) -> float:
    """CPU seconds (the calling thread's, one thread: the work whatever else runs; the best of ``repeats``) of one
    layer's attention for a slice of ``rows`` rows after ``positions`` positions, random queries, keys and values of
    the model's shape; tiling 0: the per-row loops, 1: the tiled loops."""
    import ctypes

    import numpy as np

    from specwise.models.kernels.abi import QRows, QRun, QShape, QWork

    heads, kv, hd = stack.n_heads, stack.n_kv, stack.head_dim
    rng = np.random.default_rng(positions)
    cap = positions + rows
    dtype = np.float16 if half else np.float32
    k_cache = (rng.standard_normal((1, kv, cap, hd)) / np.sqrt(hd)).astype(dtype)
    v_cache = rng.standard_normal((1, kv, cap, hd)).astype(dtype)
    qkv = rng.standard_normal((rows, (heads + 2 * kv) * hd)).astype(np.float32)
    k_rows = (ctypes.c_void_p * rows)(*[k_cache.ctypes.data] * rows)
    v_rows = (ctypes.c_void_p * rows)(*[v_cache.ctypes.data] * rows)
    caps = (ctypes.c_int64 * rows)(*[cap] * rows)
    pos = (ctypes.c_int64 * rows)(*range(positions, cap))
    qrows = QRows()
    qrows.rows, qrows.kv_half = rows, int(half)
    qrows.k_rows, qrows.v_rows = ctypes.addressof(k_rows), ctypes.addressof(v_rows)
    qrows.cap, qrows.pos = ctypes.addressof(caps), ctypes.addressof(pos)
    scores = np.zeros(heads * rows * cap, dtype=np.float32)
    attn = np.zeros((rows, heads * hd), dtype=np.float32)
    shape = QShape(1, stack.hidden, heads, kv, hd, stack.intermediate, 1e-5)
    work, run = QWork(None, 0, scores.ctypes.data, scores.size), QRun(1, 0)
    best = float("inf")
    for _ in range(repeats):
        began = time.thread_time()
        status = stack._lib.specwise_qllama_attention(
            ctypes.byref(shape), ctypes.byref(qrows), 0, 0, float(1 / np.sqrt(hd)), qkv.ctypes.data,
            attn.ctypes.data, ctypes.byref(work), ctypes.byref(run), tiling,
        )  # fmt: skip
        best = min(best, time.thread_time() - began)
        if status != 0:
            raise SystemExit(f"error: specwise_qllama_attention returned {status}")
    return best


def llama_bench_prefill(binary: str, target: Path, n: int, threads: int, extra: list[str] = ()) -> dict:
    """llama-bench's prompt processing of n tokens (one repetition); ``extra``: more of its arguments (``-fa 1``)."""
    cmd = [binary, "-m", str(target), "-p", str(n), "-n", "0", "-t", str(threads), "-r", "1", "-o", "json"]
    cmd += list(extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    record = summarize_bench_record(parse_llama_bench_json(proc.stdout)[0])
    raw = record.pop("raw")
    record["settings"] = {k: raw.get(k) for k in ("n_batch", "n_ubatch", "type_k", "type_v", "flash_attn", "cpu_info")}
    record["command"] = " ".join(cmd)
    record["load_average"] = load_average()
    return record


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a .gguf file")
    ap.add_argument("--corpus", required=True, help="a text file the prompts are cut from")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1, help="runs per length (each program)")
    ap.add_argument("--precision", default="q8", choices=["q8", "exact"])
    ap.add_argument("--llama-bench", help="path of llama.cpp's llama-bench, to time it at the same lengths")
    ap.add_argument(
        "--llama-args", default="", help="more llama-bench arguments, quoted as one (e.g. '-fa 1' for flash attention)"
    )
    ap.add_argument("--no-specwise", action="store_true", help="time llama-bench only")
    ap.add_argument("--max-rows", type=int, help="rows per layer call of a prompt (default: the package's)")
    ap.add_argument("--engine", action="store_true", help="also time one Engine.generate per length")
    ap.add_argument(
        "--attention",
        type=int,
        nargs="*",
        default=[],
        metavar="POSITIONS",
        help="also time one layer's attention alone for a slice after each of these positions, tiled and per row",
    )
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    header = script_header(argv)
    header["lscpu"] = lscpu()

    from specwise.models import load_model

    if args.max_rows:  # a prompt's slices: the layer kernel's buffers are sized from this when the model loads
        import specwise.models.kernels.layers as layers
        import specwise.models.kernels.quant as quant
        import specwise.models.quantized as quantized

        quant.MAX_ROWS = layers.MAX_ROWS = quantized.MAX_ROWS = args.max_rows

    set_num_threads(args.threads)
    target = Path(args.target)
    loaded = load_model(str(target), precision=args.precision)
    model = loaded.model
    model.governor.set_fixed(True)  # every pass on --threads threads, as llama-bench -t runs (no switch to one)
    ids = corpus_tokens(loaded.tokenizer, Path(args.corpus), max(args.lengths))
    from specwise.models.kernels.quant import MAX_ROWS, isa

    alone = []
    for positions in args.attention:
        entry = {"positions": positions, "rows": MAX_ROWS}
        for half in (False, True):
            cache = "float16" if half else "float32"
            per_row = attention_alone(model._stack, positions, MAX_ROWS, 0, 3, half)
            tiled = attention_alone(model._stack, positions, MAX_ROWS, 1, 3, half)
            entry[cache] = {"per_row_cpu_s": per_row, "tiled_cpu_s": tiled, "ratio": tiled / per_row}
            print(f"attention after {positions}, {cache}: tiled {tiled / per_row:.2f}x the per-row loops", flush=True)
        alone.append(entry)

    results = []
    for n in args.lengths:
        entry: dict = {"tokens": n, "specwise": [], "llama_bench": []}
        for _ in range(args.repeats):
            if not args.no_specwise:
                entry["specwise"].append(specwise_slices(model, ids[:n], MAX_ROWS))
                print(f"{n} tokens: specwise {entry['specwise'][-1]['tokens_per_s']:.1f} tok/s", flush=True)
            if args.llama_bench:
                extra = shlex.split(args.llama_args)
                entry["llama_bench"].append(llama_bench_prefill(args.llama_bench, target, n, args.threads, extra))
                print(f"{n} tokens: llama-bench {entry['llama_bench'][-1]['tokens_per_s']:.1f} tok/s", flush=True)
        if args.engine:
            entry["specwise_engine"] = specwise_engine(model, ids[:n])
        if entry["specwise"]:
            rates = [r["tokens_per_s"] for r in entry["specwise"]]
            best_slices = [min(s) for s in zip(*(r["slice_seconds"] for r in entry["specwise"]))]
            entry["specwise_tokens_per_s"] = {
                "median": statistics.median(rates),
                "best": max(rates),
                "slice_best": n / sum(best_slices),
                "per_cpu_second": max(r["tokens_per_cpu_s"] for r in entry["specwise"]),
            }
        if entry["llama_bench"]:
            rates = [r["tokens_per_s"] for r in entry["llama_bench"]]
            entry["llama_bench_tokens_per_s"] = {"median": statistics.median(rates), "best": max(rates)}
        if entry["llama_bench"] and entry["specwise"]:
            entry["ratio"] = {
                "median": entry["specwise_tokens_per_s"]["median"] / entry["llama_bench_tokens_per_s"]["median"],
                "best": entry["specwise_tokens_per_s"]["best"] / entry["llama_bench_tokens_per_s"]["best"],
            }
        results.append(entry)
    header["machine"]["load_average_end"] = load_average()
    result = {
        **header,
        "target": target.name,
        "corpus": Path(args.corpus).name,
        "precision": args.precision,
        "threads": args.threads,
        "max_rows": MAX_ROWS,
        "kernel_isa": isa(),
        "lengths": results,
        "attention_alone": alone,
        "summary": {
            str(e["tokens"]): {
                k: e[k] for k in ("specwise_tokens_per_s", "llama_bench_tokens_per_s", "ratio") if k in e
            }
            for e in results
        },
    }
    emit_json(result, args.out)


if __name__ == "__main__":
    main()
