"""The cluster's story: one event per thing that matters, with its time and its reason.

An :class:`EventRecorder` watches a controller's store and turns what changed since it last
looked into :class:`Event` s, which it appends to the store's ``events`` table (schema v6) and
returns (``coadapt up`` prints them; ``coadapt events`` reads the same rows back):

* instances, from their status history (every change is there, with its time and the reason
  the sizing or the reconcile gave): ``launch``, ``boot`` (the cloud has it: booting),
  ``ready`` (its agent's first heartbeat: it can run jobs, with its boot time from the
  launch; :func:`~autoscaler.controller.lifecycle.boot_phase`), ``launch-failed``, ``notice`` (a
  spot interruption notice), ``drain``, ``preemption`` (the provider ended it: after a notice,
  or it vanished while running), ``release`` (with what it cost), ``termination-failed``;
  ``agent-restart`` (its agent restarted and adopted or relaunched its jobs) is written by the
  API when the restarted agent registers, not by this recorder;
* jobs, from their rows: ``submit``, ``completion``, ``failure`` (with the cause, also when it
  is retried), ``refusal`` (with the policy's reason), ``cancel``, ``retry`` (a user queued a
  failed or refused job again, ``coadapt retry``: what it had failed or been refused
  for), ``deadline`` (the
  controller found that an active job can no longer meet its deadline, with its estimate:
  the job's ``reason`` says so);
* placements, from the assignments: ``start``, ``resume`` (after a stop, or after its agent
  relaunched it on the same GPUs: a restart the store counted that no assignment change
  shows), ``stop``, ``move`` (other instances, the same GPU count), ``rescale`` (a new GPU
  count; for both, GPUs and instances before and after, and why: the instance it
  left was preempted or released, or the policy's goodput-per-dollar plan moved it, with what
  the job's fitted goodput model predicts for its GPUs before and after and what they cost per
  hour). A job's ``move``, ``rescale`` and ``resume`` events are its restarts as the store
  counts them
  (:meth:`~autoscaler.controller.store.Store.restart_counts`), but for a change that leaves
  some instances and keeps the others with the same GPUs: the agent restarts the job then,
  the store's definition does not count it;
* batches, from the planned batch of each job: ``rebatch`` (a new batch size or split for
  the same placement: the trainer takes it without a restart);
* the service itself: ``disk-full`` (its state folder's disk has less free than it keeps:
  recorded by ``coadapt up`` as it stops, not by the recorder).

It reads only what the store keeps, so it needs no hook in the round: the service calls
:meth:`EventRecorder.observe` after each round and after a release. What happened while no
recorder watched (``coadapt up`` not running) is not invented afterwards: a new recorder
starts from the store as it finds it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from autoscaler.controller.errors import ControllerError, UnknownRowError
from autoscaler.controller.lifecycle import InstanceStatus, StatusChange, launched_at
from autoscaler.controller.store import (
    EventRow,
    InstanceRow,
    JobBatch,
    JobRow,
    JobStatus,
    Store,
    is_deleted_name,
)
from autoscaler.decide.views import JobView
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import Clock

__all__ = [
    "AGED_KINDS",
    "WARNING_KINDS",
    "Event",
    "EventKind",
    "EventRecorder",
    "event_json",
    "format_event",
]


class EventKind(StrEnum):
    """What an event is about (see the module docstring)."""

    LAUNCH = "launch"
    BOOT = "boot"
    READY = "ready"
    LAUNCH_FAILED = "launch-failed"
    NOTICE = "notice"
    DRAIN = "drain"
    PREEMPTION = "preemption"
    RELEASE = "release"
    TERMINATION_FAILED = "termination-failed"
    AGENT_RESTART = "agent-restart"
    SUBMIT = "submit"
    START = "start"
    RESUME = "resume"
    STOP = "stop"
    MOVE = "move"
    RESCALE = "rescale"
    REBATCH = "rebatch"
    COMPLETION = "completion"
    FAILURE = "failure"
    REFUSAL = "refusal"
    CANCEL = "cancel"
    RETRY = "retry"
    DEADLINE = "deadline"
    DISK_FULL = "disk-full"


WARNING_KINDS: Final = frozenset(
    {
        EventKind.LAUNCH_FAILED,
        EventKind.NOTICE,
        EventKind.PREEMPTION,
        EventKind.TERMINATION_FAILED,
        EventKind.AGENT_RESTART,
        EventKind.FAILURE,
        EventKind.REFUSAL,
        EventKind.DEADLINE,
        EventKind.DISK_FULL,
    }
)
"""Events a user should see even with ``coadapt up --quiet``."""

DEADLINE_REASON: Final = "cannot meet its deadline"
"""How the reason of an active job that can no longer meet its deadline starts (the
controller's round sets it; a ``deadline`` event tells it)."""

_RESTART_KINDS: Final = frozenset({EventKind.MOVE, EventKind.RESCALE, EventKind.RESUME})
"""The placement events that are restarts of a job (its placements after the first)."""
_ENDED: Final = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.REFUSED}
)


