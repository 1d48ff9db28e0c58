"""Chaos, the seeds' failures: a drain that fails again and again before it succeeds, and a warm-pool launch
whose lifecycle action is already over when the controller gets to it. On the real control plane and the
emulation alike; the controller runs as its own process.

- A drain that cannot finish (a PodDisruptionBudget allows no eviction, NODE_TERMINATION_GRACE_PERIOD 3 s) is
  an EarlyExit and a requeue, several times over. The terminate action survives them all, well past its
  HeartbeatTimeout, because it is heartbeated across the requeues (DESIGN.md rule 9) but never while its
  message sits in the queue held by nobody (the judge's ``heartbeats_after_end``). Once the budget allows it
  the next attempt drains the node and completes the action.
- A launch action from the warm pool completed by somebody else before the controller handled it: AWS's
  ``No active Lifecycle Action found`` is terminal, counted, and the message deleted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from tests.chaos.harness import Controller, hold_drains, settle, until
from tests.conftest import KUBERNETES


def start(request: pytest.FixtureRequest, tmp_path: Path, options: SandboxOptions) -> Sandbox:
    real = request.param == "real"
    return Sandbox(
        options,
        workdir=tmp_path / "sandbox",
        kubernetes=request.param,
        plane=request.getfixturevalue("control_plane") if real else None,
        rbac=request.getfixturevalue("chart_rbac") if real else None,
    )


@pytest.fixture(params=KUBERNETES)
def real_time(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    """Real time (scale 1): the controller reads the hook's 30 s HeartbeatTimeout (AWS's minimum) and
    heartbeats every 15 s. Pods end at once (grace 0) so that an attempt the budget allows fits in 3 s. The
    queue's maxReceiveCount is high: with the default 5, a sixth attempt finds the message in the dead-letter
    queue (as SQS does), its heartbeat stops and the action times out (seen on a loaded machine)."""
    options = SandboxOptions(
        nodes=3,
        scale=1.0,
        visibility_timeout_s=10,
        max_receive_count=50,  # the queue's redrive would take the message away after 5 receives
        heartbeat_timeout_s=30,
        cluster=ClusterSpec(apps=2, grace_s=0, empty_dir_pods=0, unreplicated_pods=0),
    )
    with start(request, tmp_path, options) as running:
        yield running


async def test_a_drain_that_fails_again_and_again_then_succeeds_never_loses_its_action(
    real_time: Sandbox, tmp_path: Path
) -> None:
    sandbox = real_time
    started = time.monotonic()
    hold_drains(sandbox, True)
    instance = sandbox.instances[0]
    (action,) = sandbox.aws.terminate_instance(instance.instance_id)
    controller = Controller(sandbox, tmp_path / "controller.log", NODE_TERMINATION_GRACE_PERIOD="3")
    failed = lambda: controller.count("drain incomplete: requeued")  # noqa: E731
    beats = lambda: sandbox.aws.action(action.token).heartbeats  # noqa: E731
    # Three failed attempts, and two beats (the action now older than its 30 s HeartbeatTimeout).
    await until(lambda: failed() >= 3 and beats() >= 2, 180, "three failed drains and two heartbeats")
    assert sandbox.aws.action(action.token).status == "open"
    for app in ("app-000", "app-001"):
        sandbox.kube.set_pdb(sandbox.cluster.namespace, app, max_unavailable="100%")
    verdict = await settle(sandbox, [action.token], [instance.private_dns_name], started, [controller])
    assert verdict["drained"] == 1
    assert controller.count("drained") == 1


@pytest.fixture(params=KUBERNETES)
def warm_pool(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    options = SandboxOptions(nodes=2, scale=0.05, visibility_timeout_s=10, launch_hooks=True)
    with start(request, tmp_path, options) as running:
        yield running


async def test_a_warm_pool_launch_already_over_is_counted_and_deleted(
    warm_pool: Sandbox, tmp_path: Path
) -> None:
    sandbox = warm_pool
    group = sandbox.instances[0].asg_name
    autoscaling = sandbox.aws.client("autoscaling")
    autoscaling.put_warm_pool(AutoScalingGroupName=group, PoolState="Stopped")

    def complete_by_hand(instance_id: str) -> str:
        (opened,) = sandbox.aws.actions(instance_id, status="open")
        autoscaling.complete_lifecycle_action(
            AutoScalingGroupName=group,
            LifecycleHookName=opened.hook_name,
            LifecycleActionToken=opened.token,
            LifecycleActionResult="CONTINUE",
        )
        return opened.token

    (warmed,) = sandbox.aws.launch_instances(group, 1, destination="WarmPool")
    into_pool = complete_by_hand(warmed.instance_id)
    (launched,) = sandbox.aws.launch_instances(group, 1, origin="WarmPool")
    over = complete_by_hand(launched.instance_id)  # somebody else was first: over before we get to it
    started = time.monotonic()
    controller = Controller(sandbox, tmp_path / "controller.log")

    def answered() -> float:
        name = "queue_processor_lifecycle_completions_total"
        return controller.metric(name, result="no-active-action")

    await until(lambda: answered() >= 1, 120, "CompleteLifecycleAction answered 'No active Lifecycle Action'")
    await settle(sandbox, [into_pool, over], [launched.private_dns_name], started, [controller])
    calls = [c for c in sandbox.aws.calls() if c.operation == "CompleteLifecycleAction" and c.token == over]
    assert [c.outcome.split(":")[0] for c in calls] == ["ok", "ValidationError"]  # ours came second
