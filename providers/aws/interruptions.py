"""Controller-side interruption feed: EventBridge -> SQS, drained by the AWS provider.

Deployment (the terraform module creates it): an EventBridge rule on the default bus matching
``{"source": ["aws.ec2"], "detail-type": [<the three types in providers.aws.events>]}`` with
an SQS queue as its target. EC2 publishes spot interruption warnings, rebalance
recommendations and state changes for *every* instance of the account and region, so the
queue carries foreign instances too; ``drain`` keeps only the cluster's own.

Delivery semantics: a message is deleted once it has been read (parsed and classified), before
the caller acts on the notice, so a crash between ``drain`` and acting loses that notice. That
is acceptable because notices are advisory: the reconcile loop re-lists instances every round
and sees a reclaimed instance disappear. A message whose delete fails reappears after the
visibility timeout and may be reported again; callers treat notices as idempotent. Receives
use short polling (``WaitTimeSeconds=0``, never blocking the reconcile loop); SQS short polling
may answer empty while a few messages remain, which the next ``drain`` then reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from providers.aws.calls import AwsCaller
from providers.aws.events import MalformedNoticeError, parse_eventbridge_event, unwrap_sqs_body
from providers.base import InterruptionNotice

log = logging.getLogger(__name__)

SQS_MAX_BATCH = 10


class SqsInterruptionQueue:
    """Reads EC2 interruption events from one SQS queue.

    ``max_messages_per_drain`` bounds one ``drain`` (a backlog is read over several calls);
    ``visibility_timeout_s`` is how long a received, not yet deleted message stays hidden;
    ``delete_foreign`` says whether events about instances the cluster does not own are
    deleted (dedicated queue) or left for other consumers (shared queue).
    """

    def __init__(
        self,
        sqs_client: Any,
        queue_url: str,
        *,
        caller: AwsCaller,
        max_messages_per_drain: int = 1000,
        visibility_timeout_s: int = 30,
        delete_foreign: bool = True,
    ) -> None:
        if max_messages_per_drain < 1:
            raise ValueError("max_messages_per_drain must be >= 1")
        self.client = sqs_client
        self.queue_url = queue_url
        self._caller = caller
        self._max_messages = max_messages_per_drain
        self._visibility_timeout_s = visibility_timeout_s
        self._delete_foreign = delete_foreign

    def _receive(self) -> list[dict[str, Any]]:
        response = self._caller.call(
            self.client,
            "receive_message",
            {
                "QueueUrl": self.queue_url,
                "MaxNumberOfMessages": SQS_MAX_BATCH,
                "WaitTimeSeconds": 0,  # never block the reconcile loop
                "VisibilityTimeout": self._visibility_timeout_s,
            },
        )
        return list(response.get("Messages", []) or [])

    def _delete(self, receipt_handles: Iterable[str]) -> None:
        handles = list(receipt_handles)
        for start in range(0, len(handles), SQS_MAX_BATCH):
            batch = handles[start : start + SQS_MAX_BATCH]
            response = self._caller.call(
                self.client,
                "delete_message_batch",
                {
                    "QueueUrl": self.queue_url,
                    "Entries": [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(batch)],
                },
            )
            for failed in response.get("Failed", []) or []:
                log.warning("could not delete interruption message: %s", failed)

    def drain(
        self,
        owned: Callable[[Sequence[str]], set[str]],
        *,
        noticed_at_s: float | None = None,
    ) -> list[InterruptionNotice]:
        """Receive everything queued (up to the bound), return notices for owned instances.

        ``owned(instance_ids)`` returns the subset the cluster owns (one ownership lookup per
        drain). Unreadable messages and events that announce nothing are deleted and
        skipped; a repeated (instance, kind) within one drain is reported once.
        """
        pending: list[tuple[InterruptionNotice, str]] = []
        to_delete: list[str] = []
        received = 0
        while received < self._max_messages:
            messages = self._receive()
            if not messages:
                break
            received += len(messages)
            for message in messages:
                handle = message["ReceiptHandle"]
                try:
                    notice = parse_eventbridge_event(
                        unwrap_sqs_body(message.get("Body", "")), noticed_at_s=noticed_at_s
                    )
                except MalformedNoticeError as err:
                    log.warning("dropping unreadable interruption message: %s", err)
                    to_delete.append(handle)
                    continue
                if notice is None:
                    to_delete.append(handle)
                else:
                    pending.append((notice, handle))

        mine = owned(sorted({n.instance_id for n, _ in pending})) if pending else set()
        notices: list[InterruptionNotice] = []
        seen: set[tuple[str, str]] = set()
        for notice, handle in pending:
            if notice.instance_id in mine:
                key = (notice.instance_id, notice.kind.value)
                if key not in seen:
                    seen.add(key)
                    notices.append(notice)
                to_delete.append(handle)
            elif self._delete_foreign:
                to_delete.append(handle)
        if to_delete:
            self._delete(to_delete)
        return notices
