"""What every typed interruption event shares: :class:`BaseEvent`, its kind, identity and SQS message.

An event is one affected instance of one message. The models live with their kinds (:mod:`queue_processor.kinds`):
validation aliases read the wire format, field names build one in code (``SpotInterruptionEvent(...)``).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Annotated, NamedTuple, TypeVar

from pydantic import (
    AliasPath,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    computed_field,
)

__all__ = [
    "SPOT_NOTICE",
    "ActionKey",
    "BaseEvent",
    "EventKind",
    "NonEmptyStr",
    "SqsMessageRef",
    "cached_field",
    "detail_alias",
    "make_event_id",
]


class EventKind(StrEnum):
    """The kinds of interruption the controller acts on; the value is the name used everywhere."""

    ASG_TERMINATE_LIFECYCLE = "asg-terminate-lifecycle"
    """ASG lifecycle action ``autoscaling:EC2_INSTANCE_TERMINATING``: drain, then complete the action."""
    ASG_LAUNCH_LIFECYCLE = "asg-launch-lifecycle"
    """ASG lifecycle action ``autoscaling:EC2_INSTANCE_LAUNCHING``: wait for the node, then complete."""
    SPOT_INTERRUPTION = "spot-interruption"
    """EC2 Spot Instance Interruption Warning: the instance goes away 120 seconds after the event time."""
    REBALANCE_RECOMMENDATION = "rebalance-recommendation"
    """EC2 Instance Rebalance Recommendation: the Spot instance is at elevated risk of interruption."""
    STATE_CHANGE = "state-change"
    """EC2 Instance State-change Notification for stopping, stopped, shutting-down or terminated."""
    SCHEDULED_CHANGE = "scheduled-change"
    """AWS Health ``scheduledChange`` event for EC2: one event per affected instance."""
    CAPACITY_RESERVATION_INTERRUPTION = "capacity-reservation-interruption"
    """EC2 Capacity Reservation Instance Interruption Warning (interruptible Capacity Reservations)."""


#: The two-minute notice of Spot ("Spot Instance interruption notices", EC2 User Guide) and Capacity Reservations.
SPOT_NOTICE = timedelta(seconds=120)

T = TypeVar("T")

#: A required, non-blank string such as an instance ID.
NonEmptyStr = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class cached_field(cached_property[T]):  # noqa: N801 - used like the decorator it extends
    """``functools.cached_property`` without the lock Python 3.11 takes on every first read (gone in 3.12):
    an event is computed by one task, and a race would only compute the same value twice."""

    def __get__(self, instance: object, owner: type | None = None) -> T:  # type: ignore[override]
        if instance is None:
            return self  # type: ignore[return-value]
        value = self.func(instance)
        instance.__dict__[self.attrname or self.func.__name__] = value
        return value


def detail_alias(key: str) -> AliasPath:
    """The validation alias of ``key`` inside an EventBridge message's ``detail``."""
    return AliasPath("detail", key)


class ActionKey(NamedTuple):
    """One lifecycle action as ``CompleteLifecycleAction`` addresses it (the instance ID if no token)."""

    token_or_instance: str
    group: str
    hook: str


class SqsMessageRef(BaseModel):
    """The SQS message an event came from: enough to delete, requeue and log it. ``receive_count`` is its
    ``ApproximateReceiveCount``, ``sent_timestamp`` its ``SentTimestamp`` as an aware datetime."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queue_url: str
    message_id: str
    receipt_handle: str
    receive_count: int = 1
    sent_timestamp: datetime | None = None


class BaseEvent(BaseModel):
    """Fields every event carries: ``instance_id`` as given (shape not checked), ``time`` when AWS emitted it (aware),
    ``source_id`` the message's own ID, ``message`` (``None`` when parsed from a file). Checks: pydantic-core's only."""

    # extra="ignore": the wire format has many fields we do not read. frozen: events are shared by tasks.
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    detail_type: str | None = Field(default=None, alias="detail-type", exclude=True, repr=False)
    source: str | None = Field(default=None, exclude=True, repr=False)
    kind: EventKind
    instance_id: NonEmptyStr
    time: AwareDatetime
    source_id: str | None = Field(default=None, validation_alias="id")
    message: SqsMessageRef | None = None

    def _identity_key(self) -> str:
        """What names this occurrence whatever its serialisation (see :func:`make_event_id`)."""
        return self.source_id or f"{self.time.isoformat()}|{self.detail_type}"

    @computed_field
    @cached_field
    def event_id(self) -> str:
        """The event's deterministic identity, :func:`make_event_id` of its kind, instance and key."""
        return make_event_id(self.kind, self.instance_id, self._identity_key())

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """When the instance is expected to go away; the event time unless the kind says otherwise."""
        return self.time

    def attach(self, message: SqsMessageRef) -> None:
        """Record the SQS message this event came from; ``ValueError`` when it already has a different one."""
        if self.message is not None and self.message != message:
            raise ValueError(f"event {self.event_id} already came from message {self.message.message_id}")
        # Frozen model: the field is written where pydantic keeps field values.
        self.__dict__["message"] = message


def make_event_id(kind: EventKind, instance_id: str, key: str) -> str:
    """``"<kind>-<20 hex digits>"``: at most 54 characters of ``[a-z0-9-]``, a valid label or taint value. ``key``:
    the lifecycle action token (shared by both forms), the AWS Health ``eventArn``, else the EventBridge ``id``."""
    # EventKind is a str: joined as it is (.value goes through enum's slower descriptor).
    digest = hashlib.blake2b("\x1f".join((kind, instance_id, key)).encode(), digest_size=10).hexdigest()
    return str.__add__(kind, "-" + digest)
