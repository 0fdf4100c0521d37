"""A store that grows old: usage totals kept incrementally (equal to the whole-history
computation), the plan mark, and retention (old reports, prices and events pruned; the bill
unchanged)."""

from __future__ import annotations

import ast
import itertools
import json
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autoscaler.controller.store as store_module
from autoscaler.accounting.billing import cost_record_from_store
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import Store, apply_migrations
from autoscaler.controller.store.retention import Pruned
from coadapt_common.clock import FakeClock
from providers.base import Market

S = InstanceStatus
SPEC = json.dumps({"init_batch_size": 64})
JOBS = ("j0", "j1", "j2")
KEYS = ("i-0", "i-1", "i-2")


class SteppedClock:
    """A wall clock a test sets, also backwards (a clock stepped back by NTP)."""

    def __init__(self, now_s: float) -> None:
        self.t = now_s

    def now_s(self) -> float:
        return self.t

    def monotonic_s(self) -> float:
        return 0.0

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def add_instance(store: Store, key: str, *, offering: str = "fake/z/t/spot") -> None:
    store.add_instance(
        instance_key=key,
        request_id=f"c1-{key}",
        offering_key=offering,
        provider="fake",
        instance_type="t",
        zone="z",
        market=Market.SPOT,
        gpu_type="T4",
        gpus=4,
        price_usd_per_hour=0.5,
    )


