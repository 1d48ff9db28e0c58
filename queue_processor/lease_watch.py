"""Node Leases (coordination.k8s.io/v1, "Leases"): names, labels, holder, expiry and body (pure), and one watch of
them (NODE_LEASES, "Efficient detection of changes"): holders (:meth:`LeaseWatch.released`) and the events handed over
(:attr:`LeaseWatch.on_handed`). Without list/watch rights, waiters poll (:data:`UNWATCHED_POLL_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from queue_processor.kube import LEASES, KubeClient
from queue_processor.rules import HANDOVER_PREFIX
from queue_processor.watch import Watched

#: ``leaseDurationSeconds`` of a node Lease held by a replica Lease (earlier versions judge by it): over any drain.
HELD_BY_REPLICA_S = 3600

#: The labels naming a node Lease's holder and the Lease itself (:func:`label_value`): what a batch of releases
#: selects by (the Leases ``in (…)``).
HOLDER_LABEL = "queue-processor/holder"
LEASE_LABEL = "queue-processor/lease"

#: A Lease's MicroTime as written.
_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"


def object_name(name: str) -> str:
    """``name`` made a valid object name: lower case, ``[a-z0-9.-]``, at most 253 characters."""
    return re.sub(r"[^a-z0-9.-]", "-", name.lower())[:253].rstrip(".-")


def lease_name(node: str) -> str:
    """``queue-processor-<node>``, made a valid object name (lower case, at most 253 characters)."""
    return object_name("queue-processor-" + node)


def replica_lease_name(identity: str) -> str:
    """``queue-processor.replica.<identity>``, made a valid object name, never a node Lease's."""
    return object_name("queue-processor.replica." + identity)


def label_value(text: str) -> str:
    """A label value standing for ``text``, which may not fit one: 20 hex digits of its BLAKE2b digest."""
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


def holder_of(lease: dict[str, Any] | None) -> str | None:
    """The Lease's ``holderIdentity``, ``None`` when it has none (or there is no Lease)."""
    holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
    return str(holder) if holder else None


def expired(lease: dict[str, Any], default_s: int) -> bool:
    """Whether the Lease's last renewal (or acquisition) + its ``leaseDurationSeconds`` is past (MicroTimes)."""
    spec = lease.get("spec") or {}
    renewed = spec.get("renewTime") or spec.get("acquireTime")
    duration = int(spec.get("leaseDurationSeconds") or default_s)
    return not renewed or datetime.fromisoformat(renewed) + timedelta(seconds=duration) < datetime.now(UTC)


def new_lease(name: str, namespace: str, holder: str) -> dict[str, Any]:
    """A Lease to create, acquired by ``holder`` now (to be written as :func:`held_lease`)."""
    now = datetime.now(UTC).strftime(_MICRO)
    spec = {"holderIdentity": holder, "acquireTime": now, "leaseTransitions": 0}
    metadata = {"name": name, "namespace": namespace}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


