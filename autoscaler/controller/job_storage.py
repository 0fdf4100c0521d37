"""Checkpoint credentials scoped to one job, made by a cloud node's agent.

A job on a cloud node cannot reach the metadata service (:mod:`.job_firewall`), so it cannot
use the node's own cloud identity; the agent hands it instead a credential good for its own
checkpoints only, under the deployment's checkpoint root (``s3://BUCKET/PREFIX`` or
``gs://BUCKET/PREFIX``): objects under ``PREFIX/<job>/`` and listing them, nothing else.

* AWS (:class:`AwsJobCredentials`): the node role assumes the deployment's job-storage role
  (``terraform/aws``: only the node role may assume it; it may touch the checkpoint prefix
  only) with a session policy (:func:`aws_session_policy`) that narrows it to the job's own
  prefix, for :data:`JOB_CREDENTIAL_LIFETIME_S`.
* GCP (:class:`GcpJobCredentials`): the node's access token (from the metadata server) is
  exchanged at Google's STS for a downscoped token (a Credential Access Boundary,
  :func:`gcs_access_boundary`); it expires with the node's token.

Each :meth:`mint` returns a :class:`JobCredential`: the bytes the agent writes to the job's
0600 file, when it expires, and the environment that makes the job use it
(:meth:`~autoscaler.controller.agent.Supervisor.start`). Neither cloud's enforcement of these
policies was exercised here (moto does not enforce session policies; STS is a local stand-in):
what is tested is the request sent and that the job's client uses what it is handed.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from autoscaler.controller.errors import ControllerError
from coadapt_common.http import credential_opener
from trainer.env import GCS_TOKEN_FILE

__all__ = [
    "JOB_CREDENTIAL_LIFETIME_S",
    "AwsJobCredentials",
    "GcpJobCredentials",
    "JobCredential",
    "JobCredentialError",
    "JobCredentialSource",
    "aws_session_name",
    "aws_session_policy",
    "gcs_access_boundary",
    "split_root",
]

JOB_CREDENTIAL_LIFETIME_S: Final = 3600
"""How long an AWS job credential lasts (``DurationSeconds``)."""
RENEW_AT: Final = 2 / 3
"""The share of a credential's lifetime after which the agent renews it."""
STS_TOKEN_URL: Final = "https://sts.googleapis.com/v1/token"
TOKEN_EXCHANGE: Final = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE: Final = "urn:ietf:params:oauth:token-type:access_token"
_SESSION_NAME_CHARS: Final = re.compile(r"[^\w+=,.@-]")


class JobCredentialSource(Protocol):
    """What mints a job's checkpoint credential (:class:`AwsJobCredentials`,
    :class:`GcpJobCredentials`)."""

    def mint(self, job: str) -> JobCredential: ...


class JobCredentialError(ControllerError):
    """A job's checkpoint credential could not be made (the cloud refused or was away)."""


@dataclass(frozen=True)
class JobCredential:
    """What a job is handed: ``data`` (its credential file's bytes), ``issued_s`` and
    ``expires_s`` (wall-clock seconds), ``env`` (variables for the job, ``{file}`` standing for
    the file's path) and, for AWS, ``aws_python`` and ``aws_region``, from which
    :meth:`aws_config` writes the job's ``AWS_CONFIG_FILE``."""

    data: bytes = field(repr=False)
    issued_s: float
    expires_s: float
    env: dict[str, str]
    aws_python: str | None = None
    aws_region: str | None = None

    def renew_at_s(self) -> float:
        """When the agent writes a new one: :data:`RENEW_AT` of the way to its expiry."""
        return self.issued_s + (self.expires_s - self.issued_s) * RENEW_AT

    def job_env(self, file: Path) -> dict[str, str]:
        """``env`` with the credential file's path in place of ``{file}``."""
        return {k: v.replace("{file}", str(file)) for k, v in self.env.items()}

    def aws_config(self, file: Path) -> str | None:
        """The job's AWS config file (``None``: not an AWS credential): a default profile
        whose ``credential_process`` prints ``file`` (:mod:`trainer.aws_credentials`)."""
        if self.aws_python is None:
            return None
        process = shlex.join([self.aws_python, "-m", "trainer.aws_credentials", str(file)])
        region = f"region = {self.aws_region}\n" if self.aws_region else ""
        return f"[default]\ncredential_process = {process}\n{region}"


