"""Least privilege for credentials (autoscaler/controller/credentials.py), over real HTTP and
real processes: each instance's agent credential is good for that instance only, each job's
report credential for that job's reports only; a local agent's token file holds its own
credential only; a job's command never becomes a launcher option; a report credential never
follows a redirect; rotation keeps a running agent and its trainer working without a restart;
and the tokens file's refusals are one line."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from autoscaler.controller.agent import (
    AgentRunner,
    JobAssignment,
    Supervisor,
    _marked,
    launch_argv,
)
from autoscaler.controller.api import ApiClient, ApiServer, make_app, serve
from autoscaler.controller.credentials import (
    ApiCredentials,
    InsecureTokenFileError,
    Role,
    TokenFile,
    TokenFileError,
    generate_tokens,
    load_token,
    load_tokens,
    open_tokens,
    rotate_agent_key,
    rotate_user_token,
    write_token_file,
)
from autoscaler.controller.errors import ControllerError
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import JobStatus, Store
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import FakeClock
from tests.controller.test_api import (
    START_S,
    ExitRecorder,
    add_instance,
    assert_error,
    call,
    place,
    report,
    snapshot,
    spec,
)
from trainer import launch
from trainer.env import REPORT_TOKEN_FILE

ROOT = Path(__file__).resolve().parents[2]


# ---- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_s=START_S)


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
def tokens_path(tmp_path: Path) -> Path:
    path = tmp_path / "state" / "tokens.json"
    generate_tokens(path)
    return path


@pytest.fixture
def exits(store_path: Path, clock: FakeClock) -> ExitRecorder:
    return ExitRecorder(store_path, clock)


@pytest.fixture
def server(
    store_path: Path, tokens_path: Path, clock: FakeClock, tmp_path: Path, exits: ExitRecorder
) -> Iterator[ApiServer]:
    """The API as a running controller serves it: over its tokens file, read again when a
    rotation changes it."""
    app = make_app(
        store_path, TokenFile(tokens_path), clock, logs_dir=tmp_path / "logs", on_job_exit=exits
    )
    srv = serve(app)
    yield srv
    srv.shutdown()
    app.close()


@pytest.fixture
def creds(tokens_path: Path) -> ApiCredentials:
    return load_tokens(tokens_path)


# ---- each credential is good for its own instance or job only ------------------------------


def test_an_agent_credential_is_good_for_its_own_instance_only(
    server: ApiServer, creds: ApiCredentials, store: Store, exits: ExitRecorder
) -> None:
    """The agent of i-a cannot register, heartbeat, read the assignments of, or report a job
    exit for i-b, nor call any user endpoint: 403, and nothing changes."""
    add_instance(store, "i-a")
    add_instance(store, "i-b")
    store.add_job("bert", JobSubmission.from_json(json.dumps(spec("bert"))).to_json())
    place(store, "bert", {"i-b": 4})
    a = creds.agent_credential("i-a")
    before = snapshot(store.path)
    refused = [
        ("POST", "/v1/agents/register", {"instance_key": "i-b"}),
        ("POST", "/v1/agents/i-b/heartbeat", {"address": "10.6.6.6"}),
        ("GET", "/v1/agents/i-b/assignments", None),
        ("POST", "/v1/agents/i-b/jobs/bert/exit", {"failed": False}),
        ("POST", "/v1/jobs", spec("evil")),
        ("GET", "/v1/jobs", None),
        ("GET", "/v1/jobs/bert/logs", None),
        ("POST", "/v1/jobs/bert/cancel", None),
        ("GET", "/v1/instances", None),
        ("POST", "/v1/fleet/release", None),
        ("GET", "/v1/costs", None),
        ("GET", "/v1/events", None),
        ("POST", "/v1/jobs/bert/reports", report("bert").to_dict()),
    ]
    for method, path, body in refused:
        assert_error(call(server, method, path, body, token=a), 403)
    assert snapshot(store.path) == before and exits.calls == []
    assert store.get_job("bert").status is JobStatus.RUNNING
    # its own instance's endpoints work
    own = ApiClient(server.url, a, timeout_s=10)
    assert own.register("i-a").instance_key == "i-a"
    assert own.assignments("i-a") == []
    b = ApiClient(server.url, creds.agent_credential("i-b"), timeout_s=10)
    (assigned,) = b.assignments("i-b")
    assert assigned["report_token"] == creds.report_credential("bert")


@pytest.mark.parametrize("ended", [InstanceStatus.ALLOCATION_FAILED, InstanceStatus.TERMINATED])
def test_an_instance_that_ended_or_failed_to_start_loses_its_agent_credential(
    server: ApiServer, creds: ApiCredentials, store: Store, ended: InstanceStatus
) -> None:
    """The audit: an ``allocation_failed`` instance's credential still heartbeat (200). Once
    the instance ended or its launch was given up on, every agent endpoint answers 401 and
    nothing changes; the other instances' agents go on."""
    add_instance(store, "i-a")
    add_instance(store, "i-b")
    a = creds.agent_credential("i-a")
    agent_a = ApiClient(server.url, a, timeout_s=10)
    assert agent_a.heartbeat("i-a").status == "running"
    row = store.get_instance("i-a")
    if ended is InstanceStatus.ALLOCATION_FAILED:  # a launch given up on before it ran
        add_instance(store, "i-c", running=False)
        row = store.transition("i-c", 1, InstanceStatus.REQUESTED, reason="launch")
        store.transition("i-c", row.version, ended, reason="capacity")
        key = "i-c"
    else:
        store.transition("i-a", row.version, ended, reason="vanished")
        key = "i-a"
    credential = creds.agent_credential(key)
    before = snapshot(store.path)
    for method, path, body in (
        ("POST", f"/v1/agents/{key}/heartbeat", {}),
        ("POST", "/v1/agents/register", {"instance_key": key}),
        ("GET", f"/v1/agents/{key}/assignments", None),
        ("POST", f"/v1/agents/{key}/jobs/bert/exit", {"failed": False}),
    ):
        message = assert_error(call(server, method, path, body, token=credential), 401)
        assert "revoked" in message and ended.value in message
    assert snapshot(store.path) == before
    b = ApiClient(server.url, creds.agent_credential("i-b"), timeout_s=10)
    assert b.heartbeat("i-b").status == "running"


