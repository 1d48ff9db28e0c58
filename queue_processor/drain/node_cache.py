"""The nodes as one watch sees them: what a cordon reads, without a GET per node.

A cordon is a read-modify-write (:meth:`queue_processor.drain.drainer.Drainer.cordon`): ``spec.taints`` has no
patch merge key, and the record of what we changed needs the node as it was. Read with a GET, a storm's 1,000
cordons cost 2,000 urgent requests, and at 200 requests per second the last node waited 10 s for its cordon.
Here the nodes are listed once (paged, 500 at a time) and watched from then on, as an informer does, and a
slim copy of each is kept (:func:`slim`: name, resourceVersion, labels, our record annotation,
``spec.unschedulable``, ``spec.taints``, ``spec.providerID``, the ``Ready`` condition; about 1 KB a node; the
watch thread slims each event before it reaches the loop, :func:`slim_event`). The ``nth_tagged_nodes`` gauge
counts from it too, instead of listing every node every 30 s, and so does the check for instances back in
service (:mod:`queue_processor.returns`), instead of listing the nodes we cordoned. A cordon's first attempt
reads the copy and its PATCH carries the copy's resourceVersion: when the node changed since (a copy behind
the server), the API server answers 409 Conflict and the write is retried on a GET, so a stale copy costs one
request and never a wrong write.

Only a copy the watch keeps current is handed out (:attr:`NodeCache.live`); a node the copy does not know
(registered a moment ago, or named otherwise) is read with a GET. At start-up a claim or a cordon waits for the
copy's first answer, until :data:`FIRST_COPY_WAIT_S` after its start at most, rather than reading its node. A 410 lists
again; a broken stream resumes from its last resourceVersion; a refusal (401/403/404/405: no ``nodes``
``watch`` right) is logged once and the cordons read with GETs, as before (the loop:
:class:`~queue_processor.drain.watched.Watched`).

The copy also answers, for an instance EC2 says is shutting down or terminated, that no node of it is left
(:meth:`NodeCache.absent`: none named after its private DNS name, none whose ``kubernetes.io/hostname`` label
is that name or its first label, the lookups :class:`~queue_processor.nodes.NodeFinder` makes): the state
changes of a storm's instances, published when each notice ends, then cost no node GET and LIST each.

Kubernetes documents: "Efficient detection of changes" and "Retrieving large results sets in chunks" (API
concepts); "Resource versions" for the optimistic concurrency of the write.
"""

from __future__ import annotations

import time
from typing import Any

from queue_processor.drain.record import RECORD_ANNOTATION
from queue_processor.drain.watched import WATCH_TIMEOUT_S, Watched
from queue_processor.kube import KubeClient

__all__ = ["FIRST_COPY_WAIT_S", "NodeCache", "slim", "slim_event"]

#: Nodes per page of the start-up list.
PAGE = 500

#: How long after the copy's start a claim or a cordon still waits for its first answer (seconds;
#: :meth:`Watched.first_answer`) before it reads its node with a GET instead. At start-up the storm is already
#: in the queue: without the wait, each of its first nodes cost a GET for its claim and one for its cordon,
#: urgent requests that the copy's own pages then waited behind (5,000 Spot warnings at three replicas: 0.17 and
#: 1.1 node GETs per node in two runs, 2.03 with the pages made urgent alone, the copy of 6,250 nodes in after
#: 26-38 s; 0.00-0.03 with the wait, docs/benchmarks.md).
FIRST_COPY_WAIT_S = 5.0

#: The well-known label the kubelet sets to the node's hostname.
HOSTNAME_LABEL = "kubernetes.io/hostname"


