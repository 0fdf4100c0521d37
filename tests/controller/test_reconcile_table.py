"""reconcile(): its documented contract as a table, and as properties of random worlds.

The table (:data:`CASES`) has one row per (stored status, what the provider lists for it,
past its timeout or not, offering unavailable or not) and the outcome the docstrings of
:mod:`autoscaler.controller.reconcile` and :mod:`autoscaler.controller.lifecycle` give for
it. Sizing is switched off there (no new rows, no cost drains), so each row shows what
reconcile does to one instance row on its own. ``None`` in an expectation: the docstrings
say nothing about it, so nothing is asserted.

The properties draw random worlds (rows in every live status, listed or not, with second
instances, foreign and late instances, notices of every kind, stalls, targets, knobs) and
check rules that hold whatever the world. Each says in a comment what a wrong implementation
it catches would look like.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Container, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.controller.lifecycle import TRANSITIONS, LifecycleTimeouts, check_transition
from autoscaler.controller.lifecycle import InstanceStatus as S
from autoscaler.controller.liveness import silence_s
from autoscaler.controller.reconcile import (
    EMPTY_RELEASE_REASON,
    NOTICE_REASON,
    UNAVAILABLE_REASON,
    VANISHED_REASON,
    Actions,
    ReconcileConfig,
    ReconcileInput,
    RowView,
    reconcile,
)
from providers.base import Instance, InstanceState, InterruptionKind, InterruptionNotice, Market

NOW = 100_000.0
POOL = "fake/g4dn.xlarge/us-east-1a/spot"
T = LifecycleTimeouts()
HEARTBEAT_S = 120.0
BOOT_GRACE_S = 600.0
TABLE_CFG = ReconcileConfig(
    heartbeat_timeout_s=HEARTBEAT_S,
    boot_grace_s=BOOT_GRACE_S,
    disruption_budget=0,  # no cost drain
    min_launches_per_offering=0,  # no new row: max(0, 0.0 x held) = 0
    launch_growth=0.0,
)
WITH_ID = frozenset({S.RUNNING, S.DRAINING, S.TERMINATING, S.TERMINATION_FAILED})
"""Statuses whose row has its cloud id recorded (``running`` is entered with it, and the
later statuses of a launched instance keep it)."""
LIMIT_S = {
    S.REQUESTED: T.requested_s,
    S.DRAINING: T.draining_s,
    S.TERMINATING: T.terminating_s,
    S.TERMINATION_FAILED: T.termination_failed_retry_s,
    S.ALLOCATION_FAILED: T.allocation_failed_settle_s,
}
"""How long each status may last (``queued`` and ``running`` have no timeout)."""

OWN, SECOND, OTHER = "i-own", "i-second", "i-other"
"""Instance ids: the row's own (recorded, or the one it adopts), a second instance under the
same request id, and another instance under its request id while its own is gone."""


def cloud(iid: str, request: str, state: InstanceState = InstanceState.RUNNING) -> Instance:
    return Instance(iid, "fake", "g4dn.xlarge", "us-east-1a", Market.SPOT, state, "c1", request)


def notice(iid: str, kind: InterruptionKind) -> InterruptionNotice:
    deadline = None if kind is InterruptionKind.REBALANCE else NOW + 120
    return InterruptionNotice(iid, kind, deadline, "fake")


# ---- the table -------------------------------------------------------------------------------


class Cloud(StrEnum):
    """What the provider lists for the row's request id (and the notices it returns)."""

    ABSENT = "absent"  # nothing
    LISTED = "listed"  # its instance, running
    STOPPING = "stopping"  # its instance, listed in state stopping (still listed)
    SPOT = "spot-notice"  # listed, with a spot-interruption notice
    PREEMPTED = "preempted-notice"  # listed, with a preemption notice (GCP)
    TERMINATED = "terminated-notice"  # listed, with a notice that it is stopping/terminated
    REBALANCE = "rebalance"  # listed, with a rebalance recommendation only (no deadline)
    TWICE = "twice"  # its instance and a second one under the same request id
    OTHER = "other"  # not its recorded instance, but another one under its request id


NOTICE_KIND = {
    Cloud.SPOT: InterruptionKind.SPOT_INTERRUPTION,
    Cloud.PREEMPTED: InterruptionKind.PREEMPTED,
    Cloud.TERMINATED: InterruptionKind.TERMINATED,
    Cloud.REBALANCE: InterruptionKind.REBALANCE,
}

Step = tuple[S, bool]
"""One expected transition of the row: (to, preemption)."""


