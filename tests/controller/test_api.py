"""The controller's HTTP API over real HTTP: a Werkzeug server on 127.0.0.1 (port 0), a real
SQLite store file, a fake clock. Every endpoint's answers, every refusal (and that a refused
request changes nothing), tokens kept out of logs, body limits, and concurrent submissions."""

from __future__ import annotations

import dataclasses
import datetime
import http.client
import json
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from autoscaler.controller.agent import assignments_from_json
from autoscaler.controller.api import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_LOG_CHUNK_BYTES,
    ApiApp,
    ApiClient,
    ApiCredentials,
    ApiError,
    ApiServer,
    ApiTokens,
    ApiUnreachableError,
    ServerLimits,
    generate_tokens,
    make_app,
    rendezvous_endpoint,
    serve,
)
from autoscaler.controller.errors import ControllerError, StoreMissingError
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.jobspec import parse_job_spec, submission_body
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.ratelimit import RateLimit, RequestLimits
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock
from providers.base import Market
from trainer.report import (
    BatchConfig,
    GradientStats,
    JobHints,
    ProfileEntry,
    ReportReply,
    TrainerReport,
    report_path,
)

START_S = 1_700_000_000.0
UNLIMITED = RequestLimits(RateLimit(1e9, 1_000_000), RateLimit(1e9, 1_000_000))


def spec(name: str = "bert", **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "init_batch_size": 64,
        "max_batch_size": 1024,
        "max_local_bsz": 128,
        "command": ["train.py", "--epochs", "3"],
    }
    body.update(kw)
    return body


def report(job: str, *, progress: float = 12.5, step: int = 100) -> TrainerReport:
    return TrainerReport(
        job_id=job,
        attempt=1,
        started_at_s=START_S - 60,
        sent_at_s=START_S,
        world_size=8,
        num_nodes=2,
        batch=BatchConfig(256, 1),
        step=step,
        skipped_steps=0,
        epoch=1,
        epoch_position=512,
        progress=progress,
        gradient=GradientStats(64, 1.0, 4.0, 10, False),
        profiles=(ProfileEntry(2, 8, 32, 1, 10, 0.5, 0.4, 0.1),),
        hints=JobHints(64, 1024),
    )


def add_instance(store: Store, key: str, *, gpus: int = 4, running: bool = True) -> None:
    row = store.add_instance(
        instance_key=key,
        request_id=f"c1-{key}",
        offering_key="fake/p3.8xlarge/us-east-1a/spot",
        provider="fake",
        instance_type="p3.8xlarge",
        zone="us-east-1a",
        market=Market.SPOT,
        gpu_type="V100",
        gpus=gpus,
        price_usd_per_hour=3.67,
    )
    if running:
        row = store.transition(key, row.version, InstanceStatus.REQUESTED, reason="launch")
        store.transition(
            key, row.version, InstanceStatus.RUNNING, reason="up", provider_instance_id=f"p-{key}"
        )


def place(store: Store, job: str, gpus_by_instance: dict[str, int]) -> None:
    """What a controller round does for a placed job: assignments, then ``running``."""
    store.set_assignments(job, gpus_by_instance)
    row = store.get_job(job)
    store.update_job(job, row.version, status=JobStatus.RUNNING)


