"""Node-side spot interruption watcher over the EC2 instance metadata service (IMDSv2).

Runs on the instance itself (the coadapt agent), so it uses only the standard library: no
boto3. IMDSv2 protocol:

1. ``PUT /latest/api/token`` with header ``X-aws-ec2-metadata-token-ttl-seconds: <ttl>``
   returns a session token (plain text);
2. every ``GET /latest/meta-data/...`` carries ``X-aws-ec2-metadata-token: <token>``; a 401
   means the token expired or is unknown (we fetch a new one and retry once);
3. ``spot/instance-action`` and ``events/recommendations/rebalance`` answer 404 while there is
   nothing to report (``providers.aws.events`` documents the bodies).

Proxies are never used for IMDS (``169.254.169.254`` must be reached directly, whatever
``HTTP_PROXY`` says). Network failures raise ``TransientError``; the caller keeps polling.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Callable

from coadapt_common.clock import Clock, SystemClock
from coadapt_common.http import credential_opener
from providers.aws.events import parse_imds_instance_action, parse_imds_rebalance
from providers.base import InterruptionNotice
from providers.errors import ProviderError, TransientError

log = logging.getLogger(__name__)

DEFAULT_IMDS_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"


class ImdsPoller:
    """Polls IMDSv2 for a spot interruption notice or a rebalance recommendation.

    ``poll()`` returns the notices that are new since the previous poll (a notice stays
    visible in IMDS until the instance goes; it is reported once). ``base_url`` is injectable
    (tests run a local fake server); ``clock`` drives token expiry and ``watch``'s sleeps.
    """

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_IMDS_URL,
        clock: Clock | None = None,
        timeout_s: float = 1.0,
        token_ttl_s: int = 21600,
        instance_id: str | None = None,
    ) -> None:
        if not 1 <= token_ttl_s <= 21600:
            raise ValueError("token_ttl_s must be in 1..21600 (the IMDSv2 limits)")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self._base_url = base_url.rstrip("/")
        self._clock: Clock = clock or SystemClock()
        self._timeout_s = timeout_s
        self._token_ttl_s = token_ttl_s
        self._token: str | None = None
        self._token_expires_mono_s = 0.0
        self._instance_id = instance_id
        self._seen: set[tuple[str, str]] = set()
        # No proxies for a link-local metadata address, and no redirect: the session token
        # goes to the metadata service only.
        self._opener = credential_opener()

    # -- HTTP ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        req = urllib.request.Request(self._base_url + path, method=method, headers=headers)
        try:
            with self._opener.open(req, timeout=self._timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read() if err.fp is not None else b""
        except (urllib.error.URLError, OSError) as err:
            raise TransientError(f"IMDS unreachable at {self._base_url}: {err}") from err

    def _fetch_token(self) -> str:
        # Refresh a minute early so a token never expires between fetch and use.
        status, body = self._request("PUT", TOKEN_PATH, {TOKEN_TTL_HEADER: str(self._token_ttl_s)})
        if status != 200 or not body:
            raise TransientError(f"IMDS token request failed: HTTP {status}", code=str(status))
        self._token = body.decode("ascii").strip()
        self._token_expires_mono_s = (
            self._clock.monotonic_s() + self._token_ttl_s - min(60.0, self._token_ttl_s / 2)
        )
        return self._token

    def _current_token(self) -> str:
        if self._token is None or self._clock.monotonic_s() >= self._token_expires_mono_s:
            return self._fetch_token()
        return self._token

    def get(self, path: str) -> str | None:
        """GET a metadata path with a session token; ``None`` on 404."""
        for attempt in range(2):
            status, body = self._request("GET", path, {TOKEN_HEADER: self._current_token()})
            if status == 200:
                return body.decode("utf-8")
            if status == 404:
                return None
            if status == 401 and attempt == 0:
                self._token = None  # expired or unknown: fetch a fresh one, once
                continue
            raise TransientError(f"IMDS GET {path}: HTTP {status}", code=str(status))
        raise TransientError(f"IMDS GET {path}: token refused twice", code="401")

    # -- notices ---------------------------------------------------------------------------

    def instance_id(self) -> str:
        """This instance's id (read once from IMDS, then cached)."""
        if self._instance_id is None:
            value = self.get(INSTANCE_ID_PATH)
            if not value:
                raise TransientError("IMDS has no instance-id")
            self._instance_id = value.strip()
        return self._instance_id

    def _read(self) -> list[tuple[tuple[str, str], InterruptionNotice]]:
        now_s = self._clock.now_s()
        instance_id = self.instance_id()
        found: list[tuple[tuple[str, str], InterruptionNotice]] = []
        action_body = self.get(INSTANCE_ACTION_PATH)
        action = parse_imds_instance_action(
            action_body, instance_id=instance_id, noticed_at_s=now_s
        )
        if action is not None and action_body is not None:
            found.append(((INSTANCE_ACTION_PATH, action_body.strip()), action))
        rebalance_body = self.get(REBALANCE_PATH)
        rebalance = parse_imds_rebalance(
            rebalance_body, instance_id=instance_id, noticed_at_s=now_s
        )
        if rebalance is not None and rebalance_body is not None:
            found.append(((REBALANCE_PATH, rebalance_body.strip()), rebalance))
        return found

    def current(self) -> list[InterruptionNotice]:
        """Every notice IMDS shows right now (spot action first), seen before or not."""
        return [notice for _, notice in self._read()]

    def poll(self) -> list[InterruptionNotice]:
        """Notices not reported by an earlier ``poll``.

        A notice is identified by its path and body: the same instance-action stays visible
        until the instance goes and is reported once; a new rebalance recommendation (new
        ``noticeTime``) is reported again.
        """
        fresh: list[InterruptionNotice] = []
        for key, notice in self._read():
            if key not in self._seen:
                self._seen.add(key)
                fresh.append(notice)
        return fresh

    def watch(
        self,
        on_notice: Callable[[InterruptionNotice], None],
        *,
        interval_s: float = 5.0,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Poll every ``interval_s`` until ``should_stop()``; call ``on_notice`` for each new one.

        IMDS failures are logged and polling goes on (the metadata service can blip).
        """
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        while not should_stop():
            try:
                for notice in self.poll():
                    on_notice(notice)
            except ProviderError as err:
                log.warning("IMDS poll failed: %s", err)
            if should_stop():
                break
            self._clock.sleep(interval_s)
