"""The AWS permissions coadapt's controller needs: one declared list, checked two ways.

* ``ADAPTER_OPERATIONS``: every API operation :class:`~providers.aws.provider.AwsProvider`
  may call, as botocore names them (``(service, OperationName)``). The provider tests record
  each operation the adapter's clients really make (a botocore ``before-call`` hook on every
  provider the tests build) and fail on one missing here.
* ``IMPLIED_ACTIONS``: IAM actions that are not API calls of their own but that AWS
  authorises as part of one (tag-on-create, passing the node role, the spot service-linked
  role), with the reason.
* ``MANAGED_TEMPLATE_OPERATIONS``: the operations only used when coadapt manages its own launch
  template (``AwsConfig.image_id``); a deployment whose template comes from terraform
  (``AwsConfig.launch_template``) does not need them.
* ``CONTROLLER_SERVICE_ACTIONS``: what the controller *service* does besides the adapter:
  publishing the users' token, and each node's own agent credential, to SSM Parameter Store
  (``autoscaler.controller.cloud_setup``; its calls are tested to be exactly these).

``controller_iam_actions()`` is the whole set; the terraform module's controller policy is
tested to grant exactly it (less the managed-template operations).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "ADAPTER_OPERATIONS",
    "CONTROLLER_SERVICE_ACTIONS",
    "IMPLIED_ACTIONS",
    "MANAGED_TEMPLATE_OPERATIONS",
    "controller_iam_actions",
    "iam_action",
]

ADAPTER_OPERATIONS: frozenset[tuple[str, str]] = frozenset(
    {
        ("ec2", "CreateFleet"),
        ("ec2", "RunInstances"),
        ("ec2", "TerminateInstances"),
        ("ec2", "DescribeInstances"),
        ("ec2", "DescribeAvailabilityZones"),
        ("ec2", "DescribeInstanceTypes"),
        ("ec2", "DescribeInstanceTypeOfferings"),
        ("ec2", "DescribeSpotPriceHistory"),
        ("ec2", "DescribeLaunchTemplates"),
        ("ec2", "CreateLaunchTemplate"),
        ("sqs", "ReceiveMessage"),
        ("sqs", "DeleteMessageBatch"),
    }
)

MANAGED_TEMPLATE_OPERATIONS: frozenset[tuple[str, str]] = frozenset(
    {("ec2", "CreateLaunchTemplate")}
)

IMPLIED_ACTIONS: Mapping[str, str] = MappingProxyType(
    {
        "ec2:CreateTags": "tag-on-create: CreateFleet / RunInstances carry TagSpecifications",
        "iam:PassRole": "the launch template gives nodes their instance profile",
        "iam:CreateServiceLinkedRole": "the first spot request creates AWSServiceRoleForEC2Spot",
    }
)

CONTROLLER_SERVICE_ACTIONS: Mapping[str, str] = MappingProxyType(
    {
        "ssm:PutParameter": "coadapt up publishes the users' token, and each node's own agent "
        "credential for that node to read",
        "ssm:AddTagsToResource": "a node's credential parameter is tagged with its instance's "
        "ARN (tag-on-create, or again when it is written over): the nodes' role is conditioned "
        "on that tag",
        "ssm:DeleteParameter": "the credential parameter of a node that is gone is deleted",
        "ssm:GetParametersByPath": "at start: the credential parameters of nodes that ended "
        "while no controller ran (names only, never values)",
    }
)

# botocore service name -> IAM service prefix, where they differ (none do today).
_IAM_PREFIX: Mapping[str, str] = MappingProxyType({})


def iam_action(service: str, operation: str) -> str:
    """The IAM action that authorises botocore's ``(service, OperationName)``."""
    return f"{_IAM_PREFIX.get(service, service)}:{operation}"


def controller_iam_actions(*, managed_template: bool = False) -> frozenset[str]:
    """Every IAM action the controller needs; ``managed_template`` when coadapt creates its
    own launch template (otherwise the template comes from the deployment)."""
    operations = (
        ADAPTER_OPERATIONS if managed_template else ADAPTER_OPERATIONS - MANAGED_TEMPLATE_OPERATIONS
    )
    return frozenset(
        {iam_action(s, o) for s, o in operations}
        | set(IMPLIED_ACTIONS)
        | set(CONTROLLER_SERVICE_ACTIONS)
    )
