"""One watch of a collection for the process's life, resumed from the last event's resourceVersion; a 410 Gone or an
event that fails to apply reads the collection again, a refusal (:data:`REFUSED`) is logged once. Sources: "Efficient
detection of changes" (API concepts), client-go's reflector.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import structlog

from queue_processor import tasks
from queue_processor.outcomes import KubeError
from queue_processor.rest import REPLICA_RANK, rank_urgent

__all__ = ["REFUSED", "RETRY_MAX_S", "RETRY_S", "WATCH_TIMEOUT_S", "Watched"]

log = structlog.get_logger(__name__)

#: One connection's ``timeoutSeconds`` (seconds), jittered up to a fifth down so replicas do not reconnect together.
WATCH_TIMEOUT_S = 300.0

#: After a failed connection: the first wait before the next (seconds), doubled up to :data:`RETRY_MAX_S`.
RETRY_S = 0.5
RETRY_MAX_S = 30.0

#: Answers meaning no watch (no RBAC right, or no watches): logged once, retried (the right may come later).
REFUSED = frozenset({401, 403, 404, 405})


class Watched:
    """The loop of one watch: a subclass gives :meth:`_begin`, :meth:`_watch` and :meth:`_apply`. ``name`` names the
    task, ``refusal`` is the warning of a refusal. Raises nothing: failures are retried with backoff."""

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
        """Wait for the first answer (open or refused), not past ``within_s`` seconds after :meth:`start`: ``True`` when
        it answered (``False`` at once when not started). Raises only ``CancelledError``."""
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
        """One connection from ``rv`` into :meth:`_receive`; the last resourceVersion seen. Raises KubeError."""
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
            # Part of the chunk may be applied: read everything again (the client ends the connection).
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
                    # The watch thread could not keep an event: read again, as for one not applied.
                    log.warning("watch event not kept; reading again", watch=self.name, error=exc.message)
                    self._rv = ""
                if exc.status in REFUSED and self.refused is None:
                    self.refused = exc
                    self.answered.set()
                    log.warning(self.refusal, status=exc.status, error=exc.message)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
