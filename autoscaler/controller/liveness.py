"""Agent liveness judged on evidence the judge gathered while it was itself running.

An agent's silence is the time since its last heartbeat *during which the controller was
running*: a controller that was stopped (SIGSTOP, a long GC pause, a VM live migration, a
suspended laptop, a restart) could hear no heartbeat, so the time it was away never counts
against an agent. The controller keeps its own record of when it was away
(:class:`AwakeLog`: a gap longer than ``stall_gap_s`` between two of its own notes of being
alive is a stall; the time before it started is one too), and :func:`silence_s` subtracts
those stalls from an agent's silence. After a stall ends, every agent therefore has the whole
heartbeat timeout again to be heard: that is the grace after a gap.

The second rule is :func:`mass_silence`: when many instances look dead at once, suspect the
controller's view first (a partition, an API that stopped serving, a stall it did not see),
as Kubernetes' node lifecycle controller stops evicting pods when a large share of a zone's
nodes turns unready at once. The thresholds are :class:`~autoscaler.controller.reconcile.
ReconcileConfig` fields with stated defaults.

Everything here is pure but :class:`AwakeLog`, a small thread-safe recorder that takes its
times from its caller (no clock of its own).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Final

__all__ = ["MAX_STALLS", "AwakeLog", "Stall", "mass_silence", "silence_s"]

Stall = tuple[float, float]
"""``(start_s, end_s)``: a time span (the clock's ``now_s``) in which the controller was not
running; ``start_s`` may be ``-inf`` (before it started)."""

MAX_STALLS: Final = 256
"""The stalls an :class:`AwakeLog` keeps; beyond it the two oldest are merged into one span
(the awake time between them then counts as a stall too: the log errs towards leniency,
never towards judging an agent dead)."""


def silence_s(since_s: float, now_s: float, stalls: Sequence[Stall]) -> float:
    """The time in ``[since_s, now_s]`` during which the controller was running: the span's
    length less its overlap with every stall (stalls may overlap one another: the union is
    subtracted). ``0`` when ``now_s <= since_s``."""
    if not now_s > since_s:
        return 0.0
    away = 0.0
    covered = since_s  # the union of the stalls is walked in start order
    for start, end in sorted(stalls):
        lo = max(start, covered)
        hi = min(end, now_s)
        if hi > lo:
            away += hi - lo
            covered = hi
        if covered >= now_s:
            break
    return max(0.0, (now_s - since_s) - away)


def mass_silence(dead: int, population: int, *, fraction: float, min_instances: int) -> bool:
    """Whether ``dead`` of ``population`` instances judged dead in one round is too many to
    believe: at least ``min_instances`` of them and at least ``fraction`` of the population.
    (Kubernetes' node lifecycle controller calls a zone partially disrupted at more than two
    unready nodes and a 0.55 share, and then slows or stops its evictions.)"""
    if dead <= 0 or population <= 0:
        return False
    return dead >= min_instances and dead >= fraction * population


class AwakeLog:
    """The controller's record of when it was running. :meth:`note` is called with the time
    whenever the controller is seen alive (each round, and a ticker thread of the service
    every second or so); a gap longer than ``stall_gap_s`` between two notes is recorded as a
    stall. The span before ``started_s`` is a stall too (a restarted controller heard nothing
    while it was away). ``stall_gap_s`` ``None``: only that first stall is ever recorded (a
    controller driven by someone else's rounds, e.g. the simulator's, has no ticker)."""

    def __init__(self, started_s: float, stall_gap_s: float | None = None) -> None:
        if stall_gap_s is not None and not (stall_gap_s > 0 and math.isfinite(stall_gap_s)):
            raise ValueError(f"stall_gap_s must be a finite number > 0, got {stall_gap_s!r}")
        self.started_s = started_s
        self.stall_gap_s = stall_gap_s
        self._last_s = started_s
        self._stalls: list[Stall] = [(-math.inf, started_s)]
        self._lock = threading.Lock()

    def note(self, at_s: float) -> Stall | None:
        """The controller is running at ``at_s``; the stall this note ends, if any."""
        with self._lock:
            last, self._last_s = self._last_s, max(self._last_s, at_s)
            if self.stall_gap_s is None or not at_s - last > self.stall_gap_s:
                return None
            stall = (last, at_s)
            self._stalls.append(stall)
            if len(self._stalls) > MAX_STALLS:  # merge the two oldest after the first
                (a, _), (_, b) = self._stalls[1], self._stalls[2]
                self._stalls[1:3] = [(a, b)]
            return stall

    def stalls(self) -> tuple[Stall, ...]:
        """Every stall recorded, oldest first (the span before the start included)."""
        with self._lock:
            return tuple(self._stalls)
