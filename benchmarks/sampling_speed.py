"""Time the sampling path per step: shaping p from logits and drawing a token, over the real vocabulary size.

Compares the engine's functions with the straightforward alternatives they replaced (``torch.multinomial`` for
drawing, a full sort for top-p), interleaved, median of many repeats. Example (the committed run):

    python benchmarks/sampling_speed.py --out benchmarks/results/sampling_speed.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from specwise.sampling import SamplingParams, probs_from_logits, sample


def full_sort_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The nucleus filter with a sort of the whole vocabulary (what the engine did before)."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    probs = probs.masked_fill(drop, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152, help="vocabulary size (default: SmolLM2's 49152)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 5], help="positions per step (k + 1)")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    results = []
    for rows in args.rows:
        # logits shaped like a language model's: a few likely tokens over a long tail
        logits = torch.randn(rows, args.vocab, generator=gen) * 2.5
        t1 = SamplingParams(temperature=1.0)
        nucleus = SamplingParams(temperature=1.0, top_p=0.9)
        probs = probs_from_logits(logits, t1)
        unfiltered = torch.softmax(logits, dim=-1)
        case = {
            "rows": rows,
            "ms": {  # each function is timed at once, on this iteration's tensors
                "probs_t1": timed(partial(probs_from_logits, logits, t1), args.repeats),
                "probs_top_p_0.9": timed(partial(probs_from_logits, logits, nucleus), args.repeats),
                "probs_top_p_0.9_full_sort": timed(partial(full_sort_top_p, unfiltered, 0.9), args.repeats),
                "sample_inverse_cdf": timed(partial(sample, probs, gen), args.repeats),
                "sample_multinomial": timed(partial(torch.multinomial, probs, 1, generator=gen), args.repeats),
            },
        }
        # the two top-p implementations agree (no ties in random logits)
        same = torch.equal(probs_from_logits(logits, nucleus) > 0, full_sort_top_p(unfiltered, 0.9) > 0)
        case["top_p_support_equal"] = bool(same)
        results.append(case)
        print(json.dumps(case))
    out = {
        "command": "python benchmarks/sampling_speed.py " + " ".join(f"--out {args.out}".split()),
        "vocab": args.vocab,
        "threads": args.threads,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