def slim(node: dict[str, Any]) -> dict[str, Any]:
    """The part of a Node a cordon reads (pure): ``metadata`` (name, resourceVersion, labels, our record
    annotation) and ``spec`` (``unschedulable``, ``taints``, and ``providerID`` for the ``nth_tagged_nodes``
    gauge), and ``status.conditions`` with the ``Ready`` condition's type and status alone (for the check of
    instances back in service). A slim copy slims to itself."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    annotations = metadata.get("annotations") or {}
    kept: dict[str, Any] = {
        "name": metadata.get("name"),
        "resourceVersion": metadata.get("resourceVersion"),
        "labels": dict(metadata.get("labels") or {}),
    }
    if RECORD_ANNOTATION in annotations:
        kept["annotations"] = {RECORD_ANNOTATION: annotations[RECORD_ANNOTATION]}
    kept_spec: dict[str, Any] = {}
    if spec.get("providerID"):
        kept_spec["providerID"] = spec["providerID"]
    if spec.get("unschedulable"):
        kept_spec["unschedulable"] = True
    if spec.get("taints"):
        kept_spec["taints"] = [dict(taint) for taint in spec["taints"]]
    slimmed: dict[str, Any] = {"metadata": kept, "spec": kept_spec}
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = [{"type": "Ready", "status": c.get("status")} for c in conditions if c.get("type") == "Ready"]
    if ready:
        slimmed["status"] = {"conditions": ready}
    return slimmed


def slim_event(event: dict[str, Any]) -> dict[str, Any] | None:
    """What the watch keeps of a node event (pure; run in the watch thread, :data:`~queue_processor.kube.Keep`):
    an added or modified node as its :func:`slim` copy, a deleted one as its name and resourceVersion, nothing
    of another event. Raises what :func:`slim` raises on a node it cannot read (the watch then ends, and the
    nodes are read again)."""
    kind = event.get("type")
    node = event.get("object")
    if not isinstance(node, dict):
        return None
    if kind == "DELETED":
        metadata = node.get("metadata") or {}
        kept = {"name": metadata.get("name"), "resourceVersion": metadata.get("resourceVersion")}
        return {"type": kind, "object": {"metadata": kept}}
    if kind in ("ADDED", "MODIFIED"):
        return {"type": kind, "object": slim(node)}
    return None


class NodeCache(Watched):
    """The watched nodes (see the module), started by :meth:`start` and ended by :meth:`close`. ``kube`` makes
    the requests: the paged list of the nodes at each (re)start and one watch per connection. Raises nothing:
    a failed list or watch is retried with backoff (:class:`~queue_processor.drain.watched.Watched`), and
    meanwhile :meth:`get` answers ``None``."""

    name = "node-cache"
    refusal = "cannot list and watch nodes: cordons read each node first (grant nodes watch)"

    def __init__(self, kube: KubeClient, *, timeout_s: float = WATCH_TIMEOUT_S) -> None:
        super().__init__(timeout_s=timeout_s)
        self.kube = kube
        self._nodes: dict[str, dict[str, Any]] = {}
        self._hostnames: dict[str, set[str]] = {}  # kubernetes.io/hostname label → names of the nodes with it
        self._counted: dict[tuple[str, str], tuple[float, int]] = {}  # (label, value) → (when, nodes)
        self._instances: dict[str, str] = {}  # instance ID (the end of spec.providerID) → node name

    def get(self, name: str) -> dict[str, Any] | None:
        """The slim copy of node ``name`` (:func:`slim`), or ``None`` while the copy is not current or does
        not know it (read it with a GET then). The caller must write with its ``resourceVersion``."""
        if not self.live:
            return None
        return self._nodes.get(name)

    def all(self) -> list[dict[str, Any]] | None:
        """Every node's slim copy, or ``None`` while the copy is not current."""
        return list(self._nodes.values()) if self.live else None

    def labelled(self, label: str, value: str, *, ttl_s: float = 60.0) -> int | None:
        """How many nodes of the copy carry ``label=value`` (a DRAIN_BUDGET_GROUP_LABEL group's size), counted
        at most once every ``ttl_s`` seconds per group (a fleet-wide rebalance asks once per drain); ``None``
        while the copy is not current."""
        if not self.live:
            return None
        now = time.monotonic()
        counted = self._counted.get((label, value))
        if counted is None or now - counted[0] >= ttl_s:
            size = sum(1 for node in self._nodes.values() if node["metadata"]["labels"].get(label) == value)
            counted = self._counted[(label, value)] = (now, size)
        return counted[1]

    def find(self, dns_name: str, provider_id: str = "") -> dict[str, Any] | None:
        """The slim copy of an instance's node, as :class:`~queue_processor.nodes.NodeFinder` would find it:
        by ``provider_id`` when given (its instance ID: ``aws:///<zone>/<instance-id>``, or without the zone), else
        named
        ``dns_name`` or labelled ``kubernetes.io/hostname`` with it or its first label; ``None`` when the copy
        has none, or is not current (:attr:`live`)."""
        if not self.live:
            return None
        if provider_id:
            name = self._instances.get(provider_id.rsplit("/", 1)[-1])
            return self._nodes.get(name) if name is not None else None
        found = self._nodes.get(dns_name)
        if found is not None:
            return found
        for hostname in (dns_name, dns_name.split(".")[0]):
            names = self._hostnames.get(hostname)
            if names:
                return self._nodes.get(min(names))
        return None

    def absent(self, dns_name: str) -> bool:
        """Whether the current copy knows no node for an instance of private DNS name ``dns_name``: none of that
        name, and none whose ``kubernetes.io/hostname`` label is ``dns_name`` or its first label. ``False``
        while the copy is not current (:attr:`live`): then nothing is known."""
        if not self.live:
            return False
        short = dns_name.split(".")[0]
        return (
            dns_name not in self._nodes
            and not self._hostnames.get(dns_name)
            and not self._hostnames.get(short)
        )

    async def _begin(self) -> str:
        """Every node, page by page, as slim copies; the list's resourceVersion."""
        self._nodes, self._hostnames, self._instances = {}, {}, {}
        rv = ""
        async for items, version in self.kube.node_pages(PAGE):
            rv = rv or version
            for node in items:
                self._put(slim(node))
        return rv

    def _put(self, kept: dict[str, Any]) -> None:
        name = str(kept["metadata"]["name"])
        self._drop(name)
        self._nodes[name] = kept
        hostname = kept["metadata"]["labels"].get(HOSTNAME_LABEL)
        if hostname:
            self._hostnames.setdefault(hostname, set()).add(name)
        provider = kept["spec"].get("providerID")
        if provider:
            self._instances[str(provider).rsplit("/", 1)[-1]] = name

    def _drop(self, name: str) -> None:
        old = self._nodes.pop(name, None)
        provider = None if old is None else old["spec"].get("providerID")
        if provider and self._instances.get(str(provider).rsplit("/", 1)[-1]) == name:
            del self._instances[str(provider).rsplit("/", 1)[-1]]
        hostname = None if old is None else old["metadata"]["labels"].get(HOSTNAME_LABEL)
        names = self._hostnames.get(hostname) if hostname else None
        if names is not None:
            names.discard(name)
            if not names:
                del self._hostnames[hostname]  # type: ignore[arg-type]  # not None: names came from it

    async def _watch(self, rv: str, timeout_s: float) -> str:
        return await self.kube.watch_nodes(
            rv, self._receive, opened=self._opened, timeout_s=timeout_s, keep=slim_event
        )

    def _apply(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            node = event.get("object") or {}
            name = (node.get("metadata") or {}).get("name")
            if name is None:
                continue
            if event.get("type") == "DELETED":
                self._drop(name)
            elif event.get("type") in ("ADDED", "MODIFIED"):
                self._put(node)  # slimmed by the watch thread (slim_event)
