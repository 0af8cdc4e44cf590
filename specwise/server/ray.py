"""`specwise serve --ray`: the OpenAI-compatible server as a Ray Serve application over one or many machines.

Two deployments make the application:

- ``SpecwiseEngine``: the replicas. Each loads the model and the drafter (``build_runtime``, checked against the
  target as in ``specwise serve``), builds the same app as ``specwise serve`` (``create_app``: every route, its
  batching worker, its limits and errors) and runs HTTP requests through it in-process, yielding the response's
  ASGI messages as they come. Its threads are the CPUs Ray gives it. A replica gets traffic only once its
  model is loaded and its health check (the generation thread is alive) passes.
- ``SpecwiseGateway``: the HTTP ingress behind Ray Serve's proxy. It reads a request (within the body limit) and
  forwards it to a replica through a deployment handle. When the replica fails before the response has started
  (its process died, its node went away), the request is sent again to another replica, up to ``RETRIES`` times;
  a stream that had started ends with an error event. The gateway holds no model and no state per request.

Ray Serve places the replicas over the cluster's nodes, restarts a failed one, and with autoscaling adds and
removes replicas on the requests each one has (running and queued). The model file and drafter artifacts are read
by every replica from the same path: a file every node can see (a shared file system, or the same path on each
machine), or ``default`` (the model shipped with the package).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from specwise.extras import missing_extra
from specwise.server.limits import BodyLimitMiddleware
from specwise.server.protocol import error_body

__all__ = [
    "APP_NAME",
    "ClusterOptions",
    "REPLICA_HEADER",
    "RETRIES_HEADER",
    "build_application",
    "cmd_serve_ray",
    "deploy",
    "main",
    "replica_threads",
]

APP_NAME = "specwise"
REPLICA_HEADER = "x-specwise-replica"  # names the replica that answered (its Ray Serve id)
RETRIES_HEADER = "x-specwise-retries"  # on a response sent again after a replica failed: how many times
RETRIES = 3  # sends of a request to another replica after the one serving it failed before answering
RETRY_PAUSE_SECONDS = 0.5  # between such sends (Ray routes the next one to a live replica)
GATEWAY_MAX_BODY_BYTES = 16 * 1024 * 1024  # the gateway's body limit when --max-body-bytes is not given
HEALTH_CHECK_PERIOD_SECONDS = 5.0
HEALTH_CHECK_TIMEOUT_SECONDS = 30.0
GRACEFUL_SHUTDOWN_SECONDS = 60.0  # a replica scaled down or redeployed finishes its requests for this long
GATEWAY_MAX_ONGOING = 4096  # requests a gateway forwards at once (the replicas' limits queue the rest)
log = logging.getLogger(__name__)


@dataclass
class ClusterOptions:
    """What every replica serves, and how many replicas: the options of ``specwise serve`` that apply per replica,
    plus the deployment's shape."""

    target: str = "default"
    drafter: str = "auto"
    gamma: int | str = "auto"
    device: str = "cpu"
    impl: str = "auto"
    precision: str | None = None
    attention: str = "float32"
    kv_cache: str = "float32"
    served_model_name: str | None = None
    max_batch: int = 16
    max_queue: int = 64
    default_max_tokens: int | None = None
    max_body_bytes: int | None = None
    api_key: str | None = None
    reasoning_format: str = "auto"
    max_step_seconds: float | None = 0.4  # specwise.batch.MAX_STEP_SECONDS
    prefill_share: float = 0.4  # specwise.batch.PREFILL_SHARE
    cache_memory: int | None = None
    replicas: int = 1  # the number of replicas (the least, with autoscaling)
    max_replicas: int | None = None  # with autoscaling: the most (None: a fixed number of replicas)
    cpus_per_replica: float = 1.0  # Ray's CPUs per replica, and so its threads
    gateways: int = 1  # gateway replicas (each forwards requests; they hold no model)

    def check(self) -> None:
        """Raise ValueError naming the first option out of range."""
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ValueError(f"--max-replicas ({self.max_replicas}) must be >= --replicas ({self.replicas})")
        if self.gateways < 1:
            raise ValueError(f"--gateways must be >= 1, got {self.gateways}")
        if self.cpus_per_replica <= 0:
            raise ValueError(f"--threads must be >= 1, got {self.cpus_per_replica}")
        if self.max_batch < 1:
            raise ValueError(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.max_queue < 1:
            raise ValueError(f"--max-queue must be >= 1, got {self.max_queue}")


def import_ray():
    """The ``ray`` module with Ray Serve; without them, a MissingExtraError naming the extra to install. (Ray is
    imported only when used, so that this module imports without the extra.)"""
    try:
        import ray
        import ray.serve  # noqa: F401
    except ModuleNotFoundError as err:
        raise missing_extra(err, "cluster", "specwise serve --ray") from err
    return ray


def replica_threads(assigned: dict) -> int:
    """The threads of a replica given Ray's resources for it (``{"CPU": 2.0, ...}``): one per whole CPU,
    at least one."""
    return max(1, int(assigned.get("CPU", 1)))


# ------------------------------------------------------------------------------------------------ replicas


class _ReplicaSide:
    """The ASGI connection of one forwarded request inside a replica: ``receive`` gives the body, then waits
    until the caller has gone; ``send`` queues the response's messages for the caller."""

    def __init__(self, body: bytes, replica: str) -> None:
        self.body, self.replica = body, replica
        self.messages: asyncio.Queue = asyncio.Queue()
        self.gone = asyncio.Event()
        self._body_given = False

    async def receive(self) -> dict:
        if not self._body_given:
            self._body_given = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ())) + [(REPLICA_HEADER.encode(), self.replica.encode())]
            message = message | {"headers": headers}
        await self.messages.put(message)


