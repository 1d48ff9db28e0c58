"""The periodic check for instances back in service (:class:`queue_processor.returns.Returns`), on both API
servers: a node whose instance is not back is decided from the node LIST alone, with no read of its own (at
1,000 drained nodes, the storm read every one of them again every RETURN_CHECK_INTERVAL_SEC); a node whose
instance came back is read once and given back as it was. With the watched copy of the nodes current, the
check lists nothing, and the instances of nodes that are not Ready are not described."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from queue_processor import rest
from queue_processor.aws import InstanceInfo
from queue_processor.drain.drainer import Drainer
from queue_processor.drain.node_writes import CordonRecord
from queue_processor.drain.plan import DrainOptions
from queue_processor.kube import KubeClient
from queue_processor.returns import Returns
from queue_processor.watch import RECORD_LABEL, NodeCache
from queue_processor_sandbox.cluster import KubeCluster
from tests.sandbox.conftest import Requests
from tests.sandbox.test_node_cache import until

CORDONED_AT = datetime(2026, 1, 1, tzinfo=UTC)


class Resolver:
    """What EC2 says of each instance now."""

    def __init__(self) -> None:
        self.infos: dict[str, InstanceInfo] = {}
        self.asked: list[str] = []

    async def get_many(self, instance_ids: list[str], *, fresh: bool = False) -> list[InstanceInfo | None]:
        self.asked.extend(instance_ids)
        return [self.infos.get(instance_id) for instance_id in instance_ids]


async def cordoned(
    cluster: KubeCluster, drainer: Drainer, instance_id: str, *, ready: bool = True, ends: str = ""
) -> str:
    """A fresh node (Ready unless ``ready`` is false: registered, never Ready), cordoned by us for
    ``instance_id`` launched at :data:`CORDONED_AT` (a notice reclaiming it at ``ends``, if given)."""
    name = f"ip-10-4-0-{uuid.uuid4().hex[:6]}.ec2.internal"
    cluster.add_node(name, ready_after_s=0.0 if ready else None)
    if ready:
        cluster.wait_for_nodes([name])
    else:
        for _ in range(1000):  # a hang guard of turns, it measures nothing
            if await drainer.kube.get_node(name) is not None:
                break
            await asyncio.sleep(0.01)
    about = CordonRecord(instance_id=instance_id, launch_time=CORDONED_AT.isoformat(), ends=ends)
    assert await drainer.writes.cordon(name, about=about)
    return name


async def listed_from_cache(kube: KubeClient, names: set[str]) -> None:
    """Until a LIST of our records from the API server's cache shows ``names`` (a hang guard of turns)."""
    for _ in range(1000):
        listed = await kube.list_nodes(f"{RECORD_LABEL}=true", cached=True)
        if names <= {str(node["metadata"]["name"]) for node in listed}:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{sorted(names)} never listed from the cache")


def info(instance_id: str, node: str, state: str, launched: datetime) -> InstanceInfo:
    return InstanceInfo(instance_id, node, "us-east-1a", state, launch_time=launched)


async def test_only_the_nodes_whose_instance_came_back_are_read(
    cluster: KubeCluster, kube: KubeClient, requests: Requests
) -> None:
    drainer = Drainer(kube, DrainOptions(), budget=10)
    resolver = Resolver()
    suffix = uuid.uuid4().hex[:8]
    away, stopped, back = (f"i-{kind}{suffix}" for kind in ("away", "stop", "back"))
    nodes = {instance: await cordoned(cluster, drainer, instance) for instance in (away, stopped, back)}
    resolver.infos = {
        away: info(away, nodes[away], "terminated", CORDONED_AT),
        stopped: info(stopped, nodes[stopped], "stopped", CORDONED_AT),
        back: info(back, nodes[back], "running", CORDONED_AT + timedelta(hours=1)),
    }
    returns = Returns(kube, drainer, resolver, busy=lambda _: False, interval_s=30)  # type: ignore[arg-type]
    # The check lists from the API server's cache, which may not show the cordons yet (a loaded machine, seen on
    # 1.37): the next check would; this one waits for them.
    await listed_from_cache(kube, set(nodes.values()))
    requests.clear()
    assert nodes[back] in await returns.check()
    # The returned node, read for the write (and read again when the write met a concurrent change of the
    # node: a 409 Conflict); the others not at all.
    conflicts = requests.answered["patch nodes 409"]
    assert requests.made["get nodes"] == 1 + conflicts
    assert requests.made["patch nodes"] == 1 + conflicts
    assert not (await kube.get_node(nodes[back]) or {})["spec"].get("unschedulable")
    for instance in (away, stopped):
        assert (await kube.get_node(nodes[instance]) or {})["spec"]["unschedulable"] is True


