"""The simulator is the product under a simulated world: what a run reports is what the
controller's store recorded, and its decisions are the controller's."""

from __future__ import annotations

from autoscaler.controller.store import JobStatus
from autoscaler.decide.jobs import JobSpec
from autoscaler.decide.policy import make_policy
from autoscaler.sim.config import SimConfig
from autoscaler.sim.engine import Simulator

JOBS = (
    JobSpec("cifar10-0", "cifar10", 0.0, 2, 512),
    JobSpec("ncf-1", "ncf", 60.0, 1, 256),
    JobSpec("cifar10-2", "cifar10", 200.0, 4, 512),
)


def test_a_run_is_what_the_controllers_store_recorded() -> None:
    sim = Simulator(JOBS, make_policy("pollux"), SimConfig(num_nodes=2, gpus_per_node=4))
    try:
        result = sim._run()
        store = sim.world.store
        rows = {row.name: row for row in store.list_jobs()}
        # Every job was submitted to the store at its own time and ended completed by its
        # trainer's "done" report and its processes' exit.
        assert {name: row.status for name, row in rows.items()} == {
            j.name: JobStatus.COMPLETED for j in JOBS
        }
        assert {n: r.submitted_at_s for n, r in rows.items()} == {
            j.name: j.submit_time_s for j in JOBS
        }
        # The restarts the run reports are the placements the controller recorded.
        restarts = store.restart_counts(rows)
        assert {j.name: j.restarts for j in result.jobs} == restarts
        # Each job's trainer reported, and its last report said it was done.
        for name in rows:
            last = store.latest_report(name)
            assert last is not None and '"done": true' in last.payload_json
        # The instances are the fixed fleet's two, brought up before the first job.
        instances = store.list_instances()
        assert len(instances) == 2 and all(r.status.value == "running" for r in instances)
        # The controller planned a batch for a job whenever it ran (none is left now).
        assert store.list_batches() == {}
        assert store.planned_at_s() is not None
    finally:
        sim.world.close()
    assert not sim.world.store.path.parent.exists()  # the world's folder is removed
