"""Build a cluster in one call: nodes for EC2 instances, and the pods a drain has to get right.

For each instance, a Node named after its PrivateDnsName with providerID ``aws:///<az>/<instance-id>``; then
ReplicaSets with PodDisruptionBudgets (the pods a drain evicts), a DaemonSet (one pod per node, never
evicted), a mirror pod per node (never evicted), pods with emptyDir volumes (evicted only with
DELETE_LOCAL_DATA), and unreplicated pods (evicted by a forced drain only). Sizes are parameters.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "EVICTED_BY",
    "MANUAL_STATUS",
    "ClusterSpec",
    "Instance",
    "KubeCluster",
    "build_kubernetes",
    "drain_of",
    "eviction_record",
]

#: Annotation (value ``manual``) of a pod whose status the sandbox sets itself (a completed, pending or unready
#: pod, :meth:`KubeCluster.add_pod`): no kubelet runs it, so on either API server its deletion, once begun,
#: never finishes (KWOK disregards such pods; the emulation leaves them terminating).
MANUAL_STATUS = "sandbox.queue-processor.dev/status"
#: Annotation on each record of :attr:`KubeCluster.evictions` (never on the pod itself): the eviction request's
#: User-Agent, as the API server saw it (its audit log's ``userAgent`` on the real control plane).
EVICTED_BY = "sandbox.queue-processor.dev/evicted-by"


def eviction_record(pod: dict[str, Any], agent: str) -> dict[str, Any]:
    """A copy of ``pod`` for the eviction record, annotated with the request's User-Agent ``agent``."""
    record = copy.deepcopy(pod)
    metadata = record.setdefault("metadata", {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), EVICTED_BY: agent}
    return record


def drain_of(record: dict[str, Any]) -> str | None:
    """The drain that sent an eviction (``drain/<id>`` in its User-Agent, as queue-processor sends it), or
    ``None`` when it names none (another client: each of its evictions counts as a drain of its own)."""
    agent = ((record.get("metadata") or {}).get("annotations") or {}).get(EVICTED_BY) or ""
    for word in agent.split():
        if word.startswith("drain/"):
            return word.removeprefix("drain/")
    return None


