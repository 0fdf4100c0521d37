"""Rate limits and retention per credential: a job's trainers (and an instance's agent) that
call too often get 429 with ``Retry-After``, the trainer's reporter honours it, and the store
keeps each job's latest reports and a bounded history, not every report, without changing
what the controller learns. Real HTTP (the API on Waitress), a real SQLite store."""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoscaler.controller.api import ApiApp, ApiServer, generate_tokens, make_app, serve
from autoscaler.controller.credentials import ApiCredentials
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.ratelimit import (
    DEFAULT_REQUEST_LIMITS,
    RateLimit,
    RateLimiter,
    RequestLimits,
)
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import JobStatus, Store
from autoscaler.decide.sizing import SizingConfig
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import FakeClock, SystemClock
from emulators.reports import synthetic_report
from providers.fake import FakeProvider
from tests.controller.test_api import add_instance, report
from trainer.env import DEFAULT_REPORT_INTERVAL_S
from trainer.report import ReportReply, TrainerReport, report_path
from trainer.reporter import MAX_RETRY_AFTER_S, HttpSink, Reporter, parse_retry_after

# ---- the limiter ---------------------------------------------------------------------------


def test_a_bucket_admits_its_burst_then_its_rate_and_says_how_long_to_wait() -> None:
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(per_s=2.0, burst=3), clock)
    assert [limiter.take("job-a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("job-a") == pytest.approx(0.5)  # one token comes in 1/2 s
    assert limiter.take("job-b") == 0.0  # another holder has its own bucket
    clock.advance(0.5)
    assert limiter.take("job-a") == 0.0  # a refusal took nothing
    assert limiter.take("job-a") == pytest.approx(0.5)
    clock.advance(3600.0)
    assert [limiter.take("job-a") for _ in range(4)][-1] > 0  # refilled to its burst only


def test_full_buckets_are_forgotten_past_the_bound() -> None:
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(per_s=1.0, burst=2), clock, max_buckets=10)
    for i in range(10):
        limiter.take(f"j{i}")
    clock.advance(10.0)  # every bucket full again
    limiter.take("busy")
    limiter.take("busy")
    assert len(limiter) == 1  # only the one that is not full
    assert limiter.take("busy") > 0


@pytest.mark.parametrize(
    "limit", [(0.0, 1), (-1.0, 1), (float("inf"), 1), (float("nan"), 1), (1.0, 0), (1.0, 1.5)]
)
def test_a_limit_is_checked(limit: tuple[Any, Any]) -> None:
    with pytest.raises(InvalidInputError):
        RateLimit(*limit)


def test_the_default_limits_come_from_the_trainer_and_agent_intervals() -> None:
    assert DEFAULT_REQUEST_LIMITS.report.per_s == pytest.approx(10 / DEFAULT_REPORT_INTERVAL_S)
    up = RequestLimits.for_intervals(5.0, 2.0)  # what coadapt up gives its agents
    assert (up.report.per_s, up.report.burst) == (2.0, 10)
    assert (up.agent.per_s, up.agent.burst) == (10.0, 30)
    with pytest.raises(InvalidInputError):
        RequestLimits.for_intervals(0.0, 2.0)


# ---- the API -------------------------------------------------------------------------------


def _app(tmp_path: Path, clock: Any, limits: RequestLimits) -> tuple[ApiApp, ApiCredentials]:
    with Store.create(tmp_path / "store.db", "c1", clock) as store:
        store.add_job("bert", JobSubmission("bert", 64, 1024, 128, command=("t.py",)).to_json())
        store.add_job("gpt", JobSubmission("gpt", 64, 1024, 128, command=("t.py",)).to_json())
        add_instance(store, "i-a")
    tokens = generate_tokens(tmp_path / "tokens.json")
    app = make_app(
        tmp_path / "store.db",
        tokens,
        clock,
        logs_dir=tmp_path / "logs",
        on_job_exit=lambda name, *, failed: JobStatus.COMPLETED,
        limits=limits,
    )
    return app, tokens


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ApiServer, ApiCredentials, FakeClock]]:
    clock = FakeClock()
    app, tokens = _app(tmp_path, clock, RequestLimits(RateLimit(1.0, 3), RateLimit(1.0, 2)))
    server = serve(app)
    try:
        yield server, tokens, clock
    finally:
        server.shutdown()
        app.close()


