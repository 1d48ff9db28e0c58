"""Kubernetes Events ("Event" v1) on nodes and pods, when EMIT_KUBERNETES_EVENTS, with the reasons, messages and
annotations of aws-node-termination-handler v1.25.6 (``pkg/observability/k8s-events.go``). Best effort: an
Event that cannot be written is logged, never a reason to fail a drain."""

from __future__ import annotations

from datetime import UTC, datetime

import structlog

from queue_processor.events import EventKind
from queue_processor.kube import KubeClient
from queue_processor.outcomes import KubeError

log = structlog.get_logger("queue_processor.events")

#: The reason of the Event recorded when an interruption is taken up (NTH's; the Capacity Reservation one is ours).
RECEIVED_REASONS: dict[EventKind, str] = {
    EventKind.SPOT_INTERRUPTION: "SpotInterruption",
    EventKind.REBALANCE_RECOMMENDATION: "RebalanceRecommendation",
    EventKind.ASG_TERMINATE_LIFECYCLE: "ASGLifecycle",
    EventKind.ASG_LAUNCH_LIFECYCLE: "UnknownInterruption",
    EventKind.STATE_CHANGE: "StateChange",
    EventKind.SCHEDULED_CHANGE: "ScheduledEvent",
    EventKind.CAPACITY_RESERVATION_INTERRUPTION: "CapacityReservationInterruption",
}

#: NTH's (reason, message) of each step's success; a failure is ``<reason>Error``, ``<error message>: <why>``.
PRE_DRAIN = ("PreDrain", "Pre-drain task successfully executed")
CORDON = ("Cordon", "Node successfully cordoned")
CORDON_ERROR = "There was a problem while trying to cordon the node"
CORDON_AND_DRAIN = ("CordonAndDrain", "Node successfully cordoned and drained")
CORDON_AND_DRAIN_ERROR = "There was a problem while trying to cordon and drain the node"
CANCEL_DRAIN = ("CancelDrain", "Early exit task successfully executed")
POST_DRAIN = ("PostDrain", "Post-drain task successfully executed")
POST_DRAIN_ERROR = "There was a problem executing the post-drain task"
#: On a pod, once its eviction was accepted.
POD_EVICTION = ("PodEviction", "Pod evicted due to node drain (node {node})")
#: Ours, on a pod (Warning), the first of its workload whose ``queue-processor/drain`` names no policy.
UNKNOWN_DRAIN_POLICY = "UnknownDrainPolicy"
#: Ours, on a pod (Warning), the first of its workload annotated ``surge`` where a surge cannot be made.
SURGE_NOT_POSSIBLE = "SurgeNotPossible"
#: Ours, on a pod (Warning), once DELETE_AT_DEADLINE deleted it.
POD_DELETED_AT_DEADLINE = (
    "PodDeletedAtDeadline",
    "Pod still on node {node} at the drain's deadline, deleted (grace period 0) before its instance ends",
)


class NodeEventRecorder:
    """Writes core/v1 Events (source ``queue-processor``): about Nodes into ``default``, about pods into theirs;
    ``annotations`` go on every Event. Built only with EMIT_KUBERNETES_EVENTS."""

    def __init__(self, kube: KubeClient, *, annotations: dict[str, str] | None = None) -> None:
        self.kube = kube
        self.annotations = dict(annotations or {})

    async def record(
        self,
        node: str,
        reason: str,
        message: str,
        *,
        warning: bool = False,
        facts: dict[str, str] | None = None,
    ) -> None:
        """One Event on ``node``; ``facts`` (NTH's per-node annotations) win over the extra ones, as in NTH."""
        involved = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node}  # kubectl's node events
        await self._create(involved, reason, message, warning, {**self.annotations, **(facts or {})})

    async def record_pod(
        self, namespace: str, name: str, reason: str, message: str, *, warning: bool = False
    ) -> None:
        """One Event on the pod ``namespace/name``, in its namespace."""
        involved = {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace}
        await self._create(involved, reason, message, warning, self.annotations)

    async def _create(
        self, involved: dict[str, str], reason: str, message: str, warning: bool, annotations: dict[str, str]
    ) -> None:
        """One Event about ``involved``, in its namespace (a Node's: ``default``)."""
        name, namespace = involved["name"], involved.get("namespace", "default")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{name}.",
                "namespace": namespace,
                **({"annotations": annotations} if annotations else {}),
            },
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "queue-processor"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "queue-processor",
        }
        try:
            await self.kube.create_event(namespace, event)
        except KubeError as exc:
            log.warning("could not record a Kubernetes Event", object=name, reason=reason, error=str(exc))
