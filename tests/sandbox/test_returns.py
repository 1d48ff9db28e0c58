"""The periodic check for instances back in service (:class:`queue_processor.returns.Returns`), on both API
servers: a node whose instance is not back is decided from the node LIST alone, with no read of its own (at
1,000 drained nodes, the storm read every one of them again every RETURN_CHECK_INTERVAL_SEC); a node whose
instance came back is read once and given back as it was."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from queue_processor.drain.drainer import Drainer
from queue_processor.drain.filters import DrainOptions
from queue_processor.drain.record import CordonRecord
from queue_processor.kube import KubeClient
from queue_processor.nodes import InstanceInfo
from queue_processor.returns import Returns
from queue_processor_sandbox.cluster import KubeCluster
from tests.sandbox.conftest import Requests

CORDONED_AT = datetime(2026, 1, 1, tzinfo=UTC)


class Resolver:
    """What EC2 says of each instance now."""

    def __init__(self) -> None:
        self.infos: dict[str, InstanceInfo] = {}

    async def get(self, instance_id: str, *, fresh: bool = False) -> InstanceInfo | None:
        return self.infos.get(instance_id)


async def cordoned(cluster: KubeCluster, drainer: Drainer, instance_id: str) -> str:
    """A fresh Ready node, cordoned by us for ``instance_id`` launched at :data:`CORDONED_AT`."""
    name = f"ip-10-4-0-{uuid.uuid4().hex[:6]}.ec2.internal"
    cluster.add_node(name)
    cluster.wait_for_nodes([name])
    about = CordonRecord(instance_id=instance_id, launch_time=CORDONED_AT.isoformat())
    assert await drainer.cordon(name, about=about)
    return name


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
    requests.made.clear()
    assert nodes[back] in await returns.check()
    # The returned node, read for the write (and read again when the write met a concurrent change of the
    # node: a 409 Conflict); the others not at all.
    conflicts = requests.answered["patch nodes 409"]
    assert requests.made["get nodes"] == 1 + conflicts
    assert requests.made["patch nodes"] == 1 + conflicts
    assert not (await kube.get_node(nodes[back]) or {})["spec"].get("unschedulable")
    for instance in (away, stopped):
        assert (await kube.get_node(nodes[instance]) or {})["spec"]["unschedulable"] is True
