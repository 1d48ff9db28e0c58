"""The per-node drain pipeline: resolve → claim → PreDrain + cordon → drain → PostDrain; EarlyExit on error.
Steps are functions over an :class:`~queue_processor.steps.OperationContext`; :class:`Handler` holds what operations
share (count, Leases, drain turns). Launches: :func:`~queue_processor.launch.run_launch`."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from datetime import UTC, datetime

import structlog

from queue_processor import rest
from queue_processor.aws import InstanceResolver
from queue_processor.config import Settings
from queue_processor.drain.drainer import Drainer, DrainResult
from queue_processor.drain.plan import OWN_POD, DrainBounds
from queue_processor.events import (
    AsgLaunchLifecycleEvent,
    AsgLifecycleEvent,
    Event,
    EventKind,
    Mode,
    NodeOperation,
    StateChangeEvent,
)
from queue_processor.launch import Draining, run_launch
from queue_processor.leases import Claim, NodeLeases, lease_name
from queue_processor.lifecycle import Heartbeats
from queue_processor.observe.events import (
    CANCEL_DRAIN,
    CORDON_AND_DRAIN,
    CORDON_AND_DRAIN_ERROR,
    NodeEventRecorder,
)
from queue_processor.observe.metrics import NULL_OBSERVER, Observer
from queue_processor.observe.webhook import Webhook, node_facts
from queue_processor.outcomes import (
    ClaimLost,
    ErrorWhere,
    KubeError,
    NodeAction,
    OperationOutcome,
)
from queue_processor.rest import AFTER_CORDONS, URGENT_RANK
from queue_processor.rules import events_in, missing
from queue_processor.steps import (
    INSTANCE_ENDED,
    OperationContext,
    Outcome,
    Parts,
    complete_actions,
    completion_delay,
    cordon,
    instance_gone,
    lease_guard,
    left_to_bootstrap,
    nothing_to_drain,
    post_drain,
    pre_drains,
    record_event,
    record_start,
    report_step,
    requeue,
    resolve,
    started_again,
    taint_joined,
)
from queue_processor.turns import Turns, drain_turn
from queue_processor.watch import FIRST_COPY_WAIT_S, NodeFinder

log = structlog.get_logger("queue_processor.handler")

#: Seconds to wait, after evicting our own pod, for the kubelet's SIGTERM before requeuing the node's messages.
LEAVE_WAIT_S = 60.0

#: Seconds before our instance's end by which we leave our drained node: SIGTERM and shutdown take that long.
LEAVE_LEAD_S = 10.0


class Handler:
    """Runs operations (see the module docstring); ``clock`` returns monotonic seconds."""

    def __init__(
        self,
        settings: Settings,
        *,
        resolver: InstanceResolver,
        finder: NodeFinder,
        heartbeats: Heartbeats,
        drainer: Drainer,
        recorder: NodeEventRecorder | None = None,
        leases: NodeLeases | None = None,
        webhook: Webhook | None = None,
        observer: Observer = NULL_OBSERVER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.parts = Parts(
            settings, resolver, finder, heartbeats, drainer, recorder, leases, webhook, observer, clock
        )
        self._drains: Counter[str] = Counter()  # instance ID → drain operations running here
        self.draining = Draining(lambda instance_id: self._drains[instance_id] > 0)
        """Whether a drain of an instance runs here, and the returns that wait for one to end."""
        self._running = 0  # operations running here, of every mode
        self._one_ended = asyncio.Event()  # set (and replaced) whenever one of them ends
        self.turns = Turns(observer)
        """Drains per group, and those that wait for a turn (DRAIN_BUDGET_NON_URGENT)."""
        self._holding: dict[str, OperationContext] = {}  # node Lease name → the operation holding it here
        if leases is not None:
            leases.watch.on_handed = self._join_handed_over
        self.park_messages: Callable[[list[str]], None] = lambda message_ids: None
        """Gives the in-flight slots of a waiting operation's messages back (set by the consumer to
        :meth:`Ledger.park_messages <queue_processor.settlement.Ledger.park_messages>`)."""

    def received(self, event: Event) -> None:
        """Heartbeat a received event's lifecycle action when ours to complete; never waits on AWS."""
        if not isinstance(event, AsgLifecycleEvent) or self.parts.settings.dry_run:
            return
        if isinstance(event, AsgLaunchLifecycleEvent) and left_to_bootstrap(self.parts.settings, event):
            return
        self.parts.heartbeats.start(event)

    async def handle(self, operation: NodeOperation) -> Outcome:
        """Run one operation: :attr:`Outcome.DONE` (acknowledge) or :attr:`Outcome.RETRY` (requeue). Raises only
        ``CancelledError``; other errors and a lost Lease (:class:`ClaimLost`) are logged as RETRY."""
        # A drain's claim and cordon go before those of operations started later; a launch waits for them.
        URGENT_RANK.set(AFTER_CORDONS if operation.mode is Mode.LAUNCH else operation.started_at)
        bound = log.bind(
            instance_id=operation.instance_id,
            kind=str(operation.first.kind),
            event_id=operation.first.event_id,
        )
        drain = operation.mode is Mode.DRAIN
        self._drains[operation.instance_id] += drain
        self._running += 1
        try:
            async with AsyncExitStack() as early_exit:
                ctx = OperationContext(self.parts, operation, early_exit, bound)
                if operation.mode is Mode.LAUNCH:
                    return await run_launch(ctx, self.draining)
                return await self._pipeline(ctx)
        except asyncio.CancelledError:
            raise
        except ClaimLost as exc:
            bound.warning("the node's Lease was lost: requeued", error=str(exc))
            self.parts.observer.operation_outcome(OperationOutcome.LEASE_LOST)
            return Outcome.RETRY
        except Exception as exc:  # one operation must never take the controller down
            bound.error("operation failed", error=repr(exc))
            self.parts.observer.error(ErrorWhere.HANDLE)
            return Outcome.RETRY
        finally:
            self._drains[operation.instance_id] -= drain
            if self._drains[operation.instance_id] <= 0:
                del self._drains[operation.instance_id]
            self._running -= 1
            self._one_ended.set()
            self._one_ended = asyncio.Event()

    async def _pipeline(self, ctx: OperationContext) -> Outcome:
        """resolve → claim → PreDrain + cordon → drain → PostDrain; DRY_RUN stops after resolve."""
        settings = self.parts.settings
        info = await resolve(ctx)
        if isinstance(info, Outcome):
            return info
        if settings.dry_run:
            return await _dry_run(ctx)
        claimed = await self._find_and_claim(ctx)
        if claimed is not None:
            return claimed
        ctx.bind(node=ctx.node)
        if not await report_step(ctx, cordon(ctx), post_drain=False):
            return await _no_node(ctx)
        URGENT_RANK.set(AFTER_CORDONS)  # the rest of the operation waits for others' claims and cordons
        ctx.bind(node=ctx.node)
        if self.parts.webhook is not None:
            ctx.facts = await node_facts(self.parts.drainer.kube, ctx.node)
        if not settings.cordon_only:
            try:
                async with lease_guard(ctx):
                    result = await self._drain_in_turn(ctx)
            except (asyncio.CancelledError, ClaimLost):
                raise
            except Exception:
                await _notify(ctx)
                raise
            if result is None:
                return Outcome.DONE
            await _notify(ctx)
            if not result.completed:
                return Outcome.RETRY
            own_pod = any(decision.reason == OWN_POD for decision in result.skipped)
            if own_pod:
                async with lease_guard(ctx):
                    if await self._leave_own_node(ctx):  # not when the kubelet's SIGTERM came: it cancels us
                        return Outcome.RETRY
        else:
            await _notify(ctx)
        return await report_step(ctx, post_drain(ctx), post_drain=True, guarded=True)

    async def _find_and_claim(self, ctx: OperationContext) -> Outcome | None:
        """The node (``ctx.node``) and, with NODE_LEASES, its claimed Lease (``ctx.claim``); ``None`` when claimed, else
        the outcome. Without Leases the private DNS name is assumed (looked up if the cordon misses)."""
        info, parts = ctx.info, self.parts
        assert info is not None
        by_name = not parts.settings.use_provider_id and bool(info.private_dns_name)
        watched = parts.drainer.writes.nodes
        if watched is not None and by_name:  # the provider-ID lookup reads no copy: it does not wait for one
            await watched.wait_first_answer(FIRST_COPY_WAIT_S)  # at start-up: the copy, not a GET per node
        if (
            by_name
            and watched is not None
            and _instance_ended(ctx)
            and watched.absent(info.private_dns_name or "")
        ):
            # Ended, and absent from the watched copy: no GET and LIST to learn what the copy knows.
            return await _no_node(ctx)
        if parts.leases is None and by_name:
            ctx.node, ctx.assumed = info.private_dns_name or "", True
            return None
        if by_name and watched is not None and watched.get(info.private_dns_name) is not None:
            ctx.node = info.private_dns_name  # the watched copy knows the node: no read to learn its name
        else:
            node = await parts.finder.find(info)
            if node is None:
                return await _no_node(ctx)
            ctx.node = str(node["metadata"]["name"])
        if parts.leases is not None:
            claim, waited = await self._claim_lease(ctx, parts.leases)
            if claim is None:
                return requeue(
                    ctx,
                    "another replica holds the node's Lease: requeued",
                    OperationOutcome.LEASE_HELD,
                    node=ctx.node,
                )
            await self._hold(ctx, claim, parts.leases)
            if waited and await started_again(ctx, fresh=True):
                return Outcome.DONE  # the other replica drained it for a stop the instance is back from
        return None

    async def _claim_lease(self, ctx: OperationContext, leases: NodeLeases) -> tuple[Claim | None, bool]:
        """Claim the node's Lease, waiting while another replica holds it until the drain deadline, handing it the
        events that bring the end nearer (:func:`~queue_processor.rules.missing`) and parking the messages. Returns
        the claim (``None``: still held) and whether it waited; raises :class:`KubeError`."""
        name, until = lease_name(ctx.node), ctx.deadline()
        handed: set[str] = set()
        waited = False
        while (claim := await leases.claim(ctx.node)) is None:
            left = until - self.parts.clock()
            if left <= 0:
                return None, waited
            holder = leases.watch.holder(name)
            new = missing(ctx.operation.events, {**leases.watch.handed(name), **dict.fromkeys(handed, "")})
            if new:
                try:
                    await self.parts.drainer.kube.patch_lease(
                        leases.namespace, name, {"metadata": {"annotations": new}}
                    )
                    handed.update(new)
                    ctx.log.info("events handed to the replica holding the node's Lease", events=sorted(new))
                except KubeError as exc:  # gone: claimed again below; else tried again at the next wake
                    ctx.log.info("events not handed over", error=str(exc))
            if not waited:
                waited = True
                ctx.log.info("another replica holds the node's Lease: waiting for it", holder=holder)
            self.park_messages(list(ctx.operation.messages))
            await leases.watch.released(name, holder, min(left, leases.duration_s))
        return claim, waited

    async def _hold(self, ctx: OperationContext, claim: Claim, leases: NodeLeases) -> None:
        """Enter ``claim`` on the EarlyExit stack; the events handed over on it join the operation."""
        ctx.claim = await ctx.early_exit.enter_async_context(claim)
        self._holding[claim.name] = ctx
        ctx.early_exit.callback(self._release_hold, claim.name, ctx)
        annotations = (claim.lease.get("metadata") or {}).get("annotations") or {}
        _join_handed(ctx, {**annotations, **leases.watch.handed(claim.name)})

    def _release_hold(self, name: str, ctx: OperationContext) -> None:
        if self._holding.get(name) is ctx:
            del self._holding[name]

    def _join_handed_over(self, name: str, annotations: Mapping[str, str]) -> None:
        """The Lease watch saw the events handed over on Lease ``name`` change: they join its operation."""
        ctx = self._holding.get(name)
        if ctx is not None:
            _join_handed(ctx, annotations)

    async def _drain_in_turn(self, ctx: OperationContext) -> DrainResult | None:
        """:func:`_drain` in the group's turn (:func:`~.turns.drain_turn`); ``None`` if the instance started since."""
        if not self.parts.settings.drain_budget_non_urgent:
            return await _drain(ctx)
        async with drain_turn(ctx, self.turns, self.park_messages) as waited:
            if waited and await started_again(ctx, fresh=True):
                return None
            return await _drain(ctx)

    async def _leave_own_node(self, ctx: OperationContext) -> bool:
        """Evict our own pod last, so the kubelet's SIGTERM starts our shutdown (held messages visible at once for a
        successor). ``True`` when evicted but no SIGTERM came within :data:`LEAVE_WAIT_S` (requeue); ``False`` when a
        PodDisruptionBudget refused it until the deadline (complete, and go with the instance)."""
        settings = self.parts.settings
        namespace, name = settings.pod_namespace or "default", settings.pod_name
        await self._wait_for_the_others(ctx)
        # Logged first: the kubelet's SIGTERM can cancel us before the eviction's answer comes back.
        ctx.log.info("leaving our own node: evicting our own pod, last", pod=f"{namespace}/{name}")
        if not await self.parts.drainer.evictions.evict_last(namespace, name, ctx.deadline()):
            ctx.log.warning(
                "our own pod could not be evicted before the deadline: completing and going with the node"
            )
            return False
        self.parts.observer.node_action(NodeAction.LEAVE, True)
        ctx.log.info(
            "our own pod evicted, last: its shutdown releases our messages, this node's actions go to our successor",
            pod=f"{namespace}/{name}",
        )
        await asyncio.sleep(LEAVE_WAIT_S)  # the kubelet's SIGTERM comes first, and shutdown cancels this
        ctx.log.warning("our own pod was evicted but no SIGTERM came: requeued", waited_s=LEAVE_WAIT_S)
        return True

    async def _wait_for_the_others(self, ctx: OperationContext) -> None:
        """Wait until no other operation is left (our shutdown cancels them; DESIGN.md rule 16), at most until
        :data:`LEAVE_LEAD_S` before our instance's end (the events at each wake) or one drain deadline from now."""
        operation, clock = ctx.operation, self.parts.clock
        deadline = ctx.deadline()

        def leave_by() -> float:
            end = ctx.instance_end()
            return min(deadline, ctx.deadline(), *(() if end is None else (end - LEAVE_LEAD_S,)))

        if self._running > 1:
            ctx.log.info(
                "our own node is drained: staying until the other drains here end",
                operations=self._running - 1,
                leave_in_s=round(max(0.0, leave_by() - clock()), 1),
            )
        while self._running > 1 and (left := leave_by() - clock()) > 0:
            operation.joined.clear()  # the drain's watcher of joins has stopped: this wait is the only one
            waits = {
                asyncio.ensure_future(self._one_ended.wait()),
                asyncio.ensure_future(operation.joined.wait()),
            }
            try:
                await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        if self._running > 1:
            ctx.log.warning("leaving our own node at its last moment", operations=self._running - 1)


