"""The ``coadapt`` command line, run as a real console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from autoscaler import __version__


def _coadapt(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("coadapt")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "autoscaler.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60)


def test_version() -> None:
    out = _coadapt("version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"coadapt {__version__}"


def test_help_lists_commands() -> None:
    out = _coadapt("--help")
    assert out.returncode == 0, out.stderr
    assert "version" in out.stdout
    assert "goodput" in out.stdout.lower()
