"""A controller on a cloud: the provider config a deployment writes, the provider it makes,
where the users' token is published, how each node gets its own agent credential, and a GCP
node's startup script.

A deployment (``terraform/aws``, ``terraform/gcp``) writes ``provider.json`` on the controller
machine; ``coadapt up --provider aws|gcp --provider-config FILE`` reads it with
:func:`load_provider_config`. Its keys (``kind`` says which cloud):

* aws: ``region``, ``launch_template_id`` (the deployment's GPU node template: image, IMDSv2,
  instance profile, the user data that starts ``coadapt agent``), ``subnets_by_zone``,
  ``security_group_ids``, ``instance_types`` (optional), ``interruption_queue_url``,
  ``checkpoint_root`` (``s3://...``), ``agent_credential_path`` (the SSM path under which
  each node's credential parameter is kept), ``instance_arn_prefix``
  (``arn:<partition>:ec2:<region>:<account>:instance/``), ``user_token_parameter`` (an SSM
  SecureString name) and ``job_storage_role_arn`` (the role each node's agent assumes to hand
  its jobs their checkpoint credentials: the nodes get it in their user data as
  ``--job-storage-role-arn``; the controller does not use it);
* gcp: ``project``, ``zones``, ``image``, ``network``, ``subnetwork``,
  ``service_account_email``, ``external_ip``, ``network_tags``, ``checkpoint_root``
  (``gs://...``), ``user_token_secret`` (a Secret Manager secret id), ``controller_url``,
  ``coadapt_pip_spec``.

No secret passes through terraform. ``coadapt up`` makes the controller's secrets
(:mod:`autoscaler.controller.credentials`) and publishes the users' token where only the
deployer reads it (:func:`publish_user_token`). Each node gets **its own** agent credential,
good for its own instance only, and nothing else:

* **GCP**: the controller writes each node's startup script (:func:`gcp_startup_script`), which
  carries that node's credential. Limit: instance metadata is readable by any process on the
  node and by any principal allowed ``compute.instances.get`` in the project (e.g. project
  viewers): such a principal can read every node's credential, each good for its own
  instance's agent endpoints only.
* **AWS**: the launch template, and so the user data, is the same for every node (EC2 Fleet
  cannot vary it per request), so a node cannot be handed a secret at launch.
  :class:`AwsAgentCredentials` keeps each node's credential in its own SSM SecureString,
  ``<agent_credential_path>/<instance key>``, tagged ``coadapt-instance-arn`` with the
  instance's ARN, once the cloud has listed the instance; the nodes' role may read a parameter
  under that path only when that tag equals the ARN of the instance making the call
  (``ssm:resourceTag/coadapt-instance-arn`` = ``${ec2:SourceInstanceARN}``), so a node reads its
  own and no other. A node learns its instance key from its own ``coadapt-request-id`` tag.
  Limits: the role's credentials are reachable from every process on the node that may reach
  instance metadata, as the node's own file is to processes of its user; and this IAM
  condition has been checked against the module's policy text only, not on a real account.

Jobs and their node's secrets: each job runs as its own unprivileged user
(``--isolate-jobs``, :mod:`coadapt_common.jobexec`), so the agent's files are out of its
reach, and the agent of a cloud node rejects, with netfilter rules it adds before it starts
any job, whatever jobs send to the metadata service (:mod:`autoscaler.controller.job_firewall`;
it exits when it cannot add them, unless told ``--allow-job-metadata``, unsafe): a job can
take neither the node role's credentials (AWS) nor the startup script that carries the node's
credential (GCP). What a job is handed is its own report credential and a credential for its
own checkpoints under ``checkpoint_root`` (:mod:`autoscaler.controller.job_storage`). Limits:
the rules were tested with a stand-in ``iptables``, never on a real kernel, and the scoped
credentials against moto and a stand-in STS, never on a real account (neither enforces those
policies); a job still shares its node's network (the controller, its peers, the internet);
a process that runs as the agent's user (root) is not a job and can read everything of its
node; GCP's IPv6 metadata address (``fd20:ce::254``) is not filtered.
"""

from __future__ import annotations

