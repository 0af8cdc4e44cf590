"""The servers a workload run compares: ``specwise serve`` processes and ``llama-server`` processes, one per
configuration, all started before the first request and kept until the last, so that requests can interleave.

A configuration names its server and how its requests are sent (:class:`ServeConfig`); :func:`make_configs`
lists the comparison: specwise plain, its default drafter, the default drafter with the original as ``prediction``,
the n-gram and draft-model combination; llama.cpp plain, ``ngram-mod``, ``ngram-simple`` and its draft model.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from specwise.lab.bench.workloads.client import MODEL

__all__ = ["CONFIG_IDS", "ServeConfig", "SpecwiseServer", "make_configs", "server_records", "start_servers"]

SPECWISE, LLAMA_CPP = "specwise", "llama.cpp"
# id: (peer, what the server runs, whether requests carry the prediction, label)
_CONFIGS: dict[str, tuple[str, str, bool, str]] = {
    "specwise:none": (SPECWISE, "none", False, "specwise plain"),
    "specwise:auto": (SPECWISE, "auto", False, "specwise default drafter"),
    "specwise:auto+prediction": (SPECWISE, "auto", True, "specwise default drafter + prediction"),
    "specwise:ngram+model": (SPECWISE, "ngram+model:{draft}", False, "specwise ngram+model:draft"),
    "specwise:ngram": (SPECWISE, "ngram", False, "specwise ngram"),
    "specwise:self": (SPECWISE, "self", False, "specwise self-drafting"),
    "specwise:ngram+self": (SPECWISE, "ngram+self", False, "specwise ngram+self"),
    "llama.cpp:none": (LLAMA_CPP, "none", False, "llama.cpp plain"),
    "llama.cpp:ngram-mod": (LLAMA_CPP, "ngram-mod", False, "llama.cpp ngram-mod"),
    "llama.cpp:ngram-simple": (LLAMA_CPP, "ngram-simple", False, "llama.cpp ngram-simple"),
    "llama.cpp:draft": (LLAMA_CPP, "draft", False, "llama.cpp draft model"),
}
CONFIG_IDS = tuple(_CONFIGS)
# run only when asked for: self-drafting needs a draft vocabulary ranking for the target's tokenizer (shipped or
# built); the copy drafter alone is one of the parts `auto` combines, for a look at what it adds
ASKED_ONLY = {"specwise:self", "specwise:ngram+self", "specwise:ngram"}
PLAIN = {SPECWISE: "specwise:none", LLAMA_CPP: "llama.cpp:none"}
# what a specwise configuration's id may add after "@" (``specwise:auto@attention=bfloat16``): its server's formats
SERVER_OPTIONS = {"attention": ("float32", "bfloat16"), "kv-cache": ("float32", "float16")}


@dataclass(frozen=True)
class ServeConfig:
    """One configuration: ``id``, ``peer`` (``specwise`` or ``llama.cpp``), ``spec`` (the specwise drafter spec,
    or llama.cpp's speculative kind), ``prediction`` (requests carry what the client knows of the answer),
    ``label``; ``server_args``: more ``specwise serve`` options (from the id's ``@option=value`` parts)."""

    id: str
    peer: str
    spec: str
    prediction: bool
    label: str
    needs_draft: bool = field(default=False)
    server_args: tuple[str, ...] = ()


def make_configs(ids: list[str] | None, draft: str | None, llama_cpp: bool) -> list[ServeConfig]:
    """The configurations ``ids`` (default: every one that can run but the self-drafting ones: the draft-model ones
    need ``draft``, the llama.cpp ones ``llama_cpp``); a specwise id may end in ``@option=value`` parts (``attention``,
    ``kv-cache``: its server's formats, e.g. ``specwise:auto@attention=bfloat16``). An unknown id, or one asked for
    that cannot run, is an error naming the fix."""
    chosen = list(ids) if ids else [c for c in CONFIG_IDS if _runnable(c, draft, llama_cpp)]
    configs = []
    for cid in chosen:
        base, server_args, suffix = _server_options(cid)
        if base not in _CONFIGS:
            raise ValueError(f"unknown configuration {cid!r}: use {', '.join(CONFIG_IDS)}")
        peer, spec, prediction, label = _CONFIGS[base]
        if server_args and peer != SPECWISE:
            raise ValueError(f"{cid}: '@' options are specwise serve's; llama.cpp's configurations take none")
        label += suffix
        needs_draft = "{draft}" in spec or spec == "draft"
        if needs_draft and draft is None:
            raise ValueError(f"{cid} needs a draft model: pass --draft-model FILE.gguf")
        if peer == LLAMA_CPP and not llama_cpp:
            raise ValueError(f"{cid} needs llama.cpp: pass --llama-cpp [PATH]")
        configs.append(ServeConfig(cid, peer, spec.format(draft=draft), prediction, label, needs_draft, server_args))
    if not configs:
        raise ValueError("no configurations to run")
    return configs


def _server_options(cid: str) -> tuple[str, tuple[str, ...], str]:
    """An id's base id, the ``specwise serve`` arguments of its ``@option=value`` parts, and what its label adds."""
    base, *parts = cid.split("@")
    args: list[str] = []
    for part in parts:
        option, _, value = part.partition("=")
        if value not in SERVER_OPTIONS.get(option, ()):
            known = "; ".join(f"@{k}={'|'.join(v)}" for k, v in SERVER_OPTIONS.items())
            raise ValueError(f"{cid}: unknown server option {part!r}: use {known}")
        args += [f"--{option}", value]
    return base, tuple(args), "".join(f", {part.replace('=', ' ')}" for part in parts)


def _runnable(cid: str, draft: str | None, llama_cpp: bool) -> bool:
    peer, spec, _, _ = _CONFIGS[cid]
    if cid in ASKED_ONLY:
        return False
    return (peer != LLAMA_CPP or llama_cpp) and (draft is not None or ("{draft}" not in spec and spec != "draft"))


class SpecwiseServer:
    """``specwise serve`` in a child process on a free local port, serving the model as ``bench``."""

    def __init__(
        self,
        target: str,
        drafter: str,
        *,
        threads: int | None = None,
        startup_timeout: float = 600.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.target, self.drafter, self.threads, self.extra_args = target, drafter, threads, tuple(extra_args)
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (None before start and after stop)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "specwise", "serve", "--target", self.target, "--drafter", self.drafter]
        cmd += ["--port", str(self.port), "--served-model-name", MODEL, "--log-level", "warning"]
        return cmd + (["--threads", str(self.threads)] if self.threads else []) + list(self.extra_args)

    def start(self) -> SpecwiseServer:
        from specwise.lab.bench.llamacpp import _free_port

        self.port = _free_port("127.0.0.1")
        fd, name = tempfile.mkstemp(prefix="specwise-serve-", suffix=".log")
        os.close(fd)
        self._log = Path(name)
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout
        while not self._ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = self._log.read_bytes()[-3000:].decode("utf-8", "replace")
                self.stop()
                raise RuntimeError(f"specwise serve ({self.drafter}) did not start:\n{tail}")
            time.sleep(0.5)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> SpecwiseServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_servers(
    configs: list[ServeConfig],
    target: str,
    gguf: Path | None,
    draft: str | None,
    threads: int,
    *,
    ctx_size: int = 8192,
    prompt_cache: bool = False,
):
    """One started server per configuration, by id (specwise ones on ``target``, llama.cpp ones on ``gguf`` with
    ``ctx_size`` tokens of context and, with ``prompt_cache``, its own prompt cache kept as a user's server keeps it);
    the caller stops them. A configuration whose server fails stops the ones already started."""
    from specwise.lab.bench.llamacpp import LlamaServer, speculative_args

    servers: dict = {}
    try:
        for config in configs:
            if config.peer == SPECWISE:
                server = SpecwiseServer(target, config.spec, threads=threads, extra_args=config.server_args)
                servers[config.id] = server.start()
            else:
                if gguf is None:
                    raise ValueError(f"{config.id} needs a GGUF target: --target default or a .gguf file")
                extra = ["--jinja", *speculative_args(config.spec, draft)]
                server = LlamaServer(
                    gguf,
                    threads=threads,
                    ctx_size=ctx_size,
                    extra_args=extra,
                    startup_timeout=600.0,
                    prompt_cache=prompt_cache,
                )
                servers[config.id] = server.start()
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def server_records(servers: dict) -> dict[str, dict]:
    """Per configuration, its server's command line and peak resident memory so far (MiB; null, with the reason,
    where it cannot be read): read before the servers stop."""
    import shlex

    from specwise.lab.bench.memory import process_peak_mib

    records = {}
    for cid, server in servers.items():
        peak, reason = process_peak_mib(server.pid)
        records[cid] = {"command": shlex.join(server.command()), "peak_rss_mib": peak, "peak_rss_reason": reason}
    return records
