"""Configuration of the AWS provider (plain data; no boto3 needed to build it).

The provider is cluster-agnostic: one ``AwsConfig`` describes *where and how* instances are
launched in one region (image or launch template, subnets per zone, security groups, instance
profile, candidate GPU types, which EC2 API to launch with); the cluster id comes with each
call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from providers.aws.catalog import DEFAULT_GPU_INSTANCE_TYPES
from providers.errors import InvalidRequestError


class LaunchApi(StrEnum):
    """Which EC2 API ``launch`` uses.

    ``CREATE_FLEET``: one ``CreateFleet`` call of type ``instant`` over all the request's pools
    (spot: ``price-capacity-optimized``; on-demand: ``lowest-price``); EC2 picks the pools.
    ``RUN_INSTANCES``: ``RunInstances`` pool by pool (cheapest known price first; spot through
    ``InstanceMarketOptions``) until the count is filled.
    """

    CREATE_FLEET = "create-fleet"
    RUN_INSTANCES = "run-instances"


@dataclass(frozen=True)
class LaunchTemplateRef:
    """A launch template you manage yourself: by id or by name, at a version.

    With ``CREATE_FLEET`` the template must carry the user data itself (EC2 Fleet cannot
    override it per request), so a launch request with ``user_data`` is refused; use
    ``image_id`` instead to let coadapt manage the template.
    """

    template_id: str | None = None
    name: str | None = None
    version: str = "$Default"

    def __post_init__(self) -> None:
        if (self.template_id is None) == (self.name is None):
            raise InvalidRequestError("LaunchTemplateRef needs exactly one of template_id, name")

    def as_spec(self) -> dict[str, str]:
        """The ``LaunchTemplateSpecification`` dict EC2 expects."""
        spec = {"Version": self.version}
        if self.template_id is not None:
            spec["LaunchTemplateId"] = self.template_id
        else:
            spec["LaunchTemplateName"] = str(self.name)
        return spec


def _frozen_mapping(value: Mapping[str, object] | None) -> Mapping[str, object]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class AwsConfig:
    """Where and how the AWS provider launches.

    ``region``: the EC2 region (``us-east-1``). Exactly one of ``image_id`` (coadapt then
    manages a launch template per cluster and user data) and ``launch_template`` is required.
    ``subnets_by_zone``: subnet id per zone, keyed by zone name (``us-east-1a``) or zone id
    (``use1-az6``); when given, only those zones are offered. When empty, every available zone
    of the region is offered and instances go to its default subnet.
    ``instance_types``: EC2 ``instance-type`` filter values (exact names or ``g5.*``
    wildcards); non-GPU types among them are dropped.
    ``spot_max_price_usd_per_hour``: spot bid cap (``None``: capped at the on-demand price, the
    EC2 default). ``on_demand_prices_usd_per_hour``: price overrides for the built-in catalogue.
    ``interruption_queue_url``: the SQS queue an EventBridge rule delivers EC2 interruption
    events to; ``None`` disables ``interruptions()`` (it then returns nothing).
    ``delete_foreign_events``: whether events about instances the cluster does not own are
    deleted from that queue (right for a queue dedicated to one controller; set ``False`` for a
    queue shared by several clusters, whose foreign events then reappear for the others).
    ``spot_price_ttl_s``: how long ``offerings()`` reuses the last spot prices.
    ``describe_batch_size`` / ``terminate_batch_size``: ids per ``DescribeInstances`` filter /
    per ``TerminateInstances`` call (EC2 limits: 200 filter values, 1000 ids).
    """

    region: str
    image_id: str | None = None
    launch_template: LaunchTemplateRef | None = None
    subnets_by_zone: Mapping[str, str] = field(default_factory=dict)
    security_group_ids: tuple[str, ...] = ()
    iam_instance_profile_arn: str | None = None
    key_name: str | None = None
    instance_types: tuple[str, ...] = DEFAULT_GPU_INSTANCE_TYPES
    launch_api: LaunchApi = LaunchApi.CREATE_FLEET
    spot_max_price_usd_per_hour: float | None = None
    on_demand_prices_usd_per_hour: Mapping[str, float] = field(default_factory=dict)
    interruption_queue_url: str | None = None
    delete_foreign_events: bool = True
    spot_price_ttl_s: float = 300.0
    describe_batch_size: int = 200
    terminate_batch_size: int = 1000

    def __post_init__(self) -> None:
        if not isinstance(self.region, str) or not self.region:
            raise InvalidRequestError("AwsConfig.region is required")
        if (self.image_id is None) == (self.launch_template is None):
            raise InvalidRequestError("AwsConfig needs exactly one of image_id, launch_template")
        if not self.instance_types:
            raise InvalidRequestError("AwsConfig.instance_types must not be empty")
        if not 1 <= self.describe_batch_size <= 200:
            raise InvalidRequestError("describe_batch_size must be in 1..200")
        if not 1 <= self.terminate_batch_size <= 1000:
            raise InvalidRequestError("terminate_batch_size must be in 1..1000")
        if self.spot_price_ttl_s < 0:
            raise InvalidRequestError("spot_price_ttl_s must be >= 0")
        if self.spot_max_price_usd_per_hour is not None and self.spot_max_price_usd_per_hour <= 0:
            raise InvalidRequestError("spot_max_price_usd_per_hour must be positive")
        object.__setattr__(self, "launch_api", LaunchApi(self.launch_api))
        object.__setattr__(self, "instance_types", tuple(self.instance_types))
        object.__setattr__(self, "security_group_ids", tuple(self.security_group_ids))
        object.__setattr__(self, "subnets_by_zone", _frozen_mapping(self.subnets_by_zone))
        object.__setattr__(
            self,
            "on_demand_prices_usd_per_hour",
            _frozen_mapping(self.on_demand_prices_usd_per_hour),
        )
