"""Calling AWS: botocore clients without hidden retries, our retry policy on our clock.

botocore's own retry loop sleeps on the real clock and would retry throttling behind our
back; clients made here have it switched off (``total_max_attempts=1``) so that every retry is
``providers.retry.call_with_retries`` on the injected clock, and only for ``TransientError``.
Retrying a launch is safe because every launch call carries a deterministic ``ClientToken``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from coadapt_common.clock import Clock
from providers.aws.errors import translate
from providers.retry import RetryPolicy, call_with_retries

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0


def make_client(
    service: str,
    *,
    region: str,
    session: Any | None = None,
    endpoint_url: str | None = None,
    max_pool_connections: int = 10,
) -> Any:
    """A boto3 client for ``service`` with botocore retries off and bounded timeouts."""
    import boto3  # lazy: only the AWS adapter needs boto3
    from botocore.config import Config

    config = Config(
        region_name=region,
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        max_pool_connections=max_pool_connections,
    )
    session = session or boto3.session.Session(region_name=region)
    return session.client(service, region_name=region, endpoint_url=endpoint_url, config=config)


class AwsCaller:
    """Calls client operations with typed errors and retries of transient failures only."""

    def __init__(
        self, *, clock: Clock, policy: RetryPolicy, rng: random.Random | None = None
    ) -> None:
        self.clock = clock
        self.policy = policy
        self.rng = rng or random.Random()

    def call(
        self, client: Any, operation: str, params: Mapping[str, Any], *, pool: str | None = None
    ) -> dict[str, Any]:
        """``client.<operation>(**params)``; raises a ``ProviderError`` subclass on failure."""
        method: Callable[..., dict[str, Any]] = getattr(client, operation)

        def once() -> dict[str, Any]:
            try:
                return method(**params)
            except (ClientError, BotoCoreError) as exc:
                raise translate(exc, pool=pool) from exc

        return call_with_retries(once, clock=self.clock, policy=self.policy, rng=self.rng)

    def pages(
        self, client: Any, operation: str, params: Mapping[str, Any], result_key: str
    ) -> Iterator[Any]:
        """Items under ``result_key`` of every page, following ``NextToken``.

        Each page is its own call, retried on its own, so a throttled page does not restart
        the listing.
        """
        token: str | None = None
        seen_tokens: set[str] = set()
        while True:
            page_params = dict(params)
            if token:
                page_params["NextToken"] = token
            response = self.call(client, operation, page_params)
            yield from response.get(result_key, []) or []
            token = response.get("NextToken") or None
            if token is None or token in seen_tokens:  # a repeated token would loop forever
                return
            seen_tokens.add(token)
