"""The whole sandbox: AWS and Kubernetes in step, the files it writes, the scenarios and the command."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import click
import pytest
from botocore.exceptions import ClientError
from click.testing import CliRunner
from kubernetes import client, config

from queue_processor.cli import load_settings, main
from queue_processor.events import EventKind
from queue_processor.kube import KubeClient, load_api_client
from queue_processor.parse import parse
from queue_processor_sandbox.cluster import EVICTED_BY
from queue_processor_sandbox.environment import SCENARIOS, Sandbox, SandboxOptions
from queue_processor_sandbox.run import judge, last_pods_evicted_early


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    options = SandboxOptions(nodes=6, asgs=2, scale=0.01, node_register_s=20, node_ready_s=10)
    with Sandbox(options, workdir=tmp_path / "sandbox") as running:
        yield running


def drain_queue(running: Sandbox) -> list[str]:
    """Every body on the queue, deleted as read: reads until SQS counts no message visible, in flight or
    delayed (no clock: a loaded machine only makes it slower)."""
    sqs = boto3.client("sqs", **running.aws.client_kwargs)
    url = running.env()["QUEUE_URL"]
    counted = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    bodies: list[str] = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        for message in got.get("Messages", []):
            bodies.append(message["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        if not got.get("Messages"):
            left = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=counted)["Attributes"]
            if not any(int(left[name]) for name in counted):
                return bodies


def kinds(bodies: list[str]) -> Counter[str]:
    return Counter(str(event.kind) for body in bodies for event in parse(body).events)


def test_nodes_are_the_instances(sandbox: Sandbox) -> None:
    api = config.new_client_from_config(str(sandbox.kubeconfig_path))
    nodes = {node.metadata.name: node for node in client.CoreV1Api(api).list_node().items}
    assert len(sandbox.instances) == 6
    assert {i.asg_name for i in sandbox.instances} == {"workers-0", "workers-1"}
    for instance in sandbox.instances:
        node = nodes[instance.private_dns_name]
        assert node.spec.provider_id == f"aws:///{instance.availability_zone}/{instance.instance_id}"
    ec2 = boto3.client("ec2", **sandbox.aws.client_kwargs)
    described = ec2.describe_instances(InstanceIds=[i.instance_id for i in sandbox.instances])
    tags = [
        {tag["Key"] for tag in instance.get("Tags", [])}
        for reservation in described["Reservations"]
        for instance in reservation["Instances"]
    ]
    assert all("aws-node-termination-handler/managed" in keys for keys in tags)


def test_the_env_file_configures_the_controller(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = dict(line.split("=", 1) for line in sandbox.env_path.read_text().splitlines())
    assert lines == sandbox.env()
    for key, value in lines.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    assert settings.queue_url == sandbox.env()["QUEUE_URL"]
    assert settings.aws_endpoint == sandbox.aws.endpoint_url
    assert settings.aws_region == "us-east-1"


def test_a_terminated_instance_loses_its_node_and_a_launched_one_registers_later(sandbox: Sandbox) -> None:
    gone = sandbox.instances[0]
    sandbox.aws.spot_interruption(gone.instance_id)
    deadline = time.monotonic() + 5
    while sandbox.kube.get("nodes", gone.private_dns_name) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert sandbox.aws.ec2_state(gone.instance_id) == "terminated"
    (launched,) = sandbox.aws.launch_instances("workers-0", 1)
    assert sandbox.kube.get("nodes", launched.private_dns_name) is None  # registers 20 s (0.2 s) later
    sandbox.kube.wait_for_nodes([launched.private_dns_name], timeout_s=5)


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("spot-storm", {EventKind.SPOT_INTERRUPTION: 6, EventKind.REBALANCE_RECOMMENDATION: 6}),
        ("asg-scale-in", {EventKind.ASG_TERMINATE_LIFECYCLE: 3}),
        ("warm-pool-launch", {EventKind.ASG_LAUNCH_LIFECYCLE: 4}),
        ("drain-policy", {EventKind.SPOT_INTERRUPTION: 1}),
        ("rebalance-fleet", {EventKind.REBALANCE_RECOMMENDATION: 4}),
    ],
)
def test_scenarios_publish_what_they_say(
    sandbox: Sandbox, scenario: str, expected: dict[EventKind, int]
) -> None:
    sandbox.publish(scenario)
    got = kinds(drain_queue(sandbox))
    for kind, count in expected.items():
        assert got[str(kind)] == count, got


def test_mixed_duplicates_sends_every_message_twice(sandbox: Sandbox) -> None:
    before = len(sandbox.aws.published())
    done = sandbox.publish("mixed-duplicates")
    # What the scenario published (each sent again): the instances' later state changes (a Spot notice that ends
    # while the queue is read on a slow machine) come once, and are not the scenario's.
    sent = sandbox.aws.published()[before : before + done["messages"] // 2]
    bodies = drain_queue(sandbox)
    ids = Counter(event.event_id for body in bodies for event in parse(body).events)
    scenario = {event.event_id for message in sent for event in parse(message.body).events}
    assert done["instances"] == 3
    assert {str(kind) for kind in kinds(bodies)} >= {
        "spot-interruption",
        "rebalance-recommendation",
        "state-change",
        "asg-terminate-lifecycle",
    }
    assert len(scenario) >= 12
    assert min(ids[event_id] for event_id in scenario) >= 2  # every event arrived at least twice


def test_poison_scenario_sends_bodies_that_do_not_parse(sandbox: Sandbox) -> None:
    sandbox.publish("poison")
    outcomes = Counter(parse(body).outcome for body in drain_queue(sandbox))
    assert outcomes["poison"] == 3
    assert outcomes["events"] >= 1


def test_pdb_blocked_relaxes_its_budget_later(sandbox: Sandbox) -> None:
    sandbox.publish("pdb-blocked")
    assert sandbox.kube.get("poddisruptionbudgets", "app-000", "apps")["spec"]["maxUnavailable"] == 0  # type: ignore[index]
    deadline = time.monotonic() + 5
    while sandbox.kube.get("poddisruptionbudgets", "app-000", "apps")["spec"]["maxUnavailable"] == 0:  # type: ignore[index]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_every_scenario_is_tested_and_offered_by_the_command() -> None:
    from queue_processor_sandbox.command import sandbox as command

    offered = next(p for p in command.params if p.name == "scenario")
    assert isinstance(offered.type, click.Choice)
    tested = {
        "spot-storm",
        "asg-scale-in",
        "warm-pool-launch",
        "mixed-duplicates",
        "poison",
        "pdb-blocked",
        "spot-critical",
        "drain-policy",
        "rebalance-fleet",
        "surge",
        "two-clusters",
    }
    assert set(SCENARIOS) == tested
    assert set(offered.type.choices) == tested


def test_the_sandbox_service_account_may_do_what_each_scenario_switches_on() -> None:
    # A scenario's setting whose RBAC rule the sandbox's ServiceAccount lacks is refused (403) on the real
    # control plane: spot-critical's deletions at the deadline were, while the emulation deleted.
    from queue_processor.permissions import rbac_rules
    from queue_processor_sandbox.environment import RBAC_SETTINGS_ON

    rules = rbac_rules(cluster_wide=True, enabled=RBAC_SETTINGS_ON)
    assert any(rule["resources"] == ["pods"] and "delete" in rule["verbs"] for rule in rules)
    assert {"NODE_LEASES", "EMIT_KUBERNETES_EVENTS", "DELETE_AT_DEADLINE"} <= RBAC_SETTINGS_ON


def test_the_sandbox_command_without_the_controller(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "sandbox",
            "--nodes",
            "4",
            "--scale",
            "0.01",
            "--scenario",
            "asg-scale-in",
            "--no-controller",
            "--exit-after",
            "0.2",
            "--workdir",
            str(tmp_path / "sb"),
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["scenario"] == "asg-scale-in"
    assert summary["nodes"] == 4
    assert summary["published"] == {"terminating": 2}  # the scenario's own account
    assert summary["messages_published"] >= 2
    assert summary["lifecycle_completed"] == 0  # nobody ran a controller: the judge says so
    assert (tmp_path / "sb" / "kubeconfig").is_file()
    assert "QUEUE_URL=" in (tmp_path / "sb" / "sandbox.env").read_text()


def test_the_sandbox_command_runs_a_scenario_with_the_controller(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "sandbox",
            "--nodes",
            "6",
            "--scale",
            "0.01",
            "--scenario",
            "asg-scale-in",
            "--workdir",
            str(tmp_path / "sb"),
        ],
    )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.exit_code == 0, summary
    assert summary["lifecycle_completed"] == 3  # half the nodes left through their terminate hook
    assert summary["lifecycle_timed_out"] == 0
    assert summary["daemonset_pods_evicted"] == 0
    assert summary["messages_left"] == 0
    assert summary["heartbeat_tasks_left"] == 0
    assert summary["drained"] == 3


def test_the_judge_sees_a_heartbeat_after_the_end_and_a_pod_evicted_twice(sandbox: Sandbox) -> None:
    # What the judge reports of a controller that misbehaves, done here by hand through the real APIs.
    instance = sandbox.instances[0]
    node = instance.private_dns_name
    namespace = sandbox.cluster.namespace
    sandbox.kube.add_pod(namespace, "slow", node=node, grace_s=100_000)  # terminating for a long while
    v1 = client.CoreV1Api(config.new_client_from_config(str(sandbox.kubeconfig_path)))
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="slow", namespace=namespace))
    for _ in range(2):  # two drains of one node at once would do this
        v1.create_namespaced_pod_eviction("slow", namespace, eviction)
    (action,) = sandbox.aws.terminate_instance(instance.instance_id)
    autoscaling = sandbox.aws.client("autoscaling")
    ids = {"AutoScalingGroupName": action.asg_name, "LifecycleHookName": action.hook_name}
    autoscaling.complete_lifecycle_action(
        LifecycleActionToken=action.token, LifecycleActionResult="CONTINUE", **ids
    )
    with pytest.raises(ClientError, match="No active Lifecycle Action"):
        autoscaling.record_lifecycle_action_heartbeat(LifecycleActionToken=action.token, **ids)
    verdict = judge(sandbox, [node], time.monotonic())
    assert (verdict["heartbeats_after_end"], verdict["nodes_drained_twice"]) == (1, 1)
    assert verdict["lifecycle_completed"] == 1
    assert verdict["evicted"] == 2


async def test_the_judge_tells_a_drains_repeated_eviction_from_a_second_drain(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Issue "Interruptions in combination" 7: one drain evicting a pod again (a retry after a reset the server
    had answered, or a grace cut again for a nearer end) is not a second drain; two drains evicting it are."""
    node = sandbox.instances[0].private_dns_name
    namespace = sandbox.cluster.namespace
    for name in ("retried", "twice"):
        sandbox.kube.add_pod(namespace, name, node=node, grace_s=100_000)  # terminating for a long while
    kube = KubeClient(load_api_client(str(sandbox.kubeconfig_path)))
    try:
        for name, drain in (("retried", "a"), ("retried", "a"), ("twice", "a"), ("twice", "b")):
            await kube.evict(namespace, name, drain=drain)
    finally:
        kube.close()
    verdict = judge(sandbox, [node], time.monotonic())
    assert (verdict["nodes_drained_twice"], verdict["evictions_repeated"]) == (1, 1)
    other = sandbox.instances[1].private_dns_name
    sandbox.kube.add_pod(namespace, "once", node=other, grace_s=100_000)
    kube = KubeClient(load_api_client(str(sandbox.kubeconfig_path)))
    try:
        for _ in range(2):
            await kube.evict(namespace, "once", drain="c")
    finally:
        kube.close()
    verdict = judge(sandbox, [other], time.monotonic())
    assert (verdict["nodes_drained_twice"], verdict["evictions_repeated"]) == (1, 2)  # the record is global


