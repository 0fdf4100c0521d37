"""How long a ``GET /metrics`` scrape's figures take to read at scale.

    python benchmarks/metrics_scrape.py [--jobs 1000] [--running 500] [--instances 500]
        [--ended-instances 2000] [--scrapes 21] [--out FILE]

A real store file (SQLite, WAL, in a temporary folder) written through the store's own
methods: ``--instances`` running instances (4 GPUs each, each since a different second) and
``--ended-instances`` terminated ones with their cost records (the history a spend total
reads); ``--jobs`` jobs of which ``--running`` run, each on one instance with a planned batch
and a trainer report. Then ``--scrapes`` scrapes of :meth:`~autoscaler.controller.metrics.
ControllerMetrics.exposition` (the body of ``GET /metrics``: the fleet read from the store,
the text rendered), timed one by one. Writes ``{"scrape_s_median", "scrape_s_p95",
"body_bytes", "jobs", "running", "instances", "ended_instances", "scrapes"}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.metrics import ControllerMetrics
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock
from providers.base import Market
from trainer.report import BatchConfig, GradientStats, JobHints, ProfileEntry, TrainerReport

START_S = 1_700_000_000.0
_SPEC = {"name": "", "init_batch_size": 64, "max_batch_size": 1024, "command": ["train.py"]}


def _report(job: str) -> TrainerReport:
    return TrainerReport(
        job_id=job, attempt=1, started_at_s=START_S, sent_at_s=START_S + 60, world_size=4,
        num_nodes=1, batch=BatchConfig(256, 1), step=100, skipped_steps=0, epoch=1,
        epoch_position=0, progress=100.0, gradient=GradientStats(64, 1.0, 4.0, 10, False),
        profiles=(ProfileEntry(1, 4, 64, 1, 10, 0.5, 0.4, 0.1),), hints=JobHints(64, 1024),
    )  # fmt: skip


def _instance(store: Store, key: str, *, end: bool) -> None:
    row = store.add_instance(
        instance_key=key, request_id=f"c1-{key}", offering_key="fake/g4dn.12xlarge/z/spot",
        provider="fake", instance_type="g4dn.12xlarge", zone="z", market=Market.SPOT,
        gpu_type="T4", gpus=4, price_usd_per_hour=1.2,
    )  # fmt: skip
    row = store.transition(key, row.version, InstanceStatus.REQUESTED, reason="launch")
    row = store.transition(key, row.version, InstanceStatus.RUNNING, reason="up",
                           provider_instance_id=f"p-{key}")  # fmt: skip
    if end:
        row = store.transition(key, row.version, InstanceStatus.TERMINATING, reason="down")
        store.transition(key, row.version, InstanceStatus.TERMINATED, reason="gone")
        store.add_cost_record(key, START_S, START_S + 3600.0, 1.2, 1.2)


def build(path: Path, clock: FakeClock, args: argparse.Namespace) -> None:
    with Store.create(path, "c1", clock) as store:
        store.set_durable(False)  # the fill only: the scrapes read
        for i in range(args.ended_instances):
            _instance(store, f"i-old-{i:06d}", end=True)
        for i in range(args.instances):
            clock.advance(1.0)
            _instance(store, f"i-{i:06d}", end=False)
        for j in range(args.jobs):
            name = f"job-{j:05d}"
            store.add_job(name, json.dumps({**_SPEC, "name": name}))
            if j < args.running:
                store.set_assignments(name, {f"i-{j % args.instances:06d}": 4})
                store.update_job(name, 1, status=JobStatus.RUNNING)
                store.set_batch(name, global_batch_size=256, local_batch_size=64,
                                accum_steps=1, gpus=4)  # fmt: skip
                store.add_report(name, _report(name).to_json())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--running", type=int, default=500)
    p.add_argument("--instances", type=int, default=500)
    p.add_argument("--ended-instances", type=int, default=2000)
    p.add_argument("--scrapes", type=int, default=21)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not 0 <= args.running <= args.jobs or args.instances < 1 or args.scrapes < 1:
        p.error("need 0 <= --running <= --jobs, --instances >= 1, --scrapes >= 1")
    clock = FakeClock(START_S)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.db"
        build(path, clock, args)
        with Store.open(path, clock) as store:
            metrics = ControllerMetrics()
            metrics.watch_store(lambda: store, clock)
            times, size = [], 0
            for _ in range(args.scrapes):
                clock.advance(15.0)
                t0 = time.perf_counter()
                size = len(metrics.exposition())
                times.append(time.perf_counter() - t0)
    times.sort()
    result = {
        "scrape_s_median": statistics.median(times),
        "scrape_s_p95": times[min(len(times) - 1, round(0.95 * (len(times) - 1)))],
        "body_bytes": size,
        "jobs": args.jobs,
        "running": args.running,
        "instances": args.instances,
        "ended_instances": args.ended_instances,
        "scrapes": args.scrapes,
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
