"""The whole sandbox in one object: AWS, Kubernetes, a cluster spanning both, and scenarios.

:class:`Sandbox` starts :class:`~queue_processor_sandbox.aws.AwsSandbox` (queue, dead-letter queue, the
standard EventBridge rules, Auto Scaling groups with lifecycle hooks) and
:class:`~queue_processor_sandbox.kube.KubeSandbox` (a Node per instance and the workloads of a
:class:`~queue_processor_sandbox.cluster.ClusterSpec`), keeps the two in step the way a real cluster does (a
launched instance registers its Node after ``node_register_s``; a terminated one loses it), and writes a
kubeconfig and an env file that point ``queue-processor run`` at both.

``kubernetes="real"`` puts the cluster on a real control plane
(:class:`~queue_processor_sandbox.real_kube.RealKube`, given or started by the sandbox) instead of the emulation:
the same nodes, workloads and scenarios, judged by the real API server and controllers. There the kubeconfig it
writes is a ServiceAccount's whose only rights are the controller's RBAC rules (``rbac``, by default those of
:mod:`queue_processor.permissions` with NODE_LEASES, EMIT_KUBERNETES_EVENTS and DELETE_AT_DEADLINE on, which the
Helm chart is tested against), ``admin.kubeconfig`` beside it is
the administrator's, and ``POD_NAMESPACE`` in the env file is that ServiceAccount's namespace. On a control
plane shared with other sandboxes (``plane`` given), the workloads go to namespaces named after the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from queue_processor.permissions import rbac_rules
from queue_processor_sandbox.aws import AwsSandbox, QueueCounts, SandboxInstance, SandboxQueue
from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.cluster import ClusterSpec, Instance, KubeCluster, build_kubernetes
from queue_processor_sandbox.kube import KubeSandbox

if TYPE_CHECKING:
    from queue_processor_sandbox.control_plane import ControlPlane

#: Where the controller's ServiceAccount lives on a real control plane (its Role and Leases too).
CONTROLLER_SERVICE_ACCOUNT = "queue-processor"

KubernetesKind = Literal["emulated", "real"]

__all__ = ["REAL_ONLY", "SCENARIOS", "SCENARIO_SETTINGS", "Neighbour", "Sandbox", "SandboxOptions"]

POISON_BODIES = (
    "this is not JSON",
    json.dumps({"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put"}]}),
    json.dumps({"source": "aws.ec2", "detail-type": "EC2 Spot Instance Interruption Warning", "detail": {}}),
)


@dataclass(frozen=True)
class SandboxOptions:
    """How big and how fast: ``nodes`` instances spread over ``asgs`` Auto Scaling groups (``workers-<n>``)
    across ``zones``; ``scale`` real seconds per simulated second; terminate hooks with
    ``heartbeat_timeout_s`` and launch hooks (``launch_hooks``) with ``launch_heartbeat_timeout_s``; the
    queue's ``visibility_timeout_s`` and ``max_receive_count`` before the dead-letter queue;
    ``node_register_s``/``node_ready_s``: how long a launched instance takes to register its Node and for the
    Node to turn Ready (simulated seconds); ``tags``: more tags on the groups, propagated to their instances
    (``eks:cluster-name`` to tell clusters apart)."""

    nodes: int = 3
    asgs: int = 1
    zones: tuple[str, ...] = ("us-east-1a", "us-east-1b", "us-east-1c")
    scale: float = 1.0
    heartbeat_timeout_s: int = 300
    launch_hooks: bool = True
    launch_heartbeat_timeout_s: int = 300
    visibility_timeout_s: int = 30
    max_receive_count: int = 5
    node_register_s: float = 30.0
    node_ready_s: float = 10.0
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    tags: dict[str, str] = field(default_factory=dict)


class Sandbox:
    """AWS and Kubernetes for a cluster of ``options.nodes`` nodes; files go to ``workdir``.

    Use as a context manager or call :meth:`start`/:meth:`stop`. Raises ``RuntimeError`` from :meth:`start`
    when another AWS sandbox runs in the process (moto's state is process-wide), and
    :class:`~queue_processor_sandbox.control_plane.ControlPlaneError` when ``kubernetes="real"`` and no
    control plane can be started. ``rbac``: the controller's (ClusterRole rules, Role rules) on a real control
    plane.
    """

    def __init__(
        self,
        options: SandboxOptions | None = None,
        *,
        workdir: Path,
        kubernetes: KubernetesKind = "emulated",
        plane: ControlPlane | None = None,
        rbac: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.options = options or SandboxOptions()
        self.workdir = workdir
        self.kubernetes = kubernetes
        self.clock = SandboxClock(self.options.scale)
        self.aws = AwsSandbox(self.clock)
        self.cluster = self.options.cluster
        self.rbac = rbac
        self.controller_namespace = "kube-system"
        self.kube: KubeCluster
        if kubernetes == "real":
            from queue_processor_sandbox.real_kube import RealKube

            real = RealKube(self.clock, plane=plane)
            self.kube = real
            self.controller_namespace = f"queue-processor-{real.run}"
            if plane is not None:  # shared: this run's namespaces
                self.cluster = replace(
                    self.cluster, namespace=f"apps-{real.run}", system_namespace=f"system-{real.run}"
                )
        else:
            self.kube = KubeSandbox(self.clock)
        self.queue: SandboxQueue | None = None
        self.instances: list[SandboxInstance] = []
        self.groups: set[str] = set()
        """This cluster's Auto Scaling groups: only their instances register Nodes here."""
        self._timers: list[threading.Timer] = []
        self._never_ready = 0  # launches whose node never turns Ready (launches_never_ready)
        self._kubelets: list[threading.Event] = []  # kubelet_for watchers, ended by stop()
        self.neighbours: list[Neighbour] = []
        """Other clusters a scenario started in this account (two-clusters): stopped with the sandbox; the
        scenario runner runs a controller for each."""
        self.ready_replicas: Any = None
        """The Ready-pod count of the workload a scenario watches (the real backend's
        :class:`~queue_processor_sandbox.real_kube.ReadyReplicas`), when it watches one: the judge's
        ``fewest_ready_replicas``."""

    def start(self) -> Sandbox:
        """Start both sides, build the cluster, write the kubeconfig and env file."""
        options = self.options
        if options.nodes < 1 or options.asgs < 1:
            raise ValueError("a sandbox needs at least one node and one Auto Scaling group")
        self.aws.start()
        try:
            self.kube.start()
            self.queue = self.aws.create_queue(
                visibility_timeout_s=options.visibility_timeout_s, max_receive_count=options.max_receive_count
            )
            self.aws.put_standard_rules(self.queue.arn)
            sizes = {
                f"workers-{index}": options.nodes // options.asgs
                + (1 if index < options.nodes % options.asgs else 0)
                for index in range(options.asgs)
            }
            self.groups = {name for name, size in sizes.items() if size}
            self.instances = self.aws.build_cluster(
                {name: size for name, size in sizes.items() if size},
                availability_zones=list(options.zones),
                heartbeat_timeout_s=options.heartbeat_timeout_s,
                launch_hook=options.launch_hooks,
                launch_heartbeat_timeout_s=options.launch_heartbeat_timeout_s,
                tags=options.tags,
            )
            build_kubernetes(self.kube, [self._instance(i) for i in self.instances], self.cluster)
            self.aws.on_instance(self._follow)
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._write_kubeconfigs()
            self.env_path.write_text("".join(f"{key}={value}\n" for key, value in self.env().items()))
        except BaseException:
            self.stop()
            raise
        return self

    def _write_kubeconfigs(self) -> None:
        if self.kubernetes != "real":
            self.kube.kubeconfig(self.kubeconfig_path)
            return
        from queue_processor_sandbox.real_kube import RealKube

        assert isinstance(self.kube, RealKube)
        self.kube.kubeconfig(self.workdir / "admin.kubeconfig")
        cluster_rules, namespaced_rules = self.rbac or (
            rbac_rules(cluster_wide=True, enabled=RBAC_SETTINGS_ON),
            rbac_rules(cluster_wide=False, enabled=RBAC_SETTINGS_ON),
        )
        self.kube.service_account_kubeconfig(
            self.kubeconfig_path,
            namespace=self.controller_namespace,
            name=CONTROLLER_SERVICE_ACCOUNT,
            cluster_rules=cluster_rules,
            namespaced_rules=namespaced_rules,
        )

    def stop(self) -> None:
        """Stop timers, both servers and their threads."""
        for timer in self._timers:
            timer.cancel()
        for kubelet in self._kubelets:
            kubelet.set()
        for neighbour in self.neighbours:
            neighbour.stop()
        self.kube.stop()
        self.aws.stop()

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kubeconfig_path(self) -> Path:
        """The kubeconfig written by :meth:`start`."""
        return self.workdir / "kubeconfig"

    @property
    def env_path(self) -> Path:
        """The env file written by :meth:`start` (``KEY=value`` lines)."""
        return self.workdir / "sandbox.env"

    @property
    def controller_username(self) -> str:
        """The Kubernetes user ``queue-processor run`` acts as with this sandbox's kubeconfig on the real
        control plane: its ServiceAccount, ``system:serviceaccount:<namespace>:queue-processor`` (how the API
        server's audit log names it; "Service account tokens", Kubernetes docs)."""
        return f"system:serviceaccount:{self.controller_namespace}:{CONTROLLER_SERVICE_ACCOUNT}"

    def queue_counts(self) -> QueueCounts:
        """The sandbox queue's :class:`~queue_processor_sandbox.aws.QueueCounts` (visible, in flight,
        dead-letter), read over HTTP. Raises ``RuntimeError`` before :meth:`start`, and botocore's errors."""
        if self.queue is None:
            raise RuntimeError("the sandbox is not started")
        return self.aws.queue_counts(self.queue)

    def env(self) -> dict[str, str]:
        """The environment that points ``queue-processor run`` at this sandbox."""
        if self.queue is None:
            raise RuntimeError("the sandbox is not started")
        return {
            **_aws_env(self.aws, self.queue),
            "KUBECONFIG": str(self.kubeconfig_path),
            **({"POD_NAMESPACE": self.controller_namespace} if self.kubernetes == "real" else {}),
        }

    @staticmethod
    def _instance(instance: SandboxInstance) -> Instance:
        return Instance(
            instance.instance_id, instance.private_dns_name, instance.availability_zone, instance.asg_name
        )

    def kubelet_for(self, namespace: str, name: str, pid: int, signum: int = signal.SIGTERM) -> None:
        """Make pod ``namespace/name`` the pod of process ``pid``, as a kubelet would: once the pod is evicted or
        deleted (it gets a ``deletionTimestamp``, or disappears), ``signum`` (SIGTERM) is sent to the process, once.
        The sandbox's pods run nothing: this lever lets a controller process be the pod it drains (its
        ``POD_NAME`` and ``POD_NAMESPACE``). Checked every 50 ms in a thread :meth:`stop` ends. Raises
        ``LookupError`` when the pod does not exist now."""
        if self.kube.get("pods", name, namespace) is None:
            raise LookupError(f"no pod {namespace}/{name}")
        stopped = threading.Event()

        def watch() -> None:
            while not stopped.wait(0.05):
                pod = self.kube.get("pods", name, namespace)
                if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signum)
                    return

        thread = threading.Thread(target=watch, name=f"kubelet-{name}", daemon=True)
        self._kubelets.append(stopped)
        thread.start()

    def launches_never_ready(self, count: int = 1) -> None:
        """The next ``count`` instances that start running in a group (a launch, or a warm-pool instance moved
        into it) register a Node that never turns Ready: a kubelet that cannot finish starting (a broken image,
        a CNI that never comes up). The lever for a launch lifecycle action whose node is never Ready.
        Raises ``ValueError`` for a negative count."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self._never_ready += count

    def _follow(self, instance: SandboxInstance, event: str) -> None:
        """Keep Kubernetes in step with EC2 for this cluster's groups (called by the AWS side under its
        lock)."""
        if instance.asg_name not in self.groups:  # another cluster's instance (a Neighbour's)
            return
        if event == "launched":
            ready_after_s: float | None = self.options.node_ready_s
            if self._never_ready > 0:
                self._never_ready -= 1
                ready_after_s = None
            _keep_in_step(self.kube, self.options, instance, event, ready_after_s)
        else:
            _keep_in_step(self.kube, self.options, instance, event, None)

    def after(self, simulated_s: float, action: Callable[[], None]) -> None:
        """Run ``action`` ``simulated_s`` simulated seconds from now, in a timer thread :meth:`stop` cancels."""
        timer = threading.Timer(self.clock.real(simulated_s), action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def publish(self, scenario: str) -> dict[str, Any]:
        """Publish the events of ``scenario`` (a key of :data:`SCENARIOS`); returns what was done. Raises
        ``KeyError`` for an unknown scenario."""
        return SCENARIOS[scenario](self)


class Neighbour:
    """Another cluster in the same account and region as ``sandbox`` (issue 29, part 4): its own Kubernetes API
    server (the emulation), queue and dead-letter queue named ``name``, the standard EventBridge rules
    (``<name>-<kind>``, on the same default bus as the sandbox's: EC2's events reach both queues, as they do in
    an account with two clusters), and one Auto Scaling group ``<name>-workers`` of ``nodes`` instances with
    the sandbox's hooks and ``tags``. Files go to ``workdir``: ``kubeconfig`` and ``env`` (:meth:`env`). Use
    as a context manager after the sandbox started; stopping it stops its API server (the AWS side is the
    sandbox's)."""

    def __init__(
        self,
        sandbox: Sandbox,
        name: str,
        *,
        nodes: int,
        tags: dict[str, str],
        workdir: Path,
        cluster: ClusterSpec | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.name = name
        self.nodes = nodes
        self.tags = dict(tags)
        self.workdir = workdir
        self.cluster = cluster or sandbox.options.cluster
        self.kube = KubeSandbox(sandbox.clock)
        self.queue: SandboxQueue | None = None
        self.instances: list[SandboxInstance] = []
        self.group = f"{name}-workers"

    def start(self) -> Neighbour:
        """Start its API server, create its queue, rules and group, build its cluster, write its files."""
        sandbox, options = self.sandbox, self.sandbox.options
        aws = sandbox.aws
        self.kube.start()
        try:
            self.queue = aws.create_queue(
                self.name,
                visibility_timeout_s=options.visibility_timeout_s,
                max_receive_count=options.max_receive_count,
            )
            aws.put_standard_rules(self.queue.arn, prefix=self.name)
            self.instances = aws.create_asg(
                self.group,
                self.nodes,
                availability_zones=list(options.zones),
                heartbeat_timeout_s=options.heartbeat_timeout_s,
                launch_hook=options.launch_hooks,
                launch_heartbeat_timeout_s=options.launch_heartbeat_timeout_s,
                tags=self.tags,
            )
            build_kubernetes(self.kube, [Sandbox._instance(i) for i in self.instances], self.cluster)
            aws.on_instance(self._follow)
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.kube.kubeconfig(self.kubeconfig_path)
            (self.workdir / "env").write_text("".join(f"{k}={v}\n" for k, v in self.env().items()))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop its API server."""
        self.kube.stop()

    def __enter__(self) -> Neighbour:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kubeconfig_path(self) -> Path:
        """Its kubeconfig (the emulation's, no credentials)."""
        return self.workdir / "kubeconfig"

    def env(self) -> dict[str, str]:
        """The environment that points ``queue-processor run`` at this cluster and its queue."""
        if self.queue is None:
            raise RuntimeError("the neighbour is not started")
        return {**_aws_env(self.sandbox.aws, self.queue), "KUBECONFIG": str(self.kubeconfig_path)}

    def queue_counts(self) -> QueueCounts:
        """Its queue's :class:`~queue_processor_sandbox.aws.QueueCounts`."""
        if self.queue is None:
            raise RuntimeError("the neighbour is not started")
        return self.sandbox.aws.queue_counts(self.queue)

    def _follow(self, instance: SandboxInstance, event: str) -> None:
        if instance.asg_name != self.group:
            return
        _keep_in_step(self.kube, self.sandbox.options, instance, event, self.sandbox.options.node_ready_s)


def _aws_env(aws: AwsSandbox, queue: SandboxQueue) -> dict[str, str]:
    """The AWS half of a controller's environment: ``queue``, the region, the endpoint, fake credentials."""
    return {
        "QUEUE_URL": queue.url,
        "AWS_REGION": aws.region,
        "AWS_ENDPOINT": aws.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }


def _keep_in_step(
    kube: KubeCluster,
    options: SandboxOptions,
    instance: SandboxInstance,
    event: str,
    ready_after_s: float | None,
) -> None:
    """What a cluster's Kubernetes does when one of its instances starts running (``"launched"``: its Node
    registers after ``node_register_s`` and turns Ready after ``ready_after_s``, never when ``None``) or is
    terminated (its Node goes)."""
    if event == "launched":
        kube.add_node(
            instance.private_dns_name,
            provider_id=instance.provider_id,
            labels={"topology.kubernetes.io/zone": instance.availability_zone},
            register_after_s=options.node_register_s,
            ready_after_s=ready_after_s,
        )
    elif event == "terminated":
        kube.delete_node(instance.private_dns_name)


def _in_service(sandbox: Sandbox) -> list[SandboxInstance]:
    """The cluster's instances still InService (a scenario acts on those; earlier ones may have gone)."""
    return [i for i in sandbox.instances if sandbox.aws.lifecycle_state(i.instance_id) == "InService"]


def _spot_storm(sandbox: Sandbox) -> dict[str, Any]:
    """Every instance gets a rebalance recommendation, then a Spot interruption warning (terminated when the
    120 s notice ends)."""
    chosen = _in_service(sandbox)
    for instance in chosen:
        sandbox.aws.rebalance_recommendation(instance.instance_id)
        sandbox.aws.spot_interruption(instance.instance_id)
    return {"interrupted": len(chosen)}


def _asg_scale_in(sandbox: Sandbox) -> dict[str, Any]:
    """Half the instances (at least one) leave their group through the terminate lifecycle hook."""
    available = _in_service(sandbox)
    chosen = available[: max(1, len(available) // 2)]
    for instance in chosen:
        sandbox.aws.terminate_instance(instance.instance_id)
    return {"terminating": len(chosen)}


def _warm_pool_launch(sandbox: Sandbox) -> dict[str, Any]:
    """Two instances launch into the first group's warm pool, then two warmed ones move into the group (their
    nodes register after ``node_register_s``); the launch hook holds each in Pending:Wait."""
    group = sandbox.instances[0].asg_name
    warmed = sandbox.aws.launch_instances(group, 2, origin="EC2", destination="WarmPool")
    for instance in warmed:
        for action in sandbox.aws.actions(instance.instance_id, status="open"):
            sandbox.aws.client("autoscaling").complete_lifecycle_action(
                AutoScalingGroupName=group,
                LifecycleHookName=action.hook_name,
                LifecycleActionToken=action.token,
                LifecycleActionResult="CONTINUE",
            )  # the warm-pool bootstrap finishing its own launch action
    launched = sandbox.aws.launch_instances(group, 2, origin="WarmPool", destination="AutoScalingGroup")
    return {"warmed": len(warmed), "launched": [i.instance_id for i in launched]}


def _mixed_duplicates(sandbox: Sandbox) -> dict[str, Any]:
    """For up to three instances at once: a rebalance recommendation, a Spot warning, a state change to
    ``stopping`` and an ASG terminate action; then every one of those messages again (redeliveries)."""
    chosen = _in_service(sandbox)[:3]
    before = len(sandbox.aws.published())
    for instance in chosen:
        sandbox.aws.rebalance_recommendation(instance.instance_id)
        sandbox.aws.spot_interruption(instance.instance_id)
        sandbox.aws.publish_state_change(instance.instance_id, "stopping")
        sandbox.aws.terminate_instance(instance.instance_id)
    published = sandbox.aws.published()[before:]
    for message in published:
        sandbox.aws.send_raw(sandbox.env()["QUEUE_URL"], message.body)
    return {"instances": len(chosen), "messages": 2 * len(published)}


def _pdb_blocked(sandbox: Sandbox) -> dict[str, Any]:
    """The PodDisruptionBudget of ``app-000`` allows no disruption; one instance is scaled in; after 60
    simulated seconds the budget is relaxed to maxUnavailable 1, so a drain that timed out can succeed."""
    namespace = sandbox.cluster.namespace
    sandbox.kube.set_pdb(namespace, "app-000", max_unavailable=0)
    instance = _in_service(sandbox)[0]
    sandbox.aws.terminate_instance(instance.instance_id)
    sandbox.after(60.0, lambda: sandbox.kube.set_pdb(namespace, "app-000", max_unavailable=1))
    return {"terminating": instance.instance_id, "relaxed_after_s": 60.0}


def _spot_critical(sandbox: Sandbox) -> dict[str, Any]:
    """One instance's node gets what a drain under a Spot notice must order: a log shipper DaemonSet and a
    mesh Deployment (both critical: ``system-node-critical``, ``system-cluster-critical``), two ordinary
    Deployments with long grace periods (60 s, and 300 s, longer than the notice), and a pod its
    PodDisruptionBudget never lets go; then the instance gets a Spot interruption warning (terminated when the
    120 s notice ends). The controller runs with DELETE_AT_DEADLINE (see ``SCENARIO_SETTINGS``)."""
    namespace = sandbox.cluster.namespace
    instance = _in_service(sandbox)[0]
    node = instance.private_dns_name
    kube = sandbox.kube
    kube.add_daemonset(
        namespace, "log-shipper", labels={"app": "log-shipper"}, priority_class="system-node-critical"
    )
    kube.add_replicaset(
        namespace,
        "mesh",
        nodes=[node],
        replicas=1,
        labels={"app": "mesh"},
        grace_s=20,
        priority_class="system-cluster-critical",
    )
    kube.add_replicaset(namespace, "orders", nodes=[node], replicas=2, labels={"app": "orders"}, grace_s=60)
    kube.add_replicaset(
        namespace, "reports", nodes=[node], replicas=1, labels={"app": "reports"}, grace_s=300
    )
    kube.add_replicaset(namespace, "ledger", nodes=[node], replicas=1, labels={"app": "ledger"}, grace_s=30)
    kube.add_pdb(namespace, "ledger", match_labels={"app": "ledger"}, min_available=1)
    sandbox.aws.spot_interruption(instance.instance_id)
    return {"interrupted": instance.instance_id, "node": node}


def _drain_policy(sandbox: Sandbox) -> dict[str, Any]:
    """One instance's node gets three ordinary pods (``web-0``…``web-2``, 5 s grace), an agent annotated
    ``queue-processor/drain: last`` (no priority of its own: the annotation alone must put it last, judged by
    ``last_pods_evicted_early``) and a pod whose annotation has a typo (``lsat``: reported, evicted as by
    default); then the instance gets a Spot interruption warning."""
    namespace = sandbox.cluster.namespace
    instance = _in_service(sandbox)[0]
    node = instance.private_dns_name
    for index in range(3):
        sandbox.kube.add_pod(namespace, f"web-{index}", node=node, labels={"app": "web"}, grace_s=5)
    sandbox.kube.add_pod(
        namespace, "agent", node=node, labels={"app": "agent"}, grace_s=1, annotations={_DRAIN: "last"}
    )
    sandbox.kube.add_pod(
        namespace, "cache", node=node, labels={"app": "cache"}, grace_s=1, annotations={_DRAIN: "lsat"}
    )
    sandbox.aws.spot_interruption(instance.instance_id)
    return {"interrupted": instance.instance_id, "node": node, "last": ["agent"], "unknown_policy": ["cache"]}


def _surge(sandbox: Sandbox) -> dict[str, Any]:
    """A single-replica Deployment ``checkout`` whose pod template asks for ``queue-processor/drain: surge``,
    under a PodDisruptionBudget of ``minAvailable: 1``; its node's instance gets a Spot interruption warning.
    The controller runs with SURGE_DRAINS (``SCENARIO_SETTINGS``). Judged by ``fewest_ready_replicas`` (never
    under the one it began with) and ``deployment_after`` (the Deployment ends as it began). Needs the real control
    plane: the emulation serves no Deployments (raises ``ValueError`` there)."""
    kube = sandbox.kube
    add_deployment = getattr(kube, "add_deployment", None)
    if add_deployment is None or not hasattr(kube, "track_ready"):
        raise ValueError("the surge scenario needs --kubernetes real: the emulation serves no Deployments")
    namespace = sandbox.cluster.namespace
    labels = {"app": "checkout"}
    (pod,) = add_deployment(
        namespace, "checkout", replicas=1, labels=labels, grace_s=2, annotations={_DRAIN: "surge"}
    )
    kube.add_pdb(namespace, "checkout", match_labels=labels, min_available=1)
    (node,) = {p["spec"]["nodeName"] for p in kube.objects("pods") if p["metadata"]["name"] == pod}
    (instance,) = [i for i in sandbox.instances if i.private_dns_name == node]
    sandbox.ready_replicas = kube.track_ready(namespace, labels)
    sandbox.aws.spot_interruption(instance.instance_id)
    return {
        "interrupted": instance.instance_id,
        "node": node,
        "deployment": f"{namespace}/checkout",
        "replicas": 1,
    }


#: The instance tag that tells the clusters of the two-clusters scenario apart (EKS managed node groups tag their
#: instances with it), and the sandbox's own cluster's value of it.
CLUSTER_TAG = "eks:cluster-name"
CLUSTER_NAME = "blue"


def _two_clusters(sandbox: Sandbox) -> dict[str, Any]:
    """Two clusters in one account and region (issue 29, part 4): the sandbox's instances are tagged
    ``eks:cluster-name: blue`` and a second cluster, ``green`` (a :class:`Neighbour`: its own emulated API
    server, queue, dead-letter queue, EventBridge rules on the same bus, and Auto Scaling group of as many
    instances, tagged ``green``), is started. In each cluster one instance gets a Spot interruption warning and
    another is scaled in (its terminate hook): EC2's events reach both queues. The runner runs a controller for
    each cluster, told its own by MANAGED_TAG / MANAGED_TAG_VALUE (``SCENARIO_SETTINGS``); judged per cluster
    (``clusters``): its leaving nodes drained, nothing evicted elsewhere, its queue and dead-letter queue empty.
    Needs at least two instances."""
    chosen = _in_service(sandbox)
    if len(chosen) < 2:
        raise ValueError("the two-clusters scenario needs at least two instances in service (--nodes 2)")
    sandbox.aws.client("ec2").create_tags(
        Resources=[i.instance_id for i in sandbox.instances],
        Tags=[{"Key": CLUSTER_TAG, "Value": CLUSTER_NAME}],
    )
    green = Neighbour(
        sandbox,
        "green",
        nodes=max(2, len(sandbox.instances)),
        tags={CLUSTER_TAG: "green"},
        workdir=sandbox.workdir / "green",
        cluster=sandbox.options.cluster,
    )
    green.start()
    sandbox.neighbours.append(green)
    leaving: dict[str, list[str]] = {}
    for name, instances in ((CLUSTER_NAME, chosen[:2]), ("green", green.instances[:2])):
        sandbox.aws.spot_interruption(instances[0].instance_id)
        sandbox.aws.terminate_instance(instances[1].instance_id)
        leaving[name] = [i.private_dns_name for i in instances]
    return {"leaving": leaving, "managed_tag": CLUSTER_TAG}


def _rebalance_fleet(sandbox: Sandbox) -> dict[str, Any]:
    """A rebalance recommendation for two thirds of the fleet at once (at least two instances). The controller
    runs with DRAIN_BUDGET_NON_URGENT=1 (``SCENARIO_SETTINGS``): they drain one at a time per Auto Scaling
    group, judged by ``most_draining_at_once``."""
    chosen = _in_service(sandbox)
    chosen = chosen[: max(2, len(chosen) * 2 // 3)]
    for instance in chosen:
        sandbox.aws.rebalance_recommendation(instance.instance_id)
    return {
        "rebalanced": len(chosen),
        "budget": SCENARIO_SETTINGS["rebalance-fleet"]["drain_budget_non_urgent"],
    }


#: The drain policy annotation, as the sandbox writes it (the controller's name for it is its own).
_DRAIN = "queue-processor/drain"


def _poison(sandbox: Sandbox) -> dict[str, Any]:
    """Bodies the controller cannot understand, for the dead-letter queue, and one good Spot warning."""
    for body in POISON_BODIES:
        sandbox.aws.send_raw(sandbox.env()["QUEUE_URL"], body)
    sandbox.aws.spot_interruption(_in_service(sandbox)[0].instance_id)
    return {"poison": len(POISON_BODIES), "good": 1}


#: Scenario name → what it publishes (see each function's docstring).
SCENARIOS: dict[str, Callable[[Sandbox], dict[str, Any]]] = {
    "spot-storm": _spot_storm,
    "asg-scale-in": _asg_scale_in,
    "warm-pool-launch": _warm_pool_launch,
    "mixed-duplicates": _mixed_duplicates,
    "pdb-blocked": _pdb_blocked,
    "poison": _poison,
    "spot-critical": _spot_critical,
    "drain-policy": _drain_policy,
    "rebalance-fleet": _rebalance_fleet,
    "surge": _surge,
    "two-clusters": _two_clusters,
}

#: Scenarios that need the real control plane (``--kubernetes real``): the emulation lacks a controller they
#: need (Deployments, for surge).
REAL_ONLY = frozenset({"surge"})

#: Settings a scenario runs the controller with, under any the caller gives (field name → value).
SCENARIO_SETTINGS: dict[str, dict[str, Any]] = {
    "spot-critical": {"delete_at_deadline": True},
    "rebalance-fleet": {"drain_budget_non_urgent": "1"},
    "surge": {"surge_drains": True},
    "two-clusters": {"managed_tag": CLUSTER_TAG, "managed_tag_value": CLUSTER_NAME},
}

#: The settings whose RBAC rules (:data:`queue_processor.permissions.KUBERNETES_RULES`) the sandbox's
#: ServiceAccount gets on a real control plane, unless ``rbac`` is given: the chart's defaults (NODE_LEASES,
#: EMIT_KUBERNETES_EVENTS) and every setting a scenario switches on (:data:`SCENARIO_SETTINGS`), or the
#: API server refuses what that scenario's controller does (spot-critical's deletions at the deadline: 403).
RBAC_SETTINGS_ON = frozenset({"NODE_LEASES", "EMIT_KUBERNETES_EVENTS"}) | {
    name.upper()
    for settings in SCENARIO_SETTINGS.values()
    for name, value in settings.items()
    if value is True
}
