"""The controller's SQLite store: versioned rows, the lifecycle enforced, migrations, damaged
files, and a process killed with SIGKILL mid-write."""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autoscaler.controller.store as store_module
import autoscaler.controller.store.schema as store_schema
from autoscaler.controller.errors import (
    ControllerError,
    DuplicateRowError,
    IllegalTransitionError,
    StaleVersionError,
    StoreCorruptError,
    StoreError,
    StoreExistsError,
    StoreMissingError,
    StoreUnwritableError,
    UnknownRowError,
)
from autoscaler.controller.lifecycle import (
    TRANSITIONS,
    InstanceStatus,
    LifecycleTimeouts,
    StatusChange,
    TimeoutAction,
    request_retries,
    timeout_from_history,
)
from autoscaler.controller.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    InstanceRow,
    JobBatch,
    JobEta,
    JobStatus,
    Store,
    apply_migrations,
    schema_of,
)
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import FakeClock
from providers.base import Market

S = InstanceStatus
ROOT = Path(__file__).resolve().parents[2]
SPEC = json.dumps({"init_batch_size": 64})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_s=1_700_000_000.0)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def location(store_location: Path | str) -> Path | str:
    """The store's file or PostgreSQL URL (both back ends: tests/controller/conftest.py)."""
    return store_location


@pytest.fixture
def store(location: Path | str, clock: FakeClock) -> Iterator[Store]:
    with Store.create(location, "c1", clock) as s:
        yield s


def add(store: Store, key: str, **kw: object) -> InstanceRow:
    fields: dict[str, object] = {
        "instance_key": key,
        "request_id": f"c1-{key}",
        "offering_key": "fake/g4dn.xlarge/us-east-1a/spot",
        "provider": "fake",
        "instance_type": "g4dn.xlarge",
        "zone": "us-east-1a",
        "market": Market.SPOT,
        "gpu_type": "T4",
        "gpus": 1,
        "price_usd_per_hour": 0.1578,
    }
    fields.update(kw)
    return store.add_instance(**fields)  # type: ignore[arg-type]


def path_to(target: InstanceStatus) -> list[InstanceStatus]:
    """The shortest walk of the table from queued to ``target`` (statuses after queued)."""
    previous: dict[InstanceStatus, InstanceStatus | None] = {S.QUEUED: None}
    todo = deque([S.QUEUED])
    while todo:
        s = todo.popleft()
        for nxt in TRANSITIONS[s]:
            if nxt not in previous:
                previous[nxt] = s
                todo.append(nxt)
    walk: list[InstanceStatus] = []
    at: InstanceStatus | None = target
    while at is not None and at is not S.QUEUED:
        walk.append(at)
        at = previous[at]
    return walk[::-1]


def drive(store: Store, key: str, target: InstanceStatus) -> InstanceRow:
    row = add(store, key)
    for to in path_to(target):
        row = store.transition(key, row.version, to, reason=f"to {to}")
    assert row.status is target
    return row


