"""The per-node pipeline: resolve → claim → PreDrain → cordon → drain → PostDrain, and EarlyExit on any failure.

For a drain operation (every kind but launch actions), :meth:`Handler.handle` runs one named step after the
other (each a short method of the same name):

1. :meth:`Handler._resolve`: the instance as EC2 describes it (batched and cached) and its managed tag. An
   instance unknown to EC2 is terminal (its lifecycle actions are completed: AWS says whether they were still
   open); an unmanaged one is terminal and its actions are left to whoever manages it. With DRY_RUN the
   operation ends here, logged, before anything writes.
2. :meth:`Handler._claim`: the Node (none: DELETE_SQS_MSG_IF_NODE_NOT_FOUND decides, see :meth:`_no_node`)
   and, with NODE_LEASES, its Lease (held by another replica: requeue). The Lease is entered on the
   operation's EarlyExit stack; a Lease lost on the way (409 on renewal, or lapsed while the process was
   paused) cancels the operation, and every eviction and completion first confirms it.
3. :meth:`Handler._cordon`: PreDrain and cordon in one write: NTH's taint per event kind when TAINT_NODE
   (value = event ID, TAINT_EFFECT), the exclude-from-load-balancers label when EXCLUDE_FROM_LOAD_BALANCERS
   and not CORDON_ONLY (never overwriting a value already there, as NTH), ``spec.unschedulable``.
4. :meth:`Handler._drain`: unless CORDON_ONLY, until NODE_TERMINATION_GRACE_PERIOD and never past the
   instance's start time (the end of a Spot notice). Kinds that join meanwhile get their taints at once.
5. :meth:`Handler._post_drain`: COMPLETE_LIFECYCLE_ACTION_DELAY_SECONDS, then every lifecycle action of the
   operation is completed with CONTINUE, again and again until none is left (actions join while others
   complete); the out-of-service taint when asked.

Heartbeats are not the pipeline's: they belong to :class:`~queue_processor.lifecycle.Heartbeats`, started
when a message is first received (:meth:`Handler.received`) and kept across requeues, so that setting them up
never delays a cordon and a requeued action does not time out. EarlyExit is the operation's
``AsyncExitStack``: whatever a step starts (the Lease and its renewal, the taint watcher) is entered there and
cancelled and awaited when the operation ends, whatever the outcome.

A launch operation waits until the instance's node is registered and Ready, then completes its launch
actions; an action headed for a warm pool is left to the instance's own bootstrap unless
COMPLETE_WARM_POOL_LAUNCH.

``handle`` returns :attr:`Outcome.DONE` (acknowledge the messages) or :attr:`Outcome.RETRY` (EarlyExit:
requeue them). It raises nothing but ``CancelledError``: unexpected errors are logged and become RETRY.
Lifecycle actions the handler is finished with are recorded in :attr:`NodeOperation.settled`; the store
deletes no message whose actions are not all settled.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

import structlog

from queue_processor import tasks
from queue_processor.coalesce import Mode, NodeOperation
from queue_processor.config import Settings
from queue_processor.deadlines import drain_deadline, instance_end, launch_ready_deadline
from queue_processor.drain.drainer import DrainBounds, Drainer, DrainResult
from queue_processor.drain.filters import OWN_POD
from queue_processor.drain.record import CordonRecord
from queue_processor.events import EventKind
from queue_processor.kinds import (
    AsgLaunchLifecycleEvent,
    AsgLifecycleEvent,
    Event,
    StateChangeEvent,
)
from queue_processor.leases import Claim, NodeLeases
from queue_processor.lifecycle import Heartbeats
from queue_processor.nodes import InstanceInfo, InstanceResolver, NodeFinder, is_managed, node_ready
from queue_processor.observe.events import (
    CANCEL_DRAIN,
    CORDON,
    CORDON_AND_DRAIN,
    CORDON_AND_DRAIN_ERROR,
    CORDON_ERROR,
    POD_DELETED_AT_DEADLINE,
    POD_EVICTION,
    POST_DRAIN,
    POST_DRAIN_ERROR,
    PRE_DRAIN,
    RECEIVED_REASONS,
    NodeEventRecorder,
)
from queue_processor.observe.observer import NULL_OBSERVER, Observer
from queue_processor.observe.webhook import NO_FACTS, NodeFacts, Webhook, node_facts
from queue_processor.outcomes import (
    ClaimLost,
    ErrorWhere,
    KubeError,
    LifecycleResult,
    NodeAction,
    OperationOutcome,
)
from queue_processor.returns import came_back

__all__ = [
    "EXCLUDE_FROM_LB_LABEL",
    "INSTANCE_ENDED",
    "OUT_OF_SERVICE_TAINT",
    "Handler",
    "Outcome",
]

log = structlog.get_logger("queue_processor.handler")

OUT_OF_SERVICE_TAINT = ("node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute")

#: How long, after evicting its own pod, the controller waits for the kubelet's SIGTERM before it requeues the
#: node's messages itself (seconds): the kubelet signals at once; this only bounds a pod that is not this process.
LEAVE_WAIT_S = 60.0

#: EC2 states of an instance that has ended: its node never comes back and its lifecycle actions are over.
INSTANCE_ENDED = ("shutting-down", "terminated")
EXCLUDE_FROM_LB_LABEL = (
    "node.kubernetes.io/exclude-from-external-load-balancers",
    "aws-node-termination-handler",
)

#: Kinds NTH gives a PreDrain task (its ``pre-drain`` action: the kind's taint); a state change and a launch
#: have none. A Capacity Reservation interruption, which NTH does not handle, is counted as a Spot one.
PRE_DRAIN_KINDS = frozenset(
    {
        EventKind.SPOT_INTERRUPTION,
        EventKind.REBALANCE_RECOMMENDATION,
        EventKind.ASG_TERMINATE_LIFECYCLE,
        EventKind.SCHEDULED_CHANGE,
        EventKind.CAPACITY_RESERVATION_INTERRUPTION,
    }
)


class Outcome(StrEnum):
    """The end of an operation for its messages."""

    DONE = "done"
    """Acknowledge: drained, or nothing to do."""
    RETRY = "retry"
    """EarlyExit: make the messages visible again after a backoff."""


T = TypeVar("T")


@dataclass
class _Target:
    """What the claim step found: the node's name, whether it was assumed (named after the instance's private
    DNS name, not read), and the Lease claimed for it."""

    info: InstanceInfo
    node: str
    assumed: bool
    claim: Claim | None


class Handler:
    """Runs operations. ``observer`` is told each action on a node, the cordon latency, each drain's
    duration and result, and the outcome of operations that end without a drain; ``clock`` returns monotonic
    seconds. ``heartbeats`` owns every lifecycle action's heartbeat and
    completes actions."""

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
        self.settings = settings
        self.resolver = resolver
        self.finder = finder
        self.heartbeats = heartbeats
        self.drainer = drainer
        self.recorder = recorder
        self.leases = leases
        self.webhook = webhook
        self.observer = observer
        self.clock = clock
        self._draining: Counter[str] = Counter()  # instance ID → drain operations running here

    # ------------------------------------------------------------------------------------------- receipt

    def received(self, event: Event) -> None:
        """An event was just received (new, joined or repeated): a lifecycle action this controller will
        complete is heartbeated from now on. Synchronous: nothing here waits on AWS."""
        if not isinstance(event, AsgLifecycleEvent) or self.settings.dry_run:
            return
        if isinstance(event, AsgLaunchLifecycleEvent) and self._left_to_bootstrap(event):
            return
        self.heartbeats.start(event)

    def _left_to_bootstrap(self, action: AsgLaunchLifecycleEvent) -> bool:
        return action.destination == "WarmPool" and not self.settings.complete_warm_pool_launch

    def draining(self, instance_id: str) -> bool:
        """Whether a drain operation for ``instance_id`` runs here now (the check for instances back in
        service leaves their nodes alone)."""
        return self._draining[instance_id] > 0

    # ---------------------------------------------------------------------------------------- operations

    async def handle(self, operation: NodeOperation) -> Outcome:
        """Run one operation to its end (see the module docstring)."""
        bound = log.bind(
            instance_id=operation.instance_id,
            kind=str(operation.first.kind),
            event_id=operation.first.event_id,
        )
        draining = operation.mode is Mode.DRAIN
        self._draining[operation.instance_id] += draining
        try:
            async with AsyncExitStack() as early_exit:
                if operation.mode is Mode.LAUNCH:
                    return await self._launch(operation, bound)
                return await self._pipeline(operation, early_exit, bound)
        except asyncio.CancelledError:
            raise
        except ClaimLost as exc:
            bound.warning("the node's Lease was lost: requeued", error=str(exc))
            self.observer.operation_outcome(OperationOutcome.LEASE_LOST)
            return Outcome.RETRY
        except Exception as exc:  # one operation must never take the controller down
            bound.error("operation failed", error=repr(exc))
            self.observer.error(ErrorWhere.HANDLE)
            return Outcome.RETRY
        finally:
            self._draining[operation.instance_id] -= draining
            if self._draining[operation.instance_id] <= 0:
                del self._draining[operation.instance_id]

    async def _pipeline(self, operation: NodeOperation, early_exit: AsyncExitStack, bound: Any) -> Outcome:
        """resolve → claim → PreDrain + cordon → drain → PostDrain."""
        info = await self._resolve(operation, bound)
        if isinstance(info, Outcome):
            return info
        if self.settings.dry_run:
            return await self._dry_run(operation, info, bound)
        target = await self._claim(operation, info, early_exit, bound)
        if isinstance(target, Outcome):
            return target
        bound = bound.bind(node=target.node)
        tainted = set(operation.kinds)  # the kinds whose taints go out with the cordon
        try:
            node = await self._cordon(operation, target, bound)
        except (asyncio.CancelledError, ClaimLost):
            raise
        except Exception as exc:  # NTH's CordonAndDrainError (CordonError with CORDON_ONLY)
            only = self.settings.cordon_only
            reason, text = (
                (CORDON[0], CORDON_ERROR) if only else (CORDON_AND_DRAIN[0], CORDON_AND_DRAIN_ERROR)
            )
            await self._event(target.node, f"{reason}Error", f"{text}: {exc}", warning=True, info=target.info)
            raise
        if node is None:
            return await self._no_node(operation, target.info, bound)
        bound = bound.bind(node=node)
        facts = await node_facts(self.drainer.kube, node) if self.webhook is not None else NO_FACTS
        if not self.settings.cordon_only:
            drain = self._drain(operation, node, target.claim, tainted, bound, target.info)
            try:
                result = await self._guarded(target.claim, drain)
            except (asyncio.CancelledError, ClaimLost):
                raise
            except Exception:
                await self._notify(operation, target.info, facts)
                raise
            await self._notify(operation, target.info, facts)
            if not result.completed:
                return Outcome.RETRY
            if any(decision.reason == OWN_POD for decision in result.skipped):
                left = self._leave(operation, node, bound)
                if await self._guarded(target.claim, left):
                    return Outcome.RETRY  # not reached when the kubelet's SIGTERM came: shutdown cancels us
        else:
            await self._notify(operation, target.info, facts)
        post_drain = self._post_drain(operation, node, target.claim, tainted, bound)
        try:
            outcome = await self._guarded(target.claim, post_drain)
        except (asyncio.CancelledError, ClaimLost):
            raise
        except Exception as exc:
            self.observer.node_action(NodeAction.POST_DRAIN, False)
            await self._event(
                node, "PostDrainError", f"{POST_DRAIN_ERROR}: {exc}", warning=True, info=target.info
            )
            raise
        self.observer.node_action(NodeAction.POST_DRAIN, True)
        await self._event(node, *POST_DRAIN, info=target.info)
        return outcome

    async def _dry_run(self, operation: NodeOperation, info: InstanceInfo, bound: Any) -> Outcome:
        """DRY_RUN, as NTH: nothing changes in Kubernetes (no cordon, taint, label, eviction, Lease or
        Event), but the lifecycle actions are completed (CONTINUE), the webhook is sent and NTH's actions are
        counted as if done, so a dry run never holds an instance until its hook times out."""
        node = info.private_dns_name or operation.instance_id
        bound.info("dry run: would cordon and drain", cordon_only=self.settings.cordon_only, node=node)
        if not PRE_DRAIN_KINDS.isdisjoint(operation.kinds):
            self.observer.node_action(NodeAction.PRE_DRAIN, True)
        only = self.settings.cordon_only
        self.observer.node_action(NodeAction.CORDON if only else NodeAction.CORDON_AND_DRAIN, True)
        await self._notify(operation, info, NO_FACTS)
        await self._completion_delay()
        await self._complete_actions(operation, None, bound)
        self.observer.node_action(NodeAction.POST_DRAIN, True)
        return Outcome.DONE

    async def _resolve(self, operation: NodeOperation, bound: Any) -> InstanceInfo | Outcome:
        """The instance as EC2 describes it, or the outcome when there is nothing to do: unknown to EC2
        (its lifecycle actions completed), not managed by this cluster (left alone), or started again since
        the stop the operation is about."""
        info = await self.resolver.get(operation.instance_id)
        if info is None:
            self.observer.operation_outcome(OperationOutcome.UNKNOWN_INSTANCE)
            if operation.mode is Mode.DRAIN:
                bound.info("instance unknown to EC2: nothing to drain, its lifecycle actions completed")
                await self._complete_actions(operation, None, bound)
            else:  # never CONTINUE a launch for an instance EC2 cannot show: left to the hook's default
                bound.info("instance unknown to EC2: its launch actions are left to their hook's timeout")
                for action in operation.lifecycle_actions:
                    await self.heartbeats.stop(action)
                self._settle_all(operation, "unknown-instance")
            return Outcome.DONE
        settings = self.settings
        if not is_managed(
            info,
            check=settings.check_tag_before_draining,
            tag=settings.managed_tag,
            value=settings.managed_tag_value,
        ):
            bound.info("instance not managed: ignored", managed_tag=settings.managed_tag)
            self.observer.operation_outcome(OperationOutcome.UNMANAGED)
            for action in operation.lifecycle_actions:
                await self.heartbeats.stop(action)
            self._settle_all(operation, "unmanaged")
            return Outcome.DONE
        if await self._started_again(operation, bound):
            return Outcome.DONE
        return info

    async def _started_again(self, operation: NodeOperation, bound: Any) -> bool:
        """Whether an operation made only of ``stopping``/``stopped`` state changes comes after the instance
        started again (EC2 now says ``pending`` or ``running``, read fresh): the stop is over, and the node
        the restarted instance registers must not be cordoned for it. A warm pool does this: an instance
        stops into the pool, and its state changes can still be in the queue when it is started into the
        group ("Warm pools for Amazon EC2 Auto Scaling")."""
        stops = ("stopping", "stopped")
        if operation.lifecycle_actions or not all(
            isinstance(event, StateChangeEvent) and event.state in stops for event in operation.events
        ):
            return False
        info = await self.resolver.get(operation.instance_id, fresh=True)
        if info is None or info.state not in ("pending", "running"):
            return False
        bound.info("instance started again since it stopped: nothing to drain", state=info.state)
        self.observer.operation_outcome(OperationOutcome.STARTED_AGAIN)
        return True

    async def _claim(
        self, operation: NodeOperation, info: InstanceInfo, early_exit: AsyncExitStack, bound: Any
    ) -> _Target | Outcome:
        """The node to cordon and, with NODE_LEASES, its Lease (entered on ``early_exit``). When the node is
        named after the instance's private DNS name (the default on EC2) and there is no Lease to claim, the
        cordon patch itself finds it; a 404 falls back to the kubernetes.io/hostname lookup."""
        assumed = self.leases is None and not self.settings.use_provider_id and bool(info.private_dns_name)
        if assumed:
            return _Target(info, info.private_dns_name or "", True, None)
        node = await self.finder.find(info)
        if node is None:
            return await self._no_node(operation, info, bound)
        name = str(node["metadata"]["name"])
        claim = None
        if self.leases is not None:
            claim = await self.leases.claim(name)
            if claim is None:
                bound.info("another replica holds the node's Lease: requeued", node=name)
                self.observer.operation_outcome(OperationOutcome.LEASE_HELD)
                return Outcome.RETRY
            await early_exit.enter_async_context(claim)
        return _Target(info, name, False, claim)

    async def _cordon(self, operation: NodeOperation, target: _Target, bound: Any) -> str | None:
        """PreDrain and cordon in one write; the node's name, or ``None`` when there is no such node."""
        taints, labels = self._pre_drain(operation)
        name = target.node
        about = self._about(operation, target.info)
        if not await self.drainer.cordon(name, taints=taints, labels_if_absent=labels, about=about):
            node = await self.finder.find(target.info) if target.assumed else None
            if node is None:
                return None
            name = str(node["metadata"]["name"])
            if not await self.drainer.cordon(name, taints=taints, labels_if_absent=labels, about=about):
                return None
        for _ in taints:
            self.observer.node_action(NodeAction.TAINT, True)
        if labels:
            self.observer.node_action(NodeAction.EXCLUDE_FROM_LB, True)
        if not PRE_DRAIN_KINDS.isdisjoint(operation.kinds):
            self.observer.node_action(NodeAction.PRE_DRAIN, True)
        if self.settings.cordon_only:
            self.observer.node_action(NodeAction.CORDON, True)
        self.observer.cordoned(self.clock() - operation.started_at)
        bound.info("cordoned")
        for kind in operation.kinds:  # NTH's Event for each interruption taken up, then its steps'
            event_id = operation.event_of(kind).event_id
            text = f"{kind} {event_id} for instance {operation.instance_id}"
            await self._event(name, RECEIVED_REASONS[kind], text, info=target.info)
        if not PRE_DRAIN_KINDS.isdisjoint(operation.kinds):
            await self._event(name, *PRE_DRAIN, info=target.info)
        if self.settings.cordon_only:
            await self._event(name, *CORDON, info=target.info)
        return name

    @staticmethod
    def _about(operation: NodeOperation, info: InstanceInfo) -> CordonRecord:
        """The instance facts recorded with our cordon (:mod:`queue_processor.drain.record`): its ID, its EC2
        ``LaunchTime`` now (a later, different one means it was stopped and started since), whether a terminate
        action sends it to a warm pool, and when."""
        return CordonRecord(
            instance_id=operation.instance_id,
            launch_time=info.launch_time.isoformat() if info.launch_time is not None else "",
            warm_pool=any(action.destination == "WarmPool" for action in operation.terminate_actions),
            since=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    async def _notify(self, operation: NodeOperation, info: InstanceInfo, facts: NodeFacts) -> None:
        """The webhook, as NTH sends it (:meth:`~queue_processor.observe.webhook.Webhook.notify_operation`)."""
        if self.webhook is not None:
            await self.webhook.notify_operation(
                [operation.event_of(kind) for kind in operation.kinds],
                info,
                facts,
                self.clock() - operation.started_at,
            )

    def _pre_drain(self, operation: NodeOperation) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
        """PreDrain's node changes, sent with the cordon: NTH's taint per event kind when TAINT_NODE (value:
        the event ID); the exclude-from-load-balancers label when EXCLUDE_FROM_LOAD_BALANCERS and not
        CORDON_ONLY, added only where the node does not carry it yet (NTH skips an existing label: its value
        may be someone else's; :meth:`Drainer.cordon` decides on the node it reads for the write)."""
        labels: dict[str, str] = {}
        if self.settings.exclude_from_load_balancers and not self.settings.cordon_only:
            labels = dict([EXCLUDE_FROM_LB_LABEL])
        return self._taints(operation, operation.kinds), labels

    def _taints(self, operation: NodeOperation, kinds: list[EventKind]) -> list[tuple[str, str, str]]:
        if not self.settings.taint_node:
            return []
        taints: list[tuple[str, str, str]] = []
        for kind in kinds:
            event = operation.event_of(kind)
            if event.taint_key is not None:  # the kind's own (kinds/<kind>.py); NTH's keys
                taints.append((event.taint_key, event.event_id, self.settings.taint_effect))
        return taints

    async def _drain(
        self,
        operation: NodeOperation,
        node: str,
        claim: Claim | None,
        tainted: set[EventKind],
        bound: Any,
        info: InstanceInfo,
    ) -> DrainResult:
        """Evict the node's pods until the deadline; how it ended. Events that join meanwhile bring the
        drain's deadline and the instance's end nearer when theirs are (DESIGN.md rule 13), and their kinds get
        their taints (a watcher task, cancelled and awaited when the drain ends; ``tainted`` grows)."""
        started = self.clock()
        kind = str(operation.first.kind)
        bounds = DrainBounds(self._deadline(operation), self._instance_end(operation))
        watcher = tasks.spawn(self._joiners(operation, node, tainted, bounds, bound), name=f"joiners-{node}")
        recorder = self.recorder if self.recorder is not None and self.recorder.enabled else None

        async def evicted(namespace: str, name: str) -> None:
            assert recorder is not None
            await recorder.record_pod(namespace, name, POD_EVICTION[0], POD_EVICTION[1].format(node=node))

        async def deleted(namespace: str, name: str) -> None:
            assert recorder is not None
            reason, text = POD_DELETED_AT_DEADLINE
            await recorder.record_pod(namespace, name, reason, text.format(node=node), warning=True)

        try:
            result = await self.drainer.drain(
                node,
                bounds,
                guard=claim.confirm if claim is not None else None,
                evicted=evicted if recorder is not None else None,
                deleted=deleted if recorder is not None else None,
            )
        except asyncio.CancelledError:
            self.observer.drained(kind, "cancelled", self.clock() - started)
            raise
        finally:
            await tasks.stop(watcher)
        self.observer.drained(kind, result.outcome, self.clock() - started)
        figures = {
            "drain_id": result.drain_id,
            "evicted": result.evicted,
            "waves": result.waves,
            "cut_short": result.cut_short,
            "deleted_at_deadline": result.deleted_at_deadline,
        }
        if not result.completed:
            self.observer.node_action(NodeAction.CORDON_AND_DRAIN, False)
            bound.warning("drain incomplete: requeued", reason=result.reason, causes=result.causes, **figures)
            text = f"{CORDON_AND_DRAIN_ERROR}: drain incomplete, will retry: {result.reason}"
            await self._event(node, "CordonAndDrainError", text, warning=True, info=info)
            if (
                EventKind.ASG_TERMINATE_LIFECYCLE in operation.kinds
            ):  # NTH's EarlyExit task for lifecycle hooks
                await self._event(node, *CANCEL_DRAIN, info=info)
            return result
        self.observer.node_action(NodeAction.CORDON_AND_DRAIN, True)
        bound.info("drained", skipped=len(result.skipped), **figures)
        await self._event(node, *CORDON_AND_DRAIN, info=info)
        return result

    async def _leave(self, operation: NodeOperation, node: str, bound: Any) -> bool:
        """Our own pod runs on the node just drained. Rather than completing the node's lifecycle actions and
        dying with the instance (every other message we hold then waits out its visibility timeout, unheartbeated,
        until a new pod runs elsewhere), evict our pod last: the kubelet's SIGTERM starts our graceful shutdown,
        which stops every heartbeat and makes every message we hold visible again at once, this node's included;
        whoever runs next (the ReplicaSet's replacement, scheduled off this cordoned node, or another replica)
        takes them up, finds this node drained and completes its actions. ``True`` when our pod was evicted and
        no SIGTERM came within :data:`LEAVE_WAIT_S` (requeue: the next receive sees how things are then);
        ``False`` when the eviction was refused until the drain deadline (a PodDisruptionBudget over our
        replicas): the actions are completed as before and this process goes with the instance."""
        namespace, name = self.settings.pod_namespace or "default", self.settings.pod_name
        if not await self.drainer.evict_last(namespace, name, self._deadline(operation)):
            bound.warning(
                "our own pod could not be evicted before the deadline: completing and going with the node"
            )
            return False
        self.observer.node_action(NodeAction.LEAVE, True)
        bound.info(
            "our own pod evicted, last: its shutdown releases our messages, this node's actions go to our successor",
            pod=f"{namespace}/{name}",
        )
        await asyncio.sleep(LEAVE_WAIT_S)  # the kubelet's SIGTERM comes first, and shutdown cancels this
        bound.warning("our own pod was evicted but no SIGTERM came: requeued", waited_s=LEAVE_WAIT_S)
        return True

    async def _joiners(
        self, operation: NodeOperation, node: str, tainted: set[EventKind], bounds: DrainBounds, bound: Any
    ) -> None:
        """Whenever an event joins: the drain's bounds tighten to its deadline and instance end when they are
        nearer (a Spot warning joining a rebalance recommendation's drain), and the node is tainted for kinds
        not tainted yet (TAINT_NODE)."""
        while True:
            await operation.joined.wait()
            operation.joined.clear()
            if bounds.tighten(self._deadline(operation), self._instance_end(operation)):
                now = self.clock()
                bound.info(
                    "a joining event brings the drain's end nearer",
                    deadline_in_s=round(bounds.deadline - now, 1),
                    instance_end_in_s=None
                    if bounds.instance_end is None
                    else round(bounds.instance_end - now, 1),
                )
            new = [kind for kind in operation.kinds if kind not in tainted]
            for key, value, effect in self._taints(operation, new):
                await self.drainer.taint(node, key, value, effect)
                self.observer.node_action(NodeAction.TAINT, True)
            tainted.update(new)

    async def _post_drain(
        self, operation: NodeOperation, node: str, claim: Claim | None, tainted: set[EventKind], bound: Any
    ) -> Outcome:
        """Complete the lifecycle actions; taint for kinds that joined since the last taint; the
        out-of-service taint when ENABLE_OUT_OF_SERVICE_TAINT (not with CORDON_ONLY, as NTH). A node gone by
        then is success: its instance terminated once its actions were completed, and the node went with it."""
        settings = self.settings
        await self._completion_delay()
        await self._complete_actions(operation, claim, bound)
        try:
            new = [kind for kind in operation.kinds if kind not in tainted]
            for key, value, effect in self._taints(operation, new):
                await self.drainer.taint(node, key, value, effect)
                self.observer.node_action(NodeAction.TAINT, True)
            tainted.update(new)
            if settings.enable_out_of_service_taint and not settings.cordon_only:
                await self.drainer.taint(node, *OUT_OF_SERVICE_TAINT)
                self.observer.node_action(NodeAction.OUT_OF_SERVICE_TAINT, True)
        except KubeError as exc:
            if exc.status != 404:
                raise
            bound.info("node gone once its actions were completed: nothing left to taint")
        await self._complete_actions(operation, claim, bound)  # actions that joined during the taints
        return Outcome.DONE

    async def _completion_delay(self) -> None:
        """COMPLETE_LIFECYCLE_ACTION_DELAY_SECONDS before completing, as NTH: after a drain, a dry run's
        decision, and a launching instance's node turning Ready (the actions are heartbeated meanwhile)."""
        if self.settings.complete_lifecycle_action_delay_seconds > 0:
            await asyncio.sleep(self.settings.complete_lifecycle_action_delay_seconds)

    async def _complete_actions(self, operation: NodeOperation, claim: Claim | None, bound: Any) -> None:
        """Complete every unsettled lifecycle action of the operation with CONTINUE, until none is left
        (actions that join while others complete are completed too). With a Lease, it is confirmed first."""
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
                bound.info("lifecycle action completed", hook=action.lifecycle_hook_name, result=result)

    def _settle_all(self, operation: NodeOperation, how: str) -> None:
        for action in operation.unsettled():
            operation.settled[action.action_key] = how

    async def _guarded(self, claim: Claim | None, step: Awaitable[T]) -> T:
        """Run ``step``; with a Lease, cancel it and raise :class:`ClaimLost` as soon as the Lease is lost."""
        if claim is None:
            return await step
        task = asyncio.ensure_future(step)
        lost = asyncio.create_task(claim.lost.wait(), name="lease-lost")
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await tasks.stop(task, lost)
        if task.cancelled() and lost.done() and not lost.cancelled():
            raise ClaimLost(f"Lease {claim.name} was lost")
        return task.result()

    async def _no_node(self, operation: NodeOperation, info: InstanceInfo, bound: Any) -> Outcome:
        """No Node for the instance. Done, its lifecycle actions completed (CONTINUE: there is nothing to
        drain), when the instance is gone, when DELETE_SQS_MSG_IF_NODE_NOT_FOUND says so, or when no node can
        come any more: the instance has run for LAUNCH_READY_TIMEOUT_SEC (its ``LaunchTime``, its last start)
        without one registering (DESIGN.md rule 9). Before that (or when EC2 gives no ``LaunchTime``) a node
        may still register, and the operation is retried."""
        if await self._instance_gone(operation):
            bound.info("instance terminated and its node gone: nothing to drain")
            self.observer.operation_outcome(OperationOutcome.INSTANCE_GONE)
            await self._complete_actions(operation, None, bound)
            return Outcome.DONE
        if self.settings.delete_sqs_msg_if_node_not_found:
            bound.info("no node for the instance: acknowledged (DELETE_SQS_MSG_IF_NODE_NOT_FOUND)")
            self.observer.operation_outcome(OperationOutcome.NODE_NOT_FOUND)
            await self._complete_actions(operation, None, bound)
            return Outcome.DONE
        timeout_s = self.settings.launch_ready_timeout_sec
        launched = info.launch_time
        running_s = None if launched is None else (datetime.now(UTC) - launched).total_seconds()
        if running_s is not None and running_s >= timeout_s:
            bound.info(
                "no node registered for the instance: nothing to drain, its lifecycle actions completed",
                running_s=running_s,
                launch_ready_timeout_s=timeout_s,
            )
            self.observer.operation_outcome(OperationOutcome.NO_NODE)
            await self._complete_actions(operation, None, bound)
            return Outcome.DONE
        bound.info(
            "no node for the instance yet: requeued", running_s=running_s, launch_ready_timeout_s=timeout_s
        )
        return Outcome.RETRY

    async def _event(
        self, node: str, reason: str, message: str, *, warning: bool = False, info: InstanceInfo | None = None
    ) -> None:
        """An Event on ``node`` with NTH's per-node annotations, from what EC2 says of its instance."""
        if self.recorder is None:
            return
        facts = {"local-hostname": node}
        if info is not None:
            zone = info.availability_zone
            facts |= {"instance-id": info.instance_id, "availability-zone": zone, "region": zone[:-1]}
        await self.recorder.record(node, reason, message, warning=warning, facts=facts)

    async def _instance_gone(self, operation: NodeOperation) -> bool:
        """Whether the instance is shutting down or terminated (its node will never come back): from the
        operation's own state changes, else from a fresh DescribeInstances."""
        if any(isinstance(e, StateChangeEvent) and e.state in INSTANCE_ENDED for e in operation.events):
            return True
        info = await self.resolver.get(operation.instance_id, fresh=True)
        return info is None or info.state in INSTANCE_ENDED

    def _deadline(self, operation: NodeOperation) -> float:
        """The operation's drain deadline now (:func:`~queue_processor.deadlines.drain_deadline`)."""
        return drain_deadline(
            operation.events,
            grace_period_s=self.settings.node_termination_grace_period,
            now=self.clock(),
            wall=datetime.now(UTC),
            started_at=operation.started_at,
        )

    def _instance_end(self, operation: NodeOperation) -> float | None:
        """When the operation's instance goes, as its events say now (:func:`~.deadlines.instance_end`)."""
        return instance_end(
            operation.events, now=self.clock(), wall=datetime.now(UTC), started_at=operation.started_at
        )

    async def _launch(self, operation: NodeOperation, bound: Any) -> Outcome:
        """Wait for the instance's node to be registered and Ready, then complete its launch actions (those
        headed for a warm pool only with COMPLETE_WARM_POOL_LAUNCH) with CONTINUE. Only while work can still
        finish them (DESIGN.md rule 9): an instance EC2 lists as shutting down or terminated ends its actions
        (acknowledged at once), an action AWS says is over is settled, and a node not Ready
        LAUNCH_READY_TIMEOUT_SEC after the action began (:func:`launch_ready_deadline`: the same moment at
        every receive, on every replica) gets the hook's DefaultResult."""
        settings = self.settings
        for action in operation.launch_actions:
            if self._left_to_bootstrap(action):
                operation.settled[action.action_key] = "left-to-bootstrap"
        if not operation.unsettled():
            bound.info("launch into a warm pool: left to the instance's bootstrap")
            return Outcome.DONE
        resolved = await self._resolve(operation, bound)
        if isinstance(resolved, Outcome):
            return resolved
        info: InstanceInfo | None = resolved
        deadline = launch_ready_deadline(
            operation.events,
            timeout_s=settings.launch_ready_timeout_sec,
            now=self.clock(),
            wall=datetime.now(UTC),
        )
        poll = 0.1
        while True:
            if info is None or info.state in INSTANCE_ENDED:
                return await self._launch_ended(operation, info, bound)
            for open_action in operation.unsettled():
                if self.heartbeats.over(open_action):
                    operation.settled[open_action.action_key] = LifecycleResult.NO_ACTIVE_ACTION
                    bound.info(
                        "launch action already over: acknowledged", hook=open_action.lifecycle_hook_name
                    )
            if not operation.unsettled():
                self.observer.operation_outcome(OperationOutcome.ACTION_OVER)
                return Outcome.DONE
            node = await self.finder.find(info)
            if node is not None and node_ready(node):
                break
            if self.clock() >= deadline:
                return await self._launch_not_ready(operation, node is not None, bound)
            await asyncio.sleep(min(poll, max(deadline - self.clock(), 0.0)))
            poll = min(poll * 1.5, 5.0)
            info = await self.resolver.get(operation.instance_id)
        bound = bound.bind(node=node["metadata"]["name"])
        await self._completion_delay()
        if settings.dry_run:  # nothing to change in Kubernetes: the action is completed, as NTH does
            bound.info("dry run: the node is Ready, its launch actions completed")
            await self._complete_actions(operation, None, bound)
            self.observer.node_action(NodeAction.POST_DRAIN, True)
            return Outcome.DONE
        name = str(node["metadata"]["name"])
        text = f"{operation.first.kind} {operation.first.event_id} for instance {operation.instance_id}"
        await self._event(name, RECEIVED_REASONS[EventKind.ASG_LAUNCH_LIFECYCLE], text, info=info)
        if settings.uncordon_on_return:
            await self._undo_on_return(operation, name, info, bound)
        try:
            await self._complete_actions(operation, None, bound)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # NTH's launch PostDrain
            self.observer.node_action(NodeAction.POST_DRAIN, False)
            await self._event(name, "PostDrainError", f"{POST_DRAIN_ERROR}: {exc}", warning=True, info=info)
            raise
        self.observer.node_action(NodeAction.POST_DRAIN, True)
        await self._event(name, *POST_DRAIN, info=info)
        return Outcome.DONE

    async def _undo_on_return(
        self, operation: NodeOperation, node: str, info: InstanceInfo | None, bound: Any
    ) -> None:
        """The launching instance is going into service and its node is Ready: undo what we did to the node
        when it carries our record for this instance (DESIGN.md rule 12) and no drain of it runs here. A launch
        out of a warm pool is proof of its return; another launch only when the instance was started since our
        cordon (:func:`~queue_processor.returns.came_back`)."""
        from_pool = any(action.origin == "WarmPool" for action in operation.launch_actions)

        def decide(found: dict[str, Any], record: CordonRecord) -> bool:
            if record.instance_id != operation.instance_id or self.draining(operation.instance_id):
                return False
            return node_ready(found) and (from_pool or came_back(record, info, found))

        if await self.drainer.undo(node, decide):
            self.observer.node_action(NodeAction.UNCORDON, True)
            bound.info(
                "instance back in service: our cordon, taints and label undone", from_warm_pool=from_pool
            )

    async def _launch_ended(self, operation: NodeOperation, info: InstanceInfo | None, bound: Any) -> Outcome:
        """The launching instance is shutting down or terminated (or EC2 no longer shows it): its launch
        actions ended with it. Their heartbeats stop and the messages are acknowledged."""
        bound.info("launching instance terminated: its launch actions are over", state=info and info.state)
        for action in operation.unsettled():
            await self.heartbeats.stop(action)
        self._settle_all(operation, "instance-gone")
        self.observer.operation_outcome(OperationOutcome.INSTANCE_GONE)
        return Outcome.DONE

    async def _launch_not_ready(self, operation: NodeOperation, registered: bool, bound: Any) -> Outcome:
        """LAUNCH_READY_TIMEOUT_SEC has passed since the launch began and the node is not Ready: each launch
        action is completed with its hook's DefaultResult (ABANDON when the hook cannot be read), as Auto
        Scaling would at the hook's timeout, but now, instead of heartbeats keeping a broken instance in
        ``Pending:Wait`` until the message reaches the dead-letter queue."""
        self.observer.operation_outcome(OperationOutcome.LAUNCH_NOT_READY)
        for action in operation.unsettled():
            result = await self.heartbeats.lifecycle.default_result(
                action.auto_scaling_group_name, action.lifecycle_hook_name
            )
            bound.warning(
                "node not Ready in time: launch action completed with its hook's DefaultResult",
                timeout_s=self.settings.launch_ready_timeout_sec,
                registered=registered,
                hook=action.lifecycle_hook_name,
                result=result,
            )
            outcome = await self.heartbeats.complete(action, result)
            operation.settled[action.action_key] = outcome
        return Outcome.DONE
