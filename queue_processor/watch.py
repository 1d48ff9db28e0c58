"""Collections watched into local copies, one watch each for the process's life (:class:`Watched`, as client-go's
reflector: list, then watch from the last resourceVersion; a 410 Gone or an event not applied lists again).
:class:`NodeCache`: slim node copies (a cordon writes on the copy's resourceVersion; stale answers 409).
:class:`Departures`: pod deletions (metadata-only): a drain takes a :class:`Ticket` *before* listing its pods; while
the stream holds and fewer than :data:`MEMORY` deletions passed, every listed pod gone is known or will come. API
concepts: "Efficient detection of changes", "Resource versions", "Receiving resources as Tables or metadata only".
:class:`LeaseWatch`: the node Leases (NODE_LEASES), their holders and the events handed over (unwatched: waiters poll).
:class:`NodeFinder`: an instance's Node read from the API server (by PrivateDnsName, then the ``kubernetes.io/hostname``
label; or, with USE_PROVIDER_ID, ``spec.providerID``)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import structlog

from queue_processor import rest
from queue_processor.aws import InstanceInfo
from queue_processor.kube import LEASES, KubeClient
from queue_processor.outcomes import KubeError
from queue_processor.rest import REPLICA_RANK, URGENT_RANK
from queue_processor.rules import HANDOVER_PREFIX

log = structlog.get_logger(__name__)

#: The Node annotation holding what we changed on it (DESIGN.md rule 12), as :class:`CordonRecord` JSON.
RECORD_ANNOTATION = "queue-processor/cordoned"
#: The Node label (value ``"true"``) on every node that carries a record: what a label selector lists.
RECORD_LABEL = "queue-processor/cordoned"

#: One connection's ``timeoutSeconds`` (seconds), jittered up to a fifth down so replicas do not reconnect together.
WATCH_TIMEOUT_S = 300.0

#: After a failed connection: the first wait before the next (seconds), doubled up to :data:`RETRY_MAX_S`.
RETRY_S = 0.5
RETRY_MAX_S = 30.0

#: Answers meaning no watch (no RBAC right, or no watches): logged once, retried (the right may come later).
REFUSED = frozenset({401, 403, 404, 405})


class Watched:
    """The loop of one watch of ``path`` (:meth:`KubeClient.watch`, its ``options``): a subclass gives :meth:`_begin`
    and :meth:`_apply`, ``name`` names the task, ``refusal`` warns of a refusal. Raises nothing (it retries)."""

    name = "watch"
    refusal = "cannot watch"

    def __init__(self, kube: KubeClient, path: str, **options: Any) -> None:
        self.kube = kube
        self._path = path
        self._options = options
        self.live = False  # whether the watch's stream runs now (or resumes from where it stopped)
        self.refused: KubeError | None = None  # the API server's refusal of the read or the watch
        self.answered = asyncio.Event()  # set once the watch is open or refused (its first answer)
        self._rv = ""  # where the watch resumes: the first read's resourceVersion, then each event's
        self._task: asyncio.Task[None] | None = None
        self._started_at = 0.0  # the event loop's time at start()

    def start(self) -> None:
        """Start the watch (the controller does at start-up); idempotent."""
        if self._task is None:
            self._started_at = asyncio.get_running_loop().time()
            self._task = rest.spawn(self._run(), name=self.name)

    async def wait_first_answer(self, within_s: float) -> bool:
        """Wait up to ``within_s`` s after :meth:`start` for an answer: whether it came. Raises only CancelledError."""
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
        await rest.stop(self._task)
        self._task = None
        self.live = False

    async def _begin(self) -> str:
        """Read the collection's state; returns the resourceVersion to watch from. Raises :class:`KubeError`."""
        raise NotImplementedError

    def _apply(self, events: list[dict[str, Any]]) -> None:
        """The ``{"type", "object"}`` events of one chunk (called in the event loop)."""
        raise NotImplementedError

    def _set_live(self, live: bool) -> None:
        if live:
            self.answered.set()
        self.live = live

    async def _stream(self) -> bool:
        """One connection, each chunk's events applied as they come and the resourceVersion moved on: whether it
        ended as the server ends one (else an event was not applied: read everything again)."""
        timeout_s = WATCH_TIMEOUT_S * random.uniform(0.8, 1.0)
        watch = self.kube.watch(self._path, self._rv, timeout_s=timeout_s, **self._options)
        async with contextlib.aclosing(watch) as chunks:
            async for events in chunks:
                if not events:  # accepted
                    self._set_live(True)
                    continue
                try:
                    self._apply(events)
                except Exception:  # part of the chunk may be applied
                    log.exception("watch event not applied; reading again", watch=self.name)
                    self._rv = ""
                    self._set_live(False)
                    return False
                for event in events:
                    rv = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self._rv = str(rv)
        return True

    async def _run(self) -> None:
        URGENT_RANK.set(REPLICA_RANK)
        delay = RETRY_S
        while True:
            try:
                if not self._rv:
                    self._rv = await self._begin()
                if await self._stream():
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


