"""The cluster commands facing faults and strangers, as a user runs them (real processes):
one line for each refusal, with its fix; `coadapt down` stops only the `coadapt up` its
state folder recorded, and only for the holder of that cluster's user token."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoscaler.controller.api import generate_tokens
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.store import Store
from coadapt_common.clock import SystemClock
from coadapt_common.procfs import PROC_ROOT, is_running, process_start_time, read_stat
from tests.conftest import UNPRIVILEGED_ID, Unprivileged

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]

pytestmark = pytest.mark.skipif(not PROC_ROOT.is_dir(), reason="needs Linux /proc")


def _run(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, **kw
    )


def _one_line(out: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single stderr line of a refusal (no traceback), holding every needle."""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("coadapt: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process of this user: what a stale or crafted up.json could name."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


# ---- one line each, with its fix -------------------------------------------------------------


@pytest.mark.slow
def test_bad_up_arguments_are_refused_in_one_line(tmp_path: Path) -> None:
    slots = _run("up", "--state-dir", str(tmp_path / "s"), "--max-gpu-slots", "0")
    assert slots.returncode == 2
    _one_line(slots, "--max-gpu-slots 0", "at least 1")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    state = _run("up", "--state-dir", str(a_file))
    assert state.returncode == 2
    _one_line(state, "is a file, not a folder")


def test_a_damaged_store_is_refused_in_one_line_with_the_way_out(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "store.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 8192)
    out = _run("up", "--state-dir", str(state))
    assert out.returncode == 1
    _one_line(out, "the store is damaged", "restore", "--new-store")
    assert not (state / "up.json").exists()


def test_a_read_only_store_is_refused_in_one_line(tmp_path: Path) -> None:
    """A store file nobody may write: mode 0400 for an ordinary user; root writes any file,
    so as root the file is made immutable (chattr +i, where the file system allows it)."""
    state = tmp_path / "state"
    Store.create(state / "store.db", "coadapt-local", SystemClock()).close()
    generate_tokens(state / "tokens.json")
    store = state / "store.db"
    immutable = False
    if os.geteuid() == 0:
        try:
            made = subprocess.run(["chattr", "+i", str(store)], capture_output=True, check=False)
        except OSError as e:  # no chattr
            pytest.skip(f"cannot make a file read-only for root here: {e}")
        if made.returncode != 0:
            pytest.skip(f"cannot make a file read-only for root here: {made.stderr!r}")
        immutable = True
    else:
        os.chmod(store, 0o400)
    try:
        out = _run("up", "--state-dir", str(state))
        assert out.returncode == 1
        _one_line(out, "cannot be written", "writable")
        assert not (state / "up.json").exists()
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(store)], check=True)


# ---- down stops only the recorded up, for the holder of its token ---------------------------


def _cmdline(pid: int) -> list[str]:
    return [p.decode() for p in (PROC_ROOT / str(pid) / "cmdline").read_bytes().split(b"\0") if p]


