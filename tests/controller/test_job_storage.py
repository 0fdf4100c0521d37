"""Each job's own checkpoint credential on a cloud node: the session policy and access boundary
(table-driven), the AWS credential on a real moto server (the AssumeRole request as sent; a
job process whose boto3 is configured only by the environment the agent gives it), and the GCP
downscoped token over real HTTP (a local stand-in for the metadata server, Google's STS and
GCS). moto enforces no session policy and the STS here is a stand-in: what these tests hold is
the request made and that the job uses what it is handed, not the clouds' enforcement."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from autoscaler.controller.agent import JobAssignment, Supervisor
from autoscaler.controller.job_storage import (
    AwsJobCredentials,
    GcpJobCredentials,
    JobCredentialError,
    aws_session_name,
    aws_session_policy,
    gcs_access_boundary,
)
from trainer.aws_credentials import main as credential_process
from trainer.storage import GcsStore

JOB_SCRIPT = """
import json, sys
from trainer.storage import open_store
store = open_store(sys.argv[1])
store.write("step-1", b"weights")
out = {"read": store.read("step-1").decode(), "names": store.names()}
if sys.argv[1].startswith("s3://"):
    import boto3
    creds = boto3.Session().get_credentials()
    out.update(key=creds.access_key, method=creds.method)
print("JOB " + json.dumps(out), flush=True)
"""


@pytest.mark.parametrize(
    ("root", "job", "objects", "listed"),
    [
        ("s3://b/checkpoints", "train-1", "arn:aws:s3:::b/checkpoints/train-1/*",
         "checkpoints/train-1/*"),
        ("s3://b/a/b/", "j", "arn:aws:s3:::b/a/b/j/*", "a/b/j/*"),
        ("s3://b", "j", "arn:aws:s3:::b/j/*", "j/*"),
    ],
)  # fmt: skip
def test_the_session_policy_opens_the_jobs_own_prefix_only(
    root: str, job: str, objects: str, listed: str
) -> None:
    other = json.dumps(aws_session_policy(root, job, "aws-cn"))
    assert other == json.dumps(aws_session_policy(root, job)).replace("arn:aws:", "arn:aws-cn:")
    assert aws_session_policy(root, job) == {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "OwnCheckpoints", "Effect": "Allow",
             "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
             "Resource": [objects]},
            {"Sid": "ListOwnCheckpoints", "Effect": "Allow", "Action": ["s3:ListBucket"],
             "Resource": ["arn:aws:s3:::b"],
             "Condition": {"StringLike": {"s3:prefix": [listed]}}},
        ],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("job", "name"),
    [
        ("train-1", "coadapt-train-1"),
        ("a b/c:d", "coadapt-a-b-c-d"),
        ("x" * 100, "coadapt-" + "x" * 56),
        ("ok_+=,.@-", "coadapt-ok_+=,.@-"),
    ],
)
def test_the_session_name_is_the_job_sanitised_within_64(job: str, name: str) -> None:
    assert aws_session_name(job) == name and len(name) <= 64


@pytest.mark.parametrize(
    ("root", "bad"), [("gs://b/p", "s3"), ("s3:///p", "s3"), ("/local", "s3"), ("s3://b", "gs")]
)
def test_a_root_of_another_kind_is_refused(root: str, bad: str) -> None:
    with pytest.raises(ValueError, match="is not"):
        (aws_session_policy if bad == "s3" else gcs_access_boundary)(root, "j")


@pytest.mark.parametrize(
    ("root", "objects", "listed"),
    [
        ("gs://b/checkpoints", "projects/_/buckets/b/objects/checkpoints/j/", "checkpoints/j/"),
        ("gs://b", "projects/_/buckets/b/objects/j/", "j/"),
    ],
)
def test_the_access_boundary_opens_the_jobs_own_prefix_only(
    root: str, objects: str, listed: str
) -> None:
    assert gcs_access_boundary(root, "j") == {
        "accessBoundary": {
            "accessBoundaryRules": [
                {
                    "availablePermissions": ["inRole:roles/storage.objectAdmin"],
                    "availableResource": "//storage.googleapis.com/projects/_/buckets/b",
                    "availabilityCondition": {
                        "title": "own-checkpoints",
                        "expression": f"resource.name.startsWith('{objects}') || "
                        "api.getAttribute('storage.googleapis.com/objectListPrefix', '')"
                        f".startsWith('{listed}')",
                    },
                }
            ]
        }
    }


def test_the_credential_process_prints_a_whole_credential_or_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"Version": 1, "AccessKeyId": "AK", "SecretAccessKey": "S", "SessionToken": "T",
            "Expiration": "2030-01-01T00:00:00+00:00"}  # fmt: skip
    path = tmp_path / "c.json"
    path.write_text(json.dumps(good))
    assert credential_process([str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == good
    path.write_text(json.dumps({**good, "SessionToken": ""}))
    assert credential_process([str(path)]) == 1
    err = capsys.readouterr().err
    assert err == f"coadapt aws credentials: {path}: lacks SessionToken\n"
    assert credential_process([]) == 2


def _wait_exit(sup: Supervisor, job: str) -> None:
    deadline = time.monotonic() + 60
    while job in sup.running and time.monotonic() < deadline:
        sup.poll()
        time.sleep(0.05)
    assert job not in sup.running


def _job_said(sup: Supervisor, job: str) -> dict[str, Any]:
    text = sup.log_path(job).read_text()
    lines = [x for x in text.splitlines() if x.startswith("JOB ")]
    assert lines, text
    return dict(json.loads(lines[-1][4:]))


def _assignment(job: str, argv: list[str]) -> JobAssignment:
    return JobAssignment(job, 1, (("i-1", 1),), "127.0.0.1:1", tuple(argv))


def _sleeper(a: JobAssignment) -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(120)"]


def _private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o600


# ------------------------------------------------------------------------- AWS, on moto


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A moto server, a bucket of its own and the agent's (dummy) credentials."""
    from emulators.aws_moto import admin_client, shared_moto_server

    for key, value in {
        "AWS_ACCESS_KEY_ID": "agent-key", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    }.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    moto = shared_moto_server()
    bucket = f"ckpt-{uuid.uuid4().hex[:10]}"
    admin_client(moto.url, "s3").create_bucket(Bucket=bucket)
    return moto.url, bucket


