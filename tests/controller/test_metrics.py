"""``GET /metrics`` (issue 39, item 3) over real HTTP on a real SQLite store with a fake clock:
every family, read with the Prometheus client's own parser; the fleet's figures from the store
at scrape time; a round's and a request's counts; who may scrape (the users' token and the
scrape token; the scrape token nowhere else; nobody unauthenticated); the scrape token in the
tokens file and through its rotations. The live cluster's scrape is test_metrics_live.py."""

from __future__ import annotations

import http.client
import json
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.controller.api import ApiCredentials, ApiServer, generate_tokens, make_app, serve
from autoscaler.controller.api.app import ROUTES
from autoscaler.controller.credentials import (
    issue_scrape_token,
    load_tokens,
    rotate_agent_key,
    rotate_scrape_token,
    rotate_user_token,
)
from autoscaler.controller.loop import Controller, RoundReport
from autoscaler.controller.metrics import (
    FAMILIES,
    ControllerMetrics,
    Leadership,
    measured_speed,
)
from autoscaler.controller.reconcile import Actions
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock
from providers.errors import ERROR_KINDS
from providers.fake import FakeProvider
from tests.controller.test_api import START_S, UNLIMITED, add_instance, place, report, spec

Families = dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]


def parse(text: str) -> Families:
    """``{family: {(sample name, sorted labels): value}}``, by the client's own parser."""
    out: Families = {}
    for family in text_string_to_metric_families(text):
        samples = out.setdefault(family.name, {})
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(families: Families, family: str, sample: str | None = None, **labels: str) -> float:
    key = (sample or family, tuple(sorted(labels.items())))
    return families[family][key]


def get(url: str, path: str, token: str | None, method: str = "GET") -> tuple[int, str]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        body = b"{}" if method in ("POST", "PUT", "DELETE") else None
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START_S)


@pytest.fixture
def store_path(tmp_path: Path, clock: FakeClock) -> Path:
    path = tmp_path / "store.db"
    Store.create(path, "c1", clock).close()
    return path


@pytest.fixture
def tokens(tmp_path: Path) -> ApiCredentials:
    path = tmp_path / "tokens.json"
    generate_tokens(path)
    issue_scrape_token(path)
    return load_tokens(path)


@pytest.fixture
def metrics() -> ControllerMetrics:
    return ControllerMetrics()


@pytest.fixture
def server(
    store_path: Path,
    tokens: ApiCredentials,
    clock: FakeClock,
    tmp_path: Path,
    metrics: ControllerMetrics,
) -> Iterator[ApiServer]:
    def on_job_exit(name: str, *, failed: bool, deterministic: bool = False) -> JobStatus:
        raise AssertionError("no job exits here")

    app = make_app(
        store_path,
        tokens,
        clock,
        logs_dir=tmp_path / "logs",
        on_job_exit=on_job_exit,
        limits=UNLIMITED,
        metrics=metrics,
    )
    srv = serve(app, "127.0.0.1", 0)
    yield srv
    srv.shutdown()
    app.close()


def scrape(server: ApiServer, token: str) -> Families:
    status, text = get(server.url, "/metrics", token)
    assert status == 200, text
    return parse(text)


# ---- the fleet, from the store -------------------------------------------------------------


def test_an_empty_cluster_answers_every_family(server: ApiServer, tokens: ApiCredentials) -> None:
    families = scrape(server, tokens.user)
    assert set(FAMILIES) <= set(families), set(FAMILIES) - set(families)
    assert value(families, "coadapt_spend_usd", "coadapt_spend_usd_total") == 0.0
    assert value(families, "coadapt_fleet_cost_usd_per_hour") == 0.0
    assert {value(families, "coadapt_jobs", status=s.value) for s in JobStatus} == {0.0}
    # every kind of provider error is there from the start, at 0
    for kind in ERROR_KINDS:
        got = value(families, "coadapt_provider_errors", "coadapt_provider_errors_total", kind=kind)
        assert got == 0.0
    assert "process_resident_memory_bytes" in families


