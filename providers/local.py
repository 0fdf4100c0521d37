"""``LocalProvider``: the embedded default cloud, where an instance is a local agent process.

Each instance is one detached ``python .../providers/local_agent.py`` process (its own session
and process group; run as a script, so it imports nothing but the standard library) with N
"GPU slots" (CPU-backed). The provider keeps no state in memory that it cannot rebuild:
everything lives in ``state_dir``::

    state_dir/lock                    flock: one mutating provider call at a time, across processes
    state_dir/instances/<id>.json     one record per instance (written atomically: tmp + rename)
    state_dir/agents/<id>/            the agent's folder: agent.json (its own heartbeat),
                                      agent.log, user_data, spot-notice.json (after preempt)

Rules it keeps, beyond ``providers.base``:

* **Intent before action.** A launch writes the record (state ``pending``, no pid) *before*
  spawning the agent, then adds the pid. A record found without a pid was left by a crashed
  launch: the provider looks for the agent by its command line (``/proc``) and adopts it, or
  marks the record ``never-started``. Terminate writes ``stopping`` before it signals.
* **Real ownership checks.** A pid counts as our agent only if ``/proc/<pid>/cmdline`` names
  the agent script and the instance id, so a recycled pid is never signalled. A process
  group is signalled only while one of its members carries ``COADAPT_LOCAL_INSTANCE=<id>`` in
  its environment.
* **Terminate leaves nothing running.** SIGTERM to the whole process group and to every
  process that carries the instance's marker outside it (workloads that start their own
  session, like the node agent's launchers: every process of an instance inherits the
  marker), a bounded wait of ``term_grace_s`` (real time: process exits are real events,
  measured on ``process_clock``), then SIGKILL to whatever is left.
* **Capacity.** At most ``max_gpu_slots`` live GPU slots on this machine (all clusters sharing
  ``state_dir``) and optionally at most N live instances per pool; a launch that runs out gets
  ``InsufficientCapacityError`` for that pool, which is then marked unavailable.
* **Shared cores.** The instances share this machine's cores: an agent's environment sets
  ``OMP_NUM_THREADS`` to the cores over the slot budget (at least 1; :attr:`threads_per_slot`)
  unless the caller's environment sets it, so a full local fleet does not oversubscribe them
  (the launcher's own default gives each worker every core, meant for a machine of its own).
* **Preemption.** ``preempt(instance_id, notice_s)`` queues a notice (and writes the agent's
  ``spot-notice.json``); once the injected ``clock`` passes the deadline the next provider call
  stops the instance. An agent that dies on its own yields a ``TERMINATED`` notice.

The injected ``clock`` stamps records and drives notice deadlines and the capacity cache.
Needs Linux ``/proc`` for the ownership checks; elsewhere it falls back to signal-0 probes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from coadapt_common.atomic import write_json_atomic
from coadapt_common.clock import Clock, SystemClock
from coadapt_common.procfs import (
    PROC_ROOT,
    ProcStat,
    has_procfs,
    is_running,
    read_proc_strings,
    read_stat,
)
from providers.base import (
    Instance,
    InstanceState,
    InterruptionKind,
    InterruptionNotice,
    LaunchRequest,
    LaunchResult,
    Market,
    Offering,
    SpotPrice,
    TerminateResult,
    find_offering,
    launch_shortfall,
)
from providers.capacity import Placement, UnavailableOfferings, walk_pools
from providers.errors import (
    InstanceNotFoundError,
    InsufficientCapacityError,
    InvalidRequestError,
    ProviderError,
)
from providers.local_agent import INSTANCE_ENV
from providers.tags import CLUSTER_ID_TAG, REQUEST_ID_TAG, all_tags, is_owned_by, validate_id

log = logging.getLogger(__name__)

LOCAL_PROVIDER: Final = "local"
LOCAL_REGION: Final = "local"
LOCAL_ZONE: Final = "local-a"
AGENT_SCRIPT: Final = str(Path(__file__).resolve().with_name("local_agent.py"))
RECORD_VERSION: Final = 1
_POLL_S: Final = 0.01
_KILL_WAIT_S: Final = 5.0


def local_offerings() -> list[Offering]:
    """The local catalogue: 1, 2 and 4 CPU-backed GPU slots, spot and on-demand, nominal prices
    (0.10 and 0.30 USD per slot-hour)."""
    out: list[Offering] = []
    for gpus in (1, 2, 4):
        for market, usd_per_slot_hour in ((Market.SPOT, 0.10), (Market.ON_DEMAND, 0.30)):
            out.append(
                Offering(
                    provider=LOCAL_PROVIDER,
                    instance_type=f"local-{gpus}gpu",
                    gpu_type="cpu-slot",
                    gpus=gpus,
                    vcpus=gpus,
                    memory_gib=2.0 * gpus,
                    region=LOCAL_REGION,
                    zone=LOCAL_ZONE,
                    market=market,
                    price_usd_per_hour=round(usd_per_slot_hour * gpus, 4),
                )
            )
    return out


def default_state_dir() -> Path:
    """``$COADAPT_HOME/local`` (default ``~/.coadapt/local``)."""
    home = os.environ.get("COADAPT_HOME")
    return (Path(home) if home else Path.home() / ".coadapt") / "local"


class RecordState(StrEnum):
    """Lifecycle of a local instance record."""

    PENDING = "pending"  # intent written, agent not (known to be) spawned
    RUNNING = "running"  # agent spawned, pid recorded
    STOPPING = "stopping"  # terminate/preempt decided, signals being sent
    TERMINATED = "terminated"  # nothing of it runs any more


class EndReason(StrEnum):
    """Why a record reached ``terminated``."""

    TERMINATED = "terminated"  # terminate() / down()
    PREEMPTED = "preempted"  # preemption deadline passed
    DIED = "died"  # the agent exited on its own (or was killed by someone else)
    NEVER_STARTED = "never-started"  # a crashed launch left an intent without a process


@dataclass(frozen=True)
class LocalNotice:
    """An interruption announced for a local instance; ``reported`` once drained."""

    kind: InterruptionKind
    deadline_s: float | None
    noticed_at_s: float
    reported: bool = False


@dataclass(frozen=True)
class LocalRecord:
    """One instance as stored in ``state_dir/instances/<id>.json``."""

    instance_id: str
    tags: Mapping[str, str]
    offering: Offering
    state: RecordState
    created_at_s: float
    pid: int | None = None
    pgid: int | None = None
    started_at_s: float | None = None
    terminated_at_s: float | None = None
    end_reason: EndReason | None = None
    notice: LocalNotice | None = None

    @property
    def cluster_id(self) -> str:
        return self.tags.get(CLUSTER_ID_TAG, "")

    @property
    def request_id(self) -> str:
        return self.tags.get(REQUEST_ID_TAG, "")

    @property
    def live(self) -> bool:
        return self.state is not RecordState.TERMINATED

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["tags"] = dict(self.tags)
        data["offering"] = asdict(self.offering)
        data["notice"] = None if self.notice is None else asdict(self.notice)
        data["version"] = RECORD_VERSION
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LocalRecord:
        o = dict(data["offering"])
        o["market"] = Market(o["market"])
        n = data.get("notice")
        notice = None
        if n is not None:
            notice = LocalNotice(
                kind=InterruptionKind(n["kind"]),
                deadline_s=n["deadline_s"],
                noticed_at_s=n["noticed_at_s"],
                reported=bool(n["reported"]),
            )
        reason = data.get("end_reason")
        return cls(
            instance_id=data["instance_id"],
            tags=MappingProxyType(dict(data["tags"])),
            offering=Offering(**o),
            state=RecordState(data["state"]),
            created_at_s=data["created_at_s"],
            pid=data.get("pid"),
            pgid=data.get("pgid"),
            started_at_s=data.get("started_at_s"),
            terminated_at_s=data.get("terminated_at_s"),
            end_reason=None if reason is None else EndReason(reason),
            notice=notice,
        )


# ------------------------------------------------------------------ /proc probes


def _read_cmdline(pid: int, *, settle: bool = True) -> list[str]:
    raw = read_proc_strings(pid, "cmdline", settle=settle)
    return [part.decode(errors="replace") for part in raw]


def _carries_marker(pid: int, instance_id: str) -> bool:
    return f"{INSTANCE_ENV}={instance_id}".encode() in read_proc_strings(pid, "environ")


def is_agent_process(pid: int | None, instance_id: str) -> bool:
    """True when ``pid`` is alive and is the local agent of ``instance_id``."""
    if pid is None:
        return False
    if not has_procfs():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if not is_running(read_stat(pid)):
        return False
    cmd = _read_cmdline(pid)
    return AGENT_SCRIPT in cmd and instance_id in cmd


def live_groups(pgids: Iterable[int]) -> dict[int, list[int]]:
    """Live (non-zombie) member pids of each of ``pgids`` that still has any."""
    wanted = set(pgids)
    if not wanted:
        return {}
    if not has_procfs():
        out: dict[int, list[int]] = {}
        for pgid in wanted:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            out[pgid] = [pgid]
        return out
    members: dict[int, list[int]] = {}
    for entry in os.scandir(PROC_ROOT):
        if not entry.name.isdigit():
            continue
        proc = read_stat(int(entry.name))
        if proc is not None and proc.pgid in wanted and is_running(proc):
            members.setdefault(proc.pgid, []).append(proc.pid)
    return members


def _find_agent(instance_id: str) -> ProcStat | None:
    """Search the process table for the agent of ``instance_id`` (crash recovery)."""
    if not has_procfs():
        return None
    for entry in os.scandir(PROC_ROOT):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        cmd = _read_cmdline(pid, settle=False)
        if AGENT_SCRIPT in cmd and instance_id in cmd:
            proc = read_stat(pid)
            if is_running(proc):
                return proc
    return None


# ------------------------------------------------------------------ the provider


class LocalProvider:
    """Instances are local agent processes. See the module docstring for the rules.

    ``state_dir``: where records live (default ``default_state_dir()``); ``clock``: stamps and
    deadlines (default the system clock); ``process_clock``: the *real* clock that bounds waits
    for processes to exit (tests keep it real); ``max_gpu_slots``: machine-wide slot budget
    (default ``2 * os.cpu_count()``); ``pool_capacity``: offering key -> most live instances
    (missing or ``None``: only the slot budget applies); ``term_grace_s``: SIGTERM-to-SIGKILL
    grace; ``heartbeat_s``: agent heartbeat period; ``spot_price_swing`` /
    ``spot_price_period_s``: simulated spot prices that move around the nominal ones (a
    sine of that relative amplitude and period on ``clock``; 0: constant).

    Counters for tests and benchmarks: ``op_counts`` (``spawn``: agent processes started,
    ``scan``: state-folder scans, ``signal``: signals sent to process groups, ``attempt``:
    pool placement attempts) and ``launch_attempts`` (per offering key).
    """

    name = LOCAL_PROVIDER

    def __init__(
        self,
        state_dir: str | Path | None = None,
        *,
        clock: Clock | None = None,
        process_clock: Clock | None = None,
        unavailable: UnavailableOfferings | None = None,
        max_gpu_slots: int | None = None,
        pool_capacity: Mapping[str, int | None] | None = None,
        term_grace_s: float = 5.0,
        heartbeat_s: float = 2.0,
        terminated_retention_s: float = 3600.0,
        python: str = sys.executable,
        spot_price_swing: float = 0.0,
        spot_price_period_s: float = 600.0,
    ) -> None:
        self._dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self._records_dir = self._dir / "instances"
        self._agents_dir = self._dir / "agents"
        self._records_dir.mkdir(parents=True, exist_ok=True)
        self._agents_dir.mkdir(parents=True, exist_ok=True)
        self._clock: Clock = clock or SystemClock()
        self._process_clock: Clock = process_clock or SystemClock()
        self._unavailable = unavailable or UnavailableOfferings(self._clock)
        slots = max_gpu_slots if max_gpu_slots is not None else 2 * (os.cpu_count() or 1)
        if slots <= 0 or term_grace_s < 0 or heartbeat_s <= 0:
            raise InvalidRequestError("max_gpu_slots and heartbeat_s must be positive")
        if not 0.0 <= spot_price_swing < 1.0 or spot_price_period_s <= 0:
            raise InvalidRequestError(
                "spot_price_swing must be in [0, 1) and spot_price_period_s positive"
            )
        self._swing = spot_price_swing
        self._period_s = spot_price_period_s
        self._max_gpu_slots = slots
        self._catalogue = {o.key: o for o in local_offerings()}
        self._pool_capacity: dict[str, int | None] = {}
        for key, cap in (pool_capacity or {}).items():
            self.set_pool_capacity(key, cap)
        self._term_grace_s = term_grace_s
        self._heartbeat_s = heartbeat_s
        self._retention_s = terminated_retention_s
        self._python = python
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._thread_lock = threading.Lock()
        self.op_counts: Counter[str] = Counter()
        self.launch_attempts: Counter[str] = Counter()

    # ----------------------------------------------------------------- controls

    @property
    def state_dir(self) -> Path:
        return self._dir

    @property
    def unavailable(self) -> UnavailableOfferings:
        return self._unavailable

    @property
    def max_gpu_slots(self) -> int:
        """The machine-wide slot budget (given, or ``2 * os.cpu_count()``)."""
        return self._max_gpu_slots

    @property
    def threads_per_slot(self) -> int:
        """Threads each worker of a local instance gets (its agent's ``OMP_NUM_THREADS``,
        unless already set): this machine's cores split over the slot budget, at least 1."""
        return max(1, (os.cpu_count() or 1) // self._max_gpu_slots)

    def set_pool_capacity(self, offering_key: str, instances: int | None) -> None:
        """At most ``instances`` live instances in ``offering_key`` (None: slot budget only)."""
        if offering_key not in self._catalogue:
            raise InvalidRequestError(f"unknown pool {offering_key!r}")
        if instances is not None and (
            isinstance(instances, bool) or not isinstance(instances, int) or instances < 0
        ):
            raise InvalidRequestError("pool capacity must be None or an int >= 0")
        self._pool_capacity[offering_key] = instances

    def record(self, instance_id: str) -> LocalRecord | None:
        """The stored record of any instance in ``state_dir`` (None: unknown)."""
        return self._read(self._records_dir / f"{instance_id}.json")

    def preempt(self, instance_id: str, notice_s: float = 120.0) -> InterruptionNotice:
        """Announce a spot reclaim of a live instance (any owner); it is stopped by the first
        provider call after the clock passes ``now + notice_s``."""
        if notice_s < 0:
            raise InvalidRequestError("notice_s must be non-negative")
        with self._locked():
            records = self._refresh(self._scan())
            rec = records.get(instance_id)
            if rec is None or not rec.live:
                raise InstanceNotFoundError(f"no live local instance {instance_id!r}")
            now = self._clock.now_s()
            notice = LocalNotice(InterruptionKind.SPOT_INTERRUPTION, now + notice_s, now)
            self._write(replace(rec, notice=notice))
            write_json_atomic(
                self._agents_dir / instance_id / "spot-notice.json",
                {"action": "terminate", "deadline_s": notice.deadline_s},
                indent=None,
                durable=True,
            )
            self._refresh(self._scan())
        return InterruptionNotice(
            instance_id, notice.kind, notice.deadline_s, LOCAL_PROVIDER, noticed_at_s=now
        )

    def down(self, cluster_id: str) -> TerminateResult:
        """Terminate every live instance of ``cluster_id`` (``coadapt down``)."""
        validate_id(cluster_id, field="cluster_id")
        with self._locked():
            records = self._refresh(self._scan())
            ids = [r.instance_id for r in records.values() if r.live and self._owns(r, cluster_id)]
        request_id = f"down-{uuid.uuid4().hex[:12]}"
        return self.terminate(cluster_id, ids, request_id)

    # ---------------------------------------------------------------- contract

    def _priced(self, o: Offering, now_s: float) -> Offering:
        """``o`` at its simulated spot price at ``now_s``: the nominal price times
        ``1 + swing * sin(2 pi now_s / period)`` (the whole spot market moves together, so the
        cheapest mix stays the cheapest); on-demand prices and a zero swing are constant."""
        if o.market is not Market.SPOT or not self._swing or o.price_usd_per_hour is None:
            return o
        factor = 1.0 + self._swing * math.sin(2.0 * math.pi * now_s / self._period_s)
        return replace(o, price_usd_per_hour=round(o.price_usd_per_hour * factor, 6))

    def offerings(self) -> Sequence[Offering]:
        """The catalogue, spot prices as they are now (see ``spot_price_swing``)."""
        now = self._clock.now_s()
        return [self._priced(o, now) for o in self._catalogue.values()]

    def spot_prices(self) -> Sequence[SpotPrice]:
        now = self._clock.now_s()
        return [
            SpotPrice(o.instance_type, o.zone, o.price_usd_per_hour, now)
            for o in self.offerings()
            if o.market is Market.SPOT and o.price_usd_per_hour is not None
        ]

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """The launch rule of ``providers.base``: start agents only for the shortfall of the
        request's live instances (read from ``state_dir``), pools tried in order through
        ``walk_pools``, all under the state lock.

        The found and the started instances are returned (in their current state).
        """
        request.validate()
        pools = [find_offering(list(self._catalogue.values()), o) for o in request.offerings]
        tags = MappingProxyType(all_tags(request.cluster_id, request.request_id, request.tags))
        with self._locked():
            records = self._refresh(self._scan())
            found = [
                self._instance(r)
                for r in sorted(records.values(), key=lambda r: (r.created_at_s, r.instance_id))
                if r.live
                and self._owns(r, request.cluster_id)
                and r.request_id == request.request_id
            ]
            missing = launch_shortfall(request, found)
            if missing == 0:
                return LaunchResult(request.request_id, request.count, tuple(found))
            live = [r for r in records.values() if r.live]
            budget = _SlotBudget(
                used_slots=sum(r.offering.gpus for r in live),
                per_pool=Counter(r.offering.key for r in live),
            )
            walk = walk_pools(
                pools,
                missing,
                self._unavailable,
                lambda batch, wanted: self._place(batch, wanted, tags, request.user_data, budget),
            )
            return LaunchResult(
                request.request_id,
                request.count,
                (*found, *(self._instance(r) for r in walk.created)),
                walk.errors,
            )

    def _place(
        self,
        pools: Sequence[Offering],
        wanted: int,
        tags: Mapping[str, str],
        user_data: str,
        budget: _SlotBudget,
    ) -> Placement[LocalRecord]:
        """One pool attempt of the walk: start as many agents as the slot budget and the pool
        limit allow (lock held). No room at all is the pool's capacity error."""
        (pool,) = pools
        self.op_counts["attempt"] += 1
        self.launch_attempts[pool.key] += 1
        room = (self._max_gpu_slots - budget.used_slots) // pool.gpus
        cap = self._pool_capacity.get(pool.key)
        if cap is not None:
            room = min(room, cap - budget.per_pool[pool.key])
        n = max(0, min(room, wanted))
        if n == 0:
            return Placement(errors={pool.key: _capacity_error(pool.key)})
        started: list[LocalRecord] = []
        try:
            for _ in range(n):
                started.append(self._start(pool, tags, user_data))
                budget.used_slots += pool.gpus
                budget.per_pool[pool.key] += 1
        except ProviderError as err:
            return Placement(tuple(started), errors={pool.key: err})
        if n < wanted:
            return Placement(tuple(started), errors={pool.key: _capacity_error(pool.key)})
        return Placement(tuple(started))

    def list_instances(self, cluster_id: str) -> Sequence[Instance]:
        validate_id(cluster_id, field="cluster_id")
        with self._locked():
            records = self._refresh(self._scan())
        owned = [r for r in records.values() if r.live and self._owns(r, cluster_id)]
        owned.sort(key=lambda r: (r.created_at_s, r.instance_id))
        return [self._instance(r) for r in owned]

    def terminate(
        self, cluster_id: str, instance_ids: Sequence[str], request_id: str
    ) -> TerminateResult:
        """Stop owned instances' process groups (SIGTERM, grace, SIGKILL) and wait for them."""
        validate_id(cluster_id, field="cluster_id")
        validate_id(request_id, field="request_id")
        ids = list(dict.fromkeys(instance_ids))
        if not all(isinstance(i, str) and i for i in ids):
            raise InvalidRequestError("instance ids must be non-empty strings")
        terminated: list[str] = []
        gone: list[str] = []
        refused: list[str] = []
        with self._locked():
            records = self._refresh(self._scan())
            to_stop: list[LocalRecord] = []
            for iid in ids:
                rec = records.get(iid)
                if rec is None:
                    gone.append(iid)
                elif not self._owns(rec, cluster_id):
                    refused.append(iid)
                elif not rec.live:
                    gone.append(iid)
                else:
                    to_stop.append(rec)
                    terminated.append(iid)
            self._stop(to_stop, EndReason.TERMINATED)
        return TerminateResult(request_id, tuple(terminated), tuple(gone), tuple(refused))

    def interruptions(self, cluster_id: str) -> Sequence[InterruptionNotice]:
        """Unreported notices of owned instances; each is reported once (persisted)."""
        validate_id(cluster_id, field="cluster_id")
        out: list[InterruptionNotice] = []
        with self._locked():
            records = self._refresh(self._scan())
            for rec in sorted(records.values(), key=lambda r: (r.created_at_s, r.instance_id)):
                n = rec.notice
                if n is None or n.reported or not self._owns(rec, cluster_id):
                    continue
                self._write(replace(rec, notice=replace(n, reported=True)))
                out.append(
                    InterruptionNotice(
                        rec.instance_id, n.kind, n.deadline_s, LOCAL_PROVIDER, n.noticed_at_s
                    )
                )
        return out

    # ---------------------------------------------------------------- internals

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock, open(self._dir / "lock", "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    @staticmethod
    def _owns(rec: LocalRecord, cluster_id: str) -> bool:
        return is_owned_by(rec.tags, cluster_id)

    def _read(self, path: Path) -> LocalRecord | None:
        try:
            return LocalRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as err:
            log.warning("ignoring unreadable local instance record %s: %s", path, err)
            return None

    def _write(self, rec: LocalRecord) -> None:
        write_json_atomic(
            self._records_dir / f"{rec.instance_id}.json", rec.to_json(), indent=None, durable=True
        )

    def _scan(self) -> dict[str, LocalRecord]:
        self.op_counts["scan"] += 1
        out: dict[str, LocalRecord] = {}
        for path in self._records_dir.glob("*.json"):
            rec = self._read(path)
            if rec is not None:
                out[rec.instance_id] = rec
        return out

    def _reap(self) -> None:
        """Collect exit statuses of agents this process spawned (no zombies left behind)."""
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[pid]

    def _refresh(self, records: dict[str, LocalRecord]) -> dict[str, LocalRecord]:
        """Bring records in line with the process table and the clock (lock held).

        Adopts or closes crashed intents, closes records whose agent died (stopping leftovers
        of its group, queuing a TERMINATED notice), stops instances past their preemption
        deadline, and forgets records terminated longer than the retention period ago.
        """
        self._reap()
        now = self._clock.now_s()
        out = dict(records)
        due: list[LocalRecord] = []
        for iid, rec in records.items():
            if not rec.live:
                if (
                    rec.terminated_at_s is not None
                    and now - rec.terminated_at_s > self._retention_s
                ):
                    self._forget(iid)
                    del out[iid]
                continue
            if rec.pid is None:
                out[iid] = self._recover_intent(rec)
                continue
            if not is_agent_process(rec.pid, iid):
                if rec.state is RecordState.RUNNING:
                    log.warning(
                        "local agent %s (pid %s) is gone; its log ends: %r",
                        iid,
                        rec.pid,
                        self._log_tail(iid),
                    )
                due.append(rec)  # the agent is gone; its group may not be
                continue
            deadline_s = None if rec.notice is None else rec.notice.deadline_s
            if rec.state is RecordState.STOPPING:
                due.append(rec)  # a crashed terminate: finish it
            elif deadline_s is not None and now >= deadline_s:
                due.append(rec)
        if due:
            for rec in self._stop(due, None):
                out[rec.instance_id] = rec
        return out

    def _recover_intent(self, rec: LocalRecord) -> LocalRecord:
        """A record without a pid under the lock was left by a crashed launch."""
        proc = _find_agent(rec.instance_id)
        if proc is not None:
            log.warning("adopting agent %s (pid %d) of a crashed launch", rec.instance_id, proc.pid)
            new = replace(
                rec,
                state=RecordState.RUNNING,
                pid=proc.pid,
                pgid=proc.pgid,
                started_at_s=self._clock.now_s(),
            )
        else:
            new = replace(
                rec,
                state=RecordState.TERMINATED,
                terminated_at_s=self._clock.now_s(),
                end_reason=EndReason.NEVER_STARTED,
            )
        self._write(new)
        return new

    def _log_tail(self, instance_id: str, max_bytes: int = 400) -> str:
        try:
            with open(self._agents_dir / instance_id / "agent.log", "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - max_bytes))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def _forget(self, instance_id: str) -> None:
        (self._records_dir / f"{instance_id}.json").unlink(missing_ok=True)
        agent_dir = self._agents_dir / instance_id
        if agent_dir.is_dir():
            for child in agent_dir.iterdir():
                child.unlink(missing_ok=True)
            agent_dir.rmdir()

    def _start(self, pool: Offering, tags: Mapping[str, str], user_data: str) -> LocalRecord:
        """Write the intent, spawn the agent detached, record its pid (lock held)."""
        iid = f"local-{uuid.uuid4().hex[:12]}"
        agent_dir = self._agents_dir / iid
        agent_dir.mkdir(parents=True)
        argv = [
            self._python,
            AGENT_SCRIPT,
            "--instance-id",
            iid,
            "--agent-dir",
            str(agent_dir),
            "--gpus",
            str(pool.gpus),
            "--heartbeat-s",
            str(self._heartbeat_s),
            "--stop-grace-s",
            str(max(0.1, 0.6 * self._term_grace_s)),
        ]
        if user_data:
            (agent_dir / "user_data").write_text(user_data, encoding="utf-8")
            argv += ["--user-data-file", str(agent_dir / "user_data")]
        rec = LocalRecord(
            instance_id=iid,
            tags=tags,
            offering=pool,
            state=RecordState.PENDING,
            created_at_s=self._clock.now_s(),
        )
        self._write(rec)  # intent before action
        env = dict(os.environ)
        env[INSTANCE_ENV] = iid
        # Shared cores (module docstring): a thread count the user set is kept.
        env.setdefault("OMP_NUM_THREADS", str(self.threads_per_slot))
        try:
            with open(agent_dir / "agent.log", "ab") as logfile:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    cwd=agent_dir,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as err:
            self._write(
                replace(
                    rec,
                    state=RecordState.TERMINATED,
                    terminated_at_s=self._clock.now_s(),
                    end_reason=EndReason.NEVER_STARTED,
                )
            )
            raise ProviderError(f"could not start local agent: {err}", pool=pool.key) from err
        self.op_counts["spawn"] += 1
        self._children[proc.pid] = proc
        rec = replace(
            rec,
            state=RecordState.RUNNING,
            pid=proc.pid,
            pgid=proc.pid,  # start_new_session: the agent leads its own group
            started_at_s=self._clock.now_s(),
        )
        self._write(rec)
        return rec

    @staticmethod
    def _our_members(records: Sequence[LocalRecord]) -> dict[str, list[int]]:
        """Live pids of each record's instance: the members of its process group that really
        belong to it, and every process elsewhere that carries its marker (a workload that
        started its own session, like the node agent's launchers, is still the instance's)."""
        groups = live_groups(r.pgid for r in records if r.pgid is not None)
        strays = _marked_processes({r.instance_id for r in records})
        out: dict[str, list[int]] = {}
        for rec in records:
            pids = set(strays.get(rec.instance_id, ()))
            if rec.pgid is not None:
                pids.update(p for p in groups.get(rec.pgid, ()) if _owned(p, rec))
            if pids:
                out[rec.instance_id] = sorted(pids)
        return out

    def _signal_groups(self, records: Sequence[LocalRecord], sig: signal.Signals) -> None:
        """Signal each record's process group while some live member of it is really ours,
        and each process of the instance outside that group."""
        members = self._our_members(records)
        for rec in records:
            if rec.instance_id not in members:
                continue
            if rec.pgid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(rec.pgid, sig)
                    self.op_counts["signal"] += 1
            for pid in members[rec.instance_id]:
                stat = read_stat(pid)
                if stat is not None and stat.pgid != rec.pgid:  # its own session
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)

    def _wait_groups_gone(self, records: Sequence[LocalRecord], wait_s: float) -> list[LocalRecord]:
        """Wait (real time) until no process of the records' instances is left; return the
        records that still have some."""
        deadline = self._process_clock.monotonic_s() + wait_s
        pending = list(records)
        while True:
            self._reap()
            members = self._our_members(pending)
            pending = [r for r in pending if r.instance_id in members]
            if not pending or self._process_clock.monotonic_s() >= deadline:
                return pending
            self._process_clock.sleep(_POLL_S)

    def _stop(self, records: Sequence[LocalRecord], reason: EndReason | None) -> list[LocalRecord]:
        """Stop the records' process groups and mark them terminated (lock held).

        ``reason`` None: decide per record (preempted when past its notice deadline, the
        pending stop's reason when a terminate was interrupted, else died).
        """
        if not records:
            return []
        now = self._clock.now_s()
        stopping = []
        for rec in records:
            r = replace(rec, state=RecordState.STOPPING)
            if rec.state is not RecordState.STOPPING:
                self._write(r)  # intent before action
            stopping.append(r)
        self._signal_groups(stopping, signal.SIGTERM)
        left = self._wait_groups_gone(stopping, self._term_grace_s)
        if left:
            self._signal_groups(left, signal.SIGKILL)
            left = self._wait_groups_gone(left, _KILL_WAIT_S)
            if left:
                raise ProviderError(
                    "local instances survived SIGKILL: " + ", ".join(r.instance_id for r in left)
                )
        done: list[LocalRecord] = []
        for orig, rec in zip(records, stopping, strict=True):
            why = reason or self._end_reason(orig, now)
            notice = rec.notice
            if why is EndReason.DIED and notice is None:
                notice = LocalNotice(InterruptionKind.TERMINATED, None, now)
            final = replace(
                rec,
                state=RecordState.TERMINATED,
                terminated_at_s=now,
                end_reason=why,
                notice=notice,
            )
            self._write(final)
            done.append(final)
        return done

    def _end_reason(self, rec: LocalRecord, now: float) -> EndReason:
        n = rec.notice
        if n is not None and n.deadline_s is not None and now >= n.deadline_s:
            return EndReason.PREEMPTED
        if rec.state is RecordState.STOPPING:
            return EndReason.TERMINATED
        return EndReason.DIED

    def _instance(self, rec: LocalRecord) -> Instance:
        o = rec.offering
        return Instance(
            instance_id=rec.instance_id,
            provider=LOCAL_PROVIDER,
            instance_type=o.instance_type,
            zone=o.zone,
            market=o.market,
            state=self._instance_state(rec),
            cluster_id=rec.cluster_id,
            request_id=rec.request_id,
            tags=rec.tags,
            launched_at_s=rec.started_at_s or rec.created_at_s,
            private_ip="127.0.0.1",
        )

    def _instance_state(self, rec: LocalRecord) -> InstanceState:
        if rec.state is RecordState.TERMINATED:
            return InstanceState.TERMINATED
        if rec.state is RecordState.STOPPING:
            return InstanceState.STOPPING
        if rec.state is RecordState.PENDING:
            return InstanceState.PENDING
        try:
            agent = json.loads((self._agents_dir / rec.instance_id / "agent.json").read_text())
        except (OSError, ValueError):
            return InstanceState.PENDING  # spawned, not yet reporting
        return InstanceState.RUNNING if agent.get("state") == "running" else InstanceState.STOPPING


def _marked_processes(instance_ids: set[str]) -> dict[str, list[int]]:
    """Live pids carrying ``COADAPT_LOCAL_INSTANCE=<id>`` of each of ``instance_ids`` (every
    process an instance starts inherits it), by instance id; empty without ``/proc``."""
    if not instance_ids or not has_procfs():
        return {}
    wanted = {f"{INSTANCE_ENV}={iid}".encode(): iid for iid in instance_ids}
    out: dict[str, list[int]] = {}
    for entry in os.scandir(PROC_ROOT):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        for item in read_proc_strings(pid, "environ", settle=False):
            iid = wanted.get(item)
            if iid is not None:
                if is_running(read_stat(pid)):
                    out.setdefault(iid, []).append(pid)
                break
    return out


def _owned(pid: int, rec: LocalRecord) -> bool:
    """Is ``pid`` part of ``rec``'s instance (its agent or the agent's workload)?"""
    if not has_procfs():
        return True  # no way to tell; the pgid was recorded by us
    return _carries_marker(pid, rec.instance_id) or is_agent_process(pid, rec.instance_id)


@dataclass
class _SlotBudget:
    """GPU slots and per-pool instances in use during one launch (mutated as agents start)."""

    used_slots: int
    per_pool: Counter[str]


def _capacity_error(offering_key: str) -> InsufficientCapacityError:
    return InsufficientCapacityError(
        f"no local capacity left in pool {offering_key} (GPU slots or pool limit)",
        code="local-capacity",
        pool=offering_key,
    )