def _join_handed(ctx: OperationContext, annotations: Mapping[str, str]) -> None:
    for event in events_in(annotations, ctx.operation.instance_id):
        if ctx.operation.add(event):
            ctx.log.info(
                "an event handed over by another replica joins the operation",
                joined_kind=str(event.kind),
                joined_event_id=event.event_id,
            )


def _instance_ended(ctx: OperationContext) -> bool:
    """Whether EC2 (resolved state or a state change) says the instance is shutting down or gone."""
    if ctx.info is not None and ctx.info.state in INSTANCE_ENDED:
        return True
    return any(
        isinstance(event, StateChangeEvent) and event.state in INSTANCE_ENDED
        for event in ctx.operation.events
    )


async def _dry_run(ctx: OperationContext) -> Outcome:
    """DRY_RUN, as NTH: nothing changes in Kubernetes, but the lifecycle actions are completed, the webhook sent
    and NTH's actions counted, so a dry run never holds an instance until its hook times out."""
    operation, info, parts = ctx.operation, ctx.info, ctx.parts
    only = parts.settings.cordon_only
    node = (info.private_dns_name if info is not None else None) or operation.instance_id
    ctx.log.info("dry run: would cordon and drain", cordon_only=only, node=node)
    if pre_drains(operation.kinds):
        parts.observer.node_action(NodeAction.PRE_DRAIN, True)
    parts.observer.node_action(NodeAction.CORDON if only else NodeAction.CORDON_AND_DRAIN, True)
    await _notify(ctx)
    await completion_delay(ctx)
    await complete_actions(ctx, claim=None)
    parts.observer.node_action(NodeAction.POST_DRAIN, True)
    return Outcome.DONE


