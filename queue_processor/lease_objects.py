"""coordination.k8s.io/v1 Lease objects as the controller writes and reads them, pure: their names, label values,
holder, expiry, and the body of a Lease created or taken over ("Leases", Kubernetes concepts)."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = [
    "HELD_BY_REPLICA_S",
    "HOLDER_LABEL",
    "LEASE_LABEL",
    "expired",
    "held_lease",
    "holder_of",
    "label_value",
    "lease_name",
    "new_lease",
    "now_utc",
    "object_name",
    "parse_time",
    "replica_lease_name",
]

#: ``leaseDurationSeconds`` of a node Lease held by a replica Lease (earlier versions judge by it): over any drain.
HELD_BY_REPLICA_S = 3600

#: The label naming a node Lease's holder (:func:`label_value`): what a batch of releases selects by.
HOLDER_LABEL = "queue-processor/holder"

#: The label naming the node Lease itself (:func:`label_value`): what a batch selects each by (``in (…)``).
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


def now_utc() -> datetime:
    """The wall clock now, aware UTC (what a Lease's times are read against)."""
    return datetime.now(UTC)


def parse_time(value: str | None) -> datetime | None:
    """A Lease's MicroTime (``acquireTime``, ``renewTime``), aware UTC; ``None`` when absent."""
    if not value:
        return None
    try:
        return datetime.strptime(value, _MICRO).replace(tzinfo=UTC)
    except ValueError:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))


def holder_of(lease: dict[str, Any] | None) -> str | None:
    """The Lease's ``holderIdentity``, ``None`` when it has none (or there is no Lease)."""
    holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
    return str(holder) if holder else None


def expired(lease: dict[str, Any], default_s: int) -> bool:
    """Whether the Lease's last renewal (or acquisition) + its ``leaseDurationSeconds`` is past."""
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = int(spec.get("leaseDurationSeconds") or default_s)
    return renewed is None or renewed + timedelta(seconds=duration) < now_utc()


def new_lease(
    name: str,
    namespace: str,
    holder: str,
    duration_s: int,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Lease to create, held by ``holder`` from now for ``duration_s`` seconds."""
    now = now_utc().strftime(_MICRO)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_s,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        },
    }


def held_lease(
    lease: dict[str, Any],
    holder: str,
    duration_s: int,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``lease`` as ``holder`` writes it on its resourceVersion: renewed (and acquired, if someone else's)."""
    now = now_utc().strftime(_MICRO)
    metadata = dict(lease.get("metadata") or {})
    if annotations:
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    if labels:
        metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
    spec = dict(lease.get("spec") or {})
    if spec.get("holderIdentity") != holder:
        spec["acquireTime"] = now
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
    spec.update(holderIdentity=holder, leaseDurationSeconds=duration_s, renewTime=now)
    return {**lease, "metadata": metadata, "spec": spec}
