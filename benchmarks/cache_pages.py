"""The KV cache on small (4 KB) pages, as it is kept, against the same cache asked to be on 2 MB huge pages
(``madvise(MADV_HUGEPAGE)`` on its mapping, what earlier versions did for caches of 2,048 positions or more).

Each run loads the target, reserves the cache's room for an N-token prompt as the engine does, reads the prompt in
slices of ``MAX_ROWS`` rows (each slice timed), then times 16 one-token decoding steps after it. Runs alternate
between the two ways, each in a process of its own (a fresh process's memory, as a server's first long prompt
finds it), ``--rounds`` times. Reported per run: the prompt's total seconds, its slowest slice, the seconds of its
first and last quarters of slices (the last quarter is where attention over the long cache weighs most), and the
median decoding step; per way the medians over rounds. The JSON also holds the command, the machine (``lscpu``'s
model name and flags) and the load averages.

    python benchmarks/cache_pages.py --target qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --corpus tinyshakespeare.txt --lengths 4096 8192 --rounds 2 --out cache_pages.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefill_lengths import corpus_tokens, lscpu  # noqa: E402

from specwise.lab.bench.environment import emit_json, load_average, script_header  # noqa: E402

STEPS = 16


def one_run(target: str, corpus: str, n: int, huge: bool, threads: int) -> dict:
    """One prompt of ``n`` tokens and 16 decoding steps in this process (``huge``: the cache on huge pages)."""
    import specwise.models.quantized as quantized
    from specwise.models import load_model
    from specwise.models.kernels.quant import MAX_ROWS
    from specwise.models.threads import set_num_threads

    if huge:
        plain = quantized.lazy_empty

        def huge_empty(shape, dtype):  # the keys' and values' caches ([layers, heads, positions, width]) only
            array = plain(shape, dtype)
            mapping = array.base
            while mapping is not None and not isinstance(mapping, mmap.mmap):
                mapping = getattr(mapping, "base", None) or getattr(mapping, "obj", None)
            if len(shape) == 4 and isinstance(mapping, mmap.mmap):
                with contextlib.suppress(OSError):
                    mapping.madvise(mmap.MADV_HUGEPAGE)
            return array

        quantized.lazy_empty = huge_empty
    set_num_threads(threads)
    loaded = load_model(target, precision="q8")
    model = loaded.model
    model.governor.set_fixed(True)
    ids = corpus_tokens(loaded.tokenizer, Path(corpus), n + STEPS)
    model.reserve(n + STEPS + 1)
    slices = []
    for lo in range(0, n, MAX_ROWS):
        began = time.perf_counter()
        model.forward(ids[lo : min(lo + MAX_ROWS, n)], num_logits=0)
        slices.append(time.perf_counter() - began)
    steps = []
    for i in range(STEPS):
        began = time.perf_counter()
        model.forward(ids[n + i : n + i + 1], num_logits=1)
        steps.append(time.perf_counter() - began)
    quarter = max(1, len(slices) // 4)
    return {
        "tokens": n,
        "cache_pages": "huge" if huge else "small",
        "prompt_seconds": sum(slices),
        "slowest_slice_seconds": max(slices),
        "first_quarter_seconds": sum(slices[:quarter]),
        "last_quarter_seconds": sum(slices[-quarter:]),
        "decode_step_seconds_median": statistics.median(steps),
        "slice_seconds": slices,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a .gguf file")
    ap.add_argument("--corpus", required=True, help="a text file the prompts are cut from")
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--one", nargs=2, metavar=("N", "WAY"), help=argparse.SUPPRESS)  # a child's run
    args = ap.parse_args(argv)
    if args.one:
        n, way = int(args.one[0]), args.one[1]
        print(json.dumps(one_run(args.target, args.corpus, n, way == "huge", args.threads)))
        return
    header = script_header(argv)
    header["lscpu"] = lscpu()
    header["load_average_start"] = load_average()
    runs = []
    for n in args.lengths:
        for _ in range(args.rounds):
            for way in ("small", "huge"):
                child = [sys.executable, __file__, "--target", args.target, "--corpus", args.corpus]
                child += ["--threads", str(args.threads), "--one", str(n), way]
                out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
                runs.append(json.loads(out.strip().splitlines()[-1]))
                r = runs[-1]
                print(
                    f"{n} {way}: prompt {r['prompt_seconds']:.1f} s, slowest slice {r['slowest_slice_seconds']:.2f} "
                    f"s, last quarter {r['last_quarter_seconds']:.1f} s, decode step "
                    f"{r['decode_step_seconds_median']:.4f} s",
                    flush=True,
                )
    summary = {}
    for n in args.lengths:
        for way in ("small", "huge"):
            mine = [r for r in runs if r["tokens"] == n and r["cache_pages"] == way]
            keys = ("prompt_seconds", "slowest_slice_seconds", "last_quarter_seconds", "decode_step_seconds_median")
            summary[f"{n}_{way}"] = {key: statistics.median(r[key] for r in mine) for key in keys}
    header["load_average_end"] = load_average()
    emit_json({**header, "runs": runs, "summary": summary}, args.out)


if __name__ == "__main__":
    main()
