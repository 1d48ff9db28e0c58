"""Cordon and taint keep every taint that is not ours, on both API servers.

``Node.spec.taints`` has no patch merge key: a strategic-merge patch that carries taints replaces the whole list
on a real API server (the emulation merged them by key, so the bug passed every test: TAINT_NODE or
ENABLE_OUT_OF_SERVICE_TAINT wiped the node's other taints). Node writes read, modify and write the list with
the read resourceVersion, and retries a write that a concurrent change made conflict.
"""

from __future__ import annotations

import uuid
from typing import Any

from queue_processor.drain.node_writes import CordonRecord, NodeWrites
from queue_processor.kube import KubeClient
from queue_processor.watch import RECORD_ANNOTATION, RECORD_LABEL
from queue_processor_sandbox.cluster import KubeCluster

OTHER = {"key": "example.com/gpu", "value": "true", "effect": "NoSchedule"}


#: The sandbox clock's scale for this module's cluster (tests/sandbox/conftest.py).
CLOCK_SCALE = 0.01


async def tainted_node(cluster: KubeCluster, kube: KubeClient) -> str:
    """A Ready node that already carries a taint of someone else's."""
    name = f"ip-10-1-0-{uuid.uuid4().hex[:6]}.ec2.internal"
    cluster.add_node(name)
    cluster.wait_for_nodes([name])
    await kube.patch_node(name, {"spec": {"taints": [OTHER]}})
    return name


async def taints_of(kube: KubeClient, name: str) -> dict[tuple[str, str], str]:
    node = await kube.get_node(name)
    assert node is not None
    return {(t["key"], t["effect"]): t.get("value", "") for t in node["spec"].get("taints") or []}


#: The taint a real server's node lifecycle controller keeps in step with ``spec.unschedulable``
#: (TaintNodesByCondition): neither ours nor the other writer's.
UNSCHEDULABLE = ("node.kubernetes.io/unschedulable", "NoSchedule")


async def others(kube: KubeClient, name: str) -> dict[tuple[str, str], str]:
    """:func:`taints_of` without :data:`UNSCHEDULABLE`."""
    return {key: value for key, value in (await taints_of(kube, name)).items() if key != UNSCHEDULABLE}


def writes(kube: KubeClient) -> NodeWrites:
    return NodeWrites(kube)


async def test_cordon_with_taints_keeps_the_other_taints(cluster: KubeCluster, kube: KubeClient) -> None:
    name = await tainted_node(cluster, kube)
    ours = ("aws-node-termination-handler/spot-itn", "spot-interruption-1", "NoSchedule")
    assert await writes(kube).cordon(name, taints=[ours], labels_if_absent={"example.com/leaving": "true"})
    node = await kube.get_node(name)
    assert node is not None
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"]["example.com/leaving"] == "true"
    taints = await taints_of(kube, name)
    assert taints[(OTHER["key"], OTHER["effect"])] == OTHER["value"]
    assert taints[(ours[0], ours[2])] == ours[1]
    # Again, with a new value: ours is replaced (same key and effect), the other stays, nothing doubles.
    assert await writes(kube).cordon(name, taints=[(ours[0], "spot-interruption-2", ours[2])])
    taints = await taints_of(kube, name)
    assert taints[(ours[0], ours[2])] == "spot-interruption-2"
    assert taints[(OTHER["key"], OTHER["effect"])] == OTHER["value"]
    node = await kube.get_node(name)
    assert node is not None
    keys = [(t["key"], t["effect"]) for t in node["spec"]["taints"]]
    assert len(keys) == len(set(keys))