def whole_history_usage(path: Path, now_s: float) -> dict[str, tuple[float, int]]:
    """The computation ``Store.usage`` made before schema v8, over the whole history: the
    oracle the running totals must equal."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT job_name, total(gpus * (coalesce(to_s, ?) - from_s)), "
            "count(DISTINCT from_s) FROM assignment_history GROUP BY job_name",
            (now_s,),
        ).fetchall()
    finally:
        conn.close()
    return {r[0]: (max(0.0, float(r[1])), max(0, int(r[2]) - 1)) for r in rows}


def assert_same_usage(store: Store, now_s: float) -> None:
    want = whole_history_usage(store.path, now_s)
    got = store.usage(JOBS, now_s)
    assert set(got) == set(want)
    for job, (served, restarts) in want.items():
        assert got[job][1] == restarts, job  # exactly
        assert got[job][0] == pytest.approx(served, rel=1e-12, abs=1e-6), job
    assert store.restart_counts(JOBS) == {job: r for job, (_, r) in want.items()}


# One step of a history: the clock moves (0: several changes at one instant; negative: a
# clock stepped back), a job's assignment is replaced, or its processes are relaunched.
step = st.one_of(
    st.tuples(st.just("clock"), st.sampled_from([0.0, 0.25, 1.0, 60.0, 3600.0, -30.0])),
    st.tuples(
        st.just("assign"),
        st.sampled_from(JOBS),
        st.dictionaries(st.sampled_from(KEYS), st.integers(0, 4), max_size=3),
    ),
    st.tuples(st.just("relaunch"), st.sampled_from(JOBS), st.sampled_from(KEYS)),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(step, max_size=30))
def test_usage_totals_equal_the_whole_history(steps: list[tuple]) -> None:
    """Over random histories (several placements at one instant, relaunches, a clock stepped
    back), the running totals give exactly the restarts, and the GPU-seconds to rounding, of
    the old whole-history computation, at every step."""
    clock = SteppedClock(1_700_000_000.0)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Store.create(Path(tmp) / "store.db", "c1", clock) as store,
    ):
        store.set_durable(False)
        for job in JOBS:
            store.add_job(job, SPEC)
        for key in KEYS:
            add_instance(store, key)
        for s in steps:
            if s[0] == "clock":
                clock.t += s[1]
            elif s[0] == "assign":
                store.set_assignments(s[1], s[2])
            else:
                store.record_relaunch(s[1], s[2])
            assert_same_usage(store, clock.t)
        assert_same_usage(store, clock.t + 7200.0)


span = st.tuples(
    st.sampled_from(JOBS),
    st.sampled_from(KEYS),
    st.integers(1, 8),
    st.sampled_from([0.0, 10.0, 10.0, 25.5, 100.0, 3600.0]),  # repeated instants
    st.one_of(st.none(), st.sampled_from([5.0, 30.0, 400.0])),  # open, or a length
)


@settings(max_examples=25, deadline=None)
@given(st.lists(span, max_size=25))
def test_the_migration_back_fills_the_totals(spans: list[tuple]) -> None:
    """A store of schema v7 with any history opens with totals equal to that history, and
    goes on counting from them."""
    clock = FakeClock(start_s=10_000.0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v7.db"
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN")
        apply_migrations(conn, 0, 7)
        conn.execute("INSERT INTO meta VALUES ('cluster_id', 'c1')")
        for job in JOBS:
            conn.execute(
                "INSERT INTO jobs (name, spec_json, status, submitted_at_s, updated_at_s) "
                "VALUES (?, '{}', 'running', 0.0, 0.0)",
                (job,),
            )
        for key in KEYS:
            conn.execute(
                "INSERT INTO instances VALUES (?, ?, 'o', 'fake', 't', 'z', 'spot', 'T4', 8, "
                "0.5, NULL, 'queued', 0, NULL, 0.0, 0.0, 1)",
                (key, f"c1-{key}"),
            )
            conn.execute(
                "INSERT INTO instance_history (instance_key, status, at_s, reason) "
                "VALUES (?, 'queued', 0.0, 'wanted')",
                (key,),
            )
        for job, key, gpus, from_s, length in spans:
            conn.execute(
                "INSERT INTO assignment_history (job_name, instance_key, gpus, from_s, to_s) "
                "VALUES (?, ?, ?, ?, ?)",
                (job, key, gpus, from_s, None if length is None else from_s + length),
            )
        conn.execute("COMMIT")
        conn.close()
        with Store.open(path, clock) as store:
            assert_same_usage(store, clock.now_s())
            store.set_assignments("j0", {"i-0": 2})  # a placement after the migration
            clock.advance(60.0)
            store.set_assignments("j0", {"i-1": 1})
            assert_same_usage(store, clock.now_s())


def test_only_the_span_helpers_write_the_history_and_the_totals() -> None:
    """``assignment_history`` and ``job_usage`` are written by ``_open_span`` and
    ``_close_spans`` alone (the migrations aside), so no change escapes the totals."""
    package = Path(store_module.__file__).parent
    writers: dict[str, set[str]] = {}
    for module in sorted(package.glob("*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    sql = " ".join(node.value.split()).upper()
                    for table in ("ASSIGNMENT_HISTORY", "JOB_USAGE"):
                        if sql.startswith(
                            (f"INSERT INTO {table} ", f"UPDATE {table} ", f"DELETE FROM {table}")
                        ):
                            writers.setdefault(table, set()).add(fn.name)
    assert writers == {
        "ASSIGNMENT_HISTORY": {"_open_span", "_close_spans"},
        "JOB_USAGE": {"_open_span", "_close_spans"},
    }


def test_a_round_reads_no_closed_span(tmp_path: Path) -> None:
    """``usage`` reads the totals and the open spans through their indexes (the open spans'
    partial one): SQLite's plan for each of its queries scans no table."""
    clock = FakeClock()
    with Store.create(tmp_path / "s.db", "c1", clock) as store:
        store.add_job("j0", SPEC)
        add_instance(store, "i-0")
        store.set_assignments("j0", {"i-0": 1})
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        for sql, index in (
            (
                "SELECT job_name, closed_gpu_s, placements FROM job_usage WHERE job_name IN (?)",
                "sqlite_autoindex_job_usage",
            ),
            (
                "SELECT job_name, gpus, from_s FROM assignment_history "
                "WHERE job_name IN (?) AND to_s IS NULL",
                "assignment_history_open",
            ),
        ):
            plan = " ".join(r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, ("j0",)))
            assert index in plan and "SCAN" not in plan, plan
    finally:
        conn.close()