def snapshot(path: Path) -> list[str]:
    """Every row of the store file, as SQL (read through a separate read-only connection)."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


class ExitRecorder:
    """A stand-in for ``Controller.job_exited`` that behaves like it (a failure queues the
    job for a retry, a success completes it) on a store of its own, and records its calls."""

    def __init__(self, path: Path, clock: FakeClock) -> None:
        self.path = path
        self.clock = clock
        self.calls: list[tuple[str, bool]] = []
        self.error: Exception | None = None

    def __call__(self, name: str, *, failed: bool) -> JobStatus:
        self.calls.append((name, failed))
        if self.error is not None:
            raise self.error
        with Store.open(self.path, self.clock) as store:
            job = store.get_job(name)
            status = JobStatus.QUEUED if failed else JobStatus.COMPLETED
            store.update_job(name, job.version, status=status, retries=job.retries + failed)
        return status


# ---- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START_S)


@pytest.fixture
def store_path(tmp_path: Path, clock: FakeClock) -> Path:
    path = tmp_path / "store.db"
    Store.create(path, "c1", clock).close()
    return path


@pytest.fixture
def store(store_path: Path, clock: FakeClock) -> Iterator[Store]:
    with Store.open(store_path, clock) as s:
        yield s


@pytest.fixture
def tokens(tmp_path: Path) -> ApiTokens:
    return generate_tokens(tmp_path / "secrets" / "tokens.json")


@pytest.fixture
def logs_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


@pytest.fixture
def exits(store_path: Path, clock: FakeClock) -> ExitRecorder:
    return ExitRecorder(store_path, clock)


def start(
    store_path: Path,
    tokens: ApiTokens,
    clock: FakeClock,
    logs_dir: Path,
    exits: ExitRecorder,
    **kw: Any,
) -> tuple[ApiApp, ApiServer]:
    # The fake clock never refills a rate limit: these tests call as often as they need
    # (the limits have their own tests: test_ratelimit.py).
    kw.setdefault("limits", UNLIMITED)
    app = make_app(store_path, tokens, clock, logs_dir=logs_dir, on_job_exit=exits, **kw)
    return app, serve(app, "127.0.0.1", 0)


@pytest.fixture
def server(
    store_path: Path, tokens: ApiTokens, clock: FakeClock, logs_dir: Path, exits: ExitRecorder
) -> Iterator[ApiServer]:
    app, srv = start(store_path, tokens, clock, logs_dir, exits)
    yield srv
    srv.shutdown()
    app.close()


@pytest.fixture
def user(server: ApiServer, tokens: ApiTokens) -> ApiClient:
    return ApiClient(server.url, tokens.user, timeout_s=10)


class Agents:
    """Each instance's agent calling with its own credential, and each job's trainers with
    theirs (what the API hands out): the client methods, keyed by the instance or the job."""

    def __init__(self, url: str, credentials: ApiCredentials) -> None:
        self.url = url
        self.credentials = credentials

    def of(self, key: str) -> ApiClient:
        return ApiClient(self.url, self.credentials.agent_credential(key), timeout_s=10)

    def register(self, key: str, **kw: Any) -> Any:
        return self.of(key).register(key, **kw)

    def heartbeat(self, key: str, **kw: Any) -> Any:
        return self.of(key).heartbeat(key, **kw)

    def assignments(self, key: str) -> Any:
        return self.of(key).assignments(key)

    def job_exited(self, key: str, name: str, **kw: Any) -> Any:
        return self.of(key).job_exited(key, name, **kw)

    def post_report(self, sent: TrainerReport) -> ReportReply:
        token = self.credentials.report_credential(sent.job_id)
        return ApiClient(self.url, token, timeout_s=10).post_report(sent)


@pytest.fixture
def agent(server: ApiServer, tokens: ApiTokens) -> Agents:
    return Agents(server.url, tokens)


def call(
    server: ApiServer,
    method: str,
    path: str,
    body: bytes | dict[str, Any] | None = None,
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One raw HTTP request; the status and the JSON answer (every answer must be JSON)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        conn.request(method, path, body=data, headers=sent)
        answer = conn.getresponse()
        raw = answer.read()
        assert answer.getheader("Content-Type") == "application/json", raw
        return answer.status, json.loads(raw)
    finally:
        conn.close()


def assert_error(answer: tuple[int, Any], status: int, field: str | None = None) -> str:
    got, body = answer
    assert got == status, body
    assert set(body) == {"error", "field"}, body
    assert isinstance(body["error"], str) and body["error"]
    assert body["field"] == field, body
    return body["error"]


# ---- users ---------------------------------------------------------------------------------


def test_submit_answers_201_with_the_job_and_stores_it(
    server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    status, body = call(server, "POST", "/v1/jobs", spec("bert"), token=tokens.user)
    assert status == 201
    assert body["name"] == "bert"
    assert body["status"] == "queued"
    assert body["retries"] == 0
    assert body["submitted_at_s"] == START_S
    assert body["assignment"] == {}
    assert body["progress"] is None and body["report"] is None
    assert (body["gpus"], body["batch_size"], body["target_progress"]) == (0, None, None)
    assert (body["restarts"], body["reason"]) == (0, None)
    assert body["spec"]["command"] == ["train.py", "--epochs", "3"]
    stored = JobSubmission.from_json(store.get_job("bert").spec_json)
    assert stored == JobSubmission.from_json(json.dumps(spec("bert")))


def test_a_deadline_is_fixed_at_submission_and_an_impossible_one_refused(
    server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    status, body = call(server, "POST", "/v1/jobs", spec("a", deadline="2h"), token=tokens.user)
    assert status == 201 and body["spec"]["deadline"] == "2h"
    assert store.get_job("a").deadline_s == START_S + 7200.0
    at = datetime.datetime.fromtimestamp(START_S + 600.0, datetime.UTC).isoformat()
    assert call(server, "POST", "/v1/jobs", spec("b", deadline=at), token=tokens.user)[0] == 201
    assert store.get_job("b").deadline_s == START_S + 600.0
    past = datetime.datetime.fromtimestamp(START_S - 1.0, datetime.UTC).isoformat()
    for bad, words in ((past, "is in the past"), (60, "is 60 s after submission")):
        answer = call(server, "POST", "/v1/jobs", spec("c", deadline=bad), token=tokens.user)
        message = assert_error(answer, 400, "deadline")
        assert words in message and "estimated 180 s" in message
    message = assert_error(
        call(server, "POST", "/v1/jobs", spec("c", deadline="soon"), token=tokens.user),
        400,
        "deadline",
    )
    assert "a duration such as" in message
    assert [j.name for j in store.list_jobs()] == ["a", "b"]


def test_a_deadline_the_specs_length_cannot_meet_is_refused_at_submit_with_the_estimate(
    server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    """A spec with a ``length`` and a deadline no offering can meet at the speed this cluster
    measured of its application is refused (400 on ``deadline``) with the estimate; with a
    feasible deadline it is accepted; an application never measured has an unknown estimate,
    said in the refusal of a deadline sooner than any start."""
    fit = {"alpha_c": 0.0, "beta_c": 0.01, "alpha_n": 0.0, "beta_n": 0.0}
    fit |= {"alpha_r": 0.0, "beta_r": 0.0, "gamma": 1.0}  # 100 samples/s on one V100
    store.add_job("bert-old", json.dumps(spec("bert-old", application="bert")))
    store.upsert_model("bert-old", "V100", json.dumps({"samples": [], "perf": fit}))
    body = {
        "name": "bert-new",
        "command": ["train.py"],
        "application": "bert",
        "gpus": {"min": 1, "max": 1},
        "gpu_types": ["V100"],
        "batch_size": {"initial": 64, "max": 1024},
        "local_batch_size": {"max": 128},
        "length": {"samples": 1_000_000},
        "deadline": "2h",
    }
    message = assert_error(
        call(server, "POST", "/v1/jobs", body, token=tokens.user), 400, "deadline"
    )
    assert "is 7200 s after submission" in message
    assert "its declared length (1000000 samples) takes at least an estimated 10180 s" in message
    assert "measured speed of application 'bert'" in message
    status, answer = call(server, "POST", "/v1/jobs", {**body, "deadline": "3h"}, token=tokens.user)
    assert status == 201, answer
    assert answer["spec"]["length_samples"] == 1_000_000
    assert store.get_job("bert-new").deadline_s == START_S + 10_800.0
    unknown = {**body, "name": "gpt-new", "application": "gpt", "deadline": 60}
    message = assert_error(
        call(server, "POST", "/v1/jobs", unknown, token=tokens.user), 400, "deadline"
    )
    assert "estimated 180 s" in message
    assert "takes an unknown time (this cluster has measured no job of application 'gpt')" in (
        message
    )
    assert sorted(j.name for j in store.list_jobs()) == ["bert-new", "bert-old"]


def test_client_submit_get_list_cancel(user: ApiClient, store: Store) -> None:
    submitted = user.submit_job(JobSubmission("a", 32, 256, 64, command=("a.py",)))
    assert submitted.status is JobStatus.QUEUED
    assert submitted.submission.command == ("a.py",)
    user.submit_job(spec("b", min_gpus=2, application="bert", adaptive=False))
    assert [j.name for j in user.list_jobs()] == ["a", "b"]
    assert user.get_job("b").submission.min_gpus == 2
    cancelled = user.cancel_job("a")
    assert cancelled.status is JobStatus.CANCELLED
    assert cancelled.version == submitted.version + 1
    assert store.get_job("a").status is JobStatus.CANCELLED
    assert user.get_job("b").status is JobStatus.QUEUED


def test_job_view_has_assignment_and_latest_progress(
    user: ApiClient, agent: Agents, store: Store
) -> None:
    user.submit_job(spec("bert"))
    add_instance(store, "i-a")
    add_instance(store, "i-b")
    place(store, "bert", {"i-a": 4, "i-b": 2})
    agent.post_report(report("bert", progress=3.0, step=30))
    agent.post_report(report("bert", progress=7.5, step=75))
    (listed,) = user.list_jobs()
    assert listed == user.get_job("bert")
    assert listed.status is JobStatus.RUNNING
    assert listed.assignment == {"i-a": 4, "i-b": 2}
    assert listed.report is not None
    assert (listed.report.progress, listed.report.step, listed.report.epoch) == (7.5, 75, 1)
    assert listed.report.at_s == START_S


def test_duplicate_job_is_409_and_keeps_the_first(
    server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    assert call(server, "POST", "/v1/jobs", spec("bert"), token=tokens.user)[0] == 201
    before = snapshot(store.path)
    answer = call(server, "POST", "/v1/jobs", spec("bert", max_local_bsz=8), token=tokens.user)
    assert "already exists" in assert_error(answer, 409, "name")
    assert snapshot(store.path) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({k: v for k, v in spec().items() if k != "max_local_bsz"}, "max_local_bsz"),
        ({k: v for k, v in spec().items() if k != "name"}, "name"),
        (spec(init_batch_size=0), "init_batch_size"),
        (spec(init_batch_size=2048), "max_batch_size"),
        (spec(min_gpus=True), "min_gpus"),
        (spec(unknown_knob=3), "unknown_knob"),
        (spec("../etc"), "name"),
        (spec("a/b"), "name"),
        (spec(""), "name"),
        ({**spec(), "name": 7}, "name"),
        (spec(command="python train.py"), "command"),
        (spec(command=[]), "command"),
        (spec(command=["train.py", 3]), "command[1]"),
        (spec(command=["python", "train.py"]), "command[0]"),
        (spec(command=["--controller-url", "http://elsewhere", "train.py"]), "command[0]"),
        ({k: v for k, v in spec().items() if k != "command"}, "command"),
        (spec(min_gpus=9223372036854775808, adaptive=False), "min_gpus"),
        (spec(min_gpus=2**62), "min_gpus"),
        (spec(max_gpus=10**9), "max_gpus"),
        (spec(max_batch_size=2**40), "max_batch_size"),
        (spec(gpu_types=["Z80"]), "gpu_types[0]"),
        (spec(min_gpus=2, max_gpus=4, adaptive=False), "max_gpus"),
        (spec(adaptive="yes"), "adaptive"),
        (spec(application=None), "application"),
    ],
)
def test_bad_submission_is_400_naming_the_field(
    server: ApiServer, tokens: ApiTokens, store: Store, body: dict[str, Any], field: str
) -> None:
    assert_error(call(server, "POST", "/v1/jobs", body, token=tokens.user), 400, field)
    assert store.list_jobs() == ()


def test_cancel_of_an_ended_job_is_409(
    server: ApiServer, user: ApiClient, tokens: ApiTokens, store: Store
) -> None:
    user.submit_job(spec("a"))
    user.cancel_job("a")
    before = snapshot(store.path)
    message = assert_error(call(server, "POST", "/v1/jobs/a/cancel", token=tokens.user), 409)
    assert "cancelled" in message
    user.submit_job(spec("b"))
    row = store.get_job("b")
    store.update_job("b", row.version, status=JobStatus.COMPLETED)
    with pytest.raises(ApiError) as e:
        user.cancel_job("b")
    assert e.value.status == 409
    assert store.get_job("b").status is JobStatus.COMPLETED
    assert [line for line in snapshot(store.path) if "'a'" in line] == [
        line for line in before if "'a'" in line
    ]


def test_cancel_writes_against_the_version_read(user: ApiClient, store: Store) -> None:
    user.submit_job(spec("a"))
    add_instance(store, "i-a")
    place(store, "a", {"i-a": 4})  # the job moved on (version 2) since it was submitted
    cancelled = user.cancel_job("a")
    assert cancelled.status is JobStatus.CANCELLED
    assert cancelled.version == 3
    assert cancelled.assignment == {"i-a": 4}  # released by the next round, not here


def test_unknown_job_is_404_everywhere(server: ApiServer, tokens: ApiTokens, store: Store) -> None:
    add_instance(store, "i-a")
    before = snapshot(store.path)
    u, a = tokens.user, tokens.agent_credential("i-a")
    assert_error(call(server, "GET", "/v1/jobs/nope", token=u), 404)
    assert_error(call(server, "POST", "/v1/jobs/nope/cancel", token=u), 404)
    assert_error(call(server, "GET", "/v1/jobs/nope/logs", token=u), 404)
    nope = tokens.report_credential("nope")
    assert_error(
        call(server, "POST", report_path("nope"), report("nope").to_dict(), token=nope), 404
    )
    exit_path = "/v1/agents/i-a/jobs/nope/exit"
    assert_error(call(server, "POST", exit_path, {"failed": True}, token=a), 404)
    assert snapshot(store.path) == before


def test_unknown_paths_and_methods_answer_json(server: ApiServer, tokens: ApiTokens) -> None:
    assert "no such endpoint" in assert_error(call(server, "GET", "/v2/jobs", token="x"), 404)
    assert_error(call(server, "GET", "/", token=tokens.user), 404)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("DELETE", "/v1/jobs", headers={"Authorization": f"Bearer {tokens.user}"})
        answer = conn.getresponse()
        body = json.loads(answer.read())
        assert answer.status == 405
        assert set(answer.getheader("Allow", "").split(", ")) >= {"GET", "POST"}
        assert "DELETE" in body["error"]
    finally:
        conn.close()


def test_list_instances_answers_every_column(
    user: ApiClient, server: ApiServer, tokens: ApiTokens, store: Store, clock: FakeClock
) -> None:
    add_instance(store, "i-a", gpus=8)
    add_instance(store, "i-b", running=False)
    store.record_heartbeat("i-a", START_S + 5)
    rows = user.list_instances()
    assert rows == store.list_instances()
    status, body = call(server, "GET", "/v1/instances", token=tokens.user)
    assert status == 200
    first = body["instances"][0]
    assert first["instance_key"] == "i-a"
    assert first["status"] == "running"
    assert first["offering_key"] == "fake/p3.8xlarge/us-east-1a/spot"
    assert first["market"] == "spot"
    assert first["price_usd_per_hour"] == 3.67
    assert (first["gpu_type"], first["gpus"]) == ("V100", 8)
    assert first["provider_instance_id"] == "p-i-a"
    assert first["last_heartbeat_s"] == START_S + 5
    assert body["instances"][1]["status"] == "queued"


# ---- logs ----------------------------------------------------------------------------------


def test_logs_concatenate_files_from_an_offset(
    user: ApiClient, logs_dir: Path, tmp_path: Path
) -> None:
    user.submit_job(spec("bert"))
    assert user.job_logs("bert") == user.job_logs("bert", 0)
    empty = user.job_logs("bert")
    assert (empty.text, empty.next_offset, empty.more, empty.instances) == ("", 0, False, ())
    folder = logs_dir / "bert"
    folder.mkdir(parents=True)
    (folder / "i-b.log").write_bytes(b"b1\n")
    (folder / "i-a.log").write_bytes(b"a1\na2\n")
    (folder / ".i-c.log.tmp").write_bytes(b"hidden")
    (tmp_path / "secret.txt").write_bytes(b"not a log")
    (folder / "i-x.log").symlink_to(tmp_path / "secret.txt")
    chunk = user.job_logs("bert")
    assert chunk.text == "a1\na2\nb1\n"
    assert chunk.next_offset == 9
    assert chunk.instances == (("i-a", 6), ("i-b", 3))
    assert user.job_logs("bert", 3).text == "a2\nb1\n"
    assert user.job_logs("bert", 9).text == ""
    assert user.job_logs("bert", 9).next_offset == 9
    assert user.job_logs("bert", 100).text == ""
    with open(folder / "i-b.log", "ab") as f:
        f.write(b"b2\n")
    follow = user.job_logs("bert", chunk.next_offset)
    assert (follow.text, follow.next_offset) == ("b2\n", 12)
    one = user.job_logs("bert", 0, instance="i-b")
    assert (one.text, one.next_offset, one.instances) == ("b1\nb2\n", 6, (("i-b", 6),))


def test_logs_hold_back_a_split_character_and_come_in_bounded_chunks(
    user: ApiClient, logs_dir: Path
) -> None:
    user.submit_job(spec("bert"))
    folder = logs_dir / "bert"
    folder.mkdir(parents=True)
    euro = "€".encode()  # three bytes
    (folder / "i-a.log").write_bytes(b"x" + euro[:2])  # an agent mid-write
    chunk = user.job_logs("bert")
    assert (chunk.text, chunk.next_offset) == ("x", 1)
    with open(folder / "i-a.log", "ab") as f:
        f.write(euro[2:] + b"\n")
    assert user.job_logs("bert", chunk.next_offset).text == "€\n"
    big = b"y" * (MAX_LOG_CHUNK_BYTES + 1000)
    (folder / "i-b.log").write_bytes(big)
    first = user.job_logs("bert", 5)
    assert first.more and len(first.text) == MAX_LOG_CHUNK_BYTES
    chunks = list(user.follow_logs("bert", 5))
    assert "".join(c.text for c in chunks) == big.decode()
    assert chunks[-1].next_offset == 5 + len(big) and not chunks[-1].more


def test_logs_offset_must_be_a_count(server: ApiServer, user: ApiClient, tokens: ApiTokens) -> None:
    user.submit_job(spec("bert"))
    for bad in ("-1", "x", "1.5", "%C2%B2"):
        answer = call(server, "GET", f"/v1/jobs/bert/logs?offset={bad}", token=tokens.user)
        assert_error(answer, 400, "offset")


def test_jobs_are_listed_page_by_page_in_a_stable_order(
    server: ApiServer, user: ApiClient, tokens: ApiTokens, clock: FakeClock
) -> None:
    for i in range(7):
        user.submit_job(spec(f"job-{i}"))
        clock.advance(1.0 if i != 3 else 0.0)  # two jobs share a time: the name orders them
    first, cursor = user.list_jobs_page(limit=3)
    assert [j.name for j in first] == ["job-0", "job-1", "job-2"] and cursor is not None
    user.submit_job(spec("late"))  # submitted while paging: on a later page, never twice
    seen = [j.name for j in first]
    while cursor is not None:
        page, cursor = user.list_jobs_page(cursor, limit=3)
        assert len(page) <= 3
        seen += [j.name for j in page]
    assert seen == [f"job-{i}" for i in range(7)] + ["late"]
    assert [j.name for j in user.list_jobs(page_size=2)] == seen
    status, body = call(server, "GET", "/v1/jobs", token=tokens.user)
    assert status == 200 and len(body["jobs"]) == 8 and body["next_cursor"] is None
    for bad in ("limit=0", "limit=501", "limit=x", "cursor=nope", "cursor=" + "A" * 600):
        answer = call(server, "GET", f"/v1/jobs?{bad}", token=tokens.user)
        assert_error(answer, 400, bad.split("=")[0])


def test_a_huge_log_offset_is_a_400_not_a_500(
    server: ApiServer, user: ApiClient, tokens: ApiTokens
) -> None:
    user.submit_job(spec("bert"))
    for bad in ("9" * 5000, str(1 << 63), "0" * 30 + "1" * 20):
        answer = call(server, "GET", f"/v1/jobs/bert/logs?offset={bad}", token=tokens.user)
        assert_error(answer, 400, "offset")
        assert len(answer[1]["error"]) < 200  # the digits are not echoed back
    padded = call(server, "GET", "/v1/jobs/bert/logs?offset=" + "0" * 40 + "3", token=tokens.user)
    assert padded[0] == 200 and padded[1]["offset"] == 3


# ---- agents --------------------------------------------------------------------------------


def test_register_answers_the_running_instance_row(
    agent: Agents, server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    add_instance(store, "i-a")
    add_instance(store, "i-q", running=False)
    assert agent.register("i-a") == store.get_instance("i-a")
    before = snapshot(store.path)
    message = assert_error(
        call(
            server,
            "POST",
            "/v1/agents/register",
            {"instance_key": "i-q"},
            token=tokens.agent_credential("i-q"),
        ),
        409,
    )
    assert "queued" in message
    answer = call(
        server,
        "POST",
        "/v1/agents/register",
        {"instance_key": "i-z"},
        token=tokens.agent_credential("i-z"),
    )
    assert_error(answer, 404)
    a = tokens.agent_credential("i-a")
    answer = call(server, "POST", "/v1/agents/register", {"key": "i-a"}, token=a)
    assert_error(answer, 400, "instance_key")
    answer = call(
        server, "POST", "/v1/agents/register", {"instance_key": "i-a", "address": "a b"}, token=a
    )
    assert_error(answer, 400, "address")
    assert snapshot(store.path) == before


def test_heartbeat_records_the_clock_time(
    agent: Agents, server: ApiServer, tokens: ApiTokens, store: Store, clock: FakeClock
) -> None:
    add_instance(store, "i-a")
    reply = agent.heartbeat("i-a")
    assert (reply.instance_key, reply.at_s, reply.status) == ("i-a", START_S, "running")
    assert store.get_instance("i-a").last_heartbeat_s == START_S
    clock.advance(30)
    assert agent.heartbeat("i-a", address="10.0.0.7").at_s == START_S + 30
    assert store.get_instance("i-a").last_heartbeat_s == START_S + 30
    z = tokens.agent_credential("i-z")
    assert_error(call(server, "POST", "/v1/agents/i-z/heartbeat", token=z), 404)


def test_assignments_give_each_running_job_its_nodes_in_rank_order(
    agent: Agents, user: ApiClient, store: Store
) -> None:
    add_instance(store, "i-a")
    add_instance(store, "i-b")
    user.submit_job(spec("bert"))
    user.submit_job(spec("gpt"))
    user.submit_job(spec("cancelled"))
    place(store, "bert", {"i-b": 2, "i-a": 4})
    place(store, "gpt", {"i-b": 2})
    place(store, "cancelled", {"i-a": 1})
    user.cancel_job("cancelled")

    on_b = {a["job"]: a for a in agent.assignments("i-b")}
    assert sorted(on_b) == ["bert", "gpt"]
    bert = on_b["bert"]
    assert bert["gpus"] == 2
    assert bert["nodes"] == [["i-a", 4], ["i-b", 2]]
    assert bert["node_rank"] == 1
    assert bert["command"] == ["train.py", "--epochs", "3"]
    assert bert["spec"]["max_batch_size"] == 1024
    assert bert["rendezvous"] is None  # the first node's address is not known yet
    assert [a["job"] for a in agent.assignments("i-a")] == ["bert"]
    assert agent.assignments("i-a")[0]["node_rank"] == 0

    agent.register("i-a", address="10.0.0.5")
    agent.heartbeat("i-b", address="10.0.0.6")
    bert = {a["job"]: a for a in agent.assignments("i-b")}["bert"]
    assert bert["rendezvous"] == rendezvous_endpoint("bert", "10.0.0.5", "i-a")
    assert bert["addresses"] == {"i-a": "10.0.0.5", "i-b": "10.0.0.6"}
    parsed = assignments_from_json(agent.assignments("i-b"))  # what the agent reads
    assert parsed["bert"].nodes == (("i-a", 4), ("i-b", 2))
    assert parsed["bert"].rendezvous == rendezvous_endpoint("bert", "10.0.0.5", "i-a")
    assert parsed["gpt"].command == ("train.py", "--epochs", "3")


def test_assignments_of_an_unknown_instance_are_404(
    server: ApiServer, tokens: ApiTokens, agent: Agents, store: Store
) -> None:
    z = tokens.agent_credential("i-z")
    assert_error(call(server, "GET", "/v1/agents/i-z/assignments", token=z), 404)
    add_instance(store, "i-a")
    assert agent.assignments("i-a") == []


def test_rendezvous_endpoint_is_stable_and_brackets_ipv6() -> None:
    a = rendezvous_endpoint("bert", "10.0.0.5")
    assert a == rendezvous_endpoint("bert", "10.0.0.5")
    host, port = a.rsplit(":", 1)
    assert host == "10.0.0.5" and 29500 <= int(port) < 30500
    assert rendezvous_endpoint("bert", "fd00::1").startswith("[fd00::1]:")
    # two clusters on one machine, each with a job "bert": their first nodes differ
    ports = {rendezvous_endpoint("bert", "127.0.0.1", f"i-{k:04x}") for k in range(20)}
    assert len(ports) > 15


def test_job_exit_calls_the_controller_once_per_run(
    agent: Agents, user: ApiClient, exits: ExitRecorder, store: Store
) -> None:
    add_instance(store, "i-a")
    add_instance(store, "i-b")
    user.submit_job(spec("bert"))
    place(store, "bert", {"i-a": 4, "i-b": 4})
    reply = agent.job_exited("i-a", "bert", failed=True)
    assert (reply.job, reply.status, reply.counted) == ("bert", JobStatus.QUEUED, True)
    assert exits.calls == [("bert", True)]
    # the other node of the same run reports the same failure: not counted again
    reply = agent.job_exited("i-b", "bert", failed=True)
    assert (reply.status, reply.counted) == (JobStatus.QUEUED, False)
    assert exits.calls == [("bert", True)]
    assert store.get_job("bert").retries == 1
    place(store, "bert", {"i-a": 4, "i-b": 4})  # the next round places it again
    reply = agent.job_exited("i-b", "bert", failed=False)
    assert (reply.status, reply.counted) == (JobStatus.COMPLETED, True)
    assert exits.calls == [("bert", True), ("bert", False)]


def test_simultaneous_exit_reports_of_one_run_count_once(
    server: ApiServer, tokens: ApiTokens, user: ApiClient, exits: ExitRecorder, store: Store
) -> None:
    keys = [f"i-{i}" for i in range(6)]
    for key in keys:
        add_instance(store, key)
    user.submit_job(spec("bert"))
    place(store, "bert", dict.fromkeys(keys, 4))
    barrier = threading.Barrier(len(keys))
    counted: list[bool] = []

    def report_exit(key: str) -> None:
        client = ApiClient(server.url, tokens.agent_credential(key), timeout_s=30)
        barrier.wait()
        counted.append(client.job_exited(key, "bert", failed=True).counted)

    threads = [threading.Thread(target=report_exit, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(counted) == [False] * 5 + [True]
    assert exits.calls == [("bert", True)]
    assert store.get_job("bert").retries == 1


def test_job_exit_refusals(
    server: ApiServer, tokens: ApiTokens, user: ApiClient, exits: ExitRecorder, store: Store
) -> None:
    add_instance(store, "i-a")
    add_instance(store, "i-b")
    user.submit_job(spec("bert"))
    place(store, "bert", {"i-a": 4})
    before = snapshot(store.path)
    path = "/v1/agents/i-b/jobs/bert/exit"
    b = tokens.agent_credential("i-b")
    message = assert_error(call(server, "POST", path, {"failed": True}, token=b), 409)
    assert "not assigned" in message
    path = "/v1/agents/i-a/jobs/bert/exit"
    a = tokens.agent_credential("i-a")
    assert_error(call(server, "POST", path, {"failed": "yes"}, token=a), 400, "failed")
    assert_error(call(server, "POST", path, {}, token=a), 400, "failed")
    path = "/v1/agents/i-z/jobs/bert/exit"
    z = tokens.agent_credential("i-z")
    assert_error(call(server, "POST", path, {"failed": True}, token=z), 404)
    assert exits.calls == []
    assert snapshot(store.path) == before


def test_an_unexpected_error_is_500_without_details(
    server: ApiServer, tokens: ApiTokens, user: ApiClient, exits: ExitRecorder, store: Store
) -> None:
    add_instance(store, "i-a")
    user.submit_job(spec("bert"))
    place(store, "bert", {"i-a": 4})
    exits.error = RuntimeError("the controller broke: secret detail")
    a = tokens.agent_credential("i-a")
    answer = call(server, "POST", "/v1/agents/i-a/jobs/bert/exit", {"failed": True}, token=a)
    message = assert_error(answer, 500)
    assert "secret detail" not in message


# ---- trainer reports -----------------------------------------------------------------------


def test_reports_round_trip_and_the_reply_says_stop_when_not_running(
    agent: Agents, user: ApiClient, store: Store
) -> None:
    add_instance(store, "i-a")
    user.submit_job(spec("bert"))
    sent = report("bert")
    reply = agent.post_report(sent)
    assert reply.stop and reply.batch is None  # queued: not placed, must not run
    latest = store.latest_report("bert")
    assert latest is not None
    assert TrainerReport.from_json(latest.payload_json) == sent
    assert latest.at_s == START_S
    place(store, "bert", {"i-a": 4})
    assert agent.post_report(report("bert", progress=20.0)) == ReportReply(stop=False)
    user.cancel_job("bert")
    assert agent.post_report(report("bert", progress=21.0)).stop
    assert len(store.reports_after(0)[1]) == 3


def test_the_reply_carries_the_planned_batch_for_the_gpus_the_trainer_runs_on(
    agent: ApiClient, user: ApiClient, store: Store
) -> None:
    """A batch planned for the trainer's world size and not the one it runs reaches it in
    the reply (adopted without a relaunch); a batch planned for another GPU count comes with
    the relaunch instead; a finished trainer is told nothing more."""
    add_instance(store, "i-a")
    add_instance(store, "i-b")
    user.submit_job(spec("bert"))
    place(store, "bert", {"i-a": 4, "i-b": 4})  # the report's 8 replicas
    assert agent.post_report(report("bert")).batch is None, "nothing planned yet"
    store.set_batch("bert", global_batch_size=512, local_batch_size=32, accum_steps=2, gpus=8)
    reply = agent.post_report(report("bert"))
    assert reply == ReportReply(batch=BatchConfig(512, 2), stop=False)
    same = dataclasses.replace(report("bert"), batch=BatchConfig(512, 2))
    assert agent.post_report(same).batch is None, "it already runs the plan"
    done = dataclasses.replace(report("bert"), done=True)
    assert agent.post_report(done).batch is None
    store.set_batch("bert", global_batch_size=256, local_batch_size=64, accum_steps=1, gpus=4)
    assert agent.post_report(report("bert")).batch is None, "planned for 4 GPUs, it runs 8"
    place(store, "bert", {"i-a": 4})
    (mine,) = agent.assignments("i-a")
    assert mine["batch"] == {"global_batch_size": 256, "local_batch_size": 64, "accum_steps": 1}
    job = user.get_job("bert").to_dict()
    assert (job["gpus"], job["batch_size"], job["local_batch_size"]) == (4, 256, 64)
    assert job["accumulation_steps"] == 1


def test_status_fields_of_a_job_with_a_declared_length(
    agent: ApiClient, user: ApiClient, store: Store, clock: FakeClock
) -> None:
    add_instance(store, "i-a")
    user.submit_job(spec("bert"))
    place(store, "bert", {"i-a": 4})
    agent.post_report(dataclasses.replace(report("bert", progress=30.0), target_progress=100.0))
    job = user.get_job("bert").to_dict()
    assert (job["progress"], job["target_progress"], job["remaining_progress"]) == (
        30.0,
        100.0,
        70.0,
    )
    assert job["report"]["target_progress"] == 100.0 and job["restarts"] == 0
    clock.advance(60.0)
    place(store, "bert", {})  # stopped (a preemption, say) ...
    clock.advance(60.0)
    place(store, "bert", {"i-a": 2})  # ... and placed again: one restart
    assert user.get_job("bert").restarts == 1


def test_a_running_jobs_answer_carries_the_eta_its_controller_recorded(
    user: ApiClient, store: Store, clock: FakeClock
) -> None:
    """The answer carries the ETA the last round recorded (``eta_s``, ``eta_at_s``, and
    ``eta_utc``), in the list as in the job's own answer; ``null`` for a job without one,
    for a job that no longer runs, and from the store of a cluster that is not up."""
    from autoscaler.controller.api import jobs_in_store

    add_instance(store, "i-a")
    for name in ("bert", "gpt"):
        user.submit_job(spec(name))
        place(store, name, {"i-a": 2})
    store.record_etas({"bert": START_S + 754.0})  # what a round writes; gpt has no estimate
    clock.advance(5.0)
    when = datetime.datetime.fromtimestamp(START_S + 754.0, datetime.UTC)
    bert = user.get_job("bert").to_dict()
    assert (bert["eta_s"], bert["eta_at_s"]) == (START_S + 754.0, START_S)
    assert bert["eta_utc"] == when.strftime("%Y-%m-%dT%H:%M:%SZ")
    listed = {j.name: j for j in user.list_jobs()}
    assert listed["bert"].eta_s == START_S + 754.0 and listed["bert"].eta_at_s == START_S
    gpt = user.get_job("gpt").to_dict()
    assert (gpt["eta_s"], gpt["eta_at_s"], gpt["eta_utc"]) == (None, None, None)
    assert listed["gpt"].eta_s is None
    # Offline (coadapt status of a cluster that is not up): no progress, no ETA.
    assert [j.eta_s for j in jobs_in_store(store)] == [None, None]
    # A job that stopped running answers none, even before the next round forgets it.
    user.cancel_job("bert")
    assert store.list_etas() != {}
    assert user.get_job("bert").eta_s is None
    assert {j.name: j.eta_s for j in user.list_jobs()}["bert"] is None


def test_a_refused_or_failed_job_can_be_retried_once_fixed(
    server: ApiServer, tokens: ApiTokens, user: ApiClient, store: Store
) -> None:
    user.submit_job(spec("bert"))
    row = store.get_job("bert")
    store.update_job("bert", row.version, status=JobStatus.REFUSED, reason="needs 64 GPUs")
    refused = user.get_job("bert")
    assert (refused.status, refused.reason) == (JobStatus.REFUSED, "needs 64 GPUs")
    again = user.retry_job("bert")
    assert (again.status, again.reason, again.retries) == (JobStatus.QUEUED, None, 0)
    assert_error(call(server, "POST", "/v1/jobs/bert/retry", token=tokens.user), 409)
    assert user.cancel_job("bert").status is JobStatus.CANCELLED


def test_a_retry_is_an_event_saying_what_the_job_had_failed_for(
    user: ApiClient, store: Store, clock: FakeClock
) -> None:
    from autoscaler.controller.events import EventKind, EventRecorder

    user.submit_job(spec("bert"))
    recorder = EventRecorder(store, clock)
    row = store.get_job("bert")
    store.update_job("bert", row.version, status=JobStatus.FAILED, reason="exit status 1: boom")
    assert [e.kind for e in recorder.observe()] == [EventKind.FAILURE]
    clock.advance(5.0)
    user.retry_job("bert")  # coadapt retry
    (event,) = recorder.observe()
    assert (event.kind, event.subject) == (EventKind.RETRY, "bert")
    assert event.message == "queued again by a user (it had failed: exit status 1: boom)"


def test_a_report_with_a_bad_schema_is_400(
    server: ApiServer, tokens: ApiTokens, user: ApiClient, store: Store
) -> None:
    user.submit_job(spec("bert"))
    good = report("bert").to_dict()
    path = report_path("bert")
    bad: list[dict[str, Any]] = [
        {k: v for k, v in good.items() if k != "step"},
        {**good, "schema_version": 99},
        {**good, "step": "many"},
        {**good, "progress": True},
        {**good, "batch": 5},
        {**good, "gradient": [1, 2]},
        {**good, "profiles": [3]},
        {**good, "started_at_s": 10**400},
        {},
    ]
    token = tokens.report_credential("bert")
    for body in bad:
        message = assert_error(call(server, "POST", path, body, token=token), 400)
        assert "report" in message
    message = assert_error(
        call(server, "POST", path, report("gpt").to_dict(), token=token), 400, "job_id"
    )
    assert "gpt" in message
    assert store.latest_report("bert") is None


@settings(
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    key=st.sampled_from(sorted(report("bert").to_dict())),
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=6,
    ),
)
def test_no_report_body_is_a_server_error(
    server: ApiServer, tokens: ApiTokens, store: Store, key: str, value: object
) -> None:
    if not store.list_jobs():
        store.add_job("bert", JobSubmission.from_json(json.dumps(spec("bert"))).to_json())
    body = json.dumps({**report("bert").to_dict(), key: value}).encode()
    token = tokens.report_credential("bert")
    status, answer = call(server, "POST", report_path("bert"), body, token=token)
    assert status in (200, 400), answer


# ---- authentication ------------------------------------------------------------------------

MUTATING = [
    ("POST", "/v1/jobs", lambda: spec("new"), "user"),
    ("POST", "/v1/jobs/bert/cancel", lambda: None, "user"),
    (
        "POST",
        "/v1/agents/register",
        lambda: {"instance_key": "i-a", "address": "10.0.0.1"},
        "agent",
    ),
    ("POST", "/v1/agents/i-a/heartbeat", lambda: {"address": "10.0.0.1"}, "agent"),
    ("POST", "/v1/agents/i-a/jobs/bert/exit", lambda: {"failed": True}, "agent"),
    ("POST", report_path("bert"), lambda: report("bert").to_dict(), "report"),
]


@pytest.mark.parametrize(("method", "path", "body", "role"), MUTATING, ids=[m[1] for m in MUTATING])
def test_every_auth_failure_on_a_mutating_endpoint_changes_nothing(
    server: ApiServer,
    tokens: ApiTokens,
    store: Store,
    exits: ExitRecorder,
    clock: FakeClock,
    method: str,
    path: str,
    body: Any,
    role: str,
) -> None:
    add_instance(store, "i-a")
    store.add_job("bert", JobSubmission.from_json(json.dumps(spec("bert"))).to_json())
    place(store, "bert", {"i-a": 4})
    clock.advance(60)  # a heartbeat would now change the row
    own = {
        "user": tokens.user,
        "agent": tokens.agent_credential("i-a"),
        "report": tokens.report_credential("bert"),
    }
    right = own[role]
    wrong_role = own["agent" if role == "user" else "user"]
    add_instance(store, "i-b")
    other = {  # the right role, for another instance or job: 403 too
        "user": None,
        "agent": tokens.agent_credential("i-b"),
        "report": tokens.report_credential("gpt"),
    }[role]
    failures: list[tuple[dict[str, str], int]] = [
        ({}, 401),
        ({"Authorization": ""}, 401),
        ({"Authorization": "Bearer"}, 401),
        ({"Authorization": "Bearer "}, 401),
        ({"Authorization": f"Basic {right}"}, 401),
        ({"Authorization": f"Bearer {right}x"}, 401),
        ({"Authorization": f"Bearer {right[:-1]}"}, 401),
        ({"Authorization": "Bearer \u00e9t\u00e9-not-a-token"}, 401),
        ({"Authorization": f"Bearer {wrong_role}"}, 403),
        ({"Authorization": f"Bearer {own['report' if role != 'report' else 'agent']}"}, 403),
    ]
    if other is not None:
        failures.append(({"Authorization": f"Bearer {other}"}, 403))

    def state() -> tuple[list[str], list[tuple[str, bool]], Any]:
        """The store's rows, the controller's calls and the agents' addresses in memory."""
        a = tokens.agent_credential("i-a")
        status, seen = call(server, "GET", "/v1/agents/i-a/assignments", token=a)
        assert status == 200
        return snapshot(store.path), list(exits.calls), seen

    before = state()
    for headers, status in failures:
        data = body()
        raw = None if data is None else json.dumps(data).encode()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            encoded = {k: v.encode("utf-8").decode("latin-1") for k, v in headers.items()}
            conn.request(method, path, body=raw, headers=encoded)
            answer = conn.getresponse()
            payload = json.loads(answer.read())
        finally:
            conn.close()
        assert answer.status == status, (headers, payload)
        assert set(payload) == {"error", "field"}
        assert not any(t in payload["error"] for t in own.values())
        if status == 401:
            assert answer.getheader("WWW-Authenticate", "").startswith("Bearer")
        assert state() == before, headers
    # the same request with the right token does change something (the check can see it)
    assert call(server, method, path, body(), token=right)[0] in (200, 201)
    assert state() != before


