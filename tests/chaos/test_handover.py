"""A Spot warning received by the replica that does not hold the node's Lease (issue 47, defect 1).

Two replicas consume different queues, so that which one receives what is not left to chance: replica A the
sandbox's queue (every kind but Spot warnings), replica B a second queue (Spot warnings only). A rebalance
recommendation starts A's drain of a node, which a PodDisruptionBudget holds; then the node's instance gets its
Spot warning, which only B receives. B cannot claim the node; it hands the warning over on the node's Lease, and
A's drain takes the warning's end at once: the pod the budget holds is deleted DELETE_AT_DEADLINE_LEAD before the
instance goes (before: A's drain kept the rebalance's ten-minute deadline and the pod went with the instance),
and the node gets the Spot taint. B's message is settled once A's drain ended.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_processor.events import EventKind
from queue_processor_sandbox.aws import SandboxQueue
from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from tests.chaos.harness import Controller, assert_judged_clean, cordoned, queue_depth, sandbox_on, until
from tests.conftest import KUBERNETES

SCALE = 0.1  # the Spot notice: 12 s


@pytest.fixture(params=KUBERNETES)
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    options = SandboxOptions(nodes=2, scale=SCALE, cluster=ClusterSpec(apps=2, pdb_max_unavailable=1))
    with sandbox_on(request, options, tmp_path / "sandbox") as running:
        yield running


def spot_warnings_to_their_own_queue(sandbox: Sandbox) -> SandboxQueue:
    """A second queue that gets the Spot warnings, which the sandbox's queue no longer gets."""
    queue = sandbox.aws.create_queue("spot-warnings")
    events = sandbox.aws.client("events")
    rule = f"queue-processor-{EventKind.SPOT_INTERRUPTION}"
    events.remove_targets(Rule=rule, Ids=["queue"])
    events.put_targets(Rule=rule, Targets=[{"Id": "queue", "Arn": queue.arn}])
    return queue


def left_on(sandbox: Sandbox, node: str) -> set[str]:
    """The pods on ``node`` a drain evicts (not a DaemonSet's, not mirror pods)."""
    return {
        pod["metadata"]["name"]
        for pod in sandbox.kube.objects("pods")
        if pod["spec"].get("nodeName") == node
        and not any(ref.get("kind") == "DaemonSet" for ref in pod["metadata"].get("ownerReferences") or [])
        and "kubernetes.io/config.mirror" not in (pod["metadata"].get("annotations") or {})
    }


async def test_a_spot_warning_received_by_the_replica_without_the_lease_reaches_the_drain(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    spot_queue = spot_warnings_to_their_own_queue(sandbox)
    instance = sandbox.instances[0]
    node = instance.private_dns_name
    namespace = sandbox.cluster.namespace
    sandbox.kube.set_pdb(
        namespace, "app-000", max_unavailable=0
    )  # its pod on the node never goes by eviction
    (guarded,) = [
        pod["metadata"]["name"]
        for pod in sandbox.kube.objects("pods")
        if pod["spec"].get("nodeName") == node and pod["metadata"]["name"].startswith("app-000")
    ]
    sandbox.kube.ensure_namespace(sandbox.controller_namespace)
    common = {
        "NODE_LEASES": "true",
        "NODE_LEASE_DURATION_SEC": "15",
        "POD_NAMESPACE": sandbox.controller_namespace,
        "TAINT_NODE": "true",
        "DELETE_AT_DEADLINE": "true",
        "DELETE_AT_DEADLINE_LEAD": "6",
        "GRACE_DEADLINE_MARGIN": "2",
        "NODE_TERMINATION_GRACE_PERIOD": "600",
    }
    a = Controller(sandbox, tmp_path / "a.log", POD_NAME="replica-a", **common)
    b = Controller(sandbox, tmp_path / "b.log", POD_NAME="replica-b", QUEUE_URL=spot_queue.url, **common)
    started = time.monotonic()
    sandbox.aws.rebalance_recommendation(instance.instance_id)
    await until(lambda: cordoned(sandbox, [node]) == 1, 60, "the node cordoned by replica A")
    await until(lambda: left_on(sandbox, node) == {guarded}, 60, "A's drain held by the budget")

    sandbox.aws.spot_interruption(instance.instance_id)

    def guarded_left() -> bool:
        return sandbox.kube.get("pods", guarded, namespace) is not None

    def running() -> bool:
        return sandbox.aws.ec2_state(instance.instance_id) == "running"

    await until(lambda: not guarded_left() or not running(), 60, "the guarded pod gone or the instance ended")
    assert running(), "the instance ended with the pod its budget held still on the node"
    assert not guarded_left()
    taints = {taint["key"] for taint in (sandbox.kube.get("nodes", node) or {})["spec"].get("taints") or []}
    assert "aws-node-termination-handler/spot-itn" in taints
    assert b.count("events handed to the replica holding the node's Lease") == 1
    assert a.count("an event handed over by another replica joins the operation") == 1

    await until(lambda: not running(), 60, "the instance ended")
    await until(lambda: queue_depth(sandbox) == (0, 0), 120, "replica A's messages settled")
    await until(lambda: sandbox.aws.queue_counts(spot_queue) == (0, 0, 0), 120, "B's Spot warning settled")
    for controller in (a, b):
        assert controller.stop(15, 60) == 0
        controller.assert_clean_exit()
    assert_judged_clean(sandbox, [node], started)
