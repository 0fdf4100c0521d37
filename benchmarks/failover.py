"""Failover: two ``coadapt up`` processes on one PostgreSQL store, the leader killed.

    python benchmarks/failover.py [--kills N] [--stops 1] [--seed 0] [--epochs 48] [--out F]

It starts its own PostgreSQL server (:class:`emulators.postgres_server.PostgresServer`, the
tests' helper) and two ``coadapt up`` processes on the ``local`` provider sharing one state
folder and that store (``--store``), each on its own port, the local agents given both
addresses (``--api-urls``), rounds every second (a lease of 1.5 s). Three training jobs
(``examples/jobs/mlp-small.yaml`` under three names, one GPU slot each, ``--epochs`` epochs)
run while, ``--kills`` times, the lease's holder is SIGKILLed at a random point of its round
(a random 0.2-2.5 s after the restarted standby said it ``stands by``) and started again as a
standby on its port, and, ``--stops`` times, the leader is frozen (SIGSTOP) in the middle of
a round that writes (the first after a new trainer report: it records the models the report
changed), a random 0-:data:`FREEZE_WITHIN_S` after it renewed the lease (between its lease
check and the round's writes; the report and the renewal are watched on the database), past
its lease until the other takes over, then resumed (SIGCONT): it carries on with its round
and its stale epoch; a stop is repeated (at most :data:`FREEZE_TRIES` times) until the woken
leader had a write refused by epoch. Then the jobs run to their end and ``coadapt down``
releases the fleet. Measured (one JSON object, printed and with ``--out`` written):

* ``kills``, ``stops``; ``takeover_s`` (each, from the kill or the freeze to the lease's
  change of holder, polled every 50 ms on the database) and ``takeover_s_max``;
* ``duplicate_launches``: request ids under which the local provider listed two instances
  at once (sampled every 0.5 s);
* ``leaked_instances``: instances the provider still lists after ``coadapt down``, plus those
  listed under a request id no instance row of the store knows;
* ``healthy_relaunches``: launchers (``trainer.launch``) of a job started after its first,
  beyond one (the jobs take one GPU slot each and nothing preempts them: every further
  launcher is a job stopped and started again);
* ``jobs``, ``jobs_completed``, ``jobs_exact``: completed at the length its script declared
  (its last report in the store says done, its progress at least that length) with no sample
  lost or repeated: the trainer's own step log (``--log-dir``: the sample ids of every
  micro-batch) holds each step once, every data epoch but the last with every sample exactly
  once and the last with none twice (a job that grew its batch needs more data epochs than
  ``--epochs`` for the same progress: AdaScale); ``samples`` gives, by job, ``[trained,
  repeated, data_epochs]`` from that log; ``final_report``, by job, ``[progress,
  target_progress, done]`` of its last stored report;
* ``stale_writes_refused`` (the lease row's counter: writes of a deposed leader refused by
  epoch), ``freeze_tries`` (the stops it took to get one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.chaos import _launchers  # noqa: E402
from emulators.postgres_server import PostgresServer  # noqa: E402
from providers.local import LocalProvider  # noqa: E402

CLUSTER = "coadapt-local"
COADAPT = [sys.executable, "-m", "autoscaler.cli"]
INTERVAL_S = 1.0
LEASE_S = 1.5 * INTERVAL_S
JOBS = ("fo-a", "fo-b", "fo-c")
NUM_SAMPLES = 1024  # examples/jobs/mlp-small.yaml's --num-samples: one epoch
FREEZE_WITHIN_S = 0.01
"""A stop comes this soon (uniformly at random) after the leader renewed its lease: inside
its round (a round renews the lease first, then reads and writes), at a random point of it;
a stop that falls between two rounds is tried again (``freeze_tries`` counts them)."""
FREEZE_TRIES = 8
REPORT_WAIT_S = 40.0  # the trainers report every 30 s (trainer.env's default)
STANDBY_WAIT_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Failover:
    def __init__(self, args: argparse.Namespace, url: str) -> None:
        self.args = args
        self.url = url
        self.rng = random.Random(args.seed)
        self.tmp = Path(tempfile.mkdtemp(prefix="coadapt-failover-"))
        self.state = self.tmp / "state"
        self.ports = (_free_port(), _free_port())
        self.urls = ",".join(f"http://127.0.0.1:{p}" for p in self.ports)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.log_offsets: dict[int, int] = {}
        self.steps = self.tmp / "steps"
        self.freeze_tries = 0
        self.takeovers: list[float] = []
        self.kills = 0
        self.stops = 0
        self.by_request: dict[str, set[str]] = {}
        self.duplicates: set[str] = set()
        self.launchers: dict[str, set[int]] = {}
        self.sampling = threading.Event()

    # ---- the pair ----------------------------------------------------------------------------

    def log_path(self, port: int) -> Path:
        return self.tmp / f"up-{port}.log"

    def start(self, port: int) -> None:
        path = self.log_path(port)
        self.log_offsets[port] = path.stat().st_size if path.exists() else 0
        log = path.open("ab")
        env = {**os.environ, "COADAPT_STORE_URL": self.url, "PYTHONPATH": str(ROOT)}
        self.procs[port] = subprocess.Popen(
            [*COADAPT, "up", "--state-dir", str(self.state), "--port", str(port),
             "--api-urls", self.urls, "--interval-s", str(INTERVAL_S), "--max-gpu-slots", "4",
             "--max-instances", "4", "--job-isolation", "none"],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip

    def lease(self) -> tuple[str, int, int] | None:
        import psycopg

        try:
            with psycopg.connect(self.url) as pg:
                row = pg.execute(
                    "SELECT holder, epoch, refused_writes FROM leader_lease"
                ).fetchone()
        except psycopg.errors.UndefinedTable:
            return None  # the first up has not built the store yet
        return None if row is None else (str(row[0]), int(row[1]), int(row[2]))

    def said_since_start(self, port: int, *needles: str) -> bool:
        """Whether the ``up`` on ``port`` said one of ``needles`` since it was last started."""
        with self.log_path(port).open("rb") as f:
            f.seek(self.log_offsets.get(port, 0))
            text = f.read().decode(errors="replace")
        return any(n in text for n in needles)

    def wait_said(self, port: int, *needles: str) -> None:
        """Until the ``up`` on ``port`` said one of ``needles`` (since its start)."""
        deadline = time.monotonic() + STANDBY_WAIT_S
        while not self.said_since_start(port, *needles):
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {port} never said {needles}: " + self.tail())
            time.sleep(0.05)

    def last_report_id(self, pg: Any) -> int:
        row = pg.execute("SELECT coalesce(max(report_id), 0) FROM reports").fetchone()
        return int(row[0])

    def renewed_at_s(self, pg: Any) -> float:
        row = pg.execute("SELECT renewed_at_s FROM leader_lease").fetchone()
        return float(row[0])

    def leader_port(self) -> int:
        lease = self.lease()
        assert lease is not None
        return int(lease[0].rsplit(":", 1)[1])

    def wait_takeover(self, epoch: int, since: float) -> float:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lease = self.lease()
            if lease is not None and lease[1] > epoch:
                took = time.monotonic() - since
                self.takeovers.append(took)
                return took
            time.sleep(0.05)
        raise RuntimeError("no takeover within 60 s: " + self.tail())

    def tail(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-2500:]
            for p in sorted(self.tmp.glob("up-*.log"))
        )

    def coadapt(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run(
            [*COADAPT, *args, "--state-dir", str(self.state)], cwd=ROOT, capture_output=True,
            text=True, timeout=180, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip

    # ---- watching ----------------------------------------------------------------------------

    def sample(self) -> None:
        provider = LocalProvider(self.state / "local")
        while not self.sampling.wait(0.5):
            with contextlib.suppress(Exception):
                listed = provider.list_instances(CLUSTER)
                seen: dict[str, int] = {}
                for inst in listed:
                    seen[inst.request_id] = seen.get(inst.request_id, 0) + 1
                    self.by_request.setdefault(inst.request_id, set()).add(inst.instance_id)
                self.duplicates |= {r for r, n in seen.items() if n > 1}
                ids = {i.instance_id for i in listed}
                for (job, _), procs in _launchers(ids).items():
                    self.launchers.setdefault(job, set()).update(pid for pid, _ in procs)

    def jobs(self) -> dict[str, dict[str, Any]]:
        out = self.coadapt("status", "--json")
        if out.returncode != 0:
            return {}
        return {j["name"]: j for j in json.loads(out.stdout)["jobs"]}

    # ---- the scenario ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        for port in self.ports:
            self.start(port)
            deadline = time.monotonic() + 90
            while self.lease() is None if port == self.ports[0] else False:
                if time.monotonic() > deadline:
                    raise RuntimeError("no controller led within 90 s: " + self.tail())
                time.sleep(0.2)
        self.wait_said(self.ports[1], "stands by")  # the second one serves and stands by
        spec = ROOT / "examples/jobs/mlp-small.yaml"
        text = spec.read_text().replace("--epochs, 16", f"--epochs, {self.args.epochs}")
        assert f"--num-samples, {NUM_SAMPLES}," in text and "--step-delay-s, 0.02]" in text
        copy = ROOT / "examples/jobs" / f".failover-{os.getpid()}.yaml"
        try:
            for name in JOBS:  # each with its own step log
                logged = f"--step-delay-s, 0.02, --log-dir, {self.steps / name}]"
                copy.write_text(text.replace("--step-delay-s, 0.02]", logged))
                out = self.coadapt("submit", str(copy), "--name", name)
                if out.returncode != 0:
                    raise RuntimeError(f"submit {name}: {out.stderr}")
        finally:
            copy.unlink(missing_ok=True)
        sampler = threading.Thread(target=self.sample, daemon=True)
        sampler.start()
        while not any(j.get("status") == "running" for j in self.jobs().values()):
            time.sleep(0.5)
        for _ in range(self.args.kills):
            time.sleep(self.rng.uniform(0.2, 2.5))  # a random point of the round
            port = self.leader_port()
            lease = self.lease()
            assert lease is not None
            self.procs[port].send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            self.procs[port].wait()
            self.kills += 1
            self.wait_takeover(lease[1], killed_at)
            self.start(port)  # back as a standby, on its port: the next kill once it stands by
            self.wait_said(port, "stands by")
        refused_before = (self.lease() or ("", 0, 0))[2]
        import psycopg

        for _ in range(self.args.stops):
            for _try in range(FREEZE_TRIES):
                time.sleep(self.rng.uniform(0.2, 1.0))
                port = self.leader_port()
                lease = self.lease()
                assert lease is not None
                with psycopg.connect(self.url, autocommit=True) as pg:
                    # a round that writes: the next after a new trainer report (it records
                    # the models the report changed); one with nothing new writes nothing
                    reported = self.last_report_id(pg)
                    deadline = time.monotonic() + REPORT_WAIT_S
                    while self.last_report_id(pg) == reported and time.monotonic() < deadline:
                        time.sleep(0.01)
                    renewed = self.renewed_at_s(pg)
                    deadline = time.monotonic() + 10 * INTERVAL_S
                    while self.renewed_at_s(pg) == renewed and time.monotonic() < deadline:
                        pass  # its next round renews the lease first
                time.sleep(self.rng.uniform(0.0, FREEZE_WITHIN_S))
                self.log_offsets[port] = self.log_path(port).stat().st_size
                self.procs[port].send_signal(signal.SIGSTOP)
                stopped_at = time.monotonic()
                self.stops += 1
                self.freeze_tries += 1
                self.wait_takeover(lease[1], stopped_at)
                time.sleep(LEASE_S)
                self.procs[port].send_signal(signal.SIGCONT)
                self.wait_said(port, "stands by", "standing by")  # woken, refused, deposed
                now_refused = (self.lease() or ("", 0, 0))[2]
                if now_refused > refused_before:
                    refused_before = now_refused
                    break
        deadline = time.monotonic() + self.args.timeout_s
        jobs: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            jobs = self.jobs() or jobs
            if jobs and all(j["status"] in ("completed", "failed") for j in jobs.values()):
                break
            time.sleep(2.0)
        lease = self.lease()
        known = set()
        import psycopg

        last: dict[str, Any] = {}
        with psycopg.connect(self.url) as pg:
            known = {str(r[0]) for r in pg.execute("SELECT request_id FROM instances")}
            for name, raw in pg.execute(
                "SELECT job_name, payload_json FROM reports ORDER BY report_id"
            ):
                last[str(name)] = json.loads(raw)
        self.sampling.set()
        sampler.join()
        strangers = {r for r in self.by_request if r not in known}
        down = self.coadapt("down")
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
        left = LocalProvider(self.state / "local").list_instances(CLUSTER)
        trained = {n: self.trained(n) for n in jobs}
        exact = [
            n
            for n, j in jobs.items()
            if j["status"] == "completed"
            and last.get(n, {}).get("done") is True
            and last[n].get("target_progress") is not None
            and last[n]["progress"] >= last[n]["target_progress"]
            and _exact(*trained[n])
        ]
        return {
            "kills": self.kills,
            "stops": self.stops,
            "takeover_s": [round(t, 3) for t in self.takeovers],
            "takeover_s_max": round(max(self.takeovers, default=0.0), 3),
            "interval_s": INTERVAL_S,
            "lease_s": LEASE_S,
            "duplicate_launches": len(self.duplicates),
            "leaked_instances": len(left) + len(strangers),
            "healthy_relaunches": sum(max(0, len(p) - 1) for p in self.launchers.values()),
            "launchers": {j: len(p) for j, p in sorted(self.launchers.items())},
            "jobs": len(JOBS),
            "jobs_completed": sum(1 for j in jobs.values() if j["status"] == "completed"),
            "jobs_exact": len(exact),
            "samples": {n: _counts(*trained[n]) for n in jobs},
            "final_report": {
                n: [last.get(n, {}).get(k) for k in ("progress", "target_progress", "done")]
                for n in jobs
            },
            "stale_writes_refused": 0 if lease is None else lease[2],
            "freeze_tries": self.freeze_tries,
            "final_epoch": None if lease is None else lease[1],
            "down_rc": down.returncode,
        }

    def trained(self, job: str) -> tuple[dict[int, list[int]], int]:
        """The sample ids ``job`` trained, by data epoch, from its step log (every rank's,
        every attempt's: a sample trained twice is there twice), and how many of its
        micro-steps (step, micro-batch, rank) were logged more than once (replayed)."""
        by_epoch: dict[int, list[int]] = {}
        seen: set[tuple[str, int, int]] = set()
        replayed = 0
        for path in sorted((self.steps / job).glob("*.jsonl")):
            rank = path.name.split("-", 1)[0]
            for line in path.read_text().splitlines():
                record = json.loads(line) if line.strip() else {}
                if "ids" in record and "event" not in record:
                    key = (rank, int(record["step"]), int(record["micro"]))
                    replayed += key in seen
                    seen.add(key)
                    by_epoch.setdefault(int(record["epoch"]), []).extend(record["ids"])
        return by_epoch, replayed

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                proc.wait()
        with contextlib.suppress(Exception):
            LocalProvider(self.state / "local").down(CLUSTER)


def _counts(by_epoch: dict[int, list[int]], replayed: int) -> list[int]:
    """``[trained, repeated, data_epochs]`` of a job's step log (:meth:`Failover.trained`):
    sample ids trained, those trained again within their data epoch, data epochs begun."""
    trained = sum(len(ids) for ids in by_epoch.values())
    distinct = sum(len(set(ids)) for ids in by_epoch.values())
    return [trained, trained - distinct, len(by_epoch)]


def _exact(by_epoch: dict[int, list[int]], replayed: int) -> bool:
    """No sample lost or repeated: no micro-step replayed, the data epochs 0..E-1 each with
    every sample once but the last, which holds no sample twice."""
    epochs = sorted(by_epoch)
    if replayed or not epochs or epochs != list(range(len(epochs))):
        return False
    full = list(range(NUM_SAMPLES))
    last = by_epoch[epochs[-1]]
    return all(sorted(by_epoch[e]) == full for e in epochs[:-1]) and len(set(last)) == len(last)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--stops", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=48)
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not (0 <= args.kills <= 100 and 0 <= args.stops <= 10 and 1 <= args.epochs <= 10_000):
        p.error("--kills 0-100, --stops 0-10, --epochs 1-10000")
    server = PostgresServer().start()
    try:
        url = server.create_database()
        run = Failover(args, url)
        try:
            result = run.run()
        finally:
            run.close()
    finally:
        server.stop()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
