# ruff: noqa: E402
"""Shared helpers for simulator tests: small workloads written to temporary files."""

from __future__ import annotations

import os

# One BLAS thread, set before numpy loads: the model fits (scipy L-BFGS-B on tiny problems) run
# many times slower with a multi-threaded OpenBLAS on a small machine.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from collections.abc import Sequence
from pathlib import Path

import pytest

from autoscaler.sim.workload import TraceJob

HEADER = "name,time,application,num_replicas,batch_size"

# Quick jobs (in simulated rounds): ncf and cifar10 finish in minutes to an hour on a few GPUs.
SMALL = [
    TraceJob("ncf-0", "ncf", 0.0, 1, 256),
    TraceJob("cifar10-1", "cifar10", 30.0, 2, 256),
    TraceJob("ncf-2", "ncf", 95.0, 2, 1024),
    TraceJob("cifar10-3", "cifar10", 200.0, 4, 512),
    TraceJob("ncf-4", "ncf", 200.0, 1, 512),
    TraceJob("cifar10-5", "cifar10", 610.0, 1, 128),
]


def write_workload(path: Path, jobs: Sequence[TraceJob]) -> Path:
    lines = [HEADER]
    for job in jobs:
        time = int(job.submit_time_s) if job.submit_time_s.is_integer() else job.submit_time_s
        lines.append(f"{job.name},{time},{job.application},{job.num_replicas},{job.batch_size}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def small_workload(tmp_path: Path) -> Path:
    return write_workload(tmp_path / "small.csv", SMALL)
