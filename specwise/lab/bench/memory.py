"""Peak resident memory, as Linux counts it: a process's high-water mark of resident pages (``VmHWM`` in
``/proc/PID/status``), the figure GNU time calls the maximum resident set size.

:class:`PeakMemory` measures this process over a stretch of work: :meth:`PeakMemory.reset` writes ``5`` to
``/proc/self/clear_refs`` (the kernel sets the mark back to the pages resident now), :meth:`PeakMemory.peak_mib`
reads the mark. What it measures is the whole process's peak while the work ran: the target's weights, every
drafter built so far and the interpreter included, not what the work alone added. :func:`process_peak_mib` reads
another process's mark over its whole life (a server's, read before it stops).

Where the files are missing (not Linux) or not writable (a sandbox), the figures are None and ``reason`` says
why; nothing here raises.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["MEASURE", "PeakMemory", "process_peak_mib"]

MEASURE = "VmHWM of /proc/self/status after writing 5 to /proc/self/clear_refs before each run (MiB)"


def _hwm_kib(status: Path) -> int:
    """The ``VmHWM`` line of a ``/proc/PID/status`` file, in KiB; OSError or ValueError where it is not there."""
    for line in status.read_text(encoding="ascii", errors="replace").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])  # "VmHWM:   123456 kB"
    raise ValueError(f"{status} has no VmHWM line")


class PeakMemory:
    """This process's peak resident memory between :meth:`reset` and :meth:`peak_mib`, or None with a ``reason``.

    ``status`` and ``clear_refs`` are the files read and written (this process's by default)."""

    def __init__(self, status: Path | str = "/proc/self/status", clear_refs: Path | str = "/proc/self/clear_refs"):
        self.status, self.clear_refs = Path(status), Path(clear_refs)
        self.reason: str | None = None
        try:
            _hwm_kib(self.status)
        except (OSError, ValueError) as err:
            self.reason = f"no peak resident memory to read ({err}): measured on Linux only"
            return
        self.reset()

    @property
    def available(self) -> bool:
        return self.reason is None

    def reset(self) -> None:
        """Set the peak back to what is resident now (nothing when unavailable)."""
        if self.reason is not None:
            return
        try:
            self.clear_refs.write_text("5", encoding="ascii")
        except OSError as err:
            self.reason = f"cannot reset the peak through {self.clear_refs} ({err})"

    def peak_mib(self) -> float | None:
        """The peak resident memory since the last :meth:`reset`, in MiB (None when unavailable)."""
        if self.reason is not None:
            return None
        try:
            return _hwm_kib(self.status) / 1024
        except (OSError, ValueError) as err:
            self.reason = f"no peak resident memory to read ({err})"
            return None

    def record(self) -> dict:
        """What results files keep: the measure, whether it was available, and why not."""
        return {"measure": MEASURE, "available": self.available, "reason": self.reason}


def process_peak_mib(pid: int | None) -> tuple[float | None, str | None]:
    """Process ``pid``'s peak resident memory over its life so far, in MiB, and None; or None and why not."""
    if pid is None:
        return None, "the process is not running"
    try:
        return _hwm_kib(Path(f"/proc/{pid}/status")) / 1024, None
    except (OSError, ValueError) as err:
        return None, f"no peak resident memory to read ({err}): measured on Linux only"