# ---- retention -----------------------------------------------------------------------------


def old_store(path: Path | str, clock: FakeClock) -> Store:
    """A store with a day of everything: jobs placed and moved, instances run and ended
    (billed), reports, prices and events, one an hour."""
    store = Store.create(path, "c1", clock)
    for job in ("j0", "j1"):
        store.add_job(job, SPEC)
    for hour in range(24):
        key = f"i-{hour:02d}"
        add_instance(store, key)
        row = store.get_instance(key)
        row = store.transition(key, row.version, S.REQUESTED, reason="launch")
        row = store.transition(
            key, row.version, S.RUNNING, reason="listed", provider_instance_id=f"x-{hour}"
        )
        store.set_assignments(f"j{hour % 2}", {key: 2})
        for job in ("j0", "j1"):
            store.add_report(job, json.dumps({"hour": hour, "job": job}))
        store.record_price("fake/z/t/spot", 0.1 + hour / 100, Market.SPOT)
        if hour == 0:
            store.record_price("fake/z/u/spot", 0.7, Market.SPOT)
        store.add_events([(clock.now_s(), "launch", key, f"hour {hour}")])
        clock.advance(1800.0)
        if hour < 23:  # the last one still runs
            store.set_assignments(f"j{hour % 2}", {})
            row = store.transition(key, row.version, S.TERMINATING, reason="released")
            row = store.transition(key, row.version, S.TERMINATED, reason="gone")
            store.add_cost_record(key, clock.now_s() - 1800.0, clock.now_s(), 0.5)
        clock.advance(1800.0)
    return store


def test_retention_prunes_old_rows_and_keeps_what_is_read(store_location: Path | str) -> None:
    """On both back ends (the pruning statements are the store's most dialect-laden)."""
    clock = FakeClock(start_s=1_000_000.0)
    start = clock.now_s()
    store = old_store(store_location, clock)
    now = clock.now_s()
    bill = cost_record_from_store(store, now)
    spans = store.assignment_history()
    usage = store.usage(["j0", "j1"], now)
    latest = store.latest_reports()
    cutoff = start + 12 * 3600.0 + 1.0  # the first 13 hours are old
    prices_after = {t: store.price_at("fake/z/t/spot", t) for t in (cutoff, cutoff + 5000, now)}

    pruned = store.prune_old(cutoff, limit=5)
    assert pruned == Pruned(reports=5, prices=5, events=5, limit=5) and pruned.more
    while store.prune_old(cutoff, limit=5).more:
        pass

    # Reports: only those from the cutoff on, and every job's latest.
    assert store.report_count() == 2 * 11
    assert store.latest_reports() == latest
    # Prices: the same answer from the cutoff on; the point in effect at the cutoff kept,
    # and an offering's only (old) point too.
    assert {t: store.price_at("fake/z/t/spot", t) for t in prices_after} == prices_after
    assert store.prices("fake/z/t/spot")[0].at_s == start + 12 * 3600.0
    assert store.price_at("fake/z/u/spot", now) == 0.7
    # Events: those from the cutoff on, cursors still good.
    events = store.events_after(0)
    assert [e.message for e in events] == [f"hour {h}" for h in range(13, 24)]
    assert store.events_after(events[-1].seq) == ()
    # The bill's records whole: the bill, the spans and the usage are unchanged.
    assert cost_record_from_store(store, now) == bill
    assert store.assignment_history() == spans
    assert store.usage(["j0", "j1"], now) == usage
    assert len(store.list_instances()) == 24 and len(store.cost_records()) == 23
    assert store.prune_old(now + 1e9) == Pruned(20, 11, 11, 1000)  # all but what is kept
    assert store.latest_reports() == latest and store.price_at("fake/z/t/spot", now) is not None
    store.close()


# ---- a round reads no past -----------------------------------------------------------------

