"""Several clusters in one account and region (issue 29, part 4): one AWS sandbox, two Kubernetes API servers,
two queues with their own EventBridge rules (on the one default bus: EC2's events reach both queues, as they do
in such an account), two controllers. Each controller acts only on its own cluster's instances, told apart by
MANAGED_TAG / MANAGED_TAG_VALUE (the tag ``eks:cluster-name`` EKS managed node groups put on their instances),
and acknowledges the other's messages without a drain, a retry or a dead-letter.

The first cluster runs on the emulation or on the real control plane; the second on an emulation of its own
(Nodes are cluster-scoped: two clusters need two API servers)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Neighbour, Sandbox, SandboxOptions
from queue_processor_sandbox.run import judge
from tests.chaos.harness import Controller, sandbox_on, until
from tests.conftest import KUBERNETES

TAG = "eks:cluster-name"


@pytest.fixture(params=KUBERNETES)
def blue(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    options = SandboxOptions(
        nodes=4, scale=0.05, visibility_timeout_s=10, tags={TAG: "blue"}, cluster=ClusterSpec(apps=2)
    )
    with sandbox_on(request, options, tmp_path / "blue", granted=False) as sandbox:
        yield sandbox


def drained(kube: object, node: str) -> bool:
    """Cordoned (or gone) with no pod left but DaemonSet and mirror pods."""
    get = kube.get  # type: ignore[attr-defined]
    found = get("nodes", node)
    if found is not None and not (found.get("spec") or {}).get("unschedulable"):
        return False
    return not [
        pod
        for pod in kube.objects("pods")  # type: ignore[attr-defined]
        if pod["spec"].get("nodeName") == node
        and not any(ref.get("kind") == "DaemonSet" for ref in pod["metadata"].get("ownerReferences") or [])
        and "kubernetes.io/config.mirror" not in (pod["metadata"].get("annotations") or {})
    ]


async def test_two_clusters_in_one_account_each_drain_only_their_own(blue: Sandbox, tmp_path: Path) -> None:
    with Neighbour(
        blue, "green", nodes=4, tags={TAG: "green"}, workdir=tmp_path / "green", cluster=ClusterSpec(apps=2)
    ) as green:
        started = time.monotonic()
        own = {"MANAGED_TAG": TAG}
        controllers = [
            Controller(blue, tmp_path / "blue.log", **own, MANAGED_TAG_VALUE="blue"),
            Controller(
                blue,
                tmp_path / "green.log",
                **green.env(),
                **own,
                MANAGED_TAG_VALUE="green",
                POD_NAMESPACE="kube-system",
            ),
        ]
        for controller in controllers:
            await until(lambda c=controller: c.count("consuming") == 1, 60, "each controller consuming")
        # In each cluster: a Spot warning for one instance, a scale-in of another (its terminate hook).
        interrupted = {"blue": blue.instances[:2], "green": green.instances[:2]}
        tokens = []
        for instances in interrupted.values():
            blue.aws.spot_interruption(instances[0].instance_id)
            tokens += [action.token for action in blue.aws.terminate_instance(instances[1].instance_id)]
        leaving = {name: [i.private_dns_name for i in instances] for name, instances in interrupted.items()}
        kubes = {"blue": blue.kube, "green": green.kube}
        try:
            await until(
                lambda: all(drained(kubes[name], node) for name, nodes in leaving.items() for node in nodes),
                180,
                "each cluster's leaving nodes drained",
            )
            await until(
                lambda: all(blue.aws.action(token).status != "open" for token in tokens),
                120,
                "actions settled",
            )
            await until(
                lambda: all(
                    c.visible + c.in_flight + c.dlq == 0 for c in (blue.queue_counts(), green.queue_counts())
                ),
                120,
                "both queues empty",
            )
        finally:
            statuses = [controller.stop(signal.SIGTERM, 60) for controller in controllers]
        assert statuses == [0, 0]
        for controller in controllers:
            controller.assert_clean_exit()
        # Each terminate action completed once, with CONTINUE, by its own cluster's controller.
        assert [(blue.aws.action(t).status, blue.aws.action(t).result) for t in tokens] == [
            ("completed", "CONTINUE")
        ] * 2
        # Nobody touched a node of the other cluster, nor a node of its own that was not leaving.
        for name, kube in kubes.items():
            evicted_on = {pod["spec"].get("nodeName") for pod in kube.evictions}
            assert evicted_on <= set(leaving[name]), (name, evicted_on)
            staying = [
                node["metadata"]["name"]
                for node in kube.objects("nodes")
                if node["metadata"]["name"] not in leaving[name]
            ]
            assert staying
            assert not any(
                (kube.get("nodes", node) or {}).get("spec", {}).get("unschedulable") for node in staying
            )
        # Each controller saw the other cluster's instances and left them alone at once: no retry, no DLQ.
        for controller, other in zip(controllers, ("green", "blue"), strict=True):
            ignored = {
                line.get("instance_id")
                for line in controller.lines()
                if line.get("event") == "instance not managed: ignored"
            }
            assert {i.instance_id for i in interrupted[other]} <= ignored, (other, ignored)
            assert controller.count("requeued") == 0
        verdict = judge(blue, leaving["blue"], started)
        assert (verdict["dlq"], verdict["heartbeats_after_end"], verdict["nodes_drained_twice"]) == (0, 0, 0)
