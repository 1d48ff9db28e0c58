"""The launch path: wait until a launching instance's node is registered and Ready, then complete its launch actions
with CONTINUE (warm-pool ones only with COMPLETE_WARM_POOL_LAUNCH), first undoing our cordon of a node back in
service (UNCORDON_ON_RETURN). Only while work can still finish them (DESIGN.md rule 9): an ended instance ends its
actions, and a node not Ready within LAUNCH_READY_TIMEOUT_SEC gets the hook's DefaultResult."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from queue_processor.aws import InstanceInfo
from queue_processor.drain.node_writes import CordonRecord
from queue_processor.events import EventKind
from queue_processor.observe.events import RECEIVED_REASONS
from queue_processor.outcomes import LifecycleResult, NodeAction, OperationOutcome
from queue_processor.returns import came_back
from queue_processor.steps import (
    INSTANCE_ENDED,
    OperationContext,
    Outcome,
    complete_actions,
    completion_delay,
    launch_ready_deadline,
    left_to_bootstrap,
    not_ours,
    record_event,
    report_step,
    resolve,
)
from queue_processor.watch import FIRST_COPY_WAIT_S, RECORD_LABEL, node_ready


@dataclass
class Draining:
    """What tells a launch whether its node is being drained here: ``here(instance_id)``; ``waiting``, the nodes
    whose return waits for a drain of them to end (here or on another replica)."""

    here: Callable[[str], bool]
    waiting: set[str] = field(default_factory=set)


async def run_launch(ctx: OperationContext, draining: Draining) -> Outcome:
    """The launch of ``ctx`` (module docstring); a node drained here (``draining``) or elsewhere is never uncordoned."""
    parts, operation = ctx.parts, ctx.operation
    settings = parts.settings
    for action in operation.launch_actions:
        if left_to_bootstrap(settings, action):
            operation.settled[action.action_key] = "left-to-bootstrap"
    if not operation.unsettled():
        ctx.log.info("launch into a warm pool: left to the instance's bootstrap")
        return Outcome.DONE
    resolved = await resolve(ctx)
    if isinstance(resolved, Outcome):
        return resolved
    deadline = launch_ready_deadline(
        operation.events,
        timeout_s=settings.launch_ready_timeout_sec,
        now=parts.clock(),
        wall=datetime.now(UTC),
    )
    node = await _ready_node(ctx, resolved, deadline)
    if isinstance(node, Outcome):
        return node
    ctx.node = str(node["metadata"]["name"])
    ctx.bind(node=ctx.node)
    await completion_delay(ctx)
    if settings.dry_run:  # nothing to change in Kubernetes: the action is completed, as NTH does
        ctx.log.info("dry run: the node is Ready, its launch actions completed")
        await complete_actions(ctx, claim=None)
        parts.observer.node_action(NodeAction.POST_DRAIN, True)
        return Outcome.DONE
    text = f"{operation.first.kind} {operation.first.event_id} for instance {operation.instance_id}"
    await record_event(ctx, RECEIVED_REASONS[EventKind.ASG_LAUNCH_LIFECYCLE], text)
    if settings.uncordon_on_return:
        await _undo_on_return(ctx, draining, deadline)
    await report_step(ctx, complete_actions(ctx, claim=None), post_drain=True)  # NTH's launch PostDrain
    return Outcome.DONE


async def _ready_node(
    ctx: OperationContext, info: InstanceInfo | None, deadline: float
) -> dict[str, Any] | Outcome:
    """Poll (0.1 s backing off to 5 s) until the node is Ready or ``deadline`` (monotonic): the node, or the outcome."""
    operation, parts = ctx.operation, ctx.parts
    poll = 0.1
    while True:
        if info is None or info.state in INSTANCE_ENDED:
            return await _launch_over(ctx, info)
        for open_action in operation.unsettled():
            if parts.heartbeats.over(open_action):
                operation.settled[open_action.action_key] = LifecycleResult.NO_ACTIVE_ACTION
                ctx.log.info("launch action already over: acknowledged", hook=open_action.lifecycle_hook_name)
        if not operation.unsettled():
            parts.observer.operation_outcome(OperationOutcome.ACTION_OVER)
            return Outcome.DONE
        node = await _find(ctx, info)
        if node is not None and node_ready(node):
            ctx.info = info
            return node
        if parts.clock() >= deadline:
            if parts.drainer.writes.nodes is not None:  # the copy may lag (a paused process): ask once
                node = await parts.finder.find(info)
                if node is not None and node_ready(node):
                    ctx.info = info
                    return node
            return await _not_ready(ctx, node is not None)
        await asyncio.sleep(min(poll, max(deadline - parts.clock(), 0.0)))
        poll = min(poll * 1.5, 5.0)
        info = await parts.resolver.get(operation.instance_id)


async def _find(ctx: OperationContext, info: InstanceInfo) -> dict[str, Any] | None:
    """The instance's node: from the watched copy while current (polls must not spend the evictions' QPS)."""
    watched = ctx.parts.drainer.writes.nodes
    if watched is not None:
        await watched.wait_first_answer(FIRST_COPY_WAIT_S)
        if watched.live:
            provider = info.provider_id if ctx.parts.settings.use_provider_id else ""
            return watched.find(info.private_dns_name, provider)
    return await ctx.parts.finder.find(info)


async def _undo_on_return(ctx: OperationContext, draining: Draining, deadline: float) -> None:
    """Undo what we did to the Ready node when it carries our record for this instance (DESIGN.md rule 12), once
    no drain of it runs (:func:`_drains_over`): a launch out of a warm pool proves the return, another launch
    only a start since our cordon (:func:`~queue_processor.returns.came_back`)."""
    operation, parts = ctx.operation, ctx.parts
    watched = parts.drainer.writes.nodes
    copy = watched.get(ctx.node) if watched is not None else None
    if copy is not None and copy["metadata"]["labels"].get(RECORD_LABEL) != "true":
        return  # the watched copy shows no record of ours: nothing to undo, no read
    from_pool = any(action.origin == "WarmPool" for action in operation.launch_actions)
    if not await _drains_over(ctx, draining, deadline):
        ctx.log.warning(
            "a drain of the node still runs: left cordoned for the check for instances back in service",
            timeout_s=parts.settings.launch_ready_timeout_sec,
        )
        return

    def decide(found: dict[str, Any], record: CordonRecord) -> bool:
        leases = parts.leases
        drained_elsewhere = leases is not None and leases.held_elsewhere(ctx.node)
        if (
            record.instance_id != operation.instance_id
            or draining.here(operation.instance_id)
            or drained_elsewhere
        ):
            return False
        if record.pending(datetime.now(UTC)):
            ctx.log.info("back before the notice that reclaims it ends: left cordoned", ends=record.ends)
            return False
        return node_ready(found) and (from_pool or came_back(record, ctx.info, found))

    if await parts.drainer.writes.undo(ctx.node, decide):
        parts.observer.node_action(NodeAction.UNCORDON, True)
        ctx.log.info(
            "instance back in service: our cordon, taints and label undone", from_warm_pool=from_pool
        )


async def _drains_over(ctx: OperationContext, draining: Draining, deadline: float) -> bool:
    """Poll (0.1 s backing off to 2 s) until ``deadline`` (monotonic) or no drain of the node runs here or elsewhere (a
    live holder on another replica; a stop's late duplicate may drain it as it returns): whether none runs."""
    leases, clock = ctx.parts.leases, ctx.parts.clock

    async def being_drained() -> bool:
        if draining.here(ctx.operation.instance_id):
            return True
        return leases is not None and await leases.held_elsewhere_now(ctx.node)

    poll = 0.1
    try:
        while await being_drained():
            left = deadline - clock()
            if left <= 0:
                return False
            if ctx.node not in draining.waiting:
                draining.waiting.add(ctx.node)
                ctx.log.info("a drain of the node runs: its return waits for it")
            await asyncio.sleep(min(poll, left))
            poll = min(poll * 1.5, 2.0)
        return True
    finally:
        draining.waiting.discard(ctx.node)


async def _launch_over(ctx: OperationContext, info: InstanceInfo | None) -> Outcome:
    """The launching instance ended, and its actions with it: heartbeats stop, messages acknowledged."""
    return await not_ours(
        ctx,
        "launching instance terminated: its launch actions are over",
        OperationOutcome.INSTANCE_GONE,
        "instance-gone",
        state=info and info.state,
    )


async def _not_ready(ctx: OperationContext, registered: bool) -> Outcome:
    """LAUNCH_READY_TIMEOUT_SEC passed without a Ready node: complete each action with its hook's DefaultResult."""
    parts, operation = ctx.parts, ctx.operation
    parts.observer.operation_outcome(OperationOutcome.LAUNCH_NOT_READY)
    for action in operation.unsettled():
        result = await parts.heartbeats.lifecycle.default_result(
            action.auto_scaling_group_name, action.lifecycle_hook_name
        )
        ctx.log.warning(
            "node not Ready in time: launch action completed with its hook's DefaultResult",
            timeout_s=parts.settings.launch_ready_timeout_sec,
            registered=registered,
            hook=action.lifecycle_hook_name,
            result=result,
        )
        operation.settled[action.action_key] = await parts.heartbeats.complete(action, result)
    return Outcome.DONE
