"""``benchmarks/chaos.py``, short: the local cluster with its three real jobs while the
controller is SIGKILLed and SIGTERMed and restarted, an agent is killed and a spot notice
lands. Nothing leaks, no launcher runs twice, no healthy job is relaunched because the
controller restarted, and no launch loses more than one checkpoint interval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.chaos import EVENTS, main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc"),
]


def test_a_short_soak_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    schedule = "controller-sigkill,agent-kill,controller-sigterm,spot-notice"
    assert set(schedule.split(",")) == set(EVENTS)
    code = main(
        ["--minutes", "2", "--schedule", schedule, "--max-events", "4", "--first-event-s", "25",
         "--event-every-s", "15", "--epochs-scale", "2", "--checkpoint-every-steps", "20",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["controller_restarts"] >= 1, doc["events"]
    assert doc["kills"]["controller-sigkill"] == 1, doc["events"]
    assert doc["down_exit"] == 0
    assert doc["leaked_instances"] == 0 and doc["leaked_processes"] == 0
    assert doc["duplicate_launchers"] == 0
    assert doc["relaunches_after_controller_restart"] == 0, doc["events"]
    assert doc["progress_lost_steps_max"] <= doc["checkpoint_every_steps"], doc
