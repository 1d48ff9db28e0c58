"""Per-node coordination.k8s.io/v1 Leases: with several replicas consuming one queue, the drain of a node is
exclusive (DESIGN.md rule 6).

Two kinds of Lease live in the replica's namespace:

- the replica's own, ``queue-processor.replica.<identity>`` (:class:`ReplicaLease`), renewed every third of
  its duration (NODE_LEASE_DURATION_SEC) while the replica holds any node; its ``holderIdentity`` is
  :attr:`NodeLeases.holder`, ``<identity>/<incarnation>``, the incarnation a token drawn when the process
  starts (a container restarted in the same pod is another incarnation: what its predecessor held is free once
  this process writes the Lease, at its first claim);
- a node's, ``queue-processor-<node>``, which a replica :meth:`NodeLeases.claim`\\ s before PreDrain and
  writes twice in all: created (or taken) with the same ``holderIdentity``, the annotation
  :data:`REPLICA_ANNOTATION` naming the replica's Lease and the labels :data:`HOLDER_LABEL` and
  :data:`LEASE_LABEL`, and released (deleted) when the node's handling ends: with the other node Leases the
  replica released within :data:`RELEASE_BATCH_S`, in one ``deletecollection`` request whose label selector
  names the holder and each Lease (a storm's releases cost a request per batch, not per node). It is held
  for as long as that replica Lease still names the same holder and is renewed: one renewal per replica
  every third of the duration, not one per node being handled (a storm's drains, each lasting a minute or
  more, cost a node Lease write every 20 s each before).

Another replica takes a node Lease over when it is released, or when the replica Lease it names is gone,
names another holder, or was not renewed for its ``leaseDurationSeconds``; a node Lease without the
annotation, or whose holder is not the replica it names (an earlier version's, which renews it and may keep an
annotation it found), when its own ``renewTime`` + ``leaseDurationSeconds`` is past. A taker writes its own
holder label, so that no batch of the replica it took the Lease from selects it. A release the API server did
not answer is made again, alone, at each renewal. Every write goes
through the API server's optimistic concurrency (create → 409 AlreadyExists, replace with a stale
resourceVersion → 409 Conflict: another replica won). A node Lease this version writes says
``leaseDurationSeconds`` :data:`HELD_BY_REPLICA_S`: a replica of an earlier version (a rolling upgrade), which
judges a node Lease by its own renewal, takes none of ours that is still being handled.

When the replica Lease is not renewed for a whole duration (the API server did not answer, or the process was
paused: a timer ends the claims at the lapse even while a renewal hangs), is renewed only by a write answered
after that, or is found deleted or rewritten by someone else, every node Lease held until then may have been
taken: each such :class:`Claim` is lost (``lost`` set, :class:`ClaimLost` from :meth:`Claim.confirm`) and its
operation requeued (EarlyExit); a replica that finds a node Lease held by another lets its message be
requeued: whatever the holder does, a later retry finds the node drained and finishes at once.
:meth:`NodeLeases.close` (at shutdown, after the operations ended) deletes the replica Lease.

"Leases" (Kubernetes concepts, coordination.k8s.io/v1).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from queue_processor import tasks
from queue_processor.config import default
from queue_processor.kube import AFTER_CORDONS, REPLICA_RANK, KubeClient, NotSentError, rank_urgent
from queue_processor.lease_watch import REPLICA_ANNOTATION, LeaseWatch
from queue_processor.outcomes import ClaimLost, KubeError

__all__ = [
    "HELD_BY_REPLICA_S",
    "HOLDER_LABEL",
    "LEASE_LABEL",
    "RELEASE_BATCH_MAX",
    "RELEASE_BATCH_S",
    "RENEW_ATTEMPTS",
    "RENEW_RETRY_S",
    "REPLICA_ANNOTATION",
    "Claim",
    "ClaimLost",
    "NodeLeases",
    "ReplicaLease",
    "lease_name",
    "replica_lease_name",
]

log = structlog.get_logger("queue_processor.leases")

_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"

#: How many times one write re-reads the Lease and writes again after a 409 that left it ours.
RENEW_ATTEMPTS = 3

#: Seconds before a failed renewal of the replica Lease is tried again (or a renewal period, when shorter).
RENEW_RETRY_S = 2.0

#: The annotation of a node Lease naming the replica Lease it is held by.

#: ``leaseDurationSeconds`` of a node Lease held by a replica Lease: what an earlier version, which judges a
#: node Lease by its own ``renewTime``, reads as its duration (an hour: longer than any drain).
HELD_BY_REPLICA_S = 3600

#: The label of a node Lease naming its holder (:func:`label_value` of ``holderIdentity``, which a label value
#: cannot hold as it is): what a batch of releases selects the replica's own Leases by.
HOLDER_LABEL = "queue-processor/holder"

#: The label of a node Lease naming the Lease itself (:func:`label_value` of its name, which may be longer than
#: a label value): what a batch of releases selects each Lease by (``in (…)``).
LEASE_LABEL = "queue-processor/lease"

#: Seconds a released node Lease waits for others to be released with it (one request for all).
RELEASE_BATCH_S = 0.5

#: The most node Leases one request deletes (the selector names each in 21 characters of the URL).
RELEASE_BATCH_MAX = 50


def _object_name(name: str) -> str:
    return re.sub(r"[^a-z0-9.-]", "-", name.lower())[:253].rstrip(".-")


def lease_name(node: str) -> str:
    """``queue-processor-<node>``, made a valid object name (lower case, at most 253 characters)."""
    return _object_name("queue-processor-" + node)


def replica_lease_name(identity: str) -> str:
    """``queue-processor.replica.<identity>``, made a valid object name: never a node Lease's name (those have
    a hyphen where this has its first dot)."""
    return _object_name("queue-processor.replica." + identity)


def label_value(text: str) -> str:
    """A label value standing for ``text`` (a holder identity or a Lease name, which may not fit one): the 20
    hexadecimal digits of its BLAKE2b digest."""
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.strptime(value, _MICRO).replace(tzinfo=UTC)
    except ValueError:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _holder(lease: dict[str, Any] | None) -> str | None:
    holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
    return str(holder) if holder else None


def _expired(lease: dict[str, Any], default_s: int) -> bool:
    """Whether the Lease's last renewal (or acquisition) + its ``leaseDurationSeconds`` is past."""
    spec = lease.get("spec") or {}
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = int(spec.get("leaseDurationSeconds") or default_s)
    return renewed is None or renewed + timedelta(seconds=duration) < _now()