async def _notify(ctx: OperationContext) -> None:
    """The webhook, as NTH sends it (:meth:`~queue_processor.observe.webhook.Webhook.notify_operation`)."""
    operation, webhook = ctx.operation, ctx.parts.webhook
    if webhook is not None and ctx.info is not None:
        await webhook.notify_operation(
            [operation.event_of(kind) for kind in operation.kinds],
            ctx.info,
            ctx.facts,
            ctx.parts.clock() - operation.started_at,
        )


async def _drain(ctx: OperationContext) -> DrainResult:
    """Evict the node's pods until the deadline (tightened by joining events: :func:`_follow_joins`); how it ended."""
    operation, node, parts = ctx.operation, ctx.node, ctx.parts
    started = parts.clock()
    kind = str(operation.first.kind)
    bounds = DrainBounds(ctx.deadline(), ctx.instance_end())
    watcher = ctx.spawn(_follow_joins(ctx, bounds), name=f"joiners-{node}")
    recorder = parts.recorder
    try:
        result = await parts.drainer.drain(
            node,
            bounds,
            guard=ctx.claim.confirm if ctx.claim is not None else None,
            lost=ctx.claim.lost.is_set if ctx.claim is not None else None,
            tell=recorder.record_pod if recorder is not None else None,
        )
    except asyncio.CancelledError:
        parts.observer.drained(kind, "cancelled", parts.clock() - started)
        raise
    finally:
        await rest.stop(watcher)
    parts.observer.drained(kind, result.outcome, parts.clock() - started)
    await _report(ctx, result)
    return result