def test_a_report_credential_is_good_for_its_own_jobs_reports_only(
    server: ApiServer, creds: ApiCredentials, store: Store, exits: ExitRecorder
) -> None:
    """The trainers of bert cannot post gpt's reports, mark any job completed, read any
    assignments or call a user endpoint."""
    add_instance(store, "i-a")
    for name in ("bert", "gpt"):
        store.add_job(name, JobSubmission.from_json(json.dumps(spec(name))).to_json())
        place(store, name, {"i-a": 2})
    bert = creds.report_credential("bert")
    before = snapshot(store.path)
    refused = [
        ("POST", "/v1/jobs/gpt/reports", report("gpt").to_dict()),
        ("POST", "/v1/agents/i-a/jobs/gpt/exit", {"failed": False}),
        ("POST", "/v1/agents/i-a/jobs/bert/exit", {"failed": False}),
        ("POST", "/v1/agents/i-a/heartbeat", None),
        ("GET", "/v1/agents/i-a/assignments", None),
        ("POST", "/v1/agents/register", {"instance_key": "i-a"}),
        ("GET", "/v1/jobs", None),
        ("POST", "/v1/jobs/gpt/cancel", None),
    ]
    for method, path, body in refused:
        assert_error(call(server, method, path, body, token=bert), 403)
    assert snapshot(store.path) == before and exits.calls == []
    assert {store.get_job(n).status for n in ("bert", "gpt")} == {JobStatus.RUNNING}
    reply = ApiClient(server.url, bert, timeout_s=10).post_report(report("bert"))
    assert not reply.stop and store.latest_report("bert") is not None


