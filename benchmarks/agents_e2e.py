"""Real coding agents, headless, against `specwise serve`: does each one complete a small task, and which requests
of its does the server refuse?

Clients: Claude Code (Anthropic Messages, /v1/messages), Codex (OpenAI Responses, /v1/responses), and on chat
completions opencode, qwen-code, the Continue CLI and aider. Each runs in a fresh temporary folder (its own HOME)
on two tasks over a 2-line Python file:

    read: read util.py and name the function it defines   (completed: the answer names it)
    edit: rename that function in util.py                  (completed: the file names the new name, not the old)

Every request of the client passes through a recording proxy in this process, which forwards it to the server
and notes its route, status, time and, for a 4xx/5xx, the error message and an excerpt of the request body: the
protocol errors. The client's own output is scanned for HTTP errors too. Per client and task the JSON says
completed, protocol_errors, seconds (and the requests made, the client's exit status and its output's tail).

Not run in CI: it installs npm and PyPI packages (--install) and runs each agent for minutes.

    python benchmarks/agents_e2e.py --target default --install --out benchmarks/results/agents_e2e/default.json
    python benchmarks/agents_e2e.py --url http://127.0.0.1:8000 --clients aider,qwen
    python benchmarks/agents_e2e.py --target /root/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --timeout 1800
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import httpx

FILE = "util.py"
OLD, NEW = "greet_user", "welcome_user"
SOURCE = f'def {OLD}(name):\n    return "Hello, " + name\n'
TASKS = {
    "read": f"Read the file {FILE} in the current folder and tell me the name of the function it defines. "
    "Answer with the name only.",
    "edit": f"In the file {FILE} in the current folder, rename the function {OLD} to {NEW}. Edit the file.",
}
VENVS = Path("/root/agent-venvs")
EXCERPT = 600  # characters of a refused request's body kept in the report
CLIENT_CLOSED = 499  # the status noted for a request its client gave up on (as the server counts it)
HTTP_ERROR = re.compile(r"(?i)\b(?:status(?: code)?|http)[ :=]*([45]\d\d)\b|\b([45]\d\d) (?:bad request|error)")


@dataclass
class Client:
    """One coding agent: how to install it, the binary it puts on PATH and the API it speaks."""

    name: str
    binary: str
    api: str  # chat (/v1/chat/completions), messages (/v1/messages) or responses (/v1/responses)
    npm: str | None = None  # the npm package (global install)
    pip: str | None = None  # the PyPI package (in its own venv under VENVS)


CLIENTS = {
    "claude": Client("claude", "claude", "messages", npm="@anthropic-ai/claude-code"),
    "codex": Client("codex", "codex", "responses", npm="@openai/codex"),
    "opencode": Client("opencode", "opencode", "chat", npm="opencode-ai"),
    "qwen": Client("qwen", "qwen", "chat", npm="@qwen-code/qwen-code"),
    "continue": Client("continue", "cn", "chat", npm="@continuedev/cli"),
    "aider": Client("aider", "aider", "chat", pip="aider-chat"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="a running `specwise serve` (default: start one with --target)")
    p.add_argument("--target", default="default", help="the model `specwise serve` loads (without --url)")
    p.add_argument("--drafter", default="auto")
    p.add_argument("--threads", type=int, default=None, help="the server's threads (default: its own)")
    p.add_argument("--model", default="specwise", help="the served model name the clients ask for")
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=1024,
        help="the started server's budget for requests that give none (aider sends none; default 1024)",
    )
    p.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated, of {', '.join(CLIENTS)}")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per client and task (default 600)")
    p.add_argument("--context", type=int, default=None, help="the context the clients are told (default: /health)")
    p.add_argument("--install", action="store_true", help="install the missing clients (npm -g, pip in a venv)")
    p.add_argument("--keep", action="store_true", help="keep each run's folder (its path is in the report)")
    p.add_argument("--out", default=None, help="JSON file (default: print the JSON)")
    p.add_argument(
        "--trace-dir",
        default=None,
        help="save every request body of each run there, in order (a trace for benchmarks/agent_traces.py)",
    )
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------ installing clients


def binary(client: Client) -> str | None:
    """The client's executable, where installed."""
    if client.pip is not None:
        path = VENVS / client.name / "bin" / client.binary
        return str(path) if path.exists() else None
    return shutil.which(client.binary)


