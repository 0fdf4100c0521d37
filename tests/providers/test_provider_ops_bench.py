"""``benchmarks/provider_ops.py``: the JSON it writes, and calls that do not grow with N."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.provider_ops import main


def run(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "out" / "result.json"
    assert main([*args, "--out", str(out)]) == 0
    assert not list(out.parent.glob("*.tmp")), "written atomically, no temporaries left"
    return json.loads(out.read_text())


def check_schema(doc: dict[str, object], provider: str, instances: int) -> None:
    assert set(doc) == {"provider", "instances", "calls", "wall_s"}
    assert doc["provider"] == provider and doc["instances"] == instances
    for key in ("calls", "wall_s"):
        section = doc[key]
        assert isinstance(section, dict) and set(section) == {"launch", "list", "terminate"}
    assert all(isinstance(v, int) and v >= 1 for v in doc["calls"].values())  # type: ignore[union-attr]
    # Each phase did real work (processes, sockets or dictionaries), so it took some time, and
    # none hung: a few hundred instances of the fake or local cloud take well under a minute.
    assert all(0.0 < v < 60.0 for v in doc["wall_s"].values())  # type: ignore[union-attr]


def test_fake_calls_do_not_grow_with_instances(tmp_path: Path) -> None:
    small = run(tmp_path, "--provider", "fake", "--instances", "5")
    large = run(tmp_path, "--provider", "fake", "--instances", "900")
    check_schema(small, "fake", 5)
    check_schema(large, "fake", 900)
    assert small["calls"] == large["calls"] == {"launch": 1, "list": 1, "terminate": 1}


def test_fake_calls_grow_with_pools(tmp_path: Path) -> None:
    doc = run(tmp_path, "--provider", "fake", "--instances", "500", "--pool-capacity", "200")
    assert doc["calls"] == {"launch": 3, "list": 1, "terminate": 1}


def test_local_counts_spawns_scans_and_signals(tmp_path: Path) -> None:
    doc = run(tmp_path, "--provider", "local", "--instances", "3")
    check_schema(doc, "local", 3)
    # launch: one scan + one spawn each; list: one scan; terminate: one scan + one SIGTERM each.
    assert doc["calls"] == {"launch": 4, "list": 1, "terminate": 4}


def test_bad_instance_count_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--provider", "fake", "--instances", "0", "--out", str(tmp_path / "x.json")])