class KubeCluster(Protocol):
    """What the sandbox needs of a Kubernetes side: the emulation
    (:class:`~queue_processor_sandbox.kube.KubeSandbox`) or a real control plane
    (:class:`~queue_processor_sandbox.real_kube.RealKube`). Durations are simulated seconds."""

    @property
    def url(self) -> str: ...

    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def kubeconfig(self, path: Path) -> Path: ...

    def add_node(
        self,
        name: str,
        *,
        provider_id: str = "",
        labels: dict[str, str] | None = None,
        register_after_s: float = 0.0,
        ready_after_s: float | None = 0.0,
    ) -> None: ...

    def wait_for_nodes(self, names: list[str], timeout_s: float = ...) -> None: ...

    def delete_node(self, name: str) -> None: ...

    def add_replicaset(
        self,
        namespace: str,
        name: str,
        *,
        nodes: list[str],
        replicas: int,
        labels: dict[str, str],
        grace_s: int = 30,
        empty_dir: bool = False,
        priority_class: str | None = None,
        wait: bool = True,
    ) -> list[str]: ...

    def add_daemonset(
        self,
        namespace: str,
        name: str,
        *,
        labels: dict[str, str],
        grace_s: int = 30,
        priority_class: str | None = None,
        wait: bool = True,
    ) -> None: ...

    def wait_for_ready_pods(self, namespace: str, labels: dict[str, str], count: int) -> None: ...

    def add_pdb(
        self,
        namespace: str,
        name: str,
        *,
        match_labels: dict[str, str],
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
        unhealthy_pod_eviction_policy: str | None = None,
    ) -> None: ...

    def set_pdb(
        self,
        namespace: str,
        name: str,
        *,
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
    ) -> None: ...

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        labels: dict[str, str] | None = None,
        grace_s: int = 30,
        empty_dir: bool = False,
        mirror: bool = False,
        phase: str = "Running",
        ready: bool = True,
        priority_class: str | None = None,
        annotations: dict[str, str] | None = None,
        wait: bool = True,
    ) -> None: ...

    def ensure_namespace(self, namespace: str) -> None: ...

    def objects(self, plural: str) -> list[dict[str, Any]]: ...

    def count(self, plural: str, predicate: Callable[[dict[str, Any]], bool]) -> int: ...

    def get(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None: ...

    @property
    def evictions(self) -> list[dict[str, Any]]: ...

    """Every pod an eviction deleted (HTTP 201, not a dry run), as it was just before, in order; each record
    carries the annotation :data:`EVICTED_BY`."""

    def denied(self) -> Counter[tuple[str, str]]: ...

    @property
    def requests(self) -> Any: ...

    @property
    def last_eviction(self) -> dict[str, Any]: ...

    @property
    def first_eviction(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Instance:
    """An EC2 instance as the cluster sees it: its node name is its PrivateDnsName."""

    instance_id: str
    private_dns_name: str
    availability_zone: str
    auto_scaling_group: str = ""
    instance_type: str = "m5.large"

    @property
    def provider_id(self) -> str:
        """``aws:///<az>/<instance-id>``, the Node's spec.providerID on AWS."""
        return f"aws:///{self.availability_zone}/{self.instance_id}"


@dataclass(frozen=True)
class ClusterSpec:
    """What to put on the nodes.

    - ``apps`` ReplicaSets (namespace ``apps``) with ``replicas_per_node`` pods per node each, spread over
      the nodes, each with a PodDisruptionBudget of ``pdb_max_unavailable`` (int or percentage);
    - a DaemonSet ``node-agent`` (namespace ``kube-system``) when ``daemonset``;
    - a mirror pod ``kube-proxy-<node>`` per node when ``mirror_pods``;
    - ``empty_dir_pods`` pods of a ReplicaSet ``cache`` with an emptyDir volume;
    - ``unreplicated_pods`` pods without a controller (``debug-<n>``);
    - ``last_pods`` pods without a controller annotated ``queue-processor/drain: last`` (``agent-<n>``, no
      priority of their own), spread over the nodes.

    ``grace_s`` is every pod's terminationGracePeriodSeconds (simulated seconds). The workloads go to
    ``namespace``, the DaemonSet and mirror pods to ``system_namespace``.
    """

    apps: int = 10
    replicas_per_node: int = 1
    pdb_max_unavailable: int | str = 1
    daemonset: bool = True
    mirror_pods: bool = True
    empty_dir_pods: int = 1
    unreplicated_pods: int = 1
    last_pods: int = 0
    grace_s: int = 5
    namespace: str = "apps"
    system_namespace: str = "kube-system"


def build_kubernetes(
    kube: KubeCluster, instances: list[Instance], spec: ClusterSpec | None = None
) -> list[str]:
    """Add a Ready Node for each instance and the workloads of ``spec``; returns the node names.

    Raises ``ValueError`` when there are no instances.
    """
    if not instances:
        raise ValueError("a cluster needs at least one instance")
    spec = spec or ClusterSpec()
    names = [instance.private_dns_name for instance in instances]
    for instance in instances:
        kube.add_node(
            instance.private_dns_name,
            provider_id=instance.provider_id,
            labels={
                "topology.kubernetes.io/zone": instance.availability_zone,
                "node.kubernetes.io/instance-type": instance.instance_type,
                **(
                    {"sandbox/auto-scaling-group": instance.auto_scaling_group}
                    if instance.auto_scaling_group
                    else {}
                ),
            },
        )
    kube.wait_for_nodes(names)
    # Everything is created first and waited for together (on a real control plane the controllers, the
    # scheduler and KWOK work on all of it at once); the budgets come last, computed over Ready pods.
    waits: list[tuple[str, dict[str, str], int]] = []
    if spec.daemonset:
        kube.add_daemonset(
            spec.system_namespace,
            "node-agent",
            labels={"app": "node-agent"},
            grace_s=spec.grace_s,
            wait=False,
        )
        waits.append((spec.system_namespace, {"app": "node-agent"}, len(names)))
    for index in range(spec.apps):
        app = f"app-{index:03d}"
        replicas = len(names) * spec.replicas_per_node
        kube.add_replicaset(
            spec.namespace,
            app,
            nodes=names,
            replicas=replicas,
            labels={"app": app},
            grace_s=spec.grace_s,
            wait=False,
        )
        waits.append((spec.namespace, {"app": app}, replicas))
    if spec.mirror_pods:
        for name in names:
            kube.add_pod(
                spec.system_namespace,
                f"kube-proxy-{name}",
                node=name,
                labels={"app": "kube-proxy"},
                mirror=True,
                wait=False,
            )
        waits.append((spec.system_namespace, {"app": "kube-proxy"}, len(names)))
    if spec.empty_dir_pods:
        kube.add_replicaset(
            spec.namespace,
            "cache",
            nodes=names,
            replicas=spec.empty_dir_pods,
            labels={"app": "cache"},
            grace_s=spec.grace_s,
            empty_dir=True,
            wait=False,
        )
        waits.append((spec.namespace, {"app": "cache"}, spec.empty_dir_pods))
    # Pods without a controller: plain ones (``debug-<n>``) and those annotated to go last (``agent-<n>``).
    loose: tuple[tuple[str, int, dict[str, str]], ...] = (
        ("debug", spec.unreplicated_pods, {}),
        ("agent", spec.last_pods, {"queue-processor/drain": "last"}),
    )
    for app, count, marks in loose:
        for index in range(count):
            kube.add_pod(
                spec.namespace,
                f"{app}-{index}",
                node=names[index % len(names)],
                labels={"app": app},
                grace_s=spec.grace_s,
                annotations=marks,
                wait=False,
            )
        if count:
            waits.append((spec.namespace, {"app": app}, count))
    for namespace, labels, count in waits:
        kube.wait_for_ready_pods(namespace, labels, count)
    for index in range(spec.apps):
        app = f"app-{index:03d}"
        kube.add_pdb(spec.namespace, app, match_labels={"app": app}, max_unavailable=spec.pdb_max_unavailable)
    return names
