"""What each job cost: instances' billed cost split by the GPU-time jobs held on them.

Pure. An instance's cost record (``[start_s, end_s]`` at its price, billed per second with the
provider minimum) is spread evenly over its life and its GPUs: each job pays for the
GPU-seconds it held on the instance (its assignment spans) at that rate; GPU-seconds no job
held are ``IDLE``. The parts of every record sum to its cost, so the jobs and ``IDLE``
together sum to the fleet's total.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from autoscaler.controller.store import AssignmentSpan, CostRecordRow

__all__ = ["IDLE", "job_costs"]

IDLE: Final = "(idle)"
"""The share of a fleet's cost no job held."""


def job_costs(
    records: Iterable[CostRecordRow],
    spans: Sequence[AssignmentSpan],
    gpus_of: Mapping[str, int],
    now_s: float,
) -> dict[str, float]:
    """USD per job (and :data:`IDLE`), from ``records`` split by ``spans`` (see the module
    docstring); ``gpus_of`` gives each instance's GPU count, ``now_s`` closes open spans."""
    by_instance: dict[str, list[AssignmentSpan]] = {}
    for span in spans:
        by_instance.setdefault(span.instance_key, []).append(span)
    out: dict[str, float] = {}
    for rec in records:
        life = rec.end_s - rec.start_s
        gpus = gpus_of.get(rec.instance_key, 0)
        attributed = 0.0
        if life > 0 and gpus > 0:
            per_gpu_second = rec.usd / (life * gpus)  # the minimum spread over its life
            for span in by_instance.get(rec.instance_key, ()):
                end = now_s if span.to_s is None else span.to_s
                overlap = min(end, rec.end_s) - max(span.from_s, rec.start_s)
                if overlap > 0:
                    share = overlap * span.gpus * per_gpu_second
                    out[span.job_name] = out.get(span.job_name, 0.0) + share
                    attributed += share
        out[IDLE] = out.get(IDLE, 0.0) + rec.usd - attributed
    return out
