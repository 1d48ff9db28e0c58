"""What the controller changed on a Node, kept on the Node itself so it can be undone exactly (pure, no I/O).

DESIGN.md rule 12: when an instance we cordoned comes back into service (a warm-pool return, a stop followed by
a start) and its node is Ready, our cordon, taints and label go; what others set stays. Every write of ours to
a Node (the cordon with PreDrain's taints and label, taints of kinds that join, the out-of-service taint)
records in the annotation :data:`RECORD_ANNOTATION` only what that write changed: ``spec.unschedulable`` when
the node was schedulable before, each taint (key and effect) the node did not carry, the value of a taint of
the same key and effect that somebody else had set and our write replaced (NTH's taint keys may be set by NTH
itself), each label it did not have. A cordon somebody else made before us is therefore never recorded, and
never undone. The label :data:`RECORD_LABEL` marks the recorded nodes so they can be listed with a label
selector.

The annotation's value is JSON (:meth:`CordonRecord.to_json`)::

    {"unschedulable": true, "taints": [["aws-node-termination-handler/spot-itn", "NoSchedule"]],
     "replacedTaints": [],
     "labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "aws-node-termination-handler"},
     "instanceID": "i-0abc", "launchTime": "2026-11-25T18:00:00+00:00", "warmPool": false,
     "since": "2026-11-25T19:00:00+00:00"}

``launchTime`` is the instance's EC2 ``LaunchTime`` when it was cordoned: EC2 reports the most recent launch or
start ("Stop and start Amazon EC2 instances"), so a different ``LaunchTime`` later means the instance was
stopped and started since, with no clock of ours compared to AWS's. ``warmPool``: the cordon was for a
terminate action headed for a warm pool, whose return is a launch action out of the pool.
"""

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
    """What the controller changed on one Node: ``unschedulable`` (it set ``spec.unschedulable``), ``taints``
    (``(key, effect)`` pairs it added), ``replaced`` (``(key, value, effect)``: taints of somebody else's that a
    taint of ours with the same key and effect replaced), ``labels`` (``{key: value}`` it added), and what it
    knew of the
    instance then: ``instance_id``, ``launch_time`` (EC2's ``LaunchTime``, ISO 8601, ``""`` when unknown),
    ``warm_pool`` (cordoned for a move into a warm pool), ``since`` (when it was first recorded, ISO 8601)."""

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
        """The annotation's value (see the module docstring)."""
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
        """The record on ``node`` (a Node in the API's JSON shape), ``None`` when it carries none or an
        unreadable one (a record somebody edited by hand is left alone rather than guessed at)."""
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
    """The record ``node`` (as read before a write of ours) should carry after that write: what it carries
    already, plus what the write changes that the node did not have (``unschedulable``: the write sets
    ``spec.unschedulable``; ``taints``: ``(key, effect)`` it writes; ``labels``: those it adds), with the
    instance facts of ``about`` (``instance_id``, ``launch_time``, ``warm_pool``, ``since`` when new) when
    given. ``None`` when there is nothing to record (the write changes nothing the node did not have, and no
    record is there)."""
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
    """The strategic-merge patch that undoes ``record`` on ``node`` (as read now), with its
    ``resourceVersion`` so a concurrent change answers 409: ``spec.unschedulable: false`` when we set it;
    ``spec.taints`` without ours, and with the taints ours replaced as they were (the list is replaced: it has
    no patch merge key); each label we added and
    that still has the value we gave it removed; the record's annotation and label removed. Taints, labels
    and a cordon somebody else added are kept."""
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
