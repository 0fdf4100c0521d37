"""An instance's lifecycle: its statuses, the one table of allowed transitions, and timeouts.

Pure: no I/O, no clock; every time is passed in (epoch seconds).

:data:`TRANSITIONS` is the only statement of which status changes exist. Each edge carries
the event that causes it; :func:`check_transition` refuses every other change, and the store
(:meth:`autoscaler.controller.store.Store.transition`, the only writer of an instance's
status) calls it before writing. A status with no outgoing edge is terminal
(:func:`is_terminal`): only ``terminated``.

The usual life is ``queued -> requested -> running -> draining -> terminating ->
terminated``; the other edges are retries (``requested -> queued``, ``terminating ->
terminating``, ``termination_failed -> terminating``), a late spot notice (``draining ->
draining``), failures (``-> allocation_failed``,
``-> termination_failed``) and instances vanishing from the cloud (``-> terminated``).

Decisions made here, and why:

* **Nothing reaches ``terminated`` from ``queued`` or ``requested``.** ``terminated`` means
  "no cloud instance is left for this row". A requested launch may fill after we stop waiting
  (the cloud is eventually consistent, and a launch whose answer was lost may have created an
  instance), and a queued row that was retried keeps a request id that was already sent. So
  a launch given up on goes to ``allocation_failed``, which is **not** terminal: an instance
  listed later under its request id is terminated through the row (``allocation_failed ->
  terminating``, never adopted), and only after ``allocation_failed_settle_s`` with nothing
  listed does the row settle to ``terminated``. The same rule covers a multi-instance request
  that failed after a partial fill.
* **A terminate retry is the self-edge ``terminating -> terminating``**, written to the
  history like any transition, so that the retry is recorded before its call (intent first)
  and the tries of one spell in ``terminating`` are counted from the history.
* **A spot notice on an instance already draining for cost is the self-edge ``draining ->
  draining``**, written once, so that the history (and so the cost report) shows the
  instance was reclaimed, not only released.
* **Vanishing is an edge from every status that has a known cloud instance**: ``running``,
  ``draining``, ``terminating`` and ``termination_failed`` go to ``terminated`` when the
  provider no longer lists the instance.
* ``running`` is entered only from ``requested``: an instance is adopted once, with its cloud
  id recorded, and never resurrected.

**Boot** is a phase of ``running``, not a status of its own (:func:`boot_phase`): an instance
is *launched* while its row waits for the cloud (``queued``, ``requested``), *booting* from
the moment the cloud has it until it is ready, and *ready* once the cloud lists it running
(booted, not ``pending``) and, where the controller hears agents, its agent has sent its first
heartbeat: the node can run a job. The controller gives jobs only to ready instances; the
sizing counts a booting one as capacity to come (it is held).

Timeouts are derived from the status history, not from timers: :func:`timeout_from_history`
reads how long the row has been in its status and how many retries it made;
:func:`timed_out` is the same decision over those values already extracted. Each
:class:`TimeoutAction` names the edge it causes (:attr:`TimeoutAction.edge`), and every such
edge is in the table.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from autoscaler.controller.errors import IllegalTransitionError
from autoscaler.errors import InvalidInputError

__all__ = [
    "AGENT_REVOKED",
    "TERMINAL",
    "TIMEOUT_EDGES",
    "TRANSITIONS",
    "BootPhase",
    "InstanceStatus",
    "LifecycleTimeouts",
    "StatusChange",
    "TimeoutAction",
    "boot_phase",
    "check_transition",
    "is_terminal",
    "launched_at",
    "left_at",
    "preempted_at",
    "request_retries",
    "terminate_retries",
    "timed_out",
    "timeout_from_history",
]


class InstanceStatus(StrEnum):
    """Where an instance row is in its life (the store's ``instances.status``)."""

    QUEUED = "queued"  # wanted; no cloud call made for its current try
    REQUESTED = "requested"  # launch intent written with its request id; the call is made
    RUNNING = "running"  # the cloud has it (its cloud id is recorded); jobs may run on it
    DRAINING = "draining"  # leaving: its jobs checkpoint and stop; nothing new is placed
    TERMINATING = "terminating"  # terminate intent written; the call is made (and retried)
    TERMINATED = "terminated"  # no cloud instance is left for this row (terminal)
    ALLOCATION_FAILED = "allocation_failed"  # launch given up; a late fill is still cleaned up
    TERMINATION_FAILED = "termination_failed"  # terminate retries exhausted; retried after a pause


_S = InstanceStatus

# The one transition table: from -> {to: the event that causes the change}.
TRANSITIONS: Final[Mapping[InstanceStatus, Mapping[InstanceStatus, str]]] = MappingProxyType(
    {
        _S.QUEUED: MappingProxyType(
            {
                _S.REQUESTED: "launch intent written with its request id, cloud call about to "
                "be made (or its instance is already listed under that id: adopting it)",
                _S.ALLOCATION_FAILED: "given up before the call: offering marked unavailable "
                "or no longer wanted (a request id sent on an earlier try may still fill)",
            }
        ),
        _S.REQUESTED: MappingProxyType(
            {
                _S.RUNNING: "the provider lists (or the launch returned) an instance carrying "
                "the request id: its cloud id is recorded",
                _S.QUEUED: "requested too long: retry with the same request id (bounded tries)",
                _S.ALLOCATION_FAILED: "capacity error, or requested too long with its tries "
                "exhausted",
            }
        ),
        _S.RUNNING: MappingProxyType(
            {
                _S.DRAINING: "the plan releases it (cost) or a spot notice: its jobs "
                "checkpoint and stop",
                _S.TERMINATING: "it must go without draining: its agent stopped heartbeating, "
                "or it was preempted with no time to drain",
                _S.TERMINATED: "vanished from the cloud's listing: preempted without notice, "
                "or terminated outside coadapt",
            }
        ),
        _S.DRAINING: MappingProxyType(
            {
                _S.DRAINING: "a spot notice while it drains for cost: recorded once, as a "
                "preemption (its jobs are already stopping)",
                _S.TERMINATING: "no job left on it, or draining too long",
                _S.TERMINATED: "vanished from the cloud's listing while draining (the reclaim "
                "came first)",
            }
        ),
        _S.TERMINATING: MappingProxyType(
            {
                _S.TERMINATING: "terminating too long: terminate again (bounded tries, each "
                "recorded before its call)",
                _S.TERMINATED: "the provider no longer lists it, or terminate answered not-found",
                _S.TERMINATION_FAILED: "terminating too long and its terminate tries are exhausted",
            }
        ),
        _S.TERMINATION_FAILED: MappingProxyType(
            {
                _S.TERMINATING: "retry terminate (after termination_failed_retry_s)",
                _S.TERMINATED: "the provider no longer lists it (gone after all, or removed "
                "by hand)",
            }
        ),
        _S.ALLOCATION_FAILED: MappingProxyType(
            {
                _S.TERMINATING: "an instance carrying its request id is listed after all (a "
                "late or partial fill): terminate it, never adopt it",
                _S.TERMINATED: "settled: nothing listed under its request id for "
                "allocation_failed_settle_s",
            }
        ),
        _S.TERMINATED: MappingProxyType({}),
    }
)

TERMINAL: Final[frozenset[InstanceStatus]] = frozenset(s for s in _S if not TRANSITIONS[s])
"""Statuses with no way out: the row owns no cloud instance and never will again."""

AGENT_REVOKED: Final[frozenset[InstanceStatus]] = TERMINAL | {_S.ALLOCATION_FAILED}
"""Statuses in which the instance's agent credential is refused (the API answers 401): the
instance ended, or its launch was given up on (an instance that fills late is terminated
through its row, never adopted: its agent has nothing to ask for)."""


class BootPhase(StrEnum):
    """Where an instance is in its start (see the module docstring)."""

    LAUNCHED = "launched"  # its row waits for the cloud (queued, requested)
    BOOTING = "booting"  # the cloud has it; not yet able to run a job
    READY = "ready"  # booted, and its agent heard (where agents are heard)


def boot_phase(
    status: InstanceStatus,
    *,
    cloud_running: bool,
    heard_s: float | None,
    needs_agent: bool,
) -> BootPhase | None:
    """The boot phase of a row in ``status`` (``None``: it is leaving or gone, not starting):
    ``cloud_running``, the provider lists its instance as running (booted, not pending);
    ``heard_s``, its agent's last heartbeat (``None``: never heard); ``needs_agent``, the
    controller judges agents by their heartbeats (a cluster with agents), so an instance is
    ready only once its agent is heard."""
    if status in (InstanceStatus.QUEUED, InstanceStatus.REQUESTED):
        return BootPhase.LAUNCHED
    if status is not InstanceStatus.RUNNING:
        return None
    if cloud_running and (heard_s is not None or not needs_agent):
        return BootPhase.READY
    return BootPhase.BOOTING


def check_transition(
    instance_id: str, from_status: InstanceStatus, to_status: InstanceStatus
) -> str:
    """Return the cause of the edge ``from_status -> to_status``, or raise
    :class:`IllegalTransitionError` (naming ``instance_id`` and both statuses) when the table
    has no such edge."""
    cause = TRANSITIONS[_status(from_status, "from_status")].get(_status(to_status, "to_status"))
    if cause is None:
        raise IllegalTransitionError(instance_id, str(from_status), str(to_status))
    return cause


def is_terminal(status: InstanceStatus) -> bool:
    """True for a status with no outgoing edge (``terminated``)."""
    return _status(status, "status") in TERMINAL


def _status(value: object, field: str) -> InstanceStatus:
    if isinstance(value, str):
        try:
            return InstanceStatus(value)
        except ValueError:
            pass
    raise InvalidInputError(f"{field}: unknown instance status {value!r}", field=field)


# ---- timeouts ------------------------------------------------------------------------------


class TimeoutAction(StrEnum):
    """What a row that stayed too long in its status must do; :attr:`edge` is the transition."""

    RETRY_REQUEST = "retry-request"  # requested -> queued, same request id
    FAIL_ALLOCATION = "fail-allocation"  # requested -> allocation_failed (tries exhausted)
    FORCE_TERMINATE_DRAIN = "force-terminate-drain"  # draining -> terminating
    RETRY_TERMINATE = "retry-terminate"  # terminating -> terminating, terminate again
    FAIL_TERMINATION = "fail-termination"  # terminating -> termination_failed
    RETRY_FAILED_TERMINATION = "retry-failed-termination"  # termination_failed -> terminating
    SETTLE_FAILED_ALLOCATION = "settle-failed-allocation"  # allocation_failed -> terminated

    @property
    def edge(self) -> tuple[InstanceStatus, InstanceStatus]:
        """The (from, to) transition this action makes."""
        return TIMEOUT_EDGES[self]


TIMEOUT_EDGES: Final[Mapping[TimeoutAction, tuple[InstanceStatus, InstanceStatus]]] = (
    MappingProxyType(
        {
            TimeoutAction.RETRY_REQUEST: (_S.REQUESTED, _S.QUEUED),
            TimeoutAction.FAIL_ALLOCATION: (_S.REQUESTED, _S.ALLOCATION_FAILED),
            TimeoutAction.FORCE_TERMINATE_DRAIN: (_S.DRAINING, _S.TERMINATING),
            TimeoutAction.RETRY_TERMINATE: (_S.TERMINATING, _S.TERMINATING),
            TimeoutAction.FAIL_TERMINATION: (_S.TERMINATING, _S.TERMINATION_FAILED),
            TimeoutAction.RETRY_FAILED_TERMINATION: (_S.TERMINATION_FAILED, _S.TERMINATING),
            TimeoutAction.SETTLE_FAILED_ALLOCATION: (_S.ALLOCATION_FAILED, _S.TERMINATED),
        }
    )
)


@dataclass(frozen=True)
class LifecycleTimeouts:
    """How long a row may stay in each waiting status (seconds), and how many tries it gets.

    ``max_request_tries`` is the most times one request id is sent to the provider (the first
    try and its retries); a request that times out on its last try fails.
    ``max_terminate_tries`` is the same for the terminate calls of one spell in
    ``terminating``. ``termination_failed_retry_s`` is the pause before a failed termination
    starts a new spell of tries; ``allocation_failed_settle_s`` how long a failed launch is
    watched for a late fill before it settles to ``terminated``. A status is "too long" when
    strictly more than its limit has passed since the row entered it (or since its last retry).
    """

    requested_s: float = 600.0
    draining_s: float = 300.0
    terminating_s: float = 300.0
    termination_failed_retry_s: float = 1800.0
    allocation_failed_settle_s: float = 600.0
    max_request_tries: int = 3
    max_terminate_tries: int = 3

    def __post_init__(self) -> None:
        for name in (
            "requested_s",
            "draining_s",
            "terminating_s",
            "termination_failed_retry_s",
            "allocation_failed_settle_s",
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise InvalidInputError(
                    f"{name} must be a finite number > 0, got {value!r}", field=name
                )
        for name in ("max_request_tries", "max_terminate_tries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(
                    f"{name} must be an integer >= 1, got {value!r}", field=name
                )


@dataclass(frozen=True)
class StatusChange:
    """One entry of an instance's status history: it entered ``status`` at ``at_s`` because
    of ``reason``; ``preemption``: this change is the provider taking the instance back (set
    where it is decided, :class:`~autoscaler.controller.reconcile.Transition`, and read by
    :func:`preempted_at`)."""

    status: InstanceStatus
    at_s: float
    reason: str = ""
    preemption: bool = False


def launched_at(history: Sequence[StatusChange]) -> float | None:
    """When the instance was launched (``None``: never): its first change to ``requested``,
    the launch intent written just before the cloud call. The one reading of a launch that the
    events (an instance's age at its drain) and the churn figures share."""
    return next((c.at_s for c in history if c.status is InstanceStatus.REQUESTED), None)


def left_at(history: Sequence[StatusChange]) -> float | None:
    """When the instance was decided to leave the fleet (``None``: never): its first change to
    ``draining`` (for cost or a spot notice) or, not drained, to ``terminating``."""
    leaving = (InstanceStatus.DRAINING, InstanceStatus.TERMINATING)
    return next((c.at_s for c in history if c.status in leaving), None)


def preempted_at(history: Sequence[StatusChange]) -> float | None:
    """When the provider took the instance back (``None``: it never did): its first change
    recorded as a preemption (a spot notice, or vanishing while running or draining). The one
    reading of a preemption that billing, the events and the round share."""
    return next((change.at_s for change in history if change.preemption), None)


def timed_out(
    status: InstanceStatus,
    since_s: float,
    now_s: float,
    retries: int,
    timeouts: LifecycleTimeouts,
) -> TimeoutAction | None:
    """What a row in ``status`` since ``since_s`` must do at ``now_s``, or ``None``.

    ``since_s`` is when the row entered its status, or its last retry in it (the time of its
    last history entry). ``retries`` is how many retries the current try count already used:
    for ``requested``, the times its request went back to ``queued`` (the row's
    ``request_tries``, :func:`request_retries`); for ``terminating``, the terminate retries of
    the current spell (:func:`terminate_retries`); ignored for other statuses. Statuses with
    no timeout (``queued``, ``running``, ``terminated``) give ``None``; so does a ``now_s``
    before ``since_s`` (a clock step back is never "too long").
    """
    status = _status(status, "status")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidInputError(
            f"retries must be an integer >= 0, got {retries!r}", field="retries"
        )
    waited_s = now_s - since_s
    t = timeouts
    if status is _S.REQUESTED and waited_s > t.requested_s:
        if retries + 1 < t.max_request_tries:
            return TimeoutAction.RETRY_REQUEST
        return TimeoutAction.FAIL_ALLOCATION
    if status is _S.DRAINING and waited_s > t.draining_s:
        return TimeoutAction.FORCE_TERMINATE_DRAIN
    if status is _S.TERMINATING and waited_s > t.terminating_s:
        if retries + 1 < t.max_terminate_tries:
            return TimeoutAction.RETRY_TERMINATE
        return TimeoutAction.FAIL_TERMINATION
    if status is _S.TERMINATION_FAILED and waited_s > t.termination_failed_retry_s:
        return TimeoutAction.RETRY_FAILED_TERMINATION
    if status is _S.ALLOCATION_FAILED and waited_s > t.allocation_failed_settle_s:
        return TimeoutAction.SETTLE_FAILED_ALLOCATION
    return None


def request_retries(history: Sequence[StatusChange]) -> int:
    """How many times the row's request went back to ``queued`` after ``requested`` (the
    retries of its one request id). The store keeps ``instances.request_tries`` equal to it."""
    return sum(
        1
        for before, after in itertools.pairwise(history)
        if before.status is _S.REQUESTED and after.status is _S.QUEUED
    )


def terminate_retries(history: Sequence[StatusChange]) -> int:
    """The terminate retries of the current spell in ``terminating``: the trailing run of
    ``terminating`` entries, less the one that began it (0 when not terminating)."""
    run = 0
    for change in reversed(history):
        if change.status is not _S.TERMINATING:
            break
        run += 1
    return max(0, run - 1)


def timeout_from_history(
    history: Sequence[StatusChange], now_s: float, timeouts: LifecycleTimeouts
) -> TimeoutAction | None:
    """:func:`timed_out` for a row with this status ``history`` (oldest first, as
    ``Store.history`` returns it): its status and ``since_s`` are those of the last entry, its
    retries are counted from the entries. Raises :class:`InvalidInputError` for an empty
    history or one whose times go backwards."""
    if not history:
        raise InvalidInputError("an instance's status history is never empty", field="history")
    for before, after in itertools.pairwise(history):
        if after.at_s < before.at_s:
            raise InvalidInputError(
                f"status history goes back in time: {before.status} at {before.at_s} then "
                f"{after.status} at {after.at_s}",
                field="history",
            )
    last = history[-1]
    status = _status(last.status, "history")
    if status is _S.REQUESTED:
        retries = request_retries(history)
    elif status is _S.TERMINATING:
        retries = terminate_retries(history)
    else:
        retries = 0
    return timed_out(status, last.at_s, now_s, retries, timeouts)