def install(client: Client) -> None:
    if binary(client) is not None:
        return
    if client.npm is not None:
        subprocess.run(["npm", "install", "-g", client.npm], check=True)
    else:
        venv = VENVS / client.name
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", client.pip], check=True)


def version(path: str) -> str | None:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:][0] if done.stdout or done.stderr else None


# ------------------------------------------------------------------------------------------ the recording proxy


@dataclass
class Exchange:
    """One request through the proxy."""

    method: str
    path: str
    label: str | None  # the run it belongs to (the client and task running when it came in)
    summary: dict  # the body's shape: fields, messages, tools, stream
    started: float = field(default_factory=time.perf_counter)
    status: int | None = None  # None: unanswered (still running when the run ended)
    seconds: float | None = None
    error: str | None = None  # the error message of a 4xx/5xx
    body_excerpt: str | None = None  # the start of a refused request's body


def summarize(body: bytes) -> dict:
    """What a request asked for, in a few fields (its size, keys, message and tool counts)."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return {"bytes": len(body), "json": False}
    if not isinstance(data, dict):
        return {"bytes": len(body)}
    out = {"bytes": len(body), "keys": sorted(data)}
    for key in ("messages", "input", "tools"):
        if isinstance(data.get(key), list):
            out[key] = len(data[key])
    for key in ("stream", "max_tokens", "max_completion_tokens", "max_output_tokens", "tool_choice"):
        if key in data:
            out[key] = data[key]
    return out


class RecordingProxy:
    """An HTTP proxy on 127.0.0.1 in a thread of this process: forwards every request to ``upstream`` (streamed
    answers streamed on) and records each exchange."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.lock = threading.Lock()
        self.label: str | None = None  # the run the requests coming in now belong to
        self.trace_dir: Path | None = None  # where each run's POST bodies are saved, in order (--trace-dir)

    def of(self, label: str) -> list[Exchange]:
        """The exchanges of run ``label``, answered or not (a request of a client stopped at its timeout may
        finish during the next run: it stays with its own)."""
        with self.lock:
            return [e for e in self.exchanges if e.label == label]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"host", b"content-length")]
        exchange = Exchange(scope["method"], path, self.label, summarize(body))
        with self.lock:
            self.exchanges.append(exchange)
            if self.trace_dir is not None and scope["method"] == "POST" and body:
                self._save(path, body)
        forward = asyncio.ensure_future(self._forward(scope, path, headers, body, send, exchange))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait([forward, gone], return_when=asyncio.FIRST_COMPLETED)
            if not forward.done():  # the client went away: so does the request to the server, which stops it
                forward.cancel()
                with contextlib.suppress(BaseException):
                    await forward
                exchange.status = exchange.status or CLIENT_CLOSED
                exchange.error = exchange.error or "the client closed the connection before the answer ended"
            elif forward.exception() is not None and exchange.status is None:  # the server went away
                err = forward.exception()
                exchange.status, exchange.error = 502, f"proxy: {type(err).__name__}: {err}"
        finally:
            gone.cancel()
            exchange.seconds = time.perf_counter() - exchange.started

    def _save(self, path: str, body: bytes) -> None:
        """The request as a trace's next turn: ``TRACE_DIR/<client>-<task>/<n>.json`` holding its route and body
        (``benchmarks/agent_traces.py`` replays them)."""
        client, task = (self.label or "unlabelled:run").split(":")[:2]
        folder = self.trace_dir / f"{client}-{task}"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            payload = json.loads(body)
        except ValueError:
            return
        n = len(list(folder.glob("*.json")))
        record = {"route": path.split("?")[0], "body": payload}
        (folder / f"{n:03d}.json").write_text(json.dumps(record, ensure_ascii=False, indent=1))

    async def _forward(self, scope, path: str, headers: list, body: bytes, send, exchange: Exchange) -> None:
        async with httpx.AsyncClient(timeout=None) as client:
            request = client.build_request(scope["method"], self.upstream + path, headers=headers, content=body)
            response = await client.send(request, stream=True)
            out_headers = [
                (k.encode(), v.encode())
                for k, v in response.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "content-encoding", "connection")
            ]
            await send({"type": "http.response.start", "status": response.status_code, "headers": out_headers})
            kept = b""
            async for chunk in response.aiter_raw():
                if response.status_code >= 400 and len(kept) < 8192:
                    kept += chunk
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            await response.aclose()
        if response.status_code >= 400:
            exchange.error = error_message(kept)
            exchange.body_excerpt = excerpt_at(body, error_param(kept))
        exchange.status = response.status_code


