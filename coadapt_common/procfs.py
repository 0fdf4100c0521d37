"""Linux process inspection through ``/proc``: the one place that parses it.

Used by the trainer's launcher (is a recorded worker still the same process?) and by the local
provider (is this pid our agent? which processes are in this group?). Every reader returns
``None``/``[]`` for a process that does not exist or cannot be read; none raises for that.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "EXEC_WINDOW_S",
    "PROC_ROOT",
    "ProcStat",
    "has_procfs",
    "is_running",
    "machine_busy_cpu_s",
    "native_thread_count",
    "process_cpu_s",
    "process_start_time",
    "process_thread_count",
    "read_proc_strings",
    "read_stat",
]

PROC_ROOT: Final = Path("/proc")
EXEC_WINDOW_S: Final = 0.5  # bound on the post-exec instant when /proc argv/envp read empty
_DEAD_STATES: Final = frozenset({"Z", "X", "x"})  # zombie, dead


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` coadapt uses: state letter, process group and the
    kernel start time (clock ticks since boot, as the decimal string the kernel writes)."""

    pid: int
    state: str
    pgid: int
    start_time: str | None


def has_procfs() -> bool:
    """True where ``/proc`` exists (Linux); callers fall back to signal-0 probes elsewhere."""
    return PROC_ROOT.is_dir()


def read_stat(pid: int) -> ProcStat | None:
    """``/proc/<pid>/stat`` parsed, or ``None`` if there is no such (readable) process."""
    try:
        raw = (PROC_ROOT / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and ')': split after its last ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    if len(fields) < 3:
        return None
    return ProcStat(
        pid=pid,
        state=fields[0],
        pgid=int(fields[2]),
        start_time=fields[19] if len(fields) > 19 else None,
    )


def is_running(stat: ProcStat | None) -> bool:
    """True for an existing process that is neither a zombie nor dead."""
    return stat is not None and stat.state not in _DEAD_STATES


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of its stat), or ``None``. With the pid it
    identifies a process for good: a recycled pid has a different start time."""
    stat = read_stat(pid)
    return None if stat is None else stat.start_time


def read_proc_strings(pid: int, name: str, *, settle: bool = True) -> list[bytes]:
    """``/proc/<pid>/{cmdline,environ}`` as a list of NUL-separated entries ([] if unreadable).

    For an instant after ``exec`` both files read empty: the parent's ``Popen`` has already
    returned (close-on-exec fds closed) but the kernel has not yet placed the new argv/envp.
    An empty read of a live process is therefore retried for up to ``EXEC_WINDOW_S``, unless
    ``settle`` is false (scans of the whole table, where kernel threads read empty for good).
    """
    deadline = time.monotonic() + EXEC_WINDOW_S
    while True:
        try:
            raw = (PROC_ROOT / str(pid) / name).read_bytes()
        except OSError:
            return []
        if raw or not settle or time.monotonic() >= deadline or not is_running(read_stat(pid)):
            return [part for part in raw.split(b"\0") if part]
        time.sleep(0.001)


def native_thread_count() -> int | None:
    """Threads of this process as the kernel sees them (native ones included, not only Python's),
    or ``None`` where ``/proc`` cannot tell."""
    try:
        return len(list((PROC_ROOT / "self" / "task").iterdir()))
    except OSError:
        return None


def process_thread_count(pid: int) -> int | None:
    """Threads of process ``pid`` as the kernel sees them, or ``None`` if it cannot tell."""
    try:
        return len(list((PROC_ROOT / str(pid) / "task").iterdir()))
    except OSError:
        return None


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds process ``pid`` has used (fields 14 and 15 of its stat),
    or ``None``."""
    try:
        raw = (PROC_ROOT / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    if len(fields) < 13:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_BUSY_TICKS: Final = (0, 1, 2, 5, 6, 7)  # user nice system [idle iowait] irq softirq steal


def machine_busy_cpu_s(stat: str | None = None) -> float | None:
    """Busy CPU-seconds of all cores since boot (user, nice, system, irq, softirq and steal
    time; not idle or iowait), from ``/proc/stat`` or its given text; ``None`` if unreadable."""
    if stat is None:
        try:
            stat = (PROC_ROOT / "stat").read_text()
        except OSError:
            return None
    fields = stat.splitlines()[0].split() if stat else []
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    return sum(ticks[i] for i in _BUSY_TICKS if i < len(ticks)) / os.sysconf("SC_CLK_TCK")
