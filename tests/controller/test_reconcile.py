"""reconcile(): the pure decision from store rows, the observed cloud and a target fleet."""

from __future__ import annotations

from autoscaler.controller.lifecycle import InstanceStatus as S
from autoscaler.controller.lifecycle import LifecycleTimeouts
from autoscaler.controller.reconcile import (
    EMPTY_RELEASE_REASON,
    NOTICE_REASON,
    ReconcileConfig,
    ReconcileInput,
    RowView,
    reconcile,
)
from providers.base import Instance, InstanceState, InterruptionKind, InterruptionNotice, Market

NOW = 10_000.0
POOL = "fake/g4dn.xlarge/us-east-1a/spot"
OTHER = "fake/p3.2xlarge/us-east-1a/on-demand"
CFG = ReconcileConfig(heartbeat_timeout_s=None)


def row(key: str, status: S, *, pid: str | None = None, since: float = NOW - 10, **kw) -> RowView:
    return RowView(
        key=key,
        request_id=f"req-{key}",
        offering_key=kw.pop("offering", POOL),
        status=status,
        since_s=since,
        provider_instance_id=pid,
        **kw,
    )


def cloud(iid: str, request: str) -> Instance:
    return Instance(
        iid, "fake", "g4dn.xlarge", "us-east-1a", Market.SPOT, InstanceState.RUNNING, "c1", request
    )


def test_adopts_an_instance_listed_under_a_known_request_id() -> None:
    out = reconcile(
        ReconcileInput(NOW, (row("a", S.REQUESTED),), (cloud("i-1", "req-a"),), target={POOL: 1}),
        CFG,
    )
    assert [(t.key, t.to, t.provider_instance_id) for t in out.transitions] == [
        ("a", S.RUNNING, "i-1")
    ]
    assert not out.leaks and not out.launch and not out.new_rows


def test_a_queued_row_whose_instance_appeared_goes_through_requested() -> None:
    out = reconcile(
        ReconcileInput(NOW, (row("a", S.QUEUED),), (cloud("i-1", "req-a"),), target={POOL: 1}),
        CFG,
    )
    assert [t.to for t in out.transitions] == [S.REQUESTED, S.RUNNING]


def test_unknown_and_duplicate_instances_are_leaks() -> None:
    rows = (row("a", S.RUNNING, pid="i-1"),)
    seen = (cloud("i-1", "req-a"), cloud("i-2", "req-a"), cloud("i-3", "req-zzz"))
    out = reconcile(ReconcileInput(NOW, rows, seen, target={POOL: 1}), CFG)
    assert sorted(leak.instance.instance_id for leak in out.leaks) == ["i-2", "i-3"]
    assert not out.transitions


def test_late_instance_of_an_ended_request_is_a_leak() -> None:
    out = reconcile(
        ReconcileInput(
            NOW, (), (cloud("i-9", "req-old"),), terminal_request_ids=frozenset({"req-old"})
        ),
        CFG,
    )
    assert [leak.instance.instance_id for leak in out.leaks] == ["i-9"]


def test_vanished_instances_are_terminated() -> None:
    rows = (
        row("a", S.RUNNING, pid="i-1"),
        row("b", S.DRAINING, pid="i-2"),
        row("c", S.TERMINATING, pid="i-3"),
    )
    out = reconcile(ReconcileInput(NOW, rows, ()), CFG)
    assert {(t.key, t.to) for t in out.transitions} == {
        ("a", S.TERMINATED),
        ("b", S.TERMINATED),
        ("c", S.TERMINATED),
    }
    # The provider ended the running and the draining one (a preemption, decided here and
    # recorded typed); the terminating one was released.
    assert {t.key: t.preemption for t in out.transitions} == {"a": True, "b": True, "c": False}


def test_spot_notice_drains_outside_the_disruption_budget() -> None:
    rows = tuple(row(k, S.RUNNING, pid=f"i-{k}") for k in "abc")
    seen = tuple(cloud(f"i-{k}", f"req-{k}") for k in "abc")
    notices = tuple(
        InterruptionNotice(f"i-{k}", InterruptionKind.SPOT_INTERRUPTION, NOW + 120, "fake")
        for k in "abc"
    )
    cfg = ReconcileConfig(heartbeat_timeout_s=None, disruption_budget=0)
    out = reconcile(
        ReconcileInput(NOW, rows, seen, notices, target={POOL: 3}, used_gpus={"a": 1}), cfg
    )
    assert out.leaving == {"a", "b", "c"}
    assert all(t.preemption and t.to is S.DRAINING for t in out.transitions)