def _post(
    conn: http.client.HTTPConnection, path: str, token: str, body: dict[str, Any]
) -> tuple[int, dict[str, str], dict[str, Any]]:
    conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    answer = conn.getresponse()
    data = json.loads(answer.read())
    return answer.status, dict(answer.getheaders()), data


def test_reports_beyond_the_limit_get_429_with_retry_after_per_job(
    served: tuple[ApiServer, ApiCredentials, FakeClock],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="autoscaler.controller.api")
    server, tokens, clock = served
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(server.url).netloc, timeout=10)
    bert, gpt = tokens.report_credential("bert"), tokens.report_credential("gpt")
    body = json.loads(report("bert").to_json())
    codes = [_post(conn, report_path("bert"), bert, body)[0] for _ in range(3)]
    assert codes == [200, 200, 200]
    status, headers, data = _post(conn, report_path("bert"), bert, body)
    assert status == 429 and headers["Retry-After"] == "1"
    assert "too many requests for job 'bert'" in data["error"]
    # Another job's credential is not held back by bert's flood.
    assert _post(conn, report_path("gpt"), gpt, json.loads(report("gpt").to_json()))[0] == 200
    clock.advance(1.0)  # what Retry-After said
    assert _post(conn, report_path("bert"), bert, body)[0] == 200
    assert all(_post(conn, report_path("bert"), bert, body)[0] == 429 for _ in range(20))
    with Store.open(tmp_path / "store.db", clock) as store:
        assert store.report_count("bert") == 4  # the refused ones were not stored
    # The operator sees the flood: one warning a minute per holder, not one per request.
    warned = [r.getMessage() for r in caplog.records if "refused (429)" in r.getMessage()]
    assert len(warned) == 1 and "job 'bert'" in warned[0]


def test_agent_calls_beyond_the_limit_get_429_and_users_are_not_limited(
    served: tuple[ApiServer, ApiCredentials, FakeClock],
) -> None:
    server, tokens, _ = served
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(server.url).netloc, timeout=10)
    agent = tokens.agent_credential("i-a")
    beat = "/v1/agents/i-a/heartbeat"
    assert [_post(conn, beat, agent, {})[0] for _ in range(3)] == [200, 200, 429]
    for _ in range(20):
        conn.request("GET", "/v1/jobs", headers={"Authorization": f"Bearer {tokens.user}"})
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 200


# ---- the trainer backs off ------------------------------------------------------------------


def test_retry_after_is_read_as_bounded_seconds() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 10 ") == 10.0
    assert parse_retry_after("99999999") == MAX_RETRY_AFTER_S
    for bad in (None, "", "-1", "1.5", "Wed, 21 Oct 2015 07:28:00 GMT", "1e9", "٣"):
        assert parse_retry_after(bad) is None


