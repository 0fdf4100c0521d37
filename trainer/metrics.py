"""Step-time profiling per configuration: wall time split into compute and exposed sync.

For each optimizer step the profiler gets three host timestamps, none of which needs a device
synchronisation:

* ``begin``: the step's first micro-batch is handed to the user (or the previous step's end, if
  the two steps are contiguous, so that data loading between steps is counted);
* ``last bucket ready``: DDP's communication hook is called for the last gradient bucket, i.e.
  the backward pass has produced every gradient;
* ``end``: ``optimizer.step()`` is called after the backward pass returned (DDP has waited for
  every all-reduce by then).

``sync_s = end - last_bucket`` is the gradient synchronisation not hidden behind compute;
``compute_s = step_s - sync_s``. On CPU these are exact. On CUDA the host runs ahead of the
device, so per-step splits are approximate; the mean ``step_s`` over many steps is still right
because the host cannot run more than a few steps ahead.

Entries are keyed by (nodes, replicas, local batch size, accumulation steps); the first
``warmup_steps`` steps after each change of key are not recorded. Thread-safe: the reporter
thread takes snapshots while the training thread records.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from coadapt_common.clock import Clock, SystemClock
from trainer.report import ProfileEntry


@dataclass(frozen=True)
class ProfileKey:
    num_nodes: int
    num_replicas: int
    local_batch_size: int
    accum_steps: int


@dataclass
class _Sums:
    steps: int = 0
    step_s: float = 0.0
    sync_s: float = 0.0


class StepProfiler:
    """Accumulates per-configuration step timings (see module docstring)."""

    def __init__(self, clock: Clock | None = None, *, warmup_steps: int = 2) -> None:
        self._clock = clock or SystemClock()
        self._warmup_steps = warmup_steps
        self._lock = threading.Lock()
        self._sums: dict[ProfileKey, _Sums] = {}
        self._key: ProfileKey | None = None
        self._since_change = 0
        self._prev_end: float | None = None
        self._begin: float | None = None
        self._last_bucket: float | None = None
        self._recent_s: float | None = None

    def break_chain(self) -> None:
        """The next step does not follow the previous one directly (new epoch, restore)."""
        self._prev_end = None

    def begin_step(self) -> None:
        """Called when a step's first micro-batch is handed out."""
        now = self._clock.monotonic_s()
        self._begin = self._prev_end if self._prev_end is not None else now
        self._last_bucket = None

    def mark_last_bucket(self) -> None:
        """Called from the communication hook of the last gradient bucket."""
        self._last_bucket = self._clock.monotonic_s()

    def end_step(self, key: ProfileKey, *, record: bool = True) -> None:
        """Called at the optimizer step, after the backward pass returned. ``record=False``
        for atypical steps (a partial last batch, a measurement split) that only advance the
        clock."""
        now = self._clock.monotonic_s()
        begin = self._begin if self._begin is not None else now
        sync = now - self._last_bucket if self._last_bucket is not None else 0.0
        self._prev_end = now
        self._begin = None
        took = now - begin
        self._recent_s = took if self._recent_s is None else 0.8 * self._recent_s + 0.2 * took
        if key != self._key:
            self._key = key
            self._since_change = 0
        self._since_change += 1
        if self._since_change <= self._warmup_steps or not record:
            return
        with self._lock:
            sums = self._sums.setdefault(key, _Sums())
            sums.steps += 1
            sums.step_s += now - begin
            sums.sync_s += max(0.0, min(sync, now - begin))

    def recent_step_s(self) -> float | None:
        """Smoothed wall time of recent steps (all keys, warm-up included), or ``None``."""
        return self._recent_s

    def snapshot(self) -> tuple[ProfileEntry, ...]:
        """Mean timings per configuration recorded so far (sorted by key)."""
        with self._lock:
            items = sorted(
                ((k, _Sums(s.steps, s.step_s, s.sync_s)) for k, s in self._sums.items()),
                key=lambda kv: (
                    kv[0].num_nodes,
                    kv[0].num_replicas,
                    kv[0].local_batch_size,
                    kv[0].accum_steps,
                ),
            )
        out = []
        for key, s in items:
            if s.steps == 0:
                continue
            step_s = s.step_s / s.steps
            sync_s = s.sync_s / s.steps
            out.append(
                ProfileEntry(
                    num_nodes=key.num_nodes,
                    num_replicas=key.num_replicas,
                    local_batch_size=key.local_batch_size,
                    accum_steps=key.accum_steps,
                    steps=s.steps,
                    step_s=step_s,
                    compute_s=step_s - sync_s,
                    sync_s=sync_s,
                )
            )
        return tuple(out)
