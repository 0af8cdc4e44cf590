"""The thread count (specwise.models.threads: get_num_threads, set_num_threads) and the thread governor: it
follows which thread count is faster, tries the other within its time budget, keeps the process's count when
fixed, and torch's count follows where torch is loaded; and the native model's results do not depend on the
thread count (so the governor changes the speed only)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from specwise.models import threads as threads_module
from specwise.models.threads import ThreadGovernor, get_num_threads, set_num_threads


@pytest.fixture
def two_threads():
    set_num_threads(2)
    yield
    set_num_threads(None)


def torch_threads() -> int | None:
    """torch's thread count where torch is loaded (it follows the governor's), else None."""
    torch = sys.modules.get("torch")
    return None if torch is None else torch.get_num_threads()


def test_the_count_is_set_by_the_process_or_the_environment(monkeypatch):
    monkeypatch.delenv("SPECWISE_NUM_THREADS", raising=False)
    set_num_threads(None)
    assert get_num_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("SPECWISE_NUM_THREADS", "3")
    assert get_num_threads() == 3
    set_num_threads(5)
    try:
        assert get_num_threads() == 5 and torch_threads() in (None, 5)
    finally:
        set_num_threads(None)
    assert get_num_threads() == 3
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="integer >= 1"):
            set_num_threads(bad)
    monkeypatch.setenv("SPECWISE_NUM_THREADS", "many")
    with pytest.raises(ValueError, match="SPECWISE_NUM_THREADS"):
        get_num_threads()


@pytest.fixture
def clock(monkeypatch):
    """A fake perf_counter the test moves by hand."""
    now = [100.0]
    monkeypatch.setattr(threads_module.time, "perf_counter", lambda: now[0])
    return now


def run(governor: ThreadGovernor, clock, seconds_on: dict[int, float], passes: int, rows: int = 1) -> list[int]:
    """``passes`` passes whose time depends on the thread count; the clock advances by each pass's time."""
    used = []
    for _ in range(passes):
        t = governor.threads(rows)
        used.append(t)
        clock[0] += seconds_on[t]
        governor.record(t, rows, seconds_on[t])
    return used


def test_a_busy_core_moves_the_passes_to_one_thread_and_back(two_threads, clock):
    governor = ThreadGovernor(fixed=False)
    quiet = {2: 0.004, 1: 0.007}
    used = run(governor, clock, quiet, 400)
    assert used[0] == 2 and governor.ratio == pytest.approx(0.007 / 0.004)
    assert used.count(1) <= 4  # a try every second at least: 400 passes take 1.6 s
    busy = {2: 0.3, 1: 0.008}  # another process takes a core: two threads stall at every join
    used = run(governor, clock, busy, 400)
    assert governor.in_use() == 1 and torch_threads() in (None, 1)  # torch's own operations follow
    tries = used[used.index(1) :].count(2)
    assert tries * 0.3 <= 0.03 * 400 * 0.008 + 0.3  # two-thread tries cost about 3% of the time
    used = run(governor, clock, quiet, 4000)  # the other process ends: the next try finds two threads faster
    assert governor.in_use() == 2 and used[-100:] == [2] * 100 and torch_threads() in (None, 2)


def test_sizes_are_compared_with_their_own_kind(two_threads, clock):
    governor = ThreadGovernor(fixed=False)
    governor.record(2, 8, 0.010)  # an 8-row pass on two threads
    assert governor.threads(1) == 2  # a 1-row pass has nothing on two threads to be compared with: no try
    governor.record(2, 1, 0.004)
    assert governor.threads(1) == 1  # now it has


def test_each_size_keeps_its_own_choice(two_threads, clock):
    """One-row steps that run best on one thread do not send a prompt's 64-row slices to one thread."""
    governor = ThreadGovernor(fixed=False)
    run(governor, clock, {2: 0.004, 1: 0.003}, 400)  # decoding steps: one thread is faster (joins cost more)
    assert governor.in_use(1) == 1
    used = run(governor, clock, {2: 0.5, 1: 0.9}, 40, rows=64)  # a prompt's slices: two threads are faster
    # a size not tried yet runs on both (the steps' mild preference says nothing of it), and its one try confirms it
    assert governor.in_use(64) == 2 and used[0] == 2 and used.count(1) <= 2 and used[-30:].count(1) <= 1
    assert governor.in_use(1) == 1  # the steps keep theirs
    used = run(governor, clock, {2: 0.004, 1: 0.003}, 50)
    assert used.count(2) <= 1


