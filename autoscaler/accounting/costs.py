"""What a fleet cost, and who it was spent on: a ledger of instance lives and job usage.

Pure: no I/O, no clock. Every time is passed in, in seconds from the start of the run (``>= 0``).
A simulator or a controller calls a :class:`CostLedger` as things happen (launches, price
changes, releases and preemptions, the GPU-seconds each job held on each instance, job events,
useful work); :meth:`CostLedger.close` returns an immutable :class:`CostRecord`, and the
functions below derive every reported figure from that record alone.

Billing (:func:`instance_cost_usd`)
    Per-second billing: an instance pays the price in effect at each moment of its life,
    integrated over the life (``usd_per_hour * seconds / 3600`` per price segment; fractional
    seconds are billed as such, never rounded up to whole seconds or hours).

Minimum billed duration
    An instance whose life is shorter than its ``min_billed_s`` pays for ``min_billed_s``
    seconds: its life at the prices in effect, plus the shortfall ``min_billed_s - life`` at the
    **last** price in effect (as if it had run on until ``launch + min_billed_s`` with no further
    price change). With no price change during its life that is the launch price: a 10 s
    instance with a 60 s minimum pays 60 s at its launch price. A price change recorded during
    a short life therefore applies to the shortfall too. The minimum applies whatever ended the
    instance (released, preempted or the end of the run). A price change recorded at the very
    instant the instance ends never applied to a running second and is dropped (it does not
    price the shortfall either). In time series the shortfall is booked as a lump at the
    instance's end (the cost *rate* is the fleet's price per hour while it runs; cumulative
    cost jumps by the shortfall at the end).

Attribution to jobs (:func:`job_costs`)
    A job is charged, for each usage ``(instance, t0, t1, gpus)``, the instance's cost over
    ``[t0, t1]`` times ``gpus / instance GPUs``: GPUs are the unit of sharing, each of an
    instance's GPUs costs the same share of its price. What no job used — GPUs left free,
    provisioning time, and every minimum-billing shortfall — is **idle** cost, so that
    ``sum(job costs) + idle = total`` (exactly, up to float rounding of the accumulation).

On-demand comparison (:func:`offering_costs`)
    When a launch gives ``ondemand_usd_per_hour`` (the on-demand price of the same offering),
    the instance's on-demand equivalent is that price times its *billed* seconds (life, or the
    minimum if longer: the same instance on demand would pay the same minimum), and its
    savings are that equivalent minus what it actually cost.

Rounding (:func:`usd_to_cents`)
    Sums are accumulated in float (``math.fsum``); dollars are rounded (to the cent, or for an
    amount under a dollar to the digits it needs: :func:`usd_for_display`) only when a
    figure is reported, with :mod:`decimal`: the float is first quantized to 1e-9 USD
    (``ROUND_HALF_EVEN``, dropping float accumulation noise far below a cent), then to 0.01 USD
    with ``ROUND_HALF_UP``. Each reported figure is rounded from its exact value; a column of
    rounded amounts may therefore differ from the rounded total by up to half a cent per row.

Validation
    Per instance, times are monotone: launch <= price changes <= end; nothing is recorded for an
    ended instance except job usage inside its life. A usage lies inside its instance's life and,
    with all other usages of that instance at the same time, uses at most its GPUs. Per job,
    events come in time order, ``submitted`` first and ``finished`` last, at most once each, and
    usage lies between them. Times are compared with a tolerance of :data:`TIME_TOLERANCE_S`
    (float sums such as ``t + (t_pre - t)``); a usage overrunning its instance's life by less is
    clipped to it. Every rejection raises :class:`~autoscaler.errors.InvalidInputError` naming
    the field, and leaves the ledger as it was.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from typing import Any, Final, Literal, cast

from autoscaler.errors import InvalidInputError
from autoscaler.market.terms import MARKETS

__all__ = [
    "END_REASONS",
    "JOB_EVENT_KINDS",
    "MARKETS",
    "MAX_SERIES_POINTS",
    "RECORD_VERSION",
    "TIME_TOLERANCE_S",
    "CostLedger",
    "CostRecord",
    "CostSummary",
    "CumulativeCost",
    "EndReason",
    "FleetPoint",
    "InstanceRecord",
    "JobCost",
    "JobEvent",
    "JobEventKind",
    "JobRecord",
    "Market",
    "OfferingCost",
    "PriceSegment",
    "UsageRecord",
    "cost_series_usd",
    "cumulative_cost_by_offering",
    "fleet_series",
    "idle_cost_usd",
    "instance_cost_usd",
    "job_costs",
    "offering_costs",
    "record_from_json",
    "record_to_json",
    "summarize",
    "total_cost_usd",
    "usd_for_display",
    "usd_to_cents",
]

Market = Literal["spot", "on-demand"]
EndReason = Literal["released", "preempted", "end_of_run"]
JobEventKind = Literal["submitted", "finished", "restart", "preemption"]

END_REASONS: Final = ("released", "preempted", "end_of_run")
JOB_EVENT_KINDS: Final = ("submitted", "finished", "restart", "preemption")
RECORD_VERSION: Final = 1
TIME_TOLERANCE_S: Final = 1e-6
"""Times this close are treated as equal when checking order and containment."""

_S_PER_HOUR = 3600.0
_NANO_USD = Decimal("1e-9")
_CENT = Decimal("0.01")


# ---- the record -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PriceSegment:
    """A price in effect on ``[t0_s, t1_s]`` (zero length only for an instance that ended at
    its launch time: a price change at the very end of a life never took effect and is
    dropped)."""

    t0_s: float
    t1_s: float
    usd_per_hour: float

    @property
    def duration_s(self) -> float:
        return self.t1_s - self.t0_s

    @property
    def cost_usd(self) -> float:
        return self.usd_per_hour * self.duration_s / _S_PER_HOUR


@dataclass(frozen=True)
class InstanceRecord:
    """One instance's life: what it was, when it lived, why it ended and the prices it paid.

    ``segments`` are contiguous, in time order, from ``launched_s`` to ``ended_s``; consecutive
    segments have different prices. ``ondemand_usd_per_hour``: the on-demand price of the same
    offering, when known (for savings)."""

    instance_id: str
    offering_key: str
    provider: str
    instance_type: str
    gpu_type: str
    gpus: int
    zone: str
    market: Market
    launched_s: float
    ended_s: float
    end_reason: EndReason
    min_billed_s: float
    segments: tuple[PriceSegment, ...]
    ondemand_usd_per_hour: float | None = None

    @property
    def life_s(self) -> float:
        return self.ended_s - self.launched_s

    @property
    def shortfall_s(self) -> float:
        """Seconds billed beyond the life because of the minimum billed duration."""
        return max(0.0, self.min_billed_s - self.life_s)

    @property
    def billed_s(self) -> float:
        return self.life_s + self.shortfall_s

    @property
    def launch_usd_per_hour(self) -> float:
        return self.segments[0].usd_per_hour

    @property
    def last_usd_per_hour(self) -> float:
        return self.segments[-1].usd_per_hour

    @property
    def shortfall_usd(self) -> float:
        """The minimum-billing charge: the shortfall at the last price in effect."""
        return self.last_usd_per_hour * self.shortfall_s / _S_PER_HOUR

    @property
    def ondemand_equivalent_usd(self) -> float | None:
        """The on-demand price times the billed seconds; ``None`` when no price was given."""
        if self.ondemand_usd_per_hour is None:
            return None
        return self.ondemand_usd_per_hour * self.billed_s / _S_PER_HOUR


@dataclass(frozen=True)
class UsageRecord:
    """``gpus`` of instance ``instance_id`` held by a job on ``[t0_s, t1_s]``."""

    instance_id: str
    t0_s: float
    t1_s: float
    gpus: int

    @property
    def gpu_s(self) -> float:
        return self.gpus * (self.t1_s - self.t0_s)


@dataclass(frozen=True)
class JobEvent:
    t_s: float
    kind: JobEventKind


@dataclass(frozen=True)
class JobRecord:
    """One job: its GPU usage, events (in time order) and useful samples processed."""

    job_id: str
    usages: tuple[UsageRecord, ...]
    events: tuple[JobEvent, ...]
    useful_samples: float = 0.0

    def _first(self, kind: str) -> float | None:
        return next((e.t_s for e in self.events if e.kind == kind), None)

    @property
    def submitted_s(self) -> float | None:
        return self._first("submitted")

    @property
    def finished_s(self) -> float | None:
        return self._first("finished")

    @property
    def jct_s(self) -> float | None:
        """Job completion time (finish - submission) when both are known."""
        if self.submitted_s is None or self.finished_s is None:
            return None
        return self.finished_s - self.submitted_s

    @property
    def restarts(self) -> int:
        return sum(1 for e in self.events if e.kind == "restart")

    @property
    def preemptions(self) -> int:
        return sum(1 for e in self.events if e.kind == "preemption")


@dataclass(frozen=True)
class CostRecord:
    """A closed ledger: every instance (ended), every job, and the close time ``closed_s``.
    Instances are in launch order, jobs in order of first mention."""

    closed_s: float
    instances: tuple[InstanceRecord, ...]
    jobs: tuple[JobRecord, ...]

    def instance(self, instance_id: str) -> InstanceRecord:
        for inst in self.instances:
            if inst.instance_id == instance_id:
                return inst
        raise KeyError(instance_id)


# ---- the ledger -----------------------------------------------------------------------------


def _check_id(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}", field=name)
    return value


def _check_number(value: object, name: str, *, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"{name} must be a number, got {value!r}", field=name)
    number = float(value)
    if not (math.isfinite(number) and number >= 0):
        raise InvalidInputError(f"{name} must be a finite {what} >= 0, got {value!r}", field=name)
    return number


def _check_time(value: object, name: str = "t_s") -> float:
    return _check_number(value, name, what="number of seconds from the start of the run")


def _check_price(value: object, name: str = "usd_per_hour") -> float:
    return _check_number(value, name, what="price in USD per hour")


def _check_gpus(value: object, name: str = "gpus") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{name} must be an integer >= 1, got {value!r}", field=name)
    return value


def _check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    text = getattr(value, "value", value)  # a str enum (e.g. providers' Market) gives its value
    if text not in choices:
        raise InvalidInputError(f"{name} must be one of {list(choices)}, got {value!r}", field=name)
    return cast(str, text)


class _Occupancy:
    """GPUs in use on one instance over time: a step function, ``levels[i]`` on
    ``[times[i], times[i + 1])``, 0 before the first and after the last breakpoint."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.levels: list[int] = []

    def _split(self, t: float) -> int:
        i = bisect_left(self.times, t)
        if i < len(self.times) and self.times[i] == t:
            return i
        self.times.insert(i, t)
        self.levels.insert(i, self.levels[i - 1] if i > 0 else 0)
        return i

    def peak(self, t0: float, t1: float) -> int:
        """The most GPUs in use at once on ``[t0, t1)``, ignoring pieces shorter than the
        tolerance (float-rounded abutting intervals)."""
        i = bisect_right(self.times, t0) - 1
        best = 0
        while i < len(self.times) and (i < 0 or self.times[i] < t1):
            start = t0 if i < 0 else max(t0, self.times[i])
            end = t1 if i + 1 >= len(self.times) else min(t1, self.times[i + 1])
            if end - start > TIME_TOLERANCE_S and i >= 0:
                best = max(best, self.levels[i])
            i += 1
        return best

    def add(self, t0: float, t1: float, gpus: int) -> None:
        i0, i1 = self._split(t0), self._split(t1)
        for i in range(i0, i1):
            self.levels[i] += gpus


