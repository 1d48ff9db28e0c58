"""In which order a drain evicts pods, and with how much grace: pure (no I/O).

**Waves** (``DRAIN_ORDER=waves``). Ordinary pods are evicted first; *critical* pods — priority class
``system-cluster-critical`` or ``system-node-critical``, or ``spec.priority`` at or above a threshold
(``DRAIN_CRITICAL_PRIORITY``) — only once the ordinary ones are gone (or the time left is what the critical ones
need), so log shippers, service meshes and storage daemons outlive the pods that use them. ``all-at-once`` is
kubectl's and NTH's order: every pod in one wave. DaemonSet and mirror pods are never evicted either way (the
filters of :mod:`queue_processor.drain.filters` decide that). Priorities: "Pod Priority and Preemption",
https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/ (the two system classes are
2000001000 and 2000000000; user classes may go up to 1000000000).

**Per-workload policy.** The pod annotation ``queue-processor/drain`` (:data:`DRAIN_POLICY_ANNOTATION`, set
through a workload's pod template) chooses how a drain treats the pod (:class:`DrainPolicy`): ``evict`` (the
default), ``last`` (evicted in the last wave, whatever its priority and whatever DRAIN_ORDER: a pod that
must outlive its node's other pods without a cluster-wide priority) or ``surge`` (a Deployment's pod, evicted
once its replacement is available, with SURGE_DRAINS: :mod:`queue_processor.drain.surge`). Any other value is
reported, once per workload, and the pod is evicted as if the annotation were absent (:func:`drain_policy`,
:func:`workload_of`).

**Deadline-aware grace.** When the instance has a known end (a Spot or Capacity Reservation notice, an AWS
Health scheduled change), a pod's grace period (its own ``terminationGracePeriodSeconds``, or
POD_TERMINATION_GRACE_PERIOD) is cut so that it ends ``margin`` seconds before the instance does: a pod killed
by the kubelet at the end of a shorter grace is at least gone from the API server, with its replacement
scheduled, before the instance vanishes with the pod still "Terminating". The API server's eviction takes the
grace in ``deleteOptions.gracePeriodSeconds`` ("API-initiated Eviction",
https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/); a grace period is at least 1 s here
(0 would be a forced deletion, which the deadline step alone does).
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
    """With SURGE_DRAINS, a Deployment's pod is evicted only once a replacement is available elsewhere
    (:mod:`queue_processor.drain.surge`); in its wave as ``evict``. Without SURGE_DRAINS, or for a pod of
    another kind of workload, reported once per workload and evicted as ``evict``."""


def drain_policy(pod: Mapping[str, Any]) -> tuple[DrainPolicy, str | None]:
    """The pod's :class:`DrainPolicy` and, when its annotation names none, the annotation's value (to be
    reported; the pod then gets :attr:`DrainPolicy.EVICT`). Surrounding blanks are ignored; values are
    lower case. Never raises."""
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
    """``namespace/Kind/name`` of the workload a pod belongs to (for what is reported once per workload): its
    controller owner, a ReplicaSet named after its Deployment and pod-template hash counted as that
    Deployment; ``namespace/Pod/name`` for a pod without a controller. Never raises."""
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
    """Whether ``pod`` goes in the last wave: its ``spec.priorityClassName`` is one of
    :data:`CRITICAL_CLASSES`, or its ``spec.priority`` (set by the API server's Priority admission from the
    class) is at least ``threshold``. Missing or mistyped fields count as absent; never raises."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    if spec.get("priorityClassName") in CRITICAL_CLASSES:
        return True
    priority = spec.get("priority")
    return isinstance(priority, int) and not isinstance(priority, bool) and priority >= threshold


def wave_of(pod: Mapping[str, Any], order: DrainOrder, threshold: int = SYSTEM_CLUSTER_CRITICAL) -> int:
    """The wave ``pod`` is evicted in: 0 (ordinary, or every pod with ``all-at-once``) or 1 (critical, or
    annotated ``queue-processor/drain: last`` whatever the order)."""
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
    """``items`` split into waves, in eviction order, without empty waves; each wave keeps the input order.
    ``pod_of(item)`` gives the pod dict of an item."""
    split: list[list[_T]] = [[], []]
    for item in items:
        split[wave_of(pod_of(item), order, threshold)].append(item)
    return [wave for wave in split if wave]


def own_grace(pod: Mapping[str, Any], override_s: int = -1) -> int:
    """The grace period (seconds) an eviction gives ``pod`` without a deadline: ``override_s``
    (POD_TERMINATION_GRACE_PERIOD) when it is 0 or more, else the pod's ``terminationGracePeriodSeconds``
    (:data:`DEFAULT_GRACE_S` when absent or mistyped)."""
    if override_s >= 0:
        return override_s
    spec = pod.get("spec")
    value = spec.get("terminationGracePeriodSeconds") if isinstance(spec, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return DEFAULT_GRACE_S


def granted_grace(own_s: int, until_end_s: float | None, margin_s: float) -> tuple[int, bool]:
    """The grace period to ask for (seconds) and whether it was cut: ``own_s`` when the instance has no known
    end (``until_end_s`` is ``None``: seconds from now to the instance's end) or ``margin_s`` is negative (the
    cut is off), else ``own_s`` cut to end ``margin_s`` seconds before the instance does, rounded down and at
    least 1 s. A pod whose own grace is 0 keeps 0."""
    if until_end_s is None or margin_s < 0:
        return own_s, False
    room = max(1, math.floor(until_end_s - margin_s))
    if own_s <= room:
        return own_s, False
    return room, True
