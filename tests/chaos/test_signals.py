"""Chaos, part one: the controller as a separate process (`queue-processor run`) against the sandbox, stopped
mid-drain by SIGTERM or SIGKILL, then started again. What a user checks: the process exits within its bound,
messages are visible again (at once after SIGTERM, after their visibility timeout after SIGKILL), nothing
heartbeats after the exit, and the restarted controller finishes the work: every lifecycle action completed,
none timed out, no DaemonSet pod evicted, nothing left in the queue.

Sizes for 2 cores: 4 nodes, 3 of them leaving through terminate lifecycle hooks whose drains a
PodDisruptionBudget holds until the test lets go.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import boto3
import pytest

from queue_processor.permissions import kubernetes_verbs
from queue_processor.sandbox.cluster import ClusterSpec
from queue_processor.sandbox.environment import Sandbox, SandboxOptions
from tests.conftest import KUBERNETES

SCRIPT = str(Path(sys.executable).parent / "queue-processor")
SCALE = 0.01  # hooks: HeartbeatTimeout 6000 s = 60 s real, longer than a kill's 10 s visibility timeout
LEAVING = 3


@pytest.fixture(params=KUBERNETES)
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    options = SandboxOptions(
        nodes=4,
        scale=SCALE,
        visibility_timeout_s=10,
        heartbeat_timeout_s=6000,
        cluster=ClusterSpec(apps=2, pdb_max_unavailable=1),
    )
    real = request.param == "real"
    plane = request.getfixturevalue("control_plane") if real else None
    rbac = request.getfixturevalue("chart_rbac") if real else None
    with Sandbox(
        options, workdir=tmp_path / "sandbox", kubernetes=request.param, plane=plane, rbac=rbac
    ) as running:
        yield running
        assert set(running.kube.requests) <= kubernetes_verbs(), set(running.kube.requests)


class Controller:
    """``queue-processor run`` in its own process, pointed at the sandbox; its output goes to a log file."""

    def __init__(self, sandbox: Sandbox, log: Path, **extra: str) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/tmp"),
            **sandbox.env(),
            "ENABLE_PROMETHEUS_SERVER": "false",
            "PROBES_SERVER_PORT": str(port),
            "SQS_MSG_VISIBILITY_TIMEOUT_SEC": "10",
            "RECEIVE_WAIT_TIME_SEC": "2",
            "SHUTDOWN_TIMEOUT_SEC": "10",
            "NODE_TERMINATION_GRACE_PERIOD": "120",
            "REQUEUE_BACKOFF_BASE_SEC": "1",
            **extra,
        }
        self.log: IO[str] = log.open("a")
        self.process = subprocess.Popen([SCRIPT, "run"], env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self, signum: int, bound_s: float) -> int:
        """Send ``signum`` and wait for the exit; its status. Fails when the process outlives ``bound_s``."""
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"the controller did not exit within {bound_s} s of signal {signum}"
            ) from None
        finally:
            self.log.close()


def queue_depth(sandbox: Sandbox) -> tuple[int, int]:
    sqs = boto3.client("sqs", **sandbox.aws.client_kwargs)
    assert sandbox.queue is not None
    attributes = sqs.get_queue_attributes(
        QueueUrl=sandbox.queue.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]), int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s  # a hang guard, generous for a loaded machine
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        await asyncio.sleep(0.2)


def heartbeats(sandbox: Sandbox) -> int:
    return sum(1 for call in sandbox.aws.calls() if call.operation == "RecordLifecycleActionHeartbeat")


def cordoned(sandbox: Sandbox, nodes: list[str]) -> int:
    return sum(
        1
        for node in nodes
        if ((sandbox.kube.get("nodes", node) or {}).get("spec") or {}).get("unschedulable")
    )


def hold_drains(sandbox: Sandbox, held: bool) -> None:
    for app in ("app-000", "app-001"):
        sandbox.kube.set_pdb(sandbox.cluster.namespace, app, max_unavailable=0 if held else 1)


async def start_draining(
    sandbox: Sandbox, tmp_path: Path, **extra: str
) -> tuple[Controller, list[str], list[str]]:
    hold_drains(sandbox, True)
    leaving = sandbox.instances[:LEAVING]
    actions = [sandbox.aws.terminate_instance(instance.instance_id) for instance in leaving]
    tokens = [action.token for started in actions for action in started]
    nodes = [instance.private_dns_name for instance in leaving]
    first = Controller(sandbox, tmp_path / "controller.log", **extra)
    await until(lambda: cordoned(sandbox, nodes) == LEAVING, 60, "every leaving node cordoned")
    return first, tokens, nodes


async def finish(
    sandbox: Sandbox, tmp_path: Path, tokens: list[str], again: Controller | None = None
) -> None:
    """Let the drains go, start the controller again (or let ``again`` go on), and check the work is done:
    every action completed (none timed out), no DaemonSet pod evicted, no pod evicted twice."""
    hold_drains(sandbox, False)
    again = again or Controller(sandbox, tmp_path / "controller.log")
    try:
        settled = lambda: all(sandbox.aws.action(token).status != "open" for token in tokens)  # noqa: E731
        await until(settled, 120, "every action settled")
        await until(lambda: queue_depth(sandbox) == (0, 0), 60, "the queue empty")
    finally:
        assert again.stop(signal.SIGTERM, 60) == 0
    statuses = [sandbox.aws.action(token).status for token in tokens]
    assert statuses == ["completed"] * len(tokens)
    owners = [pod["metadata"].get("ownerReferences") or [] for pod in sandbox.kube.evictions]
    assert not any(ref.get("kind") == "DaemonSet" for refs in owners for ref in refs)
    evicted = [(pod["metadata"]["namespace"], pod["metadata"]["name"]) for pod in sandbox.kube.evictions]
    assert len(evicted) == len(set(evicted)), "a pod evicted twice: two drains of one node"


async def test_sigterm_mid_drain_exits_in_bound_with_every_message_visible_and_a_restart_finishes(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    first, tokens, _ = await start_draining(sandbox, tmp_path)
    status = first.stop(signal.SIGTERM, 10 + 20)  # SHUTDOWN_TIMEOUT_SEC, and room for a loaded machine
    assert status == 0, (tmp_path / "controller.log").read_text()[-3000:]
    assert queue_depth(sandbox) == (LEAVING, 0)  # visible again at once, none taken by a stray poll
    beats = heartbeats(sandbox)
    await asyncio.sleep(2.0)
    assert heartbeats(sandbox) == beats, "a heartbeat after the controller exited"
    assert queue_depth(sandbox) == (LEAVING, 0)
    assert [sandbox.aws.action(token).status for token in tokens] == ["open"] * LEAVING
    await finish(sandbox, tmp_path, tokens)


async def test_sigkill_mid_drain_and_a_restart_finishes_the_work(sandbox: Sandbox, tmp_path: Path) -> None:
    first, tokens, _ = await start_draining(sandbox, tmp_path)
    assert first.stop(signal.SIGKILL, 30) == -signal.SIGKILL
    assert queue_depth(sandbox) == (0, LEAVING)  # hidden until their visibility timeout (10 s)
    await finish(sandbox, tmp_path, tokens)


async def test_two_replicas_with_leases_one_killed_mid_drain_the_other_finishes(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    namespace = sandbox.env().get("POD_NAMESPACE", "default")
    leases = {"NODE_LEASES": "true", "NODE_LEASE_DURATION_SEC": "15", "POD_NAMESPACE": namespace}
    first, tokens, _ = await start_draining(sandbox, tmp_path, POD_NAME="replica-a", **leases)
    second = Controller(sandbox, tmp_path / "controller.log", POD_NAME="replica-b", **leases)
    assert first.stop(signal.SIGKILL, 30) == -signal.SIGKILL  # its Leases lapse, its messages come back
    await finish(sandbox, tmp_path, tokens, again=second)