@dataclass(frozen=True)
class Case:
    """One row of the table. ``status``: the stored row's (``None``: no row knows the request
    id; ``terminated``: the row ended, its request id is among ``terminal_request_ids``).
    ``late``: past its status's limit (``running``: its agent silent past its heartbeat
    timeout, or its boot grace when ``booting``); not late is exactly *at* the limit, which
    is not "too long" (strictly more is). ``adopt_at``: the index of the transition that
    records the listed instance's id (:data:`OWN`); every other transition records none."""

    status: S | None
    cloud: Cloud
    expect: tuple[Step, ...] = ()
    launch: bool | None = False
    terminate: bool | None = False
    leaks: tuple[str, ...] = ()
    late: bool = False
    unavailable: bool = False
    tries_spent: bool = False  # requested/terminating: this was the last try
    issued: bool = True  # this process already sent the row's launch
    jobs: int = 1  # GPUs of jobs on the instance
    noticed: bool = False  # draining: its history already records a spot notice
    booting: bool = False  # running: no heartbeat yet
    adopt_at: int | None = None
    reason: str | None = None  # the documented reason of the first transition


def case_id(c: Case) -> str:
    parts = [str(c.status) if c.status is not None else "no-row", str(c.cloud)]
    if c.booting:
        parts.append("booting")
    if c.status is S.RUNNING:
        parts.append("silent" if c.late else "heard")
    elif c.status in LIMIT_S:
        parts.append("past-limit" if c.late else "at-limit")
    elif c.late:  # queued: no limit to pass
        parts.append("long-queued")
    flags = {
        "tries-spent": c.tries_spent,
        "unavailable": c.unavailable,
        "not-issued": not c.issued,
        "no-jobs": c.jobs == 0,
        "noticed-before": c.noticed,
    }
    return "-".join(parts + [name for name, on in flags.items() if on])


def table_input(c: Case) -> ReconcileInput:
    key, req = "r", "req-r"
    listed = {
        Cloud.ABSENT: (),
        Cloud.STOPPING: (cloud(OWN, req, InstanceState.STOPPING),),
        Cloud.TWICE: (cloud(OWN, req), cloud(SECOND, req)),
        Cloud.OTHER: (cloud(OTHER, req),),
    }.get(c.cloud, (cloud(OWN, req),))
    kind = NOTICE_KIND.get(c.cloud)
    notices = () if kind is None else (notice(OWN, kind),)
    rows: tuple[RowView, ...] = ()
    terminal: frozenset[str] = frozenset()
    if c.status is S.TERMINATED:
        terminal = frozenset({req})
    elif c.status is not None:
        heartbeat: float | None = None
        started: float | None = None
        since = NOW - 50_000.0 if c.late else NOW - 10.0
        if c.status in LIMIT_S:
            since = NOW - LIMIT_S[c.status] - (1.0 if c.late else 0.0)
        if c.status is S.RUNNING:
            since = NOW - 50_000.0
            if c.booting:
                started = NOW - BOOT_GRACE_S - (1.0 if c.late else 0.0)
                since = started
            else:
                started = since
                heartbeat = NOW - HEARTBEAT_S - (1.0 if c.late else 0.0)
        tries = {S.REQUESTED: T.max_request_tries, S.TERMINATING: T.max_terminate_tries}
        rows = (
            RowView(
                key=key,
                request_id=req,
                offering_key=POOL,
                status=c.status,
                since_s=since,
                retries=tries[c.status] - 1 if c.tries_spent else 0,
                provider_instance_id=OWN if c.status in WITH_ID else None,
                last_heartbeat_s=heartbeat,
                started_s=started,
                noticed=c.noticed,
            ),
        )
    return ReconcileInput(
        NOW,
        rows,
        listed,
        notices,
        target={},
        used_gpus={key: c.jobs},
        unavailable=frozenset({POOL}) if c.unavailable else frozenset(),
        issued=frozenset({req}) if c.issued else frozenset(),
        terminal_request_ids=terminal,
    )


ADOPTED = ((S.RUNNING, False),)
GONE = ((S.TERMINATED, True),)  # vanished while running or draining: a preemption
RELEASED = ((S.TERMINATED, False),)  # vanished while terminating or after a failed one
STOP = ((S.TERMINATING, False),)
NOTICED = ((S.DRAINING, True),)


