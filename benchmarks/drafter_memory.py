"""Peak resident memory of `specwise generate` per drafter, each run in a process of its own (GNU time's maximum
resident set size), so that what a drafter adds to a target shows beside plain decoding.

    python benchmarks/drafter_memory.py --target gemma-3-270m-Q4_K_M.gguf --drafters none auto self ngram \\
        --runs 3 --out benchmarks/results/drafter_memory_gemma270m.json

Needs GNU time (`apt-get install time`). Reports the median over ``--runs`` of each drafter's peak, in MiB, and its
ratio to the first drafter's (the baseline).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

PROMPT = "Write a haiku about the sea."


def peak_mib(target: str, drafter: str, tokens: int, specwise: str) -> float:
    cmd = ["/usr/bin/time", "-v", specwise, "generate", PROMPT, "--target", target, "--drafter", drafter]
    cmd += ["--max-new-tokens", str(tokens), "--no-chat"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    if found is None:
        raise RuntimeError("GNU time printed no maximum resident set size")
    return int(found.group(1)) / 1024


def cpu() -> str:
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if "Model name" in line), "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafters", nargs="+", default=["none", "auto"])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--specwise", default=shutil.which("specwise") or "specwise")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = {d: [peak_mib(args.target, d, args.tokens, args.specwise) for _ in range(args.runs)] for d in args.drafters}
    base = statistics.median(runs[args.drafters[0]])
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cpu": cpu(),
        "peak_mib": {d: round(statistics.median(r), 1) for d, r in runs.items()},
        "runs_mib": {d: [round(x, 1) for x in r] for d, r in runs.items()},
        "ratio_to_first": {d: round(statistics.median(r) / base, 3) for d, r in runs.items()},
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
