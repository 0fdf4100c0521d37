"""Pollux's genetic search: best fitness at population 64 (the default) vs 100 (the paper's).

Captures real scheduling rounds from a simulation of one paper workload (``--load`` 0.5 or 1.0,
arrivals optionally compressed by ``--arrival-scale``; the default Pollux policy drives it;
every ``--every``-th round with at least ``--min-jobs`` active jobs is kept, up to
``--rounds``), then re-runs one round's decision on each captured round at each population size
and seed, from a cold start (no previous population, so both sizes start alike), and scores the
plan it returns. Crowded rounds (``--load 1.0 --arrival-scale 2 --min-jobs 30``) are the hard
case: there the score also counts the jobs left waiting (``mean_waiting_jobs``).

The score is the fitness the module docstring of :mod:`autoscaler.decide.policy.pollux` defines,
evaluated here from public pieces only (each job's :meth:`GoodputModel.optimize`, the restart
factor, :func:`power_mean`), on the same scale as the policy's internal fitness (speedups times
nodes / GPUs). Prints JSON: per population, the mean best fitness over rounds and seeds, the
per-seed means, and the search's wall time; and the relative difference of the means.

    python benchmarks/ga_population.py [--workload workload-1] [--load 0.5] [--arrival-scale 1]
        [--rounds 6] [--every 4] [--min-jobs 5] [--seeds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoscaler.decide.policy.base import Decision
from autoscaler.decide.policy.pollux import PolluxOptions, PolluxPolicy, PolluxState, power_mean
from autoscaler.decide.views import ClusterView, JobView, Plan, RoundInput
from autoscaler.sim.config import SimConfig
from autoscaler.sim.engine import simulate
from autoscaler.sim.runner import paper_workloads
from autoscaler.sim.workload import compress_arrivals, load_workload
from coadapt_common.atomic import write_json_atomic


class _Captured(Exception):
    """Raised by the recorder once it has enough rounds: ends the simulation early."""


@dataclass
class Recorder:
    """A policy that delegates to ``inner`` and keeps selected rounds' inputs."""

    inner: PolluxPolicy
    rounds: int
    every: int
    min_jobs: int
    kept: list[RoundInput] = field(default_factory=list)
    _seen: int = 0

    def __post_init__(self) -> None:
        self.name = self.inner.name
        self.uses_model = self.inner.uses_model
        self.uses_oracle = self.inner.uses_oracle
        self.avoids_interference = self.inner.avoids_interference

    def initial_state(self) -> Any:
        return self.inner.initial_state()

    def gpu_bounds(self, job: JobView, cluster: ClusterView) -> tuple[int, int]:
        return self.inner.gpu_bounds(job, cluster)

    def decide(self, round_input: RoundInput, state: Any) -> Decision:
        if len(round_input.jobs) >= self.min_jobs:
            self._seen += 1
            if self._seen % self.every == 0:
                self.kept.append(round_input)
                if len(self.kept) >= self.rounds:
                    raise _Captured
        return self.inner.decide(round_input, state)


def plan_fitness(round_input: RoundInput, plan: Plan, options: PolluxOptions) -> float:
    """FITNESS_p of ``plan`` as the pollux module docstring defines it (see module docstring)."""
    cluster = round_input.cluster
    total = cluster.total_gpus
    per_node = max(cluster.gpus_per_node)
    fair_all = max(1, math.ceil(total / len(round_input.jobs)))
    speedups = []
    for job in round_input.jobs:
        alloc = plan.allocations[job.name]
        gpus, nodes = alloc.num_gpus, alloc.num_nodes
        fair_gpus = min(fair_all, max(1, job.limits.max_batch_size // job.limits.min_local_bsz))
        if gpus == 0:
            s = 0.0
        elif job.model is None:
            s = gpus / fair_gpus
        else:
            fixed = None if job.adaptive else job.fixed_batch_size
            good = float(job.model.optimize(nodes, gpus, fixed_batch_size=fixed).goodput)
            fair_nodes = max(1, math.ceil(fair_gpus / per_node))
            fair = float(job.model.optimize(fair_nodes, fair_gpus, fixed_batch_size=fixed).goodput)
            s = good / max(fair, 1e-12)
        if options.restart_penalty and alloc != job.allocation:
            delay = cluster.restart_delay_s
            s *= max(job.age_s - job.num_restarts * delay, 0.0) / (job.age_s + delay)
        speedups.append(s * cluster.num_nodes / total)
    return float(power_mean(np.array(speedups), options.power))


def capture(
    workload: str, rounds: int, every: int, min_jobs: int, load: str = "0.5", scale: float = 1.0
) -> list[RoundInput]:
    files = {p.stem: p for p in paper_workloads(load)}
    if workload not in files:
        raise SystemExit(f"ga_population: unknown workload {workload!r}; one of {sorted(files)}")
    recorder = Recorder(PolluxPolicy(seed=0), rounds, every, min_jobs)
    jobs = compress_arrivals(load_workload(files[workload]), scale).jobs
    with contextlib.suppress(_Captured):  # the recorder ends the run once it has its rounds
        simulate(jobs, recorder, SimConfig(), workload_name=workload)
    return recorder.kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", default="workload-1", help="paper workload name")
    ap.add_argument("--load", default="0.5", choices=["0.5", "1.0"], help="paper load")
    ap.add_argument(
        "--arrival-scale", type=float, default=1.0, help="submit jobs this many times as fast"
    )
    ap.add_argument("--rounds", type=int, default=6, help="rounds to capture")
    ap.add_argument("--every", type=int, default=4, help="keep every N-th eligible round")
    ap.add_argument("--min-jobs", type=int, default=5, help="eligible: at least this many jobs")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per round and population")
    ap.add_argument("--populations", default="64,100", help="comma-separated sizes")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    sizes = [int(p) for p in args.populations.split(",")]

    t0 = time.perf_counter()
    captured = capture(
        args.workload, args.rounds, args.every, args.min_jobs, args.load, args.arrival_scale
    )
    capture_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "workload": f"{args.workload} ({args.load}x, arrivals x{args.arrival_scale:g})",
        "rounds": [{"round_index": r.cluster.round_index, "jobs": len(r.jobs)} for r in captured],
        "seeds": args.seeds,
        "capture_s": capture_s,
        "populations": {},
    }
    for size in sizes:
        options = PolluxOptions(population=size)
        per_seed, walls, waiting = [], [], []
        for seed in range(args.seeds):
            scores = []
            for round_input in captured:
                policy = PolluxPolicy(seed=seed, options=options)
                t1 = time.perf_counter()
                decision = policy.decide(round_input, PolluxState())
                walls.append(time.perf_counter() - t1)
                scores.append(plan_fitness(round_input, decision.plan, options))
                waiting.append(sum(1 for a in decision.plan.allocations.values() if not a))
            per_seed.append(statistics.fmean(scores))
        result["populations"][str(size)] = {
            "mean_best_fitness": statistics.fmean(per_seed),
            "per_seed_mean": per_seed,
            "seed_stdev": statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0,
            "decide_s_mean": statistics.fmean(walls),
            "mean_waiting_jobs": statistics.fmean(waiting),
        }
    if len(sizes) == 2:
        a, b = (result["populations"][str(s)]["mean_best_fitness"] for s in sizes)
        result["relative_difference"] = (a - b) / b
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