def test_the_fleets_figures_come_from_the_store_at_scrape_time(
    server: ApiServer, tokens: ApiCredentials, store_path: Path, clock: FakeClock
) -> None:
    with Store.open(store_path, clock) as store:
        add_instance(store, "i-1")  # running since START_S, 4 V100 at 3.67 USD/h
        add_instance(store, "i-2", running=False)  # queued: no bill
        store.add_job("bert", json.dumps(spec("bert")))
        store.add_job("gpt", json.dumps(spec("gpt")))
        place(store, "bert", {"i-1": 4})
        store.set_batch("bert", global_batch_size=256, local_batch_size=32, accum_steps=1, gpus=4)
        row = store.get_job("gpt")
        store.update_job("gpt", row.version, status=JobStatus.CANCELLED)
    before = scrape(server, tokens.user)
    with Store.open(store_path, clock) as store:
        # a report at 8 replicas on 2 nodes with the batch it measured: 256 / 0.5 s
        store.add_report("bert", report("bert").to_json())
    clock.advance(3600.0)
    after = scrape(server, tokens.user)

    offering = "fake/p3.8xlarge/us-east-1a/spot"
    for families in (before, after):
        assert value(families, "coadapt_instances", offering=offering, market="spot",
                     state="running") == 1  # fmt: skip
        assert value(families, "coadapt_instances", offering=offering, market="spot",
                     state="queued") == 1  # fmt: skip
        assert value(families, "coadapt_jobs", status="running") == 1
        assert value(families, "coadapt_jobs", status="cancelled") == 1
        assert value(families, "coadapt_jobs", status="queued") == 0
        assert value(families, "coadapt_job_gpus", job="bert") == 4
        assert value(families, "coadapt_job_batch_size", job="bert") == 256
        assert value(families, "coadapt_fleet_cost_usd_per_hour") == pytest.approx(3.67)
    assert ("coadapt_job_gpus", (("job", "gpt"),)) not in after["coadapt_job_gpus"]
    # spend grows with the clock: an hour of one instance at 3.67 USD/h
    spend = value(after, "coadapt_spend_usd", "coadapt_spend_usd_total")
    assert spend - value(before, "coadapt_spend_usd", "coadapt_spend_usd_total") == (
        pytest.approx(3.67)
    )
    # the same figure /v1/costs answers (one rule)
    status, text = get(server.url, "/v1/costs", tokens.user)
    assert status == 200 and json.loads(text)["total_usd"] == pytest.approx(spend)
    # no report before: no speed; then the trainer's own measurement
    assert not before["coadapt_job_throughput"]
    assert value(after, "coadapt_job_throughput", job="bert") == pytest.approx(512.0)
    # GradientStats(64, grad_sqr 1, grad_var 4): phi = 256, (256 + 64) / (256 + 256)
    eff = value(after, "coadapt_job_statistical_efficiency", job="bert")
    assert eff == pytest.approx(320 / 512)
    assert value(after, "coadapt_job_goodput", job="bert") == pytest.approx(512.0 * eff)


def test_a_trainer_report_of_another_configuration_gives_no_throughput() -> None:
    r = report("bert")
    assert measured_speed(r).throughput == pytest.approx(512.0)
    other = type(r)(**{**r.__dict__, "world_size": 4})  # no profile entry at 4 replicas
    speed = measured_speed(other)
    assert speed.throughput is None and speed.goodput is None
    assert speed.efficiency == pytest.approx(320 / 512)


# ---- this process's work -------------------------------------------------------------------


def test_rounds_leadership_and_requests_are_counted(
    server: ApiServer, tokens: ApiCredentials, metrics: ControllerMetrics
) -> None:
    first = scrape(server, tokens.user)
    assert value(first, "coadapt_leader") == 0
    metrics.set_leadership(Leadership(leader=True, epoch=3))
    ok = RoundReport(1, 2, Actions(), {}, 2, 0.02, 0.3, 0.004, 1.5, notices=2, preemptions=3,
                     provider_errors={"capacity": 2, "transient": 1})  # fmt: skip
    failed = RoundReport(2, 0, Actions(), {}, 1, 0.7, 0.0, 0.0, 0.0, "throttled",
                         provider_errors={"transient": 1})  # fmt: skip
    metrics.observe_round(ok)
    metrics.observe_round(failed)
    assert get(server.url, "/v1/jobs/no-such-job", tokens.user)[0] == 404
    assert get(server.url, "/no/such/path", tokens.user)[0] == 404
    families = scrape(server, tokens.user)

    assert value(families, "coadapt_leader") == 1
    assert value(families, "coadapt_leader_epoch") == 3
    rounds = "coadapt_round_duration_seconds"
    assert value(families, rounds, f"{rounds}_count", phase="observe") == 2
    assert value(families, rounds, f"{rounds}_sum", phase="observe") == pytest.approx(0.72)
    for phase in ("decide", "reconcile", "act"):  # the failed round had only its observe
        assert value(families, rounds, f"{rounds}_count", phase=phase) == 1
    assert value(families, rounds, f"{rounds}_bucket", phase="act", le="1.0") == 0
    assert value(families, rounds, f"{rounds}_bucket", phase="act", le="2.5") == 1
    notices = "coadapt_preemption_notices"
    assert value(families, notices, f"{notices}_total") == 2
    assert value(families, "coadapt_preemptions", "coadapt_preemptions_total") == 3
    errors = "coadapt_provider_errors"
    assert value(families, errors, f"{errors}_total", kind="capacity") == 2
    assert value(families, errors, f"{errors}_total", kind="transient") == 2
    # requests by route template, never the raw path (no job name, no unknown path)
    requests = "coadapt_api_request_duration_seconds"
    routes = {dict(labels)["route"] for (name, labels) in families[requests]}
    assert "/v1/jobs/<name>" in routes and "/metrics" in routes and "(unmatched)" in routes
    assert not any("no-such" in r or "/no/" in r for r in routes), routes
    count = value(families, requests, f"{requests}_count", method="GET", route="/metrics")
    assert count == 1  # the first scrape (this one is counted once it is answered)


