"""Chaos, API faults during drains: the emulated API server answers 500s, 429s with Retry-After and slow
answers, and Auto Scaling throttles completions and answers them 500, while the controller (its own process)
drains three nodes leaving through terminate lifecycle hooks. When the faults end the work completes: every
action completed, none timed out, no DaemonSet pod evicted, nothing left in the queue, a clean exit, no
traceback. (Fault injection is the emulation's and the sandbox's own; the real control plane has none.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from tests.chaos.harness import DRAINING, LEAVING, Controller, settle


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    options = SandboxOptions(
        nodes=4,
        scale=DRAINING.scale,
        visibility_timeout_s=10,
        heartbeat_timeout_s=6000,
        cluster=ClusterSpec(apps=2),
    )
    with Sandbox(options, workdir=tmp_path / "sandbox") as running:
        yield running


async def test_the_work_completes_through_api_faults(sandbox: Sandbox, tmp_path: Path) -> None:
    kube = sandbox.kube
    faults = [
        kube.inject_fault("list", "pods", status=500, count=4),  # type: ignore[attr-defined]
        kube.inject_fault("create", "pods/eviction", status=429, count=6, retry_after_s=2),  # type: ignore[attr-defined]
        kube.inject_fault("patch", "nodes", delay_s=3.0, count=2),  # type: ignore[attr-defined]  # a slow server
    ]
    sandbox.aws.inject_error("CompleteLifecycleAction", "Throttling", "Rate exceeded", times=3)
    sandbox.aws.inject_error(
        "CompleteLifecycleAction", "InternalFailure", "internal error", times=2, status=500
    )
    controller = Controller(sandbox, tmp_path / "controller.log", HEARTBEAT_INTERVAL="30")
    started = time.monotonic()
    leaving = sandbox.instances[:LEAVING]
    tokens = [a.token for instance in leaving for a in sandbox.aws.terminate_instance(instance.instance_id)]
    nodes = [instance.private_dns_name for instance in leaving]
    try:
        await settle(sandbox, tokens, nodes, started, [controller])  # completed, judged clean, clean exit
        left = sandbox.aws.pending_errors()
    finally:
        sandbox.aws.clear_errors()
    assert left == {}  # the throttling and the 500s were all met (a 5xx never reaches calls())
    completions = [c for c in sandbox.aws.calls() if c.operation == "CompleteLifecycleAction"]
    assert sum(1 for c in completions if c.outcome.startswith("Throttling")) == 3  # the faults did happen
    assert [fault.count for fault in faults] == [0, 0, 0]  # every Kubernetes fault was met
