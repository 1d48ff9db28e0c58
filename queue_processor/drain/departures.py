"""Pods leaving, seen through one watch: how a drain learns that the pods it evicted are gone without re-listing
its node every few seconds.

One metadata-only watch of every pod (``GET /api/v1/pods?watch=1``, ``Accept: …;as=PartialObjectMetadata``:
names, uids and resourceVersions, no specs) runs from start-up on, for the whole process: a thousand
draining nodes cost one connection, not hundreds of pod LISTs a second competing for the client's QPS with
cordons, evictions and Lease renewals. Only deletions are kept: the uids of the last :data:`MEMORY` pods
deleted. A drain registers its pods, and each deletion of one reaches it as it comes.

Why it is safe to skip a LIST: a drain takes a :class:`Ticket` *before* it lists a node's pods. While the watch
has run without a break in its stream since the ticket (the same :attr:`Departures.epoch`, no 410 since) and
still remembers every deletion since when the drain registers the pods it found (fewer than :data:`MEMORY`
since the ticket), every pod of that list that went away since is either in the memory already or will come as
an event: its deletion is later than the watch's
position when the ticket was taken (the LIST, a quorum read, came after). Without such a ticket (the watch
not running yet, broken and not resumed, restarted after a 410, or refused by RBAC) the drain lists as before.

Kubernetes documents: "Efficient detection of changes" (watch, resourceVersion, bookmarks, 410 Gone) and
"Receiving resources as Tables or metadata only" in API concepts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from queue_processor.drain.watched import WATCH_TIMEOUT_S, Watched
from queue_processor.kube import KubeClient

__all__ = ["MEMORY", "Departures", "Ticket", "Waiting", "deletion"]

#: Deleted pods' uids remembered (about 150 bytes each). They only need to cover the moments between a drain's
#: ticket and the registration of the pods its list found: a ticket older than this many deletions then is not
#: trusted (its drain lists again).
MEMORY = 10_000

Entry = tuple[tuple[str, str], Any]  # ((namespace, name), uid): a pod a drain waits for


@dataclass(frozen=True)
class Ticket:
    """Where the watch was when a drain was about to list a node's pods: its :attr:`Departures.epoch` and how
    many deletions it had seen."""

    epoch: int
    seen: int


@dataclass(eq=False)
class Waiting:
    """The pods of one drain (``pending``: (key, uid), emptied as they go), the ticket taken before the list
    that found them (renewed by each list after), and ``changed``, set when one went or the watch stopped or
    started again. :meth:`Departures.covers` says whether ``pending`` can be trusted without a list."""

    pending: set[Entry]
    ticket: Ticket | None
    uids: tuple[Any, ...] = ()
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    current: bool = False
    """Whether the deletions remembered at its ticket were applied: from then on each one reaches it directly."""


def deletion(event: dict[str, Any]) -> dict[str, Any] | None:
    """What the watch keeps of a pod event (pure; run in the watch thread, :data:`~queue_processor.kube.Keep`):
    a deletion as ``{"type": "DELETED", "object": {"metadata": {"uid", "resourceVersion"}}}``, nothing of any
    other event. In a storm a pod deleted comes with several other events (its termination begun, its
    replacement created, bound, started), and events the loop has not taken yet would be held whole until it
    does."""
    if event.get("type") != "DELETED":
        return None
    obj = event.get("object")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict) or metadata.get("uid") is None:
        return None
    kept = {"uid": metadata["uid"], "resourceVersion": metadata.get("resourceVersion")}
    return {"type": "DELETED", "object": {"metadata": kept}}


class Departures(Watched):
    """The watch of pod deletions (see the module), started by :meth:`start` (or the first :meth:`ticket`)
    and ended by :meth:`close`. ``kube`` makes the requests: one ``limit=1`` pod list per (re)start and one watch per
    connection, each through its rate limiter. Raises nothing: a watch that fails is retried with backoff
    (:class:`~queue_processor.drain.watched.Watched`), and meanwhile the drains list."""

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
        """Take one before listing pods; ``None`` while the watch does not run (started by the first call if
        :meth:`start` was not called)."""
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
        """Follow the pods of ``pending`` (a copy, emptied as they go) while the ``with`` block runs; ``ticket``
        was taken before the list that found them."""
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
        """Take out of ``wait.pending`` every pod whose deletion the watch has seen; when the memory still covers
        its ticket, ``wait`` is then :attr:`~Waiting.current` (each deletion reaches it as it comes)."""
        for entry in [entry for entry in wait.pending if entry[1] in self._gone]:
            wait.pending.discard(entry)
            wait.changed.set()
        if self.covers(wait):
            wait.current = True

    # ------------------------------------------------------------------------------------------ the watch

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
