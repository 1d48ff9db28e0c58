"""The steps of :mod:`~queue_processor.handler` and :mod:`~queue_processor.launch` over an :class:`OperationContext`:
resolve the instance, PreDrain and cordon in one write (NTH's taint per kind, the exclude-from-load-balancers label,
:class:`CordonRecord`), complete lifecycle actions, record Events; and the deadlines its events set. Tasks go through
:meth:`OperationContext.spawn` (DESIGN.md rule 3)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from queue_processor import rest
from queue_processor.aws import InstanceInfo, InstanceResolver, is_managed
from queue_processor.config import Settings
from queue_processor.drain.drainer import Drainer
from queue_processor.drain.node_writes import CordonRecord
from queue_processor.events import (
    AsgLaunchLifecycleEvent,
    Event,
    EventKind,
    Mode,
    NodeOperation,
    ScheduledChangeEvent,
    StateChangeEvent,
)
from queue_processor.leases import Claim, NodeLeases
from queue_processor.lifecycle import Heartbeats
from queue_processor.observe.events import (
    CORDON,
    CORDON_AND_DRAIN,
    CORDON_AND_DRAIN_ERROR,
    CORDON_ERROR,
    POST_DRAIN,
    POST_DRAIN_ERROR,
    PRE_DRAIN,
    RECEIVED_REASONS,
    NodeEventRecorder,
)
from queue_processor.observe.metrics import Observer
from queue_processor.observe.webhook import NO_FACTS, NodeFacts, Webhook
from queue_processor.outcomes import ClaimLost, KubeError, NodeAction, OperationOutcome
from queue_processor.rules import RULES
from queue_processor.watch import NodeFinder

T = TypeVar("T")

#: Seconds since a message was sent after which the cached instance description (kept 60 s) is not trusted.
LATE_S = 60.0

#: EC2 states of an instance that has ended: its node never comes back and its lifecycle actions are over.
INSTANCE_ENDED = ("shutting-down", "terminated")

OUT_OF_SERVICE_TAINT = ("node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute")

EXCLUDE_FROM_LB_LABEL = (
    "node.kubernetes.io/exclude-from-external-load-balancers",
    "aws-node-termination-handler",
)


class Outcome(StrEnum):
    """The end of an operation for its messages."""

    DONE = "done"
    """Acknowledge: drained, or nothing to do."""
    RETRY = "retry"
    """EarlyExit: make the messages visible again after a backoff."""


@dataclass
class Parts:
    """What the steps talk to; ``clock``: monotonic seconds; ``None`` for ``recorder``, ``leases``, ``webhook``: off."""

    settings: Settings
    resolver: InstanceResolver
    finder: NodeFinder
    heartbeats: Heartbeats
    drainer: Drainer
    recorder: NodeEventRecorder | None
    leases: NodeLeases | None
    webhook: Webhook | None
    observer: Observer
    clock: Callable[[], float]


@dataclass
class OperationContext:
    """One operation as its steps see it: ``node`` once found (``assumed``: the private DNS name, not read),
    ``claim`` its Lease, ``tainted`` the kinds whose taints the node carries, ``facts`` for the webhook."""

    parts: Parts
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
        """Start ``coro`` as a named task (:func:`~queue_processor.rest.spawn`), stopped by the EarlyExit stack."""
        task = rest.spawn(coro, name=name, awaited=awaited)
        self.early_exit.push_async_callback(rest.stop, task)
        return task

    def deadline(self) -> float:
        """The drain deadline as the operation's events say now (:func:`drain_deadline`)."""
        operation = self.operation
        return drain_deadline(
            operation.events,
            grace_period_s=self.parts.settings.node_termination_grace_period,
            now=self.parts.clock(),
            wall=datetime.now(UTC),
            started_at=operation.started_at,
        )

    def instance_end(self) -> float | None:
        """When the instance goes, as its events say now (:func:`instance_end`)."""
        operation = self.operation
        return instance_end(
            operation.events, now=self.parts.clock(), wall=datetime.now(UTC), started_at=operation.started_at
        )

    def cordon_record(self) -> CordonRecord | None:
        """The instance facts each write of ours on the node records (:class:`CordonRecord`): its ID, ``LaunchTime``,
        whether bound for a warm pool, when, and when a notice reclaims it."""
        if self.info is None:
            return None
        launch_time = self.info.launch_time
        ends = [event.start_time for event in self.operation.events if RULES[event.kind].notice]
        return CordonRecord(
            instance_id=self.operation.instance_id,
            launch_time=launch_time.isoformat() if launch_time is not None else "",
            warm_pool=any(action.destination == "WarmPool" for action in self.operation.terminate_actions),
            since=datetime.now(UTC).isoformat(timespec="seconds"),
            ends=min(ends).isoformat() if ends else "",
        )


