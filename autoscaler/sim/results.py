"""Simulation results: per-job and per-round records, summaries, and the results JSON.

The JSON written by :func:`write_results_json` is deterministic — the same workload, policy,
config and seed give byte-identical files — unless timings are asked for: policy wall times are
measured, not simulated, and are only included with ``include_timing=True``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.accounting.churn import ChurnFigures
from autoscaler.accounting.costs import CostRecord, record_to_json
from autoscaler.sim.config import SimConfig
from coadapt_common.atomic import write_json_atomic

__all__ = [
    "JobResult",
    "RoundStats",
    "SimResult",
    "results_payload",
    "results_table",
    "write_results_json",
]

#: The table's footnote: what its abbreviations mean.
TABLE_CAPTION = (
    "JCT: job completion time, submission to finish, seconds. FTF: finish-time fairness, a "
    "job's JCT over its JCT alone on 1/N of the cluster (N: jobs present on average); below 1 "
    "is better than fair."
)

RESULTS_FORMAT = "coadapt.sim/1"


@dataclass(frozen=True)
class JobResult:
    """One finished job.

    ``jct_s`` = completion - submission (queueing included); ``gpu_s`` = GPU-seconds held
    (restart delays included); ``restarts`` = allocation changes after the first start;
    ``avg_jobs`` = jobs present on average during its life; ``ftf_ratio`` = ``jct_s`` over its
    JCT alone on ``1 / avg_jobs`` of the cluster (finish-time fairness; < 1 is better than fair).
    ``deadline_s``: its deadline (simulated time; ``None``: none, and then left out of the
    JSON); :attr:`deadline_met` whether it completed by then.
    """

    name: str
    application: str
    submit_time_s: float
    completion_time_s: float
    jct_s: float
    gpu_s: float
    restarts: int
    avg_jobs: float
    ftf_ratio: float
    deadline_s: float | None = None

    @property
    def deadline_met(self) -> bool | None:
        """Whether it completed by its deadline (``None``: it had none)."""
        if self.deadline_s is None:
            return None
        return self.completion_time_s <= self.deadline_s + 1e-6


@dataclass(frozen=True)
class RoundStats:
    """One scheduling round: its time, active jobs, GPUs allocated, the policy's wall time, and
    the wall time of the online model fitting done for the round (not part of the policy's)."""

    time_s: float
    active_jobs: int
    used_gpus: int
    policy_wall_s: float
    fit_wall_s: float = 0.0


@dataclass(frozen=True)
class SimResult:
    """The outcome of one simulation."""

    workload: str
    policy: str
    config: SimConfig
    jobs: tuple[JobResult, ...]
    rounds: tuple[RoundStats, ...]
    wall_s: float = 0.0  # measured: the simulation's elapsed time
    # Cloud mode: the closed cost record and the fleet's counters (launches, preemptions,
    # capacity errors, peak $/h); ``None`` on a fixed cluster.
    cost: CostRecord | None = None
    fleet: Mapping[str, float] | None = None
    # Cloud mode, when computed: the run's cost floors next to its bill
    # (:func:`autoscaler.sim.floor_inputs.run_floor`).
    floor: Mapping[str, Any] | None = None
    # The run's churn, from the store it leaves (:func:`autoscaler.accounting.billing.
    # churn_from_store`): its idle split over ``cost`` in cloud mode, over the store's own
    # record of the fixed fleet (nominal prices: 1 USD per GPU-hour) otherwise.
    churn: ChurnFigures | None = None

    @property
    def jcts_s(self) -> np.ndarray:
        return np.array([job.jct_s for job in self.jobs])

    def summary(self) -> dict[str, float]:
        """Aggregates: mean / p50 / p99 JCT, makespan, restarts per job, GPU-hours, mean, p99 and
        worst finish-time fairness ratio, mean GPU utilisation over rounds with active jobs."""
        jct = self.jcts_s
        total_gpus = self.config.total_gpus
        ftf = np.array([job.ftf_ratio for job in self.jobs])
        first = min(job.submit_time_s for job in self.jobs)
        used = np.array([r.used_gpus for r in self.rounds], dtype=float)
        return {
            "num_jobs": float(len(self.jobs)),
            "mean_jct_s": float(jct.mean()),
            "p50_jct_s": float(np.percentile(jct, 50)),
            "p99_jct_s": float(np.percentile(jct, 99)),
            "makespan_s": float(max(job.completion_time_s for job in self.jobs) - first),
            "restarts_per_job": float(np.mean([job.restarts for job in self.jobs])),
            "gpu_hours": float(sum(job.gpu_s for job in self.jobs) / 3600.0),
            "mean_ftf_ratio": float(ftf.mean()),
            "p99_ftf_ratio": float(np.percentile(ftf, 99)),
            "max_ftf_ratio": float(ftf.max()),
            "mean_utilization": float(used.mean() / total_gpus) if used.size else 0.0,
            "rounds": float(len(self.rounds)),
        }

    def timing(self) -> dict[str, float]:
        """Policy wall time per round (measured): p50, p99, max and total, in milliseconds; and
        the online model fitting per round, timed apart: p50, max and total."""
        walls = np.array([r.policy_wall_s for r in self.rounds]) * 1000.0
        fits = np.array([r.fit_wall_s for r in self.rounds]) * 1000.0
        if walls.size == 0:
            walls = fits = np.zeros(1)
        return {
            "policy_ms_p50": float(np.percentile(walls, 50)),
            "policy_ms_p99": float(np.percentile(walls, 99)),
            "policy_ms_max": float(walls.max()),
            "policy_ms_total": float(walls.sum()),
            "fit_ms_p50": float(np.percentile(fits, 50)),
            "fit_ms_max": float(fits.max()),
            "fit_ms_total": float(fits.sum()),
        }


def _job_json(job: JobResult) -> dict[str, Any]:
    out = asdict(job)
    if job.deadline_s is None:
        del out["deadline_s"]
    else:
        out["deadline_met"] = job.deadline_met
    return out


def results_payload(results: Sequence[SimResult], *, include_timing: bool = False) -> dict:
    """The JSON-ready form of one or more results (see the module docstring)."""
    runs = []
    for res in results:
        run: dict[str, Any] = {
            "workload": res.workload,
            "policy": res.policy,
            "config": _config_json(res.config),
            "summary": res.summary(),
            "jobs": [_job_json(job) for job in res.jobs],
            "rounds": [
                {"time_s": r.time_s, "active_jobs": r.active_jobs, "used_gpus": r.used_gpus}
                for r in res.rounds
            ],
        }
        if res.cost is not None:
            run["cost_record"] = record_to_json(res.cost)
            run["fleet"] = dict(res.fleet or {})
        if res.floor is not None:
            run["floor"] = dict(res.floor)
        if res.churn is not None:
            run["churn"] = res.churn.to_json()
        if include_timing:
            run["timing"] = {**res.timing(), "wall_s": res.wall_s}
            run["policy_wall_s"] = [r.policy_wall_s for r in res.rounds]
        runs.append(run)
    return {"format": RESULTS_FORMAT, "runs": runs}


def _config_json(config: SimConfig) -> dict[str, Any]:
    """The config as JSON; a cloud config by its strategy, offerings and settings."""
    cloud = config.cloud
    out = asdict(replace(config, cloud=None))
    if cloud is not None:
        out["cloud"] = {
            "strategy": cloud.strategy.name,
            "offerings": [o.key for o in cloud.offerings],
            "provisioning_delay_s": cloud.provisioning_delay_s if cloud.boot is None else None,
            "boot": None
            if cloud.boot is None
            else {
                "model": "lognormal",
                "seed": cloud.boot.seed,
                "rows": [asdict(q) for rows in cloud.boot.rows.values() for q in rows],
            },
            "checkpoint_interval_s": cloud.checkpoint_interval_s,
            "checkpoint_write_s": cloud.checkpoint_write_s,
            "min_billed_s": cloud.min_billed_s,
            "budget_usd_per_hour": cloud.budget_usd_per_hour,
        }
    return out


def write_results_json(
    path: str | Path, results: Sequence[SimResult], *, include_timing: bool = False
) -> None:
    """Write results atomically (see :func:`coadapt_common.atomic.write_json_atomic`)."""
    write_json_atomic(path, results_payload(results, include_timing=include_timing))


def results_table(
    results: Sequence[SimResult], paper: Sequence[Any] | None = None, *, title_suffix: str = ""
) -> Any:
    """A :class:`rich.table.Table` of the results, one row per run, with :data:`TABLE_CAPTION`.

    ``paper``: rows of :func:`autoscaler.sim.runner.compare_with_paper` (workload, policy,
    mean_jct_s, paper_jct_s, ratio) to show the published numbers next to ours, plus the
    ``"mean"`` rows. Workload and policy names are never shortened, whatever the console width
    (a narrow console wraps the numeric columns' headers instead).
    """
    from rich.table import Table

    title = "Simulated JCTs (s)" + (
        f", {title_suffix}" if paper is not None and title_suffix else ""
    )
    table = Table(title=title, caption=TABLE_CAPTION)
    labels = [res.workload for res in results] + ["workload", "mean"]
    table.add_column("workload", no_wrap=True, min_width=max(len(x) for x in labels))
    policies = [res.policy for res in results] + ["policy"]
    table.add_column("policy", no_wrap=True, min_width=max(len(x) for x in policies))
    names = ["mean JCT", "p99 JCT", "restarts/job", "mean FTF"]
    if paper is not None:
        names += ["paper", "ours/paper"]
    for name in names:
        table.add_column(name, justify="right", overflow="fold")
    rows = {(r.workload, r.policy): r for r in paper or ()}
    for res in results:
        s = res.summary()
        cells = [res.workload, res.policy, f"{s['mean_jct_s']:.0f}", f"{s['p99_jct_s']:.0f}"]
        cells += [f"{s['restarts_per_job']:.2f}", f"{s['mean_ftf_ratio']:.2f}"]
        if paper is not None:
            cells += _paper_cells(rows.get((res.workload, res.policy)))
        table.add_row(*cells)
    for (workload, policy), row in rows.items():
        if workload == "mean":
            table.add_row("mean", policy, f"{row.mean_jct_s:.0f}", "", "", "", *_paper_cells(row))
    return table


def _paper_cells(row: Any) -> list[str]:
    paper = getattr(row, "paper_jct_s", None)
    ratio = getattr(row, "ratio", None)
    return [f"{paper:.0f}" if paper else "-", f"{ratio:.2f}" if ratio else "-"]
