"""Cost of one drafted token of the shipped head drafter, by weight precision and layer path.

Variants, measured interleaved (``drafter_cost``: greedy proposals of 4 tokens on a repetitive synthetic context,
median seconds per drafted token): float32 weights with torch operators, float16 weights with torch operators,
float16 weights through the native layer kernel (the default on CPUs with the kernels).

    python benchmarks/head_cost.py --out benchmarks/results/head_cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

from specwise.drafters import make_drafter
from specwise.drafters.head import HeadDrafter
from specwise.models import load_model
from specwise.profile import drafter_cost


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/head_cost.json")
    args = ap.parse_args()
    loaded = load_model("default")
    head = make_drafter("head", loaded)[0].head
    target = loaded.model

    def variant(name: str) -> HeadDrafter:
        drafter = HeadDrafter(head, target, half_weights=name != "float32_torch")
        if name != "float16_layer_kernel":
            drafter._fused = None
        return drafter

    names = ["float32_torch", "float16_torch", "float16_layer_kernel"]
    ms: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:
            ms[name].append(1000 * drafter_cost(variant(name), target.vocab_size, target=target, repeats=9))
    result = {
        "command": "python " + " ".join(sys.argv),
        "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(), "torch": torch.__version__},
        "ms_per_drafted_token_median": {n: statistics.median(v) for n, v in ms.items()},
        "ms_per_drafted_token_rounds": ms,
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result["ms_per_drafted_token_median"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
