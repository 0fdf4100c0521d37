"""The GCP permissions coadapt's controller needs: one declared list, checked two ways.

``ADAPTER_METHODS`` maps every Compute Engine REST method the GCP adapter may call (as the
fake server in ``emulators.gce_server`` names its routes) to the IAM permissions that method
needs. The provider tests record each method the adapter really calls and fail on one missing
here; the terraform module's custom controller role is tested to hold exactly
:func:`controller_permissions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["ADAPTER_METHODS", "EXTERNAL_IP_PERMISSIONS", "controller_permissions"]

# What creating a node needs: the instance with its labels, startup script, network tags and
# service account, its boot disk, and a NIC on the subnetwork.
_CREATE = (
    "compute.instances.create",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setServiceAccount",
    "compute.instances.setTags",
    "compute.disks.create",
    "compute.subnetworks.use",
)

ADAPTER_METHODS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "instances.insert": _CREATE,
        "instances.bulkInsert": _CREATE,
        "instances.get": ("compute.instances.get",),
        "instances.aggregatedList": ("compute.instances.list",),
        "instances.delete": ("compute.instances.delete",),
        "zoneOperations.wait": ("compute.zoneOperations.get",),
        "zoneOperations.list": ("compute.zoneOperations.list",),
        "acceleratorTypes.aggregatedList": ("compute.acceleratorTypes.list",),
    }
)

# Only when nodes get an external address (``GcpConfig.external_ip``).
EXTERNAL_IP_PERMISSIONS = ("compute.subnetworks.useExternalIp",)


def controller_permissions(*, external_ip: bool = False) -> frozenset[str]:
    """Every Compute Engine permission the controller's adapter needs."""
    found = {p for perms in ADAPTER_METHODS.values() for p in perms}
    if external_ip:
        found |= set(EXTERNAL_IP_PERMISSIONS)
    return frozenset(found)
