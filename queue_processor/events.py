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
its event in one pass from JSON; ``event_id`` and ``start_time`` are computed by the model from its fields.
Models also accept their field names, so an event can be built in code: ``SpotInterruptionEvent(
instance_id=..., time=..., source_id=...)``. ``detail_type`` and ``source`` are the EventBridge envelope's,
kept out of ``model_dump``.

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
from typing import Annotated, Literal, NamedTuple, TypeVar

from pydantic import (
    AliasChoices,
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
    "AsgLaunchLifecycleEvent",
    "AsgLifecycleEvent",
    "AsgTerminateLifecycleEvent",
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


def _detail(key: str) -> AliasPath:
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


class AsgLifecycleEvent(BaseEvent):
    """An Auto Scaling lifecycle action, read from EventBridge's ``detail`` or from the notification the hook
    sends straight to SQS (the same field names at the top level, with ``Time`` and ``RequestId``). Its two
    kinds are :class:`AsgTerminateLifecycleEvent` and :class:`AsgLaunchLifecycleEvent`.

    ``lifecycle_action_token`` and the instance ID address the action in ``CompleteLifecycleAction`` and
    ``RecordLifecycleActionHeartbeat``. ``origin``/``destination`` are ``EC2``, ``AutoScalingGroup`` or
    ``WarmPool`` ("Lifecycle hooks for instances in a warm pool", EC2 Auto Scaling User Guide);
    ``notification_metadata`` is the hook's free-form string. The identity key is the token, so the
    EventBridge and the direct form of one action share an ``event_id``.
    """

    kind: Literal[EventKind.ASG_TERMINATE_LIFECYCLE, EventKind.ASG_LAUNCH_LIFECYCLE]
    lifecycle_transition: str
    instance_id: NonEmptyStr = Field(validation_alias=AliasChoices(_detail("EC2InstanceId"), "EC2InstanceId"))
    time: AwareDatetime = Field(validation_alias=AliasChoices("time", "Time"))
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
    origin: str | None = Field(default=None, validation_alias=AliasChoices(_detail("Origin"), "Origin"))
    destination: str | None = Field(
        default=None, validation_alias=AliasChoices(_detail("Destination"), "Destination")
    )
    notification_metadata: str | None = Field(
        default=None,
        validation_alias=AliasChoices(_detail("NotificationMetadata"), "NotificationMetadata"),
    )

    def _identity_key(self) -> str:
        return self.lifecycle_action_token or super()._identity_key()

    @property
    def action_key(self) -> ActionKey:
        """The lifecycle action's identity: ``(token or instance ID, group, hook)``, as the lifecycle API
        addresses it (the EventBridge and the direct form of one action share it)."""
        return ActionKey(
            self.lifecycle_action_token or self.instance_id,
            self.auto_scaling_group_name,
            self.lifecycle_hook_name,
        )


class AsgTerminateLifecycleEvent(AsgLifecycleEvent):
    """A terminate lifecycle action (``autoscaling:EC2_INSTANCE_TERMINATING``): drain, then complete it.
    ``start_time = time``: the instance waits in ``Terminating:Wait`` until the action is completed or its
    heartbeat timeout passes."""

    detail_type: Literal["EC2 Instance-terminate Lifecycle Action"] = Field(
        default="EC2 Instance-terminate Lifecycle Action", alias="detail-type", exclude=True, repr=False
    )
    kind: Literal[EventKind.ASG_TERMINATE_LIFECYCLE] = EventKind.ASG_TERMINATE_LIFECYCLE
    lifecycle_transition: Literal["autoscaling:EC2_INSTANCE_TERMINATING"] = Field(
        validation_alias=AliasChoices(_detail("LifecycleTransition"), "LifecycleTransition")
    )


class AsgLaunchLifecycleEvent(AsgLifecycleEvent):
    """A launch lifecycle action (``autoscaling:EC2_INSTANCE_LAUNCHING``), into the group or a warm pool:
    wait for the node, then complete it. ``start_time = time``."""

    detail_type: Literal["EC2 Instance-launch Lifecycle Action"] = Field(
        default="EC2 Instance-launch Lifecycle Action", alias="detail-type", exclude=True, repr=False
    )
    kind: Literal[EventKind.ASG_LAUNCH_LIFECYCLE] = EventKind.ASG_LAUNCH_LIFECYCLE
    lifecycle_transition: Literal["autoscaling:EC2_INSTANCE_LAUNCHING"] = Field(
        validation_alias=AliasChoices(_detail("LifecycleTransition"), "LifecycleTransition")
    )


class SpotInterruptionEvent(BaseEvent):
    """A Spot interruption warning: ``detail`` = ``{"instance-id", "instance-action"}``;
    ``start_time = time + 120 s``. ``instance_action`` is ``terminate``, ``stop`` or ``hibernate``."""

    detail_type: Literal["EC2 Spot Instance Interruption Warning"] = Field(
        default="EC2 Spot Instance Interruption Warning", alias="detail-type", exclude=True, repr=False
    )
    kind: Literal[EventKind.SPOT_INTERRUPTION] = EventKind.SPOT_INTERRUPTION
    instance_id: NonEmptyStr = Field(validation_alias=_detail("instance-id"))
    instance_action: str | None = Field(default=None, validation_alias=_detail("instance-action"))

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """The end of the two-minute notice: ``time + 120 s``."""
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
    """One affected instance of an AWS Health EC2 ``scheduledChange`` event, built by the parser for each
    affected instance. ``scheduled_start_time``/``end_time`` are the event's ``startTime``/``endTime``
    (``start_time`` is ``scheduled_start_time``); the identity key is ``event_arn``."""

    kind: Literal[EventKind.SCHEDULED_CHANGE] = EventKind.SCHEDULED_CHANGE
    scheduled_start_time: AwareDatetime
    end_time: AwareDatetime | None = None
    event_arn: str | None = None
    event_type_code: str | None = None

    def _identity_key(self) -> str:
        return self.event_arn or super()._identity_key()

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """The Health event's ``startTime``."""
        return self.scheduled_start_time


class CapacityReservationInterruptionEvent(BaseEvent):
    """An interruptible Capacity Reservation (or Capacity Block) reclaiming the instance: ``detail`` =
    ``{"instance-id", "instance-action", "instance-termination-time", "azId" | "availability-zone-id"}``.
    ``start_time`` is ``instance_termination_time``, or ``time`` + 120 s when the message has none."""

    detail_type: Literal["EC2 Capacity Reservation Instance Interruption Warning"] = Field(
        default="EC2 Capacity Reservation Instance Interruption Warning",
        alias="detail-type",
        exclude=True,
        repr=False,
    )
    kind: Literal[EventKind.CAPACITY_RESERVATION_INTERRUPTION] = EventKind.CAPACITY_RESERVATION_INTERRUPTION
    instance_id: NonEmptyStr = Field(validation_alias=_detail("instance-id"))
    instance_termination_time: AwareDatetime | None = Field(
        default=None, validation_alias=_detail("instance-termination-time")
    )
    instance_action: str | None = Field(default=None, validation_alias=_detail("instance-action"))
    availability_zone_id: str | None = Field(
        default=None, validation_alias=AliasChoices(_detail("availability-zone-id"), _detail("azId"))
    )

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """``instance_termination_time``, else the end of a two-minute notice."""
        return self.instance_termination_time or self.time + SPOT_NOTICE


Event = Annotated[
    AsgTerminateLifecycleEvent
    | AsgLaunchLifecycleEvent
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
