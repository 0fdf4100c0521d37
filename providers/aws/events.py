"""Pure parsers for EC2 interruption signals (no I/O, no boto3).

Two sources carry the same facts:

* **Instance metadata (IMDS), on the node.** ``/latest/meta-data/spot/instance-action``
  answers 404 until EC2 decides to reclaim a spot instance, then
  ``{"action": "terminate" | "stop" | "hibernate", "time": "2017-09-18T08:22:00Z"}``, where
  ``time`` is when the action happens (about two minutes later).
  ``/latest/meta-data/events/recommendations/rebalance`` answers 404 until EC2 sees elevated
  interruption risk, then ``{"noticeTime": "2020-10-27T08:22:00Z"}`` (no deadline).
* **EventBridge, for the controller.** Events with ``"source": "aws.ec2"`` and ``detail-type``
  ``EC2 Spot Instance Interruption Warning`` (``detail``: ``instance-id``,
  ``instance-action``), ``EC2 Instance Rebalance Recommendation`` (``detail``:
  ``instance-id``) and ``EC2 Instance State-change Notification`` (``detail``: ``instance-id``,
  ``state``). The envelope's ``time`` is when EC2 emitted the event; a spot warning is emitted
  two minutes before the action (``SPOT_WARNING_LEAD_S``).

Each parser returns an ``InterruptionNotice``, ``None`` when the input announces nothing (a
404 body, a state change to ``running``, another event type), or raises
``MalformedNoticeError`` when the input claims to be a notice but cannot be read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from providers.base import InterruptionKind, InterruptionNotice
from providers.errors import ProviderError

SPOT_WARNING_LEAD_S = 120.0

SPOT_WARNING_DETAIL_TYPE = "EC2 Spot Instance Interruption Warning"
REBALANCE_DETAIL_TYPE = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE_DETAIL_TYPE = "EC2 Instance State-change Notification"
INTERRUPTION_DETAIL_TYPES = (
    SPOT_WARNING_DETAIL_TYPE,
    REBALANCE_DETAIL_TYPE,
    STATE_CHANGE_DETAIL_TYPE,
)

IMDS_ACTIONS = frozenset({"terminate", "stop", "hibernate"})
# States that mean the instance is going away (or gone): reported as TERMINATED.
LEAVING_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
# States that mean nothing for interruptions.
OTHER_STATES = frozenset({"pending", "running"})

SOURCE_IMDS = "imds"
SOURCE_EVENTBRIDGE = "eventbridge"


class MalformedNoticeError(ProviderError, ValueError):
    """An interruption notice or event that cannot be read (bad JSON, missing field, bad time)."""


def parse_aws_time(value: object, *, field: str) -> float:
    """Epoch seconds from an AWS ISO-8601 UTC timestamp (``2017-09-18T08:22:00Z``)."""
    if not isinstance(value, str) or not value:
        raise MalformedNoticeError(f"{field}: expected an ISO-8601 time, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise MalformedNoticeError(f"{field}: unreadable time {value!r}") from err
    if parsed.tzinfo is None:  # AWS always sends UTC; a naive time is read as UTC
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _load_json_object(body: str | bytes | Mapping[str, Any], *, what: str) -> Mapping[str, Any]:
    if isinstance(body, Mapping):
        return body
    try:
        value = json.loads(body)
    except (TypeError, ValueError) as err:
        raise MalformedNoticeError(f"{what}: not JSON: {body!r:.200}") from err
    if not isinstance(value, Mapping):
        raise MalformedNoticeError(f"{what}: expected a JSON object, got {type(value).__name__}")
    return value


def _require_instance_id(value: object, *, what: str) -> str:
    if not isinstance(value, str) or not value.startswith("i-"):
        raise MalformedNoticeError(f"{what}: missing or bad instance id {value!r}")
    return value


def parse_imds_instance_action(
    body: str | bytes | Mapping[str, Any] | None,
    *,
    instance_id: str,
    noticed_at_s: float | None = None,
) -> InterruptionNotice | None:
    """Parse the body of IMDS ``spot/instance-action``.

    ``None``/empty body (the endpoint answered 404) means no notice. The deadline is the
    action's ``time``.
    """
    if body is None or (isinstance(body, str | bytes) and not body.strip()):
        return None
    data = _load_json_object(body, what="spot/instance-action")
    action = data.get("action")
    if action not in IMDS_ACTIONS:
        raise MalformedNoticeError(f"spot/instance-action: unknown action {action!r}")
    return InterruptionNotice(
        instance_id=_require_instance_id(instance_id, what="spot/instance-action"),
        kind=InterruptionKind.SPOT_INTERRUPTION,
        deadline_s=parse_aws_time(data.get("time"), field="spot/instance-action.time"),
        source=SOURCE_IMDS,
        noticed_at_s=noticed_at_s,
    )


def parse_imds_rebalance(
    body: str | bytes | Mapping[str, Any] | None,
    *,
    instance_id: str,
    noticed_at_s: float | None = None,
) -> InterruptionNotice | None:
    """Parse the body of IMDS ``events/recommendations/rebalance`` (no deadline).

    ``noticed_at_s`` defaults to the recommendation's ``noticeTime``.
    """
    if body is None or (isinstance(body, str | bytes) and not body.strip()):
        return None
    data = _load_json_object(body, what="events/recommendations/rebalance")
    notice_time_s = parse_aws_time(data.get("noticeTime"), field="rebalance.noticeTime")
    return InterruptionNotice(
        instance_id=_require_instance_id(instance_id, what="rebalance"),
        kind=InterruptionKind.REBALANCE,
        deadline_s=None,
        source=SOURCE_IMDS,
        noticed_at_s=notice_time_s if noticed_at_s is None else noticed_at_s,
    )


def parse_eventbridge_event(
    event: str | bytes | Mapping[str, Any],
    *,
    noticed_at_s: float | None = None,
) -> InterruptionNotice | None:
    """Parse one EventBridge event (the JSON object EventBridge delivers to SQS).

    Spot warning -> ``SPOT_INTERRUPTION`` with deadline ``time + 120 s``; rebalance ->
    ``REBALANCE`` (no deadline); state change to stopping/stopped/shutting-down/terminated ->
    ``TERMINATED`` with deadline ``time``. Events from other sources, other detail types and
    state changes to pending/running give ``None``. ``noticed_at_s`` defaults to the event time.
    """
    data = _load_json_object(event, what="EventBridge event")
    if data.get("source") != "aws.ec2":
        return None
    detail_type = data.get("detail-type")
    if detail_type not in INTERRUPTION_DETAIL_TYPES:
        return None
    detail = data.get("detail")
    if not isinstance(detail, Mapping):
        raise MalformedNoticeError(f"{detail_type}: missing detail object")
    instance_id = _require_instance_id(detail.get("instance-id"), what=str(detail_type))
    event_time_s = parse_aws_time(data.get("time"), field=f"{detail_type}.time")
    noticed = event_time_s if noticed_at_s is None else noticed_at_s
    if detail_type == SPOT_WARNING_DETAIL_TYPE:
        return InterruptionNotice(
            instance_id=instance_id,
            kind=InterruptionKind.SPOT_INTERRUPTION,
            deadline_s=event_time_s + SPOT_WARNING_LEAD_S,
            source=SOURCE_EVENTBRIDGE,
            noticed_at_s=noticed,
        )
    if detail_type == REBALANCE_DETAIL_TYPE:
        return InterruptionNotice(
            instance_id=instance_id,
            kind=InterruptionKind.REBALANCE,
            deadline_s=None,
            source=SOURCE_EVENTBRIDGE,
            noticed_at_s=noticed,
        )
    state = detail.get("state")
    if state in OTHER_STATES:
        return None
    if state not in LEAVING_STATES:
        raise MalformedNoticeError(f"{detail_type}: unknown state {state!r}")
    return InterruptionNotice(
        instance_id=instance_id,
        kind=InterruptionKind.TERMINATED,
        deadline_s=event_time_s,
        source=SOURCE_EVENTBRIDGE,
        noticed_at_s=noticed,
    )


def unwrap_sqs_body(body: str) -> Mapping[str, Any]:
    """The EventBridge event inside an SQS message body.

    EventBridge -> SQS delivers the event JSON as the body. EventBridge -> SNS -> SQS (without
    raw delivery) wraps it in an SNS envelope whose ``Message`` holds the event JSON; both are
    accepted.
    """
    data = _load_json_object(body, what="SQS message body")
    if data.get("Type") == "Notification" and isinstance(data.get("Message"), str):
        return _load_json_object(data["Message"], what="SNS message")
    return data