def test_credentials_are_derived_bound_and_not_interchangeable(creds: ApiCredentials) -> None:
    a = creds.agent_credential("i-a")
    assert creds.authenticate(a, 0.0) == creds.authenticate(a, 1e12) is not None
    principal = creds.authenticate(a, 0.0)
    assert principal is not None and (principal.role, principal.subject) == (Role.AGENT, "i-a")
    principal = creds.authenticate(creds.report_credential("i-a"), 0.0)
    assert principal is not None and principal.role is Role.REPORT
    mac = a.rsplit(".", 1)[1]
    forged = [
        f"report.i-a.{mac}",  # the kind is inside the MAC
        f"agent.i-b.{mac}",  # so is the subject
        a[:-1] + ("A" if a[-1] != "A" else "B"),
        a + "x",
        "agent.i-a.",
        "x" * 600,
        f"user.i-a.{mac}",
    ]
    for token in forged:
        assert creds.authenticate(token, 0.0) is None, token
    other = generate_tokens_in_memory()
    assert other.authenticate(a, 0.0) is None  # another cluster's key
    assert creds.user not in repr(creds) and a not in repr(creds)


def generate_tokens_in_memory() -> ApiCredentials:
    return ApiCredentials(user="u" * 43, agent_key=os.urandom(32))


# ---- the local agent's own token file ------------------------------------------------------


def test_a_local_agents_token_file_holds_its_own_credential_only(tmp_path: Path) -> None:
    from autoscaler.controller.lifecycle import InstanceStatus
    from autoscaler.controller.service import UpConfig, _agent_user_data
    from autoscaler.controller.store import InstanceRow
    from providers.base import Market

    state = tmp_path / "state"
    tokens = open_tokens(state / "tokens.json")
    creds = tokens.current()
    row = InstanceRow(
        "i-7", "c-i-7", "local/slot/local-a/spot", "local", "slot", "local-a", Market.SPOT, "T4",
        1, 0.1, None, InstanceStatus.REQUESTED, 0, None, 0.0, 0.0, 1,
    )  # fmt: skip
    user_data = _agent_user_data(UpConfig(state), "http://127.0.0.1:1", tokens)(row)
    token_file = state.resolve() / "agents" / "i-7" / "agent-token.json"
    assert f"--token-file {token_file}" in user_data
    assert "tokens.json" not in user_data  # no agent is pointed at the controller's file
    raw = token_file.read_text()
    assert json.loads(raw) == {"agent": creds.agent_credential("i-7")}
    assert creds.user not in raw and base64.urlsafe_b64encode(creds.agent_key).decode() not in raw
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    for secret in (creds.user, creds.agent_credential("i-7")):  # the command line: no secret
        assert secret not in user_data
    assert load_token(token_file, "agent") == creds.agent_credential("i-7")


