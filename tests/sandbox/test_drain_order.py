"""A drain's order and timing, and why it is stuck, on both API servers (the emulation must agree with the
real one): critical pods are evicted only once the ordinary ones are gone (DRAIN_ORDER=waves), grace periods
are cut to end before the instance does, what is left at the deadline is deleted (DELETE_AT_DEADLINE), and a
drain a PodDisruptionBudget blocks names the budget with its arithmetic — including the classic stuck drain,
unready pods under a budget, with ``unhealthyPodEvictionPolicy`` IfHealthyBudget and AlwaysAllow.

Time runs unscaled here (1 simulated second = 1 real second): grace periods are a few seconds.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from queue_processor.cli import main
from queue_processor.drain.drainer import Drainer
from queue_processor.drain.plan import DRAIN_POLICY_ANNOTATION as DRAIN
from queue_processor.drain.plan import DrainBounds, DrainOptions, DrainOrder, DrainTiming
from queue_processor.kube import KubeClient
from queue_processor.observe.metrics import Metrics
from queue_processor.outcomes import DrainOutcome
from queue_processor_sandbox.cluster import KubeCluster
from tests.unit.test_drainer import told


def a_node(cluster: KubeCluster) -> tuple[str, str]:
    """A fresh Ready node and a fresh namespace."""
    suffix = uuid.uuid4().hex[:6]
    name = f"ip-10-2-0-{suffix}.ec2.internal"
    cluster.add_node(name)
    cluster.wait_for_nodes([name])
    namespace = f"drain-{suffix}"
    cluster.ensure_namespace(namespace)
    return name, namespace


def names_on(pods: list[dict[str, object]], namespace: str) -> set[str]:
    """The names of ``pods`` in ``namespace`` (the DaemonSet of another test has a pod on every node)."""
    return {
        pod["metadata"]["name"]  # type: ignore[index]
        for pod in pods
        if pod["metadata"]["namespace"] == namespace  # type: ignore[index]
    }


@pytest.mark.parametrize("order", [DrainOrder.WAVES, DrainOrder.ALL_AT_ONCE])
async def test_critical_pods_are_evicted_once_the_ordinary_ones_are_gone(
    cluster: KubeCluster, kube: KubeClient, order: DrainOrder
) -> None:
    node, namespace = a_node(cluster)
    ordinary = ["web-0", "web-1"]  # without a controller: nothing replaces them on a later test's node
    for name in ordinary:
        cluster.add_pod(namespace, name, node=node, labels={"app": "web"}, grace_s=3)
    cluster.add_pod(
        namespace, "mesh", node=node, labels={"app": "mesh"}, grace_s=1, priority_class="system-node-critical"
    )
    cluster.add_daemonset(
        namespace, "logs", labels={"app": "logs"}, grace_s=1, priority_class="system-node-critical"
    )
    left_when_mesh_went: list[set[str]] = []

    async def evicted(_: str, name: str) -> None:
        if name == "mesh":
            left_when_mesh_went.append(names_on(await kube.pods_on_node(node), namespace) & set(ordinary))

    drainer = Drainer(kube, DrainOptions(), budget=1, timing=DrainTiming(order=order))
    result = await drainer.drain(node, drainer.clock() + 60, tell=told(evicted=evicted))
    assert result.completed, result
    assert result.evicted == 3
    assert result.waves == ([2, 1] if order is DrainOrder.WAVES else [3])
    if order is DrainOrder.WAVES:
        assert left_when_mesh_went == [set()]  # the mesh outlived every pod that used it
    else:
        assert left_when_mesh_went == [set(ordinary)]  # kubectl's order: both were still terminating
    remaining = [pod for pod in await kube.pods_on_node(node) if pod["metadata"]["namespace"] == namespace]
    owners = [ref["kind"] for pod in remaining for ref in pod["metadata"].get("ownerReferences") or []]
    assert owners == ["DaemonSet"]  # the log shipper stays


@pytest.mark.parametrize("order", [DrainOrder.WAVES, DrainOrder.ALL_AT_ONCE])
async def test_a_pod_annotated_last_outlives_the_nodes_other_pods_and_an_unknown_policy_is_reported(
    cluster: KubeCluster, kube: KubeClient, order: DrainOrder
) -> None:
    node, namespace = a_node(cluster)
    cluster.add_pod(namespace, "web-0", node=node, labels={"app": "web"}, grace_s=3)
    cluster.add_pod(  # a typo: evicted as by default, and said so
        namespace, "cache-0", node=node, labels={"app": "cache"}, grace_s=1, annotations={DRAIN: "lsat"}
    )
    cluster.add_pod(  # no priority at all: the annotation alone puts it last
        namespace, "agent", node=node, labels={"app": "agent"}, grace_s=1, annotations={DRAIN: "last"}
    )
    left_when_agent_went: list[set[str]] = []
    noticed: list[tuple[str, str]] = []

    async def evicted(_: str, name: str) -> None:
        if name == "agent":
            left_when_agent_went.append(names_on(await kube.pods_on_node(node), namespace) - {"agent"})

    async def notice(pod_namespace: str, name: str, reason: str, message: str) -> None:
        assert reason == "UnknownDrainPolicy"
        noticed.append((f"{pod_namespace}/{name}", message))

    drainer = Drainer(kube, DrainOptions(), budget=1, timing=DrainTiming(order=order))
    result = await drainer.drain(node, drainer.clock() + 60, tell=told(evicted=evicted, noticed=notice))
    assert result.completed, result
    assert result.waves == [2, 1]  # in both orders: the annotation asks for it
    assert left_when_agent_went == [set()]  # web-0 and cache-0 were gone before the agent was evicted
    assert noticed == [
        (
            f"{namespace}/cache-0",
            f"queue-processor/drain: 'lsat' is not a drain policy (evict, last, surge): the pods of "
            f"{namespace}/Pod/cache-0 are evicted as by default",
        )
    ]


async def test_grace_periods_are_cut_to_end_a_margin_before_the_instance(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    node, namespace = a_node(cluster)
    cluster.add_pod(namespace, "slow", node=node, grace_s=600)
    cluster.add_pod(namespace, "quick", node=node, grace_s=1)
    granted: dict[str, int] = {}

    async def evicted(_: str, name: str) -> None:
        for pod in await kube.pods_on_node(node):
            if pod["metadata"]["name"] == name:
                granted[name] = pod["metadata"]["deletionGracePeriodSeconds"]

    drainer = Drainer(kube, DrainOptions(), budget=1, timing=DrainTiming(grace_margin_s=5))
    end = drainer.clock() + 12
    result = await drainer.drain(node, end, instance_end=end, tell=told(evicted=evicted))
    assert result.completed, result
    assert (result.evicted, result.cut_short) == (2, 1)
    assert 1 <= granted["slow"] <= 7  # 12 s to the end less the 5 s margin, less the time the drain took
    assert granted.get("quick", 1) == 1  # its own (it may be gone before it is read)


async def test_what_a_budget_blocks_is_deleted_just_before_the_instance_ends(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    node, namespace = a_node(cluster)
    cluster.add_pod(namespace, "guarded", node=node, labels={"app": "db"}, grace_s=30)
    cluster.add_pod(namespace, "free", node=node, grace_s=1)
    cluster.add_pdb(namespace, "db", match_labels={"app": "db"}, min_available=1)
    deleted: list[str] = []

    async def on_delete(_: str, name: str) -> None:
        deleted.append(name)

    metrics = Metrics(process_metrics=False)
    timing = DrainTiming(delete_at_deadline=True, delete_lead_s=2)
    drainer = Drainer(kube, DrainOptions(), budget=1, timing=timing, observer=metrics)
    end = drainer.clock() + 6
    result = await drainer.drain(node, end, instance_end=end, tell=told(deleted=on_delete))
    assert (result.completed, result.outcome) == (True, DrainOutcome.DELETED), result
    assert (result.evicted, result.blocked, result.deleted_at_deadline) == (1, 1, 1)
    assert deleted == ["guarded"]
    left = names_on(await kube.pods_on_node(node), namespace)
    assert left == set()  # gone from the API server at once: its controller may replace it
    assert metrics.registry.get_sample_value("queue_processor_pods_deleted_at_deadline_total") == 1
    assert drainer.evictions.blocked == {}  # the gauge holds nothing once the drain is over


async def test_a_nearer_end_that_joins_a_running_drain_is_picked_up_at_once(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    """DESIGN.md rule 13 (issue "Interruptions in combination" 4): a rebalance recommendation starts the drain
    (no instance end, a deadline ten minutes away); the Spot warning for the same instance joins once the slow
    pod has been evicted with its own 600 s. The pod already terminating is evicted again with its grace cut to
    the new end (the API server shortens a terminating pod's grace), and what the budget holds is deleted just
    before it, not when the rebalance deadline comes."""
    node, namespace = a_node(cluster)
    cluster.add_pod(namespace, "guarded", node=node, labels={"app": "db"}, grace_s=30)
    cluster.add_pod(namespace, "slow", node=node, grace_s=600)
    cluster.add_pdb(namespace, "db", match_labels={"app": "db"}, min_available=1)
    timing = DrainTiming(delete_at_deadline=True, delete_lead_s=2, grace_margin_s=3)
    drainer = Drainer(kube, DrainOptions(), budget=1, timing=timing)
    bounds = DrainBounds(drainer.clock() + 600)  # the rebalance recommendation's
    deleted: list[str] = []

    async def spot_warning_joins(_: str, name: str) -> None:
        if name == "slow":
            assert bounds.tighten(drainer.clock() + 600, drainer.clock() + 8)

    async def on_delete(_: str, name: str) -> None:
        deleted.append(name)

    result = await drainer.drain(node, bounds, tell=told(evicted=spot_warning_joins, deleted=on_delete))
    assert (result.completed, result.outcome) == (True, DrainOutcome.DELETED), result
    assert "guarded" in deleted
    assert result.cut_short == 1  # slow: evicted again, its 600 s cut to the Spot warning's end
    assert names_on(await kube.pods_on_node(node), namespace) == set()


async def test_a_blocked_drain_names_the_budget_with_its_arithmetic(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    node, namespace = a_node(cluster)
    cluster.add_pod(namespace, "db-0", node=node, labels={"app": "db"}, grace_s=1)
    cluster.add_pdb(namespace, "db", match_labels={"app": "db"}, min_available=1)
    seen: list[tuple[str, float]] = []

    class Watching(Metrics):
        def drain_blocked(self, budget: str, pods: int) -> None:
            seen.append((budget, pods))
            super().drain_blocked(budget, pods)

    drainer = Drainer(kube, DrainOptions(), budget=1, observer=Watching(process_metrics=False))
    result = await drainer.drain(node, drainer.clock() + 3)
    assert (result.completed, result.outcome, result.blocked) == (False, DrainOutcome.TIMEOUT, 1)
    assert result.causes == [
        f"PodDisruptionBudget {namespace}/db refuses the eviction of {namespace}/db-0: minAvailable 1, "
        "currentHealthy 1, desiredHealthy 1, disruptionsAllowed 0, expectedPods 1, "
        "unhealthyPodEvictionPolicy IfHealthyBudget"
    ]
    assert seen == [(f"{namespace}/db", 1), (f"{namespace}/db", 0)]


@pytest.mark.parametrize("policy", ["IfHealthyBudget", "AlwaysAllow"])
async def test_unready_pods_under_a_budget_that_is_not_met(
    cluster: KubeCluster, kube: KubeClient, policy: str
) -> None:
    """Three pods, two of them unready (crash-looping, say), under ``minAvailable: 2``: currentHealthy 1,
    desiredHealthy 2. IfHealthyBudget (the default) protects the unready pods too, since the budget is not
    met: nothing can be evicted, the classic stuck drain. AlwaysAllow lets the unready pods go; the ready one
    stays protected (disruptionsAllowed 0)."""
    node, namespace = a_node(cluster)
    cluster.add_pod(namespace, "ok", node=node, labels={"app": "q"}, grace_s=1)
    for name in ("sick-0", "sick-1"):
        cluster.add_pod(namespace, name, node=node, labels={"app": "q"}, grace_s=1, ready=False)
    cluster.add_pdb(
        namespace, "q", match_labels={"app": "q"}, min_available=2, unhealthy_pod_eviction_policy=policy
    )
    drainer = Drainer(kube, DrainOptions(), budget=1)
    result = await drainer.drain(node, drainer.clock() + 4)
    assert result.completed is False
    left = names_on(await kube.pods_on_node(node), namespace)
    cause = result.causes[0]
    assert f"PodDisruptionBudget {namespace}/q refuses the eviction of" in cause
    assert "currentHealthy 1, desiredHealthy 2, disruptionsAllowed 0" in cause
    assert cause.endswith(f"unhealthyPodEvictionPolicy {policy}")
    if policy == "IfHealthyBudget":
        assert (result.evicted, result.blocked) == (0, 3)
        assert len(result.causes) == 1
    else:
        assert (result.evicted, result.blocked) == (2, 1)
        assert f"of {namespace}/ok:" in cause
        # No kubelet runs these sandbox pods, so the evicted ones stay terminating: the third kind of cause.
        assert result.causes[1:] == [
            f"evicted pods did not terminate: {namespace}/sick-0 (grace 1 s), {namespace}/sick-1 (grace 1 s)"
        ]
    assert left == {"ok", "sick-0", "sick-1"}


def test_explain_names_what_would_block_a_drain_and_changes_nothing(
    cluster: KubeCluster, tmp_path: Path
) -> None:
    node, namespace = a_node(cluster)
    cluster.add_pod(namespace, "db-0", node=node, labels={"app": "db"}, grace_s=20)
    cluster.add_pod(namespace, "web-0", node=node, labels={"app": "web"}, grace_s=5)
    cluster.add_pod(namespace, "mesh", node=node, grace_s=1, priority_class="system-cluster-critical")
    cluster.add_pod(namespace, "agent", node=node, grace_s=1, annotations={DRAIN: "last"})
    cluster.add_pod(namespace, "cache-0", node=node, grace_s=1, annotations={DRAIN: "lsat"})
    cluster.add_pdb(namespace, "db", match_labels={"app": "db"}, min_available=1)
    kubeconfig = str(cluster.kubeconfig(tmp_path / "kubeconfig"))
    answer = CliRunner().invoke(main, ["explain", node, "--kubeconfig", kubeconfig, "--format", "json"])
    assert answer.exit_code == 1, answer.output  # an eviction would be refused
    explained = json.loads(answer.stdout)
    pods = {p["name"]: p for p in explained["pods"] if p["namespace"] == namespace}
    assert set(pods) == {"db-0", "web-0", "mesh", "agent", "cache-0"}
    db, web, mesh = pods["db-0"], pods["web-0"], pods["mesh"]
    assert (pods["agent"]["policy"], pods["agent"]["wave"]) == ("last", 2)
    assert (pods["cache-0"]["policy"], pods["cache-0"]["wave"]) == ("evict (unknown 'lsat')", 1)
    assert (db["policy"], mesh["policy"]) == ("evict", "evict")
    assert (db["wave"], db["grace_s"], db["ready"], db["blocked"]) == (1, 20, True, True)
    assert db["budgets"] == [
        f"{namespace}/db: minAvailable 1, currentHealthy 1, desiredHealthy 1, disruptionsAllowed 0, "
        "expectedPods 1, unhealthyPodEvictionPolicy IfHealthyBudget"
    ]
    assert db["eviction"].startswith("429 Cannot evict pod as it would violate the pod's disruption budget.")
    assert "The disruption budget db needs 1 healthy pods and has 1 currently" in db["eviction"]
    assert (web["wave"], web["grace_s"], web["eviction"], web["blocked"], web["budgets"]) == (
        1,
        5,
        "allowed",
        False,
        [],
    )
    assert (mesh["wave"], mesh["eviction"]) == (2, "allowed")
    assert f"refused now ({namespace}/db-0)" in explained["summary"]
    # a dry run: every pod is still there, none terminating
    left = {
        pod["metadata"]["name"]: pod["metadata"].get("deletionTimestamp")
        for pod in cluster.objects("pods")
        if pod["metadata"]["namespace"] == namespace
    }
    assert left == {"db-0": None, "web-0": None, "mesh": None, "agent": None, "cache-0": None}
    table = CliRunner().invoke(main, ["explain", node, "--kubeconfig", kubeconfig])
    assert table.exit_code == 1
    assert "refused now" in table.stdout
    assert "db-0" in table.stdout
    assert "last" in table.stdout  # the policy column
    gone = CliRunner().invoke(main, ["explain", "ip-10-9-9-9.ec2.internal", "--kubeconfig", kubeconfig])
    assert gone.exit_code == 2
    assert "node ip-10-9-9-9.ec2.internal not found" in gone.stderr