async def test_a_cordon_adds_a_label_only_where_the_node_has_none(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    name = await tainted_node(cluster, kube)
    label = "node.kubernetes.io/exclude-from-external-load-balancers"
    await kube.patch_node(name, {"metadata": {"labels": {label: "maintenance"}}})
    wanted = {label: "aws-node-termination-handler", "example.com/leaving": "true"}
    assert await writes(kube).cordon(name, labels_if_absent=wanted)  # no taints: labels alone
    node = await kube.get_node(name)
    assert node is not None
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"][label] == "maintenance"  # someone else's value is kept
    assert node["metadata"]["labels"]["example.com/leaving"] == "true"
    taints = await taints_of(
        kube, name
    )  # a real server's controller-manager may add node.kubernetes.io/unschedulable
    assert taints[(OTHER["key"], OTHER["effect"])] == OTHER["value"]
    assert set(taints) - {("node.kubernetes.io/unschedulable", "NoSchedule")} == {
        (OTHER["key"], OTHER["effect"])
    }


async def test_the_out_of_service_taint_keeps_the_other_taints(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    name = await tainted_node(cluster, kube)
    await writes(kube).taint(name, "node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute")
    taints = await taints_of(kube, name)
    assert taints[("node.kubernetes.io/out-of-service", "NoExecute")] == "nodeshutdown"
    assert taints[(OTHER["key"], OTHER["effect"])] == OTHER["value"]


async def test_a_taint_written_between_our_read_and_our_write_is_kept(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    """Another writer changes the node after our read: our write answers 409 Conflict and is retried on a fresh
    read, so the other writer's taint survives."""
    name = await tainted_node(cluster, kube)
    late = {"key": "example.com/late", "value": "yes", "effect": "PreferNoSchedule"}
    reads = 0
    original = kube.get_node

    async def get_then_interfere(node_name: str) -> dict[str, Any] | None:
        nonlocal reads
        node = await original(node_name)
        reads += 1
        if reads == 1:  # someone else writes after our first read
            current = await original(node_name)
            assert current is not None
            taints = [*(current["spec"].get("taints") or []), late]
            await kube.patch_node(node_name, {"spec": {"taints": taints}})
        return node

    kube.get_node = get_then_interfere  # type: ignore[method-assign]
    assert await writes(kube).cordon(name, taints=[("ours", "1", "NoSchedule")])
    assert reads == 2  # the conflicted write was retried on a fresh read
    taints = await taints_of(kube, name)
    assert set(taints) >= {
        (OTHER["key"], OTHER["effect"]),
        (late["key"], late["effect"]),
        ("ours", "NoSchedule"),
    }


async def test_cordon_of_a_missing_node_is_false(kube: KubeClient) -> None:
    assert not await writes(kube).cordon("no-such-node", taints=[("ours", "1", "NoSchedule")])
    assert not await writes(kube).cordon("no-such-node")


async def test_undo_takes_back_what_we_did_and_nothing_else(cluster: KubeCluster, kube: KubeClient) -> None:
    """DESIGN.md rule 12, on the API server's own patch semantics: the cordon with PreDrain's taint and label,
    the out-of-service taint after it, then the undo: the node is as it was, someone else's taint included."""
    name = await tainted_node(cluster, kube)
    about = CordonRecord(instance_id="i-1", launch_time="2026-11-25T10:00:00+00:00")
    lb = {"node.kubernetes.io/exclude-from-external-load-balancers": "aws-node-termination-handler"}
    ours = ("aws-node-termination-handler/spot-itn", "spot-interruption-1", "NoSchedule")
    assert await writes(kube).cordon(name, taints=[ours], labels_if_absent=lb, about=about)
    await writes(kube).taint(name, "node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute")
    assert await writes(kube).undo(name, lambda node, record: record.instance_id == "i-1")
    node = await kube.get_node(name)
    assert node is not None
    assert not node["spec"].get("unschedulable")
    assert await others(kube, name) == {(OTHER["key"], OTHER["effect"]): OTHER["value"]}
    labels = node["metadata"].get("labels") or {}
    assert not set(lb) & set(labels)
    assert RECORD_LABEL not in labels
    assert RECORD_ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert not await writes(kube).undo(name, lambda node, record: True)  # nothing recorded any more


async def test_undo_keeps_a_cordon_somebody_else_made(cluster: KubeCluster, kube: KubeClient) -> None:
    name = await tainted_node(cluster, kube)
    await kube.patch_node(name, {"spec": {"unschedulable": True}})  # kubectl cordon, before the interruption
    ours = ("aws-node-termination-handler/spot-itn", "spot-interruption-1", "NoSchedule")
    assert await writes(kube).cordon(name, taints=[ours], about=CordonRecord(instance_id="i-1"))
    assert await writes(kube).undo(name, lambda node, record: True)
    node = await kube.get_node(name)
    assert node is not None
    assert node["spec"].get("unschedulable") is True  # theirs: kept
    assert await others(kube, name) == {(OTHER["key"], OTHER["effect"]): OTHER["value"]}


async def test_a_taint_written_after_our_record_was_undone_records_its_instance(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    """Issue 47.7: a taint of a kind that joined a drain, written after another replica gave the node back
    (our record gone), got a record without the instance: never undone, an out-of-service NoExecute taint
    left on a live node. Every write of ours records the instance, so the check for instances back in service
    can undo it in turn."""
    name = await tainted_node(cluster, kube)
    drainer = writes(kube)
    about = CordonRecord(instance_id="i-0joined", launch_time="2026-01-01T00:00:00+00:00")
    await drainer.taint(name, "node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute", about=about)
    node = await kube.get_node(name)
    assert node is not None
    record = CordonRecord.from_node(node)
    assert record is not None
    assert (record.instance_id, record.launch_time) == ("i-0joined", "2026-01-01T00:00:00+00:00")
    assert record.taints == (("node.kubernetes.io/out-of-service", "NoExecute"),)
    assert await drainer.undo(name, lambda _, found: found.instance_id == "i-0joined")
    assert await others(kube, name) == {(OTHER["key"], OTHER["effect"]): OTHER["value"]}
