"""Agent traces replayed through the servers: ``specwise bench --workload agent-traces`` (docs/BENCHMARKS.md, Agent
traces) with this script's options. Each recorded request of a coding agent's run (its system prompt, tool schemas,
tool results, turn by turn, as ``benchmarks/agents_e2e.py --trace-dir`` saved them) is sent in order to
``specwise serve`` (``--drafter``, and plain decoding with ``--plain``) and, with ``--llama-cpp``, to llama.cpp's
``llama-server`` on the same GGUF file; per turn the time to first token, the turn's time, the prompt and cached
tokens; per trace the total time and its ratio to llama-server's.

    python benchmarks/agent_traces.py --target qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --traces benchmarks/traces/opencode-read benchmarks/traces/qwen-read --llama-cpp --out /tmp/traces

writes ``results.json``, ``report.md`` and the plots into ``--out``, as ``specwise bench`` does. The traces in
``benchmarks/traces/`` were recorded from the agents named in their folder names (licences and versions in
``benchmarks/traces/README.md``).
"""

from __future__ import annotations

import argparse
import sys

from specwise.cli import main as specwise_main


def bench_arguments(argv: list[str] | None = None) -> list[str]:
    """This script's options as ``specwise bench`` arguments."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a .gguf file")
    ap.add_argument(
        "--traces", nargs="+", required=True, help="trace folders (000.json, 001.json, ...) or their parent"
    )
    ap.add_argument("--drafter", default="auto", help="specwise's configuration: auto, none, self, ngram+self")
    ap.add_argument("--plain", action="store_true", help="also specwise's plain decoding")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256, help="the most new tokens of a turn")
    ap.add_argument("--llama-cpp", nargs="?", const="", default=None, metavar="PATH", help="also llama-server")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", required=True, help="a folder for results.json, report.md and the plots")
    args = ap.parse_args(argv)
    configs = [f"specwise:{args.drafter}", *(["specwise:none"] if args.plain and args.drafter != "none" else [])]
    configs += [] if args.llama_cpp is None else ["llama.cpp:none"]
    out = ["bench", "--out", args.out, "--workload", "agent-traces", "--traces", *args.traces]
    out += ["--target", args.target, "--configs", *configs, "--threads", str(args.threads)]
    out += ["--max-new-tokens", str(args.max_tokens), "--rounds", str(args.rounds)]
    return out + ([] if args.llama_cpp is None else ["--llama-cpp", *([args.llama_cpp] if args.llama_cpp else [])])


if __name__ == "__main__":
    sys.exit(specwise_main(bench_arguments()))