def _pending(first, queue: asyncio.Queue, done) -> tuple[list[dict], bool]:
    """``first`` and every message already queued behind it, as one batch for the caller, consecutive body parts
    joined into one (each item a stream sends through Ray costs far more than its bytes: while the caller is slower
    than the app, a batch carries several tokens' events); and whether ``done`` came."""
    batch: list[dict] = []
    message = first
    while True:
        if message is done:
            return batch, True
        last = batch[-1] if batch else None
        if last is not None and last["type"] == message["type"] == "http.response.body" and last.get("more_body"):
            batch[-1] = message | {"body": last.get("body", b"") + message.get("body", b"")}
        else:
            batch.append(message)
        try:
            message = queue.get_nowait()
        except asyncio.QueueEmpty:
            return batch, False


def _scope(request: dict) -> dict:
    """The ASGI scope of a forwarded request (see ``_forwarded``)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": request["http_version"],
        "method": request["method"],
        "scheme": request["scheme"],
        "path": request["path"],
        "raw_path": request["path"].encode(),
        "root_path": "",
        "query_string": request["query_string"],
        "headers": [(bytes(k), bytes(v)) for k, v in request["headers"]],
        "client": tuple(request["client"]) if request["client"] else None,
        "server": tuple(request["server"]) if request["server"] else None,
        "state": {},
    }


class SpecwiseEngine:
    """One replica: the specwise app of ``specwise serve`` over its own model, batch engine and threads (a Ray
    Serve deployment made by ``build_application``)."""

    async def __init__(self, options: dict) -> None:
        from ray import serve

        from specwise.models.threads import set_num_threads
        from specwise.runtime import build_runtime
        from specwise.server.app import serving_app

        ray = import_ray()
        opts = ClusterOptions(**options)
        self.threads = replica_threads(ray.get_runtime_context().get_assigned_resources())
        set_num_threads(self.threads)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.node = ray.get_runtime_context().get_node_id()
        _check_target_here(opts.target)
        runtime = build_runtime(
            opts.target, opts.drafter, opts.gamma, opts.device, opts.impl, opts.precision, opts.attention, opts.kv_cache
        )
        self.app = serving_app(runtime, opts, opts.api_key)
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()  # starts the generation worker
        log.info("specwise replica %s: %d threads, node %s", self.replica, self.threads, self.node)

    async def handle(self, request: dict):
        """Run one HTTP request through the app; yields its ASGI response messages (start, then body parts) in
        batches (lists): whatever the app has sent since the caller took the last one (see ``_pending``)."""
        side = _ReplicaSide(request["body"], self.replica)
        done = object()

        async def run() -> None:
            try:
                await self.app(_scope(request), side.receive, side.send)
            finally:
                await side.messages.put(done)

        task = asyncio.create_task(run())
        try:
            finished = False
            while not finished:
                batch, finished = _pending(await side.messages.get(), side.messages, done)
                if batch:
                    yield batch
            await task  # its error, if the app let one through
        finally:
            side.gone.set()  # the caller has gone, or the response is complete: a stream ends, its job is cancelled
            if not task.done():
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(task, 5)

    def check_health(self) -> None:
        """Ray's health check: the replica is unhealthy (and replaced) once its generation thread has stopped."""
        if not self.app.state.server.worker.alive:
            raise RuntimeError(f"specwise replica {self.replica}: the generation thread has stopped")

    async def __del__(self) -> None:
        with contextlib.suppress(Exception):
            await self._lifespan.__aexit__(None, None, None)


