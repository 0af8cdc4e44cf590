"""Agent traces for ``specwise bench --workload agent-traces``: requests recorded from coding agents, replayed turn
by turn, and what each configuration did with each trace.

A trace is a folder of recorded turns, ``000.json``, ``001.json``, ... in the order the agent sent them, each
``{"route": ..., "body": ...}`` with the body exactly as the agent sent it (its system prompt, tool schemas, the
conversation so far and its tool results). The traces are not shipped with the package: specwise's repository keeps
some in ``benchmarks/traces/`` (opencode, qwen-code and Codex; their README names the sources and licences), and
``benchmarks/agents_e2e.py --trace-dir`` records more.

:func:`find_traces` reads and checks them; :func:`trace_requests` makes one request per turn (sent by
:func:`specwise.lab.bench.workloads.client.replay`); :func:`trace_summary` gathers a run's figures per trace: each
turn's time to first token, time, decode rate, prompt and cached tokens, and the trace's total time.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from specwise.lab.bench.workloads import TRACES, Request

__all__ = ["ROUTES", "find_traces", "trace_requests", "trace_summary", "warmup_request"]

ROUTES = ("/v1/chat/completions", "/v1/messages", "/v1/responses")  # the APIs the agents speak
_CHAT = "/v1/chat/completions"


def _check_turn(turn, where: str) -> None:
    if not isinstance(turn, dict) or turn.get("route") not in ROUTES:
        raise ValueError(f'{where}: a recorded turn is {{"route": one of {", ".join(ROUTES)}, "body": {{...}}}}')
    body = turn.get("body")
    key = "input" if turn["route"] == "/v1/responses" else "messages"
    if not isinstance(body, dict) or not body.get(key):
        raise ValueError(f"{where}: the body of a {turn['route']} turn needs its {key!r}")


def load_trace(folder: Path | str) -> list[dict]:
    """The turns of one trace folder, in the order of their file names, each checked (errors name the file)."""
    files = sorted(Path(folder).glob("*.json"))
    if not files:
        raise ValueError(f"{folder}: no recorded turns (000.json, 001.json, ...)")
    turns = []
    for file in files:
        try:
            turn = json.loads(file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"{file}: not JSON ({err})") from None
        _check_turn(turn, str(file))
        turns.append(turn)
    return turns


def find_traces(paths: list[str] | list[Path]) -> dict[str, list[dict]]:
    """The traces under ``paths``, by folder name: each path is a trace (a folder of turns) or a folder of traces
    (its sub-folders holding turns, in name order)."""
    traces: dict[str, list[dict]] = {}
    for path in map(Path, paths):
        if not path.is_dir():
            raise FileNotFoundError(f"--traces: {path} is not a folder of recorded traces")
        folders = [path] if any(path.glob("*.json")) else sorted(p for p in path.iterdir() if any(p.glob("*.json")))
        if not folders:
            raise ValueError(f"--traces: {path} holds no trace (folders of 000.json, 001.json, ...)")
        for folder in folders:
            if folder.name in traces:
                raise ValueError(f"--traces: two traces are named {folder.name!r}: trace folders need unique names")
            traces[folder.name] = load_trace(folder)
    return traces


def trace_requests(paths: list[str] | list[Path], limit: int | None = None) -> list[Request]:
    """One request per recorded turn of the first ``limit`` traces (all by default), in order."""
    traces = list(find_traces(paths).items())[:limit]
    return [
        Request(TRACES, name, i, route=turn["route"], body=turn["body"])
        for name, turns in traces
        for i, turn in enumerate(turns)
    ]


def warmup_request() -> Request:
    """A short chat to warm a server up with: a trace's own first turn would leave its prompt in the cache."""
    body = {"messages": [{"role": "user", "content": "Say hello."}]}
    return Request(TRACES, "warmup", 0, route=_CHAT, body=body)


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


_TURN_FIGURES = ("ttft_seconds", "seconds", "decode_tokens_per_second", "server_decode_tokens_per_second",
                 "prompt_tokens", "cached_tokens", "completion_tokens")  # fmt: skip


def _turn(turn: int, runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    entry = {"turn": turn, "route": runs[0].get("route"), "runs": len(runs), "errors": len(runs) - len(ok)}
    entry |= {name: _median([r.get(name) for r in ok]) for name in _TURN_FIGURES}
    if len(ok) < len(runs):
        entry["error"] = next(r["error"] for r in runs if "error" in r)
    return entry


def trace_summary(runs: list[dict], configs: list[str], plain_llama: str | None) -> list[dict]:
    """Per configuration and trace: each turn's medians over rounds and seeds (``_TURN_FIGURES``), ``total_seconds``
    (the sum of the measured turns' times), and, where ``plain_llama`` (llama.cpp's plain configuration) ran,
    ``vs_llama_cpp_plain``: the total over the turns both served ÷ llama.cpp plain's over the same turns."""
    chosen = [r for r in runs if r["workload"] == TRACES]
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for r in chosen:
        grouped[(r["config"], r["item_id"], r["turn"])].append(r)
    names = list(dict.fromkeys(r["item_id"] for r in chosen))
    entries = {}
    for config in configs:
        for name in names:
            keys = sorted(k for k in grouped if k[0] == config and k[1] == name)
            turns = [_turn(k[2], grouped[k]) for k in keys]
            if not turns:
                continue
            measured = [t["seconds"] for t in turns if t["seconds"] is not None]
            entries[(config, name)] = {
                "config": config,
                "trace": name,
                "turns": turns,
                "measured_turns": len(measured),
                "total_seconds": sum(measured) if measured else None,
                "vs_llama_cpp_plain": None,
                "shared_turns": 0,
            }
    for (config, name), entry in entries.items():
        theirs = entries.get((plain_llama, name))
        if theirs is None or config == plain_llama:
            continue
        other = {t["turn"]: t["seconds"] for t in theirs["turns"]}
        pairs = [(t["seconds"], other.get(t["turn"])) for t in entry["turns"]]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if pairs and sum(b for _, b in pairs) > 0:
            entry["vs_llama_cpp_plain"] = sum(a for a, _ in pairs) / sum(b for _, b in pairs)
            entry["shared_turns"] = len(pairs)
    return list(entries.values())