async def _disconnected(receive) -> None:
    """Return once the client has closed the connection (the request's body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def error_param(body: bytes) -> str | None:
    """The ``param`` of an error body (OpenAI's shape), or the field an Anthropic message names first."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    if not isinstance(error, dict):
        return None
    if error.get("param"):
        return error["param"]
    head = str(error.get("message", "")).split(":", 1)[0]
    return head if re.fullmatch(r"[\w.\[\]]+", head) else None


def excerpt_at(body: bytes, param: str | None) -> str:
    """The part of a refused request's body that ``param`` (``input[10].call_id``, ``messages.0.content``) names:
    the deepest element of its path that the body has, as JSON (else the body's start), EXCERPT characters."""
    try:
        node = json.loads(body)
    except ValueError:
        return body[:EXCERPT].decode("utf-8", "replace")
    path = re.findall(r"[^.\[\]]+", param or "")
    where = []
    for step in path:
        key = int(step) if step.isdigit() and isinstance(node, list) else step
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            break
        where.append(step)
    if not where:
        return body[:EXCERPT].decode("utf-8", "replace")
    return f"{'.'.join(where)}: {json.dumps(node)[:EXCERPT]}"


def error_message(body: bytes) -> str:
    """The message of an error body in OpenAI's or Anthropic's shape (else the body's start)."""
    try:
        data = json.loads(body)
        error = data.get("error", data)
        if isinstance(error, dict):
            return f"{error.get('type')}: {error.get('message')} (param {error.get('param')})"
    except (ValueError, AttributeError):
        pass
    return body[:EXCERPT].decode("utf-8", "replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def proxy(upstream: str) -> Iterator[tuple[str, RecordingProxy]]:
    import uvicorn

    app = RecordingProxy(upstream)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def specwise_server(args: argparse.Namespace, log: Path) -> Iterator[dict]:
    """`specwise serve` in its own process on a free port (its log in ``log``); yields its url and command."""
    port = free_port()
    command = [sys.executable, "-m", "specwise", "serve", "--target", args.target, "--drafter", args.drafter]
    command += ["--port", str(port), "--served-model-name", args.model]
    command += ["--default-max-tokens", str(args.default_max_tokens)]
    command += [] if args.threads is None else ["--threads", str(args.threads)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"`specwise serve` exited ({proc.returncode}): see {log}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"`specwise serve` did not start in 600 s: see {log}")
            time.sleep(1)
        yield {"url": url, "command": shlex.join(command), "log": str(log)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


# ------------------------------------------------------------------------------------ each client's invocation


@dataclass
class Setup:
    """What a run needs: the proxy's base URL, the model name, the context, and the run's folders."""

    base: str  # the proxy, no /v1
    model: str
    context: int
    timeout_ms: int  # the clients' own request timeouts: a long first prompt is minutes of prefill on a CPU
    work: Path  # the project folder (util.py)
    home: Path  # the client's HOME
    env: dict = field(default_factory=dict)


def client_command(client: Client, path: str, task: str, s: Setup) -> list[str]:
    """The client's headless command for ``task``; writes its configuration under ``s.home`` / ``s.work`` and
    sets its environment in ``s.env``."""
    v1 = f"{s.base}/v1"
    if client.name == "claude":
        s.env |= {
            "ANTHROPIC_BASE_URL": s.base,
            "ANTHROPIC_AUTH_TOKEN": "specwise",
            "ANTHROPIC_MODEL": s.model,
            "ANTHROPIC_SMALL_FAST_MODEL": s.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": s.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "API_TIMEOUT_MS": str(s.timeout_ms),
        }
        return [path, "-p", task, "--allowedTools", "Read,Edit", "--model", s.model]
    if client.name == "codex":
        s.env |= {"SPECWISE_API_KEY": "specwise", "CODEX_HOME": str(s.home / ".codex")}
        (s.home / ".codex").mkdir(parents=True, exist_ok=True)
        provider = (
            f'{{ name = "specwise", base_url = "{v1}", wire_api = "responses", env_key = "SPECWISE_API_KEY", '
            f"stream_idle_timeout_ms = {s.timeout_ms} }}"
        )
        config = ["-c", "model_provider=specwise", "-c", f"model_providers.specwise={provider}"]
        config += ["-c", f"model_context_window={s.context}"]
        command = [path, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        return [*command, "-m", s.model, *config, task]
    output = min(1024, s.context // 16)  # the reply's budget the clients ask for: 512 of an 8K context
    if client.name == "opencode":
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "specwise": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "specwise",
                    "options": {"baseURL": v1, "apiKey": "specwise", "timeout": s.timeout_ms},
                    "models": {s.model: {"name": s.model, "limit": {"context": s.context, "output": output}}},
                }
            },
            "model": f"specwise/{s.model}",
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
            "autoupdate": False,
            "share": "disabled",
        }
        path_ = s.home / ".config" / "opencode" / "opencode.json"
        path_.parent.mkdir(parents=True, exist_ok=True)
        path_.write_text(json.dumps(config, indent=2))
        s.env["OPENCODE_CONFIG"] = str(path_)
        return [path, "run", "--print-logs", "--log-level", "WARN", "-m", f"specwise/{s.model}", task]
    if client.name == "qwen":
        s.env |= {"OPENAI_BASE_URL": v1, "OPENAI_API_KEY": "specwise", "OPENAI_MODEL": s.model}
        s.env["QWEN_CODE_API_TIMEOUT_MS"] = str(s.timeout_ms)  # its default, 120 s (4 tries), ends a long prefill
        settings = {
            "security": {"auth": {"selectedType": "openai"}},
            "privacy": {"usageStatisticsEnabled": False},
            "model": {"name": s.model, "generationConfig": {"contextWindowSize": s.context}},
        }
        (s.home / ".qwen").mkdir(parents=True, exist_ok=True)
        (s.home / ".qwen" / "settings.json").write_text(json.dumps(settings, indent=2))
        return [path, "-p", task, "--approval-mode", "yolo", "-m", s.model]
    if client.name == "continue":
        config = (
            "name: specwise\nversion: 0.0.1\nschema: v1\nmodels:\n"
            f"  - name: {s.model}\n    provider: openai\n    model: {s.model}\n    apiBase: {v1}\n"
            f"    apiKey: specwise\n    defaultCompletionOptions:\n      contextLength: {s.context}\n"
            "    roles: [chat, edit, apply]\n    capabilities: [tool_use]\n"
        )
        (s.home / "continue.yaml").write_text(config)
        return [path, "-p", task, "--config", str(s.home / "continue.yaml"), "--auto"]
    if client.name == "aider":
        s.env |= {"OPENAI_API_BASE": v1, "OPENAI_API_KEY": "specwise"}
        settings = {f"openai/{s.model}": {"max_input_tokens": s.context, "max_output_tokens": output}}
        (s.home / ".aider.model.metadata.json").write_text(json.dumps(settings))
        return [
            path,
            "--message",
            task,
            "--yes-always",
            "--model",
            f"openai/{s.model}",
            "--edit-format",
            "whole",
            "--no-git",
            "--no-auto-commits",
            "--no-check-update",
            "--no-analytics",
            "--no-show-model-warnings",
            "--no-stream",
            "--no-pretty",
            "--model-metadata-file",
            str(s.home / ".aider.model.metadata.json"),
            FILE,
        ]
    raise ValueError(f"unknown client {client.name!r}")


# --------------------------------------------------------------------------------------------- running a task


def completed(task: str, output: str, work: Path) -> bool:
    """Whether the task was done: the answer names the function / the file was edited."""
    if task == "read":
        return OLD in output
    text = (work / FILE).read_text()
    return NEW in text and OLD not in text


def client_errors(output: str) -> list[str]:
    """Lines of the client's output that report an HTTP 4xx/5xx (at most 10)."""
    lines = [line.strip()[:300] for line in output.splitlines() if HTTP_ERROR.search(line)]
    return list(dict.fromkeys(lines))[:10]


def run_task(client: Client, path: str, task: str, base: str, app: RecordingProxy, args, context: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"agents-e2e-{client.name}-{task}-"))
    work, home = root / "project", root / "home"
    work.mkdir()
    home.mkdir()
    (work / FILE).write_text(SOURCE)
    setup = Setup(base, args.model, context, int(args.timeout * 1000), work, home)
    command = client_command(client, path, TASKS[task], setup)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    # PWD too: opencode takes its project folder from it, not from the process's working directory
    env |= {"HOME": str(home), "PWD": str(work), "NO_COLOR": "1", "CI": "1", "TERM": "dumb"} | setup.env
    label = f"{client.name}:{task}:{root.name}"
    app.label = label
    start = time.perf_counter()
    status, output = run_client(command, work, env, args.timeout)
    seconds = time.perf_counter() - start
    time.sleep(0.5)  # the proxy's last record
    exchanges = app.of(label)
    errors = [
        {"route": e.path, "status": e.status, "error": e.error, "request": e.summary, "body_excerpt": e.body_excerpt}
        for e in exchanges
        if e.status is not None and e.status >= 400 and e.status != CLIENT_CLOSED
    ]
    report = {
        "completed": completed(task, output, work),
        "protocol_errors": errors,
        "client_reported_errors": client_errors(output),
        "seconds": round(seconds, 1),
        "exit_status": status,
        "requests": [
            {
                "route": e.path,
                "status": "unanswered" if e.status is None else e.status,
                "seconds": round(e.seconds if e.seconds is not None else time.perf_counter() - e.started, 2),
                **e.summary,
            }
            for e in exchanges
        ],
        "file_after": (work / FILE).read_text() if task == "edit" else None,
        "output_tail": output[-1500:],
        "command": shlex.join(command[:1] + ["<task>" if a == TASKS[task] else a for a in command[1:]]),
        "environment": {k: v for k, v in setup.env.items() if "KEY" not in k and "TOKEN" not in k},
    }
    if args.keep:
        report["folder"] = str(root)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return report


def run_client(command: list[str], work: Path, env: dict, timeout: float) -> tuple[int | str, str]:
    """Run the client in a session of its own (its exit status and output); at the timeout, the whole process
    group is stopped (agents start helpers), the status ``timeout``."""
    proc = subprocess.Popen(
        command,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                output, _ = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                output = ""
        return "timeout", output


# ------------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.clients.split(",") if n.strip()]
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [n for n in names if n not in CLIENTS] + [t for t in tasks if t not in TASKS]
    if unknown:
        raise SystemExit(f"unknown client or task: {', '.join(unknown)}")
    log = Path(args.out or "agents_e2e.json").with_suffix(".server.log")
    if args.url:
        server = _existing(args.url)
    else:
        server = specwise_server(args, log)
    results: dict = {}
    with server as info, proxy(info["url"]) as (base, app):
        app.trace_dir = Path(args.trace_dir) if args.trace_dir else None
        health = httpx.get(f"{info['url']}/health", timeout=60).json()
        model = httpx.get(f"{info['url']}/v1/models", timeout=60).json()["data"][0]["id"]
        if model != args.model:
            print(f"the server serves {model!r}: asking for that", file=sys.stderr)
            args.model = model
        context = args.context or health.get("context") or 8192
        for name in names:
            client = CLIENTS[name]
            if args.install:
                install(client)
            path = binary(client)
            if path is None:
                results[name] = {"installed": False, "install": client.npm or client.pip}
                continue
            results[name] = {"version": version(path), "api": client.api, "tasks": {}}
            for task in tasks:
                print(f"{name}: {task} ...", file=sys.stderr, flush=True)
                outcome = run_task(client, path, task, base, app, args, context)
                results[name]["tasks"][task] = outcome
                summary = {k: outcome[k] for k in ("completed", "seconds", "exit_status")}
                summary["errors"] = [f"{e['status']} {e['route']}: {e['error']}" for e in outcome["protocol_errors"]]
                print(f"{name}: {task}: {json.dumps(summary)}", file=sys.stderr, flush=True)
    report = {
        "command": "python " + shlex.join(sys.argv if argv is None else ["benchmarks/agents_e2e.py", *argv]),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": vars(args),
        "server": {"command": info.get("command"), "health": health},
        "tasks": TASKS,
        "results": results,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


@contextmanager
def _existing(url: str) -> Iterator[dict]:
    yield {"url": url.rstrip("/"), "command": None}


if __name__ == "__main__":
    sys.exit(main())
