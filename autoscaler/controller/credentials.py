"""Who may call the controller's API, with what, and where each credential is kept.

Three roles, each with its own credential, each good for the least it needs:

=========  ===============================  ===============================================
role       held by                          good for
=========  ===============================  ===============================================
user       the users (CLI, dashboard)       the user endpoints, nothing an agent or a
                                            trainer calls
agent      one instance's agent             that instance's register, heartbeat,
                                            assignments and job exits; 403 on every other
                                            instance's and on the user endpoints
report     the trainers of one job          ``POST /v1/jobs/{that job}/reports``; 403 on
                                            every other job's and on every other endpoint
scrape     a metrics scraper (Prometheus)   ``GET /metrics``; 403 on every other endpoint
=========  ===============================  ===============================================

**The users' token** is random (``secrets.token_urlsafe(32)``), kept in the controller's
tokens file (``<state>/tokens.json``, 0600), and leaves it only for the users' hands: the CLI
reads it there, the dashboard gets it in its URL fragment, and on a cloud deployment the
controller publishes it where only the deployer reads it (:mod:`autoscaler.controller.cloud_setup`).

**The scrape token** (``coadapt tokens scrape``, :func:`issue_scrape_token`) is random too and
kept in the same file (``scrape``), made on its first issue: a scraper reads the metrics and
nothing else, so the users' token need not sit in a monitoring system's configuration.
``coadapt tokens rotate scrape`` replaces it at once (the old one is refused from the
controller's next request).

**Agent and report credentials** are derived, never stored: ``<kind>.<subject>.<mac>``, the MAC
being HMAC-SHA256 over ``coadapt <kind>\\0<subject>`` with the *agent key*, a random 32-byte key
in the same tokens file. ``subject`` is the instance key (agent) or the job name (report). The
controller checks one by recomputing the MAC and comparing in constant time, so nothing per
instance or per job is stored, and the two kinds can never stand for each other (the kind is
inside the MAC). A local agent gets its own in a file of its own (``<state>/agents/<key>/
agent-token.json``); a cloud node its own through the cloud (``cloud_setup.py``); an agent hands
each job's report credential to that job's launcher in a 0600 file whose path is in the
launcher's environment (``COADAPT_REPORT_TOKEN_FILE``), never on a command line
(``/proc/PID/cmdline`` is readable by every user; ``environ`` and the file only by the job's own).

**A report credential is per job, not per launch.** A job's name is unique for the life of the
store (the API refuses a duplicate, ended jobs included), so the credential already names one
job; every launch of it (a retry, a rescale, each node's launcher) reports for the same job, and
the report itself carries the launch (``attempt``). Binding it to a launch would add a stored
launch id and make every rescale hand out a new credential, for no authority taken away: a
stale launcher of the same job can only post that job's reports, which the controller answers
with ``stop`` once the job is no longer running.

**Rotation** (``coadapt tokens rotate``, :func:`rotate_user_token`, :func:`rotate_agent_key`):

* the users' token is replaced at once: the old one is refused from the controller's next
  request (it reads the file again whenever it changed: :class:`TokenFile`). No job or agent
  uses it; a deployed controller publishes the new one where it published the old.
* the agent key is replaced with a grace period: the previous key stays valid until
  ``previous_agent_key_until_s`` (default 10 minutes). An agent that heartbeats with a
  credential of the previous key gets its new credential in the heartbeat's answer and keeps
  it (in memory and in its token file); its next read of the assignments carries each job's
  new report credential, which the agent writes over the job's credential file, and the
  trainer's reporter reads that file before every report. Nothing is relaunched. After the
  grace period credentials of the previous key are refused (401). A second rotation of the
  agent key is refused while the previous key is still honoured (it would cut off whoever has
  not renewed yet), unless forced.

**A shared (PostgreSQL) store** holds the credentials the API checks, so that every
controller process of the store accepts the same tokens (:class:`StoreCredentials`; the row:
:mod:`autoscaler.controller.store.credential_meta`, which says why the secrets are kept whole,
not hashed). The first ``coadapt up`` of a new shared store puts them there (those of its
``tokens.json`` when it has one, so a controller moved onto a shared store keeps its agents'
credentials; new ones otherwise); every later one reads them. Each process reads the row again
at most every :data:`SHARED_CREDENTIALS_TTL_S` seconds, so a rotation made on any machine
(``coadapt tokens rotate ... --store URL``: the ``store`` argument of the rotations, one write
transaction) is honoured, and the old users' or scrape token refused, by every process within
that time. Each process keeps its machine's ``tokens.json`` a copy of the row (0600, marked
``shared_store``), what the CLI on that machine authenticates with; a rotation of that copy
alone would change nothing the API checks, so it is refused (it names ``--store``). The
embedded SQLite store keeps ``tokens.json`` alone, as above.

Nothing here shows a secret: the dataclasses leave them out of ``repr``, and no error message
quotes a token or a file's content.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Protocol

from autoscaler.controller.errors import ControllerError
from autoscaler.errors import InvalidInputError
from coadapt_common.atomic import write_bytes_atomic

__all__ = [
    "DEFAULT_AGENT_KEY_GRACE_S",
    "MAX_CREDENTIAL_CHARS",
    "MIN_TOKEN_CHARS",
    "SHARED_CREDENTIALS_TTL_S",
    "ApiCredentials",
    "CredentialSource",
    "InsecureTokenFileError",
    "Principal",
    "Role",
    "SharedCredentialStore",
    "StoreCredentials",
    "TokenFile",
    "TokenFileError",
    "generate_tokens",
    "issue_scrape_token",
    "load_token",
    "load_tokens",
    "open_tokens",
    "rotate_agent_key",
    "rotate_scrape_token",
    "rotate_user_token",
    "write_secret_file",
    "write_token_file",
]

MIN_TOKEN_CHARS: Final = 16
MAX_CREDENTIAL_CHARS: Final = 512
"""A presented credential longer than this is refused before any work is done on it."""
DEFAULT_AGENT_KEY_GRACE_S: Final = 600.0
MAX_AGENT_KEY_GRACE_S: Final = 7 * 86400.0
AGENT_KEY_BYTES: Final = 32
_MAX_TOKEN_FILE_BYTES: Final = 64 * 1024
_MAX_SUBJECT_CHARS: Final = 200
SHARED_CREDENTIALS_TTL_S: Final = 1.0
"""How old the credentials a controller of a shared store checks may be: it reads the store's
row again at most this often (a rotation on another machine is honoured within it)."""
_SHARED_MARK: Final = "shared_store"

_log = logging.getLogger(__name__)


class Role(StrEnum):
    """Who a credential speaks for."""

    USER = "user"  # submits, lists, cancels jobs; reads logs, instances, costs
    AGENT = "agent"  # one instance's agent: that instance's endpoints only
    REPORT = "report"  # one job's trainers: that job's reports only
    SCRAPE = "scrape"  # a metrics scraper: GET /metrics only


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: its ``role``; ``subject`` the instance key (agent) or the job
    name (report), ``None`` for a user; ``renew``: the credential was made with the previous
    agent key (still honoured, during the grace period of a rotation)."""

    role: Role
    subject: str | None = None
    renew: bool = False