@dataclass(frozen=True)
class Event:
    """One event: at ``at_s`` (Unix time), of ``kind``, about ``subject`` (a job name or an
    instance key), said in ``message`` (one line)."""

    at_s: float
    kind: EventKind
    subject: str
    message: str

    @property
    def warning(self) -> bool:
        return self.kind in WARNING_KINDS


def format_event(event: Event | EventRow, *, local_time: bool = True) -> str:
    """One line: ``HH:MM:SS kind subject: message`` (local time, or UTC)."""
    clock = time.localtime if local_time else time.gmtime
    stamp = time.strftime("%H:%M:%S", clock(event.at_s))
    return f"{stamp} {event.kind:<10} {event.subject}: {event.message}"


AGED_KINDS: Final = frozenset({EventKind.DRAIN, EventKind.NOTICE})
"""Events whose JSON (:func:`event_json`) gives the age of the instance they are about."""


def event_json(row: EventRow, store: Store) -> dict[str, object]:
    """One stored event as JSON (``coadapt events --json``): its row's fields and, for a
    ``drain`` or a ``notice`` (:data:`AGED_KINDS`), ``instance_age_s``: the seconds from the
    instance's launch (:func:`~autoscaler.controller.lifecycle.launched_at`) to the event
    (``None`` when the store has no launch of it: a row pruned, or never launched)."""
    out: dict[str, object] = {
        "seq": row.seq,
        "at_s": row.at_s,
        "kind": row.kind,
        "subject": row.subject,
        "message": row.message,
    }
    if row.kind in AGED_KINDS:
        try:
            launched = launched_at(store.history(row.subject))
        except UnknownRowError:  # no such instance row (any more)
            launched = None
        out["instance_age_s"] = None if launched is None else max(0.0, row.at_s - launched)
    return out


def _gpus(placement: Mapping[str, int]) -> int:
    return sum(placement.values())


def _n_gpus(placement: Mapping[str, int]) -> str:
    n = _gpus(placement)
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _where(placement: Mapping[str, int]) -> str:
    return ", ".join(f"{key} x{n}" for key, n in sorted(placement.items()))


def _batch_text(batch: JobBatch) -> str:
    return f"batch {batch.global_batch_size} ({batch.local_batch_size}/GPU x {batch.accum_steps})"