async def _report(ctx: OperationContext, result: DrainResult) -> None:
    """Log, count and record (Events) how a drain ended."""
    figures = {
        "drain_id": result.drain_id,
        "evicted": result.evicted,
        "waves": result.waves,
        "cut_short": result.cut_short,
        "deleted_at_deadline": result.deleted_at_deadline,
    }
    observer = ctx.parts.observer
    if not result.completed:
        observer.node_action(NodeAction.CORDON_AND_DRAIN, False)
        ctx.log.warning("drain incomplete: requeued", reason=result.reason, causes=result.causes, **figures)
        text = f"{CORDON_AND_DRAIN_ERROR}: drain incomplete, will retry: {result.reason}"
        await record_event(ctx, "CordonAndDrainError", text, warning=True)
        if EventKind.ASG_TERMINATE_LIFECYCLE in ctx.operation.kinds:  # NTH's EarlyExit for lifecycle hooks
            await record_event(ctx, *CANCEL_DRAIN)
        return
    observer.node_action(NodeAction.CORDON_AND_DRAIN, True)
    ctx.log.info("drained", skipped=len(result.skipped), **figures)
    await record_event(ctx, *CORDON_AND_DRAIN)


async def _follow_joins(ctx: OperationContext, bounds: DrainBounds) -> None:
    """On each joining event: tighten the drain's bounds, record a restart, taint the new kinds."""
    operation, clock = ctx.operation, ctx.parts.clock
    while True:
        await operation.joined.wait()
        operation.joined.clear()
        if bounds.tighten(ctx.deadline(), ctx.instance_end()):
            now = clock()
            end = bounds.instance_end
            ctx.log.info(
                "a joining event brings the drain's end nearer",
                deadline_in_s=round(bounds.deadline - now, 1),
                instance_end_in_s=None if end is None else round(end - now, 1),
            )
        await record_start(ctx)
        await taint_joined(ctx)


