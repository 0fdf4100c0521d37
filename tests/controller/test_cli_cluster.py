"""The cluster commands as a user runs them: `coadapt up` in its own process, then submit,
status, logs, cancel and down from others (slow). `coadapt demo`: test_demo_story.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc"),
]


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_up_submit_status_logs_cancel_down(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    up = subprocess.Popen(
        [*COADAPT, "up", "--state-dir", str(state), "--interval-s", "2", "--max-gpu-slots", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (state / "up.json").exists(), "coadapt up did not come up"
        assert (state / "tokens.json").stat().st_mode & 0o777 == 0o600
        bad = tmp_path / "bad.yaml"
        bad.write_text(
            "name: x\ncommand: [train.py]\nlocal_batch_size: {max: 8}\n"
            "batch_size: {initial: 64, max: 32}\n"
        )
        refused = _run("submit", str(bad), "--state-dir", str(state), check=False)
        assert refused.returncode == 2 and "bad.yaml:4 [batch_size.max]" in refused.stderr
        assert (
            "submitted mlp-small"
            in _run("submit", "examples/jobs/mlp-small.yaml", "--state-dir", str(state)).stdout
        )
        # mlp-wide, long enough to be cancelled while it runs (2 GPUs: after mlp-small). Its
        # per-sample work is a sleep, as an accelerator's would be, and its MLP narrow: two
        # processes training a 512-wide MLP until the cancel were most of this test's CPU.
        wide = tmp_path / "mlp-wide.yaml"
        text = (ROOT / "examples/jobs/mlp-wide.yaml").read_text()  # a copy elsewhere: the
        text = text.replace("../elastic_mlp.py", str(ROOT / "examples/elastic_mlp.py"))  # script
        text = text.replace("--epochs 1 ", "--epochs 12 ").replace("--hidden 512", "--hidden 64")
        text = text.replace("--initial-batch-size", "--sample-delay-s 0.001 --initial-batch-size")
        assert all(a in text for a in ("--hidden 64", "--epochs 12", "--sample-delay-s 0.001"))
        wide.write_text(text)
        _run("submit", str(wide), "--state-dir", str(state))
        deadline = time.monotonic() + 180
        doc: dict = {}
        while time.monotonic() < deadline:
            doc = json.loads(_run("status", "--json", "--state-dir", str(state)).stdout)
            jobs = {j["name"]: j for j in doc["jobs"]}
            if jobs["mlp-small"]["status"] == "completed" and jobs["mlp-wide"]["report"]:
                break
            time.sleep(2)
        jobs = {j["name"]: j for j in doc["jobs"]}
        assert jobs["mlp-small"]["status"] == "completed", doc
        assert any(i["status"] == "running" for i in doc["instances"])
        assert "verdict: done" in _run("logs", "mlp-small", "--state-dir", str(state)).stdout
        chunk = json.loads(_run("logs", "mlp-small", "--json", "--state-dir", str(state)).stdout)
        assert chunk["job"] == "mlp-small" and "verdict: done" in chunk["text"]
        cancelled = _run("cancel", "mlp-wide", "--state-dir", str(state))
        assert "mlp-wide: cancelled" in cancelled.stdout
        table = _run("status", "--state-dir", str(state)).stdout
        assert "mlp-small" in table and "completed" in table
        _run("down", "--state-dir", str(state))
        assert up.wait(timeout=120) == 0
        assert not (state / "up.json").exists()
        gone = _run("status", "--state-dir", str(state), check=False)  # from the store
        assert gone.returncode == 0 and "no cluster is up" in gone.stderr, gone.stderr
        assert "mlp-small" in gone.stdout and "completed" in gone.stdout
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(timeout=120)
    output = up.stdout.read() if up.stdout else ""
    assert "no instance left" in output, output[-2000:]
    # up tells the story as it goes: one timestamped line per event, with its reason
    assert re.search(r"^\d\d:\d\d:\d\d launch +i-\w+: .*wanted by the plan", output, re.M), output
    assert re.search(r"^\d\d:\d\d:\d\d completion +mlp-small: completed in", output, re.M)
    assert re.search(r"^\d\d:\d\d:\d\d cancel +mlp-wide: cancelled", output, re.M)
    assert "#token=<" not in output and "Traceback" not in output


def test_describe_delete_and_submit_under_another_name(tmp_path: Path) -> None:
    """describe through the API while up and from the store after down; submit --name; an
    ended job deleted, its name submitted again, its history kept as <name>~1."""
    state = tmp_path / "cluster"
    up = subprocess.Popen(
        [*COADAPT, "up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "2"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        spec = "examples/jobs/mlp-small.yaml"
        named = _run("submit", spec, "--name", "other", "--state-dir", str(state))
        assert "submitted other" in named.stdout
        bad = _run("submit", spec, "--name", "Not_A_Name", "--state-dir", str(state), check=False)
        assert bad.returncode == 2 and "--name" in bad.stderr
        online = _run("describe", "other", "--state-dir", str(state))
        assert "no cluster is up" not in online.stderr
        assert re.search(r"^name: +other$", online.stdout, re.M), online.stdout
        busy = _run("delete", "other", "--state-dir", str(state), check=False)
        assert busy.returncode == 1 and "only an ended job" in busy.stderr, busy.stderr
        _run("cancel", "other", "--state-dir", str(state))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            gone = _run("delete", "other", "--state-dir", str(state), check=False)
            if gone.returncode == 0:
                break
            time.sleep(1)  # the next round frees its GPUs
        assert "kept as other~1" in gone.stdout, gone.stdout + gone.stderr
        again = _run("submit", spec, "--name", "other", "--state-dir", str(state))
        assert "submitted other" in again.stdout
        doc = json.loads(_run("status", "--json", "--state-dir", str(state)).stdout)
        assert [j["name"] for j in doc["jobs"]] == ["other"]
        _run("down", "--state-dir", str(state))
        assert up.wait(timeout=120) == 0
        offline = _run("describe", "other", "--state-dir", str(state))
        assert "no cluster is up" in offline.stderr
        assert re.search(r"^name: +other$", offline.stdout, re.M)
        kept = _run("describe", "other~1", "--state-dir", str(state))
        assert re.search(r"^status: +cancelled$", kept.stdout, re.M), kept.stdout + kept.stderr
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(timeout=120)