def _check_target_here(target: str) -> None:
    """A target given as a path must exist on this replica's node: one line naming the node and the fix."""
    looks_like_path = target.endswith(".gguf") or target.startswith(("/", "./", "../", "~"))
    if looks_like_path and not Path(target).expanduser().exists():
        node = os.uname().nodename
        raise FileNotFoundError(
            f"--target {target}: no such file on node {node}: put the model on a path every node of the cluster "
            "can read (a shared file system, or the same path on each machine)"
        )


# ------------------------------------------------------------------------------------------------- gateway


def _forwarded(scope: dict, body: bytes) -> dict:
    """What a replica needs of a request: plain values, the same for any replica it is sent to."""
    return {
        "http_version": scope.get("http_version", "1.1"),
        "method": scope["method"],
        "scheme": scope.get("scheme", "http"),
        "path": scope["path"],
        "query_string": scope.get("query_string", b""),
        "headers": [(bytes(k), bytes(v)) for k, v in scope.get("headers", ())],
        "client": list(scope["client"]) if scope.get("client") else None,
        "server": list(scope["server"]) if scope.get("server") else None,
        "body": body,
    }


async def _send_error(send, status: int, message: str, code: str | None, type_: str = "server_error") -> None:
    payload = json.dumps(error_body(message, type_, None, code), separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _is_event_stream(start: dict) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in start["headers"])


