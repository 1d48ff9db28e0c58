"""A rollout on a single control-plane node, on the real control plane (DESIGN.md rule 8; kOps' stuck upgrade).

The chart's objects, rendered by Helm's own engine with the ``tolerations`` and ``nodeSelector`` a kOps user
sets to run the controller on the control plane, are created on the real API server (which validates them);
the Deployment's pod is scheduled by the real kube-scheduler onto the only node labelled and tainted as kOps
labels and taints a control plane, and KWOK runs it. The upgrade (a new pod template) must complete there: the
old pod may go first, nothing needs a second node or a free host port. The same upgrade with a host port and
``maxUnavailable: 0`` (what NTH's chart did) must stay Pending: the test can fail.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from queue_processor.kube import KubeClient, load_api_client
from queue_processor_sandbox.clock import SandboxClock
from tests.conftest import ROOT
from tests.deploy.test_chart import load_engine

CHART = ROOT / "charts" / "queue-processor"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
KOPS_VALUES = {
    "queueURL": "https://sqs.us-east-1.amazonaws.com/123456789012/queue-processor",
    "tolerations": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {CONTROL_PLANE_LABEL: ""},
}
#: Where each kind the chart renders is created: (collection path, namespaced).
PATHS = {
    "ServiceAccount": ("/api/v1", True),
    "Secret": ("/api/v1", True),
    "Service": ("/api/v1", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", True),
    "Deployment": ("/apis/apps/v1", True),
    "PodDisruptionBudget": ("/apis/policy/v1", True),
}


def plural(kind: str) -> str:
    return kind.lower() + ("es" if kind.endswith("s") else "s")


@pytest.fixture
def cluster(control_plane: Any, tmp_path: Path) -> Iterator[tuple[Any, KubeClient]]:
    from queue_processor_sandbox.real_kube import RealKube

    with RealKube(SandboxClock(1.0), plane=control_plane) as real:
        client = KubeClient(load_api_client(str(real.kubeconfig(tmp_path / "admin"))))
        try:
            yield real, client
        finally:
            client.close()


def rendered(values: dict[str, Any], release: str, namespace: str) -> list[dict[str, Any]]:
    chart = load_engine().Chart.load(str(CHART))
    try:
        files = chart.render(values=values, name=release, namespace=namespace)
    finally:
        chart.close()
    return [
        doc
        for path, text in sorted(files.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


async def create(client: KubeClient, obj: dict[str, Any], namespace: str) -> None:
    base, namespaced = PATHS[obj["kind"]]
    where = f"{base}/namespaces/{namespace}" if namespaced else base
    await client.request("POST", f"{where}/{plural(obj['kind'])}", body=obj)


def host_port(deployment: dict[str, Any]) -> dict[str, Any]:
    """NTH's chart's shape: the metrics port bound on the host, and no pod may go before its successor runs."""
    changed = copy.deepcopy(deployment)
    (container,) = changed["spec"]["template"]["spec"]["containers"]
    for port in container.get("ports") or []:
        port["hostPort"] = port["containerPort"]
    changed["spec"]["strategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    return changed


async def until(what: str, check: Any, timeout_s: float = 120.0) -> Any:
    """Poll ``check()`` (async) until it returns something true; a hang guard, it measures nothing."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("shape", ["chart", "host-port"])
async def test_an_upgrade_rolls_out_on_a_single_control_plane_node(
    cluster: tuple[Any, KubeClient], shape: str
) -> None:
    real, client = cluster
    suffix = uuid.uuid4().hex[:6]
    release, namespace = f"qp-{suffix}", f"qp-{suffix}"
    node = f"control-plane-{suffix}"
    real.add_node(node, labels={CONTROL_PLANE_LABEL: "", "kubernetes.io/os": "linux"})
    real.wait_for_nodes([node])
    await client.patch_node(
        node, {"spec": {"taints": [{"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"}]}}
    )
    real.ensure_namespace(namespace)

    objects = rendered(KOPS_VALUES, release, namespace)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    if shape == "host-port":
        deployment.update(host_port(deployment))
    for obj in objects:
        await create(client, obj, namespace)
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment['metadata']['name']}"
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())

    async def pods() -> list[dict[str, Any]]:
        answer = await client.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector}
        )
        return list(answer.get("items") or [])

    async def rolled_out() -> bool:
        found = await client.request("GET", path)
        status, spec = found.get("status") or {}, found["spec"]
        return (
            status.get("observedGeneration", 0) >= found["metadata"]["generation"]
            and status.get("updatedReplicas") == spec["replicas"]
            and status.get("availableReplicas") == spec["replicas"]
            and status.get("replicas") == spec["replicas"]
        )

    await until("the first rollout", rolled_out)
    (first,) = await pods()
    assert first["spec"]["nodeName"] == node  # the one node its nodeSelector and tolerations allow

    # The upgrade: the chart rendered again with a new pod template, replacing the Deployment.
    upgraded = copy.deepcopy(deployment)
    upgraded["spec"]["template"]["metadata"].setdefault("annotations", {})["upgrade"] = suffix
    current = await client.request("GET", path)
    upgraded["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await client.request("PUT", path, body=upgraded)

    if shape == "chart":
        await until("the upgrade rolled out", rolled_out)
        (pod,) = [
            p for p in await pods() if not p["metadata"].get("deletionTimestamp")
        ]  # the old one may linger
        assert pod["metadata"]["name"] != first["metadata"]["name"]
        assert pod["spec"]["nodeName"] == node
        return

    async def pending() -> dict[str, Any] | None:
        for pod in await pods():
            conditions = (pod.get("status") or {}).get("conditions") or []
            if any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions):
                return pod
        return None

    stuck = await until("the scheduler's verdict on the new pod", pending)
    (scheduled,) = [c for c in stuck["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled["reason"] == "Unschedulable"
    assert "free ports" in scheduled["message"], scheduled["message"]
    assert not await rolled_out()  # kOps' stuck upgrade: the old pod holds the port and may not go first
