"""Spot preemption: replayed availability traces and the interruption hazard of spot pools.

Pure core; loading reads the files named (by default the copies shipped in
``autoscaler/data/``). Every malformed file fails with
:class:`~autoscaler.errors.TraceFormatError` naming the file, the 1-based line and the field.

:class:`AvailabilityTrace` replays the Bamboo spot availability traces (both formats, detected
from the file); :class:`SpotHazardModel` turns the AWS Spot Instance Advisor's interruption bands
into a per-instance-hour hazard and samples preemption times deterministically per (seed,
instance id). Notice times and billing rules are in :mod:`autoscaler.market.terms`.
"""

from __future__ import annotations

import bisect
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from types import MappingProxyType

from autoscaler.errors import DuplicateOfferingError, InvalidInputError, TraceFormatError
from autoscaler.market.catalog import MarketOffering, PricedOffering
from autoscaler.market.files import CsvFile, prices_dir, spot_dir
from autoscaler.market.series import check_window, seed_int
from autoscaler.market.terms import ON_DEMAND

__all__ = [
    "BAMBOO_TRACES",
    "COUNT_TRACE",
    "EVENT_TRACE",
    "HOURS_PER_MONTH",
    "INTERRUPTION_BAND_FRACTIONS",
    "AvailabilityTrace",
    "InterruptionBand",
    "SpotHazardModel",
    "bamboo_trace_path",
    "band_hazard_per_hour",
    "load_availability_trace",
    "load_hazard_model",
]

_SPOT_ADVISOR_FILE = "aws_spot_advisor_gpu.csv"

#: Fraction of capacity reclaimed per trailing month assumed for each AWS Spot Instance Advisor
#: interruption band: the band's midpoint; the open band ">20%" counts as 25%.
INTERRUPTION_BAND_FRACTIONS: Mapping[str, float] = MappingProxyType(
    {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}
)
#: Length of the advisor's "trailing month": 30 days.
HOURS_PER_MONTH = 720.0

#: The Bamboo availability traces shipped in ``spot_dir()/bamboo``.
BAMBOO_TRACES: tuple[str, ...] = (
    "g4dn-trace.csv",
    "p3-trace.csv",
    "gcloud/a100x1-east1b.txt",
    "gcloud/v100x1-east1c.txt",
)


def bamboo_trace_path(name: str) -> Path:
    """Path of a shipped Bamboo trace, ``name`` one of :data:`BAMBOO_TRACES`."""
    if name not in BAMBOO_TRACES:
        raise InvalidInputError(
            f"unknown Bamboo trace {name!r}; shipped: {', '.join(BAMBOO_TRACES)}", field="name"
        )
    return spot_dir() / "bamboo" / name


# --------------------------------------------------------------------------------------------
# Availability traces (Bamboo)
# --------------------------------------------------------------------------------------------

_EVENT_LINE = re.compile(r"^\s*\d+(?:\.\d+)?\s*,\s*(?:add|remove)\s*,\s*\S.*$")
_COUNT_LINE = re.compile(r"^\s*\d{4}-\d{2}-\d{2}\s*,\s*\d{1,2}:\d{2}:\d{2}\s*,\s*\d+\s*$")
_EVENT_HEADER = ("time_ms", "event", "node")
_COUNT_HEADER = ("date", "time", "count")
#: :attr:`AvailabilityTrace.kind` of event-list traces and of count traces.
EVENT_TRACE = "events"
COUNT_TRACE = "counts"


