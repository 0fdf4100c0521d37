"""Fixtures of the trainer tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.trainer.harness import Cluster, base_env


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Launchers of one test, ended when it ends (:class:`~tests.trainer.harness.Cluster`)."""
    c = Cluster(tmp_path, base_env())
    yield c
    c.close()
