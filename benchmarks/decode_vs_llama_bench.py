"""Plain decoding of a GGUF file by specwise (``q8``, and ``exact`` with ``--precisions``) and by llama.cpp's
``llama-bench``, side by side, at several context depths; and specwise's start-up and resident memory on the file.

For files that ``llama-completion`` / ``llama-server`` of the built llama.cpp cannot run (``specwise bench
--llama-cpp`` needs them), ``llama-bench`` still times the same passes: ``-n N -d DEPTH`` decodes N tokens after
DEPTH tokens of context. specwise decodes N tokens after DEPTH random tokens of context (the pass after the prompt
only, as llama-bench's tg). The rounds alternate them, one run each; medians and the median paired ratios.

    python benchmarks/decode_vs_llama_bench.py --target gemma.gguf --depths 0 512 --rounds 5 --out out.json
    python benchmarks/decode_vs_llama_bench.py --target default --depths 2048 --new-tokens 64 --precisions q8 exact
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from specwise.engine import Engine
from specwise.lab.bench.llamacpp import llama_bench
from specwise.lab.bench.runner import emit_json, script_header
from specwise.models.threads import set_num_threads
from specwise.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
_STARTUP = (
    "import time\nt = time.perf_counter()\nfrom specwise.models import load_model\nload_model({path!r})\n"
    "print(time.perf_counter() - t)\n"
)


def specwise_rate(model, depth: int, n: int) -> float:
    """Decode tokens/s of n tokens after depth random tokens of context (the prompt's pass left out)."""
    ids = np.random.default_rng(depth).integers(100, model.vocab_size - 100, max(1, depth))
    stats = Engine(model, None, gamma=0).generate(ids.tolist(), GREEDY, max_new_tokens=n, eos_token_ids=[]).stats
    return stats.new_tokens / (stats.total_seconds - stats.prefill_seconds)


def startup(path: Path, runs: int = 3) -> list[float]:
    """Seconds to a loaded model (tokenizer cached), each in a fresh process."""
    out = []
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-c", _STARTUP.format(path=str(path))], capture_output=True, text=True, check=True
        )
        out.append(float(proc.stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="default", help="default or a .gguf file")
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 512])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precisions", nargs="+", default=["q8"], choices=["q8", "exact"], help="specwise's numerics")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from specwise.models import load_model
    from specwise.models.loader import gguf_source

    try:
        gguf = gguf_source(args.target)
    except FileNotFoundError as err:
        raise SystemExit(f"error: {err}: give --target default or a .gguf file") from None
    if gguf is None:
        raise SystemExit(f"error: --target {args.target}: give default or a .gguf file")
    args.target = Path(gguf)

    set_num_threads(args.threads)
    launch = startup(args.target)
    models = {p: load_model(str(args.target), precision=p).model for p in args.precisions}
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the first precision's load sets the peak
    model = models[args.precisions[0]]
    for m in models.values():
        specwise_rate(m, 0, 8)  # warm up
    results = {}
    for depth in args.depths:
        rows = []
        for _ in range(args.rounds):
            ours = {p: specwise_rate(m, depth, args.new_tokens) for p, m in models.items()}
            peer = llama_bench(args.target, n_gen=args.new_tokens, threads=args.threads, depth=depth, repetitions=1)
            rows.append({"specwise": ours[args.precisions[0]], **{f"specwise_{p}": v for p, v in ours.items()},
                         "llama_cpp": peer["tokens_per_s"], "llama_bench": peer})  # fmt: skip
        results[str(depth)] = {
            "rounds": rows,
            "specwise_median": statistics.median(r["specwise"] for r in rows),
            "llama_cpp_median": statistics.median(r["llama_cpp"] for r in rows),
            "ratio_median": statistics.median(r["specwise"] / r["llama_cpp"] for r in rows),
            **{
                f"ratio_median_{p}": statistics.median(r[f"specwise_{p}"] / r["llama_cpp"] for r in rows)
                for p in args.precisions
            },
        }
    emit_json(
        {
            **script_header(argv),
            "target": str(args.target),
            "file_mb": args.target.stat().st_size / 1e6,
            "startup_s": launch,
            "max_rss_mb_after_load": rss_mb,
            "weight_mb": model.weight_bytes / 1e6,
            "new_tokens": args.new_tokens,
            "by_depth": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
