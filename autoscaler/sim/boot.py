"""The simulated world's boot times: how long a launched instance takes to run a job.

A world parameter, not the model's: the fleet sizing believes ``SizingConfig.
provisioning_delay_s`` (120 s); the world boots each instance in a time drawn from
:class:`BootTimes`, a log-normal per provider and instance size whose median and 95th
percentile come from ``autoscaler/data/boot/boot_times.csv`` (its README gives the public
measurements they rest on, and which part is our estimate). Each instance's boot is drawn
once, at its launch, from a seeded generator: the same seed gives the same boots.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from autoscaler.errors import InvalidInputError
from providers.base import Offering

__all__ = ["BOOT_TIMES_CSV", "BootQuantiles", "BootTimes", "load_boot_times"]

BOOT_TIMES_CSV: Final = "boot_times.csv"
_Z95: Final = 1.6448536269514722  # the standard normal's 95th percentile


@dataclass(frozen=True)
class BootQuantiles:
    """One row of the table: instances of ``provider`` with up to ``max_gpus`` GPUs boot in
    ``median_s`` at the median and ``p95_s`` at the 95th percentile (``p95_s >= median_s >
    0``)."""

    provider: str
    max_gpus: int
    median_s: float
    p95_s: float

    def __post_init__(self) -> None:
        if not (0 < self.median_s <= self.p95_s and math.isfinite(self.p95_s)):
            raise InvalidInputError(
                f"boot times need 0 < median <= p95, got {self.median_s}, {self.p95_s}",
                field="boot_times",
            )
        if self.max_gpus < 1:
            raise InvalidInputError("max_gpus must be >= 1", field="boot_times")

    @property
    def sigma(self) -> float:
        """The log-normal's shape: ``ln(p95 / median) / z_0.95``."""
        return math.log(self.p95_s / self.median_s) / _Z95


@dataclass
class BootTimes:
    """Draws each instance's boot (see the module docstring). ``rows`` by provider, each
    list sorted by ``max_gpus``; an instance takes the smallest row that fits its GPUs (the
    largest when none does). A provider the table lacks boots like the table's slowest
    median row of that size. Not thread-safe (one world)."""

    rows: Mapping[str, tuple[BootQuantiles, ...]]
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.rows or not all(self.rows.values()):
            raise InvalidInputError("boot times need at least one row", field="boot_times")
        self._rng = random.Random(f"boot:{self.seed}")

    def quantiles(self, provider: str, gpus: int) -> BootQuantiles:
        """The row that applies to an instance of ``provider`` with ``gpus`` GPUs."""
        options = self.rows.get(provider)
        if options is None:
            fits = [_fit(rows, gpus) for rows in self.rows.values()]
            return max(fits, key=lambda q: q.median_s)
        return _fit(options, gpus)

    def draw_s(self, offering: Offering) -> float:
        """One boot, in seconds, for a new instance of ``offering``."""
        q = self.quantiles(offering.provider, offering.gpus)
        return q.median_s * math.exp(q.sigma * self._rng.gauss(0.0, 1.0))


def _fit(rows: tuple[BootQuantiles, ...], gpus: int) -> BootQuantiles:
    return next((q for q in rows if gpus <= q.max_gpus), rows[-1])


def load_boot_times(seed: int = 0, text: str | None = None) -> BootTimes:
    """The table shipped in ``autoscaler/data/boot`` (or ``text``, the same CSV format:
    ``provider,max_gpus,median_s,p95_s``), drawing with ``seed``."""
    if text is None:
        path = Path(__file__).resolve().parents[1] / "data" / "boot" / BOOT_TIMES_CSV
        text = path.read_text(encoding="utf-8")
    by: dict[str, list[BootQuantiles]] = {}
    try:
        for r in csv.DictReader(text.splitlines()):
            q = BootQuantiles(
                r["provider"].strip(), int(r["max_gpus"]), float(r["median_s"]), float(r["p95_s"])
            )
            by.setdefault(q.provider, []).append(q)
    except (KeyError, ValueError) as e:
        raise InvalidInputError(f"bad boot-times table: {e}", field="boot_times") from e
    return BootTimes({p: tuple(sorted(v, key=lambda q: q.max_gpus)) for p, v in by.items()}, seed)
