"""Ready-made fake GCP environments: ``FakeGceServer`` + a ``GcpProvider`` wired to it.

``FakeGcpEnv`` is what tests and benchmarks build on: one fake Compute API server on
``127.0.0.1`` and a provider using the real google-cloud-compute REST client against it
(``AnonymousCredentials``), sharing one ``FakeClock`` so operation waits cost no wall time.

``fake_benchmark_env(cluster_id)`` is the entry point of ``benchmarks/provider_ops.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from coadapt_common.clock import FakeClock
from emulators.gce_server import FakeGceServer
from providers.base import Market, Offering
from providers.gcp import naming
from providers.gcp.config import GcpConfig, parse_instance_type
from providers.gcp.provider import GcpProvider
from providers.retry import RetryPolicy

TEST_PROJECT = "coadapt-test"
TEST_ZONES = ("us-central1-a", "us-central1-b", "us-east1-c")


def anonymous_credentials() -> Any:
    """google-auth's ``AnonymousCredentials`` (imported lazily: google import is slow)."""
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()


class FakeGcpEnv:
    """A started ``FakeGceServer`` and helpers to make providers for it and poke its state."""

    def __init__(
        self,
        *,
        project: str = TEST_PROJECT,
        zones: tuple[str, ...] = TEST_ZONES,
        clock: FakeClock | None = None,
        **server_kwargs: Any,
    ) -> None:
        self.clock = clock or FakeClock()
        self.project = project
        self.zones = zones
        self.server = FakeGceServer(project, zones, clock=self.clock, **server_kwargs).start()

    def config(self, **overrides: Any) -> GcpConfig:
        """A ``GcpConfig`` for the fake project and zones (``overrides`` replace fields)."""
        fields: dict[str, Any] = {"project": self.project, "zones": self.zones}
        fields.update(overrides)
        return GcpConfig(**fields)

    def provider(self, config: GcpConfig | None = None, **kwargs: Any) -> GcpProvider:
        """A ``GcpProvider`` talking to the fake server on the shared ``FakeClock``."""
        kwargs.setdefault("clock", self.clock)
        kwargs.setdefault("retry_policy", RetryPolicy(max_attempts=4, base_delay_s=0.5))
        return GcpProvider(
            config or self.config(),
            api_endpoint=self.server.endpoint,
            credentials=anonymous_credentials(),
            **kwargs,
        )

    @staticmethod
    def pool_of(offering: Offering) -> tuple[str, str, str, str]:
        """``(zone, machine type, attached accelerator or "", provisioning model)``."""
        spec = parse_instance_type(offering.instance_type)
        model = "SPOT" if offering.market is Market.SPOT else "STANDARD"
        return offering.zone, spec.machine_type, spec.accelerator_type or "", model

    def exhaust(self, offering: Offering) -> None:
        """No capacity left in that pool (only that market)."""
        zone, machine, _, _ = self.pool_of(offering)
        self.server.exhaust(zone, machine, market=offering.market.value)

    def launch_attempts(self, offering: Offering) -> int:
        zone, machine, accelerator, model = self.pool_of(offering)
        return self.server.launch_attempts(zone, machine, model, accelerator)

    def has_live_instance(self, instance_id: str) -> bool:
        zone, name = naming.parse_instance_id(instance_id)
        return self.server.has_live_instance(zone, name)

    def preempt(self, instance_id: str) -> str:
        zone, name = naming.parse_instance_id(instance_id)
        return self.server.preempt(zone, name)

    def add_foreign_instance(self, **kwargs: Any) -> str:
        """Create an instance the test cluster does not own; its coadapt id."""
        zone = kwargs.pop("zone", self.zones[0])
        name = self.server.add_foreign_instance(zone, **kwargs)
        return naming.format_instance_id(zone, name)

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> FakeGcpEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def fake_benchmark_env(
    cluster_id: str,
) -> Iterator[tuple[GcpProvider, list[Offering], Callable[[], dict[str, int]]]]:
    """``(provider, offerings, call_counter)`` over a fresh fake GCE server.

    ``offerings``: the single-GPU spot pools, cheapest first (unlimited capacity).
    ``call_counter()``: Compute API calls served so far by kind -- ``launch`` (insert,
    bulkInsert), ``list`` (instance get/list/aggregatedList), ``terminate`` (delete),
    ``operations`` (zone operation wait/get/list), ``other``; their sum is every API call.
    ``cluster_id`` is not needed to set the environment up (the caller uses it).
    """
    del cluster_id
    with FakeGcpEnv() as env:
        provider = env.provider()
        provider.warm_up()  # client construction and the google import are set-up, not launch
        pools = sorted(
            (o for o in provider.offerings() if o.market is Market.SPOT and o.gpus == 1),
            key=lambda o: (o.price_usd_per_hour or 0.0, o.key),
        )
        yield provider, pools, env.server.call_kinds


__all__ = [
    "TEST_PROJECT",
    "TEST_ZONES",
    "FakeGcpEnv",
    "anonymous_credentials",
    "fake_benchmark_env",
]
