"""A drain waits for its evicted pods through the watch of pod deletions, on both API servers (the emulation must
agree with the real one): one list of the node's pods, then no more while the watch runs; a pod that does not go
is still found by a last list at the deadline; and where the watch is refused, the drain lists as before.

Time runs unscaled here (1 simulated second = 1 real second): grace periods are a second or two.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from queue_processor.drain.drainer import Drainer
from queue_processor.drain.plan import DrainOptions
from queue_processor.kube import KubeClient
from queue_processor.watch import Departures
from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.cluster import KubeCluster
from queue_processor_sandbox.kube import KubeSandbox
from tests.sandbox.conftest import Requests, client_of


def a_node(cluster: KubeCluster) -> tuple[str, str]:
    """A fresh Ready node and a fresh namespace."""
    suffix = uuid.uuid4().hex[:6]
    name = f"ip-10-3-0-{suffix}.ec2.internal"
    cluster.add_node(name)
    cluster.wait_for_nodes([name])
    namespace = f"gone-{suffix}"
    cluster.ensure_namespace(namespace)
    return name, namespace


async def live(departures: Departures) -> None:
    departures.start()
    await departures.answered.wait()
    assert departures.live


@pytest.mark.parametrize("watched", [True, False], ids=["watch", "no-watch"])
async def test_a_drain_lists_its_node_once_while_the_watch_runs(
    cluster: KubeCluster, kube: KubeClient, requests: Requests, watched: bool
) -> None:
    """With the watch, one list of the node; without it (the counterpart: the polls the watch saves), the wait
    re-lists at least once per second of the pods' grace periods."""
    client = kube
    node, namespace = a_node(cluster)
    for index in range(4):
        cluster.add_pod(namespace, f"web-{index}", node=node, labels={"app": "web"}, grace_s=index % 2 + 1)
    departures = Departures(client) if watched else None
    if departures is not None:
        await live(departures)
    drainer = Drainer(client, DrainOptions(), budget=1, departures=departures)
    try:
        result = await drainer.drain(node, drainer.clock() + 60)
    finally:
        if departures is not None:
            await departures.close()
    assert result.completed, result
    assert result.evicted == 4
    if departures is not None:
        assert requests.made["list pods"] == 2  # the watch's start (limit=1) and the drain's one list
        assert requests.made["watch pods"] == 1
        assert departures.seen >= 4
    else:
        assert requests.made["list pods"] > 3
    assert not [pod for pod in await client.pods_on_node(node) if pod["metadata"]["namespace"] == namespace]


async def test_a_pod_that_never_goes_is_found_by_a_last_list_at_the_deadline(
    cluster: KubeCluster, kube: KubeClient, requests: Requests
) -> None:
    client = kube
    node, namespace = a_node(cluster)
    cluster.add_pod(namespace, "quick", node=node, grace_s=1)
    # Unready: no kubelet plays it (KWOK disregards it; the emulation leaves it), so once evicted it stays
    # terminating, on both servers.
    cluster.add_pod(namespace, "stuck", node=node, grace_s=1, ready=False)
    departures = Departures(client)
    await live(departures)
    drainer = Drainer(client, DrainOptions(), budget=1, departures=departures)
    try:
        result = await drainer.drain(node, drainer.clock() + 8)
    finally:
        await departures.close()
    assert not result.completed
    assert result.remaining == 1
    assert requests.made["list pods"] == 3  # the watch's start, the drain's list, the last list


async def test_a_refused_watch_leaves_the_drain_listing(tmp_path: Path) -> None:
    """Emulation only (fault injection): RBAC without ``pods`` ``watch`` answers 403; the drain polls."""
    with KubeSandbox(SandboxClock(1.0)) as sandbox:
        node, namespace = a_node(sandbox)
        sandbox.add_pod(namespace, "web-0", node=node, grace_s=1)
        sandbox.inject_fault(verb="watch", resource="pods", status=403, count=1000)
        requests = Requests()
        client = client_of(sandbox, tmp_path, requests)
        departures = Departures(client)
        departures.start()
        try:
            await departures.answered.wait()
            drainer = Drainer(client, DrainOptions(), budget=1, departures=departures)
            result = await drainer.drain(node, drainer.clock() + 30)
        finally:
            await departures.close()
            client.close()
    assert result.completed, result
    assert departures.refused is not None
    assert departures.refused.status == 403
    assert requests.made["list pods"] >= 3