import base64
import json
import shlex
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from autoscaler.controller.credentials import ApiCredentials
from autoscaler.controller.errors import ControllerError
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import InstanceRow
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import Clock
from coadapt_common.http import credential_opener
from providers.base import Provider
from providers.capacity import UnavailableOfferings
from providers.gcp.metadata import (
    DEFAULT_METADATA_BASE_URL,
    INSTANCE_PATH,
    read_instance_metadata,
)

__all__ = [
    "INSTANCE_ARN_TAG",
    "AwsAgentCredentials",
    "CredentialPublishError",
    "ProviderConfig",
    "gcp_startup_script",
    "load_provider_config",
    "make_cloud_provider",
    "publish_user_token",
]

KINDS = ("aws", "gcp")
_REQUIRED: Mapping[str, tuple[str, ...]] = {
    "aws": ("region", "launch_template_id", "agent_credential_path", "instance_arn_prefix"),
    "gcp": ("project", "zones", "image", "controller_url"),
}
SECRET_MANAGER_URL = "https://secretmanager.googleapis.com/v1"
INSTANCE_ARN_TAG: Final = "coadapt-instance-arn"
"""The tag of a node's credential parameter that the nodes' role is conditioned on (AWS)."""
NODE_TOKEN_FILE: Final = "/etc/coadapt/agent-token.json"
# An instance in these states may have a node whose agent calls the API.
_NODE_MAY_RUN: Final = frozenset(
    {
        InstanceStatus.REQUESTED,
        InstanceStatus.RUNNING,
        InstanceStatus.DRAINING,
        InstanceStatus.TERMINATING,
        InstanceStatus.TERMINATION_FAILED,
    }
)


class CredentialPublishError(ControllerError):
    """A credential could not be published or withdrawn in the cloud (retried later)."""


@dataclass(frozen=True)
class ProviderConfig:
    """A parsed ``provider.json`` (see the module docstring); ``settings`` keeps every key."""

    kind: str
    settings: Mapping[str, Any] = field(repr=False)
    checkpoint_root: str | None = None