#: Seconds after the copy's start a claim or cordon waits for its first answer before a GET of its node.
FIRST_COPY_WAIT_S = 5.0

#: The well-known label the kubelet sets to the node's hostname.
HOSTNAME_LABEL = "kubernetes.io/hostname"


def slim(node: dict[str, Any]) -> dict[str, Any]:
    """A Node's name, resourceVersion, labels, record; ``unschedulable``, ``taints``, ``providerID``, ``Ready``."""
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
    kept_spec = {key: spec[key] for key in ("providerID", "unschedulable") if spec.get(key)}
    if spec.get("taints"):
        kept_spec["taints"] = [dict(taint) for taint in spec["taints"]]
    slimmed: dict[str, Any] = {"metadata": kept, "spec": kept_spec}
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = [{"type": "Ready", "status": c.get("status")} for c in conditions if c.get("type") == "Ready"]
    if ready:
        slimmed["status"] = {"conditions": ready}
    return slimmed


def instance_of(provider_id: str) -> str:
    """The EC2 instance ID at the end of a node's ``spec.providerID`` (``aws:///<zone>/<instance ID>``)."""
    return str(provider_id).rsplit("/", 1)[-1]


def slim_event(event: dict[str, Any]) -> dict[str, Any] | None:
    """What the watch thread keeps of a node event (:data:`~queue_processor.rest.Keep`): added or modified as
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
    """The watched nodes, from :meth:`start` to :meth:`close`; while not live (retrying) the lookups answer ``None``."""

    name = "node-cache"
    refusal = "cannot list and watch nodes: cordons read each node first (grant nodes watch)"

    def __init__(self, kube: KubeClient) -> None:
        super().__init__(kube, "/api/v1/nodes", keep=slim_event)
        self._nodes: dict[str, dict[str, Any]] = {}
        self._hostnames: dict[str, set[str]] = {}  # kubernetes.io/hostname label → names of the nodes with it
        self._counted: dict[tuple[str, str], tuple[float, int]] = {}  # (label, value) → (when, nodes)
        self._instances: dict[str, str] = {}  # instance ID (the end of spec.providerID) → node name

    def get(self, name: str) -> dict[str, Any] | None:
        """The slim copy of node ``name``, or ``None`` when not live or unknown. Write with its resourceVersion."""
        return self._nodes.get(name) if self.live else None

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
        """An instance's node as :class:`~queue_processor.aws.NodeFinder` finds it (by ``provider_id``'s instance ID,
        else by name or hostname label: ``dns_name`` or its first label); ``None`` if not live."""
        if not self.live:
            return None
        if provider_id:
            name = self._instances.get(instance_of(provider_id))
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
        """Whether the live copy has no node for private DNS name ``dns_name`` (:meth:`find`); ``False`` if not live."""
        return self.live and self.find(dns_name) is None

    async def _begin(self) -> str:
        """Every node, page by page, as slim copies; the list's resourceVersion."""
        self._nodes, self._hostnames, self._instances = {}, {}, {}
        rv = ""
        async for items, version in self.kube.node_pages():
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
            self._instances[instance_of(provider)] = name

    def _drop(self, name: str) -> None:
        old = self._nodes.pop(name, None)
        if old is None:
            return
        provider = old["spec"].get("providerID")
        if provider and self._instances.get(instance_of(provider)) == name:
            del self._instances[instance_of(provider)]
        hostname = old["metadata"]["labels"].get(HOSTNAME_LABEL)
        names = self._hostnames.get(hostname, set())
        names.discard(name)
        if not names:
            self._hostnames.pop(hostname, None)

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


#: Deleted pods' uids remembered: a ticket older than this many deletions is not trusted (the drain lists again).
MEMORY = 10_000

Entry = tuple[tuple[str, str], Any]  # ((namespace, name), uid): a pod a drain waits for


@dataclass(frozen=True)
class Ticket:
    """The watch's :attr:`Departures.epoch` and deletions seen when a drain was about to list its pods."""

    epoch: int
    seen: int


@dataclass(eq=False)
class Waiting:
    """A drain's ``pending`` (key, uid) pods, last list's ticket, ``changed`` when a pod went or the watch moved;
    ``current`` once the deletions remembered at its ticket were applied (from then on each one reaches it)."""

    pending: set[Entry]
    ticket: Ticket | None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    current: bool = False


def deletion(event: dict[str, Any]) -> dict[str, Any] | None:
    """What the watch thread keeps of a pod event (:data:`~queue_processor.rest.Keep`): a deletion as
    ``{"type": "DELETED", "object": {"metadata": {"uid", "resourceVersion"}}}``, nothing of other events."""
    if event.get("type") != "DELETED":
        return None
    obj = event.get("object")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict) or metadata.get("uid") is None:
        return None
    kept = {"uid": metadata["uid"], "resourceVersion": metadata.get("resourceVersion")}
    return {"type": "DELETED", "object": {"metadata": kept}}


