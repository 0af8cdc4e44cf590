"""The one thread that runs generations.

The Engine holds one sequence in the target's KV cache and is not re-entrant, so requests take turns: the
asyncio side queues a Job, this thread runs ``Engine.stream`` for it and hands each event back to the Job's
event loop. A Job whose client has gone is cancelled: skipped if still queued, stopped at the next target pass
if running, so the next request starts at once.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from specwise.engine import Engine, GenerationEvent
from specwise.sampling import SamplingParams
from specwise.server.metrics import ServerMetrics

__all__ = ["ClientDisconnected", "GenerationWorker", "Job", "JobSpec", "QueueFullError", "ServerStopping"]

POLL_SECONDS = 0.25  # how often a waiting request checks whether its client is still there


class QueueFullError(RuntimeError):
    """Too many requests are waiting for the engine."""


class ServerStopping(RuntimeError):
    """The server shut down before the request ran."""


class ClientDisconnected(Exception):
    """The client went away while its request was waiting or running."""


@dataclass
class JobSpec:
    """What to generate: the arguments of ``Engine.stream`` and the endpoint (a metrics label)."""

    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    eos_token_ids: list[int] | None = None
    endpoint: str = "completions"


class Job:
    """One generation request and the channel its events come back on (worker thread -> event loop)."""

    def __init__(self, spec: JobSpec, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.spec = spec
        self.submitted_at = time.perf_counter()
        self.tokens = 0  # generated so far
        self._next_check = 0.0  # when to ask next whether the client is still there
        self._loop = loop or asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Ask the worker to skip or stop this job (a no-op once it has finished)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, item: GenerationEvent | BaseException) -> None:
        """Hand an event (or the error that ended the job) to the event loop; called by the worker."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel()

    async def events(self, is_disconnected: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator:
        """The job's GenerationEvents in order, up to the one with a finish_reason.

        Raises the error that ended the job, or ClientDisconnected (after cancelling the job) when
        ``is_disconnected`` says the client has gone.
        """
        while True:
            item = await self._next(is_disconnected)
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finish_reason is not None:
                return

    async def _next(self, is_disconnected: Callable[[], Awaitable[bool]] | None) -> GenerationEvent | BaseException:
        getter = asyncio.ensure_future(self._events.get())
        try:
            while True:
                await self._check_client(is_disconnected)
                done, _ = await asyncio.wait({getter}, timeout=POLL_SECONDS)
                if done:
                    return getter.result()
        finally:
            if not getter.done():
                getter.cancel()

    async def _check_client(self, is_disconnected: Callable[[], Awaitable[bool]] | None) -> None:
        """At most every POLL_SECONDS (events may come faster): cancel the job if the client has gone."""
        if is_disconnected is None or time.perf_counter() < self._next_check:
            return
        self._next_check = time.perf_counter() + POLL_SECONDS
        if await is_disconnected():
            self.cancel()
            raise ClientDisconnected("the client disconnected")


class GenerationWorker:
    """Runs queued Jobs one at a time on a dedicated thread.

    max_queue: how many jobs may wait (the running one aside) before ``submit`` refuses more.
    """

    def __init__(self, engine: Engine, metrics: ServerMetrics, max_queue: int = 64) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._running: Job | None = None

    @property
    def alive(self) -> bool:
        """Whether the worker thread is running."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def waiting(self) -> int:
        """Jobs queued and not yet started."""
        return self._queue.qsize()

    @property
    def running(self) -> int:
        """1 while a job is being generated, else 0."""
        return int(self._running is not None)

    def start(self) -> None:
        """Start the thread (a no-op if it runs)."""
        with self._lock:
            if not self.alive:
                self._thread = threading.Thread(target=self._run, name="specwise-generation", daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the running job, fail the queued ones, and end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._running is not None:
            self._running.cancel()
        self._queue.put(None)
        thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a job; raises QueueFullError when ``max_queue`` jobs are already waiting."""
        self.start()
        if self._queue.qsize() >= self.max_queue:
            raise QueueFullError(f"{self._queue.qsize()} requests are already waiting")
        self.metrics.waiting.inc()
        self._queue.put(job)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                break
            self.metrics.waiting.dec()
            self._running = job
            try:
                self._execute(job)
            finally:
                self._running = None
        self._fail_queued()

    def _fail_queued(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self.metrics.waiting.dec()
                job.put(ServerStopping("the server is shutting down"))

    def _execute(self, job: Job) -> None:
        spec, m = job.spec, self.metrics
        if job.cancelled:
            m.requests.labels(spec.endpoint, "cancelled").inc()
            return
        m.queue_time.observe(time.perf_counter() - job.submitted_at)
        m.running.inc()
        m.prompt_tokens.inc(len(spec.prompt_ids))
        events = self.engine.stream(spec.prompt_ids, spec.params, spec.max_tokens, spec.stop, spec.eos_token_ids)
        first_at: float | None = None
        try:
            for event in events:
                if event.token_ids and first_at is None:
                    first_at = time.perf_counter()
                    m.time_to_first_token.observe(first_at - job.submitted_at)
                job.tokens += len(event.token_ids)
                m.generation_tokens.inc(len(event.token_ids))
                if event.finish_reason is not None:
                    self._finished(job, event, first_at)
                job.put(event)
                if job.cancelled and event.finish_reason is None:
                    m.requests.labels(spec.endpoint, "cancelled").inc()
                    break
        except Exception as err:  # the engine's ValueError (bad request) or a failure: the job's error
            m.requests.labels(spec.endpoint, "error").inc()
            job.put(err)
        finally:
            events.close()
            m.running.dec()

    def _finished(self, job: Job, event: GenerationEvent, first_at: float | None) -> None:
        m, now = self.metrics, time.perf_counter()
        m.requests.labels(job.spec.endpoint, event.finish_reason).inc()
        m.latency.labels(job.spec.endpoint).observe(now - job.submitted_at)
        if first_at is not None and job.tokens > 1:
            m.time_per_output_token.observe((now - first_at) / (job.tokens - 1))
        m.record_stats(event.stats)