def test_the_reporter_honours_retry_after(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A trainer reporting far faster than its limit: after the burst, one 429, then nothing
    is sent until Retry-After has passed (the server logs no request in between)."""
    clock = FakeClock()
    app, tokens = _app(tmp_path, clock, RequestLimits(RateLimit(0.5, 2), RateLimit(1.0, 2)))
    server = serve(app)

    def seen() -> int:  # the requests the API answered (its request log, at DEBUG)
        return sum("/v1/jobs/bert/reports" in r.getMessage() for r in caplog.records)

    try:
        caplog.set_level(logging.DEBUG, logger="autoscaler.controller.api")
        sink = HttpSink(server.url, "bert", token=tokens.report_credential("bert"))
        reporter = Reporter(sink, lambda: report("bert"), interval_s=0.1, clock=clock)
        replies = [reporter.send_now() for _ in range(2)]
        assert all(isinstance(r, ReportReply) for r in replies)
        assert reporter.send_now() is None and reporter.throttled == 1  # the 429
        assert seen() == 3
        for _ in range(5):  # within Retry-After (2 s): nothing leaves the trainer
            clock.advance(0.3)
            assert reporter.send_now() is None
        assert seen() == 3 and reporter.throttled == 6
        clock.advance(0.6)  # 2.1 s after the 429
        assert isinstance(reporter.send_now(), ReportReply) and seen() == 4
        assert reporter.failed == 0  # a throttle is not a failure
    finally:
        server.shutdown()
        app.close()


# ---- retention -----------------------------------------------------------------------------

CLUSTER = "lim1"


def _synthetic(job: str, gpus: int, now_s: float, step_s: float) -> str:
    return synthetic_report(
        job,
        gpus=gpus,
        nodes=1,
        local_bsz=128,
        step_s=step_s,
        sync_s=step_s * 0.1,
        progress=1.0,
        now_s=now_s,
        init_batch_size=128,
        max_batch_size=1024,
        grad_var=3.0,
    ).to_json()


def _learn(tmp_path: Path, history: int) -> tuple[dict[str, Any], dict[str, Any], Store]:
    """Six rounds of two jobs, each reporting five times a round (a different step time
    each); the models the controller holds then, and those a restarted controller holds."""
    clock = FakeClock()
    store = Store.create(tmp_path / f"store-{history}.db", CLUSTER, clock)
    for i in range(2):
        spec = JobSubmission(f"job-{i}", 128, 1024, 128, 32, command=("train.py",))
        store.add_job(spec.name, spec.to_json())
    config = ControllerConfig(
        CLUSTER,
        sizing=SizingConfig(max_instances=4),
        reconcile=ReconcileConfig(heartbeat_timeout_s=None),
        report_history=history,
    )
    cloud = FakeProvider(clock=clock)
    ctl = Controller(store, cloud, clock, config)
    for r in range(6):
        ctl.run_round()
        clock.advance(60.0)
        placed: dict[str, int] = {}
        for (job, _), gpus in store.list_assignments().items():
            placed[job] = placed.get(job, 0) + gpus
        for job, gpus in placed.items():
            for k in range(5):
                store.add_report(job, _synthetic(job, gpus, clock.now_s(), 0.2 + 0.01 * (r + k)))
    ctl.run_round()
    views = {v.name: dict(v.models) for v in ctl.job_views(0.0)}
    again = Controller(store, cloud.restarted(), clock, config)
    again._read_reports(store.list_assignments(), {})  # what a restart reads
    restored = {v.name: dict(v.models) for v in again.job_views(0.0)}
    return views, restored, store


def test_pruning_reports_changes_nothing_the_controller_learns(tmp_path: Path) -> None:
    kept_all, restored_all, full = _learn(tmp_path, history=10_000)
    kept_two, restored_two, pruned = _learn(tmp_path, history=2)
    assert kept_all and all(kept_all.values()), "the jobs were profiled"
    assert kept_two == kept_all
    assert restored_two == restored_all
    assert [m.params_json for m in pruned.list_models()] == [
        m.params_json for m in full.list_models()
    ]
    for job in ("job-0", "job-1"):
        assert full.report_count(job) > 20  # 5 a round, 6 rounds, all kept
        assert pruned.report_count(job) == 2  # the newest two
        assert pruned.latest_report(job) == full.latest_report(job)
    full.close()
    pruned.close()


def test_only_reports_the_controller_has_read_are_pruned(tmp_path: Path) -> None:
    clock = FakeClock()
    with Store.create(tmp_path / "store.db", CLUSTER, clock) as store:
        store.add_job("a", JobSubmission("a", 64, 1024, 128, command=("t.py",)).to_json())
        ids = [store.add_report("a", f'{{"n": {i}}}').report_id for i in range(10)]
        assert store.prune_reports(["a"], ids[3], keep_per_job=2) == 4  # ids[0..3]: read
        assert store.report_count("a") == 6
        assert store.prune_reports(["a"], ids[-1], keep_per_job=2) == 4
        assert [p for _, p in store.reports_after(0)[1]] == ['{"n": 8}', '{"n": 9}']
        assert store.prune_reports(["a", "unknown"], ids[-1], keep_per_job=2) == 0
        with pytest.raises(InvalidInputError):
            store.prune_reports(["a"], ids[-1], keep_per_job=0)


# ---- acceptance: a flood from one job ----------------------------------------------------------


def _used_bytes(path: Path) -> int:
    """Bytes of the store file's pages that hold data (free pages are reused)."""
    import sqlite3

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        used = conn.execute("PRAGMA page_count").fetchone()[0]
        used -= conn.execute("PRAGMA freelist_count").fetchone()[0]
    return int(page * used)


def _flood(url: str, token: str, body: bytes, rate_per_s: float, seconds: float) -> list[Any]:
    """POST ``body`` as one job's trainer at ``rate_per_s`` for ``seconds`` (four senders on
    keep-alive connections); every answer's ``(status, Retry-After)``."""
    answers: list[Any] = []
    lock = threading.Lock()
    start = time.monotonic()
    senders = 4

    def send(k: int) -> None:
        conn = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=30)
        n = k
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while True:
            due = start + n / rate_per_s
            if due - start >= seconds:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            conn.request("POST", report_path("bert"), body=body, headers=headers)
            answer = conn.getresponse()
            answer.read()
            with lock:
                answers.append((answer.status, answer.getheader("Retry-After")))
            n += senders

    threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


