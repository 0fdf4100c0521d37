"""``coadapt deploy`` / ``coadapt destroy`` with no terraform, with a fake terraform executable
on PATH (a script that records its calls and answers ``output -json``), and against a real
controller API."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autoscaler.cli.main import app
from autoscaler.controller.api import generate_tokens, make_app, serve
from autoscaler.controller.deploy import OUTPUTS, load_deployment, render_root
from autoscaler.controller.store import Store
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import FakeClock
from providers.base import Market

ROOT = Path(__file__).resolve().parents[2]

FAKE_TERRAFORM = """#!{python}
import json, os, sys
log = os.environ["FAKE_TF_LOG"]
with open(log, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd()}}) + "\\n")
if sys.argv[1] == os.environ.get("FAKE_TF_FAIL"):
    print("Error: the fake says no", file=sys.stderr)
    sys.exit(1)
if sys.argv[1] == "plan":
    assert os.path.exists("main.tf.json"), "no root module"
if sys.argv[1:] == ["output", "-json"]:
    root = json.load(open("main.tf.json"))
    module = root["module"]["coadapt"]
    values = {{name: "out-" + name for name in root["output"]}}
    values["cluster_id"] = module["cluster_id"]
    values["controller_url"] = os.environ.get("FAKE_TF_URL", "http://10.0.0.5:8080")
    values["region"] = module.get("region", "us-east-1")
    print(json.dumps({{k: {{"value": v, "type": "string", "sensitive": False}}
                      for k, v in values.items()}}))
