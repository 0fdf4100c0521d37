"""A controller on a cloud: the deployment's provider config, ``coadapt up --provider aws`` on
a moto server (the users' token published to SSM, each node's own credential in its own
tagged parameter, nodes launched from the deployment's template and released at down), the GCP
publication of the users' token over real HTTP, and the nodes' side."""

from __future__ import annotations

import base64
import json
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

from autoscaler.controller.api import ApiClient
from autoscaler.controller.cloud_setup import (
    INSTANCE_ARN_TAG,
    AwsAgentCredentials,
    CredentialPublishError,
    gcp_startup_script,
    load_provider_config,
    publish_user_token,
)
from autoscaler.controller.credentials import (
    ApiCredentials,
    TokenFileError,
    generate_tokens,
    load_token,
    load_tokens,
    rotate_agent_key,
)
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.loop import instance_key_from_request_id, launch_request_id
from autoscaler.controller.service import UpConfig, run_up
from autoscaler.controller.store import InstanceRow
from autoscaler.errors import InvalidInputError
from providers.base import Market
from providers.tags import CLUSTER_ID_TAG, REQUEST_ID_TAG

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


# ------------------------------------------------------------------------- the config file


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "no provider config"),
        ("{not json", "not JSON"),
        ([1, 2], "a JSON object"),
        ({"kind": "azure"}, "kind must be one of aws, gcp"),
        (
            {"kind": "aws", "region": "us-east-1"},
            "lacks launch_template_id, agent_credential_path, instance_arn_prefix",
        ),
        ({"kind": "gcp", "project": "p-12345"}, "lacks zones, image, controller_url"),
    ],
)
def test_a_bad_provider_config_is_refused_naming_the_file(
    tmp_path: Path, content: Any, says: str
) -> None:
    path = tmp_path / "provider.json"
    if content is not None:
        _write(path, content)
    with pytest.raises(InvalidInputError) as e:
        load_provider_config(path)
    assert str(path) in str(e.value) and says in str(e.value)


def test_up_refuses_a_config_of_the_other_cloud(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "provider.json",
        {"kind": "aws", "region": "us-east-1", "launch_template_id": "lt-1",
         "agent_credential_path": "/p", "instance_arn_prefix": "arn:aws:ec2:r:1:instance/"},
    )  # fmt: skip
    cfg = UpConfig(tmp_path / "state", provider="gcp", provider_config=path)
    with pytest.raises(InvalidInputError, match="is a aws config, not gcp"):
        run_up(cfg, threading.Event())
    assert not (tmp_path / "state").exists()  # refused before anything was created


# ---------------------------------------------------------------------------- the nodes' side


def test_a_node_finds_its_instance_key_in_its_request_id_tag() -> None:
    assert instance_key_from_request_id("c1", launch_request_id("c1", "i-0123")) == "i-0123"
    for bad in ("c2-i-0123", "c1-", "c1i-0123"):
        with pytest.raises(ValueError, match="not one of cluster"):
            instance_key_from_request_id("c1", bad)


def test_a_node_token_file_holds_only_the_agent_token(tmp_path: Path) -> None:
    path = tmp_path / "agent-token.json"
    path.write_text(json.dumps({"agent": "a" * 40}))
    path.chmod(0o600)
    assert load_token(path, "agent") == "a" * 40
    path.chmod(0o644)
    with pytest.raises(TokenFileError, match="chmod 600"):
        load_token(path, "agent")
    path.chmod(0o600)
    path.write_text(json.dumps({"agent": "short"}))
    with pytest.raises(TokenFileError, match="holds no agent token"):
        load_token(path, "agent")