async def test_an_instance_back_before_the_notice_that_reclaims_it_ends_keeps_its_node_cordoned(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    """A Capacity Reservation interruption's instance stopped and started again (a warm pool) before the
    notice's termination time: back, by its ``LaunchTime``, but reclaimed then all the same. The check leaves
    its node cordoned, and gives back the node of an instance whose notice ended before it came back."""
    drainer = Drainer(kube, DrainOptions(), budget=10)
    resolver = Resolver()
    suffix = uuid.uuid4().hex[:8]
    pending, ended = f"i-pending{suffix}", f"i-ended{suffix}"
    later, earlier = datetime.now(UTC) + timedelta(hours=1), datetime.now(UTC) - timedelta(hours=1)
    nodes = {
        pending: await cordoned(cluster, drainer, pending, ends=later.isoformat()),
        ended: await cordoned(cluster, drainer, ended, ends=earlier.isoformat()),
    }
    resolver.infos = {
        instance: info(instance, node, "running", CORDONED_AT + timedelta(hours=1))
        for instance, node in nodes.items()
    }
    returns = Returns(kube, drainer, resolver, busy=lambda _: False, interval_s=30)  # type: ignore[arg-type]
    await listed_from_cache(kube, set(nodes.values()))
    assert await returns.check() == [nodes[ended]]
    assert (await kube.get_node(nodes[pending]) or {})["spec"]["unschedulable"] is True


async def test_with_the_watched_copy_nothing_is_listed_and_nodes_not_ready_are_not_described(
    cluster: KubeCluster, kube: KubeClient, requests: Requests
) -> None:
    """After a storm thousands of nodes carry our record: the check reads them from the watched copy (no LIST
    of whole nodes every interval), describes only the instances of Ready nodes (a node not Ready is not back,
    whatever EC2 says), and still gives back the node whose instance returned."""
    drainer = Drainer(kube, DrainOptions(), budget=10)
    resolver = Resolver()
    suffix = uuid.uuid4().hex[:8]
    away, back, unready = (f"i-{kind}{suffix}" for kind in ("away", "back", "unready"))
    nodes = {instance: await cordoned(cluster, drainer, instance) for instance in (away, back)}
    nodes[unready] = await cordoned(cluster, drainer, unready, ready=False)
    relaunched = CORDONED_AT + timedelta(hours=1)
    resolver.infos = {
        away: info(away, nodes[away], "terminated", CORDONED_AT),
        back: info(back, nodes[back], "running", relaunched),
        unready: info(unready, nodes[unready], "running", relaunched),
    }
    copy = NodeCache(kube)
    copy.start()
    try:
        await copy.answered.wait()
        await until(
            lambda: all(
                ((copy.get(name) or {}).get("metadata") or {}).get("labels", {}).get(RECORD_LABEL) == "true"
                for name in nodes.values()
            ),
            "our record on the three nodes in the copy",
        )
        returns = Returns(
            kube,
            drainer,
            resolver,  # type: ignore[arg-type]
            busy=lambda _: False,
            interval_s=30,
            nodes=copy,
        )
        requests.clear()
        assert await returns.check() == [nodes[back]]
        assert requests.made["list nodes"] == 0
        ours = [instance for instance in resolver.asked if instance.endswith(suffix)]  # the plane is shared
        assert sorted(ours) == sorted([away, back])
        assert not (await kube.get_node(nodes[back]) or {})["spec"].get("unschedulable")
        assert (await kube.get_node(nodes[unready]) or {})["spec"]["unschedulable"] is True
    finally:
        await copy.close()


async def came_back_in(cluster: KubeCluster, kube: KubeClient) -> tuple[str, Drainer, Resolver, str]:
    """A namespace for node Leases, and a node we cordoned whose instance is back in service (running, started
    an hour after the cordon): the namespace, the drainer, the resolver that says so, the node's name."""
    namespace = f"ops-{uuid.uuid4().hex[:6]}"
    cluster.ensure_namespace(namespace)
    drainer = Drainer(kube, DrainOptions(), budget=10)
    resolver = Resolver()
    back = f"i-back{uuid.uuid4().hex[:8]}"
    node = await cordoned(cluster, drainer, back)
    resolver.infos = {back: info(back, node, "running", CORDONED_AT + timedelta(hours=1))}
    return namespace, drainer, resolver, node


async def test_a_node_another_replica_holds_is_not_given_back(cluster: KubeCluster, kube: KubeClient) -> None:
    """Issue 47.7: the check asked only this process whether a node was being drained. A node whose Lease
    another replica holds (its drain runs there, or waits for its turn) is left alone, whatever its instance
    says; once that replica releases the Lease, the node is given back."""
    from queue_processor.leases import NodeLeases

    namespace, drainer, resolver, node = await came_back_in(cluster, kube)
    ours = NodeLeases(kube, namespace=namespace, identity="replica-a", duration_s=60)
    other = NodeLeases(kube, namespace=namespace, identity="replica-b", duration_s=60)
    copy = NodeCache(kube)  # a LIST from the API server's cache may not show the node yet
    try:
        copy.start()
        ours.watch.start()
        assert await ours.watch.wait_first_answer(30)
        await until(lambda: copy.get(node) is not None, "the node in the watched copy")
        held = await other.claim(node)
        assert held is not None
        await until(lambda: ours.held_elsewhere(node), "the other replica's Lease in our copy")
        returns = Returns(
            kube,
            drainer,
            resolver,  # type: ignore[arg-type]
            busy=lambda _: False,
            leases=ours,
            interval_s=30,
            nodes=copy,
        )
        assert await returns.check() == []
        assert (await kube.get_node(node) or {})["spec"]["unschedulable"] is True
        await held.release()
        await other.flush()
        await until(lambda: not ours.held_elsewhere(node), "the release in our copy")
        assert await returns.check() == [node]
        assert not (await kube.get_node(node) or {})["spec"].get("unschedulable")
    finally:
        await copy.close()
        await ours.close()
        await other.close()


async def test_a_node_whose_holder_replica_is_gone_is_given_back(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    """Explorer seed 1669: a replica killed while it held a node's Lease leaves that Lease behind; its replica
    Lease lapses (here: is gone), so a claim would take the node, and so does the check: the node of an
    instance back in service is given back, not left cordoned for ever behind a dead holder."""
    from queue_processor.leases import NodeLeases

    namespace, drainer, resolver, node = await came_back_in(cluster, kube)
    ours = NodeLeases(kube, namespace=namespace, identity="replica-a", duration_s=60)
    dead = NodeLeases(kube, namespace=namespace, identity="replica-b", duration_s=60)
    copy = NodeCache(kube)
    try:
        copy.start()
        ours.watch.start()
        assert await ours.watch.wait_first_answer(30)
        await until(lambda: copy.get(node) is not None, "the node in the watched copy")
        assert await dead.claim(node) is not None
        await rest.stop(dead.replica._renewer)  # killed: nothing renews its replica Lease any more
        await kube.delete_lease(namespace, dead.replica.name)  # lapsed and gone; its node Lease left
        await until(lambda: ours.held_elsewhere(node), "the dead replica's Lease in our copy")
        returns = Returns(
            kube,
            drainer,
            resolver,  # type: ignore[arg-type]
            busy=lambda _: False,
            leases=ours,
            interval_s=30,
            nodes=copy,
        )
        assert await returns.check() == [node]
        assert not (await kube.get_node(node) or {})["spec"].get("unschedulable")
    finally:
        await copy.close()
        await ours.close()
