"""``coadapt_common.procfs`` against real processes (Linux ``/proc``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coadapt_common.procfs import (
    has_procfs,
    is_running,
    native_thread_count,
    process_start_time,
    read_proc_strings,
    read_stat,
)

pytestmark = pytest.mark.skipif(not has_procfs(), reason="needs Linux /proc")


def test_reads_this_process() -> None:
    stat = read_stat(os.getpid())
    assert stat is not None
    assert stat.pid == os.getpid()
    assert stat.pgid == os.getpgrp()
    assert is_running(stat)
    assert stat.start_time is not None and stat.start_time.isdigit()
    assert process_start_time(os.getpid()) == stat.start_time
    argv = [a.encode() for a in sys.orig_argv if a]
    assert read_proc_strings(os.getpid(), "cmdline") == argv


def test_a_command_name_with_spaces_and_parens_parses(tmp_path: Path) -> None:
    odd = tmp_path / "a) b ("
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"])
    try:
        stat = None
        for _ in range(200):  # until exec has replaced the name
            stat = read_stat(child.pid)
            comm = Path(f"/proc/{child.pid}/comm").read_text().strip()
            if comm.startswith("a) b"):
                break
            time.sleep(0.005)
        assert stat is not None and is_running(stat)
        assert stat.pgid == os.getpgrp()
        assert stat.start_time is not None and stat.start_time.isdigit()
    finally:
        child.kill()
        child.wait()


def test_a_zombie_is_not_running_and_a_reaped_pid_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # exited but not reaped: a zombie
        stat = read_stat(child.pid)
        if stat is not None and stat.state == "Z":
            break
        time.sleep(0.01)
    assert stat is not None and stat.state == "Z"
    assert not is_running(stat)
    child.wait()
    assert read_stat(child.pid) is None
    assert process_start_time(child.pid) is None
    assert read_proc_strings(child.pid, "cmdline") == []


def test_native_threads_are_counted() -> None:
    import threading

    before = native_thread_count()
    assert before is not None and before >= 1
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        assert native_thread_count() == before + 1
    finally:
        release.set()
        worker.join()
