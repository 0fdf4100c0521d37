"""coadapt in the simulator: a job no pool can hold fails the run at once, with the reason."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from autoscaler.decide.policy import make_policy
from autoscaler.model.traces import traces_folder
from autoscaler.sim.config import SimConfig
from autoscaler.sim.engine import SimulationError, simulate
from autoscaler.sim.workload import TraceJob


def big_batch_traces(root: Path) -> Path:
    """cifar10 with M0 = 4096 (its only validation run) and per-GPU batches of at most 32:
    4096 / (32 x 16 micro-batches) = 8 GPUs at the least."""
    src = traces_folder() / "cifar10"
    dst = root / "cifar10"
    dst.mkdir(parents=True)
    shutil.copy(src / "validation-4096.csv", dst / "validation-4096.csv")
    for name in ("placements.csv", "scalability.csv"):
        with open(src / name, newline="") as f:
            rows = list(csv.DictReader(f))
        with open(dst / name, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(rows[0]))
            out.writeheader()
            out.writerows(r for r in rows if int(float(r["local_bsz"])) <= 32)
    return root


@pytest.mark.slow
def test_a_job_no_pool_can_hold_fails_the_simulation_at_once(tmp_path: Path) -> None:
    root = big_batch_traces(tmp_path / "traces")
    jobs = [TraceJob("wide", "cifar10", 0.0, 1, 4096)]
    small = SimConfig(num_nodes=1, gpus_per_node=4, traces_dir=str(root))
    with pytest.raises(SimulationError, match=r"refused wide: needs at least 8 GPUs"):
        simulate(jobs, make_policy("coadapt"), small)
    # On two such nodes it fits (as whole nodes) and completes.
    result = simulate(
        jobs, make_policy("coadapt"), SimConfig(num_nodes=2, gpus_per_node=4, traces_dir=str(root))
    )
    assert result.jobs[0].gpu_s > 0
