"""What the steps of an operation share: the operation's context, the one step wrapper with its table of
Events, and the helpers both paths use (drain: :mod:`queue_processor.handler`; launch:
:mod:`queue_processor.launch`).

:class:`OperationContext` is handed to every step of one operation: the operation, its EarlyExit stack
(``early_exit``, an ``AsyncExitStack``), its bound logger, and what the steps found so far (the instance, the
node, the Lease, the kinds already tainted, the node's facts for the webhook). Every task a step starts is
started with :meth:`OperationContext.spawn`, which puts its stop on the stack: when the operation ends, by
any outcome, an error or a cancellation, each such task is cancelled and awaited (DESIGN.md rule 3).

:meth:`Steps.step` runs a step and reports it as NTH does, from :data:`STEP_EVENTS`: on success the
step's action is counted and its Event recorded; on failure (not a cancellation, not a lost Lease) the
action is counted as failed, its error Event recorded, and the error raised again. A step may be guarded by
the operation's Lease (:meth:`Steps.guarded`): it is cancelled as soon as the Lease is lost, and
:class:`~queue_processor.outcomes.ClaimLost` is raised.
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

#: How long ago a message may have been sent (seconds) before the cached description of its instance (kept 60 s)
#: is not trusted to show a start since.
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
    """How a step is reported. ``action``: the NTH action counted (``actions_total``) as succeeded or failed,
    ``None`` for none; ``success``: the (reason, message) of the Event on success; ``failure(settings)``: the
    (reason, message) of the warning Event on failure, whose message gets ``": <error>"`` appended."""

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
    """One operation as its steps see it (see the module docstring). ``node`` is the node's name once the
    claim step found one (``assumed``: named after the instance's private DNS name, not read); ``claim`` its
    Lease with NODE_LEASES; ``tainted`` the event kinds whose taints the node carries (it grows as kinds join);
    ``facts`` the node's facts for the webhook (read once the node is cordoned)."""

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
        """Start ``coro`` as a named task (:func:`queue_processor.tasks.spawn`; ``awaited``: the caller takes
        its result, so its exception is not logged on its own) whose stop (cancelled and awaited) is on the
        operation's EarlyExit stack; the caller may stop it earlier (stopping twice is harmless)."""
        task = tasks.spawn(coro, name=name, awaited=awaited)
        self.early_exit.push_async_callback(tasks.stop, task)
        return task


@dataclass(frozen=True)
class Collaborators:
    """What the drain and launch paths both talk to. ``observer`` is told each action on a node and the
    outcome of operations that end without a drain; ``clock`` returns monotonic seconds; ``heartbeats`` owns
    every lifecycle action's heartbeat and completes actions; ``recorder`` records Kubernetes Events (none:
    no Events)."""

    settings: Settings
    resolver: InstanceResolver
    finder: NodeFinder
    heartbeats: Heartbeats
    recorder: NodeEventRecorder | None
    observer: Observer
    clock: Callable[[], float] = time.monotonic


class Steps:
    """The helpers the drain and launch paths share, over their :class:`Collaborators` (each one is also an
    attribute of the same name)."""

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
        """Run ``work`` (guarded by the operation's Lease when ``guarded``) and report it from
        :data:`STEP_EVENTS`. Raises what ``work`` raises; ``ClaimLost`` when the Lease is lost meanwhile."""
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
        """Await ``work``; with a Lease, cancel it and raise :class:`ClaimLost` as soon as the Lease is lost.
        Both tasks live on the operation's EarlyExit stack and are stopped here."""
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
        """Whether a launch action is the instance's own bootstrap's to complete: headed for a warm pool,
        without COMPLETE_WARM_POOL_LAUNCH."""
        return action.destination == "WarmPool" and not self.settings.complete_warm_pool_launch

    async def resolve(self, ctx: OperationContext) -> InstanceInfo | Outcome:
        """The instance as EC2 describes it (also set on ``ctx.info``), or the outcome when there is nothing
        to do: unknown to EC2 (a drain's lifecycle actions completed; a launch's left to their hook's
        timeout), not managed by this cluster (left alone), or started again since the stop the operation is
        about."""
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
        """Whether the instance was started again since everything a drain operation is about, so that there
        is nothing left to drain, and the node the restarted instance registered must not be cordoned for it:

        - its ``LaunchTime`` (EC2: the most recent launch or start) is later than the moment every message of
          the operation was sent to the queue (SQS ``SentTimestamp``; the event's time without one). A Spot
          stop or hibernate, an EC2 stop, a scale-in into a warm pool or an AWS Health retirement is followed
          by a start; a message requeued by a drain that could not finish (or delivered late) then arrives
          after it (explorer seed 513: a requeued Spot warning cordoned and drained the node the instance had
          come back on). An operation with a lifecycle action is drained as ever: a terminate action can
          outlive a stop and a start (Spot hibernates the instance while the action waits; explorer seed 29),
          and only its completion ends it;
        - or the operation is made only of ``stopping``/``stopped`` state changes and EC2 now says ``pending``
          or ``running`` without a ``LaunchTime`` or with one no earlier than the second the last of them was
          sent (EC2 reports ``LaunchTime`` to the second, so a start in that second does not look later; an
          earlier one may be EC2's eventual consistency just after the stop): a warm pool moves a stopped
          instance into the group this way ("Warm pools for Amazon EC2 Auto Scaling"), its state changes still
          in the queue.

        An event that joins the operation meanwhile (while EC2 is read) keeps it going: it may be the new run's
        own interruption.

        The instance is read fresh when the cache cannot be trusted for this: a message delivered before
        (``ApproximateReceiveCount`` above 1), a message sent more than :data:`LATE_S` ago, only stops, or
        ``fresh`` (a drain whose turn came after a wait). A new warning delivered on time costs no read (a
        storm's first deliveries)."""
        operation, info = ctx.operation, ctx.info
        if operation.mode is not Mode.DRAIN or info is None or operation.lifecycle_actions:
            return False  # a terminate action can outlive a stop and start (Spot hibernates it meanwhile)
        evaluated = list(operation.events)
        stops_only = not operation.lifecycle_actions and all(
            isinstance(event, StateChangeEvent) and event.state in ("stopping", "stopped")
            for event in evaluated
        )
        newest = max(map(_sent, evaluated))
        if not _launched_after(info, newest):
            retried = any(
                event.message is not None and event.message.receive_count > 1 for event in evaluated
            )
            late = datetime.now(UTC) - newest > timedelta(seconds=LATE_S)
            if not (stops_only or retried or late or fresh):
                return False
            now = await self.resolver.get(operation.instance_id, fresh=True)
            if now is None:
                return False
            info = ctx.info = now  # what a cordon records, if there is one: EC2 as it is now
            # Running again after stops: EC2 gives no LaunchTime, or one in the second of the last stop's
            # message or later (LaunchTime is reported to the second). An earlier one is EC2's eventual
            # consistency just after the stop.
            running_again = (
                stops_only
                and info.state in ("pending", "running")
                and (info.launch_time is None or info.launch_time >= newest.replace(microsecond=0))
            )
            if not (running_again or _launched_after(info, newest)):
                return False
        if len(operation.events) != len(evaluated):
            return False  # an event joined while EC2 was read (the new run's own warning?): drain for it
        ctx.log.info(
            "instance started again since the interruption: nothing to drain",
            state=info.state,
            launch_time=info.launch_time and info.launch_time.isoformat(),
        )
        self.observer.operation_outcome(OperationOutcome.STARTED_AGAIN)
        return True

    async def completion_delay(self) -> None:
        """COMPLETE_LIFECYCLE_ACTION_DELAY_SECONDS before completing, as NTH: after a drain, a dry run's
        decision, and a launching instance's node turning Ready (the actions are heartbeated meanwhile)."""
        if self.settings.complete_lifecycle_action_delay_seconds > 0:
            await asyncio.sleep(self.settings.complete_lifecycle_action_delay_seconds)

    async def complete_actions(self, ctx: OperationContext, *, claim: Claim | None) -> None:
        """Complete every unsettled lifecycle action of the operation with CONTINUE, until none is left
        (actions that join while others complete are completed too). With a Lease, it is confirmed first."""
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
        """The operation's lifecycle actions are not ours to complete: their heartbeats stop and each one not
        settled yet is settled as ``how``."""
        for action in operation.lifecycle_actions:
            await self.heartbeats.stop(action)
        settle_all(operation, how)

    async def event(self, ctx: OperationContext, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the operation's node with NTH's per-node annotations, from what EC2 says of its
        instance."""
        if self.recorder is None:
            return
        facts = {"local-hostname": ctx.node}
        if ctx.info is not None:
            zone = ctx.info.availability_zone
            facts |= {"instance-id": ctx.info.instance_id, "availability-zone": zone, "region": zone[:-1]}
        await self.recorder.record(ctx.node, reason, message, warning=warning, facts=facts)

    async def instance_gone(self, operation: NodeOperation) -> bool:
        """Whether the instance is shutting down or terminated (its node will never come back): from the
        operation's own state changes, else from a fresh DescribeInstances."""
        if any(isinstance(e, StateChangeEvent) and e.state in INSTANCE_ENDED for e in operation.events):
            return True
        info = await self.resolver.get(operation.instance_id, fresh=True)
        return info is None or info.state in INSTANCE_ENDED


def _sent(event: Event) -> datetime:
    """When the event's message was sent to the queue (its SQS ``SentTimestamp``), else the event's time. The
    send is what a start is compared with: a notice can carry a time earlier than it was sent (the sandbox
    stamps its compressed notices so, and a notice may be published late)."""
    sent = event.message.sent_timestamp if event.message is not None else None
    return sent or event.time


def _launched_after(info: InstanceInfo, when: datetime) -> bool:
    """Whether EC2's ``LaunchTime`` of the instance is later than ``when`` (unknown: no)."""
    return info.launch_time is not None and info.launch_time > when


def settle_all(operation: NodeOperation, how: str) -> None:
    """Settle every unsettled lifecycle action of ``operation`` as ``how``."""
    for action in operation.unsettled():
        operation.settled[action.action_key] = how


async def _awaited(work: Awaitable[T]) -> T:
    return await work