def split_root(root: str, scheme: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``scheme://bucket/prefix`` (prefix without slashes at its ends,
    may be empty); :class:`ValueError` for another scheme or no bucket."""
    parsed = urllib.parse.urlparse(root)
    if parsed.scheme != scheme or not parsed.netloc:
        raise ValueError(f"{root!r} is not {scheme}://BUCKET[/PREFIX]")
    return parsed.netloc, parsed.path.strip("/")


def _job_prefix(prefix: str, job: str) -> str:
    return f"{prefix}/{job}/" if prefix else f"{job}/"


def aws_session_name(job: str) -> str:
    """A ``RoleSessionName`` for ``job``: ``coadapt-<job>`` with every character STS refuses
    made ``-``, at most 64 characters (it shows in CloudTrail as who wrote)."""
    return _SESSION_NAME_CHARS.sub("-", f"coadapt-{job}")[:64]


def aws_session_policy(root: str, job: str, partition: str = "aws") -> dict[str, Any]:
    """The session policy that narrows the job-storage role to ``job``'s checkpoints under
    ``root`` (``s3://BUCKET/PREFIX``): Get/Put/DeleteObject on ``BUCKET/PREFIX/<job>/*`` and
    ListBucket on ``BUCKET`` when ``s3:prefix`` is like ``PREFIX/<job>/*`` (ARNs of
    ``partition``: ``aws``, ``aws-cn``, ``aws-us-gov``)."""
    bucket, prefix = split_root(root, "s3")
    own = _job_prefix(prefix, job)
    arn = f"arn:{partition}:s3:::{bucket}"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "OwnCheckpoints",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": [f"{arn}/{own}*"],
            },
            {
                "Sid": "ListOwnCheckpoints",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [arn],
                "Condition": {"StringLike": {"s3:prefix": [f"{own}*"]}},
            },
        ],
    }


class AwsJobCredentials:
    """Mints a job's S3 credential (see the module docstring) with the agent's own AWS
    credentials (the node role, from instance metadata), in the partition of ``role_arn``
    (``arn:PARTITION:iam::...``). ``endpoint_url``: a test server."""

    def __init__(
        self,
        role_arn: str,
        root: str,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        python: str = sys.executable,
    ) -> None:
        import boto3

        split_root(root, "s3")
        parts = role_arn.split(":")
        self.partition = parts[1] if len(parts) > 1 and parts[0] == "arn" and parts[1] else "aws"
        self.role_arn = role_arn
        self.root = root
        self.python = python
        self._sts = boto3.client("sts", region_name=region, endpoint_url=endpoint_url)

    def clients(self) -> tuple[Any, ...]:
        """The boto3 clients it calls (a test's hook reads the requests sent)."""
        return (self._sts,)

    def mint(self, job: str) -> JobCredential:
        """A credential for ``job``: ``sts:AssumeRole`` with the session policy, for
        :data:`JOB_CREDENTIAL_LIFETIME_S`; the file holds it in ``credential_process`` form
        and the job's ``AWS_CONFIG_FILE`` runs :mod:`trainer.aws_credentials` on it, so boto3
        reads it again once it expires. :class:`JobCredentialError` when STS refuses."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self._sts.assume_role(
                RoleArn=self.role_arn,
                RoleSessionName=aws_session_name(job),
                Policy=json.dumps(
                    aws_session_policy(self.root, job, self.partition), separators=(",", ":")
                ),
                DurationSeconds=JOB_CREDENTIAL_LIFETIME_S,
            )
        except (BotoCoreError, ClientError) as e:
            raise JobCredentialError(f"sts:AssumeRole {self.role_arn} for {job}: {e}") from e
        c = answer["Credentials"]
        expires = c["Expiration"]
        data = {
            "Version": 1,
            "AccessKeyId": c["AccessKeyId"],
            "SecretAccessKey": c["SecretAccessKey"],
            "SessionToken": c["SessionToken"],
            "Expiration": expires.isoformat(),
        }
        env = {"AWS_EC2_METADATA_DISABLED": "true"}  # never wait on a metadata it cannot reach
        return JobCredential(
            json.dumps(data).encode(),
            time.time(),
            expires.timestamp(),
            env,
            aws_python=self.python,
            aws_region=self._sts.meta.region_name,
        )


def gcs_access_boundary(root: str, job: str) -> dict[str, Any]:
    """The Credential Access Boundary of ``job``'s token under ``root``
    (``gs://BUCKET/PREFIX``): ``roles/storage.objectAdmin`` on ``BUCKET``, available only for
    objects whose name starts ``PREFIX/<job>/`` and for listings whose prefix does (a listing
    is a call on the bucket, whose resource name is no object's: without the second clause
    the job could not list its own checkpoints)."""
    bucket, prefix = split_root(root, "gs")
    own = _job_prefix(prefix, job)
    objects = f"projects/_/buckets/{bucket}/objects/{own}"
    expression = (
        f"resource.name.startsWith('{objects}') || "
        f"api.getAttribute('storage.googleapis.com/objectListPrefix', '').startsWith('{own}')"
    )
    return {
        "accessBoundary": {
            "accessBoundaryRules": [
                {
                    "availablePermissions": ["inRole:roles/storage.objectAdmin"],
                    "availableResource": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
                    "availabilityCondition": {
                        "title": "own-checkpoints",
                        "expression": expression,
                    },
                }
            ]
        }
    }


class GcpJobCredentials:
    """Mints a job's downscoped GCS token (see the module docstring) from the node's own
    token. ``metadata_url`` and ``sts_url``: test servers."""

    def __init__(
        self,
        root: str,
        *,
        metadata_url: str | None = None,
        sts_url: str = STS_TOKEN_URL,
        timeout_s: float = 10.0,
    ) -> None:
        from providers.gcp.metadata import DEFAULT_METADATA_BASE_URL

        split_root(root, "gs")
        self.root = root
        self.metadata_url = metadata_url or DEFAULT_METADATA_BASE_URL
        self.sts_url = sts_url
        self.timeout_s = timeout_s
        self._opener = credential_opener(proxies=True)

    def mint(self, job: str) -> JobCredential:
        """A token for ``job``: the node's access token exchanged at STS with
        :func:`gcs_access_boundary`; the file holds the token alone (``GcsStore`` reads it
        again when it changes). :class:`JobCredentialError` when either service fails."""
        from providers.errors import ProviderError
        from providers.gcp.metadata import read_instance_metadata

        try:
            body, _ = read_instance_metadata(
                self.metadata_url, "service-accounts/default/token", timeout_s=self.timeout_s
            )
            subject = str(json.loads(body)["access_token"])
        except (ProviderError, ValueError, KeyError, TypeError) as e:
            raise JobCredentialError(f"the node's token for {job}: {e}") from e
        form = {
            "grant_type": TOKEN_EXCHANGE,
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "requested_token_type": ACCESS_TOKEN_TYPE,
            "subject_token": subject,
            "options": json.dumps(gcs_access_boundary(self.root, job), separators=(",", ":")),
        }
        request = urllib.request.Request(
            self.sts_url,
            data=urllib.parse.urlencode(form).encode(),
            method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        issued = time.time()
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                answer = json.loads(response.read())
            token = str(answer["access_token"])
            lifetime_s = float(answer.get("expires_in", 0))
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as e:
            raise JobCredentialError(f"STS token exchange for {job}: {e}") from e
        if not token or lifetime_s <= 0:
            raise JobCredentialError(f"STS token exchange for {job}: no token or no lifetime")
        return JobCredential(
            (token + "\n").encode(), issued, issued + lifetime_s, {GCS_TOKEN_FILE: "{file}"}
        )
