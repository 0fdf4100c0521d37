"""A behavioural in-memory cloud that satisfies ``providers.base.Provider``.

``FakeProvider`` plays both roles at once: the *cloud* (capacity pools that run dry, instances
with lifecycles, spot prices, preemptions) and the *adapter* in front of it (validation before
any call, ownership by tags, idempotency by request id, typed errors, retry of transient errors
on the injected clock, the unavailable-offerings cache). Tests drive it directly; the simulator
uses it as its cloud, so every operation is O(instances touched), never O(fleet history).

What the "cloud" side records, and what tests can steer:

* ``calls`` — one ``FakeCall(op, args)`` per simulated API call, in order. ``op`` is one of
  ``OPS``. A launch makes one call per pool attempted (like one ``RunInstances`` with
  ``MaxCount``); ``list_instances`` one call per page of ``page_size`` matching instances;
  ``terminate`` one call per batch of ``page_size`` ids. Pools skipped because they are marked
  unavailable make no call.
* ``set_capacity(offering_key, n)`` — at most ``n`` live instances in that pool (``None``:
  unlimited). A launch fills what remains, reports ``InsufficientCapacityError`` for the pool
  that ran dry and marks it in the ``UnavailableOfferings`` cache; until the mark expires,
  later launches skip it without a call and still report a capacity ``PoolError``.
* ``next_error(op, error)`` — the next call of ``op`` raises ``error`` (queue several to fail
  several calls). ``TransientError`` is retried with backoff on the clock; any other
  ``ProviderError`` on a launch becomes that pool's ``PoolError`` (``AuthError`` is raised);
  on other ops it is raised.
* ``preempt(instance_id, notice_s)`` — queues an ``InterruptionNotice`` (deadline
  ``now + notice_s``) for ``interruptions()`` and terminates the instance once the clock passes
  the deadline. ``rebalance(instance_id)`` queues a deadline-less recommendation.
* ``add_foreign_instance()`` — an instance not owned by any coadapt cluster (or owned by
  another one, given its tags): never listed, refused by ``terminate``.
* ``reset()`` — back to the state right after construction.
* ``restarted()`` — a new adapter over the same cloud, as a controller restarted after a crash
  builds it (shares the cloud's state, none of the adapter's).

**A cloud that outlives the process: ``state_path``.** Without it (the default, and what the
simulator uses) the cloud lives in this object's memory and no operation touches a file. With
``state_path=FILE`` the cloud side lives in ``FILE`` (JSON, headed ``"format":
"coadapt-fake-cloud", "version": 1``), so a controller process can be ``kill -9``-ed and
restarted against the same cloud, and a test process can preempt instances while a controller
process runs. Each operation is one transaction: take an ``flock`` on ``FILE.lock``, load
``FILE`` (skipped when it is the text this object last read or wrote), operate, and write the
state back atomically (temp file, fsync, rename) when it changed, also when the operation
raised a ``ProviderError`` (a cloud call may have acted before it failed). That rename is the
cloud's commit point: a process killed before it leaves the cloud as it was before the
operation, killed after it, as after. The file holds the cloud side only: the catalogue with
current spot prices, capacity per pool, every known instance (pool, tags, launch time,
termination time, preemption deadline), the request-id tag index, queued interruption notices,
pending deadlines, the retention queue and the id counter; timestamps are absolute seconds of
the injected clock, so a restarted process may pass a later ``FakeClock`` or a ``SystemClock``.
When ``FILE`` exists, construction loads it and the ``offerings``/``capacity`` arguments are
ignored (they only seed a new file). The adapter side is *not* stored and stays per object:
the unavailable-offerings cache, ``calls``, ``next_error`` queues, retry randomness, and the
settings ``boot_s``, ``page_size``, ``terminated_retention_s``, ``retry_policy`` (processes
sharing a file should pass the same ones). So a restarted adapter knows nothing of earlier
capacity marks, just as a restarted controller would not. Every file-backed operation costs
O(instances known to the cloud) to serialise; fine for crash tests, not meant for large fleets.
A file that is gone, unreadable or not in this format raises ``FakeStateError`` naming it.

Launch fills the request's pools in the order given (the caller's preference). Not thread-safe:
one controller (or one simulator) drives one object; with a ``state_path``, several objects in
several processes may share one file.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import functools
import heapq
import json
import os
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, Concatenate, Final, NamedTuple, ParamSpec, TypeVar

from coadapt_common.atomic import write_text_atomic
from coadapt_common.clock import Clock, SystemClock
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
    AuthError,
    FakeStateError,
    InstanceNotFoundError,
    InsufficientCapacityError,
    InvalidRequestError,
    ProviderError,
)
from providers.retry import RetryPolicy, call_with_retries
from providers.tags import CLUSTER_ID_TAG, REQUEST_ID_TAG, all_tags, is_owned_by, validate_id

FAKE_PROVIDER: Final = "fake"
OPS: Final = frozenset({"offerings", "spot_prices", "launch", "list", "terminate", "interruptions"})
DEFAULT_REGION: Final = "us-east-1"
DEFAULT_ZONES: Final = ("us-east-1a", "us-east-1b")
STATE_FORMAT: Final = "coadapt-fake-cloud"
STATE_VERSION: Final = 1

_P = ParamSpec("_P")
_R = TypeVar("_R")


class FakeCall(NamedTuple):
    """One simulated API call: the operation and a summary of its arguments."""

    op: str
    args: Mapping[str, object]


@dataclass(frozen=True)
class _Shape:
    instance_type: str
    gpu_type: str
    gpus: int
    vcpus: int
    memory_gib: float
    on_demand_usd_per_hour: float
    spot_usd_per_hour: tuple[float, float]  # one per zone of DEFAULT_ZONES


# us-east-1 list prices (on-demand) and typical spot prices, per instance.
_SHAPES: Final = (
    _Shape("g4dn.xlarge", "T4", 1, 4, 16.0, 0.526, (0.1578, 0.1702)),
    _Shape("g4dn.12xlarge", "T4", 4, 48, 192.0, 3.912, (1.1736, 1.2483)),
    _Shape("g5.xlarge", "A10G", 1, 4, 16.0, 1.006, (0.3018, 0.3362)),
    _Shape("p4d.24xlarge", "A100", 8, 96, 1152.0, 32.7726, (11.5704, 12.9011)),
)


def default_offerings(provider: str = FAKE_PROVIDER) -> list[Offering]:
    """A small realistic GPU catalogue: 4 types x 2 zones x {spot, on-demand} = 16 pools."""
    out: list[Offering] = []
    for shape in _SHAPES:
        for zone, spot_price in zip(DEFAULT_ZONES, shape.spot_usd_per_hour, strict=True):
            for market, price in (
                (Market.SPOT, spot_price),
                (Market.ON_DEMAND, shape.on_demand_usd_per_hour),
            ):
                out.append(
                    Offering(
                        provider=provider,
                        instance_type=shape.instance_type,
                        gpu_type=shape.gpu_type,
                        gpus=shape.gpus,
                        vcpus=shape.vcpus,
                        memory_gib=shape.memory_gib,
                        region=DEFAULT_REGION,
                        zone=zone,
                        market=market,
                        price_usd_per_hour=price,
                    )
                )
    return out


def default_capacity(provider: str = FAKE_PROVIDER) -> dict[str, int | None]:
    """Scarce A100s (2 spot, 4 on-demand per zone), everything else unlimited."""
    caps: dict[str, int | None] = {}
    for o in default_offerings(provider):
        if o.instance_type == "p4d.24xlarge":
            caps[o.key] = 2 if o.market is Market.SPOT else 4
    return caps


@dataclass
class _Record:
    """The fake cloud's own (mutable) view of one instance."""

    instance_id: str
    offering: Offering
    tags: Mapping[str, str]
    launched_at_s: float
    private_ip: str
    terminated_at_s: float | None = None
    preempt_at_s: float | None = None
    boot_s: float = 0.0  # how long it stays pending after its launch

    @property
    def cluster_tag(self) -> str | None:
        return self.tags.get(CLUSTER_ID_TAG)


