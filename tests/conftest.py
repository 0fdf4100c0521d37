"""Shared test configuration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Deterministic hypothesis runs (property tests are seeded, never flaky).
try:
    from hypothesis import settings

    settings.register_profile("coadapt", derandomize=True, deadline=None, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "coadapt"))
except ImportError:  # pragma: no cover - hypothesis is a dev dependency
    pass


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT
