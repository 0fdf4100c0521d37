"""``benchmarks/api_load.py`` against a real ``coadapt up`` in its own process, with a few
clients and a hundred stalled connections for a few seconds: no error, no lost job, the job
list answered a page at a time, and the server's threads bounded however many connections
it holds (a thread per connection would show 100 more)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.api_load import main


@pytest.mark.slow
def test_a_real_up_under_load_and_stalled_clients(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    assert main(["--clients", "8", "--seconds", "4", "--half-open", "100", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["target"] == "coadapt up"
    assert doc["requests"] > 0 and doc["errors"] == 0 and doc["lost_jobs"] == 0
    assert doc["jobs"] >= doc["requests"] // 3
    assert 0 < doc["p50_ms"] <= doc["p99_ms"]
    assert doc["jobs"] > 100 + doc["clients"]  # so the first page is a page, not the whole list
    assert doc["list_jobs_max"] == 100, doc  # a page, however many jobs there are
    assert doc["list_bytes_max"] < 100 * 1024, doc  # a page of jobs of under 1 KiB each
    # the up process: main, rounds, API loop and 8 workers, a few more of its own; never a
    # thread per connection (100 stalled, 8 clients)
    assert doc["server_threads_max"] < 40, doc


def test_in_process_with_a_few_clients(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    assert main(["--clients", "4", "--seconds", "1", "--in-process", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["requests"] > 0 and doc["errors"] == 0 and doc["lost_jobs"] == 0
    # each client submits, reads back and lists, in turn: every submission stored once
    assert doc["requests"] == 3 * doc["jobs"], doc
    # the first page: a page (the last lists saw every job but what other clients added since)
    assert min(100, doc["jobs"] - doc["clients"]) <= doc["list_jobs_max"] <= 100, doc
