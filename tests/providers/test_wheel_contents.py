"""The built wheel ships the product, never the cloud emulators, tests or benchmarks.

Builds a real wheel with setuptools' PEP 517 backend (what ``pip wheel . --no-deps`` runs, here
without build isolation so no package index is needed) from a copy of the source tree, so the
checkout gets no ``build/`` or ``*.egg-info`` from the test, and reads its file list.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EMULATOR_MODULES = ("aws_moto.py", "gce_server.py", "gcp_env.py")


def _source_copy(dest: Path) -> Path:
    """What the build reads: the metadata files and the top-level packages, no venv or caches."""
    src = dest / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for entry in ROOT.iterdir():
        if entry.is_dir() and (entry / "__init__.py").is_file():
            shutil.copytree(entry, src / entry.name, ignore=ignore)
    return src


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    pytest.importorskip("setuptools")
    tmp = tmp_path_factory.mktemp("wheel")
    src = _source_copy(tmp)
    out = tmp / "dist"
    out.mkdir()
    build = "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", build, str(out)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_the_wheel_holds_the_product_packages(wheel_files: list[str]) -> None:
    tops = {name.split("/", 1)[0] for name in wheel_files if "/" in name}
    assert {"autoscaler", "providers", "trainer"} <= tops
    assert "providers/fake.py" in wheel_files, "the contract's behavioural fake ships"
    assert "providers/gcp/provider.py" in wheel_files
    assert "providers/aws/provider.py" in wheel_files
    assert "providers/local_agent.py" in wheel_files
    # The data the simulator and the GPU-type estimates read ship with the package.
    assert "autoscaler/data/gpu-types/speed_vs_t4.csv" in wheel_files
    assert "autoscaler/data/pollux/traces/bert/placements.csv" in wheel_files
    assert "autoscaler/data/pollux/LICENSE" in wheel_files


def test_the_wheel_holds_no_emulator_test_or_benchmark(wheel_files: list[str]) -> None:
    packages = {name.split("/", 1)[0] for name in wheel_files if name.endswith(".py")}
    assert not packages & {"emulators", "tests", "benchmarks"}, sorted(packages)
    leaked = [
        name
        for name in wheel_files
        if name.rsplit("/", 1)[-1] in (*EMULATOR_MODULES, "fake_server.py", "testing.py")
        or "moto" in name.rsplit("/", 1)[-1]
    ]
    assert leaked == []