_C = Case
CASES = [
    # No live row: an instance under an unknown request id, or under one that already ended.
    _C(None, Cloud.ABSENT),
    _C(None, Cloud.LISTED, leaks=(OWN,)),
    _C(None, Cloud.SPOT, leaks=(OWN,)),
    _C(S.TERMINATED, Cloud.LISTED, leaks=(OWN,)),
    # queued: no timeout; launched unless its offering is unavailable; adopted via requested.
    _C(S.QUEUED, Cloud.ABSENT, launch=True),
    _C(S.QUEUED, Cloud.ABSENT, launch=True, late=True),
    _C(S.QUEUED, Cloud.ABSENT, launch=True, issued=False),
    _C(
        S.QUEUED,
        Cloud.ABSENT,
        ((S.ALLOCATION_FAILED, False),),
        unavailable=True,
        reason=UNAVAILABLE_REASON,
    ),
    _C(S.QUEUED, Cloud.LISTED, ((S.REQUESTED, False), *ADOPTED), adopt_at=1),
    _C(S.QUEUED, Cloud.LISTED, ((S.REQUESTED, False), *ADOPTED), adopt_at=1, unavailable=True),
    _C(S.QUEUED, Cloud.TWICE, ((S.REQUESTED, False), *ADOPTED), adopt_at=1, leaks=(SECOND,)),
    _C(S.QUEUED, Cloud.REBALANCE, ((S.REQUESTED, False), *ADOPTED), adopt_at=1),
    _C(
        S.QUEUED,
        Cloud.SPOT,
        ((S.REQUESTED, False), *ADOPTED, *NOTICED),
        adopt_at=1,
    ),
    # requested: re-issued once per process, timed out back to queued or failed; adopted.
    _C(S.REQUESTED, Cloud.ABSENT),
    _C(S.REQUESTED, Cloud.ABSENT, launch=True, issued=False),
    _C(S.REQUESTED, Cloud.ABSENT, launch=True, issued=False, unavailable=True),
    _C(S.REQUESTED, Cloud.ABSENT, ((S.QUEUED, False),), launch=None, late=True),
    _C(S.REQUESTED, Cloud.ABSENT, ((S.QUEUED, False),), launch=None, late=True, issued=False),
    _C(S.REQUESTED, Cloud.ABSENT, ((S.ALLOCATION_FAILED, False),), late=True, tries_spent=True),
    _C(S.REQUESTED, Cloud.LISTED, ADOPTED, adopt_at=0),
    _C(S.REQUESTED, Cloud.LISTED, ADOPTED, adopt_at=0, issued=False),
    _C(S.REQUESTED, Cloud.LISTED, ADOPTED, adopt_at=0, late=True),
    _C(S.REQUESTED, Cloud.LISTED, ADOPTED, adopt_at=0, late=True, tries_spent=True),
    _C(S.REQUESTED, Cloud.LISTED, ADOPTED, adopt_at=0, unavailable=True),
    _C(S.REQUESTED, Cloud.STOPPING, ADOPTED, adopt_at=0),
    _C(S.REQUESTED, Cloud.TWICE, ADOPTED, adopt_at=0, leaks=(SECOND,)),
    _C(S.REQUESTED, Cloud.REBALANCE, ADOPTED, adopt_at=0),
    _C(S.REQUESTED, Cloud.SPOT, (*ADOPTED, *NOTICED), adopt_at=0),
    # running: vanished = preempted; a notice drains it; a silent agent is released.
    _C(S.RUNNING, Cloud.ABSENT, GONE, reason=VANISHED_REASON),
    _C(S.RUNNING, Cloud.ABSENT, GONE, late=True),
    _C(S.RUNNING, Cloud.LISTED),
    # ... one that runs no job and that the target (none here) drops goes at once.
    _C(S.RUNNING, Cloud.LISTED, STOP, terminate=True, jobs=0, reason=EMPTY_RELEASE_REASON),
    _C(S.RUNNING, Cloud.LISTED, unavailable=True),
    _C(S.RUNNING, Cloud.LISTED, STOP, terminate=True, late=True),
    _C(S.RUNNING, Cloud.LISTED, booting=True),
    _C(S.RUNNING, Cloud.LISTED, STOP, terminate=True, late=True, booting=True),
    _C(S.RUNNING, Cloud.STOPPING),
    _C(S.RUNNING, Cloud.SPOT, NOTICED, reason=NOTICE_REASON),
    _C(S.RUNNING, Cloud.SPOT, NOTICED, late=True),
    _C(S.RUNNING, Cloud.PREEMPTED, NOTICED),
    _C(S.RUNNING, Cloud.TERMINATED, NOTICED),
    _C(S.RUNNING, Cloud.REBALANCE),
    _C(S.RUNNING, Cloud.TWICE, leaks=(SECOND,)),
    _C(S.RUNNING, Cloud.OTHER, GONE, leaks=(OTHER,)),
    # draining: vanished = preempted; drained or too long -> terminating; a notice recorded once.
    _C(S.DRAINING, Cloud.ABSENT, GONE, reason=VANISHED_REASON),
    _C(S.DRAINING, Cloud.ABSENT, GONE, late=True, jobs=0),
    _C(S.DRAINING, Cloud.LISTED),
    _C(S.DRAINING, Cloud.LISTED, STOP, terminate=True, late=True),
    _C(S.DRAINING, Cloud.LISTED, STOP, terminate=True, jobs=0),
    _C(S.DRAINING, Cloud.STOPPING),
    _C(S.DRAINING, Cloud.SPOT, NOTICED, reason=NOTICE_REASON),
    _C(S.DRAINING, Cloud.PREEMPTED, NOTICED),
    _C(S.DRAINING, Cloud.SPOT, noticed=True),
    _C(S.DRAINING, Cloud.SPOT, (*NOTICED, *STOP), terminate=True, jobs=0),
    _C(S.DRAINING, Cloud.SPOT, STOP, terminate=True, jobs=0, noticed=True),
    _C(S.DRAINING, Cloud.SPOT, NOTICED, late=True),
    _C(S.DRAINING, Cloud.REBALANCE),
    _C(S.DRAINING, Cloud.TWICE, leaks=(SECOND,)),
    _C(S.DRAINING, Cloud.OTHER, GONE, leaks=(OTHER,)),
    # terminating: vanished = released; too long -> again (bounded) or termination_failed.
    _C(S.TERMINATING, Cloud.ABSENT, RELEASED, reason=VANISHED_REASON),
    _C(S.TERMINATING, Cloud.ABSENT, RELEASED, late=True),
    _C(S.TERMINATING, Cloud.LISTED),
    _C(S.TERMINATING, Cloud.LISTED, terminate=None, issued=False),
    _C(S.TERMINATING, Cloud.LISTED, ((S.TERMINATING, False),), terminate=True, late=True),
    _C(
        S.TERMINATING,
        Cloud.LISTED,
        ((S.TERMINATION_FAILED, False),),
        late=True,
        tries_spent=True,
    ),
    _C(S.TERMINATING, Cloud.SPOT),
    _C(S.TERMINATING, Cloud.TWICE, leaks=(SECOND,)),
    _C(S.TERMINATING, Cloud.OTHER, RELEASED, leaks=(OTHER,)),
    # termination_failed: vanished = released; retried after its pause.
    _C(S.TERMINATION_FAILED, Cloud.ABSENT, RELEASED),
    _C(S.TERMINATION_FAILED, Cloud.ABSENT, RELEASED, late=True),
    _C(S.TERMINATION_FAILED, Cloud.LISTED),
    _C(S.TERMINATION_FAILED, Cloud.LISTED, STOP, terminate=True, late=True),
    _C(S.TERMINATION_FAILED, Cloud.SPOT),
    _C(S.TERMINATION_FAILED, Cloud.TWICE, leaks=(SECOND,)),
    # allocation_failed: a late fill is terminated through the row, never adopted; settles.
    _C(S.ALLOCATION_FAILED, Cloud.ABSENT),
    _C(S.ALLOCATION_FAILED, Cloud.ABSENT, RELEASED, late=True),
    _C(S.ALLOCATION_FAILED, Cloud.ABSENT, unavailable=True),
    _C(S.ALLOCATION_FAILED, Cloud.LISTED, STOP, terminate=True, adopt_at=0),
    _C(S.ALLOCATION_FAILED, Cloud.LISTED, STOP, terminate=True, adopt_at=0, late=True),
    _C(S.ALLOCATION_FAILED, Cloud.LISTED, STOP, terminate=True, adopt_at=0, unavailable=True),
    _C(S.ALLOCATION_FAILED, Cloud.SPOT, STOP, terminate=True, adopt_at=0),
    _C(S.ALLOCATION_FAILED, Cloud.TWICE, STOP, terminate=True, adopt_at=0, leaks=(SECOND,)),
]


