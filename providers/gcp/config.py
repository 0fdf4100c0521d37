"""Configuration of the GCP provider (pure values; no google import).

``GcpConfig`` says *which* project and zones to use, *which* GPU machine shapes to offer
(``MachineSpec``), and how to build an instance (image, network, disk). Everything is validated
when the config is built, so a bad config fails at start-up, not at the first launch.

Instance-type naming: an ``Offering.instance_type`` is the GCE machine type for shapes with
built-in GPUs (``g2-standard-4``, ``a2-highgpu-1g``) and ``<machine>+<count>x<accelerator>``
for N1 machines with attached GPUs (``n1-standard-8+1xnvidia-tesla-t4``), so two N1 pools
with different GPUs have different offering keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from providers.base import Market
from providers.errors import InvalidRequestError
from providers.gcp import catalog

_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_PROJECT_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_INSTANCE_TYPE_RE = re.compile(r"^(?P<machine>[a-z0-9-]+)\+(?P<count>[0-9]+)x(?P<acc>[a-z0-9-]+)$")
_NETWORK_TAG_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class MachineSpec:
    """One GPU machine shape to offer.

    ``accelerator_type`` / ``accelerator_count`` are for N1 machines with *attached* GPUs
    (``guestAccelerators``); leave them empty for G2/A2 shapes, whose GPUs are built in.
    """

    machine_type: str
    accelerator_type: str | None = None
    accelerator_count: int = 0

    def __post_init__(self) -> None:
        shape = catalog.MACHINE_SHAPES.get(self.machine_type)
        if shape is None:
            raise InvalidRequestError(
                f"unknown GCE machine type {self.machine_type!r}; known: "
                f"{sorted(catalog.MACHINE_SHAPES)}"
            )
        if shape.builtin_accelerator is not None:
            if self.accelerator_type is not None or self.accelerator_count:
                raise InvalidRequestError(
                    f"{self.machine_type} has built-in GPUs; do not attach accelerators"
                )
            return
        if self.accelerator_type is None:
            raise InvalidRequestError(
                f"{self.machine_type} has no GPU: name an accelerator_type to attach"
            )
        acc = catalog.ACCELERATORS.get(self.accelerator_type)
        if acc is None or not acc.allowed_counts:
            raise InvalidRequestError(
                f"accelerator {self.accelerator_type!r} cannot be attached to an N1 machine"
            )
        if self.accelerator_count not in acc.allowed_counts:
            raise InvalidRequestError(
                f"{self.accelerator_type} can be attached {acc.allowed_counts} at a time, "
                f"not {self.accelerator_count}"
            )

    @property
    def instance_type(self) -> str:
        """The ``Offering.instance_type`` for this shape (see the module docstring)."""
        if self.accelerator_type is None:
            return self.machine_type
        return f"{self.machine_type}+{self.accelerator_count}x{self.accelerator_type}"

    @property
    def gpu_accelerator(self) -> str:
        shape = catalog.machine_shape(self.machine_type)
        return shape.builtin_accelerator or str(self.accelerator_type)

    @property
    def gpus(self) -> int:
        shape = catalog.machine_shape(self.machine_type)
        return shape.builtin_accelerator_count or self.accelerator_count

    @property
    def gpu_type(self) -> str:
        return catalog.accelerator(self.gpu_accelerator).gpu_type

    def price_usd_per_hour(self, market: Market) -> float | None:
        """Catalogue price of one instance of this shape on ``market`` (see ``catalog``)."""
        shape = catalog.machine_shape(self.machine_type)
        spot = market is Market.SPOT
        price = shape.spot_usd_per_hour if spot else shape.on_demand_usd_per_hour
        if self.accelerator_type is not None:
            acc = catalog.accelerator(self.accelerator_type)
            per_gpu = acc.spot_usd_per_gpu_hour if spot else acc.on_demand_usd_per_gpu_hour
            if per_gpu is None:
                return None
            price += per_gpu * self.accelerator_count
        return round(price, 6)


def parse_instance_type(instance_type: str) -> MachineSpec:
    """Inverse of ``MachineSpec.instance_type``; ``InvalidRequestError`` when malformed."""
    m = _INSTANCE_TYPE_RE.match(instance_type)
    if m is None:
        return MachineSpec(instance_type)
    return MachineSpec(m["machine"], m["acc"], int(m["count"]))


DEFAULT_MACHINES: tuple[MachineSpec, ...] = (
    MachineSpec("g2-standard-4"),
    MachineSpec("a2-highgpu-1g"),
    MachineSpec("n1-standard-8", "nvidia-tesla-t4", 1),
    MachineSpec("n1-standard-8", "nvidia-tesla-v100", 1),
)


@dataclass(frozen=True)
class GcpConfig:
    """Everything the GCP provider needs to know besides credentials, endpoint and clock.

    * ``project`` / ``zones``: where instances go; offerings are ``machines x zones x markets``.
    * ``image`` / ``network`` / ``subnetwork`` / ``disk_size_gb`` / ``disk_type`` /
      ``external_ip`` / ``service_account_email``: how each instance is built. The default image
      is plain Debian; for training set a GPU-driver image (e.g. a Deep Learning VM family).
    * ``use_bulk_insert``: create a pool's instances with one ``instances.bulkInsert`` call
      (default) instead of one ``instances.insert`` per instance.
    * ``http_timeout_s``: per HTTP request. ``operation_timeout_s``: how long a launch waits
      for a pool's insert operation; ``delete_wait_s``: how long ``terminate`` waits for delete
      operations (0 = do not wait). ``operation_poll_interval_s``: sleep between polls.
    * ``list_page_size``: ``maxResults`` for list calls (GCE caps it at 500).
    * ``check_zone_availability``: ask the API once (``acceleratorTypes.aggregatedList``) which
      zones have each GPU, and offer only those pools.
    * ``preemption_lookback_s``: preemption operations older than this before the provider
      started are history, not news (``interruptions``).
    * ``network_tags``: network tags on every instance (what firewall rules select nodes by,
      e.g. the terraform module's ``coadapt-<cluster>-node``).
    * ``price_overrides``: ``{"<instance_type>/<market>": usd_per_hour}``, replacing catalogue
      prices (e.g. ``{"g2-standard-4/spot": 0.25}``).
    """

    project: str
    zones: tuple[str, ...]
    machines: tuple[MachineSpec, ...] = DEFAULT_MACHINES
    markets: tuple[Market, ...] = (Market.SPOT, Market.ON_DEMAND)
    image: str = "projects/debian-cloud/global/images/family/debian-12"
    network: str = "global/networks/default"
    subnetwork: str | None = None
    disk_size_gb: int = 100
    disk_type: str = "pd-balanced"
    external_ip: bool = True
    service_account_email: str | None = None
    use_bulk_insert: bool = True
    http_timeout_s: float = 60.0
    operation_timeout_s: float = 600.0
    delete_wait_s: float = 120.0
    operation_poll_interval_s: float = 2.0
    list_page_size: int = 500
    check_zone_availability: bool = False
    preemption_lookback_s: float = 3600.0
    price_overrides: Mapping[str, float] = field(default_factory=dict, hash=False)
    network_tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.project, str) or not _PROJECT_RE.match(self.project):
            raise InvalidRequestError(f"not a GCP project id: {self.project!r}")
        if isinstance(self.zones, str) or not self.zones:
            raise InvalidRequestError("zones must be a non-empty tuple of zone names")
        for zone in self.zones:
            if not isinstance(zone, str) or not _ZONE_RE.match(zone):
                raise InvalidRequestError(f"not a GCE zone name: {zone!r}")
        if len(set(self.zones)) != len(self.zones):
            raise InvalidRequestError("duplicate zones")
        if not self.machines:
            raise InvalidRequestError("machines must name at least one GPU machine shape")
        types = [m.instance_type for m in self.machines]
        if len(set(types)) != len(types):
            raise InvalidRequestError("duplicate machine shapes")
        if not self.markets or any(not isinstance(m, Market) for m in self.markets):
            raise InvalidRequestError("markets must be a non-empty tuple of Market values")
        if not self.image:
            raise InvalidRequestError("image is required")
        if isinstance(self.network_tags, str) or not all(
            isinstance(t, str) and _NETWORK_TAG_RE.match(t) for t in self.network_tags
        ):
            raise InvalidRequestError(
                "network_tags must be a tuple of lowercase names (letters, digits, '-')"
            )
        object.__setattr__(self, "network_tags", tuple(self.network_tags))
        if isinstance(self.disk_size_gb, bool) or self.disk_size_gb < 10:
            raise InvalidRequestError("disk_size_gb must be at least 10")
        for name in ("http_timeout_s", "operation_timeout_s", "operation_poll_interval_s"):
            if getattr(self, name) <= 0:
                raise InvalidRequestError(f"{name} must be positive")
        if self.delete_wait_s < 0 or self.preemption_lookback_s < 0:
            raise InvalidRequestError("delete_wait_s and preemption_lookback_s must be >= 0")
        if not 1 <= self.list_page_size <= 500:
            raise InvalidRequestError("list_page_size must be within 1..500 (GCE's cap)")
        for key, price in self.price_overrides.items():
            if not isinstance(price, int | float) or price <= 0:
                raise InvalidRequestError(f"price override {key!r} must be a positive number")

    def machine_for(self, instance_type: str) -> MachineSpec | None:
        """The configured shape whose ``instance_type`` is ``instance_type``, if any."""
        for m in self.machines:
            if m.instance_type == instance_type:
                return m
        return None
