"""Kubernetes Events on the Node, when EMIT_KUBERNETES_EVENTS: what the controller did and why, where
``kubectl describe node`` shows it ("Event" v1 in the Kubernetes API reference).

Best effort: an Event that cannot be written is logged and counted, never a reason to fail a drain.
"""

from __future__ import annotations

from datetime import UTC, datetime

import structlog

from queue_processor.kube import KubeClient, KubeError

__all__ = ["NodeEventRecorder"]

log = structlog.get_logger("queue_processor.events")


class NodeEventRecorder:
    """Writes core/v1 Events about Nodes into ``namespace`` (``default``, where node events live) when
    ``enabled``; ``component`` is the Event's source."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        enabled: bool,
        namespace: str = "default",
        component: str = "queue-processor",
    ) -> None:
        self.kube = kube
        self.enabled = enabled
        self.namespace = namespace
        self.component = component
        self.failures = 0

    async def record(self, node: str, reason: str, message: str, *, warning: bool = False) -> None:
        """One Event on ``node`` (``reason`` in CamelCase, e.g. ``Cordon``, ``Drain``, ``DrainFailed``)."""
        if not self.enabled:
            return
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node}.", "namespace": self.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self.component,
        }
        try:
            await self.kube.create_event(self.namespace, event)
        except KubeError as exc:
            self.failures += 1
            log.warning("could not record a Kubernetes Event", node=node, reason=reason, error=str(exc))
