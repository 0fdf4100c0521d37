"""A controller process and the world around it, for the kill -9 tests (run as a program).

    python -m tests.controller.world --dir DIR --cloud fake|aws [--moto-url URL]
        [--kill-at N] [--seed S] [--jobs J] [--work W] [--max-rounds R]

``DIR`` holds everything that must outlive the process: the store (``store.db``), the fake
cloud (``cloud.json``; with ``aws`` the moto server holds it) and the clock (``clock``, a
:class:`~coadapt_common.clock.FakeClock` time advanced a minute per round). Each round: the
world may preempt one spot instance (seeded by round), the controller runs its round, the
simulated agents heartbeat for every running instance and make progress on every job placed
on running instances (a trainer report with a profile, through the store, as the API will),
and a job with ``--work`` GPU-rounds of progress completes. When every job has completed, the
controller releases the fleet (``down``) and the program prints ``DONE clean=<bool>``.

``--kill-at N`` kills the process with SIGKILL at the N-th crash point the controller passes
(:data:`autoscaler.controller.loop.CRASH_POINTS`; with ``--kill-point P`` the N-th passage of
``P``), after printing ``KILL <N> <point>``. Fake preemptions come with AWS's 120 s notice;
on moto, two in three preemptions send EC2's spot warning through EventBridge to the
interruption queue the provider reads, the others terminate the instance outright (a reclaim
whose warning was missed).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
from pathlib import Path

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.loop import CRASH_POINTS, Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import JobStatus, Store
from autoscaler.decide.sizing import SizingConfig
from coadapt_common.atomic import write_text_atomic
from coadapt_common.clock import FakeClock
from emulators.reports import synthetic_report
from providers.base import Market, Provider
from trainer.report import TrainerReport

CLUSTER = "crash1"
WORK_GPU_ROUNDS = 6
START_S = 1_700_000_000.0


def _clock(d: Path) -> FakeClock:
    f = d / "clock"
    return FakeClock(float(f.read_text()) if f.exists() else START_S)


def _store(d: Path, clock: FakeClock, jobs: int) -> Store:
    path = d / "store.db"
    if path.exists():
        return Store.open(path, clock)
    store = Store.create(path, CLUSTER, clock)
    for i in range(jobs):
        spec = JobSubmission(
            f"job-{i}", 128, 1024, 128, 32, application="cifar10", command=("train.py",)
        )
        store.add_job(spec.name, spec.to_json())
    return store


def _provider(args: argparse.Namespace, clock: FakeClock) -> Provider:
    if args.cloud == "fake":
        from providers.fake import FakeProvider

        return FakeProvider(clock=clock, state_path=Path(args.dir) / "cloud.json")
    from emulators.aws_moto import create_interruption_queue, make_provider

    queue_file = Path(args.dir) / "queue"
    if not queue_file.exists():
        queue_url, _ = create_interruption_queue(args.moto_url)
        write_text_atomic(queue_file, queue_url, durable=True)
    queue_url = queue_file.read_text()
    return make_provider(args.moto_url, clock=clock, interruption_queue_url=queue_url)


def _preempt(
    args: argparse.Namespace, provider: Provider, rng: random.Random, clock: FakeClock
) -> None:
    spot = sorted(
        i.instance_id
        for i in provider.list_instances(CLUSTER)
        if i.market is Market.SPOT and i.state.value == "running"
    )
    draw = rng.random()
    if not spot or draw > 0.3:
        return
    victim = rng.choice(spot)
    if args.cloud == "fake":
        provider.preempt(victim, notice_s=120.0)  # type: ignore[attr-defined]
    elif draw < 0.2:  # EC2's two-minute warning, through EventBridge to the queue
        from emulators.aws_moto import send_spot_warning

        send_spot_warning(args.moto_url, victim, at_s=clock.now_s())
    else:  # reclaimed with the warning missed: gone from the listing
        from emulators.aws_moto import admin_client

        admin_client(args.moto_url, "ec2").terminate_instances(InstanceIds=[victim])
    print(f"PREEMPT {victim}", flush=True)


def _agents(store: Store, now_s: float, work: float) -> None:
    """Heartbeats, progress reports and completions, as the agents and trainers would."""
    running = {r.instance_key: r for r in store.list_instances(statuses=(InstanceStatus.RUNNING,))}
    for key in running:
        store.record_heartbeat(key, now_s)
    placed: dict[str, int] = {}
    for (job, key), gpus in store.list_assignments().items():
        if key in running:
            placed[job] = placed.get(job, 0) + gpus
    for job in store.list_jobs(statuses=(JobStatus.QUEUED, JobStatus.RUNNING)):
        gpus = placed.get(job.name, 0)
        if not gpus:
            continue
        last = store.latest_report(job.name)
        done = 0.0 if last is None else TrainerReport.from_json(last.payload_json).progress
        progress = done + gpus
        store.add_report(job.name, _report(job.name, gpus, progress, now_s).to_json())
        if progress >= work:
            store.update_job(job.name, job.version, status=JobStatus.COMPLETED)


def _report(job: str, gpus: int, progress: float, now_s: float) -> TrainerReport:
    local = 128 // min(gpus, 4)
    step_s = 0.05 + 0.001 * local + (0.01 if gpus > 1 else 0.0)
    return synthetic_report(
        job,
        gpus=gpus,
        nodes=gpus,
        local_bsz=local,
        step_s=step_s,
        sync_s=0.005,
        progress=progress,
        now_s=now_s,
        init_batch_size=128,
        max_batch_size=1024,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--cloud", choices=("fake", "aws"), required=True)
    p.add_argument("--moto-url")
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--kill-point", choices=CRASH_POINTS, help="count only this crash point")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--max-rounds", type=int, default=200)
    p.add_argument("--work", type=float, default=WORK_GPU_ROUNDS, help="GPU-rounds per job")
    args = p.parse_args(argv)
    d = Path(args.dir)
    clock = _clock(d)
    store = _store(d, clock, args.jobs)
    provider = _provider(args, clock)
    passed = 0

    def hook(point: str) -> None:
        nonlocal passed
        if args.kill_point not in (None, point):
            return
        passed += 1
        if passed == args.kill_at:
            print(f"KILL {passed} {point}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    config = ControllerConfig(
        CLUSTER,
        sizing=SizingConfig(max_instances=8),
        reconcile=ReconcileConfig(heartbeat_timeout_s=300.0, boot_grace_s=600.0),
    )
    controller = Controller(store, provider, clock, config, crash_hook=hook)
    for _ in range(args.max_rounds):
        rng = random.Random(f"{args.seed}-{clock.now_s()}")
        _preempt(args, provider, rng, clock)
        report = controller.run_round()
        print(f"ROUND {report.round_index} calls={report.cloud_calls}", flush=True)
        clock.advance(60.0)
        _agents(store, clock.now_s(), args.work)
        write_text_atomic(d / "clock", repr(clock.now_s()), durable=True)
        if not store.list_jobs(statuses=(JobStatus.QUEUED, JobStatus.RUNNING)):
            down = controller.down()
            print(f"DONE clean={down.clean}", flush=True)
            return 0
    print("UNFINISHED", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
