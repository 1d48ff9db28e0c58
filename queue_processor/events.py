"""The typed interruption events, one model per kind: one affected instance of one message each.
Aliases read the wire format (EC2 User Guide: "Spot Instance interruption notices", "EC2 instance rebalance
recommendations", "EC2 instance state-change events", "Monitor interruptible Capacity Reservations with EventBridge";
"Amazon EC2 Auto Scaling lifecycle hooks", in ``detail`` or top-level when sent straight to SQS). :class:`EventStore`
(pure) deduplicates by event ID and keeps one :class:`NodeOperation` per instance and mode: a node is drained **once**,
every message asking for it settled when that drain ends (DESIGN.md rule 2)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
    """``functools.cached_property`` without the lock Python 3.11 takes on every first read."""

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
    """The SQS message an event came from; ``ApproximateReceiveCount`` and ``SentTimestamp`` (aware datetime)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queue_url: str
    message_id: str
    receipt_handle: str
    receive_count: int = 1
    sent_timestamp: datetime | None = None


class BaseEvent(BaseModel):
    """Fields every event carries: ``instance_id`` as given (shape not checked), ``time`` when AWS emitted it (aware),
    ``source_id`` the message's own ID, ``message`` (``None`` when parsed from a file). Checks: pydantic-core's only."""

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
        """Record the SQS message this event came from (the parser does, once, on the event it made)."""
        self.__dict__["message"] = message


def make_event_id(kind: EventKind, instance_id: str, key: str) -> str:
    """``"<kind>-<20 hex digits>"``: at most 54 characters of ``[a-z0-9-]``, a valid label or taint value. ``key``:
    the lifecycle action token (shared by both forms), the AWS Health ``eventArn``, else the EventBridge ``id``."""
    digest = hashlib.blake2b("\x1f".join((kind, instance_id, key)).encode(), digest_size=10).hexdigest()
    return str.__add__(kind, "-" + digest)


def _detail(*keys: str, top: bool = False, **field: Any) -> Any:
    """A field read from ``detail.<key>`` (the first of ``keys``), also top-level with ``top``; ``field``: more."""
    choices = [AliasPath("detail", key) for key in keys] + (list(keys) if top else [])
    return Field(validation_alias=AliasChoices(*choices) if len(choices) > 1 else choices[0], **field)


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
    availability_zone_id: str | None = _detail("availability-zone-id", "azId", default=None)

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """``instance_termination_time``, else the end of a two-minute notice."""
        return self.instance_termination_time or self.time + SPOT_NOTICE


class AsgLifecycleEvent(BaseEvent):
    """A lifecycle action in either format, identified by its token; ``origin``/``destination`` as in "Lifecycle
    hooks for instances in a warm pool"."""

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


A = TypeVar("A", bound=AsgLifecycleEvent)


class Mode(StrEnum):
    """What an operation does to its node."""

    DRAIN = "drain"
    """Cordon and drain (every kind but launch actions)."""
    LAUNCH = "launch"
    """Wait for the node to register and turn Ready, then complete the launch action(s)."""


@dataclass
class NodeOperation:
    """One instance's events (unique IDs) and their message IDs, in arrival order; ``started_at``: store clock (s);
    ``settled``: how each finished lifecycle action ended; ``joined``: set when one joins (the handler clears it)."""

    instance_id: str
    mode: Mode
    started_at: float
    events: list[Event] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    settled: dict[ActionKey, str] = field(default_factory=dict)
    joined: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)

    def unsettled(self) -> list[AsgLifecycleEvent]:
        """Its lifecycle actions (terminate or launch) not settled yet."""
        return [a for a in self.lifecycle_actions if a.action_key not in self.settled]

    def _actions(self, kind: type[A]) -> list[A]:
        """Its events of type ``kind``, one per :class:`ActionKey`."""
        seen: dict[ActionKey, A] = {}
        for event in self.events:
            if isinstance(event, kind):
                seen.setdefault(event.action_key, event)
        return list(seen.values())

    @property
    def lifecycle_actions(self) -> list[AsgLifecycleEvent]:
        """All its lifecycle actions, one per :class:`ActionKey`."""
        return self._actions(AsgLifecycleEvent)

    @property
    def key(self) -> tuple[str, Mode]:
        """``(instance_id, mode)``: at most one operation per key is in flight."""
        return (self.instance_id, self.mode)

    @property
    def first(self) -> Event:
        return self.events[0]

    @property
    def kinds(self) -> list[EventKind]:
        """The kinds of its events, without repeats, in arrival order."""
        return list(dict.fromkeys(event.kind for event in self.events))

    def add(self, event: Event) -> bool:
        """Add ``event`` unless one of its ID is there (``True`` when added); a join sets :attr:`joined`."""
        if any(existing.event_id == event.event_id for existing in self.events):
            return False
        if self.events:
            self.joined.set()
        self.events.append(event)
        return True

    def event_of(self, kind: EventKind) -> Event:
        """The first of its events of ``kind``; raises ``StopIteration`` when it has none."""
        return next(event for event in self.events if event.kind is kind)

    @property
    def terminate_actions(self) -> list[AsgTerminateLifecycleEvent]:
        """Its ASG terminate lifecycle actions, one per :class:`ActionKey`."""
        return self._actions(AsgTerminateLifecycleEvent)

    @property
    def launch_actions(self) -> list[AsgLaunchLifecycleEvent]:
        """Its ASG launch lifecycle actions, one per :class:`ActionKey`."""
        return self._actions(AsgLaunchLifecycleEvent)


