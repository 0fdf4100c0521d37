"""Node-side GCE preemption notice: the metadata server's ``instance/preempted`` value.

On a GCE VM, ``GET http://metadata.google.internal/computeMetadata/v1/instance/preempted``
with header ``Metadata-Flavor: Google`` returns ``FALSE`` until the VM is preempted, then
``TRUE``; Compute Engine gives the guest about 30 seconds before it stops or deletes it.
``?wait_for_change=true`` (with ``last_etag`` and ``timeout_sec``) holds the request until the
value changes, so a watcher reacts within milliseconds without busy polling.

Stdlib only (``urllib``): the node agent needs neither google-cloud-compute nor credentials.
The base URL is injectable, so tests point it at ``FakeGceServer.metadata_base_url``.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

from coadapt_common.clock import Clock
from providers.base import InterruptionKind, InterruptionNotice
from providers.errors import ProviderError, TransientError
from providers.gcp.naming import format_instance_id, last_segment
from providers.gcp.parse import parse_preempted_value

DEFAULT_METADATA_BASE_URL = "http://metadata.google.internal"
INSTANCE_PATH = "/computeMetadata/v1/instance/"
PREEMPTION_NOTICE_S = 30.0
SOURCE_METADATA = "gce-metadata"


def read_instance_metadata(
    base_url: str, key: str, *, timeout_s: float, params: dict[str, str] | None = None
) -> tuple[str, str]:
    """``(body, etag)`` of ``instance/<key>``; typed errors for transport/HTTP failures."""
    url = base_url.rstrip("/") + INSTANCE_PATH + key
    if params:
        url += "?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if response.headers.get("Metadata-Flavor", "").lower() != "google":
                raise ProviderError(f"{url} did not answer as a GCE metadata server")
            return response.read().decode(), response.headers.get("ETag", "")
    except urllib.error.HTTPError as err:
        if err.code >= 500:
            raise TransientError(f"metadata server {err.code} for {url}") from err
        raise ProviderError(f"metadata server {err.code} for {url}", code=str(err.code)) from err
    except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
        raise TransientError(f"metadata server unreachable at {url}: {err}") from err


def discover_instance_id(
    base_url: str = DEFAULT_METADATA_BASE_URL, *, timeout_s: float = 5.0
) -> str:
    """This VM's coadapt instance id ``"<zone>/<name>"``, read from the metadata server."""
    zone, _ = read_instance_metadata(base_url, "zone", timeout_s=timeout_s)
    name, _ = read_instance_metadata(base_url, "name", timeout_s=timeout_s)
    return format_instance_id(last_segment(zone.strip()), name.strip())


class PreemptionWatcher:
    """Watches ``instance/preempted`` for one VM and turns ``TRUE`` into a notice.

    ``poll()`` reads once; ``wait(timeout_s)`` blocks (server-side ``wait_for_change``) until
    the value changes or the timeout passes. Both return the notice once the VM is preempted
    (the same notice on every later call: its deadline is fixed at first sight,
    ``PREEMPTION_NOTICE_S`` after it on the injected clock) and ``None`` before.
    """

    def __init__(
        self,
        instance_id: str,
        *,
        clock: Clock,
        base_url: str = DEFAULT_METADATA_BASE_URL,
        http_timeout_s: float = 5.0,
        notice_window_s: float = PREEMPTION_NOTICE_S,
    ) -> None:
        self.instance_id = instance_id
        self._clock = clock
        self._base_url = base_url
        self._http_timeout_s = http_timeout_s
        self._notice_window_s = notice_window_s
        self._etag = ""
        self._notice: InterruptionNotice | None = None

    def _seen(self, body: str, etag: str) -> InterruptionNotice | None:
        self._etag = etag or self._etag
        try:
            preempted = parse_preempted_value(body)
        except ValueError as err:
            raise ProviderError(str(err)) from err
        if preempted and self._notice is None:
            now_s = self._clock.now_s()
            self._notice = InterruptionNotice(
                instance_id=self.instance_id,
                kind=InterruptionKind.PREEMPTED,
                deadline_s=now_s + self._notice_window_s,
                source=SOURCE_METADATA,
                noticed_at_s=now_s,
            )
        return self._notice

    def poll(self) -> InterruptionNotice | None:
        """Read ``instance/preempted`` once."""
        body, etag = read_instance_metadata(
            self._base_url, "preempted", timeout_s=self._http_timeout_s
        )
        return self._seen(body, etag)

    def wait(self, timeout_s: float) -> InterruptionNotice | None:
        """Block until the value changes (or ``timeout_s``, whole seconds, at least 1)."""
        if self._notice is not None:
            return self._notice
        seconds = max(1, int(timeout_s))
        params = {"wait_for_change": "true", "timeout_sec": str(seconds)}
        if self._etag:
            params["last_etag"] = self._etag
        body, etag = read_instance_metadata(
            self._base_url,
            "preempted",
            timeout_s=seconds + self._http_timeout_s,
            params=params,
        )
        return self._seen(body, etag)