def _new_lease(
    name: str,
    namespace: str,
    holder: str,
    duration_s: int,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Lease to create, held by ``holder`` from now for ``duration_s`` seconds."""
    now = _now().strftime(_MICRO)
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


def _held(
    lease: dict[str, Any],
    holder: str,
    duration_s: int,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``lease`` as ``holder`` writes it (on its resourceVersion): renewed now, acquired now (one transition
    more) when it was someone else's, ``annotations`` and ``labels`` added."""
    now = _now().strftime(_MICRO)
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


class ReplicaLease:
    """This replica's own Lease (see the module): written before the first claim, renewed every
    ``renew_every_s`` while claims are held (one write in flight at a time, shared with every
    :meth:`Claim.confirm` and claim), deleted by :meth:`close`. ``renewed_at`` is the monotonic time the last
    write that succeeded was sent; ``epoch`` counts the lapses: a claim made in an earlier epoch is lost."""

    def __init__(self, leases: NodeLeases) -> None:
        self._leases = leases
        self.name = replica_lease_name(leases.identity)
        self.lease: dict[str, Any] | None = None
        self.renewed_at = -math.inf
        self.epoch = 0
        self.claims: set[Claim] = set()
        self._claiming = 0  # claims in progress, which may be waiting for the renewal in flight
        self._renewal: asyncio.Task[KubeError | None] | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._lapse: asyncio.TimerHandle | None = None
        self.unreleased: dict[str, dict[str, Any]] = {}
        """Node Leases whose release failed (name → the Lease as last written): released again at each
        renewal, so that a Lease still naming us is not held for as long as we hold other nodes."""

    def age(self) -> float:
        """Seconds since the last renewal that succeeded was sent (infinite before the first)."""
        return self._leases.clock() - self.renewed_at

    async def renew(self) -> KubeError | None:
        """Write the Lease now, or wait for the write in flight and take its result: ``None`` when it was
        written, else the error (logged). A lapse found on the way ends the epoch first."""
        if self._renewal is None or self._renewal.done():
            self._renewal = asyncio.create_task(self._renew_once(), name=f"renew-{self.name}")
        # Shielded: a caller cancelled mid-renewal (its eviction stopped) leaves the write to the others.
        return await asyncio.shield(self._renewal)

    async def fresh(self) -> None:
        """Renew the Lease unless it was renewed within a renewal period. Raises the :class:`KubeError` that
        kept it from being written."""
        if self.age() >= self._leases.renew_every_s:
            error = await self.renew()
            if error is not None and self.age() >= self._leases.renew_every_s:
                raise error

    def check(self) -> None:
        """End the epoch when the Lease was not renewed for a whole duration."""
        if self.age() >= self._leases.duration_s:
            self._end_epoch(
                f"the replica's Lease {self.name} was not renewed for {self._leases.duration_s} s"
            )

    def _end_epoch(self, why: str) -> None:
        self.epoch += 1
        for claim in list(self.claims):
            claim._mark_lost(why)

    async def _renew_once(self) -> KubeError | None:
        rank_urgent(REPLICA_RANK)  # a renewal asked for by an operation is still the replica's
        leases = self._leases
        self.check()
        sent = leases.clock()
        try:
            for _ in range(RENEW_ATTEMPTS):
                try:
                    if self.lease is None:
                        self.lease = await leases.kube.create_lease(
                            leases.namespace,
                            _new_lease(self.name, leases.namespace, leases.holder, leases.duration_s),
                        )
                    else:
                        self.lease = await leases.kube.replace_lease(
                            leases.namespace, _held(self.lease, leases.holder, leases.duration_s)
                        )
                except KubeError as exc:
                    if exc.status not in (404, 409) or (exc.status == 404 and self.lease is None):
                        raise
                    current = await leases.kube.get_lease(leases.namespace, self.name)
                    if _holder(current) != leases.holder and _holder(self.lease) == leases.holder:
                        # Ours, and no longer: whatever it named may have been taken.
                        self._end_epoch(
                            f"the replica's Lease {self.name} was "
                            + (f"rewritten by {_holder(current)!r}" if current is not None else "deleted")
                        )
                    self.lease = current  # written again on its resourceVersion (or created again)
                    continue
                if leases.clock() - self.renewed_at >= leases.duration_s:
                    # Landed after the last renewal had lapsed: another replica may have read the Lease
                    # expired before this write and taken what it named.
                    self._end_epoch(f"the replica's Lease {self.name} was renewed only after it had lapsed")
                self.renewed_at = sent
                self._watch_lapse()
                return None
            raise KubeError(409, "Conflict", f"Lease {self.name} kept changing under {RENEW_ATTEMPTS} writes")
        except KubeError as exc:
            log.warning("replica lease renewal failed", lease=self.name, error=str(exc))
            return exc

    async def _renew_forever(self) -> None:
        rank_urgent(AFTER_CORDONS)  # its releases sent again; each renewal ranks itself (_renew_once)
        leases = self._leases
        while True:
            due = leases.renew_every_s - self.age()
            if due > 0:
                await asyncio.sleep(due)
            elif await self.renew() is not None:
                await asyncio.sleep(min(leases.renew_every_s, RENEW_RETRY_S))
            else:
                for name, lease in list(self.unreleased.items()):
                    if await leases.clear(lease) and self.unreleased.get(name) is lease:
                        del self.unreleased[name]  # not one released again meanwhile

    def _unwatch_lapse(self) -> None:
        if self._lapse is not None:
            self._lapse.cancel()
            self._lapse = None

    def _watch_lapse(self) -> None:
        """End the epoch when the Lease lapses while claims are held, even while a renewal hangs (a claim is
        then lost at once, not at its next confirmation)."""
        self._unwatch_lapse()
        if self.claims:
            wait = max(0.0, self._leases.duration_s - self.age())
            self._lapse = asyncio.get_running_loop().call_later(wait, self.check)

    def hold(self, claim: Claim) -> None:
        """Count ``claim`` among those the renewal keeps (it starts with the first)."""
        self.claims.add(claim)
        if self._renewer is None or self._renewer.done():
            self._renewer = tasks.spawn(self._renew_forever(), name=f"lease-{self.name}")
        if self._lapse is None:
            self._watch_lapse()

    async def drop(self, claim: Claim) -> None:
        """Stop counting ``claim``; the last one stops the renewal (and a write in flight that no claim in
        progress waits for)."""
        self.claims.discard(claim)
        if not self.claims:
            self._unwatch_lapse()
            renewer, self._renewer = self._renewer, None
            renewal = None
            if self._claiming == 0:  # a claim that comes meanwhile starts a write of its own
                renewal, self._renewal = self._renewal, None
            await tasks.stop(renewer, renewal)

    async def close(self, timeout_s: float = 1.0) -> None:
        """Stop renewing and delete the Lease if it is ours, so that what it still held is free at once; the
        deletion is waited for at most ``timeout_s`` seconds (the shutdown's budget). Errors are logged, not
        raised."""
        self._end_epoch(f"the replica's Lease {self.name} was given up (shutdown)")
        self._unwatch_lapse()
        renewer, self._renewer = self._renewer, None
        renewal, self._renewal = self._renewal, None
        leases = self._leases
        try:
            async with asyncio.timeout(timeout_s):  # a cancelled write waits for its answer: bounded here
                await tasks.stop(renewer, renewal)
                if _holder(self.lease) == leases.holder:
                    await leases.kube.delete_lease(leases.namespace, self.name)
                    self.lease = None
        except (KubeError, TimeoutError) as exc:
            log.warning("replica lease deletion failed", lease=self.name, error=str(exc) or "timed out")


class Claim:
    """A held node Lease; :meth:`release` it when the node's handling ends.

    ``lost`` is set when the replica Lease lapses (or is found deleted or rewritten) while the claim is held:
    another replica may have taken the node. The operation stops when ``lost`` is set (EarlyExit).
    :meth:`confirm` is called before anything that must not be done twice (an eviction, a lifecycle
    completion): when the replica Lease's last renewal is older than a renewal period (a paused process wakes
    up), it is renewed first, and :class:`ClaimLost` raised when this claim did not outlive it."""

    def __init__(self, leases: NodeLeases, lease: dict[str, Any], epoch: int) -> None:
        self._leases = leases
        self.lease = lease
        self.epoch = epoch
        self.lost = asyncio.Event()
        leases.replica.hold(self)
        if epoch != leases.replica.epoch:
            self._mark_lost(f"the replica's Lease {leases.replica.name} lapsed while the node's was claimed")

    @property
    def name(self) -> str:
        """The node Lease's name."""
        return str(self.lease["metadata"]["name"])

    def _mark_lost(self, why: str) -> None:
        if not self.lost.is_set():
            log.warning("lease lost", lease=self.name, why=why)
            self.lost.set()

    async def confirm(self) -> None:
        """Make sure the node Lease is still ours: the replica Lease is renewed first (or the renewal in
        flight waited for) when its last renewal is older than a renewal period. Raises :class:`ClaimLost`
        when the claim is lost."""
        replica = self._leases.replica
        if not self.lost.is_set() and replica.age() >= self._leases.renew_every_s:
            await replica.renew()
            replica.check()
        if self.epoch != replica.epoch:
            self._mark_lost(f"the replica's Lease {replica.name} lapsed")
        if self.lost.is_set():
            raise ClaimLost(f"Lease {self.name} was lost")

    async def release(self) -> None:
        """Give the node Lease up. A claim still held is deleted with the others this replica releases within
        :data:`RELEASE_BATCH_S` (:meth:`NodeLeases.flush` sends them at once and waits): the node is free
        within that. A lost claim's Lease is released alone (:meth:`NodeLeases.clear`: one another replica
        took is left to it). One the API server did not answer is released again at each renewal while this
        replica holds other nodes (holding none, its own Lease lapses and frees it). The last claim released
        stops the replica Lease's renewal. Errors are logged, not raised."""
        leases = self._leases
        await leases.replica.drop(self)
        if (
            leases.batches
            and not self.lost.is_set()
            and self.epoch == leases.replica.epoch
            and leases._batchable(self.lease)
        ):
            leases._release_later(self.lease, self.epoch)
        elif not await leases.clear(self.lease):  # retried at each renewal while we hold other nodes
            leases.replica.unreleased[self.name] = self.lease

    async def __aenter__(self) -> Claim:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class NodeLeases:
    """Node Lease claims for ``identity`` (this replica: its pod name) in ``namespace``, held while the replica
    Lease is renewed: it lapses ``duration_s`` whole seconds (``leaseDurationSeconds`` is an int32) after its
    last renewal, renewed every ``renew_every_s`` seconds (default: a third of the duration). ``incarnation``
    (default: random) tells this process from an earlier one of the same pod; ``clock`` returns monotonic
    seconds."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        identity: str,
        duration_s: int = default("node_lease_duration_sec"),
        renew_every_s: float | None = None,
        incarnation: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.namespace = namespace or "default"
        self.identity = identity
        self.holder = f"{identity}/{incarnation or secrets.token_hex(4)}"
        self.duration_s = int(duration_s)
        self.renew_every_s = renew_every_s if renew_every_s is not None else self.duration_s / 3
        self.clock = clock
        self.replica = ReplicaLease(self)
        self._claiming: Counter[str] = Counter()  # node Lease name → claims of it being made
        self._pending: dict[
            str, tuple[dict[str, Any], int]
        ] = {}  # released, not yet sent: name → (Lease, epoch)
        self._sending: dict[str, asyncio.Future[None]] = {}  # in a batch being sent: name → its answer
        self._hurry = asyncio.Event()  # send the pending releases without waiting (a full batch, a flush)
        self._flushing = 0  # flush() calls waiting
        self._releaser: asyncio.Task[None] | None = None
        self._lapsed: dict[str, float] = {}  # holder → clock() when its replica Lease was found lapsed
        self._live: dict[str, float] = {}  # holder → clock() when its replica Lease was found current
        self.watch = LeaseWatch(kube, self.namespace, LEASE_LABEL)
        """The watched node Leases of the namespace (:mod:`queue_processor.lease_watch`), started by the
        controller (:meth:`LeaseWatch.start`) and stopped by :meth:`close`."""
        self.batches = True
        """Whether releases go in batches: set false when the API server refuses ``deletecollection`` (a Role
        without the verb: the releases then go one by one, logged once)."""

    async def claim(self, node: str) -> Claim | None:
        """The node's Lease for this replica, or ``None`` when another replica holds it. The replica Lease is
        written first when its last renewal is older than a renewal period (a storm's first claim: one more
        request per replica). Raises :class:`KubeError` when the API server cannot be reached."""
        name = lease_name(node)
        replica = self.replica
        replica._claiming += 1
        # An earlier release not answered, or not yet sent: this claim takes the Lease over (the release goes
        # back if it fails); one being sent is waited for (it deletes the Lease: this claim creates it again).
        pending = self._pending.pop(name, None)
        unreleased = replica.unreleased.pop(name, None) or (pending[0] if pending else None)
        self._claiming[name] += 1
        claimed: Claim | None = None
        try:
            sending = self._sending.get(name)
            if sending is not None:
                await asyncio.shield(sending)
            await replica.fresh()
            epoch = replica.epoch
            existing: dict[str, Any] | None = None
            for _ in range(2):  # a Lease deleted between the refused create and the read is created again
                try:  # created first: a node's first claim (a storm's) is one request, not a read and a create
                    claimed = Claim(
                        self,
                        await self.kube.create_lease(
                            self.namespace,
                            _new_lease(
                                name,
                                self.namespace,
                                self.holder,
                                HELD_BY_REPLICA_S,
                                self._annotations(),
                                self._labels(name),
                            ),
                        ),
                        epoch,
                    )
                    return claimed
                except KubeError as exc:
                    if exc.status != 409:  # 409 AlreadyExists: an earlier claim's Lease, or another replica's
                        raise
                existing = await self.kube.get_lease(self.namespace, name)
                if existing is not None:
                    break
            if existing is None or await self._held_by_another(existing):
                return None
            try:
                claimed = Claim(
                    self,
                    await self.kube.replace_lease(
                        self.namespace,
                        _held(
                            existing, self.holder, HELD_BY_REPLICA_S, self._annotations(), self._labels(name)
                        ),
                    ),
                    epoch,
                )
                return claimed
            except KubeError as exc:
                if exc.status == 409:  # another replica created or took it first
                    return None
                raise
        finally:
            replica._claiming -= 1
            self._claiming[name] -= 1
            if self._claiming[name] <= 0:
                del self._claiming[name]
            if claimed is None and unreleased is not None:
                replica.unreleased.setdefault(name, unreleased)

    def held_elsewhere(self, node: str) -> bool:
        """Whether another replica holds node ``node``'s Lease, as the watched copy shows (:attr:`watch`):
        ``True`` too while that copy is not current, unless the API server refused the watch (then nothing is
        known, and ``False``); ``False`` for a holder :meth:`held_elsewhere_now` found lapsed within the last
        renewal period. The check for instances back in service, and a launch, leave such a node alone: its
        drain may run, or wait for its turn, on that replica."""
        if not self.watch.live:
            return self.watch.refused is None
        holder = self.watch.holder(lease_name(node))
        if holder is None or holder == self.holder:
            return False
        lapsed = self._lapsed.get(holder)
        return lapsed is None or self.clock() - lapsed >= self.renew_every_s

    async def held_elsewhere_now(self, node: str) -> bool:
        """:meth:`held_elsewhere`, and its holder's replica Lease confirmed current, as a claim judges it: a
        replica killed while it held the node leaves its node Lease behind, and the node is free once that
        replica's own Lease lapsed (or was deleted), or when the holder was our own pod's earlier process. One
        GET of a holder's replica Lease per renewal period at most (its answer is kept, by holder). An error,
        a copy not current, or a Lease of an earlier version (no replica annotation): held."""
        if not self.held_elsewhere(node):
            return False
        name = lease_name(node)
        holder, replica = self.watch.holder(name), self.watch.replica(name)
        if holder is None or replica is None:
            return True
        now = self.clock()
        seen = self._live.get(holder)
        if seen is not None and now - seen < self.renew_every_s:
            return True
        identity, slash, _ = holder.rpartition("/")
        if replica == self.replica.name:
            lapsed = True  # our pod's earlier process: what it held is ours
        elif not slash or replica_lease_name(identity) != replica:
            return True
        else:
            try:
                lease = await self.kube.get_lease(self.namespace, replica)
            except KubeError:
                return True
            lapsed = lease is None or _holder(lease) != holder or _expired(lease, self.duration_s)
        for found in (self._lapsed, self._live):  # holders of other processes come and go: keep the recent
            for old in [key for key, at in found.items() if now - at >= self.duration_s]:
                del found[old]
        (self._lapsed if lapsed else self._live)[holder] = now
        if lapsed:
            log.info("node Lease held by a replica that is gone: the node is free", lease=name, holder=holder)
        return not lapsed

    async def clear(self, lease: dict[str, Any] | None) -> bool:
        """Release a node Lease as we last wrote it: deleted, on the precondition that it is still at that
        resourceVersion (nothing is left behind for a node that is gone, and the node's next claim is one
        create); a 409 re-reads it and deletes it while it is still ours. A Lease a claim of this replica holds
        or is making is left to that claim (a release made again at a renewal, after the node was claimed again).
        ``True`` when it is released, gone, or no longer ours (another replica took it: left to it; or claimed
        again here), ``False`` when the API server did not answer (logged)."""
        for _ in range(RENEW_ATTEMPTS):
            if lease is None or _holder(lease) != self.holder:
                return True
            if self._claimed(str((lease.get("metadata") or {}).get("name"))):
                return True
            metadata = lease.get("metadata") or {}
            name = str(metadata.get("name"))
            try:
                await self.kube.delete_lease(
                    self.namespace, name, resource_version=metadata.get("resourceVersion")
                )
                return True
            except KubeError as exc:
                if exc.status != 409:
                    log.warning("lease release failed", lease=name, error=str(exc))
                    return False
            try:
                lease = await self.kube.get_lease(self.namespace, name)
            except KubeError as exc:
                log.warning("lease release failed", lease=name, error=str(exc))
                return False
        return False

    def _batchable(self, lease: dict[str, Any]) -> bool:
        """Whether ``lease`` carries this replica's labels as written here (a batch's selector finds it)."""
        metadata = lease.get("metadata") or {}
        return (metadata.get("labels") or {}) == {
            **(metadata.get("labels") or {}),
            **self._labels(metadata["name"]),
        }

    def _release_later(self, lease: dict[str, Any], epoch: int) -> None:
        """Queue ``lease`` (held by a claim of ``epoch`` just given up) for the next batch of releases."""
        self._pending[str(lease["metadata"]["name"])] = (lease, epoch)
        if len(self._pending) >= RELEASE_BATCH_MAX:
            self._hurry.set()
        if self._releaser is None or self._releaser.done():
            self._releaser = tasks.spawn(self._release_batches(), name="lease-releases")

    async def _release_batches(self) -> None:
        """Send the pending releases, a batch at most every :data:`RELEASE_BATCH_S` (at once when a batch is
        full or a flush waits), until none is left."""
        rank_urgent(AFTER_CORDONS)
        while self._pending:
            if not self._hurry.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RELEASE_BATCH_S):
                        await self._hurry.wait()
            names = list(self._pending)[:RELEASE_BATCH_MAX]
            batch = {name: self._pending.pop(name) for name in names}
            if not self._flushing and len(self._pending) < RELEASE_BATCH_MAX:
                self._hurry.clear()
            await self._send(batch)

    async def _send(self, batch: dict[str, tuple[dict[str, Any], int]]) -> None:
        """Delete ``batch``'s Leases in one request: selected by this replica's holder label and each Lease's
        own (a Lease another replica of this version took carries its holder label: not selected). The request
        is sent only while the replica Lease was renewed within two thirds of its duration, in the epoch the
        batch was made in: before another replica can read it lapsed and take a Lease over (one of an earlier
        version keeps the labels it found). A Lease released in an epoch that has ended since, or whose label
        another Lease this replica holds shares, is released alone (:meth:`clear`: on the resourceVersion we
        wrote), and so is every Lease of a batch not sent or not answered; one that fails alone too is released
        again at each renewal. A claim waiting for a Lease of the batch (:meth:`claim`) waits for its own
        answer only."""
        self.replica.check()
        loop = asyncio.get_running_loop()
        epoch = self.replica.epoch
        held = {label_value(claim.name) for claim in self.replica.claims} | {
            label_value(name) for name in self._claiming
        }
        alone = {
            name: lease
            for name, (lease, released_in) in batch.items()
            if released_in != epoch or label_value(name) in held
        }
        together = {name: lease for name, (lease, _) in batch.items() if name not in alone}
        answers: dict[str, asyncio.Future[None]] = {name: loop.create_future() for name in alone}
        batch_answer: asyncio.Future[None] = loop.create_future()
        answers.update(dict.fromkeys(together, batch_answer))
        self._sending.update(answers)
        try:
            if together:
                selector = (
                    f"{HOLDER_LABEL}={label_value(self.holder)},"
                    f"{LEASE_LABEL} in ({','.join(sorted(label_value(name) for name in together))})"
                )
                try:
                    await self.kube.delete_leases(
                        self.namespace,
                        selector,
                        sending=lambda: (
                            self.replica.epoch == epoch and self.replica.age() < self.duration_s * 2 / 3
                        ),
                    )
                except NotSentError:
                    await self._clear_each(together)
                except KubeError as exc:
                    if exc.status in (403, 404, 405) and self.batches:
                        self.batches = False
                        log.warning(
                            "node Lease releases go one by one: deletecollection leases refused",
                            error=str(exc),
                            rbac="coordination.k8s.io leases deletecollection",
                        )
                    else:
                        log.warning("lease releases failed", leases=len(together), error=str(exc))
                    await self._clear_each(together)
                self._answer(together, batch_answer)
            for name, lease in alone.items():
                try:
                    await self._clear_each({name: lease})
                finally:
                    self._answer([name], answers[name])
        finally:
            for name, answer in answers.items():
                self._answer([name], answer)

    async def _clear_each(self, leases: dict[str, dict[str, Any]]) -> None:
        """Release each of ``leases`` alone (:meth:`clear`); one the API server did not answer is released again
        at each renewal."""
        for name, lease in leases.items():
            if not await self.clear(lease):
                self.replica.unreleased[name] = lease

    def _answer(self, names: Any, answer: asyncio.Future[None]) -> None:
        """The releases of ``names`` are answered: a claim waiting for one goes on."""
        for name in names:
            if self._sending.get(name) is answer:
                del self._sending[name]
        if not answer.done():
            answer.set_result(None)

    async def flush(self) -> None:
        """Send the node Lease releases not yet sent now, and wait until every release made so far is
        answered (what the sending ended with is logged, not raised)."""
        self._flushing += 1
        self._hurry.set()
        try:
            while self._releaser is not None and not self._releaser.done():
                await asyncio.wait({self._releaser})
        finally:
            self._flushing -= 1
            if not self._flushing:
                self._hurry.clear()

    def _claimed(self, name: str) -> bool:
        """Whether a claim of this replica holds node Lease ``name`` or is being made."""
        return name in self._claiming or any(claim.name == name for claim in self.replica.claims)

    async def _held_by_another(self, lease: dict[str, Any]) -> bool:
        holder = _holder(lease)
        if holder is None or holder == self.holder:
            return False
        named = ((lease.get("metadata") or {}).get("annotations") or {}).get(REPLICA_ANNOTATION)
        identity, slash, _ = holder.rpartition("/")
        if not named or not slash or replica_lease_name(identity) != named:
            # An earlier version's Lease (renewed by its holder; it may have kept an annotation of ours it
            # found on the Lease): judged by its own renewal.
            return not _expired(lease, self.duration_s)
        if named == self.replica.name:  # our pod's earlier process: what it held is ours to take
            return False
        replica = await self.kube.get_lease(self.namespace, named)
        return replica is not None and _holder(replica) == holder and not _expired(replica, self.duration_s)

    def _annotations(self) -> dict[str, str]:
        return {REPLICA_ANNOTATION: self.replica.name}

    def _labels(self, name: str) -> dict[str, str]:
        return {HOLDER_LABEL: label_value(self.holder), LEASE_LABEL: label_value(name)}

    async def close(self, timeout_s: float = 1.0) -> None:
        """At shutdown, after the operations ended: send the node Lease releases not yet sent, stop the replica
        Lease's renewal and delete it (waiting at most ``timeout_s`` seconds in all for the API server; a
        release not sent by then names a replica Lease that is gone: free to any replica)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s / 2  # the rest is the replica Lease's
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await self.flush()
        try:
            # A release cancelled mid-request waits for its answer: the timeout's cancellation ends that.
            async with asyncio.timeout_at(max(deadline, loop.time() + timeout_s / 20)):
                await tasks.stop(self._releaser)
        except TimeoutError:
            log.warning("node lease releases abandoned at shutdown", leases=len(self._sending))
        self._pending.clear()
        await self.watch.close()
        await self.replica.close(max(timeout_s / 20, deadline + timeout_s / 2 - loop.time()))
