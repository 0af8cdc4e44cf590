"""The one thread that runs generations, continuously batched.

The asyncio side queues a Job (or the Jobs of a JobGroup, one per choice of a request), each carrying the step's
:class:`~specwise.step.Request` as the request path built it; this thread keeps a
:class:`~specwise.batch.BatchEngine` over the runtime's Engine, moves queued Jobs into it as slots free (up to
``max_batch`` share each target pass), steps it, and hands each request's events back to its Job's event loop.
Requests join between steps and leave when done, so a short request does not wait for a long one. A Job whose
client has gone is cancelled: skipped if still queued, dropped from the batch before the next step if running, so
its slot serves the next request.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from specwise.batch import MAX_STEP_SECONDS, PREFILL_SHARE, BatchEngine, BatchStep
from specwise.engine import Engine, GenerationEvent
from specwise.server.metrics import ServerMetrics
from specwise.step import Request

__all__ = [
    "BatchFailed",
    "ClientDisconnected",
    "GenerationWorker",
    "Job",
    "JobGroup",
    "QueueFullError",
    "ServerStopping",
]

POLL_SECONDS = 0.25  # how often a waiting request checks whether its client is still there
log = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """Too many requests are waiting for the engine."""


class ServerStopping(RuntimeError):
    """The server shut down before the request ran."""


class ClientDisconnected(Exception):
    """The client went away while its request was waiting or running."""


class BatchFailed(RuntimeError):
    """A step of the batch failed unexpectedly: every request in it ends with this error (the server's fault, not
    the request's; the worker goes on with a new batch)."""


class Job:
    """One generation (one choice of a request: the step's ``request``) and the channel its events come back on
    (worker thread -> event loop). The Jobs of a JobGroup share one channel, each event tagged with its Job's
    ``index``. ``endpoint`` labels its metrics (``chat``, ``completions``, ``infill``, ``messages``)."""

    def __init__(
        self,
        request: Request,
        endpoint: str = "completions",
        loop: asyncio.AbstractEventLoop | None = None,
        index: int = 0,
        channel: asyncio.Queue | None = None,
    ) -> None:
        self.request = request
        self.endpoint = endpoint
        self.index = index
        self.submitted_at = time.perf_counter()
        self.tokens = 0  # generated so far
        self.first_token_at: float | None = None  # when the first token came out (perf_counter)
        self._loop = loop or asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue() if channel is None else channel
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
            self._loop.call_soon_threadsafe(self._events.put_nowait, (self.index, item))
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel()

    async def events(self, is_disconnected: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator:
        """The job's GenerationEvents in order, up to the one with a finish_reason.

        Raises the error that ended the job, or ClientDisconnected (after cancelling the job) when
        ``is_disconnected`` says the client has gone.
        """
        async for _, event in _receive(self._events, [self], is_disconnected):
            yield event


class JobGroup:
    """The choices of one request (``n`` of them): a Job per Request, ``index`` i for the i-th, all on one
    channel. The worker runs them as separate requests of its batch."""

    def __init__(
        self, requests: list[Request], endpoint: str = "completions", loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        if not requests:
            raise ValueError("a JobGroup needs at least one Request")
        loop = loop or asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()
        self.jobs = [Job(request, endpoint, loop, i, self._events) for i, request in enumerate(requests)]

    def cancel(self) -> None:
        """Cancel every choice (a no-op for those finished)."""
        for job in self.jobs:
            job.cancel()

    async def events(self, is_disconnected: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator:
        """``(index, GenerationEvent)`` pairs as they come, each choice's in order, until every choice's last
        event. Raises the first error that ends a choice, or ClientDisconnected (after cancelling them all)."""
        async for pair in _receive(self._events, self.jobs, is_disconnected):
            yield pair


async def _receive(
    channel: asyncio.Queue, jobs: list[Job], is_disconnected: Callable[[], Awaitable[bool]] | None
) -> AsyncIterator[tuple[int, GenerationEvent]]:
    """``(index, event)`` pairs from ``channel`` until each of ``jobs`` has sent its last event; raises an error
    sent instead; checks at most every POLL_SECONDS whether the client is still there."""
    running = len(jobs)
    next_check = [0.0]  # when to ask next whether the client is still there
    while running:
        index, item = await _next(channel, jobs, is_disconnected, next_check)
        if isinstance(item, BaseException):
            raise item
        yield index, item
        if item.finish_reason is not None:
            running -= 1


async def _next(
    channel: asyncio.Queue,
    jobs: list[Job],
    is_disconnected: Callable[[], Awaitable[bool]] | None,
    next_check: list[float],
) -> tuple[int, GenerationEvent | BaseException]:
    getter = asyncio.ensure_future(channel.get())
    try:
        while True:
            await _check_client(jobs, is_disconnected, next_check)
            done, _ = await asyncio.wait({getter}, timeout=POLL_SECONDS)
            if done:
                return getter.result()
    finally:
        if not getter.done():
            getter.cancel()


async def _check_client(
    jobs: list[Job], is_disconnected: Callable[[], Awaitable[bool]] | None, next_check: list[float]
) -> None:
    """At most every POLL_SECONDS (events may come faster): cancel the jobs if the client has gone."""
    if is_disconnected is None or time.perf_counter() < next_check[0]:
        return
    next_check[0] = time.perf_counter() + POLL_SECONDS
    if await is_disconnected():
        for job in jobs:
            job.cancel()
        raise ClientDisconnected("the client disconnected")


class GenerationWorker:
    """Runs queued Jobs on a dedicated thread, up to ``max_batch`` of them sharing each target pass.

    max_queue: how many jobs may wait for a place in the batch (those in it aside) before ``submit`` refuses more.
    max_batch: requests generated together (1: one at a time, in arrival order).
    max_step_seconds, prefill_share, cache_memory: the batch's (:class:`~specwise.batch.BatchEngine`): the time a
        step in which requests decode may take while a joining prompt is read, the share of the time the prompt
        takes meanwhile, and the bytes the slots' caches may hold (None: a quarter of the machine's memory).
    """

    def __init__(
        self,
        engine: Engine,
        metrics: ServerMetrics,
        max_queue: int = 64,
        max_batch: int = 16,
        *,
        max_step_seconds: float | None = MAX_STEP_SECONDS,
        prefill_share: float = PREFILL_SHARE,
        cache_memory: int | None = None,
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_batch = max_batch
        self._options = {
            "max_step_seconds": max_step_seconds,
            "prefill_share": prefill_share,
            "cache_memory": cache_memory,
        }
        self._batch = self._new_batch()  # checks the options
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._jobs: dict[int, Job] = {}  # the batch's request ids -> their jobs (kept by the worker thread)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()  # the running thread's stop signal
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        """Whether the worker thread is running."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def waiting(self) -> int:
        """Jobs queued for a place in the batch."""
        return self._queue.qsize()

    @property
    def running(self) -> int:
        """Jobs in the batch (being generated)."""
        return len(self._jobs)

    def start(self) -> None:
        """Start the thread (a no-op if it runs)."""
        with self._lock:
            if not self.alive:
                self._stopping = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(self._stopping,), name="specwise-generation", daemon=True
                )
                self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Fail the running and queued jobs (ServerStopping) and end the thread (after the step under way)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        self._queue.put(None)  # wakes the thread if it waits for work
        thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a job; raises QueueFullError when ``max_queue`` jobs are already waiting."""
        self.submit_all([job])

    def submit_all(self, jobs: list[Job]) -> None:
        """Queue the jobs of one request (its choices) together, or none of them: raises QueueFullError when
        ``max_queue`` jobs are already waiting."""
        self.start()
        if self._queue.qsize() >= self.max_queue:
            raise QueueFullError(f"{self._queue.qsize()} requests are already waiting")
        for job in jobs:
            self.metrics.waiting.inc()
            self._queue.put(job)

    # ---- the worker thread -----------------------------------------------------------------------------------

    def _run(self, stopping: threading.Event) -> None:
        try:
            while not stopping.is_set():
                if not self._jobs:
                    self._wait_for_work()
                self._drop_cancelled()
                self._take_queued()
                if self._jobs:
                    self._step()
                self._set_gauges()
        finally:
            self._end(ServerStopping("the server is shutting down"))

    def _wait_for_work(self) -> None:
        """Block until a job (or the stop signal) arrives."""
        job = self._queue.get()
        if job is not None:
            self._admit(job)

    def _take_queued(self) -> None:
        """Queued jobs into the batch while it has room."""
        while len(self._jobs) < self.max_batch:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self._admit(job)

    def _admit(self, job: Job) -> None:
        m = self.metrics
        m.waiting.dec()
        if job.cancelled:
            m.requests.labels(job.endpoint, "cancelled").inc()
            return
        m.queue_time.observe(time.perf_counter() - job.submitted_at)
        try:
            rid = self._batch.submit(job.request)
        except ValueError as err:  # the engine's check of the request: a bad request, answered at once
            m.requests.labels(job.endpoint, "error").inc()
            job.put(err)
            return
        m.prompt_tokens.inc(len(job.request.prompt_ids))
        self._jobs[rid] = job

    def _drop_cancelled(self) -> None:
        """Jobs whose clients have gone leave the batch before the next step."""
        for rid, job in list(self._jobs.items()):
            if job.cancelled:
                self._batch.cancel(rid)
                del self._jobs[rid]
                self.metrics.requests.labels(job.endpoint, "cancelled").inc()

    def _step(self) -> None:
        try:
            step = self._batch.step()
        except Exception as err:  # a failure of the engine: the batch's jobs end with it, a new batch goes on
            log.exception("a batch step failed: its %d requests end with the error", len(self._jobs))
            self._fail_batch(BatchFailed(f"{type(err).__name__}: {err}"))
            return
        self._record_pass(step)
        for rid, err in step.errors:  # a request that failed on its own (e.g. its sampling settings): a 400
            job = self._jobs.pop(rid, None)
            if job is not None:
                self.metrics.requests.labels(job.endpoint, "error").inc()
                job.put(err)
        for rid, event in step.events:
            job = self._jobs.get(rid)
            if job is not None:
                self._deliver(rid, job, event)
        if self._jobs and not self._batch.has_work():  # never expected; its jobs would wait for ever
            self._fail_batch(BatchFailed(f"the batch lost {len(self._jobs)} requests"))

    def _fail_jobs(self, err: BaseException, outcome: str) -> None:
        """End every job in the batch with ``err``, counted as ``outcome``; their requests leave the batch."""
        jobs, self._jobs = self._jobs, {}
        for rid, job in jobs.items():
            self._batch.cancel(rid)
            self.metrics.requests.labels(job.endpoint, outcome).inc()
            job.put(err)

    def _fail_batch(self, err: BaseException) -> None:
        """A step failed: its jobs end with ``err`` and a new, empty batch goes on."""
        self._fail_jobs(err, "error")
        self._batch = self._new_batch()

    def _new_batch(self) -> BatchEngine:
        return BatchEngine(self.engine, self.max_batch, **self._options)

    def _deliver(self, rid: int, job: Job, event: GenerationEvent) -> None:
        m = self.metrics
        if event.token_ids and job.first_token_at is None:
            job.first_token_at = time.perf_counter()
            m.time_to_first_token.observe(job.first_token_at - job.submitted_at)
        job.tokens += len(event.token_ids)
        m.generation_tokens.inc(len(event.token_ids))
        if event.finish_reason is not None:
            del self._jobs[rid]
            self._finished(job, event)
        job.put(event)

    def _finished(self, job: Job, event: GenerationEvent) -> None:
        m, now = self.metrics, time.perf_counter()
        m.requests.labels(job.endpoint, event.finish_reason).inc()
        m.latency.labels(job.endpoint).observe(now - job.submitted_at)
        if job.first_token_at is not None and job.tokens > 1:
            m.time_per_output_token.observe((now - job.first_token_at) / (job.tokens - 1))
        m.record_stats(event.stats)

    def _record_pass(self, step: BatchStep) -> None:
        if step.prefill_copied:
            self.metrics.prompt_tokens_copied.inc(step.prefill_copied)
        if step.sequences:
            self.metrics.batch_passes.inc()
            self.metrics.batch_step_seconds.inc(step.seconds)
            self.metrics.batch_pass_seconds.inc(step.pass_seconds)
            self.metrics.batch_size.observe(step.sequences)
            self.metrics.batch_rows.observe(step.rows)

    def _set_gauges(self) -> None:
        self.metrics.running.set(len(self._jobs))
        self.metrics.sequences_running.set(self._batch.running)

    def _end(self, err: BaseException) -> None:
        """The thread ends: fail the running jobs (counted as cancelled) and the queued ones."""
        self._fail_jobs(err, "cancelled")
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self.metrics.waiting.dec()
                job.put(err)
        self._set_gauges()
