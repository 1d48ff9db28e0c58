"""What the steps of an operation share: its context, the step wrapper and the helpers of both paths
(:mod:`queue_processor.handler`, :mod:`queue_processor.launch`). Every task a step starts goes through
:meth:`OperationContext.spawn`: cancelled and awaited however the operation ends (DESIGN.md rule 3).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from queue_processor import tasks
from queue_processor.coalesce import Mode, NodeOperation
from queue_processor.config import Settings
from queue_processor.events import EventKind
from queue_processor.kinds import AsgLaunchLifecycleEvent, Event, StateChangeEvent
from queue_processor.leases import Claim
from queue_processor.lifecycle import Heartbeats
from queue_processor.nodes import InstanceInfo, InstanceResolver, NodeFinder, is_managed
from queue_processor.observe.events import (
    CORDON,
    CORDON_AND_DRAIN,
    CORDON_AND_DRAIN_ERROR,
    CORDON_ERROR,
    POST_DRAIN,
    POST_DRAIN_ERROR,
    NodeEventRecorder,
)
from queue_processor.observe.observer import Observer
from queue_processor.observe.webhook import NO_FACTS, NodeFacts
from queue_processor.outcomes import ClaimLost, NodeAction, OperationOutcome

__all__ = [
    "INSTANCE_ENDED",
    "STEP_EVENTS",
    "Collaborators",
    "OperationContext",
    "Outcome",
    "Step",
    "StepEvents",
    "Steps",
]

T = TypeVar("T")

#: Seconds since a message was sent after which the cached instance description (kept 60 s) is not trusted.
LATE_S = 60.0

#: EC2 states of an instance that has ended: its node never comes back and its lifecycle actions are over.
INSTANCE_ENDED = ("shutting-down", "terminated")


class Outcome(StrEnum):
    """The end of an operation for its messages."""

    DONE = "done"
    """Acknowledge: drained, or nothing to do."""
    RETRY = "retry"
    """EarlyExit: make the messages visible again after a backoff."""


class Step(StrEnum):
    """The steps :meth:`Steps.step` reports (keys of :data:`STEP_EVENTS`)."""

    CORDON = "cordon"
    """PreDrain and cordon (NTH's CordonError with CORDON_ONLY, else CordonAndDrainError, on failure)."""
    POST_DRAIN = "post-drain"
    """The lifecycle actions completed after a drain, or after a launching node turned Ready."""


@dataclass(frozen=True)
class StepEvents:
    """How a step is reported: ``action``, NTH's action counted (``actions_total``; ``None``: none); ``success``,
    the (reason, message) of its Event; ``failure(settings)``, those of its warning Event."""

    action: NodeAction | None
    success: tuple[str, str] | None
    failure: Callable[[Settings], tuple[str, str]]


#: The steps' Events, as NTH records them (aws-node-termination-handler's pkg/observability/k8s-events.go).
STEP_EVENTS: dict[Step, StepEvents] = {
    Step.CORDON: StepEvents(
        action=None,
        success=None,
        failure=lambda s: (
            (f"{CORDON[0]}Error", CORDON_ERROR)
            if s.cordon_only
            else (f"{CORDON_AND_DRAIN[0]}Error", CORDON_AND_DRAIN_ERROR)
        ),
    ),
    Step.POST_DRAIN: StepEvents(
        action=NodeAction.POST_DRAIN,
        success=POST_DRAIN,
        failure=lambda _: ("PostDrainError", POST_DRAIN_ERROR),
    ),
}


@dataclass
class OperationContext:
    """One operation as its steps see it: ``node`` once found (``assumed``: the private DNS name, not read),
    ``claim`` its Lease, ``tainted`` the kinds whose taints the node carries, ``facts`` for the webhook."""

    operation: NodeOperation
    early_exit: AsyncExitStack
    log: Any
    info: InstanceInfo | None = None
    node: str = ""
    assumed: bool = False
    claim: Claim | None = None
    tainted: set[EventKind] = field(default_factory=set)
    facts: NodeFacts = NO_FACTS

    def bind(self, **values: Any) -> None:
        """Add ``values`` to every later log line of the operation."""
        self.log = self.log.bind(**values)

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str, awaited: bool = False) -> asyncio.Task[T]:
        """Start ``coro`` as a named task (:func:`queue_processor.tasks.spawn`; ``awaited``: the caller takes its
        result) whose stop is on the EarlyExit stack; stopping it earlier is harmless."""
        task = tasks.spawn(coro, name=name, awaited=awaited)
        self.early_exit.push_async_callback(tasks.stop, task)
        return task


