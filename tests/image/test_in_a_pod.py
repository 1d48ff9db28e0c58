"""The controller as users run it: its image, installed by ``helm install`` from the chart, in a pod that a real
kubelet runs on a real node of the real control plane (:mod:`queue_processor_sandbox.real_node`), beside the
sandbox's KWOK nodes it drains. The pod reaches the API server through the ``kubernetes`` Service's ClusterIP
with its mounted ServiceAccount token and the chart's RBAC, and the sandbox's AWS through an address the node
forwards to loopback; nothing else differs from a cluster's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from queue_processor_sandbox.environment import Sandbox
from queue_processor_sandbox.processes import Samples, parse_metrics, total
from queue_processor_sandbox.real_node import RealNode, RealNodeError
from queue_processor_sandbox.release import AWS_SERVICE, NODE_LABEL, Release, is_ready, json_lines, wait_for
from tests.chaos.harness import (
    DRAINING,
    LEAVING,
    Draining,
    assert_judged_clean,
    cordoned,
    hold_drains,
    queue_depth,
)
from tests.conftest import REQUIRE_REAL_CLUSTER

CHART = Path(__file__).resolve().parents[2] / "charts" / "queue-processor"


@pytest.fixture
def sandbox(control_plane: Any, tmp_path: Path) -> Iterator[Sandbox]:
    with Sandbox(DRAINING, workdir=tmp_path / "sandbox", kubernetes="real", plane=control_plane) as running:
        yield running


def real_node(
    control_plane: Any,
    sandbox: Sandbox,
    image: str,
    workdir: Path,
    name: str,
    label: str,
    provider_id: str = "",
) -> RealNode:
    """A real node named ``name`` for the controller's pod (``NODE_LABEL`` set to ``label``), its image imported,
    the sandbox's AWS forwarded; skipped (failed in CI) when this machine cannot run one."""
    moto_port = int(sandbox.env()["AWS_ENDPOINT"].rsplit(":", 1)[1])
    try:
        return RealNode(
            control_plane,
            name,
            workdir,
            provider_id=provider_id,
            labels={NODE_LABEL: label},
            images=(image,),
            forwards={AWS_SERVICE: moto_port},
        )
    except RealNodeError as exc:
        if REQUIRE_REAL_CLUSTER:
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture
def node(control_plane: Any, sandbox: Sandbox, image: str, tmp_path: Path) -> Iterator[RealNode]:
    """A real node for the controller's pod, its image imported, the sandbox's AWS forwarded."""
    suffix = uuid.uuid4().hex[:6]
    with real_node(control_plane, sandbox, image, tmp_path / "node", f"real-{suffix}", suffix) as real:
        yield real


def scrape_pod(address: str) -> Samples:
    """``/metrics`` of the pod at ``address``, through its metrics port (the chart's default, 9092)."""
    with urllib.request.urlopen(f"http://{address}:9092/metrics", timeout=10) as answer:
        return parse_metrics(answer.read().decode())


def release_of(sandbox: Sandbox, node: RealNode, image: str, helm_bin: Path, tmp_path: Path) -> Release:
    """The chart, to be installed by Helm with its pod on ``node``."""
    return Release(sandbox, node, image, helm_bin, CHART, tmp_path / "release")