# ----------------------------------------------------------------------------------------------- the deadlines
# Event times are AWS's wall clock (aware UTC, against ``wall``); deadlines are on the monotonic clock (``now``). The
# earliest event wins (DESIGN.md rule 13).


def pre_drains(kinds: Iterable[EventKind]) -> bool:
    return any(RULES[kind].pre_drain for kind in kinds)


def notice_end(events: Sequence[Event], *, now: float, wall: datetime, started_at: float) -> float | None:
    """The end (on ``now``'s clock) of the earliest Spot or Capacity Reservation notice, ``None`` without one; one
    over by ``wall`` is measured from ``started_at`` with its own length (a drain cut to nothing never succeeds)."""
    notices = [event for event in events if RULES[event.kind].notice]
    if not notices:
        return None
    first = min(notices, key=lambda event: event.start_time)
    left = (first.start_time - wall).total_seconds()
    if left <= 0:
        length = (first.start_time - first.time).total_seconds()
        left = length - (now - started_at)
    return now + max(left, 0.0)


def drain_deadline(
    events: Sequence[Event], *, grace_period_s: float, now: float, wall: datetime, started_at: float
) -> float:
    """``grace_period_s`` (NODE_TERMINATION_GRACE_PERIOD) from ``now``, never past :func:`notice_end`."""
    deadline = now + grace_period_s
    end = notice_end(events, now=now, wall=wall, started_at=started_at)
    return deadline if end is None else min(deadline, end)


def instance_end(events: Sequence[Event], *, now: float, wall: datetime, started_at: float) -> float | None:
    """When the instance goes (on ``now``): earliest of :func:`notice_end` and a future scheduled change, or None."""
    ends = [
        end for end in (notice_end(events, now=now, wall=wall, started_at=started_at),) if end is not None
    ]
    for event in events:
        if isinstance(event, ScheduledChangeEvent) and event.start_time > wall:
            ends.append(now + (event.start_time - wall).total_seconds())
    return min(ends, default=None)


def launch_ready_deadline(events: Sequence[Event], *, timeout_s: float, now: float, wall: datetime) -> float:
    """When (on ``now``'s clock) the launch actions have waited ``timeout_s`` (LAUNCH_READY_TIMEOUT_SEC) for their
    node, from the earliest action's event time (every replica agrees; one ahead of ``wall`` counts as now)."""
    started = min(
        (event.time for event in events if isinstance(event, AsgLaunchLifecycleEvent)), default=None
    )
    age = 0.0 if started is None else max((wall - started).total_seconds(), 0.0)
    return now + max(timeout_s - age, 0.0)


# ------------------------------------------------------------------------------------------------ the wrapper


async def report_step(
    ctx: OperationContext, work: Awaitable[T], *, post_drain: bool, guarded: bool = False
) -> T:
    """Run ``work`` (guarded by the Lease when ``guarded``) and report it as NTH's pkg/observability/k8s-events.go: the
    cordon's failure as CordonError (CORDON_ONLY) or CordonAndDrainError; PostDrain (``post_drain``) counted in
    ``actions_total`` and recorded as PostDrain or PostDrainError. Raises what ``work`` raises, or ``ClaimLost``."""
    observer = ctx.parts.observer
    try:
        if guarded:
            async with lease_guard(ctx):
                result = await work
        else:
            result = await work
    except (asyncio.CancelledError, ClaimLost):
        raise
    except Exception as exc:
        if post_drain:
            observer.node_action(NodeAction.POST_DRAIN, False)
            reason, text = "PostDrainError", POST_DRAIN_ERROR
        elif ctx.parts.settings.cordon_only:
            reason, text = f"{CORDON[0]}Error", CORDON_ERROR
        else:
            reason, text = f"{CORDON_AND_DRAIN[0]}Error", CORDON_AND_DRAIN_ERROR
        await record_event(ctx, reason, f"{text}: {exc}", warning=True)
        raise
    if post_drain:
        observer.node_action(NodeAction.POST_DRAIN, True)
        await record_event(ctx, *POST_DRAIN)
    return result