def test_every_round_of_a_real_controller_feeds_the_round_histogram() -> None:
    """The phases the report carries are the ones the histogram has (a report field renamed
    would fail here, not in production)."""
    metrics = ControllerMetrics()
    report_fields = {f for f in RoundReport.__dataclass_fields__ if f.endswith("_s")}
    assert {"observe_s", "decide_s", "reconcile_s", "act_s"} <= report_fields
    metrics.observe_round(RoundReport(1, 0, Actions(), {}, 0, 0.1, 0.1, 0.1, 0.1))
    families = parse(metrics.exposition().decode())
    phases = {dict(labels)["phase"] for _, labels in families["coadapt_round_duration_seconds"]}
    assert phases == {"observe", "decide", "reconcile", "act"}


# ---- who may scrape ------------------------------------------------------------------------


def test_an_unauthenticated_scrape_is_refused(server: ApiServer) -> None:
    assert get(server.url, "/metrics", None)[0] == 401
    assert get(server.url, "/metrics", "not-a-valid-token-at-all")[0] == 401


def test_the_scrape_token_opens_metrics_and_nothing_else(
    server: ApiServer, tokens: ApiCredentials
) -> None:
    assert tokens.scrape is not None
    assert get(server.url, "/metrics", tokens.scrape)[0] == 200
    refused = []
    for method, path, _, _ in ROUTES:
        if path == "/metrics":
            continue
        concrete = re.sub(r"<(\w+)>", lambda m: f"x-{m.group(1)}".replace("_", "-"), path)
        status, text = get(server.url, concrete, tokens.scrape, method)
        assert status == 403, (method, path, status, text)
        refused.append(path)
    assert len(refused) == len(ROUTES) - 1
    # an agent's or a job's credential cannot scrape either
    assert get(server.url, "/metrics", tokens.agent_credential("i-1"))[0] == 403
    assert get(server.url, "/metrics", tokens.report_credential("bert"))[0] == 403


def test_the_scrape_token_is_kept_through_rotations_and_rotated_alone(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    generate_tokens(path)
    assert load_tokens(path).scrape is None
    first = issue_scrape_token(path)
    assert issue_scrape_token(path) == first  # issued again: the same
    rotate_user_token(path)
    rotate_agent_key(path, now_s=START_S)
    assert load_tokens(path).scrape == first
    assert first not in repr(load_tokens(path))  # never shown
    rotated = rotate_scrape_token(path)
    assert rotated.scrape not in (None, first)
    creds = load_tokens(path)
    assert creds.authenticate(first, START_S) is None
    principal = creds.authenticate(rotated.scrape or "", START_S)
    assert principal is not None and principal.role.value == "scrape"


# ---- the Grafana dashboard -----------------------------------------------------------------

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "coadapt.json"


def test_the_grafana_dashboard_queries_only_what_metrics_exports(
    server: ApiServer, tokens: ApiCredentials, store_path: Path, clock: FakeClock,
    metrics: ControllerMetrics,
) -> None:  # fmt: skip
    """Every metric name a panel's query uses is a sample name a scrape answers (so the
    dashboard cannot drift from the endpoint), and every family is on some panel."""
    with Store.open(store_path, clock) as store:  # every per-job sample present
        add_instance(store, "i-1")
        store.add_job("bert", json.dumps(spec("bert")))
        place(store, "bert", {"i-1": 4})
        store.add_report("bert", report("bert").to_json())
    metrics.observe_round(RoundReport(1, 0, Actions(), {}, 0, 0.1, 0.1, 0.1, 0.1))
    assert get(server.url, "/v1/jobs", tokens.user)[0] == 200  # a request counted
    status, text = get(server.url, "/metrics", tokens.user)
    assert status == 200
    exported = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    doc = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in doc["panels"] for target in panel.get("targets", ())]
    assert exprs
    used: set[str] = set()
    for expr in exprs:
        without_labels = re.sub(r"\{[^}]*\}", "", expr)
        without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
        names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_ranges))
        ours = {n for n in names if n.startswith("coadapt_")}
        assert ours, expr
        assert ours <= exported, (expr, ours - exported)
        used |= ours
    for family in FAMILIES:
        assert any(name == family or name.startswith(f"{family}_") for name in used), family