def test_aws_a_job_gets_its_own_assumed_role_credential_and_uses_only_it(
    tmp_path: Path, moto_s3: tuple[str, str]
) -> None:
    from emulators.aws_moto import admin_client

    url, bucket = moto_s3
    root = f"s3://{bucket}/checkpoints"
    iam = admin_client(url, "iam")
    node = "arn:aws:iam::123456789012:role/node"
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": node}}]}  # fmt: skip
    role = iam.create_role(
        RoleName=f"job-storage-{uuid.uuid4().hex[:8]}", AssumeRolePolicyDocument=json.dumps(trust)
    )["Role"]["Arn"]
    broker = AwsJobCredentials(role, root, region="us-east-1", endpoint_url=url)
    sent: list[dict[str, Any]] = []
    broker.clients()[0].meta.events.register(
        "provide-client-params.sts.AssumeRole", lambda params, **_: sent.append(dict(params))
    )
    sup = Supervisor(
        "agent-aws", tmp_path / "w", storage=broker, env={"AWS_ENDPOINT_URL": url},
        argv_for=lambda a: [sys.executable, "-c", JOB_SCRIPT, f"{root}/{a.job}"],
    )  # fmt: skip
    assert sup.start(_assignment("train-1", ["x"])) is not None
    _wait_exit(sup, "train-1")
    (request,) = sent
    assert json.loads(request.pop("Policy")) == aws_session_policy(root, "train-1")
    assert request == {
        "RoleArn": role, "RoleSessionName": "coadapt-train-1", "DurationSeconds": 3600
    }  # fmt: skip
    said = _job_said(sup, "train-1")
    assert said["read"] == "weights" and said["names"] == ["step-1"]
    assert said["method"] == "custom-process"  # the agent's variables were not handed on
    assert said["key"] != "agent-key" and said["key"].startswith("ASIA")
    got = admin_client(url, "s3").get_object(Bucket=bucket, Key="checkpoints/train-1/step-1")
    assert got["Body"].read() == b"weights"
    credential, _ = sup.storage_paths("train-1")
    assert not credential.exists()  # gone with its job


