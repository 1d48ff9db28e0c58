"""The controller drains its own node (issue "Interruptions in combination" 5).

A scale-in takes the node the controller's own pod runs on, together with another node. The controller drains
its node, evicts its own pod last, and does not complete the node's lifecycle action: the kubelet's SIGTERM
(the sandbox's lever :meth:`~queue_processor_sandbox.environment.Sandbox.kubelet_for`, since the sandbox's pods
run nothing) starts its graceful shutdown, which stops its heartbeats and makes every message it holds visible
again at once. Its successor (the ReplicaSet's replacement, started here as a second process) finds the node
drained and completes both actions. No action is left to time out because the controller drained itself, and
no pod is evicted twice.

Before: the controller completed its own node's action, the instance went with the process, and every other
message it held waited out its visibility timeout, unheartbeated, until a new pod ran elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from tests.chaos.harness import Controller, cordoned, queue_depth, sandbox_on, settle, until
from tests.conftest import KUBERNETES

SCALE = 0.01  # hooks: HeartbeatTimeout 6000 s = 60 s real


@pytest.fixture(params=KUBERNETES)
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    options = SandboxOptions(
        nodes=3,
        scale=SCALE,
        visibility_timeout_s=30,  # longer than the test would wait for a message a dead process held
        heartbeat_timeout_s=6000,
        cluster=ClusterSpec(apps=2, pdb_max_unavailable=1),
    )
    with sandbox_on(request, options, tmp_path / "sandbox") as running:
        yield running


def controller_pod_on(sandbox: Sandbox, node: str) -> str:
    """The controller's own pod on ``node`` (a ReplicaSet's, labelled as the chart's): its name."""
    (pod,) = sandbox.kube.add_replicaset(
        sandbox.controller_namespace,
        "queue-processor",
        nodes=[node],
        replicas=1,
        labels={"app.kubernetes.io/name": "queue-processor"},
        grace_s=1,
    )
    return pod


async def test_the_controller_evicts_itself_last_and_its_successor_completes_its_node(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    own, other = sandbox.instances[0], sandbox.instances[1]
    namespace = sandbox.controller_namespace
    sandbox.kube.ensure_namespace(namespace)
    pod = controller_pod_on(sandbox, own.private_dns_name)
    identity = {"POD_NAME": pod, "POD_NAMESPACE": namespace}
    first = Controller(sandbox, tmp_path / "first.log", **identity)
    sandbox.kubelet_for(namespace, pod, first.process.pid)
    started = time.monotonic()
    (own_action,) = sandbox.aws.terminate_instance(own.instance_id)
    (other_action,) = sandbox.aws.terminate_instance(other.instance_id)

    # The kubelet's SIGTERM, once its own pod is evicted: a clean exit, every message it held visible at once.
    assert first.process.wait(timeout=120) == 0
    first.assert_clean_exit()
    assert queue_depth(sandbox)[1] == 0  # nothing left in flight: no visibility timeout to wait out
    assert (
        sandbox.aws.action(own_action.token).status == "open"
    )  # left to the successor, heartbeated till then
    on_own = [
        p["metadata"]["name"]
        for p in sandbox.kube.evictions
        if p["spec"].get("nodeName") == own.private_dns_name
    ]
    assert on_own[-1] == pod  # evicted last
    assert len(on_own) > 1  # after the node's other pods

    successor = Controller(
        sandbox, tmp_path / "successor.log", POD_NAME=f"{pod}-next", POD_NAMESPACE=namespace
    )
    nodes = [own.private_dns_name, other.private_dns_name]
    verdict = await settle(sandbox, [own_action.token, other_action.token], nodes, started, [successor])
    assert verdict["lifecycle_timed_out"] == 0


@pytest.fixture(params=KUBERNETES)
def storm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    options = SandboxOptions(nodes=3, scale=0.25, heartbeat_timeout_s=6000, cluster=ClusterSpec(apps=0))
    with sandbox_on(request, options, tmp_path / "sandbox") as running:
        yield running


async def test_a_storm_that_takes_the_controllers_own_node_keeps_its_other_drains_going(
    storm: Sandbox, tmp_path: Path
) -> None:
    """Issue 47.2 (DESIGN.md rule 16): Spot warnings for every node, the controller's own among them, one
    replica (the chart's default). Its own node drains at once; the other nodes' drains are held for a while by
    a PodDisruptionBudget. The controller stays on its drained node until those drains end (before: it evicted
    itself as soon as its node was drained, its shutdown cancelled every other drain, and their pods went with
    their instances), then leaves: every other node is drained inside its notice."""
    sandbox = storm
    own, others = sandbox.instances[0], sandbox.instances[1:]
    namespace, apps = sandbox.controller_namespace, sandbox.cluster.namespace
    sandbox.kube.ensure_namespace(namespace)
    pod = controller_pod_on(sandbox, own.private_dns_name)
    held = {"app": "held"}
    nodes = [instance.private_dns_name for instance in others]
    sandbox.kube.add_replicaset(apps, "held", nodes=nodes, replicas=2, labels=held, grace_s=2)
    sandbox.kube.add_pdb(apps, "held", match_labels=held, max_unavailable=0)  # the other drains wait for it
    controller = Controller(sandbox, tmp_path / "controller.log", POD_NAME=pod, POD_NAMESPACE=namespace)
    sandbox.kubelet_for(namespace, pod, controller.process.pid)
    for instance in sandbox.instances:
        sandbox.aws.spot_interruption(instance.instance_id)

    def evictable_on(node: str) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in sandbox.kube.pods_on(node)
            if _evictable(p) and p["metadata"]["name"] != pod
        ]

    own_node = own.private_dns_name
    await until(lambda: cordoned(sandbox, [own_node]) == 1, 60, "the controller's own node cordoned")
    await until(
        lambda: not evictable_on(own_node), 60, "the controller's own node drained but for its own pod"
    )
    await until(lambda: controller.count("drained") >= 1, 60, "the controller's own drain over")
    assert controller.process.poll() is None, "the controller left before the other drains ended"
    sandbox.kube.set_pdb(apps, "held", max_unavailable=2)  # every node is cordoned: no replacement runs
    drained_first: dict[str, bool] = {}

    def each_other_node_drained_or_gone() -> bool:
        for instance in others:
            if instance.instance_id not in drained_first:
                if not evictable_on(instance.private_dns_name):
                    drained_first[instance.instance_id] = (
                        sandbox.aws.ec2_state(instance.instance_id) == "running"
                    )
                elif sandbox.aws.ec2_state(instance.instance_id) != "running":
                    drained_first[instance.instance_id] = False
        return len(drained_first) == len(others)

    await until(each_other_node_drained_or_gone, 120, "every other node drained, or its instance ended")
    assert drained_first == {instance.instance_id: True for instance in others}
    assert controller.process.wait(timeout=60) == 0  # it left in the end: the kubelet's SIGTERM
    controller.assert_clean_exit()


def _evictable(pod: dict[str, Any]) -> bool:
    """A pod a drain evicts: not a DaemonSet's, not a mirror pod."""
    metadata = pod["metadata"]
    return not any(ref.get("kind") == "DaemonSet" for ref in metadata.get("ownerReferences") or []) and (
        "kubernetes.io/config.mirror" not in (metadata.get("annotations") or {})
    )
