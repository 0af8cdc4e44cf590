"""How long small torch operations take right after a quantized target pass, against the same operations in a loop.

Question: what does interpreted work cost right after a pass, which streams the weights through the CPU's caches?
Answer: 40–220 µs for a torch call that takes 2–11 µs in a loop (benchmarks/results/cold_ops_default.json). This
is why a decoding step runs in one native call and the step around it avoids tensors (docs/ENGINE.md).

    python benchmarks/experiments/cold_ops.py --out benchmarks/results/cold_ops_default.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from specwise.lab.bench.runner import emit_json, machine_info
from specwise.models.loader import load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="default")
    ap.add_argument("--passes", type=int, default=60)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = load_model(args.target).model
    hidden = model.hidden
    model.forward(torch.arange(64))
    x, w = torch.randn(3, hidden), torch.randn(hidden)
    ops = {
        "rms_norm of 3 rows": lambda: torch.nn.functional.rms_norm(x, (hidden,), w, 1e-5),
        "add": lambda: x + 1,
        "empty": lambda: torch.empty(3, model.vocab_size),
        "index by a list": lambda: x[[1, 2]],
        "cat": lambda: torch.cat([x, x]),
        "tensor of one id": lambda: torch.tensor([5]),
        "argmax": lambda: x.argmax(-1),
    }
    rows = {}
    for name, op in ops.items():
        first, second, loop = [], [], []
        for _ in range(args.passes):
            model.forward(torch.tensor([5]))
            model.rollback(64)
            t0 = time.perf_counter()
            op()
            t1 = time.perf_counter()
            op()
            t2 = time.perf_counter()
            first.append(t1 - t0)
            second.append(t2 - t1)
        for _ in range(args.passes):
            t0 = time.perf_counter()
            op()
            loop.append(time.perf_counter() - t0)
        rows[name] = {
            "first_after_a_pass_us": statistics.median(first) * 1e6,
            "second_after_a_pass_us": statistics.median(second) * 1e6,
            "in_a_loop_us": statistics.median(loop) * 1e6,
        }
        print(name, " ".join(f"{k} {v:.1f}" for k, v in rows[name].items()), file=sys.stderr, flush=True)
    result = {"command": " ".join(sys.argv), "machine": machine_info("cpu"), "medians": rows}
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
