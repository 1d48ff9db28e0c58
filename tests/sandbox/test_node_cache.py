"""The watched copy of the nodes (:mod:`queue_processor.watch`), on both API servers (the emulation
must agree with the real one): the nodes are listed page by page and followed by a watch; a cordon writes on
the copy without reading the node (one request, not two); a copy behind the server is answered 409 and the
cordon writes again on a fresh read, keeping what the other writer set."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from queue_processor.drain.drainer import Drainer
from queue_processor.drain.node_writes import CordonRecord
from queue_processor.drain.plan import DrainOptions
from queue_processor.kube import KubeClient
from queue_processor.watch import NodeCache, slim, slim_event
from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.cluster import KubeCluster
from queue_processor_sandbox.kube import KubeSandbox
from tests.sandbox.conftest import Requests, client_of

OTHER = {"key": "example.com/gpu", "value": "true", "effect": "NoSchedule"}


def a_node(cluster: KubeCluster) -> str:
    name = f"ip-10-5-0-{uuid.uuid4().hex[:6]}.ec2.internal"
    cluster.add_node(name)
    cluster.wait_for_nodes([name])
    return name


async def until(check: Callable[[], bool], what: str) -> None:
    """Yield to the loop until ``check()`` holds (the watch's events arrive from its thread); a hang guard of
    a thousand turns of 10 ms, it measures nothing."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_nodes_are_listed_in_pages_and_followed(cluster: KubeCluster, kube: KubeClient) -> None:
    names = [a_node(cluster) for _ in range(3)]
    pages = [page async for page, _ in kube.node_pages(limit=2)]
    assert len(pages) >= 2
    assert all(len(page) <= 2 for page in pages)
    listed = {node["metadata"]["name"] for page in pages for node in page}
    assert set(names) <= listed
    cache = NodeCache(kube)
    cache.start()
    try:
        await cache.answered.wait()
        assert cache.live
        assert cache.refused is None
        assert set(names) <= {node["metadata"]["name"] for node in cache.all() or []}
        later = a_node(cluster)
        await until(lambda: cache.get(later) is not None, "the new node in the copy")
        await kube.patch_node(later, {"spec": {"taints": [OTHER]}})
        await until(lambda: bool((cache.get(later) or {})["spec"].get("taints")), "the taint in the copy")
        cluster.delete_node(later)
        await until(lambda: cache.get(later) is None, "the deleted node gone from the copy")
    finally:
        await cache.close()


async def test_a_cordon_on_the_watched_copy_is_one_request(
    cluster: KubeCluster, kube: KubeClient, requests: Requests
) -> None:
    """Once the copy has the node as the server has it, the cordon is its one write. A change of the node by
    someone else in between (the real cluster's node controllers may write at any moment) would cost a 409 and
    a read: such an attempt is made again on another node, three at most."""
    cache = NodeCache(kube)
    cache.start()
    try:
        await cache.answered.wait()
        drainer = Drainer(kube, DrainOptions(), budget=10, nodes=cache)
        for _ in range(3):
            name = a_node(cluster)
            current = await kube.get_node(name)
            assert current is not None
            version = current["metadata"]["resourceVersion"]
            await until(
                lambda: (cache.get(name) or {}).get("metadata", {}).get("resourceVersion") == version,  # noqa: B023
                "the node in the copy as the server has it",
            )
            requests.made.clear()
            assert await drainer.writes.cordon(name, about=CordonRecord(instance_id="i-0cache"))
            if requests.made != {"patch nodes": 2, "get nodes": 1}:  # not a write between: the case tested
                break
        assert requests.made == {"patch nodes": 1}
        node = await kube.get_node(name)
        assert node is not None
        assert node["spec"]["unschedulable"] is True
        record = CordonRecord.from_node(node)
        assert record is not None
        assert record.unschedulable
        assert record.instance_id == "i-0cache"
    finally:
        await cache.close()


async def test_a_cordon_at_start_up_waits_for_the_copy_rather_than_reading_its_node(
    cluster: KubeCluster, kube: KubeClient, requests: Requests, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start-up the storm is already in the queue: a cordon asked before the copy's first answer waits for
    it (``FIRST_COPY_WAIT_S`` at most) and writes on it, rather than reading its node with a GET, an urgent
    request the copy's own pages would wait behind. A change of the node by someone else in between (the real
    cluster's node controllers) would cost a 409 and a read: such an attempt is made again on another node."""
    monkeypatch.setattr(
        "queue_processor.drain.node_writes.FIRST_COPY_WAIT_S", 3600.0
    )  # no bound a slow CI reaches
    made: dict[str, int] = {}
    for _ in range(3):
        name = a_node(cluster)
        cache = NodeCache(kube)
        requests.made.clear()
        cache.start()
        try:
            assert not cache.answered.is_set()
            drainer = Drainer(kube, DrainOptions(), budget=10, nodes=cache)
            assert await drainer.writes.cordon(name, about=CordonRecord(instance_id="i-0first"))
            made = {kind: n for kind, n in requests.made.items() if kind in ("get nodes", "patch nodes")}
            if made != {"patch nodes": 2, "get nodes": 1}:  # not a write between: the case tested
                break
        finally:
            await cache.close()
    assert made == {"patch nodes": 1}
    node = await kube.get_node(name)
    assert node is not None
    assert node["spec"]["unschedulable"] is True


class Stale:
    """A watched copy that has not seen the latest change of the node."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node

    def get(self, name: str) -> dict[str, Any] | None:
        return self.node

    async def wait_first_answer(self, timeout_s: float) -> bool:
        return True


async def test_a_cordon_on_a_stale_copy_is_refused_and_written_again_on_a_read(
    cluster: KubeCluster, kube: KubeClient, requests: Requests
) -> None:
    name = a_node(cluster)
    before = await kube.get_node(name)
    assert before is not None
    stale = copy.deepcopy(before)
    await kube.patch_node(name, {"spec": {"taints": [OTHER], "unschedulable": True}})  # someone else, since
    requests.made.clear()
    drainer = Drainer(kube, DrainOptions(), budget=10, nodes=Stale(stale))  # type: ignore[arg-type]
    assert await drainer.writes.cordon(name, taints=[("ours", "x", "NoSchedule")])
    assert requests.made == {"patch nodes": 2, "get nodes": 1}  # 409 on the copy, then read and written
    node = await kube.get_node(name)
    assert node is not None
    keys = {(taint["key"], taint["effect"]) for taint in node["spec"]["taints"]}
    assert {(OTHER["key"], OTHER["effect"]), ("ours", "NoSchedule")} <= keys
    record = CordonRecord.from_node(node)
    assert record is not None
    assert not record.unschedulable


async def test_after_a_compaction_and_a_restart_the_nodes_are_listed_again(tmp_path: Path) -> None:
    """Emulation only (a test cannot compact the real cluster's etcd): the dropped watch resumes from its
    resourceVersion, is told 410, and the copy is listed again and followed from there."""
    requests = Requests()
    with KubeSandbox(SandboxClock(1.0)) as cluster:
        kube = client_of(cluster, tmp_path, requests)
        cache = NodeCache(kube)
        cache.start()
        try:
            await cache.answered.wait()
            before = a_node(cluster)
            await until(lambda: cache.get(before) is not None, "the node in the copy")
            requests.made.clear()
            cluster.ensure_namespace("later")  # a change past the watch's last resourceVersion
            cluster.compact(end_watches=True)
            await until(lambda: requests.made["list nodes"] >= 1 and cache.live, "listed again")
            later = a_node(cluster)
            await until(lambda: cache.get(later) is not None, "a node added after, in the copy")
            assert cache.get(before) is not None
        finally:
            await cache.close()
            kube.close()


async def test_a_watch_closed_by_its_reader_shuts_its_connection(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    """The client hands a watch's events to whoever iterates it; a reader that stops (its copy could not apply
    an event, and it reads everything again) closes the watch, and the thread reading the connection ends: no
    thread and no connection is left behind by each read again."""
    pages = [version async for _, version in kube.node_pages()]
    before = {thread for thread in threading.enumerate() if thread.name == "kube-watch"}

    async def read() -> None:
        async with contextlib.aclosing(kube.watch("/api/v1/nodes", pages[-1], timeout_s=120)) as chunks:
            async for events in chunks:
                if events:
                    raise ValueError("cannot apply")
                a_node(cluster)  # accepted: a change to stream

    with pytest.raises(ValueError, match="cannot apply"):
        await read()
    await until(
        lambda: not {t for t in threading.enumerate() if t.name == "kube-watch"} - before, "the thread ended"
    )


async def test_a_deleted_node_is_absent_from_the_copy_and_a_new_one_present(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    """What lets the state change of a terminated instance end with no node read: the copy says no node is
    left for its DNS name once the node is deleted, and knows a node as soon as the watch delivers it."""
    cache = NodeCache(kube)
    cache.start()
    try:
        await cache.answered.wait()
        name = a_node(cluster)
        await until(lambda: not cache.absent(name), "the new node in the copy")
        cluster.delete_node(name)
        await until(lambda: cache.absent(name), "the deleted node gone from the copy")
    finally:
        await cache.close()


async def test_a_watch_delivers_what_its_keep_keeps_and_marks_where_the_stream_is(
    cluster: KubeCluster, kube: KubeClient
) -> None:
    """The node watch slims each event in its thread (:func:`slim_event`): the loop receives the copy's part of
    an added node and the name of a deleted one, never the whole object; an event the thread drops still moves
    the receiver's resourceVersion on, with a ``BOOKMARK`` carrying only it (where a broken stream resumes)."""
    pages = [version async for _, version in kube.node_pages()]
    seen: list[dict[str, Any]] = []
    ours = f"ip-10-5-1-{uuid.uuid4().hex[:6]}.ec2.internal"

    def keep(event: dict[str, Any]) -> dict[str, Any] | None:
        named = ((event.get("object") or {}).get("metadata") or {}).get("name")
        return slim_event(event) if named == ours else None

    async def read() -> None:
        async for events in kube.watch("/api/v1/nodes", pages[-1], timeout_s=120, keep=keep):
            seen.extend(events)

    watch = asyncio.create_task(read())
    try:
        cluster.add_node(ours)
        cluster.wait_for_nodes([ours])
        cluster.delete_node(ours)
        await until(lambda: any(event["type"] == "DELETED" for event in seen), "the deletion delivered")
        other = a_node(cluster)  # dropped by keep: only a bookmark reaches the loop
        before = len(seen)
        await until(lambda: any(e["type"] == "BOOKMARK" for e in seen[before:]), "a bookmark after the drop")
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    for event in seen:
        metadata = event["object"]["metadata"]
        assert metadata["resourceVersion"]
        if event["type"] == "BOOKMARK":
            assert event["object"] == {"metadata": {"resourceVersion": metadata["resourceVersion"]}}
        elif event["type"] == "DELETED":
            assert event["object"] == {
                "metadata": {"name": ours, "resourceVersion": metadata["resourceVersion"]}
            }
        else:
            assert event["type"] in ("ADDED", "MODIFIED")
            assert metadata["name"] == ours
            assert event["object"] == slim(event["object"])  # no managedFields, images, capacity…
    assert other not in str(seen)
    ready = [e["object"].get("status") for e in seen if e["type"] in ("ADDED", "MODIFIED")]
    assert {"conditions": [{"type": "Ready", "status": "True"}]} in ready  # the check of returns reads it