# ---- what a real round counts (the controller on the fake cloud) ---------------------------


def test_a_rounds_report_counts_notices_preemptions_and_provider_errors(tmp_path: Path) -> None:
    """A noticed preemption is one notice and one preemption (its vanishing later is not a
    second one); a preemption without notice is one preemption and no notice; a launch
    refused for quota is one ``quota`` provider error."""
    from providers.errors import QuotaExceededError
    from tests.controller.test_loop import CONFIG, _rounds, _setup

    store, _, clock = _setup(tmp_path, jobs=1)
    memory = CONFIG.unavailable_offerings(clock)
    cloud = FakeProvider(clock=clock, unavailable=memory)
    ctl = Controller(store, cloud, clock, CONFIG, unavailable=memory)
    cloud.next_error("launch", QuotaExceededError("vCPU quota of the family reached"))
    first = ctl.run_round()
    assert dict(first.provider_errors) == {"quota": 1}
    assert (first.notices, first.preemptions) == (0, 0)
    _rounds(ctl, store, clock, 3)
    live = cloud.list_instances(CONFIG.cluster_id)
    assert len(live) >= 2, live  # one to notice, one to take without notice
    noticed, silent = live[0], live[1:]
    cloud.preempt(noticed.instance_id, notice_s=90.0)
    for inst in silent:
        cloud.preempt(inst.instance_id, notice_s=0.0)
    reports = []
    for _ in range(4):  # the notice's drain, then its instance vanishing, then calm
        reports.append(ctl.run_round())
        clock.advance(60.0)
    assert sum(r.notices for r in reports) == 1
    assert sum(r.preemptions for r in reports) == 1 + len(silent)
    assert all(not r.provider_errors for r in reports)
    metrics = ControllerMetrics()
    for r in [first, *reports]:
        metrics.observe_round(r)
    families = parse(metrics.exposition().decode())
    assert value(families, "coadapt_preemptions", "coadapt_preemptions_total") == 1 + len(silent)
    errors = "coadapt_provider_errors"
    assert value(families, errors, f"{errors}_total", kind="quota") == 1


def test_tokens_scrape_from_the_command_line(tmp_path: Path) -> None:
    """``coadapt tokens scrape --out FILE`` writes the token alone, 0600 (a Prometheus
    ``credentials_file``), the same on a second issue; ``rotate scrape`` replaces it, and
    ``rotate all`` rotates it too once one was issued."""
    from typer.testing import CliRunner

    from autoscaler.cli.main import app
    from autoscaler.controller.credentials import open_tokens

    state = tmp_path / "cluster"
    open_tokens(state / "tokens.json")
    runner = CliRunner()
    out = tmp_path / "prometheus" / "coadapt.token"
    out.parent.mkdir()
    done = runner.invoke(app, ["tokens", "scrape", "--state-dir", str(state), "--out", str(out)])
    assert done.exit_code == 0, done.output
    token = out.read_text()
    assert out.stat().st_mode & 0o777 == 0o600 and token not in done.output
    assert load_tokens(state / "tokens.json").scrape == token
    printed = runner.invoke(app, ["tokens", "scrape", "--state-dir", str(state)])
    assert printed.exit_code == 0 and printed.output.strip() == token
    rotated = runner.invoke(app, ["tokens", "rotate", "scrape", "--state-dir", str(state)])
    assert rotated.exit_code == 0, rotated.output
    second = load_tokens(state / "tokens.json").scrape
    assert second not in (None, token)
    runner.invoke(app, ["tokens", "rotate", "all", "--state-dir", str(state)])
    assert load_tokens(state / "tokens.json").scrape not in (None, second)