def test_the_gcp_startup_script_carries_its_nodes_own_credential_only(tmp_path: Path) -> None:
    """The script is valid bash; it writes this node's credential (good for its instance
    only) to the token file when the file is missing, and carries no other secret: not the
    users' token, not another node's credential, not the agent key."""
    config = load_provider_config(
        _write(
            tmp_path / "provider.json",
            {"kind": "gcp", "project": "proj-12345", "zones": ["us-central1-a"],
             "image": "img", "user_token_secret": "coadapt-c1-user-token",
             "controller_url": "http://10.0.0.2:8080", "checkpoint_root": "gs://b/checkpoints",
             "coadapt_pip_spec": "coadapt==0.1"},
        )
    )  # fmt: skip
    creds = generate_tokens(tmp_path / "tokens.json")
    own = creds.agent_credential("i-abc")
    script = gcp_startup_script(
        config, instance_key="i-abc", api_url="http://10.0.0.2:8080", credential=own
    )
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    assert "--instance-key i-abc" in script and "--checkpoint-root gs://b/checkpoints" in script
    assert (
        "--notice-source gcp" in script and "--token-file /etc/coadapt/agent-token.json" in script
    )
    assert "--isolate-jobs" in script  # a job cannot read the node's credential (root's, 0600)
    assert "coadapt==0.1" in script and "umask 077" in script
    assert json.dumps({"agent": own}) in script
    assert creds.user not in script and creds.agent_credential("i-other") not in script
    assert "secretmanager" not in script and "agent_key" not in script
    # Run the part that keeps the credential, with the file under a temporary root: written
    # when missing (0600 under the umask), never overwritten (a renewed credential stays).
    lines = script.splitlines()
    keep = lines[lines.index("if [ ! -s /etc/coadapt/agent-token.json ]; then") :]
    keep = keep[: keep.index("fi") + 1]
    target = tmp_path / "agent-token.json"
    part = "umask 077\n" + "\n".join(keep).replace("/etc/coadapt/agent-token.json", str(target))
    subprocess.run(["bash", "-c", part], check=True)
    assert load_token(target, "agent") == own and target.stat().st_mode & 0o777 == 0o600
    target.write_text(json.dumps({"agent": "renewed-" + "x" * 40}))
    subprocess.run(["bash", "-c", part], check=True)
    assert load_token(target, "agent") == "renewed-" + "x" * 40


# ----------------------------------------------------------------- GCP: the token, over HTTP


class _FakeGoogle(BaseHTTPRequestHandler):
    """The metadata server's token endpoint and Secret Manager's addVersion."""

    seen: ClassVar[list[tuple[str, str, dict[str, str], bytes]]] = []
    redirect: ClassVar[bool] = False  # answer addVersion with a 302 to /elsewhere

    def do_GET(self) -> None:
        self._record(b"")
        if self.headers.get("Metadata-Flavor") != "Google":
            self._answer(403, {})
        else:
            self._answer(200, {"access_token": "ya29.vm-token", "expires_in": 3599})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._record(body)
        if self.redirect and self.path != "/elsewhere":
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        ok = self.headers.get("Authorization") == "Bearer ya29.vm-token"
        self._answer(200 if ok else 401, {"name": self.path})

    def _record(self, body: bytes) -> None:
        self.seen.append((self.command, self.path, dict(self.headers), body))

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_google() -> Iterator[str]:
    _FakeGoogle.seen = []
    _FakeGoogle.redirect = False
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeGoogle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_gcp_publishes_only_the_users_token_as_a_secret_version(
    tmp_path: Path, fake_google: str
) -> None:
    config = load_provider_config(
        _write(
            tmp_path / "provider.json",
            {"kind": "gcp", "project": "proj-12345", "zones": ["us-central1-a"], "image": "i",
             "user_token_secret": "coadapt-c1-user-token", "controller_url": "http://c:1"},
        )
    )  # fmt: skip
    publish_user_token(
        config, "u" * 43, endpoint_url=f"{fake_google}/v1", metadata_url=f"{fake_google}/md"
    )
    (get, user) = _FakeGoogle.seen
    assert get[1] == "/md/computeMetadata/v1/instance/service-accounts/default/token"
    assert user[1] == "/v1/projects/proj-12345/secrets/coadapt-c1-user-token:addVersion"
    assert base64.b64decode(json.loads(user[3])["payload"]["data"]) == b"u" * 43
    # A redirect is not followed: the VM's bearer token goes nowhere else.
    _FakeGoogle.seen, _FakeGoogle.redirect = [], True
    with pytest.raises(CredentialPublishError, match="302"):
        publish_user_token(
            config, "u" * 43, endpoint_url=f"{fake_google}/v1", metadata_url=f"{fake_google}/md"
        )
    assert [seen[1] for seen in _FakeGoogle.seen if seen[0] == "POST"] == [user[1]]


# ------------------------------------------------------------------- AWS: up on moto, for real


def _fake_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    }.items():  # fmt: skip
        monkeypatch.setenv(key, value)