def _param(c: Case) -> object:
    return pytest.param(c, id=case_id(c))


def test_the_table_covers_every_status_reconcile_acts_on() -> None:
    assert {c.status for c in CASES} == set(S) | {None}
    ids = [case_id(c) for c in CASES]
    assert len(ids) == len(set(ids)), [i for i, n in Counter(ids).items() if n > 1]


@pytest.mark.parametrize("c", [_param(c) for c in CASES])
def test_table(c: Case) -> None:
    out = reconcile(table_input(c), TABLE_CFG)
    assert [(t.key, t.to, t.preemption) for t in out.transitions] == [
        ("r", to, preemption) for to, preemption in c.expect
    ]
    assert [t.provider_instance_id for t in out.transitions] == [
        OWN if i == c.adopt_at else None for i in range(len(c.expect))
    ]
    if c.reason is not None:
        assert out.transitions[0].reason == c.reason
    if c.launch is not None:
        assert out.launch == (("r",) if c.launch else ())
    if c.terminate is not None:
        assert out.terminate == (("r",) if c.terminate else ())
    assert sorted(leak.instance.instance_id for leak in out.leaks) == sorted(c.leaks)
    assert not out.new_rows and not out.suspected


# ---- properties --------------------------------------------------------------------------------

OFFERINGS = ("fake/a/z1/spot", "fake/b/z1/spot", "fake/c/z2/on-demand")
LIVE = tuple(s for s in S if s is not S.TERMINATED)
AGES = (0.0, 10.0, 60.0, 61.0, 120.0, 121.0, 300.0, 301.0, 600.0, 601.0, 1000.0, 1801.0, 9000.0)
"""Ages (seconds before NOW) around every default limit: at it, and just past it."""
KINDS = tuple(InterruptionKind)


@dataclass(frozen=True)
class World:
    inp: ReconcileInput
    cfg: ReconcileConfig


LISTINGS = ("none", "own", "own+second", "other")
"""What the provider lists under a row's request id: nothing, its instance (recorded or to
adopt), that and a second one, or only another one."""
SETTLED = (S.RUNNING, S.RUNNING, S.RUNNING, S.DRAINING, S.TERMINATING)
"""A fleet with nothing launching, mostly running (where cost drains and liveness act)."""
TRIMMED = (S.RUNNING, S.RUNNING, S.RUNNING, S.REQUESTED)
"""A fleet being trimmed: running instances, now and then one still launching."""
HEARD = ("own", "own", "own+second", "none")
"""Listings of a settled fleet: mostly its own instances."""


