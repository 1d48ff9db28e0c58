"""Node writes of a drain: cordon, taints and labels in one write, and their undo; a 409 is retried on a fresh read.
Each write records in :data:`~queue_processor.watch.RECORD_ANNOTATION` only what it changed: another's cordon stays.
The JSON (:meth:`CordonRecord.to_json`) holds ``unschedulable``, ``taints`` (``[key, effect]``), ``replacedTaints``
(``[key, value, effect]``), ``labels``, ``instanceID``, ``launchTime``, ``warmPool``, ``since``. EC2's ``LaunchTime``
is the latest launch or start ("Stop and start Amazon EC2 instances")."""

from __future__ import annotations

import asyncio
import functools
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from queue_processor.kube import KubeClient
from queue_processor.outcomes import KubeError
from queue_processor.watch import FIRST_COPY_WAIT_S, RECORD_ANNOTATION, RECORD_LABEL, NodeCache


@dataclass(frozen=True)
class CordonRecord:
    """What the controller changed on one Node (``unschedulable``, ``taints`` added, ``replaced`` others' taints,
    ``labels`` added) and the instance then: ``instance_id``, ``launch_time``, ``since``, ``ends`` (of a Spot or
    Capacity Reservation notice; ISO 8601, ``""``: unknown), ``warm_pool`` (cordoned for a move into a warm pool)."""

    unschedulable: bool = False
    taints: tuple[tuple[str, str], ...] = ()
    replaced: tuple[tuple[str, str, str], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    instance_id: str = ""
    launch_time: str = ""
    warm_pool: bool = False
    since: str = ""
    ends: str = ""

    def pending(self, now: datetime) -> bool:
        """Whether the notice the record names reclaims the instance after ``now`` (aware): a return before then
        does not hold ("Monitor interruptible Capacity Reservations", EC2 User Guide)."""
        try:
            return bool(self.ends) and datetime.fromisoformat(self.ends) > now
        except (ValueError, TypeError):
            return False

    def to_json(self) -> str:
        """The annotation's value (see the module)."""
        return json.dumps(
            {
                "unschedulable": self.unschedulable,
                "taints": [list(taint) for taint in self.taints],
                "replacedTaints": [list(taint) for taint in self.replaced],
                "labels": dict(self.labels),
                "instanceID": self.instance_id,
                "launchTime": self.launch_time,
                "warmPool": self.warm_pool,
                "since": self.since,
                **({"ends": self.ends} if self.ends else {}),
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> CordonRecord | None:
        """The record on ``node`` (API JSON), or ``None`` when it carries none or an unreadable one (not guessed)."""
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(RECORD_ANNOTATION)
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(
                unschedulable=bool(data.get("unschedulable")),
                taints=tuple((str(key), str(effect)) for key, effect in data.get("taints") or []),
                replaced=tuple(
                    (str(key), str(value), str(effect))
                    for key, value, effect in data.get("replacedTaints") or []
                ),
                labels={str(key): str(value) for key, value in (data.get("labels") or {}).items()},
                instance_id=str(data.get("instanceID") or ""),
                launch_time=str(data.get("launchTime") or ""),
                warm_pool=bool(data.get("warmPool")),
                since=str(data.get("since") or ""),
                ends=str(data.get("ends") or ""),
            )
        except (ValueError, TypeError, AttributeError):
            return None


def cordon_patch(
    node: Mapping[str, Any],
    *,
    unschedulable: bool,
    taints: Sequence[tuple[str, str, str]] = (),
    labels: Mapping[str, str] | None = None,
    about: CordonRecord | None = None,
) -> dict[str, Any]:
    """The strategic-merge patch of our write on ``node`` (as read now; its ``resourceVersion``: a concurrent change
    answers 409): ``unschedulable`` if asked, ``taints`` (``(key, value, effect)``, the node's others kept), the
    ``labels`` it lacks, and the node's record plus what this write adds (with ``about``'s instance facts), if any."""
    metadata, spec = node.get("metadata") or {}, node.get("spec") or {}
    ours = [{"key": key, "value": value[:63], "effect": effect} for key, value, effect in taints]
    wanted = sorted({(taint["key"], taint["effect"]) for taint in ours})
    present = {(t.get("key"), t.get("effect")): t for t in spec.get("taints") or []}
    existing = CordonRecord.from_node(node)
    record = existing or CordonRecord()
    known = set(record.taints) | {(key, effect) for key, _, effect in record.replaced}
    new = [taint for taint in wanted if taint not in known]
    added = {key: value for key, value in (labels or {}).items() if key not in (metadata.get("labels") or {})}
    about = about or record  # no instance facts: the record's own
    record = replace(
        record,
        unschedulable=record.unschedulable or (unschedulable and not spec.get("unschedulable")),
        taints=record.taints + tuple(taint for taint in new if taint not in present),
        replaced=record.replaced
        + tuple(
            (str(k), str(present[(k, e)].get("value") or ""), str(e)) for k, e in new if (k, e) in present
        ),
        labels={**record.labels, **added},
        instance_id=about.instance_id or record.instance_id,
        launch_time=about.launch_time or record.launch_time,
        warm_pool=about.warm_pool,
        since=record.since or about.since,
        ends=about.ends or record.ends,
    )
    patch: dict[str, Any] = {
        "metadata": {"resourceVersion": metadata.get("resourceVersion")},
        "spec": {"unschedulable": True} if unschedulable else {},
    }
    if existing is not None or record.unschedulable or record.taints or record.replaced or record.labels:
        patch["metadata"]["annotations"] = {RECORD_ANNOTATION: record.to_json()}
        added = {**added, RECORD_LABEL: "true"}
    if added:
        patch["metadata"]["labels"] = added
    if ours:
        kept = [t for t in spec.get("taints") or [] if (t.get("key"), t.get("effect")) not in wanted]
        patch["spec"]["taints"] = kept + ours
    return patch


def undo_patch(node: Mapping[str, Any], record: CordonRecord) -> dict[str, Any]:
    """The strategic-merge patch undoing ``record`` on ``node`` (as read now; its ``resourceVersion``: 409 on a change):
    our cordon, taints (the whole list: no patch merge key), labels still our value, and the record go; others' stay."""
    metadata, spec = node.get("metadata") or {}, node.get("spec") or {}
    current = metadata.get("labels") or {}
    labels: dict[str, Any] = {key: None for key, value in record.labels.items() if current.get(key) == value}
    labels[RECORD_LABEL] = None
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "annotations": {RECORD_ANNOTATION: None},
            "labels": labels,
        },
        "spec": {},
    }
    if record.unschedulable:
        patch["spec"]["unschedulable"] = False
    ours = set(record.taints) | {(key, effect) for key, _, effect in record.replaced}
    taints = spec.get("taints") or []
    kept = [t for t in taints if (t.get("key"), t.get("effect")) not in ours]
    restored = [{"key": key, "value": value, "effect": effect} for key, value, effect in record.replaced]
    if len(kept) != len(taints) or restored:
        patch["spec"]["taints"] = kept + [{k: v for k, v in t.items() if v or k != "value"} for t in restored]
    return patch


#: Attempts of a node write, each on a fresh read after a 409 Conflict.
TAINT_WRITE_ATTEMPTS = 8


class NodeWrites:
    """Cordons, taints and their undo; ``nodes``: the watched copy a first attempt writes on (``None``: a GET each)."""

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
        """Cordon the node (idempotent), adding ``taints`` (``(key, value, effect)``) and the ``labels_if_absent`` it
        lacks in one write, recorded with ``about``'s facts for :meth:`undo`. ``False``: no node; raises KubeError."""
        body = functools.partial(
            cordon_patch, unschedulable=True, taints=taints, labels=labels_if_absent, about=about
        )
        return await self._patch(node, body, cached=True)

    async def taint(
        self, node: str, key: str, value: str, effect: str, *, about: CordonRecord | None = None
    ) -> None:
        """Add or update one taint as :meth:`cordon` does, keeping the others; :class:`KubeError` (404: node gone)."""
        body = functools.partial(
            cordon_patch, unschedulable=False, taints=[(key, value, effect)], about=about
        )
        if not await self._patch(node, body, cached=True):
            raise KubeError(404, "NotFound", f'nodes "{node}" not found')

    async def undo(self, node: str, decide: Callable[[dict[str, Any], CordonRecord], bool]) -> bool:
        """Take back what the node's record says we changed, if ``decide(node, record)`` agrees: ``True`` when undone,
        ``False`` if the node is gone, has no record or ``decide`` declined; 409s retried, else :class:`KubeError`."""

        def undo_body(current: dict[str, Any]) -> dict[str, Any] | None:
            record = CordonRecord.from_node(current)
            return None if record is None or not decide(current, record) else undo_patch(current, record)

        return await self._patch(node, undo_body, cached=False)

    async def _patch(
        self, node: str, body_of: Callable[[dict[str, Any]], dict[str, Any] | None], *, cached: bool
    ) -> bool:
        """Patch the node with ``body_of(node as read)``, 409s retried on a fresh read (:data:`TAINT_WRITE_ATTEMPTS`;
        ``cached``: first on the watched copy): ``True`` if written, ``False`` if gone or ``None``; raises KubeError."""
        for attempt in range(TAINT_WRITE_ATTEMPTS):
            current = None
            if attempt == 0 and cached and self.nodes is not None:
                await self.nodes.wait_first_answer(FIRST_COPY_WAIT_S)
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
