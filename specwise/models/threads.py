"""How many threads a pass of the native model uses: all it may use while they pay, one while another process
takes a core.

Every pass of the native kernels splits its work between the threads statically and waits for all of them at
each of its ~150 joins; when another busy process takes one of two cores, the descheduled thread stalls the other
at every join and a pass takes several times its quiet time (measured: 0.21-0.45x the quiet speed), while one
thread keeps ~96% of its own speed beside the same competitor. :class:`ThreadGovernor` times the passes and runs
each on the thread count that has been fastest lately for passes of that many rows, trying the other count now and
then, so that it follows a competitor that comes and goes. The kernels' results do not depend on the thread count
(tested bit for bit), so the choice changes the speed only.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["ThreadGovernor", "thread_mode", "get_num_threads", "run_apart", "set_num_threads"]

T = TypeVar("T")

_threads: int | None = None  # set by set_num_threads; None: the cores this process may run on


def get_num_threads() -> int:
    """The threads native passes may use: what :func:`set_num_threads` set, else ``SPECWISE_NUM_THREADS``, else
    the cores this process may run on."""
    if _threads is not None:
        return _threads
    value = os.environ.get("SPECWISE_NUM_THREADS")
    if value:
        try:
            count = int(value)
        except ValueError:
            count = 0
        if count < 1:
            raise ValueError(f"SPECWISE_NUM_THREADS must be an integer >= 1, got {value!r}")
        return count
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def set_num_threads(count: int | None) -> None:
    """Let native passes use ``count`` threads (None: back to the default of :func:`get_num_threads`). torch's
    own count follows where torch is loaded (the float32 and Hugging Face models)."""
    global _threads
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"the thread count must be an integer >= 1, got {count!r}")
    _threads = count
    _follow(get_num_threads())


def _follow(count: int) -> None:
    """torch's thread count set to ``count`` where torch is loaded (its operations then stall as the kernels')."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != count:
        torch.set_num_threads(count)


