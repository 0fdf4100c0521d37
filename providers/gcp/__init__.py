"""GCP (Compute Engine) adapter: ``GcpProvider`` implements ``providers.base.Provider``.

google-cloud-compute is imported only inside this package and only on the first API call
(``providers.gcp.provider._Api``); importing ``providers.gcp`` itself is cheap.

Modules: ``config`` (``GcpConfig``, ``MachineSpec``), ``catalog`` (machine shapes and prices),
``naming`` (instance ids ``"<zone>/<name>"``, deterministic names and request ids),
``error_map`` (GCE errors -> typed errors), ``parse`` (REST JSON -> coadapt values),
``metadata`` (node-side preemption watcher) and ``provider`` (the adapter). The fake Compute
REST server and the ready-made fake environments are dev-only: ``emulators.gce_server`` and
``emulators.gcp_env``, not installed with the package.
"""

from providers.gcp.config import DEFAULT_MACHINES, GcpConfig, MachineSpec
from providers.gcp.provider import GcpProvider

__all__ = ["DEFAULT_MACHINES", "GcpConfig", "GcpProvider", "MachineSpec"]