@st.composite
def worlds(
    draw: st.DrawFn,
    statuses: Sequence[S] = LIVE,
    listings: Sequence[str] = LISTINGS,
    heartbeats: Sequence[float | None] = (None, 60.0, 120.0),
    most: int = 6,
    pools: Sequence[str] = OFFERINGS,
) -> World:
    """A random world: rows drawn from ``statuses``, listed as ``listings`` say, with the
    agent heartbeat timeout from ``heartbeats`` and a target of at most ``most`` per
    offering."""
    rows: list[RowView] = []
    observed: list[Instance] = []
    notices: list[InterruptionNotice] = []
    for k in range(draw(st.integers(0, 7))):
        key = f"r{k}"
        status = draw(st.sampled_from(statuses))
        pid = f"i-{key}" if status in WITH_ID else None
        started = heartbeat = None
        if status is S.RUNNING:
            started_age = draw(st.sampled_from(AGES))
            started = NOW - started_age
            heard = draw(st.sampled_from((None, *(a for a in AGES if a <= started_age))))
            heartbeat = None if heard is None else NOW - heard
        rows.append(
            RowView(
                key=key,
                request_id=f"q-{key}",
                offering_key=draw(st.sampled_from(pools)),
                status=status,
                since_s=NOW - draw(st.sampled_from(AGES)),
                retries=draw(st.integers(0, 3)),
                provider_instance_id=pid,
                last_heartbeat_s=heartbeat,
                started_s=started,
                noticed=status is S.DRAINING and draw(st.booleans()),
            )
        )
        listing = draw(st.sampled_from(listings))
        ids = {"none": (), "own": ("",), "own+second": ("", "-2"), "other": ("-x",)}[listing]
        for suffix in ids:
            observed.append(cloud(f"i-{key}{suffix}", f"q-{key}"))
    terminal: set[str] = set()
    for j in range(draw(st.integers(0, 3))):  # instances of no live row
        req = f"q-ended{j}" if draw(st.booleans()) else f"q-unknown{j}"
        if req.startswith("q-ended"):
            terminal.add(req)
        observed.append(cloud(f"i-foreign{j}", req))
    for inst in observed:
        if draw(st.integers(0, 3)) == 0:
            notices.append(notice(inst.instance_id, draw(st.sampled_from(KINDS))))
    stalls = draw(
        st.lists(
            st.tuples(st.sampled_from(AGES), st.sampled_from(AGES)).map(
                lambda ab: (NOW - max(ab), NOW - min(ab))
            ),
            max_size=1,
        )
    )
    inp = ReconcileInput(
        now_s=NOW,
        rows=tuple(rows),
        observed=tuple(observed),
        notices=tuple(notices),
        target={o: draw(st.integers(0, most)) for o in draw(st.sets(st.sampled_from(OFFERINGS)))},
        used_gpus={r.key: draw(st.integers(0, 2)) for r in rows},
        unavailable=frozenset(draw(st.sets(st.sampled_from(OFFERINGS), max_size=2))),
        issued=frozenset(r.request_id for r in rows if draw(st.booleans())),
        terminal_request_ids=frozenset(terminal),
        stalls=tuple(stalls),
    )
    cfg = ReconcileConfig(
        timeouts=LifecycleTimeouts(
            max_request_tries=draw(st.integers(1, 3)), max_terminate_tries=draw(st.integers(1, 3))
        ),
        heartbeat_timeout_s=draw(st.sampled_from(heartbeats)),
        boot_grace_s=draw(st.sampled_from((0.0, 300.0, 600.0))),
        mass_silence_fraction=draw(st.sampled_from((0.3, 0.55, 1.0))),
        mass_silence_min_instances=draw(st.integers(0, 4)),
        mass_silence_hold_s=draw(st.sampled_from((0.0, 900.0, 5000.0))),
        disruption_budget=draw(st.integers(0, 3)),
        launch_growth=draw(st.sampled_from((0.0, 0.5, 1.0, 2.0))),
        min_launches_per_offering=draw(st.integers(0, 4)),
        max_in_flight=draw(st.integers(0, 10)),
    )
    return World(inp, cfg)


EXAMPLES = settings(max_examples=25)


def final_status(inp: ReconcileInput, out: Actions) -> dict[str, S]:
    """Each row's status once the transitions are applied in order (each checked an edge)."""
    status = {r.key: r.status for r in inp.rows}
    for t in out.transitions:
        check_transition(t.key, status[t.key], t.to)  # raises on an edge the table lacks
        status[t.key] = t.to
    return status


def own_listed(inp: ReconcileInput) -> dict[str, Instance]:
    """Row key -> its recorded instance, where the provider lists it."""
    by_id = {i.instance_id: i for i in inp.observed}
    return {
        r.key: by_id[r.provider_instance_id]
        for r in inp.rows
        if r.provider_instance_id in by_id
        and by_id[r.provider_instance_id].request_id == r.request_id
    }


def interrupted(inp: ReconcileInput) -> set[str]:
    """Instance ids with a notice that announces their end (a rebalance announces none)."""
    return {n.instance_id for n in inp.notices if n.kind is not InterruptionKind.REBALANCE}


