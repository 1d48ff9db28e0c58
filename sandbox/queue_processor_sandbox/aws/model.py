"""The names, records and formats the sandbox's AWS modules share.

The account, region and zones the sandbox lives in; the hook and transition names; the types of a lifecycle
action's result and status; the public records of the cluster (:class:`SandboxInstance`, :class:`SandboxQueue`,
:class:`ClientKwargs`); and the time and queue-name formats of AWS's messages (:func:`whole_seconds`,
:func:`milliseconds`, :func:`queue_name`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, NamedTuple, TypedDict

from moto.core.models import DEFAULT_ACCOUNT_ID

__all__ = [
    "ACCOUNT_ID",
    "DEFAULT_REGION",
    "DEFAULT_ZONES",
    "IMAGE_ID",
    "LAUNCH_HOOK",
    "LAUNCH_TRANSITION",
    "MANAGED_TAG",
    "MAX_GLOBAL_TIMEOUT_S",
    "TERMINATE_HOOK",
    "TERMINATE_TRANSITION",
    "ActionStatus",
    "ClientKwargs",
    "LifecycleRequest",
    "Operation",
    "Result",
    "SandboxInstance",
    "SandboxQueue",
    "milliseconds",
    "queue_name",
    "utcnow",
    "whole_seconds",
]

#: moto's default account; the sandbox's fake credentials map to it.
ACCOUNT_ID: str = DEFAULT_ACCOUNT_ID
DEFAULT_REGION = "us-east-1"
DEFAULT_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
#: The tag aws-node-termination-handler checks (``--managed-tag``), propagated to the group's instances.
MANAGED_TAG = "aws-node-termination-handler/managed"
TERMINATE_HOOK = "queue-processor-terminate"
LAUNCH_HOOK = "queue-processor-launch"
TERMINATE_TRANSITION = "autoscaling:EC2_INSTANCE_TERMINATING"
LAUNCH_TRANSITION = "autoscaling:EC2_INSTANCE_LAUNCHING"
#: An image moto knows; the sandbox never boots it.
IMAGE_ID = "ami-12c6146b"
#: "Configure a lifecycle hook": the global timeout is 48 hours or 100 x HeartbeatTimeout, whichever is smaller.
MAX_GLOBAL_TIMEOUT_S = 48 * 3600.0

Result = Literal["CONTINUE", "ABANDON"]
ActionStatus = Literal["open", "completed", "timed-out", "cancelled"]
Operation = Literal["RecordLifecycleActionHeartbeat", "CompleteLifecycleAction"]


@dataclass(frozen=True)
class LifecycleRequest:
    """One ``RecordLifecycleActionHeartbeat`` or ``CompleteLifecycleAction`` request as the Auto Scaling API
    received it (EC2 Auto Scaling API Reference): the group, the hook, the action's token or instance ID
    (``None`` when absent; AWS wants one of the two) and, for a completion, ``LifecycleActionResult``
    (``None`` for a heartbeat, or when absent)."""

    operation: Operation
    asg_name: str
    hook_name: str
    token: str | None
    instance_id: str | None
    result: str | None


# --------------------------------------------------------------------------------------------- public records


class ClientKwargs(TypedDict):
    """What a boto3 or aiobotocore client needs to reach the sandbox (``create_client(service, **kw)``)."""

    endpoint_url: str
    region_name: str
    aws_access_key_id: str
    aws_secret_access_key: str


@dataclass(frozen=True)
class SandboxInstance:
    """An instance of a sandbox Auto Scaling group, as the Kubernetes side names it: ``private_dns_name`` is
    the node name, ``provider_id`` the node's ``spec.providerID`` (``aws:///<az>/<instance-id>``)."""

    instance_id: str
    private_dns_name: str
    private_ip_address: str
    availability_zone: str
    provider_id: str
    asg_name: str


@dataclass(frozen=True)
class SandboxQueue:
    """An SQS queue and its dead-letter queue: URLs as clients of the sandbox use them, and ARNs."""

    url: str
    arn: str
    dlq_url: str
    dlq_arn: str


class QueueCounts(NamedTuple):
    """How many messages a queue holds, from SQS's approximate attributes (``GetQueueAttributes``):
    ``visible`` (ApproximateNumberOfMessages), ``in_flight`` (ApproximateNumberOfMessagesNotVisible: received,
    inside their visibility timeout) and ``dlq`` (visible in its dead-letter queue)."""

    visible: int
    in_flight: int
    dlq: int

    @property
    def left(self) -> int:
        """Messages not yet deleted from the queue (visible + in flight)."""
        return self.visible + self.in_flight


# ------------------------------------------------------------------------------------------------- formatting


def utcnow() -> datetime:
    """The wall-clock time now, aware UTC."""
    return datetime.now(UTC)


def whole_seconds(moment: datetime) -> str:
    """EventBridge's ``time``: ``2026-11-22T12:00:37Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def milliseconds(moment: datetime) -> str:
    """``2026-11-22T12:00:37.214Z``, as a lifecycle notification's ``Time``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def queue_name(arn_or_url: str) -> str:
    """The name of the SQS queue an ARN (``arn:aws:sqs:<region>:<account>:<name>``), URL or name names."""
    return arn_or_url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
