"""A full state disk (issue 37, item 3), on a small tmpfs this test mounts (root only): a
running ``coadapt up`` whose disk fills ends with one line and a ``disk-full`` event, its store
intact (``PRAGMA integrity_check``); the job it ran is not launched again, and ``up`` on the full
disk refuses in one line, with or without the space it keeps free."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]
SLEEPER = "import time\nprint('job started', flush=True)\ntime.sleep(600)\n"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc"),
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _fill(disk: Path, name: str, leave_bytes: int) -> None:
    """Write a file that leaves about ``leave_bytes`` free on ``disk`` (0: until it is full)."""
    st = os.statvfs(disk)
    size = max(0, st.f_bavail * st.f_frsize - leave_bytes)
    try:
        with open(disk / name, "wb") as out:
            while size > 0:
                size -= out.write(b"\0" * min(size, 1 << 20))
            while not leave_bytes:
                out.write(b"\0" * 4096)
                out.flush()
    except OSError as e:
        assert e.errno == errno.ENOSPC, e


def test_a_full_state_disk_ends_up_in_one_line_keeps_the_store_and_relaunches_nothing(
    tmp_path: Path,
) -> None:
    from providers.local import LocalProvider

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    state = disk / "state"
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    spec = tmp_path / "sleeper.yaml"
    spec.write_text(
        f"name: sleeper\ncommand: [{script}]\ngpus: {{min: 1, max: 1}}\n"
        "batch_size: {initial: 32, max: 32}\nlocal_batch_size: {max: 32}\n"
    )
    up = subprocess.Popen(
        [*COADAPT, "up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "1",
         "--min-free-mib", "8"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (state / "up.json").exists(), "coadapt up did not come up"
        assert _run("submit", str(spec), "--state-dir", str(state)).returncode == 0
        deadline = time.monotonic() + 120
        logs = ""
        while "job started" not in logs and time.monotonic() < deadline:
            time.sleep(0.5)
            logs = _run("logs", "sleeper", "--state-dir", str(state)).stdout
        assert "job started" in logs
        _fill(disk, "filler", 4 << 20)  # 4 MiB left: under the 8 kept free
        assert up.wait(timeout=60) == 1
        output = up.stdout.read() if up.stdout else ""
        last = output.strip().splitlines()[-1]
        assert "Traceback" not in output, output
        assert "disk of the state folder" in last and "is full" in last, output
        assert "disk-full" in output  # the event, as up tells it
        with sqlite3.connect(state / "store.db") as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            kinds = [k for (k,) in db.execute("SELECT kind FROM events")]
        assert "disk-full" in kinds
        # Nothing is launched into the full disk: up refuses to start, with its reserve or
        # without it (what a write fails with, then, is said in one line as well).
        _fill(disk, "filler-2", 0)
        for extra in ([], ["--min-free-mib", "0"]):
            again = _run("up", "--state-dir", str(state), "--interval-s", "1", *extra)
            assert again.returncode == 1, again.stdout + again.stderr
            lines = (again.stdout + again.stderr).strip().splitlines()
            assert len(lines) == 1 and "is full" in lines[0], lines
        time.sleep(3)  # an agent's steps: it starts nothing new
        logs = b"".join(p.read_bytes() for p in (state / "logs" / "sleeper").glob("*.log"))
        assert logs.count(b"job started") == 1
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(timeout=60)
        for name in ("filler", "filler-2"):
            (disk / name).unlink(missing_ok=True)
        if (state / "local").exists():
            local = LocalProvider(state / "local")
            left = [i.instance_id for i in local.list_instances("coadapt-local")]
            if left:
                local.terminate("coadapt-local", left, "test-cleanup")
        subprocess.run(["umount", "-l", str(disk)], check=False)