# ---- a job's command never becomes a launcher option ---------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    """Records every request (path and Authorization header); answers 302 to ``target`` when
    it is set, else 200 with an empty report reply."""

    seen: ClassVar[list[tuple[str, str | None]]]
    target: ClassVar[str | None]

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.target:
            self.send_response(302)
            self.send_header("Location", self.target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"schema_version": 1, "batch": null, "stop": false}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _any

    def log_message(self, *args: Any) -> None:
        pass


def _recorder(target: str | None = None) -> tuple[ThreadingHTTPServer, list[Any]]:
    seen: list[Any] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen, "target": target})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, seen


def test_a_command_that_starts_with_launcher_options_is_never_read_as_them(
    tmp_path: Path,
) -> None:
    """The agent's argv for the command ``--controller-url http://<a listening fake>
    train.py``: the launcher never takes the fake's address (parse_args), and a real launcher
    run refuses the command as a usage error without a single request reaching the fake."""
    fake, seen = _recorder()
    try:
        elsewhere = f"http://127.0.0.1:{fake.server_address[1]}"
        (tmp_path / "train.py").write_text("print('should never run')\n")
        a = JobAssignment(
            "bert", 1, (("i-a", 1),), "127.0.0.1:1", ("--controller-url", elsewhere, "train.py")
        )
        argv = launch_argv(a, controller_url="http://ctl:8080", python=sys.executable)
        assert argv[argv.index("--") + 1 :] == ["--controller-url", elsewhere, "train.py"]
        with pytest.raises(launch.TrainerConfigError, match="script must be a path"):
            launch.parse_args(argv[3:])
        # without the agent's own URL the result is the same: the command stays a command
        quiet = launch_argv(a, controller_url=None, python=sys.executable)
        with pytest.raises(launch.TrainerConfigError):
            launch.parse_args(quiet[3:])
        # a normal command after `--` keeps its own arguments, even option-like ones
        ok = JobAssignment("bert", 1, (("i-a", 1),), "127.0.0.1:1", ("train.py", "--lr", "3"))
        config = launch.parse_args(launch_argv(ok, controller_url="http://ctl:8080")[3:])
        assert config.controller_url == "http://ctl:8080"
        assert (config.script, config.script_args) == ("train.py", ("--lr", "3"))
        run = subprocess.run(
            argv, cwd=tmp_path, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert run.returncode == launch.ExitCode.USAGE, run.stdout + run.stderr
        assert "script must be a path" in run.stderr and "should never run" not in run.stdout
        time.sleep(0.2)
        assert seen == []
    finally:
        fake.shutdown()
        fake.server_close()


# ---- no credential follows a redirect ------------------------------------------------------


def test_the_reporter_does_not_resend_its_credential_on_a_redirect(tmp_path: Path) -> None:
    """A 'controller' that answers 302 to a second local server: the second one gets no
    Authorization header (here: no request at all), and the report counts as failed."""
    from trainer.reporter import HttpSink, Reporter

    second, second_seen = _recorder()
    first, first_seen = _recorder(f"http://127.0.0.1:{second.server_address[1]}/steal")
    try:
        token_file = tmp_path / "bert.token"
        token_file.write_text("report.bert." + "k" * 43)
        sink = HttpSink(
            f"http://127.0.0.1:{first.server_address[1]}", "bert", token_file=token_file
        )
        reporter = Reporter(sink, lambda: report("bert"), interval_s=60.0)
        assert reporter.send_now() is None and reporter.failed == 1
        assert first_seen == [("/v1/jobs/bert/reports", "Bearer report.bert." + "k" * 43)]
        assert all(auth is None for _, auth in second_seen)
        assert second_seen == []
    finally:
        for s in (first, second):
            s.shutdown()
            s.server_close()


# ---- rotation ------------------------------------------------------------------------------

TRAINER = r"""
import json, os, sys, time
from trainer.reporter import HttpSink
from trainer.report import BatchConfig, JobHints, TrainerReport
out = sys.argv[1]
with open(out + ".env", "w") as f:
    json.dump(dict(os.environ), f)
sink = HttpSink(os.environ["API"], "bert", token_file=os.environ["COADAPT_REPORT_TOKEN_FILE"])
step = 0
while True:
    step += 1
    report = TrainerReport(job_id="bert", attempt=0, started_at_s=0.0, sent_at_s=0.0,
                           world_size=1, num_nodes=1, batch=BatchConfig(8, 1), step=step,
                           skipped_steps=0, epoch=0, epoch_position=step, progress=float(step),
                           gradient=None, profiles=(), hints=JobHints(8, 64))
    try:
        sink.send(report)
        line = "ok"
    except Exception as e:
        line = "err " + str(getattr(e, "code", e))
    with open(out, "a") as f:
        f.write(f"{os.getpid()} {line}\n")
    time.sleep(0.05)
