"""Build a cluster in one call: nodes for EC2 instances, and the pods a drain has to get right.

For each instance, a Node named after its PrivateDnsName with providerID ``aws:///<az>/<instance-id>``; then
ReplicaSets with PodDisruptionBudgets (the pods a drain evicts), a DaemonSet (one pod per node, never
evicted), a mirror pod per node (never evicted), pods with emptyDir volumes (evicted only with
DELETE_LOCAL_DATA), and unreplicated pods (evicted by a forced drain only). Sizes are parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from queue_processor.sandbox.kube import KubeSandbox

__all__ = ["ClusterSpec", "Instance", "build_kubernetes"]


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
    - ``unreplicated_pods`` pods without a controller (``debug-<n>``).

    ``grace_s`` is every pod's terminationGracePeriodSeconds (simulated seconds).
    """

    apps: int = 10
    replicas_per_node: int = 1
    pdb_max_unavailable: int | str = 1
    daemonset: bool = True
    mirror_pods: bool = True
    empty_dir_pods: int = 1
    unreplicated_pods: int = 1
    grace_s: int = 5


def build_kubernetes(
    kube: KubeSandbox, instances: list[Instance], spec: ClusterSpec | None = None
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
    if spec.daemonset:
        kube.add_daemonset("kube-system", "node-agent", labels={"app": "node-agent"}, grace_s=spec.grace_s)
    for index in range(spec.apps):
        app = f"app-{index:03d}"
        kube.add_replicaset(
            "apps",
            app,
            nodes=names,
            replicas=len(names) * spec.replicas_per_node,
            labels={"app": app},
            grace_s=spec.grace_s,
        )
        kube.add_pdb("apps", app, match_labels={"app": app}, max_unavailable=spec.pdb_max_unavailable)
    if spec.mirror_pods:
        for name in names:
            kube.add_pod(
                "kube-system", f"kube-proxy-{name}", node=name, labels={"app": "kube-proxy"}, mirror=True
            )
    if spec.empty_dir_pods:
        kube.add_replicaset(
            "apps",
            "cache",
            nodes=names,
            replicas=spec.empty_dir_pods,
            labels={"app": "cache"},
            grace_s=spec.grace_s,
            empty_dir=True,
        )
    for index in range(spec.unreplicated_pods):
        kube.add_pod(
            "apps",
            f"debug-{index}",
            node=names[index % len(names)],
            labels={"app": "debug"},
            grace_s=spec.grace_s,
        )
    return names