@dataclass(frozen=True)
class _StateFile:
    """Where a file-backed fake cloud lives: ``path`` and its sidecar lock file."""

    path: Path

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive ``flock`` on the lock file (the kernel drops it if we die)."""
        with open(self.lock_path, "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            yield  # closing the file releases the lock

    def read(self) -> str | None:
        """The file's text, None when there is no file."""
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as err:
            raise self.error(f"cannot read it ({err})") from err

    def write(self, text: str) -> None:
        """Replace the file atomically and durably: the cloud's commit point."""
        write_text_atomic(self.path, text, durable=True)

    def error(self, why: str) -> FakeStateError:
        return FakeStateError(f"fake cloud state file {self.path}: {why}", path=str(self.path))


def _cloud_op(
    method: Callable[Concatenate[FakeProvider, _P], _R],
) -> Callable[Concatenate[FakeProvider, _P], _R]:
    """Mark a method that reads or changes the cloud side. With a ``state_path`` each call is
    one transaction on the file (lock, load, run, save; module docstring); without one, or
    inside a transaction already, the method runs as is."""

    @functools.wraps(method)
    def op(self: FakeProvider, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        store = self._store
        if store is None or self._in_transaction:
            return method(self, *args, **kwargs)
        return self._transaction(store, partial(method, self, *args, **kwargs))

    return op


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number of seconds, got {value!r}")
    return float(value)


def _optional_seconds(value: object) -> float | None:
    return None if value is None else _seconds(value)


def _text_map(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object of strings, got {value!r}")
    return {_text(k): _text(v) for k, v in value.items()}


class FakeProvider:
    """In-memory cloud + adapter. See the module docstring for the behaviour it simulates.

    ``offerings`` is the catalogue (default ``default_offerings(name)``; every offering's
    ``provider`` must equal ``name``); ``capacity`` maps offering keys to the most live instances
    the pool holds (missing or ``None``: unlimited). ``boot_s`` is how long an instance stays
    ``PENDING``, or ``boot_time`` draws it per launch from the instance's offering (a
    simulated world's boot distribution; it is kept with the instance);
    ``terminated_retention_s`` how long a terminated instance stays known (later it is
    unknown, which ``terminate`` also counts as already gone). ``state_path``: keep the cloud
    side in that file instead of in memory (module docstring); an existing file is loaded (and
    ``offerings``/``capacity`` ignored), a missing one is created from them.
    """

    def __init__(
        self,
        offerings: Iterable[Offering] | None = None,
        capacity: Mapping[str, int | None] | None = None,
        *,
        clock: Clock | None = None,
        unavailable: UnavailableOfferings | None = None,
        name: str = FAKE_PROVIDER,
        boot_s: float = 0.0,
        boot_time: Callable[[Offering], float] | None = None,
        page_size: int = 1000,
        retry_policy: RetryPolicy | None = None,
        seed: int = 0,
        terminated_retention_s: float = 3600.0,
        state_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name = name
        catalogue = list(default_offerings(name) if offerings is None else offerings)
        for o in catalogue:
            if o.provider != name:
                raise InvalidRequestError(f"offering {o.key!r} is not of provider {name!r}")
        if len({o.key for o in catalogue}) != len(catalogue):
            raise InvalidRequestError("duplicate offerings in the catalogue")
        if page_size <= 0 or boot_s < 0 or terminated_retention_s < 0:
            raise InvalidRequestError("page_size must be positive, durations non-negative")
        self._initial_catalogue = tuple(catalogue)
        self._initial_capacity = dict(capacity or {})
        self._check_capacity(self._initial_capacity)
        self._clock: Clock = clock or SystemClock()
        self._unavailable = unavailable or UnavailableOfferings(self._clock)
        self._boot_s = boot_s
        self._boot_time = boot_time
        self._page_size = page_size
        self._retry_policy = retry_policy or RetryPolicy()
        self._seed = seed
        self._retention_s = terminated_retention_s
        self.calls: list[FakeCall] = []
        self._store = None if state_path is None else _StateFile(Path(state_path))
        self._in_transaction = False
        self._state_text: str | None = None  # the file as this object last read or wrote it
        self._init_state()
        if self._store is not None:
            self._open_store(self._store)

    # ------------------------------------------------------------ test controls

    def booted_ids(self, cluster_id: str) -> frozenset[str]:
        """The ids of ``cluster_id``'s live instances past their boot (what the cloud lists as
        running), read without an API call: a simulated world's agents start on these."""
        now = self._clock.now_s()
        return frozenset(
            i
            for i in self._by_cluster.get(cluster_id, ())
            if (rec := self._records.get(i)) is not None
            and rec.terminated_at_s is None
            and now >= rec.launched_at_s + rec.boot_s
        )

    @property
    def unavailable(self) -> UnavailableOfferings:
        """The capacity cache this provider marks and consults."""
        return self._unavailable

    def reset(self) -> None:
        """Forget every instance, call, injected error and notice; restore capacity and prices.

        With a ``state_path``, the file gets this object's initial cloud (every object over it
        sees the reset)."""
        self.calls = []
        self._unavailable.clear()
        if self._store is None:
            self._init_state()
            return
        with self._store.locked():
            self._init_state()
            self._save(self._store, force=True)

    def restarted(self) -> FakeProvider:
        """A new adapter over this same cloud, as a restarted controller builds it.

        Shares the cloud's state with this object (instances, the request-id tag index,
        capacity, prices, call records, injected errors, notices) and none of the adapter's: a
        fresh unavailable-offerings cache and retry randomness. ``reset()`` on either one
        detaches them. With a ``state_path`` the cloud is the file, which the twin reads at its
        first operation; a new ``FakeProvider(state_path=...)`` is the same without the shared
        call records and injected errors.
        """
        twin = copy.copy(self)  # shallow: the cloud's containers are shared, not copied
        twin._unavailable = UnavailableOfferings(self._clock)
        twin._rng = random.Random(self._seed)
        twin._state_text = None  # file-backed: load the file, never trust memory shared with us
        return twin

    @_cloud_op
    def set_capacity(self, offering_key: str, instances: int | None) -> None:
        """At most ``instances`` live instances in ``offering_key`` from now on (None: no cap)."""
        self._offering(offering_key)
        self._check_capacity({offering_key: instances})
        self._capacity[offering_key] = instances

    @_cloud_op
    def remaining_capacity(self, offering_key: str) -> int | None:
        """Free slots in the pool (None: unlimited)."""
        return self._room(offering_key)

    @_cloud_op
    def set_spot_price(self, instance_type: str, zone: str, price_usd_per_hour: float) -> None:
        """Change the spot price of one (type, zone); offerings() reflects it."""
        if not price_usd_per_hour > 0:
            raise InvalidRequestError("a spot price must be positive")
        found = False
        for key, o in self._catalogue.items():
            if o.market is Market.SPOT and (o.instance_type, o.zone) == (instance_type, zone):
                self._catalogue[key] = replace(o, price_usd_per_hour=price_usd_per_hour)
                found = True
        if not found:
            raise InvalidRequestError(f"no spot offering {instance_type} in {zone}")

    def next_error(self, op: str, error: ProviderError) -> None:
        """The next call of ``op`` (one of ``OPS``) raises ``error``; one-shot, queued."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; expected one of {sorted(OPS)}")
        if not isinstance(error, ProviderError):
            raise TypeError("injected errors must be ProviderError instances")
        self._errors[op].append(error)

    @_cloud_op
    def preempt(
        self,
        instance_id: str,
        notice_s: float = 120.0,
        kind: InterruptionKind = InterruptionKind.SPOT_INTERRUPTION,
    ) -> InterruptionNotice:
        """Announce the reclaim of a live instance; it terminates when the clock passes the
        deadline (``notice_s == 0``: at once). Raises ``InstanceNotFoundError`` if not live."""
        if notice_s < 0:
            raise ValueError("notice_s must be non-negative")
        self._advance()
        rec = self._live_record(instance_id)
        now = self._clock.now_s()
        deadline = now + notice_s
        rec.preempt_at_s = deadline if rec.preempt_at_s is None else min(rec.preempt_at_s, deadline)
        heapq.heappush(self._deadlines, (rec.preempt_at_s, instance_id))
        notice = InterruptionNotice(instance_id, kind, deadline, "fake", noticed_at_s=now)
        self._queue_notice(rec, notice)
        self._advance()
        return notice

    @_cloud_op
    def rebalance(self, instance_id: str) -> InterruptionNotice:
        """Queue a rebalance recommendation (elevated risk, no deadline) for a live instance."""
        self._advance()
        rec = self._live_record(instance_id)
        notice = InterruptionNotice(
            instance_id, InterruptionKind.REBALANCE, None, "fake", noticed_at_s=self._clock.now_s()
        )
        self._queue_notice(rec, notice)
        return notice

    @_cloud_op
    def add_foreign_instance(
        self, offering: Offering | None = None, tags: Mapping[str, str] | None = None
    ) -> str:
        """Create an instance nobody launched through coadapt (``tags`` as given, default none).

        It uses pool capacity like any other instance. Returns its id."""
        chosen = self._offering(offering.key) if offering else next(iter(self._catalogue.values()))
        rec = self._create(chosen, MappingProxyType(dict(tags or {})))
        return rec.instance_id

    def call_count(self, op: str, **match: object) -> int:
        """How many recorded calls have ``op`` and the given argument values."""
        return sum(
            1
            for c in self.calls
            if c.op == op and all(c.args.get(k) == v for k, v in match.items())
        )

    @_cloud_op
    def instance_state(self, instance_id: str) -> InstanceState | None:
        """The cloud's state of any known instance, owned or not (None: unknown)."""
        self._advance()
        rec = self._records.get(instance_id)
        return None if rec is None else self._state(rec)

    # ---------------------------------------------------------------- contract

    @_cloud_op
    def offerings(self) -> Sequence[Offering]:
        self._call("offerings", {})
        return list(self._catalogue.values())

    @_cloud_op
    def spot_prices(self) -> Sequence[SpotPrice]:
        self._call("spot_prices", {})
        now = self._clock.now_s()
        return [
            SpotPrice(o.instance_type, o.zone, o.price_usd_per_hour, now)
            for o in self._catalogue.values()
            if o.market is Market.SPOT and o.price_usd_per_hour is not None
        ]

    @_cloud_op
    def launch(self, request: LaunchRequest) -> LaunchResult:
        """The launch rule of ``providers.base``: create only the shortfall of the request's
        live instances (found by the cloud's request-id index), pools tried in order through
        ``walk_pools``.

        Pools marked unavailable are skipped with a capacity ``PoolError`` and no call. A pool
        that runs dry yields what it had, a capacity ``PoolError``, and a mark.
        """
        request.validate()
        pools = [self._lookup(o) for o in request.offerings]
        tags = MappingProxyType(all_tags(request.cluster_id, request.request_id, request.tags))
        self._advance()
        key = (request.cluster_id, request.request_id)
        found = [
            self._instance(self._records[i])
            for i in self._by_request.get(key, ())
            if i in self._records
        ]
        found = [i for i in found if i.state is not InstanceState.TERMINATED]
        missing = launch_shortfall(request, found)
        if missing == 0:
            return LaunchResult(request.request_id, request.count, tuple(found))
        walk = walk_pools(pools, missing, self._unavailable, partial(self._place, tags))
        if found or walk.created:  # the index keeps only the request's live instances
            self._by_request[key] = [i.instance_id for i in found] + [
                r.instance_id for r in walk.created
            ]
        return LaunchResult(
            request.request_id,
            request.count,
            (*found, *(self._instance(r) for r in walk.created)),
            walk.errors,
        )

    def _place(
        self, tags: Mapping[str, str], pools: Sequence[Offering], wanted: int
    ) -> Placement[_Record]:
        """One pool attempt of the walk (``RunInstances`` with ``MaxCount``), with retries of
        transient errors; ``AuthError`` raises, other errors are the pool's."""
        (pool,) = pools
        try:
            batch = call_with_retries(
                partial(self._cloud_run, pool, wanted, tags),
                clock=self._clock,
                policy=self._retry_policy,
                rng=self._rng,
            )
        except AuthError:
            raise
        except ProviderError as err:
            return Placement(errors={pool.key: err})
        return Placement(tuple(batch))

    @_cloud_op
    def list_instances(self, cluster_id: str) -> Sequence[Instance]:
        validate_id(cluster_id, field="cluster_id")
        self._advance()
        ids = sorted(
            i
            for i in self._by_cluster.get(cluster_id, ())
            if is_owned_by(self._records[i].tags, cluster_id)
        )
        pages = max(1, -(-len(ids) // self._page_size))
        for page in range(pages):
            call_with_retries(
                partial(self._call, "list", {"cluster_id": cluster_id, "page": page}),
                clock=self._clock,
                policy=self._retry_policy,
                rng=self._rng,
            )
        return [self._instance(self._records[i]) for i in ids]

    @_cloud_op
    def terminate(
        self, cluster_id: str, instance_ids: Sequence[str], request_id: str
    ) -> TerminateResult:
        """Terminate owned live instances; unknown or terminated ids are already gone, ids not
        owned by ``cluster_id`` are refused. One call per batch of ``page_size`` ids."""
        validate_id(cluster_id, field="cluster_id")
        validate_id(request_id, field="request_id")
        ids = list(dict.fromkeys(instance_ids))
        if not all(isinstance(i, str) and i for i in ids):
            raise InvalidRequestError("instance ids must be non-empty strings")
        self._advance()
        terminated: list[str] = []
        gone: list[str] = []
        refused: list[str] = []
        for start in range(0, len(ids), self._page_size):
            batch = ids[start : start + self._page_size]
            call_with_retries(
                partial(self._call, "terminate", {"cluster_id": cluster_id, "count": len(batch)}),
                clock=self._clock,
                policy=self._retry_policy,
                rng=self._rng,
            )
            for iid in batch:
                rec = self._records.get(iid)
                if rec is None:
                    gone.append(iid)
                elif not is_owned_by(rec.tags, cluster_id):
                    refused.append(iid)
                elif rec.terminated_at_s is not None:
                    gone.append(iid)
                else:
                    self._terminate_record(rec, self._clock.now_s())
                    terminated.append(iid)
        return TerminateResult(request_id, tuple(terminated), tuple(gone), tuple(refused))

    @_cloud_op
    def interruptions(self, cluster_id: str) -> Sequence[InterruptionNotice]:
        """Drain the notices queued for instances owned by ``cluster_id``."""
        validate_id(cluster_id, field="cluster_id")
        self._advance()
        call_with_retries(
            partial(self._call, "interruptions", {"cluster_id": cluster_id}),
            clock=self._clock,
            policy=self._retry_policy,
            rng=self._rng,
        )
        queued = self._notices.pop(cluster_id, None) or []
        return [n for n in queued if self._owned_record(n.instance_id, cluster_id)]

    # ---------------------------------------------------------------- internals

    def _init_state(self) -> None:
        self._init_cloud()
        self._errors: dict[str, deque[ProviderError]] = {op: deque() for op in OPS}
        self._rng = random.Random(self._seed)

    def _init_cloud(self) -> None:
        self._catalogue: dict[str, Offering] = {o.key: o for o in self._initial_catalogue}
        self._capacity: dict[str, int | None] = dict(self._initial_capacity)
        self._records: dict[str, _Record] = {}
        self._live_by_pool: Counter[str] = Counter()
        self._by_cluster: dict[str, set[str]] = {}
        self._by_request: dict[tuple[str, str], list[str]] = {}
        self._notices: dict[str, list[InterruptionNotice]] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._retired: list[tuple[float, str]] = []
        self._next_id = 1

    @staticmethod
    def _check_capacity(capacity: Mapping[str, int | None]) -> None:
        for key, cap in capacity.items():
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
                raise InvalidRequestError(f"capacity of {key!r} must be None or an int >= 0")

    def _lookup(self, wanted: Offering) -> Offering:
        """Our (current-price) offering with ``wanted.key``, else InvalidRequestError."""
        own = self._catalogue.get(wanted.key)
        return own if own is not None else find_offering((), wanted)

    def _offering(self, offering_key: str) -> Offering:
        try:
            return self._catalogue[offering_key]
        except KeyError:
            raise InvalidRequestError(f"unknown pool {offering_key!r}") from None

    def _call(self, op: str, args: Mapping[str, object]) -> None:
        """Record one API call; raise the error injected for ``op``, if any."""
        self.calls.append(FakeCall(op, MappingProxyType(dict(args))))
        queue = self._errors[op]
        if queue:
            raise queue.popleft()

    def _cloud_run(self, pool: Offering, wanted: int, tags: Mapping[str, str]) -> list[_Record]:
        """The cloud's RunInstances: up to ``wanted`` in one pool, capacity error if none."""
        self._call("launch", {"pool": pool.key, "count": wanted})
        room = self._room(pool.key)
        n = wanted if room is None else min(wanted, room)
        if n == 0:
            raise InsufficientCapacityError(
                f"no capacity in pool {pool.key}",
                code="InsufficientInstanceCapacity",
                pool=pool.key,
            )
        return [self._create(pool, tags) for _ in range(n)]

    def _room(self, offering_key: str) -> int | None:
        cap = self._capacity.get(offering_key)
        return None if cap is None else max(0, cap - self._live_by_pool[offering_key])

    def _create(self, offering: Offering, tags: Mapping[str, str]) -> _Record:
        n = self._next_id
        self._next_id = n + 1
        rec = _Record(
            instance_id=f"i-{n:017x}",
            offering=offering,
            tags=tags,
            launched_at_s=self._clock.now_s(),
            private_ip=f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}",
            boot_s=self._boot_s if self._boot_time is None else self._boot_time(offering),
        )
        self._records[rec.instance_id] = rec
        self._live_by_pool[offering.key] += 1
        if rec.cluster_tag is not None:
            self._by_cluster.setdefault(rec.cluster_tag, set()).add(rec.instance_id)
        return rec

    def _terminate_record(self, rec: _Record, at_s: float) -> None:
        rec.terminated_at_s = at_s
        self._live_by_pool[rec.offering.key] -= 1
        if rec.cluster_tag is not None:
            self._by_cluster[rec.cluster_tag].discard(rec.instance_id)
        heapq.heappush(self._retired, (at_s, rec.instance_id))

    def _advance(self) -> None:
        """Apply what the clock made happen: preemption deadlines, forgetting old instances."""
        now = self._clock.now_s()
        while self._deadlines and self._deadlines[0][0] <= now:
            at_s, iid = heapq.heappop(self._deadlines)
            rec = self._records.get(iid)
            if rec is not None and rec.terminated_at_s is None and rec.preempt_at_s == at_s:
                self._terminate_record(rec, at_s)
        while self._retired and self._retired[0][0] + self._retention_s < now:
            _, iid = heapq.heappop(self._retired)
            self._records.pop(iid, None)

    def _state(self, rec: _Record) -> InstanceState:
        if rec.terminated_at_s is not None:
            return InstanceState.TERMINATED
        if self._clock.now_s() < rec.launched_at_s + rec.boot_s:
            return InstanceState.PENDING
        return InstanceState.RUNNING

    def _instance(self, rec: _Record) -> Instance:
        o = rec.offering
        return Instance(
            instance_id=rec.instance_id,
            provider=self.name,
            instance_type=o.instance_type,
            zone=o.zone,
            market=o.market,
            state=self._state(rec),
            cluster_id=rec.tags.get(CLUSTER_ID_TAG, ""),
            request_id=rec.tags.get(REQUEST_ID_TAG, ""),
            tags=rec.tags,
            launched_at_s=rec.launched_at_s,
            private_ip=rec.private_ip,
        )

    def _live_record(self, instance_id: str) -> _Record:
        rec = self._records.get(instance_id)
        if rec is None or rec.terminated_at_s is not None:
            raise InstanceNotFoundError(f"no live instance {instance_id!r}")
        return rec

    def _owned_record(self, instance_id: str, cluster_id: str) -> bool:
        rec = self._records.get(instance_id)
        return rec is not None and is_owned_by(rec.tags, cluster_id)

    def _queue_notice(self, rec: _Record, notice: InterruptionNotice) -> None:
        cluster = rec.cluster_tag
        if cluster is not None:  # nobody can read notices of untagged instances
            self._notices.setdefault(cluster, []).append(notice)

    # ------------------------------------------------------- the state file

    def _open_store(self, store: _StateFile) -> None:
        """Load the cloud from the state file, or create the file with the initial cloud."""
        store.path.parent.mkdir(parents=True, exist_ok=True)
        with store.locked():
            if store.read() is None:
                self._save(store, force=True)
            else:
                self._load(store)

    def _transaction(self, store: _StateFile, body: Callable[[], _R]) -> _R:
        """Run ``body`` as one transaction on the file: lock, load, run, save when changed.

        A ``ProviderError`` is a cloud answer (the cloud may have acted before it failed), so
        its state is saved too; any other exception leaves the file as it was and makes the
        next operation reload it."""
        with store.locked():
            self._load(store)
            self._in_transaction = True
            try:
                result = body()
            except ProviderError:
                self._save(store)
                raise
            except BaseException:
                self._state_text = None  # memory may be half-changed: reload next time
                raise
            finally:
                self._in_transaction = False
            self._save(store)
            return result

    def _load(self, store: _StateFile) -> None:
        """Replace the cloud side in memory with the file's (lock held)."""
        text = store.read()
        if text is None:
            raise store.error("it is gone")
        if text == self._state_text:
            return  # nobody wrote since we did
        try:
            self._restore(json.loads(text))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise store.error(
                f"not a valid {STATE_FORMAT!r} version {STATE_VERSION} file "
                f"({type(err).__name__}: {err})"
            ) from err
        self._state_text = text

    def _save(self, store: _StateFile, *, force: bool = False) -> None:
        """Write the cloud side to the file when it differs from what the file holds."""
        known, self._state_text = self._state_text, None  # if anything fails: reload next time
        text = json.dumps(self._snapshot(), sort_keys=True, allow_nan=False) + "\n"
        if text != known or force:
            store.write(text)
        self._state_text = text

    def _snapshot(self) -> dict[str, Any]:
        """The cloud side as the state file's JSON document."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "provider": self.name,
            "catalogue": [
                {**asdict(o), "market": o.market.value} for o in self._catalogue.values()
            ],
            "capacity": self._capacity,
            "instances": [
                {
                    "id": r.instance_id,
                    "pool": r.offering.key,
                    "tags": dict(r.tags),
                    "launched_at_s": r.launched_at_s,
                    "private_ip": r.private_ip,
                    "terminated_at_s": r.terminated_at_s,
                    "preempt_at_s": r.preempt_at_s,
                    "boot_s": r.boot_s,
                }
                for r in self._records.values()
            ],
            # the request-id tag index; ids the cloud forgot are left out (ids are never reused)
            "requests": [
                [cluster, request, known]
                for (cluster, request), ids in self._by_request.items()
                if (known := [i for i in ids if i in self._records])
            ],
            "notices": {
                cluster: [
                    {
                        "instance_id": n.instance_id,
                        "kind": n.kind.value,
                        "deadline_s": n.deadline_s,
                        "source": n.source,
                        "noticed_at_s": n.noticed_at_s,
                    }
                    for n in queued
                ]
                for cluster, queued in self._notices.items()
            },
            "deadlines": self._deadlines,  # heaps of (seconds, instance id)
            "retired": self._retired,
            "next_id": self._next_id,
        }

    def _restore(self, doc: Any) -> None:
        """Set the cloud side from a state document; ValueError/KeyError/TypeError if bad."""
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise ValueError(f"no 'format': {STATE_FORMAT!r} header")
        if doc.get("version") != STATE_VERSION:
            raise ValueError(f"version {doc.get('version')!r}, expected {STATE_VERSION}")
        if doc["provider"] != self.name:
            raise ValueError(f"written for provider {doc['provider']!r}, not {self.name!r}")
        catalogue: dict[str, Offering] = {}
        for d in doc["catalogue"]:
            o = Offering(**{**d, "market": Market(d["market"])})
            if o.provider != self.name:
                raise ValueError(f"offering {o.key!r} is not of provider {self.name!r}")
            catalogue[o.key] = o
        capacity: dict[str, int | None] = {_text(k): v for k, v in doc["capacity"].items()}
        self._check_capacity(capacity)
        records: dict[str, _Record] = {}
        live_by_pool: Counter[str] = Counter()
        by_cluster: dict[str, set[str]] = {}
        for d in doc["instances"]:
            rec = _Record(
                instance_id=_text(d["id"]),
                offering=catalogue[d["pool"]],
                tags=MappingProxyType(_text_map(d["tags"])),
                launched_at_s=_seconds(d["launched_at_s"]),
                private_ip=_text(d["private_ip"]),
                terminated_at_s=_optional_seconds(d["terminated_at_s"]),
                preempt_at_s=_optional_seconds(d["preempt_at_s"]),
                boot_s=_seconds(d.get("boot_s", self._boot_s)),
            )
            records[rec.instance_id] = rec
            if rec.terminated_at_s is None:
                live_by_pool[rec.offering.key] += 1
                if rec.cluster_tag is not None:
                    by_cluster.setdefault(rec.cluster_tag, set()).add(rec.instance_id)
        by_request = {
            (_text(cluster), _text(request)): [_text(i) for i in ids]
            for cluster, request, ids in doc["requests"]
        }
        notices = {
            _text(cluster): [
                InterruptionNotice(
                    _text(n["instance_id"]),
                    InterruptionKind(n["kind"]),
                    _optional_seconds(n["deadline_s"]),
                    _text(n["source"]),
                    _optional_seconds(n["noticed_at_s"]),
                )
                for n in queued
            ]
            for cluster, queued in doc["notices"].items()
        }
        deadlines = [(_seconds(at), _text(i)) for at, i in doc["deadlines"]]
        retired = [(_seconds(at), _text(i)) for at, i in doc["retired"]]
        heapq.heapify(deadlines)  # a no-op on the heaps we wrote
        heapq.heapify(retired)
        next_id = doc["next_id"]
        if isinstance(next_id, bool) or not isinstance(next_id, int) or next_id < 1:
            raise ValueError(f"next_id must be a positive integer, got {next_id!r}")
        self._catalogue = catalogue
        self._capacity = capacity
        self._records = records
        self._live_by_pool = live_by_pool
        self._by_cluster = by_cluster
        self._by_request = by_request
        self._notices = notices
        self._deadlines = deadlines
        self._retired = retired
        self._next_id = next_id
