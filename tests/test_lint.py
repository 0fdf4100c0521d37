"""Static checks kept in CI: ruff over the tree, mypy over the pure core."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE_CORE = [
    "autoscaler/goodput.py",
    "autoscaler/speedup.py",
    "autoscaler/errors.py",
    "autoscaler/clock.py",
    "autoscaler/atomic.py",
    "autoscaler/jobs.py",
    "autoscaler/traces.py",
    "autoscaler/policy",
    "autoscaler/sim",
    "providers/base.py",
    "providers/errors.py",
    "providers/tags.py",
    "providers/retry.py",
    "providers/capacity.py",
    "providers/fake.py",
]


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def test_ruff_is_clean() -> None:
    out = subprocess.run(
        [_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_mypy_is_clean_on_the_pure_core() -> None:
    out = subprocess.run(
        [_tool("mypy"), *PURE_CORE], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
