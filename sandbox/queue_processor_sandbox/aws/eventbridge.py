"""EventBridge and notification delivery: how the sandbox's messages reach SQS, and the record of them.

Every event AWS would emit (lifecycle actions, EC2 state changes, the scenario notices) is put on the default
bus by :meth:`Delivery.publish`: it is matched against the bus's enabled rules with moto's own event-pattern
matcher and sent to their SQS targets with the body EventBridge produces ("Amazon EventBridge events",
EventBridge User Guide). moto's ``PutEvents`` does deliver to SQS, but its default target template drops
``account``; the sandbox therefore sends the body itself. Targets with an ``InputTransformer`` and non-SQS
targets are not served. A lifecycle hook with an SQS notification target also gets every notification in the
direct format (:meth:`Delivery.publish_action`, :meth:`Delivery.send_direct`); :meth:`Delivery.send_raw`
sends any body as it is. Each body sent is recorded as a :class:`PublishedMessage`.

:data:`STANDARD_RULES` are the rules the Terraform module creates.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from moto.backends import get_backend

from queue_processor.events import EventKind
from queue_processor_sandbox.aws.lifecycle import ActionState
from queue_processor_sandbox.aws.model import (
    ACCOUNT_ID,
    TERMINATE_TRANSITION,
    milliseconds,
    queue_name,
    utcnow,
    whole_seconds,
)

__all__ = ["STANDARD_RULES", "Delivery", "PublishedMessage"]

#: The package's logger, as before the package was split into modules.
log = logging.getLogger(__package__ or __name__)

#: The EventBridge rules the Terraform module creates, one per kind, keyed by the kind they feed
#: ("Amazon EventBridge event patterns"). State changes are limited to the states the controller acts on.
STANDARD_RULES: Mapping[EventKind, Mapping[str, Any]] = {
    EventKind.ASG_TERMINATE_LIFECYCLE: {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
    },
    EventKind.ASG_LAUNCH_LIFECYCLE: {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance-launch Lifecycle Action"],
    },
    EventKind.SPOT_INTERRUPTION: {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Spot Instance Interruption Warning"],
    },
    EventKind.REBALANCE_RECOMMENDATION: {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance Rebalance Recommendation"],
    },
    EventKind.STATE_CHANGE: {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance State-change Notification"],
        "detail": {"state": ["stopping", "stopped", "shutting-down", "terminated"]},
    },
    EventKind.SCHEDULED_CHANGE: {
        "source": ["aws.health"],
        "detail-type": ["AWS Health Event"],
        "detail": {"service": ["EC2"], "eventTypeCategory": ["scheduledChange"]},
    },
    EventKind.CAPACITY_RESERVATION_INTERRUPTION: {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"],
    },
}


@dataclass(frozen=True)
class PublishedMessage:
    """A body the sandbox published: ``via`` ``eventbridge`` (to the matching rules' SQS targets),
    ``direct`` (a lifecycle hook's notification target) or ``raw``; ``queues`` are the names it reached."""

    time: datetime
    via: Literal["eventbridge", "direct", "raw"]
    body: str
    queues: tuple[str, ...]


class Delivery:
    """Delivery to the SQS queues of moto's backends in ``region``, under the sandbox's ``lock``, and the record
    of every body sent (:meth:`published`)."""

    def __init__(self, lock: threading.RLock, region: str) -> None:
        self._lock = lock
        self._region = region
        self._published: list[PublishedMessage] = []
        # lifecycle action token -> the (queue name, message ID) of every SQS message that carries it
        self._carriers: dict[str, list[tuple[str, str]]] = {}

    @property
    def _sqs(self) -> Any:
        return get_backend("sqs")[ACCOUNT_ID][self._region]

    @property
    def _events(self) -> Any:
        return get_backend("events")[ACCOUNT_ID][self._region]

    def published(self) -> list[PublishedMessage]:
        """Every body published, in order."""
        with self._lock:
            return list(self._published)

    def clear(self) -> None:
        """Forget every body published (the sandbox's reset)."""
        with self._lock:
            self._published.clear()
            self._carriers.clear()

    def held(self, token: str) -> bool:
        """Whether a consumer holds the lifecycle action of ``token`` now: whether a message that carries it
        (its EventBridge event or its hook's notification) is in flight, received and not yet visible again.
        ``False`` when every such message is visible in its queue (released, or requeued and its visibility
        timeout over, and nobody received it since) or gone."""
        with self._lock:
            for name, message_id in self._carriers.get(token, ()):
                queue = self._sqs.queues.get(name)
                messages = queue._messages if queue is not None else ()  # moto's own record
                if any(m.id == message_id and not m.visible for m in messages):
                    return True
            return False

    def send_raw(self, queue: str, body: str) -> None:
        """Send ``body`` as it is to ``queue`` (a URL, ARN or name): poison, or any format by hand."""
        with self._lock:
            self._send(queue_name(queue), body)
            self._published.append(PublishedMessage(utcnow(), "raw", body, (queue_name(queue),)))

    def publish_action(self, action: ActionState, group_arn: str) -> None:
        """A lifecycle action's notification: to EventBridge, and straight to the hook's SQS target."""
        detail: dict[str, Any] = {
            "LifecycleActionToken": action.token,
            "AutoScalingGroupName": action.asg_name,
            "LifecycleHookName": action.hook_name,
            "EC2InstanceId": action.instance_id,
            "LifecycleTransition": action.transition,
            "Origin": action.origin,
            "Destination": action.destination,
        }
        if action.notification_metadata is not None:
            detail["NotificationMetadata"] = action.notification_metadata
        detail_type = (
            "EC2 Instance-terminate Lifecycle Action"
            if action.transition == TERMINATE_TRANSITION
            else "EC2 Instance-launch Lifecycle Action"
        )
        sent = self._carriers.setdefault(action.token, [])
        self._publish(
            "aws.autoscaling", detail_type, detail, [group_arn], whole_seconds(action.started_at), sent
        )
        if action.notification_target_arn and ":sqs:" in action.notification_target_arn:
            direct = {
                "Origin": action.origin,
                "LifecycleHookName": action.hook_name,
                "Destination": action.destination,
                "AccountId": ACCOUNT_ID,
                "RequestId": str(uuid.uuid4()),
                "LifecycleTransition": action.transition,
                "AutoScalingGroupName": action.asg_name,
                "Service": "AWS Auto Scaling",
                "Time": milliseconds(action.started_at),
                "EC2InstanceId": action.instance_id,
                "LifecycleActionToken": action.token,
            }
            if action.notification_metadata is not None:
                direct["NotificationMetadata"] = action.notification_metadata
            self.send_direct(action.notification_target_arn, direct, sent)

    def send_direct(
        self, target_arn: str, body: Mapping[str, Any], sent: list[tuple[str, str]] | None = None
    ) -> None:
        """Send ``body`` as JSON straight to the SQS queue of ``target_arn`` (a lifecycle hook's notification
        target), as Auto Scaling does; recorded as ``direct``. The (queue name, message ID) sent is appended to
        ``sent`` when given."""
        text = json.dumps(body)
        name = queue_name(target_arn)
        with self._lock:
            self._send(name, text, sent)
            self._published.append(PublishedMessage(utcnow(), "direct", text, (name,)))

    def publish(
        self, source: str, detail_type: str, detail: dict[str, Any], resources: list[str], event_time: str
    ) -> dict[str, Any]:
        """Put one event on the default bus: every enabled rule whose pattern matches (moto's matcher)
        sends the EventBridge body to its SQS targets. Returns the body."""
        return self._publish(source, detail_type, detail, resources, event_time, None)

    def _publish(
        self,
        source: str,
        detail_type: str,
        detail: dict[str, Any],
        resources: list[str],
        event_time: str,
        sent: list[tuple[str, str]] | None,
    ) -> dict[str, Any]:
        event: dict[str, Any] = {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": detail_type,
            "source": source,
            "account": ACCOUNT_ID,
            "time": event_time,
            "region": self._region,
            "resources": resources,
            "detail": detail,
        }
        text = json.dumps(event)
        queues: list[str] = []
        with self._lock:
            for rule in self._rules():
                if (
                    rule.state != "ENABLED"
                    or rule.scheduled_expression
                    or not rule.event_pattern.matches_event(event)
                ):
                    continue
                for target in rule.targets:
                    if ":sqs:" in target["Arn"] and not target.get("InputTransformer"):
                        queues.append(queue_name(target["Arn"]))
                        self._send(queues[-1], text, sent)
            self._published.append(PublishedMessage(utcnow(), "eventbridge", text, tuple(queues)))
        return event

    def _rules(self) -> Iterator[Any]:
        bus = self._events.event_buses.get("default")
        return iter(list(bus.rules.values())) if bus is not None else iter(())

    def _send(self, queue_name: str, body: str, sent: list[tuple[str, str]] | None = None) -> None:
        try:
            message = self._sqs.send_message(queue_name=queue_name, message_body=body)
        except Exception:  # a rule or hook pointing at a deleted queue: AWS drops the delivery too
            log.warning("aws sandbox: no queue %s for a delivery", queue_name)
            return
        if sent is not None:
            sent.append((queue_name, message.id))