async def _no_node(ctx: OperationContext) -> Outcome:
    """No Node for the instance: DONE, actions completed, if the instance is gone, with DELETE_SQS_MSG_IF_NODE_NOT_FOUND
    or LAUNCH_READY_TIMEOUT_SEC after its ``LaunchTime`` (DESIGN.md rule 9); else RETRY (a node may yet register)."""
    settings = ctx.parts.settings
    if await instance_gone(ctx):
        return await nothing_to_drain(
            ctx, "instance terminated and its node gone: nothing to drain", OperationOutcome.INSTANCE_GONE
        )
    if settings.delete_sqs_msg_if_node_not_found:
        return await nothing_to_drain(
            ctx,
            "no node for the instance: acknowledged (DELETE_SQS_MSG_IF_NODE_NOT_FOUND)",
            OperationOutcome.NODE_NOT_FOUND,
        )
    timeout_s = settings.launch_ready_timeout_sec
    launched = ctx.info.launch_time if ctx.info is not None else None
    running_s = None if launched is None else (datetime.now(UTC) - launched).total_seconds()
    times = {"running_s": running_s, "launch_ready_timeout_s": timeout_s}
    if running_s is not None and running_s >= timeout_s:
        return await nothing_to_drain(
            ctx,
            "no node registered for the instance: nothing to drain, its lifecycle actions completed",
            OperationOutcome.NO_NODE,
            **times,
        )
    return requeue(ctx, "no node for the instance yet: requeued", None, **times)