def test_read_endpoints_need_their_role(server: ApiServer, tokens: ApiTokens, store: Store) -> None:
    add_instance(store, "i-a")
    store.add_job("bert", JobSubmission.from_json(json.dumps(spec("bert"))).to_json())
    agent, reporter = tokens.agent_credential("i-a"), tokens.report_credential("bert")
    for path in ("/v1/jobs", "/v1/jobs/bert", "/v1/jobs/bert/logs", "/v1/instances"):
        assert call(server, "GET", path, token=tokens.user)[0] == 200
        assert_error(call(server, "GET", path, token=agent), 403)
        assert_error(call(server, "GET", path, token=reporter), 403)
        assert_error(call(server, "GET", path), 401)
    path = "/v1/agents/i-a/assignments"
    assert call(server, "GET", path, token=agent)[0] == 200
    assert_error(call(server, "GET", path, token=tokens.user), 403)
    assert_error(call(server, "GET", path, token=reporter), 403)
    assert_error(call(server, "GET", path, token="wrong-token-wrong-token"), 401)


def test_tokens_never_reach_logs_or_error_answers(
    server: ApiServer,
    tokens: ApiTokens,
    store: Store,
    exits: ExitRecorder,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    add_instance(store, "i-a")
    caplog.set_level(logging.DEBUG)
    wrong = "Zm9vYmFyLXRoaXMtaXMtbm90LWEtdG9rZW4"
    answers: list[Any] = []
    agent_token, report_token = tokens.agent_credential("i-a"), tokens.report_credential("bert")
    user, agent = ApiClient(server.url, tokens.user), ApiClient(server.url, agent_token)
    user.submit_job(spec("bert"))
    place(store, "bert", {"i-a": 4})
    answers += [user.list_jobs(), user.job_logs("bert"), agent.heartbeat("i-a")]
    ApiClient(server.url, report_token).post_report(report("bert"))
    for client, job in [
        (ApiClient(server.url, wrong), "bert"),  # 401
        (agent, "bert"),  # 403
        (user, "nope"),  # 404
    ]:
        with pytest.raises(ApiError) as e:
            client.get_job(job)
        answers += [str(e.value), repr(e.value), repr(client)]
    exits.error = RuntimeError("boom")  # a 500, logged with its traceback
    with pytest.raises(ApiError) as e:
        agent.job_exited("i-a", "bert", failed=True)
    answers.append(str(e.value))
    for token in (tokens.user, agent_token, report_token, wrong):
        call(server, "POST", "/v1/jobs", b"{not json", token=token)
    assert any("GET /v1/jobs" in r.getMessage() for r in caplog.records)  # logs were captured
    assert any(r.levelno >= logging.ERROR for r in caplog.records)  # the 500's traceback too
    out, err = capfd.readouterr()
    text = caplog.text + out + err + repr(answers) + repr(tokens)
    for token in (tokens.user, agent_token, report_token, wrong):
        assert token not in text
        assert token[-20:-4] not in text


# ---- bodies --------------------------------------------------------------------------------


def test_a_body_over_the_limit_is_413_and_changes_nothing(
    server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    before = snapshot(store.path)
    big = json.dumps(spec("big", application="x" * (DEFAULT_MAX_BODY_BYTES + 10))).encode()
    message = assert_error(call(server, "POST", "/v1/jobs", big, token=tokens.user), 413)
    assert str(DEFAULT_MAX_BODY_BYTES) in message
    assert snapshot(store.path) == before


def test_413_comes_before_the_body_is_read(
    server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    """The client announces 64 MiB and sends 1 KiB of it: the answer comes anyway."""
    before = snapshot(store.path)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        head = (
            "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {tokens.user}\r\nContent-Length: {64 << 20}\r\n\r\n"
        )
        sock.sendall(head.encode() + b"[" * 1024)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            assert data, answer
            answer += data
    assert answer.startswith(b"HTTP/1.1 413")
    assert snapshot(store.path) == before


def test_a_chunked_body_over_the_limit_is_413(
    store_path: Path,
    tokens: ApiTokens,
    clock: FakeClock,
    logs_dir: Path,
    exits: ExitRecorder,
    store: Store,
) -> None:
    app, srv = start(store_path, tokens, clock, logs_dir, exits, max_body_bytes=1000)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        body = json.dumps(spec("big", application="x" * 2000)).encode()
        conn.request(
            "POST",
            "/v1/jobs",
            body=iter([body[:500], body[500:]]),
            headers={"Authorization": f"Bearer {tokens.user}"},
            encode_chunked=True,
        )
        answer = conn.getresponse()
        assert answer.status == 413, answer.read()
        conn.close()
        assert store.list_jobs() == ()
        body = json.dumps(spec("exact")).encode()
        for size, status in ((1000, 201), (1001, 413)):  # the limit holds for chunks too
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            padded = body + b" " * (size - len(body))
            conn.request(
                "POST",
                "/v1/jobs",
                body=iter([padded[:300], padded[300:]]),
                headers={"Authorization": f"Bearer {tokens.user}"},
                encode_chunked=True,
            )
            assert conn.getresponse().status == status
            conn.close()
    finally:
        srv.shutdown()
        app.close()


def test_the_body_limit_is_configurable_and_inclusive(
    store_path: Path, tokens: ApiTokens, clock: FakeClock, logs_dir: Path, exits: ExitRecorder
) -> None:
    app, srv = start(store_path, tokens, clock, logs_dir, exits, max_body_bytes=400)
    try:
        body = json.dumps(spec("a")).encode()
        exact = body + b" " * (400 - len(body))
        assert call(srv, "POST", "/v1/jobs", exact, token=tokens.user)[0] == 201
        body = json.dumps(spec("b")).encode()
        over = body + b" " * (401 - len(body))
        assert_error(call(srv, "POST", "/v1/jobs", over, token=tokens.user), 413)
    finally:
        srv.shutdown()
        app.close()
    with pytest.raises(ValueError):
        make_app(store_path, tokens, clock, logs_dir=logs_dir, on_job_exit=exits, max_body_bytes=0)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{", "not valid JSON"),
        (b'{"name": "a",}', "not valid JSON"),
        (b"", "empty"),
        (b"  \n", "empty"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"init_batch_size": NaN}', "NaN"),
        (b'{"x": Infinity}', "Infinity"),
        (b"[1, 2]", "an array"),
        (b'"job"', "a string"),
        (b"null", "null"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_malformed_json_is_400_with_a_clear_message(
    server: ApiServer, tokens: ApiTokens, store: Store, body: bytes, words: str
) -> None:
    message = assert_error(call(server, "POST", "/v1/jobs", body, token=tokens.user), 400)
    assert words in message
    assert store.list_jobs() == ()


# ---- concurrency and the store -------------------------------------------------------------


def test_twenty_concurrent_submissions_all_succeed(
    server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    n = 20
    barrier = threading.Barrier(n)
    results: list[int | BaseException] = [0] * n

    def submit(i: int) -> None:
        client = ApiClient(server.url, tokens.user, timeout_s=30)
        barrier.wait()
        try:
            results[i] = 201 if client.submit_job(spec(f"job-{i:02d}")).name else 0
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [201] * n
    names = [j.name for j in store.list_jobs()]
    assert sorted(names) == [f"job-{i:02d}" for i in range(n)]


def test_a_deleted_store_is_503(server: ApiServer, tokens: ApiTokens, store: Store) -> None:
    store.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.path}{suffix}").unlink(missing_ok=True)
    message = assert_error(call(server, "GET", "/v1/jobs", token=tokens.user), 503)
    assert "deleted or replaced" in message


def test_store_for_thread_skips_the_checks_but_not_the_identity(
    store_path: Path, clock: FakeClock
) -> None:
    template = Store.open(store_path, clock)
    template.close()  # the app keeps a closed one: for_thread never uses its connection
    out: list[object] = []

    def in_thread() -> None:
        with template.for_thread() as mine:
            mine.add_job("a", JobSubmission("a", 1, 1, 1, command=("a.py",)).to_json())
            out.append(mine.cluster_id)

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    assert out == ["c1"]
    with Store.open(store_path, clock) as check:
        assert [j.name for j in check.list_jobs()] == ["a"]
    moved = store_path.with_name("moved.db")
    store_path.rename(moved)
    Store.create(store_path, "c1", clock).close()  # another file at the same path
    with pytest.raises(StoreMissingError):
        template.for_thread()


def test_make_app_needs_an_existing_store(
    tmp_path: Path, tokens: ApiTokens, clock: FakeClock, exits: ExitRecorder
) -> None:
    with pytest.raises(ControllerError):
        make_app(tmp_path / "none.db", tokens, clock, logs_dir=tmp_path, on_job_exit=exits)


def test_stores_are_one_per_worker_and_closed_at_shutdown(
    store_path: Path, tokens: ApiTokens, clock: FakeClock, logs_dir: Path, exits: ExitRecorder
) -> None:
    """The workers are a fixed pool: however many requests, at most one store each (a store
    is the file and its -wal and -shm), all closed once the server shut down. (No other store
    is open here: SQLite keeps a closed connection's file open while another connection of
    the process holds a lock on that file.)"""

    def handles() -> int:
        return sum(
            1 for fd in os.listdir("/proc/self/fd") if _target(fd).startswith(str(store_path))
        )

    before = handles()
    app = make_app(store_path, tokens, clock, logs_dir=logs_dir, on_job_exit=exits)
    srv = serve(app, limits=ServerLimits(threads=3))
    try:
        for _ in range(30):
            assert call(srv, "GET", "/v1/jobs", token=tokens.user)[0] == 200
        assert 0 < handles() - before <= 3 * 3
        assert srv.worker_threads == 3
    finally:
        srv.shutdown()
        app.close()
    deadline = time.monotonic() + 5
    while handles() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert handles() == before


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


# ---- the client ----------------------------------------------------------------------------


def test_client_raises_typed_errors(user: ApiClient, server: ApiServer) -> None:
    with pytest.raises(ApiError) as e:
        user.submit_job(spec("x", max_local_bsz=0))
    assert (e.value.status, e.value.field) == (400, "max_local_bsz")
    assert isinstance(e.value, ControllerError)
    with pytest.raises(ApiError) as e:
        user.get_job("no/such job")  # quoted as one path segment: an unknown job, not a path
    assert e.value.status == 404
    server.shutdown()
    with pytest.raises(ApiUnreachableError) as e:
        user.list_jobs()
    assert e.value.status == 0


def test_client_never_follows_a_redirect(tokens: ApiTokens) -> None:
    seen: list[str | None] = []

    @Request.application  # type: ignore[arg-type]
    def elsewhere(request: Request) -> Response:
        seen.append(request.headers.get("Authorization"))
        return Response("{}", mimetype="application/json")

    target = make_server("127.0.0.1", 0, elsewhere)
    threading.Thread(target=target.serve_forever, args=(0.05,), daemon=True).start()

    @Request.application  # type: ignore[arg-type]
    def redirecting(request: Request) -> Response:
        return Response("", 307, {"Location": f"http://127.0.0.1:{target.server_port}/v1/jobs"})

    source = make_server("127.0.0.1", 0, redirecting)
    threading.Thread(target=source.serve_forever, args=(0.05,), daemon=True).start()
    try:
        client = ApiClient(f"http://127.0.0.1:{source.server_port}", tokens.user)
        with pytest.raises(ApiError) as e:
            client.list_jobs()
        assert e.value.status == 307
        assert seen == []
    finally:
        for s in (source, target):
            s.shutdown()
            s.server_close()


def test_the_trainers_http_sink_authenticates_with_the_jobs_report_credential(
    server: ApiServer, store: Store, tokens: ApiTokens, tmp_path: Path
) -> None:
    """What a real trainer sends (trainer.reporter.HttpSink, its credential read from the file
    COADAPT_REPORT_TOKEN_FILE names) is accepted; without it, or with the agent's, it is
    refused and nothing is stored."""
    import urllib.error

    from trainer.reporter import HttpSink

    store.add_job("bert", JobSubmission(**spec()).to_json())
    for token, code in ((None, 401), (tokens.agent_credential("i-1"), 403)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            HttpSink(server.url, "bert", timeout_s=10, token=token).send(report("bert"))
        assert refused.value.code == code and store.latest_report("bert") is None
    token_file = tmp_path / "bert.token"
    token_file.write_text(tokens.report_credential("bert") + "\n")
    sink = HttpSink(server.url, "bert", timeout_s=10, token_file=token_file)
    assert tokens.report_credential("bert") not in repr(sink)
    assert sink.send(report("bert")) is not None
    assert store.latest_report("bert") is not None


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    endpoint=st.sampled_from(
        [
            ("/v1/jobs", "user"),
            ("/v1/jobs/bert/cancel", "user"),
            ("/v1/agents/register", "agent"),
            ("/v1/agents/i-1/heartbeat", "agent"),
            ("/v1/agents/i-1/jobs/bert/exit", "agent"),
        ]
    ),
    base=st.sampled_from(["spec", "empty", "none"]),
    key=st.text(max_size=12) | st.sampled_from(sorted(spec("x"))),
    value=JSON_VALUES,
    raw=st.none() | st.binary(max_size=40),
)
def test_no_payload_to_any_endpoint_is_a_server_error(
    server: ApiServer,
    tokens: ApiTokens,
    store: Store,
    endpoint: tuple[str, str],
    base: str,
    key: str,
    value: object,
    raw: bytes | None,
) -> None:
    """Random JSON (or random bytes) to every POST endpoint: a 2xx or a 4xx, never a 5xx."""
    if not store.list_jobs():
        add_instance(store, "i-1")
        store.add_job("bert", JobSubmission.from_json(json.dumps(spec("bert"))).to_json())
        place(store, "bert", {"i-1": 1})
    path, role = endpoint
    start: dict[str, Any] = {"spec": spec("fuzz"), "empty": {}, "none": {}}[base]
    body = raw if raw is not None else json.dumps({**start, key: value}).encode()
    token = tokens.user if role == "user" else tokens.agent_credential("i-1")
    status, answer = call(server, "POST", path, body, token=token)
    assert status < 500, (path, body[:200], answer)


# ---- one naming: the spec's names and shape in the JSON body (issue 41) ----------------------


def _post_job(server: ApiServer, token: str, body: dict[str, Any]) -> tuple[int, Any, Any]:
    """POST /v1/jobs over real HTTP: the status, the JSON answer and the headers."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(
            "POST",
            "/v1/jobs",
            body=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}"},
        )
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read()), answer.headers
    finally:
        conn.close()


def test_a_job_submitted_with_the_yaml_names_is_the_specs_job(
    server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    text = (
        "name: shaped\ncommand: [train.py, --epochs, '3']\ngpus: {min: 2, max: 4}\n"
        "batch_size: {initial: 64, max: 1024}\nlocal_batch_size: {min: 8, max: 128}\n"
        "checkpoint: s3://bucket/shaped\nmarkets: [on-demand]\n"
    )
    body = yaml.safe_load(text)
    status, answer, headers = _post_job(server, tokens.user, body)
    assert status == 201, answer
    assert headers.get("Deprecation") is None
    stored = JobSubmission.from_json(store.get_job("shaped").spec_json)
    assert stored == parse_job_spec(text).submission()  # the same job as `coadapt submit`'s
    assert (stored.min_gpus, stored.max_gpus, stored.checkpoint_uri) == (2, 4, "s3://bucket/shaped")


def test_a_fixed_job_submitted_as_json_needs_no_batch_limits(
    server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    body = {
        "name": "fixed",
        "command": ["train.py"],
        "adaptive": False,
        "gpus": {"min": 2},
        "batch_size": {"initial": 48},
    }
    status, answer, _ = _post_job(server, tokens.user, body)
    assert status == 201, answer
    stored = JobSubmission.from_json(store.get_job("fixed").spec_json)
    assert (stored.init_batch_size, stored.max_batch_size, stored.max_local_bsz) == (48, 48, 48)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        pytest.param({"gpus": {"min": 0}}, "gpus.min", "must be >= 1", id="bound"),
        pytest.param(
            {"batch_size": {"initial": 64, "max": 32}},
            "batch_size.max",
            "must be >= batch_size.initial (64)",
            id="relation in spec words",
        ),
        pytest.param({"gpus": {"mni": 1}}, "gpus.mni", "did you mean 'min'", id="unknown key"),
        pytest.param({"gpus": 2}, "gpus", "an object with keys min, max", id="not an object"),
        pytest.param({"gpu": {"min": 1}}, "gpu", "did you mean 'gpus'", id="unknown top"),
        pytest.param({"local_batch_size": None}, "local_batch_size.max", "adaptive", id="lacks"),
        pytest.param(
            {"min_gpus": 2}, "min_gpus", "write 'gpus.min', one naming", id="mixed namings"
        ),
        pytest.param({"weight": 2}, "weight", "weight was removed", id="removed"),
    ],
)
def test_a_bad_spec_shaped_body_is_400_naming_the_spec_field(
    server: ApiServer, tokens: ApiTokens, change: dict[str, Any], field: str, words: str
) -> None:
    body: dict[str, Any] = {
        "name": "bad",
        "command": ["train.py"],
        "batch_size": {"initial": 64, "max": 1024},
        "local_batch_size": {"max": 128},
    }
    body.update(change)
    status, answer, _ = _post_job(server, tokens.user, body)
    assert (status, answer["field"]) == (400, field), answer
    assert words in answer["error"], answer


def test_the_old_flat_names_still_work_and_are_answered_deprecated(
    server: ApiServer, tokens: ApiTokens, store: Store
) -> None:
    status, answer, headers = _post_job(server, tokens.user, spec("flat", min_gpus=2))
    assert status == 201, answer
    assert headers.get("Deprecation") == "true"
    assert "docs/jobspec.md" in (headers.get("Link") or "")
    assert JobSubmission.from_json(store.get_job("flat").spec_json).min_gpus == 2


def test_the_client_submits_in_the_specs_names(
    user: ApiClient, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Our own client sends no deprecated name: the server logs each body that does."""
    caplog.set_level(logging.WARNING, logger="autoscaler.controller.api.users")
    user.submit_job(spec("flat"))  # a mapping goes as it is: the flat one is logged
    assert "deprecated flat field names (init_batch_size" in caplog.text
    caplog.clear()
    job = parse_job_spec(
        "name: viaclient\ncommand: [train.py]\ngpus: {min: 1, max: 2}\n"
        "batch_size: {initial: 64, max: 512}\nlocal_batch_size: {max: 64}\n"
    ).submission()
    assert "gpus" in submission_body(job) and "min_gpus" not in submission_body(job)
    user.submit_job(job)
    assert JobSubmission.from_json(store.get_job("viaclient").spec_json) == job
    assert "deprecated" not in caplog.text


def test_a_deleted_jobs_logs_and_checkpoints_are_moved_aside_so_its_name_starts_afresh(
    store_path: Path,
    tokens: ApiTokens,
    clock: FakeClock,
    logs_dir: Path,
    exits: ExitRecorder,
    store: Store,
    tmp_path: Path,
) -> None:
    """A cluster whose checkpoints are on this machine (``checkpoints_dir``, a local
    ``coadapt up``'s): deleting an ended job moves its checkpoint folder aside with its logs,
    so a job submitted again under the name does not resume from the deleted one's."""
    checkpoints = tmp_path / "checkpoints"
    app, srv = start(store_path, tokens, clock, logs_dir, exits, checkpoints_dir=checkpoints)
    try:
        user = ApiClient(srv.url, tokens.user, timeout_s=10)
        user.submit_job(spec("a"))
        (checkpoints / "a").mkdir(parents=True)
        (checkpoints / "a" / "step-20.pt").write_bytes(b"state")
        (logs_dir / "a").mkdir(parents=True)
        user.cancel_job("a")
        answer = user.delete_job("a")
        assert answer["checkpoints"] == str(checkpoints / "a~1")
        assert answer["logs"] == str(logs_dir / "a~1")
        assert not (checkpoints / "a").exists()
        assert (checkpoints / "a~1" / "step-20.pt").read_bytes() == b"state"
        user.submit_job(spec("b"))
        user.cancel_job("b")  # no checkpoint folder: nothing to move
        assert user.delete_job("b")["checkpoints"] is None
    finally:
        srv.shutdown()
        app.close()
