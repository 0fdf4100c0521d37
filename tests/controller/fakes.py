"""A controller over a fresh SQLite store and the in-process fake cloud, for tests that drive
rounds by hand with a fake clock."""

from __future__ import annotations

from pathlib import Path

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import Store
from autoscaler.decide.sizing import SizingConfig
from coadapt_common.clock import FakeClock
from providers.fake import FakeProvider


def fake_controller(
    tmp_path: Path, cluster: str, *, jobs: int = 2, max_instances: int = 6, **reconcile: object
) -> tuple[Store, FakeProvider, FakeClock, Controller]:
    """``(store, cloud, clock, controller)`` with ``jobs`` small cifar10 jobs submitted, agent
    liveness off unless ``reconcile`` sets it, and at most ``max_instances`` instances."""
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", cluster, clock)
    for i in range(jobs):
        spec = JobSubmission(
            f"job-{i}", 128, 1024, 128, 32, application="cifar10", command=("train.py",)
        )
        store.add_job(spec.name, spec.to_json())
    cloud = FakeProvider(clock=clock)
    cfg = ControllerConfig(
        cluster,
        sizing=SizingConfig(max_instances=max_instances),
        reconcile=ReconcileConfig(**{"heartbeat_timeout_s": None, **reconcile}),  # type: ignore[arg-type]
    )
    return store, cloud, clock, Controller(store, cloud, clock, cfg)
