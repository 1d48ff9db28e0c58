"""The controller end to end on the sandbox: real SQS (moto over HTTP), real Kubernetes client, scaled time, on
both Kubernetes API servers (the emulation, and the real control plane where the controller runs as a
ServiceAccount with only its RBAC rules).

Each test starts a sandbox cluster (time scale 0.01: a 120 s Spot notice lasts 1.2 s, the hooks' 1000 s
heartbeat timeout 10 s), runs the controller in the test's event loop, publishes events and checks what a
user would: which pods were evicted, which lifecycle actions were completed and how often, what is left in
the queue, and that no task outlives its operation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from queue_processor.app import Controller, run_controller
from queue_processor.cli import load_settings
from queue_processor.config import Settings
from queue_processor.kube import KubeClient, load_api_client
from queue_processor.permissions import kubernetes_verbs
from queue_processor.watch import RECORD_ANNOTATION, RECORD_LABEL
from queue_processor_sandbox.aws import TERMINATE_HOOK
from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from tests.conftest import KUBERNETES

SCALE = 0.01  # hooks: HeartbeatTimeout 1000 s = 10 s real, so the controller heartbeats every 5 s


@pytest.fixture(params=KUBERNETES)
def sandbox(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Sandbox]:
    marker = request.node.get_closest_marker("scale")
    options = SandboxOptions(
        nodes=6,
        scale=marker.args[0] if marker else SCALE,
        visibility_timeout_s=10,
        max_receive_count=3,
        heartbeat_timeout_s=1000,  # 10 s real: heartbeats every 5 s
        node_register_s=50,
        node_ready_s=20,
        cluster=ClusterSpec(apps=4, pdb_max_unavailable=1),
    )
    real = request.param == "real"
    plane = request.getfixturevalue("control_plane") if real else None
    rbac = request.getfixturevalue("chart_rbac") if real else None  # the chart's rules, rendered by Helm
    with Sandbox(
        options, workdir=tmp_path / "sandbox", kubernetes=request.param, plane=plane, rbac=rbac
    ) as running:
        for key, value in running.env().items():
            monkeypatch.setenv(key, value)
        yield running
        # Least privilege, checked on what really crossed the wire: every request the controller made is
        # one the chart's RBAC grants (and, on the real server, none was refused).
        assert set(running.kube.requests) <= kubernetes_verbs(), set(running.kube.requests)
        if real:
            assert not running.kube.denied(), running.kube.denied()  # type: ignore[attr-defined]


@dataclass
class Running:
    controller: Controller
    sandbox: Sandbox

    def queue_depth(self) -> tuple[int, int]:
        counts = self.sandbox.queue_counts()
        return counts.visible, counts.in_flight

    def dlq_depth(self) -> int:
        return self.sandbox.queue_counts().dlq

    def evicted(self, node: str | None = None) -> list[dict[str, Any]]:
        return [p for p in self.sandbox.kube.evictions if node is None or p["spec"].get("nodeName") == node]


async def until(predicate: Callable[[], bool], timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        await asyncio.sleep(0.05)


@asynccontextmanager
async def controller(sandbox: Sandbox, **overrides: Any) -> AsyncIterator[Running]:
    defaults = {
        "prometheus_server_port": 0,
        "probes_server_port": 0,
        "poison_visibility_timeout_sec": 1,
        "receive_wait_time_sec": 2,  # a stop lets the open long polls end
    }
    settings: Settings = load_settings(**{**defaults, **overrides})
    stop = asyncio.Event()
    started: list[Controller] = []
    task = asyncio.create_task(
        run_controller(
            settings, stop, kubeconfig=str(sandbox.kubeconfig_path), serve=False, started=started.append
        )
    )
    await until(lambda: bool(started) or task.done(), what="controller start")
    if task.done():
        task.result()
    running = Running(started[0], sandbox)
    try:
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        assert running.controller.consumer.tasks == 0  # no operation task outlives the controller


def node_of(sandbox: Sandbox, index: int) -> tuple[str, str]:
    instance = sandbox.instances[index]
    return instance.instance_id, instance.private_dns_name


def unschedulable(sandbox: Sandbox, node: str) -> bool:
    found = sandbox.kube.get("nodes", node)
    return bool(found and (found.get("spec") or {}).get("unschedulable"))


@pytest.mark.scale(0.1)  # a 12 s Spot notice: a loaded machine may take more than 1.2 s to receive it
async def test_spot_interruption_drains_the_node_before_the_notice_ends(sandbox: Sandbox) -> None:
    instance_id, node = node_of(sandbox, 0)
    async with controller(sandbox) as running:
        sandbox.aws.spot_interruption(instance_id)
        await until(
            lambda: unschedulable(sandbox, node) or sandbox.kube.get("nodes", node) is None, what="cordon"
        )
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    evicted = running.evicted(node)
    kinds = {(p["metadata"].get("ownerReferences") or [{}])[0].get("kind") for p in evicted}
    assert "DaemonSet" not in kinds
    assert not any("kubernetes.io/config.mirror" in (p["metadata"].get("annotations") or {}) for p in evicted)
    assert len(evicted) >= 4  # the ReplicaSets' pods on it


async def test_asg_terminate_is_drained_then_completed_once(sandbox: Sandbox) -> None:
    instance_id, node = node_of(sandbox, 1)
    async with controller(sandbox) as running:
        (action,) = sandbox.aws.terminate_instance(instance_id)
        await until(lambda: sandbox.aws.action(action.token).status != "open", what="lifecycle completion")
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    completions = [c for c in sandbox.aws.calls(instance_id) if c.operation == "CompleteLifecycleAction"]
    assert [(c.result, c.ok) for c in completions] == [("CONTINUE", True)]
    assert sandbox.aws.action(action.token).result == "CONTINUE"
    assert running.evicted(node)
    assert sandbox.kube.last_eviction[node] <= completions[0].time  # drained, then completed
    # What a dashboard shows: the AWS calls made, and that SQS answers (with or without messages).
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in running.controller.metrics.registry.collect()
        for sample in metric.samples
    }
    calls = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "queue_processor_aws_requests_total"
    }
    assert (
        calls[(("operation", "CompleteLifecycleAction"), ("result", "ok"), ("service", "autoscaling"))] == 1
    )
    assert calls[(("operation", "ReceiveMessage"), ("result", "ok"), ("service", "sqs"))] >= 1
    received_at = [
        v for (name, _), v in samples.items() if name == "queue_processor_last_receive_timestamp_seconds"
    ]
    assert received_at
    assert time.time() - max(received_at) < 30


async def test_every_kind_for_the_same_instances_drains_once_and_completes_each_action_once(
    sandbox: Sandbox,
) -> None:
    async with controller(sandbox) as running:
        done = sandbox.publish("mixed-duplicates")
        await until(lambda: running.queue_depth() == (0, 0), timeout_s=40, what="queue drained")
    assert done["instances"] == 3
    evicted = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in running.evicted()]
    assert len(evicted) == len(set(evicted))  # no pod evicted twice
    completions = [c for c in sandbox.aws.calls() if c.operation == "CompleteLifecycleAction" and c.ok]
    tokens = [c.token for c in completions]
    assert len(tokens) == len(set(tokens))  # no lifecycle action completed twice
    assert running.dlq_depth() == 0


def requeued(running: Running) -> float:
    registry = running.controller.metrics.registry
    samples = [
        sample.value
        for metric in registry.collect()
        if metric.name == "queue_processor_messages_requeued"
        for sample in metric.samples
        if sample.name.endswith("_total")
    ]
    return sum(samples)


def drain_results(running: Running) -> dict[str, float]:
    """``queue_processor_drain_duration_seconds_count`` by ``result``."""
    counts: dict[str, float] = {}
    for metric in running.controller.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "queue_processor_drain_duration_seconds_count":
                result = sample.labels["result"]
                counts[result] = counts.get(result, 0) + sample.value
    return counts


def heartbeats(sandbox: Sandbox, instance_id: str) -> int:
    return len([c for c in sandbox.aws.calls(instance_id) if c.operation == "RecordLifecycleActionHeartbeat"])


@pytest.mark.scale(0.1)  # a 12 s notice: at 0.01 (1.2 s) a loaded machine received it after it had ended
async def test_a_notice_joined_by_other_kinds_keeps_its_whole_drain_time(sandbox: Sandbox) -> None:
    # A rebalance recommendation and a state change carry no notice: their start time is when they were
    # sent. Joined to a Spot warning's operation, they must not cut its drain to nothing (which would
    # requeue it and drain on a later receive).
    # On a loaded machine the drain may still not finish inside the (scaled) notice, so a requeue is allowed;
    # a drain cut short is not: none may end incomplete within half a second (the notice lasts seconds).
    instance_id, node = node_of(sandbox, 1)
    async with controller(sandbox) as running:
        sandbox.aws.rebalance_recommendation(instance_id)
        sandbox.aws.spot_interruption(instance_id)
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    assert running.evicted(node)
    cut_short = [
        sample.value
        for metric in running.controller.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "queue_processor_drain_duration_seconds_bucket"
        and sample.labels["result"] == "timeout"
        and sample.labels["le"] == "0.5"
    ]
    assert sum(cut_short) == 0, "a drain ended at once: its deadline was cut to nothing"


async def test_a_requeued_action_is_heartbeated_through_its_backoff_and_not_after_shutdown(
    sandbox: Sandbox,
) -> None:
    # The hook times out after 10 s without a heartbeat; the first requeue backoff (12-18 s) is longer. NTH
    # stops heartbeating at EarlyExit, so the instance would go away undrained; here the heartbeat goes on
    # while the message waits, and the retry drains and completes the action.
    instance_id, _node = node_of(sandbox, 2)
    sandbox.kube.set_pdb(sandbox.cluster.namespace, "app-000", max_unavailable=0)  # nothing of app-000 may go
    async with controller(sandbox, node_termination_grace_period=2, requeue_backoff_base_sec=15) as running:
        (action,) = sandbox.aws.terminate_instance(instance_id)
        await until(lambda: requeued(running) >= 1, timeout_s=30, what="EarlyExit and requeue")
        beats = heartbeats(sandbox, instance_id)
        await until(
            lambda: heartbeats(sandbox, instance_id) > beats, timeout_s=30, what="a heartbeat while requeued"
        )
        sandbox.kube.set_pdb(sandbox.cluster.namespace, "app-000", max_unavailable=1)
        await until(
            lambda: sandbox.aws.action(action.token).status != "open", timeout_s=60, what="completion"
        )
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    assert sandbox.aws.action(action.token).status == "completed"  # not timed out
    calls = sandbox.aws.calls(instance_id)
    completed_at = next(c.time for c in calls if c.operation == "CompleteLifecycleAction" and c.ok)
    assert not [c for c in calls if c.operation == "RecordLifecycleActionHeartbeat" and c.time > completed_at]
    assert running.controller.handler.parts.heartbeats.running == 0


async def test_after_a_stop_every_message_in_flight_stays_visible(sandbox: Sandbox) -> None:
    # Four terminate actions whose drains a PodDisruptionBudget holds. Before: the stop cancelled the long
    # polls on the client side, but they stayed open in SQS (moto's server) and took the messages just made
    # visible, hiding them for a whole visibility timeout. Now the polls end first, and whatever they bring
    # back is made visible again.
    sandbox.kube.set_pdb(sandbox.cluster.namespace, "app-000", max_unavailable=0)
    sandbox.kube.set_pdb(sandbox.cluster.namespace, "app-001", max_unavailable=0)
    instances = [node_of(sandbox, index)[0] for index in range(4)]
    async with controller(
        sandbox, node_termination_grace_period=60, receive_loops_per_queue=2, receive_wait_time_sec=5
    ) as running:
        for instance_id in instances:
            sandbox.aws.terminate_instance(instance_id)
        await until(
            lambda: len(running.controller.consumer.store.held()) == 4, timeout_s=30, what="4 messages held"
        )
    assert running.queue_depth() == (4, 0)
    await asyncio.sleep(1.0)  # a poll left open on the server would take them now
    assert running.queue_depth() == (4, 0)


async def test_no_heartbeat_after_shutdown(sandbox: Sandbox) -> None:
    instance_id, _node = node_of(sandbox, 2)
    sandbox.kube.set_pdb(sandbox.cluster.namespace, "app-000", max_unavailable=0)
    async with controller(sandbox, node_termination_grace_period=30) as running:
        (action,) = sandbox.aws.terminate_instance(instance_id)
        await until(lambda: heartbeats(sandbox, instance_id) >= 1, timeout_s=30, what="a heartbeat")
    assert running.controller.handler.parts.heartbeats.running == 0
    beats = heartbeats(sandbox, instance_id)
    await asyncio.sleep(6.0)  # more than a heartbeat interval (5 s)
    assert heartbeats(sandbox, instance_id) == beats, "a heartbeat was sent after the controller stopped"
    assert sandbox.aws.action(action.token).status == "open"  # left for the next replica, not completed


@pytest.mark.parametrize("sandbox", ["emulated"], indirect=True)  # Auto Scaling's answers, not Kubernetes'
async def test_without_describe_lifecycle_hooks_the_node_is_drained_and_the_action_completed(
    sandbox: Sandbox,
) -> None:
    # NTH's documented IAM policy has no autoscaling:DescribeLifecycleHooks: the default HEARTBEAT_INTERVAL
    # (-1, half the hook's timeout) cannot be worked out. The node must still be cordoned, drained and its
    # action completed (before: the AccessDenied escaped and every attempt was retried with nothing done).
    sandbox.aws.inject_error(
        "DescribeLifecycleHooks",
        "AccessDenied",
        "User: arn:aws:sts::123456789012:assumed-role/nth/x is not authorized to perform: "
        "autoscaling:DescribeLifecycleHooks",
    )
    instance_id, node = node_of(sandbox, 1)
    async with controller(sandbox) as running:
        (action,) = sandbox.aws.terminate_instance(instance_id)
        await until(lambda: sandbox.aws.action(action.token).status != "open", what="completion")
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    assert sandbox.aws.action(action.token).status == "completed"
    assert running.evicted(node)


@pytest.mark.parametrize("sandbox", ["emulated"], indirect=True)
async def test_a_throttled_heartbeat_is_retried_before_the_hook_times_out(sandbox: Sandbox) -> None:
    # The hook: 40 s real without a heartbeat; HEARTBEAT_INTERVAL=30 s. The first beat is throttled on every
    # attempt. Waiting a whole interval before the next one (as before: at 60 s) lands after the hook's
    # timeout; a retry within seconds does not.
    instance_id, _node = node_of(sandbox, 2)
    group = sandbox.instances[2].asg_name
    asg = boto3.client("autoscaling", **sandbox.aws.client_kwargs)
    asg.put_lifecycle_hook(
        AutoScalingGroupName=group,
        LifecycleHookName=TERMINATE_HOOK,
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
        HeartbeatTimeout=4000,  # simulated seconds: 40 s real at the test's scale
        DefaultResult="CONTINUE",
    )
    sandbox.aws.inject_error("RecordLifecycleActionHeartbeat", "Throttling", "Rate exceeded")
    sandbox.kube.set_pdb(sandbox.cluster.namespace, "app-000", max_unavailable=0)  # the drain waits
    async with controller(sandbox, node_termination_grace_period=120, heartbeat_interval=30) as running:
        (action,) = sandbox.aws.terminate_instance(instance_id)

        def beats(ok: bool) -> int:
            calls = sandbox.aws.calls(instance_id)
            return len([c for c in calls if c.operation == "RecordLifecycleActionHeartbeat" and c.ok is ok])

        # Auto Scaling throttles until every attempt of the first heartbeat has failed, then recovers.
        registry = running.controller.metrics.registry
        await until(
            lambda: (
                (registry.get_sample_value("queue_processor_heartbeats_total", {"result": "error"}) or 0) >= 1
            ),
            timeout_s=60,
            what="a throttled heartbeat",
        )
        sandbox.aws.clear_errors()
        assert beats(False) >= 5
        await until(lambda: beats(True) >= 1, timeout_s=60, what="a heartbeat after the throttled ones")
        sandbox.kube.set_pdb(sandbox.cluster.namespace, "app-000", max_unavailable=1)
        await until(
            lambda: sandbox.aws.action(action.token).status != "open", timeout_s=60, what="completion"
        )
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    assert sandbox.aws.action(action.token).status == "completed"  # not timed out


async def test_a_blocked_drain_is_retried_and_completes_once_the_budget_allows(sandbox: Sandbox) -> None:
    instance_id, _node = node_of(sandbox, 2)
    sandbox.kube.set_pdb(sandbox.cluster.namespace, "app-000", max_unavailable=0)
    # retry well inside the 10 s hook timeout
    async with controller(sandbox, node_termination_grace_period=1, requeue_backoff_base_sec=0.5) as running:
        (action,) = sandbox.aws.terminate_instance(instance_id)
        await until(lambda: requeued(running) >= 1, what="first attempt requeued")
        sandbox.kube.set_pdb(sandbox.cluster.namespace, "app-000", max_unavailable=1)
        await until(
            lambda: sandbox.aws.action(action.token).status != "open", timeout_s=30, what="completion"
        )
    completions = [c for c in sandbox.aws.calls(instance_id) if c.operation == "CompleteLifecycleAction"]
    assert [(c.result, c.ok) for c in completions] == [("CONTINUE", True)]
    assert sandbox.aws.action(action.token).status == "completed"
    # What a dashboard shows: drains that timed out on the budget, then one that drained.
    results = drain_results(running)
    assert results.get("timeout", 0) >= 1
    assert results.get("drained") == 1


async def test_a_warm_pool_launch_completes_only_once_the_node_is_ready(sandbox: Sandbox) -> None:
    async with controller(sandbox) as running:
        (launched,) = sandbox.aws.launch_instances("workers-0", 1)
        (action,) = sandbox.aws.actions(launched.instance_id, status="open")
        await until(
            lambda: sandbox.aws.action(action.token).status != "open", timeout_s=30, what="launch completion"
        )
        node = sandbox.kube.get("nodes", launched.private_dns_name)
        assert node is not None
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    assert sandbox.aws.action(action.token).result == "CONTINUE"


@pytest.mark.parametrize("cache", [False, True])
async def test_daemonset_and_mirror_pods_are_never_evicted(sandbox: Sandbox, cache: bool) -> None:
    instance_id, node = node_of(sandbox, 3)
    async with controller(sandbox, use_apiserver_cache=cache) as running:
        sandbox.aws.rebalance_recommendation(instance_id)
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    assert running.evicted(node)
    for pod in running.evicted(node):
        owner = (pod["metadata"].get("ownerReferences") or [{}])[0].get("kind")
        assert owner != "DaemonSet"
        assert "kubernetes.io/config.mirror" not in (pod["metadata"].get("annotations") or {})


async def test_poison_reaches_the_dead_letter_queue_while_the_loop_keeps_working(sandbox: Sandbox) -> None:
    instance_id, node = node_of(sandbox, 4)
    async with controller(sandbox) as running:
        sandbox.publish("poison")
        await until(lambda: running.dlq_depth() == 3, timeout_s=30, what="poison in the DLQ")
        sandbox.aws.rebalance_recommendation(instance_id)
        await until(lambda: unschedulable(sandbox, node), what="cordon after poison")


async def test_a_health_scheduled_change_drains_every_affected_instance(sandbox: Sandbox) -> None:
    targets = [node_of(sandbox, index) for index in (0, 1)]
    async with controller(sandbox) as running:
        sandbox.aws.scheduled_change([instance_id for instance_id, _ in targets])
        await until(lambda: all(unschedulable(sandbox, node) for _, node in targets), what="both cordoned")
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    for _, node in targets:
        assert running.evicted(node)  # NTH drained only the first affected instance


async def test_a_capacity_reservation_interruption_is_drained(sandbox: Sandbox) -> None:
    instance_id, node = node_of(sandbox, 5)
    async with controller(sandbox) as running:
        sandbox.aws.capacity_reservation_interruption(instance_id)
        await until(
            lambda: unschedulable(sandbox, node) or sandbox.kube.get("nodes", node) is None, what="cordon"
        )
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    assert running.evicted(node)


async def test_tasks_return_to_their_baseline_after_many_failing_cycles(sandbox: Sandbox) -> None:
    """Requeued, retried, requeued again: no operation task may pile up, and none outlives the controller
    (NTH leaked goroutines on failed drains). Heartbeat tasks: see test_early_exit_stops_the_heartbeat."""
    instance_id, node = node_of(sandbox, 4)
    sandbox.kube.set_pdb(
        sandbox.cluster.namespace, "app-001", max_unavailable=0
    )  # this drain can never finish
    baseline = len(asyncio.all_tasks())
    async with controller(sandbox, node_termination_grace_period=1, requeue_backoff_base_sec=0.1) as running:
        running_tasks = len(asyncio.all_tasks())
        sandbox.aws.rebalance_recommendation(instance_id)
        await until(lambda: requeued(running) >= 3, timeout_s=60, what="three failed cycles")
        # maxReceiveCount is 3 here: after its third failure the message moves to the dead-letter queue.
        await until(lambda: running.dlq_depth() == 1, timeout_s=30, what="the message in the DLQ")
        await until(lambda: running.controller.consumer.tasks == 0, what="no operation left")
        assert len(asyncio.all_tasks()) <= running_tasks
    assert len(asyncio.all_tasks()) == baseline
    assert unschedulable(sandbox, node)


async def test_kubernetes_events_are_recorded_on_the_node_when_asked(sandbox: Sandbox) -> None:
    """NTH's reasons and messages (``pkg/observability/k8s-events.go``), its per-node annotations and the
    extra ones."""
    instance_id, node = node_of(sandbox, 3)
    extra = "team=platform,instance-id=overridden"
    namespace = next(  # the workloads' namespace (on the real control plane, this run's)
        pod["metadata"]["namespace"]
        for pod in sandbox.kube.objects("pods")
        if pod["spec"].get("nodeName") == node and pod["metadata"]["name"].startswith("app-")
    )
    sandbox.kube.add_pod(  # a drain policy with a typo: the pod is evicted, and its Event says why
        namespace, "typo-0", node=node, grace_s=1, annotations={"queue-processor/drain": "lsat"}
    )
    async with controller(
        sandbox, emit_kubernetes_events=True, kubernetes_events_extra_annotations=extra
    ) as running:
        sandbox.aws.rebalance_recommendation(instance_id)
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    # the controller's own Events (a real cluster's node controller records RegisteredNode on the node too)
    ours = [
        e
        for e in sandbox.kube.objects("events")
        if (e.get("source") or {}).get("component") == "queue-processor"
    ]
    # Nodes are cluster-scoped and their Events live in "default": on a control plane other tests share, Events
    # of other runs' nodes are there too (a scale-in's ASGLifecycle): only this node's are this test's.
    on_node = {
        e["reason"]: e
        for e in ours
        if e["involvedObject"]["kind"] == "Node" and e["involvedObject"]["name"] == node
    }
    assert sorted(on_node) == ["CordonAndDrain", "PostDrain", "PreDrain", "RebalanceRecommendation"]
    assert on_node["CordonAndDrain"]["message"] == "Node successfully cordoned and drained"
    assert all(e["type"] == "Normal" for e in on_node.values())
    annotations = on_node["PreDrain"]["metadata"]["annotations"]
    assert annotations["team"] == "platform"
    assert annotations["instance-id"] == instance_id  # NTH's own annotations win over the extra ones
    assert annotations["local-hostname"] == node
    evicted = {
        e["involvedObject"]["name"]
        for e in ours
        if e["reason"] == "PodEviction" and e["involvedObject"].get("namespace") == namespace
    }
    assert evicted == {pod["metadata"]["name"] for pod in sandbox.kube.evictions}
    assert evicted  # the node had pods to evict
    assert "typo-0" in evicted
    (policy,) = [e for e in ours if e["reason"] == "UnknownDrainPolicy"]
    assert (policy["involvedObject"]["kind"], policy["involvedObject"]["name"], policy["type"]) == (
        "Pod",
        "typo-0",
        "Warning",
    )
    assert policy["message"] == (
        "queue-processor/drain: 'lsat' is not a drain policy (evict, last, surge): "
        f"the pods of {namespace}/Pod/typo-0 are evicted as by default"
    )


async def test_with_node_leases_the_node_is_drained_and_its_lease_released(sandbox: Sandbox) -> None:
    instance_id, node = node_of(sandbox, 1)
    async with controller(
        sandbox, node_leases=True, pod_name="replica-1", pod_namespace=sandbox.controller_namespace
    ) as running:
        sandbox.aws.rebalance_recommendation(instance_id)
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    lease = sandbox.kube.get("leases", f"queue-processor-{node}", sandbox.controller_namespace)
    assert lease is None  # released (deleted) after the drain
    assert running.evicted(node)


@pytest.mark.parametrize("case", ["delete-if-not-found", "no-node-will-come", "a-node-may-come"])
async def test_a_terminate_action_for_an_instance_without_a_node(sandbox: Sandbox, case: str) -> None:
    # The instance runs but no Node exists for it (never joined, or deleted by hand). With
    # DELETE_SQS_MSG_IF_NODE_NOT_FOUND the message is acknowledged and the action completed at once (nothing
    # to drain). Without it, the same once the instance has run for LAUNCH_READY_TIMEOUT_SEC (its node would
    # have registered by now: no Terminating:Wait heartbeated for an hour of requeues, nothing in the
    # dead-letter queue); before that a node may still register, and the message is retried, the action left
    # open, and nothing else touched.
    instance_id, node = node_of(sandbox, 3)
    sandbox.kube.delete_node(node)
    settings: dict[str, Any] = {"delete_sqs_msg_if_node_not_found": case == "delete-if-not-found"}
    if case == "no-node-will-come":
        settings["launch_ready_timeout_sec"] = 1
        ec2 = sandbox.aws.client("ec2")
        (reservation,) = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        launched = reservation["Instances"][0]["LaunchTime"]
        await until(
            lambda: (datetime.now(UTC) - launched).total_seconds() > 1.5, what="the instance runs 1 s"
        )
    async with controller(sandbox, requeue_backoff_base_sec=0.5, **settings) as running:
        (action,) = sandbox.aws.terminate_instance(instance_id)
        if case == "a-node-may-come":
            await until(lambda: requeued(running) >= 2, what="retried")
        else:
            await until(lambda: sandbox.aws.action(action.token).status != "open", what="completion")
            await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    completions = [c for c in sandbox.aws.calls(instance_id) if c.operation == "CompleteLifecycleAction"]
    if case == "a-node-may-come":
        assert completions == []
        assert sandbox.aws.action(action.token).status == "open"
    else:
        assert [(c.result, c.outcome) for c in completions] == [("CONTINUE", "ok")]
        assert running.dlq_depth() == 0
    assert not running.evicted()


async def test_a_launch_whose_node_never_turns_ready_gets_its_hooks_default_result(sandbox: Sandbox) -> None:
    # A kubelet that never becomes Ready: the launch action is completed with its hook's DefaultResult
    # (ABANDON, the sandbox's and the Terraform module's default: the group replaces the instance)
    # LAUNCH_READY_TIMEOUT_SEC after it began, instead of being heartbeated in Pending:Wait until its message
    # reaches the dead-letter queue.
    sandbox.launches_never_ready(1)
    async with controller(sandbox, launch_ready_timeout_sec=2) as running:
        (launched,) = sandbox.aws.launch_instances("workers-0", 1)
        (action,) = sandbox.aws.actions(launched.instance_id, status="open")
        await until(
            lambda: sandbox.aws.action(action.token).status != "open", timeout_s=30, what="launch completion"
        )
        await until(lambda: running.queue_depth() == (0, 0), timeout_s=30, what="queue drained")
        node = sandbox.kube.get("nodes", launched.private_dns_name)
        assert node is None or not any(
            c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or []
        )
    completions = [
        c for c in sandbox.aws.calls(launched.instance_id) if c.operation == "CompleteLifecycleAction"
    ]
    assert [(c.result, c.outcome) for c in completions] == [("ABANDON", "ok")]
    assert running.dlq_depth() == 0


FOREIGN_TAINT = {"key": "example.com/dedicated", "value": "batch", "effect": "NoSchedule"}
LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"


def ours_left(sandbox: Sandbox, node: str) -> dict[str, Any]:
    """What of ours is left on ``node``: unschedulable, the taints other than the foreign one (and the real
    node lifecycle controller's, which follows ``spec.unschedulable``), our label and record."""
    found = sandbox.kube.get("nodes", node)
    assert found is not None
    controller_taint = ("node.kubernetes.io/unschedulable", "NoSchedule")
    taints = {
        (t["key"], t["effect"])
        for t in found["spec"].get("taints") or []
        if (t["key"], t["effect"]) not in {controller_taint, (FOREIGN_TAINT["key"], FOREIGN_TAINT["effect"])}
    }
    labels = found["metadata"].get("labels") or {}
    return {
        "unschedulable": bool(found["spec"].get("unschedulable")),
        "taints": taints,
        "labels": {key for key in (LB_LABEL, RECORD_LABEL) if key in labels},
        "record": RECORD_ANNOTATION in (found["metadata"].get("annotations") or {}),
        "foreign": FOREIGN_TAINT in (found["spec"].get("taints") or []),
    }


BACK = {"unschedulable": False, "taints": set(), "labels": set(), "record": False, "foreign": True}


async def test_an_instance_stopped_then_started_again_gets_its_node_back_as_it_was(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Issue "Interruptions in combination" 3: the instance stopped (its node drained, cordoned, tainted,
    labelled), then started again: our cordon, taints and label go, someone else's taint stays; a node cordoned
    for a rebalance recommendation (its instance never left) stays cordoned."""
    instance_id, node = node_of(sandbox, 2)
    rebalanced_id, rebalanced = node_of(sandbox, 5)
    admin = KubeClient(load_api_client(str(sandbox.kube.kubeconfig(tmp_path / "admin"))))
    try:
        await admin.patch_node(node, {"spec": {"taints": [FOREIGN_TAINT]}})
    finally:
        admin.close()
    settings = {
        "taint_node": True,
        "exclude_from_load_balancers": True,
        "enable_out_of_service_taint": True,
        "return_check_interval_sec": 1,
    }
    async with controller(sandbox, **settings) as running:
        sandbox.aws.rebalance_recommendation(rebalanced_id)
        sandbox.aws.stop_instance(instance_id)
        await until(
            lambda: unschedulable(sandbox, node) and unschedulable(sandbox, rebalanced), what="cordons"
        )
        await until(lambda: running.queue_depth() == (0, 0), what="both drained")
        left = ours_left(sandbox, node)
        assert left["unschedulable"]
        assert left["taints"] >= {("node.kubernetes.io/out-of-service", "NoExecute")}
        assert left["labels"] == {LB_LABEL, RECORD_LABEL}
        sandbox.aws.start_instance(instance_id)
        await until(lambda: not unschedulable(sandbox, node), what="the returned node schedulable again")
        assert ours_left(sandbox, node) == BACK
        assert unschedulable(sandbox, rebalanced)  # checked in the same pass, and left alone


async def into_warm_pool(sandbox: Sandbox, instance: Any) -> None:
    """Scale ``instance`` in into its group's warm pool; until its terminate action is over and it is warmed."""
    (leaving,) = sandbox.aws.terminate_instance(instance.instance_id, to_warm_pool=True)
    await until(lambda: sandbox.aws.action(leaving.token).status != "open", what="terminate completion")
    await until(
        lambda: (sandbox.aws.lifecycle_state(instance.instance_id) or "").startswith("Warmed:"),
        what="the instance in the warm pool",
    )


async def out_of_warm_pool(sandbox: Sandbox, running: Any, instance: Any) -> Any:
    """Bring ``instance`` back into its group; until its launch action is over and the queue empty: the action."""
    (back,) = sandbox.aws.launch_instances(instance.asg_name, 1, origin="WarmPool")
    assert back.instance_id == instance.instance_id
    (returning,) = sandbox.aws.actions(instance.instance_id, status="open")
    await until(lambda: sandbox.aws.action(returning.token).status != "open", what="launch completion")
    await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    return returning


async def test_a_warm_pool_return_gets_its_node_back_when_its_launch_action_is_handled(
    sandbox: Sandbox,
) -> None:
    """Scale-in into a warm pool drains and cordons the node; the instance's move back into the group (a launch
    action from WarmPool to AutoScalingGroup) undoes our cordon, taint and label before the action is
    completed (the periodic check is out of the way here: its interval is an hour)."""
    instance = sandbox.instances[1]
    settings = {"taint_node": True, "exclude_from_load_balancers": True, "return_check_interval_sec": 3600}
    async with controller(sandbox, **settings) as running:
        await into_warm_pool(sandbox, instance)
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
        assert unschedulable(sandbox, instance.private_dns_name)
        returning = await out_of_warm_pool(sandbox, running, instance)
    assert sandbox.aws.action(returning.token).result == "CONTINUE"
    left = ours_left(sandbox, instance.private_dns_name)
    assert left == {**BACK, "foreign": False}


async def test_a_warm_pool_return_before_its_capacity_reservation_notice_ends_stays_cordoned(
    sandbox: Sandbox,
) -> None:
    """Explorer seed 2735: a Capacity Reservation interruption drains the node; the instance moves into the warm
    pool and back before the notice's termination time, which still reclaims it. The launch action is
    completed, but the node is not given back: pods scheduled there would go with the instance, undrained."""
    instance = sandbox.instances[1]
    node = instance.private_dns_name
    async with controller(sandbox, return_check_interval_sec=3600) as running:
        sandbox.aws.capacity_reservation_interruption(instance.instance_id, notice_s=3600)
        await until(lambda: unschedulable(sandbox, node), what="the cordon")
        await until(lambda: running.queue_depth() == (0, 0), what="the notice's drain")
        await into_warm_pool(sandbox, instance)
        returning = await out_of_warm_pool(sandbox, running, instance)
    assert sandbox.aws.action(returning.token).result == "CONTINUE"
    assert unschedulable(sandbox, node)


async def test_a_warm_pool_return_waits_until_another_replica_s_drain_of_its_node_ends(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Explorer seeds 119 and 1504: the stop into the warm pool delivered twice, its duplicate drained the node
    on another replica (which holds the node's Lease) as the instance left the pool; the launch action's
    handler gave the node back under that drain. It waits until the other replica lets the Lease go (the
    launch action heartbeated meanwhile), then gives the node back and completes the action."""
    from queue_processor.leases import NodeLeases

    instance = sandbox.instances[1]
    node = instance.private_dns_name
    namespace = sandbox.controller_namespace
    sandbox.kube.ensure_namespace(namespace)
    settings = {
        "node_leases": True,
        "pod_name": "replica-1",
        "pod_namespace": namespace,
        "return_check_interval_sec": 3600,
    }
    admin = KubeClient(load_api_client(str(sandbox.kube.kubeconfig(tmp_path / "admin"))))
    other = NodeLeases(admin, namespace=namespace, identity="replica-2", duration_s=60)
    try:
        async with controller(sandbox, **settings) as running:
            (leaving,) = sandbox.aws.terminate_instance(instance.instance_id, to_warm_pool=True)
            await until(
                lambda: sandbox.aws.action(leaving.token).status != "open", what="terminate completion"
            )
            await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
            lease = f"queue-processor-{node}"
            await until(
                lambda: sandbox.kube.get("leases", lease, namespace) is None, what="our Lease released"
            )
            held = await other.claim(node)  # the duplicate's drain, on the other replica
            assert held is not None
            launches = running.controller.handler.draining
            (back,) = sandbox.aws.launch_instances(instance.asg_name, 1, origin="WarmPool")
            assert back.instance_id == instance.instance_id
            (returning,) = sandbox.aws.actions(instance.instance_id, status="open")
            await until(lambda: node in launches.waiting, what="the return waiting for the other's drain")
            assert unschedulable(sandbox, node)
            assert sandbox.aws.action(returning.token).status == "open"
            await held.release()
            await other.flush()
            await until(
                lambda: sandbox.aws.action(returning.token).status != "open", what="launch completion"
            )
            await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    finally:
        await other.close()
        admin.close()
    assert sandbox.aws.action(returning.token).result == "CONTINUE"
    assert not unschedulable(sandbox, node)


@pytest.mark.scale(0.1)  # a 12 s Spot notice: a loaded machine may take more than 1.2 s to receive it
async def test_a_node_named_otherwise_is_found_by_its_hostname_label(sandbox: Sandbox) -> None:
    # Clusters that name nodes differently keep the instance's private DNS name in kubernetes.io/hostname:
    # the cordon by name misses (404), the label lookup finds the node, and it is drained.
    instance_id, node = node_of(sandbox, 4)
    sandbox.kube.delete_node(node)
    sandbox.kube.add_node("worker-renamed", labels={"kubernetes.io/hostname": node})
    sandbox.kube.wait_for_nodes(["worker-renamed"])
    pods = sandbox.kube.add_replicaset(
        sandbox.cluster.namespace, "renamed", nodes=["worker-renamed"], replicas=2, labels={"app": "r"}
    )
    async with controller(sandbox) as running:
        sandbox.aws.spot_interruption(instance_id)
        await until(lambda: running.queue_depth() == (0, 0), what="queue drained")
    assert unschedulable(sandbox, "worker-renamed")
    assert {p["metadata"]["name"] for p in running.evicted("worker-renamed")} >= set(pods)


@pytest.mark.scale(0.1)  # 12 s Spot notices: the joined drains are seen running before their instances go
async def test_rebalance_drains_take_turns_and_spot_warnings_that_join_them_start_at_once(
    sandbox: Sandbox,
) -> None:
    # DRAIN_BUDGET_NON_URGENT=2: a rebalance recommendation for four nodes of one Auto Scaling group cordons all
    # four and drains two at once; the other two wait, their messages held without in-flight slots. The apps'
    # budgets allow no eviction, so the two drains stay under way. Spot warnings for the four then join: no
    # drain waits any more.
    leaving = [node_of(sandbox, index) for index in range(4)]
    group = sandbox.instances[0].asg_name
    for app in range(4):
        sandbox.kube.set_pdb(sandbox.cluster.namespace, f"app-{app:03d}", max_unavailable=0)
    async with controller(sandbox, drain_budget_non_urgent="2") as running:
        turns = running.controller.handler.turns
        slots = running.controller.consumer.ledger.slots
        for instance_id, _ in leaving:
            sandbox.aws.rebalance_recommendation(instance_id)
        await until(
            lambda: turns.running.get(group) == 2 and turns.waiting(group) == 2,
            what="two drains, two waiting",
        )
        assert all(unschedulable(sandbox, node) for _, node in leaving)  # waiting ones are cordoned too
        assert slots.parked == 2  # held, renewed, but not taking the receive's room
        waiting = running.controller.metrics.registry.get_sample_value(
            "queue_processor_drains_waiting", {"group": group}
        )
        assert waiting == 2
        for instance_id, _ in leaving:
            sandbox.aws.spot_interruption(instance_id)
        await until(lambda: turns.running.get(group) == 4, what="every drain under way")
        assert turns.waiting(group) == 0
        await until(lambda: running.queue_depth() == (0, 0), timeout_s=60, what="queue drained")
    assert running.dlq_depth() == 0
    assert slots.parked == 0
