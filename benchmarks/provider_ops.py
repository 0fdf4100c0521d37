"""Provider operation cost: launch N instances, list them, terminate them all.

Counts the real API calls and the wall time of each phase, prints a table and writes::

    {"provider": str, "instances": int,
     "calls": {"launch": int, "list": int, "terminate": int},
     "wall_s": {"launch": float, "list": float, "terminate": float}}

``calls[phase]`` is every API call made during that phase, of any kind (a launch that first
looks up its request id counts that lookup too); the table also shows the split by kind.
Calls should grow with pools and pages, not with instances — except for ``local``, whose
"API" is the operating system: one process spawn and one signal per instance, by nature.

What counts as a call:

* ``fake``: the fake cloud's call records (one per pool attempt, page, or terminate batch);
* ``local``: agent process spawns (launch), state-folder scans (list), process-group signals
  (terminate);
* ``aws-moto`` / ``gcp-fake``: the ``call_counter`` of ``emulators.aws_moto.
  moto_benchmark_env`` / ``emulators.gcp_env.fake_benchmark_env`` (real HTTP calls).

The emulators come from the dev-only top-level ``emulators`` package of a checkout (not the
installed wheel, not the ``tests`` tree; see ``emulators/__init__.py`` for why), which is why
this script puts the repository root on ``sys.path``.

    python benchmarks/provider_ops.py --provider aws-moto|gcp-fake|local|fake \\
        --instances N --out FILE [--pool-capacity K]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coadapt_common.atomic import write_json_atomic
from coadapt_common.clock import SystemClock
from providers.base import LaunchRequest, Market, Offering, Provider

PHASES = ("launch", "list", "terminate")
PROVIDERS = ("aws-moto", "gcp-fake", "local", "fake")

CallCounter = Callable[[], dict[str, int]]
T = TypeVar("T")


@dataclass(frozen=True)
class BenchEnv:
    """A provider ready to use, the pools to launch into, and its API-call counter."""

    provider: Provider
    offerings: Sequence[Offering]
    call_counter: CallCounter
    settle: Callable[[Sequence[str]], None] = lambda ids: None


@contextlib.contextmanager
def fake_env(cluster_id: str, pool_capacity: int | None) -> Iterator[BenchEnv]:
    from providers.fake import FakeProvider

    provider = FakeProvider(clock=SystemClock())
    pools = sorted(
        (o for o in provider.offerings() if o.gpus == 1 and o.market is Market.SPOT),
        key=lambda o: (o.price_usd_per_hour or 0.0, o.key),
    )
    for o in pools:
        provider.set_capacity(o.key, pool_capacity)
    before = len(provider.calls)

    def counter() -> dict[str, int]:
        counts = {phase: 0 for phase in PHASES}
        for call in provider.calls[before:]:
            if call.op in counts:
                counts[call.op] += 1
        return counts

    yield BenchEnv(provider, pools, counter)


@contextlib.contextmanager
def local_env(cluster_id: str, instances: int) -> Iterator[BenchEnv]:
    from providers.local import LocalProvider

    with tempfile.TemporaryDirectory(prefix="coadapt-bench-") as tmp:
        provider = LocalProvider(Path(tmp), max_gpu_slots=max(1, instances))
        pools = [
            o
            for o in provider.offerings()
            if o.instance_type == "local-1gpu" and o.market is Market.SPOT
        ]

        def counter() -> dict[str, int]:
            ops = provider.op_counts
            return {"launch": ops["spawn"], "list": ops["scan"], "terminate": ops["signal"]}

        def settle(ids: Sequence[str]) -> None:
            """Wait (no provider call) until every agent reports running."""
            deadline = time.monotonic() + 60.0
            pending = set(ids)
            while pending and time.monotonic() < deadline:
                for iid in list(pending):
                    path = Path(tmp, "agents", iid, "agent.json")
                    with contextlib.suppress(OSError, ValueError):
                        if json.loads(path.read_text()).get("state") == "running":
                            pending.discard(iid)
                time.sleep(0.02)
            if pending:
                raise SystemExit(f"{len(pending)} local agents did not come up within 60 s")

        try:
            yield BenchEnv(provider, pools, counter, settle)
        finally:
            provider.down(cluster_id)


@contextlib.contextmanager
def cloud_env(kind: str, cluster_id: str) -> Iterator[BenchEnv]:
    """The environments the AWS and GCP adapters provide for this benchmark."""
    make_env: Callable[[str], contextlib.AbstractContextManager[Any]]
    try:
        if kind == "aws-moto":
            from emulators.aws_moto import moto_benchmark_env

            make_env = moto_benchmark_env
        else:
            from emulators.gcp_env import fake_benchmark_env

            make_env = fake_benchmark_env
    except ImportError as err:
        needed = (
            "emulators.aws_moto.moto_benchmark_env"
            if kind == "aws-moto"
            else "emulators.gcp_env.fake_benchmark_env"
        )
        raise SystemExit(
            f"--provider {kind} needs {needed}, which could not be imported: {err}"
        ) from err
    with make_env(cluster_id) as (provider, offerings, call_counter):
        yield BenchEnv(provider, list(offerings), call_counter)


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(after) | set(before))}


@dataclass(frozen=True)
class Measured:
    """What one benchmark run measured: the document to write and the per-kind call split."""

    doc: dict[str, object]
    calls_by_kind: dict[str, dict[str, int]]


class Phases:
    """Times phases and diffs the call counter around each."""

    def __init__(self, counter: CallCounter) -> None:
        self._counter = counter
        self._clock = SystemClock()
        self.calls_by_kind: dict[str, dict[str, int]] = {}
        self.wall_s: dict[str, float] = {}

    def measure(self, phase: str, fn: Callable[[], T]) -> T:
        before = self._counter()
        start = self._clock.monotonic_s()
        out = fn()
        self.wall_s[phase] = self._clock.monotonic_s() - start
        self.calls_by_kind[phase] = diff(self._counter(), before)
        return out


def run(env: BenchEnv, provider_name: str, cluster_id: str, instances: int) -> Measured:
    """Launch, list, terminate; each phase measured on its own."""
    phases = Phases(env.call_counter)
    request = LaunchRequest(
        request_id=f"bench-{uuid.uuid4().hex[:12]}",
        cluster_id=cluster_id,
        offerings=tuple(env.offerings),
        count=instances,
    )
    launched = phases.measure("launch", lambda: env.provider.launch(request))
    ids = [i.instance_id for i in launched.instances]
    if len(ids) != instances:
        errors = [f"{e.offering_key}: {e.error}" for e in launched.errors]
        raise SystemExit(f"launched {len(ids)} of {instances}; errors: {errors}")
    env.settle(ids)
    listed = phases.measure("list", lambda: env.provider.list_instances(cluster_id))
    if len(listed) != instances:
        print(f"warning: listed {len(listed)} of {instances} instances", file=sys.stderr)
    terminate_id = f"bench-{uuid.uuid4().hex[:12]}"
    result = phases.measure(
        "terminate", lambda: env.provider.terminate(cluster_id, ids, terminate_id)
    )
    if len(result.terminated) != instances:
        raise SystemExit(f"terminated {len(result.terminated)} of {instances}")
    doc: dict[str, object] = {
        "provider": provider_name,
        "instances": instances,
        "calls": {phase: sum(phases.calls_by_kind[phase].values()) for phase in PHASES},
        "wall_s": {phase: round(phases.wall_s[phase], 6) for phase in PHASES},
    }
    return Measured(doc, phases.calls_by_kind)


def print_table(m: Measured) -> None:
    calls = m.doc["calls"]
    wall = m.doc["wall_s"]
    assert isinstance(calls, dict) and isinstance(wall, dict)
    print(f"provider={m.doc['provider']}  instances={m.doc['instances']}")
    print(f"{'phase':<10} {'calls':>6} {'wall_s':>10}  calls by kind")
    for phase in PHASES:
        kinds = ", ".join(f"{k}={v}" for k, v in m.calls_by_kind[phase].items() if v)
        print(f"{phase:<10} {calls[phase]:>6} {wall[phase]:>10.4f}  {kinds or '-'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", required=True, choices=PROVIDERS)
    parser.add_argument("--instances", required=True, type=int)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument(
        "--pool-capacity",
        type=int,
        default=None,
        help="fake only: at most this many instances per pool (default unlimited)",
    )
    args = parser.parse_args(argv)
    if args.instances <= 0:
        parser.error("--instances must be positive")
    cluster_id = f"bench-{uuid.uuid4().hex[:10]}"
    if args.provider == "fake":
        env_cm = fake_env(cluster_id, args.pool_capacity)
    elif args.provider == "local":
        env_cm = local_env(cluster_id, args.instances)
    else:
        env_cm = cloud_env(args.provider, cluster_id)
    with env_cm as env:
        measured = run(env, args.provider, cluster_id, args.instances)
    print_table(measured)
    write_json_atomic(args.out, measured.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
