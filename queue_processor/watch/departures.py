"""Pod deletions seen through one metadata-only watch of every pod, so a drain need not re-list its node.

A drain takes a :class:`Ticket` *before* it lists its pods: while the stream has not broken since (same
:attr:`Departures.epoch`) and fewer than :data:`MEMORY` deletions passed, every listed pod that went is remembered or
will come as an event; otherwise the drain lists. API concepts: "Efficient detection of changes", "Receiving
resources as Tables or metadata only"."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from queue_processor.kube import KubeClient
from queue_processor.watch.watched import WATCH_TIMEOUT_S, Watched

__all__ = ["MEMORY", "Departures", "Ticket", "Waiting", "deletion"]

#: Deleted pods' uids remembered: a ticket older than this many deletions is not trusted (the drain lists again).
MEMORY = 10_000

Entry = tuple[tuple[str, str], Any]  # ((namespace, name), uid): a pod a drain waits for


@dataclass(frozen=True)
class Ticket:
    """The watch's :attr:`Departures.epoch` and deletions seen when a drain was about to list its pods."""

    epoch: int
    seen: int


@dataclass(eq=False)
class Waiting:
    """One drain's pods (``pending``: (key, uid), emptied as they go), the ticket of its last list, and
    ``changed``, set when a pod went or the watch stopped or started."""

    pending: set[Entry]
    ticket: Ticket | None
    uids: tuple[Any, ...] = ()
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    current: bool = False
    """Whether the deletions remembered at its ticket were applied: from then on each one reaches it directly."""


def deletion(event: dict[str, Any]) -> dict[str, Any] | None:
    """What the watch thread keeps of a pod event (:data:`~queue_processor.kube.Keep`): a deletion as
    ``{"type": "DELETED", "object": {"metadata": {"uid", "resourceVersion"}}}``, nothing of other events."""
    if event.get("type") != "DELETED":
        return None
    obj = event.get("object")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict) or metadata.get("uid") is None:
        return None
    kept = {"uid": metadata["uid"], "resourceVersion": metadata.get("resourceVersion")}
    return {"type": "DELETED", "object": {"metadata": kept}}


class Departures(Watched):
    """The watch of pod deletions, started by :meth:`start` or the first :meth:`ticket`, ended by :meth:`close`. Raises
    nothing: failures are retried, and the drains list meanwhile."""

    name = "pod-departures"
    refusal = "cannot watch pods: drains list their nodes' pods instead (grant pods watch)"

    def __init__(self, kube: KubeClient, *, memory: int = MEMORY, timeout_s: float = WATCH_TIMEOUT_S) -> None:
        super().__init__(timeout_s=timeout_s)
        self.kube = kube
        self.memory = memory
        self.epoch = 0
        """Starts of the watch from a fresh resourceVersion: a ticket of an earlier epoch is not trusted."""
        self.seen = 0
        """Deletions seen since the process started."""
        self._gone: dict[Any, int] = {}  # uid -> its number among the deletions seen, oldest first
        self._waiting: dict[Any, list[Waiting]] = {}

    def ticket(self) -> Ticket | None:
        """Take one before listing pods; ``None`` while the watch does not run (this call starts it)."""
        self.start()
        return Ticket(self.epoch, self.seen) if self.live else None

    def covers(self, waiting: Waiting) -> bool:
        """Whether every deletion of ``waiting``'s pods since its ticket is known or will come as an event."""
        ticket = waiting.ticket
        return (
            ticket is not None
            and self.live
            and ticket.epoch == self.epoch
            and (waiting.current or self.seen - ticket.seen < self.memory)
        )

    @contextlib.contextmanager
    def waiting(self, pending: set[Entry], ticket: Ticket | None) -> Iterator[Waiting]:
        """Follow ``pending`` (copied) while the block runs; ``ticket`` was taken before the list that found them."""
        wait = Waiting(set(pending), ticket, tuple({uid for _, uid in pending}))
        for uid in wait.uids:
            self._waiting.setdefault(uid, []).append(wait)
        self._forget_gone(wait)
        try:
            yield wait
        finally:
            for uid in wait.uids:
                waits = self._waiting.get(uid)
                if waits is not None:
                    with contextlib.suppress(ValueError):
                        waits.remove(wait)
                    if not waits:
                        del self._waiting[uid]

    def listed(self, wait: Waiting, ticket: Ticket | None, present: set[Entry]) -> None:
        """A list of the node's pods, taken after ``ticket``, found ``present``: what is not there has gone."""
        wait.pending &= present
        wait.ticket, wait.current = ticket, False
        self._forget_gone(wait)

    def _forget_gone(self, wait: Waiting) -> None:
        """Drop from ``wait.pending`` the pods seen deleted; mark it current when the memory covers its ticket."""
        for entry in [entry for entry in wait.pending if entry[1] in self._gone]:
            wait.pending.discard(entry)
            wait.changed.set()
        if self.covers(wait):
            wait.current = True

    async def _begin(self) -> str:
        rv = await self.kube.pods_version()
        self._restart()
        return rv

    async def _watch(self, rv: str, timeout_s: float) -> str:
        return await self.kube.watch_pods(
            rv, self._receive, opened=self._opened, timeout_s=timeout_s, keep=deletion
        )

    def _restart(self) -> None:
        """A fresh start: tickets taken before it are not trusted."""
        self.epoch += 1
        self.live = False
        self._set_live(True)

    def _set_live(self, live: bool) -> None:
        """The stream runs (``True``) or is broken; either way every drain looks again."""
        changed = live != self.live
        super()._set_live(live)
        if not changed:
            return
        for waits in self._waiting.values():
            for wait in waits:
                wait.changed.set()

    def _apply(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            if event.get("type") != "DELETED":
                continue
            uid = ((event.get("object") or {}).get("metadata") or {}).get("uid")
            if uid is None or uid in self._gone:
                continue
            self.seen += 1
            self._gone[uid] = self.seen
            if len(self._gone) > self.memory:
                del self._gone[next(iter(self._gone))]
            for wait in self._waiting.get(uid, ()):
                for entry in [entry for entry in wait.pending if entry[1] == uid]:
                    wait.pending.discard(entry)
                wait.changed.set()