def snapshot(path: Path | str) -> list[tuple[object, ...]]:
    """Every row of every table, read with a plain connection (sqlite3, or psycopg)."""
    if isinstance(path, str):
        import psycopg

        with psycopg.connect(path) as pg:
            out: list[tuple[object, ...]] = []
            tables = pg.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() ORDER BY table_name"
            ).fetchall()
            for (table,) in tables:
                out.append((table,))
                out.extend(pg.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall())
            return out
    conn = sqlite3.connect(path)
    try:
        out: list[tuple[object, ...]] = []
        for (table,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ).fetchall():
            out.append((table,))
            out.extend(conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2"))
        return out
    finally:
        conn.close()


# ---- creating and opening ------------------------------------------------------------------


def test_create_then_open(path: Path, clock: FakeClock) -> None:
    with Store.create(path, "c1", clock) as s:
        assert (s.cluster_id, s.schema_version, s.path) == ("c1", SCHEMA_VERSION, path)
        s.add_job("j1", SPEC)
    with Store.open(path, clock) as s:
        assert s.cluster_id == "c1"
        assert s.get_job("j1").spec_json == SPEC
        mode = s._live().execute("PRAGMA journal_mode").fetchone()[0]
        sync = s._live().execute("PRAGMA synchronous").fetchone()[0]
        fks = s._live().execute("PRAGMA foreign_keys").fetchone()[0]
        assert (mode, sync, fks) == ("wal", 2, 1)  # 2 is FULL


def test_create_refuses_an_existing_file(path: Path, clock: FakeClock) -> None:
    path.write_bytes(b"precious")
    with pytest.raises(StoreExistsError) as err:
        Store.create(path, "c1", clock)
    assert err.value.path == str(path)
    assert path.read_bytes() == b"precious"


def test_create_refuses_a_bad_cluster_id(path: Path, clock: FakeClock) -> None:
    with pytest.raises(InvalidInputError):
        Store.create(path, "Bad Id!", clock)
    assert not path.exists()


def test_open_of_a_missing_file_creates_nothing(tmp_path: Path, clock: FakeClock) -> None:
    with pytest.raises(StoreMissingError) as err:
        Store.open(tmp_path / "nope.db", clock)
    assert "nope.db" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_closed_store_refuses_calls(store: Store) -> None:
    store.close()
    store.close()  # twice is fine
    with pytest.raises(StoreError, match="closed"):
        store.list_jobs()


def test_errors_share_the_controller_root() -> None:
    for cls in (StoreMissingError, StoreCorruptError, UnknownRowError, DuplicateRowError):
        assert issubclass(cls, StoreError) and issubclass(cls, ControllerError)
    assert issubclass(StaleVersionError, ControllerError)


# ---- jobs ----------------------------------------------------------------------------------


def test_jobs_are_versioned(store: Store, clock: FakeClock) -> None:
    j = store.add_job("j1", SPEC)
    assert (j.status, j.retries, j.version, j.submitted_at_s) == (
        JobStatus.QUEUED,
        0,
        1,
        clock.now_s(),
    )
    clock.advance(5)
    j2 = store.update_job("j1", 1, status=JobStatus.RUNNING, retries=1)
    assert (j2.status, j2.retries, j2.version, j2.updated_at_s) == (
        JobStatus.RUNNING,
        1,
        2,
        clock.now_s(),
    )
    assert j2.submitted_at_s == j.submitted_at_s
    with pytest.raises(StaleVersionError) as err:
        store.update_job("j1", 1, status=JobStatus.FAILED)
    assert (err.value.table, err.value.key, err.value.expected, err.value.actual) == (
        "jobs",
        "j1",
        1,
        2,
    )
    assert store.get_job("j1") == j2


def test_job_errors(store: Store) -> None:
    store.add_job("j1", SPEC)
    with pytest.raises(DuplicateRowError):
        store.add_job("j1", SPEC)
    with pytest.raises(InvalidInputError):
        store.add_job("j2", "[1, 2]")  # a spec is a JSON object
    with pytest.raises(InvalidInputError):
        store.update_job("j1", 1, priority=3)
    with pytest.raises(InvalidInputError):
        store.update_job("j1", 1, status="paused")
    with pytest.raises(InvalidInputError):
        store.update_job("j1", 1)
    with pytest.raises(UnknownRowError):
        store.update_job("nope", 1, retries=1)
    with pytest.raises(UnknownRowError):
        store.get_job("nope")
    assert [j.name for j in store.list_jobs()] == ["j1"]


def test_list_jobs_by_status(store: Store, clock: FakeClock) -> None:
    for name in ("b", "a", "c"):
        store.add_job(name, SPEC)
        clock.advance(1)
    store.update_job("a", 1, status=JobStatus.RUNNING)
    assert [j.name for j in store.list_jobs()] == ["b", "a", "c"]  # submission order
    assert [j.name for j in store.list_jobs(statuses=[JobStatus.QUEUED])] == ["b", "c"]
    running = (JobStatus.RUNNING, JobStatus.COMPLETED)
    assert [j.name for j in store.list_jobs(statuses=running)] == ["a"]
    assert store.list_jobs(statuses=[]) == ()


# ---- instances and the lifecycle -----------------------------------------------------------


def test_a_new_instance_is_queued_with_its_history(store: Store, clock: FakeClock) -> None:
    row = add(store, "i-1")
    assert (row.status, row.version, row.request_tries, row.provider_instance_id) == (
        S.QUEUED,
        1,
        0,
        None,
    )
    assert row.market is Market.SPOT and row.price_usd_per_hour == 0.1578
    assert store.history("i-1") == (StatusChange(S.QUEUED, clock.now_s(), "wanted by the plan"),)
    assert store.get_by_request_id("c1-i-1") == row
    assert store.get_by_request_id("c1-other") is None
    with pytest.raises(DuplicateRowError):
        add(store, "i-1", request_id="c1-fresh")
    with pytest.raises(DuplicateRowError):
        add(store, "i-2", request_id="c1-i-1")
    with pytest.raises(InvalidInputError):
        add(store, "i-3", request_id="Not An Id")
    with pytest.raises(InvalidInputError):
        add(store, "i-4", market="reserved")
    with pytest.raises(InvalidInputError):
        add(store, "i-5", price_usd_per_hour=float("nan"))
    assert [r.instance_key for r in store.list_instances()] == ["i-1"]


@pytest.mark.parametrize(
    ("before", "after"), [(a, b) for a in InstanceStatus for b in TRANSITIONS[a]]
)
def test_every_edge_through_the_store(
    store: Store, clock: FakeClock, before: InstanceStatus, after: InstanceStatus
) -> None:
    row = drive(store, "i-1", before)
    clock.advance(7)
    new = store.transition("i-1", row.version, after, reason="because", provider_instance_id="x-1")
    assert (new.status, new.version, new.updated_at_s) == (after, row.version + 1, clock.now_s())
    assert new.provider_instance_id == "x-1"
    assert store.history("i-1")[-1] == StatusChange(after, clock.now_s(), "because")
    assert len(store.history("i-1")) == new.version  # one entry per status change


@pytest.mark.parametrize("before", list(InstanceStatus))
def test_every_non_edge_through_the_store_changes_nothing(
    store: Store, path: Path, before: InstanceStatus
) -> None:
    row = drive(store, "i-1", before)
    history = store.history("i-1")
    rows_before = snapshot(path)
    for after in InstanceStatus:
        if after in TRANSITIONS[before]:
            continue
        with pytest.raises(IllegalTransitionError) as err:
            store.transition("i-1", row.version, after, reason="no", provider_instance_id="x-9")
        assert (err.value.from_status, err.value.to_status) == (before.value, after.value)
        assert store.get_instance("i-1") == row
        assert store.history("i-1") == history
    assert snapshot(path) == rows_before


def test_a_stale_transition_changes_nothing(store: Store, location: Path | str) -> None:
    row = add(store, "i-1")
    moved = store.transition("i-1", row.version, S.REQUESTED, reason="launch intent")
    before = snapshot(location)
    with pytest.raises(StaleVersionError) as err:
        store.transition("i-1", row.version, S.REQUESTED, reason="again")
    assert (err.value.expected, err.value.actual) == (1, 2)
    # A stale version is reported before the edge is checked (the caller must re-read).
    with pytest.raises(StaleVersionError):
        store.transition("i-1", row.version, S.TERMINATED, reason="illegal and stale")
    assert snapshot(location) == before
    assert store.get_instance("i-1") == moved
    with pytest.raises(UnknownRowError):
        store.transition("i-404", 1, S.REQUESTED, reason="nope")


def test_two_store_objects_over_one_file(location: Path | str, clock: FakeClock) -> None:
    with Store.create(location, "c1", clock) as a, Store.open(location, clock) as b:
        row = add(a, "i-1")
        a.add_job("j1", SPEC)
        seen_by_b = b.get_instance("i-1")
        assert seen_by_b == row
        won = a.transition("i-1", row.version, S.REQUESTED, reason="a launches")
        job = b.get_job("j1")
        a.update_job("j1", job.version, status=JobStatus.RUNNING)
        before = snapshot(location)
        with pytest.raises(StaleVersionError) as err:
            b.transition("i-1", seen_by_b.version, S.ALLOCATION_FAILED, reason="b gives up")
        assert (err.value.expected, err.value.actual) == (1, 2)
        with pytest.raises(StaleVersionError):
            b.update_instance_fields("i-1", seen_by_b.version, last_heartbeat_s=1.0)
        with pytest.raises(StaleVersionError):
            b.update_job("j1", job.version, status=JobStatus.CANCELLED)
        assert snapshot(location) == before
        assert b.get_instance("i-1") == won
        assert b.history("i-1") == a.history("i-1")


def test_request_tries_are_kept_by_the_store(store: Store) -> None:
    row = add(store, "i-1")
    for expected in (1, 2):
        row = store.transition("i-1", row.version, S.REQUESTED, reason="launch")
        row = store.transition("i-1", row.version, S.QUEUED, reason="retry")
        assert row.request_tries == expected == request_retries(store.history("i-1"))
    row = store.transition("i-1", row.version, S.REQUESTED, reason="launch")
    # A caller may restate the count the store derives, never set another one.
    with pytest.raises(InvalidInputError):
        store.transition("i-1", row.version, S.QUEUED, reason="retry", request_tries=7)
    assert store.get_instance("i-1") == row
    row = store.transition("i-1", row.version, S.QUEUED, reason="retry", request_tries=3)
    assert row.request_tries == 3
    with pytest.raises(InvalidInputError):
        store.update_instance_fields("i-1", row.version, request_tries=0)


def test_instance_fields(store: Store, clock: FakeClock) -> None:
    row = drive(store, "i-1", S.REQUESTED)
    row = store.transition("i-1", row.version, S.RUNNING, reason="listed", provider_instance_id="x")
    history = store.history("i-1")
    clock.advance(3)
    row2 = store.update_instance_fields("i-1", row.version, last_heartbeat_s=clock.now_s())
    assert (row2.last_heartbeat_s, row2.version, row2.status) == (
        clock.now_s(),
        row.version + 1,
        S.RUNNING,
    )
    assert store.history("i-1") == history  # no status change, no history entry
    # Restating the recorded cloud id is fine; changing it is not (a row owns one instance).
    row3 = store.update_instance_fields("i-1", row2.version, provider_instance_id="x")
    with pytest.raises(InvalidInputError):
        store.update_instance_fields("i-1", row3.version, provider_instance_id="y")
    with pytest.raises(InvalidInputError):
        store.update_instance_fields("i-1", row3.version, status=S.TERMINATED)
    with pytest.raises(InvalidInputError):
        store.update_instance_fields("i-1", row3.version)
    with pytest.raises(InvalidInputError):
        store.transition("i-1", row3.version, S.DRAINING, reason="")
    assert store.get_instance("i-1") == row3


def test_one_cloud_instance_belongs_to_one_row(store: Store) -> None:
    a = drive(store, "i-a", S.REQUESTED)
    b = drive(store, "i-b", S.REQUESTED)
    store.transition("i-a", a.version, S.RUNNING, reason="listed", provider_instance_id="x-1")
    with pytest.raises(DuplicateRowError):
        store.transition("i-b", b.version, S.RUNNING, reason="listed", provider_instance_id="x-1")
    assert store.get_instance("i-b") == b


def test_list_instances_and_terminal_request_ids(store: Store) -> None:
    drive(store, "i-b", S.RUNNING)
    drive(store, "i-a", S.TERMINATED)
    drive(store, "i-c", S.ALLOCATION_FAILED)
    assert [r.instance_key for r in store.list_instances()] == ["i-a", "i-b", "i-c"]
    live = [s for s in InstanceStatus if s is not S.TERMINATED]
    assert [r.instance_key for r in store.list_instances(statuses=live)] == ["i-b", "i-c"]
    assert store.terminal_request_ids() == {"c1-i-a"}


def test_history_times_never_go_backwards(location: Path | str) -> None:
    class SteppedClock(FakeClock):
        def step_back(self, seconds: float) -> None:
            self._now_s -= seconds

    clock = SteppedClock()
    with Store.create(location, "c1", clock) as s:
        row = add(s, "i-1")
        clock.advance(100)
        row = s.transition("i-1", row.version, S.REQUESTED, reason="launch")
        clock.step_back(60)
        s.transition("i-1", row.version, S.QUEUED, reason="retry")
        times = [c.at_s for c in s.history("i-1")]
        assert times == sorted(times) and times[-1] == times[-2]


def test_timeouts_from_the_stored_history(store: Store, clock: FakeClock) -> None:
    t = LifecycleTimeouts(requested_s=600, max_request_tries=2)
    row = drive(store, "i-1", S.REQUESTED)
    clock.advance(600)
    assert timeout_from_history(store.history("i-1"), clock.now_s(), t) is None
    clock.advance(1)
    action = timeout_from_history(store.history("i-1"), clock.now_s(), t)
    assert action is TimeoutAction.RETRY_REQUEST
    row = store.transition("i-1", row.version, action.edge[1], reason=action.value)
    row = store.transition("i-1", row.version, S.REQUESTED, reason="relaunch, same request id")
    assert row.request_id == "c1-i-1"
    since, started = store.status_times("i-1")
    assert (since, started) == (clock.now_s(), None)
    clock.advance(601)
    action = timeout_from_history(store.history("i-1"), clock.now_s(), t)
    assert action is TimeoutAction.FAIL_ALLOCATION
    row = store.transition("i-1", row.version, action.edge[1], reason=action.value)
    assert row.status is S.ALLOCATION_FAILED


def test_status_times(store: Store, clock: FakeClock) -> None:
    row = drive(store, "i-1", S.REQUESTED)
    clock.advance(10)
    row = store.transition("i-1", row.version, S.RUNNING, reason="listed")
    started = clock.now_s()
    clock.advance(10)
    store.transition("i-1", row.version, S.DRAINING, reason="notice")
    assert store.status_times("i-1") == (clock.now_s(), started)
    with pytest.raises(UnknownRowError):
        store.status_times("i-404")
    with pytest.raises(UnknownRowError):
        store.history("i-404")


WRITES = ("UPDATE", "INSERT", "DELETE", "REPLACE")


def store_package_tree() -> ast.Module:
    """Every module of the store package, as one syntax tree."""
    package = Path(store_module.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) > 5  # the package, not a lone module
    body = [ast.parse(m.read_text(encoding="utf-8")) for m in modules]
    return ast.Module(body=[node for tree in body for node in tree.body], type_ignores=[])


def test_only_transition_writes_the_instance_status() -> None:
    """Every SQL text in the store package that writes ``instances`` or ``instance_history``,
    by the function it is in: the status column is set by ``transition`` alone, a row is
    created (as queued) by ``add_instance`` alone, and no SQL that writes them is built at run
    time."""
    tree = store_package_tree()
    writers: dict[str, set[str]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.JoinedStr):
                head = node.values[0] if node.values else None
                text = head.value if isinstance(head, ast.Constant) else ""
                assert not str(text).lstrip().upper().startswith(WRITES), (
                    f"{fn.name} builds write SQL at run time"
                )
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            sql = " ".join(node.value.split()).upper()
            if sql.startswith("UPDATE INSTANCES "):
                set_clause = sql.split(" SET ", 1)[1].split(" WHERE ", 1)[0]
                columns = {part.split("=")[0].strip() for part in set_clause.split(",")}
                kind = "set-status" if "STATUS" in columns else "update"
                writers.setdefault(kind, set()).add(fn.name)
            elif sql.startswith("INSERT INTO INSTANCES "):
                writers.setdefault("insert", set()).add(fn.name)
            elif sql.startswith(("INSERT INTO INSTANCE_HISTORY", "UPDATE INSTANCE_HISTORY")):
                writers.setdefault("history", set()).add(fn.name)
            elif sql.startswith(("DELETE FROM INSTANCE", "REPLACE INTO INSTANCE")):
                writers.setdefault("delete", set()).add(fn.name)
    assert writers == {
        "set-status": {"transition"},
        "update": {"update_instance_fields", "record_heartbeat"},
        "insert": {"add_instance"},
        "history": {"_append_history"},
    }
    callers = {
        fn.name
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef)
        for node in ast.walk(fn)
        if isinstance(node, ast.Attribute) and node.attr == "_append_history"
    }
    assert callers == {"add_instance", "transition"}


