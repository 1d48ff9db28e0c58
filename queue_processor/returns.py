"""Instances back in service: what we did to their nodes is undone (DESIGN.md rule 12).

A node cordoned and tainted when its instance was stopped (a state change, a Spot stop or hibernate, an AWS
Health scheduled stop) or moved into a warm pool keeps ``spec.unschedulable``, our taints and the
exclude-from-load-balancers label when the instance comes back and its kubelet registers the same Node Ready
again: capacity nothing can be scheduled on. Every write of ours records on the Node what it changed
(:mod:`queue_processor.drain.record`); :class:`Returns` takes it back, and only it, when the instance is back:

- every RETURN_CHECK_INTERVAL_SEC it reads the nodes carrying our record from the watched copy of the nodes
  (:class:`~queue_processor.drain.node_cache.NodeCache`; while that is not current, one LIST with a label
  selector, from the API server's cache) and describes the instances of those that are Ready (batched
  DescribeInstances, fresh); only a node that looks back as read is read again, for its undo (the others cost
  no request). After a storm thousands of nodes carry our record until their instances are gone: the LIST
  would hold them all whole at once, every interval, and a task per instance would wait for the describes;
- an instance is back when EC2 says it is ``running`` and its ``LaunchTime`` differs from the one recorded
  with our cordon (EC2 reports the most recent launch or start: it was stopped and started since), and its
  node is ``Ready``;
- a node whose instance has an operation in flight here, or whose node Lease another replica holds (its drain
  runs or waits for its turn there: :meth:`NodeLeases.held_elsewhere_now
  <queue_processor.leases.NodeLeases.held_elsewhere_now>`; a Lease left by a replica that is gone holds
  nothing), is left alone, and the decision is made again on the
  node as read for the write (a cordon by another replica since then records the current ``LaunchTime``, and
  the write carries the read ``resourceVersion``), so a new interruption is never undone.

A warm-pool move out of a *running* pool stops nothing, so its ``LaunchTime`` does not change: that return is
seen by its launch lifecycle action (``Origin`` ``WarmPool``, ``Destination`` ``AutoScalingGroup``), whose
handling undoes the record once the node is Ready (:meth:`queue_processor.handler.Handler`'s launch path).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import structlog

from queue_processor.drain.drainer import Drainer
from queue_processor.drain.node_cache import NodeCache
from queue_processor.drain.record import RECORD_LABEL, CordonRecord
from queue_processor.kube import AFTER_CORDONS, KubeClient, rank_urgent
from queue_processor.leases import NodeLeases
from queue_processor.nodes import InstanceInfo, InstanceResolver, node_ready
from queue_processor.observe.observer import NULL_OBSERVER, Observer
from queue_processor.outcomes import NodeAction

__all__ = ["Returns", "came_back"]

log = structlog.get_logger("queue_processor.returns")


def came_back(record: CordonRecord, info: InstanceInfo | None, node: dict[str, Any]) -> bool:
    """Whether the instance of a node we cordoned (``record``) is back in service, as EC2 (``info``) and the
    node say now: running, started since our cordon (a ``LaunchTime`` other than the recorded one; a record
    without one proves nothing), and its node Ready (pure)."""
    if info is None or info.state != "running" or info.launch_time is None or not record.launch_time:
        return False
    return info.launch_time.isoformat() != record.launch_time and node_ready(node)


class Returns:
    """The periodic check of :mod:`this module <queue_processor.returns>`. ``busy(instance_id)`` says whether
    an operation for that instance is in flight here; ``leases`` (NODE_LEASES) whether another replica holds
    the node's Lease (:meth:`NodeLeases.held_elsewhere_now`); ``interval_s`` is RETURN_CHECK_INTERVAL_SEC;
    ``observer`` counts each undo (``node_action="uncordon"``); ``nodes``, the watched copy of the nodes, is
    read instead of a LIST while it is current."""

    def __init__(
        self,
        kube: KubeClient,
        drainer: Drainer,
        resolver: InstanceResolver,
        *,
        busy: Callable[[str], bool],
        leases: NodeLeases | None = None,
        interval_s: float,
        observer: Observer = NULL_OBSERVER,
        nodes: NodeCache | None = None,
    ) -> None:
        self.kube = kube
        self.drainer = drainer
        self.resolver = resolver
        self.busy = busy
        self.leases = leases
        self.interval_s = interval_s
        self.observer = observer
        self.nodes = nodes

    def _decide(
        self, instance_id: str, info: InstanceInfo | None, node: dict[str, Any], now: CordonRecord
    ) -> bool:
        """On the node as read for the undo: still our record for ``instance_id``, no operation for it in
        flight here or on another replica, and the instance came back (:func:`came_back`)."""
        return (
            now.instance_id == instance_id
            and not self.busy(instance_id)
            and not (self.leases is not None and self.leases.held_elsewhere(str(node["metadata"]["name"])))
            and came_back(now, info, node)
        )

    async def run(self) -> None:
        """Check every ``interval_s`` until cancelled; a failed check is logged and the next one comes."""
        rank_urgent(AFTER_CORDONS)
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a check must never take the controller down
                log.warning("check for instances back in service failed", error=repr(exc))

    async def check(self) -> list[str]:
        """One pass: the names of the nodes whose record was undone. Raises :class:`KubeError` when the nodes
        cannot be listed, and the AWS error when the instances cannot be described."""
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
                continue  # decided on the node as listed: no read (a storm leaves a thousand drained nodes)
            name = str(node["metadata"]["name"])
            decide = functools.partial(self._decide, record.instance_id, info)
            if await self.drainer.undo(name, decide):
                self.observer.node_action(NodeAction.UNCORDON, True)
                log.info(
                    "instance back in service: our cordon, taints and label undone",
                    node=name,
                    instance_id=record.instance_id,
                )
                undone.append(name)
        return undone