"""


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_rotation_keeps_a_running_agent_and_its_trainer_working_without_a_restart(
    server: ApiServer,
    tokens_path: Path,
    store: Store,
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    """An agent runs a job whose stand-in trainer reports through the real HttpSink. The agent
    key is rotated: the agent's next heartbeat renews its credential (kept in its token file),
    its next assignment read hands the job its new report credential (its file rewritten),
    and after the grace period the old credentials are refused while the agent and the very
    same trainer process keep working. A rotation of the users' token cuts off the old one at
    once and touches neither. The trainer never sees the agent's credential."""
    add_instance(store, "i-1")
    store.add_job("bert", JobSubmission.from_json(json.dumps(spec("bert"))).to_json())
    place(store, "bert", {"i-1": 1})
    first = load_tokens(tokens_path)
    old_agent, old_report = first.agent_credential("i-1"), first.report_credential("bert")
    agent_file = tmp_path / "agent" / "agent-token.json"
    write_token_file(agent_file, "agent", old_agent)
    script = tmp_path / "stand_in_trainer.py"
    script.write_text(TRAINER)
    out = tmp_path / "reports.log"
    sup = Supervisor(
        f"test-{uuid.uuid4().hex[:8]}",
        tmp_path / "agent",
        stop_grace_s=5.0,
        argv_for=lambda a: [sys.executable, str(script), str(out)],
        env={"API": server.url, "PYTHONPATH": str(ROOT)},
    )
    runner = AgentRunner(
        ApiClient(server.url, load_token(agent_file, "agent"), timeout_s=10),
        "i-1",
        sup,
        address="127.0.0.1",
        on_credential=lambda c: write_token_file(agent_file, "agent", c),
    )
    try:
        runner.step()
        _wait_for(lambda: any(line.endswith(" ok") for line in _lines(out)))
        pid = sup._procs["bert"].pid
        environ = json.loads(Path(f"{out}.env").read_text())
        assert environ[REPORT_TOKEN_FILE] == str(sup.credential_path("bert"))
        assert not any(old_agent in v for v in environ.values())  # never the agent's
        assert "COADAPT_API_TOKEN" not in environ
        assert sup.credential_path("bert").read_text().strip() == old_report
        assert stat.S_IMODE(sup.credential_path("bert").stat().st_mode) == 0o600

        second = rotate_agent_key(tokens_path, now_s=clock.now_s(), grace_s=600)
        new_agent, new_report = second.agent_credential("i-1"), second.report_credential("bert")
        assert (new_agent, new_report) != (old_agent, old_report)
        runner.step()  # heartbeat: renewed; assignments: the job's new report credential
        assert load_token(agent_file, "agent") == new_agent
        assert sup.credential_path("bert").read_text().strip() == new_report
        assert "bert" in sup.running  # not restarted

        clock.advance(601)  # the grace period is over: the old credentials are refused
        assert_error(call(server, "POST", "/v1/agents/i-1/heartbeat", token=old_agent), 401)
        old_post = call(server, "POST", "/v1/jobs/bert/reports", report("bert").to_dict(),
                        token=old_report)  # fmt: skip
        assert_error(old_post, 401)
        seen = len(_lines(out))
        runner.step()  # the agent keeps working with its renewed credential
        _wait_for(lambda: len(_lines(out)) > seen + 3)
        assert all(line == f"{pid} ok" for line in _lines(out)[seen + 1 :])  # same process

        before_user = second.user
        third = rotate_user_token(tokens_path)
        assert_error(call(server, "GET", "/v1/jobs", token=before_user), 401)
        assert call(server, "GET", "/v1/jobs", token=third.user)[0] == 200
        runner.step()
        seen = len(_lines(out))
        _wait_for(lambda: len(_lines(out)) > seen + 3)
        assert all(line == f"{pid} ok" for line in _lines(out)[seen + 1 :])
        assert third.agent_credential("i-1") == new_agent  # the agent key did not change
    finally:
        runner.close()
    assert _marked(sup.agent_id, None) == []
    assert not sup.credential_path("bert").exists()  # withdrawn with the job


