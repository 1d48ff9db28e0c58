"""The per-node pipeline: PreDrain → cordon → drain → PostDrain, and EarlyExit on any failure.

For a drain operation (every kind but launch actions), :meth:`Handler.handle`:

1. resolves the instance (EC2, batched and cached) and checks the managed tag — an unknown instance or an
   unmanaged one is terminal: acknowledged, nothing done;
2. finds the Node — none: DELETE_SQS_MSG_IF_NODE_NOT_FOUND decides (acknowledge and complete the lifecycle
   actions with CONTINUE, or requeue);
3. with NODE_LEASES, claims the node's Lease (held by another replica: requeue);
   PreDrain: starts one heartbeat task per ASG terminate action (their owner is this call: they are cancelled
   and awaited when it returns, whatever happened — DESIGN.md rule 3), taints the node with NTH's key for each
   kind (value = event ID, TAINT_EFFECT) when TAINT_NODE, labels it out of external load balancers when
   EXCLUDE_FROM_LOAD_BALANCERS;
4. cordons it at once (no drain budget involved);
5. drains it unless CORDON_ONLY, until NODE_TERMINATION_GRACE_PERIOD and never past the instance's start
   time (the end of a Spot notice);
6. PostDrain: waits COMPLETE_LIFECYCLE_ACTION_DELAY_SECONDS, completes every terminate action with CONTINUE
   (an action that is over already counts as done), adds the out-of-service taint when asked.

A launch operation waits until the instance's node is registered and Ready, then completes its launch
actions; an action headed for a warm pool is left to the instance's own bootstrap unless
COMPLETE_WARM_POOL_LAUNCH. With DRY_RUN nothing is changed: each step is logged instead.

``handle`` returns :attr:`Outcome.DONE` (acknowledge the messages) or :attr:`Outcome.RETRY` (EarlyExit:
requeue them). It raises nothing but ``CancelledError``: unexpected errors are logged and become RETRY.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import structlog

from queue_processor.coalesce import Mode, NodeOperation
from queue_processor.config import Settings
from queue_processor.drain.drainer import Drainer, DrainResult
from queue_processor.events import EventKind, StateChangeEvent
from queue_processor.leases import NodeLeases
from queue_processor.lifecycle import Lifecycle
from queue_processor.nodes import InstanceInfo, InstanceResolver, NodeFinder, is_managed
from queue_processor.observe.events import NodeEventRecorder
from queue_processor.observe.webhook import Webhook

__all__ = ["EXCLUDE_FROM_LB_LABEL", "OUT_OF_SERVICE_TAINT", "TAINT_KEYS", "Handler", "Outcome"]

log = structlog.get_logger("queue_processor.handler")

#: NTH's taint keys (pkg/node/node.go); capacity-reservation interruptions are ours. State changes: none.
TAINT_KEYS = {
    EventKind.SPOT_INTERRUPTION: "aws-node-termination-handler/spot-itn",
    EventKind.SCHEDULED_CHANGE: "aws-node-termination-handler/scheduled-maintenance",
    EventKind.ASG_TERMINATE_LIFECYCLE: "aws-node-termination-handler/asg-lifecycle-termination",
    EventKind.REBALANCE_RECOMMENDATION: "aws-node-termination-handler/rebalance-recommendation",
    EventKind.CAPACITY_RESERVATION_INTERRUPTION: "aws-node-termination-handler/capacity-reservation-interruption",
}
OUT_OF_SERVICE_TAINT = ("node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute")
EXCLUDE_FROM_LB_LABEL = (
    "node.kubernetes.io/exclude-from-external-load-balancers",
    "aws-node-termination-handler",
)


#: Kinds whose start time is a hard deadline: the instance is reclaimed then.
NOTICE_KINDS = frozenset({EventKind.SPOT_INTERRUPTION, EventKind.CAPACITY_RESERVATION_INTERRUPTION})


class Outcome(StrEnum):
    """The end of an operation for its messages."""

    DONE = "done"
    """Acknowledge: drained, or nothing to do."""
    RETRY = "retry"
    """EarlyExit: make the messages visible again after a backoff."""


def _is_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class Handler:
    """Runs operations. ``on_step(step, status)`` and ``on_timing(name, seconds, labels)`` feed metrics
    (``cordon``, ``drain``…); ``clock`` returns monotonic seconds."""

    def __init__(
        self,
        settings: Settings,
        *,
        resolver: InstanceResolver,
        finder: NodeFinder,
        lifecycle: Lifecycle,
        drainer: Drainer,
        recorder: NodeEventRecorder | None = None,
        leases: NodeLeases | None = None,
        webhook: Webhook | None = None,
        on_step: Callable[[str, str], None] | None = None,
        on_timing: Callable[[str, float, dict[str, str]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.resolver = resolver
        self.finder = finder
        self.lifecycle = lifecycle
        self.drainer = drainer
        self.recorder = recorder
        self.leases = leases
        self.webhook = webhook
        self.on_step = on_step or (lambda step, status: None)
        self.on_timing = on_timing or (lambda name, seconds, labels: None)
        self.clock = clock

    async def handle(self, operation: NodeOperation) -> Outcome:
        """Run one operation to its end (see the module docstring)."""
        bound = log.bind(
            instance_id=operation.instance_id,
            kind=str(operation.first.kind),
            event_id=operation.first.event_id,
        )
        try:
            if operation.mode is Mode.LAUNCH:
                return await self._launch(operation, bound)
            return await self._drain(operation, bound)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one operation must never take the controller down
            bound.error("operation failed", error=repr(exc))
            self.on_step("handle", "error")
            return Outcome.RETRY

    async def _instance_of(
        self, operation: NodeOperation, bound: Any
    ) -> tuple[InstanceInfo | None, Outcome | None]:
        """The instance as EC2 describes it, or the outcome when there is nothing to do (unknown to EC2, or
        not managed by this cluster)."""
        info = await self.resolver.get(operation.instance_id)
        if info is None:
            bound.info("instance unknown to EC2: nothing to do")
            return None, Outcome.DONE
        settings = self.settings
        if not is_managed(
            info,
            check=settings.check_tag_before_draining,
            tag=settings.managed_tag,
            value=settings.managed_tag_value,
        ):
            bound.info("instance not managed: ignored", managed_tag=settings.managed_tag)
            return None, Outcome.DONE
        return info, None

    async def _node_of(
        self, operation: NodeOperation, bound: Any
    ) -> tuple[dict[str, Any] | None, Outcome | None]:
        info, outcome = await self._instance_of(operation, bound)
        if info is None:
            return None, outcome
        return await self.finder.find(info), None

    async def _no_node(self, operation: NodeOperation, bound: Any) -> Outcome:
        """No Node for the instance: done when the instance is gone or DELETE_SQS_MSG_IF_NODE_NOT_FOUND says
        so (its terminate actions completed), else retried."""
        if await self._instance_gone(operation):
            bound.info("instance terminated and its node gone: nothing to drain")
            await self._complete_terminate_actions(operation, bound)
            return Outcome.DONE
        if self.settings.delete_sqs_msg_if_node_not_found:
            bound.info("no node for the instance: acknowledged (DELETE_SQS_MSG_IF_NODE_NOT_FOUND)")
            await self._complete_terminate_actions(operation, bound)
            return Outcome.DONE
        bound.info("no node for the instance: requeued")
        return Outcome.RETRY

    async def _drain(self, operation: NodeOperation, bound: Any) -> Outcome:
        settings = self.settings
        info, outcome = await self._instance_of(operation, bound)
        if info is None:
            return outcome or Outcome.DONE
        # Cordon at once: when the node is named after the instance's private DNS name (the default on EC2)
        # and nothing must happen between finding and cordoning it (no Lease to claim, not a dry run), the
        # cordon patch itself finds it; a 404 falls back to the kubernetes.io/hostname lookup.
        assumed = (
            self.leases is None
            and not settings.dry_run
            and not settings.use_provider_id
            and bool(info.private_dns_name)
        )
        name = info.private_dns_name if assumed else None
        if name is None:
            node = await self.finder.find(info)
            if node is None:
                return await self._no_node(operation, bound)
            name = node["metadata"]["name"]
        bound = bound.bind(node=name)
        claim = await self.leases.claim(name) if self.leases is not None else None
        if self.leases is not None and claim is None:
            bound.info("another replica holds the node's Lease: requeued")
            return Outcome.RETRY
        heartbeats = await self._start_heartbeats(operation)
        try:
            if settings.dry_run:
                bound.info("dry run: would cordon and drain", cordon_only=settings.cordon_only)
                return Outcome.DONE
            taints, labels = self._pre_drain(operation)
            if not await self.drainer.cordon(name, taints=taints, labels=labels):
                node = await self.finder.find(info) if assumed else None
                if node is None or not await self.drainer.cordon(
                    node["metadata"]["name"], taints=taints, labels=labels
                ):
                    return await self._no_node(operation, bound)
                name = node["metadata"]["name"]
                bound = bound.bind(node=name)
            for _ in taints:
                self.on_step("taint", "success")
            self.on_step("cordon", "success")
            self.on_timing("cordon", self.clock() - operation.started_at, {})
            bound.info("cordoned")
            await self._event(name, "Cordon", f"cordoned for {self._kinds(operation)}")
            if self.webhook is not None:
                action = "cordoned" if settings.cordon_only else "cordoned, draining"
                await self.webhook.notify(operation.first, name, f"{self._kinds(operation)}: node {action}")
            if not settings.cordon_only:
                started = self.clock()
                kind = str(operation.first.kind)
                try:
                    result = await self.drainer.drain(name, self._deadline(operation))
                except asyncio.CancelledError:
                    self.on_timing("drain", self.clock() - started, {"kind": kind, "result": "cancelled"})
                    raise
                self.on_timing(
                    "drain", self.clock() - started, {"kind": kind, "result": _drain_result(result)}
                )
                if not result.completed:
                    self.on_step("cordon-and-drain", "error")
                    bound.warning("drain incomplete: requeued", reason=result.reason, evicted=result.evicted)
                    await self._event(
                        name, "DrainFailed", f"drain incomplete, will retry: {result.reason}", True
                    )
                    return Outcome.RETRY
                self.on_step("cordon-and-drain", "success")
                bound.info("drained", evicted=result.evicted, skipped=len(result.skipped))
                await self._event(
                    name, "Drain", f"drained for {self._kinds(operation)}: {result.evicted} pods evicted"
                )
            return await self._post_drain(operation, name, bound)
        finally:
            for task in heartbeats:
                task.cancel()
            await asyncio.gather(*heartbeats, return_exceptions=True)
            if claim is not None:
                await claim.release()

    async def _event(self, node: str, reason: str, message: str, warning: bool = False) -> None:
        if self.recorder is not None:
            await self.recorder.record(node, reason, message, warning=warning)

    @staticmethod
    def _kinds(operation: NodeOperation) -> str:
        return ", ".join(
            f"{kind} ({next(e.event_id for e in operation.events if e.kind is kind)})"
            for kind in operation.kinds
        )

    async def _instance_gone(self, operation: NodeOperation) -> bool:
        """Whether the instance is shutting down or terminated (its node will never come back): from the
        operation's own state changes, else from a fresh DescribeInstances."""
        gone = ("shutting-down", "terminated")
        if any(isinstance(e, StateChangeEvent) and e.state in gone for e in operation.events):
            return True
        info = await self.resolver.get(operation.instance_id, fresh=True)
        return info is None or info.state in gone

    async def _start_heartbeats(self, operation: NodeOperation) -> list[asyncio.Task[None]]:
        """One heartbeat task per terminate action, and a watcher that starts one for each action that joins
        the operation later; the caller cancels and awaits them all."""
        tasks: list[asyncio.Task[None]] = []
        started: set[tuple[str, str, str]] = set()
        await self._heartbeat_new(operation, tasks, started)
        tasks.append(
            asyncio.create_task(self._watch_joiners(operation, tasks, started), name="heartbeat-watcher")
        )
        return tasks

    async def _heartbeat_new(
        self, operation: NodeOperation, tasks: list[asyncio.Task[None]], started: set[tuple[str, str, str]]
    ) -> None:
        for action in operation.terminate_actions:
            key = (
                action.lifecycle_action_token or action.instance_id,
                action.auto_scaling_group_name,
                action.lifecycle_hook_name,
            )
            if key in started:
                continue
            started.add(key)
            interval = await self.lifecycle.interval_s(action)
            if interval:
                name = f"heartbeat-{action.instance_id}-{action.lifecycle_hook_name}"
                tasks.append(asyncio.create_task(self.lifecycle.heartbeat(action, interval), name=name))

    async def _watch_joiners(
        self, operation: NodeOperation, tasks: list[asyncio.Task[None]], started: set[tuple[str, str, str]]
    ) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self._heartbeat_new(operation, tasks, started)

    def _pre_drain(self, operation: NodeOperation) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
        """PreDrain's node changes, sent with the cordon: NTH's taint per event kind when TAINT_NODE (value:
        the event ID), the exclude-from-load-balancers label when EXCLUDE_FROM_LOAD_BALANCERS."""
        settings = self.settings
        taints: list[tuple[str, str, str]] = []
        if settings.taint_node:
            for kind in operation.kinds:
                key = TAINT_KEYS.get(kind)
                if key is not None:
                    event = next(e for e in operation.events if e.kind is kind)
                    taints.append((key, event.event_id, settings.taint_effect))
        labels = dict([EXCLUDE_FROM_LB_LABEL]) if settings.exclude_from_load_balancers else {}
        return taints, labels

    def _deadline(self, operation: NodeOperation) -> float:
        """NODE_TERMINATION_GRACE_PERIOD from now, and, when a Spot or Capacity Reservation notice is among
        the operation's events, never past the end of the earliest such notice. Other kinds (rebalance,
        state change, lifecycle actions) carry no notice: their start time is when they were sent, already
        past, and must not shorten the drain."""
        now = self.clock()
        deadline = now + self.settings.node_termination_grace_period
        notices = [e.start_time for e in operation.events if e.kind in NOTICE_KINDS]
        if notices:
            left = (min(notices) - datetime.now(UTC)).total_seconds()
            deadline = min(deadline, now + max(left, 0.0))
        return deadline

    async def _post_drain(self, operation: NodeOperation, node: str, bound: Any) -> Outcome:
        settings = self.settings
        if settings.complete_lifecycle_action_delay_seconds > 0:
            await asyncio.sleep(settings.complete_lifecycle_action_delay_seconds)
        await self._complete_terminate_actions(operation, bound)
        if settings.enable_out_of_service_taint and not settings.cordon_only:
            await self.drainer.taint(node, *OUT_OF_SERVICE_TAINT)
        return Outcome.DONE

    async def _complete_terminate_actions(self, operation: NodeOperation, bound: Any) -> None:
        for action in operation.terminate_actions:
            if self.settings.dry_run:
                bound.info("dry run: would complete the lifecycle action", hook=action.lifecycle_hook_name)
                continue
            result = await self.lifecycle.complete(action, "CONTINUE")
            self.on_step("lifecycle-complete", "success")
            bound.info("lifecycle action completed", hook=action.lifecycle_hook_name, result=result)

    async def _launch(self, operation: NodeOperation, bound: Any) -> Outcome:
        settings = self.settings
        actions = operation.launch_actions
        if not settings.complete_warm_pool_launch:
            actions = [a for a in actions if a.destination != "WarmPool"]
            if not actions:
                bound.info("launch into a warm pool: left to the instance's bootstrap")
                return Outcome.DONE
        node, outcome = await self._node_of(operation, bound)
        if outcome is not None:
            return outcome
        heartbeats = []
        for action in actions:
            interval = await self.lifecycle.interval_s(action)
            if interval:
                name = f"heartbeat-{action.instance_id}-{action.lifecycle_hook_name}"
                heartbeats.append(asyncio.create_task(self.lifecycle.heartbeat(action, interval), name=name))
        try:
            deadline = self.clock() + settings.launch_ready_timeout_sec
            poll = 0.1
            while node is None or not _is_ready(node):
                if self.clock() >= deadline:
                    bound.warning(
                        "node not Ready in time: requeued", timeout_s=settings.launch_ready_timeout_sec
                    )
                    return Outcome.RETRY
                await asyncio.sleep(poll)
                poll = min(poll * 1.5, 5.0)
                info = await self.resolver.get(operation.instance_id)
                node = await self.finder.find(info) if info is not None else None
            bound = bound.bind(node=node["metadata"]["name"])
            for action in actions:
                if settings.dry_run:
                    bound.info("dry run: would complete the launch action")
                    continue
                result = await self.lifecycle.complete(action, "CONTINUE")
                self.on_step("lifecycle-complete", "success")
                bound.info("launch action completed: node Ready", result=result)
            return Outcome.DONE
        finally:
            for task in heartbeats:
                task.cancel()
            await asyncio.gather(*heartbeats, return_exceptions=True)


def _drain_result(result: DrainResult) -> str:
    """The ``result`` label of ``queue_processor_drain_duration_seconds`` (``observe.metrics.DrainResult``):
    ``drained``; ``error`` when a pod could not be evicted (filters refused it, or the eviction failed);
    else ``timeout`` (pods still there at the deadline, PodDisruptionBudgets included)."""
    if result.completed:
        return "drained"
    if result.failed or (result.reason or "").startswith("cannot drain"):
        return "error"
    return "timeout"