def test_the_store_reads_no_clock_of_its_own() -> None:
    tree = store_package_tree()
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {"time", "datetime"} & imported


# ---- assignments, plans --------------------------------------------------------------------


def test_assignments_are_replaced_atomically(store: Store, location: Path | str) -> None:
    for key in ("i-1", "i-2", "i-3"):
        add(store, key)
    store.add_job("j1", SPEC)
    store.add_job("j2", SPEC)
    store.set_assignments("j1", {"i-1": 2, "i-2": 1})
    store.set_assignments("j2", {"i-2": 1})
    assert store.list_assignments() == {("j1", "i-1"): 2, ("j1", "i-2"): 1, ("j2", "i-2"): 1}
    store.set_assignments("j1", {"i-1": 2, "i-2": 3, "i-3": 0})  # zero: not assigned
    versions = {(a.job_name, a.instance_key): a.version for a in store.assignment_rows()}
    assert versions == {("j1", "i-1"): 1, ("j1", "i-2"): 2, ("j2", "i-2"): 1}
    assert store.list_assignments(job="j1") == {("j1", "i-1"): 2, ("j1", "i-2"): 3}
    assert store.list_assignments(instance="i-2") == {("j1", "i-2"): 3, ("j2", "i-2"): 1}
    assert store.list_assignments(job="j2", instance="i-1") == {}
    before = snapshot(location)
    with pytest.raises(UnknownRowError):
        store.set_assignments("j1", {"i-1": 1, "i-404": 1})
    with pytest.raises(UnknownRowError):
        store.set_assignments("j404", {"i-1": 1})
    with pytest.raises(InvalidInputError):
        store.set_assignments("j1", {"i-1": -1})
    assert snapshot(location) == before
    store.set_assignments("j1", {})
    assert store.list_assignments() == {("j2", "i-2"): 1}


