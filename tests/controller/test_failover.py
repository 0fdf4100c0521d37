"""Two real ``coadapt up`` processes on one real PostgreSQL store (the local provider, three
real training jobs): the leader is SIGKILLed at random points of its round and frozen past its
lease (SIGSTOP, then SIGCONT). ``benchmarks/failover.py`` runs the scenario (it starts its own
PostgreSQL server, as the tests' fixture does); here with two kills and one freeze."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.failover import INTERVAL_S, main
from emulators.postgres_server import postgres_unavailable

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc"),
    pytest.mark.skipif(postgres_unavailable() is not None, reason="no PostgreSQL server here"),
]


def test_jobs_run_through_leader_kills_and_a_frozen_leader(tmp_path: Path) -> None:
    out = tmp_path / "failover.json"
    assert main(["--kills", "2", "--stops", "1", "--epochs", "48", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["kills"] == 2 and got["stops"] >= 1
    assert got["takeover_s_max"] <= 2 * INTERVAL_S, got["takeover_s"]
    assert got["jobs_completed"] == got["jobs"] == 3, got["samples"]
    assert got["jobs_exact"] == 3, got["samples"]  # the trainers' own step logs
    for trained, repeated, data_epochs in got["samples"].values():  # none lost or twice
        assert repeated == 0 and trained >= 48 * 1024 and data_epochs >= 48, got["samples"]
    for progress, target, done in got["final_report"].values():  # reports reach a pair
        assert done is True and target is not None and progress >= target, got["final_report"]
    assert got["duplicate_launches"] == 0
    assert got["leaked_instances"] == 0
    assert got["healthy_relaunches"] == 0, got["launchers"]
    # Frozen inside its round (after its lease renewal) and woken past its lease, the leader
    # carries on with its round: its write is refused by epoch (the store's counter).
    assert got["stale_writes_refused"] >= 1, got["freeze_tries"]
    assert got["final_epoch"] >= 1 + got["kills"] + got["stops"]
