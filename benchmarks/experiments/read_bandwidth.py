"""How fast this machine reads memory on one thread and on two, quiet and beside one busy process.

Question: what is the ceiling of memory-bound decoding on a busy 2-core machine? Answer: beside one busy process
the best read is 0.47 of two quiet threads (quiet 18.3 GB/s on one thread, 34.2 on two; beside it 16.0 on one, 12.6
on two) (benchmarks/results/read_bandwidth.json; docs/FIGURES.md "A busy machine").

A 192 MB float32 matrix (larger than a model's pass, far larger than the private caches) times a vector (torch's
matrix-vector product, which reads the matrix once) on 1 and 2 threads, in alternating rounds, then again beside
one ``while True: pass`` process; GB/s is bytes over the median time. Decoding reads every weight once per token,
so one thread's share of two threads' speed bounds what decoding keeps when another process takes a core, and the
two-thread figure beside the busy process shows what a statically split read loses when one of its threads is
descheduled.

    python benchmarks/experiments/read_bandwidth.py --out benchmarks/results/read_bandwidth.json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

from specwise.lab.bench.runner import emit_json, machine_info

BUSY = "while True: pass"


def rates(a: torch.Tensor, rounds: int) -> dict[int, float]:
    v = torch.ones(a.shape[1])
    times: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(rounds):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            a.mv(v)
            start = time.perf_counter()
            a.mv(v)
            times[threads].append(time.perf_counter() - start)
    return {t: a.numel() * 4 / statistics.median(v) / 1e9 for t, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=192)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    x = torch.ones(args.mb * (1 << 20) // 4 // 4096, 4096)
    quiet = rates(x, args.rounds)
    busy_proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.5)
        busy = rates(x, args.rounds)
    finally:
        busy_proc.kill()
    result = {
        "command": " ".join(["python", *sys.argv]),
        "machine": machine_info("cpu"),
        "mb": args.mb,
        "quiet_gb_s": quiet,
        "busy_gb_s": busy,
        "one_over_two_quiet": quiet[1] / quiet[2],
        "busy_best_over_quiet_two": max(busy.values()) / quiet[2],
    }
    print(
        f"quiet: 1 thread {quiet[1]:.1f} GB/s, 2 threads {quiet[2]:.1f}; beside a busy process: 1 thread "
        f"{busy[1]:.1f}, 2 threads {busy[2]:.1f}; the best busy over quiet two threads "
        f"{result['busy_best_over_quiet_two']:.2f}",
        file=sys.stderr,
    )
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
