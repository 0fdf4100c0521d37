# ruff: noqa: E402
"""Helpers to build literal policy inputs."""

from __future__ import annotations

import os

# One BLAS thread, set before numpy loads: the model fits (scipy L-BFGS-B on tiny problems) run
# many times slower with a multi-threaded OpenBLAS on a small machine.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from autoscaler.decide.views import Allocation, ClusterView, JobView, Oracle, Plan, RoundInput
from autoscaler.model.goodput import BatchLimits, GoodputModel, GradParams, PerfParams

LIMITS = BatchLimits(init_batch_size=128, max_batch_size=4096, max_local_bsz=512, min_local_bsz=32)


def cluster(nodes: int = 2, gpus: int = 4, **kwargs) -> ClusterView:
    """``nodes`` identical nodes with ids node-00, node-01, ..."""
    return ClusterView.uniform(nodes, gpus, now_s=600.0, round_index=10, **kwargs)


def alloc_of(row: tuple[int, ...]) -> Allocation:
    """A dense row over node-00, node-01, ... as an allocation by instance key."""
    return Allocation((f"node-{i:02d}", g) for i, g in enumerate(row) if g)


def rows(c: ClusterView, plan: Plan) -> dict[str, tuple[int, ...]]:
    """The plan's allocations as dense rows over ``c.nodes`` (for literal comparisons)."""
    return {name: c.dense(a) for name, a in plan.allocations.items()}


def view(
    name: str,
    *,
    nodes: int = 2,
    alloc: tuple[int, ...] | None = None,
    submit: float = 0.0,
    age: float = 3600.0,
    attained: float = 0.0,
    restarts: int = 0,
    requested: int = 1,
    batch: int = 256,
    profiled: int = 0,
    model: GoodputModel | None = None,
    oracle: Oracle | None = None,
    limits: BatchLimits = LIMITS,
) -> JobView:
    return JobView(
        name=name,
        application="cifar10",
        submit_time_s=submit,
        age_s=age,
        attained_gpu_s=attained,
        num_restarts=restarts,
        allocation=alloc_of(alloc) if alloc is not None else Allocation(),
        limits=limits,
        requested_gpus=requested,
        fixed_batch_size=batch,
        max_profiled_gpus=profiled,
        model=model,
        oracle=oracle,
    )


def model(sync_s: float, *, grad_var: float = 1.0, grad_sqr: float = 0.01) -> GoodputModel:
    """A goodput model whose gradient sync costs about ``sync_s`` per iteration (large = a job
    that does not scale) with a large noise scale (large batches stay efficient)."""
    perf = PerfParams(
        alpha_c=0.01,
        beta_c=0.001,
        alpha_n=sync_s,
        beta_n=sync_s / 10,
        alpha_r=2 * sync_s,
        beta_r=sync_s / 5,
        gamma=1.0,
    )
    return GoodputModel(perf, GradParams(grad_sqr, grad_var), LIMITS)


def round_input(c: ClusterView, *jobs: JobView) -> RoundInput:
    return RoundInput(c, tuple(jobs))
