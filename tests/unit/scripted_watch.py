"""A scripted Kubernetes client for the unit tests of the watches (queue_processor.watch and its
subclasses): each watch connection takes the next step of a script."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from queue_processor.outcomes import KubeError
from queue_processor.rest import Keep


class ScriptedWatch:
    """Each watch connection (:meth:`watch`, whichever collection) takes the next step of ``script``: an
    exception to raise before it opens; a list of events to hand over once open, after which the connection
    lasts (handing over what :meth:`deliver` gives it) until :meth:`end`; or ``(events, exception)``: the
    events, then the stream breaks. The pod watch starts from ``pods_version`` ("100", "200"…); the node watch
    from ``node_pages`` (``nodes`` at "100", "200"…, or ``list_error`` raised)."""

    def __init__(
        self, *script: Any, nodes: list[dict[str, Any]] | None = None, list_error: KubeError | None = None
    ) -> None:
        self.script = list(script)
        self.nodes = nodes or []
        self.list_error = list_error
        self.reads = 0
        self.watched_from: list[str] = []
        self._open: asyncio.Queue[list[dict[str, Any]] | str] | None = None

    async def pods_version(self) -> str:
        self.reads += 1
        return str(self.reads * 100)

    async def node_pages(self, limit: int = 500) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        if self.list_error is not None:
            raise self.list_error
        self.reads += 1
        yield self.nodes, str(self.reads * 100)

    async def watch(
        self, path: str, rv: str, *, timeout_s: float, keep: Keep | None = None, **options: Any
    ) -> AsyncIterator[list[dict[str, Any]]]:
        self.watched_from.append(rv)
        step = self.script.pop(0) if self.script else []
        if isinstance(step, BaseException):
            raise step
        yield []  # accepted
        events, broken = step if isinstance(step, tuple) else (step, None)
        if events:
            yield _kept(events, keep)
        if broken is not None:
            raise broken
        self._open = asyncio.Queue()
        while isinstance(chunk := await self._open.get(), list):
            yield _kept(chunk, keep)
        yield [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": chunk}}}]  # where it ended

    async def connections(self, count: int) -> None:
        """Let the loop run until ``count`` connections were made (at most 50 turns: the script answers at
        once, this bounds a hang and measures nothing)."""
        for _ in range(50):
            if len(self.watched_from) == count:
                return
            await asyncio.sleep(0)

    async def deliver(self, events: list[dict[str, Any]]) -> None:
        """The open connection hands ``events`` over; returns once the loop let the watch take them."""
        assert self._open is not None
        self._open.put_nowait(events)
        for _ in range(20):
            await asyncio.sleep(0)

    def end(self, rv: str) -> None:
        """The server ends the open connection, its last resourceVersion ``rv``."""
        assert self._open is not None
        self._open.put_nowait(rv)


def _kept(events: list[dict[str, Any]], keep: Keep | None) -> list[dict[str, Any]]:
    """What ``keep`` keeps of ``events``, as the watch thread of :meth:`queue_processor.kube.KubeClient.watch`
    hands them over; ``keep`` raising ends the connection with a ``WatchReceiverError``, as there."""
    if keep is None:
        return events
    try:
        delivered = [k for k in map(keep, events) if k is not None]
        if events and keep(events[-1]) is None:  # where the stream is, as the thread marks it
            rv = ((events[-1].get("object") or {}).get("metadata") or {}).get("resourceVersion")
            delivered.append({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}})
    except Exception as exc:
        raise KubeError(0, "WatchReceiverError", f"{type(exc).__name__}: {exc}") from exc
    return delivered