@EXAMPLES
@given(worlds())
def test_every_transition_is_an_edge_of_the_lifecycle(w: World) -> None:
    # Wrong: adopting a queued row straight to running, settling a requested row to
    # terminated, draining a terminating row for a notice: check_transition raises.
    out = reconcile(w.inp, w.cfg)
    after = final_status(w.inp, out)
    assert {t.key for t in out.transitions} <= after.keys()
    for key in out.terminate:  # terminate only what is (now) terminating
        assert after[key] is S.TERMINATING
    for key in out.launch:  # launch only what waits to be launched
        assert after[key] in (S.QUEUED, S.REQUESTED)
    # Self-edges: a notice recorded once on a draining row, a terminate retry with its call.
    # Wrong: recording the notice again every round (noticed rows), a retry with no call.
    rows = {r.key: r for r in w.inp.rows}
    status = {r.key: r.status for r in w.inp.rows}
    for t in out.transitions:
        if t.to is status[t.key] is S.DRAINING:
            assert t.preemption and not rows[t.key].noticed
        if t.to is status[t.key] is S.TERMINATING:
            assert t.key in out.terminate
        status[t.key] = t.to
    assert max(Counter(t.key for t in out.transitions).values(), default=0) <= 3


@EXAMPLES
@given(worlds(), st.data())
def test_deterministic_and_independent_of_input_order(w: World, data: st.DataObject) -> None:
    # Wrong: visiting rows or instances in the order they came in (which instance of a
    # request is adopted, the order of launches and leaks, which surplus row drains).
    out = reconcile(w.inp, w.cfg)
    assert reconcile(w.inp, w.cfg) == out
    shuffled = replace(
        w.inp,
        rows=tuple(data.draw(st.permutations(w.inp.rows))),
        observed=tuple(data.draw(st.permutations(w.inp.observed))),
        notices=tuple(data.draw(st.permutations(w.inp.notices))),
        stalls=tuple(data.draw(st.permutations(w.inp.stalls))),
    )
    assert reconcile(shuffled, w.cfg) == out


@EXAMPLES
@given(worlds())
def test_no_instance_is_both_launched_and_terminated_and_calls_are_counted(w: World) -> None:
    # Wrong: stopping a draining row twice (notice, then drained), launching a row that
    # also terminates, leaking an instance a row adopts: duplicate or contradictory calls.
    out = reconcile(w.inp, w.cfg)
    assert not set(out.launch) & set(out.terminate)
    assert not set(out.launch) & out.leaving
    for keys in (out.launch, out.terminate, out.suspected):
        assert len(keys) == len(set(keys))
    leaked = [leak.instance.instance_id for leak in out.leaks]
    assert len(leaked) == len(set(leaked))
    recorded = {t.provider_instance_id for t in out.transitions} - {None}
    assert not recorded & set(leaked)
    # cloud_calls bounds the calls: one per launch, new row, terminate and leak. Wrong: one
    # of them forgotten in the count (the rate limiter would then be overrun).
    calls = len(set(out.launch)) + len(out.new_rows) + len(set(out.terminate)) + len(leaked)
    assert out.cloud_calls >= calls
    assert out.cloud_calls == (
        len(out.launch) + len(out.new_rows) + len(out.terminate) + len(out.leaks)
    )


@EXAMPLES
@given(worlds())
def test_leaving_is_every_row_moved_off_running(w: World) -> None:
    # Wrong: leaving without the self-edge draining -> draining (a noticed row keeps taking
    # jobs), or without cost drains; or a running row left running counted as leaving.
    out = reconcile(w.inp, w.cfg)
    after = final_status(w.inp, out)
    assert out.leaving == {t.key for t in out.transitions if t.to is not S.RUNNING}
    for r in w.inp.rows:
        if r.status is S.RUNNING:  # the rows the policy may place jobs on
            assert (r.key in out.leaving) == (after[r.key] is not S.RUNNING)


@EXAMPLES
@given(worlds())
def test_each_listed_instance_is_owned_once_or_leaks(w: World) -> None:
    # Wrong: adopting an instance by its tags alone (no row's request id), adopting two
    # instances of one request, leaking a row's own instance, dropping a late instance.
    out = reconcile(w.inp, w.cfg)
    rows = {r.request_id: r for r in w.inp.rows}
    leaked = Counter(leak.instance.instance_id for leak in out.leaks)
    recorded = {t.provider_instance_id: t.key for t in out.transitions if t.provider_instance_id}
    assert len(recorded) == len([t for t in out.transitions if t.provider_instance_id])
    for inst in w.inp.observed:
        row = rows.get(inst.request_id)
        if row is None:  # not in the store (ours by its tag): a leak, never adopted
            assert leaked[inst.instance_id] == 1 and inst.instance_id not in recorded
            continue
        owned = row.provider_instance_id == inst.instance_id
        adopted = recorded.get(inst.instance_id) == row.key
        assert owned + adopted + leaked[inst.instance_id] == 1, inst
        if adopted:
            assert row.provider_instance_id is None
    per_row = Counter(recorded.values())
    assert max(per_row.values(), default=0) <= 1