def test_the_first_plan_is_marked_once(
    store: Store, location: Path | str, clock: FakeClock
) -> None:
    assert store.planned_at_s() is None
    first = clock.now_s()
    store.mark_planned()
    assert store.planned_at_s() == first
    clock.advance(60)
    before = snapshot(location)
    store.mark_planned()  # every round calls it: once marked, nothing is written
    assert snapshot(location) == before
    with Store.open(location, clock) as other:
        assert other.planned_at_s() == first
        other.mark_planned()  # another object on the file: the first time is kept
        assert other.planned_at_s() == first


# ---- v2: reports, models, prices, costs ----------------------------------------------------


def test_reports(store: Store, clock: FakeClock) -> None:
    store.add_job("j1", SPEC)
    store.add_job("j2", SPEC)
    assert store.reports_after(0) == (0, ())
    r1 = store.add_report("j1", '{"step": 1}')
    clock.advance(1)
    store.add_report("j2", '{"step": 1}')
    r3 = store.add_report("j1", '{"step": 2}')
    assert store.latest_report("j1") == r3 and store.latest_report("j3") is None
    assert {k: v.payload_json for k, v in store.latest_reports().items()} == {
        "j1": '{"step": 2}',
        "j2": '{"step": 1}',
    }
    cursor, new = store.reports_after(0)
    assert cursor == r3.report_id and [job for job, _ in new] == ["j1", "j2", "j1"]
    assert store.reports_after(r1.report_id)[1] == (("j2", '{"step": 1}'), ("j1", '{"step": 2}'))
    assert store.reports_after(cursor) == (cursor, ())
    with pytest.raises(UnknownRowError):
        store.add_report("nope", "{}")


def test_models_are_upserted(store: Store, clock: FakeClock) -> None:
    store.add_job("j1", SPEC)
    store.upsert_model("j1", "T4", '{"alpha": 1.0}')
    clock.advance(30)
    store.upsert_model("j1", "T4", '{"alpha": 2.0}')
    store.upsert_model("j1", "A10G", '{"alpha": 3.0}')
    model = store.get_model("j1", "T4")
    assert model is not None
    assert (model.params_json, model.fitted_at_s) == ('{"alpha": 2.0}', clock.now_s())
    assert [(m.gpu_type, m.params_json) for m in store.list_models("j1")] == [
        ("A10G", '{"alpha": 3.0}'),
        ("T4", '{"alpha": 2.0}'),
    ]
    assert store.get_model("j1", "H100") is None
    with pytest.raises(UnknownRowError):
        store.upsert_model("nope", "T4", "{}")


def test_a_rounds_etas_replace_the_last_ones(store: Store, clock: FakeClock) -> None:
    """Each round's estimates replace the last round's whole: a job that no longer has one
    (stopped running, lost its model) has none; an unknown job or a time that is not finite
    changes nothing; deleting an ended job takes its estimate with it."""
    for name in ("j1", "j2"):
        store.add_job(name, SPEC)
    assert store.list_etas() == {}
    store.record_etas({"j1": clock.now_s() + 600.0, "j2": clock.now_s() + 60.0})
    said = clock.now_s()
    assert store.list_etas(["j2", "nope"]) == {"j2": JobEta("j2", said + 60.0, said)}
    clock.advance(30.0)
    store.record_etas({"j1": said + 590.0})
    assert store.list_etas() == {"j1": JobEta("j1", said + 590.0, said + 30.0)}
    for bad in ({"nope": said}, {"j1": math.inf}, {"j1": math.nan}, {"j1": True}):
        with pytest.raises((UnknownRowError, InvalidInputError)):
            store.record_etas(bad)  # type: ignore[arg-type]
    assert store.list_etas() == {"j1": JobEta("j1", said + 590.0, said + 30.0)}
    job = store.get_job("j1")
    store.update_job("j1", job.version, status=JobStatus.CANCELLED)
    store.delete_job("j1")  # its row is kept under another name; its estimate is not
    assert store.list_etas() == {}
    store.record_etas({})
    assert store.list_etas() == {}


