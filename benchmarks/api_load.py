"""Load on the controller API: many clients submitting jobs and polling, at once.

    python benchmarks/api_load.py [--clients 200] [--seconds 60] [--out FILE]

A real API server (``autoscaler.controller.api``, Werkzeug, one thread per connection) over a
real store file, in this process; ``--clients`` client threads, each with its own
:class:`~autoscaler.controller.api.ApiClient` and the user token, loop for ``--seconds``: submit
a job (a fresh name), read it back, list the jobs. Every request's latency is recorded; an
error is any request that raised. At the end every submitted job must be in the store
(``lost_jobs`` counts those that are not).

Writes ``{"requests", "errors", "p50_ms", "p99_ms", "lost_jobs", "clients", "seconds",
"jobs"}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from autoscaler.controller.api import ApiClient, ApiError, generate_tokens, make_app, serve
from autoscaler.controller.jobs import JobSubmission
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.atomic import write_json_atomic
from coadapt_common.clock import SystemClock


def run(clients: int, seconds: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="coadapt-api-load-"))
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
    latencies: list[float] = []
    errors: list[str] = []
    submitted: list[str] = []
    lock = threading.Lock()
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

    def client(i: int) -> None:
        api = ApiClient(server.url, tokens.user, timeout_s=60.0)
        n = 0
        while time.monotonic() < stop:
            name = f"load-{i:03d}-{n:05d}"
            n += 1
            spec = JobSubmission(name, 64, 512, 64, command=("train.py",))
            if timed(lambda: api.submit_job(spec)):  # noqa: B023 - called at once
                with lock:
                    submitted.append(name)
            timed(lambda: api.get_job(name))  # noqa: B023
            timed(api.list_jobs)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.shutdown()
    app.close()
    with Store.open(tmp / "store.db", clock) as store:
        stored = {j.name for j in store.list_jobs()}
    ms = np.array(latencies) * 1000.0
    return {
        "clients": clients,
        "seconds": seconds,
        "requests": len(latencies),
        "errors": len(errors),
        "p50_ms": float(statistics.median(ms)) if len(ms) else 0.0,
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else 0.0,
        "jobs": len(stored),
        "lost_jobs": len(set(submitted) - stored),
        "first_errors": errors[:5],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    result = run(args.clients, args.seconds)
    print(json.dumps(result, indent=2))
    if args.out:
        write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
