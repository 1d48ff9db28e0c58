"""Replacement before eviction (SURGE_DRAINS, ``queue-processor/drain: surge``) on the real control plane.

Real plane only: a surge scales a Deployment, and the replacement comes from kube-controller-manager's
Deployment and ReplicaSet controllers, placed by kube-scheduler and made Ready by KWOK. The emulation serves no
Deployments (it answers 404, and a surge there falls back to eviction: ``unavailable``, tested in
tests/unit/test_surge.py). Ready replicas are counted at every change of the workload's pods the informer sees
(not sampled on a timer): the lowest count is exact for what the API server published.

Time runs unscaled (1 simulated second = 1 real second).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from queue_processor.drain.drainer import Drainer
from queue_processor.drain.plan import DRAIN_POLICY_ANNOTATION as DRAIN
from queue_processor.drain.plan import DrainOptions, DrainTiming
from queue_processor.drain.surge import SURGE_RECORD_ANNOTATION
from queue_processor.kube import KubeClient, load_api_client
from queue_processor.observe.metrics import Metrics
from queue_processor.outcomes import DrainOutcome
from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.real_kube import RealKube
from tests.unit.test_drainer import told


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[RealKube]:
    with RealKube(SandboxClock(1.0), plane=request.getfixturevalue("control_plane")) as real:
        yield real


@pytest.fixture
async def kube(cluster: RealKube, tmp_path: Path) -> AsyncIterator[KubeClient]:
    client = KubeClient(load_api_client(str(cluster.kubeconfig(tmp_path / "kubeconfig"))))
    yield client
    client.close()


def a_deployment(
    cluster: RealKube, *, replicas: int = 1, budget: bool = True
) -> tuple[str, str, dict[str, str]]:
    """Two fresh Ready nodes and, in a fresh namespace, a Deployment ``web`` of ``replicas`` pods annotated
    ``surge`` (grace 2 s) with (``budget``) a PodDisruptionBudget of ``minAvailable: replicas``: the node one of
    its pods runs on, the namespace, the pods' labels."""
    suffix = uuid.uuid4().hex[:6]
    nodes = [f"ip-10-3-{index}-{suffix}.ec2.internal" for index in range(2)]
    ours = {"surge-test": suffix}  # the Deployment's pods go to this test's nodes only
    for name in nodes:
        cluster.add_node(name, labels=ours)
    cluster.wait_for_nodes(nodes)
    namespace = f"surge-{suffix}"
    labels = {"app": f"web-{suffix}"}
    cluster.add_deployment(
        namespace,
        "web",
        replicas=replicas,
        labels=labels,
        grace_s=2,
        annotations={DRAIN: "surge"},
        node_labels=ours,
    )
    if budget:
        cluster.add_pdb(namespace, "web", match_labels=labels, min_available=replicas)
    placed = sorted(
        (pod["metadata"]["name"], pod["spec"]["nodeName"])
        for pod in cluster.objects("pods")
        if pod["metadata"]["namespace"] == namespace
    )
    return placed[0][1], namespace, labels


def deployment(cluster: RealKube, namespace: str) -> dict[str, Any]:
    found = cluster.get_raw(f"/apis/apps/v1/namespaces/{namespace}/deployments/web")
    assert found is not None
    return found


def surges(metrics: Metrics, result: str) -> float:
    return metrics.registry.get_sample_value("queue_processor_surges_total", {"result": result}) or 0.0


@pytest.mark.parametrize("budget", [True, False], ids=["min-available-1", "no-budget"])
async def test_a_single_replica_deployment_keeps_a_ready_replica_through_the_drain(
    cluster: RealKube, kube: KubeClient, budget: bool
) -> None:
    """The issue's case: one replica, ``minAvailable: 1``. Without a surge the budget refuses the eviction until
    the deadline (the next test); with it the replacement is Ready elsewhere first, the Ready count never drops
    to 0, the node is drained inside a Spot notice, and the Deployment ends as it began. Without a budget
    nothing but the surge's own wait keeps the pod until its replacement is Ready."""
    node, namespace, labels = a_deployment(cluster, budget=budget)
    metrics = Metrics(process_metrics=False)
    drainer = Drainer(kube, DrainOptions(), budget=1, timing=DrainTiming(surge=True), observer=metrics)
    assert await drainer.writes.cordon(node)
    ready = cluster.track_ready(namespace, labels)
    try:
        end = drainer.clock() + 120  # a Spot notice: completed means drained inside it
        result = await drainer.drain(node, end, instance_end=end)
    finally:
        ready.stop()
    assert (result.completed, result.outcome, result.evicted) == (True, DrainOutcome.DRAINED, 1), result
    assert ready.fewest is not None
    assert ready.fewest >= 1, ready.fewest
    assert surges(metrics, "surged") == 1
    after = deployment(cluster, namespace)
    assert after["spec"]["replicas"] == 1
    assert SURGE_RECORD_ANNOTATION not in (after["metadata"].get("annotations") or {})
    cluster.wait_for_ready_pods(namespace, labels, 1)
    # ends as it began: one replica, Ready, on another node
    placed = [
        pod["spec"].get("nodeName")
        for pod in cluster.objects("pods")
        if pod["metadata"]["namespace"] == namespace and not pod["metadata"].get("deletionTimestamp")
    ]
    assert node not in placed