"""


@pytest.fixture
def module(tmp_path: Path) -> Path:
    """A small stand-in for terraform/aws: what render_root reads is the variables."""
    m = tmp_path / "module"
    m.mkdir()
    (m / "variables.tf").write_text(
        'variable "cluster_id" {\n  type = string\n  description = "id"\n}\n'
        'variable "region" {\n  type = string\n  description = "r"\n  default = "us-east-1"\n}\n'
        'variable "node_ami_id" {\n  type = string\n  description = "ami"\n}\n'
        'variable "max_instances" {\n  type = number\n  description = "n"\n  default = 8\n}\n'
    )
    return m


@pytest.fixture
def fake_terraform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tf = bin_dir / "terraform"
    tf.write_text(FAKE_TERRAFORM.format(python=sys.executable))
    tf.chmod(tf.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "tf.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("FAKE_TF_LOG", str(log))
    return log


@pytest.fixture
def no_terraform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line)["argv"] for line in log.read_text().splitlines()]


def _deploy(state: Path, module: Path, *extra: str) -> Any:
    return CliRunner().invoke(
        app,
        ["deploy", "aws", "--state-dir", str(state), "--module-dir", str(module),
         "--var", "cluster_id=c1", "--var", "node_ami_id=ami-123", *extra],
    )  # fmt: skip


def test_without_terraform_it_writes_the_root_and_prints_the_commands(
    tmp_path: Path, module: Path, no_terraform: None
) -> None:
    result = _deploy(tmp_path / "state", module, "--var", "max_instances=16")
    assert result.exit_code == 3, result.output
    assert "no terraform (or tofu) on PATH" in result.output
    assert "terraform init -input=false" in result.output
    assert "terraform apply -input=false coadapt.tfplan" in result.output
    root = json.loads((tmp_path / "state/deploy/aws/main.tf.json").read_text())
    assert root["module"]["coadapt"] == {
        "source": str(module.resolve()), "cluster_id": "c1", "node_ami_id": "ami-123",
        "max_instances": 16,
    }  # fmt: skip
    assert root["provider"] == {"aws": {}}  # region not given: the module's default
    assert load_deployment(tmp_path / "state").outputs == {}


def test_with_terraform_it_applies_and_records_the_outputs(
    tmp_path: Path, module: Path, fake_terraform: Path
) -> None:
    var_file = tmp_path / "vars.json"
    var_file.write_text(json.dumps({"region": "eu-west-1", "max_instances": 4}))
    result = _deploy(tmp_path / "state", module, "--var-file", str(var_file))
    assert result.exit_code == 0, result.output
    calls = _calls(fake_terraform)
    assert calls == [
        ["init", "-input=false"],
        ["plan", "-input=false", "-out=coadapt.tfplan"],
        ["apply", "-input=false", "coadapt.tfplan"],
        ["output", "-json"],
    ]
    record = load_deployment(tmp_path / "state")
    assert record.variables == {
        "region": "eu-west-1", "max_instances": 4, "cluster_id": "c1", "node_ami_id": "ami-123"
    }  # fmt: skip
    assert set(record.outputs) >= set(OUTPUTS["aws"]) and record.outputs["cluster_id"] == "c1"
    root = json.loads((record.workdir / "main.tf.json").read_text())
    assert root["provider"] == {"aws": {"region": "eu-west-1"}}
    assert "controller at http://10.0.0.5:8080" in result.output


def test_a_failed_step_records_nothing(
    tmp_path: Path, module: Path, fake_terraform: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TF_FAIL", "apply")
    result = _deploy(tmp_path / "state", module)
    assert result.exit_code == 1
    assert "terraform apply -input=false coadapt.tfplan` failed (exit 1)" in result.output
    assert load_deployment(tmp_path / "state").outputs == {}


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--var", "regoin=us-east-1"], "has no variable regoin"),
        (["--var", "bad"], "use NAME=VALUE"),
    ],
)
def test_bad_variables_are_refused_before_terraform_runs(
    tmp_path: Path, module: Path, fake_terraform: Path, extra: list[str], says: str
) -> None:
    result = _deploy(tmp_path / "state", module, *extra)
    assert result.exit_code == 2 and says in result.output
    assert not fake_terraform.exists()


def test_a_missing_required_variable_is_named(module: Path) -> None:
    with pytest.raises(InvalidInputError, match="needs node_ami_id"):
        render_root("aws", module, {"cluster_id": "c1"})


def test_outputs_from_a_manual_run_are_recorded(
    tmp_path: Path, module: Path, no_terraform: None
) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({n: {"value": f"v-{n}"} for n in OUTPUTS["aws"]}))
    result = _deploy(tmp_path / "state", module, "--outputs-file", str(outputs))
    assert result.exit_code == 0, result.output
    assert load_deployment(tmp_path / "state").outputs["controller_url"] == "v-controller_url"
    outputs.write_text(json.dumps({"cluster_id": {"value": "c1"}}))
    result = _deploy(tmp_path / "state", module, "--outputs-file", str(outputs))
    assert result.exit_code == 2 and "no output region" in result.output


# ----------------------------------------------------------------------------------- destroy


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[str, Store]]:
    """A real controller API over a store (no service loop: the test plays the rounds)."""
    clock = FakeClock(start_s=1_700_000_000.0)
    store_path = tmp_path / "controller" / "store.db"
    store_path.parent.mkdir()
    Store.create(store_path, "c1", clock).close()
    tokens = generate_tokens(tmp_path / "controller" / "tokens.json")
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "tokens.json").write_bytes(
        (tmp_path / "controller/tokens.json").read_bytes()
    )
    (tmp_path / "state" / "tokens.json").chmod(0o600)

    def no_exits(name: str, *, failed: bool) -> Any:
        raise AssertionError("no job exits here")

    application = make_app(
        store_path, tokens, clock, logs_dir=tmp_path / "logs", on_job_exit=no_exits
    )
    server = serve(application, "127.0.0.1", 0)
    with Store.open(store_path, clock) as store:
        yield server.url, store
    server.shutdown()
    application.close()


def _deployed(state: Path, module: Path, url: str) -> None:
    outputs = {n: f"v-{n}" for n in OUTPUTS["aws"]} | {"controller_url": url}
    (state / "deploy" / "aws").mkdir(parents=True)
    (state / "deploy.json").write_text(
        json.dumps({"cloud": "aws", "module_dir": str(module), "workdir": str(state / "deploy/aws"),
                    "variables": {"cluster_id": "c1"}, "outputs": outputs})
    )  # fmt: skip


def _destroy(state: Path, *extra: str) -> Any:
    return CliRunner().invoke(
        app, ["destroy", "--state-dir", str(state), "--timeout-s", "1", *extra]
    )


def test_destroy_refuses_while_instances_remain_and_says_which(
    tmp_path: Path, module: Path, controller: tuple[str, Store], fake_terraform: Path
) -> None:
    url, store = controller
    row = store.add_instance(
        instance_key="i-key1", request_id="c1-i-key1", offering_key="o", provider="aws",
        instance_type="g4dn.xlarge", zone="use1-az1", market=Market.SPOT, gpu_type="T4",
        gpus=1, price_usd_per_hour=0.2,
    )  # fmt: skip
    from autoscaler.controller.lifecycle import InstanceStatus

    row = store.transition(row.instance_key, row.version, InstanceStatus.REQUESTED, reason="launch")
    store.transition(
        row.instance_key, row.version, InstanceStatus.RUNNING, reason="up",
        provider_instance_id="i-0stuck",
    )  # fmt: skip
    store.record_release_listing(["i-0stuck"], None)  # a cloud that does not let it go
    state = tmp_path / "state"
    _deployed(state, module, url)
    result = _destroy(state)
    assert result.exit_code == 1, result.output
    assert "refusing to destroy: 1 instance(s) still listed" in result.output
    assert "i-0stuck (i-key1, running)" in result.output
    assert store.released_at_s() is not None  # the release was asked for
    assert not fake_terraform.exists()  # terraform never ran
    # The cloud lets it go: destroy proceeds.
    store.record_release_listing([], None)
    result = _destroy(state)
    assert result.exit_code == 0, result.output
    assert _calls(fake_terraform) == [
        ["init", "-input=false"], ["destroy", "-input=false", "-auto-approve"]
    ]  # fmt: skip
    assert (state / "deploy.destroyed.json").exists() and not (state / "deploy.json").exists()


def test_destroy_waits_for_a_listing_after_the_release(
    tmp_path: Path, module: Path, controller: tuple[str, Store], fake_terraform: Path
) -> None:
    url, _ = controller  # nothing plays the rounds: no listing ever confirms the release
    state = tmp_path / "state"
    _deployed(state, module, url)
    result = _destroy(state)
    assert result.exit_code == 1 and "no confirmed release" in result.output
    assert not fake_terraform.exists()


def test_destroy_refuses_when_the_controller_is_unreachable(
    tmp_path: Path, module: Path, fake_terraform: Path
) -> None:
    state = tmp_path / "state"
    generate_tokens(state / "tokens.json")
    _deployed(state, module, "http://127.0.0.1:9")
    result = _destroy(state)
    assert result.exit_code == 1
    assert "cannot reach the controller at http://127.0.0.1:9" in result.output
    assert not fake_terraform.exists()


def test_destroy_without_a_deployment_says_how_to_make_one(tmp_path: Path) -> None:
    result = _destroy(tmp_path / "nothing")
    assert result.exit_code == 2 and "coadapt deploy aws|gcp" in result.output


@pytest.mark.slow
def test_a_deployed_cluster_is_reached_with_the_token_the_controller_published(
    tmp_path: Path, module: Path, controller: tuple[str, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tokens file yet: the CLI reads the users' token from the deployment's SSM parameter
    (moto here), keeps it 0600, and talks to the controller (its address overridden, as
    through a tunnel)."""
    from autoscaler.controller.api import load_token, load_tokens
    from emulators.aws_moto import admin_client, shared_moto_server

    url, _ = controller
    moto = shared_moto_server()
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_ENDPOINT_URL": moto.url}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    state = tmp_path / "state"
    user_token = load_tokens(state / "tokens.json").user
    (state / "tokens.json").unlink()
    _deployed(state, module, "http://10.9.9.9:8080")  # the VPC address, unreachable here
    record = json.loads((state / "deploy.json").read_text())
    parameter = f"/coadapt/{uuid.uuid4().hex[:8]}/user-token"
    record["outputs"] |= {"region": "us-east-1", "user_token_parameter": parameter}
    (state / "deploy.json").write_text(json.dumps(record))
    admin_client(moto.url, "ssm").put_parameter(
        Name=parameter, Value=user_token, Type="SecureString"
    )
    monkeypatch.setenv("COADAPT_CONTROLLER_URL", url)
    result = CliRunner().invoke(app, ["status", "--json", "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["jobs"] == []
    assert (state / "tokens.json").stat().st_mode & 0o777 == 0o600
    assert load_token(state / "tokens.json", "user") == user_token


@pytest.mark.parametrize(
    ("cloud", "variables"),
    [
        ("aws", {"cluster_id": "c1", "region": "us-east-1", "node_ami_id": "ami-123"}),
        ("gcp", {"cluster_id": "c1", "project": "proj-12345", "region": "us-central1",
                 "zones": ["us-central1-a"], "node_image": "img"}),
    ],
)  # fmt: skip
def test_the_real_modules_render_with_their_required_variables(
    cloud: str, variables: dict[str, Any]
) -> None:
    module = ROOT / "terraform" / cloud
    root = render_root(cloud, module, variables)
    assert set(root["output"]) == set(OUTPUTS[cloud])
    with pytest.raises(InvalidInputError, match="needs"):
        render_root(cloud, module, {"cluster_id": "c1"})


TF_MIRROR = Path("/opt/tf-plugins/registry.terraform.io/hashicorp/aws")


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("terraform") and TF_MIRROR.is_dir()),
    reason="needs a terraform binary and the hashicorp/aws provider in a local mirror",
)
def test_the_rendered_aws_root_validates_with_terraform(tmp_path: Path) -> None:
    """Where terraform and the AWS provider are at hand offline: the root module deploy
    writes, with the real module, passes `terraform validate`."""
    state = tmp_path / "state"
    result = CliRunner().invoke(
        app,
        ["deploy", "aws", "--state-dir", str(state), "--var", "cluster_id=c1",
         "--var", "region=us-east-1", "--var", "node_ami_id=ami-123", "--outputs-file",
         str(tmp_path / "none.json")],
    )  # fmt: skip
    assert result.exit_code == 2  # no outputs file: nothing ran, but the root is written
    workdir = state / "deploy" / "aws"
    rc = tmp_path / "tfrc"
    mirror = TF_MIRROR.parents[2]
    rc.write_text(f'provider_installation {{\n filesystem_mirror {{ path = "{mirror}" }}\n}}\n')
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(rc), "TF_IN_AUTOMATION": "1"}
    for command in (["init", "-backend=false", "-input=false"], ["validate"]):
        done = subprocess.run(
            ["terraform", *command], cwd=workdir, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


def test_an_update_starts_from_the_recorded_variables_and_keeps_the_outputs_on_failure(
    tmp_path: Path, module: Path, fake_terraform: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    assert _deploy(state, module).exit_code == 0
    first = load_deployment(state)
    result = CliRunner().invoke(
        app,
        ["deploy", "aws", "--state-dir", str(state), "--module-dir", str(module),
         "--var", "max_instances=4"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    root = json.loads((state / "deploy/aws/main.tf.json").read_text())["module"]["coadapt"]
    assert (root["cluster_id"], root["node_ami_id"], root["max_instances"]) == ("c1", "ami-123", 4)
    monkeypatch.setenv("FAKE_TF_FAIL", "apply")
    failed = CliRunner().invoke(
        app, ["deploy", "aws", "--state-dir", str(state), "--module-dir", str(module)]
    )
    assert failed.exit_code == 1 and "the outputs recorded before are kept" in failed.output
    assert load_deployment(state).outputs == first.outputs  # destroy can still find it
    other = CliRunner().invoke(app, ["deploy", "gcp", "--state-dir", str(state)])
    assert other.exit_code == 2 and "holds a aws deployment" in other.output
