"""Load on the controller API: many clients submitting jobs and polling, at once, against a real
``coadapt up`` in its own process.

    python benchmarks/api_load.py [--clients 200] [--seconds 60] [--half-open 0] [--out FILE]
                                  [--in-process]

By default a ``coadapt up`` (local provider, a fresh state folder) runs in a separate process,
its fleet released first (``POST /v1/fleet/release``: the thousands of jobs submitted launch
no instance on this machine, while the service's round loop still runs beside its API). With
``--in-process`` the API server runs in this process over a store file instead (no rounds).
``--clients`` client threads, each with its own :class:`~autoscaler.controller.api.ApiClient`
and the user token, loop for ``--seconds``: submit a job (a fresh name), read it back, read the
first page of the job list (``GET /v1/jobs``, what the dashboard and ``status`` read first).
``--half-open`` more connections each send half a request and stall for the whole run (slow or
hostile clients). Every request's latency is recorded; an error is any request that raised. At
the end every submitted job must be listed by the API (``lost_jobs`` counts those that are not).
The server process's threads are sampled every 0.2 s (``server_threads_max``), and the largest
job-list answer is kept (``list_bytes_max``, and ``list_jobs_max``, the most jobs one answer
listed: at most a page, 100, however many jobs there are).

Writes ``{"requests", "errors", "p50_ms", "p99_ms", "lost_jobs", "clients", "seconds", "jobs",
"half_open", "server_threads_max", "list_bytes_max", "list_jobs_max", "server_cpu_ms_per_request",
"client_cpu_ms_per_request", "target", "cpus", "load_before", "load_after"}`` (``load_*``: the
1-minute load average of this machine; the CPU figures tell what the machine had to give
whatever else ran on it: in-process, both are this process's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from autoscaler.controller.api import (
    ApiClient,
    ApiError,
    generate_tokens,
    load_tokens,
    make_app,
    serve,
)
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.atomic import write_json_atomic
from coadapt_common.clock import SystemClock
from coadapt_common.procfs import process_cpu_s, process_thread_count

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def _in_process(tmp: Path) -> Iterator[tuple[str, str, int]]:
    clock = SystemClock()
    Store.create(tmp / "store.db", "load", clock).close()
    tokens = generate_tokens(tmp / "tokens.json")
    app = make_app(
        tmp / "store.db",
        tokens,
        clock,
        logs_dir=tmp / "logs",
        on_job_exit=lambda name, *, failed: JobStatus.COMPLETED,
    )
    server = serve(app)
    try:
        yield server.url, tokens.user, os.getpid()
    finally:
        server.shutdown()
        app.close()


@contextmanager
def _coadapt_up(tmp: Path) -> Iterator[tuple[str, str, int]]:
    state = tmp / "state"
    log = open(tmp / "up.log", "w")  # noqa: SIM115 - closed below
    up = subprocess.Popen(
        [sys.executable, "-m", "autoscaler.cli", "up", "--state-dir", str(state),
         "--interval-s", "5", "--max-instances", "1", "--max-gpu-slots", "1"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists():
            if up.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"coadapt up did not start: {(tmp / 'up.log').read_text()}")
            time.sleep(0.05)
        url = json.loads((state / "up.json").read_text())["url"]
        user = load_tokens(state / "tokens.json").user
        ApiClient(url, user).release_fleet()  # no instance for the load's jobs
        yield url, user, up.pid
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)  # keeps the (empty) fleet: nothing to release
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
        log.close()


def _cpu_s(pid: int) -> float:
    return process_cpu_s(pid) or 0.0


def _threads(pid: int) -> int:
    return process_thread_count(pid) or 0


def _half_open(url: str, count: int) -> list[socket.socket]:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    out = []
    for _ in range(count):
        s = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
        s.sendall(b'POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n{"na')
        out.append(s)
    return out


def run(clients: int, seconds: float, *, half_open: int = 0, in_process: bool = False) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="coadapt-api-load-"))
    load_before = os.getloadavg()[0]
    target = _in_process(tmp) if in_process else _coadapt_up(tmp)
    latencies: list[float] = []
    errors: list[str] = []
    submitted: list[str] = []
    list_bytes = [0]
    list_jobs = [0]
    lock = threading.Lock()
    try:
        with target as (url, token, pid):
            stalled = _half_open(url, half_open)
            threads_max = [_threads(pid)]
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(0.2):
                    threads_max[0] = max(threads_max[0], _threads(pid))

            sampler = threading.Thread(target=sample)
            sampler.start()
            cpu_before = _cpu_s(pid), _cpu_s(os.getpid())
            stop = time.monotonic() + seconds

            def timed(call: Callable[[], object]) -> bool:
                t0 = time.perf_counter()
                try:
                    call()
                    ok = True
                except ApiError as e:
                    ok = False
                    with lock:
                        errors.append(str(e))
                with lock:
                    latencies.append(time.perf_counter() - t0)
                return ok

            def first_page(api: ApiClient) -> None:
                _, raw = api._request("GET", "/v1/jobs", query={"limit": "100"})
                listed = len(json.loads(raw)["jobs"])
                with lock:
                    list_bytes[0] = max(list_bytes[0], len(raw))
                    list_jobs[0] = max(list_jobs[0], listed)

            def client(i: int) -> None:
                api = ApiClient(url, token, timeout_s=60.0)
                n = 0
                while time.monotonic() < stop:
                    name = f"load-{i:03d}-{n:05d}"
                    n += 1
                    spec = JobSubmission(name, 64, 512, 64, command=("train.py",))
                    if timed(lambda: api.submit_job(spec)):  # noqa: B023 - called at once
                        with lock:
                            submitted.append(name)
                    timed(lambda: api.get_job(name))  # noqa: B023
                    timed(lambda: first_page(api))

            threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            sampling.set()
            sampler.join()
            server_cpu_s = _cpu_s(pid) - cpu_before[0]
            client_cpu_s = _cpu_s(os.getpid()) - cpu_before[1]
            stored = {j.name for j in ApiClient(url, token, timeout_s=120.0).list_jobs()}
            for s in stalled:
                s.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ms = np.array(latencies) * 1000.0
    return {
        "target": "in-process" if in_process else "coadapt up",
        "clients": clients,
        "seconds": seconds,
        "half_open": half_open,
        "requests": len(latencies),
        "errors": len(errors),
        "p50_ms": float(statistics.median(ms)) if len(ms) else 0.0,
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else 0.0,
        "jobs": len(stored),
        "lost_jobs": len(set(submitted) - stored),
        "server_threads_max": threads_max[0],
        "server_cpu_ms_per_request": 1000.0 * server_cpu_s / max(1, len(latencies)),
        "client_cpu_ms_per_request": 1000.0 * client_cpu_s / max(1, len(latencies)),
        "list_bytes_max": list_bytes[0],
        "list_jobs_max": list_jobs[0],
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "first_errors": errors[:5],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--half-open", type=int, default=0, help="stalled connections held open")
    p.add_argument("--in-process", action="store_true", help="no coadapt up: a server here")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    result = run(args.clients, args.seconds, half_open=args.half_open, in_process=args.in_process)
    print(json.dumps(result, indent=2))
    if args.out:
        write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
