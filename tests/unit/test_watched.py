"""The wait for a watch's first answer (:meth:`queue_processor.watch.Watched.wait_first_answer`): a claim or a
cordon at start-up waits for the watched copy of the nodes, bounded, and never for a watch that was not
started."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from queue_processor.rest import REPLICA_RANK, URGENT_RANK
from queue_processor.watch import Watched


class Scripted(Watched):
    """A watch whose first read waits for ``read`` and whose connection (it is its own client: :meth:`watch`)
    opens at once and then idles; ``ranks`` records the rank its reads were made at
    (queue_processor.rest.URGENT_RANK)."""

    def __init__(self) -> None:
        super().__init__(self, "/api/v1/nodes")  # type: ignore[arg-type]
        self.read = asyncio.Event()
        self.ranks: list[float] = []

    async def _begin(self) -> str:
        self.ranks.append(URGENT_RANK.get())
        await self.read.wait()
        return "1"

    async def watch(self, path: str, rv: str, **options: Any) -> AsyncIterator[list[dict[str, Any]]]:
        yield []  # accepted
        await asyncio.Event().wait()  # until closed

    def _apply(self, events: list[dict[str, Any]]) -> None:
        pass


async def test_a_watch_not_started_is_not_waited_for() -> None:
    watch = Scripted()
    assert await watch.wait_first_answer(3600.0) is False


async def test_the_wait_ends_at_its_bound_when_the_copy_is_not_in_and_is_not_made_again() -> None:
    """The bound counts from the watch's start, for every caller: once it passed, a claim or a cordon reads its
    node at once rather than waiting again."""
    watch = Scripted()
    watch.start()
    try:
        assert await watch.wait_first_answer(0.05) is False
        assert not watch.live
        later = asyncio.create_task(watch.wait_first_answer(0.05))
        await asyncio.sleep(0)
        assert later.done()
        assert later.result() is False
    finally:
        await watch.close()


async def test_the_wait_ends_when_the_watch_first_answers_and_not_again() -> None:
    watch = Scripted()
    watch.start()
    try:
        waiting = asyncio.create_task(watch.wait_first_answer(3600.0))
        await asyncio.sleep(0)
        assert not waiting.done()
        watch.read.set()
        assert await waiting is True
        assert watch.live
        assert await watch.wait_first_answer(3600.0) is True  # answered once: at once from then on
    finally:
        await watch.close()


async def test_the_copy_s_pages_rank_ahead_of_every_operation_whoever_starts_the_watch() -> None:
    """Claims and cordons wait for the copy's first answer at start-up: its pages go before them, even when
    the watch is (re)started from within an operation."""
    URGENT_RANK.set(1234.5)  # this test's task is an operation's
    watch = Scripted()
    watch.start()
    try:
        watch.read.set()
        assert await watch.wait_first_answer(3600.0) is True
        assert watch.ranks == [REPLICA_RANK]
    finally:
        await watch.close()