class Departures(Watched):
    """The watch of pod deletions, from :meth:`start` or :meth:`ticket` to :meth:`close` (failing: drains list)."""

    name = "pod-departures"
    refusal = "cannot watch pods: drains list their nodes' pods instead (grant pods watch)"

    def __init__(self, kube: KubeClient) -> None:
        super().__init__(kube, "/api/v1/pods", metadata_only=True, keep=deletion)
        self.memory = MEMORY
        self.epoch = 0  # starts from a fresh resourceVersion: a ticket of an earlier epoch is not trusted
        self.seen = 0  # deletions seen since the process started
        self._gone: dict[Any, int] = {}  # uid -> its number among the deletions seen, oldest first
        self._waiting: dict[Any, set[Waiting]] = {}

    def ticket(self) -> Ticket | None:
        """Take one before listing pods; ``None`` while the watch does not run (this call starts it)."""
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
        """Follow ``pending`` (copied) while the block runs; ``ticket`` was taken before the list that found them."""
        wait, uids = Waiting(set(pending), ticket), {uid for _, uid in pending}
        for uid in uids:
            self._waiting.setdefault(uid, set()).add(wait)
        self._forget_gone(wait)
        try:
            yield wait
        finally:
            for uid in uids:
                waits = self._waiting.get(uid, set())
                waits.discard(wait)
                if not waits:
                    self._waiting.pop(uid, None)

    def listed(self, wait: Waiting, ticket: Ticket | None, present: set[Entry]) -> None:
        """A list of the node's pods, taken after ``ticket``, found ``present``: what is not there has gone."""
        wait.pending &= present
        wait.ticket, wait.current = ticket, False
        self._forget_gone(wait)

    def _forget_gone(self, wait: Waiting) -> None:
        """Drop from ``wait.pending`` the pods seen deleted; mark it current when the memory covers its ticket."""
        for entry in [entry for entry in wait.pending if entry[1] in self._gone]:
            wait.pending.discard(entry)
            wait.changed.set()
        if self.covers(wait):
            wait.current = True

    async def _begin(self) -> str:
        """A fresh start: tickets taken before it are not trusted."""
        rv = await self.kube.pods_version()
        self.epoch += 1
        self.live = False
        self._set_live(True)
        return rv

    def _set_live(self, live: bool) -> None:
        """The stream runs (``True``) or is broken; either way every drain looks again."""
        if live != self.live:
            for waits in self._waiting.values():
                for wait in waits:
                    wait.changed.set()
        super()._set_live(live)

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
                self._forget_gone(wait)


def node_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def tagged_nodes(nodes: list[dict[str, Any]], instance_ids: set[str]) -> int:
    """How many ``nodes`` run one of ``instance_ids`` by ``spec.providerID``, as NTH counts them."""
    ids = (str((node.get("spec") or {}).get("providerID") or "").split("/") for node in nodes)
    return sum(len(parts) == 5 and parts[4].startswith("i-") and parts[4] in instance_ids for parts in ids)


class NodeFinder:
    """An instance's Node (module docstring); its providerID index is listed again after 30 s, 2 s after a miss."""

    def __init__(self, kube: KubeClient, *, use_provider_id: bool) -> None:
        self.kube = kube
        self.use_provider_id = use_provider_id
        self._by_instance: dict[str, str] = {}  # instance ID (the end of spec.providerID) → node name
        self._indexed_at = -1e18
        self._index_lock = asyncio.Lock()

    async def find(self, info: InstanceInfo) -> dict[str, Any] | None:
        """The Node (a dict), or ``None`` when the cluster has none for the instance."""
        if self.use_provider_id:
            return await self._by_provider_id(info)
        if not info.private_dns_name:
            return None
        node = await self.kube.get_node(info.private_dns_name)
        if node is not None:
            return node
        short = info.private_dns_name.split(".")[0]
        nodes = await self.kube.list_nodes(f"{HOSTNAME_LABEL} in ({info.private_dns_name},{short})")
        return nodes[0] if nodes else None

    async def _by_provider_id(self, info: InstanceInfo) -> dict[str, Any] | None:
        for refresh in (False, True):  # the index as it is, then read again after a miss
            async with self._index_lock:
                age = time.monotonic() - self._indexed_at
                if age > 30.0 or (refresh and age > 2.0):
                    nodes = await self.kube.list_nodes(cached=True)
                    self._by_instance = {
                        instance_of((n.get("spec") or {}).get("providerID", "")): n["metadata"]["name"]
                        for n in nodes
                    }
                    self._indexed_at = time.monotonic()
            # The providerID's instance ID: some providers omit the zone (aws:///<instance ID>).
            name = self._by_instance.get(info.instance_id)
            if name is not None:
                return await self.kube.get_node(name)
        return None


#: The annotation of a node Lease naming the replica Lease it is held by (held while that one is renewed).
REPLICA_ANNOTATION = "queue-processor/replica-lease"

#: Without a live watch: how often a replica waiting for a node's Lease tries its claim again (seconds).
UNWATCHED_POLL_S = 5.0


def holder_of(lease: dict[str, Any] | None) -> str | None:
    holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
    return str(holder) if holder else None


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
