"""Injected clocks.

Every component that waits or reads the time takes a ``Clock``. Production code uses
``SystemClock``; tests use ``FakeClock``, whose ``sleep`` advances time instantly.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Source of time. ``now_s`` is wall-clock seconds since the epoch; ``sleep`` waits."""

    def now_s(self) -> float: ...

    def monotonic_s(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def now_s(self) -> float:
        return time.time()

    def monotonic_s(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A manual clock for tests: ``sleep`` and ``advance`` move time forward instantly.

    ``sleeps`` records every requested sleep, so tests can assert backoff schedules.
    """

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._now_s = float(start_s)
        self._mono_s = 0.0
        self.sleeps: list[float] = []

    def now_s(self) -> float:
        return self._now_s

    def monotonic_s(self) -> float:
        return self._mono_s

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now_s += seconds
        self._mono_s += seconds
