"""The AWS adapter's API calls against its declared permissions (``providers.aws.permissions``).

``tests/conftest.py`` checks after every test that no provider built by
``emulators.aws_moto.make_provider`` called an undeclared operation. Here one provider runs
every kind of work the controller asks of it, on the moto server, and the operations it made
must be exactly the declared list: nothing declared that the adapter never calls (the policy
would grant more than needed), nothing called that is not declared.
"""

from __future__ import annotations

import uuid

import pytest

from coadapt_common.clock import FakeClock
from emulators.aws_moto import (
    OperationLog,
    admin_client,
    create_interruption_queue,
    delete_interruption_queue,
    make_provider,
    pick_pools,
    send_spot_warning,
    shared_moto_server,
)
from providers.aws.config import LaunchApi, LaunchTemplateRef
from providers.aws.permissions import (
    ADAPTER_OPERATIONS,
    CONTROLLER_SERVICE_ACTIONS,
    IMPLIED_ACTIONS,
    MANAGED_TEMPLATE_OPERATIONS,
    controller_iam_actions,
    iam_action,
)
from providers.base import LaunchRequest, Market


def _request(cluster_id: str, provider, n: int, **kw) -> LaunchRequest:
    return LaunchRequest(
        request_id=f"req-{uuid.uuid4().hex[:12]}",
        cluster_id=cluster_id,
        offerings=tuple(pick_pools(provider, Market.SPOT, 1)),
        count=n,
        **kw,
    )


@pytest.mark.slow
def test_the_adapter_calls_exactly_the_declared_operations() -> None:
    moto = shared_moto_server()
    cluster_id = f"perm-{uuid.uuid4().hex[:10]}"
    queue_url, rule = create_interruption_queue(moto.url)
    log = OperationLog()
    try:
        # coadapt's own launch template (image_id), both launch APIs, the interruption queue.
        for api in (LaunchApi.CREATE_FLEET, LaunchApi.RUN_INSTANCES):
            p = log.watch(
                make_provider(
                    moto.url, clock=FakeClock(), launch_api=api, interruption_queue_url=queue_url
                )
            )
            launched = p.launch(_request(cluster_id, p, 1, user_data="#!/bin/sh\ntrue"))
            assert launched.instances
            send_spot_warning(moto.url, launched.instances[0].instance_id, at_s=0.0)
            assert p.interruptions(cluster_id)
            assert p.list_instances(cluster_id)
            p.terminate(cluster_id, [i.instance_id for i in launched.instances], "term-1")
        # A deployment's template (terraform): no template management.
        template = admin_client(moto.url, "ec2").create_launch_template(
            LaunchTemplateName=f"perm-{uuid.uuid4().hex[:8]}",
            LaunchTemplateData={"ImageId": "ami-12345678"},
        )["LaunchTemplate"]["LaunchTemplateId"]
        managed_before = log.seen()
        q = log.watch(
            make_provider(
                moto.url, clock=FakeClock(), launch_template=LaunchTemplateRef(template_id=template)
            )
        )
        fleet = q.launch(_request(cluster_id, q, 1))
        q.terminate(cluster_id, [i.instance_id for i in fleet.instances], "term-2")
    finally:
        delete_interruption_queue(moto.url, queue_url, rule)
    assert log.seen() == ADAPTER_OPERATIONS
    assert managed_before >= MANAGED_TEMPLATE_OPERATIONS


def test_the_controller_actions_are_the_operations_and_what_they_imply() -> None:
    actions = controller_iam_actions()
    assert iam_action("ec2", "CreateFleet") in actions
    assert iam_action("ec2", "CreateLaunchTemplate") not in actions  # terraform's template
    assert iam_action("ec2", "CreateLaunchTemplate") in controller_iam_actions(
        managed_template=True
    )
    assert set(IMPLIED_ACTIONS) <= actions and set(CONTROLLER_SERVICE_ACTIONS) <= actions
    assert all(":" in a and " " not in a for a in actions)