def run_apart(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` in a thread of its own that ends with it: its result, or its exception re-raised.

    For work that runs the native kernels before another thread decodes (loading a model and building its drafters
    while a server's decoding thread waits to start). OpenMP keeps a pool of threads for each thread that starts a
    parallel region, for as long as that thread lives; with one pool left on a thread that lives on (the server's
    event loop), libgomp manages more threads than there are cores and stops spinning between the ~150 parallel
    regions of a pass: every region then wakes its threads through the kernel, and a pass of 8 rows of the default
    model took 17 ms instead of 9 on 2 cores. A thread that ends takes its pool with it."""
    out: list = []

    def body() -> None:
        try:
            out.append((True, fn(*args, **kwargs)))
        except BaseException as err:  # re-raised in the caller's thread
            out.append((False, err))

    thread = threading.Thread(target=body, name="specwise-load", daemon=True)
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


def thread_mode() -> str:
    """``auto`` (the governor decides) unless ``SPECWISE_THREADS=fixed`` (every pass on all the threads of
    :func:`get_num_threads`)."""
    mode = os.environ.get("SPECWISE_THREADS", "auto")
    if mode not in ("auto", "fixed"):
        raise ValueError(f"SPECWISE_THREADS must be auto or fixed, got {mode!r}")
    return mode


def _bucket(rows: int) -> int:
    """Passes are timed apart by their rows (their costs differ): each count up to 16, then by powers of two."""
    return rows if rows <= 16 else 16 + (rows - 1).bit_length()


class ThreadGovernor:
    """Chooses the thread count of each pass: the process's count (``most``, :func:`get_num_threads`) or one,
    whichever is faster now for passes of its size.

    Passes are timed per size (rows, :func:`_bucket`) on the count in use for that size (a running average, weight
    ``ewma``). Now and then a pass runs on the other count, and its time over the average of passes of its size on
    the count in use is the ratio that decides which count that size uses: a one-row decoding step and a 64-row
    slice of a prompt are chosen apart (on a quiet machine the first may run best on one thread while the second
    needs both; one choice for every size ran a long prompt on one thread after the decoding steps had chosen it).
    A size not tried yet runs on all the threads, unless the last ratio measured says a competitor holds a core (one
    thread under ``COMPETITOR`` of the time of all: then every size runs best on one). Tries are paid from one
    budget for all sizes: a try waits until ``budget`` of the time since the last try of any size pays for it (a
    try on two threads beside a busy process can take a hundred times a quiet pass; a speculative step's passes
    come in a dozen sizes, and a budget per size let their tries on one thread take a third of a code edit's time),
    and a size's next try at least ``min_interval`` seconds after its last."""

    COMPETITOR = 0.5  # one thread in less than this share of the time of all: another process holds a core

    def __init__(
        self, budget: float = 0.03, min_interval: float = 1.0, ewma: float = 0.25, fixed: bool | None = None
    ) -> None:
        self.budget = budget
        self.min_interval = min_interval
        self.ewma = ewma
        self.fixed = thread_mode() == "fixed" if fixed is None else fixed
        self._time: dict[tuple[int, int], float] = {}  # (size, threads) -> average seconds per pass
        self.ratio: float | None = None  # the last try's seconds on one thread / seconds on all (None: none yet)
        self._ratios: dict[int, float] = {}  # the same per size (its last try)
        self._next_try: dict[int, float] = {}  # per size: when the count not in use may be tried again
        self._next_any = 0.0  # when a try of any size may come (the budget shared by every size)
        self._most: int | None = None
        self.last: int | None = None  # the thread count of the last pass recorded

    @property
    def most(self) -> int:
        """The thread count the process was given (:func:`get_num_threads`); when it changes, what was measured on
        the old one is dropped."""
        current = get_num_threads()
        if self._most is not None and current != self._most:
            self._time.clear()
            self._ratios.clear()
            self.ratio = None
        self._most = current
        return current

    def set_fixed(self, fixed: bool) -> None:
        """Every pass on the process's count (True), or the count chosen per pass (False)."""
        self.fixed = bool(fixed)

    def in_use(self, rows: int = 1) -> int:
        """The count passes of ``rows`` rows run on between tries."""
        ratio = self._ratios.get(_bucket(rows))
        if ratio is None and self.ratio is not None and self.ratio < self.COMPETITOR:
            ratio = self.ratio  # a size not tried yet: on one thread only while a competitor holds a core
        return 1 if ratio is not None and ratio < 1.0 else self.most

    def threads(self, rows: int) -> int:
        """The thread count for a pass of ``rows`` rows; torch's own operations, where torch is loaded, follow the
        count in use."""
        most = self.most
        if self.fixed or most <= 1:
            return most
        key = _bucket(rows)
        use = self.in_use(rows)
        _follow(use)  # the rest of a step (sampling, drafting) stalls the same way
        other = most if use == 1 else 1
        comparable = (key, use) in self._time
        now = time.perf_counter()
        return other if comparable and now >= self._next_try.get(key, 0.0) and now >= self._next_any else use

    def record(self, threads: int, rows: int, seconds: float) -> None:
        """Note that a pass of ``rows`` rows took ``seconds`` on ``threads`` threads."""
        self.last = threads
        if self.fixed:
            return
        use, key = self.in_use(rows), _bucket(rows)
        if threads == use:
            old = self._time.get((key, use))
            self._time[(key, use)] = seconds if old is None else old + self.ewma * (seconds - old)
            return
        base = self._time.get((key, use))
        if base:  # a try of the other count, against passes of the same size on the count in use
            self.ratio = self._ratios[key] = seconds / base if threads == 1 else base / seconds
            self._time[(key, threads)] = seconds
        now = time.perf_counter()
        self._next_try[key] = now + max(self.min_interval, seconds / self.budget)
        self._next_any = now + seconds / self.budget