def test_a_notice_on_an_instance_draining_for_cost_is_recorded_once() -> None:
    """Its end must bill as a preemption; its jobs are already stopping (not drained again),
    and a notice already recorded is not recorded again."""
    seen = (cloud("i-a", "req-a"),)
    notice = (InterruptionNotice("i-a", InterruptionKind.SPOT_INTERRUPTION, NOW + 120, "fake"),)
    out = reconcile(
        ReconcileInput(NOW, (row("a", S.DRAINING, pid="i-a"),), seen, notice, used_gpus={"a": 1}),
        CFG,
    )
    assert [(t.to, t.reason, t.preemption) for t in out.transitions] == [
        (S.DRAINING, NOTICE_REASON, True)
    ]
    assert not out.terminate
    again = row("a", S.DRAINING, pid="i-a", noticed=True)
    out = reconcile(ReconcileInput(NOW, (again,), seen, notice, used_gpus={"a": 1}), CFG)
    assert not out.transitions
    # Its jobs gone in the same round: recorded, then stopped.
    out = reconcile(ReconcileInput(NOW, (row("a", S.DRAINING, pid="i-a"),), seen, notice), CFG)
    assert [(t.to, t.reason) for t in out.transitions] == [
        (S.DRAINING, NOTICE_REASON),
        (S.TERMINATING, "drained: no job left on it"),
    ]
    assert out.terminate == ("a",)


def test_rebalance_recommendation_alone_drains_nothing() -> None:
    rows = (row("a", S.RUNNING, pid="i-a"),)
    note = InterruptionNotice("i-a", InterruptionKind.REBALANCE, None, "fake")
    out = reconcile(
        ReconcileInput(NOW, rows, (cloud("i-a", "req-a"),), (note,), target={POOL: 1}), CFG
    )
    assert not out.transitions


def test_shortfall_creates_rows_within_the_launch_rate_limits() -> None:
    rows = (row("a", S.RUNNING, pid="i-a"),)
    cfg = ReconcileConfig(heartbeat_timeout_s=None, min_launches_per_offering=3, max_in_flight=64)
    out = reconcile(ReconcileInput(NOW, rows, (cloud("i-a", "req-a"),), target={POOL: 100}), cfg)
    assert len(out.new_rows) == 3  # max(3, 1.0 x 1 running)
    cfg = ReconcileConfig(heartbeat_timeout_s=None, min_launches_per_offering=50, max_in_flight=5)
    out = reconcile(ReconcileInput(NOW, rows, (cloud("i-a", "req-a"),), target={POOL: 100}), cfg)
    assert len(out.new_rows) == 5  # launches in flight capped


def test_unavailable_offering_gets_no_launch_and_its_queued_rows_fail() -> None:
    rows = (row("q", S.QUEUED),)
    out = reconcile(
        ReconcileInput(NOW, rows, (), target={POOL: 4}, unavailable=frozenset({POOL})), CFG
    )
    assert not out.new_rows and not out.launch
    assert [(t.key, t.to) for t in out.transitions] == [("q", S.ALLOCATION_FAILED)]


def test_surplus_drains_the_emptiest_within_the_budget() -> None:
    rows = tuple(row(k, S.RUNNING, pid=f"i-{k}") for k in "abcde")
    seen = tuple(cloud(f"i-{k}", f"req-{k}") for k in "abcde")
    used = {"a": 4, "b": 1, "c": 2, "d": 3, "e": 4}
    cfg = ReconcileConfig(heartbeat_timeout_s=None, disruption_budget=2)
    out = reconcile(ReconcileInput(NOW, rows, seen, target={POOL: 1}, used_gpus=used), cfg)
    assert out.leaving == {"b", "c"}
    assert {t.to for t in out.transitions} == {S.DRAINING}


def test_ready_instances_with_no_job_are_released_at_once_outside_the_budget() -> None:
    """Issue 40: a ready instance that runs no job and that the target drops is released in
    that round, straight to terminating (nothing to drain), young (held) or not, and beyond
    the disruption budget, which counts disruptions; the rest of the surplus drains within
    it."""
    rows = tuple(row(k, S.RUNNING, pid=f"i-{k}") for k in "abcd")
    seen = tuple(cloud(f"i-{k}", f"req-{k}") for k in "abcd")
    used = {"a": 4, "b": 0, "c": 2, "d": 0}
    cfg = ReconcileConfig(heartbeat_timeout_s=None, disruption_budget=1)
    out = reconcile(
        ReconcileInput(
            NOW, rows, seen, target={POOL: 1}, used_gpus=used, held=frozenset({"b", "d"})
        ),
        cfg,
    )
    assert out.leaving == {"b", "c", "d"}
    moved = {t.key: (t.to, t.reason) for t in out.transitions}
    assert moved["b"] == (S.TERMINATING, EMPTY_RELEASE_REASON)
    assert moved["d"] == (S.TERMINATING, EMPTY_RELEASE_REASON)
    assert moved["c"][0] is S.DRAINING
    assert set(out.terminate) == {"b", "d"}


