"""Reconcile: the store's instances against the observed cloud and the round's target fleet.

A pure function, :func:`reconcile`, from one frozen :class:`ReconcileInput` (the store's
live instance rows, what the provider listed, the interruption notices it returned, the
fleet sizing's target per offering, the GPUs each instance runs for jobs, the time) to an
:class:`Actions` value. It makes no cloud call and reads no clock; the controller's act
phase executes the actions (store first, then the cloud). It first *mirrors* the cloud, then
*acts*:

Mirror (what already happened):

* a listed instance whose request id is a row's, while that row has no cloud id yet:
  adopted (``requested -> running``; a row that timed back to ``queued`` goes through
  ``requested`` first, with the same request id);
* a listed instance whose request id no row knows, or whose row is already terminal, or
  that is a second instance of one request: a leak, terminated;
* a row whose instance is no longer listed: ``running``/``draining``/``terminating``/
  ``termination_failed`` -> ``terminated`` (preempted without notice, or terminated);
* an interruption notice on a running instance (one adopted this round included):
  ``running -> draining`` (its jobs checkpoint and stop; the policy re-places them).
  Preemptions are exempt from the disruption budget. A notice on an instance already
  draining for cost is recorded once (``draining -> draining``), so its end is billed as a
  preemption; its drain clock restarts with it (that round does not end it as draining too
  long).

Act (what to change):

* timeouts from each row's time in its status (:func:`~autoscaler.controller.lifecycle.
  timed_out`): requested too long -> back to ``queued`` with the same request id (bounded
  tries) or ``allocation_failed``; draining too long -> ``terminating``; terminating too long
  -> terminate again (bounded) or ``termination_failed``;
* a running instance whose agent has not heartbeaten for ``heartbeat_timeout_s`` (none at
  all: for ``boot_grace_s`` from its start) is presumed dead: ``terminating`` (its jobs are
  re-placed). Silence counts only while the controller was running (:mod:`autoscaler.
  controller.liveness`: the input's ``stalls`` are subtracted), and when at least
  ``mass_silence_min_instances`` and ``mass_silence_fraction`` of the running instances look
  dead in one round, the controller suspects its own view and releases none of them
  (``Actions.suspected``), but one per round whose silence passed ``mass_silence_hold_s``;
* drained instances with no job left on them: ``terminating``;
* the target fleet: per offering, the instances held (queued, requested, running) are
  compared with the target; a shortfall creates new rows (``queued``, each with its own
  request id), at most ``max(min_launches_per_offering, launch_growth x held)`` per offering
  per round and ``max_in_flight`` queued or requested in all; a surplus first releases, in
  that round, the ready instances (:func:`~autoscaler.controller.lifecycle.boot_phase`) that
  run no job, newest first (those of the input's ``held`` last), straight to
  ``terminating`` (nothing to drain; also while other offerings launch, but not while
  instances of the same offering are still being launched: the one still to come is then
  the spare). The rest of a surplus drains
  running instances, those running the fewest GPUs of jobs still training first (GPUs held by a job
  that finished training, ``finishing_gpus``, are free within seconds: its instance goes
  before the one a running job was just placed on), at most ``disruption_budget`` per round,
  none while instances are launching (replacements come up before anything is drained for
  cost), and none of the input's ``held`` (young instances, instances running a job placed
  there recently or a non-adaptive job: :mod:`autoscaler.controller.hold`). Queued rows of
  an offering marked unavailable fail without a call.

Requested rows with no listed instance are (re)launched once per controller process: after a
restart the launch is re-issued with the same request id, which the provider's launch rule
makes idempotent (no duplicate), and later rounds wait for the listing or the timeout.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Final

from autoscaler.controller.lifecycle import (
    BootPhase,
    InstanceStatus,
    LifecycleTimeouts,
    TimeoutAction,
    boot_phase,
    timed_out,
)
from autoscaler.controller.liveness import Stall, mass_silence, silence_s
from autoscaler.errors import InvalidInputError
from providers.base import Instance, InstanceState, InterruptionKind, InterruptionNotice

__all__ = [
    "EMPTY_RELEASE_REASON",
    "NOTICE_REASON",
    "UNAVAILABLE_REASON",
    "VANISHED_REASON",
    "Actions",
    "LaunchIntent",
    "Leak",
    "ReconcileConfig",
    "ReconcileInput",
    "RowView",
    "Transition",
    "reconcile",
    "unavailable_launch",
]

HELD = frozenset({InstanceStatus.QUEUED, InstanceStatus.REQUESTED, InstanceStatus.RUNNING})
"""Statuses that count as holding an instance of an offering (what sizing's target is
compared with)."""

UNAVAILABLE_REASON: Final = "offering unavailable (capacity error)"
"""The history reason of a queued row failed because its offering is marked unavailable."""
NOTICE_REASON = "spot interruption notice"
"""The history reason of a drain for a spot notice (a preemption)."""
EMPTY_RELEASE_REASON: Final = "fleet target lowered (cost): ready, no job on it"
"""The history reason of a ready instance that runs no job, released when the target drops
it (straight to ``terminating``: there is nothing to drain)."""
VANISHED_REASON = "no longer listed by the cloud"
"""The history reason of an instance that vanished (preempted without a notice read)."""

PREEMPTIBLE: Final = frozenset({InstanceStatus.RUNNING, InstanceStatus.DRAINING})
"""Statuses in which an instance that vanishes from the listing was ended by the provider (a
preemption), not released."""

_STARTING: Final = frozenset({InstanceStatus.QUEUED, InstanceStatus.REQUESTED})
"""Statuses of an instance still being launched (no cloud instance recorded yet)."""

_LISTED = frozenset(
    {
        InstanceStatus.RUNNING,
        InstanceStatus.DRAINING,
        InstanceStatus.TERMINATING,
        InstanceStatus.TERMINATION_FAILED,
    }
)


@dataclass(frozen=True)
class RowView:
    """What reconcile reads of one store instance row. ``since_s``: when it entered its
    status or last retried in it (its last history entry); ``retries``: the retries of its
    current try count (``requested``: the row's ``request_tries``; ``terminating``: the
    terminate retries of this spell, :func:`~autoscaler.controller.lifecycle.
    terminate_retries`); ``started_s``: when it became running (``None``: not yet);
    ``noticed``: its history already records a spot notice."""

    key: str
    request_id: str
    offering_key: str
    status: InstanceStatus
    since_s: float
    retries: int = 0
    provider_instance_id: str | None = None
    last_heartbeat_s: float | None = None
    started_s: float | None = None
    noticed: bool = False


@dataclass(frozen=True)
class ReconcileConfig:
    """Knobs of :func:`reconcile` (see the module docstring). ``heartbeat_timeout_s``
    ``None`` turns agent liveness off (a fleet without agents, e.g. the benchmark).

    Mass silence (:func:`~autoscaler.controller.liveness.mass_silence`): when at least
    ``mass_silence_min_instances`` (default 3, Kubernetes' "more than two unready nodes") and
    at least ``mass_silence_fraction`` (default 0.55, Kubernetes' default
    ``--unhealthy-zone-threshold``) of the running instances look dead in one round, none is
    released for it, but at most one per round whose silence exceeds ``mass_silence_hold_s``
    (default 900 s: a fleet that really died is given back slowly, not kept forever)."""

    timeouts: LifecycleTimeouts = field(default_factory=LifecycleTimeouts)
    heartbeat_timeout_s: float | None = 120.0
    boot_grace_s: float = 600.0
    mass_silence_fraction: float = 0.55
    mass_silence_min_instances: int = 3
    mass_silence_hold_s: float = 900.0
    disruption_budget: int = 2
    launch_growth: float = 1.0
    min_launches_per_offering: int = 4
    max_in_flight: int = 64

    def __post_init__(self) -> None:
        if self.heartbeat_timeout_s is not None and not self.heartbeat_timeout_s > 0:
            raise InvalidInputError("heartbeat_timeout_s must be > 0", field="heartbeat_timeout_s")
        if not 0 < self.mass_silence_fraction <= 1:
            raise InvalidInputError(
                "mass_silence_fraction must be in (0, 1]", field="mass_silence_fraction"
            )
        if not (self.mass_silence_hold_s >= 0 and math.isfinite(self.mass_silence_hold_s)):
            raise InvalidInputError("mass_silence_hold_s must be >= 0", field="mass_silence_hold_s")
        for name in (
            "disruption_budget",
            "min_launches_per_offering",
            "max_in_flight",
            "mass_silence_min_instances",
        ):
            if getattr(self, name) < 0:
                raise InvalidInputError(f"{name} must be >= 0", field=name)
        if not (self.launch_growth >= 0 and math.isfinite(self.launch_growth)):
            raise InvalidInputError("launch_growth must be >= 0", field="launch_growth")
        if not self.boot_grace_s >= 0:
            raise InvalidInputError("boot_grace_s must be >= 0", field="boot_grace_s")


@dataclass(frozen=True)
class ReconcileInput:
    """One round's reconcile input (see the module docstring). ``rows``: the store's
    non-terminal instance rows; ``terminal_request_ids``: request ids of rows already
    terminal (an instance listed under one is a late leak); ``target``: instances wanted per
    offering key; ``used_gpus``: GPUs jobs hold per instance key (the current assignments);
    ``finishing_gpus``: the part of ``used_gpus`` held by jobs whose trainer reported that it
    finished training (each at most its instance's ``used_gpus``), counted as free when a
    surplus picks what to drain, and only there;
    ``unavailable``: offering keys marked after capacity errors; ``issued``: request ids
    whose launch or termination this controller process already sent (a restarted one knows
    none, and sends each again once);
    ``stalls``: the spans in which the controller was not running (its
    :class:`~autoscaler.controller.liveness.AwakeLog`), never counted as an agent's silence;
    ``held``: instance keys never drained for cost this round (:func:`~autoscaler.controller.
    hold.held_instances`; a notice or the cloud taking one back still ends it)."""

    now_s: float
    rows: tuple[RowView, ...]
    observed: tuple[Instance, ...]
    notices: tuple[InterruptionNotice, ...] = ()
    target: Mapping[str, int] = field(default_factory=dict)
    used_gpus: Mapping[str, int] = field(default_factory=dict)
    finishing_gpus: Mapping[str, int] = field(default_factory=dict)
    unavailable: frozenset[str] = frozenset()
    issued: frozenset[str] = frozenset()
    terminal_request_ids: frozenset[str] = frozenset()
    stalls: tuple[Stall, ...] = ()
    held: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Transition:
    """Move row ``key`` to ``to`` because of ``reason``; ``provider_instance_id`` is set with
    it when given (adoption). ``preemption``: the provider is taking the instance back (a spot
    notice, or it vanished while running or draining): the one place a preemption is decided,
    recorded typed in the row's history (:attr:`~autoscaler.controller.lifecycle.StatusChange.
    preemption`), where billing, the events and the next rounds read it."""

    key: str
    to: InstanceStatus
    reason: str
    provider_instance_id: str | None = None
    preemption: bool = False


@dataclass(frozen=True)
class LaunchIntent:
    """A new row to create (``queued``) for one instance of ``offering_key``."""

    offering_key: str


@dataclass(frozen=True)
class Leak:
    """A listed instance no live row owns: terminate it."""

    instance: Instance
    reason: str


@dataclass(frozen=True)
class Actions:
    """What the act phase does, in order: ``transitions`` (store), ``new_rows`` (store,
    ``queued``), then the cloud calls: ``launch`` (row keys to launch: each goes ``queued ->
    requested`` in the store before its call, or is re-issued if already requested),
    ``terminate`` (row keys whose instance to terminate: rows already ``terminating``) and
    ``leaks``. ``suspected``: running instances whose agents look dead but are kept, the
    silence being too widespread to believe (see the module docstring)."""

    transitions: tuple[Transition, ...] = ()
    new_rows: tuple[LaunchIntent, ...] = ()
    launch: tuple[str, ...] = ()
    terminate: tuple[str, ...] = ()
    leaks: tuple[Leak, ...] = ()
    suspected: tuple[str, ...] = ()

    @property
    def leaving(self) -> frozenset[str]:
        """Instance keys that take no job from this round on: every row moved to a status
        other than ``running`` (draining for a notice or for cost, released, gone); the
        policy decides on the others."""
        return frozenset(t.key for t in self.transitions if t.to is not InstanceStatus.RUNNING)

    @property
    def cloud_calls(self) -> int:
        """An upper bound on the provider calls executing these actions makes."""
        return len(self.launch) + len(self.new_rows) + len(self.terminate) + len(self.leaks)


class _Builder:
    """The actions of one reconcile, accumulated row by row."""

    def __init__(self, inp: ReconcileInput, cfg: ReconcileConfig) -> None:
        self.inp = inp
        self.cfg = cfg
        self.transitions: list[Transition] = []
        self.status: dict[str, InstanceStatus] = {}
        self.launch: list[str] = []
        self.terminate: list[str] = []
        self.leaks: list[Leak] = []
        self.silent: list[tuple[RowView, float]] = []  # (row, silence) of agents judged dead
        self.watched = 0  # running instances whose liveness was judged
        self.suspected: list[str] = []

    def move(
        self,
        row: RowView,
        to: InstanceStatus,
        reason: str,
        *,
        provider_instance_id: str | None = None,
        preemption: bool = False,
    ) -> None:
        self.transitions.append(Transition(row.key, to, reason, provider_instance_id, preemption))
        self.status[row.key] = to

    def stop(self, row: RowView, reason: str) -> None:
        """To ``terminating`` and terminate its instance."""
        self.move(row, InstanceStatus.TERMINATING, reason)
        self.terminate.append(row.key)


def reconcile(inp: ReconcileInput, config: ReconcileConfig | None = None) -> Actions:
    """The round's actions (see the module docstring). Deterministic: rows and instances are
    visited in key order, whatever order they came in."""
    b = _Builder(inp, config or ReconcileConfig())
    rows = sorted(inp.rows, key=lambda r: r.key)
    by_request = {r.request_id: r for r in rows}
    listed: dict[str, list[Instance]] = {}
    for inst in sorted(inp.observed, key=lambda i: i.instance_id):
        if inst.request_id in by_request:
            listed.setdefault(inst.request_id, []).append(inst)
        elif inst.request_id in inp.terminal_request_ids:
            b.leaks.append(Leak(inst, "instance of a request already ended"))
        else:
            b.leaks.append(Leak(inst, "owned instance no row knows (a leak)"))
    noticed = {
        n.instance_id
        for n in inp.notices
        if n.kind is not InterruptionKind.REBALANCE  # a recommendation carries no deadline
    }
    for row in rows:
        b.status[row.key] = row.status
        mine = listed.get(row.request_id, [])
        # The row's own instance: the one it recorded, else the first listed; others leak.
        own = next((i for i in mine if i.instance_id == row.provider_instance_id), None)
        if own is None and row.provider_instance_id is None and mine:
            own = mine[0]
        b.leaks.extend(Leak(i, "second instance of one request") for i in mine if i is not own)
        if own is None and row.provider_instance_id is not None and row.status in _LISTED:
            # Gone while running or draining: the provider ended it (a preemption, noticed
            # or not); gone while terminating: released.
            b.move(
                row,
                InstanceStatus.TERMINATED,
                VANISHED_REASON,
                preemption=row.status in PREEMPTIBLE,
            )
        elif own is not None and row.provider_instance_id is None:
            _adopt(b, row, own, noticed)
        else:
            _act_on_row(b, row, own, noticed)
    _release_silent(b)
    new_rows = _size(b, rows)
    return Actions(
        transitions=tuple(b.transitions),
        new_rows=tuple(new_rows),
        launch=tuple(b.launch),
        terminate=tuple(b.terminate),
        leaks=tuple(b.leaks),
        suspected=tuple(b.suspected),
    )


def unavailable_launch(
    key: str, status: InstanceStatus, offering_key: str, unavailable: Container[str]
) -> Transition | None:
    """The one rule of a launch into an offering marked unavailable (``unavailable``: the
    round's snapshot of the marks, or the live memory while the act phase launches): a
    ``queued`` row fails (``allocation_failed``) without a cloud call; ``None`` for any other
    row, or an offering not marked. Reconcile applies it to the rows it reads; the act phase
    to each launch it is about to make, for a mark an earlier launch of the same round
    made."""
    if status is InstanceStatus.QUEUED and offering_key in unavailable:
        return Transition(key, InstanceStatus.ALLOCATION_FAILED, UNAVAILABLE_REASON)
    return None


def _adopt(b: _Builder, row: RowView, own: Instance, noticed: set[str]) -> None:
    """A listed instance carries the request id of a row that has no cloud id yet: adopted,
    unless the row gave its launch up (then the late fill is terminated through the row). An
    instance adopted with a notice on it drains at once, like any running one (the provider
    tells a notice once: left for the next round, it would be lost)."""
    if row.status is InstanceStatus.ALLOCATION_FAILED:
        b.move(
            row,
            InstanceStatus.TERMINATING,
            "late fill of a failed launch",
            provider_instance_id=own.instance_id,
        )
        b.terminate.append(row.key)
        return
    if row.status is InstanceStatus.QUEUED:
        b.move(row, InstanceStatus.REQUESTED, "its instance appeared: adopting it")
    b.move(
        row,
        InstanceStatus.RUNNING,
        "listed by the cloud under its request id",
        provider_instance_id=own.instance_id,
    )
    if own.instance_id in noticed:
        b.move(row, InstanceStatus.DRAINING, NOTICE_REASON, preemption=True)


def _act_on_row(b: _Builder, row: RowView, own: Instance | None, noticed: set[str]) -> None:
    """Timeouts, notices, liveness and drains for one row whose cloud side is mirrored."""
    inp, cfg = b.inp, b.cfg
    s = row.status
    timeout = timed_out(s, row.since_s, inp.now_s, row.retries, cfg.timeouts)
    if s is InstanceStatus.QUEUED:
        refused = unavailable_launch(row.key, s, row.offering_key, inp.unavailable)
        if refused is not None:
            b.move(row, refused.to, refused.reason)
        else:
            b.launch.append(row.key)
    elif s is InstanceStatus.REQUESTED:
        if timeout is TimeoutAction.RETRY_REQUEST:
            b.move(row, InstanceStatus.QUEUED, "requested too long: retrying the same request id")
        elif timeout is TimeoutAction.FAIL_ALLOCATION:
            b.move(row, InstanceStatus.ALLOCATION_FAILED, "requested too long, tries exhausted")
        elif row.request_id not in inp.issued:
            b.launch.append(row.key)  # re-issued once per process: the launch rule dedupes
    elif s is InstanceStatus.RUNNING and own is not None:
        if own.instance_id in noticed:
            b.move(row, InstanceStatus.DRAINING, NOTICE_REASON, preemption=True)
        else:
            b.watched += 1
            silent = _silence_past_timeout(row, inp, cfg)
            if silent is not None:
                b.silent.append((row, silent))
    elif s is InstanceStatus.DRAINING:
        # A first notice on an instance draining (for cost) restarts its drain clock: the
        # jobs on it get the notice's window to checkpoint, whatever the drain's age.
        fresh_notice = own is not None and own.instance_id in noticed and not row.noticed
        if fresh_notice:
            b.move(row, InstanceStatus.DRAINING, NOTICE_REASON, preemption=True)
        if inp.used_gpus.get(row.key, 0) == 0:
            b.stop(row, "drained: no job left on it")
        elif timeout is TimeoutAction.FORCE_TERMINATE_DRAIN and not fresh_notice:
            b.stop(row, "draining too long")
    elif s is InstanceStatus.TERMINATING:
        if timeout is TimeoutAction.FAIL_TERMINATION:
            b.move(row, InstanceStatus.TERMINATION_FAILED, "terminating too long, tries exhausted")
        elif timeout is TimeoutAction.RETRY_TERMINATE:
            b.stop(row, "terminating too long: terminating again")  # the retry is recorded
        elif row.request_id not in inp.issued:
            b.terminate.append(row.key)  # re-issued once per process (terminate is idempotent)
    elif s is InstanceStatus.TERMINATION_FAILED:
        if timeout is TimeoutAction.RETRY_FAILED_TERMINATION:
            b.stop(row, "retrying a failed termination")
    elif (
        s is InstanceStatus.ALLOCATION_FAILED and timeout is TimeoutAction.SETTLE_FAILED_ALLOCATION
    ):
        b.move(row, InstanceStatus.TERMINATED, "settled: nothing listed under its request id")


def _silence_past_timeout(row: RowView, inp: ReconcileInput, cfg: ReconcileConfig) -> float | None:
    """The agent's silence while the controller ran, when it is past its timeout:
    ``heartbeat_timeout_s`` since its last heartbeat (none at all: ``boot_grace_s`` since the
    instance started); ``None`` while it is within it (or liveness is off)."""
    if cfg.heartbeat_timeout_s is None:
        return None
    started = row.started_s if row.started_s is not None else row.since_s
    last = row.last_heartbeat_s
    if last is None:
        silent = silence_s(started, inp.now_s, inp.stalls)
        return silent if silent > cfg.boot_grace_s else None
    silent = silence_s(max(last, started), inp.now_s, inp.stalls)
    return silent if silent > cfg.heartbeat_timeout_s else None


def _release_silent(b: _Builder) -> None:
    """Release the instances whose agents are judged dead, unless so many are at once that
    the controller's own view is suspect: then only one per round whose silence passed
    ``mass_silence_hold_s`` (the longest silent first), the others kept as ``suspected``."""
    cfg = b.cfg
    if not mass_silence(
        len(b.silent),
        b.watched,
        fraction=cfg.mass_silence_fraction,
        min_instances=cfg.mass_silence_min_instances,
    ):
        for row, _ in b.silent:
            b.stop(row, "agent stopped heartbeating")
        return
    held = sorted(b.silent, key=lambda rs: (-rs[1], rs[0].key))
    if held and held[0][1] > cfg.mass_silence_hold_s:
        row, silent = held.pop(0)
        b.stop(
            row,
            f"agent stopped heartbeating ({silent:.0f} s, past the {cfg.mass_silence_hold_s:.0f}"
            " s hold of a mass silence)",
        )
    b.suspected.extend(sorted(row.key for row, _ in held))


def _training_gpus(inp: ReconcileInput, key: str) -> int:
    """GPUs of instance ``key`` held by jobs still training: what draining it disrupts."""
    used = inp.used_gpus.get(key, 0)
    return used - min(max(inp.finishing_gpus.get(key, 0), 0), used)


def _size(b: _Builder, rows: list[RowView]) -> list[LaunchIntent]:
    """New rows for shortfalls, drains for surpluses (see the module docstring)."""
    inp, cfg = b.inp, b.cfg
    held: dict[str, list[RowView]] = {}
    in_flight = 0
    for row in rows:
        s = b.status[row.key]
        if s in HELD:
            held.setdefault(row.offering_key, []).append(row)
        if s in (InstanceStatus.QUEUED, InstanceStatus.REQUESTED):
            in_flight += 1
    launching = in_flight > 0
    booted = {i.instance_id for i in inp.observed if i.state is InstanceState.RUNNING}
    needs_agent = cfg.heartbeat_timeout_s is not None
    new_rows: list[LaunchIntent] = []
    surplus: list[RowView] = []
    released: list[RowView] = []
    for key in sorted(set(held) | set(inp.target)):
        have = held.get(key, [])
        want = max(0, int(inp.target.get(key, 0)))
        if want < len(have) and not any(b.status[r.key] in _STARTING for r in have):
            # Ready instances that run no job go first, at once: releasing one disrupts
            # nothing, and keeping it bills idle time while nothing of its offering is still
            # coming up (then the booting one would be the one to spare).
            empty = [
                r
                for r in have
                if b.status[r.key] is InstanceStatus.RUNNING
                and inp.used_gpus.get(r.key, 0) == 0
                and boot_phase(
                    InstanceStatus.RUNNING,
                    cloud_running=r.provider_instance_id in booted,
                    heard_s=r.last_heartbeat_s,
                    needs_agent=needs_agent,
                )
                is BootPhase.READY
            ]
            # The hold's own (kept for the next job: hold.kept_empty) last, then newest first.
            empty.sort(key=lambda r: (r.key in inp.held, -(r.started_s or 0.0), r.key))
            gone = empty[: len(have) - want]
            released.extend(gone)
            have = [r for r in have if r not in gone]
        if want > len(have):
            if key in inp.unavailable:
                continue
            running = sum(1 for r in have if b.status[r.key] is InstanceStatus.RUNNING)
            limit = max(cfg.min_launches_per_offering, math.floor(cfg.launch_growth * running))
            count = min(want - len(have), limit, max(0, cfg.max_in_flight - in_flight))
            new_rows.extend(LaunchIntent(key) for _ in range(count))
            in_flight += count
        elif want < len(have):
            ready = [
                r
                for r in have
                if b.status[r.key] is InstanceStatus.RUNNING and r.key not in inp.held
            ]
            # Fewest GPUs of jobs still training first, then the newest (least sunk
            # provisioning).
            ready.sort(key=lambda r: (_training_gpus(inp, r.key), -(r.started_s or 0.0), r.key))
            surplus.extend(ready[: len(have) - want])
    for row in released:
        b.stop(row, EMPTY_RELEASE_REASON)
    if launching or new_rows:
        return new_rows  # replacements first: no cost drain while instances are launching
    surplus.sort(key=lambda r: (_training_gpus(inp, r.key), r.key))
    for row in surplus[: cfg.disruption_budget]:
        b.move(row, InstanceStatus.DRAINING, "fleet target lowered (cost)")
    return new_rows