@pytest.mark.slow
def test_up_on_aws_publishes_the_credentials_launches_from_the_template_and_releases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emulators.aws_moto import (
        TEST_GPU_TYPES,
        admin_client,
        create_interruption_queue,
        default_network,
        delete_interruption_queue,
        shared_moto_server,
    )

    _fake_aws_credentials(monkeypatch)
    moto = shared_moto_server()
    cluster = f"cloud-{uuid.uuid4().hex[:8]}"
    ec2 = admin_client(moto.url, "ec2")
    image_id, subnets = default_network(moto.url)
    template_id = ec2.create_launch_template(
        LaunchTemplateName=f"{cluster}-nodes",
        LaunchTemplateData={"ImageId": image_id, "MetadataOptions": {"HttpTokens": "required"}},
    )["LaunchTemplate"]["LaunchTemplateId"]
    queue_url, rule = create_interruption_queue(moto.url)
    agents_path = f"/coadapt/{cluster}/agents"
    user_parameter = f"/coadapt/{cluster}/user-token"
    arn_prefix = "arn:aws:ec2:us-east-1:123456789012:instance/"
    ssm = admin_client(moto.url, "ssm")
    ssm.put_parameter(Name=user_parameter, Value="placeholder", Type="SecureString")
    # What a node that ended while no controller ran left behind: withdrawn at start.
    ssm.put_parameter(Name=f"{agents_path}/i-gone", Value="x" * 40, Type="SecureString")
    provider_json = _write(
        tmp_path / "provider.json",
        {"kind": "aws", "region": "us-east-1", "launch_template_id": template_id,
         "subnets_by_zone": subnets, "security_group_ids": [],
         "instance_types": list(TEST_GPU_TYPES), "interruption_queue_url": queue_url,
         "checkpoint_root": "s3://bucket/checkpoints", "agent_credential_path": agents_path,
         "instance_arn_prefix": arn_prefix, "user_token_parameter": user_parameter},
    )  # fmt: skip

    def credentials_published() -> dict[str, tuple[str, dict[str, str]]]:
        """Each credential parameter under the path: its value and its tags, by key."""
        out = {}
        for page in ssm.get_paginator("get_parameters_by_path").paginate(
            Path=agents_path, WithDecryption=True
        ):
            for param in page["Parameters"]:
                out[param["Name"].rsplit("/", 1)[1]] = (param["Value"], _tags(ssm, param["Name"]))
        return out

    state = tmp_path / "state"
    cfg = UpConfig(
        state, cluster_id=cluster, interval_s=0.2, max_instances=2, provider="aws",
        provider_config=provider_json, endpoint_url=moto.url,
    )  # fmt: skip
    stop = threading.Event()
    ready = threading.Event()
    result: dict[str, Any] = {}

    def serve() -> None:
        result["down"] = run_up(cfg, stop, on_ready=lambda url: ready.set())

    thread = threading.Thread(target=serve)
    thread.start()

    def ours() -> list[dict[str, Any]]:
        found = ec2.describe_instances(
            Filters=[
                {"Name": f"tag:{CLUSTER_ID_TAG}", "Values": [cluster]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )["Reservations"]
        return [i for r in found for i in r["Instances"]]

    try:
        assert ready.wait(60)
        tokens = load_tokens(state / "tokens.json")
        user = ssm.get_parameter(Name=user_parameter, WithDecryption=True)["Parameter"]
        assert user["Value"] == tokens.user and user["Type"] == "SecureString"
        url = json.loads((state / "up.json").read_text())["url"]
        ApiClient(url, tokens.user, timeout_s=10).submit_job(
            JobSubmission("resnet", 128, 1024, 128, 32, command=("train.py",))
        )
        deadline = time.monotonic() + 60
        while not ours() and time.monotonic() < deadline:
            time.sleep(0.2)
        launched = ours()
        assert launched, "the controller launched nothing for a queued job"
        keys = {r.instance_key for r in ApiClient(url, tokens.user).list_instances()}
        deadline = time.monotonic() + 30  # published after the round that saw the instance
        while len(credentials_published()) < len(launched) and time.monotonic() < deadline:
            time.sleep(0.2)
        published = credentials_published()
        assert "i-gone" not in published
        for instance in launched:
            tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
            # What a node's user data does with its own tag: find its row, and its own
            # credential, tagged with its own ARN (what the nodes' role is conditioned on).
            key = instance_key_from_request_id(cluster, tags[REQUEST_ID_TAG])
            assert key in keys
            value, param_tags = published[key]
            assert value == tokens.agent_credential(key)
            assert param_tags == {INSTANCE_ARN_TAG: arn_prefix + instance["InstanceId"]}
            assert tokens.user not in value
        # coadapt destroy's first step: release through the controller, which then holds
        # nothing, across rounds, though the job still waits.
        client = ApiClient(url, tokens.user, timeout_s=10)
        assert client.release_fleet() > 0
        deadline = time.monotonic() + 60
        while (ours() or any(r.status != "terminated" for r in client.list_instances())) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.2)
        time.sleep(1.0)  # five more rounds
        assert ours() == []
        assert {r.status for r in client.list_instances()} == {"terminated"}
        job = client.get_job("resnet")  # it waits (still submitted), placed nowhere
        assert job.status in ("queued", "running") and dict(job.assignment) == {}
        listing = client.fleet()["release_listing"]  # what coadapt destroy waits for
        assert listing["instances"] == [] and listing["error"] is None
        assert credentials_published() == {}  # the nodes are gone: so are their credentials
    finally:
        stop.set()
        thread.join(120)
        delete_interruption_queue(moto.url, queue_url, rule)
    # Stopped after the release: it kept (and had) nothing; only coadapt down releases.
    assert not result["down"].released and result["down"].remaining == ()
    assert ours() == []
    assert not (state / "up.json").exists()


def _tags(ssm: Any, name: str) -> dict[str, str]:
    listed = ssm.list_tags_for_resource(ResourceType="Parameter", ResourceId=name)["TagList"]
    return {t["Key"]: t["Value"] for t in listed}


def _row(key: str, cloud_id: str | None, status: InstanceStatus) -> InstanceRow:
    return InstanceRow(
        key, f"c-{key}", "aws/g4dn.xlarge/us-east-1a/spot", "aws", "g4dn.xlarge", "us-east-1a",
        Market.SPOT, "T4", 1, 0.2, cloud_id, status, 0, None, 0.0, 0.0, 1,
    )  # fmt: skip


@pytest.mark.slow
def test_aws_node_credentials_make_exactly_the_declared_calls_and_follow_a_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each node whose instance the cloud listed gets its own credential, tagged with its own
    ARN, once; a rotation of the agent key writes them again (tag kept); a node that is gone
    loses its parameter, and what no controller withdrew is withdrawn at the first sync. The
    SSM operations made are exactly the declared service actions (the controller's policy)."""
    from emulators.aws_moto import OperationLog, admin_client, shared_moto_server
    from providers.aws.permissions import CONTROLLER_SERVICE_ACTIONS, iam_action

    _fake_aws_credentials(monkeypatch)
    moto = shared_moto_server()
    path = f"/coadapt/creds-{uuid.uuid4().hex[:8]}/agents"
    prefix = "arn:aws:ec2:us-east-1:123456789012:instance/"
    config = load_provider_config(
        _write(
            tmp_path / "provider.json",
            {"kind": "aws", "region": "us-east-1", "launch_template_id": "lt-1",
             "agent_credential_path": path, "instance_arn_prefix": prefix},
        )
    )  # fmt: skip
    ssm = admin_client(moto.url, "ssm")
    ssm.put_parameter(Name=f"{path}/i-gone", Value="x" * 40, Type="SecureString")
    tokens = tmp_path / "tokens.json"
    first = generate_tokens(tokens)
    log = OperationLog()
    published = AwsAgentCredentials(config, endpoint_url=moto.url)
    log.watch(published)  # type: ignore[arg-type]  # anything with clients()
    rows = [
        _row("i-a", "i-0a", InstanceStatus.RUNNING),
        _row("i-b", "i-0b", InstanceStatus.DRAINING),
        _row("i-c", None, InstanceStatus.REQUESTED),  # not listed yet: no instance ARN
        _row("i-d", "i-0d", InstanceStatus.TERMINATED),
    ]

    def values() -> dict[str, str]:
        listed = ssm.get_parameters_by_path(Path=path, WithDecryption=True)["Parameters"]
        return {p["Name"].rsplit("/", 1)[1]: p["Value"] for p in listed}

    published.sync(rows, first)
    assert values() == {k: first.agent_credential(k) for k in ("i-a", "i-b")}
    assert _tags(ssm, f"{path}/i-a") == {INSTANCE_ARN_TAG: prefix + "i-0a"}
    assert _tags(ssm, f"{path}/i-b") == {INSTANCE_ARN_TAG: prefix + "i-0b"}
    made = set(log.take())
    published.sync(rows, first)
    assert log.take() == set()  # published once per credential: nothing to do
    second = rotate_agent_key(tokens, now_s=time.time())
    published.sync(rows, second)
    assert values() == {k: second.agent_credential(k) for k in ("i-a", "i-b")}
    assert _tags(ssm, f"{path}/i-a") == {INSTANCE_ARN_TAG: prefix + "i-0a"}
    rows[0] = _row("i-a", "i-0a", InstanceStatus.TERMINATED)
    published.sync(rows, second)
    assert set(values()) == {"i-b"}
    made |= log.take()
    assert {iam_action(service, op) for service, op in made} == set(CONTROLLER_SERVICE_ACTIONS)
    assert isinstance(second, ApiCredentials) and second.user == first.user


def test_a_stale_up_file_is_told_from_a_live_one(tmp_path: Path) -> None:
    import os

    from autoscaler.controller.service import UpRecord, up_is_stale
    from coadapt_common.procfs import process_start_time, read_proc_strings

    def record(pid: int, started: str | None, cmdline: list[str]) -> dict[str, object]:
        return {"url": "http://127.0.0.1:9", "pid": pid, "started": started, "cmdline": cmdline}

    me = os.getpid()
    mine = [p.decode() for p in read_proc_strings(me, "cmdline")]
    up = tmp_path / "up.json"
    up.write_text(json.dumps(record(me, process_start_time(me), mine)))
    assert not up_is_stale(up)  # this very process
    gone = subprocess.Popen(["true"])
    gone.wait()
    up.write_text(json.dumps(record(gone.pid, "1", ["true"])))
    assert up_is_stale(up)  # a reboot or a kill -9 left it
    up.write_text(json.dumps(record(me, "0", mine)))
    assert up_is_stale(up)  # a recycled pid
    up.write_text(json.dumps(record(me, process_start_time(me), ["coadapt", "up"])))
    assert not up_is_stale(up)  # it runs, as another program: not ours, and not gone either
    up.write_text("{damaged")
    assert not up_is_stale(up)  # not judged: up refuses and says where
    up.write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": me}))
    assert not up_is_stale(up) and UpRecord.read(up) is None  # not a whole record


@pytest.mark.slow
def test_up_and_down_judge_an_up_file_by_one_check(tmp_path: Path) -> None:
    """``coadapt up`` (taking over a stale record) and ``coadapt down`` (stopping the recorded
    process, and waiting for it to go) ask the one :meth:`UpRecord.process`: pid, start time
    and command line together. Each record is judged the same by both: ``up`` takes over
    exactly the records ``down`` calls gone, and ``down`` stops only a process it calls ours."""
    from autoscaler.controller.service import UpProcess, UpRecord, up_is_stale
    from coadapt_common.procfs import process_start_time, read_proc_strings

    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        pid = sleeper.pid
        started = process_start_time(pid)
        assert started is not None
        cmdline = [p.decode() for p in read_proc_strings(pid, "cmdline")]
        cases = {
            UpProcess.OURS: (pid, started, cmdline),
            UpProcess.GONE: (pid, "1", cmdline),  # a recycled pid
            UpProcess.OTHER: (pid, started, ["coadapt", "up"]),  # crafted: another program
        }
        state = tmp_path / "state"
        state.mkdir()
        generate_tokens(state / "tokens.json")
        up = state / "up.json"
        for want, (p, s, c) in cases.items():
            up.write_text(
                json.dumps({"url": "http://127.0.0.1:9", "pid": p, "started": s, "cmdline": c})
            )
            got = UpRecord.read(up)
            assert got is not None and got.process() is want
            assert up_is_stale(up) is (want is UpProcess.GONE)
            down = subprocess.run(
                [sys.executable, "-m", "autoscaler.cli", "down", "--state-dir", str(state),
                 "--timeout-s", "1"],
                capture_output=True, text=True, check=False, cwd=ROOT,
            )  # fmt: skip
            assert down.returncode == 1, down.stderr
            if want is UpProcess.GONE:  # down goes on without up: here no store, nothing to do
                assert "no store.db there" in down.stderr
                assert "nothing was stopped or released" in down.stderr
            elif want is UpProcess.OTHER:
                assert "not the coadapt up that wrote it" in down.stderr
            else:  # ours by the check: down went on to ask its API (nobody listens there)
                assert "could not ask coadapt up" in down.stderr
            assert sleeper.poll() is None  # never signalled
    finally:
        sleeper.kill()
        sleeper.wait()
    assert UpRecord.read(tmp_path / "missing.json") is None