# ---- errors --------------------------------------------------------------------------------


class TokenFileError(ControllerError):
    """A tokens file cannot be created or used; ``path`` names it. The message says what is
    wrong and how to fix it, on one line, and never shows a token."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class InsecureTokenFileError(TokenFileError):
    """The tokens file is readable or writable by its group or by others."""


# ---- the credentials -----------------------------------------------------------------------


def _is_token(token: object) -> bool:
    """At least :data:`MIN_TOKEN_CHARS` printable ASCII characters, no space, at most
    :data:`MAX_CREDENTIAL_CHARS`."""
    return (
        isinstance(token, str)
        and MIN_TOKEN_CHARS <= len(token) <= MAX_CREDENTIAL_CHARS
        and all("!" <= c <= "~" for c in token)
    )


def _mac(key: bytes, role: Role, subject: str) -> str:
    digest = hmac.new(key, f"coadapt {role.value}\0{subject}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _check_subject(subject: str, what: str) -> None:
    if (
        not isinstance(subject, str)
        or not 1 <= len(subject) <= _MAX_SUBJECT_CHARS
        or not all("!" <= c <= "~" for c in subject)
    ):
        raise InvalidInputError(
            f"{what} must be 1-{_MAX_SUBJECT_CHARS} printable ASCII characters", field=what
        )


@dataclass(frozen=True)
class ApiCredentials:
    """The controller's secrets (none shown by ``repr``): the users' token, the agent key,
    during a rotation's grace period the previous agent key and until when it is honoured
    (wall-clock seconds), and the scrape token (``None`` until one is issued). See the module
    docstring."""

    user: str = field(repr=False)
    agent_key: bytes = field(repr=False)
    previous_agent_key: bytes | None = field(default=None, repr=False)
    previous_agent_key_until_s: float | None = None
    scrape: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not _is_token(self.user):
            raise InvalidInputError(
                f"the user token must be {MIN_TOKEN_CHARS}-{MAX_CREDENTIAL_CHARS} printable "
                "ASCII characters without spaces",
                field="user",
            )
        if self.scrape is not None and (
            not _is_token(self.scrape) or hmac.compare_digest(self.scrape, self.user)
        ):
            raise InvalidInputError(
                f"the scrape token must be {MIN_TOKEN_CHARS}-{MAX_CREDENTIAL_CHARS} printable "
                "ASCII characters without spaces, and not the users' token",
                field="scrape",
            )
        for name in ("agent_key", "previous_agent_key"):
            key = getattr(self, name)
            if key is not None and (not isinstance(key, bytes) or len(key) < AGENT_KEY_BYTES):
                raise InvalidInputError(
                    f"the {name.replace('_', ' ')} must be at least {AGENT_KEY_BYTES} bytes",
                    field=name,
                )
        if (self.previous_agent_key is None) != (self.previous_agent_key_until_s is None):
            raise InvalidInputError(
                "a previous agent key needs the time it is honoured until, and only then",
                field="previous_agent_key_until_s",
            )

    def current(self) -> ApiCredentials:
        """Itself (a fixed :class:`CredentialSource`)."""
        return self

    def agent_credential(self, instance_key: str) -> str:
        """The credential of the agent of ``instance_key``."""
        _check_subject(instance_key, "instance_key")
        return f"{Role.AGENT.value}.{instance_key}.{_mac(self.agent_key, Role.AGENT, instance_key)}"

    def report_credential(self, job: str) -> str:
        """The credential of the trainers of ``job`` (its reports only)."""
        _check_subject(job, "job")
        return f"{Role.REPORT.value}.{job}.{_mac(self.agent_key, Role.REPORT, job)}"

    def authenticate(self, presented: str, now_s: float) -> Principal | None:
        """Who ``presented`` speaks for, ``None`` when it is no valid credential. Every
        comparison with a secret is made in constant time."""
        if not _is_token(presented):
            return None
        if hmac.compare_digest(presented.encode(), self.user.encode()):
            return Principal(Role.USER)
        if self.scrape is not None and hmac.compare_digest(
            presented.encode(), self.scrape.encode()
        ):
            return Principal(Role.SCRAPE)
        kind, _, rest = presented.partition(".")
        subject, _, mac = rest.rpartition(".")
        if kind not in (Role.AGENT.value, Role.REPORT.value) or not subject or not mac:
            return None
        role = Role(kind)
        if hmac.compare_digest(mac.encode(), _mac(self.agent_key, role, subject).encode()):
            return Principal(role, subject)
        previous, until = self.previous_agent_key, self.previous_agent_key_until_s
        if (
            previous is not None
            and until is not None
            and now_s < until
            and hmac.compare_digest(mac.encode(), _mac(previous, role, subject).encode())
        ):
            return Principal(role, subject, renew=True)
        return None

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {"user": self.user, "agent_key": _b64(self.agent_key)}
        if self.previous_agent_key is not None:
            doc["previous_agent_key"] = _b64(self.previous_agent_key)
            doc["previous_agent_key_until_s"] = self.previous_agent_key_until_s
        if self.scrape is not None:
            doc["scrape"] = self.scrape
        return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


class CredentialSource(Protocol):
    """What the API checks credentials against: a fixed :class:`ApiCredentials`, or a
    :class:`TokenFile` that follows a rotation."""

    def current(self) -> ApiCredentials: ...


def _b64(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode()


def _new_credentials(user: str | None = None, agent_key: bytes | None = None) -> ApiCredentials:
    return ApiCredentials(
        user=user or secrets.token_urlsafe(32),
        agent_key=agent_key or secrets.token_bytes(AGENT_KEY_BYTES),
    )


# ---- the tokens file -----------------------------------------------------------------------


def _write(path: Path, credentials: ApiCredentials, *, replace: bool) -> None:
    """The tokens file, 0600 from its creation (whatever the umask), written whole or not at
    all (a temporary file, fsynced, renamed into place)."""
    try:
        write_bytes_atomic(path, credentials.to_json(), durable=True, mode=0o600, replace=replace)
    except FileExistsError as e:
        raise TokenFileError(
            f"{path}: a tokens file already exists there; use it, or replace its secrets with "
            "`coadapt tokens rotate`",
            path=str(path),
        ) from e
    except OSError as e:
        raise TokenFileError(
            f"{path}: cannot write the tokens file ({e.strerror or e}); make its folder "
            "writable by this user",
            path=str(path),
        ) from e


def generate_tokens(path: str | Path, *, overwrite: bool = False) -> ApiCredentials:
    """Create the tokens file ``path`` with a new users' token and a new agent key (see
    :func:`_write`). Refuses (:class:`TokenFileError`) when ``path`` exists, unless
    ``overwrite`` (new secrets replace the old ones atomically, no grace period)."""
    p = Path(path)
    credentials = _new_credentials()
    _write(p, credentials, replace=overwrite)
    return credentials


def _parse(p: Path | str, data: dict[str, Any]) -> ApiCredentials:
    def key(name: str) -> bytes | None:
        value = data.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f"{name} is not a string")
        try:
            return base64.urlsafe_b64decode(value.encode())
        except (ValueError, TypeError) as e:
            raise ValueError(f"{name} is not base64") from e

    try:
        agent_key = key("agent_key")
        if agent_key is None:
            raise ValueError("it has no agent key")
        until = data.get("previous_agent_key_until_s")
        if until is not None and (isinstance(until, bool) or not isinstance(until, int | float)):
            raise ValueError("previous_agent_key_until_s is not a number")
        return ApiCredentials(
            user=data.get("user", ""),
            agent_key=agent_key,
            previous_agent_key=key("previous_agent_key"),
            previous_agent_key_until_s=None if until is None else float(until),
            scrape=data.get("scrape"),
        )
    except (ValueError, InvalidInputError) as e:
        raise TokenFileError(
            f"{p}: not a usable tokens file ({e}); restore it from a backup, or make new "
            "secrets with `coadapt tokens rotate all` (agents and running jobs then need a "
            "restart of the cluster)",
            path=str(p),
        ) from e


def load_tokens(path: str | Path) -> ApiCredentials:
    """Read the tokens file ``path`` (see :func:`generate_tokens`). Refuses, with
    :class:`InsecureTokenFileError`, a file its group or others may read or write (checked on
    the opened file, so it cannot be swapped between the check and the read), and with
    :class:`TokenFileError` one that is missing, not a regular file, or malformed."""
    p = Path(path)
    return _parse(p, _read_token_file(p))


def load_token(path: str | Path, role: str) -> str:
    """One role's token (``"agent"`` or ``"user"``) from ``path``: the controller's tokens
    file (``user``), or a file holding only that role's (an agent's own credential; the
    users' token a CLI keeps for a deployed cluster). The same refusals as
    :func:`load_tokens`."""
    p = Path(path)
    token = _read_token_file(p).get(role)
    if not _is_token(token):
        raise TokenFileError(
            f"{p}: it holds no {role} token; write the {role} token there, or point to the "
            "file that holds it",
            path=str(p),
        )
    return str(token)


def write_token_file(path: str | Path, role: str, token: str) -> None:
    """A file holding one role's token, ``{"<role>": token}``, 0600 (an agent's credential:
    what :func:`load_token` reads); its folder is made 0700 when missing."""
    p = Path(path)
    if not _is_token(token):
        raise InvalidInputError(f"not a {role} token", field=role)
    try:
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = (json.dumps({role: token}) + "\n").encode()
        write_bytes_atomic(p, data, durable=True, mode=0o600, replace=True)
    except OSError as e:
        raise TokenFileError(
            f"{p}: cannot write the {role} token file ({e.strerror or e}); make its folder "
            "writable by this user",
            path=str(p),
        ) from e


def write_secret_file(path: str | Path, token: str) -> None:
    """A file holding ``token`` alone (no newline, no JSON: what a Prometheus
    ``credentials_file`` reads), 0600 from its creation, written whole or not at all."""
    p = Path(path)
    if not _is_token(token):
        raise InvalidInputError("not a token", field="token")
    try:
        write_bytes_atomic(p, token.encode(), durable=True, mode=0o600, replace=True)
    except OSError as e:
        raise TokenFileError(
            f"{p}: cannot write the token file ({e.strerror or e}); make its folder writable "
            "by this user",
            path=str(p),
        ) from e


def _read_token_file(p: Path) -> dict[str, Any]:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as e:
        raise TokenFileError(
            f"{p}: no tokens file there; check the path (`coadapt up` creates the cluster's "
            "in its state folder)",
            path=str(p),
        ) from e
    except OSError as e:
        raise TokenFileError(
            f"{p}: cannot open the tokens file ({e.strerror or e}); run as the user that owns it",
            path=str(p),
        ) from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenFileError(
                f"{p}: the tokens file is not a regular file; point to the file itself",
                path=str(p),
            )
        if st.st_mode & 0o077:
            raise InsecureTokenFileError(
                f"{p}: the tokens file has mode {stat.S_IMODE(st.st_mode):04o}: others may "
                "read or change it; make it private (chmod 600) or generate new tokens",
                path=str(p),
            )
        raw = b""
        while len(raw) <= _MAX_TOKEN_FILE_BYTES:
            chunk = os.read(fd, _MAX_TOKEN_FILE_BYTES + 1)
            if not chunk:
                break
            raw += chunk
    except OSError as e:
        raise TokenFileError(
            f"{p}: cannot read the tokens file ({e.strerror or e}); check the disk and the "
            "file's owner",
            path=str(p),
        ) from e
    finally:
        os.close(fd)
    try:
        if len(raw) > _MAX_TOKEN_FILE_BYTES:
            raise ValueError("too large for a tokens file")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data
    except ValueError as e:  # the message never quotes the file's content
        raise TokenFileError(
            f"{p}: not a tokens file ({str(e).splitlines()[0][:80]}); restore it, or make new "
            "secrets with `coadapt tokens rotate all`",
            path=str(p),
        ) from e


def open_tokens(path: str | Path) -> TokenFile:
    """The controller's tokens file, made when missing (:func:`generate_tokens`). A file of an
    older coadapt, with one shared ``agent`` token and no agent key, gets an agent key and
    loses the shared token (rewritten whole): the users' token is kept."""
    p = Path(path)
    if not p.exists():
        generate_tokens(p)
    else:
        data = _read_token_file(p)
        if "agent_key" not in data and "agent" in data:
            user = data.get("user")
            if not _is_token(user):
                raise TokenFileError(
                    f"{p}: an old tokens file without a usable users' token; restore it, or "
                    "make new secrets with `coadapt tokens rotate all`",
                    path=str(p),
                )
            _write(p, _new_credentials(user=str(user)), replace=True)
            _log.info("%s: the shared agent token was replaced by an agent key", p)
    return TokenFile(p)


