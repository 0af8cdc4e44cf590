"""Coding-assistant workloads for ``specwise bench --workload``: code edits, fill-in-the-middle and agent
conversations, cut from CPython's standard library source (see README.md in this folder), sent to OpenAI-compatible
servers; and agents' recorded requests, replayed (``agent-traces``: the traces are the user's, read by ``traces.py``).

:func:`load_items` reads a workload's shipped items (checked); :func:`workload_requests` turns them into the
requests a client sends, one per code edit, per FIM cut, and per assistant turn of an agent trace (the history so
far, ending where the assistant speaks).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DATA_DIR", "TRACES", "WORKLOADS", "Request", "load_items", "workload_requests"]

DATA_DIR = Path(__file__).parent
WORKLOADS = {"code-edit": "code_edit.jsonl", "fim": "fim.jsonl", "agent": "agent.jsonl"}  # the shipped ones
TRACES = "agent-traces"  # recorded requests, from folders the user names (--traces)
_ROLES = {"system", "user", "assistant", "tool"}


@dataclass(frozen=True)
class Request:
    """One request of a workload: a chat (``messages``, ``tools``), a FIM completion (``prefix``, ``suffix``), or
    a recorded request (``route``, ``body``: an agent's turn as it sent it).

    ``prediction`` is what the client knows of the answer (the original code of an edit; the file a tool returned
    before an answer that quotes it), or None."""

    workload: str
    item_id: str
    turn: int
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None
    prediction: str | None = None
    prefix: str | None = None
    suffix: str | None = None
    route: str | None = None
    body: dict | None = None

    @property
    def id(self) -> str:
        return f"{self.item_id}#{self.turn}" if self.workload in ("agent", TRACES) else self.item_id

    @property
    def is_fim(self) -> bool:
        return self.prefix is not None


def _check_source(source: dict, where: str) -> None:
    for key in ("cpython", "path", "sha256"):
        if not isinstance(source.get(key), str) or not source[key]:
            raise ValueError(f"{where}: source.{key} must be a non-empty string")


def _check_messages(messages: list, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise ValueError(f"{where}: messages[{i}] needs a role among {sorted(_ROLES)}")
        if m["role"] == "assistant" and not (m.get("content") or m.get("tool_calls")):
            raise ValueError(f"{where}: messages[{i}] (assistant) has neither content nor tool_calls")
        if m["role"] == "tool" and not (isinstance(m.get("content"), str) and m.get("tool_call_id")):
            raise ValueError(f"{where}: messages[{i}] (tool) needs content and tool_call_id")


def _check(workload: str, item: dict, where: str) -> None:
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        raise ValueError(f"{where}: each item must be an object with a string id")
    if workload == "code-edit":
        _check_source(item.get("source", {}), where)
        if not isinstance(item.get("original"), str) or not item["original"]:
            raise ValueError(f"{where}: original must be a non-empty string")
        _check_messages(item.get("messages"), where)
    elif workload == "fim":
        _check_source(item.get("source", {}), where)
        if not all(isinstance(item.get(k), str) for k in ("prefix", "middle", "suffix")) or not item["middle"]:
            raise ValueError(f"{where}: prefix, middle and suffix must be strings, the middle non-empty")
        joined = (item["prefix"] + item["middle"] + item["suffix"]).encode()
        if hashlib.sha256(joined).hexdigest() != item.get("span_sha256"):
            raise ValueError(f"{where}: prefix + middle + suffix does not give the recorded span (span_sha256)")
    else:
        for source in item.get("sources", []):
            _check_source(source, where)
        _check_messages(item.get("messages"), where)
        if not isinstance(item.get("tools"), list) or not item["tools"]:
            raise ValueError(f"{where}: tools must be a non-empty list of function schemas")


def load_items(workload: str, path: Path | str | None = None) -> list[dict]:
    """The items of ``workload`` (``code-edit``, ``fim`` or ``agent``): the shipped file, or ``path``; each one
    checked, errors naming the file and line."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}: use one of {', '.join(WORKLOADS)}")
    file = Path(path) if path is not None else DATA_DIR / WORKLOADS[workload]
    items = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            item = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{where}: not JSON ({err})") from None
        _check(workload, item, where)
        items.append(item)
    if not items:
        raise ValueError(f"{file}: no items")
    return items


def _agent_requests(trace: dict) -> list[Request]:
    """A request at each assistant message: the history before it. An answer after a tool result predicts that
    result (the answers quote it)."""
    requests, messages = [], trace["messages"]
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = messages[:i]
        quoting = message.get("content") and before[-1]["role"] == "tool"
        prediction = before[-1]["content"] if quoting else None
        requests.append(Request("agent", trace["id"], len(requests), before, trace["tools"], prediction))
    return requests


def workload_requests(workload: str, limit: int | None = None, path: Path | str | None = None) -> list[Request]:
    """The requests of ``workload``'s first ``limit`` items (all by default): code edits predict their original."""
    items = load_items(workload, path)[:limit]
    if workload == "code-edit":
        return [Request(workload, it["id"], 0, it["messages"], prediction=it["original"]) for it in items]
    if workload == "fim":
        return [Request(workload, it["id"], 0, prefix=it["prefix"], suffix=it["suffix"]) for it in items]
    return [r for trace in items for r in _agent_requests(trace)]