def test_prices(store: Store) -> None:
    key = "fake/g4dn.xlarge/us-east-1a/spot"
    assert store.price_at(key, 100.0) is None
    store.record_price(key, 0.20, Market.SPOT, at_s=100.0)
    store.record_price(key, 0.30, "spot", at_s=200.0)
    store.record_price(key, 0.25, Market.SPOT, at_s=200.0)  # same time: the later one counts
    assert store.price_at(key, 99.9) is None
    assert store.price_at(key, 100.0) == 0.20
    assert store.price_at(key, 199.0) == 0.20
    assert store.price_at(key, 1e9) == 0.25
    assert [p.price_usd_per_hour for p in store.prices(key)] == [0.20, 0.30, 0.25]
    with pytest.raises(InvalidInputError):
        store.record_price(key, -0.1, Market.SPOT)


def test_money_is_stored_exactly_and_summed_with_fsum(store: Store) -> None:
    add(store, "i-1", price_usd_per_hour=0.1 + 0.2)
    assert store.get_instance("i-1").price_usd_per_hour == 0.1 + 0.2  # bit for bit
    for _ in range(10):
        store.add_cost_record("i-1", 0.0, 360.0, 1.0)  # 0.1 USD each, not exact in binary
    rec = store.cost_records("i-1")[0]
    assert rec.usd == 1.0 * 360.0 / 3600.0
    assert store.total_cost_usd() == 1.0  # fsum: the exact sum of the stored floats, rounded once
    store.add_cost_record("i-1", 0.0, 10.0, 0.36, usd=0.06)  # a minimum billed duration
    assert store.cost_records()[-1].usd == 0.06
    assert store.total_cost_usd("i-1") == pytest.approx(1.06, abs=1e-12)
    assert store.total_cost_usd("i-404") == 0.0
    with pytest.raises(InvalidInputError):
        store.add_cost_record("i-1", 10.0, 5.0, 1.0)
    with pytest.raises(UnknownRowError):
        store.add_cost_record("i-404", 0.0, 1.0, 1.0)


# ---- migrations ----------------------------------------------------------------------------

# Rows written by the code of each past version, with that version's SQL: SEED[v] is run
# right after migration v, and the later migrations carry the rows on (v8 drops ``plans``,
# so its row can only be written before). A new schema version adds its own entry.
SEED: dict[int, list[str]] = {
    1: [
        "INSERT INTO jobs (name, spec_json, status, retries, submitted_at_s, updated_at_s, "
        "version) VALUES ('j1', '{\"init_batch_size\": 64}', 'running', 1, 10.0, 20.0, 3)",
        "INSERT INTO instances VALUES ('i-1', 'c1-i-1', 'fake/z/t/spot', 'fake', 't', 'z', "
        "'spot', 'T4', 4, 0.5, 'x-1', 'running', 1, 15.0, 11.0, 14.0, 5)",
        "INSERT INTO instance_history (instance_key, status, at_s, reason) VALUES "
        "('i-1', 'queued', 11.0, 'wanted'), ('i-1', 'requested', 12.0, 'launch'), "
        "('i-1', 'queued', 13.0, 'retry'), ('i-1', 'requested', 13.0, 'launch'), "
        "('i-1', 'running', 14.0, 'listed')",
        "INSERT INTO assignments VALUES ('j1', 'i-1', 4, 1)",
        'INSERT INTO plans (at_s, plan_json) VALUES (20.0, \'{"j1": {"i-1": 4}}\')',
    ],
    2: [
        "INSERT INTO reports (job_name, at_s, payload_json) VALUES ('j1', 21.0, '{\"s\": 1}')",
        "INSERT INTO models VALUES ('j1', 'T4', '{\"alpha\": 1}', 22.0)",
        "INSERT INTO price_history (offering_key, at_s, price_usd_per_hour, market) "
        "VALUES ('fake/z/t/spot', 5.0, 0.5, 'spot')",
        "INSERT INTO cost_records (instance_key, start_s, end_s, price_usd_per_hour, usd) "
        "VALUES ('i-1', 14.0, 3614.0, 0.5, 0.5)",
    ],
    3: [
        "INSERT INTO assignment_history (job_name, instance_key, gpus, from_s, to_s) "
        "VALUES ('j1', 'i-1', 2, 15.0, 18.0)",
    ],
    4: [
        "UPDATE jobs SET reason = 'a reason' WHERE name = 'j1'",
        "INSERT INTO job_batches VALUES ('j1', 256, 32, 2, 4, 19.0)",
    ],
    5: [],  # an index only
    6: [
        "INSERT INTO events (at_s, kind, subject, message) VALUES "
        "(23.0, 'launch', 'i-1', 'requested')",
    ],
    7: ["UPDATE jobs SET deadline_s = 3610.0 WHERE name = 'j1'"],
    8: [],  # usage totals back-filled from the history, plans become a meta row, indexes
    9: [],  # a column, back-filled from the reason strings (test_typed_preemptions_...)
    # Keys in the one format from v10 on: provider/instance_type/zone/market.
    10: [
        "INSERT INTO price_history (offering_key, at_s, price_usd_per_hour, market) "
        "VALUES ('fake/t/z/on-demand', 7.0, 1.5, 'on-demand')",
    ],
    11: ["INSERT INTO job_etas VALUES ('j1', 5000.0, 30.0)"],
    12: ["INSERT INTO leader_lease VALUES (1, 'h:1:2', 3, 10.0, 20.0, 21.5, 0)"],
}


