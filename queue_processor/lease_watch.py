"""The node Leases as one watch sees them: who holds each, and the events handed over on it (NODE_LEASES).

A replica whose node Lease another holds waits for its release (:meth:`LeaseWatch.released`) instead of
requeuing its message (each receive counts towards the dead-letter redrive); the holder learns at once of events
handed to it (:attr:`LeaseWatch.on_handed`). Without list/watch rights, waiters poll (:data:`UNWATCHED_POLL_S`).
Documents: "Efficient detection of changes" (API concepts); "Leases" (Kubernetes concepts).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from queue_processor.kube import KubeClient
from queue_processor.rules import HANDOVER_PREFIX
from queue_processor.watch import Watched

__all__ = ["REPLICA_ANNOTATION", "UNWATCHED_POLL_S", "LeaseWatch"]

#: The annotation of a node Lease naming the replica Lease it is held by (held while that one is renewed).
REPLICA_ANNOTATION = "queue-processor/replica-lease"

#: Without a live watch: how often a replica waiting for a node's Lease tries its claim again (seconds).
UNWATCHED_POLL_S = 5.0


class LeaseWatch(Watched):
    """The watched node Leases of ``namespace`` selected by ``selector``, from :meth:`start` to :meth:`close`.
    Raises nothing: failures are retried with backoff."""

    name = "lease-watch"
    refusal = (
        "cannot list and watch node Leases: a replica waiting for a node's Lease polls for it, and events "
        "handed over reach a holder only through its own receive (grant leases list and watch)"
    )

    def __init__(self, kube: KubeClient, namespace: str, selector: str) -> None:
        super().__init__()
        self.kube = kube
        self.namespace = namespace
        self.selector = selector
        self._holders: dict[str, str | None] = {}  # Lease name → holderIdentity
        self._handed: dict[str, dict[str, str]] = {}  # Lease name → its hand-over annotations
        self._replicas: dict[str, str] = {}  # Lease name → the replica Lease its annotation names
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self.on_handed: Callable[[str, Mapping[str, str]], None] | None = None
        """Called (in the event loop) with a Lease's name and its hand-over annotations whenever they change."""

    def holder(self, name: str) -> str | None:
        """The ``holderIdentity`` of Lease ``name`` (``None``: no such Lease, or no current copy)."""
        return self._holders.get(name) if self.live else None

    def replica(self, name: str) -> str | None:
        """The replica Lease that node Lease ``name`` names (:data:`REPLICA_ANNOTATION`), or ``None``."""
        return self._replicas.get(name) if self.live else None

    def handed(self, name: str) -> dict[str, str]:
        """The hand-over annotations of Lease ``name`` (empty without a current copy)."""
        return dict(self._handed.get(name) or {}) if self.live else {}

    async def released(self, name: str, holder: str | None, within_s: float) -> None:
        """Return once Lease ``name`` is no longer held by ``holder`` (``None``: at its next change, waiting at most
        :data:`UNWATCHED_POLL_S`, as when unwatched), or after ``within_s`` seconds. Raises only ``CancelledError``."""
        if not self.live or holder is None:
            within_s = min(within_s, UNWATCHED_POLL_S)
        if not self.live:
            await asyncio.sleep(max(0.0, within_s))
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                while self.live and (holder is None or self._holders.get(name) == holder):
                    await self._next_change(name)
                    if holder is None:
                        return

    async def _next_change(self, name: str) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(name, set()).add(waiter)
        try:
            await waiter
        finally:
            waiters = self._waiters.get(name)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[name]

    async def _begin(self) -> str:
        items, version = await self.kube.list_leases(self.namespace, self.selector)
        names = set(self._holders)
        self._holders, handed, self._handed, self._replicas = {}, self._handed, {}, {}
        for lease in items:
            self._put(lease)
        for name in names | set(self._holders):
            self._wake(name)
            if self._handed.get(name, {}) != handed.get(name, {}):
                self._tell(name)
        return version

    async def _watch(self, rv: str, timeout_s: float) -> str:
        return await self.kube.watch_leases(
            self.namespace, self.selector, rv, self._receive, opened=self._opened, timeout_s=timeout_s
        )

    def _apply(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            metadata = (event.get("object") or {}).get("metadata") or {}
            name = metadata.get("name")
            if name is None or event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            before = self._handed.get(name, {})
            if event.get("type") == "DELETED":
                self._holders.pop(name, None)
                self._handed.pop(name, None)
                self._replicas.pop(name, None)
            else:
                self._put(event["object"])
            self._wake(name)
            if self._handed.get(name, {}) != before:
                self._tell(name)

    def _put(self, lease: dict[str, Any]) -> None:
        metadata = lease.get("metadata") or {}
        name = str(metadata["name"])
        self._holders[name] = ((lease.get("spec") or {}).get("holderIdentity")) or None
        annotations = metadata.get("annotations") or {}
        replica = annotations.get(REPLICA_ANNOTATION)
        if replica:
            self._replicas[name] = str(replica)
        else:
            self._replicas.pop(name, None)
        handed = {key: str(value) for key, value in annotations.items() if key.startswith(HANDOVER_PREFIX)}
        if handed:
            self._handed[name] = handed
        else:
            self._handed.pop(name, None)

    def _set_live(self, live: bool) -> None:
        super()._set_live(live)
        if not live:
            for name in list(self._waiters):
                self._wake(name)

    def _wake(self, name: str) -> None:
        for waiter in self._waiters.get(name, ()):
            if not waiter.done():
                waiter.set_result(None)

    def _tell(self, name: str) -> None:
        handed = self._handed.get(name)
        if self.on_handed is not None and handed:
            self.on_handed(name, dict(handed))