async def test_without_surge_drains_the_annotation_is_reported_and_the_budget_holds_the_pod(
    cluster: RealKube, kube: KubeClient
) -> None:
    node, namespace, _ = a_deployment(cluster)
    metrics = Metrics(process_metrics=False)
    drainer = Drainer(kube, DrainOptions(), budget=1, timing=DrainTiming(surge=False), observer=metrics)
    assert await drainer.writes.cordon(node)
    notices: list[str] = []

    async def noticed(_: str, name: str, reason: str, message: str) -> None:
        assert reason == "SurgeNotPossible"
        notices.append(message)

    result = await drainer.drain(node, drainer.clock() + 4, tell=told(noticed=noticed))
    assert (result.completed, result.outcome, result.blocked) == (False, DrainOutcome.TIMEOUT, 1), result
    assert len(notices) == 1, notices
    assert "needs SURGE_DRAINS=true" in notices[0], notices
    assert f"{namespace}/Deployment/web" in notices[0]
    assert deployment(cluster, namespace)["spec"]["replicas"] == 1  # never scaled
    assert (
        sum(surges(metrics, r) for r in ("surged", "not-ready", "no-time", "autoscaled", "unavailable")) == 0
    )


async def test_a_deployment_an_autoscaler_owns_is_not_scaled(cluster: RealKube, kube: KubeClient) -> None:
    node, namespace, _ = a_deployment(cluster, replicas=2)
    cluster.set_pdb(namespace, "web", min_available=1)
    path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers"
    cluster.plane.request(
        "POST",
        path,
        {
            "metadata": {"name": "web"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 2,
                "maxReplicas": 4,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 80},
                        },
                    }
                ],
            },
        },
    )
    metrics = Metrics(process_metrics=False)
    drainer = Drainer(kube, DrainOptions(), budget=1, timing=DrainTiming(surge=True), observer=metrics)
    assert await drainer.writes.cordon(node)
    end = drainer.clock() + 60
    result = await drainer.drain(node, end, instance_end=end)
    assert result.completed, result
    assert surges(metrics, "autoscaled") == 1
    after = deployment(cluster, namespace)
    assert after["spec"]["replicas"] == 2  # left to the autoscaler
    assert SURGE_RECORD_ANNOTATION not in (after["metadata"].get("annotations") or {})


async def test_a_surge_a_killed_process_left_is_taken_back_by_the_next(
    cluster: RealKube, kube: KubeClient
) -> None:
    """A controller SIGKILLed mid-surge leaves the Deployment a replica up, with its record naming a pod that
    is gone by now. The next surge of that Deployment takes it back in the same write as its own."""
    node, namespace, labels = a_deployment(cluster)
    record = {"base": 1, "pods": {"0b1d0b1d-dead-4bad-8bad-000000000000": "web-gone"}}
    await kube.patch_deployment(
        namespace,
        "web",
        {"metadata": {"annotations": {SURGE_RECORD_ANNOTATION: json.dumps(record)}}, "spec": {"replicas": 2}},
    )
    cluster.wait_for_ready_pods(namespace, labels, 2)
    metrics = Metrics(process_metrics=False)
    drainer = Drainer(kube, DrainOptions(), budget=1, timing=DrainTiming(surge=True), observer=metrics)
    assert await drainer.writes.cordon(node)
    end = drainer.clock() + 120
    result = await drainer.drain(node, end, instance_end=end)
    assert result.completed, result
    after = deployment(cluster, namespace)
    assert after["spec"]["replicas"] == 1, after["spec"]
    assert SURGE_RECORD_ANNOTATION not in (after["metadata"].get("annotations") or {})
    await asyncio.to_thread(cluster.wait_for_ready_pods, namespace, labels, 1)


async def test_an_owner_that_scales_the_surge_back_keeps_its_count(
    cluster: RealKube, kube: KubeClient
) -> None:
    """Issue 47.4: while the surge waits for its replacement, the owner sets the count back (``kubectl scale``,
    a GitOps self-heal). The Deployment controller then reports every replica available at once, and the
    ReplicaSet removes the replacement it was bringing up: the pod is not evicted as if it had come (before:
    ``surged``), it waits until its eviction must start (``undone``), and the owner's count stays."""
    node, namespace, _ = a_deployment(cluster, budget=False)
    metrics = Metrics(process_metrics=False)
    timing = DrainTiming(surge=True, grace_margin_s=2)
    drainer = Drainer(kube, DrainOptions(), budget=1, timing=timing, observer=metrics)
    suffix = namespace.removeprefix("surge-")
    for other in cluster.objects("nodes"):  # the replacement stays Pending: it never comes before the undo
        if (other["metadata"].get("labels") or {}).get("surge-test") == suffix:
            assert await drainer.writes.cordon(other["metadata"]["name"])
    end = drainer.clock() + 30
    draining = asyncio.create_task(drainer.drain(node, end, instance_end=end))
    for _ in range(600):  # until the surge scaled up
        if deployment(cluster, namespace)["spec"]["replicas"] == 2:
            break
        await asyncio.sleep(0.05)
    await kube.patch_deployment(namespace, "web", {"spec": {"replicas": 1}})
    result = await draining
    assert result.completed, result
    assert surges(metrics, "undone") == 1
    assert surges(metrics, "surged") == 0
    after = deployment(cluster, namespace)
    assert after["spec"]["replicas"] == 1
    assert SURGE_RECORD_ANNOTATION not in (after["metadata"].get("annotations") or {})
