"""The nodes as one watch sees them (listed in pages, then watched, as an informer does), as slim copies.

A cordon's first attempt writes with the copy's resourceVersion instead of a GET (a stale copy answers 409 and the
retry reads). The ``nth_tagged_nodes`` gauge and the return check read it too. Only a live copy is handed out.
API concepts: "Efficient detection of changes", "Retrieving large results sets in chunks", "Resource versions"."""

from __future__ import annotations

import time
from typing import Any

from queue_processor.drain.record import RECORD_ANNOTATION
from queue_processor.kube import KubeClient
from queue_processor.watch.watched import WATCH_TIMEOUT_S, Watched

__all__ = ["FIRST_COPY_WAIT_S", "NodeCache", "slim", "slim_event"]

#: Nodes per page of the start-up list.
PAGE = 500

#: How long after the copy's start a claim or cordon waits for its first answer (seconds) before it reads its
#: node with a GET: at start-up those urgent GETs would hold the copy's own pages back (docs/benchmarks.md).
FIRST_COPY_WAIT_S = 5.0

#: The well-known label the kubelet sets to the node's hostname.
HOSTNAME_LABEL = "kubernetes.io/hostname"


def slim(node: dict[str, Any]) -> dict[str, Any]:
    """The part of a Node we read (pure): name, resourceVersion, labels, our record annotation; ``spec``'s
    ``unschedulable``, ``taints``, ``providerID``; the ``Ready`` condition's status. Idempotent."""
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
    """What the watch thread keeps of a node event (:data:`~queue_processor.kube.Keep`): added or modified as
    :func:`slim`, deleted as name and resourceVersion, else nothing. Raises what :func:`slim` raises."""
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
    """The watched nodes, started by :meth:`start`, ended by :meth:`close`. Raises nothing: a failed list or
    watch is retried with backoff, and meanwhile the lookups answer ``None``."""

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
        """The slim copy of node ``name``, or ``None`` when not live or unknown. Write with its resourceVersion."""
        if not self.live:
            return None
        return self._nodes.get(name)

    def all(self) -> list[dict[str, Any]] | None:
        """Every node's slim copy, or ``None`` while the copy is not current."""
        return list(self._nodes.values()) if self.live else None

    def labelled(self, label: str, value: str, *, ttl_s: float = 60.0) -> int | None:
        """How many nodes carry ``label=value``, counted at most every ``ttl_s`` seconds; ``None`` while not live."""
        if not self.live:
            return None
        now = time.monotonic()
        counted = self._counted.get((label, value))
        if counted is None or now - counted[0] >= ttl_s:
            size = sum(1 for node in self._nodes.values() if node["metadata"]["labels"].get(label) == value)
            counted = self._counted[(label, value)] = (now, size)
        return counted[1]

    def find(self, dns_name: str, provider_id: str = "") -> dict[str, Any] | None:
        """An instance's node as :class:`~queue_processor.nodes.NodeFinder` finds it (by ``provider_id``'s instance ID,
        else by name or hostname label: ``dns_name`` or its first label); ``None`` if not live."""
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
        """Whether the live copy has no node for private DNS name ``dns_name`` (by name or hostname label, as
        :meth:`find`); ``False`` while not live."""
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
