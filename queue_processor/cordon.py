"""PreDrain and cordon of an operation's node in one write (unschedulable, NTH's taint per kind, the
exclude-from-load-balancers label, and the record of what we changed: :mod:`~queue_processor.drain.record`), the taints
of kinds that join later, and the instance facts every write of ours records."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from queue_processor.coalesce import NodeOperation
from queue_processor.config import Settings
from queue_processor.drain.node_writes import NodeWrites
from queue_processor.drain.record import CordonRecord
from queue_processor.events import EventKind
from queue_processor.nodes import InstanceInfo, InstanceResolver, NodeFinder
from queue_processor.observe.events import CORDON, PRE_DRAIN, RECEIVED_REASONS
from queue_processor.observe.observer import Observer
from queue_processor.outcomes import NodeAction
from queue_processor.rules import RULES, pre_drains
from queue_processor.steps import OperationContext

__all__ = ["EXCLUDE_FROM_LB_LABEL", "OUT_OF_SERVICE_TAINT", "Cordons"]

OUT_OF_SERVICE_TAINT = ("node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute")

EXCLUDE_FROM_LB_LABEL = (
    "node.kubernetes.io/exclude-from-external-load-balancers",
    "aws-node-termination-handler",
)


class Cordons:
    """An operation's writes on its node through ``writes``; ``event(ctx, reason, message)`` records a Kubernetes
    Event on it, ``clock`` returns monotonic seconds."""

    def __init__(
        self,
        settings: Settings,
        writes: NodeWrites,
        *,
        finder: NodeFinder,
        resolver: InstanceResolver,
        observer: Observer,
        clock: Callable[[], float],
        event: Callable[[OperationContext, str, str], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self.writes = writes
        self.finder = finder
        self.resolver = resolver
        self.observer = observer
        self.clock = clock
        self.event = event

    async def cordon(self, ctx: OperationContext) -> bool:
        """PreDrain and cordon in one write; ``False`` when there is no such node (an assumed name is looked up)."""
        operation, info = ctx.operation, ctx.info
        assert info is not None
        taints, labels = self.pre_drain(operation)
        ctx.tainted = set(operation.kinds)  # the kinds whose taints go out with the cordon
        about, writes = self.about(operation, info), self.writes
        if not await writes.cordon(ctx.node, taints=taints, labels_if_absent=labels, about=about):
            node = await self.finder.find(info) if ctx.assumed else None
            if node is None:
                return False
            ctx.node = str(node["metadata"]["name"])
            if not await writes.cordon(ctx.node, taints=taints, labels_if_absent=labels, about=about):
                return False
        for _ in taints:
            self.observer.node_action(NodeAction.TAINT, True)
        if labels:
            self.observer.node_action(NodeAction.EXCLUDE_FROM_LB, True)
        if pre_drains(operation.kinds):
            self.observer.node_action(NodeAction.PRE_DRAIN, True)
        if self.settings.cordon_only:
            self.observer.node_action(NodeAction.CORDON, True)
        self.observer.cordoned(self.clock() - operation.started_at)
        ctx.log.info("cordoned", node=ctx.node)
        for kind in operation.kinds:  # NTH's Event for each interruption taken up, then its steps'
            event_id = operation.event_of(kind).event_id
            text = f"{kind} {event_id} for instance {operation.instance_id}"
            await self.event(ctx, RECEIVED_REASONS[kind], text)
        if pre_drains(operation.kinds):
            await self.event(ctx, *PRE_DRAIN)
        if self.settings.cordon_only:
            await self.event(ctx, *CORDON)
        return True

    @staticmethod
    def about(operation: NodeOperation, info: InstanceInfo) -> CordonRecord:
        """The instance facts recorded with our cordon (:mod:`queue_processor.drain.record`): its ID, its
        ``LaunchTime`` (another later one means stopped and started since), whether bound for a warm pool, when."""
        return CordonRecord(
            instance_id=operation.instance_id,
            launch_time=info.launch_time.isoformat() if info.launch_time is not None else "",
            warm_pool=any(action.destination == "WarmPool" for action in operation.terminate_actions),
            since=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    def recorded(self, ctx: OperationContext) -> CordonRecord | None:
        """The instance facts every write of ours on the node records (:meth:`about`)."""
        return self.about(ctx.operation, ctx.info) if ctx.info is not None else None

    def pre_drain(self, operation: NodeOperation) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
        """PreDrain's node changes, sent with the cordon: NTH's taint per kind (TAINT_NODE; value: the event ID) and
        the exclude-from-load-balancers label, only where absent (as NTH: a value may be another's)."""
        labels: dict[str, str] = {}
        if self.settings.exclude_from_load_balancers and not self.settings.cordon_only:
            labels = dict([EXCLUDE_FROM_LB_LABEL])
        return self.taints(operation, operation.kinds), labels

    def taints(self, operation: NodeOperation, kinds: list[EventKind]) -> list[tuple[str, str, str]]:
        if not self.settings.taint_node:
            return []
        taints: list[tuple[str, str, str]] = []
        for kind in kinds:
            key = RULES[kind].taint_key
            if key is not None:
                taints.append((key, operation.event_of(kind).event_id, self.settings.taint_effect))
        return taints

    async def taint_joined(self, ctx: OperationContext) -> None:
        """Taint the node for the kinds that joined since its last taints (TAINT_NODE)."""
        new = [kind for kind in ctx.operation.kinds if kind not in ctx.tainted]
        for key, value, effect in self.taints(ctx.operation, new):
            await self.writes.taint(ctx.node, key, value, effect, about=self.recorded(ctx))
            self.observer.node_action(NodeAction.TAINT, True)
        ctx.tainted.update(new)

    async def record_start(self, ctx: OperationContext) -> None:
        """Record a ``LaunchTime`` newer than the cordon's, lest the return check take that start for a return."""
        if ctx.info is None or ctx.node is None:
            return
        try:
            now = await self.resolver.get(ctx.operation.instance_id, fresh=True)
        except Exception as exc:  # the joins after this one must still tighten the bounds
            ctx.log.warning("instance not read as an event joined: its record unchanged", error=repr(exc))
            return
        if now is None or now.launch_time is None or now.launch_time == ctx.info.launch_time:
            return
        ctx.info = now
        if not await self.writes.cordon(ctx.node, about=self.recorded(ctx)):
            ctx.log.info("node gone while an event joined: nothing to record")