@contextlib.asynccontextmanager
async def lease_guard(ctx: OperationContext) -> AsyncIterator[None]:
    """Run the body; with a Lease, cancel it and raise :class:`ClaimLost` once the Lease is lost, unless the body
    ended first (in the same turn too) or a shutdown is cancelling it already (its cleanup runs undisturbed)."""
    claim, task = ctx.claim, asyncio.current_task()
    if claim is None or task is None:
        yield
        return
    scope, over, cancelling = asyncio.timeout(None), False, task.cancelling()

    async def expire() -> None:
        await claim.lost.wait()
        if not over and task.cancelling() == cancelling:
            scope.reschedule(asyncio.get_running_loop().time())

    try:
        async with scope:
            watcher = rest.spawn(expire(), name=f"lease-lost-{ctx.node}")
            try:
                yield
            finally:
                over = True
                if not scope.expired():
                    scope.reschedule(None)
                await rest.stop(watcher)
    except TimeoutError:
        if not scope.expired():
            raise
        raise ClaimLost(f"Lease {claim.name} was lost") from None


# ------------------------------------------------------------------------------------------- the instance


def left_to_bootstrap(settings: Settings, action: AsgLaunchLifecycleEvent) -> bool:
    """Whether a launch action is left to the bootstrap (warm pool, no COMPLETE_WARM_POOL_LAUNCH)."""
    return action.destination == "WarmPool" and not settings.complete_warm_pool_launch


async def resolve(ctx: OperationContext) -> InstanceInfo | Outcome:
    """The instance as EC2 describes it (``ctx.info``), or the outcome: unknown, unmanaged, :func:`started_again`."""
    operation, parts = ctx.operation, ctx.parts
    # A launch is a start: it changed the LaunchTime a cached answer has, which the next cordon records.
    info = await parts.resolver.get(operation.instance_id, fresh=operation.mode is Mode.LAUNCH)
    if info is None and operation.mode is Mode.DRAIN:
        return await nothing_to_drain(
            ctx,
            "instance unknown to EC2: nothing to drain, its lifecycle actions completed",
            OperationOutcome.UNKNOWN_INSTANCE,
        )
    if info is None:  # never CONTINUE a launch for an instance EC2 cannot show: left to the hook's default
        return await not_ours(
            ctx,
            "instance unknown to EC2: its launch actions are left to their hook's timeout",
            OperationOutcome.UNKNOWN_INSTANCE,
            "unknown-instance",
        )
    settings = parts.settings
    tag = settings.managed_tag
    if not is_managed(
        info, check=settings.check_tag_before_draining, tag=tag, value=settings.managed_tag_value
    ):
        return await not_ours(
            ctx, "instance not managed: ignored", OperationOutcome.UNMANAGED, "unmanaged", managed_tag=tag
        )
    ctx.info = info
    if await started_again(ctx):
        return Outcome.DONE
    return info


async def started_again(ctx: OperationContext, *, fresh: bool = False) -> bool:
    """Whether the instance started again since its messages: ``LaunchTime`` after every ``SentTimestamp`` or, after
    stops only, running and launched since ("Warm pools for Amazon EC2 Auto Scaling"); never for lifecycle actions."""
    operation, info = ctx.operation, ctx.info
    evaluated: list[Event] = []
    while len(evaluated) != len(operation.events):
        evaluated = list(operation.events)
        if operation.mode is not Mode.DRAIN or info is None or operation.lifecycle_actions:
            return False  # a terminate action can outlive a stop and start (Spot hibernates it meanwhile)
        info = await _launched_since(ctx, info, evaluated, fresh=fresh)
    if info is None:
        return False
    ctx.log.info(
        "instance started again since the interruption: nothing to drain",
        state=info.state,
        launch_time=info.launch_time and info.launch_time.isoformat(),
    )
    ctx.parts.observer.operation_outcome(OperationOutcome.STARTED_AGAIN)
    return True


