"""The job lengths a policy learns from reach it from the store: each completed job's attained
service, the latest first, bounded; failed and cancelled jobs are no lengths; a restarted
controller reads them again."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import JobStatus, Store
from autoscaler.decide.policy.base import Decision
from autoscaler.decide.policy.coadapt import CoadaptPolicy, CoadaptState
from autoscaler.decide.sizing import SizingConfig
from autoscaler.decide.views import MAX_FINISHED_JOBS, RoundInput
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import FakeClock
from providers.fake import FakeProvider

CLUSTER = "lengths1"
CONFIG = ControllerConfig(
    CLUSTER,
    sizing=SizingConfig(max_instances=4),
    reconcile=ReconcileConfig(heartbeat_timeout_s=None),
    max_job_retries=1,
)


class Recording(CoadaptPolicy):
    """The coadapt policy, keeping each round input it was given (what the loop fed it)."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[RoundInput] = []

    def decide(self, round_input: RoundInput, state: CoadaptState) -> Decision:
        self.inputs.append(round_input)
        return super().decide(round_input, state)


def _store(tmp_path: Path, jobs: int) -> tuple[Store, FakeClock]:
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", CLUSTER, clock)
    for i in range(jobs):
        spec = JobSubmission(
            f"job-{i}", 128, 1024, 128, 32, application="cifar10", command=("train.py",)
        )
        store.add_job(spec.name, spec.to_json())
    return store, clock


def _rounds(ctl: Controller, clock: FakeClock, n: int) -> None:
    for _ in range(n):
        ctl.run_round()
        clock.advance(60.0)


def test_the_round_input_carries_the_completed_jobs_attained_service(tmp_path: Path) -> None:
    store, clock = _store(tmp_path, jobs=4)
    policy = Recording()
    cloud = FakeProvider(clock=clock)
    ctl = Controller(store, cloud, clock, CONFIG, policy=policy)
    _rounds(ctl, clock, 4)
    placed = {job for job, _ in store.list_assignments()}
    assert placed == {"job-0", "job-1", "job-2", "job-3"}, f"the jobs should run first: {placed}"
    assert policy.inputs and policy.inputs[-1].finished_gpu_s == ()  # nothing finished yet
    assert ctl.job_exited("job-0", failed=False) is JobStatus.COMPLETED
    clock.advance(60.0)
    ctl.job_exited("job-1", failed=False)  # a second completion, a round later
    row = store.get_job("job-2")
    store.update_job("job-2", row.version, status=JobStatus.CANCELLED)
    for _ in range(2):  # job-3 fails for good: a failure is no length
        ctl.job_exited("job-3", failed=True)
    assert store.get_job("job-3").status is JobStatus.FAILED
    served = store.usage(["job-0", "job-1", "job-2", "job-3"], clock.now_s())
    assert served["job-2"][0] > 0 and served["job-3"][0] > 0
    assert served["job-0"][0] > 0 and served["job-1"][0] > served["job-0"][0]
    store.add_job("job-4", JobSubmission("job-4", 128, 1024, 128, 32, command=("t.py",)).to_json())
    ctl.run_round()  # a round still decides (job-4) and is told what finished
    assert policy.inputs[-1].finished_gpu_s == (served["job-1"][0], served["job-0"][0])
    assert store.finished_gpu_s(1) == (served["job-1"][0],)  # bounded, the latest first
    again = Recording()  # a restarted controller reads them from the store
    Controller(store, cloud, clock, CONFIG, policy=again).run_round()
    assert again.inputs[-1].finished_gpu_s == (served["job-1"][0], served["job-0"][0])


def test_the_finished_lengths_read_is_bounded(tmp_path: Path) -> None:
    store, _ = _store(tmp_path, jobs=0)
    with pytest.raises(InvalidInputError, match="limit"):
        store.finished_gpu_s(0)
    assert store.finished_gpu_s(MAX_FINISHED_JOBS) == ()
