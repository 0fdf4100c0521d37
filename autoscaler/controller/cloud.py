"""A controller on a cloud: the provider config a deployment writes, the provider it makes,
where the agents' token is published, and a GCP node's startup script.

A deployment (``terraform/aws``, ``terraform/gcp``) writes ``provider.json`` on the controller
machine; ``coadapt up --provider aws|gcp --provider-config FILE`` reads it with
:func:`load_cloud_config`. Its keys (``kind`` says which cloud):

* aws: ``region``, ``launch_template_id`` (the deployment's GPU node template: image, IMDSv2,
  instance profile, the user data that starts ``coadapt agent``), ``subnets_by_zone``,
  ``security_group_ids``, ``instance_types`` (optional), ``interruption_queue_url``,
  ``checkpoint_root`` (``s3://...``), ``agent_token_parameter`` and ``user_token_parameter``
  (SSM SecureString names);
* gcp: ``project``, ``zones``, ``image``, ``network``, ``subnetwork``,
  ``service_account_email``, ``external_ip``, ``network_tags``, ``checkpoint_root``
  (``gs://...``), ``agent_token_secret`` and ``user_token_secret`` (Secret Manager secret
  ids), ``controller_url``,
  ``coadapt_pip_spec``.

The tokens never pass through terraform: ``coadapt up`` makes them and publishes them
(:func:`publish_tokens`): the agents' where the nodes' roles may read it, the users' where the
deployer reads it. On AWS the launch template
carries the node's user data (EC2 Fleet cannot vary it per request), so a node learns its
instance key from its own ``coadapt-request-id`` tag; on GCP the controller writes each node's
startup script (:func:`gcp_startup_script`) with its key.
"""

from __future__ import annotations

import base64
import json
import shlex
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoscaler.controller.api import ApiTokens
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import Clock
from providers.base import Provider
from providers.capacity import UnavailableOfferings
from providers.gcp.metadata import (
    DEFAULT_METADATA_BASE_URL,
    INSTANCE_PATH,
    read_instance_metadata,
)

__all__ = [
    "CloudConfig",
    "gcp_startup_script",
    "load_cloud_config",
    "make_cloud_provider",
    "publish_tokens",
]

KINDS = ("aws", "gcp")
_REQUIRED: Mapping[str, tuple[str, ...]] = {
    "aws": ("region", "launch_template_id", "agent_token_parameter"),
    "gcp": ("project", "zones", "image", "agent_token_secret", "controller_url"),
}
SECRET_MANAGER_URL = "https://secretmanager.googleapis.com/v1"


@dataclass(frozen=True)
class CloudConfig:
    """A parsed ``provider.json`` (see the module docstring); ``settings`` keeps every key."""

    kind: str
    settings: Mapping[str, Any] = field(repr=False)
    checkpoint_root: str | None = None


def load_cloud_config(path: str | Path) -> CloudConfig:
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
    return CloudConfig(kind, dict(data), root if isinstance(root, str) and root else None)


def make_cloud_provider(
    config: CloudConfig,
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


def publish_tokens(
    config: CloudConfig,
    tokens: ApiTokens,
    *,
    endpoint_url: str | None = None,
    metadata_url: str = DEFAULT_METADATA_BASE_URL,
    timeout_s: float = 10.0,
) -> None:
    """Store the API tokens where they are read: the agents' token in the SSM SecureString
    ``agent_token_parameter`` (AWS) or as a new version of the Secret Manager secret
    ``agent_token_secret`` (GCP, with the VM's own service-account token from the metadata
    server) for the nodes; the users' token likewise in ``user_token_parameter`` /
    ``user_token_secret`` when the deployment has one (what ``coadapt destroy`` and a user's
    CLI read). ``endpoint_url`` / ``metadata_url``: test servers."""
    s = config.settings
    where = {"agent": tokens.agent, "user": tokens.user}
    if config.kind == "aws":
        import boto3

        ssm = boto3.client("ssm", region_name=s["region"], endpoint_url=endpoint_url)
        for role, token in where.items():
            if s.get(f"{role}_token_parameter"):
                ssm.put_parameter(
                    Name=s[f"{role}_token_parameter"],
                    Value=token,
                    Type="SecureString",
                    Overwrite=True,
                )
        return
    access, _ = read_instance_metadata(
        metadata_url, "service-accounts/default/token", timeout_s=timeout_s
    )
    bearer = json.loads(access)["access_token"]
    base = endpoint_url or SECRET_MANAGER_URL
    for role, token in where.items():
        if not s.get(f"{role}_token_secret"):
            continue
        name = f"projects/{s['project']}/secrets/{s[f'{role}_token_secret']}"
        payload = {"payload": {"data": base64.b64encode(token.encode()).decode()}}
        request = urllib.request.Request(
            f"{base}/{name}:addVersion",
            data=json.dumps(payload).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()


def gcp_startup_script(config: CloudConfig, *, instance_key: str, api_url: str) -> str:
    """A GCP node's startup script: install coadapt, read the agents' token from Secret
    Manager (with the node's service account), then run ``coadapt agent`` as a systemd
    service for ``instance_key``. Idempotent (a startup script runs at every boot)."""
    s = config.settings
    secret = f"projects/{s['project']}/secrets/{s['agent_token_secret']}/versions/latest"
    agent = [
        "/opt/coadapt/bin/coadapt", "agent", "--api", api_url,
        "--token-file", "/etc/coadapt/agent-token.json", "--instance-key", instance_key,
        "--work-dir", "/var/lib/coadapt/agent", "--logs-dir", "/var/log/coadapt/jobs",
        "--notice-source", "gcp",
    ]  # fmt: skip
    if config.checkpoint_root:
        agent += ["--checkpoint-root", config.checkpoint_root]
    pip_spec = str(s.get("coadapt_pip_spec") or "coadapt")
    md = DEFAULT_METADATA_BASE_URL + INSTANCE_PATH.rstrip("/")
    return "\n".join(
        [
            "#!/bin/bash",
            "set -euo pipefail",
            "umask 077",
            "mkdir -p /etc/coadapt /var/lib/coadapt/agent /var/log/coadapt/jobs",
            "[ -x /opt/coadapt/bin/coadapt ] || { python3 -m venv /opt/coadapt && "
            f"/opt/coadapt/bin/pip install --quiet {shlex.quote(pip_spec)}; }}",
            f"IP=$(curl -sf -H 'Metadata-Flavor: Google' {md}/network-interfaces/0/ip)",
            f"BEARER=$(curl -sf -H 'Metadata-Flavor: Google' "
            f"{md}/service-accounts/default/token | python3 -c "
            "'import json,sys; print(json.load(sys.stdin)[\"access_token\"])')",
            'until TOKEN=$(curl -sf -H "Authorization: Bearer $BEARER" '
            f"{SECRET_MANAGER_URL}/{secret}:access | python3 -c "
            "'import base64,json,sys; "
            'print(base64.b64decode(json.load(sys.stdin)["payload"]["data"]).decode())\'); '
            "do sleep 10; done",
            'TOKEN="$TOKEN" python3 -c \'import json,os; json.dump({"agent": '
            'os.environ["TOKEN"]}, open("/etc/coadapt/agent-token.json", "w"))\'',
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
