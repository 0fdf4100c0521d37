"""Checkpoint storage behind one small interface: local folder, S3, GCS.

:class:`CheckpointStore` is the port. Contract of every backend:

* ``write(name, data)`` is atomic: a reader sees either the previous object or the whole new one,
  never a prefix (local: temporary file + fsync + rename; S3/GCS: single-request uploads are
  atomic by the services' semantics).
* ``read(name)`` returns the bytes or raises :class:`CheckpointNotFoundError`.
* ``names()`` lists the objects under the store's prefix (unordered; temporary files excluded).
* ``delete(name)`` of a missing object is a no-op (idempotent).
* Any other failure raises :class:`CheckpointStorageError`.

Backends import their SDKs lazily: ``S3Store`` imports boto3 when constructed; ``GcsStore``
needs no SDK at all (it speaks the GCS JSON API with ``urllib``; google-cloud-storage is not a
dependency). ``open_store(uri)`` picks a backend from ``file://``, ``s3://``, ``gs://`` or a plain
path.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Protocol

from coadapt_common.atomic import write_bytes_atomic
from coadapt_common.http import credential_opener
from trainer.env import GCS_TOKEN_FILE
from trainer.errors import CheckpointNotFoundError, CheckpointStorageError, TrainerConfigError


class CheckpointStore(Protocol):
    """Where checkpoints live (see module docstring for the contract)."""

    uri: str

    def write(self, name: str, data: bytes) -> None: ...

    def read(self, name: str) -> bytes: ...

    def names(self) -> list[str]: ...

    def delete(self, name: str) -> None: ...


def _check_name(name: str) -> str:
    if not name or "/" in name or name.startswith(".") or name in ("..",):
        raise TrainerConfigError(f"invalid object name {name!r}", field="name")
    return name


class LocalStore:
    """A folder (created on first write)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.uri = f"file://{self.root.resolve()}"

    def write(self, name: str, data: bytes) -> None:
        path = self.root / _check_name(name)
        try:
            write_bytes_atomic(path, data, durable=True)
        except OSError as e:
            raise CheckpointStorageError(f"cannot write {path}: {e}") from e

    def read(self, name: str) -> bytes:
        path = self.root / _check_name(name)
        try:
            return path.read_bytes()
        except FileNotFoundError as e:
            raise CheckpointNotFoundError(f"no checkpoint {path}") from e
        except OSError as e:
            raise CheckpointStorageError(f"cannot read {path}: {e}") from e

    def names(self) -> list[str]:
        try:
            return [n for n in os.listdir(self.root) if not n.startswith(".")]
        except FileNotFoundError:
            return []
        except OSError as e:
            raise CheckpointStorageError(f"cannot list {self.root}: {e}") from e

    def delete(self, name: str) -> None:
        try:
            (self.root / _check_name(name)).unlink(missing_ok=True)
        except OSError as e:
            raise CheckpointStorageError(f"cannot delete {name} in {self.root}: {e}") from e


class S3Store:
    """An S3 bucket and prefix, through boto3 (imported here, lazily).

    ``endpoint_url`` (or the ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` variables boto3 reads)
    points it at S3-compatible servers such as moto or MinIO.
    """

    def __init__(
        self, bucket: str, prefix: str = "", *, client: Any = None, endpoint_url: str | None = None
    ) -> None:
        if not bucket:
            raise TrainerConfigError("empty bucket", field="bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}"
        if client is None:
            try:
                import boto3
            except ImportError as e:  # pragma: no cover - depends on the install
                raise CheckpointStorageError("s3:// checkpoints need boto3 installed") from e
            client = boto3.client("s3", endpoint_url=endpoint_url)
        self._client = client

    def _key(self, name: str) -> str:
        name = _check_name(name)
        return f"{self.prefix}/{name}" if self.prefix else name

    def _error(self, action: str, name: str, e: Exception) -> CheckpointStorageError:
        return CheckpointStorageError(f"S3 {action} s3://{self.bucket}/{self._key(name)}: {e}")

    def write(self, name: str, data: bytes) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)
        except Exception as e:  # botocore raises many unrelated types
            raise self._error("put", name, e) from e

    def read(self, name: str) -> bytes:
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(name))
            return response["Body"].read()
        except Exception as e:
            code = getattr(e, "response", {}).get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise CheckpointNotFoundError(f"no checkpoint {self._key(name)}") from e
            raise self._error("get", name, e) from e

    def names(self) -> list[str]:
        prefix = f"{self.prefix}/" if self.prefix else ""
        out: list[str] = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    rest = item["Key"][len(prefix) :]
                    if rest and "/" not in rest:
                        out.append(rest)
        except Exception as e:
            raise CheckpointStorageError(f"S3 list s3://{self.bucket}/{prefix}: {e}") from e
        return out

    def delete(self, name: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(name))
        except Exception as e:
            raise self._error("delete", name, e) from e


