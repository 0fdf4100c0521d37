"""Failures as a user meets them on a real local cluster (`coadapt up` in its own process,
the other commands from others, at 80 columns): a failing job's cause in `status` (one line)
and `status --json` from its first failure (how the line reads once it has failed for good:
tests/cli/test_cli_ux.py); `logs -f` on a queued job (queued while no `coadapt up` runs: `logs`
reads the state folder) waits for it and follows it to its end once an `up` runs it; once
`coadapt up` was killed (SIGKILL), `status` says in one line that the controller cannot be
reached, `logs` still reads the state folder, and `down` says how to take the fleet back
(not "remove up.json"). An API refusal (cancel of an ended job) and an unknown job are one
line each, without an HTTP code. No traceback anywhere."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoscaler.controller.jobspec import load_job_spec
from autoscaler.controller.store import Store
from coadapt_common.clock import SystemClock

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]
ENV = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc"),
]

FAILING_SCRIPT = """\
import sys
print("loading the dataset", flush=True)
raise RuntimeError("the dataset at /nowhere/data is missing")
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV
    )


def _clean(out: subprocess.CompletedProcess[str]) -> None:
    text = out.stdout + out.stderr
    assert "Traceback" not in text and "╭" not in text, text
    assert not re.search(r"coadapt: [45]\d\d\b", text), text


def _status(state: Path) -> dict:
    out = _run("status", "--json", "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    return {j["name"]: j for j in json.loads(out.stdout)["jobs"]}


def _up(state: Path) -> subprocess.Popen[str]:
    argv = ["up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "2"]
    up = subprocess.Popen(
        [*COADAPT, *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
    )
    deadline = time.monotonic() + 60
    while _up_pid(state) != up.pid and time.monotonic() < deadline:
        assert up.poll() is None, up.stdout.read() if up.stdout else ""
        time.sleep(0.1)
    assert _up_pid(state) == up.pid, "coadapt up did not come up"
    return up


def _up_pid(state: Path) -> int | None:
    """The pid in the state folder's up.json (None: none, or being written)."""
    try:
        return int(json.loads((state / "up.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def test_failed_job_cause_logs_follow_and_down_after_a_killed_up(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    script = tmp_path / "load_data.py"
    script.write_text(FAILING_SCRIPT)
    script.chmod(0o644)  # as root the job runs as its own user: readable whatever the umask
    spec = tmp_path / "broken.yaml"
    spec.write_text(
        f"name: broken\ncommand: [{script}]\ngpus: {{min: 1, max: 1}}\n"
        "batch_size: {initial: 32, max: 32}\nlocal_batch_size: {max: 32}\n"
    )
    small = (ROOT / "examples/jobs/mlp-small.yaml").read_text()
    small = small.replace("../elastic_mlp.py", str(ROOT / "examples/elastic_mlp.py"))  # copied
    one = tmp_path / "mlp-small.yaml"  # one GPU: it runs beside the broken job
    one.write_text(small.replace("gpus: {min: 1, max: 2}", "gpus: {min: 1, max: 1}"))
    first = _up(state)  # makes the cluster's store and tokens; stopped, it keeps them
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0
    # mlp-small queued while no controller runs (written to the store as the API writes it)
    with Store.open(state / "store.db", SystemClock()) as store:
        store.add_job("mlp-small", load_job_spec(one).submission().to_json())
    followed, told = tmp_path / "follow.out", tmp_path / "follow.err"
    with followed.open("w") as out_file, told.open("w") as err_file:
        follow = subprocess.Popen(
            [*COADAPT, "logs", "-f", "mlp-small", "--state-dir", str(state), "--timeout-s", "150"],
            cwd=ROOT,
            stdout=out_file,
            stderr=err_file,
            text=True,
            env=ENV,
        )
    deadline = time.monotonic() + 30
    while "queued" not in told.read_text() and time.monotonic() < deadline:
        assert follow.poll() is None, told.read_text()
        time.sleep(0.2)
    assert "mlp-small is queued; waiting for it to start" in told.read_text()
    up = _up(state)
    try:
        assert _run("submit", str(spec), "--state-dir", str(state)).returncode == 0
        assert follow.wait(timeout=180) == 0, told.read_text()
        assert "verdict: done" in followed.read_text()  # followed from the queue to its end
        # its first failure: queued again (up to 3 times), the cause its reason already
        deadline = time.monotonic() + 150
        jobs = _status(state)
        while not jobs["broken"]["retries"] and time.monotonic() < deadline:
            time.sleep(1)
            jobs = _status(state)
        broken = jobs["broken"]
        assert broken["retries"] >= 1, broken
        assert "RuntimeError: the dataset at /nowhere/data is missing" in broken["reason"]
        assert broken["reason"].startswith("exit status ")
        table = _run("status", "--state-dir", str(state))
        _clean(table)
        (line,) = [x for x in table.stdout.splitlines() if x.startswith("broken (")]
        assert re.match(r"broken \((queued|running|failed)(, retry \d)?\): ", line), line
        assert "RuntimeError: the dataset at /nowhere/data is missing" in line
        assert max(len(x) for x in table.stdout.splitlines() if x != line) <= 80
        ended = _run("cancel", "mlp-small", "--state-dir", str(state))  # the API answers 409
        _clean(ended)
        assert ended.returncode == 1
        assert ended.stderr.startswith("coadapt: job 'mlp-small' already ended (completed); ")
        unknown = _run("logs", "nosuch", "--state-dir", str(state))
        _clean(unknown)
        assert unknown.returncode == 1 and unknown.stderr.startswith("coadapt: no job 'nosuch'")

        up.send_signal(signal.SIGKILL)
        up.wait(timeout=30)
        gone = _run("status", "--state-dir", str(state))
        _clean(gone)
        assert gone.returncode == 1
        (message,) = gone.stderr.splitlines()
        assert message.startswith("coadapt: cannot reach the cluster's controller")
        assert f"coadapt up --state-dir {state}" in message
        logs = _run("logs", "mlp-small", "--state-dir", str(state))
        assert logs.returncode == 0 and "verdict: done" in logs.stdout, logs.stderr
        failed_logs = _run("logs", "broken", "--state-dir", str(state))  # the job's own
        assert "RuntimeError: the dataset at /nowhere/data is missing" in failed_logs.stdout
        # down needs no up: it releases what the killed one left (test_cli_lifecycle.py)
        down = _run("down", "--state-dir", str(state))
        _clean(down)
        assert down.returncode == 0, down
        assert f"its coadapt up (pid {up.pid}) is gone" in down.stdout, down.stdout
        assert "no instance left" in down.stdout, down.stdout
    finally:
        if follow.poll() is None:
            follow.terminate()
            follow.wait(timeout=30)
        if up.poll() is None:
            up.terminate()
            up.wait(timeout=120)
        from providers.local import LocalProvider

        LocalProvider(state / "local").down("coadapt-local")  # the fleet the killed up left