class SpecwiseGateway:
    """The HTTP ingress: forwards each request to a replica, and again to another when that one fails first (a Ray
    Serve ingress deployment made by ``build_application``)."""

    def __init__(self, engine, max_body_bytes: int | None = None) -> None:
        from ray.exceptions import RayActorError
        from ray.serve.exceptions import BackPressureError

        self.replica_failed, self.busy = RayActorError, BackPressureError  # (its process or node died)
        self.engine = engine.options(stream=True)
        self.max_body_bytes = max_body_bytes or GATEWAY_MAX_BODY_BYTES

    def __serve_build_asgi_app__(self):
        return _LifespanAware(BodyLimitMiddleware(self._forward, self.max_body_bytes))

    async def _forward(self, scope, receive, send) -> None:
        message = await receive()  # the body, read whole by the body limit
        request = _forwarded(scope, message.get("body", b""))
        for attempt in range(RETRIES + 1):
            started = event_stream = False
            try:
                start = None
                async for batch in self.engine.handle.remote(request):
                    for message in batch:
                        if message["type"] == "http.response.start":
                            start = message  # held until the body begins: a failure before then is retried
                            continue
                        if start is not None:
                            if attempt:
                                retried = (RETRIES_HEADER.encode(), b"%d" % attempt)
                                start = start | {"headers": [*start["headers"], retried]}
                            await send(start)
                            start, started, event_stream = None, True, _is_event_stream(start)
                        await send(message)
                return
            except self.replica_failed as err:  # the replica's process or node went away
                if started:
                    await _end_stream_with_error(send, err, event_stream)
                    return
                if attempt == RETRIES:
                    message = (
                        f"every replica this request was sent to ({RETRIES + 1}) failed before answering (the last: "
                        f"{type(err).__name__}): retry later"
                    )
                    await _send_error(send, 503, message, "replica_failed")
                    return
                log.warning("a replica failed before answering (%s): sending the request again", type(err).__name__)
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
            except self.busy:
                await _send_error(send, 429, "the cluster is busy: retry later", "queue_full", "server_busy")
                return
            except Exception as err:  # anything else from Ray: an error body, never a traceback
                log.exception("forwarding a request failed")
                if started:
                    await _end_stream_with_error(send, err, event_stream)
                else:
                    with contextlib.suppress(Exception):
                        await _send_error(send, 500, f"internal error: {type(err).__name__}: {err}", None)
                return


async def _end_stream_with_error(send, err: BaseException, event_stream: bool) -> None:
    """End a response whose replica failed after it had started: an event stream with an error event and [DONE]
    (as the server ends a stream that fails), any other response where it was cut."""
    message = f"the replica serving this request failed ({type(err).__name__}) after the response had started"
    event = json.dumps(error_body(message, "server_error", None, "replica_failed"), separators=(",", ":"))
    body = f"data: {event}\n\ndata: [DONE]\n\n".encode() if event_stream else b""
    with contextlib.suppress(Exception):
        await send({"type": "http.response.body", "body": body, "more_body": False})


class _LifespanAware:
    """An ASGI app that answers the lifespan protocol itself (the gateway has nothing to start) and passes HTTP
    requests on."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        elif scope["type"] == "http":
            await self.app(scope, receive, send)


# ---------------------------------------------------------------------------------------------- deployment


def build_application(options: ClusterOptions):
    """The Ray Serve application: the gateway bound to ``options.replicas`` engine replicas (or autoscaling
    between ``replicas`` and ``max_replicas`` on the requests each replica has, aiming at ``max_batch``)."""
    from ray import serve

    options.check()
    shape: dict = {
        "ray_actor_options": {"num_cpus": options.cpus_per_replica},
        "max_ongoing_requests": options.max_batch,
        "max_queued_requests": options.max_queue,
    }
    if options.max_replicas is None:
        shape["num_replicas"] = options.replicas
    else:
        shape["autoscaling_config"] = {
            "min_replicas": options.replicas,
            "max_replicas": options.max_replicas,
            "target_ongoing_requests": options.max_batch,
        }
    engine = serve.deployment(
        SpecwiseEngine,
        name="SpecwiseEngine",
        health_check_period_s=HEALTH_CHECK_PERIOD_SECONDS,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_SECONDS,
        graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_SECONDS,
        **shape,
    )
    gateway = serve.deployment(
        serve.ingress()(SpecwiseGateway),
        name="SpecwiseGateway",
        num_replicas=options.gateways,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=GATEWAY_MAX_ONGOING,
    )
    return gateway.bind(engine.bind(asdict(options)), options.max_body_bytes)


def deploy(
    options: ClusterOptions,
    host: str = "127.0.0.1",
    port: int = 8000,
    proxy_location: str = "EveryNode",
    name: str = APP_NAME,
) -> str:
    """Start Ray Serve's HTTP proxy on ``host:port`` (on the connected cluster) and run the application; returns
    once every replica is ready. Returns the base URL on this node. When the replicas cannot start (the model
    file missing or refused on a node), raises ValueError with their error in one line."""
    from ray import serve

    serve.start(http_options={"host": host, "port": port}, proxy_location=proxy_location)
    try:
        serve.run(build_application(options), name=name, route_prefix="/", blocking=False)
    except RuntimeError as err:  # Ray's report; the replicas' own errors are in the deployments' status
        reports = [str(err)]
        with contextlib.suppress(Exception):
            deployments = serve.status().applications[name].deployments.values()
            reports += [d.message for d in deployments if d.message]
        raise ValueError(_deploy_failure("\n".join(reports))) from None
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"


_USER_ERRORS = ("FileNotFoundError: ", "PermissionError: ", "OSError: ", "ValueError: ", "GGUFError: ")
_USER_ERRORS += ("NotImplementedError: ", "MissingExtraError: ", "MemoryError: ")  # as `specwise` reports them


def _deploy_failure(text: str) -> str:
    """The one line that says why the replicas could not start, out of Ray's report (tracebacks included)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        for error in _USER_ERRORS:
            if error in line:
                return "a replica could not start: " + line.split(error, 1)[1]
    return "the deployment failed: " + (text.strip().splitlines() or ["no reason given"])[-1]


