"""How fast a policy decides at scale: synthetic rounds of 64 to 2,048 GPUs.

    python benchmarks/policy_scale.py [--sizes 64,256,1024,2048] [--policies coadapt,pollux]
        [--rounds 7] [--seed 0] [--pollux-limit-s 60] [--out FILE]

A round is built the way a real one looks to a policy (seeded):

- the fleet: at each size, the mixed cluster's proportions (``examples/clusters/mixed-64.yaml``:
  37.5% of the GPUs T4 on 4-GPU nodes, 37.5% V100 and 25% A100 on 8-GPU nodes), and an all-T4
  variant (4-GPU nodes);
- the jobs (160 at 64 GPUs, 400 at 256, 1,000 at 1,024, 2,000 at 2,048): each an application
  drawn like the paper's 1.0x workloads, that has run 1-8 configurations on one or two GPU
  types (the types of the fleet, by capacity); its profile holds the true times of those
  configurations (the traces on T4, :class:`~autoscaler.sim.cluster.TypeSpeed` on the others),
  its throughput models are fitted from them (one per type; for a type-unaware policy, such as
  pollux, the pooled one it sees instead, as a controller running it would fit), and its
  gradient statistics are the traces' at a random point of its training;
- a first decision from no allocations gives every job its current allocation; the measured
  rounds follow, each with the gradient statistics of a third of the jobs refreshed (a new
  epoch), the previous round's state handed back, and the clock advanced a minute.

``coadapt-milp`` (not run by default) is coadapt with its exact solver
(``solver="milp"``, HiGHS), to compare the fast solver's time and gap with it.

Measured, per size and policy, on one core (``OPENBLAS_NUM_THREADS=1``): the median and p95 of
``decide``, and the median of three *rounds with refits*: in each, every running job reports
one new configuration (the trainers' measurements, samples and gradient statistics, are
synthesised before the clock starts: they are not the round's work), the
:class:`~autoscaler.model.fitting.ModelBook` takes them and refits all of them (together,
warm-started), the job views and their models are rebuilt and the policy decides. Each (size,
variant, policy) runs in its own process, whose peak RSS is reported. Pollux is skipped at a
size once a round there has taken more than ``--pollux-limit-s`` (60 s), and at every larger
size; the JSON says so (``"skipped"``).

Writes ``{"sizes": {"<gpus>": {"<policy>": {"jobs", "median_s", "p95_s",
"round_with_refits_s", "peak_rss_mib", "gap"}}}, "sizes_t4": {...same...}}``; ``gap`` (coadapt
only) is the median over rounds of the solver's relative gap, ``(bound - objective) /
|objective|``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue as queue_module
import resource
import signal
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoscaler.decide.policy import make_policy
from autoscaler.decide.views import Allocation, ClusterView, JobView, NodeView, RoundInput
from autoscaler.model.fitting import ModelBook
from autoscaler.model.goodput import BatchLimits, GoodputModel, GradParams, ProfileSample
from autoscaler.model.gputypes import default_speed_table
from autoscaler.model.traces import AppTrace, load_app
from autoscaler.sim.cluster import NodeGroup, TypeSpeed, uniform_cluster
from autoscaler.sim.runner import paper_workloads
from autoscaler.sim.workload import load_workload
from coadapt_common.atomic import write_json_atomic

JOBS = {64: 160, 256: 400, 1024: 1000, 2048: 2000}
MIXED = (("T4", 4, 0.375), ("V100", 8, 0.375), ("A100", 8, 0.25))


def fleet(gpus: int, mixed: bool) -> tuple[ClusterView, dict[str, NodeGroup]]:
    """The nodes of one size, and the node group of each GPU type."""
    spec = uniform_cluster(gpus // 4, 4)
    groups = {"T4": spec.groups[0]}
    nodes: list[NodeView] = []
    if not mixed:
        nodes = [NodeView(f"t4-{i:04d}", "T4", 4) for i in range(gpus // 4)]
        return ClusterView(tuple(nodes), 3600.0, 60), groups
    from autoscaler.sim.cluster import DEFAULT_INSTANCE, INTERCONNECTS

    for gpu_type, per_node, share in MIXED:
        count = max(1, round(gpus * share / per_node))
        net = INTERCONNECTS[DEFAULT_INSTANCE[gpu_type]]
        groups[gpu_type] = NodeGroup(
            gpu_type,
            per_node,
            count,
            DEFAULT_INSTANCE[gpu_type],
            net.intra_gbytes_per_s,
            net.network_gbps,
        )
        nodes += [NodeView(f"{gpu_type.lower()}-{i:04d}", gpu_type, per_node) for i in range(count)]
    return ClusterView(tuple(nodes), 3600.0, 60), groups


def _limits(app: AppTrace, max_local: int | None = None) -> BatchLimits:
    return BatchLimits(
        app.init_batch_size,
        app.max_batch_size,
        max_local if max_local is not None else app.max_local_bsz,
        app.min_local_bsz,
    )


class Round:
    """A synthetic round's jobs: profiles in a ModelBook, gradient statistics, limits."""

    def __init__(self, gpus: int, mixed: bool, seed: int, pooled: bool = False) -> None:
        """``pooled``: fit the pooled model a type-unaware policy reads, instead of one per
        type (what a controller running that policy fits)."""
        self.rng = np.random.default_rng([seed, gpus, int(mixed)])
        self.cluster, self.groups = fleet(gpus, mixed)
        self.speeds = default_speed_table()
        apps = [j.application for f in paper_workloads("1.0") for j in load_workload(f).jobs]
        self.book = ModelBook(refit_tolerance=0.0)
        self.pooled = pooled
        self._speeds: dict[tuple[str, str], TypeSpeed] = {}
        types = [n.gpu_type for n in self.cluster.nodes for _ in range(n.gpus)]
        self.jobs: list[dict[str, Any]] = []
        for i in range(JOBS[gpus]):
            app = load_app(str(self.rng.choice(apps)))
            ran = sorted({str(self.rng.choice(types)) for _ in range(int(self.rng.integers(1, 3)))})
            job = {"name": f"job-{i:04d}", "app": app, "types": ran, "max_gpus": 1}
            job["progress"] = float(self.rng.uniform(0, 0.9)) * app.target_progress
            for gpu_type in ran:
                for _ in range(int(self.rng.integers(1, 9))):
                    self.record(job, gpu_type)
            self.jobs.append(job)
        self.book.refit()

    def _speed(self, app: AppTrace, gpu_type: str) -> TypeSpeed:
        key = (app.name, gpu_type)
        speed = self._speeds.get(key)
        if speed is None:
            speed = self._speeds[key] = TypeSpeed(app, self.groups[gpu_type], self.speeds)
        return speed

    def record(self, job: dict[str, Any], gpu_type: str) -> None:
        """One more measured configuration of ``job`` on ``gpu_type``, into the book."""
        self.take(job, gpu_type, self.measure(job, gpu_type))

    def take(self, job: dict[str, Any], gpu_type: str, sample: ProfileSample) -> None:
        """What the controller does with a report: the sample into the job's profile."""
        job["max_gpus"] = max(job["max_gpus"], sample.num_gpus)
        self.book.record(job["name"], None if self.pooled else gpu_type, sample)

    def measure(self, job: dict[str, Any], gpu_type: str) -> ProfileSample:
        """What a trainer measures: one new configuration of ``job`` on ``gpu_type``."""
        app: AppTrace = job["app"]
        speed = self._speed(app, gpu_type)
        per_node = self.groups[gpu_type].gpus_per_node
        gpus = int(self.rng.choice([1, 2, 4, 8, 16, 32]))
        gpus = min(gpus, max(1, app.max_batch_size // app.min_local_bsz))
        full, rest = divmod(gpus, per_node)
        placement = tuple([per_node] * full + ([rest] if rest else []))
        local = int(self.rng.integers(app.min_local_bsz, speed.max_local_bsz + 1))
        step, sync = speed.step_time_s(placement, local)
        return ProfileSample(placement, local, 1, float(step), float(min(sync, step)))

    def gradients(self) -> dict[str, GradParams]:
        """What the trainers report of their gradient noise now (the traces' statistics at
        each job's progress)."""
        out = {}
        for job in self.jobs:
            app: AppTrace = job["app"]
            sqr, var = app.grad_stats(job["progress"], app.init_batch_size)
            out[job["name"]] = GradParams(float(sqr), float(var))
        return out

    def views(
        self,
        allocations: dict[str, Allocation],
        now_s: float,
        gradients: dict[str, GradParams] | None = None,
    ) -> tuple[JobView, ...]:
        """The job views a controller builds from its book: ``gradients`` as reported (by
        default :meth:`gradients`)."""
        grads = self.gradients() if gradients is None else gradients
        out = []
        for index, job in enumerate(self.jobs):
            app: AppTrace = job["app"]
            grad = grads[job["name"]]
            models = {}
            pooled = None
            if self.pooled:
                pooled = GoodputModel(self.book.perf(job["name"], None), grad, _limits(app))
            else:
                for gpu_type in job["types"]:
                    perf = self.book.perf(job["name"], gpu_type)
                    limits = _limits(app, self._speed(app, gpu_type).max_local_bsz)
                    models[gpu_type] = GoodputModel(perf, grad, limits)
            out.append(
                JobView(
                    name=job["name"],
                    application=app.name,
                    submit_time_s=float(index),
                    age_s=now_s,
                    attained_gpu_s=float(self.rng.uniform(0, 1e5)),
                    num_restarts=int(self.rng.integers(0, 5)),
                    allocation=allocations.get(job["name"], Allocation()),
                    limits=_limits(app),
                    requested_gpus=4,
                    fixed_batch_size=app.init_batch_size,
                    max_profiled_gpus=job["max_gpus"],
                    model=pooled,
                    models=models,
                    remaining_progress=app.target_progress - job["progress"],
                )
            )
        return tuple(out)

    def cluster_at(self, now_s: float, round_index: int) -> ClusterView:
        return replace(self.cluster, now_s=now_s, round_index=round_index)

    def new_epochs(self, share: float) -> None:
        for job in self.jobs:
            if self.rng.random() < share:
                app: AppTrace = job["app"]
                job["progress"] = min(
                    app.target_progress * 0.999, job["progress"] + app.target_progress / 50
                )


#: Rounds with refits measured per (size, variant, policy); their median is reported.
REFIT_ROUNDS = 3


class _TooSlow(Exception):
    pass


def _too_slow(_signum: int, _frame: Any) -> None:
    raise _TooSlow


def measure(
    gpus: int, mixed: bool, policy_name: str, rounds: int, seed: int, limit_s: float | None = None
) -> dict[str, Any]:
    """One (size, variant, policy), in its own process; ``{"skipped": ...}`` if its first round
    takes more than ``limit_s``."""
    if policy_name == "coadapt-milp":  # coadapt with the exact solver, for comparison
        policy = make_policy("coadapt", solver="milp")
    else:
        policy = make_policy(policy_name, seed=seed)
    rnd = Round(gpus, mixed, seed, pooled=not getattr(policy, "type_aware", False))
    state = policy.initial_state()
    now = 3600.0
    ri = RoundInput(rnd.cluster_at(now, 60), rnd.views({}, now))
    if limit_s is not None:  # stop a round that runs past the limit (the child process only)
        signal.signal(signal.SIGALRM, _too_slow)
        signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        first = policy.decide(ri, state)
    except _TooSlow:
        return {"skipped": f"a round took over {limit_s:g} s"}
    finally:
        if limit_s is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
    state, allocations = first.state, dict(first.plan.allocations)
    walls, gaps = [], []
    for r in range(rounds):
        now += 60.0
        rnd.new_epochs(1 / 3)
        ri = RoundInput(rnd.cluster_at(now, 61 + r), rnd.views(allocations, now))
        t0 = time.perf_counter()
        decision = policy.decide(ri, state)
        walls.append(time.perf_counter() - t0)
        state, allocations = decision.state, dict(decision.plan.allocations)
        if hasattr(state, "gap"):
            gaps.append(state.gap / max(abs(state.objective), 1e-12))
    # Rounds in which every running job reports a new configuration (the median of three:
    # one round alone is at the mercy of a noisy neighbour on a shared machine).
    refit_walls = []
    for r in range(REFIT_ROUNDS):
        now += 60.0
        running = [job for job in rnd.jobs if allocations.get(job["name"])]
        reports = [(job, job["types"][0], rnd.measure(job, job["types"][0])) for job in running]
        gradients = rnd.gradients()
        t0 = time.perf_counter()
        for job, gpu_type, sample in reports:
            rnd.take(job, gpu_type, sample)
        rnd.book.refit()
        views = rnd.views(allocations, now, gradients)
        decision = policy.decide(RoundInput(rnd.cluster_at(now, 62 + rounds + r), views), state)
        refit_walls.append(time.perf_counter() - t0)
        state, allocations = decision.state, dict(decision.plan.allocations)
    refit_round_s = statistics.median(refit_walls)
    out = {
        "jobs": len(rnd.jobs),
        "gpus": rnd.cluster.total_gpus,
        "running_jobs": len(running),
        "median_s": statistics.median(walls),
        "p95_s": float(np.percentile(walls, 95)),
        "round_with_refits_s": refit_round_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }
    if gaps:
        out["gap"] = statistics.median(gaps)
    return out


def _child(queue: Any, *args: Any) -> None:
    queue.put(measure(*args))


def _in_child(limit_s: float | None, *args: Any) -> dict[str, Any] | None:
    """``measure(*args)`` in a fresh process (its own peak RSS); ``None`` if it ran out of
    ``limit_s``."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, *args))
    proc.start()
    try:
        return queue.get(timeout=limit_s)
    except queue_module.Empty:
        return None
    finally:
        proc.kill() if proc.is_alive() else None
        proc.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="64,256,1024,2048")
    ap.add_argument("--policies", default="coadapt,pollux")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pollux-limit-s", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    unknown = [s for s in sizes if s not in JOBS]
    if unknown:
        ap.error(f"--sizes: no job count for {unknown}; choose among {sorted(JOBS)}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    result: dict[str, Any] = {"sizes": {}, "sizes_t4": {}, "rounds": args.rounds}
    for variant, mixed in (("sizes", True), ("sizes_t4", False)):
        too_slow: set[str] = set()
        for gpus in sizes:
            row = result[variant].setdefault(str(gpus), {})
            for policy in policies:
                if policy in too_slow:
                    reason = f"a round took over {args.pollux_limit_s:g} s at a smaller size"
                    row[policy] = {"skipped": reason}
                    continue
                slow = policy in ("pollux", "coadapt-milp")
                limit = args.pollux_limit_s if slow else None
                hard = None if limit is None else limit * (args.rounds + 4)
                measured = _in_child(hard, gpus, mixed, policy, args.rounds, args.seed, limit)
                if measured is None or "skipped" in measured:
                    reason = f"a round took over {args.pollux_limit_s:g} s"
                    row[policy] = measured or {"skipped": reason}
                    too_slow.add(policy)
                    continue
                row[policy] = measured
                if slow and row[policy]["median_s"] > args.pollux_limit_s:
                    too_slow.add(policy)
                print(f"{variant} {gpus:5d} {policy:8s} {json.dumps(row[policy])}", flush=True)
    print(json.dumps(result, indent=2))
    if args.out is not None:
        write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