@dataclass(frozen=True)
class AvailabilityTrace:
    """How many spot instances of one pool were alive over time, and when some were lost.

    ``times_s[i]`` (strictly increasing, seconds from the trace's origin) is a change point:
    from it on ``capacity[i]`` instances are alive; ``added[i]`` were granted and
    ``preempted[i]`` reclaimed at that instant (``capacity[i] = capacity[i-1] + added[i] -
    preempted[i]``, capacity 0 before the first point). ``instances[i]`` is the set of node
    names alive from ``times_s[i]`` for event traces, ``None`` for count traces (which only
    know the net change: a drop of n counts as n preemptions, a rise as n additions).
    """

    source: str
    kind: str
    times_s: tuple[float, ...]
    capacity: tuple[int, ...]
    added: tuple[int, ...]
    preempted: tuple[int, ...]
    instances: tuple[frozenset[str], ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.times_s)
        if self.kind not in (EVENT_TRACE, COUNT_TRACE):
            raise InvalidInputError(f"unknown trace kind {self.kind!r}", field="kind")
        if n == 0 or not (len(self.capacity) == len(self.added) == len(self.preempted) == n):
            raise InvalidInputError("a trace needs equal, non-empty columns", field="times_s")
        if self.instances is not None and len(self.instances) != n:
            raise InvalidInputError("one instance set per change point", field="instances")
        before = 0
        for i in range(n):
            if not math.isfinite(self.times_s[i]) or (i and self.times_s[i] <= self.times_s[i - 1]):
                raise InvalidInputError("times must be finite and increasing", field="times_s")
            if min(self.capacity[i], self.added[i], self.preempted[i]) < 0:
                raise InvalidInputError("counts must be >= 0", field="capacity")
            if self.capacity[i] != before + self.added[i] - self.preempted[i]:
                raise InvalidInputError(
                    f"capacity at index {i} is not the previous plus added minus preempted",
                    field="capacity",
                )
            if self.instances is not None and len(self.instances[i]) != self.capacity[i]:
                raise InvalidInputError(
                    "instance set size differs from capacity", field="instances"
                )
            before = self.capacity[i]

    @property
    def start_s(self) -> float:
        return self.times_s[0]

    @property
    def end_s(self) -> float:
        """The last change point (the trace says nothing after it; capacity stays)."""
        return self.times_s[-1]

    def _index(self, t_s: float) -> int:
        return bisect.bisect_right(self.times_s, t_s) - 1

    def capacity_at(self, t_s: float) -> int:
        """Instances alive at ``t_s`` (changes at ``t_s`` included); 0 before the trace."""
        i = self._index(t_s)
        return 0 if i < 0 else self.capacity[i]

    def instances_at(self, t_s: float) -> frozenset[str]:
        """Names of the instances alive at ``t_s`` (event traces only)."""
        if self.instances is None:
            raise InvalidInputError(
                f"{self.source}: a count trace has no instance names", field="kind"
            )
        i = self._index(t_s)
        return frozenset() if i < 0 else self.instances[i]

    def _sum_between(self, column: tuple[int, ...], t0_s: float, t1_s: float) -> int:
        check_window(t0_s, t1_s)
        lo = bisect.bisect_left(self.times_s, t0_s)
        hi = bisect.bisect_left(self.times_s, t1_s)
        return sum(column[lo:hi])

    def preemptions_between(self, t0_s: float, t1_s: float) -> int:
        """Instances reclaimed at times in ``[t0_s, t1_s)``."""
        return self._sum_between(self.preempted, t0_s, t1_s)

    def additions_between(self, t0_s: float, t1_s: float) -> int:
        """Instances granted at times in ``[t0_s, t1_s)``."""
        return self._sum_between(self.added, t0_s, t1_s)

    def preemption_times(self, t0_s: float, t1_s: float) -> list[tuple[float, int]]:
        """``(t_s, instances reclaimed)`` for each preemption in ``[t0_s, t1_s)``."""
        check_window(t0_s, t1_s)
        lo = bisect.bisect_left(self.times_s, t0_s)
        hi = bisect.bisect_left(self.times_s, t1_s)
        return [(self.times_s[i], self.preempted[i]) for i in range(lo, hi) if self.preempted[i]]