GROWING = (
    "instances",
    "instance_history",
    "assignment_history",
    "job_usage",
    "jobs",
    "reports",
    "events",
    "price_history",
    "cost_records",
)
"""The tables that grow with the cluster's age (rows of ended instances, jobs, spans, ...)."""


def round_on_a_store_with_a_past(path: Path, past: int) -> list[str]:
    """A controller's fourth round on a store whose cluster already ran ``past`` instances
    (launched, holding a job that is done now, ended), with an event each: the statements
    the round ran, with their values."""
    from autoscaler.controller.jobbook import JobSubmission
    from autoscaler.controller.loop import Controller, ControllerConfig
    from autoscaler.controller.reconcile import ReconcileConfig
    from autoscaler.decide.sizing import SizingConfig
    from providers.fake import FakeProvider

    clock = FakeClock()
    store = Store.create(path, "c1", clock)
    store.set_durable(False)
    for job in ("old-0", "old-1", "j0", "j1"):
        spec = JobSubmission(job, 128, 1024, 128, 32, application="cifar10", command=("train.py",))
        store.add_job(job, spec.to_json())
    for i in range(past):
        key = f"past-{i:04d}"
        add_instance(store, key)
        row = store.get_instance(key)
        row = store.transition(key, row.version, S.REQUESTED, reason="launch")
        row = store.transition(key, row.version, S.RUNNING, reason="up", provider_instance_id=key)
        store.set_assignments(f"old-{i % 2}", {key: 1})
        clock.advance(600.0)
        store.set_assignments(f"old-{i % 2}", {})
        row = store.transition(key, row.version, S.TERMINATING, reason="released")
        store.transition(key, row.version, S.TERMINATED, reason="gone")
        store.add_events([(clock.now_s(), "note", key, "past")])
    for job in ("old-0", "old-1"):
        store.update_job(job, store.get_job(job).version, status="completed")
    config = ControllerConfig(
        "c1",
        sizing=SizingConfig(min_instances=4, max_instances=4),
        reconcile=ReconcileConfig(heartbeat_timeout_s=None),
        retention_s=None,  # nothing pruned: the past is all there
    )
    ctl = Controller(store, FakeProvider(clock=clock), clock, config, instance_keys=iter_keys())
    for _ in range(3):
        ctl.run_round()
        clock.advance(60.0)
    statements: list[str] = []
    conn = store._conn
    assert conn is not None
    conn.set_trace_callback(statements.append)
    ctl.run_round()
    conn.set_trace_callback(None)
    assert store.list_assignments(), "the round placed jobs: its reads are a busy round's"
    store.close()
    return statements


def iter_keys() -> Callable[[], str]:
    """Instance keys in order (the same on every store), not random ones."""
    counter = itertools.count()
    return lambda: f"i-{next(counter):04d}"


ENDED = ("'terminated'", "'completed'", "'failed'", "'cancelled'")
"""Statuses of rows that only accumulate: an index search for one reads the whole past."""


def test_a_round_reads_no_past(tmp_path: Path) -> None:
    """Every statement of a controller round on a store with a past, as SQLite plans it:
    none reads a growing table whole, and none goes through an index to the rows of an
    ended status (the status index would read every terminated instance for the leak check;
    the request ids' index is used instead)."""
    statements = round_on_a_store_with_a_past(tmp_path / "old.db", 30)
    assert any("request_id IN" in sql for sql in statements)  # the leak check ran
    conn = sqlite3.connect(tmp_path / "old.db")
    try:
        reads_past = []
        for sql in statements:
            if not sql.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
                continue
            for row in conn.execute("EXPLAIN QUERY PLAN " + sql):
                words = row[-1].split()
                whole = words[:1] == ["SCAN"] and words[1] in GROWING
                by_status = "_by_status" in row[-1] and any(v in sql for v in ENDED)
                if whole or by_status:
                    reads_past.append(f"{row[-1]}: {sql}")
    finally:
        conn.close()
    assert reads_past == []