def _new_user_token(old: ApiCredentials) -> ApiCredentials:
    return dataclasses.replace(old, user=secrets.token_urlsafe(32))


def _new_scrape_token(old: ApiCredentials) -> ApiCredentials:
    return dataclasses.replace(old, scrape=secrets.token_urlsafe(32))


def _a_scrape_token(old: ApiCredentials) -> ApiCredentials:
    return old if old.scrape is not None else _new_scrape_token(old)


def _update(
    path: str | Path,
    change: Callable[[ApiCredentials], ApiCredentials],
    store: SharedCredentialStore | None,
) -> ApiCredentials:
    """Apply ``change`` to the credentials: those of the tokens file ``path``, or, with
    ``store``, the shared store's (one write transaction), of which ``path`` then gets the
    copy. A tokens file that is a shared store's copy is refused without ``store``."""
    p = Path(path)
    if store is None:
        data = _read_token_file(p)
        if data.get(_SHARED_MARK):
            raise TokenFileError(
                f"{p}: a copy of a shared store's credentials (the controllers check the "
                "store's); change them with --store postgresql://... (the store's URL)",
                path=str(p),
            )
        new = change(_parse(p, data))
        _write(p, new, replace=True)
        return new
    where = "the shared store's credentials"

    def change_doc(doc: str | None) -> str:
        if doc is None:
            raise TokenFileError(
                f"{where}: none yet; start `coadapt up --store ...` on it first (it makes them)",
                path=where,
            )
        return change(_parse_doc(where, doc)).to_json().decode()

    new = _parse_doc(where, store.update_api_credentials_doc(change_doc))
    write_shared_copy(p, new)
    return new


