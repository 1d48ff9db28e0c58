"""The watched copy of the nodes (queue_processor.watch) on a scripted client: what it keeps of a
node, when it lists again (a 410), and that a refusal leaves cordons reading the node as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from queue_processor import watch as node_cache
from queue_processor import watch as watched
from queue_processor.outcomes import KubeError
from queue_processor.watch import RECORD_ANNOTATION, NodeCache, slim, slim_event
from tests.unit.scripted_watch import ScriptedWatch


def node(name: str, rv: str = "1", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": rv},
        "spec": spec,
        "status": {"capacity": {"cpu": "2"}},
    }


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
    kube = ScriptedWatch(
        KubeError(410, "Expired", "too old"), [{"type": "ADDED", "object": node("b")}], nodes=[node("a")]
    )
    cache = NodeCache(kube)  # type: ignore[arg-type]
    cache.start()
    await cache.answered.wait()
    for _ in range(50):
        if cache.get("b") is not None:
            break
        await asyncio.sleep(0)
    assert kube.reads == 2
    assert kube.watched_from == ["100", "200"]
    assert cache.get("a") is not None
    assert cache.get("b") is not None
    await cache.close()
    assert cache.get("a") is None  # closed: not current


async def test_a_refused_list_leaves_the_cordons_reading_nodes() -> None:
    kube = ScriptedWatch(list_error=KubeError(403, "Forbidden", "nodes is forbidden"))
    cache = NodeCache(kube)  # type: ignore[arg-type]
    cache.start()
    await cache.answered.wait()
    assert cache.refused is not None
    assert cache.refused.status == 403
    assert cache.get("a") is None
    assert cache.all() is None
    await cache.close()


async def test_a_broken_stream_resumes_from_the_last_change_it_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watched, "RETRY_S", 0.0)
    modified = {"type": "MODIFIED", "object": node("a", "150", unschedulable=True)}
    kube = ScriptedWatch(([modified], KubeError(0, "ConnectionError", "reset")), [], nodes=[node("a")])
    cache = NodeCache(kube)  # type: ignore[arg-type]
    cache.start()
    await kube.connections(2)
    assert kube.watched_from == ["100", "150"]
    assert kube.reads == 1
    assert (cache.get("a") or {})["spec"] == {"unschedulable": True}
    await cache.close()


@pytest.mark.parametrize("where", ["kept", "applied"])
async def test_an_event_the_copy_cannot_read_reads_the_nodes_again(
    where: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node whose labels are not a map cannot be kept, whether the watch thread fails on it (``kept``: it
    slims each event) or the loop does (``applied``: an event that reaches it whole): the error is logged, the
    copy is not live until the nodes are listed again, and the watch goes on from the new list (the copy had
    missed that event)."""
    monkeypatch.setattr(watched, "RETRY_S", 0.0)
    if where == "applied":
        monkeypatch.setattr(node_cache, "slim_event", lambda event: event)
    broken = node("a", "150")
    broken["metadata"]["labels"] = 5
    kube = ScriptedWatch([{"type": "MODIFIED", "object": broken}], [], nodes=[node("a")])
    cache = NodeCache(kube)  # type: ignore[arg-type]
    cache.start()
    await kube.connections(2)
    assert kube.reads == 2
    assert kube.watched_from == ["100", "200"]
    assert cache.live
    assert (cache.get("a") or {})["metadata"]["resourceVersion"] == "1"
    assert f"watch event not {where}; reading again" in capsys.readouterr().out
    await cache.close()


def test_a_node_is_absent_only_when_the_current_copy_has_none_by_name_or_hostname_label() -> None:
    cache = NodeCache(ScriptedWatch())  # type: ignore[arg-type]
    dns = "ip-10-0-0-1.ec2.internal"

    def named(name: str, hostname: str | None, rv: str) -> dict[str, Any]:
        labeled = node(name, rv)
        labeled["metadata"]["labels"] = {"kubernetes.io/hostname": hostname} if hostname else {}
        return labeled

    cache._apply([{"type": "ADDED", "object": named("worker-1", "ip-10-0-0-1", "1")}])
    assert cache.absent(dns) is False  # not current: nothing is known
    cache.live = True
    assert cache.absent(dns) is False  # its hostname label is the name's first label
    cache._apply([{"type": "MODIFIED", "object": named("worker-1", "other", "2")}])
    assert cache.absent(dns) is True  # the label changed: the old one no longer names it
    cache._apply([{"type": "ADDED", "object": named(dns, None, "3")}])
    assert cache.absent(dns) is False  # named after the DNS name
    cache._apply([{"type": "DELETED", "object": named(dns, None, "4")}])
    cache._apply([{"type": "ADDED", "object": named("worker-2", dns, "5")}])
    assert cache.absent(dns) is False  # labeled with the whole DNS name
    cache._apply([{"type": "DELETED", "object": named("worker-2", dns, "6")}])
    assert cache.absent(dns) is True
    assert cache.absent("ip-10-0-0-2.ec2.internal") is True


def test_the_slim_copy_keeps_the_ready_condition_alone_and_slims_to_itself() -> None:
    whole = node("a", "7")
    whole["status"] = {
        "conditions": [
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
            {
                "type": "Ready",
                "status": "False",
                "reason": "KubeletNotReady",
                "message": "PLEG is not healthy",
            },
        ],
        "images": [{"names": ["registry.example/app:1"], "sizeBytes": 1}],
    }
    kept = slim(whole)
    assert kept["status"] == {"conditions": [{"type": "Ready", "status": "False"}]}
    assert slim(kept) == kept
    assert "status" not in slim(node("b", "8"))  # no Ready condition reported: none kept (not Ready)


def test_the_watch_keeps_a_slim_copy_of_a_node_event_and_the_name_of_a_deletion() -> None:
    whole = node("a", "7")
    assert slim_event({"type": "MODIFIED", "object": whole}) == {"type": "MODIFIED", "object": slim(whole)}
    assert slim_event({"type": "DELETED", "object": whole}) == {
        "type": "DELETED",
        "object": {"metadata": {"name": "a", "resourceVersion": "7"}},
    }
    assert slim_event({"type": "ERROR", "object": {"code": 410}}) is None
    broken = node("b", "9")
    broken["metadata"]["labels"] = 5
    with pytest.raises(TypeError):  # the watch ends, and the nodes are read again (above)
        slim_event({"type": "ADDED", "object": broken})
