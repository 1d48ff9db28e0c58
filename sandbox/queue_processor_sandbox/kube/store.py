"""The Kubernetes emulation's object store: the served resources, the stored objects and their indexes.

What it holds:

- :data:`RESOURCES`: every served resource (plural → :class:`ResourceInfo`: group/version, kind, namespaced);
- :class:`ObjectStore`: the objects by resource and ``(namespace, name)`` key, the cluster-wide
  ``resourceVersion`` counter (``metadata.resourceVersion`` and ``metadata.generation`` kept as the API server
  keeps them), the pod indexes (by node, by label, by controller, per-label readiness and owner counters) that
  let a PodDisruptionBudget, a ReplicaSet or a ``spec.nodeName`` list cost the size of their selection, and the
  snapshot that a ``resourceVersion=0`` list is served from (the API server's watch cache, which may lag), and
  the recent changes a watch is served from (:attr:`ObjectStore.history`, a window per resource, bounded as the
  API server's watch cache is, one cache per resource: a watch from an older ``resourceVersion`` is told 410
  Expired, and the writes of one resource never expire a watch of another);
- the helpers that name a resource in a ``Status`` the way the API server does (:func:`qualified`,
  :func:`details`).

No locking here: every method expects the caller to hold the sandbox's lock
(:attr:`~queue_processor_sandbox.kube.KubeSandbox.lock`).
"""

from __future__ import annotations

import uuid
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from queue_processor_sandbox.kube_logic import (
    ApiError,
    Obj,
    is_ready,
    is_terminating,
    owner,
    selector_matches,
)

__all__ = [
    "HISTORY",
    "RESOURCES",
    "Change",
    "Key",
    "ObjectStore",
    "ResourceInfo",
    "details",
    "now_iso",
    "qualified",
]

#: Changes kept for watches, per resource. The API server's watch cache keeps a window of recent events per
#: resource too (one cache per resource), and answers a watch from before it with 410 Expired ("too old
#: resource version"). With one window for every resource (as before 2026-11-27), a storm's pod writes could
#: expire a watch of the nodes, which the API server's node cache would keep (not seen in a storm: the mend is
#: for agreement with the real server, tested in tests/sandbox/test_kube.py).
HISTORY = 20_000


@dataclass(frozen=True)
class ResourceInfo:
    """A served resource: its API group/version (``v1``, ``apps/v1``…), kind, and whether it is namespaced."""

    group_version: str
    kind: str
    namespaced: bool


RESOURCES: dict[str, ResourceInfo] = {
    "namespaces": ResourceInfo("v1", "Namespace", False),
    "nodes": ResourceInfo("v1", "Node", False),
    "pods": ResourceInfo("v1", "Pod", True),
    "events": ResourceInfo("v1", "Event", True),
    "daemonsets": ResourceInfo("apps/v1", "DaemonSet", True),
    "replicasets": ResourceInfo("apps/v1", "ReplicaSet", True),
    "poddisruptionbudgets": ResourceInfo("policy/v1", "PodDisruptionBudget", True),
    "leases": ResourceInfo("coordination.k8s.io/v1", "Lease", True),
}

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects


@dataclass(frozen=True)
class Change:
    """One write, as a watch replays it: the ``resourceVersion`` it made, the resource, the object before
    (``None``: created) and after (``None``: removed)."""

    rv: int
    plural: str
    old: Obj | None
    new: Obj | None


def qualified(plural: str) -> str:
    """``pods``, ``leases.coordination.k8s.io``: how the API server names a resource in its error messages."""
    group = RESOURCES[plural].group_version.rpartition("/")[0]
    return f"{plural}.{group}" if group else plural


def details(plural: str) -> dict[str, str]:
    """The ``group`` (omitted for the core group) and ``kind`` (the plural) of a Status's details."""
    group = RESOURCES[plural].group_version.rpartition("/")[0]
    return {"group": group, "kind": plural} if group else {"kind": plural}


