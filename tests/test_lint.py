"""Static checks kept in CI: ruff over the tree, mypy over autoscaler/, coadapt_common/, providers/
and trainer/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TYPED_PACKAGES = [  # the decision plane and the provider adapters: pure core and thin edges
    "autoscaler",
    "coadapt_common",
    "emulators",
    "providers",
    "trainer",
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
def test_mypy_is_clean() -> None:
    out = subprocess.run(
        [_tool("mypy"), *TYPED_PACKAGES], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    """``.ci/run`` runs the README's test command, the first bash block after "Run the tests",
    verbatim (and so on the same workers and with the same install)."""
    readme = (ROOT / "README.md").read_text()
    after = readme.split("**Run the tests**", 1)[1]
    block = after.split("```bash\n", 1)[1].split("```", 1)[0].strip()
    assert "\n" not in block and block.startswith("python3 -m venv .venv")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith(block + " ") or line == block for line in ci), block