def load_availability_trace(path: str | Path) -> AvailabilityTrace:
    """Parse a spot availability trace, detecting its format from the first data line.

    * **Events** (Bamboo ``p3-trace.csv``, ``g4dn-trace.csv``): ``time_ms,add|remove,node``,
      no header (a ``time_ms,event,node`` header is accepted). Times are **milliseconds**
      (every value in the shipped files is a multiple of 60 000, and the traces span ~10.8 h
      and ~11.4 h: read as seconds they would span over a year), converted to seconds; events
      at one time are applied together. Adding a node already alive, removing one not alive, or
      a time going backwards is an error.
    * **Counts** (Bamboo ``gcloud/*.txt``): ``YYYY-MM-DD, HH:MM:SS, count`` (a
      ``date,time,count`` header is accepted), read as UTC; times in seconds from the earliest
      retained sample. The logger repeats each sample for up to two minutes, and a new sample can
      be stamped before those repeats: the count at time t is that of **the last line in the
      file whose time is <= t** (a line that goes back in time overrides what earlier lines
      said from its time on).

    Anything else is a :class:`TraceFormatError` naming the file and line (and the field when
    one cell is bad).
    """
    p = Path(path)
    name = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceFormatError(f"cannot read file: {e.strerror}", path=name) from e
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"not a text file ({e})", path=name) from e
    lines = [(i + 1, raw) for i, raw in enumerate(text.splitlines()) if raw.strip()]
    if not lines:
        raise TraceFormatError("empty trace", path=name, line=1)
    first_no, first = lines[0]
    header = tuple(c.strip().lower() for c in first.split(","))
    if header in (_EVENT_HEADER, _COUNT_HEADER):
        lines = lines[1:]
        kind = EVENT_TRACE if header == _EVENT_HEADER else COUNT_TRACE
        if not lines:
            raise TraceFormatError("no data lines after the header", path=name, line=first_no)
    elif _EVENT_LINE.match(first):
        kind = EVENT_TRACE
    elif _COUNT_LINE.match(first):
        kind = COUNT_TRACE
    else:
        raise TraceFormatError(
            "unknown availability trace format: expected 'time_ms,add|remove,node' or "
            f"'YYYY-MM-DD, HH:MM:SS, count', got {first.strip()[:60]!r}",
            path=name,
            line=first_no,
        )
    if kind == EVENT_TRACE:
        return _parse_events(name, lines)
    return _parse_counts(name, lines)


def _cells(name: str, line: int, raw: str, fields: tuple[str, ...]) -> list[str]:
    cells = [c.strip() for c in raw.split(",")]
    if len(cells) != len(fields):
        raise TraceFormatError(
            f"expected {len(fields)} comma-separated fields ({','.join(fields)}), got {len(cells)}",
            path=name,
            line=line,
        )
    for cell, fname in zip(cells, fields, strict=True):
        if not cell:
            raise TraceFormatError("missing value", path=name, line=line, field=fname)
    return cells


def _parse_events(name: str, lines: list[tuple[int, str]]) -> AvailabilityTrace:
    alive: set[str] = set()
    times: list[float] = []
    capacity: list[int] = []
    added: list[int] = []
    preempted: list[int] = []
    instances: list[frozenset[str]] = []
    last_ms = -math.inf
    for line, raw in lines:
        t_text, event, node = _cells(name, line, raw, _EVENT_HEADER)
        try:
            t_ms = float(t_text)
        except ValueError:
            raise TraceFormatError(
                f"not a number: {t_text!r}", path=name, line=line, field="time_ms"
            ) from None
        if not math.isfinite(t_ms) or t_ms < 0:
            raise TraceFormatError(
                f"time must be finite and >= 0: {t_text!r}", path=name, line=line, field="time_ms"
            )
        if t_ms < last_ms:
            raise TraceFormatError(
                f"time {t_text} ms is before the previous line's",
                path=name,
                line=line,
                field="time_ms",
            )
        event = event.lower()
        if event == "add":
            if node in alive:
                raise TraceFormatError(
                    f"node {node!r} added while alive", path=name, line=line, field="node"
                )
            alive.add(node)
        elif event == "remove":
            if node not in alive:
                raise TraceFormatError(
                    f"node {node!r} removed while not alive", path=name, line=line, field="node"
                )
            alive.discard(node)
        else:
            raise TraceFormatError(
                f"event must be add or remove, got {event!r}", path=name, line=line, field="event"
            )
        t_s = t_ms / 1000.0
        if not times or t_ms > last_ms:
            times.append(t_s)
            added.append(0)
            preempted.append(0)
            capacity.append(0)
            instances.append(frozenset())
        if event == "add":
            added[-1] += 1
        else:
            preempted[-1] += 1
        capacity[-1] = len(alive)
        instances[-1] = frozenset(alive)
        last_ms = t_ms
    return AvailabilityTrace(
        name,
        EVENT_TRACE,
        tuple(times),
        tuple(capacity),
        tuple(added),
        tuple(preempted),
        tuple(instances),
    )