def build_store_at(path: Path, version: int) -> None:
    """A store file as the code of schema ``version`` left it, with rows of every version."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for v in range(1, version + 1):
            apply_migrations(conn, v - 1, v)
            if v == 1:
                conn.execute("INSERT INTO meta VALUES ('cluster_id', 'c1')")
            for sql in SEED[v]:
                conn.execute(sql)
        conn.execute("COMMIT")
    finally:
        conn.close()


def check_seeded_rows(store: Store, version: int) -> None:
    job = store.get_job("j1")
    assert (job.status, job.retries, job.version) == (JobStatus.RUNNING, 1, 3)
    row = store.get_instance("i-1")
    assert (row.status, row.provider_instance_id, row.request_tries, row.version) == (
        S.RUNNING,
        "x-1",
        1,
        5,
    )
    assert row.offering_key == "fake/t/z/spot"  # the one key format (v10)
    assert [c.status for c in store.history("i-1")][-1] is S.RUNNING
    assert request_retries(store.history("i-1")) == row.request_tries
    assert store.list_assignments() == {("j1", "i-1"): 4}
    # The one plan, as what it stood for (v8): the store planned, at that plan's time.
    assert store.planned_at_s() == 20.0
    if version >= 2:
        assert store.reports_after(0)[1] == (("j1", '{"s": 1}'),)
        # The old key ('fake/z/t/spot', zone before type) in the one format (v10).
        assert store.price_at("fake/t/z/spot", 6.0) == 0.5
        assert store.price_at("fake/z/t/spot", 6.0) is None
        # A key written in the one format is left as it was.
        assert store.price_at("fake/t/z/on-demand", 8.0) == (1.5 if version >= 10 else None)
        assert store.total_cost_usd() == 0.5
        assert store.get_model("j1", "T4") is not None
    else:  # tables of later versions start empty
        assert store.reports_after(0) == (0, ())
        assert store.cost_records() == () and store.list_models() == ()
    spans = [
        (a.job_name, a.instance_key, a.gpus, a.from_s, a.to_s) for a in store.assignment_history()
    ]
    # The held assignment, from the last plan on (the v3 migration), and a span of v3.
    assert spans == [("j1", "i-1", 4, 20.0, None)] + (
        [("j1", "i-1", 2, 15.0, 18.0)] if version >= 3 else []
    )
    # The usage totals back-filled from those spans (the v8 migration): two placements.
    assert store.usage(["j1"], 100.0) == (
        {"j1": (326.0, 1)} if version >= 3 else {"j1": (320.0, 0)}
    )
    events = [(e.at_s, e.kind, e.subject, e.message) for e in store.events_after(0)]
    if version >= 6:
        assert events == [(23.0, "launch", "i-1", "requested")]
    else:  # no story before v6
        assert events == []
    # An ETA from v11 on; none before (a stopped cluster's next round estimates again).
    assert store.list_etas() == ({"j1": JobEta("j1", 5000.0, 30.0)} if version >= 11 else {})
    # A job of a store before v7 has no deadline (the column reads NULL).
    assert job.deadline_s == (3610.0 if version >= 7 else None)
    if version >= 4:
        assert job.reason == "a reason"
        assert store.get_batch("j1") == JobBatch("j1", 256, 32, 2, 4, 19.0)
    else:  # no reason, no batch planned yet
        assert job.reason is None and store.list_batches() == {}


def test_migrations_are_numbered_in_order_and_seeded() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))
    assert set(SEED) == set(range(1, SCHEMA_VERSION + 1)), "seed rows for every version"


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_every_past_version_opens_and_migrates(
    tmp_path: Path, clock: FakeClock, version: int
) -> None:
    old = tmp_path / f"v{version}.db"
    build_store_at(old, version)
    with Store.open(old, clock) as s:
        assert s.schema_version == SCHEMA_VERSION
        check_seeded_rows(s, version)
    fresh = tmp_path / "fresh.db"
    Store.create(fresh, "c1", clock).close()
    schemas = []
    for p in (old, fresh):
        conn = sqlite3.connect(p)
        schemas.append(schema_of(conn))
        version_row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'")
        assert version_row.fetchone()[0] == str(SCHEMA_VERSION)
        conn.close()
    assert schemas[0] == schemas[1]
    assert {name for kind, name, _, _ in schemas[0] if kind == "table"} >= {
        "meta",
        "jobs",
        "instances",
        "instance_history",
        "assignments",
        "reports",
        "models",
        "price_history",
        "cost_records",
        "assignment_history",
        "job_usage",
    }
    assert "plans" not in {name for kind, name, _, _ in schemas[0] if kind == "table"}
    with Store.open(old, clock) as s:  # opening again migrates nothing; the rows move on
        check_seeded_rows(s, version)
        row = s.get_instance("i-1")
        s.transition("i-1", row.version, S.DRAINING, reason="after the migration")


def test_a_failed_migration_leaves_the_old_version(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "v1.db"
    build_store_at(old, 1)
    before = snapshot(old)
    broken = (
        *MIGRATIONS[:1],
        store_module.Migration(2, "broken", ("CREATE TABLE reports (x)", "NOT SQL")),
    )
    monkeypatch.setattr(store_schema, "MIGRATIONS", broken)
    with pytest.raises(StoreError):
        Store.open(old, clock)
    assert snapshot(old) == before


# ---- damaged files -------------------------------------------------------------------------


def a_real_store(path: Path, clock: FakeClock) -> bytes:
    with Store.create(path, "c1", clock) as s:
        for i in range(60):
            s.add_job(f"job-{i:03d}", json.dumps({"pad": "x" * 500}))
            add(s, f"i-{i:03d}")
    return path.read_bytes()


def refused(path: Path, clock: FakeClock, match: str) -> None:
    before = path.read_bytes()
    siblings = sorted(p.name for p in path.parent.iterdir())
    with pytest.raises(StoreCorruptError, match=match) as err:
        Store.open(path, clock)
    assert err.value.path == str(path) and str(path) in str(err.value)
    assert path.read_bytes() == before, "opening must not write to a damaged file"
    assert sorted(p.name for p in path.parent.iterdir()) == siblings


def test_random_bytes_are_not_a_store(path: Path, clock: FakeClock) -> None:
    path.write_bytes(os.urandom(3 * 4096))
    refused(path, clock, "not an SQLite database")


def test_an_empty_file_is_not_a_store(path: Path, clock: FakeClock) -> None:
    path.write_bytes(b"")
    refused(path, clock, "empty")


@pytest.mark.parametrize("cut", ["header", "one-page", "half", "last-page", "last-byte"])
def test_a_truncated_store_is_refused(path: Path, clock: FakeClock, cut: str) -> None:
    data = a_real_store(path, clock)
    size = {
        "header": 60,
        "one-page": 4096,
        "half": len(data) // 2,
        "last-page": len(data) - 4096,
        "last-byte": len(data) - 1,
    }[cut]
    path.write_bytes(data[:size])
    refused(path, clock, "damaged|truncated|integrity")


def test_an_overwritten_page_is_refused(path: Path, clock: FakeClock) -> None:
    data = bytearray(a_real_store(path, clock))
    page = (len(data) // 4096 // 2) * 4096  # a page in the middle, all of it
    data[page : page + 4096] = random.Random(7).randbytes(4096)
    path.write_bytes(bytes(data))
    refused(path, clock, "damaged|integrity")


def test_another_sqlite_database_is_not_a_store(path: Path, clock: FakeClock) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    refused(path, clock, "no meta table")


def test_a_newer_schema_is_refused(path: Path, clock: FakeClock) -> None:
    a_real_store(path, clock)
    conn = sqlite3.connect(path)
    conn.execute(
        "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
    )
    conn.commit()
    conn.close()
    refused(path, clock, f"schema version {SCHEMA_VERSION + 1} is newer")


@pytest.mark.parametrize(
    "damage",
    [
        "DROP TABLE job_usage",
        "DELETE FROM meta WHERE key = 'cluster_id'",
        "UPDATE meta SET value = 'two' WHERE key = 'schema_version'",
        "ALTER TABLE jobs ADD COLUMN owner TEXT",
    ],
)
def test_a_store_with_missing_or_changed_tables_is_refused(
    path: Path, clock: FakeClock, damage: str
) -> None:
    a_real_store(path, clock)
    conn = sqlite3.connect(path)
    conn.execute(damage)
    conn.commit()
    conn.close()
    refused(path, clock, "differ|meta")


def test_a_folder_is_not_a_store(tmp_path: Path, clock: FakeClock) -> None:
    with pytest.raises(StoreCorruptError):
        Store.open(tmp_path, clock)


# ---- killed mid-write ----------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from autoscaler.controller.lifecycle import InstanceStatus as S
    from autoscaler.controller.store import Store
    from coadapt_common.clock import FakeClock

    path, mode = sys.argv[1], sys.argv[2]
    clock = FakeClock()
    store = Store.open(path, clock)
    walk = [S.REQUESTED, S.RUNNING, S.DRAINING, S.TERMINATING, S.TERMINATED]

    def add(key):
        return store.add_instance(
            instance_key=key, request_id=f"c1-{key}", offering_key="o", provider="fake",
            instance_type="t", zone="z", market="spot", gpu_type="T4", gpus=1,
            price_usd_per_hour=0.5,
        )

    if mode.startswith("between:"):
        # Die inside one change, right before its statement that starts with ``trigger``,
        # after the change has already written something.
        _, change, trigger = mode.split(":", 2)
        real = store._conn
        armed = False

        class Dying:
            def __getattr__(self, name):
                return getattr(real, name)

            def execute(self, sql, params=()):
                if armed and sql.startswith(trigger) and real.in_transaction:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real.execute(sql, params)

        row = add("i-victim")
        row = store.transition("i-victim", row.version, S.REQUESTED, reason="launch")
        store._conn = Dying()
        armed = True
        if change == "transition":
            store.transition("i-victim", row.version, S.RUNNING, reason="listed")
        else:
            add("i-new")
        sys.exit(3)  # not reached

    i = 0
    while True:
        key = f"i-{i:06d}"
        row = add(key)
        for to in walk:
            clock.advance(1)
            row = store.transition(key, row.version, to, reason="loop")
            if to is S.RUNNING:
                store.add_cost_record(key, clock.now_s() - 1, clock.now_s(), 0.5)
        i += 1
        if i == 3:
            print("writing", flush=True)
    """
)


