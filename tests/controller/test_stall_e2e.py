"""Issue 37, items 1 and 5, on a real cluster: ``coadapt up`` (local provider, its own
process) is stopped with SIGSTOP for three heartbeat timeouts while a real torchrun job
trains, then continued with SIGCONT. Its agents kept running and heartbeating into the void;
the controller, once running again, must not count its own stall against them: no instance is
released, no job is restarted (the trainer's own report says the same run goes on). Then the
instance's node agent is killed with kill -9: the instance starts it again, and the new agent
adopts the running launcher (the same trainer run goes on), and the restart is an event.

The heartbeat timeout is small (``--heartbeat-timeout-s 10``, agents polling every second) so
the test is short; the rule is the same at the default."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoscaler.controller.store import Store
from coadapt_common.clock import SystemClock
from trainer.report import TrainerReport

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]
ENV = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
TIMEOUT_S = 10.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc"),
]

EXAMPLE = ROOT / "examples" / "elastic_mlp.py"
SPEC = f"""\
name: stall
command: [{EXAMPLE}, --epochs, 200, --initial-batch-size, 64, --num-samples, 1024,
          --step-delay-s, 0.05]
gpus: {{min: 1, max: 1}}
batch_size: {{initial: 64, max: 64}}
local_batch_size: {{max: 64}}
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=180, env=ENV
    )


def _up_pid(state: Path) -> int | None:
    try:
        return int(json.loads((state / "up.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _latest(state: Path) -> TrainerReport | None:
    with Store.open(state / "store.db", SystemClock()) as store:
        row = store.latest_report("stall")
    return None if row is None else TrainerReport.from_json(row.payload_json)


def _instances(state: Path) -> dict[str, tuple[str, list[str]]]:
    """Each instance row: its status and the reasons in its history."""
    with Store.open(state / "store.db", SystemClock()) as store:
        return {
            r.instance_key: (r.status.value, [h.reason for h in store.history(r.instance_key)])
            for r in store.list_instances()
        }


def _agent_pid(key: str) -> int | None:
    """The node agent process (``... service agent ... --instance-key KEY``) of ``key``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv[:1] != [b"/bin/sh"]
            and b"autoscaler.controller.service" in argv
            and (b"--instance-key" in argv and key.encode() in argv)
        ):
            return int(entry.name)
    return None


def _restart_events(state: Path) -> list:
    with Store.open(state / "store.db", SystemClock()) as store:
        return [e for e in store.events_after(0) if e.kind == "agent-restart"]


def test_a_stopped_controller_releases_no_instance_and_restarts_no_job(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    spec = tmp_path / "stall.yaml"
    spec.write_text(SPEC)
    argv = [
        "up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "1",
        "--agent-interval-s", "1", "--heartbeat-timeout-s", str(TIMEOUT_S),
    ]  # fmt: skip
    log = (tmp_path / "up.out").open("w")
    up = subprocess.Popen(
        [*COADAPT, *argv], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=ENV
    )
    try:
        deadline = time.monotonic() + 60
        while _up_pid(state) != up.pid and time.monotonic() < deadline:
            assert up.poll() is None, (tmp_path / "up.out").read_text()
            time.sleep(0.2)
        out = _run("submit", str(spec), "--state-dir", str(state))
        assert out.returncode == 0, out.stdout + out.stderr
        deadline = time.monotonic() + 180
        before = _latest(state)
        while (before is None or before.step < 3) and time.monotonic() < deadline:
            time.sleep(0.5)
            before = _latest(state)
        assert before is not None and before.step >= 3, (tmp_path / "up.out").read_text()
        held = {k for k, (status, _) in _instances(state).items() if status == "running"}
        assert len(held) == 1

        up.send_signal(signal.SIGSTOP)  # a GC pause, a live migration, a suspended laptop
        time.sleep(3 * TIMEOUT_S)
        up.send_signal(signal.SIGCONT)
        time.sleep(2 * TIMEOUT_S)  # rounds after the resume, agents heard again

        after = _latest(state)
        instances = _instances(state)
        for key in held:
            status, reasons = instances[key]
            assert status == "running", (key, status, reasons)
            assert "agent stopped heartbeating" not in reasons, reasons
        assert set(instances) == held, instances  # nothing released, nothing replaced
        assert after is not None
        # The same run of the trainer goes on: same attempt and start, further along.
        assert (after.attempt, after.started_at_s) == (before.attempt, before.started_at_s)
        assert after.step > before.step
        text = (tmp_path / "up.out").read_text()
        assert "released" not in text and "stopped on" not in text, text

        (key,) = held
        agent = _agent_pid(key)
        assert agent is not None
        os.kill(agent, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not _restart_events(state) and time.monotonic() < deadline:
            time.sleep(0.5)  # the instance (local_agent.py) starts its agent again
        (event,) = _restart_events(state)
        assert event.subject == key and "adopted the running launcher of stall" in event.message
        assert _agent_pid(key) not in (None, agent)
        time.sleep(3.0)
        again = _latest(state)
        assert again is not None
        assert (again.attempt, again.started_at_s) == (before.attempt, before.started_at_s)
        assert again.step >= after.step
        status, reasons = _instances(state)[key]
        assert status == "running" and "agent stopped heartbeating" not in reasons
    finally:
        up.send_signal(signal.SIGCONT)
        down = _run("down", "--state-dir", str(state))
        try:
            up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        log.close()
    assert down.returncode == 0, down.stdout + down.stderr
