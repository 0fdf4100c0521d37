"""Shared test configuration."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Deterministic hypothesis runs (property tests are seeded, never flaky).
try:
    from hypothesis import settings

    settings.register_profile("coadapt", derandomize=True, deadline=None, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "coadapt"))
except ImportError:  # pragma: no cover - hypothesis is a dev dependency
    pass


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files that hold a slow test run first, each file's tests kept together and in order:
    with workers (``-n``, files dealt out whole by ``--dist loadfile``) the long files start at
    once and the short ones fill in around them, and a module's fixtures are built once."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: (item.path not in slow_files, _longest_rank(item.path)))


LONGEST_FILES = (
    "tests/trainer/test_lightning_e2e.py",
    "tests/trainer/test_hf_e2e_local.py",
    "tests/controller/test_chaos_bench.py",
    "tests/trainer/test_lightning_integration.py",
    "tests/trainer/test_hf_integration.py",
)
"""The files that take longest (minutes each, mostly waiting on real clusters and launches):
dealt out first, so that none of them starts last on an otherwise idle machine (a fresh-clone
``.ci/run`` once ended with the Lightning e2e test running alone for its last five minutes)."""


def _longest_rank(path: Path) -> int:
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    return LONGEST_FILES.index(rel) if rel in LONGEST_FILES else len(LONGEST_FILES)


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture
def jobs_tmp_path() -> Iterator[Path]:
    """A temporary folder the jobs of a local cluster may write into: run as root, each job
    runs as its own user (``coadapt_common.jobexec``), and ``tmp_path`` is behind pytest's
    0700 base folder. Open to all, sticky (as ``/tmp``), removed after the test."""
    folder = Path(tempfile.mkdtemp(prefix="coadapt-jobs-"))
    os.chmod(folder, 0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _umask_restored() -> Iterator[None]:
    """Each test ends with the worker's umask as it began: ``coadapt up`` and ``down`` set
    077 for their process, and a test that runs them in-process (typer's runner) would leave
    it to the next test in the same worker (whose files, a job's script included, would then
    be unreadable by an isolated job's user)."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


@pytest.fixture(autouse=True)
def _aws_adapter_calls_stay_declared():
    """Every test that drives the AWS adapter (through ``emulators.aws_moto.make_provider``)
    holds it to the operations its IAM policy grants (``providers.aws.permissions``)."""
    yield
    import sys

    moto_helpers = sys.modules.get("emulators.aws_moto")
    if moto_helpers is None:
        return
    from providers.aws.permissions import ADAPTER_OPERATIONS

    undeclared = sorted(moto_helpers.OPERATIONS_SEEN.take() - ADAPTER_OPERATIONS)
    assert not undeclared, (
        f"the AWS adapter called {undeclared}, which providers/aws/permissions.py does not "
        "declare (and the terraform controller policy does not grant)"
    )


@pytest.fixture(autouse=True)
def _gcp_adapter_calls_stay_declared():
    """The same for the GCP adapter against the fake Compute Engine server
    (``providers.gcp.permissions``)."""
    yield
    import sys

    server = sys.modules.get("emulators.gce_server")
    if server is None:
        return
    from providers.gcp.permissions import ADAPTER_METHODS

    undeclared = sorted(set(server.ROUTES_SEEN) - set(ADAPTER_METHODS))
    server.ROUTES_SEEN.clear()
    assert not undeclared, (
        f"the GCP adapter called {undeclared}, which providers/gcp/permissions.py does not "
        "declare (and the terraform controller role does not grant)"
    )


UNPRIVILEGED_ID = 65534  # nobody: who permission tests run as when the suite runs as root


class Unprivileged:
    """Runs commands as a user whom file modes bind: the suite's own user when it is not
    root, else ``nobody`` (uid/gid 65534; root writes anywhere, so a permission test run as
    root would prove nothing and skip). ``folder`` is a fresh folder that user owns."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.as_nobody = os.geteuid() == 0

    def read_only_folder(self, name: str) -> Path:
        """A folder in ``folder`` that user may read but not write (mode 0500, theirs)."""
        path = self.folder / name
        path.mkdir()
        if self.as_nobody:
            os.chown(path, UNPRIVILEGED_ID, UNPRIVILEGED_ID)
        path.chmod(0o500)
        return path

    def run(self, argv: list[str], timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """``argv`` in ``folder`` as that user (its output as text). ``sys.executable`` as
        ``argv[0]`` runs this Python with this suite's packages, through an interpreter of the
        same version that user can run (this one may live in root's home)."""
        env = {**os.environ, "HOME": str(self.folder), "PYTHONDONTWRITEBYTECODE": "1"}
        who: dict[str, Any] = {}
        if self.as_nobody:  # set in the child before exec (no preexec_fn: threads are safe)
            who = {"user": UNPRIVILEGED_ID, "group": UNPRIVILEGED_ID, "extra_groups": []}
            if argv[:1] == [sys.executable]:
                argv = [_python_for(who), *argv[1:]]
                ours = [p for p in sys.path if p.startswith((sys.prefix, str(ROOT)))]
                env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *ours])
        return subprocess.run(
            argv,
            cwd=self.folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            **who,
        )


def _python_for(who: dict[str, Any]) -> str:
    """A Python of this version that ``who`` can run (skips the test when there is none)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [sys.executable, shutil.which(f"python{version}"), f"/usr/bin/python{version}"]
    for candidate in dict.fromkeys(c for c in candidates if c):
        try:
            probe = subprocess.run(
                [
                    candidate,
                    "-c",
                    f"import sys; sys.exit(sys.version[:{len(version)}] != '{version}')",
                ],
                capture_output=True,
                timeout=30,
                check=False,
                **who,
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return candidate
    pytest.skip(f"no Python {version} that uid {UNPRIVILEGED_ID} may run")


@pytest.fixture
def unprivileged() -> Iterator[Unprivileged]:
    """See :class:`Unprivileged`; the folder is removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="coadapt-unprivileged-"))
    try:
        if os.geteuid() == 0:
            os.chown(folder, UNPRIVILEGED_ID, UNPRIVILEGED_ID)
        yield Unprivileged(folder)
    finally:
        for path in (folder, *folder.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o700)
        shutil.rmtree(folder)