def rotate_user_token(
    path: str | Path, *, store: SharedCredentialStore | None = None
) -> ApiCredentials:
    """A new users' token in the tokens file ``path`` (with ``store``: in the shared store,
    ``path`` getting the copy); the old one is refused from the controller's next request
    (every controller's, within :data:`SHARED_CREDENTIALS_TTL_S`, on a shared store).
    Returns the new credentials."""
    return _update(path, _new_user_token, store)


def issue_scrape_token(path: str | Path, *, store: SharedCredentialStore | None = None) -> str:
    """The scrape token of the tokens file ``path`` (with ``store``: of the shared store),
    good for ``GET /metrics`` only, made and written there when it has none yet: issuing it
    again gives the same token."""
    if store is None:
        old = load_tokens(path)
        if old.scrape is not None:
            return old.scrape
    return _update(path, _a_scrape_token, store).scrape or ""


def rotate_scrape_token(
    path: str | Path, *, store: SharedCredentialStore | None = None
) -> ApiCredentials:
    """A new scrape token in the tokens file ``path`` (with ``store``: in the shared store)
    (made when it had none); the old one is refused from the controller's next request.
    Returns the new credentials."""
    return _update(path, _new_scrape_token, store)


def rotate_agent_key(
    path: str | Path,
    *,
    now_s: float,
    grace_s: float = DEFAULT_AGENT_KEY_GRACE_S,
    force: bool = False,
    store: SharedCredentialStore | None = None,
) -> ApiCredentials:
    """A new agent key in the tokens file ``path`` (with ``store``: in the shared store);
    credentials of the previous one are honoured for ``grace_s`` more seconds (agents and
    trainers renew meanwhile: see the module docstring). Refuses (:class:`TokenFileError`)
    while a previous key is still honoured, unless ``force`` (which drops it at once)."""
    p = Path(path)
    if not 0 < grace_s <= MAX_AGENT_KEY_GRACE_S:
        raise InvalidInputError(
            f"the grace period must be in (0, {MAX_AGENT_KEY_GRACE_S:.0f}] seconds, got {grace_s}",
            field="grace_s",
        )
    where = str(p) if store is None else "the shared store's credentials"

    def change(old: ApiCredentials) -> ApiCredentials:
        until = old.previous_agent_key_until_s
        if until is not None and now_s < until and not force:
            raise TokenFileError(
                f"{where}: the agent key was rotated less than its grace period ago (the "
                f"previous key is honoured for {until - now_s:.0f} s more); rotate again after "
                "that, or with --force (agents that have not renewed yet are then refused)",
                path=where,
            )
        return ApiCredentials(
            user=old.user,
            agent_key=secrets.token_bytes(AGENT_KEY_BYTES),
            previous_agent_key=old.agent_key,
            previous_agent_key_until_s=now_s + grace_s,
            scrape=old.scrape,
        )

    return _update(p, change, store)