@EXAMPLES
@given(worlds())
def test_the_mirror_converges_in_one_round(w: World) -> None:
    # Round 1 applied to the store (statuses, recorded ids, ended rows), round 2 sees the
    # same listing: nothing is adopted again, nothing vanishes, the same instances leak.
    # Wrong: an adoption that does not record the cloud id (adopted again next round, or
    # the row then looks vanished), an ended row's late instance no longer leaked.
    out = reconcile(w.inp, w.cfg)
    after = final_status(w.inp, out)
    ids = {t.key: t.provider_instance_id for t in out.transitions if t.provider_instance_id}
    moved = {t.key for t in out.transitions}
    noticed = {t.key for t in out.transitions if t.to is S.DRAINING and t.preemption}
    rows, ended = [], set(w.inp.terminal_request_ids)
    for r in w.inp.rows:
        if after[r.key] is S.TERMINATED:
            ended.add(r.request_id)
            continue
        rows.append(
            replace(
                r,
                status=after[r.key],
                provider_instance_id=ids.get(r.key, r.provider_instance_id),
                since_s=NOW if r.key in moved else r.since_s,
                noticed=r.noticed or r.key in noticed,
                started_s=NOW if ids.get(r.key) and after[r.key] is S.RUNNING else r.started_s,
                retries=0 if r.key in moved else r.retries,
            )
        )
    again = reconcile(
        replace(w.inp, rows=tuple(rows), notices=(), terminal_request_ids=frozenset(ended)),
        w.cfg,
    )
    assert not [t for t in again.transitions if t.provider_instance_id]
    assert not [t for t in again.transitions if t.reason == VANISHED_REASON]
    assert {leak.instance.instance_id for leak in again.leaks} == {
        leak.instance.instance_id for leak in out.leaks
    }


def _held(
    after: dict[str, S], rows: Sequence[RowView], offering: str, statuses: Container[S]
) -> int:
    return sum(1 for r in rows if r.offering_key == offering and after[r.key] in statuses)


@EXAMPLES
@given(worlds())
def test_launches_stay_within_the_bounds(w: World) -> None:
    # Wrong: launching past the target, past max(min_launches, growth x running) per
    # offering or past max_in_flight in all, into an unavailable offering, or re-issuing a
    # request this process already sent.
    inp, cfg = w.inp, w.cfg
    out = reconcile(inp, cfg)
    after = final_status(inp, out)
    held_statuses = (S.QUEUED, S.REQUESTED, S.RUNNING)
    new = Counter(n.offering_key for n in out.new_rows)
    in_flight = sum(1 for s in after.values() if s in (S.QUEUED, S.REQUESTED))
    if out.new_rows:
        assert in_flight + len(out.new_rows) <= cfg.max_in_flight
    for offering in OFFERINGS:
        held = _held(after, inp.rows, offering, held_statuses)
        running = _held(after, inp.rows, offering, (S.RUNNING,))
        want = inp.target.get(offering, 0)
        limit = max(cfg.min_launches_per_offering, math.floor(cfg.launch_growth * running))
        assert new[offering] <= max(0, want - held)
        assert new[offering] <= limit
        if offering in inp.unavailable:
            assert new[offering] == 0
        elif want > held and limit > 0:  # a shortfall creates rows while there is room
            assert new[offering] > 0 or in_flight + len(out.new_rows) >= cfg.max_in_flight
    rows = {r.key: r for r in inp.rows}
    for key in out.launch:
        r = rows[key]
        if r.status is S.QUEUED:
            assert r.offering_key not in inp.unavailable
        else:
            assert r.status is S.REQUESTED and r.request_id not in inp.issued


@settings(max_examples=40)
@given(
    worlds(TRIMMED, ("own", "own", "own", "none"), heartbeats=(None,), most=2, pools=OFFERINGS[:1])
)
def test_cost_drains_stay_within_the_budget_and_take_the_emptiest(w: World) -> None:
    # Wrong: draining more than disruption_budget, draining while replacements launch,
    # draining an offering at or under its target, draining a busy instance before an idle
    # one of the same offering.
    inp, cfg = w.inp, w.cfg
    out = reconcile(inp, cfg)
    after = final_status(inp, out)
    rows = {r.key: r for r in inp.rows}
    cost = [
        t.key
        for t in out.transitions
        if t.to is S.DRAINING and not t.preemption and rows[t.key].status is S.RUNNING
    ]
    assert len(cost) <= cfg.disruption_budget
    if out.new_rows or any(s in (S.QUEUED, S.REQUESTED) for s in after.values()):
        assert not cost
    for offering in OFFERINGS:
        drained = [k for k in cost if rows[k].offering_key == offering]
        held = _held(after, inp.rows, offering, (S.QUEUED, S.REQUESTED, S.RUNNING))
        assert len(drained) <= max(0, held + len(drained) - inp.target.get(offering, 0))
        kept = [r.key for r in inp.rows if r.offering_key == offering and after[r.key] is S.RUNNING]
        if drained and kept:
            used = inp.used_gpus
            assert max(used.get(k, 0) for k in drained) <= min(used.get(k, 0) for k in kept)