async def _launched_since(
    ctx: OperationContext, info: InstanceInfo, events: list[Event], *, fresh: bool
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
    now = await ctx.parts.resolver.get(ctx.operation.instance_id, fresh=True)
    if now is None:
        return None
    ctx.info = now
    # A stop is judged by its own time (the state change's, whole seconds as LaunchTime), not its send: delivery
    # may trail it past a start. An earlier LaunchTime is EC2's eventual consistency after a stop.
    stopped_at = max(event.time for event in events).replace(microsecond=0)
    running_again = (
        stops_only
        and now.state in ("pending", "running")
        and (now.launch_time is None or now.launch_time >= stopped_at)
    )
    return now if running_again or _launched_after(now, newest) else None


async def instance_gone(ctx: OperationContext) -> bool:
    """Whether the instance is shutting down or terminated (its state changes, else DescribeInstances)."""
    operation = ctx.operation
    if any(isinstance(e, StateChangeEvent) and e.state in INSTANCE_ENDED for e in operation.events):
        return True
    info = await ctx.parts.resolver.get(operation.instance_id, fresh=True)
    return info is None or info.state in INSTANCE_ENDED


# --------------------------------------------------------------------------------------- PreDrain and cordon


async def cordon(ctx: OperationContext) -> bool:
    """PreDrain and cordon in one write; ``False`` when there is no such node (an assumed name is looked up)."""
    operation, info, parts = ctx.operation, ctx.info, ctx.parts
    assert info is not None
    taints, labels = node_taints(ctx, operation.kinds), {}
    if parts.settings.exclude_from_load_balancers and not parts.settings.cordon_only:
        labels = dict([EXCLUDE_FROM_LB_LABEL])  # only where absent, as NTH: a value may be another's
    ctx.tainted = set(operation.kinds)  # the kinds whose taints go out with the cordon
    about, writes = ctx.cordon_record(), parts.drainer.writes
    if not await writes.cordon(ctx.node, taints=taints, labels_if_absent=labels, about=about):
        node = await parts.finder.find(info) if ctx.assumed else None
        if node is None:
            return False
        ctx.node = str(node["metadata"]["name"])
        if not await writes.cordon(ctx.node, taints=taints, labels_if_absent=labels, about=about):
            return False
    observer, cordon_only, pre_drain = parts.observer, parts.settings.cordon_only, pre_drains(operation.kinds)
    for _ in taints:
        observer.node_action(NodeAction.TAINT, True)
    if labels:
        observer.node_action(NodeAction.EXCLUDE_FROM_LB, True)
    if pre_drain:
        observer.node_action(NodeAction.PRE_DRAIN, True)
    if cordon_only:
        observer.node_action(NodeAction.CORDON, True)
    observer.cordoned(parts.clock() - operation.started_at)
    ctx.log.info("cordoned", node=ctx.node)
    for kind in operation.kinds:  # NTH's Event for each interruption taken up, then its steps'
        text = f"{kind} {operation.event_of(kind).event_id} for instance {operation.instance_id}"
        await record_event(ctx, RECEIVED_REASONS[kind], text)
    if pre_drain:
        await record_event(ctx, *PRE_DRAIN)
    if cordon_only:
        await record_event(ctx, *CORDON)
    return True


def node_taints(ctx: OperationContext, kinds: list[EventKind]) -> list[tuple[str, str, str]]:
    """NTH's taint for each of ``kinds`` that has one (TAINT_NODE; value: the event ID): (key, value, effect)."""
    settings = ctx.parts.settings
    if not settings.taint_node:
        return []
    keys = [(RULES[kind].taint_key, kind) for kind in kinds]
    return [(key, ctx.operation.event_of(kind).event_id, settings.taint_effect) for key, kind in keys if key]


async def taint_joined(ctx: OperationContext) -> None:
    """Taint the node for the kinds that joined since its last taints (TAINT_NODE)."""
    new = [kind for kind in ctx.operation.kinds if kind not in ctx.tainted]
    for key, value, effect in node_taints(ctx, new):
        await ctx.parts.drainer.writes.taint(ctx.node, key, value, effect, about=ctx.cordon_record())
        ctx.parts.observer.node_action(NodeAction.TAINT, True)
    ctx.tainted.update(new)


async def record_start(ctx: OperationContext) -> None:
    """Record a ``LaunchTime`` newer than the cordon's, lest the return check take that start for a return."""
    if ctx.info is None or ctx.node is None:
        return
    try:
        now = await ctx.parts.resolver.get(ctx.operation.instance_id, fresh=True)
    except Exception as exc:  # the joins after this one must still tighten the bounds
        ctx.log.warning("instance not read as an event joined: its record unchanged", error=repr(exc))
        return
    if now is None or now.launch_time is None or now.launch_time == ctx.info.launch_time:
        return
    ctx.info = now
    if not await ctx.parts.drainer.writes.cordon(ctx.node, about=ctx.cordon_record()):
        ctx.log.info("node gone while an event joined: nothing to record")


# ------------------------------------------------------------------------------------ lifecycle and Events


async def completion_delay(ctx: OperationContext) -> None:
    """Wait COMPLETE_LIFECYCLE_ACTION_DELAY_SECONDS before completing, as NTH."""
    if (delay := ctx.parts.settings.complete_lifecycle_action_delay_seconds) > 0:
        await asyncio.sleep(delay)


async def complete_actions(ctx: OperationContext, *, claim: Claim | None) -> None:
    """Complete every unsettled lifecycle action with CONTINUE, joiners too; with a Lease, confirmed first."""
    operation = ctx.operation
    action_done = NodeAction.LAUNCH_READY if operation.mode is Mode.LAUNCH else NodeAction.LIFECYCLE_COMPLETE
    while pending := operation.unsettled():
        for action in pending:
            if claim is not None:
                await claim.confirm()
            result = await ctx.parts.heartbeats.complete(action, "CONTINUE")
            operation.settled[action.action_key] = result
            ctx.parts.observer.node_action(action_done, True)
            ctx.log.info("lifecycle action completed", hook=action.lifecycle_hook_name, result=result)


async def post_drain(ctx: OperationContext) -> Outcome:
    """Complete the lifecycle actions, taint joined kinds, add the out-of-service taint
    (ENABLE_OUT_OF_SERVICE_TAINT, not with CORDON_ONLY). A node gone by then went with its instance: success."""
    settings, parts = ctx.parts.settings, ctx.parts
    await completion_delay(ctx)
    await complete_actions(ctx, claim=ctx.claim)
    try:
        await taint_joined(ctx)
        if settings.enable_out_of_service_taint and not settings.cordon_only:
            await parts.drainer.writes.taint(ctx.node, *OUT_OF_SERVICE_TAINT, about=ctx.cordon_record())
            parts.observer.node_action(NodeAction.OUT_OF_SERVICE_TAINT, True)
    except KubeError as exc:
        if exc.status != 404:
            raise
        ctx.log.info("node gone once its actions were completed: nothing left to taint")
    await complete_actions(ctx, claim=ctx.claim)  # actions that joined during the taints
    return Outcome.DONE


async def nothing_to_drain(
    ctx: OperationContext, message: str, outcome: OperationOutcome, **fields: Any
) -> Outcome:
    """DONE, nothing left to drain (counted as ``outcome``, logged): lifecycle actions completed with CONTINUE."""
    ctx.log.info(message, **fields)
    ctx.parts.observer.operation_outcome(outcome)
    await complete_actions(ctx, claim=None)
    return Outcome.DONE


async def not_ours(
    ctx: OperationContext, message: str, outcome: OperationOutcome, how: str, **fields: Any
) -> Outcome:
    """DONE, not ours to finish (counted, logged): heartbeats stop, open actions settled as ``how`` for their hook."""
    ctx.log.info(message, **fields)
    ctx.parts.observer.operation_outcome(outcome)
    operation = ctx.operation
    for action in operation.lifecycle_actions:
        await ctx.parts.heartbeats.stop(action)
    for action in operation.unsettled():
        operation.settled[action.action_key] = how
    return Outcome.DONE


def requeue(
    ctx: OperationContext, message: str, outcome: OperationOutcome | None = None, **fields: Any
) -> Outcome:
    """RETRY (counted as ``outcome`` when given, logged): EarlyExit, its messages visible again after a backoff."""
    ctx.log.info(message, **fields)
    if outcome is not None:
        ctx.parts.observer.operation_outcome(outcome)
    return Outcome.RETRY


async def record_event(ctx: OperationContext, reason: str, message: str, *, warning: bool = False) -> None:
    """Record an Event on the operation's node with NTH's per-node annotations."""
    recorder = ctx.parts.recorder
    if recorder is None:
        return
    facts = {"local-hostname": ctx.node}
    if ctx.info is not None:
        zone = ctx.info.availability_zone
        facts |= {"instance-id": ctx.info.instance_id, "availability-zone": zone, "region": zone[:-1]}
    await recorder.record(ctx.node, reason, message, warning=warning, facts=facts)


def _sent(event: Event) -> datetime:
    """When the event's message was sent (``SentTimestamp``), else the event's time (a notice may predate its send)."""
    sent = event.message.sent_timestamp if event.message is not None else None
    return sent or event.time


def _launched_after(info: InstanceInfo, when: datetime) -> bool:
    return info.launch_time is not None and info.launch_time > when
