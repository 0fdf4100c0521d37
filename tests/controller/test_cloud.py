"""A controller on a cloud: the deployment's provider config, ``coadapt up --provider aws`` on
a moto server (token published to SSM, nodes launched from the deployment's template and
released at down), the GCP token publication over real HTTP, and the nodes' side."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from autoscaler.controller.api import (
    ApiClient,
    ApiTokens,
    TokenFileError,
    load_token,
    load_tokens,
)
from autoscaler.controller.cloud import (
    gcp_startup_script,
    load_cloud_config,
    publish_tokens,
)
from autoscaler.controller.jobs import JobSubmission
from autoscaler.controller.loop import instance_key_from_request_id, launch_request_id
from autoscaler.controller.service import UpConfig, run_up
from autoscaler.errors import InvalidInputError
from providers.tags import CLUSTER_ID_TAG, REQUEST_ID_TAG


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
        ({"kind": "aws", "region": "us-east-1"}, "lacks launch_template_id, agent_token_parameter"),
        ({"kind": "gcp", "project": "p-12345"}, "lacks zones, image, agent_token_secret"),
    ],
)
def test_a_bad_provider_config_is_refused_naming_the_file(
    tmp_path: Path, content: Any, says: str
) -> None:
    path = tmp_path / "provider.json"
    if content is not None:
        _write(path, content)
    with pytest.raises(InvalidInputError) as e:
        load_cloud_config(path)
    assert str(path) in str(e.value) and says in str(e.value)


def test_up_refuses_a_config_of_the_other_cloud(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "provider.json",
        {"kind": "aws", "region": "us-east-1", "launch_template_id": "lt-1",
         "agent_token_parameter": "/p"},
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
    with pytest.raises(TokenFileError, match="no agent token"):
        load_token(path, "agent")


def test_the_gcp_startup_script_is_valid_bash_and_carries_no_secret(tmp_path: Path) -> None:
    config = load_cloud_config(
        _write(
            tmp_path / "provider.json",
            {"kind": "gcp", "project": "proj-12345", "zones": ["us-central1-a"],
             "image": "img", "agent_token_secret": "coadapt-c1-agent-token",
             "controller_url": "http://10.0.0.2:8080", "checkpoint_root": "gs://b/checkpoints",
             "coadapt_pip_spec": "coadapt==0.1"},
        )
    )  # fmt: skip
    script = gcp_startup_script(config, instance_key="i-abc", api_url="http://10.0.0.2:8080")
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    assert "--instance-key i-abc" in script and "--checkpoint-root gs://b/checkpoints" in script
    assert "--notice-source gcp" in script
    assert "secrets/coadapt-c1-agent-token/versions/latest:access" in script
    assert "coadapt==0.1" in script and "umask 077" in script


# ----------------------------------------------------------------- GCP: the token, over HTTP


class _FakeGoogle(BaseHTTPRequestHandler):
    """The metadata server's token endpoint and Secret Manager's addVersion."""

    seen: ClassVar[list[tuple[str, str, dict[str, str], bytes]]] = []

    def do_GET(self) -> None:
        self._record(b"")
        if self.headers.get("Metadata-Flavor") != "Google":
            self._answer(403, {})
        else:
            self._answer(200, {"access_token": "ya29.vm-token", "expires_in": 3599})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._record(body)
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
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeGoogle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_gcp_publishes_the_token_as_a_secret_version(tmp_path: Path, fake_google: str) -> None:
    config = load_cloud_config(
        _write(
            tmp_path / "provider.json",
            {"kind": "gcp", "project": "proj-12345", "zones": ["us-central1-a"], "image": "i",
             "agent_token_secret": "coadapt-c1-agent-token",
             "user_token_secret": "coadapt-c1-user-token", "controller_url": "http://c:1"},
        )
    )  # fmt: skip
    publish_tokens(
        config,
        ApiTokens(user="u" * 43, agent="a" * 43),
        endpoint_url=f"{fake_google}/v1",
        metadata_url=f"{fake_google}/md",
    )
    (get, agent, user) = _FakeGoogle.seen
    assert get[1] == "/md/computeMetadata/v1/instance/service-accounts/default/token"
    assert agent[1] == "/v1/projects/proj-12345/secrets/coadapt-c1-agent-token:addVersion"
    assert base64.b64decode(json.loads(agent[3])["payload"]["data"]) == b"a" * 43
    assert user[1] == "/v1/projects/proj-12345/secrets/coadapt-c1-user-token:addVersion"
    assert base64.b64decode(json.loads(user[3])["payload"]["data"]) == b"u" * 43


# ------------------------------------------------------------------- AWS: up on moto, for real


def test_up_on_aws_publishes_the_token_launches_from_the_template_and_releases(
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

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    }.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    moto = shared_moto_server()
    cluster = f"cloud-{uuid.uuid4().hex[:8]}"
    ec2 = admin_client(moto.url, "ec2")
    image_id, subnets = default_network(moto.url)
    template_id = ec2.create_launch_template(
        LaunchTemplateName=f"{cluster}-nodes",
        LaunchTemplateData={"ImageId": image_id, "MetadataOptions": {"HttpTokens": "required"}},
    )["LaunchTemplate"]["LaunchTemplateId"]
    queue_url, rule = create_interruption_queue(moto.url)
    parameter = f"/coadapt/{cluster}/agent-token"
    user_parameter = f"/coadapt/{cluster}/user-token"
    ssm = admin_client(moto.url, "ssm")
    for name in (parameter, user_parameter):
        ssm.put_parameter(Name=name, Value="placeholder", Type="SecureString")
    provider_json = _write(
        tmp_path / "provider.json",
        {"kind": "aws", "region": "us-east-1", "launch_template_id": template_id,
         "subnets_by_zone": subnets, "security_group_ids": [],
         "instance_types": list(TEST_GPU_TYPES), "interruption_queue_url": queue_url,
         "checkpoint_root": "s3://bucket/checkpoints", "agent_token_parameter": parameter,
         "user_token_parameter": user_parameter},
    )  # fmt: skip
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
        published = ssm.get_parameter(Name=parameter, WithDecryption=True)["Parameter"]
        assert published["Value"] == tokens.agent and published["Type"] == "SecureString"
        user = ssm.get_parameter(Name=user_parameter, WithDecryption=True)["Parameter"]
        assert user["Value"] == tokens.user
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
        for instance in launched:
            tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
            # What a node's user data does with its own tag: find its row.
            assert instance_key_from_request_id(cluster, tags[REQUEST_ID_TAG]) in keys
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
    finally:
        stop.set()
        thread.join(120)
        delete_interruption_queue(moto.url, queue_url, rule)
    # Stopped after the release: it kept (and had) nothing; only coadapt down releases.
    assert not result["down"].released and result["down"].remaining == ()
    assert ours() == []
    assert not (state / "up.json").exists()


def test_a_stale_up_file_is_told_from_a_live_one(tmp_path: Path) -> None:
    import os

    from autoscaler.controller.service import up_is_stale
    from coadapt_common.procfs import process_start_time

    up = tmp_path / "up.json"
    up.write_text(json.dumps({"url": "u", "pid": os.getpid(),
                              "started": process_start_time(os.getpid())}))  # fmt: skip
    assert not up_is_stale(up)  # this very process
    gone = subprocess.Popen(["true"])
    gone.wait()
    up.write_text(json.dumps({"url": "u", "pid": gone.pid}))
    assert up_is_stale(up)  # a reboot or a kill -9 left it
    up.write_text(json.dumps({"url": "u", "pid": os.getpid(), "started": "0"}))
    assert up_is_stale(up)  # a recycled pid
    up.write_text("{damaged")
    assert not up_is_stale(up)  # not judged: up refuses and says where
