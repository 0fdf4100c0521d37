"""The simulated world's measurement noise: how far a trainer's report strays from the truth.

A world parameter, not the model's: a real trainer's gradient statistics are a smoothed
estimate (``trainer.gns.GradientNoiseEstimator``, an EMA of unbiased per-step estimates) and its
profiled step time is a mean over the steps recorded so far (``trainer.metrics.StepProfiler``),
so both scatter around the truth by an amount that shrinks with the number of measurements
behind them. :class:`ReportNoise` holds that scatter, the relative standard deviation
(sd / mean) per quantity at a few measurement counts ``n``, as measured on our own trainer by
``benchmarks/report_noise.py`` (2 processes, gloo, CPU, the examples' models; the file and the
command that regenerates it are in ``autoscaler/data/noise``, whose README gives the caveats; at
each ``n`` the table holds the larger spread of the two models measured there).
Between two measured ``n`` the spread is interpolated linearly in ``log n``; outside them it is
clamped to the nearest end (beyond the largest ``n`` the trainer's EMA has forgotten its oldest
measurements, so the spread stays at its plateau).

:meth:`ReportNoise.noisy` draws one reading from a seeded generator. The distributions, and why:

* ``grad_var``, ``step_s``, ``noise_scale``: positive quantities, multiplicative log-normal with
  its mean kept at the truth (``value * exp(s Z - s^2/2)``, ``s^2 = ln(1 + r^2)``): the
  estimators are unbiased, and the readings of ``grad_var`` and of step times were never <= 0 in
  the calibration runs (``frac_nonpositive`` in the data). A log-normal keeps them > 0 and
  matches the data's mean and sd; its tails are those of the MLP's readings (whose ``sd_log`` is
  close to ``s``), lighter than those of the BERT's preconditioned ``grad_var`` (see the README).
* ``grad_sqr``: normal, ``value * (1 + r Z)``: the trainer's estimate ``|m_B|^2 - sigma2 / B`` is
  unbiased and not clamped, and with one measurement it did come out <= 0 (``frac_nonpositive``
  in the data; ``trainer.report.GradientStats`` allows it and ``autoscaler.model.goodput`` reads
  ``grad_sqr <= 0`` as noise-dominated), so a reading may be <= 0 where the spread is large.

:meth:`ReportNoise.none` is the ideal world's: every reading is the truth, and no random number
is drawn (the world's other streams stay as they were).
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from autoscaler.errors import InvalidInputError

__all__ = [
    "MAX_MEASUREMENTS",
    "QUANTITIES",
    "REPORT_NOISE_JSON",
    "NoiseCurve",
    "ReportNoise",
    "load_report_noise",
    "report_noise_from",
]

REPORT_NOISE_JSON: Final = "report_noise.json"
QUANTITIES: Final = ("grad_sqr", "grad_var", "noise_scale", "step_s")
"""What a report carries that noise applies to: the gradient statistics (at the initial batch
size), the noise scale derived from them, and the profiled step time."""
MAX_MEASUREMENTS: Final = 10**12
"""Largest measurement count accepted (any real job's is far below)."""
MAX_RELATIVE_SD: Final = 100.0
"""Largest relative spread a table may hold (a guard against a corrupt file)."""
_LOGNORMAL: Final = frozenset({"grad_var", "noise_scale", "step_s"})


@dataclass(frozen=True)
class NoiseCurve:
    """Relative sd ``relative_sd[i]`` of a reading that rests on ``n[i]`` measurements.
    ``n`` strictly increasing, >= 1; each spread finite and in ``[0, MAX_RELATIVE_SD]``."""

    n: tuple[int, ...]
    relative_sd: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.n or len(self.n) != len(self.relative_sd):
            raise InvalidInputError(
                "a noise curve needs as many spreads as measurement counts, at least one",
                field="report_noise",
            )
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.n):
            raise InvalidInputError("measurement counts must be integers >= 1", field="n")
        if any(b <= a for a, b in zip(self.n, self.n[1:], strict=False)):
            raise InvalidInputError("measurement counts must increase", field="n")
        for r in self.relative_sd:
            if not (isinstance(r, (int, float)) and math.isfinite(r) and 0 <= r <= MAX_RELATIVE_SD):
                raise InvalidInputError(
                    f"relative sd {r!r} is not in [0, {MAX_RELATIVE_SD}]", field="relative_sd"
                )

    def at(self, measurements: int) -> float:
        """The spread at ``measurements`` (interpolated in ``log n``, clamped at the ends)."""
        if measurements <= self.n[0]:
            return float(self.relative_sd[0])
        if measurements >= self.n[-1]:
            return float(self.relative_sd[-1])
        i = bisect.bisect_right(self.n, measurements)
        n0, n1 = self.n[i - 1], self.n[i]
        r0, r1 = self.relative_sd[i - 1], self.relative_sd[i]
        t = (math.log(measurements) - math.log(n0)) / (math.log(n1) - math.log(n0))
        return float(r0 + t * (r1 - r0))


