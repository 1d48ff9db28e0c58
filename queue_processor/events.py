"""Typed interruption events: one pydantic model per message kind.

An :data:`Event` is what the parser (:mod:`queue_processor.parse`) makes of one SQS message body and what the
rest of the controller acts on. One message gives one event per affected instance (an AWS Health event can name
several instances). Every event carries:

- ``kind`` (:class:`EventKind`), the name used in logs, metrics and ``queue-processor inspect``;
- ``instance_id``, the EC2 instance ID as the message gives it (its shape is not checked: some real messages
  carry IDs that are not well-formed);
- ``event_id``, a deterministic identity (:func:`make_event_id`): unique per instance, the same across SQS
  redeliveries of the same message, whatever the JSON key order or whitespace;
- ``time``, when AWS emitted the event, and ``start_time``, when the instance is expected to go away;
- ``source_id``, the identifier the message itself gives (EventBridge ``id``, a lifecycle notification's
  ``RequestId``, an AWS Health ``eventArn``), for logs and support cases;
- ``message``, the SQS message it came from (:class:`SqsMessageRef`), ``None`` when parsed from a file.

Each model reads its own wire format: its fields carry validation aliases for the EventBridge message (and, for
lifecycle actions, the notification Auto Scaling sends straight to SQS), so the parser validates a body into
its event in one pass from JSON, and ``event_id`` and ``start_time`` are derived by the model itself. Models
also accept their field names, so an event can be built in code: ``SpotInterruptionEvent(instance_id=...,
time=..., source_id=...)``. ``detail_type`` and ``source`` are the EventBridge envelope's, kept out of
``model_dump``.

Formats: "Amazon EventBridge events" in the EC2 User Guide (Spot interruption warning, rebalance
recommendation, state-change, Capacity Reservation interruption), "Amazon EC2 Auto Scaling lifecycle hooks"
(lifecycle notifications, warm pools' Origin/Destination) and the AWS Health User Guide ("Monitoring AWS
Health events with Amazon EventBridge").
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import (
    AliasChoices,
    AliasPath,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    model_validator,
)

__all__ = [
    "SPOT_NOTICE",
    "AsgLifecycleEvent",
    "BaseEvent",
    "CapacityReservationInterruptionEvent",
    "Event",
    "EventKind",
    "RebalanceRecommendationEvent",
    "ScheduledChangeEvent",
    "SpotInterruptionEvent",
    "SqsMessageRef",
    "StateChangeEvent",
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

TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
LAUNCHING = "autoscaling:EC2_INSTANCE_LAUNCHING"
#: The lifecycle transitions acted on, and the event kind of each.
TRANSITION_KINDS = {TERMINATING: EventKind.ASG_TERMINATE_LIFECYCLE, LAUNCHING: EventKind.ASG_LAUNCH_LIFECYCLE}

#: A required, non-blank string such as an instance ID.
NonEmptyStr = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]

# Stands for "not given" in ``start_time`` until the model derives it; never a real start time.
_UNSET_TIME = datetime.min.replace(tzinfo=UTC)


def _detail(key: str) -> AliasPath:
    return AliasPath("detail", key)


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
    """Fields every event carries; see the module docstring. Times are timezone-aware (a naive time is
    taken to be UTC).

    Validation derives ``event_id`` (always) and ``start_time`` (when not given), and takes ``message`` from
    the validation context (``{"message": SqsMessageRef}``) when it is not given.
    """

    # extra="ignore": the wire format has many fields we do not read. frozen: events are shared by tasks.
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    detail_type: str | None = Field(default=None, alias="detail-type", exclude=True, repr=False)
    source: str | None = Field(default=None, exclude=True, repr=False)
    kind: EventKind
    instance_id: NonEmptyStr
    event_id: str = ""
    time: datetime
    start_time: datetime = _UNSET_TIME
    source_id: str | None = Field(default=None, validation_alias="id")
    message: SqsMessageRef | None = None

    def _identity_key(self) -> str:
        """What names this occurrence whatever its serialisation (see :func:`make_event_id`)."""
        return self.source_id or f"{self.time.isoformat()}|{self.detail_type}"

    def _default_start_time(self) -> datetime:
        """``start_time`` when the message does not give one."""
        return self.time

    def _prepare(self) -> None:
        """Set fields that the ones below depend on (overridden by kinds that derive ``kind``)."""

    @model_validator(mode="after")
    def _complete(self, info: ValidationInfo) -> Self:
        # The model is frozen: derived fields are written to its __dict__, where pydantic keeps field values
        # (object.__setattr__ does the same, three times slower; this runs once per message).
        self._prepare()
        values = self.__dict__
        time: datetime = values["time"]
        if time.tzinfo is None:
            values["time"] = time.replace(tzinfo=UTC)
        start_time: datetime = values["start_time"]
        if start_time is _UNSET_TIME:
            values["start_time"] = self._default_start_time()
        elif start_time.tzinfo is None:
            values["start_time"] = start_time.replace(tzinfo=UTC)
        values["event_id"] = make_event_id(self.kind, self.instance_id, self._identity_key())
        context = info.context
        if context is not None and values["message"] is None:
            values["message"] = context.get("message")
        return self


class AsgLifecycleEvent(BaseEvent):
    """An Auto Scaling lifecycle action, read from EventBridge's ``detail`` or from the notification the hook
    sends straight to SQS (the same field names at the top level, with ``Time`` and ``RequestId``).

    ``kind`` follows ``lifecycle_transition`` (``autoscaling:EC2_INSTANCE_TERMINATING`` or
    ``…_LAUNCHING``; any other transition is a validation error). ``lifecycle_action_token`` and the instance
    ID address the action in ``CompleteLifecycleAction`` and ``RecordLifecycleActionHeartbeat``.
    ``origin``/``destination`` are ``EC2``, ``AutoScalingGroup`` or ``WarmPool`` ("Lifecycle hooks for
    instances in a warm pool", EC2 Auto Scaling User Guide); ``notification_metadata`` is the hook's free-form
    string. The identity key is the token, so both forms of one action share an ``event_id``.
    """

    detail_type: Literal[
        "EC2 Instance-terminate Lifecycle Action", "EC2 Instance-launch Lifecycle Action"
    ] = Field(
        default="EC2 Instance-terminate Lifecycle Action", alias="detail-type", exclude=True, repr=False
    )
    kind: Literal[EventKind.ASG_TERMINATE_LIFECYCLE, EventKind.ASG_LAUNCH_LIFECYCLE] = (
        EventKind.ASG_TERMINATE_LIFECYCLE
    )
    instance_id: NonEmptyStr = Field(validation_alias=AliasChoices(_detail("EC2InstanceId"), "EC2InstanceId"))
    time: datetime = Field(validation_alias=AliasChoices("time", "Time"))
    source_id: str | None = Field(default=None, validation_alias=AliasChoices("id", "RequestId"))
    auto_scaling_group_name: NonEmptyStr = Field(
        validation_alias=AliasChoices(_detail("AutoScalingGroupName"), "AutoScalingGroupName")
    )
    lifecycle_hook_name: NonEmptyStr = Field(
        validation_alias=AliasChoices(_detail("LifecycleHookName"), "LifecycleHookName")
    )
    lifecycle_action_token: str | None = Field(
        default=None,
        validation_alias=AliasChoices(_detail("LifecycleActionToken"), "LifecycleActionToken"),
    )
    lifecycle_transition: str = Field(
        validation_alias=AliasChoices(_detail("LifecycleTransition"), "LifecycleTransition")
    )
    origin: str | None = Field(default=None, validation_alias=AliasChoices(_detail("Origin"), "Origin"))
    destination: str | None = Field(
        default=None, validation_alias=AliasChoices(_detail("Destination"), "Destination")
    )
    notification_metadata: str | None = Field(
        default=None,
        validation_alias=AliasChoices(_detail("NotificationMetadata"), "NotificationMetadata"),
    )

    def _prepare(self) -> None:
        kind = TRANSITION_KINDS.get(self.lifecycle_transition)
        if kind is None:
            raise ValueError(f"lifecycle transition {self.lifecycle_transition!r} is not acted on")
        self.__dict__["kind"] = kind

    def _identity_key(self) -> str:
        return self.lifecycle_action_token or super()._identity_key()


class SpotInterruptionEvent(BaseEvent):
    """A Spot interruption warning: ``detail`` = ``{"instance-id", "instance-action"}``;
    ``start_time = time + 120 s``. ``instance_action`` is ``terminate``, ``stop`` or ``hibernate``."""

    detail_type: Literal["EC2 Spot Instance Interruption Warning"] = Field(
        default="EC2 Spot Instance Interruption Warning", alias="detail-type", exclude=True, repr=False
    )
    kind: Literal[EventKind.SPOT_INTERRUPTION] = EventKind.SPOT_INTERRUPTION
    instance_id: NonEmptyStr = Field(validation_alias=_detail("instance-id"))
    instance_action: str | None = Field(default=None, validation_alias=_detail("instance-action"))

    def _default_start_time(self) -> datetime:
        return self.time + SPOT_NOTICE


class RebalanceRecommendationEvent(BaseEvent):
    """A rebalance recommendation: ``detail`` = ``{"instance-id"}``; ``start_time = time`` (no deadline)."""

    detail_type: Literal["EC2 Instance Rebalance Recommendation"] = Field(
        default="EC2 Instance Rebalance Recommendation", alias="detail-type", exclude=True, repr=False
    )
    kind: Literal[EventKind.REBALANCE_RECOMMENDATION] = EventKind.REBALANCE_RECOMMENDATION
    instance_id: NonEmptyStr = Field(validation_alias=_detail("instance-id"))


class StateChangeEvent(BaseEvent):
    """An instance state change: ``detail`` = ``{"instance-id", "state"}``; ``start_time = time``. The parser
    keeps only ``stopping``, ``stopped``, ``shutting-down`` and ``terminated``."""

    detail_type: Literal["EC2 Instance State-change Notification"] = Field(
        default="EC2 Instance State-change Notification", alias="detail-type", exclude=True, repr=False
    )
    kind: Literal[EventKind.STATE_CHANGE] = EventKind.STATE_CHANGE
    instance_id: NonEmptyStr = Field(validation_alias=_detail("instance-id"))
    state: NonEmptyStr = Field(validation_alias=_detail("state"))


class ScheduledChangeEvent(BaseEvent):
    """One affected instance of an AWS Health EC2 ``scheduledChange`` event; ``start_time`` is the event's
    ``startTime``, ``end_time`` its ``endTime`` when given. Built by the parser, one per affected instance;
    the identity key is ``event_arn``."""

    kind: Literal[EventKind.SCHEDULED_CHANGE] = EventKind.SCHEDULED_CHANGE
    event_arn: str | None = None
    event_type_code: str | None = None
    end_time: datetime | None = None

    def _identity_key(self) -> str:
        return self.event_arn or super()._identity_key()


class CapacityReservationInterruptionEvent(BaseEvent):
    """An interruptible Capacity Reservation (or Capacity Block) reclaiming the instance: ``detail`` =
    ``{"instance-id", "instance-action", "instance-termination-time", "azId" | "availability-zone-id"}``.
    ``start_time`` is ``instance-termination-time``, or ``time`` + 120 s when the message has none."""

    detail_type: Literal["EC2 Capacity Reservation Instance Interruption Warning"] = Field(
        default="EC2 Capacity Reservation Instance Interruption Warning",
        alias="detail-type",
        exclude=True,
        repr=False,
    )
    kind: Literal[EventKind.CAPACITY_RESERVATION_INTERRUPTION] = EventKind.CAPACITY_RESERVATION_INTERRUPTION
    instance_id: NonEmptyStr = Field(validation_alias=_detail("instance-id"))
    start_time: datetime = Field(default=_UNSET_TIME, validation_alias=_detail("instance-termination-time"))
    instance_action: str | None = Field(default=None, validation_alias=_detail("instance-action"))
    availability_zone_id: str | None = Field(
        default=None,
        validation_alias=AliasChoices(_detail("availability-zone-id"), _detail("azId")),
    )

    def _default_start_time(self) -> datetime:
        return self.time + SPOT_NOTICE


Event = Annotated[
    AsgLifecycleEvent
    | SpotInterruptionEvent
    | RebalanceRecommendationEvent
    | StateChangeEvent
    | ScheduledChangeEvent
    | CapacityReservationInterruptionEvent,
    Field(discriminator="kind"),
]
"""Any event, discriminated by ``kind``."""


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