def _parse_counts(name: str, lines: list[tuple[int, str]]) -> AvailabilityTrace:
    stack: list[tuple[datetime, int]] = []  # retained samples, time increasing
    for line, raw in lines:
        day, clock, count_text = _cells(name, line, raw, _COUNT_HEADER)
        try:
            when = datetime.fromisoformat(f"{day} {clock}").replace(tzinfo=UTC)
        except ValueError:
            field_name = "date"
            try:
                date.fromisoformat(day)
                field_name = "time"
            except ValueError:
                pass
            raise TraceFormatError(
                f"bad date/time {day!r} {clock!r}", path=name, line=line, field=field_name
            ) from None
        if not count_text.isdigit():
            raise TraceFormatError(
                f"count must be an integer >= 0, got {count_text!r}",
                path=name,
                line=line,
                field="count",
            )
        while stack and stack[-1][0] >= when:
            stack.pop()  # this line overrides earlier lines from its time on
        stack.append((when, int(count_text)))
    origin = stack[0][0]
    times: list[float] = []
    capacity: list[int] = []
    added: list[int] = []
    preempted: list[int] = []
    before = 0
    for when, count in stack:
        if times and count == before:
            continue
        times.append((when - origin).total_seconds())
        capacity.append(count)
        added.append(max(0, count - before))
        preempted.append(max(0, before - count))
        before = count
    return AvailabilityTrace(
        name, COUNT_TRACE, tuple(times), tuple(capacity), tuple(added), tuple(preempted), None
    )


# --------------------------------------------------------------------------------------------
# Spot interruption hazard (AWS Spot Instance Advisor)
# --------------------------------------------------------------------------------------------


def band_hazard_per_hour(label: str) -> float:
    """Per-instance-hour preemption hazard of an advisor interruption band.

    With ``f`` = :data:`INTERRUPTION_BAND_FRACTIONS` [label] read as the probability that an
    instance running for a month (:data:`HOURS_PER_MONTH`) is interrupted, and a constant
    hazard: ``lambda = -ln(1 - f) / 720``. ``<5%`` gives 3.5e-5/h (mean life ~3.3 years),
    ``>20%`` 4.0e-4/h (~104 days).
    """
    fraction = INTERRUPTION_BAND_FRACTIONS.get(label.strip())
    if fraction is None:
        raise InvalidInputError(
            f"unknown interruption band {label!r}; known: {', '.join(INTERRUPTION_BAND_FRACTIONS)}",
            field="interruption_frequency_label",
        )
    return -math.log1p(-fraction) / HOURS_PER_MONTH


@dataclass(frozen=True)
class InterruptionBand:
    """The advisor's figures for one (region, instance type)."""

    region: str
    instance_type: str
    label: str
    savings_vs_ondemand_pct: float
    source_date: str

    @property
    def monthly_fraction(self) -> float:
        return INTERRUPTION_BAND_FRACTIONS[self.label]

    @property
    def hazard_per_hour(self) -> float:
        return band_hazard_per_hour(self.label)