def run_writer(path: Path, mode: str) -> subprocess.Popen[str]:
    script = path.parent / "writer.py"
    script.write_text(WRITER, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(script), str(path), mode],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def consistent(path: Path, clock: FakeClock) -> Store:
    """Reopen after a kill: the integrity check passes (Store.open runs it), and every row's
    status is its last history entry, with one history entry per status change."""
    store = Store.open(path, clock)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    for row in store.list_instances():
        history = store.history(row.instance_key)
        assert history[-1].status is row.status
        assert len(history) == row.version  # the writer makes no field-only updates
    return store


@pytest.mark.parametrize("delay_s", [0.05, 0.23])
def test_sigkill_while_writing_leaves_a_consistent_store(
    path: Path, clock: FakeClock, delay_s: float
) -> None:
    Store.create(path, "c1", clock).close()
    child = run_writer(path, "loop")
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "writing", child.stderr.read() if child.stderr else ""
        # Let it write a while longer, then kill it wherever it is.
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=delay_s)
        assert child.poll() is None, "the writer stopped on its own"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with consistent(path, clock) as store:
        assert len(store.list_instances()) >= 3
        assert len(store.cost_records()) >= 3


@pytest.mark.parametrize(
    ("change", "trigger"),
    [
        ("transition", "INSERT INTO instance_history"),  # after its UPDATE
        ("transition", "COMMIT"),
        ("add", "INSERT INTO instance_history"),  # after its INSERT INTO instances
        ("add", "COMMIT"),
    ],
)
def test_sigkill_between_the_statements_of_one_change(
    path: Path, clock: FakeClock, change: str, trigger: str
) -> None:
    """Killed inside a transaction, after some of its statements ran: the change is gone as a
    whole (the row keeps its old status and history; a half-added row does not exist)."""
    Store.create(path, "c1", clock).close()
    child = run_writer(path, f"between:{change}:{trigger}")
    _, err = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL, err
    with consistent(path, clock) as store:
        victim = store.get_instance("i-victim")
        assert victim.status is S.REQUESTED and victim.version == 2
        assert [c.status for c in store.history("i-victim")] == [S.QUEUED, S.REQUESTED]
        assert store.get_by_request_id("c1-i-new") is None
        assert [r.instance_key for r in store.list_instances()] == ["i-victim"]


# ---- a property: the store agrees with the table -------------------------------------------


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moves=st.lists(st.tuples(st.sampled_from(list(InstanceStatus)), st.booleans()), max_size=12))
def test_random_moves_keep_the_store_equal_to_a_model(
    tmp_path_factory: pytest.TempPathFactory,
    moves: list[tuple[InstanceStatus, bool]],
) -> None:
    """Random status changes, some against a stale version: the store accepts exactly the
    fresh ones that are edges of the table, and its row and history match a simple model."""
    clock = FakeClock()
    path = tmp_path_factory.mktemp("prop") / "store.db"
    with Store.create(path, "c1", clock) as store:
        row = add(store, "i-1")
        model = [S.QUEUED]
        for to, stale in moves:
            clock.advance(1)
            version = row.version - 1 if stale and row.version > 1 else row.version
            attempt = functools.partial(store.transition, "i-1", version, to, reason="move")
            if version != row.version:
                with pytest.raises(StaleVersionError):
                    attempt()
            elif to not in TRANSITIONS[model[-1]]:
                with pytest.raises(IllegalTransitionError):
                    attempt()
            else:
                row = attempt()
                model.append(to)
            assert [c.status for c in store.history("i-1")] == model
            assert store.get_instance("i-1") == row and row.version == len(model)


def test_heartbeats_only_move_forward_and_never_conflict_with_versions(tmp_path: Path) -> None:
    clock = FakeClock()
    store = Store.create(tmp_path / "s.db", "c1", clock)
    row = store.add_instance(
        instance_key="i-1",
        request_id="req-1",
        offering_key="fake/z/t/spot",
        provider="fake",
        instance_type="t",
        zone="z",
        market="spot",
        gpu_type="T4",
        gpus=1,
        price_usd_per_hour=0.5,
    )
    store.record_heartbeat("i-1", 100.0)
    store.record_heartbeat("i-1", 50.0)  # late delivery: ignored
    after = store.get_instance("i-1")
    assert after.last_heartbeat_s == 100.0 and after.version == row.version
    store.transition("i-1", row.version, InstanceStatus.REQUESTED, reason="intent")
    with pytest.raises(UnknownRowError):
        store.record_heartbeat("i-404", 1.0)


