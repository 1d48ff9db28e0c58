"""Instances back in service (a stop and start, a warm pool): :class:`Returns` undoes exactly what we recorded on
their nodes (:class:`~queue_processor.drain.node_writes.CordonRecord`) once the instance is back and no operation for
it runs anywhere. A return from a *running* warm pool (same ``LaunchTime``) is the launch path's."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from queue_processor.aws import InstanceInfo, InstanceResolver
from queue_processor.drain.drainer import Drainer
from queue_processor.drain.node_writes import CordonRecord
from queue_processor.kube import KubeClient
from queue_processor.leases import NodeLeases
from queue_processor.observe.metrics import NULL_OBSERVER, Observer
from queue_processor.outcomes import NodeAction
from queue_processor.rest import AFTER_CORDONS, URGENT_RANK
from queue_processor.watch import RECORD_LABEL, NodeCache, node_ready

log = structlog.get_logger("queue_processor.returns")


def came_back(record: CordonRecord, info: InstanceInfo | None, node: dict[str, Any]) -> bool:
    """Whether the instance of a node we cordoned (``record``) is back, as EC2 (``info``) and the node say: running, a
    ``LaunchTime`` other than the recorded one, the node Ready, and no notice of the record still to reclaim it."""
    if info is None or info.state != "running" or info.launch_time is None or not record.launch_time:
        return False
    if record.pending(datetime.now(UTC)):
        return False
    return info.launch_time.isoformat() != record.launch_time and node_ready(node)


@dataclass
class Returns:
    """The periodic check every ``interval_s`` (RETURN_CHECK_INTERVAL_SEC). ``busy(instance_id)``: an operation for
    it runs here; ``leases``: another replica's node Leases; ``nodes``: the watched copy, read instead of a LIST."""

    kube: KubeClient
    drainer: Drainer
    resolver: InstanceResolver
    _: KW_ONLY
    busy: Callable[[str], bool]
    interval_s: float
    leases: NodeLeases | None = None
    observer: Observer = NULL_OBSERVER
    nodes: NodeCache | None = None

    def _decide(
        self, instance_id: str, info: InstanceInfo | None, node: dict[str, Any], now: CordonRecord
    ) -> bool:
        """On the node as read for the undo: still our record for ``instance_id``, no operation for it here or on
        another replica, and :func:`came_back`, so a new interruption is never undone."""
        return (
            now.instance_id == instance_id
            and not self.busy(instance_id)
            and not (self.leases is not None and self.leases.held_elsewhere(str(node["metadata"]["name"])))
            and came_back(now, info, node)
        )

    async def run(self) -> None:
        """Check every ``interval_s`` until cancelled; a failed check is logged and the next one comes."""
        URGENT_RANK.set(AFTER_CORDONS)
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a check must never take the controller down
                log.warning("check for instances back in service failed", error=repr(exc))

    async def check(self) -> list[str]:
        """One pass: the Ready nodes carrying our record (the watched copy, else one cached LIST), their instances
        described afresh, those back undone; the names undone. Raises :class:`KubeError`, or the AWS error."""
        watched = self.nodes.all() if self.nodes is not None else None
        if watched is None:
            nodes = await self.kube.list_nodes(f"{RECORD_LABEL}=true", cached=True)
        else:
            nodes = [node for node in watched if node["metadata"]["labels"].get(RECORD_LABEL) == "true"]
        candidates: list[tuple[dict[str, Any], CordonRecord]] = []
        for node in nodes:
            if not node_ready(node):
                continue  # not back, whatever EC2 says (came_back): no describe
            record = CordonRecord.from_node(node)
            if (
                record is not None
                and record.instance_id
                and not self.busy(record.instance_id)
                and not (
                    self.leases is not None
                    and await self.leases.held_elsewhere_now(str(node["metadata"]["name"]))
                )
            ):
                candidates.append((node, record))
        del nodes, watched  # a LIST's nodes whole: only the candidates are kept while the describes run
        infos = await self.resolver.get_many([record.instance_id for _, record in candidates], fresh=True)
        undone: list[str] = []
        for (node, record), info in zip(candidates, infos, strict=True):
            if not came_back(record, info, node):
                continue  # decided on the node as listed: no read
            name = str(node["metadata"]["name"])
            decide = functools.partial(self._decide, record.instance_id, info)
            if await self.drainer.writes.undo(name, decide):
                self.observer.node_action(NodeAction.UNCORDON, True)
                log.info(
                    "instance back in service: our cordon, taints and label undone",
                    node=name,
                    instance_id=record.instance_id,
                )
                undone.append(name)
        return undone
