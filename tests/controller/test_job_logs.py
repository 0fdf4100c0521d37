"""Bounded job logs (issue 37, item 3): a job's output goes through its own capped writer
(``coadapt_common.logcap``), never past ``log_max_bytes`` on disk, with stable offsets and a
line that says what was dropped; an agent starts no launcher while the disk is full."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from autoscaler.controller.agent import JobAssignment, Supervisor
from autoscaler.controller.api import read_job_logs
from coadapt_common.logcap import meta_path, older_path, run_writer, segments

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc")

# Writes 1 GiB as fast as it can (1 MiB at a time), then one last line.
FLOOD = r"""
import os, sys
block = (b"x" * 1023 + b"\n") * 1024
for _ in range(1024):
    os.write(1, block)
os.write(1, b"the last line\n")
"""


def _job(name: str) -> JobAssignment:
    return JobAssignment(name, 1, (("i-a", 1),), "127.0.0.1:1", ("flood.py",))


def _wait_ended(sup: Supervisor, timeout_s: float) -> list:
    deadline = time.monotonic() + timeout_s
    ended: list = []
    while not ended and time.monotonic() < deadline:
        ended = sup.poll()
        time.sleep(0.05)
    return ended


def _wait_drained(path: Path, text: bytes, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_bytes()[-4096:]:
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never reached {path}")


@pytest.mark.slow
def test_a_1_gib_log_is_capped_at_the_configured_size(tmp_path: Path) -> None:
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    cap = 8 << 20
    sup = Supervisor(
        f"test-{uuid.uuid4().hex[:8]}",
        tmp_path / "agent",
        argv_for=lambda a: [sys.executable, str(script)],
        logs_dir=tmp_path / "logs",
        log_max_bytes=cap,
    )
    started = time.monotonic()
    sup.start(_job("flood"))
    ended = _wait_ended(sup, 120)
    assert [(j, o.value) for j, o, _ in ended] == [("flood", "done")]
    log = sup.log_path("flood")
    _wait_drained(log, b"the last line\n")
    elapsed_s = time.monotonic() - started
    on_disk = sum(p.stat().st_size for p in (log, older_path(log)))
    assert cap // 2 <= on_disk <= cap, on_disk  # 1 GiB written, at most the cap kept
    written = 1024 * 1024 * 1024 + len(b"the last line\n")
    seg = segments(log)
    assert seg.total_bytes == written and seg.dropped_bytes >= written - cap
    chunk = read_job_logs(tmp_path / "logs", "flood")
    dropped_mib = (written - on_disk) / (1 << 20)
    assert chunk.text.startswith(f"[coadapt: {dropped_mib:.1f} MiB of this log were dropped here")
    assert "coadapt up --job-log-max-mib" in chunk.text.splitlines()[0]
    assert chunk.instances == ((sup.agent_id, written),)  # offsets count every byte
    tail = read_job_logs(tmp_path / "logs", "flood", offset=written - 14)
    assert tail.text == "the last line\n" and tail.next_offset == written
    print(f"1 GiB through the capped writer in {elapsed_s:.1f} s")


def _write_through(path: Path, blocks: list[bytes], max_bytes: int) -> None:
    read_end, write_end = os.pipe()
    writer = threading.Thread(target=run_writer, args=(read_end, path, max_bytes))
    writer.start()
    for block in blocks:
        os.write(write_end, block)
    os.close(write_end)
    writer.join(30)
    os.close(read_end)


def test_offsets_stay_stable_across_rotations_and_a_follower_is_told_what_it_missed(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    path = logs / "job" / "i-1.log"
    lines = [f"line {i:06d} {'y' * 60}\n".encode() for i in range(5000)]  # 360 KB
    _write_through(path, lines[:100], 64 << 10)
    first = read_job_logs(logs, "job")
    assert first.text.encode() == b"".join(lines[:100])
    _write_through(path, lines[100:], 64 << 10)  # a relaunch: the same log goes on
    assert path.stat().st_size + older_path(path).stat().st_size <= 64 << 10
    seg = segments(path)
    assert seg.total_bytes == sum(len(x) for x in lines)
    later = read_job_logs(logs, "job", offset=first.next_offset)  # where the follower was
    note, rest = later.text.split("\n", 1)
    assert note.startswith("[coadapt: ") and "dropped here" in note
    assert rest.encode() == b"".join(lines)[seg.dropped_bytes :]
    assert later.next_offset == seg.total_bytes
    assert not meta_path(path).name.endswith(".log")  # never listed as an instance's log
    assert [k for k, _ in read_job_logs(logs, "job").instances] == ["i-1"]


def test_a_log_written_without_the_writer_reads_as_before(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "i-1.log").write_text("step 10\n")
    chunk = read_job_logs(tmp_path, "job")
    assert chunk.text == "step 10\n" and chunk.next_offset == 8


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_an_agent_starts_no_launcher_on_a_full_disk(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        sup = Supervisor(
            "test-full",
            disk / "agent",
            argv_for=lambda a: [sys.executable, "-c", "import time; time.sleep(1); print('ran')"],
            logs_dir=disk / "logs",
            min_free_bytes=4 << 20,
        )
        (disk / "filler").write_bytes(b"\0" * (5 << 20))
        assert sup.start(_job("j")) is None and sup.running == {}
        assert sup.start(_job("j")) is None  # said once, refused each time
        (disk / "filler").unlink()
        assert sup.start(_job("j")) is not None
        filler = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)  # the disk fills now
        with pytest.raises(OSError):
            while True:
                os.write(filler, b"\0" * 65536)
        os.close(filler)
        # the agent goes on: the job's end is still read (processes.json cannot be written)
        assert [j for j, _, _ in _wait_ended(sup, 30)] == ["j"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_the_failure_cause_is_found_across_a_rotation(tmp_path: Path) -> None:
    from autoscaler.controller.agent import failure_cause

    path = tmp_path / "job" / "i-1.log"
    last = b"ValueError: the data file is broken\n"
    filler = b"z" * 99 + b"\n"
    body = filler * ((32768 - len(last)) // len(filler))
    body += b"y" * (32768 - len(last) - len(body) - 1) + b"\n"
    _write_through(path, [body, last, b"coadapt-launch: verdict: failed\n"], 64 << 10)
    assert path.read_bytes() == b"coadapt-launch: verdict: failed\n"  # rotated just before
    assert failure_cause(path, 1) == "exit status 1: ValueError: the data file is broken"
