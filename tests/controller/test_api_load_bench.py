"""``benchmarks/api_load.py``: the documented JSON, with a few clients for a moment."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.api_load import main


def test_writes_the_documented_json_with_no_error_and_no_lost_job(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    assert main(["--clients", "8", "--seconds", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["requests"] > 0 and doc["errors"] == 0 and doc["lost_jobs"] == 0
    assert doc["jobs"] >= doc["requests"] // 3
    assert 0 < doc["p50_ms"] <= doc["p99_ms"]