def now_iso() -> str:
    """The wall-clock time now (UTC) as the API server writes timestamps: ``2024-05-01T12:00:00Z`` (seconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ObjectStore:
    """The stored objects of every resource in :data:`RESOURCES`, their resourceVersions and pod indexes.

    Every method expects the caller to hold the sandbox's lock. ``on_pod_removed`` is called with a pod just
    after it was removed (the simulated DaemonSet controller hooks in there).
    """

    def __init__(self) -> None:
        self.objects: dict[str, dict[Key, Obj]] = {plural: {} for plural in RESOURCES}
        self.pods_by_node: dict[str, set[Key]] = {}
        # (namespace, label, value) → pods: PodDisruptionBudgets and ReplicaSets select through it, so an
        # eviction costs the size of its selection, not of the cluster.
        self.pods_by_label: dict[tuple[str, str, str], set[Key]] = {}
        self.active_by_owner: dict[str, set[Key]] = {}  # controller uid -> its pods not being deleted
        # Per label (namespace, key, value): ready pods, and pods not being deleted by controller reference
        # (kind, name, uid; None for none): a one-label PodDisruptionBudget's status without a scan.
        self.label_ready: dict[tuple[str, str, str], int] = {}
        self.label_owners: dict[tuple[str, str, str], dict[tuple[str, str, str] | None, int]] = {}
        self.writes: Counter[str] = Counter()  # stores and removals by resource, to know when to recompute
        self.rv = 0
        self.snapshot: dict[str, dict[Key, Obj]] = {}
        self.snapshot_by_node: dict[str, list[Key]] = {}
        self.snapshot_at = -1e18
        self.on_pod_removed: Callable[[Obj], None] = lambda pod: None
        self.history: dict[str, list[Change]] = {}
        """The latest writes of each resource, oldest first (at most 2 x :data:`HISTORY` each; trimmed to
        :data:`HISTORY`)."""
        self.trimmed: dict[str, int] = {}
        """Per resource, the resourceVersion of the last of its writes trimmed from :attr:`history`."""
        self.compacted = 0
        """The resourceVersion of the last compaction (:meth:`compact`): no watch starts before it."""
        self.on_write: Callable[[], None] = lambda: None
        """Called (lock held) after every write: the watches are woken there."""

    def ensure_namespace(self, namespace: str) -> None:
        """Create ``namespace`` unless it exists."""
        if ("", namespace) not in self.objects["namespaces"]:
            self.insert(
                "namespaces",
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": namespace},
                    "status": {"phase": "Active"},
                },
            )

    def key(self, obj: Obj) -> Key:
        """The ``(namespace, name)`` key of an object (namespace ``""`` for a cluster-scoped kind)."""
        return (
            obj["metadata"].get("namespace", "") if RESOURCES[self.plural_of(obj)].namespaced else "",
            obj["metadata"]["name"],
        )

    @staticmethod
    def plural_of(obj: Obj) -> str:
        """The resource (plural) of an object, from its ``kind``."""
        return next(plural for plural, info in RESOURCES.items() if info.kind == obj["kind"])

    def next_rv(self) -> str:
        """Advance the cluster-wide resourceVersion and return it."""
        self.rv += 1
        return str(self.rv)

    def free_name(self, plural: str, namespace: str, prefix: str) -> str:
        """``prefix`` and five random characters, a name no object of ``plural`` in ``namespace`` has (lock
        held). Five hex characters collide within a few thousand names (a storm's replacement pods); the API
        server retries a ``generateName`` that collides (RetryGenerateName), and so does this."""
        while True:
            name = prefix + uuid.uuid4().hex[:5]
            if (namespace, name) not in self.objects[plural]:
                return name

    def insert(self, plural: str, obj: Obj) -> Obj:
        """Store a new object (lock held); raises 409 AlreadyExists when its name is taken."""
        metadata = obj.setdefault("metadata", {})
        namespace = metadata.get("namespace", "") if RESOURCES[plural].namespaced else ""
        if RESOURCES[plural].namespaced:
            metadata["namespace"] = namespace or "default"
            namespace = metadata["namespace"]
            self.ensure_namespace(namespace)
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = self.free_name(plural, namespace, metadata["generateName"])
        key = (namespace, metadata["name"])
        if key in self.objects[plural]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{qualified(plural)} "{metadata["name"]}" already exists',
                {"name": metadata["name"], **details(plural)},
            )
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", now_iso())
        metadata["generation"] = 1
        metadata["resourceVersion"] = self.next_rv()
        self.objects[plural][key] = obj
        self.stored(plural, key, None, obj)
        return obj

    def replace(self, plural: str, key: Key, obj: Obj) -> Obj:
        """Store a new version of an existing object (lock held); copy-on-write, so cache snapshots stay
        consistent."""
        old = self.objects[plural][key]
        obj["metadata"]["resourceVersion"] = self.next_rv()
        if obj.get("spec") != old.get("spec"):
            obj["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        self.objects[plural][key] = obj
        self.stored(plural, key, old, obj)
        return obj

    def remove(self, plural: str, key: Key) -> Obj | None:
        """Remove an object (lock held) and return it, or ``None`` when there was none; a removed pod is
        passed to :attr:`on_pod_removed`."""
        obj = self.objects[plural].pop(key, None)
        if obj is not None:
            self.rv += 1
            self.stored(plural, key, obj, None)
            if plural == "pods":
                self.on_pod_removed(obj)
        return obj

    def stored(self, plural: str, key: Key, old: Obj | None, new: Obj | None) -> None:
        """Bookkeeping after an object was stored, replaced (both given) or removed (``new`` None)."""
        self.writes[plural] += 1
        if plural == "pods":
            self.index_pod(key, old, new)
        changes = self.history.setdefault(plural, [])
        changes.append(Change(self.rv, plural, old, new))
        if len(changes) > 2 * HISTORY:
            self.trimmed[plural] = changes[-HISTORY - 1].rv
            del changes[:-HISTORY]
        self.on_write()

    def history_from(self, plural: str) -> int:
        """The resourceVersion a watch of ``plural`` can start from at the earliest: every write of it after
        that is in :attr:`history`."""
        return max(self.trimmed.get(plural, 0), self.compacted)

    def compact(self) -> None:
        """Forget every change kept (etcd's compaction): no watch starts before the current resourceVersion."""
        self.history.clear()
        self.trimmed.clear()
        self.compacted = self.rv

    def changes_after(self, plural: str, rv: int) -> list[Change]:
        """The writes of ``plural`` made after resourceVersion ``rv``, oldest first (``rv`` must not be older
        than :meth:`history_from`)."""
        changes = self.history.get(plural, [])
        return changes[bisect_right(changes, rv, key=lambda change: change.rv) :]

    def index_pod(self, key: Key, old: Obj | None, new: Obj | None) -> None:
        """Move a pod's entries in the indexes from its ``old`` version to its ``new`` one (either may be
        ``None``: created, removed)."""
        for pod, step in ((old, -1), (new, 1)):
            if pod is None:
                continue
            ready = is_ready(pod)
            terminating = is_terminating(pod)
            reference = owner(pod)
            by = (reference["kind"], reference["name"], reference["uid"]) if reference else None
            for label in (pod["metadata"].get("labels") or {}).items():
                index = (key[0], *label)
                if ready:
                    self.label_ready[index] = self.label_ready.get(index, 0) + step
                if not terminating:
                    owners = self.label_owners.setdefault(index, {})
                    owners[by] = owners.get(by, 0) + step
                    if not owners[by]:
                        del owners[by]
        for pod, add in ((old, False), (new, True)):
            if pod is None or is_terminating(pod):
                continue
            uid = (owner(pod) or {}).get("uid")
            if uid:
                members = self.active_by_owner.setdefault(uid, set())
                if add:
                    members.add(key)
                else:
                    members.discard(key)
        # Unscheduled pods are indexed under "" (the scheduler's queue).
        old_node = (old.get("spec") or {}).get("nodeName") or "" if old else None
        new_node = (new.get("spec") or {}).get("nodeName") or "" if new else None
        if old_node is not None and old_node != new_node:
            self.pods_by_node.get(old_node, set()).discard(key)
        if new_node is not None:
            self.pods_by_node.setdefault(new_node, set()).add(key)
        old_labels = (old["metadata"].get("labels") or {}) if old else {}
        new_labels = (new["metadata"].get("labels") or {}) if new else {}
        if old_labels != new_labels:
            for label, value in old_labels.items():
                self.pods_by_label.get((key[0], label, value), set()).discard(key)
            for label, value in new_labels.items():
                self.pods_by_label.setdefault((key[0], label, value), set()).add(key)

    def select_pods(self, namespace: str, selector: Obj | None) -> list[Obj]:
        """The pods of ``namespace`` that a LabelSelector object selects (through the label index when it
        has matchLabels)."""
        match_labels = (selector or {}).get("matchLabels") or {}
        if match_labels:
            keys = set.intersection(
                *(
                    self.pods_by_label.get((namespace, label, value), set())
                    for label, value in match_labels.items()
                )
            )
            candidates = [self.objects["pods"][key] for key in keys]
        else:
            candidates = [
                p for p in self.objects["pods"].values() if p["metadata"].get("namespace") == namespace
            ]
        return [p for p in candidates if selector_matches(selector, p["metadata"].get("labels") or {})]

    def refresh_cache(self, now: float, max_age: float) -> None:
        """Take a new snapshot for ``resourceVersion=0`` lists when the current one is older than ``max_age``
        (both real monotonic seconds): the API server's watch cache, which may lag behind the store. Objects
        are replaced, never changed in place, so a shallow copy is a consistent snapshot."""
        if now - self.snapshot_at > max_age:
            self.snapshot = {p: dict(objs) for p, objs in self.objects.items()}
            self.snapshot_by_node = {node: list(keys) for node, keys in self.pods_by_node.items()}
            self.snapshot_at = now
