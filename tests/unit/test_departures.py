"""The watch of pod deletions (queue_processor.watch), on a scripted client: when a drain may trust
what the watch saw (a ticket of the current epoch, deletions remembered since), and when it must list again
(the watch restarted after a 410, broke, or forgot)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from queue_processor import watch as departures_module
from queue_processor import watch as watched
from queue_processor.outcomes import KubeError
from queue_processor.watch import Departures, deletion
from tests.unit.scripted_watch import ScriptedWatch


def deleted(uid: str) -> dict[str, Any]:
    return {"type": "DELETED", "object": {"metadata": {"name": uid, "namespace": "ns", "uid": uid}}}


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_deletion_empties_the_drains_pending_set_and_wakes_it() -> None:
    kube = ScriptedWatch([])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await departures.answered.wait()
    ticket = departures.ticket()
    with departures.waiting({(("ns", "a"), "a"), (("ns", "b"), "b")}, ticket) as wait:
        assert departures.covers(wait)
        await kube.deliver([deleted("a"), {"type": "MODIFIED", "object": {"metadata": {"uid": "b"}}}])
        assert wait.changed.is_set()
        assert wait.pending == {(("ns", "b"), "b")}
    assert not departures._waiting  # unregistered
    await departures.close()


async def test_a_deletion_seen_before_the_drain_followed_its_pods_counts() -> None:
    """The list came after the ticket, the deletion before the registration: the memory covers it."""
    kube = ScriptedWatch([])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await departures.answered.wait()
    ticket = departures.ticket()
    await kube.deliver([deleted("a")])
    with departures.waiting({(("ns", "a"), "a"), (("ns", "b"), "b")}, ticket) as wait:
        assert wait.pending == {(("ns", "b"), "b")}
    await departures.close()


async def test_after_a_410_the_watch_starts_again_from_now_and_old_tickets_are_not_trusted() -> None:
    kube = ScriptedWatch([], KubeError(410, "Expired", "too old resource version"), [])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await departures.answered.wait()
    old = departures.ticket()
    with departures.waiting({(("ns", "a"), "a")}, old) as wait:
        assert departures.covers(wait)
        kube.end("150")  # the stream ends; the next one answers 410, then a fresh start
        await settle()
        assert kube.watched_from == ["100", "150", "200"]
        assert departures.live
        assert wait.changed.is_set()
        assert not departures.covers(wait)  # it must list again, with a new ticket
        departures.listed(wait, departures.ticket(), {(("ns", "a"), "a")})
        assert departures.covers(wait)
    await departures.close()


async def test_a_broken_stream_resumes_where_it_was_and_keeps_the_tickets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watched, "RETRY_S", 0.0)
    kube = ScriptedWatch([], KubeError(0, "ConnectionError", "reset"), [])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await departures.answered.wait()
    ticket = departures.ticket()
    with departures.waiting({(("ns", "a"), "a")}, ticket) as wait:
        kube.end("170")
        await settle()
        assert wait.changed.is_set()  # the break woke the drain (it lists while the watch is down)
        assert kube.watched_from == ["100", "170", "170"]  # the next connection goes on from where it was
        assert departures.live
        assert departures.epoch == 1
        assert departures.covers(wait)  # nothing was missed: the same epoch
    await departures.close()


async def test_a_stream_that_breaks_after_a_deletion_resumes_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not from the connection's first resourceVersion: the deletion is not delivered twice, and none after it
    is missed."""
    monkeypatch.setattr(watched, "RETRY_S", 0.0)
    gone = deleted("a")
    gone["object"]["metadata"]["resourceVersion"] = "160"
    kube = ScriptedWatch(([gone], KubeError(0, "ConnectionError", "reset")), [])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await kube.connections(2)
    assert kube.watched_from == ["100", "160"]
    assert departures.seen == 1
    assert departures.epoch == 1
    await departures.close()


async def test_a_ticket_older_than_the_memory_is_not_trusted() -> None:
    kube = ScriptedWatch([])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.memory = 3
    departures.start()
    await departures.answered.wait()
    ticket = departures.ticket()
    await kube.deliver(
        [deleted("x"), deleted("y"), deleted("z")]
    )  # three deletions between the ticket and the
    with departures.waiting({(("ns", "a"), "a")}, ticket) as wait:  # registration: "x" may be forgotten
        assert not departures.covers(wait)
    assert len(departures._gone) == 3
    await departures.close()


async def test_once_registered_a_drain_is_covered_however_many_pods_go_elsewhere() -> None:
    kube = ScriptedWatch([])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.memory = 3
    departures.start()
    await departures.answered.wait()
    with departures.waiting({(("ns", "a"), "a")}, departures.ticket()) as wait:
        await kube.deliver([deleted(f"other-{index}") for index in range(10)])
        assert departures.covers(wait)  # each deletion of its pods reaches it directly
        await kube.deliver([deleted("a")])
        assert not wait.pending
    await departures.close()


async def test_a_refused_watch_is_said_once_and_gives_no_tickets() -> None:
    refusal = KubeError(403, "Forbidden", 'pods is forbidden: cannot watch resource "pods"')
    kube = ScriptedWatch(refusal, refusal)
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await departures.answered.wait()
    assert departures.refused is refusal
    assert departures.ticket() is None
    await departures.close()


def test_the_watch_keeps_a_deletion_s_uid_and_nothing_of_other_events() -> None:
    gone = deleted("a")
    gone["object"]["metadata"].update(resourceVersion="160", name="web-1", labels={"app": "web"})
    assert deletion(gone) == {
        "type": "DELETED",
        "object": {"metadata": {"uid": "a", "resourceVersion": "160"}},
    }
    assert deletion({"type": "MODIFIED", "object": {"metadata": {"uid": "b"}}}) is None
    assert deletion({"type": "DELETED", "object": {"metadata": {}}}) is None
    assert deletion({"type": "DELETED", "object": None}) is None


async def test_an_event_the_watch_thread_cannot_keep_reads_the_pods_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A keep that raises ends the connection as a receiver's error: the watch starts again from a fresh read
    (a new epoch: tickets taken before are not trusted), not from where it was, which would fail again."""
    monkeypatch.setattr(watched, "RETRY_S", 0.0)

    def cannot(event: dict[str, Any]) -> dict[str, Any] | None:
        raise ValueError("cannot keep")

    monkeypatch.setattr(departures_module, "deletion", cannot)
    kube = ScriptedWatch([deleted("a")], [])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await kube.connections(2)
    assert kube.reads == 2
    assert kube.watched_from == ["100", "200"]
    assert departures.epoch == 2
    assert "watch event not kept; reading again" in capsys.readouterr().out
    await departures.close()


async def test_a_stream_that_breaks_after_events_the_watch_dropped_resumes_after_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only deletions reach the loop, but the resourceVersion of the events dropped still does (a bookmark):
    a broken stream resumes after them, not from the last deletion."""
    monkeypatch.setattr(watched, "RETRY_S", 0.0)
    gone = deleted("a")
    gone["object"]["metadata"]["resourceVersion"] = "160"
    changed = {"type": "MODIFIED", "object": {"metadata": {"uid": "b", "resourceVersion": "170"}}}
    kube = ScriptedWatch(([gone, changed], KubeError(0, "ConnectionError", "reset")), [])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await kube.connections(2)
    assert kube.watched_from == ["100", "170"]
    assert departures.seen == 1
    await departures.close()