def test_aws_the_agent_renews_a_running_jobs_credential_in_place(
    tmp_path: Path, moto_s3: tuple[str, str]
) -> None:
    url, bucket = moto_s3
    role = "arn:aws:iam::123456789012:role/job-storage"
    broker = AwsJobCredentials(role, f"s3://{bucket}/c", region="us-east-1", endpoint_url=url)
    sup = Supervisor(
        "agent-renew", tmp_path / "w", stop_grace_s=1.0, storage=broker,
        argv_for=lambda a: [sys.executable, "-c", "import time; time.sleep(120)"],
    )  # fmt: skip
    sup.start(_assignment("long", ["x"]))
    try:
        credential, config = sup.storage_paths("long")
        assert _private(credential) and _private(config)
        first = json.loads(credential.read_text())
        assert "trainer.aws_credentials" in config.read_text()
        expires = first["Expiration"]
        assert sup.renew_storage_credentials(time.time()) == []  # not yet: 2/3 of an hour
        assert sup.renew_storage_credentials(time.time() + 2401) == ["long"]
        second = json.loads(credential.read_text())
        assert second["AccessKeyId"] != first["AccessKeyId"] and second["Expiration"] >= expires
    finally:
        sup.stop_all()


def test_aws_a_renewal_that_fails_keeps_the_old_credential_says_so_once_and_backs_off(
    tmp_path: Path, moto_s3: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    url, bucket = moto_s3
    good = AwsJobCredentials("arn:aws:iam::123456789012:role/job-storage", f"s3://{bucket}/c",
                             region="us-east-1", endpoint_url=url)  # fmt: skip
    sup = Supervisor(
        "agent-renew-fails", tmp_path / "w", stop_grace_s=1.0, storage=good,
        argv_for=lambda a: [sys.executable, "-c", "import time; time.sleep(120)"],
    )  # fmt: skip
    sup.start(_assignment("long", ["x"]))
    try:
        credential, _ = sup.storage_paths("long")
        first = credential.read_text()
        sup.storage = AwsJobCredentials("not-an-arn", f"s3://{bucket}/c", region="us-east-1",
                                        endpoint_url=url)  # fmt: skip
        due = time.time() + 2401
        with caplog.at_level("WARNING", logger="autoscaler.controller.agent"):
            for step_s in range(0, 60, 1):  # an agent steps every second or so
                assert sup.renew_storage_credentials(due + step_s) == []
        said = [r.getMessage() for r in caplog.records if "not renewed" in r.getMessage()]
        assert len(said) == 1 and "sts:AssumeRole" in said[0], said
        assert credential.read_text() == first  # the job keeps the one it has
        sup.storage = good
        assert sup.renew_storage_credentials(due + 59) == []  # tried again a minute later
        assert sup.renew_storage_credentials(due + 60) == ["long"]
        assert credential.read_text() != first
        assert any("renewed again" in r.getMessage() for r in caplog.records)
    finally:
        sup.stop_all()


def test_aws_a_refused_assume_role_starts_nothing_and_says_why_once(
    tmp_path: Path, moto_s3: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, bucket = moto_s3
    broker = AwsJobCredentials("not-an-arn", f"s3://{bucket}/c", region="us-east-1",
                               endpoint_url=url)  # fmt: skip
    sup = Supervisor("agent-refused", tmp_path / "w", storage=broker,
                     argv_for=lambda a: [sys.executable, "-c", "pass"])  # fmt: skip
    with pytest.raises(JobCredentialError):
        broker.mint("j")
    assert broker.partition == "aws"
    gov = AwsJobCredentials("arn:aws-us-gov:iam::1:role/j", "s3://b", region="us-gov-west-1")
    assert gov.partition == "aws-us-gov"  # its session policy names ARNs of that partition
    assert sup.start(_assignment("j", ["x"])) is None
    assert sup.start(_assignment("j", ["x"])) is None
    err = capsys.readouterr().err
    assert err.count("not starting j: no checkpoint credential: sts:AssumeRole") == 1, err
    assert sup.running == {}


# ---------------------------------------------------------------- GCP, over real HTTP


class _FakeGoogle(BaseHTTPRequestHandler):
    """The metadata server's token, Google's STS token exchange, GCS uploads and reads."""

    exchanges: ClassVar[list[dict[str, str]]] = []
    lifetime_s: ClassVar[int] = 3599  # of the tokens STS hands out
    bearers: ClassVar[list[str]] = []
    objects: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        if self.path.startswith("/computeMetadata/"):
            ok = self.headers.get("Metadata-Flavor") == "Google"
            self._answer(200 if ok else 403, {"access_token": "ya29.node", "expires_in": 3599})
            return
        self.bearers.append(self.headers.get("Authorization", ""))
        parsed = urllib.parse.urlparse(self.path)
        if parsed.path.endswith("/o"):  # a listing
            prefix = urllib.parse.parse_qs(parsed.query)["prefix"][0]
            names = [{"name": n} for n in self.objects if n.startswith(prefix)]
            self._answer(200, {"items": names})
            return
        name = urllib.parse.unquote(parsed.path.rsplit("/o/", 1)[1])
        self._answer(200, self.objects[name], raw=True)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/token":
            form = dict(urllib.parse.parse_qsl(body.decode(), strict_parsing=True))
            self.exchanges.append(form)
            token = f"ya29.down-{len(self.exchanges)}"
            self._answer(200, {"access_token": token, "token_type": "Bearer",
                               "expires_in": self.lifetime_s,
                               "issued_token_type": form["requested_token_type"]})  # fmt: skip
            return
        self.bearers.append(self.headers.get("Authorization", ""))
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        self.objects[query["name"][0]] = body
        self._answer(200, {})

    def _answer(self, status: int, body: Any, raw: bool = False) -> None:
        data = body if raw else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_google() -> Iterator[str]:
    _FakeGoogle.exchanges, _FakeGoogle.bearers, _FakeGoogle.objects = [], [], {}
    _FakeGoogle.lifetime_s = 3599
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeGoogle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_gcp_a_job_gets_a_downscoped_token_in_a_file_its_store_reads_again(
    tmp_path: Path, fake_google: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = "gs://ckpt/checkpoints"
    broker = GcpJobCredentials(root, metadata_url=fake_google, sts_url=f"{fake_google}/v1/token")
    monkeypatch.setenv("COADAPT_GCS_TOKEN", "the-agents-own")  # never handed on to a job
    sup = Supervisor(
        "agent-gcp", tmp_path / "w", storage=broker,
        env={"STORAGE_EMULATOR_HOST": fake_google},
        argv_for=lambda a: [sys.executable, "-c", JOB_SCRIPT, f"{root}/{a.job}"],
    )  # fmt: skip
    sup.start(_assignment("train-1", ["x"]))
    _wait_exit(sup, "train-1")
    (exchange,) = _FakeGoogle.exchanges
    options = json.loads(exchange.pop("options"))
    assert exchange == {
        "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
        "subject_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "subject_token": "ya29.node",
    }
    assert options == gcs_access_boundary(root, "train-1")
    said = _job_said(sup, "train-1")
    assert said == {"read": "weights", "names": ["step-1"]}
    assert set(_FakeGoogle.bearers) == {"Bearer ya29.down-1"}
    assert _FakeGoogle.objects["checkpoints/train-1/step-1"] == b"weights"

    sup.argv_for = lambda a: [sys.executable, "-c", "import time; time.sleep(120)"]
    sup.stop_grace_s = 1.0
    sup.start(_assignment("long", ["x"]))
    try:
        token_file, _ = sup.storage_paths("long")
        assert _private(token_file) and token_file.read_text() == "ya29.down-2\n"
        monkeypatch.setenv("COADAPT_GCS_TOKEN_FILE", str(token_file))
        store = GcsStore("ckpt", "checkpoints/long", endpoint=fake_google)
        store.write("a", b"1")
        assert sup.renew_storage_credentials(time.time() + 2400) == ["long"]
        store.write("b", b"2")
        assert _FakeGoogle.bearers[-2:] == ["Bearer ya29.down-2", "Bearer ya29.down-3"]
    finally:
        sup.stop_all()
    assert os.environ["COADAPT_GCS_TOKEN"] == "the-agents-own"


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs get users of their own as root")
def test_aws_an_isolated_job_reads_its_credential_as_its_own_user(
    tmp_path: Path, moto_s3: tuple[str, str]
) -> None:
    """As root with ``isolate``: the credential and config files are the job's user's, 0600,
    in its own folder, and the job, running as that user, checkpoints with them."""
    from coadapt_common.jobexec import job_uid, probe

    if probe() is not None:
        pytest.skip(f"no isolation here: {probe()}")
    url, bucket = moto_s3
    root = f"s3://{bucket}/checkpoints"
    role = "arn:aws:iam::123456789012:role/job-storage"
    broker = AwsJobCredentials(role, root, region="us-east-1", endpoint_url=url)
    script = JOB_SCRIPT + "import os; print('JOB ' + json.dumps({'uid': os.getuid()}))\n"
    seen: list[tuple[int, int, int]] = []

    def argv_for(a: JobAssignment) -> list[str]:
        return [sys.executable, "-c", script, f"{root}/{a.job}"]

    sup = Supervisor("agent-iso", tmp_path / "w", storage=broker, isolate=True,
                     env={"AWS_ENDPOINT_URL": url}, argv_for=argv_for)  # fmt: skip
    sup.start(_assignment("iso-1", ["x"]))
    for path in sup.storage_paths("iso-1"):
        st = path.stat()
        seen.append((st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)))
    _wait_exit(sup, "iso-1")
    uid = job_uid("iso-1")
    assert seen == [(uid, uid, 0o600)] * 2
    lines = [x for x in sup.log_path("iso-1").read_text().splitlines() if x.startswith("JOB ")]
    assert [json.loads(x[4:]) for x in lines][-1] == {"uid": uid}, lines
    said = json.loads(lines[0][4:])
    assert said["read"] == "weights" and said["method"] == "custom-process"


@pytest.mark.parametrize(
    ("root", "extra", "says"),
    [
        ("gs://b/c", ["--job-storage-role-arn", "arn:aws:iam::1:role/j"], "ROLE"),
        ("/var/lib/ckpt", ["--job-storage-role-arn", "arn:aws:iam::1:role/j"], "ROLE"),
        (None, ["--job-storage-role-arn", "arn:aws:iam::1:role/j"], "ROLE"),
        ("s3://b/c", ["--notice-source", "aws"], "AWS"),
    ],
)
def test_the_agent_refuses_a_job_storage_config_that_leaves_jobs_without_one(
    tmp_path: Path,
    root: str | None,
    extra: list[str],
    says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before it touches the firewall (no iptables here: the AWS case would otherwise end
    with status 3)."""
    from autoscaler.controller.credentials import write_token_file
    from autoscaler.controller.service import agent_main

    token = tmp_path / "agent-token.json"
    write_token_file(token, "agent", "a" * 43)
    argv = ["--api", "http://127.0.0.1:9", "--token-file", str(token), "--instance-key", "i-1",
            "--work-dir", str(tmp_path / "w"), *extra]  # fmt: skip
    if root is not None:
        argv += ["--checkpoint-root", root]
    umask = os.umask(0o022)
    try:
        assert agent_main(argv) == 2
    finally:
        os.umask(umask)  # agent_main sets its process's
    expected = {
        "ROLE": "--job-storage-role-arn needs an s3:// --checkpoint-root",
        "AWS": "an s3:// --checkpoint-root on an AWS node needs --job-storage-role-arn (jobs "
        "cannot reach the node's role)",
    }
    assert capsys.readouterr().err == f"coadapt agent: {expected[says]}\n"


def test_gcp_a_restarted_agent_renews_an_adopted_jobs_token_at_once(
    tmp_path: Path, fake_google: str
) -> None:
    """A job adopted from the agent's previous life (kill -9: nothing stopped) gets a new
    token at the first renewal: how old the one it has is, the new life cannot know."""
    broker = GcpJobCredentials(
        "gs://b/c", metadata_url=fake_google, sts_url=f"{fake_google}/v1/token"
    )
    agent_id = f"agent-{uuid.uuid4().hex[:8]}"

    def life() -> Supervisor:
        return Supervisor(
            agent_id, tmp_path / "w", stop_grace_s=1.0, storage=broker, argv_for=_sleeper
        )

    first = life()
    first.start(_assignment("long", ["x"]))
    second = life()  # the first life "died": its job runs on
    try:
        adoption = second.adopt()
        assert adoption is not None and adoption.adopted == ("long",)
        token_file, _ = second.storage_paths("long")
        assert token_file.read_text() == "ya29.down-1\n"
        assert second.renew_storage_credentials() == ["long"]
        assert token_file.read_text() == "ya29.down-2\n"
        assert second.renew_storage_credentials() == []  # the next one at 2/3 of its life
    finally:
        second.stop_all()
        first.sweep()


@pytest.mark.slow
def test_the_agents_step_renews_a_running_jobs_token_at_two_thirds_of_its_life(
    tmp_path: Path, fake_google: str
) -> None:
    """Over a real API: the step that starts the job hands it a token; a step before 2/3 of
    the token's life leaves it; the first step after writes a new one (tokens of 3 s here)."""
    from autoscaler.controller.agent import AgentRunner
    from autoscaler.controller.api import ApiClient, generate_tokens, make_app, serve
    from autoscaler.controller.jobbook import JobSubmission
    from autoscaler.controller.lifecycle import InstanceStatus
    from autoscaler.controller.store import JobStatus, Store
    from coadapt_common.clock import FakeClock

    _FakeGoogle.lifetime_s = 3
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "c1", clock)
    row = store.add_instance(
        instance_key="i-1", request_id="c1-i-1", offering_key="local/slot/local-a/on-demand",
        provider="local", instance_type="slot", zone="local-a", market="on-demand",
        gpu_type="T4", gpus=1, price_usd_per_hour=0.1,
    )  # fmt: skip
    row = store.transition("i-1", row.version, InstanceStatus.REQUESTED, reason="launch")
    store.transition(
        "i-1", row.version, InstanceStatus.RUNNING, reason="up", provider_instance_id="p"
    )
    store.add_job("a", JobSubmission("a", 64, 512, 64, command=("x.py",)).to_json())
    store.set_assignments("a", {"i-1": 1})
    store.update_job("a", store.get_job("a").version, status=JobStatus.RUNNING)
    tokens = generate_tokens(tmp_path / "tokens.json")
    app = make_app(
        tmp_path / "store.db",
        tokens,
        clock,
        logs_dir=tmp_path / "logs",
        on_job_exit=lambda name, *, failed: JobStatus.FAILED,  # the job never ends on its own
    )
    server = serve(app)
    broker = GcpJobCredentials(
        "gs://b/c", metadata_url=fake_google, sts_url=f"{fake_google}/v1/token"
    )
    sup = Supervisor(f"agent-{uuid.uuid4().hex[:8]}", tmp_path / "agent", stop_grace_s=1.0,
                     storage=broker, argv_for=_sleeper)  # fmt: skip
    runner = AgentRunner(
        ApiClient(server.url, tokens.agent_credential("i-1"), timeout_s=10),
        "i-1",
        sup,
        address="127.0.0.1",
    )
    try:
        assert [(x.kind.value, x.job) for x in runner.step()] == [("start", "a")]
        started = time.time()
        token_file, _ = sup.storage_paths("a")
        assert token_file.read_text() == "ya29.down-1\n"
        runner.step()
        if time.time() - started < 1.5:  # well before 2 s (a loaded machine may be late)
            assert token_file.read_text() == "ya29.down-1\n"
        time.sleep(max(0.0, started + 2.2 - time.time()))
        runner.step()
        assert token_file.read_text() == f"ya29.down-{len(_FakeGoogle.exchanges)}\n"
        assert len(_FakeGoogle.exchanges) >= 2
    finally:
        runner.close()
        server.shutdown()
        app.close()