class EventRecorder:
    """Turns store changes into :class:`Event` s (see the module docstring). Not thread-safe:
    one recorder per store connection, called from the thread that runs the rounds."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        views: Callable[[], Sequence[JobView]] | None = None,
    ) -> None:
        """``views``: the jobs as the policy sees them now (``Controller.job_views``), read
        only when a rescale is told, to say what the job's fitted goodput model predicts for
        its GPUs before and after, and what they cost per hour."""
        self._store = store
        self._clock = clock
        self._views = views
        self._view_cache: dict[str, JobView] | None = None
        history = store.history_after(0)
        self._history_cursor = history[-1][0] if history else 0
        self._status: dict[str, InstanceStatus] = {
            r.instance_key: r.status for r in store.list_instances()
        }
        self._launched: set[str] = set(self._status)
        self._heard: set[str] = {  # instances whose agent was heard: told ready already
            r.instance_key for r in store.list_instances() if r.last_heartbeat_s is not None
        }
        self._noticed: set[str] = {  # a spot notice: a preemption recorded on a drain
            key
            for _, key, change in history
            if change.preemption and change.status is InstanceStatus.DRAINING
        }
        self._jobs: dict[str, JobRow] = {j.name: j for j in store.list_jobs()}
        self._placements = self._read_placements()
        self._batches: dict[str, JobBatch] = store.list_batches()
        self._started: set[str] = set(self._placements) | {
            s.job_name for s in store.assignment_history()
        }
        self._stopped_by: dict[str, str] = {}
        self._restarts: dict[str, int] = store.restart_counts(
            name for name, job in self._jobs.items() if job.status not in _ENDED
        )
        last = store.latest_events(1)
        self._told_s = last[0].at_s if last else 0.0

    def _read_placements(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (job, key), gpus in self._store.list_assignments().items():
            out.setdefault(job, {})[key] = gpus
        return out

    def observe(self) -> tuple[Event, ...]:
        """The events since the last call (or since the recorder was made), oldest first;
        they are appended to the store's ``events`` table before they are returned.

        The story is in time order across calls too: an event stamped before the last one
        already told (a row another thread wrote with an earlier time while the previous
        round was told, such as a job's completion or an instance's history) is told at that
        last time instead, at most a round later than it happened."""
        now = self._clock.now_s()
        self._view_cache = None
        events = self._instance_events()
        events += self._ready_events()
        jobs = {j.name: j for j in self._store.list_jobs()}
        placements = self._read_placements()
        batches = self._store.list_batches()
        events += self._restart_events(self._placement_events(jobs, placements, batches, now), now)
        events += self._job_events(jobs)
        events.sort(key=lambda e: e.at_s)  # stable: one moment keeps the order of its causes
        events = [e if e.at_s >= self._told_s else replace(e, at_s=self._told_s) for e in events]
        if events:
            self._told_s = events[-1].at_s
        self._jobs, self._placements, self._batches = jobs, placements, batches
        self._store.add_events([(e.at_s, e.kind.value, e.subject, e.message) for e in events])
        return tuple(events)

    # ---- instances -------------------------------------------------------------------------

    def _instance_events(self) -> list[Event]:
        out: list[Event] = []
        changes = self._store.history_after(self._history_cursor)
        if changes:
            self._history_cursor = changes[-1][0]
        rows = {r.instance_key: r for r in self._store.list_instances()} if changes else {}
        for _, key, change in changes:
            before = self._status.get(key)
            self._status[key] = change.status
            row = rows.get(key)
            event = self._instance_event(key, before, change, row)
            if event is not None:
                out.append(event)
        return out

    def _ready_events(self) -> list[Event]:
        """``ready`` for each running instance whose agent is heard for the first time, at
        that heartbeat, with its boot time from its launch."""
        out: list[Event] = []
        for row in self._store.list_instances(statuses=(InstanceStatus.RUNNING,)):
            heard = row.last_heartbeat_s
            if heard is None or row.instance_key in self._heard:
                continue
            self._heard.add(row.instance_key)
            launched = launched_at(self._store.history(row.instance_key))
            boot = ""
            if launched is not None:
                boot = f" {max(0.0, heard - launched):.0f} s after its launch"
            out.append(
                Event(
                    heard,
                    EventKind.READY,
                    row.instance_key,
                    f"ready: its agent is heard{boot} ({row.provider_instance_id})",
                )
            )
        return out

    def _instance_event(
        self,
        key: str,
        before: InstanceStatus | None,
        change: StatusChange,
        row: InstanceRow | None,
    ) -> Event | None:
        s, at, reason = change.status, change.at_s, change.reason
        if s is InstanceStatus.REQUESTED and key not in self._launched:
            self._launched.add(key)
            what = ""
            if row is not None:
                what = (
                    f"{row.offering_key} ({row.gpus} x {row.gpu_type}, {row.market.value}, "
                    f"{row.price_usd_per_hour:.4g} USD/h)"
                )
            wanted = self._first_reason(key)
            return Event(at, EventKind.LAUNCH, key, f"{what}: {wanted}".strip(": "))
        if s is InstanceStatus.RUNNING and before is not InstanceStatus.RUNNING:
            cloud_id = None if row is None else row.provider_instance_id
            return Event(at, EventKind.BOOT, key, f"booting as {cloud_id} ({reason})")
        if s is InstanceStatus.ALLOCATION_FAILED:
            return Event(at, EventKind.LAUNCH_FAILED, key, reason)
        if s is InstanceStatus.DRAINING and change.preemption:
            if key in self._noticed:
                return None
            self._noticed.add(key)
            return Event(
                at,
                EventKind.NOTICE,
                key,
                "spot interruption notice: the provider takes it back; its jobs checkpoint "
                "and stop, the next round places them elsewhere",
            )
        if s is InstanceStatus.DRAINING and before is not InstanceStatus.DRAINING:
            return Event(at, EventKind.DRAIN, key, f"draining: {reason}")
        if s is InstanceStatus.TERMINATION_FAILED:
            return Event(at, EventKind.TERMINATION_FAILED, key, reason)
        if s is InstanceStatus.TERMINATED:
            cost = self._store.total_cost_usd(key)
            billed = f"; it cost {cost:.4g} USD" if cost > 0 else ""
            if key in self._noticed:
                return Event(
                    at, EventKind.PREEMPTION, key, f"ended after its spot notice ({reason}){billed}"
                )
            if change.preemption and before is not None:
                return Event(
                    at,
                    EventKind.PREEMPTION,
                    key,
                    f"gone from the cloud while {before.value} (preempted without a notice "
                    f"read){billed}",
                )
            why = self._last_reason(key, InstanceStatus.TERMINATING) or reason
            return Event(at, EventKind.RELEASE, key, f"released: {why}{billed}")
        return None

    def _first_reason(self, key: str) -> str:
        history = self._store.history(key)
        return history[0].reason if history else ""

    def _last_reason(self, key: str, status: InstanceStatus) -> str | None:
        found = [h.reason for h in self._store.history(key) if h.status is status]
        return found[-1] if found else None

    # ---- placements and batches ------------------------------------------------------------

    def _gone_reason(self, keys: Sequence[str]) -> str | None:
        """Why a job left the instances ``keys``, when one of them is leaving the fleet."""
        for key in sorted(keys):
            status = self._status.get(key)
            if key in self._noticed:
                return f"its instance {key} got a spot notice"
            if status in (InstanceStatus.DRAINING, InstanceStatus.TERMINATING):
                why = self._last_reason(key, InstanceStatus.DRAINING) or "released"
                return f"its instance {key} is leaving the fleet ({why})"
            if status is InstanceStatus.TERMINATED:
                return f"its instance {key} is gone"
        return None

    def _placement_events(
        self,
        jobs: Mapping[str, JobRow],
        placements: Mapping[str, Mapping[str, int]],
        batches: Mapping[str, JobBatch],
        now: float,
    ) -> list[Event]:
        out: list[Event] = []
        for name in sorted(set(self._placements) | set(placements)):
            old = dict(self._placements.get(name, {}))
            new = dict(placements.get(name, {}))
            job = jobs.get(name)
            batch = batches.get(name)
            batch_text = f", {_batch_text(batch)}" if batch is not None else ""
            if old == new:
                before = self._batches.get(name)
                if (
                    new
                    and batch is not None
                    and before is not None
                    and (
                        (before.global_batch_size, before.local_batch_size, before.accum_steps)
                        != (batch.global_batch_size, batch.local_batch_size, batch.accum_steps)
                    )
                ):
                    out.append(
                        Event(
                            now,
                            EventKind.REBATCH,
                            name,
                            f"{_batch_text(before)} -> {_batch_text(batch)} on "
                            f"{_n_gpus(new)}: the policy's best goodput for what the job "
                            "has measured so far",
                        )
                    )
                continue
            if not new:
                if job is None or job.status in _ENDED:
                    continue  # its end is its own event
                why = self._gone_reason(list(old)) or "the policy gave its GPUs to others"
                self._stopped_by[name] = why
                out.append(
                    Event(
                        now,
                        EventKind.STOP,
                        name,
                        f"stopped on {_n_gpus(old)} ({_where(old)}): {why}; it checkpoints "
                        "and waits for its next placement",
                    )
                )
                continue
            if not old:
                if name not in self._started:
                    self._started.add(name)
                    out.append(
                        Event(
                            now,
                            EventKind.START,
                            name,
                            f"placed on {_n_gpus(new)} ({_where(new)}){batch_text}",
                        )
                    )
                else:
                    after = self._stopped_by.pop(name, None)
                    since = f" after it stopped ({after})" if after else ""
                    out.append(
                        Event(
                            now,
                            EventKind.RESUME,
                            name,
                            f"{self._resume_text(name)} on "
                            f"{_n_gpus(new)} ({_where(new)}){batch_text}{since}",
                        )
                    )
                continue
            left = [k for k in old if k not in new]
            gone = self._gone_reason(left)
            if gone is not None:
                why = gone
            elif _gpus(new) > _gpus(old):
                why = "the policy gives it more GPUs: they pay for themselves in goodput per dollar"
            elif _gpus(new) < _gpus(old):
                why = "the policy takes GPUs back: more goodput per dollar across the jobs"
            else:
                why = "the policy moves it to other GPUs: more goodput per dollar across the jobs"
            if _gpus(new) == _gpus(old):
                kind, what = EventKind.MOVE, f"to {_where(new)}, the same {_n_gpus(new)}"
            else:
                kind, what = EventKind.RESCALE, f"{_gpus(old)} -> {_n_gpus(new)} ({_where(new)})"
            out.append(
                Event(
                    now,
                    kind,
                    name,
                    f"{what}{batch_text}: {why}"
                    f"{self._prediction(name, old, new, self._batches.get(name), batch)}; "
                    f"it checkpoints, then restarts from that checkpoint{self._progress(name)}",
                )
            )
        return out

    def _restart_events(self, told: list[Event], now: float) -> list[Event]:
        """``told`` (the placement events), with the restarts the store counted that no
        placement change tells (:meth:`~autoscaler.controller.store.Store.restart_counts`, the
        one definition: an agent that relaunched a job on the same GPUs), each told as a
        ``resume``. So the ``move``, ``rescale`` and ``resume`` events of a job are its
        restarts as the
        store, the bill and the policy count them."""
        active = {name for name, job in self._jobs.items() if job.status not in _ENDED}
        counts = self._store.restart_counts(sorted({e.subject for e in told} | active))
        out = list(told)
        for name, count in sorted(counts.items()):
            seen = sum(1 for e in told if e.subject == name and e.kind in _RESTART_KINDS)
            for _ in range(count - self._restarts.get(name, 0) - seen):
                out.append(
                    Event(
                        now,
                        EventKind.RESUME,
                        name,
                        "started again on the same GPUs: its agent relaunched it (a "
                        f"restart); it {self._resume_text(name)}",
                    )
                )
        self._restarts.update(counts)
        return out

    def _prediction(
        self,
        name: str,
        old: Mapping[str, int],
        new: Mapping[str, int],
        batch_old: JobBatch | None,
        batch_new: JobBatch | None,
    ) -> str:
        """``; its model predicts a -> b samples/s of goodput for c -> d USD/h`` (the GPUs it
        holds, at their instances' prices), or nothing when the job has no fitted model yet or
        the views cannot be read."""
        if self._views is None:
            return ""
        if self._view_cache is None:
            try:
                self._view_cache = {v.name: v for v in self._views()}
            except (ControllerError, InvalidInputError):
                self._view_cache = {}
        view = self._view_cache.get(name)
        if view is None:
            return ""
        rows = {r.instance_key: r for r in self._store.list_instances()}
        types = [rows[k].gpu_type for k in sorted(new) if k in rows]
        model = view.model  # a type-unaware policy's; else the model of the GPU type it gets
        if model is None and view.models:
            model = next((view.models[t] for t in types if t in view.models), None)
            model = model or next(iter(view.models.values()))
        if model is None:
            return ""

        def goodput(placement: Mapping[str, int], batch: JobBatch | None) -> float:
            nodes, gpus = len(placement), _gpus(placement)
            if batch is not None and batch.gpus == gpus:
                return float(model.goodput(nodes, gpus, batch.local_batch_size, batch.accum_steps))
            return float(model.optimize(nodes, gpus).goodput)

        def usd_per_hour(placement: Mapping[str, int]) -> float:
            total = 0.0
            for key, n in placement.items():
                row = rows.get(key)
                if row is not None and row.gpus > 0:
                    total += row.price_usd_per_hour * n / row.gpus
            return total

        try:
            g0, g1 = goodput(old, batch_old), goodput(new, batch_new)
        except (InvalidInputError, ValueError, ArithmeticError):
            return ""
        if not (math.isfinite(g0) and math.isfinite(g1)) or g0 <= 0 or g1 <= 0:
            return ""
        c0, c1 = usd_per_hour(old), usd_per_hour(new)
        return (
            f"; its model predicts {g0:.4g} -> {g1:.4g} samples/s of goodput for "
            f"{c0:.3g} -> {c1:.3g} USD/h"
        )

    def _latest(self, name: str) -> tuple[float, float | None, float | None] | None:
        """``(progress, target, checkpoint progress)`` of the job's latest trainer report
        (``None``: no readable report); the last two ``None`` when the report has none."""
        report = self._store.latest_report(name)
        if report is None:
            return None
        try:
            data = json.loads(report.payload_json)
            progress = float(data["progress"])
            target = data.get("target_progress")
            saved = data.get("checkpoint_progress")
        except (ValueError, TypeError, KeyError):
            return None
        if not math.isfinite(progress):
            return None

        def number(value: object) -> float | None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None
            return float(value) if math.isfinite(value) else None

        target, saved = number(target), number(saved)
        return progress, target if target is not None and target > 0 else None, saved

    def _progress(self, name: str) -> str:
        """`` (progress P of T)`` from the job's latest trainer report, or nothing."""
        latest = self._latest(name)
        if latest is None:
            return ""
        progress, target, _ = latest
        of = f" of {target:.0f}" if target is not None else ""
        return f" (progress {progress:.0f}{of})"

    def _resume_text(self, name: str) -> str:
        """How a stopped job resumes, as far as its trainer's reports tell: from the
        checkpoint its last report names (``checkpoint_progress``) and what was lost since, or
        that its last report names none. Never a checkpoint the reports do not vouch for."""
        latest = self._latest(name)
        if latest is None:
            return "resumes (it has not reported yet: from its checkpoint, if it saved one)"
        progress, target, saved = latest
        of = f" of {target:.0f}" if target is not None else ""
        if saved is None:
            return (
                f"resumes, but its last report (progress {progress:.0f}{of}) names no "
                f"checkpoint: unless it saved one since, it starts over ({progress:.0f} of "
                "progress lost)"
            )
        lost = progress - saved
        if lost <= 0:
            return f"resumes from its checkpoint at progress {saved:.0f}{of}"
        return (
            f"resumes from its checkpoint at progress {saved:.0f}{of}: its last report was at "
            f"{progress:.0f}, so at least {lost:.0f} of progress is lost"
        )

    # ---- jobs ------------------------------------------------------------------------------

    def _job_events(self, jobs: Mapping[str, JobRow]) -> list[Event]:
        out: list[Event] = []
        for name, job in sorted(jobs.items()):
            old = self._jobs.get(name)
            if is_deleted_name(name) and old is None:
                continue  # a deleted job's history, moved: told when it happened
            if old is not None and old.submitted_at_s != job.submitted_at_s:
                old = None  # a new job under a deleted one's name
            if old is None:
                out.append(Event(job.submitted_at_s, EventKind.SUBMIT, name, "submitted"))
                if job.status is JobStatus.QUEUED:
                    continue
            at = job.updated_at_s
            reason = job.reason or "no reason given"
            if (
                job.reason
                and job.reason.startswith(DEADLINE_REASON)
                and (old is None or old.reason != job.reason)
            ):
                out.append(Event(at, EventKind.DEADLINE, name, job.reason))
            if (old is None or old.status is not job.status) and job.status in _ENDED:
                if job.status is JobStatus.COMPLETED:
                    jct = job.updated_at_s - job.submitted_at_s
                    out.append(Event(at, EventKind.COMPLETION, name, f"completed in {jct:.0f} s"))
                elif job.status is JobStatus.FAILED:
                    out.append(Event(at, EventKind.FAILURE, name, f"failed: {reason}"))
                elif job.status is JobStatus.REFUSED:
                    out.append(Event(at, EventKind.REFUSAL, name, f"refused: {reason}"))
                else:
                    out.append(Event(at, EventKind.CANCEL, name, "cancelled"))
            elif (
                old is not None
                and old.status in (JobStatus.FAILED, JobStatus.REFUSED)
                and job.status not in _ENDED  # queued, or already placed again this round
            ):
                was = f"{old.status.value}: {old.reason}" if old.reason else old.status.value
                again = f"queued again by a user (it had {was})"
                out.append(Event(at, EventKind.RETRY, name, again))
            elif old is not None and job.retries > old.retries and job.status not in _ENDED:
                out.append(
                    Event(
                        at,
                        EventKind.FAILURE,
                        name,
                        f"failed (try {job.retries}), will run again: {reason}",
                    )
                )
        return out
