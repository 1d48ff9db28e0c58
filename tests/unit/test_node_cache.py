"""The watched copy of the nodes (queue_processor.drain.node_cache) on a scripted client: what it keeps of a
node, when it lists again (a 410), and that a refusal leaves cordons reading the node as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from queue_processor.drain.node_cache import NodeCache, slim
from queue_processor.drain.record import RECORD_ANNOTATION
from queue_processor.kube import KubeError

Deliver = Callable[[list[dict[str, Any]]], None]


def node(name: str, rv: str = "1", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": rv},
        "spec": spec,
        "status": {"capacity": {"cpu": "2"}},
    }


class ScriptedKube:
    """Each list (``node_pages``) answers ``nodes`` at resourceVersion "100", "200"…, or raises ``list_error``;
    each ``watch_nodes`` takes the next step of ``script``: an exception to raise, events to deliver before
    waiting for the end of the test, or ``(events, exception)``: events, then the stream breaks."""

    def __init__(
        self, nodes: list[dict[str, Any]], *script: Any, list_error: KubeError | None = None
    ) -> None:
        self.nodes = nodes
        self.script = list(script)
        self.lists = 0
        self.list_error = list_error
        self.watched_from: list[str] = []

    async def node_pages(self, limit: int = 500) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        if self.list_error is not None:
            raise self.list_error
        self.lists += 1
        yield self.nodes, str(self.lists * 100)

    async def watch_nodes(
        self, rv: str, deliver: Deliver, *, timeout_s: float, opened: Callable[[], None] | None = None
    ) -> str:
        self.watched_from.append(rv)
        step = self.script.pop(0) if self.script else []
        if isinstance(step, BaseException):
            raise step
        if opened is not None:
            opened()
        if isinstance(step, tuple):  # events, then the stream breaks
            events, broken = step
            deliver(events)
            raise broken
        deliver(step)
        await asyncio.get_running_loop().create_future()  # until closed
        return rv


def test_the_copy_keeps_what_a_cordon_reads_and_nothing_else() -> None:
    full = node(
        "a", "7", unschedulable=True, taints=[{"key": "k", "effect": "NoSchedule"}], providerID="aws:///z/i-1"
    )
    full["metadata"] |= {"labels": {"l": "v"}, "annotations": {RECORD_ANNOTATION: "{}", "other": "x" * 1000}}
    assert slim(full) == {
        "metadata": {
            "name": "a",
            "resourceVersion": "7",
            "labels": {"l": "v"},
            "annotations": {RECORD_ANNOTATION: "{}"},
        },
        "spec": {
            "providerID": "aws:///z/i-1",
            "unschedulable": True,
            "taints": [{"key": "k", "effect": "NoSchedule"}],
        },
    }


async def test_a_410_lists_the_nodes_again_and_watches_from_the_new_list() -> None:
    kube = ScriptedKube(
        [node("a")], KubeError(410, "Expired", "too old"), [{"type": "ADDED", "object": node("b")}]
    )
    cache = NodeCache(kube)  # type: ignore[arg-type]
    cache.start()
    await cache.answered.wait()
    for _ in range(50):
        if cache.get("b") is not None:
            break
        await asyncio.sleep(0)
    assert kube.lists == 2
    assert kube.watched_from == ["100", "200"]
    assert cache.get("a") is not None
    assert cache.get("b") is not None
    await cache.close()
    assert cache.get("a") is None  # closed: not current


async def test_a_refused_list_leaves_the_cordons_reading_nodes() -> None:
    kube = ScriptedKube([], list_error=KubeError(403, "Forbidden", "nodes is forbidden"))
    cache = NodeCache(kube)  # type: ignore[arg-type]
    cache.start()
    await cache.answered.wait()
    assert cache.refused is not None
    assert cache.refused.status == 403
    assert cache.get("a") is None
    assert cache.all() is None
    await cache.close()


async def test_a_broken_stream_resumes_from_the_last_change_it_delivered() -> None:
    modified = {"type": "MODIFIED", "object": node("a", "150", unschedulable=True)}
    kube = ScriptedKube([node("a")], ([modified], KubeError(0, "ConnectionError", "reset")), [])
    cache = NodeCache(kube)  # type: ignore[arg-type]
    cache.start()
    for _ in range(1000):
        if len(kube.watched_from) == 2:
            break
        await asyncio.sleep(
            0.01
        )  # the backoff before the resume is 0.5 s (a hang guard, it measures nothing)
    assert kube.watched_from == ["100", "150"]
    assert kube.lists == 1
    assert (cache.get("a") or {})["spec"] == {"unschedulable": True}
    await cache.close()