@pytest.mark.slow
def test_down_refuses_an_up_file_naming_another_process(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    generate_tokens(state / "tokens.json")
    started = process_start_time(sleeper.pid)
    records = [
        # a stale record: the pid was reused by another process (another start time)
        {"url": "http://127.0.0.1:9", "pid": sleeper.pid, "started": "1", "cmdline": ["x"]},
        # a crafted one: the right start time, another command line
        {"url": "http://127.0.0.1:9", "pid": sleeper.pid, "started": started,
         "cmdline": [sys.executable, "-m", "autoscaler.cli", "up"]},
        # crafted to match the process itself: no coadapt up answers for it with this token
        {"url": "http://127.0.0.1:9", "pid": sleeper.pid, "started": started,
         "cmdline": _cmdline(sleeper.pid)},
        {"pid": sleeper.pid},  # not a record at all
    ]  # fmt: skip
    for record in records:
        (state / "up.json").write_text(json.dumps(record))
        out = _run("down", "--state-dir", str(state), "--timeout-s", "5")
        assert out.returncode == 1
        _one_line(out, "nothing was stopped")
        assert sleeper.poll() is None and is_running(read_stat(sleeper.pid))


@pytest.mark.slow
def test_down_of_a_copied_state_folder_with_another_token_stops_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = subprocess.Popen(
        [*COADAPT, "up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (state / "up.json").exists(), "coadapt up did not come up"
        copy = tmp_path / "copy"
        shutil.copytree(state, copy, ignore=shutil.ignore_patterns("store.db*", "local"))
        (copy / "tokens.json").unlink()
        generate_tokens(copy / "tokens.json")  # the copy's own token, not the cluster's
        out = _run("down", "--state-dir", str(copy), "--timeout-s", "5")
        assert out.returncode == 1
        _one_line(out, "not this cluster's", "nothing was stopped")
        time.sleep(1.0)
        assert up.poll() is None, "the real cluster was stopped"
        down = _run("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr
        assert up.wait(timeout=120) == 0
        assert "no instance left" in (up.stdout.read() if up.stdout else "")
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=120)


@pytest.mark.slow
def test_a_write_ahead_log_deleted_under_up_ends_it_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = subprocess.Popen(
        [*COADAPT, "up", "--state-dir", str(state), "--interval-s", "0.5", "--max-gpu-slots", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (state / "up.json").exists(), "coadapt up did not come up"
        time.sleep(1.0)
        (state / "store.db-wal").unlink()
        assert up.wait(timeout=30) == 1
        err = up.stderr.read() if up.stderr else ""
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and "write-ahead log" in lines[0], err
        assert lines[0].startswith("coadapt: ") and "start coadapt up again" in lines[0]
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


# ---- read commands read only -----------------------------------------------------------------


@pytest.mark.slow
def test_read_commands_work_on_a_read_only_state_folder(unprivileged: Unprivileged) -> None:
    """events, logs, cost report and status (of a cluster that is not up) on a state folder
    its reader may not write (a stopped cluster's, another user's copy): the audit found
    events failing there. They open the store read-only: they work and leave the folder as
    it was."""
    state = unprivileged.folder / "state"
    clock = SystemClock()
    with Store.create(state / "store.db", "coadapt-local", clock) as store:
        store.add_job("bert", JobSubmission("bert", 64, 512, 64, command=("t.py",)).to_json())
        store.add_events([(clock.now_s(), "start", "bert", "placed on i-1 (2 GPUs)")])
    (state / "logs" / "bert").mkdir(parents=True)
    (state / "logs" / "bert" / "i-1.log").write_text("step 1 loss 0.5\n")
    for path in (state, *state.rglob("*")):
        if unprivileged.as_nobody:
            os.chown(path, UNPRIVILEGED_ID, UNPRIVILEGED_ID)
    for path in (*state.rglob("*"), state):  # the folder last: it stays searchable until then
        path.chmod(0o500 if path.is_dir() else 0o400)
    before = sorted(str(p.relative_to(state)) for p in state.rglob("*"))
    cli = [sys.executable, "-m", "autoscaler.cli"]
    events = unprivileged.run([*cli, "events", "--state-dir", str(state)])
    assert events.returncode == 0, events.stderr
    assert "placed on i-1 (2 GPUs)" in events.stdout
    logs = unprivileged.run([*cli, "logs", "bert", "--state-dir", str(state)])
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == "step 1 loss 0.5\n"
    cost = unprivileged.run([*cli, "cost", "report", "--state-dir", str(state)])
    assert cost.returncode == 0, cost.stderr
    assert "coadapt-local" in cost.stdout
    status = unprivileged.run([*cli, "status", "--state-dir", str(state), "--json"])
    assert status.returncode == 0, status.stderr
    assert "no cluster is up" in status.stderr and "as its store last recorded" in status.stderr
    (job,) = json.loads(status.stdout)["jobs"]
    assert (job["name"], job["status"], job["gpus"]) == ("bert", "queued", 0)
    table = unprivileged.run([*cli, "status", "--state-dir", str(state)])
    assert table.returncode == 0, table.stderr
    assert "bert" in table.stdout and "queued" in table.stdout
    assert sorted(str(p.relative_to(state)) for p in state.rglob("*")) == before


# ---- what a job writes cannot drive the reader's terminal -------------------------------------

HOSTILE_LOG = (
    "epoch 1 loss 0.5\n"
    "\x1b]0;pwned\x07"  # set the terminal's title
    "\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\x1b[32mcoadapt: job bert completed\x1b[0m\r\n"  # a fake, coloured line
    "\x9b31mC1 CSI\tand a tab\n"  # the one-character CSI
    "\u202eevil\rover\n"  # a bidirectional override, a bare carriage return
)


@pytest.mark.slow
def test_logs_show_a_jobs_terminal_escapes_as_text_unless_raw(tmp_path: Path) -> None:
    """The audit: `coadapt logs` wrote a job's escapes raw (title change, screen clear, fake
    coloured lines) where status and events clean them. By the same rule
    (api.printable), every control character but line breaks and tabs is shown as ?."""
    state = tmp_path / "state"
    with Store.create(state / "store.db", "coadapt-local", SystemClock()) as store:
        store.add_job("bert", JobSubmission("bert", 64, 512, 64, command=("t.py",)).to_json())
    (state / "logs" / "bert").mkdir(parents=True)
    (state / "logs" / "bert" / "i-1.log").write_bytes(HOSTILE_LOG.encode())
    shown = _run("logs", "bert", "--state-dir", str(state))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (
        "epoch 1 loss 0.5\n"
        "?]0;pwned??[2J?[H?[32mcoadapt: job bert completed?[0m\n"
        "?31mC1 CSI\tand a tab\n"
        "?evil?over\n"
    )
    assert all(c.isprintable() or c in "\n\t" for c in shown.stdout)
    raw = _run("logs", "bert", "--state-dir", str(state), "--raw")
    assert raw.returncode == 0, raw.stderr
    # (read as text: the pipe's line breaks, \r included, arrive as \n)
    assert raw.stdout == HOSTILE_LOG.replace("\r\n", "\n").replace("\r", "\n")
    assert "\x1b]0;pwned\x07" in raw.stdout
