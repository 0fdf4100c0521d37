"""Running many simulations: one workload x policy per task, in parallel worker processes.

Each task loads its workload, builds its policy (seeded with the config's seed) and runs the
:class:`~autoscaler.sim.engine.Simulator`. Results come back in task order regardless of which
worker finished first, so parallel and serial runs give identical results.

Numerical libraries are pinned to one thread in the workers (``OPENBLAS_NUM_THREADS=1`` etc.):
the simulator's linear algebra is tiny, and a multi-threaded BLAS makes scipy's optimisers many
times slower while fighting the other workers for cores.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoscaler.decide.views import PolicyName
from autoscaler.errors import InvalidInputError
from autoscaler.model.traces import data_root
from autoscaler.sim.config import PAPER_POLICIES, SimConfig
from autoscaler.sim.engine import simulate
from autoscaler.sim.results import SimResult
from autoscaler.sim.workload import load_workload

__all__ = [
    "PAPER_LOADS",
    "PAPER_POLICIES",
    "ComparisonRow",
    "RunSpec",
    "compare_with_paper",
    "limit_threads",
    "paper_reference",
    "paper_workloads",
    "run_many",
    "run_one",
]

_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: The paper's job loads and the folder (under :func:`~autoscaler.model.traces.data_root`) of each.
PAPER_LOADS: dict[str, str] = {"1.0": "workloads", "0.5": "workloads-0.5"}


def limit_threads() -> None:
    """Ask BLAS/OpenMP libraries for one thread, in this process (effective only before they
    are first loaded) and in the processes it starts. Explicit user settings are kept."""
    for var in _THREAD_VARS:
        os.environ.setdefault(var, "1")


@dataclass(frozen=True)
class RunSpec:
    """One simulation task: a workload file, a policy and the cluster config.

    ``policy_options`` are keyword options of the policy's constructor (as sorted pairs, so the
    spec stays hashable and comparable).
    """

    workload: str
    policy: PolicyName
    config: SimConfig = field(default_factory=SimConfig)
    policy_options: tuple[tuple[str, Any], ...] = ()


def run_one(
    spec: RunSpec, *, on_round: Callable[[float, int, int], None] | None = None
) -> SimResult:
    """Run one task in this process."""
    from autoscaler.decide.policy import make_policy

    workload = load_workload(spec.workload)
    policy = make_policy(spec.policy, seed=spec.config.seed, **dict(spec.policy_options))
    return simulate(
        workload.jobs, policy, spec.config, workload_name=workload.name, on_round=on_round
    )


def _cost(spec: RunSpec) -> int:
    return 0 if spec.policy is PolicyName.POLLUX else 1


def run_many(
    specs: Sequence[RunSpec],
    *,
    processes: int = 2,
    on_start: Callable[[], None] | None = None,
    on_done: Callable[[RunSpec, SimResult], None] | None = None,
    on_round: Callable[[float, int, int], None] | None = None,
) -> list[SimResult]:
    """Run ``specs`` on ``processes`` worker processes (1 = in this process); results in the
    order of ``specs``. ``on_done`` is called in this process as each task finishes;
    ``on_round(now_s, jobs_done, jobs)`` after every round, but only for a single task run in
    this process. Expensive policies are started first so that the workers finish together.
    Any task's error is re-raised here (after the others are cancelled). Every workload is
    loaded (validated) before any simulation starts; ``on_start`` is called once that passed."""
    if processes < 1:
        raise InvalidInputError("processes must be >= 1", field="processes")
    for spec in specs:  # Fail fast on bad input, before starting any worker.
        load_workload(spec.workload)
    if on_start is not None:
        on_start()
    results: list[SimResult | None] = [None] * len(specs)
    if processes == 1 or len(specs) <= 1:
        for i, spec in enumerate(specs):
            results[i] = run_one(spec, on_round=on_round if len(specs) == 1 else None)
            if on_done is not None:
                on_done(spec, results[i])  # type: ignore[arg-type]
        return results  # type: ignore[return-value]
    limit_threads()
    order = sorted(range(len(specs)), key=lambda i: (_cost(specs[i]), i))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(processes, len(specs)), mp_context=context) as pool:
        futures: dict[Future[SimResult], int] = {pool.submit(run_one, specs[i]): i for i in order}
        pending = set(futures)
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(finished, key=lambda f: futures[f]):
                    i = futures[future]
                    results[i] = future.result()
                    if on_done is not None:
                        on_done(specs[i], results[i])  # type: ignore[arg-type]
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return results  # type: ignore[return-value]


def paper_workloads(load: str, root: Path | None = None) -> list[Path]:
    """The eight workload files of the paper at ``load`` (``"1.0"`` or ``"0.5"``)."""
    if load not in PAPER_LOADS:
        raise InvalidInputError(
            f"unknown load {load!r}; expected one of {', '.join(PAPER_LOADS)}", field="load"
        )
    from autoscaler.sim.workload import workload_files

    return workload_files((root or data_root()) / PAPER_LOADS[load])


def paper_reference(policy: str, load: str, root: Path | None = None) -> dict[str, Any]:
    """The published simulator results of the paper's artifact for ``policy`` at ``load``:
    ``{"avgs": {workload: mean JCT s}, "mean": float, "jcts": {workload: {job: s}}}``."""
    path = (root or data_root()) / "reference" / f"{policy}-{load}.json"
    with open(path) as handle:
        return json.load(handle)


@dataclass(frozen=True)
class ComparisonRow:
    """One workload's average JCT under one policy, next to the published number (if any)."""

    workload: str
    policy: str
    mean_jct_s: float
    paper_jct_s: float | None

    @property
    def ratio(self) -> float | None:
        """Ours / published (``None`` without a published number)."""
        return None if not self.paper_jct_s else self.mean_jct_s / self.paper_jct_s


def compare_with_paper(results: Sequence[SimResult], load: str) -> list[ComparisonRow]:
    """Each result's average JCT next to the paper's published simulator result for the same
    policy and workload at ``load``, plus one ``"mean"`` row per policy (mean over its
    workloads, against the published mean over all eight)."""
    rows: list[ComparisonRow] = []
    by_policy: dict[str, list[float]] = {}
    for res in results:
        try:
            ref = paper_reference(res.policy, load)
        except FileNotFoundError:
            ref = {"avgs": {}, "mean": None}
        mean = res.summary()["mean_jct_s"]
        rows.append(ComparisonRow(res.workload, res.policy, mean, ref["avgs"].get(res.workload)))
        by_policy.setdefault(res.policy, []).append(mean)
    for policy, means in by_policy.items():
        try:
            published = paper_reference(policy, load)["mean"]
        except FileNotFoundError:
            published = None
        rows.append(ComparisonRow("mean", policy, sum(means) / len(means), published))
    return rows