@EXAMPLES
@given(worlds())
def test_preemption_is_a_notice_or_vanishing_while_running_or_draining(w: World) -> None:
    # Wrong: a terminating instance's disappearance billed as a preemption, a rebalance
    # recommendation drained as one, a running instance with a notice left running.
    inp = w.inp
    out = reconcile(inp, w.cfg)
    after = final_status(inp, out)
    own, ends = own_listed(inp), interrupted(inp)
    status = {r.key: r.status for r in inp.rows}
    instance_of = {k: i.instance_id for k, i in own.items()}
    for t in out.transitions:
        if t.provider_instance_id is not None:  # adopted this round
            instance_of[t.key] = t.provider_instance_id
        if t.to is S.TERMINATED and status[t.key] in (S.RUNNING, S.DRAINING):
            assert t.preemption and t.reason == VANISHED_REASON
        elif t.preemption:
            assert t.to is S.DRAINING and t.reason == NOTICE_REASON
            assert status[t.key] in (S.RUNNING, S.DRAINING)
            assert instance_of[t.key] in ends
        status[t.key] = t.to
    for r in inp.rows:
        if r.status is S.RUNNING and r.key in own and own[r.key].instance_id in ends:
            assert after[r.key] is S.DRAINING and r.key in out.leaving


@EXAMPLES
@given(worlds())
def test_rebalance_and_stray_notices_change_nothing(w: World) -> None:
    # Wrong: a rebalance recommendation (no deadline) treated as an interruption, or a
    # notice for an instance nobody lists acted on.
    out = reconcile(w.inp, w.cfg)
    extra = tuple(notice(i.instance_id, InterruptionKind.REBALANCE) for i in w.inp.observed)
    stray = tuple(notice("i-nowhere", kind) for kind in KINDS)
    assert reconcile(replace(w.inp, notices=(*w.inp.notices, *extra, *stray)), w.cfg) == out


@EXAMPLES
@given(worlds(SETTLED, HEARD, heartbeats=(60.0, 120.0), most=2))
def test_silent_agents_are_released_or_suspected(w: World) -> None:
    # Wrong: a dead agent kept without being suspected, a live one released, silence counted
    # through the controller's own stalls, a mass silence releasing more than one per round
    # (or not the longest silent, or one within the hold), a lone dead agent kept.
    inp, cfg = w.inp, w.cfg
    assert cfg.heartbeat_timeout_s is not None
    out = reconcile(inp, cfg)
    status = {r.key: r.status for r in inp.rows}
    released = {  # for silence (an empty ready instance the target drops goes too)
        t.key
        for t in out.transitions
        if status[t.key] is S.RUNNING and t.to is S.TERMINATING and t.reason != EMPTY_RELEASE_REASON
    }
    own, ends = own_listed(inp), interrupted(inp)
    judged = [  # running, its instance listed, no notice: its agent's liveness is judged
        r
        for r in inp.rows
        if r.status is S.RUNNING and r.key in own and own[r.key].instance_id not in ends
    ]
    silence = {}  # key -> the silence of an agent judged dead (counted while awake)
    for r in judged:
        assert r.started_s is not None
        if r.last_heartbeat_s is None:
            quiet_s, limit = silence_s(r.started_s, NOW, inp.stalls), cfg.boot_grace_s
        else:
            quiet_s = silence_s(r.last_heartbeat_s, NOW, inp.stalls)
            limit = cfg.heartbeat_timeout_s
        if quiet_s > limit:
            silence[r.key] = quiet_s
    dead = len(silence)
    mass = (
        dead > 0
        and dead >= cfg.mass_silence_min_instances
        and dead >= cfg.mass_silence_fraction * len(judged)
    )
    assert released <= set(out.terminate)
    if not mass:
        assert released == silence.keys() and not out.suspected
    else:
        assert len(released) <= 1 and not released & set(out.suspected)
        assert released | set(out.suspected) == silence.keys()
        longest = max(silence.values())
        assert bool(released) == (longest > cfg.mass_silence_hold_s)
        assert all(silence[k] == longest for k in released)
    # The controller away the whole time: nobody's silence counts.
    asleep = reconcile(replace(inp, stalls=((-math.inf, NOW),)), cfg)
    assert not asleep.suspected
    assert not [
        t
        for t in asleep.transitions
        if status[t.key] is S.RUNNING
        and t.to is S.TERMINATING
        and t.reason != EMPTY_RELEASE_REASON  # an empty ready one the target drops goes
    ]


def test_the_lifecycle_table_has_the_edges_the_table_above_uses() -> None:
    """The table's expectations are walks of the lifecycle (a typo in a Case shows here)."""
    for c in CASES:
        if c.status in (None, S.TERMINATED):
            assert not c.expect
            continue
        assert c.status is not None
        at: S = c.status
        for to, _ in c.expect:
            assert to in TRANSITIONS[at], (c, at, to)
            at = to
