"""What every typed interruption event shares: :class:`BaseEvent`, its kind, identity and SQS message.

The models themselves live with their kinds, one module each in :mod:`queue_processor.kinds` (which also
defines the :data:`~queue_processor.kinds.Event` union). An event is what the parser
(:mod:`queue_processor.parse`) makes of one SQS message body and what the rest of the controller acts on. One
message gives one event per affected instance (an AWS Health event can name several instances). Every event
carries:

- ``kind`` (:class:`EventKind`), the name used in logs, metrics and ``queue-processor inspect``;
- ``instance_id``, the EC2 instance ID as the message gives it (its shape is not checked: some real messages
  carry IDs that are not well-formed);
- ``event_id``, a deterministic identity (:func:`make_event_id`): unique per instance, the same across SQS
  redeliveries of the same message, whatever the JSON key order or whitespace;
- ``time``, when AWS emitted the event, and ``start_time``, when the instance is expected to go away;
- ``source_id``, the identifier the message itself gives (EventBridge ``id``, a lifecycle notification's
  ``RequestId``, an AWS Health ``eventArn``), for logs and support cases;
- ``message``, the SQS message it came from (:class:`SqsMessageRef`), ``None`` when parsed from a file.

Each model reads its own wire format and states its rules: ``taint_key`` (TAINT_NODE) and ``notice``
(whether its ``start_time`` is a deadline the instance is reclaimed at). Its fields carry validation aliases
for the EventBridge message (and, for lifecycle actions, the notification Auto Scaling sends straight to SQS),
so the parser validates a body into its event in one pass from JSON; ``event_id`` and ``start_time`` are
computed by the model from its fields. Models also accept their field names, so an event can be built in code:
``SpotInterruptionEvent(instance_id=..., time=..., source_id=...)``. ``detail_type`` and ``source`` are the
EventBridge envelope's, kept out of ``model_dump``.

Formats: "Amazon EventBridge events" in the EC2 User Guide (Spot interruption warning, rebalance
recommendation, state-change, Capacity Reservation interruption), "Amazon EC2 Auto Scaling lifecycle hooks"
(lifecycle notifications, warm pools' Origin/Destination) and the AWS Health User Guide ("Monitoring AWS
Health events with Amazon EventBridge").
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Annotated, ClassVar, NamedTuple, TypeVar

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


#: Spot gives a two-minute notice ("Spot Instance interruption notices", EC2 User Guide); so does an
#: interruptible Capacity Reservation.
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
    """One Auto Scaling lifecycle action: its token (the instance ID when the message carried none), its
    group and its hook (the parameters of ``CompleteLifecycleAction``)."""

    token_or_instance: str
    group: str
    hook: str


class SqsMessageRef(BaseModel):
    """The SQS message an event came from: enough to delete it, requeue it and log it.

    ``receive_count`` is the message's ``ApproximateReceiveCount`` attribute (1 on first delivery);
    ``sent_timestamp`` its ``SentTimestamp`` attribute (SQS gives epoch milliseconds) as an aware datetime.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    queue_url: str
    message_id: str
    receipt_handle: str
    receive_count: int = 1
    sent_timestamp: datetime | None = None


class BaseEvent(BaseModel):
    """Fields every event carries; see the module docstring. ``time`` must carry a timezone (AWS always
    sends one); a time without one is a validation error.

    ``event_id`` and ``start_time`` are computed from the fields (once, on first use) and appear in
    ``model_dump``. Validation runs no Python code: every check is pydantic-core's, which keeps parsing
    at a few microseconds a message.
    """

    # extra="ignore": the wire format has many fields we do not read. frozen: events are shared by tasks.
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    #: NTH's taint key for this kind (TAINT_NODE), ``None`` for a kind that is never tainted for.
    taint_key: ClassVar[str | None] = None
    #: Whether ``start_time`` is a hard deadline (the instance is reclaimed then): drains never run past it.
    #: Kinds without a notice (rebalance, state change, lifecycle actions) have a start time that is already
    #: past and must not shorten a drain.
    notice: ClassVar[bool] = False

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
        """When the instance is expected to go away (aware datetime); the event time unless the kind says
        otherwise."""
        return self.time

    def attach(self, message: SqsMessageRef) -> None:
        """Record the SQS message this event came from (the parser does, after validation). Raises
        ``ValueError`` when the event already has a different one."""
        if self.message is not None and self.message != message:
            raise ValueError(f"event {self.event_id} already came from message {self.message.message_id}")
        # Frozen model: the field is written where pydantic keeps field values.
        self.__dict__["message"] = message


def make_event_id(kind: EventKind, instance_id: str, key: str) -> str:
    """The deterministic identity of an event: ``"<kind>-<20 hex digits>"``, at most 54 characters.

    ``key`` names the occurrence independently of how the message is serialised: the lifecycle action token
    for ASG actions (so the EventBridge and the direct form of one action share an ID), the AWS Health
    ``eventArn``, otherwise the EventBridge ``id``. The result contains only ``[a-z0-9-]``, so it is also a
    valid Kubernetes label or taint value (≤ 63 characters).
    """
    # EventKind is a str: joined as it is (reading .value goes through enum's descriptor, 3x slower).
    digest = hashlib.blake2b("\x1f".join((kind, instance_id, key)).encode(), digest_size=10).hexdigest()
    return str.__add__(kind, "-" + digest)
