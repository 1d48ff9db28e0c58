"""A scripted Kubernetes client for the unit tests of the watches (queue_processor.watch and its
subclasses): each watch connection takes the next step of a script."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from queue_processor.outcomes import KubeError
from queue_processor.rest import Keep

Deliver = Callable[[list[dict[str, Any]]], None]


class ScriptedWatch:
    """Each watch connection (:meth:`watch`, whichever collection) takes the next step of ``script``: an
    exception to raise before it opens; a list of events to deliver once open, after which the connection lasts
    until :meth:`end`; or ``(events, exception)``: the events, then the stream breaks. The pod watch starts
    from ``pods_version`` ("100", "200"…); the node watch from ``node_pages`` (``nodes`` at "100", "200"…, or
    ``list_error`` raised)."""

    def __init__(
        self, *script: Any, nodes: list[dict[str, Any]] | None = None, list_error: KubeError | None = None
    ) -> None:
        self.script = list(script)
        self.nodes = nodes or []
        self.list_error = list_error
        self.reads = 0
        self.watched_from: list[str] = []
        self.deliver: Deliver | None = None
        self._end: asyncio.Future[str] | None = None

    async def pods_version(self) -> str:
        self.reads += 1
        return str(self.reads * 100)

    async def node_pages(self, limit: int = 500) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        if self.list_error is not None:
            raise self.list_error
        self.reads += 1
        yield self.nodes, str(self.reads * 100)

    async def watch(
        self,
        path: str,
        rv: str,
        deliver: Deliver,
        *,
        timeout_s: float,
        opened: Callable[[], None] | None = None,
        keep: Keep | None = None,
        **options: Any,
    ) -> str:
        return await self._connection(rv, _kept(deliver, keep), opened)

    async def connections(self, count: int) -> None:
        """Let the loop run until ``count`` connections were made (at most 50 turns: the script answers at
        once, this bounds a hang and measures nothing)."""
        for _ in range(50):
            if len(self.watched_from) == count:
                return
            await asyncio.sleep(0)

    def end(self, rv: str) -> None:
        """The server ends the open connection, its last resourceVersion ``rv``."""
        assert self._end is not None
        self._end.set_result(rv)

    async def _connection(self, rv: str, deliver: Deliver, opened: Callable[[], None] | None) -> str:
        self.watched_from.append(rv)
        step = self.script.pop(0) if self.script else []
        if isinstance(step, BaseException):
            raise step
        if opened is not None:
            opened()
        self.deliver = deliver
        if isinstance(step, tuple):
            events, broken = step
            self._hand(deliver, events)
            raise broken
        self._hand(deliver, step)
        self._end = asyncio.get_running_loop().create_future()
        return await self._end

    @staticmethod
    def _hand(deliver: Deliver, events: list[dict[str, Any]]) -> None:
        """``deliver(events)``; a receiver that raises ends the connection with a ``WatchReceiverError``, as
        :meth:`queue_processor.kube.KubeClient.watch` does."""
        try:
            deliver(events)
        except Exception as exc:
            raise KubeError(0, "WatchReceiverError", f"{type(exc).__name__}: {exc}") from exc


def _kept(deliver: Deliver, keep: Keep | None) -> Deliver:
    """``deliver`` of what ``keep`` keeps of each event, as the watch thread of
    :meth:`queue_processor.kube.KubeClient.watch` hands them over."""
    if keep is None:
        return deliver

    def kept(events: list[dict[str, Any]]) -> None:
        delivered = [k for k in map(keep, events) if k is not None]
        if events and keep(events[-1]) is None:  # where the stream is, as the thread marks it
            rv = ((events[-1].get("object") or {}).get("metadata") or {}).get("resourceVersion")
            delivered.append({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}})
        deliver(delivered)

    return kept