def test_a_second_agent_key_rotation_within_the_grace_period_is_refused(
    tokens_path: Path,
) -> None:
    first = load_tokens(tokens_path)
    second = rotate_agent_key(tokens_path, now_s=1000.0, grace_s=60)
    assert second.previous_agent_key == first.agent_key
    assert second.authenticate(first.agent_credential("i-1"), 1059.0) is not None
    assert second.authenticate(first.agent_credential("i-1"), 1060.0) is None
    with pytest.raises(TokenFileError, match="grace period") as e:
        rotate_agent_key(tokens_path, now_s=1030.0)
    assert "\n" not in str(e.value)
    assert load_tokens(tokens_path) == second
    forced = rotate_agent_key(tokens_path, now_s=1030.0, force=True)
    assert forced.authenticate(first.agent_credential("i-1"), 1030.0) is None
    assert forced.authenticate(second.agent_credential("i-1"), 1030.0) is not None
    later = rotate_agent_key(tokens_path, now_s=1e9)  # after the grace period: no refusal
    assert later.previous_agent_key == forced.agent_key
    for bad in (0.0, -1.0, 8 * 86400.0):
        with pytest.raises(InvalidInputError, match="grace period"):
            rotate_agent_key(tokens_path, now_s=2e9, grace_s=bad)


def test_the_controller_keeps_the_last_good_credentials_when_the_file_goes_bad(
    tokens_path: Path,
) -> None:
    source = TokenFile(tokens_path)
    good = source.current()
    tokens_path.write_text("{damaged")  # (never by coadapt: it writes whole files only)
    assert source.current() == good
    tokens_path.write_bytes(good.to_json())  # restored, then rotated: picked up again
    new = rotate_user_token(tokens_path)
    assert new != good and source.current() == new


# ---- the tokens file -----------------------------------------------------------------------


def test_generated_tokens_file_is_private_from_its_creation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[tuple[str, int, int]] = []
    real_open = os.open

    def spy(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        opened.append((str(path), flags, mode))
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", spy)
    old = os.umask(0)  # the most permissive umask: the file must still be 0600
    try:
        tokens = generate_tokens(tmp_path / "tokens.json")
    finally:
        os.umask(old)
    created = [(p, flags, mode) for p, flags, mode in opened if flags & os.O_CREAT]
    assert len(created) == 1
    _, flags, mode = created[0]
    assert mode == 0o600 and flags & os.O_EXCL
    path = tmp_path / "tokens.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens.json"]  # no temporary left
    data = json.loads(path.read_text())
    assert set(data) == {"user", "agent_key"}
    assert data["user"] == tokens.user and len(tokens.user) >= 43
    assert base64.urlsafe_b64decode(data["agent_key"]) == tokens.agent_key
    assert len(tokens.agent_key) == 32
    assert load_tokens(path) == tokens
    assert tokens.user not in repr(tokens) and data["agent_key"] not in repr(tokens)