def test_the_judge_counts_a_heartbeat_while_nobody_holds_the_message(sandbox: Sandbox) -> None:
    # A heartbeat is owed only by whoever holds one of the action's messages: before anybody received it, or
    # once it is visible again, a heartbeat keeps alive an action nobody is handling.
    instance = sandbox.instances[0]
    (action,) = sandbox.aws.terminate_instance(instance.instance_id)
    autoscaling = sandbox.aws.client("autoscaling")
    ids = {"AutoScalingGroupName": action.asg_name, "LifecycleHookName": action.hook_name}
    started = time.monotonic()

    def beat() -> int:
        autoscaling.record_lifecycle_action_heartbeat(LifecycleActionToken=action.token, **ids)
        return int(judge(sandbox, [instance.private_dns_name], started)["heartbeats_after_end"])

    assert beat() == 1  # its message waits in the queue, received by nobody
    sqs = sandbox.aws.client("sqs")
    url = sandbox.env()["QUEUE_URL"]
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600)["Messages"]
    assert action.token in received[0]["Body"]
    assert beat() == 1  # held: owed
    entries = [
        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
        for i, m in enumerate(received)
    ]
    sqs.change_message_visibility_batch(QueueUrl=url, Entries=entries)  # released
    assert beat() == 2


def test_the_judge_counts_an_eviction_denied(sandbox: Sandbox) -> None:
    # The emulation has no RBAC: a 403 is injected, as a real API server answers a role without the verb.
    instance = sandbox.instances[0]
    namespace = sandbox.cluster.namespace
    sandbox.kube.add_pod(namespace, "guarded", node=instance.private_dns_name)
    sandbox.kube.inject_fault("create", "pods/eviction", status=403)  # type: ignore[attr-defined]
    v1 = client.CoreV1Api(config.new_client_from_config(str(sandbox.kubeconfig_path)))
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="guarded", namespace=namespace))
    with pytest.raises(client.ApiException) as denied:
        v1.create_namespaced_pod_eviction("guarded", namespace, eviction)
    assert denied.value.status == 403
    verdict = judge(sandbox, [instance.private_dns_name], time.monotonic())
    assert (verdict["evictions_denied"], verdict["evicted"]) == (1, 0)