@dataclass
class _Instance:
    instance_id: str
    offering_key: str
    provider: str
    instance_type: str
    gpu_type: str
    gpus: int
    zone: str
    market: Market
    launched_s: float
    min_billed_s: float
    ondemand_usd_per_hour: float | None
    points: list[tuple[float, float]]  # (time, usd_per_hour), first at launch
    ended_s: float | None = None
    end_reason: EndReason | None = None
    last_usage_s: float = 0.0
    occupancy: _Occupancy = field(default_factory=_Occupancy)

    @property
    def last_event_s(self) -> float:
        return self.points[-1][0]

    def record(self) -> InstanceRecord:
        assert self.ended_s is not None and self.end_reason is not None
        bounds = [t for t, _ in self.points] + [self.ended_s]
        segments = tuple(
            PriceSegment(bounds[i], bounds[i + 1], price)
            for i, (_, price) in enumerate(self.points)
        )
        return InstanceRecord(
            instance_id=self.instance_id,
            offering_key=self.offering_key,
            provider=self.provider,
            instance_type=self.instance_type,
            gpu_type=self.gpu_type,
            gpus=self.gpus,
            zone=self.zone,
            market=self.market,
            launched_s=self.launched_s,
            ended_s=self.ended_s,
            end_reason=self.end_reason,
            min_billed_s=self.min_billed_s,
            segments=segments,
            ondemand_usd_per_hour=self.ondemand_usd_per_hour,
        )