@dataclass(frozen=True)
class ReportNoise:
    """The world's report noise: one :class:`NoiseCurve` per quantity of :data:`QUANTITIES`
    (all of them), and where it came from (``source``: the command that measured it, or
    ``"exact"``). Immutable; drawing needs a generator the caller owns (see :func:`noisy`)."""

    curves: Mapping[str, NoiseCurve]
    source: str = ""

    def __post_init__(self) -> None:
        missing = [q for q in QUANTITIES if q not in self.curves]
        extra = [q for q in self.curves if q not in QUANTITIES]
        if missing or extra:
            raise InvalidInputError(
                f"report noise needs exactly {', '.join(QUANTITIES)}: missing {missing}, "
                f"unknown {extra}",
                field="report_noise",
            )

    @classmethod
    def none(cls) -> ReportNoise:
        """The ideal world: every reading is the truth (spread 0 everywhere)."""
        return cls({q: NoiseCurve((1,), (0.0,)) for q in QUANTITIES}, source="exact")

    @property
    def exact(self) -> bool:
        """True when every spread is 0 (readings are the truth, nothing is drawn)."""
        return all(r == 0 for c in self.curves.values() for r in c.relative_sd)

    def relative_sd(self, quantity: str, measurements: int) -> float:
        """Relative sd (sd / mean) of a ``quantity`` reading that rests on ``measurements``
        measurements (gradient statistics: the estimator's updates, the report's
        ``GradientStats.measurements``; ``step_s``: the profile's recorded ``steps``).
        Raises :class:`InvalidInputError` for an unknown quantity or a count outside
        ``[1, MAX_MEASUREMENTS]``."""
        return self._curve(quantity).at(_check_measurements(measurements))

    def noisy(
        self,
        rng: np.random.Generator | random.Random,
        value: float,
        quantity: str,
        measurements: int,
    ) -> float:
        """What a trainer reports for the true ``value`` of ``quantity`` when its reading
        rests on ``measurements`` measurements: log-normal (mean kept) for the positive
        quantities, normal for ``grad_sqr`` (see the module docstring), with sd
        ``relative_sd(quantity, measurements) * value``. Draws exactly one standard normal from
        ``rng`` (a ``numpy.random.Generator`` or a ``random.Random``), none when the spread is
        0: the same seed gives the same readings. ``value`` must be finite, and > 0 for all but
        ``grad_sqr`` (:class:`InvalidInputError` otherwise)."""
        if self._curve(quantity).at(_check_measurements(measurements)) == 0:
            return self.reading(value, quantity, measurements, 0.0)
        return self.reading(value, quantity, measurements, _standard_normal(rng))

    def reading(self, value: float, quantity: str, measurements: int, z: float) -> float:
        """:meth:`noisy`'s reading at a given standard normal ``z`` (the caller draws it:
        a world whose readings are correlated over time keeps its own ``z`` per stream)."""
        curve = self._curve(quantity)
        n = _check_measurements(measurements)
        if not math.isfinite(z):
            raise InvalidInputError("z must be finite", field="z")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInputError(f"{quantity} must be a number", field=quantity)
        value = float(value)
        if not math.isfinite(value):
            raise InvalidInputError(f"{quantity} {value} is not finite", field=quantity)
        if quantity in _LOGNORMAL and not value > 0:
            raise InvalidInputError(f"{quantity} must be > 0, got {value}", field=quantity)
        r = curve.at(n)
        if r == 0:
            return value
        if quantity in _LOGNORMAL:
            s2 = math.log1p(r * r)
            return value * math.exp(math.sqrt(s2) * z - s2 / 2)
        return value * (1.0 + r * z)

    def _curve(self, quantity: str) -> NoiseCurve:
        curve = self.curves.get(quantity)
        if curve is None:
            raise InvalidInputError(
                f"unknown quantity {quantity!r}: one of {', '.join(QUANTITIES)}", field="quantity"
            )
        return curve


def _standard_normal(rng: np.random.Generator | random.Random) -> float:
    if isinstance(rng, random.Random):
        return rng.gauss(0.0, 1.0)
    if isinstance(rng, np.random.Generator):
        return float(rng.standard_normal())
    raise InvalidInputError("rng must be a numpy.random.Generator or a random.Random", field="rng")


def _check_measurements(measurements: int) -> int:
    if isinstance(measurements, bool) or not isinstance(measurements, (int, np.integer)):
        raise InvalidInputError("measurements must be an integer", field="measurements")
    if not 1 <= measurements <= MAX_MEASUREMENTS:
        raise InvalidInputError(
            f"measurements {measurements} is not in [1, {MAX_MEASUREMENTS}]",
            field="measurements",
        )
    return int(measurements)


def report_noise_from(
    data: Mapping[str, Any], source: str = "", model: str | None = None
) -> ReportNoise:
    """A :class:`ReportNoise` from the JSON of ``benchmarks/report_noise.py``: its
    ``calibration`` block (per quantity, ``n`` and ``relative_sd`` lists: per ``n`` the largest
    spread of the models measured), or with ``model`` that model's own spreads (its
    ``models.<model>.spread`` rows)."""
    try:
        if model is None:
            table = data["calibration"]
            curves = {
                q: NoiseCurve(
                    tuple(table[q]["n"]), tuple(float(r) for r in table[q]["relative_sd"])
                )
                for q in QUANTITIES
            }
        else:
            rows = data["models"][model]["spread"]
            curves = {
                q: NoiseCurve(
                    tuple(int(r["n"]) for r in rows[q]),
                    tuple(float(r["relative_sd"]) for r in rows[q]),
                )
                for q in QUANTITIES
            }
        command = str(data.get("command", "")) or source
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidInputError(f"bad report-noise file: {e!r}", field="report_noise") from e
    return ReportNoise(curves, source=command)


def load_report_noise(text: str | None = None, model: str | None = None) -> ReportNoise:
    """The calibration shipped in ``autoscaler/data/noise`` (or ``text``, the same JSON): the
    table over all models, or ``model``'s own spreads (see :func:`report_noise_from`)."""
    if text is None:
        path = Path(__file__).resolve().parents[1] / "data" / "noise" / REPORT_NOISE_JSON
        text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise InvalidInputError(f"report-noise file is not JSON: {e}", field="report_noise") from e
    if not isinstance(data, Mapping):
        raise InvalidInputError("report-noise file must hold a JSON object", field="report_noise")
    return report_noise_from(data, model=model)