def test_the_judge_counts_a_pod_annotated_last_that_went_before_an_ordinary_one() -> None:
    def pod(name: str, node: str = "n1", *, last: bool = False, **spec: Any) -> dict[str, Any]:
        annotations = {"queue-processor/drain": "last"} if last else {}
        metadata = {"namespace": "apps", "name": name, "uid": name, "annotations": annotations}
        return {"metadata": metadata, "spec": {"nodeName": node, **spec}}

    agent, web, mesh = (
        pod("agent", last=True),
        pod("web"),
        pod("mesh", priorityClassName="system-node-critical"),
    )
    assert last_pods_evicted_early([web, agent, mesh]) == 0
    assert last_pods_evicted_early([agent, web]) == 1  # the ordinary pod went after it
    assert last_pods_evicted_early([agent, mesh, pod("web", "n2")]) == 0  # critical, or another node's
    assert last_pods_evicted_early([web, agent, web]) == 0  # a repeated eviction is not a first one
    # A node back in service and drained again (explorer seed 2735): its new pods are another drain's.
    first, second = pod("agent-a", last=True), pod("web-b")
    first["metadata"]["annotations"][EVICTED_BY] = "queue-processor/0.1.0 drain/aaa"
    second["metadata"]["annotations"][EVICTED_BY] = "queue-processor/0.1.0 drain/bbb"
    assert last_pods_evicted_early([first, second]) == 0
    second["metadata"]["annotations"][EVICTED_BY] = "queue-processor/0.1.0 drain/aaa"
    assert last_pods_evicted_early([first, second]) == 1
    # The controller's own pod leaves its node last of all, after the pods annotated last (explorer seed 119).
    own = pod("queue-processor-abc12")
    own["metadata"]["labels"] = {"app.kubernetes.io/name": "queue-processor"}
    assert last_pods_evicted_early([web, agent, own]) == 0