def test_an_empty_instance_not_yet_ready_or_of_an_offering_still_launching_stays() -> None:
    """Only a *ready* empty instance is released at once: one still booting (the cloud lists
    it pending, or its agent is not heard yet) is not, nor one of an offering whose instances
    are still being launched (the one to come is the spare)."""
    booting = Instance(
        "i-b",
        "fake",
        "g4dn.xlarge",
        "us-east-1a",
        Market.SPOT,
        InstanceState.PENDING,
        "c1",
        "req-b",
    )
    rows = (row("a", S.RUNNING, pid="i-a"), row("b", S.RUNNING, pid="i-b"))
    heard = ReconcileConfig(heartbeat_timeout_s=120.0, disruption_budget=0)
    out = reconcile(
        ReconcileInput(NOW, rows, (cloud("i-a", "req-a"), booting), target={POOL: 0}), heard
    )
    assert not out.transitions  # a: its agent never heard; b: the cloud has it pending
    rows = (
        row("a", S.RUNNING, pid="i-a", last_heartbeat_s=NOW - 1),
        row("q", S.REQUESTED),
    )
    out = reconcile(ReconcileInput(NOW, rows, (cloud("i-a", "req-a"),), target={POOL: 1}), heard)
    assert not out.transitions
    out = reconcile(ReconcileInput(NOW, rows[:1], (cloud("i-a", "req-a"),), target={}), heard)
    assert [(t.key, t.to) for t in out.transitions] == [("a", S.TERMINATING)]


def test_no_cost_drain_while_replacements_launch() -> None:
    rows = (row("a", S.RUNNING, pid="i-a"), row("n", S.REQUESTED, offering=OTHER))
    out = reconcile(
        ReconcileInput(
            NOW,
            rows,
            (cloud("i-a", "req-a"),),
            target={POOL: 0, OTHER: 1},
            used_gpus={"a": 2},  # a job to move: an empty instance goes at once (above)
            issued=frozenset({"req-n"}),
        ),
        CFG,
    )
    assert not out.leaving and not out.transitions


def test_drained_instance_without_jobs_is_terminated() -> None:
    rows = (row("a", S.DRAINING, pid="i-a"), row("b", S.DRAINING, pid="i-b"))
    seen = (cloud("i-a", "req-a"), cloud("i-b", "req-b"))
    out = reconcile(ReconcileInput(NOW, rows, seen, used_gpus={"b": 2}), CFG)
    assert out.terminate == ("a",)


def test_requested_rows_are_reissued_once_per_process_then_time_out() -> None:
    t = LifecycleTimeouts()
    fresh = row("a", S.REQUESTED, since=NOW - 5)
    out = reconcile(ReconcileInput(NOW, (fresh,), (), target={POOL: 1}), CFG)
    assert out.launch == ("a",)  # a restarted controller re-issues (launch rule dedupes)
    out = reconcile(
        ReconcileInput(NOW, (fresh,), (), target={POOL: 1}, issued=frozenset({"req-a"})), CFG
    )
    assert out.launch == () and not out.new_rows  # held: no second row for it
    stale = row("a", S.REQUESTED, since=NOW - t.requested_s - 1)
    out = reconcile(
        ReconcileInput(NOW, (stale,), (), target={POOL: 1}, issued=frozenset({"req-a"})), CFG
    )
    assert [tr.to for tr in out.transitions] == [S.QUEUED]
    spent = row("a", S.REQUESTED, since=NOW - t.requested_s - 1, retries=t.max_request_tries - 1)
    out = reconcile(
        ReconcileInput(NOW, (spent,), (), target={POOL: 1}, issued=frozenset({"req-a"})), CFG
    )
    assert [tr.to for tr in out.transitions] == [S.ALLOCATION_FAILED]


def test_dead_agent_is_terminated_after_its_timeout() -> None:
    cfg = ReconcileConfig(heartbeat_timeout_s=60.0, boot_grace_s=300.0)
    alive = row("a", S.RUNNING, pid="i-a", last_heartbeat_s=NOW - 30, started_s=NOW - 1000)
    dead = row("b", S.RUNNING, pid="i-b", last_heartbeat_s=NOW - 61, started_s=NOW - 1000)
    booting = row("c", S.RUNNING, pid="i-c", started_s=NOW - 200)
    silent = row("d", S.RUNNING, pid="i-d", started_s=NOW - 301)
    seen = tuple(cloud(f"i-{k}", f"req-{k}") for k in "abcd")
    out = reconcile(
        ReconcileInput(NOW, (alive, dead, booting, silent), seen, target={POOL: 4}), cfg
    )
    assert sorted(out.terminate) == ["b", "d"]


