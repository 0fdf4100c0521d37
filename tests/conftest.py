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
