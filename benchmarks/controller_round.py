"""How long a controller round takes at scale, cloud latency aside.

    python benchmarks/controller_round.py [--jobs 1000] [--instances 500] [--rounds 9]
        [--history-days N [--compare-fresh]] [--store URL | --postgres] [--out FILE]

A real store file (SQLite, WAL, in a temporary folder), the behavioural fake cloud in memory
(no latency: what is measured is the controller), the default fleet strategy (goodput-per-
dollar sizing, held at ``--instances`` by ``min_instances = max_instances``) and the default
policy (``coadapt``). The fleet is the fake's T4 and A100 offerings with unlimited capacity.
Warm-up rounds run until the fleet holds ``--instances`` running instances; then ``--rounds``
measured rounds follow, each after every placed job reported (a trainer report with a new
profile and gradient statistics, written to the store as the API will) and every running
instance heartbeat, the clock a minute later.

``--history-days N`` first fills the store with N simulated days of a busy cluster's past,
written through the store's own methods, as the controller writes them (an old store, to
show a round's cost does not grow with the cluster's age): every day a generation of
``--instances / 4`` instances is launched, run and, the next day, ended and billed; every
six hours each job is moved onto one of them (an assignment change: spans, usage totals)
with an event; every hour each offering's price is recorded. Then the jobs hold nothing and
the past fleet is gone, as in a fresh store, and the run goes on as without it. (Trainer
reports are not filled: the controller keeps a bounded number per job as it reads them.)
``--compare-fresh`` also builds a fresh store of the same jobs and times its rounds
interleaved with the old one's (alternating which goes first), so both meet the same load
of a shared machine; the JSON then adds ``"fresh": {"round_s_median", "round_s_p95",
"phases_s_median"}`` and ``"aged_over_fresh"``, the ratio of the two medians.

``--store URL`` (an empty PostgreSQL database) or ``--postgres`` (a private server started
and stopped by the run, :class:`emulators.postgres_server.PostgresServer`, a fresh database in
it) also builds the same cluster on PostgreSQL and times its rounds interleaved with the
SQLite one's (alternating which goes first, as ``--compare-fresh`` does); the JSON then adds
``"postgres": {"round_s_median", "round_s_p95", "phases_s_median", "warmup_rounds"}`` and
``"postgres_over_sqlite"``, the ratio of the two medians (the top-level figures stay
SQLite's).

Prints a table of the measured rounds split into observe / decide / reconcile / act, and
writes ``{"round_s_median", "round_s_p95", "rss_mib", "store_mib", "phases_s_median":
{...}, "jobs", "instances", "rounds", "fleet_gpus", "assigned_gpus", "placed_jobs",
"history_days", "history": {...}}``: after the last round, the GPUs of the running
instances, those the jobs hold, and the jobs placed (the rounds measured are rounds that
keep a fleet busy, not empty ones); ``history`` counts the rows the fill wrote (``spans``,
``instances``, ``events``, ``prices``) and its wall time (``fill_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import JobStatus, Store
from autoscaler.controller.store.postgres import is_postgres_url
from autoscaler.decide.sizing import SizingConfig
from autoscaler.model.traces import load_app
from autoscaler.sim.runner import paper_workloads
from autoscaler.sim.workload import load_workload
from coadapt_common.atomic import write_json_atomic
from coadapt_common.clock import FakeClock
from emulators.reports import synthetic_report
from providers.fake import FakeProvider, default_offerings
from trainer.report import TrainerReport

CLUSTER = "bench"


def _fleet(clock: FakeClock) -> FakeProvider:
    offerings = [o for o in default_offerings() if o.gpu_type in ("T4", "A100")]
    return FakeProvider(offerings, capacity={}, clock=clock)


def _report(
    job: str,
    app: str,
    gpus: int,
    nodes: int,
    progress: float,
    now_s: float,
    rng: np.random.Generator,
) -> TrainerReport:
    trace = load_app(app)
    local = int(rng.integers(trace.min_local_bsz, trace.max_local_bsz + 1))
    step_s = float(0.05 + 0.002 * local * rng.uniform(0.9, 1.1) + (0.02 if nodes > 1 else 0.0))
    return synthetic_report(
        job,
        gpus=gpus,
        nodes=nodes,
        local_bsz=local,
        step_s=step_s,
        sync_s=0.2 * step_s if gpus > 1 else 0.0,
        progress=progress,
        now_s=now_s,
        init_batch_size=trace.init_batch_size,
        max_batch_size=trace.max_batch_size,
        grad_sqr=float(rng.uniform(0.5, 2)),
        grad_var=float(rng.uniform(1, 8)),
    )


def _agents(bench: Bench) -> None:
    store, now = bench.store, bench.clock.now_s()
    running = {r.instance_key for r in store.list_instances(statuses=(InstanceStatus.RUNNING,))}
    for key in running:
        store.record_heartbeat(key, now)
    placed: dict[str, list[int]] = {}
    for (job, key), gpus in store.list_assignments().items():
        if key in running:
            placed.setdefault(job, []).append(gpus)
    for job, parts in placed.items():
        report = _report(job, bench.apps[job], sum(parts), len(parts), 1.0, now, bench.rng)
        store.add_report(job, report.to_json())


HISTORY_MOVE_S = 6 * 3600.0
"""How often, in the filled past, every job is moved (a new assignment)."""


def _fill_history(
    store: Store, clock: FakeClock, days: int, jobs: list[str], instances: int
) -> dict[str, float]:
    """``days`` simulated days of history for ``jobs`` (see the module docstring), the clock
    moved past them; returns what was written."""
    t0 = time.perf_counter()
    offerings = _fleet(clock).offerings()
    rng = np.random.default_rng(1)
    store.set_durable(False)  # a fill, not a cluster: a crash loses only the benchmark
    per_day = max(1, instances // 4)
    counts = {"spans": 0, "instances": 0, "events": 0, "prices": 0}
    live: list[tuple[str, int]] = []  # (key, version) of the running generation
    for day in range(days):
        generation: list[tuple[str, int]] = []
        for k in range(per_day):
            o = offerings[(day + k) % len(offerings)]
            key = f"past-{day:03d}-{k:04d}"
            row = store.add_instance(
                instance_key=key,
                request_id=f"{CLUSTER}-{key}",
                offering_key=o.key,
                provider=o.provider,
                instance_type=o.instance_type,
                zone=o.zone,
                market=o.market.value,
                gpu_type=o.gpu_type,
                gpus=o.gpus,
                price_usd_per_hour=o.price_usd_per_hour or 0.0,
            )
            row = store.transition(key, row.version, InstanceStatus.REQUESTED, reason="launch")
            row = store.transition(
                key, row.version, InstanceStatus.RUNNING, reason="listed", provider_instance_id=key
            )
            generation.append((key, row.version))
        _end_generation(store, clock, live)
        live = generation
        counts["instances"] += per_day
        for _move in range(int(86_400 / HISTORY_MOVE_S)):
            events = []
            for job in jobs:
                key = live[int(rng.integers(len(live)))][0]
                store.set_assignments(job, {key: 1})
                events.append((clock.now_s(), "rescale", job, f"{job} moved to {key}"))
            counts["spans"] += len(jobs)
            store.add_events(events)
            counts["events"] += len(events)
            for _hour in range(int(HISTORY_MOVE_S / 3600)):
                for o in offerings:
                    price = (o.price_usd_per_hour or 0.0) * float(rng.uniform(0.8, 1.2))
                    store.record_price(o.key, price, o.market)
                counts["prices"] += len(offerings)
                clock.advance(3600.0)
    for job in jobs:
        store.set_assignments(job, {})
    _end_generation(store, clock, live)
    store.set_durable(True)
    return {**counts, "fill_s": time.perf_counter() - t0}


def _end_generation(store: Store, clock: FakeClock, generation: list[tuple[str, int]]) -> None:
    """Release and bill a generation of past instances (they ran since their launch)."""
    for key, version in generation:
        row = store.transition(key, version, InstanceStatus.TERMINATING, reason="released")
        row = store.transition(key, row.version, InstanceStatus.TERMINATED, reason="gone")
        _, started = store.status_times(key)
        assert started is not None
        store.add_cost_record(key, started, clock.now_s(), row.price_usd_per_hour)


@dataclass
class Bench:
    """One cluster under measurement: its store (in ``tmp``), controller, clock, jobs'
    applications, the random stream of its reports, and the rounds measured."""

    store: Store
    ctl: Controller
    clock: FakeClock
    apps: dict[str, str]
    rng: np.random.Generator
    tmp: Path
    history: dict[str, float]
    warmup: int = 0
    walls: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(
        default_factory=lambda: {"observe": [], "decide": [], "reconcile": [], "act": []}
    )


def _bench(jobs: int, instances: int, history_days: int, store_url: str | None = None) -> Bench:
    """A cluster of ``jobs`` (the same ones whatever ``history_days``) warmed up until it
    holds ``instances`` running instances and every placed job has reported; its store a
    SQLite file in a temporary folder, or the (empty) PostgreSQL database ``store_url``."""
    rng = np.random.default_rng(0)
    clock = FakeClock()
    names = sorted({j.application for f in paper_workloads("1.0") for j in load_workload(f).jobs})
    tmp = Path(tempfile.mkdtemp(prefix="coadapt-bench-"))
    store = Store.create(store_url or tmp / "store.db", CLUSTER, clock)
    apps: dict[str, str] = {}
    for i in range(jobs):
        app = str(rng.choice(names))
        trace = load_app(app)
        spec = JobSubmission(
            f"job-{i:05d}",
            trace.init_batch_size,
            trace.max_batch_size,
            trace.max_local_bsz,
            trace.min_local_bsz,
            application=app,
            command=("train.py",),
        )
        store.add_job(spec.name, spec.to_json())
        apps[spec.name] = app
    history = (
        _fill_history(store, clock, history_days, list(apps), instances) if history_days else {}
    )
    config = ControllerConfig(
        CLUSTER,
        sizing=SizingConfig(min_instances=instances, max_instances=instances),
        reconcile=ReconcileConfig(heartbeat_timeout_s=600.0, max_in_flight=instances),
    )
    ctl = Controller(store, _fleet(clock), clock, config)
    bench = Bench(store, ctl, clock, apps, rng, tmp, history)
    while len(store.list_instances(statuses=(InstanceStatus.RUNNING,))) < instances:
        ctl.run_round()
        clock.advance(60.0)
        _agents(bench)
        bench.warmup += 1
        if bench.warmup > 60:
            raise SystemExit(f"the fleet did not reach {instances} instances in 60 rounds")
    ctl.run_round()  # the first round with every placed job profiled: models, tables
    clock.advance(60.0)
    _agents(bench)
    return bench


def _measure(bench: Bench, label: str) -> None:
    t0 = time.perf_counter()
    rep = bench.ctl.run_round()
    wall = time.perf_counter() - t0
    bench.walls.append(wall)
    for name in bench.phases:
        bench.phases[name].append(getattr(rep, f"{name}_s"))
    print(
        f"{label:>5} {len(bench.walls):>5} {wall:>8.3f} {rep.observe_s:>8.3f} "
        f"{rep.decide_s:>8.3f} {rep.reconcile_s:>9.3f} {rep.act_s:>8.3f}",
        flush=True,
    )
    bench.clock.advance(60.0)
    _agents(bench)


def _summary(bench: Bench) -> dict:
    return {
        "round_s_median": statistics.median(bench.walls),
        "round_s_p95": float(np.percentile(bench.walls, 95)),
        "phases_s_median": {k: statistics.median(v) for k, v in bench.phases.items()},
    }


def run(
    jobs: int,
    instances: int,
    rounds: int,
    history_days: int = 0,
    compare_fresh: bool = False,
    store_url: str | None = None,
) -> dict:
    bench = _bench(jobs, instances, history_days)
    fresh = _bench(jobs, instances, 0) if compare_fresh else None
    pg = _bench(jobs, instances, history_days, store_url) if store_url else None
    print(f"{'store':>5} {'round':>5} {'total_s':>8} {'observe':>8} {'decide':>8} "
          f"{'reconcile':>9} {'act':>8}")  # fmt: skip
    for r in range(rounds):
        # interleaved, alternating which goes first: one machine's load for all of them
        group = [(bench, "aged" if history_days else ("sqlite" if pg else "fresh"))]
        if fresh is not None:
            group = [(bench, "aged"), (fresh, "fresh")]
        if pg is not None:
            group.append((pg, "pg"))
        for b, label in group if r % 2 == 0 else reversed(group):
            _measure(b, label)
    store = bench.store
    live = store.list_instances(statuses=(InstanceStatus.RUNNING,))
    running = len(live)
    active = len(store.list_jobs(statuses=(JobStatus.QUEUED, JobStatus.RUNNING)))
    on_live = {r.instance_key for r in live}
    held = store.list_assignments()
    assigned_gpus = sum(g for (_, key), g in held.items() if key in on_live)
    placed_jobs = len({job for (job, key) in held if key in on_live})
    store_mib = sum(p.stat().st_size for p in bench.tmp.iterdir()) / 2**20
    out = {
        "jobs": active,
        "instances": running,
        "rounds": rounds,
        "warmup_rounds": bench.warmup,
        "fleet_gpus": sum(r.gpus for r in live),
        "assigned_gpus": assigned_gpus,
        "placed_jobs": placed_jobs,
        **_summary(bench),
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "store_mib": store_mib,
        "history_days": history_days,
        "history": bench.history,
    }
    if fresh is not None:
        out["fresh"] = _summary(fresh)
        out["aged_over_fresh"] = out["round_s_median"] / out["fresh"]["round_s_median"]
    if pg is not None:
        out["postgres"] = {**_summary(pg), "warmup_rounds": pg.warmup}
        out["postgres_over_sqlite"] = out["postgres"]["round_s_median"] / out["round_s_median"]
    for done in (bench, fresh, pg):
        if done is not None:
            done.store.close()
            shutil.rmtree(done.tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--instances", type=int, default=500)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument(
        "--history-days",
        type=int,
        default=0,
        help="fill the store with this many simulated days of history first (0: fresh)",
    )
    p.add_argument(
        "--compare-fresh",
        action="store_true",
        help="also time a fresh store, its rounds interleaved with the old one's",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--store",
        help="also time the cluster on this (empty) PostgreSQL database, postgresql://...",
    )
    where.add_argument(
        "--postgres",
        action="store_true",
        help="also time the cluster on PostgreSQL: a private server this run starts and stops",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.history_days < 0:
        p.error("--history-days must be >= 0")
    if args.store is not None and not is_postgres_url(args.store):
        p.error("--store takes a postgresql://user@host:port/database URL")
    server = None
    if args.postgres:
        from emulators.postgres_server import PostgresServer, postgres_unavailable

        why = postgres_unavailable()
        if why is not None:
            p.error(f"--postgres: no PostgreSQL server can start here: {why}")
        server = PostgresServer().start()
    try:
        url = args.store if server is None else server.create_database()
        result = run(
            args.jobs, args.instances, args.rounds, args.history_days, args.compare_fresh, url
        )
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(result, indent=2))
    if args.out:
        write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