@dataclass(frozen=True)
class Collaborators:
    """What both paths talk to; ``clock`` returns monotonic seconds, ``recorder`` ``None``: no Events."""

    settings: Settings
    resolver: InstanceResolver
    finder: NodeFinder
    heartbeats: Heartbeats
    recorder: NodeEventRecorder | None
    observer: Observer
    clock: Callable[[], float] = time.monotonic


class Steps:
    """The helpers the drain and launch paths share; each :class:`Collaborators` field is an attribute."""

    def __init__(self, parts: Collaborators) -> None:
        self.parts = parts
        self.settings = parts.settings
        self.resolver = parts.resolver
        self.finder = parts.finder
        self.heartbeats = parts.heartbeats
        self.recorder = parts.recorder
        self.observer = parts.observer
        self.clock = parts.clock

    # -------------------------------------------------------------------------------------- the wrapper

    async def step(
        self, ctx: OperationContext, step: Step, work: Awaitable[T], *, guarded: bool = False
    ) -> T:
        """Run ``work`` (guarded by the Lease when ``guarded``) and report it, as NTH, from :data:`STEP_EVENTS`, on
        failure too. Raises what ``work`` raises; ``ClaimLost`` when the Lease is lost meanwhile."""
        events = STEP_EVENTS[step]
        try:
            result = await (self.guarded(ctx, work) if guarded else work)
        except (asyncio.CancelledError, ClaimLost):
            raise
        except Exception as exc:
            if events.action is not None:
                self.observer.node_action(events.action, False)
            reason, text = events.failure(self.settings)
            await self.event(ctx, reason, f"{text}: {exc}", warning=True)
            raise
        if events.action is not None:
            self.observer.node_action(events.action, True)
        if events.success is not None:
            await self.event(ctx, *events.success)
        return result

    async def guarded(self, ctx: OperationContext, work: Awaitable[T]) -> T:
        """Await ``work``; with a Lease, cancel it and raise :class:`ClaimLost` as soon as the Lease is lost."""
        claim = ctx.claim
        if claim is None:
            return await work
        task = ctx.spawn(_awaited(work), name=f"step-{ctx.node}", awaited=True)  # raised below, by result()
        lost = ctx.spawn(claim.lost.wait(), name=f"lease-lost-{ctx.node}")
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await tasks.stop(task, lost)
        if task.cancelled() and lost.done() and not lost.cancelled():
            raise ClaimLost(f"Lease {claim.name} was lost")
        return task.result()

    # -------------------------------------------------------------------------------------- shared steps

    def left_to_bootstrap(self, action: AsgLaunchLifecycleEvent) -> bool:
        """Whether a launch action is left to the bootstrap (warm pool, no COMPLETE_WARM_POOL_LAUNCH)."""
        return action.destination == "WarmPool" and not self.settings.complete_warm_pool_launch

    async def resolve(self, ctx: OperationContext) -> InstanceInfo | Outcome:
        """The instance as EC2 describes it (also ``ctx.info``), or the outcome when there is nothing to do: unknown
        to EC2, not managed, or started again (:meth:`_started_again`)."""
        operation, log = ctx.operation, ctx.log
        # A launch is a start: it changed the LaunchTime a cached answer has, which the next cordon records.
        info = await self.resolver.get(operation.instance_id, fresh=operation.mode is Mode.LAUNCH)
        if info is None:
            self.observer.operation_outcome(OperationOutcome.UNKNOWN_INSTANCE)
            if operation.mode is Mode.DRAIN:
                log.info("instance unknown to EC2: nothing to drain, its lifecycle actions completed")
                await self.complete_actions(ctx, claim=None)
            else:  # never CONTINUE a launch for an instance EC2 cannot show: left to the hook's default
                log.info("instance unknown to EC2: its launch actions are left to their hook's timeout")
                await self.stop_heartbeats(operation, "unknown-instance")
            return Outcome.DONE
        settings = self.settings
        if not is_managed(
            info,
            check=settings.check_tag_before_draining,
            tag=settings.managed_tag,
            value=settings.managed_tag_value,
        ):
            log.info("instance not managed: ignored", managed_tag=settings.managed_tag)
            self.observer.operation_outcome(OperationOutcome.UNMANAGED)
            await self.stop_heartbeats(operation, "unmanaged")
            return Outcome.DONE
        ctx.info = info
        if await self._started_again(ctx):
            return Outcome.DONE
        return info

    async def _started_again(self, ctx: OperationContext, *, fresh: bool = False) -> bool:
        """Whether the instance was started again since its messages, leaving nothing to drain: its ``LaunchTime``
        is later than every ``SentTimestamp`` or, after stops only, it runs again (a warm pool's return, "Warm pools
        for Amazon EC2 Auto Scaling"). Lifecycle actions always drain; events joining meanwhile are judged too."""
        operation, info = ctx.operation, ctx.info
        evaluated: list[Event] = []
        while len(evaluated) != len(operation.events):
            evaluated = list(operation.events)
            if operation.mode is not Mode.DRAIN or info is None or operation.lifecycle_actions:
                return False  # a terminate action can outlive a stop and start (Spot hibernates it meanwhile)
            info = await self._launched_since(ctx, info, evaluated, fresh=fresh)
        if info is None:
            return False
        ctx.log.info(
            "instance started again since the interruption: nothing to drain",
            state=info.state,
            launch_time=info.launch_time and info.launch_time.isoformat(),
        )
        self.observer.operation_outcome(OperationOutcome.STARTED_AGAIN)
        return True

    async def _launched_since(
        self, ctx: OperationContext, info: InstanceInfo, events: list[Event], *, fresh: bool
    ) -> InstanceInfo | None:
        """``info``, or EC2 read afresh (a redelivery, a message older than :data:`LATE_S`, stops only, ``fresh``),
        if it shows a start after ``events``, else ``None``; a fresh read becomes ``ctx.info`` (a cordon records it)."""
        stops_only = all(
            isinstance(event, StateChangeEvent) and event.state in ("stopping", "stopped") for event in events
        )
        newest = max(map(_sent, events))
        if _launched_after(info, newest):
            return info
        retried = any(event.message is not None and event.message.receive_count > 1 for event in events)
        late = datetime.now(UTC) - newest > timedelta(seconds=LATE_S)
        if not (stops_only or retried or late or fresh):
            return None
        now = await self.resolver.get(ctx.operation.instance_id, fresh=True)
        if now is None:
            return None
        ctx.info = now
        # LaunchTime is reported to the second; an earlier one is EC2's eventual consistency after a stop.
        running_again = (
            stops_only
            and now.state in ("pending", "running")
            and (now.launch_time is None or now.launch_time >= newest.replace(microsecond=0))
        )
        return now if running_again or _launched_after(now, newest) else None

    async def completion_delay(self) -> None:
        """Wait COMPLETE_LIFECYCLE_ACTION_DELAY_SECONDS before completing, as NTH."""
        if self.settings.complete_lifecycle_action_delay_seconds > 0:
            await asyncio.sleep(self.settings.complete_lifecycle_action_delay_seconds)

    async def complete_actions(self, ctx: OperationContext, *, claim: Claim | None) -> None:
        """Complete every unsettled lifecycle action with CONTINUE, joiners too; with a Lease, confirmed first."""
        operation = ctx.operation
        while pending := operation.unsettled():
            for action in pending:
                if claim is not None:
                    await claim.confirm()
                result = await self.heartbeats.complete(action, "CONTINUE")
                operation.settled[action.action_key] = result
                launch = operation.mode is Mode.LAUNCH
                self.observer.node_action(
                    NodeAction.LAUNCH_READY if launch else NodeAction.LIFECYCLE_COMPLETE, True
                )
                ctx.log.info("lifecycle action completed", hook=action.lifecycle_hook_name, result=result)

    async def stop_heartbeats(self, operation: NodeOperation, how: str) -> None:
        """The operation's actions are not ours: stop their heartbeats and settle them as ``how``."""
        for action in operation.lifecycle_actions:
            await self.heartbeats.stop(action)
        settle_all(operation, how)

    async def event(self, ctx: OperationContext, reason: str, message: str, *, warning: bool = False) -> None:
        """Record an Event on the operation's node with NTH's per-node annotations."""
        if self.recorder is None:
            return
        facts = {"local-hostname": ctx.node}
        if ctx.info is not None:
            zone = ctx.info.availability_zone
            facts |= {"instance-id": ctx.info.instance_id, "availability-zone": zone, "region": zone[:-1]}
        await self.recorder.record(ctx.node, reason, message, warning=warning, facts=facts)

    async def instance_gone(self, operation: NodeOperation) -> bool:
        """Whether the instance is shutting down or terminated (its state changes, else DescribeInstances)."""
        if any(isinstance(e, StateChangeEvent) and e.state in INSTANCE_ENDED for e in operation.events):
            return True
        info = await self.resolver.get(operation.instance_id, fresh=True)
        return info is None or info.state in INSTANCE_ENDED


def _sent(event: Event) -> datetime:
    """When the event's message was sent (``SentTimestamp``), else the event's time (a notice may predate its send)."""
    sent = event.message.sent_timestamp if event.message is not None else None
    return sent or event.time


def _launched_after(info: InstanceInfo, when: datetime) -> bool:
    return info.launch_time is not None and info.launch_time > when


def settle_all(operation: NodeOperation, how: str) -> None:
    """Settle every unsettled lifecycle action of ``operation`` as ``how``."""
    for action in operation.unsettled():
        operation.settled[action.action_key] = how


async def _awaited(work: Awaitable[T]) -> T:
    return await work