def test_a_competitor_moves_the_sizes_not_tried_yet_to_one_thread(two_threads, clock):
    """A ratio that only a busy core explains (one thread several times faster) sends every size not tried yet to
    one thread; a mild one (one thread a little faster on one-row steps of a quiet machine) does not."""
    governor = ThreadGovernor(fixed=False)
    run(governor, clock, {2: 0.004, 1: 0.0036}, 400)
    assert governor.in_use(1) == 1 and governor.in_use(8) == 2
    governor = ThreadGovernor(fixed=False)
    run(governor, clock, {2: 0.3, 1: 0.008}, 400)
    assert governor.in_use(1) == 1 and governor.in_use(8) == 1


def test_the_tries_of_every_size_share_one_budget(two_threads, clock):
    """A speculative step's passes come in many sizes: their tries on the slower count together cost about the
    budget, not the budget once per size."""
    governor = ThreadGovernor(fixed=False)
    spent = extra = 0.0
    for i in range(6000):
        rows = 1 + i % 12  # a dozen sizes in turn
        quiet = 0.01 * (1 + rows / 4)  # two threads
        t = governor.threads(rows)
        seconds = quiet if t == 2 else 1.8 * quiet
        clock[0] += seconds
        spent += seconds
        extra += seconds - quiet
        governor.record(t, rows, seconds)
    assert extra <= 1.5 * governor.budget * spent


def test_fixed_never_changes_the_count(two_threads, clock, monkeypatch):
    monkeypatch.setenv("SPECWISE_THREADS", "fixed")
    governor = ThreadGovernor()
    assert governor.fixed
    assert set(run(governor, clock, {2: 0.3, 1: 0.001}, 50)) == {2} and get_num_threads() == 2
    monkeypatch.setenv("SPECWISE_THREADS", "sometimes")
    with pytest.raises(ValueError, match="SPECWISE_THREADS"):
        ThreadGovernor()


def test_the_native_model_gives_the_same_logits_on_any_thread_count(two_threads, tmp_path):
    from gguf_raw import tiny_model

    from specwise.models.kernels import quant

    if not quant.quantized_available():
        pytest.skip("the native quantized kernels are not built")
    from specwise.models.quantized import QuantizedModel

    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_model().bytes())
    model = QuantizedModel(path, huge_pages=False)
    model.fix_threads(True)
    ids = np.random.default_rng(0).integers(0, 96, 80)
    outs = []
    for count in (1, 2):
        set_num_threads(count)
        model.rollback(0)
        outs.append([model.forward(ids[:70]), model.forward(ids[70:75]), model.forward(ids[75:76])])
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_a_thread_count_set_by_the_user_is_kept(two_threads, clock):
    governor = ThreadGovernor(fixed=False)
    run(governor, clock, {2: 0.004, 1: 0.007}, 50)
    assert governor.in_use() == 2
    set_num_threads(1)  # the user asks for one thread: the governor follows, and never raises it again
    assert set(run(governor, clock, {2: 0.004, 1: 0.007}, 300)) == {1} and get_num_threads() == 1
    assert torch_threads() in (None, 1)


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def _settled(count: int) -> int:
    """The process's thread count once threads that are ending have ended (at most 5 s)."""
    import time

    for _ in range(100):
        if _tasks() <= count:
            break
        time.sleep(0.05)
    return _tasks()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux /proc")
def test_work_run_apart_leaves_no_openmp_threads_behind(two_threads, tmp_path):
    """OpenMP keeps a pool of threads for each thread that starts a parallel region while that thread lives, and one
    pool too many stops libgomp spinning between a pass's regions (the server's passes took 17 ms instead of 9):
    loading run apart leaves no pool, where the same work on a thread that lives on leaves one."""
    import threading

    from gguf_raw import tiny_model

    from specwise.models.kernels import quant

    if not quant.quantized_available():
        pytest.skip("the native quantized kernels are not built")
    from specwise.models.quantized import QuantizedModel
    from specwise.models.threads import run_apart

    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_model().bytes())
    ids = list(range(1, 40))

    def load_and_pass():
        model = QuantizedModel(path, huge_pages=False)
        model.fix_threads(True)  # every pass on both threads: a parallel region of two
        model.forward(ids)
        return model

    before = _settled(_tasks())
    model = run_apart(load_and_pass)
    assert _settled(before) == before
    # the control: the same work on a thread that stays alive leaves that thread and its pool's worker
    done, release = threading.Event(), threading.Event()

    def stays():
        load_and_pass()
        done.set()
        release.wait()

    thread = threading.Thread(target=stays, daemon=True)
    thread.start()
    done.wait()
    assert _tasks() >= before + 2
    release.set()
    thread.join()
    assert _settled(before) == before
    with pytest.raises(ZeroDivisionError):  # an exception comes back to the caller
        run_apart(lambda: 1 / 0)
    assert model.forward([1])[0].shape == (model.vocab_size,)
