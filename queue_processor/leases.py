"""Per-node coordination.k8s.io/v1 Leases: with several replicas consuming one queue, the drain of a node is
exclusive (DESIGN.md rule 6).

A replica :meth:`NodeLeases.claim`\\ s ``queue-processor-<node>`` in its namespace before PreDrain: it creates
the Lease, or renews its own, or takes over one whose holder stopped renewing (``renewTime`` +
``leaseDurationSeconds`` in the past) — always through the API server's optimistic concurrency (create → 409
AlreadyExists, replace with a stale resourceVersion → 409 Conflict: another replica won). While it handles the
node, a renewal task keeps the Lease (every third of its duration; one renewal in flight at a time, shared
with every :meth:`Claim.confirm`; a 409 that leaves the Lease ours is not a loss); :meth:`Claim.release`
cancels and awaits that task and gives the Lease up. A replica that finds the Lease held by another lets its
message be requeued: whatever the holder does, a later retry finds the node drained and finishes at once.

"Leases" (Kubernetes concepts, coordination.k8s.io/v1).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import structlog

from queue_processor import tasks
from queue_processor.config import default
from queue_processor.kube import KubeClient
from queue_processor.outcomes import ClaimLost, KubeError

__all__ = ["RENEW_ATTEMPTS", "Claim", "ClaimLost", "NodeLeases", "lease_name"]

log = structlog.get_logger("queue_processor.leases")

_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"


def lease_name(node: str) -> str:
    """``queue-processor-<node>``, made a valid object name (lower case, at most 253 characters)."""
    return ("queue-processor-" + re.sub(r"[^a-z0-9.-]", "-", node.lower()))[:253].rstrip(".-")


def _now() -> datetime:
    return datetime.now(UTC)


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.strptime(value, _MICRO).replace(tzinfo=UTC)
    except ValueError:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))


#: How many times one renewal re-reads the Lease and writes again after a 409 that left it ours.
RENEW_ATTEMPTS = 3


class Claim:
    """A held Lease; :meth:`release` it when the node's handling ends (cancels and awaits the renewal).

    ``lost`` is set when the Lease is someone else's: a renewal's 409 Conflict re-reads the Lease, and only a
    ``holderIdentity`` that is no longer ours (or a Lease that cannot be written for a whole lease duration)
    is a loss; a 409 that left it ours (our own earlier write, or another writer that did not take it) is
    written again on the fresh ``resourceVersion``. The operation stops when ``lost`` is set (EarlyExit).
    :meth:`confirm` is called before anything that must not be done twice (an eviction, a lifecycle
    completion): when the last renewal is older than a renewal period (a paused process wakes up), it renews
    first and raises :class:`ClaimLost` on failure. At most one renewal is in flight per claim: the background
    renewal and every concurrent :meth:`confirm` share it and read its result (DESIGN.md rule 10).
    ``clock`` returns monotonic seconds."""

    def __init__(
        self, leases: NodeLeases, lease: dict[str, Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._leases = leases
        self.lease = lease
        self.clock = clock
        self.renewed_at = clock()
        self.lost = asyncio.Event()
        self._renewal: asyncio.Task[None] | None = None
        self._renewer = tasks.spawn(self._renew_forever(), name=f"lease-{lease['metadata']['name']}")

    @property
    def name(self) -> str:
        """The Lease's name."""
        return str(self.lease["metadata"]["name"])

    async def renew(self) -> None:
        """Renew the Lease now, or wait for the renewal already in flight and take its result. Raises
        :class:`ClaimLost` when the Lease is lost; a renewal that failed otherwise (the API server did not
        answer) is logged and raises nothing while the Lease has not lapsed."""
        if self.lost.is_set():
            raise ClaimLost(f"Lease {self.name} was lost")
        if self._renewal is None or self._renewal.done():
            self._renewal = asyncio.create_task(self._renew_once(), name=f"renew-{self.name}")
        # Shielded: a caller cancelled mid-renewal (its eviction stopped) leaves the write to the others.
        await asyncio.shield(self._renewal)

    async def _renew_once(self) -> None:
        leases = self._leases
        try:
            for _ in range(RENEW_ATTEMPTS):
                try:
                    self.lease = await leases._write(self.lease, renew=True)
                except KubeError as exc:
                    if exc.status != 409:
                        raise
                    current = await leases.kube.get_lease(leases.namespace, self.name)
                    holder = ((current or {}).get("spec") or {}).get("holderIdentity")
                    if current is None or holder != leases.identity:
                        self._lose(f"held by {holder!r} now" if current is not None else "deleted")
                    self.lease = current  # ours still: write again on its resourceVersion
                    continue
                self.renewed_at = self.clock()
                return
            raise KubeError(
                409, "Conflict", f"Lease {self.name} kept changing under {RENEW_ATTEMPTS} renewals"
            )
        except KubeError as exc:
            if self.clock() - self.renewed_at >= leases.duration_s:
                self._lose(f"not renewed for {leases.duration_s} s: {exc}")
            log.warning("lease renewal failed", lease=self.name, error=str(exc))

    def _lose(self, why: str) -> NoReturn:
        log.warning("lease lost", lease=self.name, why=why)
        self.lost.set()
        raise ClaimLost(f"Lease {self.name}: {why}")

    async def _renew_forever(self) -> None:
        while not self.lost.is_set():
            await asyncio.sleep(self._leases.renew_every_s)
            with contextlib.suppress(ClaimLost):
                await self.renew()

    async def confirm(self) -> None:
        """Make sure the Lease is still ours: renew it now (or wait for the renewal in flight) when the last
        renewal is older than a renewal period. Raises :class:`ClaimLost` when it is not (or no longer)
        ours."""
        if self.lost.is_set():
            raise ClaimLost(f"Lease {self.name} was lost")
        if self.clock() - self.renewed_at >= self._leases.renew_every_s:
            await self.renew()
            if self.clock() - self.renewed_at >= self._leases.duration_s:
                self.lost.set()
                raise ClaimLost(f"Lease {self.name} lapsed and could not be renewed")

    async def release(self) -> None:
        """Stop renewing (the renewal task and a renewal in flight are cancelled and awaited) and give the
        Lease up (its holder cleared) unless it was lost; a 409 re-reads it and clears it when it is still
        ours. Errors are logged, not raised."""
        await tasks.stop(self._renewer, self._renewal)
        if self.lost.is_set():
            return
        leases = self._leases
        lease: dict[str, Any] | None = self.lease
        for _ in range(RENEW_ATTEMPTS):
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != leases.identity:
                return
            try:
                await leases.kube.replace_lease(
                    leases.namespace, {**lease, "spec": {**lease.get("spec", {}), "holderIdentity": None}}
                )
                return
            except KubeError as exc:
                if exc.status != 409:
                    log.warning("lease release failed", lease=self.name, error=str(exc))
                    return
            try:
                lease = await leases.kube.get_lease(leases.namespace, self.name)
            except KubeError as exc:
                log.warning("lease release failed", lease=self.name, error=str(exc))
                return

    async def __aenter__(self) -> Claim:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class NodeLeases:
    """Lease claims for ``identity`` (this replica: its pod name) in ``namespace``; a Lease lasts
    ``duration_s`` whole seconds (``leaseDurationSeconds`` is an int32) unless renewed, every ``renew_every_s``
    seconds (default: a third of the duration)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        identity: str,
        duration_s: int = default("node_lease_duration_sec"),
        renew_every_s: float | None = None,
    ) -> None:
        self.kube = kube
        self.namespace = namespace or "default"
        self.identity = identity
        self.duration_s = int(duration_s)
        self.renew_every_s = renew_every_s if renew_every_s is not None else self.duration_s / 3

    async def claim(self, node: str) -> Claim | None:
        """The node's Lease for this replica, or ``None`` when another replica holds it. Raises
        :class:`KubeError` when the API server cannot be reached."""
        name = lease_name(node)
        existing: dict[str, Any] | None = None
        for _ in range(2):  # a Lease deleted between the refused create and the read is created again
            try:  # created first: a node's first claim (a storm's) is one request, not a read and a create
                return Claim(self, await self.kube.create_lease(self.namespace, self._fresh(name)))
            except KubeError as exc:
                if exc.status != 409:  # 409 AlreadyExists: an earlier claim's Lease, or another replica's
                    raise
            existing = await self.kube.get_lease(self.namespace, name)
            if existing is not None:
                break
        if existing is None:
            return None
        try:
            spec = existing.get("spec") or {}
            holder = spec.get("holderIdentity")
            renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
            duration = int(spec.get("leaseDurationSeconds") or self.duration_s)
            expired = renewed is None or renewed + timedelta(seconds=duration) < _now()
            if holder and holder != self.identity and not expired:
                return None
            return Claim(self, await self._write(existing, renew=holder == self.identity))
        except KubeError as exc:
            if exc.status == 409:  # another replica created or took it first
                return None
            raise

    def _fresh(self, name: str) -> dict[str, Any]:
        now = _now().strftime(_MICRO)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.duration_s,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }

    async def _write(self, lease: dict[str, Any], *, renew: bool) -> dict[str, Any]:
        now = _now().strftime(_MICRO)
        spec = dict(lease.get("spec") or {})
        if not renew:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.duration_s, renewTime=now)
        replaced: dict[str, Any] = await self.kube.replace_lease(self.namespace, {**lease, "spec": spec})
        return replaced