def load_provider_config(path: str | Path) -> ProviderConfig:
    """Read and check ``provider.json``; :class:`InvalidInputError` names the file and what is
    wrong (missing, not JSON, an unknown ``kind``, a required key absent)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError as e:
        raise InvalidInputError(f"{p}: no provider config there", field="provider_config") from e
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"{p}: not JSON: {e}", field="provider_config") from e
    if not isinstance(data, dict):
        raise InvalidInputError(f"{p}: a provider config is a JSON object", field="provider_config")
    kind = data.get("kind")
    if kind not in KINDS:
        raise InvalidInputError(
            f"{p}: kind must be one of {', '.join(KINDS)}, got {kind!r}", field="kind"
        )
    missing = [k for k in _REQUIRED[kind] if not data.get(k)]
    if missing:
        raise InvalidInputError(f"{p}: {kind} config lacks {', '.join(missing)}", field=missing[0])
    root = data.get("checkpoint_root")
    return ProviderConfig(kind, dict(data), root if isinstance(root, str) and root else None)


def make_cloud_provider(
    config: ProviderConfig,
    clock: Clock,
    *,
    endpoint_url: str | None = None,
    unavailable: UnavailableOfferings | None = None,
) -> Provider:
    """The provider a cloud config describes (``endpoint_url``: a test server;
    ``unavailable``: the unavailable-offerings memory it shares with the controller)."""
    s = config.settings
    if config.kind == "aws":
        from providers.aws import AwsConfig, AwsProvider, LaunchTemplateRef

        aws_fields: dict[str, Any] = {
            "region": s["region"],
            "launch_template": LaunchTemplateRef(template_id=s["launch_template_id"]),
            "subnets_by_zone": dict(s.get("subnets_by_zone") or {}),
            "security_group_ids": tuple(s.get("security_group_ids") or ()),
            "interruption_queue_url": s.get("interruption_queue_url") or None,
        }
        if s.get("instance_types"):
            aws_fields["instance_types"] = tuple(s["instance_types"])
        return AwsProvider(
            AwsConfig(**aws_fields),
            clock=clock,
            endpoint_url=endpoint_url,
            unavailable=unavailable,
        )
    from providers.gcp.config import GcpConfig
    from providers.gcp.provider import GcpProvider

    gcp_fields: dict[str, Any] = {"project": s["project"], "zones": tuple(s["zones"])}
    for key in ("image", "network", "subnetwork", "service_account_email"):
        if s.get(key):
            gcp_fields[key] = s[key]
    gcp_fields["external_ip"] = bool(s.get("external_ip", False))
    gcp_fields["network_tags"] = tuple(s.get("network_tags") or ())
    return GcpProvider(
        GcpConfig(**gcp_fields), clock=clock, api_endpoint=endpoint_url, unavailable=unavailable
    )


def publish_user_token(
    config: ProviderConfig,
    token: str,
    *,
    endpoint_url: str | None = None,
    metadata_url: str = DEFAULT_METADATA_BASE_URL,
    timeout_s: float = 10.0,
) -> None:
    """Store the users' token where the deployer reads it (what ``coadapt destroy`` and a
    user's CLI read): the SSM SecureString ``user_token_parameter`` (AWS) or a new version of
    the Secret Manager secret ``user_token_secret`` (GCP, with the VM's own service-account
    token from the metadata server, sent without following a redirect); nothing when the
    deployment names neither. Called at start and after a rotation. ``endpoint_url`` /
    ``metadata_url``: test servers. :class:`CredentialPublishError` when it fails."""
    s = config.settings
    if config.kind == "aws":
        if not s.get("user_token_parameter"):
            return
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        ssm = boto3.client("ssm", region_name=s["region"], endpoint_url=endpoint_url)
        try:
            ssm.put_parameter(
                Name=s["user_token_parameter"], Value=token, Type="SecureString", Overwrite=True
            )
        except (BotoCoreError, ClientError) as e:
            raise CredentialPublishError(f"SSM {s['user_token_parameter']}: {e}") from e
        return
    if not s.get("user_token_secret"):
        return
    from providers.errors import ProviderError

    name = f"projects/{s['project']}/secrets/{s['user_token_secret']}"
    try:
        access, _ = read_instance_metadata(
            metadata_url, "service-accounts/default/token", timeout_s=timeout_s
        )
        bearer = json.loads(access)["access_token"]
        payload = {"payload": {"data": base64.b64encode(token.encode()).decode()}}
        request = urllib.request.Request(
            f"{endpoint_url or SECRET_MANAGER_URL}/{name}:addVersion",
            data=json.dumps(payload).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"},
        )
        with credential_opener(proxies=True).open(request, timeout=timeout_s) as response:
            response.read()
    except (ProviderError, urllib.error.URLError, OSError, ValueError, KeyError) as e:
        raise CredentialPublishError(f"Secret Manager {name}: {e}") from e


class AwsAgentCredentials:
    """Each AWS node's own agent credential in its own SSM SecureString (see the module
    docstring): :meth:`sync` publishes the credential of every instance the cloud has listed
    and whose node may run, once per credential (again after a rotation of the agent key),
    tagged with the instance's ARN, and deletes the parameters of instances that ended. The
    first :meth:`sync` also deletes what instances that ended while no controller ran left
    behind. Its SSM calls are ``CONTROLLER_SERVICE_ACTIONS`` (``providers/aws/permissions.py``),
    all of them and no other (tested)."""

    def __init__(self, config: ProviderConfig, *, endpoint_url: str | None = None) -> None:
        import boto3

        s = config.settings
        self._ssm = boto3.client("ssm", region_name=s["region"], endpoint_url=endpoint_url)
        self.path = str(s["agent_credential_path"]).rstrip("/")
        self.arn_prefix = str(s["instance_arn_prefix"])
        self._published: dict[str, str] | None = None  # instance key -> credential published

    def clients(self) -> tuple[Any, ...]:
        """The boto3 clients it calls (for the tests' operation log)."""
        return (self._ssm,)

    def parameter_name(self, instance_key: str) -> str:
        return f"{self.path}/{instance_key}"

    def sync(self, rows: Iterable[InstanceRow], credentials: ApiCredentials) -> None:
        """Publish and withdraw (see the class docstring); :class:`CredentialPublishError`
        for the first call that failed (what succeeded stays done; the rest is retried at the
        next call)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if self._published is None:
                self._published = dict.fromkeys(self._listed(), "")
            published = self._published
            live = {
                r.instance_key: r.provider_instance_id
                for r in rows
                if r.provider_instance_id and r.status in _NODE_MAY_RUN
            }
            for key, instance_id in sorted(live.items()):
                credential = credentials.agent_credential(key)
                if published.get(key) != credential:
                    self._put(key, f"{self.arn_prefix}{instance_id}", credential)
                    published[key] = credential
            for key in sorted(set(published) - set(live)):
                self._delete(key)
                del published[key]
        except (BotoCoreError, ClientError) as e:
            raise CredentialPublishError(f"SSM {self.path}: {e}") from e

    def _listed(self) -> list[str]:
        keys = []
        pages = self._ssm.get_paginator("get_parameters_by_path").paginate(
            Path=self.path, Recursive=False, WithDecryption=False
        )
        for page in pages:
            keys += [str(p["Name"]).rsplit("/", 1)[-1] for p in page.get("Parameters", [])]
        return keys

    def _put(self, key: str, arn: str, credential: str) -> None:
        from botocore.exceptions import ClientError

        name = self.parameter_name(key)
        tags = [{"Key": INSTANCE_ARN_TAG, "Value": arn}]
        try:  # tagged as it is created: no moment where a node could read it untagged
            self._ssm.put_parameter(Name=name, Value=credential, Type="SecureString", Tags=tags)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "ParameterAlreadyExists":
                raise
            self._ssm.put_parameter(
                Name=name, Value=credential, Type="SecureString", Overwrite=True
            )
            self._ssm.add_tags_to_resource(ResourceType="Parameter", ResourceId=name, Tags=tags)

    def _delete(self, key: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self._ssm.delete_parameter(Name=self.parameter_name(key))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "ParameterNotFound":
                raise


def gcp_startup_script(
    config: ProviderConfig, *, instance_key: str, api_url: str, credential: str
) -> str:
    """A GCP node's startup script: install coadapt, keep ``credential`` (this node's own
    agent credential, nothing shared) in its token file, then run ``coadapt agent`` as a
    systemd service for ``instance_key``. Idempotent (a startup script runs at every boot):
    the token file is written only when missing, so a credential the agent renewed since (a
    rotation of the agent key) survives a reboot."""
    s = config.settings
    agent = [
        "/opt/coadapt/bin/coadapt", "agent", "--api", api_url,
        "--token-file", NODE_TOKEN_FILE, "--instance-key", instance_key,
        "--work-dir", "/var/lib/coadapt/agent", "--logs-dir", "/var/log/coadapt/jobs",
        "--notice-source", "gcp", "--isolate-jobs",
    ]  # fmt: skip
    if config.checkpoint_root:
        agent += ["--checkpoint-root", config.checkpoint_root]
    pip_spec = str(s.get("coadapt_pip_spec") or "coadapt")
    md = DEFAULT_METADATA_BASE_URL + INSTANCE_PATH.rstrip("/")
    token_json = json.dumps({"agent": credential})
    return "\n".join(
        [
            "#!/bin/bash",
            "set -euo pipefail",
            "umask 077",
            "mkdir -p /etc/coadapt /var/lib/coadapt/agent /var/log/coadapt/jobs",
            "[ -x /opt/coadapt/bin/coadapt ] || { python3 -m venv /opt/coadapt && "
            f"/opt/coadapt/bin/pip install --quiet {shlex.quote(pip_spec)}; }}",
            f"IP=$(curl -sf -H 'Metadata-Flavor: Google' {md}/network-interfaces/0/ip)",
            f"if [ ! -s {NODE_TOKEN_FILE} ]; then",
            f"cat > {NODE_TOKEN_FILE} <<'TOKEN'",
            token_json,
            "TOKEN",
            "fi",
            "cat > /etc/systemd/system/coadapt-agent.service <<UNIT",
            "[Unit]",
            "Description=coadapt node agent",
            "After=network-online.target",
            "[Service]",
            f"ExecStart={shlex.join(agent)} --address $IP",
            "Restart=always",
            "KillMode=mixed",
            "TimeoutStopSec=120",
            "[Install]",
            "WantedBy=multi-user.target",
            "UNIT",
            "systemctl daemon-reload",
            "systemctl enable --now coadapt-agent.service",
            "",
        ]
    )
