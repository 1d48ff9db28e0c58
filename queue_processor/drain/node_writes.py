"""Node writes of a drain: cordon, taints and labels in one write, recorded in the node's
:class:`~queue_processor.drain.record.CordonRecord`, and their undo; a 409 Conflict is retried on a fresh read."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from queue_processor.drain.record import RECORD_ANNOTATION, RECORD_LABEL, CordonRecord, recorded, undo_patch
from queue_processor.kube import KubeClient
from queue_processor.outcomes import KubeError
from queue_processor.watch.node_cache import FIRST_COPY_WAIT_S, NodeCache

#: Attempts of a node write, each on a fresh read after a 409 Conflict.
TAINT_WRITE_ATTEMPTS = 8


class NodeWrites:
    """Cordons, taints and their undo through ``kube``; ``nodes``: the watched copy a first attempt writes on
    without reading the node (``None``: a GET per write)."""

    def __init__(self, kube: KubeClient, nodes: NodeCache | None = None) -> None:
        self.kube = kube
        self.nodes = nodes

    async def cordon(
        self,
        node: str,
        *,
        taints: Sequence[tuple[str, str, str]] = (),
        labels_if_absent: Mapping[str, str] | None = None,
        about: CordonRecord | None = None,
    ) -> bool:
        """Mark the node unschedulable and, in the same write, add ``taints`` (``(key, value, effect)``) and the
        ``labels_if_absent`` it lacks, recorded (with ``about``'s instance facts) for :meth:`undo`; idempotent. A
        read-modify-write (``spec.taints`` has no patch merge key), retried on a 409 (:data:`TAINT_WRITE_ATTEMPTS`).
        ``False`` when the node does not exist; raises :class:`KubeError` otherwise."""
        return await self._write(node, taints, labels_if_absent or {}, about, unschedulable=True)

    async def taint(
        self, node: str, key: str, value: str, effect: str, *, about: CordonRecord | None = None
    ) -> None:
        """Add (or update) one taint, keeping the others, as :meth:`cordon`; recorded with ``about``'s instance
        facts when new. Raises :class:`KubeError` (404: the node is gone)."""
        if not await self._write(node, [(key, value, effect)], {}, about, unschedulable=False):
            raise KubeError(404, "NotFound", f'nodes "{node}" not found')

    async def undo(self, node: str, decide: Callable[[dict[str, Any], CordonRecord], bool]) -> bool:
        """Take back what the node's record says we changed, if ``decide(node, record)`` agrees: ``True`` when undone,
        ``False`` if the node is gone, has no record or ``decide`` declined; 409s retried, else :class:`KubeError`."""

        def undo_body(current: dict[str, Any]) -> dict[str, Any] | None:
            record = CordonRecord.from_node(current)
            return None if record is None or not decide(current, record) else undo_patch(current, record)

        return await self._patch(node, undo_body, cached=False)

    async def _write(
        self,
        node: str,
        taints: Sequence[tuple[str, str, str]],
        labels_if_absent: Mapping[str, str],
        about: CordonRecord | None,
        *,
        unschedulable: bool,
    ) -> bool:
        ours = [{"key": key, "value": value[:63], "effect": effect} for key, value, effect in taints]
        identities = {(taint["key"], taint["effect"]) for taint in ours}

        def write_body(current: dict[str, Any]) -> dict[str, Any]:
            present = (current.get("metadata") or {}).get("labels") or {}
            metadata: dict[str, Any] = {"resourceVersion": current["metadata"]["resourceVersion"]}
            labels = {key: value for key, value in labels_if_absent.items() if key not in present}
            spec: dict[str, Any] = {"unschedulable": True} if unschedulable else {}
            record = recorded(
                current, unschedulable=unschedulable, taints=sorted(identities), labels=labels, about=about
            )
            if record is not None:
                metadata["annotations"] = {RECORD_ANNOTATION: record.to_json()}
                labels = {**labels, RECORD_LABEL: "true"}
            if labels:
                metadata["labels"] = labels
            if taints:
                spec["taints"] = [
                    taint
                    for taint in (current.get("spec") or {}).get("taints") or []
                    if (taint.get("key"), taint.get("effect")) not in identities
                ] + ours
            return {"metadata": metadata, "spec": spec}

        return await self._patch(node, write_body, cached=True)

    async def _patch(
        self, node: str, body_of: Callable[[dict[str, Any]], dict[str, Any] | None], *, cached: bool
    ) -> bool:
        """Patch the node with ``body_of(node as read)`` (``None``: nothing to write), each 409 Conflict retried on
        a fresh read (:data:`TAINT_WRITE_ATTEMPTS`); ``cached``: the first attempt writes on the watched copy. ``True``
        once written, ``False`` when the node is gone or there is nothing to write; raises :class:`KubeError`."""
        for attempt in range(TAINT_WRITE_ATTEMPTS):
            current = None
            if attempt == 0 and cached and self.nodes is not None:  # a stale copy answers 409: the next reads
                await self.nodes.first_answer(FIRST_COPY_WAIT_S)  # at start-up: the copy, not a GET per node
                current = self.nodes.get(node)
            if current is None:
                current = await self.kube.get_node(node)
            body = None if current is None else body_of(current)
            if body is None:
                return False
            try:
                await self.kube.patch_node(node, body)
                return True
            except KubeError as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409 or attempt == TAINT_WRITE_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        return False  # pragma: no cover - the loop returns or raises
