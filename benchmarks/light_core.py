"""The core install against an older one, side by side: start-up to the first token, peak resident memory and
decoding speed of ``specwise generate`` from the command line, in fresh processes.

A side is an interpreter and, optionally, a source tree put first on its path (a checkout with its kernels built in
place: ``python setup.py build_ext --inplace``). Each round runs both sides once, in alternating order; speed ratios
are paired per prompt and round (new over old) with a 95% interval on their geometric mean. Greedy answers of the
two sides are compared token for token. Peak resident memory is the child's own (``wait4``'s ``ru_maxrss``).

    python benchmarks/light_core.py --old-python .venv/bin/python --old-tree /tmp/old \\
        --new-python .venv-core/bin/python --model default --model ~/.cache/specwise/gguf/gemma-3-270m.gguf \\
        --rounds 5 --out benchmarks/results/light_core.json

``--env DIR`` (repeatable) adds the size on disk of virtual environments; ``--install`` times ``pip install`` of
this checkout into a fresh virtual environment (the core alone) and reports its size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specwise.lab.bench.environment import emit_json, script_header
from specwise.lab.bench.paired import geometric_interval

PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome, with a docstring and two examples.",
    "Explain in three short paragraphs why the sky is blue.",
    "List five tips for writing clear commit messages.",
    "Rewrite this sentence in the passive voice: The committee approved the new budget on Monday.",
)


class Side:
    """An interpreter, a source tree first on its path (or none) and a cache directory of its own (versions may keep
    their caches in different forms: a tokenizer cache one of them removes would be rebuilt at every other run)."""

    def __init__(self, name: str, python: str, tree: str | None, cache: str) -> None:
        self.name, self.python, self.tree, self.cache = name, os.path.abspath(python), tree, cache

    def env(self, cache: str | None = None) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if self.tree:
            env["PYTHONPATH"] = str(Path(self.tree).resolve())
        env["SPECWISE_CACHE"] = cache or self.cache
        return env


def _run(side: Side, args: list[str], cache: str | None = None) -> tuple[float, int, dict]:
    """One ``specwise generate`` process of ``side`` (launched and reaped here, so that its rusage is its own)."""
    cmd = [side.python, "-m", "specwise", "generate", *args, "--json"]
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, env=side.env(cache), cwd="/", stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{side.name}: {' '.join(cmd)} failed:\n{err.read()[-2000:]}")
        return wall, usage.ru_maxrss, json.loads(out.read().strip().splitlines()[-1])


def startup(sides: list[Side], model: str, rounds: int, cold: bool) -> dict:
    """Seconds from launch to exit of a one-token answer, and peak resident memory; ``cold``: an empty cache each
    time (the tokenizer built from the file)."""
    args = ["Hi", "--target", model, "--max-new-tokens", "1", "--drafter", "none"]
    rows: dict[str, list] = {s.name: [] for s in sides}
    if not cold:
        for s in sides:
            _run(s, args)  # fill the caches
    for r in range(rounds):
        for s in sides if r % 2 == 0 else sides[::-1]:
            with tempfile.TemporaryDirectory() as cache:
                wall, rss, _ = _run(s, args, cache if cold else None)
            rows[s.name].append({"seconds": wall, "rss_mib": rss / 1024})
    return {
        name: {
            "median_seconds": statistics.median(x["seconds"] for x in xs),
            "median_rss_mib": statistics.median(x["rss_mib"] for x in xs),
            "runs": xs,
        }
        for name, xs in rows.items()
    }


def decode(sides: list[Side], model: str, drafter: str, rounds: int, max_new: int, precision: str = "q8") -> dict:
    """Tokens per second of greedy answers (the engine's own count), paired per prompt and round; greedy answers
    compared token for token."""
    pairs, runs, same = [], [], True
    for r in range(rounds):
        for i, prompt in enumerate(PROMPTS):
            args = [prompt, "--target", model, "--max-new-tokens", str(max_new), "--drafter", drafter]
            args += ["--precision", precision]
            got = {}
            for s in sides if (r + i) % 2 == 0 else sides[::-1]:
                wall, rss, answer = _run(s, args)
                got[s.name] = answer
                runs.append(
                    {
                        "side": s.name,
                        "prompt": i,
                        "round": r,
                        "tokens_per_second": answer["stats"]["tokens_per_second"],
                        "new_tokens": answer["stats"]["new_tokens"],
                        "rss_mib": rss / 1024,
                        "wall_seconds": wall,
                    }
                )
            old, new = got[sides[0].name], got[sides[1].name]
            same = same and old["token_ids"] == new["token_ids"]
            pairs.append(new["stats"]["tokens_per_second"] / old["stats"]["tokens_per_second"])
    medians = {s.name: statistics.median(x["tokens_per_second"] for x in runs if x["side"] == s.name) for s in sides}
    peak = {s.name: max(x["rss_mib"] for x in runs if x["side"] == s.name) for s in sides}
    return {
        "drafter": drafter,
        "precision": precision,
        "median_tokens_per_second": medians,
        "peak_rss_mib": peak,
        "ratio_new_over_old": geometric_interval(pairs),
        "greedy_identical": same,
        "runs": runs,
    }


def du_mib(path: Path) -> float:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) / 1024


def fresh_install(repo: Path) -> dict:
    """``pip install`` of ``repo`` (the core alone, no extras) into a new virtual environment: seconds and size."""
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        empty = du_mib(venv)
        t = time.perf_counter()
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "-c", str(repo / "constraints.txt"), str(repo)],
            check=True,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
        seconds = time.perf_counter() - t
        listing = subprocess.run(
            [str(venv / "bin" / "pip"), "list", "--format=json"], capture_output=True, text=True, check=True
        ).stdout
        probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch"], capture_output=True)
        torch = probe.returncode == 0
        return {
            "seconds": seconds,
            "venv_mib": du_mib(venv),
            "empty_venv_mib": empty,
            "packages": sorted(p["name"] for p in json.loads(listing)),
            "torch_importable": torch,
        }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-python", required=True)
    ap.add_argument("--old-tree")
    ap.add_argument("--new-python", required=True)
    ap.add_argument("--new-tree")
    ap.add_argument("--model", action="append", default=[], help="default, or a .gguf path (repeatable)")
    ap.add_argument("--drafter", action="append", default=[], help="drafters of the speed runs (default: none)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--start-rounds", type=int, default=7)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--exact", action="append", default=[], help="models to decode with --precision exact too (repeatable)"
    )
    ap.add_argument("--env", action="append", default=[], help="a virtual environment to size (repeatable)")
    ap.add_argument("--install", action="store_true", help="time a fresh core install of this checkout")
    ap.add_argument("--install-only", action="store_true", help="only the sizes and the fresh install: no model runs")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    caches = tempfile.TemporaryDirectory()
    sides = [
        Side("old", args.old_python, args.old_tree, os.path.join(caches.name, "old")),
        Side("new", args.new_python, args.new_tree, os.path.join(caches.name, "new")),
    ]
    result: dict = {**script_header(argv), "sides": {s.name: {"python": s.python, "tree": s.tree} for s in sides}}
    result["envs_mib"] = {env: du_mib(Path(env)) for env in args.env}
    if args.install or args.install_only:
        result["fresh_install"] = fresh_install(Path(__file__).resolve().parents[1])
    result["models"] = {}
    for model in [] if args.install_only else args.model or ["default"]:
        cell: dict = {}
        if model.endswith(".gguf"):
            cell["file_mib"] = Path(model).stat().st_size / 2**20
        cell["start_cached"] = startup(sides, model, args.start_rounds, cold=False)
        if model == "default":
            cell["start_cold"] = startup(sides, model, max(3, args.start_rounds // 2), cold=True)
        cell["decode"] = [
            decode(sides, model, drafter, args.rounds, args.max_new_tokens) for drafter in args.drafter or ["none"]
        ]
        if model in args.exact:
            cell["decode"].append(decode(sides, model, "none", args.rounds, args.max_new_tokens, "exact"))
        result["models"][model] = cell
        print(f"{model}: done", file=sys.stderr)
    emit_json(result, args.out)


if __name__ == "__main__":
    main()
