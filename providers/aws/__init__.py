"""AWS (EC2) provider: ``AwsProvider`` and its configuration.

Modules: ``config`` (``AwsConfig``), ``catalog`` (on-demand prices, GPU names), ``errors`` (AWS
codes -> typed errors), ``events`` (pure parsers of IMDS and EventBridge notices), ``imds``
(node-side IMDSv2 poller, standard library only), ``interruptions`` (EventBridge -> SQS
consumer), ``provider`` (``AwsProvider``). The moto server helpers for tests and benchmarks are
dev-only: ``emulators.aws_moto``, not installed with the package.

boto3/botocore are imported only when a client is built or an SDK error is translated, so
``import providers.aws`` and the pure modules (config, catalog, events, imds) work without
boto3 installed. ``AwsProvider`` is loaded on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from providers.aws.config import AwsConfig, LaunchApi, LaunchTemplateRef

if TYPE_CHECKING:
    from providers.aws.provider import AwsProvider

__all__ = ["AwsConfig", "AwsProvider", "LaunchApi", "LaunchTemplateRef"]


def __getattr__(name: str) -> Any:
    if name == "AwsProvider":
        from providers.aws.provider import AwsProvider

        return AwsProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
