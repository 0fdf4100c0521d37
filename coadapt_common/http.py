"""HTTP for requests that carry a credential: one opener, shared by every client that sends one.

urllib's default opener follows a redirect, and for a 301/302/303/307/308 it re-sends every
header but the body's (``Authorization`` included) to wherever the ``Location`` points: a
controller, proxy or storage endpoint that answers with a redirect would receive the bearer
token and hand it to another host. :func:`credential_opener` never follows one: the 3xx comes
back as the :class:`urllib.error.HTTPError` it is, and the caller treats it as a failed request.
"""

from __future__ import annotations

import urllib.request
from typing import Any

__all__ = ["credential_opener"]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Answers a redirect as an error instead of following it."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def credential_opener(*, proxies: bool = False) -> urllib.request.OpenerDirector:
    """An opener that never follows a redirect. ``proxies``: honour the proxy environment
    variables (only for ``https://`` endpoints, where a proxy tunnels TLS and never sees the
    credential); by default none is used, so a plain-``http://`` request and its token go only
    to the address it names."""
    handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
    if not proxies:
        handlers.insert(0, urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(*handlers)