class GcsStore:
    """A GCS bucket and prefix through the GCS JSON API (``urllib``; no SDK needed).

    Authentication: a bearer token from ``token`` (a string or a zero-argument callable), else
    the file ``COADAPT_GCS_TOKEN_FILE`` names (its first line: the job's own token, which its
    node agent writes and renews there; the file is read again whenever its size, time or inode
    changed), else the ``COADAPT_GCS_TOKEN`` or ``GOOGLE_OAUTH_ACCESS_TOKEN`` variable, else the
    GCE metadata server (the VM's service account; cached until shortly before it expires). No
    token is sent to an emulator (``STORAGE_EMULATOR_HOST`` or an explicit ``endpoint``) unless
    given (a token file counts as given).
    Service-account key files are not supported: use the metadata server or pass a token.
    """

    DEFAULT_ENDPOINT = "https://storage.googleapis.com"
    METADATA_TOKEN_URL = (
        "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
    )

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        token: str | Any = None,
        timeout_s: float = 60.0,
    ) -> None:
        if not bucket:
            raise TrainerConfigError("empty bucket", field="bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"gs://{bucket}/{self.prefix}"
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        self.endpoint = (endpoint or emulator or self.DEFAULT_ENDPOINT).rstrip("/")
        self._emulated = self.endpoint != self.DEFAULT_ENDPOINT
        self._token = token
        self._timeout_s = timeout_s
        self._cached: tuple[str, float] | None = None
        self._from_file: tuple[tuple[str, int, int, int], str] | None = None  # (stat, token)
        self._lock = threading.Lock()
        # The bearer goes to the storage endpoint only: never re-sent to a redirect's target
        # (an https proxy, which tunnels TLS, is allowed).
        self._opener = credential_opener(proxies=True)

    # --- auth -----------------------------------------------------------------------------
    def _bearer(self) -> str | None:
        if callable(self._token):
            return str(self._token())
        if isinstance(self._token, str):
            return self._token
        if os.environ.get(GCS_TOKEN_FILE):
            return self._token_file(os.environ[GCS_TOKEN_FILE])
        for var in ("COADAPT_GCS_TOKEN", "GOOGLE_OAUTH_ACCESS_TOKEN"):
            if os.environ.get(var):
                return os.environ[var]
        if self._emulated:
            return None
        with self._lock:
            if self._cached and self._cached[1] > time.monotonic():
                return self._cached[0]
            request = urllib.request.Request(
                self.METADATA_TOKEN_URL, headers={"Metadata-Flavor": "Google"}
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    body = json.loads(response.read())
            except (OSError, ValueError) as e:
                raise CheckpointStorageError(
                    "gs:// checkpoints need a token: set COADAPT_GCS_TOKEN or run on GCE "
                    f"with a service account ({e})"
                ) from e
            token = str(body["access_token"])
            self._cached = (token, time.monotonic() + float(body.get("expires_in", 300)) - 60)
            return token

    def _token_file(self, path: str) -> str:
        """The token in ``path``, read again when the file changed since the last read."""
        try:
            st = os.stat(path)
            seen = (path, st.st_mtime_ns, st.st_size, st.st_ino)
            with self._lock:
                if self._from_file is not None and self._from_file[0] == seen:
                    return self._from_file[1]
            with open(path, encoding="utf-8") as handle:
                token = handle.readline().strip()
        except OSError as e:
            raise CheckpointStorageError(f"{GCS_TOKEN_FILE} {path}: {e}") from e
        if not token:
            raise CheckpointStorageError(f"{GCS_TOKEN_FILE} {path}: empty")
        with self._lock:
            self._from_file = (seen, token)
        return token

    # --- HTTP -----------------------------------------------------------------------------
    def _object(self, name: str) -> str:
        name = _check_name(name)
        return f"{self.prefix}/{name}" if self.prefix else name

    def _request(
        self, method: str, url: str, body: bytes | None = None, *, missing_ok: bool = False
    ) -> bytes | None:
        headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
        bearer = self._bearer()
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=self._timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                if missing_ok:
                    return None
                raise CheckpointNotFoundError(f"GCS {method} {url}: not found") from e
            raise CheckpointStorageError(f"GCS {method} {url}: HTTP {e.code} {e.reason}") from e
        except OSError as e:
            raise CheckpointStorageError(f"GCS {method} {url}: {e}") from e

    def _object_url(self, name: str) -> str:
        quoted = urllib.parse.quote(self._object(name), safe="")
        return f"{self.endpoint}/storage/v1/b/{self.bucket}/o/{quoted}"

    def write(self, name: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": self._object(name)})
        self._request("POST", f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o?{query}", data)

    def read(self, name: str) -> bytes:
        data = self._request("GET", f"{self._object_url(name)}?alt=media")
        return data or b""

    def names(self) -> list[str]:
        prefix = f"{self.prefix}/" if self.prefix else ""
        out: list[str] = []
        token: str | None = None
        while True:
            params = {"prefix": prefix, "fields": "items(name),nextPageToken"}
            if token:
                params["pageToken"] = token
            url = f"{self.endpoint}/storage/v1/b/{self.bucket}/o?{urllib.parse.urlencode(params)}"
            try:
                page = json.loads(self._request("GET", url) or b"{}")
            except ValueError as e:
                raise CheckpointStorageError(f"GCS list {url}: invalid JSON") from e
            for item in page.get("items", []):
                rest = item["name"][len(prefix) :]
                if rest and "/" not in rest:
                    out.append(rest)
            token = page.get("nextPageToken")
            if not token:
                return out

    def delete(self, name: str) -> None:
        self._request("DELETE", self._object_url(name), missing_ok=True)


def open_store(uri: str) -> CheckpointStore:
    """A store for ``file:///path``, ``s3://bucket/prefix``, ``gs://bucket/prefix`` or a path."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "s3":
        return S3Store(parsed.netloc, parsed.path)
    if parsed.scheme == "gs":
        return GcsStore(parsed.netloc, parsed.path)
    if parsed.scheme == "file":
        return LocalStore(urllib.parse.unquote(parsed.path))
    if parsed.scheme == "":
        return LocalStore(uri)
    raise TrainerConfigError(f"unsupported checkpoint URI scheme {parsed.scheme!r}", field="uri")