async def test_a_storm_drained_by_the_pod_helm_installed_on_a_real_node(
    sandbox: Sandbox, node: RealNode, image: str, helm_bin: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    release = release_of(sandbox, node, image, helm_bin, tmp_path)
    release.apply()
    # helm --wait accepts a Deployment of one replica with none Ready (maxUnavailable 1): wait for the pod.
    (pod,) = await wait_for("the controller's pod Ready", release.ready, 120)
    assert pod["spec"]["nodeName"] == node.name  # /readyz passed: the queue reached with the chart's values
    log = release.open_log()

    leaving = sandbox.instances[:LEAVING]
    nodes = [instance.private_dns_name for instance in leaving]
    tokens = [a.token for i in leaving for a in sandbox.aws.terminate_instance(i.instance_id)]
    completed = lambda: all(sandbox.aws.action(t).status == "completed" for t in tokens)  # noqa: E731
    await wait_for("every lifecycle action completed by the pod", completed)
    await wait_for("the queue empty", lambda: queue_depth(sandbox) == (0, 0), 60)

    samples = await asyncio.to_thread(scrape_pod, pod["status"]["podIP"])
    assert total(samples, "queue_processor_messages_received_total") >= LEAVING

    release.uninstall()
    # Helm waits for its Deployment to go; the pod goes after it, once the kubelet saw its container exit.
    await wait_for("the controller's pod gone", lambda: not release.pods(), 120)
    lines = json_lines(log)
    log.close()
    stopped = [line for line in lines if line.get("event") == "stopped"]
    assert stopped, lines[-5:]  # the kubelet's SIGTERM reached the controller: it stopped
    assert {k: stopped[-1][k] for k in ("tasks_left", "operations_left", "heartbeats_left")} == dict.fromkeys(
        ("tasks_left", "operations_left", "heartbeats_left"), 0
    )
    assert_judged_clean(sandbox, nodes, started)


async def test_kill_9_of_the_container_the_kubelet_restarts_it_and_it_finishes_the_work(
    sandbox: Sandbox, node: RealNode, image: str, helm_bin: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    draining = Draining(sandbox, tmp_path)  # three terminate hooks, their drains held by the budgets
    release = release_of(sandbox, node, image, helm_bin, tmp_path)
    release.apply()
    (pod,) = await wait_for("the controller's pod Ready", release.ready, 120)
    await wait_for("every leaving node cordoned", lambda: cordoned(sandbox, draining.nodes) == LEAVING)
    (status,) = pod["status"]["containerStatuses"]
    os.kill(node.pid_of(status["containerID"]), signal.SIGKILL)
    restarted = lambda: (p := release.ready()) and p[0]["status"]["containerStatuses"][0]["restartCount"] >= 1  # noqa: E731
    await wait_for("the container restarted by the kubelet, Ready", restarted)
    hold_drains(sandbox, False)
    completed = lambda: all(sandbox.aws.action(t).status == "completed" for t in draining.tokens)  # noqa: E731
    await wait_for("every lifecycle action completed after the restart", completed)
    await wait_for("the queue empty", lambda: queue_depth(sandbox) == (0, 0), 120)
    assert_judged_clean(sandbox, draining.nodes, started)


async def test_helm_upgrade_to_two_replicas_mid_storm_rolls_out_on_the_real_node(
    sandbox: Sandbox, node: RealNode, image: str, helm_bin: Path, tmp_path: Path
) -> None:
    """NTH's seed 004 for real: the upgrade replaces the pod while drains are held; two pods of the new
    revision on one node (no host port), node Leases between them, no action timed out, no node drained
    twice."""
    started = time.monotonic()
    draining = Draining(sandbox, tmp_path)
    release = release_of(sandbox, node, image, helm_bin, tmp_path)
    release.apply()
    await wait_for("the controller's pod Ready", release.ready, 120)
    await wait_for("every leaving node cordoned", lambda: cordoned(sandbox, draining.nodes) == LEAVING)
    release.apply(replicas=2, nodeLeases=True, logLevel="debug")
    pods = await wait_for("two pods of the new revision Ready", lambda: release.ready(2), 180)
    assert {pod["spec"]["nodeName"] for pod in pods} == {node.name}
    hold_drains(sandbox, False)
    completed = lambda: all(sandbox.aws.action(t).status == "completed" for t in draining.tokens)  # noqa: E731
    await wait_for("every lifecycle action completed across the rollout", completed)
    await wait_for("the queue empty", lambda: queue_depth(sandbox) == (0, 0), 120)
    assert_judged_clean(sandbox, draining.nodes, started)


def pod_ready(release: Release) -> bool | None:
    """Whether the release's one pod is Ready as the kubelet reports it (``None`` while it has no pod)."""
    pods = release.pods()
    if len(pods) != 1:
        return None
    return is_ready(pods[0])


async def test_the_pod_is_not_ready_while_sqs_refuses_it_and_ready_again_after(
    sandbox: Sandbox, node: RealNode, image: str, helm_bin: Path, tmp_path: Path
) -> None:
    """The chart's readiness probe as documented: /readyz fails when SQS stopped answering (the kubelet marks
    the pod not ready, it is not restarted), and passes again once SQS answers."""
    release = release_of(sandbox, node, image, helm_bin, tmp_path)
    release.values["probes"] = {
        "readiness": {
            "initialDelaySeconds": 1,
            "periodSeconds": 1,
            "timeoutSeconds": 2,
            "failureThreshold": 1,
        }
    }
    release.apply()
    await wait_for("the controller's pod Ready", release.ready, 120)
    node.refuse(AWS_SERVICE)
    await wait_for("the pod not ready while SQS refuses it", lambda: pod_ready(release) is False, 120)
    node.refuse(AWS_SERVICE, refused=False)
    (pod,) = await wait_for("the pod Ready again once SQS answers", release.ready, 120)
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0


@pytest.fixture
def slower(control_plane: Any, tmp_path: Path) -> Iterator[Sandbox]:
    """:data:`DRAINING` at a quarter of real time: a Spot notice lasts 30 s, time for a kubelet to evict a pod
    and for its successor to start; the hooks' HeartbeatTimeout (6,000 s) is 25 minutes."""
    options = replace(DRAINING, scale=0.25)
    with Sandbox(options, workdir=tmp_path / "sandbox", kubernetes="real", plane=control_plane) as running:
        yield running


async def test_a_spot_warning_for_the_controller_s_own_node_hands_its_work_to_a_successor(
    slower: Sandbox, control_plane: Any, image: str, helm_bin: Path, tmp_path: Path
) -> None:
    """The controller's own node gets a Spot warning while it drains three others (their budgets hold them).
    It keeps draining them until the last moment before its instance's end, cordons and drains its node and
    evicts its own pod last; the kubelet sends SIGTERM for real, the controller stops with nothing left and its
    messages visible; the ReplicaSet's replacement runs on the other real node and completes every lifecycle
    action once the budgets let the pods go."""
    sandbox = slower
    started = time.monotonic()
    label = uuid.uuid4().hex[:6]
    (own,) = sandbox.aws.create_asg(f"system-{label}", 1)  # a group of its own: no KWOK node for it
    with real_node(
        control_plane, sandbox, image, tmp_path / "own", own.private_dns_name, label, own.provider_id
    ) as first:
        draining = Draining(sandbox, tmp_path)
        release = release_of(sandbox, first, image, helm_bin, tmp_path)
        release.apply()
        (pod,) = await wait_for("the controller's pod Ready", release.ready, 120)
        assert pod["spec"]["nodeName"] == first.name
        log = release.open_log()
        await wait_for("every leaving node cordoned", lambda: cordoned(sandbox, draining.nodes) == LEAVING)
        with real_node(control_plane, sandbox, image, tmp_path / "other", f"real-{label}", label) as second:
            sandbox.aws.spot_interruption(own.instance_id)

            def successor() -> bool:
                pods = release.ready()
                return bool(pods) and pods[0]["spec"]["nodeName"] == second.name  # type: ignore[index]

            await wait_for("the successor Ready on the other node", successor, 180)
            first_pod = pod["metadata"]["name"]
            gone = lambda: all(p["metadata"]["name"] != first_pod for p in release.pods())  # noqa: E731
            await wait_for("the evicted pod gone, its container ended", gone, 120)
            lines = json_lines(log)
            log.close()
            hold_drains(sandbox, False)
            completed = lambda: all(sandbox.aws.action(t).status == "completed" for t in draining.tokens)  # noqa: E731
            await wait_for("every lifecycle action completed by the successor", completed)
            await wait_for("the queue empty", lambda: queue_depth(sandbox) == (0, 0), 120)
    (tmp_path / "first-pod.log").write_text("".join(json.dumps(line) + "\n" for line in lines))
    events = [line.get("event") for line in lines]
    assert "our own node is drained: staying until the other drains here end" in events
    staying = events.index("our own node is drained: staying until the other drains here end")
    assert "leaving our own node: evicting our own pod, last" in events[staying:], lines[staying:]
    account = f"system:serviceaccount:{release.namespace}:{pod['spec']['serviceAccountName']}"
    assert evictions(control_plane, account, first_pod) == [201]  # the kubelet's SIGTERM came from it
    stopped = [line for line in lines if line.get("event") == "stopped"]
    assert stopped, lines[-5:]  # the kubelet's SIGTERM reached it
    left = ("tasks_left", "operations_left", "heartbeats_left")
    assert {key: stopped[-1][key] for key in left} == dict.fromkeys(left, 0)
    assert all(sandbox.aws.action(t).result == "CONTINUE" for t in draining.tokens)
    assert sandbox.queue_counts().dlq == 0
    assert_judged_clean(sandbox, draining.nodes, started)


def evictions(plane: Any, account: str, pod: str) -> list[int]:
    """The answers (HTTP status codes) to ``account``'s evictions of ``pod`` in the API server's audit log."""
    events, _ = plane.audit_events(0)
    return [
        event["responseStatus"]["code"]
        for event in events
        if event.get("stage") == "ResponseComplete"
        and (event.get("user") or {}).get("username") == account
        and (event.get("objectRef") or {}).get("subresource") == "eviction"
        and (event.get("objectRef") or {}).get("name") == pod
    ]


def credentials(plane: Any, account: str, offset: int) -> tuple[set[str], int]:
    """The credential IDs (``JTI=…`` of ServiceAccount tokens) of ``account``'s requests in the API server's
    audit log since byte ``offset``, and the offset to read from next."""
    events, offset = plane.audit_events(offset)
    seen = {
        credential
        for event in events
        if (event.get("user") or {}).get("username") == account
        for credential in (
            (event["user"].get("extra") or {}).get("authentication.kubernetes.io/credential-id") or []
        )
    }
    return seen, offset


async def test_the_pod_follows_its_token_when_the_kubelet_writes_a_new_one(
    sandbox: Sandbox, node: RealNode, image: str, helm_bin: Path, control_plane: Any, tmp_path: Path
) -> None:
    """In-cluster configuration from the pod's projected ServiceAccount token, rotated for real: the kubelet,
    restarted (as an upgrade does), requests a new token and writes it into the pod's volume; the controller,
    retrying evictions its budgets refuse meanwhile, sends the new one within the client's refresh period (it
    reads the file again every minute), and finishes its drains with it."""
    started = time.monotonic()
    _, offset = control_plane.audit_events(0)
    draining = Draining(sandbox, tmp_path)
    release = release_of(sandbox, node, image, helm_bin, tmp_path)
    release.apply()
    (pod,) = await wait_for("the controller's pod Ready", release.ready, 120)
    await wait_for("every leaving node cordoned", lambda: cordoned(sandbox, draining.nodes) == LEAVING)
    account = f"system:serviceaccount:{release.namespace}:{pod['spec']['serviceAccountName']}"
    first, offset = credentials(control_plane, account, offset)
    assert first  # its requests so far, with the token the pod started with
    node.restart_kubelet()
    rotated: set[str] = set()

    def new_token_used() -> bool:
        nonlocal offset
        found, offset = credentials(control_plane, account, offset)
        rotated.update(found - first)
        return bool(rotated)

    await wait_for("a request with the new token", new_token_used, 240)
    hold_drains(sandbox, False)
    completed = lambda: all(sandbox.aws.action(t).status == "completed" for t in draining.tokens)  # noqa: E731
    await wait_for("every lifecycle action completed with the new token", completed)
    await wait_for("the queue empty", lambda: queue_depth(sandbox) == (0, 0), 60)
    (pod,) = release.pods()
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert_judged_clean(sandbox, draining.nodes, started)


async def test_a_frozen_controller_fails_its_liveness_probe_and_the_kubelet_restarts_it(
    sandbox: Sandbox, node: RealNode, image: str, helm_bin: Path, tmp_path: Path
) -> None:
    """The chart's liveness probe as documented: a controller that no longer answers ``/healthz`` (its process
    stopped, SIGSTOP: a hung process) fails the probe, and the kubelet restarts the container after
    ``failureThreshold`` periods and ``terminationGracePeriodSeconds`` (the frozen process cannot handle the
    SIGTERM; the SIGKILL ends it). The new process finishes the drains the frozen one held; meanwhile the
    messages it held reappeared at their visibility timeout."""
    started = time.monotonic()
    draining = Draining(sandbox, tmp_path)
    release = release_of(sandbox, node, image, helm_bin, tmp_path)
    release.values["probes"] = {
        "liveness": {
            "initialDelaySeconds": 10,
            "periodSeconds": 2,
            "timeoutSeconds": 1,
            "failureThreshold": 2,
        }
    }
    release.values["terminationGracePeriodSeconds"] = 5
    release.apply()
    (pod,) = await wait_for("the controller's pod Ready", release.ready, 120)
    await wait_for("every leaving node cordoned", lambda: cordoned(sandbox, draining.nodes) == LEAVING)
    (status,) = pod["status"]["containerStatuses"]
    os.kill(node.pid_of(status["containerID"]), signal.SIGSTOP)

    def restarted() -> dict[str, Any] | None:
        pods = release.ready()
        status = pods[0]["status"]["containerStatuses"][0] if pods else {}
        return status if status.get("restartCount", 0) >= 1 else None

    status = await wait_for("the container restarted by the kubelet, Ready", restarted)
    assert status["lastState"]["terminated"]["exitCode"] == 137  # killed: it never handled the SIGTERM
    hold_drains(sandbox, False)
    completed = lambda: all(sandbox.aws.action(t).status == "completed" for t in draining.tokens)  # noqa: E731
    await wait_for("every lifecycle action completed after the restart", completed)
    await wait_for("the queue empty", lambda: queue_depth(sandbox) == (0, 0), 120)
    assert_judged_clean(sandbox, draining.nodes, started)