def held_lease(
    lease: dict[str, Any],
    holder: str,
    duration_s: int,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``lease`` as ``holder`` writes it on its resourceVersion: renewed (and acquired, if someone else's)."""
    now = datetime.now(UTC).strftime(_MICRO)
    metadata = dict(lease.get("metadata") or {})
    for key, marks in (("annotations", annotations), ("labels", labels)):
        if marks:
            metadata[key] = {**(metadata.get(key) or {}), **marks}
    spec = dict(lease.get("spec") or {})
    if spec.get("holderIdentity") != holder:
        spec["acquireTime"] = now
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
    spec.update(holderIdentity=holder, leaseDurationSeconds=duration_s, renewTime=now)
    return {**lease, "metadata": metadata, "spec": spec}


#: The annotation of a node Lease naming the replica Lease it is held by (held while that one is renewed).
REPLICA_ANNOTATION = "queue-processor/replica-lease"

#: Without a live watch: how often a replica waiting for a node's Lease tries its claim again (seconds).
UNWATCHED_POLL_S = 5.0


class _Copy(NamedTuple):  # what the watch keeps of a node Lease
    holder: str | None  # holderIdentity
    replica: str | None  # the replica Lease its REPLICA_ANNOTATION names
    handed: dict[str, str]  # its hand-over annotations


_NONE = _Copy(None, None, {})


def _copy_of(lease: dict[str, Any]) -> _Copy:
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    replica = str(annotations[REPLICA_ANNOTATION]) if annotations.get(REPLICA_ANNOTATION) else None
    handed = {key: str(value) for key, value in annotations.items() if key.startswith(HANDOVER_PREFIX)}
    return _Copy(holder_of(lease), replica, handed)


class LeaseWatch(Watched):
    """The watched node Leases of ``namespace`` selected by ``selector``, from :meth:`start` to :meth:`close`."""

    name = "lease-watch"
    refusal = (
        "cannot list and watch node Leases: a replica waiting for a node's Lease polls for it, and events "
        "handed over reach a holder only through its own receive (grant leases list and watch)"
    )

    def __init__(self, kube: KubeClient, namespace: str, selector: str) -> None:
        super().__init__(kube, LEASES.format(namespace), query={"labelSelector": selector})
        self.namespace = namespace
        self.selector = selector
        self._copies: dict[str, _Copy] = {}  # Lease name → what is kept of it
        self._changes: dict[str, asyncio.Future[None]] = {}  # Lease name → resolved at its next change
        self.on_handed: Callable[[str, Mapping[str, str]], None] | None = None
        """Called (in the event loop) with a Lease's name and its hand-over annotations whenever they change."""

    def holder(self, name: str) -> str | None:
        """The ``holderIdentity`` of Lease ``name`` (``None``: no such Lease, or no current copy)."""
        return self._copies.get(name, _NONE).holder if self.live else None

    def replica(self, name: str) -> str | None:
        """The replica Lease that node Lease ``name`` names (:data:`REPLICA_ANNOTATION`), or ``None``."""
        return self._copies.get(name, _NONE).replica if self.live else None

    def handed(self, name: str) -> dict[str, str]:
        """The hand-over annotations of Lease ``name`` (empty without a current copy)."""
        return dict(self._copies.get(name, _NONE).handed) if self.live else {}

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
                while self.live and (holder is None or self._copies.get(name, _NONE).holder == holder):
                    change = self._changes.setdefault(name, asyncio.get_running_loop().create_future())
                    await asyncio.shield(change)  # shared: a waiter cancelled leaves it to the others
                    if holder is None:
                        return

    async def _begin(self) -> str:
        items, version = await self.kube.list_leases(self.namespace, self.selector)
        before = self._copies
        self._copies = {str(lease["metadata"]["name"]): _copy_of(lease) for lease in items}
        for name in before.keys() | self._copies.keys():
            self._changed(name, before.get(name, _NONE).handed)
        return version

    def _apply(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            lease = event.get("object") or {}
            name = (lease.get("metadata") or {}).get("name")
            if name is None or event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            before = self._copies.pop(name, _NONE).handed
            if event.get("type") != "DELETED":
                self._copies[name] = _copy_of(lease)
            self._changed(name, before)

    def _set_live(self, live: bool) -> None:
        super()._set_live(live)
        if not live:
            for name in list(self._changes):
                self._wake(name)

    def _wake(self, name: str) -> None:
        change = self._changes.pop(name, None)
        if change is not None:
            change.set_result(None)

    def _changed(self, name: str, handed: dict[str, str]) -> None:
        """Wake the waiters of Lease ``name``; tell its hand-over annotations when they changed from ``handed``."""
        self._wake(name)
        now = self._copies.get(name, _NONE).handed
        if now and now != handed and self.on_handed is not None:
            self.on_handed(name, dict(now))