# ---- the shared store's credentials --------------------------------------------------------


class SharedCredentialStore(Protocol):
    """What a shared store offers for the credentials (:class:`~autoscaler.controller.store.
    credential_meta.CredentialMeta`): one document, created once, updated in a transaction."""

    def api_credentials_doc(self) -> str | None: ...

    def create_api_credentials_doc(self, doc: str) -> str: ...

    def update_api_credentials_doc(self, change: Callable[[str | None], str]) -> str: ...


def _parse_doc(where: str, doc: str) -> ApiCredentials:
    try:
        data = json.loads(doc)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:  # the message never quotes the document
        raise TokenFileError(
            f"{where}: not a credentials document ({str(e).splitlines()[0][:80]}); make new "
            "secrets with `coadapt tokens rotate all --store ...`",
            path=where,
        ) from e
    return _parse(where, data)


def write_shared_copy(path: str | Path, credentials: ApiCredentials) -> None:
    """The tokens file ``path`` as a copy of a shared store's ``credentials`` (0600, marked
    ``shared_store``: what the CLI on this machine reads; rotating it alone is refused)."""
    p = Path(path)
    doc = json.loads(credentials.to_json())
    doc[_SHARED_MARK] = True
    try:
        data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        write_bytes_atomic(p, data, durable=True, mode=0o600, replace=True)
    except OSError as e:
        raise TokenFileError(
            f"{p}: cannot write the tokens file ({e.strerror or e}); make its folder "
            "writable by this user",
            path=str(p),
        ) from e