@dataclass
class _Job:
    job_id: str
    usages: list[UsageRecord] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)
    useful_samples: float = 0.0

    def time_of(self, kind: str) -> float | None:
        return next((e.t_s for e in self.events if e.kind == kind), None)


class CostLedger:
    """Accumulates a run's cost facts as they happen; :meth:`close` gives the
    :class:`CostRecord`. See the module docstring for the billing, attribution and validation
    rules. Not thread-safe; a rejected call raises ``InvalidInputError`` and changes nothing.
    """

    def __init__(self) -> None:
        self._instances: dict[str, _Instance] = {}
        self._jobs: dict[str, _Job] = {}
        self._latest_s = 0.0
        self._closed = False

    # ---- instances ------------------------------------------------------------------------

    def launch(
        self,
        instance_id: str,
        *,
        offering_key: str,
        provider: str,
        instance_type: str,
        gpu_type: str,
        gpus: int,
        zone: str,
        market: Market | str,
        t_s: float,
        usd_per_hour: float,
        min_billed_s: float = 60.0,
        ondemand_usd_per_hour: float | None = None,
    ) -> None:
        """An instance starts billing at ``t_s`` at ``usd_per_hour``. ``instance_id`` must be
        new (ids are never reused); ``market`` is ``"spot"`` or ``"on-demand"``;
        ``ondemand_usd_per_hour`` is the on-demand price of the same offering, for savings."""
        self._check_open()
        _check_id(instance_id, "instance_id")
        if instance_id in self._instances:
            raise InvalidInputError(
                f"instance {instance_id!r} was already launched (ids are never reused)",
                field="instance_id",
            )
        for name, value in (
            ("offering_key", offering_key),
            ("provider", provider),
            ("instance_type", instance_type),
            ("gpu_type", gpu_type),
            ("zone", zone),
        ):
            _check_id(value, name)
        ondemand = None
        if ondemand_usd_per_hour is not None:
            ondemand = _check_price(ondemand_usd_per_hour, "ondemand_usd_per_hour")
        t = _check_time(t_s)
        self._instances[instance_id] = _Instance(
            instance_id=instance_id,
            offering_key=offering_key,
            provider=provider,
            instance_type=instance_type,
            gpu_type=gpu_type,
            gpus=_check_gpus(gpus),
            zone=zone,
            market=cast(Market, _check_choice(market, "market", MARKETS)),
            launched_s=t,
            min_billed_s=_check_number(min_billed_s, "min_billed_s", what="number of seconds"),
            ondemand_usd_per_hour=ondemand,
            points=[(t, _check_price(usd_per_hour))],
        )
        self._latest_s = max(self._latest_s, t)

    def price_change(self, instance_id: str, t_s: float, usd_per_hour: float) -> None:
        """From ``t_s`` on, the running instance pays ``usd_per_hour``. ``t_s`` is no earlier
        than its launch and its last price change; a change at the same time replaces it."""
        self._check_open()
        inst = self._live(instance_id, "price change")
        t, price = _check_time(t_s), _check_price(usd_per_hour)
        self._check_not_before(inst, t, "price change")
        t = max(t, inst.last_event_s)
        if t == inst.last_event_s:
            inst.points[-1] = (t, price)
            if len(inst.points) > 1 and inst.points[-2][1] == price:
                inst.points.pop()
        elif price != inst.points[-1][1]:
            inst.points.append((t, price))
        self._latest_s = max(self._latest_s, t)

    def end(self, instance_id: str, t_s: float, reason: EndReason | str) -> None:
        """The instance stops billing at ``t_s``: ``"released"`` by us, ``"preempted"`` by
        the provider, or ``"end_of_run"``. ``t_s`` is no earlier than its last price change
        and the end of every usage recorded on it."""
        self._check_open()
        inst = self._live(instance_id, "end")
        t = _check_time(t_s)
        why = cast(EndReason, _check_choice(reason, "reason", END_REASONS))
        self._check_not_before(inst, t, "end")
        if t < inst.last_usage_s - TIME_TOLERANCE_S:
            raise InvalidInputError(
                f"instance {instance_id!r}: end at {t} s is before the end of a usage recorded "
                f"on it ({inst.last_usage_s} s)",
                field="t_s",
            )
        inst.ended_s, inst.end_reason = max(t, inst.last_event_s), why
        if inst.ended_s == inst.last_event_s and len(inst.points) > 1:
            inst.points.pop()  # a price change at the end never applied to a running second
        self._latest_s = max(self._latest_s, t)

    # ---- jobs -----------------------------------------------------------------------------

    def job_usage(self, job_id: str, instance_id: str, t0_s: float, t1_s: float, gpus: int) -> None:
        """Job ``job_id`` held ``gpus`` GPUs of instance ``instance_id`` on ``[t0_s, t1_s]``.
        The interval lies inside the instance's life (its end may be unknown yet), within the
        job's submission and finish when known, and the instance's GPUs in use at once (this
        usage and all others recorded on it) never exceed its GPU count."""
        self._check_open()
        _check_id(job_id, "job_id")
        _check_id(instance_id, "instance_id")
        inst = self._instances.get(instance_id)
        if inst is None:
            raise InvalidInputError(
                f"job {job_id!r}: usage on unknown instance {instance_id!r}", field="instance_id"
            )
        t0, t1 = _check_time(t0_s, "t0_s"), _check_time(t1_s, "t1_s")
        n = _check_gpus(gpus)
        if t1 < t0:
            raise InvalidInputError(
                f"job {job_id!r}: usage ends ({t1} s) before it starts ({t0} s)", field="t1_s"
            )
        if t0 < inst.launched_s - TIME_TOLERANCE_S:
            raise InvalidInputError(
                f"job {job_id!r}: usage of {instance_id!r} starts at {t0} s, before its launch "
                f"at {inst.launched_s} s",
                field="t0_s",
            )
        if inst.ended_s is not None and t1 > inst.ended_s + TIME_TOLERANCE_S:
            raise InvalidInputError(
                f"job {job_id!r}: usage of {instance_id!r} ends at {t1} s, after the instance "
                f"ended at {inst.ended_s} s",
                field="t1_s",
            )
        if n > inst.gpus:
            raise InvalidInputError(
                f"job {job_id!r}: {n} GPUs of {instance_id!r}, which has {inst.gpus}", field="gpus"
            )
        job = self._jobs.get(job_id)
        if job is not None:
            submitted, finished = job.time_of("submitted"), job.time_of("finished")
            if submitted is not None and t0 < submitted - TIME_TOLERANCE_S:
                raise InvalidInputError(
                    f"job {job_id!r}: usage from {t0} s, before its submission at {submitted} s",
                    field="t0_s",
                )
            if finished is not None and t1 > finished + TIME_TOLERANCE_S:
                raise InvalidInputError(
                    f"job {job_id!r}: usage until {t1} s, after it finished at {finished} s",
                    field="t1_s",
                )
        if t1 > t0:
            peak = inst.occupancy.peak(t0, t1)
            if peak + n > inst.gpus:
                raise InvalidInputError(
                    f"job {job_id!r}: {n} GPUs of {instance_id!r} on [{t0}, {t1}] s while "
                    f"{peak} of its {inst.gpus} are already in use",
                    field="gpus",
                )
            inst.occupancy.add(t0, t1, n)
        self._job(job_id).usages.append(UsageRecord(instance_id, t0, t1, n))
        inst.last_usage_s = max(inst.last_usage_s, t1)
        self._latest_s = max(self._latest_s, t1)

    def job_event(self, job_id: str, t_s: float, kind: JobEventKind | str) -> None:
        """A job event: ``"submitted"`` (first, once), ``"restart"``, ``"preemption"`` or
        ``"finished"`` (last, once), in time order per job."""
        self._check_open()
        _check_id(job_id, "job_id")
        t = _check_time(t_s)
        what = cast(JobEventKind, _check_choice(kind, "kind", JOB_EVENT_KINDS))
        job = self._jobs.get(job_id)
        if job is not None:
            if job.events and t < job.events[-1].t_s - TIME_TOLERANCE_S:
                raise InvalidInputError(
                    f"job {job_id!r}: {what} at {t} s, before its last event "
                    f"({job.events[-1].kind} at {job.events[-1].t_s} s)",
                    field="t_s",
                )
            if job.time_of("finished") is not None:
                raise InvalidInputError(f"job {job_id!r}: {what} after it finished", field="kind")
            if what == "submitted" and job.events:
                raise InvalidInputError(
                    f"job {job_id!r}: submitted must be its first event", field="kind"
                )
            if what == "submitted" and any(u.t0_s < t - TIME_TOLERANCE_S for u in job.usages):
                raise InvalidInputError(
                    f"job {job_id!r}: submitted at {t} s after GPU usage recorded", field="t_s"
                )
            if what == "finished" and any(u.t1_s > t + TIME_TOLERANCE_S for u in job.usages):
                raise InvalidInputError(
                    f"job {job_id!r}: finished at {t} s before the end of its GPU usage",
                    field="t_s",
                )
        self._job(job_id).events.append(JobEvent(t, what))
        self._latest_s = max(self._latest_s, t)

    def job_work(self, job_id: str, useful_samples: float) -> None:
        """Add ``useful_samples`` (samples of training that count: work done, net of work lost
        to preemptions) to the job's total. Calls add up; the total is what goodput per dollar
        divides."""
        self._check_open()
        _check_id(job_id, "job_id")
        samples = _check_number(useful_samples, "useful_samples", what="number of samples")
        self._job(job_id).useful_samples += samples

    # ---- closing --------------------------------------------------------------------------

    def close(self, t_s: float) -> CostRecord:
        """End every instance still running at ``t_s`` with ``"end_of_run"`` and return the
        record. ``t_s`` is no earlier than anything recorded. The ledger accepts nothing
        afterwards."""
        self._check_open()
        t = _check_time(t_s)
        if t < self._latest_s - TIME_TOLERANCE_S:
            raise InvalidInputError(
                f"close at {t} s, before the latest time recorded ({self._latest_s} s)",
                field="t_s",
            )
        t = max(t, self._latest_s)
        for inst in self._instances.values():
            if inst.ended_s is None:
                self.end(inst.instance_id, t, "end_of_run")
        self._closed = True
        return CostRecord(
            closed_s=t,
            instances=tuple(inst.record() for inst in self._instances.values()),
            jobs=tuple(
                JobRecord(j.job_id, tuple(j.usages), tuple(j.events), j.useful_samples)
                for j in self._jobs.values()
            ),
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def running(self) -> tuple[str, ...]:
        """Ids of instances launched and not ended, in launch order."""
        return tuple(i.instance_id for i in self._instances.values() if i.ended_s is None)

    # ---- internals ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInputError("the ledger is closed", field="ledger")

    def _live(self, instance_id: str, what: str) -> _Instance:
        _check_id(instance_id, "instance_id")
        inst = self._instances.get(instance_id)
        if inst is None:
            raise InvalidInputError(
                f"{what} of unknown instance {instance_id!r}", field="instance_id"
            )
        if inst.ended_s is not None:
            raise InvalidInputError(
                f"{what} of instance {instance_id!r}, which ended at {inst.ended_s} s "
                f"({inst.end_reason})",
                field="instance_id",
            )
        return inst

    @staticmethod
    def _check_not_before(inst: _Instance, t: float, what: str) -> None:
        if t < inst.last_event_s - TIME_TOLERANCE_S:
            raise InvalidInputError(
                f"instance {inst.instance_id!r}: {what} at {t} s is before its last event at "
                f"{inst.last_event_s} s",
                field="t_s",
            )

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _Job(job_id)
        return job


# ---- money ----------------------------------------------------------------------------------


def usd_to_cents(usd: float) -> Decimal:
    """``usd`` rounded to the cent (see Rounding in the module docstring): quantized to 1e-9
    USD with ``ROUND_HALF_EVEN``, then to 0.01 USD with ``ROUND_HALF_UP``."""
    if not math.isfinite(usd):
        raise InvalidInputError(f"not a finite amount of USD: {usd!r}", field="usd")
    exact = Decimal(usd).quantize(_NANO_USD, rounding=ROUND_HALF_EVEN)
    cents = exact.quantize(_CENT, rounding=ROUND_HALF_UP)
    return cents if cents else Decimal("0.00")  # never "-0.00"


USD_DISPLAY_DIGITS: Final = 3
"""Significant digits :func:`usd_for_display` keeps for an amount under one dollar."""


def usd_for_display(usd: float) -> Decimal:
    """``usd`` with the precision the amount needs: to the cent from one dollar up (what a bill
    shows, :func:`usd_to_cents`); under a dollar, :data:`USD_DISPLAY_DIGITS` significant
    digits (at least 2 decimals, at most 9: ``0.0153``, ``0.000412``, ``0.512``), so a run that
    cost a fraction of a cent does not read ``0.00``. Zero is ``0.00``."""
    cents = usd_to_cents(usd)
    exact = Decimal(usd).quantize(_NANO_USD, rounding=ROUND_HALF_EVEN)
    if exact == 0 or abs(exact) >= 1:
        return cents
    exponent = abs(exact).adjusted()  # 0.0153 -> -2
    decimals = min(9, max(2, USD_DISPLAY_DIGITS - 1 - exponent))
    shown = exact.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    if shown == 0:
        return Decimal("0.00")
    text = format(shown, "f").rstrip("0")
    if len(text.partition(".")[2]) < 2:
        text = format(shown.quantize(_CENT), "f")
    return Decimal(text)


def _price_integral_usd(
    inst: InstanceRecord, t0: float, t1: float, starts: list[float] | None = None
) -> float:
    """The instance's price integrated over ``[t0, t1]`` clipped to its life (no shortfall).
    ``starts``: the segments' start times, when the caller has them already."""
    t0, t1 = max(t0, inst.launched_s), min(t1, inst.ended_s)
    if t1 <= t0:
        return 0.0
    if starts is None:
        starts = [s.t0_s for s in inst.segments]
    i = max(0, bisect_right(starts, t0) - 1)
    parts = []
    for seg in inst.segments[i:]:
        if seg.t0_s >= t1:
            break
        overlap = min(t1, seg.t1_s) - max(t0, seg.t0_s)
        if overlap > 0:
            parts.append(seg.usd_per_hour * overlap)
    return math.fsum(parts) / _S_PER_HOUR


def _segment_starts(record: CostRecord) -> dict[str, list[float]]:
    return {i.instance_id: [s.t0_s for s in i.segments] for i in record.instances}


def instance_cost_usd(inst: InstanceRecord) -> float:
    """What the instance cost: its price segments plus the minimum-billing shortfall."""
    return math.fsum([*(s.cost_usd for s in inst.segments), inst.shortfall_usd])


def total_cost_usd(record: CostRecord) -> float:
    """The sum over instances of :func:`instance_cost_usd`."""
    return math.fsum(instance_cost_usd(inst) for inst in record.instances)


def _attributed_by_instance(record: CostRecord) -> dict[str, float]:
    """USD attributed to jobs, per instance id."""
    by_id = {inst.instance_id: inst for inst in record.instances}
    starts = _segment_starts(record)
    parts: dict[str, list[float]] = {iid: [] for iid in by_id}
    for job in record.jobs:
        for u in job.usages:
            inst = by_id[u.instance_id]
            usd = _price_integral_usd(inst, u.t0_s, u.t1_s, starts[u.instance_id])
            parts[u.instance_id].append(usd * u.gpus / inst.gpus)
    return {iid: math.fsum(p) for iid, p in parts.items()}


def idle_cost_usd(record: CostRecord) -> float:
    """Cost no job was charged: per instance, its cost minus what its usages were attributed
    (free GPUs, time before and between jobs, minimum-billing shortfalls)."""
    attributed = _attributed_by_instance(record)
    return math.fsum(
        instance_cost_usd(inst) - attributed[inst.instance_id] for inst in record.instances
    )


# ---- derived reports ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobCost:
    """A job's figures: GPU-hours held, USD attributed (see the module docstring), useful
    samples and samples per USD (``None`` when nothing was attributed), restarts, preemptions,
    submission, finish and JCT when known."""

    job_id: str
    gpu_hours: float
    cost_usd: float
    useful_samples: float
    samples_per_usd: float | None
    restarts: int
    preemptions: int
    submitted_s: float | None
    finished_s: float | None
    jct_s: float | None


def job_costs(record: CostRecord) -> tuple[JobCost, ...]:
    """One :class:`JobCost` per job of the record, in its order."""
    by_id = {inst.instance_id: inst for inst in record.instances}
    starts = _segment_starts(record)
    out = []
    for job in record.jobs:
        usd_parts, gpu_s_parts = [], []
        for u in job.usages:
            inst = by_id[u.instance_id]
            t0, t1 = max(u.t0_s, inst.launched_s), min(u.t1_s, inst.ended_s)
            gpu_s_parts.append(u.gpus * max(0.0, t1 - t0))
            usd = _price_integral_usd(inst, t0, t1, starts[u.instance_id])
            usd_parts.append(usd * u.gpus / inst.gpus)
        usd = math.fsum(usd_parts)
        out.append(
            JobCost(
                job_id=job.job_id,
                gpu_hours=math.fsum(gpu_s_parts) / _S_PER_HOUR,
                cost_usd=usd,
                useful_samples=job.useful_samples,
                samples_per_usd=job.useful_samples / usd if usd > 0 else None,
                restarts=job.restarts,
                preemptions=job.preemptions,
                submitted_s=job.submitted_s,
                finished_s=job.finished_s,
                jct_s=job.jct_s,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class OfferingCost:
    """Totals of one (offering, market): instances launched, preempted, instance-hours and
    GPU-hours lived, USD spent; the on-demand equivalent and savings over the instances that
    gave an on-demand price (``None`` when none did)."""

    offering_key: str
    market: Market
    provider: str
    instance_type: str
    gpu_type: str
    zone: str
    instances: int
    preempted: int
    instance_hours: float
    gpu_hours: float
    cost_usd: float
    ondemand_usd: float | None
    savings_usd: float | None


def offering_costs(record: CostRecord) -> tuple[OfferingCost, ...]:
    """One :class:`OfferingCost` per (offering key, market), in order of first launch.
    ``savings_usd`` = on-demand equivalent - actual cost, over the instances with an
    on-demand price."""
    groups: dict[tuple[str, str], list[InstanceRecord]] = {}
    for inst in record.instances:
        groups.setdefault((inst.offering_key, inst.market), []).append(inst)
    out = []
    for (key, market), insts in groups.items():
        first = insts[0]
        priced = [i for i in insts if i.ondemand_usd_per_hour is not None]
        ondemand = savings = None
        if priced:
            ondemand = math.fsum(cast(float, i.ondemand_equivalent_usd) for i in priced)
            savings = ondemand - math.fsum(instance_cost_usd(i) for i in priced)
        out.append(
            OfferingCost(
                offering_key=key,
                market=cast(Market, market),
                provider=first.provider,
                instance_type=first.instance_type,
                gpu_type=first.gpu_type,
                zone=first.zone,
                instances=len(insts),
                preempted=sum(1 for i in insts if i.end_reason == "preempted"),
                instance_hours=math.fsum(i.life_s for i in insts) / _S_PER_HOUR,
                gpu_hours=math.fsum(i.life_s * i.gpus for i in insts) / _S_PER_HOUR,
                cost_usd=math.fsum(instance_cost_usd(i) for i in insts),
                ondemand_usd=ondemand,
                savings_usd=savings,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class FleetPoint:
    """A step of the fleet: from ``t_s`` until the next point, ``instances`` running with
    ``gpus`` GPUs in all, paying ``usd_per_hour`` together."""

    t_s: float
    instances: int
    gpus: int
    usd_per_hour: float


def _fleet_changes(record: CostRecord) -> dict[float, list[tuple[str, float | None]]]:
    """Time -> (instance id, its price from then on, or ``None`` when it ends)."""
    changes: dict[float, list[tuple[str, float | None]]] = {}
    for inst in record.instances:
        for seg in inst.segments:
            changes.setdefault(seg.t0_s, []).append((inst.instance_id, seg.usd_per_hour))
        changes.setdefault(inst.ended_s, []).append((inst.instance_id, None))
    return changes


def fleet_series(record: CostRecord) -> tuple[FleetPoint, ...]:
    """The fleet's size and cost rate as a step series from time 0 to the close: one point at
    0 and one at every time the fleet or a price changed (values after the change)."""
    gpus_of = {inst.instance_id: inst.gpus for inst in record.instances}
    live: dict[str, float] = {}
    points = [FleetPoint(0.0, 0, 0, 0.0)]
    for t, changes in sorted(_fleet_changes(record).items()):
        # Zero-length lives (launch and end at once) apply in order: price first, then end.
        for iid, price in changes:
            if price is None:
                live.pop(iid, None)
            else:
                live[iid] = price
        point = FleetPoint(t, len(live), sum(gpus_of[i] for i in live), math.fsum(live.values()))
        if points[-1].t_s == t:
            points[-1] = point
        else:
            points.append(point)
    if points[-1].t_s < record.closed_s:
        last = points[-1]
        points.append(FleetPoint(record.closed_s, last.instances, last.gpus, last.usd_per_hour))
    return tuple(points)


@dataclass(frozen=True)
class CumulativeCost:
    """Cumulative USD per offering key at ``times_s``: ``usd[k][i]`` is what offering
    ``offerings[k]`` had cost by ``times_s[i]``. Linear between consecutive points; a time
    appears twice where a minimum-billing shortfall is booked (before, then after the lump)."""

    times_s: tuple[float, ...]
    offerings: tuple[str, ...]
    usd: tuple[tuple[float, ...], ...]


def cumulative_cost_by_offering(record: CostRecord) -> CumulativeCost:
    """See :class:`CumulativeCost`; starts at time 0, ends at the close, and its last values
    are each offering's total cost."""
    keys = tuple(dict.fromkeys(inst.offering_key for inst in record.instances))
    index = {k: n for n, k in enumerate(keys)}
    rate_changes: dict[float, list[tuple[str, str, float | None]]] = {}
    lumps: dict[float, list[tuple[int, float]]] = {}
    for inst in record.instances:
        for seg in inst.segments:
            rate_changes.setdefault(seg.t0_s, []).append(
                (inst.offering_key, inst.instance_id, seg.usd_per_hour)
            )
        rate_changes.setdefault(inst.ended_s, []).append(
            (inst.offering_key, inst.instance_id, None)
        )
        if inst.shortfall_s > 0:
            lumps.setdefault(inst.ended_s, []).append(
                (index[inst.offering_key], inst.shortfall_usd)
            )
    live: list[dict[str, float]] = [{} for _ in keys]
    parts: list[list[float]] = [[] for _ in keys]  # accrued pieces, summed with fsum
    times: list[float] = [0.0]
    columns: list[list[float]] = [[0.0] for _ in keys]
    prev = 0.0
    for t in sorted(set(rate_changes) | set(lumps) | {record.closed_s}):
        for k in range(len(keys)):
            if live[k] and t > prev:
                parts[k].append(math.fsum(live[k].values()) * (t - prev) / _S_PER_HOUR)
        if t in lumps:
            times.append(t)
            for k in range(len(keys)):
                columns[k].append(math.fsum(parts[k]))
            for k, usd in lumps[t]:
                parts[k].append(usd)
        for key, iid, price in rate_changes.get(t, ()):
            if price is None:
                live[index[key]].pop(iid, None)
            else:
                live[index[key]][iid] = price
        if times[-1] != t or t in lumps:
            times.append(t)
            for k in range(len(keys)):
                columns[k].append(math.fsum(parts[k]))
        else:
            for k in range(len(keys)):
                columns[k][-1] = math.fsum(parts[k])
        prev = t
    return CumulativeCost(tuple(times), keys, tuple(tuple(c) for c in columns))


@dataclass(frozen=True)
class CostSummary:
    """A run's headline figures (USD unrounded; round with :func:`usd_to_cents` to report).

    ``attributed_usd + idle_usd == total_usd``; ``shortfall_usd`` (minimum billing) is part of
    ``idle_usd``; ``ondemand_usd``/``savings_usd`` cover the instances that gave an on-demand
    price (``None`` when none did); ``samples_per_usd`` is all useful samples over the total
    cost (``None`` when the run cost nothing)."""

    closed_s: float
    total_usd: float
    attributed_usd: float
    idle_usd: float
    shortfall_usd: float
    ondemand_usd: float | None
    savings_usd: float | None
    instances: int
    spot_instances: int
    preempted_instances: int
    instance_hours: float
    gpu_hours: float
    used_gpu_hours: float
    jobs: int
    finished_jobs: int
    restarts: int
    preemptions: int
    useful_samples: float
    samples_per_usd: float | None
    peak_instances: int
    peak_gpus: int
    peak_usd_per_hour: float

    @property
    def utilization(self) -> float | None:
        """Job GPU-hours over fleet GPU-hours (``None`` for an empty fleet)."""
        return self.used_gpu_hours / self.gpu_hours if self.gpu_hours > 0 else None


def summarize(record: CostRecord) -> CostSummary:
    """The :class:`CostSummary` of a record."""
    jobs = job_costs(record)
    offerings = offering_costs(record)
    series = fleet_series(record)
    total = total_cost_usd(record)
    attributed = math.fsum(j.cost_usd for j in jobs)
    priced = [o for o in offerings if o.ondemand_usd is not None]
    samples = math.fsum(j.useful_samples for j in jobs)
    return CostSummary(
        closed_s=record.closed_s,
        total_usd=total,
        attributed_usd=attributed,
        idle_usd=idle_cost_usd(record),
        shortfall_usd=math.fsum(i.shortfall_usd for i in record.instances),
        ondemand_usd=math.fsum(cast(float, o.ondemand_usd) for o in priced) if priced else None,
        savings_usd=math.fsum(cast(float, o.savings_usd) for o in priced) if priced else None,
        instances=len(record.instances),
        spot_instances=sum(1 for i in record.instances if i.market == "spot"),
        preempted_instances=sum(1 for i in record.instances if i.end_reason == "preempted"),
        instance_hours=math.fsum(o.instance_hours for o in offerings),
        gpu_hours=math.fsum(o.gpu_hours for o in offerings),
        used_gpu_hours=math.fsum(j.gpu_hours for j in jobs),
        jobs=len(jobs),
        finished_jobs=sum(1 for j in jobs if j.finished_s is not None),
        restarts=sum(j.restarts for j in jobs),
        preemptions=sum(j.preemptions for j in jobs),
        useful_samples=samples,
        samples_per_usd=samples / total if total > 0 else None,
        peak_instances=max(p.instances for p in series),
        peak_gpus=max(p.gpus for p in series),
        peak_usd_per_hour=max(p.usd_per_hour for p in series),
    )


# ---- JSON -----------------------------------------------------------------------------------


def record_to_json(record: CostRecord) -> dict[str, Any]:
    """The record as JSON-ready data, ``{"version": 1, "closed_s", "instances", "jobs"}``;
    :func:`record_from_json` reads it back equal."""
    return {
        "version": RECORD_VERSION,
        "closed_s": record.closed_s,
        "instances": [
            {
                "instance_id": i.instance_id,
                "offering_key": i.offering_key,
                "provider": i.provider,
                "instance_type": i.instance_type,
                "gpu_type": i.gpu_type,
                "gpus": i.gpus,
                "zone": i.zone,
                "market": i.market,
                "launched_s": i.launched_s,
                "ended_s": i.ended_s,
                "end_reason": i.end_reason,
                "min_billed_s": i.min_billed_s,
                "ondemand_usd_per_hour": i.ondemand_usd_per_hour,
                "segments": [
                    {"t0_s": s.t0_s, "t1_s": s.t1_s, "usd_per_hour": s.usd_per_hour}
                    for s in i.segments
                ],
            }
            for i in record.instances
        ],
        "jobs": [
            {
                "job_id": j.job_id,
                "useful_samples": j.useful_samples,
                "events": [{"t_s": e.t_s, "kind": e.kind} for e in j.events],
                "usages": [
                    {"instance_id": u.instance_id, "t0_s": u.t0_s, "t1_s": u.t1_s, "gpus": u.gpus}
                    for u in j.usages
                ],
            }
            for j in record.jobs
        ],
    }


class _Reader:
    """Typed access to JSON data; every error names the path of the offending value."""

    def __init__(self, data: object, path: str) -> None:
        self.data, self.path = data, path

    def fail(self, message: str, key: str | None = None) -> InvalidInputError:
        where = self.path if key is None else f"{self.path}.{key}" if self.path else key
        return InvalidInputError(f"cost record: {where or '(top)'}: {message}", field=where or None)

    def obj(self) -> Mapping[str, Any]:
        if not isinstance(self.data, Mapping):
            raise self.fail(f"expected an object, got {type(self.data).__name__}")
        return self.data

    def get(self, key: str) -> Any:
        data = self.obj()
        if key not in data:
            raise self.fail("missing", key)
        return data[key]

    def items(self, key: str) -> list[_Reader]:
        value = self.get(key)
        if not isinstance(value, list):
            raise self.fail(f"expected a list, got {type(value).__name__}", key)
        base = f"{self.path}.{key}" if self.path else key
        return [_Reader(v, f"{base}[{n}]") for n, v in enumerate(value)]

    def text(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str) or not value:
            raise self.fail(f"expected a non-empty string, got {value!r}", key)
        return value

    def number(self, key: str) -> float:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"expected a number, got {value!r}", key)
        if not (math.isfinite(value) and value >= 0):
            raise self.fail(f"expected a finite number >= 0, got {value!r}", key)
        return float(value)

    def optional_number(self, key: str) -> float | None:
        return None if self.obj().get(key) is None else self.number(key)

    def integer(self, key: str) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"expected an integer, got {value!r}", key)
        return value

    def wrap(self, error: InvalidInputError, **rename: str) -> InvalidInputError:
        """A ledger's rejection of this item, named by the path of the value it rejected
        (``rename``: the ledger's argument name -> this item's key, when they differ)."""
        key = rename.get(error.field or "", error.field)
        known = key is not None and (key in self.obj() or "." in key)
        return self.fail(str(error), key if known else None)


def record_from_json(data: object) -> CostRecord:
    """Read a record written by :func:`record_to_json` (version 1). The data is replayed
    through a :class:`CostLedger`, so a record that breaks any ledger rule is rejected too.
    Errors are :class:`~autoscaler.errors.InvalidInputError` whose ``field`` (and message) is
    the path of the offending value, e.g. ``instances[2].segments[0].usd_per_hour``."""
    top = _Reader(data, "")
    version = top.get("version")
    if isinstance(version, bool) or version != RECORD_VERSION:
        raise top.fail(f"unsupported version {version!r} (expected {RECORD_VERSION})", "version")
    closed_s = top.number("closed_s")
    instances, jobs = top.items("instances"), top.items("jobs")
    order: dict[str, int] = {}
    for n, item in enumerate(jobs):
        job_id = item.text("job_id")
        if job_id in order:
            raise item.fail(f"duplicate job {job_id!r} (also jobs[{order[job_id]}])", "job_id")
        order[job_id] = n
    ledger = CostLedger()
    for item in instances:
        _replay_instance(ledger, item)
    for item in jobs:  # events first: usage is then checked against submission and finish
        job_id = item.text("job_id")
        for event in item.items("events"):
            t_s, kind = event.number("t_s"), event.text("kind")
            try:
                ledger.job_event(job_id, t_s, kind)
            except InvalidInputError as e:
                raise event.wrap(e) from None
    for item in jobs:
        job_id = item.text("job_id")
        for usage in item.items("usages"):
            iid, gpus = usage.text("instance_id"), usage.integer("gpus")
            t0_s, t1_s = usage.number("t0_s"), usage.number("t1_s")
            try:
                ledger.job_usage(job_id, iid, t0_s, t1_s, gpus)
            except InvalidInputError as e:
                raise usage.wrap(e) from None
        samples = item.number("useful_samples")
        try:
            ledger.job_work(job_id, samples)
        except InvalidInputError as e:
            raise item.wrap(e) from None
    try:
        record = ledger.close(closed_s)
    except InvalidInputError as e:
        raise top.fail(str(e), "closed_s") from None
    # Jobs in the record's order (the ledger orders them by first mention).
    ordered = tuple(sorted(record.jobs, key=lambda j: order[j.job_id]))
    return CostRecord(record.closed_s, record.instances, ordered)


def _replay_instance(ledger: CostLedger, item: _Reader) -> None:
    """Launch, price changes and end of one instance item, checked for contiguous segments."""
    segments = item.items("segments")
    if not segments:
        raise item.fail("an instance has at least one price segment", "segments")
    launched, ended = item.number("launched_s"), item.number("ended_s")
    bounds = [(s.number("t0_s"), s.number("t1_s")) for s in segments]
    if bounds[0][0] != launched:
        raise segments[0].fail(f"the first segment starts at launched_s ({launched})", "t0_s")
    for n in range(1, len(bounds)):
        if bounds[n][0] != bounds[n - 1][1]:
            raise segments[n].fail("segments are contiguous: t0_s = the previous t1_s", "t0_s")
    if bounds[-1][1] != ended:
        raise segments[-1].fail(f"the last segment ends at ended_s ({ended})", "t1_s")
    fields = {
        key: item.text(key)
        for key in ("offering_key", "provider", "instance_type", "gpu_type", "zone", "market")
    }
    iid, gpus, end_reason = item.text("instance_id"), item.integer("gpus"), item.text("end_reason")
    min_billed_s, ondemand = (
        item.number("min_billed_s"),
        item.optional_number("ondemand_usd_per_hour"),
    )
    prices = [seg.number("usd_per_hour") for seg in segments]
    try:
        ledger.launch(
            iid,
            gpus=gpus,
            t_s=launched,
            usd_per_hour=prices[0],
            min_billed_s=min_billed_s,
            ondemand_usd_per_hour=ondemand,
            **fields,
        )
    except InvalidInputError as e:
        raise item.wrap(e, t_s="launched_s", usd_per_hour="segments[0].usd_per_hour") from None
    for seg, (t0, _), price in zip(segments[1:], bounds[1:], prices[1:], strict=True):
        try:
            ledger.price_change(iid, t0, price)
        except InvalidInputError as e:
            raise seg.wrap(e, t_s="t0_s") from None
    try:
        ledger.end(iid, ended, end_reason)
    except InvalidInputError as e:
        raise item.wrap(e, t_s="ended_s", reason="end_reason") from None


MAX_SERIES_POINTS: Final = 1000
"""The most points :func:`cost_series_usd` returns (a long-lived cluster's series is thinned)."""


def cost_series_usd(
    closed: Sequence[tuple[float, float, float, float]],
    running: Sequence[tuple[float, float]],
    now_s: float,
) -> list[tuple[float, float]]:
    """The fleet's cumulative cost over time, ``[(t_s, usd), ...]`` oldest first: what the
    dashboard's cost chart draws (``GET /v1/costs``).

    ``closed``: the instances' closed bills, each ``(start_s, end_s, usd_per_hour, usd)``
    (the controller's cost records); ``running``: the instances still billing, each
    ``(started_s, usd_per_hour)``. Times are Unix seconds (any origin, the same for all).

    It starts at 0 USD at the first instance's start (the earliest start of either), grows
    at the sum of the prices of the instances running at each moment (linear between points),
    and ends at ``now_s`` with every closed record's ``usd`` plus what each running instance
    accrued since it started. A closed record billed more than its price times its life (a
    provider minimum) adds the difference as a step at its end. Empty when nothing ever ran.
    At most :data:`MAX_SERIES_POINTS` points: the first and the last are always kept."""
    rate: dict[float, float] = {}  # t -> change of the cost rate (USD/s) there
    lump: dict[float, float] = {}  # t -> USD booked at once (minimum billing)
    for start_s, end_s, usd_per_hour, usd in closed:
        end = max(start_s, end_s)
        per_s = usd_per_hour / _S_PER_HOUR
        rate[start_s] = rate.get(start_s, 0.0) + per_s
        rate[end] = rate.get(end, 0.0) - per_s
        extra = usd - per_s * (end - start_s)
        if extra > 1e-12:
            lump[end] = lump.get(end, 0.0) + extra
    for started_s, usd_per_hour in running:
        start = min(started_s, now_s)
        rate[start] = rate.get(start, 0.0) + usd_per_hour / _S_PER_HOUR
    if not rate:
        return []
    times = sorted(t for t in set(rate) | set(lump) if t <= now_s)
    if not times or times[-1] < now_s:
        times.append(now_s)
    points: list[tuple[float, float]] = []
    total, per_s, prev = 0.0, 0.0, times[0]
    for t in times:
        total += per_s * (t - prev)
        points.append((t, total))
        if t in lump:
            total += lump[t]
            points.append((t, total))
        per_s = max(0.0, per_s + rate.get(t, 0.0))
        prev = t
    if len(points) > MAX_SERIES_POINTS:
        step = (len(points) - 1) / (MAX_SERIES_POINTS - 1)
        points = [points[round(i * step)] for i in range(MAX_SERIES_POINTS)]
    return points