def test_generate_refuses_to_replace_unless_asked(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    first = generate_tokens(path)
    with pytest.raises(TokenFileError):
        generate_tokens(path)
    assert load_tokens(path) == first
    second = generate_tokens(path, overwrite=True)
    assert second != first and load_tokens(path) == second
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens.json"]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_load_refuses_a_file_others_may_read_or_write(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "tokens.json"
    tokens = generate_tokens(path)
    os.chmod(path, mode)
    with pytest.raises(InsecureTokenFileError) as e:
        load_tokens(path)
    assert isinstance(e.value, ControllerError)
    assert "chmod 600" in str(e.value)
    assert tokens.user not in str(e.value)
    os.chmod(path, 0o400)
    assert load_tokens(path) == tokens


def test_load_refuses_missing_and_malformed_files_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    with pytest.raises(TokenFileError, match="no tokens file") as e:
        load_tokens(path)
    messages = [str(e.value)]
    secret = "s3cret-s3cret-s3cret-s3cret"
    key = base64.urlsafe_b64encode(b"k" * 32).decode()
    for content in (
        "{",
        "[]",
        json.dumps({"user": secret}),  # no agent key
        json.dumps({"user": 1, "agent_key": key}),
        json.dumps({"user": secret, "agent_key": base64.urlsafe_b64encode(b"short").decode()}),
        json.dumps({"user": secret, "agent_key": 5}),
        json.dumps({"user": secret, "agent_key": key, "previous_agent_key": key}),
        "x" * 70000,
    ):
        path.write_text(content)
        os.chmod(path, 0o600)
        with pytest.raises(TokenFileError) as e:
            load_tokens(path)
        messages.append(str(e.value))
    with pytest.raises(TokenFileError, match="not a regular file") as e:
        load_tokens(tmp_path)
    messages.append(str(e.value))
    for message in messages:  # one line: what, then how to fix it; never a secret
        assert "\n" not in message and "; " in message and str(tmp_path) in message
        assert secret not in message and key not in message


def test_an_old_tokens_file_loses_its_shared_agent_token(tmp_path: Path) -> None:
    """A tokens file of the shared-agent-token design: the users' token is kept, the shared
    agent token is dropped (it is good for nothing any more), an agent key is made."""
    path = tmp_path / "tokens.json"
    old = {"user": "u" * 43, "agent": "a" * 43}
    path.write_text(json.dumps(old))
    path.chmod(0o600)
    creds = open_tokens(path).current()
    assert creds.user == "u" * 43
    data = json.loads(path.read_text())
    assert set(data) == {"user", "agent_key"} and "a" * 43 not in path.read_text()
    assert creds.authenticate("a" * 43, 0.0) is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.slow
def test_the_tokens_file_refusals_reach_the_user_as_one_line(tmp_path: Path) -> None:
    """`coadapt status` and `coadapt agent` with a missing, open or damaged tokens file: a
    one-line `coadapt: <what>; <how to fix>`, no traceback."""
    state = tmp_path / "cluster"
    state.mkdir()
    (state / "up.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": 1}))
    cli = [sys.executable, "-m", "autoscaler.cli"]
    agent = [sys.executable, "-m", "autoscaler.controller.service", "agent", "--api",
             "http://127.0.0.1:9", "--instance-key", "i-1",
             "--work-dir", str(tmp_path / "w")]  # fmt: skip
    for setup in ("missing", "open", "damaged"):
        path = state / "tokens.json"
        path.unlink(missing_ok=True)
        if setup != "missing":
            path.write_text("{damaged" if setup == "damaged" else json.dumps({"user": "u" * 43}))
            path.chmod(0o600 if setup == "damaged" else 0o644)
        for argv in (
            [*cli, "status", "--state-dir", str(state)],
            [*agent, "--token-file", str(path)],
        ):
            run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert run.returncode in (1, 2), run.stderr
            assert run.stderr.count("\n") == 1 and run.stderr.startswith("coadapt: "), run.stderr
            assert "; " in run.stderr and "Traceback" not in run.stderr


def test_tokens_rotate_from_the_command_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autoscaler.cli.main import app

    state = tmp_path / "cluster"
    first = open_tokens(state / "tokens.json").current()
    runner = CliRunner()
    done = runner.invoke(app, ["tokens", "rotate", "user", "--state-dir", str(state)])
    assert done.exit_code == 0, done.output
    after_user = load_tokens(state / "tokens.json")
    assert after_user.user != first.user and after_user.agent_key == first.agent_key
    done = runner.invoke(
        app, ["tokens", "rotate", "agent-key", "--state-dir", str(state), "--grace-s", "30"]
    )
    assert done.exit_code == 0 and "honoured until" in done.output, done.output
    rotated = load_tokens(state / "tokens.json")
    assert rotated.previous_agent_key == first.agent_key and rotated.user == after_user.user
    again = runner.invoke(app, ["tokens", "rotate", "all", "--state-dir", str(state)])
    assert again.exit_code == 1 and "--force" in again.output
    assert load_tokens(state / "tokens.json") == rotated  # refused whole: nothing changed
    assert (
        runner.invoke(app, ["tokens", "rotate", "nope", "--state-dir", str(state)]).exit_code == 2
    )
    bad_grace = ["tokens", "rotate", "agent-key", "--state-dir", str(state), "--grace-s", "0"]
    assert runner.invoke(app, [*bad_grace, "--force"]).exit_code == 2
    copy = tmp_path / "laptop"
    write_token_file(copy / "tokens.json", "user", "u" * 43)  # a CLI's copy of a deployment's
    refused = runner.invoke(app, ["tokens", "rotate", "user", "--state-dir", str(copy)])
    assert refused.exit_code == 1 and "controller machine" in refused.output