def test_the_fleet_release_is_kept_across_reopening(path: Path, clock: FakeClock) -> None:
    with Store.create(path, "c1", clock) as s:
        assert s.released_at_s() is None
        clock.advance(5.0)
        s.set_released(True)
        at = s.released_at_s()
        clock.advance(5.0)
        s.set_released(True)  # a second release keeps the first time
        assert s.released_at_s() == at == clock.now_s() - 5.0
    with Store.open(path, clock) as s:
        assert s.released_at_s() == at
        s.set_released(False)
        assert s.released_at_s() is None


def test_a_jobs_planned_batch_and_reason(tmp_path: Path, clock: FakeClock) -> None:
    with Store.create(tmp_path / "s.db", "c1", clock) as s:
        s.add_job("j1", SPEC)
        assert s.get_batch("j1") is None
        clock.advance(5.0)
        first = s.set_batch("j1", global_batch_size=256, local_batch_size=64, accum_steps=2, gpus=2)
        assert first == JobBatch("j1", 256, 64, 2, 2, clock.now_s())
        clock.advance(5.0)  # the same plan again keeps its time
        again = s.set_batch("j1", global_batch_size=256, local_batch_size=64, accum_steps=2, gpus=2)
        assert again == first
        moved = s.set_batch("j1", global_batch_size=512, local_batch_size=64, accum_steps=2, gpus=4)
        assert (moved.global_batch_size, moved.gpus, moved.at_s) == (512, 4, clock.now_s())
        assert s.list_batches() == {"j1": moved}
        with pytest.raises(InvalidInputError):
            s.set_batch("j1", global_batch_size=0, local_batch_size=1, accum_steps=1, gpus=1)
        with pytest.raises(UnknownRowError):
            s.set_batch("nope", global_batch_size=1, local_batch_size=1, accum_steps=1, gpus=1)
        s.clear_batch("j1")
        assert s.get_batch("j1") is None
        job = s.get_job("j1")
        refused = s.update_job(
            "j1", job.version, status=JobStatus.REFUSED, reason="needs\n64 GPUs " + "x" * 900
        )
        assert refused.status is JobStatus.REFUSED
        assert refused.reason is not None and "\n" not in refused.reason
        assert len(refused.reason) == 500
        cleared = s.update_job("j1", refused.version, status=JobStatus.QUEUED, reason=None)
        assert cleared.reason is None


def test_a_deadline_is_fixed_at_submission(tmp_path: Path, clock: FakeClock) -> None:
    with Store.create(tmp_path / "s.db", "c1", clock) as s:
        now = clock.now_s()
        assert s.add_job("a", "{}").deadline_s is None
        assert s.add_job("b", "{}", deadline_after_s=600.0).deadline_s == now + 600.0
        assert s.add_job("c", "{}", deadline_at_s=now + 50.0).deadline_s == now + 50.0
        clock.advance(100.0)
        assert s.get_job("b").deadline_s == now + 600.0  # fixed, not moving with the clock
        with pytest.raises(InvalidInputError):
            s.add_job("d", "{}", deadline_after_s=-1.0)
        with pytest.raises(InvalidInputError):
            s.add_job("e", "{}", deadline_at_s=math.inf)


# ---- read-only opens -------------------------------------------------------------------------


def test_a_read_only_store_reads_what_a_live_writer_committed_and_writes_nothing(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "store.db"
    writer = Store.create(path, "c1", clock)
    writer.add_job("j1", '{"name": "j1"}')
    with Store.open_read_only(path, clock) as reader:
        assert [j.name for j in reader.list_jobs()] == ["j1"]
        writer.add_job("j2", '{"name": "j2"}')  # committed while the reader is open (WAL)
        assert [j.name for j in reader.list_jobs()] == ["j1", "j2"]
        with pytest.raises(StoreUnwritableError, match="opened read-only"):
            reader.add_job("j3", "{}")
        with pytest.raises(StoreUnwritableError):
            reader.check_writable()
    assert [j.name for j in writer.list_jobs()] == ["j1", "j2"]
    writer.close()


def test_a_read_only_open_neither_migrates_nor_opens_what_open_refuses(
    tmp_path: Path, clock: FakeClock
) -> None:
    old = tmp_path / "v1.db"
    build_store_at(old, 1)
    with pytest.raises(StoreError, match="schema version 1, older") as refused:
        Store.open_read_only(old, clock)
    assert "coadapt up --state-dir" in str(refused.value)
    conn = sqlite3.connect(old)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
    conn.close()
    with pytest.raises(StoreMissingError):
        Store.open_read_only(tmp_path / "none.db", clock)
    (tmp_path / "junk.db").write_bytes(b"not a database" * 512)
    with pytest.raises(StoreCorruptError):
        Store.open_read_only(tmp_path / "junk.db", clock)


def test_typed_preemptions_are_back_filled_from_the_reason_strings(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A store of schema 7 knew a preemption only by its history's reason strings: the
    migration records them typed (a spot notice; vanishing while running or draining), and
    leaves a release (vanishing while terminating) a release."""
    from autoscaler.controller.lifecycle import preempted_at

    old = tmp_path / "v7.db"
    build_store_at(old, 7)
    conn = sqlite3.connect(old, isolation_level=None)
    conn.execute(
        "INSERT INTO instances VALUES ('i-2', 'c1-i-2', 'fake/z/t/spot', 'fake', 't', 'z', "
        "'spot', 'T4', 4, 0.5, 'x-2', 'terminated', 0, NULL, 11.0, 30.0, 4)"
    )
    conn.execute(
        "INSERT INTO instances VALUES ('i-3', 'c1-i-3', 'fake/z/t/spot', 'fake', 't', 'z', "
        "'spot', 'T4', 4, 0.5, 'x-3', 'terminated', 0, NULL, 11.0, 30.0, 4)"
    )
    conn.execute(
        "INSERT INTO instance_history (instance_key, status, at_s, reason) VALUES "
        "('i-2', 'queued', 11.0, 'w'), ('i-2', 'running', 12.0, 'l'), "
        "('i-2', 'draining', 20.0, 'spot interruption notice'), "
        "('i-2', 'terminated', 30.0, 'no longer listed by the cloud'), "
        "('i-3', 'queued', 11.0, 'w'), ('i-3', 'running', 12.0, 'l'), "
        "('i-3', 'terminating', 25.0, 'drained: no job left on it'), "
        "('i-3', 'terminated', 30.0, 'no longer listed by the cloud')"
    )
    conn.close()
    with Store.open(old, clock) as s:
        assert [c.preemption for c in s.history("i-2")] == [False, False, True, True]
        assert preempted_at(s.history("i-2")) == 20.0
        assert preempted_at(s.history("i-3")) is None
        assert preempted_at(s.history("i-1")) is None
