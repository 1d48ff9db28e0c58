"""In which order a drain evicts pods, and with how much grace (pure).

DRAIN_ORDER=waves evicts *critical* pods (:func:`is_critical`) only once the others are gone or only their time is
left, so log shippers, meshes and storage daemons outlive their users ("Pod Priority and Preemption");
``all-at-once`` is kubectl's order. :data:`DRAIN_POLICY_ANNOTATION` picks a pod's :class:`DrainPolicy`. With a known
instance end a grace period is cut to end ``margin`` seconds before it, so the pod is gone from the API server before
the instance vanishes: ``deleteOptions.gracePeriodSeconds`` ("API-initiated Eviction"), at least 1 s (0 would be a
forced deletion, which only the deadline step does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, TypeVar

__all__ = [
    "CRITICAL_CLASSES",
    "DEFAULT_GRACE_S",
    "DRAIN_POLICY_ANNOTATION",
    "SYSTEM_CLUSTER_CRITICAL",
    "DrainOrder",
    "DrainPolicy",
    "drain_policy",
    "granted_grace",
    "is_critical",
    "own_grace",
    "wave_of",
    "waves",
    "workload_of",
]

#: spec.priority of the ``system-cluster-critical`` PriorityClass (``system-node-critical`` is 2000001000).
SYSTEM_CLUSTER_CRITICAL = 2_000_000_000

#: The PriorityClasses Kubernetes creates, whose pods are critical whatever their spec.priority says.
CRITICAL_CLASSES = frozenset({"system-cluster-critical", "system-node-critical"})

#: A pod's terminationGracePeriodSeconds when its spec has none (the API server's default).
DEFAULT_GRACE_S = 30


class DrainOrder(StrEnum):
    """DRAIN_ORDER: ``waves`` (ordinary pods, then critical ones) or ``all-at-once`` (kubectl's, NTH's)."""

    WAVES = "waves"
    ALL_AT_ONCE = "all-at-once"


#: The pod annotation that chooses a pod's :class:`DrainPolicy` (through its workload's pod template).
DRAIN_POLICY_ANNOTATION = "queue-processor/drain"


class DrainPolicy(StrEnum):
    """The values of :data:`DRAIN_POLICY_ANNOTATION`."""

    EVICT = "evict"
    """The default: evicted in its wave (by priority with DRAIN_ORDER=waves)."""
    LAST = "last"
    """Evicted in the last wave, once the node's other pods are gone, whatever its priority or DRAIN_ORDER."""
    SURGE = "surge"
    """With SURGE_DRAINS, a Deployment's pod is evicted in its wave once a replacement is available
    (:mod:`queue_processor.drain.surge`); otherwise reported once per workload and evicted as ``evict``."""


def drain_policy(pod: Mapping[str, Any]) -> tuple[DrainPolicy, str | None]:
    """The pod's :class:`DrainPolicy`, and the annotation's value when it names none (the pod then gets
    ``EVICT``). Surrounding blanks are ignored. Never raises."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    value = annotations.get(DRAIN_POLICY_ANNOTATION) if isinstance(annotations, Mapping) else None
    if value is None:
        return DrainPolicy.EVICT, None
    text = str(value).strip()
    try:
        return DrainPolicy(text), None
    except ValueError:
        return DrainPolicy.EVICT, text


def workload_of(pod: Mapping[str, Any]) -> str:
    """``namespace/Kind/name`` of the pod's controller owner (a ReplicaSet ``<deployment>-<pod-template-hash>``
    counts as its Deployment), or ``namespace/Pod/name`` without one. Never raises."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return "default/Pod/None"
    namespace = str(metadata.get("namespace") or "default")
    owners = metadata.get("ownerReferences")
    controllers = (
        [o for o in owners if isinstance(o, Mapping) and o.get("controller")]
        if isinstance(owners, list)
        else []
    )
    if not controllers:
        return f"{namespace}/Pod/{metadata.get('name')}"
    kind, name = str(controllers[0].get("kind")), str(controllers[0].get("name"))
    labels = metadata.get("labels")
    template_hash = labels.get("pod-template-hash") if isinstance(labels, Mapping) else None
    if kind == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
        return f"{namespace}/Deployment/{name.removesuffix(f'-{template_hash}')}"
    return f"{namespace}/{kind}/{name}"


def is_critical(pod: Mapping[str, Any], threshold: int = SYSTEM_CLUSTER_CRITICAL) -> bool:
    """Whether ``pod``'s priority class is in :data:`CRITICAL_CLASSES` or ``spec.priority`` ≥ ``threshold``."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    if spec.get("priorityClassName") in CRITICAL_CLASSES:
        return True
    priority = spec.get("priority")
    return isinstance(priority, int) and not isinstance(priority, bool) and priority >= threshold


def wave_of(pod: Mapping[str, Any], order: DrainOrder, threshold: int = SYSTEM_CLUSTER_CRITICAL) -> int:
    """The wave ``pod`` is evicted in: 1 when critical (with ``waves``) or annotated ``last``, else 0."""
    if drain_policy(pod)[0] is DrainPolicy.LAST:
        return 1
    return 1 if order is DrainOrder.WAVES and is_critical(pod, threshold) else 0


_T = TypeVar("_T")


def waves(
    items: Sequence[_T],
    order: DrainOrder,
    threshold: int = SYSTEM_CLUSTER_CRITICAL,
    *,
    pod_of: Callable[[_T], Mapping[str, Any]],
) -> list[list[_T]]:
    """``items`` split into non-empty waves in eviction order, input order kept; ``pod_of`` gives an item's pod."""
    split: list[list[_T]] = [[], []]
    for item in items:
        split[wave_of(pod_of(item), order, threshold)].append(item)
    return [wave for wave in split if wave]


def own_grace(pod: Mapping[str, Any], override_s: int = -1) -> int:
    """The grace (seconds) for ``pod`` without a deadline: ``override_s`` (POD_TERMINATION_GRACE_PERIOD) when
    ≥ 0, else its ``terminationGracePeriodSeconds`` (:data:`DEFAULT_GRACE_S` when absent or mistyped)."""
    if override_s >= 0:
        return override_s
    spec = pod.get("spec")
    value = spec.get("terminationGracePeriodSeconds") if isinstance(spec, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return DEFAULT_GRACE_S


def granted_grace(own_s: int, until_end_s: float | None, margin_s: float) -> tuple[int, bool]:
    """The grace to ask for (seconds) and whether it was cut: ``own_s`` cut to end ``margin_s`` before the instance's
    end (``until_end_s`` from now; ``None``: unknown, no cut; negative ``margin_s``: no cut), a cut one at least 1 s."""
    if until_end_s is None or margin_s < 0:
        return own_s, False
    room = max(1, math.floor(until_end_s - margin_s))
    if own_s <= room:
        return own_s, False
    return room, True
