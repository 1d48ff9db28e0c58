"""Least privilege, proven on the real control plane: the controller runs as a ServiceAccount whose only rights are
the ClusterRole and Role that the Helm chart renders (Helm's own engine), with node Leases, Kubernetes Events and
surge drains on. With every rule, an ASG terminate action is drained and completed with zero HTTP 403 (its node
running a Deployment's pod annotated ``queue-processor/drain: surge``, so the surge's rules are used too);
without any one rule, the API server refuses (403) the requests that rule grants, and a drain that needs them
does not complete (a surge without its rules falls back to eviction: the drain completes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from queue_processor.app import Controller, run_controller
from queue_processor.cli import load_settings
from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions

Rules = list[dict[str, Any]]

#: Without these the drain cannot finish; without the others (Events) it finishes and the refusals are logged.
ESSENTIAL = {"nodes", "pods", "pods/eviction", "leases"}


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        await asyncio.sleep(0.1)


async def drain_one(
    plane: Any, rbac: tuple[Rules, Rules], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, wait_for: str
) -> tuple[Sandbox, bool]:
    """One sandbox, one ASG terminate action; the controller runs until the action is completed (``wait_for``
    "completion") or until the API server has refused something (``"403"``). Whether the action was completed."""
    options = SandboxOptions(
        nodes=2, scale=0.05, heartbeat_timeout_s=600, cluster=ClusterSpec(apps=2, pdb_max_unavailable=1)
    )
    sandbox = Sandbox(options, workdir=tmp_path / "sandbox", kubernetes="real", plane=plane, rbac=rbac)
    sandbox.start()
    try:
        (pod,) = sandbox.kube.add_deployment(  # type: ignore[attr-defined]
            sandbox.cluster.namespace,
            "surge",
            replicas=1,
            labels={"app": "surge"},
            grace_s=1,
            annotations={"queue-processor/drain": "surge"},
        )
        (node,) = {
            p["spec"]["nodeName"] for p in sandbox.kube.objects("pods") if p["metadata"]["name"] == pod
        }
        (instance,) = [
            i for i in sandbox.instances if i.private_dns_name == node
        ]  # its replacement: the other
        for key, value in sandbox.env().items():
            monkeypatch.setenv(key, value)
        settings = load_settings(
            prometheus_server_port=0,
            probes_server_port=0,
            node_leases=True,
            emit_kubernetes_events=True,
            surge_drains=True,
            pod_name="queue-processor-0",
            pod_namespace=sandbox.controller_namespace,
            requeue_backoff_base_sec=0.5,
            receive_wait_time_sec=2,
        )
        stop = asyncio.Event()
        started: list[Controller] = []
        task = asyncio.create_task(
            run_controller(
                settings, stop, kubeconfig=str(sandbox.kubeconfig_path), serve=False, started=started.append
            )
        )
        await until(lambda: bool(started) or task.done(), 30, "controller start")
        (action,) = sandbox.aws.terminate_instance(instance.instance_id)
        completed = lambda: sandbox.aws.action(action.token).status == "completed"  # noqa: E731
        try:
            if wait_for == "completion":
                await until(completed, 60, "lifecycle action completed")
            else:
                await until(lambda: bool(sandbox.kube.denied()), 60, "a request refused")  # type: ignore[attr-defined]
                await asyncio.sleep(1.0)  # what follows the refusal, for the report
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
        return sandbox, completed()
    finally:
        sandbox.stop()


@pytest.fixture
def plane(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("control_plane")


async def test_the_charts_rules_are_enough(
    plane: Any, chart_rbac: tuple[Rules, Rules], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox, completed = await drain_one(plane, chart_rbac, tmp_path, monkeypatch, wait_for="completion")
    assert completed
    assert not sandbox.kube.denied()  # type: ignore[attr-defined]
    used = {what.split()[1] for what in sandbox.kube.requests}
    every = {"nodes", "pods", "pods/eviction", "events", "leases", "deployments", "horizontalpodautoscalers"}
    assert used >= every  # every rule was exercised


def _without(rbac: tuple[Rules, Rules], resource: str) -> tuple[Rules, Rules]:
    cluster, role = rbac
    keep = (
        [r for r in cluster if r["resources"] != [resource]],
        [r for r in role if r["resources"] != [resource]],
    )
    granting = sum(1 for r in [*cluster, *role] if r["resources"] == [resource])  # pods: list, and delete
    assert granting >= 1, f"no rule grants {resource}"
    assert len(keep[0]) + len(keep[1]) == len(cluster) + len(role) - granting
    return keep


@pytest.mark.parametrize(
    "resource",
    ["nodes", "pods", "pods/eviction", "events", "leases", "deployments", "horizontalpodautoscalers"],
)
async def test_without_any_one_rule_something_is_refused(
    resource: str,
    plane: Any,
    chart_rbac: tuple[Rules, Rules],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sandbox, completed = await drain_one(
        plane, _without(chart_rbac, resource), tmp_path, monkeypatch, wait_for="403"
    )
    denied = sandbox.kube.denied()  # type: ignore[attr-defined]
    assert {what.split()[1] for _, what in denied} == {resource}, denied
    assert all(user.startswith("system:serviceaccount:") for user, _ in denied)
    if resource in ESSENTIAL:
        assert not completed, f"the drain completed without the {resource} rule"