def test_deterministic_whatever_the_input_order() -> None:
    rows = tuple(row(k, S.RUNNING, pid=f"i-{k}") for k in "abcd")
    seen = (*(cloud(f"i-{k}", f"req-{k}") for k in "abcd"), cloud("i-x", "req-x"))
    a = reconcile(ReconcileInput(NOW, rows, seen, target={POOL: 2}), CFG)
    b = reconcile(ReconcileInput(NOW, rows[::-1], seen[::-1], target={POOL: 2}), CFG)
    assert a == b


def test_every_transition_reconcile_makes_is_an_edge_of_the_table() -> None:
    """Seeded random worlds (every status, listed or not, notices, timeouts, targets):
    each row's transitions, applied in order from its status, follow the table's edges."""
    import random

    from autoscaler.controller.lifecycle import check_transition

    rng = random.Random(7)
    statuses = list(S)
    for _ in range(400):
        rows, seen, notes = [], [], []
        for k in range(rng.randint(1, 8)):
            status = rng.choice([s for s in statuses if s is not S.TERMINATED])
            has_id = (
                status not in (S.QUEUED, S.REQUESTED, S.ALLOCATION_FAILED) or rng.random() < 0.2
            )
            pid = f"i-{k}" if has_id else None
            rows.append(
                row(
                    f"r{k}",
                    status,
                    pid=pid,
                    since=NOW - rng.choice([0, 100, 700, 2000]),
                    retries=rng.randint(0, 3),
                    last_heartbeat_s=rng.choice([None, NOW - 10, NOW - 1000]),
                    started_s=rng.choice([None, NOW - 50, NOW - 5000]),
                    offering=rng.choice([POOL, OTHER]),
                )
            )
            if rng.random() < 0.6:
                seen.append(cloud(pid or f"i-new{k}", f"req-r{k}"))
            if pid and rng.random() < 0.2:
                notes.append(
                    InterruptionNotice(pid, InterruptionKind.SPOT_INTERRUPTION, NOW + 120, "fake")
                )
        out = reconcile(
            ReconcileInput(
                NOW,
                tuple(rows),
                tuple(seen),
                tuple(notes),
                target={POOL: rng.randint(0, 6), OTHER: rng.randint(0, 3)},
                used_gpus={r.key: rng.randint(0, 2) for r in rows},
                unavailable=frozenset(rng.sample([POOL, OTHER], rng.randint(0, 1))),
                issued=frozenset(r.request_id for r in rows if rng.random() < 0.5),
            ),
            ReconcileConfig(heartbeat_timeout_s=rng.choice([None, 60.0])),
        )
        now_status = {r.key: r.status for r in rows}
        for t in out.transitions:
            check_transition(t.key, now_status[t.key], t.to)  # raises on a non-edge
            now_status[t.key] = t.to
        for key in out.terminate:
            assert now_status[key] is S.TERMINATING
        for key in out.launch:
            assert now_status[key] in (S.QUEUED, S.REQUESTED)


def test_surplus_drains_a_finishing_jobs_instance_before_a_running_jobs_new_one() -> None:
    """Issue 41: a job that finished training leaves the sizing's view at once, so the target
    drops by its instance while its processes still exit; the drain must take that instance
    (free within seconds), not the newest one, which a running job was just scaled onto (the
    demo's mlp-medium went 1 -> 2 GPUs, then 2 -> 1 when mlp-small finished)."""
    rows = (
        row("old", S.RUNNING, pid="i-old", started_s=NOW - 60),  # mlp-medium's first
        row("fin", S.RUNNING, pid="i-fin", started_s=NOW - 40),  # mlp-small, done training
        row("new", S.RUNNING, pid="i-new", started_s=NOW - 20),  # mlp-medium's second
    )
    seen = tuple(cloud(f"i-{k}", f"req-{k}") for k in ("old", "fin", "new"))
    used = {"old": 1, "fin": 1, "new": 1}
    out = reconcile(
        ReconcileInput(
            NOW, rows, seen, target={POOL: 2}, used_gpus=used, finishing_gpus={"fin": 1}
        ),
        CFG,
    )
    assert out.leaving == {"fin"}
    # without a finishing job, the newest of equally used instances goes (as before)
    out = reconcile(ReconcileInput(NOW, rows, seen, target={POOL: 2}, used_gpus=used), CFG)
    assert out.leaving == {"new"}