@pytest.mark.slow
def test_200_reports_a_second_from_one_job_are_throttled_and_the_store_stays_bounded(
    tmp_path: Path,
) -> None:
    """What the audit did (199 reports/s from one job's credential, all stored), against
    the limit ``coadapt up`` sets (report interval 5 s: 2/s, burst 10) and the history the
    controller keeps (here 20 reports a job): two floods of 4 s each, a controller round
    after each."""
    clock = SystemClock()
    limits = RequestLimits.for_intervals(5.0, 2.0)
    app, tokens = _app(tmp_path, clock, limits)
    store = Store.open(tmp_path / "store.db", clock)
    config = ControllerConfig(
        "c1", reconcile=ReconcileConfig(heartbeat_timeout_s=None), report_history=20
    )
    ctl = Controller(store, FakeProvider(clock=FakeClock()), clock, config)
    ctl._read_reports({}, {})  # a (re)started controller's first read: nothing yet
    server = serve(app)
    body = report("bert").to_json().encode()
    try:
        used = []
        for _ in range(2):
            started = time.monotonic()
            answers = _flood(server.url, tokens.report_credential("bert"), body, 200.0, 4.0)
            elapsed = time.monotonic() - started
            accepted = sum(1 for status, _ in answers if status == 200)
            refused = [after for status, after in answers if status == 429]
            assert accepted + len(refused) == len(answers), "only 200 or 429"
            assert len(answers) / elapsed > 100, "the flood did not reach its rate"
            # The burst and the rate over the flood (a token may refill between the floods).
            assert accepted <= limits.report.burst + limits.report.per_s * elapsed + 1
            assert len(refused) >= 0.85 * len(answers)
            assert all(after is not None and int(after) >= 1 for after in refused)
            ctl._read_reports({}, {})  # the round's read of the reports: then pruned
            assert store.report_count("bert") <= config.report_history
            used.append(_used_bytes(tmp_path / "store.db"))
        row = len(body) + 64  # a report's row, generously
        assert used[1] - used[0] <= config.report_history * row
    finally:
        server.shutdown()
        app.close()
        store.close()


@pytest.mark.slow
def test_a_job_flooding_the_api_does_not_outgrow_its_history_in_rows_or_bytes(
    tmp_path: Path,
) -> None:
    """Without the limiter's help (a limit far above the flood): the store still keeps at
    most the bounded history of each job once the controller has read the reports."""
    clock = FakeClock()
    with Store.create(tmp_path / "store.db", "c1", clock) as store:
        store.add_job("bert", JobSubmission("bert", 64, 1024, 128, command=("t.py",)).to_json())
        config = ControllerConfig("c1", reconcile=ReconcileConfig(heartbeat_timeout_s=None))
        ctl = Controller(store, FakeProvider(clock=clock), clock, config)
        ctl._read_reports({}, {})  # a (re)started controller's first read: nothing yet
        payload = report("bert").to_json()
        sizes = []
        for _ in range(3):
            for _ in range(1000):
                store.add_report("bert", payload)
            ctl._read_reports({}, {})
            assert store.report_count("bert") == config.report_history
            sizes.append(_used_bytes(tmp_path / "store.db"))
        assert sizes[2] <= sizes[1] + 4096  # freed pages are reused: no growth
        latest = store.latest_report("bert")
        assert latest is not None and TrainerReport.from_json(latest.payload_json).job_id == "bert"
