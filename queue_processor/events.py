"""The typed interruption events: :class:`BaseEvent` (kind, identity, SQS message) and one model per kind.

An event is one affected instance of one message. Validation aliases read the wire format (the EC2 User Guide's
"Spot Instance interruption notices", "EC2 instance rebalance recommendations", "EC2 instance state-change
events", "Monitor interruptible Capacity Reservations with EventBridge"; "Amazon EC2 Auto Scaling lifecycle
hooks", in EventBridge's ``detail`` or at the top level of a notification sent straight to SQS); field names build
one in code (``SpotInterruptionEvent(...)``). Reading message bodies into them is :mod:`queue_processor.parse`'s.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

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
    "NonEmptyStr",
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


def _detail(key: str, *, top: bool = False, **field: Any) -> Any:
    """A field read from ``detail.<key>``, or also from the top-level ``key`` (``top``: a notification sent
    straight to SQS); ``field``: more of ``pydantic.Field``'s arguments."""
    path = AliasPath("detail", key)
    return Field(validation_alias=AliasChoices(path, key) if top else path, **field)


def _detail_type(name: str) -> Any:
    """The ``detail-type`` a model is told apart by when parsed (not dumped, not shown)."""
    return Field(default=name, alias="detail-type", exclude=True, repr=False)


class _InstanceEvent(BaseEvent):
    """An EC2 event naming its instance in ``detail.instance-id``."""

    instance_id: NonEmptyStr = _detail("instance-id")


class SpotInterruptionEvent(_InstanceEvent):
    """A Spot interruption warning; ``instance_action`` is ``terminate``, ``stop`` or ``hibernate``."""

    detail_type: Literal["EC2 Spot Instance Interruption Warning"] = _detail_type(
        "EC2 Spot Instance Interruption Warning"
    )
    kind: Literal[EventKind.SPOT_INTERRUPTION] = EventKind.SPOT_INTERRUPTION
    instance_action: str | None = _detail("instance-action", default=None)

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """The end of the two-minute notice: ``time + 120 s``."""
        return self.time + SPOT_NOTICE


class RebalanceRecommendationEvent(_InstanceEvent):
    """A rebalance recommendation: ``detail`` = ``{"instance-id"}``; ``start_time = time`` (no deadline)."""

    detail_type: Literal["EC2 Instance Rebalance Recommendation"] = _detail_type(
        "EC2 Instance Rebalance Recommendation"
    )
    kind: Literal[EventKind.REBALANCE_RECOMMENDATION] = EventKind.REBALANCE_RECOMMENDATION


class StateChangeEvent(_InstanceEvent):
    """An instance state change (``detail.state``); ``start_time = time``."""

    detail_type: Literal["EC2 Instance State-change Notification"] = _detail_type(
        "EC2 Instance State-change Notification"
    )
    kind: Literal[EventKind.STATE_CHANGE] = EventKind.STATE_CHANGE
    state: NonEmptyStr = _detail("state")


class CapacityReservationInterruptionEvent(_InstanceEvent):
    """An interruptible Capacity Reservation (or Capacity Block) reclaiming the instance, two minutes ahead."""

    detail_type: Literal["EC2 Capacity Reservation Instance Interruption Warning"] = _detail_type(
        "EC2 Capacity Reservation Instance Interruption Warning"
    )
    kind: Literal[EventKind.CAPACITY_RESERVATION_INTERRUPTION] = EventKind.CAPACITY_RESERVATION_INTERRUPTION
    instance_termination_time: AwareDatetime | None = _detail("instance-termination-time", default=None)
    instance_action: str | None = _detail("instance-action", default=None)
    availability_zone_id: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            AliasPath("detail", "availability-zone-id"), AliasPath("detail", "azId")
        ),
    )

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """``instance_termination_time``, else the end of a two-minute notice."""
        return self.instance_termination_time or self.time + SPOT_NOTICE


class AsgLifecycleEvent(BaseEvent):
    """A lifecycle action in either format; ``origin``/``destination`` as in "Lifecycle hooks for instances in a
    warm pool". The identity key is the action token: both forms of one action share an ``event_id``."""

    kind: Literal[EventKind.ASG_TERMINATE_LIFECYCLE, EventKind.ASG_LAUNCH_LIFECYCLE]
    lifecycle_transition: str
    instance_id: NonEmptyStr = _detail("EC2InstanceId", top=True)
    time: AwareDatetime = Field(validation_alias=AliasChoices("time", "Time"))
    source_id: str | None = Field(default=None, validation_alias=AliasChoices("id", "RequestId"))
    auto_scaling_group_name: NonEmptyStr = _detail("AutoScalingGroupName", top=True)
    lifecycle_hook_name: NonEmptyStr = _detail("LifecycleHookName", top=True)
    lifecycle_action_token: str | None = _detail("LifecycleActionToken", top=True, default=None)
    origin: str | None = _detail("Origin", top=True, default=None)
    destination: str | None = _detail("Destination", top=True, default=None)
    notification_metadata: str | None = _detail("NotificationMetadata", top=True, default=None)

    def _identity_key(self) -> str:
        return self.lifecycle_action_token or super()._identity_key()

    @property
    def action_key(self) -> ActionKey:
        """``(token or instance ID, group, hook)``, as ``CompleteLifecycleAction`` addresses the action."""
        return ActionKey(
            self.lifecycle_action_token or self.instance_id,
            self.auto_scaling_group_name,
            self.lifecycle_hook_name,
        )


class AsgTerminateLifecycleEvent(AsgLifecycleEvent):
    """A terminate lifecycle action: drain, then complete it. ``start_time = time`` (``Terminating:Wait`` from then)."""

    detail_type: Literal["EC2 Instance-terminate Lifecycle Action"] = _detail_type(
        "EC2 Instance-terminate Lifecycle Action"
    )
    kind: Literal[EventKind.ASG_TERMINATE_LIFECYCLE] = EventKind.ASG_TERMINATE_LIFECYCLE
    lifecycle_transition: Literal["autoscaling:EC2_INSTANCE_TERMINATING"] = _detail(
        "LifecycleTransition", top=True
    )


class AsgLaunchLifecycleEvent(AsgLifecycleEvent):
    """A launch lifecycle action, into the group or a warm pool: wait for the node, then complete it."""

    detail_type: Literal["EC2 Instance-launch Lifecycle Action"] = _detail_type(
        "EC2 Instance-launch Lifecycle Action"
    )
    kind: Literal[EventKind.ASG_LAUNCH_LIFECYCLE] = EventKind.ASG_LAUNCH_LIFECYCLE
    lifecycle_transition: Literal["autoscaling:EC2_INSTANCE_LAUNCHING"] = _detail(
        "LifecycleTransition", top=True
    )


class ScheduledChangeEvent(BaseEvent):
    """One affected instance of an AWS Health EC2 ``scheduledChange`` event; the identity key is ``event_arn``."""

    kind: Literal[EventKind.SCHEDULED_CHANGE] = EventKind.SCHEDULED_CHANGE
    scheduled_start_time: AwareDatetime
    end_time: AwareDatetime | None = None
    event_arn: str | None = None
    event_type_code: str | None = None
    #: The EventBridge envelope's ``id`` (NTH names the event after it; ``source_id`` is the ``eventArn``).
    eventbridge_id: str | None = None

    def _identity_key(self) -> str:
        return self.event_arn or super()._identity_key()

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """The Health event's ``startTime``."""
        return self.scheduled_start_time


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
