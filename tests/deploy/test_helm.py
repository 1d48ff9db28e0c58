"""The chart with a real Helm (v3, built by ``make cluster-bin`` from the Go module proxy, pinned in
tools/cluster/helm/go.mod): ``helm lint``; ``helm template`` gives the very objects the chart's tests check
(test_chart.py renders with Helm's engine through helm-python-sdk); and on the real control plane the life of
a release as an operator lives it: ``helm install --wait``, ``helm upgrade`` with a value changed,
``helm rollback`` to the first revision, ``helm uninstall``, which leaves none of the release's objects.

The pods run on a KWOK node (they run nothing): what Helm and the API server do is real, the controller in the
pod is not (tests/image run the image itself)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from queue_processor.kube import KubeClient, load_api_client
from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.release import Helm
from tests.conftest import ROOT
from tests.deploy.test_chart import NAMESPACE, RELEASE, VALUE_SETS, Rendered, load_engine

CHART = ROOT / "charts" / "queue-processor"
INSTANCE = "app.kubernetes.io/instance"


@pytest.fixture
def helm(helm_bin: Path, tmp_path: Path) -> Helm:
    return Helm(helm_bin, tmp_path / "helm")


def values_file(path: Path, values: dict[str, Any]) -> Path:
    path.write_text(json.dumps(values))  # JSON is YAML
    return path


def test_helm_lint_passes_strict(helm: Helm, tmp_path: Path) -> None:
    values = values_file(tmp_path / "values.yaml", VALUE_SETS["full"])
    linted = helm("lint", "--strict", str(CHART), "-f", str(values))
    assert "0 chart(s) failed" in linted.stdout


def test_helm_lint_refuses_values_the_schema_refuses(helm: Helm, tmp_path: Path) -> None:
    values = values_file(tmp_path / "values.yaml", {**VALUE_SETS["defaults"], "replicas": "three"})
    linted = helm("lint", "--strict", str(CHART), "-f", str(values), check=False)
    assert linted.returncode != 0
    assert "replicas" in linted.stdout + linted.stderr


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_helm_template_renders_what_the_chart_tests_check(helm: Helm, tmp_path: Path, value_set: str) -> None:
    values = VALUE_SETS[value_set]
    shown = helm(
        "template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_file(tmp_path / "v", values))
    )
    by_helm = sorted((doc for doc in yaml.safe_load_all(shown.stdout) if doc), key=_key)
    chart = load_engine().Chart.load(CHART)
    try:
        by_engine = sorted(
            Rendered(chart.render(values=values, name=RELEASE, namespace=NAMESPACE)).objects, key=_key
        )
    finally:
        chart.close()
    assert [_key(o) for o in by_helm] == [_key(o) for o in by_engine]
    assert by_helm == by_engine


@pytest.fixture
def admin(control_plane: Any, tmp_path: Path) -> Iterator[tuple[Any, Path, KubeClient]]:
    """The sandbox's cluster on the real control plane: (RealKube, an administrator's kubeconfig, a client)."""
    from queue_processor_sandbox.real_kube import RealKube

    with RealKube(SandboxClock(1.0), plane=control_plane) as real:
        kubeconfig = real.kubeconfig(tmp_path / "admin")
        client = KubeClient(load_api_client(str(kubeconfig)))
        try:
            yield real, kubeconfig, client
        finally:
            client.close()


#: Where each kind the chart renders (with nodeLeases and the PodDisruptionBudget) is listed.
LISTED = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}


async def release_objects(client: KubeClient, namespace: str, release: str) -> dict[str, list[str]]:
    """The objects of each kind labelled with the release's instance, and Helm's own release records (Secrets
    ``sh.helm.release.v1.<release>.v<N>``), by kind."""
    found: dict[str, list[str]] = {}
    for kind, path in LISTED.items():
        listed = await client.request(
            "GET", path.format(ns=namespace), query={"labelSelector": f"{INSTANCE}={release}"}
        )
        names = [item["metadata"]["name"] for item in listed.get("items") or []]
        if names:
            found[kind] = sorted(names)
    records = await client.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/secrets",
        query={"labelSelector": f"owner=helm,name={release}"},
    )
    if records.get("items"):
        found["release records"] = sorted(item["metadata"]["name"] for item in records["items"])
    return found


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item.get("value", "") for item in container.get("env") or []}


async def test_install_upgrade_rollback_uninstall_on_the_real_control_plane(
    admin: tuple[Any, Path, KubeClient], helm_bin: Path, tmp_path: Path
) -> None:
    real, kubeconfig, client = admin
    helm = Helm(helm_bin, tmp_path / "helm", kubeconfig)
    suffix = uuid.uuid4().hex[:6]
    release = namespace = f"qp-{suffix}"
    node = f"helm-{suffix}"
    real.add_node(node, labels={"kubernetes.io/os": "linux", "queue-processor.test/helm": suffix})
    real.wait_for_nodes([node])
    # FULL without the objects whose CRDs (Prometheus Operator's, Grafana's) this cluster does not serve.
    unserved = ("serviceMonitor", "prometheusRule", "grafanaDashboard")
    values = {
        **{key: value for key, value in VALUE_SETS["full"].items() if key not in unserved},
        "replicas": 1,
        "nodeSelector": {"queue-processor.test/helm": suffix},
        "logLevel": "info",
    }
    install = ["-n", namespace, "--wait", "--timeout", "5m", str(CHART), "-f"]
    deployment_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{release}-queue-processor"

    helm("install", release, *install, str(values_file(tmp_path / "v1", values)), "--create-namespace")
    # Helm's --wait takes a Deployment as ready once no more than maxUnavailable (the chart's 1) of its pods
    # are unavailable: with one replica, before its pod is; the rollout completes when KWOK makes it Ready.
    first: dict[str, Any] = {}
    for _ in range(600):  # a hang guard of turns, it measures nothing
        first = await client.request("GET", deployment_path)
        if (first.get("status") or {}).get("availableReplicas") == 1:
            break
        await asyncio.sleep(0.1)
    assert (first.get("status") or {}).get("availableReplicas") == 1, first.get("status")
    assert _env(first)["LOG_LEVEL"] == "info"
    installed = await release_objects(client, namespace, release)
    assert set(installed) >= {
        "ServiceAccount",
        "Deployment",
        "ClusterRole",
        "ClusterRoleBinding",
        "release records",
    }

    changed = {**values, "logLevel": "debug"}
    helm("upgrade", release, *install, str(values_file(tmp_path / "v2", changed)))
    upgraded = await client.request("GET", deployment_path)
    assert _env(upgraded)["LOG_LEVEL"] == "debug"
    assert upgraded["metadata"]["generation"] > first["metadata"]["generation"]

    helm("rollback", release, "1", "-n", namespace, "--wait", "--timeout", "5m")
    rolled_back = await client.request("GET", deployment_path)
    assert _env(rolled_back)["LOG_LEVEL"] == "info"
    history = json.loads(helm("history", release, "-n", namespace, "-o", "json").stdout)
    assert [(entry["revision"], entry["status"]) for entry in history] == [
        (1, "superseded"),
        (2, "superseded"),
        (3, "deployed"),
    ]
    assert (await release_objects(client, namespace, release)).keys() == installed.keys()

    helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "5m")
    assert await release_objects(client, namespace, release) == {}
