"""The simulated world's restart times: how long a job makes no progress when it restarts.

A world parameter, not the model's: the policies plan with ``SimConfig.restart_delay_s``
(30 s, the Pollux paper's simulator's figure); a ``measured`` world (:mod:`autoscaler.sim.
truths`) instead stops each restarted job for a time drawn from :class:`RestartTimes`:

    restart_s = overhead_s + state_bytes(application) * (save_s_per_byte + load_s_per_byte)

- ``overhead_s``: one of the restarts ``benchmarks/trainer_overhead.py`` measured on our
  trainer (real ``coadapt-launch`` / torchrun / gloo: SIGTERM, stop agreement, checkpoint,
  exit, a new launch, imports, rendezvous, restore, first step), less the checkpoint save and
  load it timed, drawn uniformly from those runs (the measured distribution as it is, no fit);
- the per-byte save and load times: the medians over the same runs of the checkpoint's size
  over its save and load times;
- ``state_bytes``: each application's model in float32 with its optimizer's state
  (``autoscaler/data/restart/models.csv``: parameters, optimizer copies, and the source of
  each count).

The files (``autoscaler/data/restart``, with a README that says how to regenerate them) are
the trainer on this project's CPU host, not a GPU node: no CUDA context or cuDNN warm-up is
in them, and the checkpoint goes to local disk, not object storage. Each restart is drawn
from a seeded generator: the same seed and the same sequence of restarts give the same times.
"""

from __future__ import annotations

import csv
import json
import math
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from autoscaler.errors import InvalidInputError

__all__ = [
    "MODELS_CSV",
    "RESTARTS_JSON",
    "ModelState",
    "RestartTimes",
    "load_restart_times",
]

RESTARTS_JSON: Final = "trainer_restart.json"
MODELS_CSV: Final = "models.csv"
_FLOAT32_BYTES: Final = 4
_DATA: Final = Path(__file__).resolve().parents[1] / "data" / "restart"


@dataclass(frozen=True)
class ModelState:
    """An application's checkpointed state: ``parameters`` float32 weights, ``copies`` times
    (the weights plus the optimizer's per-weight buffers: 2 for SGD with momentum, 3 for
    Adam), and the ``optimizer`` it trains with."""

    application: str
    parameters: int
    copies: int
    optimizer: str = "SGD"

    @property
    def preconditioned(self) -> bool:
        """Whether its optimizer scales each weight's step (Adam, AdamW): its gradient
        statistics are then the preconditioned ones."""
        return self.optimizer.lower() in ("adam", "adamw")

    def __post_init__(self) -> None:
        if self.parameters < 1 or not 1 <= self.copies <= 8:
            raise InvalidInputError(
                f"{self.application}: need parameters >= 1 and 1 <= copies <= 8",
                field="restart_models",
            )

    @property
    def state_bytes(self) -> float:
        return float(self.parameters * self.copies * _FLOAT32_BYTES)


@dataclass
class RestartTimes:
    """Draws restart times (see the module docstring). ``overheads_s``: the measured restarts
    less their checkpoint's save and load; ``save_s_per_byte``/``load_s_per_byte``: the
    measured rates; ``models``: by application (an application not listed restarts in the
    overhead alone, as a model of negligible size would). Not thread-safe (one world)."""

    overheads_s: tuple[float, ...]
    save_s_per_byte: float
    load_s_per_byte: float
    models: Mapping[str, ModelState]
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.overheads_s or not all(math.isfinite(x) and x >= 0 for x in self.overheads_s):
            raise InvalidInputError(
                "restart times need at least one finite overhead >= 0", field="restart_times"
            )
        for rate in (self.save_s_per_byte, self.load_s_per_byte):
            if not (math.isfinite(rate) and rate >= 0):
                raise InvalidInputError(
                    "checkpoint rates must be finite and >= 0", field="restart_times"
                )
        self._rng = random.Random(f"restart:{self.seed}")

    def checkpoint_s(self, application: str) -> float:
        """Seconds to save and then load ``application``'s state at the measured rates."""
        model = self.models.get(application)
        if model is None:
            return 0.0
        return model.state_bytes * (self.save_s_per_byte + self.load_s_per_byte)

    def draw_s(self, application: str) -> float:
        """One restart of a job of ``application``, in seconds."""
        return self._rng.choice(self.overheads_s) + self.checkpoint_s(application)


def _measured(text: str) -> tuple[tuple[float, ...], float, float]:
    """``trainer_overhead.py``'s JSON -> (overheads, save s/byte, load s/byte)."""
    try:
        data = json.loads(text)
        runs = [run for group in data["restart_runs"].values() for run in group]
        overheads = tuple(
            float(r["restart_s"]) - float(r["save_s"]) - float(r["load_s"]) for r in runs
        )
        save = statistics.median(float(r["save_s"]) / float(r["checkpoint_bytes"]) for r in runs)
        load = statistics.median(float(r["load_s"]) / float(r["checkpoint_bytes"]) for r in runs)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        raise InvalidInputError(f"bad trainer restart file: {e!r}", field="restart_times") from e
    except statistics.StatisticsError as e:
        raise InvalidInputError(
            "the trainer restart file has no runs", field="restart_times"
        ) from e
    return tuple(max(x, 0.0) for x in overheads), save, load


def _models(text: str) -> dict[str, ModelState]:
    out: dict[str, ModelState] = {}
    try:
        for r in csv.DictReader(text.splitlines()):
            m = ModelState(
                r["application"].strip(),
                int(r["parameters"]),
                int(r["copies"]),
                (r.get("optimizer") or "SGD").strip(),
            )
            out[m.application] = m
    except (KeyError, ValueError, AttributeError) as e:
        raise InvalidInputError(f"bad restart models table: {e!r}", field="restart_models") from e
    return out


def load_restart_times(
    seed: int = 0, *, restarts_text: str | None = None, models_text: str | None = None
) -> RestartTimes:
    """The measurements shipped in ``autoscaler/data/restart`` (or the given texts, in the
    same formats), drawing with ``seed``."""
    if restarts_text is None:
        restarts_text = (_DATA / RESTARTS_JSON).read_text(encoding="utf-8")
    if models_text is None:
        models_text = (_DATA / MODELS_CSV).read_text(encoding="utf-8")
    overheads, save, load = _measured(restarts_text)
    return RestartTimes(overheads, save, load, _models(models_text), seed)
