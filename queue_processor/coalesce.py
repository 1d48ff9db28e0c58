"""The event store: deduplication by event ID and one operation per instance and mode (pure, no I/O).

However SQS and EventBridge repeat and however many kinds one instance brings, a node is drained **once**, and every
message asking for it acknowledged when that drain ends, every lifecycle action among them completed (DESIGN.md rule 2).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from queue_processor.events import (
    ActionKey,
    AsgLaunchLifecycleEvent,
    AsgLifecycleEvent,
    AsgTerminateLifecycleEvent,
    Event,
    EventKind,
)

__all__ = ["Admission", "EventStore", "MessageOutcome", "Mode", "NodeOperation", "Settlement"]


class Mode(StrEnum):
    """What an operation does to its node."""

    DRAIN = "drain"
    """Cordon and drain (every kind but launch actions)."""
    LAUNCH = "launch"
    """Wait for the node to register and turn Ready, then complete the launch action(s)."""


def mode_of(event: Event) -> Mode:
    """The mode of the operation an event belongs to."""
    return Mode.LAUNCH if event.kind is EventKind.ASG_LAUNCH_LIFECYCLE else Mode.DRAIN


@dataclass
class NodeOperation:
    """Everything asked of one instance at once: its events (unique IDs) and the IDs of their messages, in arrival
    order; ``started_at``: the store clock's reading (seconds); ``settled``: how each lifecycle action the handler
    is finished with ended; ``joined``: set whenever an event joins (the handler clears it)."""

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

    @property
    def lifecycle_actions(self) -> list[AsgLifecycleEvent]:
        """All its lifecycle actions, one per :class:`~queue_processor.events.ActionKey`."""
        return _unique_actions(e for e in self.events if isinstance(e, AsgLifecycleEvent))

    @property
    def key(self) -> tuple[str, Mode]:
        """``(instance_id, mode)``: at most one operation per key is in flight."""
        return (self.instance_id, self.mode)

    @property
    def first(self) -> Event:
        """The event that started the operation."""
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
        """Its ASG terminate lifecycle actions, one per :class:`~.events.ActionKey`."""
        return _unique_actions(e for e in self.events if isinstance(e, AsgTerminateLifecycleEvent))

    @property
    def launch_actions(self) -> list[AsgLaunchLifecycleEvent]:
        """Its ASG launch lifecycle actions, one per :class:`~.events.ActionKey`."""
        return _unique_actions(e for e in self.events if isinstance(e, AsgLaunchLifecycleEvent))


A = TypeVar("A", bound=AsgLifecycleEvent)


def _unique_actions(events: Iterable[A]) -> list[A]:
    seen: dict[ActionKey, A] = {}
    for event in events:
        seen.setdefault(event.action_key, event)
    return list(seen.values())


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


@dataclass(frozen=True)
class Settlement:
    """Messages whose every operation has ended, with what to do with each."""

    messages: tuple[tuple[str, MessageOutcome], ...]
    """(message ID, what to do with it) pairs; the receipt handles are the settlement ledger's
    (:class:`~queue_processor.settlement.Ledger`)."""


@dataclass
class _MessageState:
    running: int = 0
    failed: bool = False
    actions: set[ActionKey] = field(default_factory=set)  # the lifecycle actions it carries


class EventStore:
    """Deduplication and coalescing; one asyncio loop. ``dedup_ttl_s``: seconds a success is remembered."""

    def __init__(self, dedup_ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.dedup_ttl_s = dedup_ttl_s
        self.clock = clock
        self._operations: dict[tuple[str, Mode], NodeOperation] = {}
        self._done: dict[str, float] = {}  # event_id → expiry
        self._messages: dict[str, _MessageState] = {}
        self._message_ops: dict[str, set[tuple[str, Mode]]] = {}

    @property
    def operations(self) -> list[NodeOperation]:
        """The operations in flight."""
        return list(self._operations.values())

    def in_flight(self, message_id: str) -> bool:
        """Whether a message still has an operation running."""
        state = self._messages.get(message_id)
        return state is not None and state.running > 0

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

    @property
    def held_count(self) -> int:
        """How many messages :meth:`held` would return."""
        return len(self._messages)

    def admit(self, event: Event) -> Admission:
        """Take one event: whether it starts an operation, joins the one in flight, or repeats a succeeded one. Its
        ``message`` is tracked until every operation it joined has ended."""
        self._expire()
        if event.event_id in self._done:
            return Admission(AdmissionKind.DONE, None)
        key = (event.instance_id, mode_of(event))
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
            operations = self._message_ops.setdefault(message.message_id, set())
            if key not in operations:  # the message's first event for this operation
                operations.add(key)
                state.running += 1
                operation.messages.append(message.message_id)
        return Admission(kind, operation)

    def finish(self, operation: NodeOperation, *, succeeded: bool) -> Settlement:
        """End an operation, remembering a success's event IDs (not unsettled actions'); the messages with none left:
        DELETE when all theirs succeeded, actions settled, else REQUEUE. ``KeyError`` for one not in flight."""
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
            state.running -= 1
            state.failed = state.failed or not succeeded or bool(state.actions & unsettled)
            self._message_ops[message_id].discard(operation.key)
            if state.running == 0:
                del self._messages[message_id]
                del self._message_ops[message_id]
                settled.append(
                    (message_id, MessageOutcome.REQUEUE if state.failed else MessageOutcome.DELETE)
                )
        return Settlement(tuple(settled))

    def _expire(self) -> None:
        now = self.clock()
        if self._done and next(iter(self._done.values())) <= now:
            self._done = {event_id: expiry for event_id, expiry in self._done.items() if expiry > now}