def test_the_judge_counts_the_most_nodes_of_a_group_draining_at_once() -> None:
    from types import SimpleNamespace

    from queue_processor_sandbox.run import most_draining_at_once

    t = [datetime(2026, 11, 26, 4, 0, second, tzinfo=UTC) for second in range(10)]
    instances = [SimpleNamespace(private_dns_name=f"n{i}", asg_name="a" if i < 3 else "b") for i in range(5)]

    def judged(spans: dict[str, tuple[datetime, datetime]]) -> int:
        kube = SimpleNamespace(
            first_eviction={node: span[0] for node, span in spans.items()},
            last_eviction={node: span[1] for node, span in spans.items()},
        )
        sandbox = SimpleNamespace(kube=kube, instances=instances)
        return most_draining_at_once(sandbox, [f"n{i}" for i in range(5)])  # type: ignore[arg-type]

    assert judged({}) == 0
    assert judged({"n0": (t[0], t[1]), "n1": (t[2], t[3]), "n2": (t[4], t[5])}) == 1  # one after another
    assert judged({"n0": (t[0], t[4]), "n1": (t[2], t[3]), "n2": (t[3], t[5])}) == 3  # all three share t[3]
    assert judged({"n0": (t[0], t[4]), "n3": (t[1], t[3])}) == 1  # another group's drain does not count