class StoreCredentials:
    """The credentials of a shared store as a running controller sees them (a
    :class:`CredentialSource`): :meth:`current` reads the store's row again when the last read
    is :data:`SHARED_CREDENTIALS_TTL_S` old, and rewrites the machine's ``tokens.json`` copy
    when the row changed. A row that cannot be read or parsed leaves the last good
    credentials in force (logged). Thread-safe: ``store`` is used under this object's lock
    only, so it must be a store object of its own (its connection is not shared).

    Made by :meth:`open`: the store's credentials, put there first when it has none."""

    def __init__(
        self,
        store: SharedCredentialStore,
        copy_path: str | Path,
        credentials: ApiCredentials,
        doc: str,
        *,
        ttl_s: float = SHARED_CREDENTIALS_TTL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(copy_path)
        self._store = store
        self._ttl_s = ttl_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._credentials = credentials
        self._doc = doc
        self._read_at = monotonic()

    @classmethod
    def open(
        cls,
        store: SharedCredentialStore,
        copy_path: str | Path,
        *,
        ttl_s: float = SHARED_CREDENTIALS_TTL_S,
    ) -> StoreCredentials:
        """The shared store's credentials, after putting them there if it has none yet (those
        of the tokens file ``copy_path`` when there is one, so that its agents' credentials
        stay valid, else new ones; the first controller of the store wins), and writing the
        copy at ``copy_path``. :class:`TokenFileError` when the store's row is not usable."""
        p = Path(copy_path)
        where = "the shared store's credentials"
        doc = store.api_credentials_doc()
        if doc is None:
            seed = open_tokens(p).current() if p.exists() else _new_credentials()
            doc = store.create_api_credentials_doc(seed.to_json().decode())
            _log.info("the shared store's credentials are in the store")
        credentials = _parse_doc(where, doc)
        write_shared_copy(p, credentials)
        return cls(store, p, credentials, doc, ttl_s=ttl_s)

    def current(self) -> ApiCredentials:
        if self._monotonic() - self._read_at < self._ttl_s:
            return self._credentials
        with self._lock:
            if self._monotonic() - self._read_at < self._ttl_s:
                return self._credentials
            self._read_at = self._monotonic()
            try:
                doc = self._store.api_credentials_doc()
                if doc is not None and doc != self._doc:
                    self._credentials = _parse_doc("the shared store's credentials", doc)
                    self._doc = doc
                    _log.info("the shared store's credentials changed: read again")
                    write_shared_copy(self.path, self._credentials)
            except (ControllerError, InvalidInputError) as e:
                _log.warning("%s; keeping the credentials read before", e)
            return self._credentials


class TokenFile:
    """The tokens file as the running controller sees it: :meth:`current` reads it again when
    it changed (a rotation), at most one ``stat`` per call; a file that became unreadable or
    malformed leaves the last good credentials in force (logged once per change). Thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._credentials = load_tokens(self.path)
        self._seen = self._signature()

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def current(self) -> ApiCredentials:
        signature = self._signature()
        if signature == self._seen:
            return self._credentials
        with self._lock:
            if signature != self._seen:
                self._seen = signature
                try:
                    self._credentials = load_tokens(self.path)
                    _log.info("%s: credentials read again (changed)", self.path)
                except TokenFileError as e:
                    _log.warning("%s; keeping the credentials read before", e)
            return self._credentials