@dataclass(frozen=True)
class SpotHazardModel:
    """Spot preemptions as a constant per-instance hazard from the advisor's bands.

    ``bands`` maps ``(region, instance_type)`` to its band. An offering with no band uses
    ``default_band`` (a label such as ``"5-10%"``) or, if that is ``None``, is an error. The
    on-demand market has hazard 0.
    """

    bands: Mapping[tuple[str, str], InterruptionBand]
    seed: int = 0
    default_band: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bands", MappingProxyType(dict(self.bands)))
        if self.default_band is not None:
            band_hazard_per_hour(self.default_band)

    def hazard_per_hour(self, offering: PricedOffering | MarketOffering) -> float:
        """Preemptions per instance-hour of ``offering`` on the spot market (0 for a
        :class:`MarketOffering` on the on-demand market)."""
        if isinstance(offering, MarketOffering):
            if offering.market == ON_DEMAND:
                return 0.0
            offering = offering.offering
        band = self.bands.get((offering.region, offering.instance_type))
        if band is not None:
            return band.hazard_per_hour
        if self.default_band is None:
            raise InvalidInputError(
                f"no interruption band for {offering.instance_type} in {offering.region} "
                "(give default_band)",
                field="instance_type",
            )
        return band_hazard_per_hour(self.default_band)

    def survival(self, offering: PricedOffering | MarketOffering, duration_s: float) -> float:
        """Probability that an instance lives ``duration_s`` without preemption."""
        if not (math.isfinite(duration_s) and duration_s >= 0):
            raise InvalidInputError("duration must be finite and >= 0", field="duration_s")
        return math.exp(-self.hazard_per_hour(offering) * duration_s / 3600.0)

    def sample_preemption_s(
        self, offering: PricedOffering | MarketOffering, instance_id: str, launched_at_s: float
    ) -> float:
        """When the instance ``instance_id`` launched at ``launched_at_s`` is preempted.

        An exponential draw with the offering's hazard, from a generator seeded by
        (``seed``, ``instance_id``): the same arguments always give the same time, and
        different instances get independent draws. ``math.inf`` when the hazard is 0.
        """
        if not instance_id:
            raise InvalidInputError("instance id must not be empty", field="instance_id")
        if not math.isfinite(launched_at_s):
            raise InvalidInputError("launch time must be finite", field="launched_at_s")
        rate = self.hazard_per_hour(offering)
        if rate <= 0:
            return math.inf
        u = random.Random(seed_int(self.seed, instance_id)).random()
        return launched_at_s - math.log1p(-u) / rate * 3600.0


def load_hazard_model(
    path: str | Path | None = None, *, seed: int = 0, default_band: str | None = None
) -> SpotHazardModel:
    """A :class:`SpotHazardModel` from an advisor CSV (default: the shipped
    ``aws_spot_advisor_gpu.csv``; columns ``region,instance_type,savings_vs_ondemand_pct,
    interruption_frequency_label,source_commit_date``). Bad rows and duplicate (region, type)
    pairs are a :class:`TraceFormatError` naming file, line and field."""
    f = CsvFile(prices_dir() / _SPOT_ADVISOR_FILE if path is None else Path(path))
    columns = (
        "region",
        "instance_type",
        "savings_vs_ondemand_pct",
        "interruption_frequency_label",
        "source_commit_date",
    )
    bands: dict[tuple[str, str], InterruptionBand] = {}
    lines: dict[tuple[str, str], int] = {}
    for line, row in f.rows(columns):
        key = (f.text(row, line, "region"), f.text(row, line, "instance_type"))
        label = f.text(row, line, "interruption_frequency_label")
        if label not in INTERRUPTION_BAND_FRACTIONS:
            raise f.error(
                f"unknown interruption band {label!r}", line, "interruption_frequency_label"
            )
        savings_text = f.text(row, line, "savings_vs_ondemand_pct")
        try:
            savings = float(savings_text)
        except ValueError:
            raise f.error(
                f"not a number: {savings_text!r}", line, "savings_vs_ondemand_pct"
            ) from None
        if key in lines:
            raise DuplicateOfferingError(
                f"duplicate advisor row for {key[1]} in {key[0]} (first at {f.name}:{lines[key]})",
                path=f.name,
                line=line,
                other_path=f.name,
                other_line=lines[key],
                field="instance_type",
            )
        lines[key] = line
        bands[key] = InterruptionBand(
            key[0], key[1], label, savings, f.text(row, line, "source_commit_date")
        )
    return SpotHazardModel(bands, seed=seed, default_band=default_band)
