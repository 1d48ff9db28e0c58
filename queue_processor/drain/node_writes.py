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
from queue_processor.watch import FIRST_COPY_WAIT_S, NodeCache

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
        patch: dict[str, Any] = {"spec": {"unschedulable": True}}
        try:
            await self._read_modify_write(node, taints, patch, labels_if_absent or {}, about)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def taint(
        self, node: str, key: str, value: str, effect: str, *, about: CordonRecord | None = None
    ) -> None:
        """Add (or update) one taint, keeping the others, as :meth:`cordon`; recorded with ``about``'s instance
        facts when new. Raises :class:`KubeError` (404: the node is gone)."""
        await self._read_modify_write(node, [(key, value, effect)], {}, {}, about)

    async def undo(self, node: str, decide: Callable[[dict[str, Any], CordonRecord], bool]) -> bool:
        """Take back what the node's record says we changed, if ``decide(node, record)`` agrees: ``True`` when undone,
        ``False`` if the node is gone, has no record or ``decide`` declined; 409s retried, else :class:`KubeError`."""
        for attempt in range(TAINT_WRITE_ATTEMPTS):
            current = await self.kube.get_node(node)
            record = CordonRecord.from_node(current) if current is not None else None
            if current is None or record is None or not decide(current, record):
                return False
            try:
                await self.kube.patch_node(node, undo_patch(current, record))
                return True
            except KubeError as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409 or attempt == TAINT_WRITE_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        return False  # pragma: no cover - the loop returns or raises

    async def _read_modify_write(
        self,
        node: str,
        taints: Sequence[tuple[str, str, str]],
        patch: dict[str, Any],
        labels_if_absent: Mapping[str, str],
        about: CordonRecord | None = None,
    ) -> None:
        ours = [{"key": key, "value": value[:63], "effect": effect} for key, value, effect in taints]
        identities = {(taint["key"], taint["effect"]) for taint in ours}
        for attempt in range(TAINT_WRITE_ATTEMPTS):
            # First attempt: the watched copy, no read (a stale copy answers 409 and the next attempt reads).
            if attempt == 0 and self.nodes is not None:
                await self.nodes.first_answer(FIRST_COPY_WAIT_S)  # at start-up: the copy, not a GET per node
            current = self.nodes.get(node) if attempt == 0 and self.nodes is not None else None
            if current is None:
                current = await self.kube.get_node(node)
            if current is None:
                raise KubeError(404, "NotFound", f'nodes "{node}" not found')
            kept = [
                taint
                for taint in (current.get("spec") or {}).get("taints") or []
                if (taint.get("key"), taint.get("effect")) not in identities
            ]
            present = (current.get("metadata") or {}).get("labels") or {}
            metadata: dict[str, Any] = {"resourceVersion": current["metadata"]["resourceVersion"]}
            labels = {key: value for key, value in labels_if_absent.items() if key not in present}
            spec = dict(patch.get("spec", {}))
            record = recorded(
                current,
                unschedulable=bool(spec.get("unschedulable")),
                taints=sorted(identities),
                labels=labels,
                about=about,
            )
            if record is not None:
                metadata["annotations"] = {RECORD_ANNOTATION: record.to_json()}
                labels = {**labels, RECORD_LABEL: "true"}
            if labels:
                metadata["labels"] = labels
            if taints:
                spec["taints"] = kept + ours
            body = {**patch, "metadata": metadata, "spec": spec}
            try:
                await self.kube.patch_node(node, body)
                return
            except KubeError as exc:
                if exc.status != 409 or attempt == TAINT_WRITE_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