def options_from_args(args: argparse.Namespace) -> ClusterOptions:
    from specwise.server.options import api_key

    return ClusterOptions(
        target=args.target,
        drafter=args.drafter,
        gamma=args.gamma,
        device=args.device,
        impl=args.impl,
        precision=args.precision,
        attention=args.attention,
        kv_cache=args.kv_cache,
        served_model_name=args.served_model_name,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        default_max_tokens=args.default_max_tokens,
        max_body_bytes=args.max_body_bytes,
        api_key=api_key(args),
        reasoning_format=args.reasoning_format,
        max_step_seconds=args.max_step_seconds,
        prefill_share=args.prefill_share,
        cache_memory=args.cache_memory,
        replicas=args.replicas,
        max_replicas=args.max_replicas,
        cpus_per_replica=float(args.threads or 1),
        gateways=args.gateways,
    )


def cmd_serve_ray(args: argparse.Namespace) -> int:
    """`specwise serve --ray`: join the cluster at --address (or start one on this machine), deploy, and serve
    until interrupted; then remove the application (and stop the cluster this command started)."""
    options = options_from_args(args)
    options.check()
    if args.address is None:
        _check_target_here(options.target)  # a local cluster: the file must be here
    if args.address is not None:
        _check_address(args.address)
    ray = import_ray()
    from ray import serve

    ray.init(address=args.address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    try:
        url = deploy(options, args.host, args.port)
        shape = (
            f"{options.replicas} replica(s)"
            if options.max_replicas is None
            else f"{options.replicas} to {options.max_replicas} replicas (autoscaling)"
        )
        where = f"cluster {args.address}" if args.address else "a local Ray cluster"
        print(
            f"specwise: serving {options.target!r} on {where}: {shape} x {int(options.cpus_per_replica)} thread(s), "
            f"drafter {options.drafter}, max batch {options.max_batch}, at {url}/v1",
            file=sys.stderr,
            flush=True,
        )
        _wait_for_interrupt()
    finally:
        with contextlib.suppress(Exception):
            serve.delete(APP_NAME)
        if args.address is None:
            serve.shutdown()
        ray.shutdown()
    return 0


def _check_address(address: str, timeout: float = 10.0) -> None:
    """Refuse at once, in one line, a HOST:PORT where nothing listens (Ray would retry for minutes); other forms
    (``auto``, ``ray://...``) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise ConnectionError(
            f"--address {address}: no Ray cluster answers there ({err.strerror or err}): start one with "
            "`ray start --head --port PORT` on the head machine, or leave out --address to start one here"
        ) from None


def _wait_for_interrupt() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass


def main(argv: list[str] | None = None) -> int:
    """``python -m specwise.server.ray ARGS``: the same as ``specwise serve --ray ARGS``."""
    from specwise.cli import main as specwise_main

    return specwise_main(["serve", "--ray", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
