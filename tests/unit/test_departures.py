"""The watch of pod deletions (queue_processor.drain.departures), on a scripted client: when a drain may trust
what the watch saw (a ticket of the current epoch, deletions remembered since), and when it must list again
(the watch restarted after a 410, broke, or forgot)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from queue_processor.drain import departures as departures_module
from queue_processor.drain.departures import Departures
from queue_processor.kube import KubeError

Deliver = Callable[[list[dict[str, Any]]], None]


class ScriptedKube:
    """``pods_version`` answers "100", "200"…; each ``watch_pods`` takes the next step of ``script``: an
    exception to raise, or a list of events to deliver before waiting until :meth:`end` is called."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.versions = 0
        self.watched_from: list[str] = []
        self.deliver: Deliver | None = None
        self._end: asyncio.Future[str] | None = None

    async def pods_version(self) -> str:
        self.versions += 1
        return str(self.versions * 100)

    async def watch_pods(
        self, rv: str, deliver: Deliver, *, timeout_s: float, opened: Callable[[], None] | None = None
    ) -> str:
        self.watched_from.append(rv)
        step = self.script.pop(0) if self.script else []
        if isinstance(step, BaseException):
            raise step
        if opened is not None:
            opened()
        self.deliver = deliver
        deliver(step)
        self._end = asyncio.get_running_loop().create_future()
        return await self._end

    def end(self, rv: str) -> None:
        assert self._end is not None
        self._end.set_result(rv)


def deleted(uid: str) -> dict[str, Any]:
    return {"type": "DELETED", "object": {"metadata": {"name": uid, "namespace": "ns", "uid": uid}}}


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_deletion_empties_the_drains_pending_set_and_wakes_it() -> None:
    kube = ScriptedKube([])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await departures.answered.wait()
    ticket = departures.ticket()
    with departures.waiting({(("ns", "a"), "a"), (("ns", "b"), "b")}, ticket) as wait:
        assert departures.covers(wait)
        assert kube.deliver is not None
        kube.deliver([deleted("a"), {"type": "MODIFIED", "object": {"metadata": {"uid": "b"}}}])
        assert wait.changed.is_set()
        assert wait.pending == {(("ns", "b"), "b")}
    assert not departures._waiting  # unregistered
    await departures.close()


async def test_a_deletion_seen_before_the_drain_followed_its_pods_counts() -> None:
    """The list came after the ticket, the deletion before the registration: the memory covers it."""
    kube = ScriptedKube([])
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await departures.answered.wait()
    ticket = departures.ticket()
    assert kube.deliver is not None
    kube.deliver([deleted("a")])
    with departures.waiting({(("ns", "a"), "a"), (("ns", "b"), "b")}, ticket) as wait:
        assert wait.pending == {(("ns", "b"), "b")}
    await departures.close()


async def test_after_a_410_the_watch_starts_again_from_now_and_old_tickets_are_not_trusted() -> None:
    kube = ScriptedKube([], KubeError(410, "Expired", "too old resource version"), [])
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
    monkeypatch.setattr(departures_module, "RETRY_S", 0.0)
    kube = ScriptedKube([], KubeError(0, "ConnectionError", "reset"), [])
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


async def test_a_ticket_older_than_the_memory_is_not_trusted() -> None:
    kube = ScriptedKube([])
    departures = Departures(kube, memory=3)  # type: ignore[arg-type]
    departures.start()
    await departures.answered.wait()
    ticket = departures.ticket()
    assert kube.deliver is not None
    kube.deliver([deleted("x"), deleted("y"), deleted("z")])  # three deletions between the ticket and the
    with departures.waiting({(("ns", "a"), "a")}, ticket) as wait:  # registration: "x" may be forgotten
        assert not departures.covers(wait)
    assert len(departures._gone) == 3
    await departures.close()


async def test_once_registered_a_drain_is_covered_however_many_pods_go_elsewhere() -> None:
    kube = ScriptedKube([])
    departures = Departures(kube, memory=3)  # type: ignore[arg-type]
    departures.start()
    await departures.answered.wait()
    with departures.waiting({(("ns", "a"), "a")}, departures.ticket()) as wait:
        assert kube.deliver is not None
        kube.deliver([deleted(f"other-{index}") for index in range(10)])
        assert departures.covers(wait)  # each deletion of its pods reaches it directly
        kube.deliver([deleted("a")])
        assert not wait.pending
    await departures.close()


async def test_a_refused_watch_is_said_once_and_gives_no_tickets() -> None:
    refusal = KubeError(403, "Forbidden", 'pods is forbidden: cannot watch resource "pods"')
    kube = ScriptedKube(refusal, refusal)
    departures = Departures(kube)  # type: ignore[arg-type]
    departures.start()
    await departures.answered.wait()
    assert departures.refused is refusal
    assert departures.ticket() is None
    await departures.close()
