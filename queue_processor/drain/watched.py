"""One watch of a collection, kept going for the life of the process: what the watched copy of the nodes
(:mod:`queue_processor.drain.node_cache`) and the watch of pod deletions (:mod:`queue_processor.drain.departures`)
share.

:class:`Watched` starts from a resourceVersion its subclass reads (a list, or a one-item list's version),
watches from there, and keeps the resourceVersion of the last event delivered: a connection the server ends
(after ``timeoutSeconds``) or that breaks resumes from it, so that nothing is missed and nothing replayed. A
410 Gone (the version was compacted away) starts again from a fresh read; a refusal (401/403/404/405: no
``watch`` right, or a server without watches) is logged once, and the subclass's callers do without the watch
meanwhile; every other failure backs off from :data:`RETRY_S` to :data:`RETRY_MAX_S` seconds. Events the
subclass fails to apply (:meth:`Watched._apply` raising) are logged with the error, and the collection is
read again from scratch: the copy is not live meanwhile.

Kubernetes documents: "Efficient detection of changes" (watch, resourceVersion, bookmarks, 410 Gone) in API
concepts, and client-go's reflector, which an informer uses to the same end.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import structlog

from queue_processor import tasks
from queue_processor.kube import REPLICA_RANK, KubeError, rank_urgent

__all__ = ["REFUSED", "RETRY_MAX_S", "RETRY_S", "WATCH_TIMEOUT_S", "Watched"]

log = structlog.get_logger(__name__)

#: How long one watch connection lasts (seconds; ``timeoutSeconds``, jittered by up to a fifth down so that
#: replicas do not reconnect together). The server ends it; the next one resumes from the last resourceVersion.
WATCH_TIMEOUT_S = 300.0

#: After a failed connection: the first wait before the next (seconds), doubled up to :data:`RETRY_MAX_S`.
RETRY_S = 0.5
RETRY_MAX_S = 30.0

#: The API server's answers that mean "no watch for you" (no RBAC right, or a server without watches): logged
#: once, and retried with the same backoff (the right may be granted later).
REFUSED = frozenset({401, 403, 404, 405})


class Watched:
    """The loop of one watch (see the module). A subclass gives :meth:`_begin` (read where to start: returns a
    resourceVersion), :meth:`_watch` (one connection) and :meth:`_apply` (the events of one chunk), and may
    override :meth:`_set_live`. ``name`` names the task; ``refusal`` is the warning logged once when the API
    server refuses. Raises nothing: failures are retried with backoff."""

    name = "watch"
    refusal = "cannot watch"

    def __init__(self, *, timeout_s: float = WATCH_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.live = False
        """Whether the watch's stream runs now (or resumes from where it stopped)."""
        self.refused: KubeError | None = None
        """The API server's refusal of the read or the watch, if it refused."""
        self.answered = asyncio.Event()
        """Set once the watch is open or refused (its first answer)."""
        self._rv = ""  # where the watch resumes: the first read's resourceVersion, then each event's
        self._task: asyncio.Task[None] | None = None
        self._started_at = 0.0  # the event loop's time at start()

    def start(self) -> None:
        """Start the watch (the controller does at start-up); idempotent."""
        if self._task is None:
            self._started_at = asyncio.get_running_loop().time()
            self._task = tasks.spawn(self._run(), name=self.name)

    async def first_answer(self, within_s: float) -> bool:
        """Wait until the watch has answered for the first time (its copy read and its stream open, or
        refused), but not past ``within_s`` seconds after it was started: ``True`` when it has answered. Every
        caller shares that one bound, so a watch that never answers delays each caller once at start-up, not
        each operation by ``within_s``. A watch not started is not waited for (``False`` at once). Raises
        nothing but ``CancelledError``."""
        if self.answered.is_set():
            return True
        if self._task is None:
            return False
        left = self._started_at + within_s - asyncio.get_running_loop().time()
        if left <= 0:
            return False
        try:
            # Not wait_for: it may swallow a cancellation that comes in the same turn as the answer.
            async with asyncio.timeout(left):
                await self.answered.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop the watch (its connection is shut)."""
        await tasks.stop(self._task)
        self._task = None
        self.live = False

    async def _begin(self) -> str:
        """Read the collection's state; returns the resourceVersion to watch from. Raises :class:`KubeError`."""
        raise NotImplementedError

    async def _watch(self, rv: str, timeout_s: float) -> str:
        """One connection from ``rv`` delivering to :meth:`_receive` and calling :meth:`_opened`; returns the
        last resourceVersion it saw (``""`` if none). Raises :class:`KubeError`."""
        raise NotImplementedError

    def _apply(self, events: list[dict[str, Any]]) -> None:
        """The ``{"type", "object"}`` events of one chunk (called in the event loop)."""
        raise NotImplementedError

    def _set_live(self, live: bool) -> None:
        """The stream runs (``True``: the watch answered) or is broken."""
        if live:
            self.answered.set()
        self.live = live

    def _opened(self) -> None:
        self._set_live(True)

    def _receive(self, events: list[dict[str, Any]]) -> None:
        try:
            self._apply(events)
        except Exception:
            # Some of the chunk may be applied, the rest is not: the copy is no longer the server's. It is read
            # again from scratch (the connection ends: the client raises WatchReceiverError).
            log.exception("watch event not applied; reading again", watch=self.name)
            self._rv = ""
            self._set_live(False)
            raise
        for event in events:
            rv = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")
            if rv:
                self._rv = str(rv)

    async def _run(self) -> None:
        rank_urgent(REPLICA_RANK)
        delay = RETRY_S
        while True:
            try:
                if not self._rv:
                    self._rv = await self._begin()
                timeout_s = self.timeout_s * random.uniform(0.8, 1.0)
                self._rv = await self._watch(self._rv, timeout_s) or self._rv
                delay = RETRY_S
                continue
            except KubeError as exc:
                self._set_live(False)
                if exc.status == 410:  # too old: read again and watch from there
                    self._rv = ""
                    continue
                if exc.reason == "WatchReceiverError" and self._rv:
                    # An event the watch thread could not keep (one the loop could not apply reset this
                    # already, and logged it): the collection is read again, as for an event not applied.
                    log.warning("watch event not kept; reading again", watch=self.name, error=exc.message)
                    self._rv = ""
                if exc.status in REFUSED and self.refused is None:
                    self.refused = exc
                    self.answered.set()
                    log.warning(self.refusal, status=exc.status, error=exc.message)
            # a broken stream resumes from the last resourceVersion delivered (self._rv)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
