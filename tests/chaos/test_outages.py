"""Chaos, outages while nodes drain: connections reset by the Kubernetes API server, the AWS endpoint gone for
a while, and (on the real control plane) kube-apiserver killed and started again. What a user checks: the
controller lives through it (``/healthz`` passes throughout), ``/readyz`` names the dependency that is gone and
passes again once it is back, and the work completes: every terminate action completed, none timed out, the
judge's verdict clean, a clean exit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.control_plane import ControlPlane
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from queue_processor_sandbox.run import judge
from tests.chaos.harness import DRAINING, LEAVING, Controller, Draining, hold_drains, settle, until


def options() -> SandboxOptions:
    return SandboxOptions(
        nodes=LEAVING + 2,  # one more leaves mid-test; the evicted pods need somewhere to go
        scale=DRAINING.scale,
        visibility_timeout_s=10,
        heartbeat_timeout_s=6000,
        cluster=ClusterSpec(apps=2, pdb_max_unavailable=1),
    )


@pytest.fixture
def emulated(tmp_path: Path) -> Iterator[Sandbox]:
    with Sandbox(options(), workdir=tmp_path / "sandbox") as running:
        yield running


def checks(controller: Controller, path: str) -> dict[str, bool]:
    """The named checks of ``/readyz`` or ``/healthz`` ({} while the server does not answer)."""
    status, body = controller.get(path)
    return dict(json.loads(body).get("checks") or {}) if status in (200, 503) else {}


async def test_resets_and_an_aws_outage_mid_drain(emulated: Sandbox, tmp_path: Path) -> None:
    sandbox = emulated
    draining = Draining(sandbox, tmp_path)
    controller = await draining.first()
    assert checks(controller, "/readyz") == {"sqs": True, "kubernetes": True}
    resets = [
        sandbox.kube.inject_fault("list", "pods", reset=True, count=3),  # type: ignore[attr-defined]
        sandbox.kube.inject_fault("create", "pods/eviction", reset=True, count=3),  # type: ignore[attr-defined]
        sandbox.kube.inject_fault("patch", "nodes", reset=True, count=1),  # type: ignore[attr-defined]
    ]
    sandbox.aws.stop_endpoint()
    try:
        await until(lambda: checks(controller, "/readyz").get("sqs") is False, 60, "/readyz: sqs failing")
        assert checks(controller, "/healthz") == {"receive-loops": True}  # alive: only waiting for AWS
    finally:
        sandbox.aws.restart_endpoint()
    await until(lambda: checks(controller, "/readyz").get("sqs") is True, 60, "/readyz: sqs passing again")
    # A node that joins the drain now meets the node-patch reset on its cordon.
    extra = sandbox.instances[LEAVING]
    draining.tokens += [a.token for a in sandbox.aws.terminate_instance(extra.instance_id)]
    draining.nodes.append(extra.private_dns_name)
    hold_drains(sandbox, False)
    await settle(sandbox, draining.tokens, draining.nodes, draining.started, [controller])
    assert [fault.count for fault in resets] == [0, 0, 0]  # every reset was met
    assert controller.count("receive failed") >= 1


@pytest.fixture
def real(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    plane = request.getfixturevalue("control_plane")
    rbac = request.getfixturevalue("chart_rbac")
    with Sandbox(
        options(), workdir=tmp_path / "sandbox", kubernetes="real", plane=plane, rbac=rbac
    ) as running:
        yield running


async def test_kube_apiserver_killed_and_started_again_mid_drain(
    real: Sandbox, control_plane: ControlPlane, tmp_path: Path
) -> None:
    sandbox, plane = real, control_plane
    draining = Draining(sandbox, tmp_path)
    controller = await draining.first()
    plane.kill("kube-apiserver")
    try:
        # The drains go on trying to evict (the budgets allow nothing), and get no answer.
        await until(
            lambda: checks(controller, "/readyz").get("kubernetes") is False, 60, "kubernetes failing"
        )
        assert checks(controller, "/healthz") == {"receive-loops": True}
    finally:
        plane.start_again("kube-apiserver")
    await until(
        lambda: checks(controller, "/readyz").get("kubernetes") is True, 120, "kubernetes passing again"
    )

    # A kube-apiserver that has just started may answer 403 for a moment (its RBAC informers not synced yet,
    # though /readyz passes): the controller's evictions are denied until then, and only then. Once the API
    # server refuses one for the budget (429), RBAC is back: no denial may follow.
    def budget_refusals() -> float:
        name = "queue_processor_kube_requests_total"
        return controller.metric(name, verb="create", resource="pods/eviction", code="429")

    refused = budget_refusals()
    await until(lambda: budget_refusals() > refused, 120, "an eviction refused by the budget, not by RBAC")
    denied_while_starting = judge(sandbox, draining.nodes, draining.started)["evictions_denied"]
    hold_drains(sandbox, False)
    expected = {"evictions_denied": denied_while_starting}
    await settle(sandbox, draining.tokens, draining.nodes, draining.started, [controller], expected)
