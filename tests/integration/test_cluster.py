"""The controller against a Kubernetes API server chosen at run time: a real cluster when ``KUBECONFIG`` is set,
else both the test run's real control plane (as if it were a user's cluster) and the embedded sandbox's API
server. AWS is always the sandbox (moto over HTTP).

On a real cluster the tests touch only what they create: a namespace ``qp-it-<hex>`` and one fake Node per
test (named as the sandbox instance's private DNS name, labelled ``queue-processor.test/run``, tainted
``queue-processor.test/fake-node:NoSchedule`` so that no other workload lands on it, marked Ready through its
status subresource; no kubelet runs it). A ReplicaSet and a DaemonSet pinned to that node by a node selector get
their pods bound to it by the cluster's own scheduler and controllers; those pods never start (there is no
kubelet), which is why the controller runs with ``POD_TERMINATION_GRACE_PERIOD=0``: an eviction with a grace
period of 0 deletes the pod at once instead of waiting for a kubelet. Everything is deleted at the end (the
namespace cascades; the Node is deleted explicitly). The test needs RBAC to create namespaces, nodes,
ReplicaSets, DaemonSets, PodDisruptionBudgets, and to patch node status. A node controller marks a node
without kubelet heartbeats unreachable after its grace period (40-50 s); each test ends well before.

What a user checks: the node is cordoned, the ReplicaSet's pods on it are evicted, the DaemonSet's pod (and
a mirror pod, where the API server accepts one) is left alone with ``USE_APISERVER_CACHE`` on or off, the
message is deleted, and a terminate lifecycle action is completed once, after the drain.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from queue_processor.app import Controller, run_controller
from queue_processor.cli import load_settings
from queue_processor_sandbox.aws import AwsSandbox, SandboxInstance, SandboxQueue
from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.kube import KubeSandbox
from tests.integration.test_controller import until

REAL = bool(os.environ.get("KUBECONFIG"))
RUN_LABEL = "queue-processor.test/run"
FAKE_NODE_TAINT = {"key": "queue-processor.test/fake-node", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": FAKE_NODE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}


@dataclass
class Target:
    """The API server under test and the objects of one test on it."""

    api: k8s.ApiClient
    kubeconfig: Path
    run: str
    namespace: str
    sandbox: KubeSandbox | None = None
    nodes: list[str] = field(default_factory=list)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def pods_on(self, node: str) -> list[Any]:
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        return [p for p in pods if p.metadata.namespace == self.namespace]

    def add_node(self, instance: SandboxInstance) -> str:
        """A Node for the instance, Ready and schedulable; returns its name."""
        name = instance.private_dns_name
        labels = {RUN_LABEL: self.run, "topology.kubernetes.io/zone": instance.availability_zone}
        if self.sandbox is not None:
            self.sandbox.add_node(name, provider_id=instance.provider_id, labels=labels)
            self.sandbox.wait_for_nodes([name])
        else:
            labels["kubernetes.io/hostname"] = name
            # Tainted, so that no workload of the cluster is ever scheduled onto a node no kubelet runs.
            body = {
                "metadata": {"name": name, "labels": labels},
                "spec": {"providerID": instance.provider_id, "taints": [FAKE_NODE_TAINT]},
            }
            self.core.create_node(body)
            capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            status = {
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                }
            }
            self.core.patch_node_status(name, status)
        self.nodes.append(name)
        return name

    def add_workloads(self, node: str) -> None:
        """On ``node``: a 3-replica ReplicaSet with a PodDisruptionBudget (maxUnavailable 3: the
        replacements cannot start anywhere, so a tighter budget would block the drain, as it would block kubectl
        drain), a DaemonSet pod,
        and a mirror pod where the API server accepts one. Waits until they are bound to the node."""
        app = {"app": f"web-{node.split('.')[0]}"}
        if self.sandbox is not None:
            self.sandbox.add_replicaset(self.namespace, app["app"], nodes=[node], replicas=3, labels=app)
            self.sandbox.add_pdb(self.namespace, app["app"], match_labels=app, max_unavailable=3)
            self.sandbox.add_daemonset(self.namespace, "agent", labels={"app": "agent"})
            self.sandbox.add_pod(self.namespace, f"static-{node.split('.')[0]}", node=node, mirror=True)
            return
        selector = {RUN_LABEL: self.run, "kubernetes.io/hostname": node}
        container = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
        template = {
            "metadata": {"labels": app},
            "spec": {"nodeSelector": selector, "tolerations": [TOLERATION], "containers": [container]},
        }
        k8s.AppsV1Api(self.api).create_namespaced_replica_set(
            self.namespace,
            {
                "metadata": {"name": app["app"]},
                "spec": {"replicas": 3, "selector": {"matchLabels": app}, "template": template},
            },
        )
        k8s.PolicyV1Api(self.api).create_namespaced_pod_disruption_budget(
            self.namespace,
            {
                "metadata": {"name": app["app"]},
                "spec": {"maxUnavailable": 3, "selector": {"matchLabels": app}},
            },
        )
        agent = {"app": "agent"}
        ds_template = {
            "metadata": {"labels": agent},
            "spec": {
                "nodeSelector": {RUN_LABEL: self.run},
                "tolerations": [TOLERATION],
                "containers": [container],
            },
        }
        try:
            k8s.AppsV1Api(self.api).create_namespaced_daemon_set(
                self.namespace,
                {
                    "metadata": {"name": "agent"},
                    "spec": {"selector": {"matchLabels": agent}, "template": ds_template},
                },
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
        mirror = {
            "metadata": {
                "name": f"static-{node.split('.')[0]}",
                "annotations": {"kubernetes.io/config.mirror": "queue-processor-test"},
            },
            "spec": {"nodeName": node, "containers": [container]},
        }
        # An API server may refuse a mirror pod from a user that is not a node: that check is then skipped.
        with suppress(ApiException):
            self.core.create_namespaced_pod(self.namespace, mirror)
        _wait(
            lambda: (
                len([p for p in self.pods_on(node) if (p.metadata.labels or {}).get("app") == app["app"]])
                == 3
            ),
            "ReplicaSet pods bound to the node",
        )
        _wait(
            lambda: any((p.metadata.labels or {}).get("app") == "agent" for p in self.pods_on(node)),
            "DaemonSet pod",
        )


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout_s} s"
        time.sleep(0.2)


@pytest.fixture
def aws() -> Iterator[AwsSandbox]:
    with AwsSandbox(SandboxClock(1.0)) as sandbox:
        yield sandbox


@pytest.fixture(params=["cluster"] if REAL else ["emulated", "cluster"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """``cluster``: the cluster of ``KUBECONFIG`` when it is set, else the real control plane of the test run
    (the same code path: nothing of the sandbox's cluster helpers is used). ``emulated``: the sandbox's API
    server."""
    run = uuid.uuid4().hex[:8]
    namespace = f"qp-it-{run}"
    if request.param == "cluster":
        if REAL:
            kubeconfig = Path(os.environ["KUBECONFIG"])
        else:
            kubeconfig = request.getfixturevalue("control_plane").admin_kubeconfig
        api = k8s_config.new_client_from_config(str(kubeconfig))
        current = Target(api, kubeconfig, run, namespace)
        current.core.create_namespace({"metadata": {"name": namespace}})
        try:
            yield current
        finally:
            for node in current.nodes:
                with suppress(ApiException):
                    current.core.delete_node(node)
            current.core.delete_namespace(namespace)
            api.close()
        return
    sandbox = KubeSandbox(SandboxClock(1.0))
    sandbox.start()
    try:
        kubeconfig = sandbox.kubeconfig(tmp_path / "kubeconfig")
        api = k8s_config.new_client_from_config(str(kubeconfig))
        yield Target(api, kubeconfig, run, namespace, sandbox=sandbox)
        api.close()
    finally:
        sandbox.stop()


@asynccontextmanager
async def controller(
    aws: AwsSandbox, target: Target, queue_url: str, monkeypatch: pytest.MonkeyPatch, **env: str
) -> AsyncIterator[Controller]:
    """The controller in this event loop, configured through the environment as in a pod."""
    values = {
        "QUEUE_URL": queue_url,
        "AWS_REGION": aws.region,
        "AWS_ENDPOINT": aws.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "POD_TERMINATION_GRACE_PERIOD": "0",
        "NODE_TERMINATION_GRACE_PERIOD": "60",
        "POD_NAMESPACE": target.namespace,
        **env,
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(prometheus_server_port=0, probes_server_port=0, receive_wait_time_sec=2)
    stop = asyncio.Event()
    started: list[Controller] = []
    task = asyncio.create_task(
        run_controller(settings, stop, kubeconfig=str(target.kubeconfig), serve=False, started=started.append)
    )
    await until(lambda: bool(started) or task.done(), timeout_s=30, what="controller start")
    if task.done():
        task.result()
    try:
        yield started[0]
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        assert started[0].consumer.tasks == 0


def _setup(aws: AwsSandbox, target: Target, instances: int) -> tuple[SandboxQueue, list[SandboxInstance]]:
    queue = aws.create_queue(f"qp-it-{target.run}", visibility_timeout_s=30, max_receive_count=3)
    aws.put_standard_rules(queue.arn)
    built = aws.build_cluster({f"it-{target.run}": instances}, heartbeat_timeout_s=300)
    for instance in built:
        target.add_workloads(target.add_node(instance))
    return queue, built


@pytest.mark.parametrize("cache", [False, True], ids=["live-list", "apiserver-cache"])
async def test_a_spot_warning_drains_the_node_and_leaves_daemonset_and_mirror_pods(
    aws: AwsSandbox, target: Target, cache: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue, (instance,) = _setup(aws, target, 1)
    node = instance.private_dns_name
    before = {p.metadata.uid: p for p in target.pods_on(node)}
    kept = {uid for uid, p in before.items() if (p.metadata.labels or {}).get("app") == "agent"}
    kept |= {
        uid for uid, p in before.items() if "kubernetes.io/config.mirror" in (p.metadata.annotations or {})
    }
    evictable = set(before) - kept
    assert len(evictable) == 3

    async with controller(aws, target, queue.url, monkeypatch, USE_APISERVER_CACHE=str(cache).lower()):
        aws.spot_interruption(instance.instance_id)
        await until(lambda: aws.queue_counts(queue).left == 0, timeout_s=30, what="message deleted")

    assert target.core.read_node(node).spec.unschedulable is True
    after = {p.metadata.uid for p in target.pods_on(node) if p.metadata.deletion_timestamp is None}
    assert not (after & evictable), "the ReplicaSet's pods are still on the node"
    assert kept <= after, "a DaemonSet or mirror pod was evicted"


async def test_an_asg_terminate_action_is_completed_once_after_the_drain(
    aws: AwsSandbox, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue, (instance,) = _setup(aws, target, 1)
    node = instance.private_dns_name

    async with controller(aws, target, queue.url, monkeypatch):
        (action,) = aws.terminate_instance(instance.instance_id)
        await until(
            lambda: aws.action(action.token).result is not None,
            timeout_s=30,
            what="lifecycle action completed",
        )
        await until(lambda: aws.queue_counts(queue).left == 0, timeout_s=30, what="message deleted")

    completions = [c for c in aws.calls(instance.instance_id) if c.operation == "CompleteLifecycleAction"]
    assert [c.result for c in completions] == ["CONTINUE"]
    assert target.core.read_node(node).spec.unschedulable is True
    left = [p for p in target.pods_on(node) if (p.metadata.labels or {}).get("app", "").startswith("web-")]
    assert all(p.metadata.deletion_timestamp is not None for p in left)