class AdmissionKind(StrEnum):
    """What :meth:`EventStore.admit` made of an event."""

    NEW = "new"
    """It starts an operation: handle it."""
    JOINED = "joined"
    """It joined the operation in flight for its instance (or repeats one of its events)."""
    DONE = "done"
    """It repeats an event whose operation already succeeded: nothing to do."""


@dataclass(frozen=True)
class Admission:
    """The answer of :meth:`EventStore.admit`: ``kind``, and the operation it started or joined."""

    kind: AdmissionKind
    operation: NodeOperation | None


class MessageOutcome(StrEnum):
    """What to do with a message whose operations have all ended."""

    DELETE = "delete"
    REQUEUE = "requeue"


@dataclass
class _MessageState:
    failed: bool = False
    actions: set[ActionKey] = field(default_factory=set)  # the lifecycle actions it carries
    operations: set[tuple[str, Mode]] = field(default_factory=set)  # the keys of its operations running


class EventStore:
    """Deduplication and coalescing; one asyncio loop. ``dedup_ttl_s``: seconds a success is remembered."""

    def __init__(self, dedup_ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.dedup_ttl_s = dedup_ttl_s
        self.clock = clock
        self._operations: dict[tuple[str, Mode], NodeOperation] = {}
        self._done: dict[str, float] = {}  # event_id → expiry
        self._messages: dict[str, _MessageState] = {}

    def in_flight(self, message_id: str) -> bool:
        """Whether a message still has an operation running."""
        return message_id in self._messages

    def actions_of(self, message_id: str) -> set[ActionKey]:
        """The lifecycle actions a message in flight carries (empty for one not in flight)."""
        state = self._messages.get(message_id)
        return set(state.actions) if state is not None else set()

    def running(self, operation: NodeOperation) -> bool:
        """Whether ``operation`` is in flight (admitted and not finished)."""
        return self._operations.get(operation.key) is operation

    def held(self) -> list[str]:
        """The IDs of every message that still has an operation running."""
        return list(self._messages)

    def counts(self) -> tuple[int, int]:
        """``(messages held, operations in flight)``."""
        return len(self._messages), len(self._operations)

    def admit(self, event: Event) -> Admission:
        """Start, join or repeat an operation; the event's ``message`` is tracked until all it joined have ended."""
        self._expire()
        if event.event_id in self._done:
            return Admission(AdmissionKind.DONE, None)
        key = (event.instance_id, Mode.LAUNCH if event.kind is EventKind.ASG_LAUNCH_LIFECYCLE else Mode.DRAIN)
        operation = self._operations.get(key)
        kind = AdmissionKind.JOINED
        if operation is None:
            operation = NodeOperation(event.instance_id, key[1], self.clock())
            self._operations[key] = operation
            kind = AdmissionKind.NEW
        operation.add(event)
        message = event.message
        if message is not None:
            state = self._messages.setdefault(message.message_id, _MessageState())
            if isinstance(event, AsgLifecycleEvent):
                state.actions.add(event.action_key)
            if key not in state.operations:  # the message's first event for this operation
                state.operations.add(key)
                operation.messages.append(message.message_id)
        return Admission(kind, operation)

    def finish(self, operation: NodeOperation, *, succeeded: bool) -> tuple[tuple[str, MessageOutcome], ...]:
        """End an operation, remembering a success's event IDs (not unsettled actions'); ``(message ID, outcome)``
        of messages with none left: DELETE if all succeeded and actions settled, else REQUEUE; raises ``KeyError``."""
        if self._operations.get(operation.key) is not operation:
            raise KeyError(f"no operation in flight for {operation.key}")
        del self._operations[operation.key]
        # An action the handler did not settle (it joined after the last completion) keeps its message.
        unsettled = {action.action_key for action in operation.unsettled()}
        if succeeded:
            expiry = self.clock() + self.dedup_ttl_s
            for event in operation.events:
                if not (isinstance(event, AsgLifecycleEvent) and event.action_key not in operation.settled):
                    self._done[event.event_id] = expiry
        settled: list[tuple[str, MessageOutcome]] = []
        for message_id in operation.messages:
            state = self._messages[message_id]
            state.failed = state.failed or not succeeded or bool(state.actions & unsettled)
            state.operations.discard(operation.key)
            if not state.operations:
                del self._messages[message_id]
                settled.append(
                    (message_id, MessageOutcome.REQUEUE if state.failed else MessageOutcome.DELETE)
                )
        return tuple(settled)

    def _expire(self) -> None:
        now = self.clock()
        if self._done and next(iter(self._done.values())) <= now:
            self._done = {event_id: expiry for event_id, expiry in self._done.items() if expiry > now}
