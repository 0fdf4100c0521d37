"""The provider contract, run against ``LocalProvider`` with real agent processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from coadapt_common.clock import FakeClock
from providers.base import LaunchRequest, Market, Offering
from providers.local import LocalProvider
from providers.local_agent import INSTANCE_ENV
from tests.providers.contract import ProviderContract


def instance_pids(instance_id: str, pgid: int | None) -> list[int]:
    """Independent check of the process table: live (non-zombie) processes of the group that
    carry the instance's marker in their environment (so a recycled pgid never matches)."""
    if pgid is None:
        return []
    marker = f"{INSTANCE_ENV}={instance_id}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        if int(fields[2]) != pgid or fields[0] in ("Z", "X"):
            continue
        deadline = time.monotonic() + 0.5
        while True:  # argv/envp read empty for an instant after exec
            try:
                environ = Path(entry.path, "environ").read_bytes()
            except OSError:
                environ = b""
                break
            if environ or time.monotonic() > deadline:
                break
            time.sleep(0.001)
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def instance_running(state_dir: Path, instance_id: str) -> bool:
    record = json.loads((state_dir / "instances" / f"{instance_id}.json").read_text())
    return bool(instance_pids(instance_id, record["pgid"]))


def kill_leftovers(state_dir: Path) -> list[str]:
    """SIGKILL whatever of the folder's instances still runs; return their ids."""
    left = []
    for path in (state_dir / "instances").glob("*.json"):
        pids = instance_pids(path.stem, json.loads(path.read_text())["pgid"])
        if pids:
            left.append(path.stem)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return left


class LocalHarness:
    """``ContractHarness`` over a ``LocalProvider`` in a temporary state folder."""

    def __init__(self, state_dir: Path) -> None:
        self.clock = FakeClock()
        self.state_dir = state_dir
        self.provider = self.restarted_provider()
        self.cluster_id = f"local-{uuid.uuid4().hex[:10]}"
        self.foreign_clusters: list[str] = []

    def offerings_for_test(self) -> list[Offering]:
        return [
            o
            for o in self.provider.offerings()
            if o.market is Market.SPOT and o.instance_type in ("local-1gpu", "local-2gpu")
        ]

    def exhaust_pool(self, offering: Offering) -> None:
        self.provider.set_pool_capacity(offering.key, 0)

    def add_foreign_instance(self) -> str:
        """An instance owned by another cluster on the same machine."""
        other = f"foreign-{uuid.uuid4().hex[:10]}"
        self.foreign_clusters.append(other)
        pool = self.offerings_for_test()[-1]
        result = self.provider.launch(LaunchRequest(f"req-{other}", other, (pool,), 1))
        return result.instances[0].instance_id

    def inject_preemption(self, instance_id: str) -> None:
        self.provider.preempt(instance_id, notice_s=120.0)

    def settle(self) -> None:
        """Local calls are synchronous; nothing to wait for."""

    def cloud_launch_calls(self, offering_key: str) -> int:
        return self.provider.launch_attempts[offering_key]

    def cloud_calls(self) -> int:
        return sum(self.provider.op_counts.values())

    def cloud_has_instance(self, instance_id: str) -> bool:
        return instance_running(self.state_dir, instance_id)

    def restarted_provider(self) -> LocalProvider:
        """A new provider over the same state folder (the local "cloud")."""
        return LocalProvider(
            self.state_dir, clock=self.clock, max_gpu_slots=16, term_grace_s=2.0, heartbeat_s=0.5
        )

    def forget_idempotency_tokens(self) -> None:
        """Local launches keep no idempotency tokens: only the records' request-id tags."""

    def close(self) -> None:
        """Bring everything down and check that no process of this test survives."""
        try:
            for cluster in [self.cluster_id, *self.foreign_clusters]:
                self.provider.down(cluster)
        finally:
            survivors = kill_leftovers(self.state_dir)
        assert not survivors, f"processes left running: {survivors}"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[LocalHarness]:
    h = LocalHarness(tmp_path / "local")
    yield h
    h.close()


class TestLocalProviderContract(ProviderContract):
    pass
