"""What the controller changed on a Node, kept on the Node so it can be undone exactly (DESIGN.md rule 12).

Each write of ours records in :data:`RECORD_ANNOTATION` only what it changed, so a cordon somebody else made is never
undone. The JSON (:meth:`CordonRecord.to_json`) holds ``unschedulable``, ``taints`` (``[key, effect]``),
``replacedTaints`` (``[key, value, effect]``), ``labels``, ``instanceID``, ``launchTime``, ``warmPool``, ``since``.
EC2's ``LaunchTime`` is the latest launch or start ("Stop and start Amazon EC2 instances")."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["RECORD_ANNOTATION", "RECORD_LABEL", "CordonRecord", "recorded", "undo_patch"]

#: The Node annotation holding the :class:`CordonRecord` (JSON).
RECORD_ANNOTATION = "queue-processor/cordoned"
#: The Node label (value ``"true"``) on every node that carries a record: what a label selector lists.
RECORD_LABEL = "queue-processor/cordoned"


@dataclass(frozen=True)
class CordonRecord:
    """What the controller changed on one Node (``unschedulable``, ``taints`` added, ``replaced`` others' taints,
    ``labels`` added) and the instance then: ``instance_id``, ``launch_time`` and ``since`` (ISO 8601, ``""``:
    unknown), ``warm_pool`` (cordoned for a move into a warm pool)."""

    unschedulable: bool = False
    taints: tuple[tuple[str, str], ...] = ()
    replaced: tuple[tuple[str, str, str], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    instance_id: str = ""
    launch_time: str = ""
    warm_pool: bool = False
    since: str = ""

    @property
    def changed(self) -> bool:
        """Whether anything is recorded to undo."""
        return self.unschedulable or bool(self.taints) or bool(self.replaced) or bool(self.labels)

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
            )
        except (ValueError, TypeError, AttributeError):
            return None


def recorded(
    node: Mapping[str, Any],
    *,
    unschedulable: bool,
    taints: Iterable[tuple[str, str]],
    labels: Mapping[str, str],
    about: CordonRecord | None,
) -> CordonRecord | None:
    """The record ``node`` (as read before our write) should carry after it: its own plus what the write adds
    (``taints`` as ``(key, effect)``), with ``about``'s instance facts; ``None`` when there is nothing to record."""
    spec = node.get("spec") or {}
    present = {(t.get("key"), t.get("effect")): t for t in spec.get("taints") or []}
    existing = CordonRecord.from_node(node)
    record = existing or CordonRecord()
    known = set(record.taints) | {(key, effect) for key, _, effect in record.replaced}
    wanted = [taint for taint in taints if taint not in known]
    added_taints = [taint for taint in wanted if taint not in present]
    replaced = [
        (str(key), str(present[(key, effect)].get("value") or ""), str(effect))
        for key, effect in wanted
        if (key, effect) in present
    ]
    current_labels = (node.get("metadata") or {}).get("labels") or {}
    added_labels = {key: value for key, value in labels.items() if key not in current_labels}
    record = replace(
        record,
        unschedulable=record.unschedulable or (unschedulable and not spec.get("unschedulable")),
        taints=record.taints + tuple(added_taints),
        replaced=record.replaced + tuple(replaced),
        labels={**record.labels, **added_labels},
    )
    if about is not None:
        record = replace(
            record,
            instance_id=about.instance_id or record.instance_id,
            launch_time=about.launch_time or record.launch_time,
            warm_pool=about.warm_pool,
            since=record.since or about.since,
        )
    if existing is None and not record.changed:
        return None
    return record


def undo_patch(node: Mapping[str, Any], record: CordonRecord) -> dict[str, Any]:
    """The strategic-merge patch undoing ``record`` on ``node`` (as read now), with its ``resourceVersion`` so a
    concurrent change answers 409: our cordon, our taints (replaced ones restored; the list has no patch merge
    key), our labels still holding our value, and the record go; what others set stays."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    current_labels = metadata.get("labels") or {}
    labels: dict[str, Any] = {
        key: None for key, value in record.labels.items() if current_labels.get(key) == value
    }
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
        patch["spec"]["taints"] = kept + [
            {k: v for k, v in taint.items() if v or k != "value"} for taint in restored
        ]
    return patch
