"""The simulated world's own truths, separate from the decision model's beliefs.

``SimConfig.world`` names the world a run replays (:data:`WORLDS`):

- ``"ideal"``: the world the Pollux paper's simulator assumed, kept for the comparison with
  its published figures: a restart costs exactly the policies' ``restart_delay_s``, trainers
  report exact gradient statistics and step times, and (in cloud runs) every instance boots
  in the sizing's ``provisioning_delay_s``;
- ``"measured"``: each of those drawn from its own measurements instead, each with a stated
  source: restarts from our trainer's measured restarts scaled by each model's checkpoint
  size (:mod:`autoscaler.sim.restart`), report noise from our trainer's estimator and
  profiler on the calibration model that trains as the application does (SGD or Adam;
  :mod:`autoscaler.sim.report_noise`), and in cloud runs boots from public start-up
  measurements (:mod:`autoscaler.sim.boot`; :func:`autoscaler.sim.experiments.build_run`)
  and spot preemptions from the availability traces where one is given;
- ``"measured-restarts"`` and ``"measured-reports"``: the ideal world with one measured truth
  each (the restarts; the reports' noise), to say how far each moves a figure (ablations:
  boots stay the sizing's in both).

``SimConfig.speed_error`` (either world): each (application, GPU type) pair whose true speed
is derived from the speed table (no trace measured on that type) runs at the table's ratio
times a factor drawn uniformly within ``1 +- speed_error``, seeded by the run's seed and the
pair, so the policies' type estimates (which read the table) are off by up to that much.

Everything here is seeded from the run's seed: the same config gives the same world.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from autoscaler.errors import InvalidInputError
from autoscaler.sim.report_noise import ReportNoise, load_report_noise
from autoscaler.sim.restart import RestartTimes, load_restart_times

__all__ = [
    "IDEAL",
    "MAX_SPEED_ERROR",
    "MEASURED",
    "MEASURED_REPORTS",
    "MEASURED_RESTARTS",
    "WORLDS",
    "WorldTruths",
    "check_speed_error",
]

IDEAL: Final = "ideal"
MEASURED: Final = "measured"
MEASURED_RESTARTS: Final = "measured-restarts"
MEASURED_REPORTS: Final = "measured-reports"
WORLDS: tuple[str, ...] = (IDEAL, MEASURED, MEASURED_RESTARTS, MEASURED_REPORTS)
#: The calibration models (``autoscaler/data/noise``) whose spreads a measured world's reports
#: carry: the tiny BERT trained with AdamW (preconditioned gradient statistics) for
#: applications trained with Adam, the MLP trained with SGD for the others.
PRECONDITIONED_MODEL: Final = "bert"
UNPRECONDITIONED_MODEL: Final = "mlp"
_EXACT: Final = ReportNoise.none()
#: A speed error of 1 would allow a type that does not run at all.
MAX_SPEED_ERROR: Final = 0.9


def check_speed_error(value: float) -> float:
    """``value`` if it is a valid ``speed_error`` (finite, in ``[0, MAX_SPEED_ERROR]``)."""
    if not (math.isfinite(value) and 0.0 <= value <= MAX_SPEED_ERROR):
        raise InvalidInputError(
            f"speed_error must be in [0, {MAX_SPEED_ERROR}], got {value!r}", field="speed_error"
        )
    return value


@dataclass
class WorldTruths:
    """The truths of one simulation (see the module docstring); built once per run by
    :meth:`build`. ``restart``: the measured restart times (and each application's model),
    ``None`` in the ideal world; ``restarts_measured``: whether restarts are drawn from them
    (false in ``"measured-reports"``); ``noises``: the reports' measurement noise by whether
    the application's optimizer is preconditioned (:meth:`noise`; empty, exact, in the ideal
    and ``"measured-restarts"`` worlds), drawn from ``rng`` (seeded by the run's seed, apart
    from the restarts' draws)."""

    world: str
    seed: int
    speed_error: float
    restart: RestartTimes | None
    noises: Mapping[bool, ReportNoise] = field(default_factory=dict)
    restarts_measured: bool = True
    rng: random.Random = field(init=False, repr=False)  # the report noise's draws

    def __post_init__(self) -> None:
        self.rng = random.Random(f"report-noise:{self.seed}")

    @classmethod
    def build(cls, world: str, seed: int, speed_error: float = 0.0) -> WorldTruths:
        if world not in WORLDS:
            raise InvalidInputError(
                f"world must be one of {', '.join(WORLDS)}, got {world!r}", field="world"
            )
        check_speed_error(speed_error)
        if world == IDEAL:
            return cls(world, seed, speed_error, None)
        noises: dict[bool, ReportNoise] = {}
        if world in (MEASURED, MEASURED_REPORTS):
            noises = {
                False: load_report_noise(model=UNPRECONDITIONED_MODEL),
                True: load_report_noise(model=PRECONDITIONED_MODEL),
            }
        restarts = load_restart_times(seed)
        return cls(world, seed, speed_error, restarts, noises, world != MEASURED_REPORTS)

    def noise(self, application: str) -> ReportNoise:
        """The measurement noise of a job of ``application``'s reports: exact in the ideal
        world; in the measured one our estimator's spread on the calibration model that
        trains as it does (:data:`PRECONDITIONED_MODEL` for an Adam-trained application,
        :data:`UNPRECONDITIONED_MODEL` otherwise; ``autoscaler/data/restart/models.csv`` says
        which optimizer each application trains with)."""
        if not self.noises:
            return _EXACT
        model = None if self.restart is None else self.restart.models.get(application)
        return self.noises[model is not None and model.preconditioned]

    def restart_s(self, application: str, planned_s: float) -> float:
        """How long a job of ``application`` makes no progress after a (re)start: the
        policies' ``planned_s`` in the ideal and ``"measured-reports"`` worlds, a measured draw
        otherwise."""
        if self.restart is None or not self.restarts_measured:
            return planned_s
        return self.restart.draw_s(application)

    def speed_factor(self, application: str, gpu_type: str) -> float:
        """The factor on the speed table's ratio of ``application`` on ``gpu_type`` (1 without
        a speed error); the same pair always gets the same factor in a run."""
        if self.speed_error == 0.0:
            return 1.0
        rng = random.Random(f"speed:{self.seed}:{application}:{gpu_type}")
        return rng.uniform(1.0 - self.speed_error, 1.0 + self.speed_error)
