"""Per-node coordination.k8s.io/v1 Leases ("Leases") making a node's drain exclusive among replicas (DESIGN.md rule 6).
A node's Lease, ``queue-processor-<node>`` (:meth:`NodeLeases.claim`), names the claimer's :class:`ReplicaLease`,
is held while that one is renewed and deleted when released; another replica takes it once released or lapsed
(409: another replica won). A lapse loses every :class:`Claim` held."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from queue_processor import rest
from queue_processor.config import default
from queue_processor.kube import KubeClient
from queue_processor.outcomes import ClaimLost, KubeError
from queue_processor.rest import AFTER_CORDONS, REPLICA_RANK, URGENT_RANK
from queue_processor.watch import REPLICA_ANNOTATION, LeaseWatch, holder_of

log = structlog.get_logger("queue_processor.leases")

#: ``leaseDurationSeconds`` of a node Lease held by a replica Lease (earlier versions judge by it): over any drain.
HELD_BY_REPLICA_S = 3600

#: The labels naming a node Lease's holder and the Lease (:func:`label_value`), which a batch of releases selects by.
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


#: How many times one write re-reads the Lease and writes again after a 409 that left it ours.
RENEW_ATTEMPTS = 3

#: Seconds before a failed renewal of the replica Lease is tried again (or a renewal period, when shorter).
RENEW_RETRY_S = 2.0

#: Seconds a released node Lease waits for others to be released with it (one request for all), and the most one
#: request deletes (the selector names each in 21 characters of the URL).
RELEASE_BATCH_S = 0.5
RELEASE_BATCH_MAX = 50


class ReplicaLease:
    """This replica's own Lease, ``queue-processor.replica.<identity>``: written before the first claim, renewed
    while claims are held (one write in flight at a time), deleted by :meth:`close`. ``renewed_at`` is the
    monotonic time the last successful write was sent; ``epoch`` counts lapses (a claim of an earlier one is lost)."""

    def __init__(self, leases: NodeLeases) -> None:
        self._leases = leases
        self.name = replica_lease_name(leases.identity)
        self.lease: dict[str, Any] | None = None
        self.renewed_at = -math.inf
        self.epoch = 0
        self.claims: set[Claim] = set()
        self._renewal: asyncio.Task[KubeError | None] | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._lapse: asyncio.TimerHandle | None = None
        # Node Leases whose release failed (name → the Lease as last written): released again at each renewal.
        self.unreleased: dict[str, dict[str, Any]] = {}

    def age(self) -> float:
        """Seconds since the last renewal that succeeded was sent (infinite before the first)."""
        return self._leases.clock() - self.renewed_at

    async def renew(self) -> KubeError | None:
        """Write the Lease now, or join the write in flight: ``None`` when written, else the error (logged)."""
        if self._renewal is None or self._renewal.done():
            self._renewal = asyncio.create_task(self._renew_once(), name=f"renew-{self.name}")
        # Shielded: a caller cancelled mid-renewal (its eviction stopped) leaves the write to the others.
        return await asyncio.shield(self._renewal)

    async def fresh(self) -> None:
        """Renew the Lease unless renewed within a renewal period. Raises the :class:`KubeError` that stopped it."""
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
        URGENT_RANK.set(REPLICA_RANK)  # a renewal asked for by an operation is still the replica's
        leases = self._leases
        self.check()
        sent = leases.clock()
        try:
            for _ in range(RENEW_ATTEMPTS):
                try:
                    self.lease = await leases.write(self.name, self.lease, leases.duration_s)
                except KubeError as exc:
                    if exc.status not in (404, 409) or (exc.status == 404 and self.lease is None):
                        raise
                    current = await leases.kube.get_lease(leases.namespace, self.name)
                    if holder_of(current) != leases.holder and holder_of(self.lease) == leases.holder:
                        # Ours, and no longer: whatever it named may have been taken.
                        self._end_epoch(
                            f"the replica's Lease {self.name} was "
                            + (f"rewritten by {holder_of(current)!r}" if current is not None else "deleted")
                        )
                    self.lease = current  # written again on its resourceVersion (or created again)
                    continue
                if leases.clock() - self.renewed_at >= leases.duration_s:
                    # Landed after a lapse: another replica may have taken what it named meanwhile.
                    self._end_epoch(f"the replica's Lease {self.name} was renewed only after it had lapsed")
                self.renewed_at = sent
                self._watch_lapse()
                return None
            raise KubeError(409, "Conflict", f"Lease {self.name} kept changing under {RENEW_ATTEMPTS} writes")
        except KubeError as exc:
            log.warning("replica lease renewal failed", lease=self.name, error=str(exc))
            return exc

    async def _renew_forever(self) -> None:
        URGENT_RANK.set(AFTER_CORDONS)  # its releases sent again; each renewal ranks itself (_renew_once)
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
        """End the epoch when the Lease lapses while claims are held, even while a renewal hangs."""
        self._unwatch_lapse()
        if self.claims:
            wait = max(0.0, self._leases.duration_s - self.age())
            self._lapse = asyncio.get_running_loop().call_later(wait, self.check)

    def hold(self, claim: Claim) -> None:
        """Count ``claim`` among those the renewal keeps (it starts with the first)."""
        self.claims.add(claim)
        if self._renewer is None or self._renewer.done():
            self._renewer = rest.spawn(self._renew_forever(), name=f"lease-{self.name}")
        if self._lapse is None:
            self._watch_lapse()

    async def drop(self, claim: Claim) -> None:
        """Stop counting ``claim``; the last one stops the renewal."""
        self.claims.discard(claim)
        if not self.claims:
            self._unwatch_lapse()
            renewer, self._renewer = self._renewer, None
            renewal = None
            if not self._leases._claiming:  # a claim that comes meanwhile starts a write of its own
                renewal, self._renewal = self._renewal, None
            await rest.stop(renewer, renewal)

    async def close(self, timeout_s: float = 1.0) -> None:
        """Stop renewing and delete the Lease if ours, waiting at most ``timeout_s`` seconds; errors logged."""
        self._end_epoch(f"the replica's Lease {self.name} was given up (shutdown)")
        self._unwatch_lapse()
        renewer, self._renewer = self._renewer, None
        renewal, self._renewal = self._renewal, None
        leases = self._leases
        try:
            async with asyncio.timeout(timeout_s):  # a cancelled write waits for its answer: bounded here
                await rest.stop(renewer, renewal)
                if holder_of(self.lease) == leases.holder:
                    await leases.kube.delete_lease(leases.namespace, self.name)
                    self.lease = None
        except (KubeError, TimeoutError) as exc:
            log.warning("replica lease deletion failed", lease=self.name, error=str(exc) or "timed out")


class Claim:
    """A held node Lease (:meth:`release` it at the end); ``lost`` is set when the replica Lease lapses (or is deleted
    or rewritten): EarlyExit. :meth:`confirm` it before what must not be done twice (an eviction, a completion)."""

    def __init__(self, leases: NodeLeases, lease: dict[str, Any], epoch: int) -> None:
        self._leases = leases
        self.lease = lease
        self.name = str(lease["metadata"]["name"])
        self.epoch = epoch
        self.lost = asyncio.Event()
        leases.replica.hold(self)
        if epoch != leases.replica.epoch:
            self._mark_lost(f"the replica's Lease {leases.replica.name} lapsed while the node's was claimed")

    def _mark_lost(self, why: str) -> None:
        if not self.lost.is_set():
            log.warning("lease lost", lease=self.name, why=why)
            self.lost.set()

    async def confirm(self) -> None:
        """Check the node Lease is ours (the replica Lease renewed first when due). Raises :class:`ClaimLost`."""
        replica = self._leases.replica
        if not self.lost.is_set() and replica.age() >= self._leases.renew_every_s:
            await replica.renew()
            replica.check()
        if self.epoch != replica.epoch:
            self._mark_lost(f"the replica's Lease {replica.name} lapsed")
        if self.lost.is_set():
            raise ClaimLost(f"Lease {self.name} was lost")

    async def release(self) -> None:
        """Give the node Lease up: in the next batch of releases, or alone when lost (:meth:`NodeLeases.clear`);
        one not answered is released again at each renewal while other nodes are held. Errors are logged."""
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
    """Node Lease claims for ``identity`` (the pod name) in ``namespace``: the replica Lease lapses ``duration_s``
    whole seconds after its last renewal, renewed every ``renew_every_s`` (default: a third). The holder is
    ``<identity>/<random>``, telling this process from an earlier one of the same pod."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        identity: str,
        duration_s: int = default("node_lease_duration_sec"),
        renew_every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.namespace = namespace or "default"
        self.identity = identity
        self.holder = f"{identity}/{secrets.token_hex(4)}"
        self.duration_s = int(duration_s)
        self.renew_every_s = renew_every_s if renew_every_s is not None else self.duration_s / 3
        self.clock = clock
        self.replica = ReplicaLease(self)
        self._claiming: Counter[str] = Counter()  # node Lease name → claims of it being made
        self._pending: dict[str, tuple[dict[str, Any], int]] = {}  # released, not sent: name → (Lease, epoch)
        self._sending: dict[str, asyncio.Future[None]] = {}  # in a batch being sent: name → its answer
        self._hurry = asyncio.Event()  # send the pending releases without waiting (a full batch, a flush)
        self._flushing = 0  # flush() calls waiting
        self._releaser: asyncio.Task[None] | None = None
        self._lapsed: dict[str, float] = {}  # holder → clock() when its replica Lease was found lapsed
        self._live: dict[str, float] = {}  # holder → clock() when its replica Lease was found current
        self.watch = LeaseWatch(kube, self.namespace, LEASE_LABEL)  # started by the controller, closed here
        self.batches = True  # whether releases go in batches: false once ``deletecollection`` was refused

    async def claim(self, node: str) -> Claim | None:
        """The node's Lease for this replica, or ``None`` when another holds it. Raises :class:`KubeError`."""
        name = lease_name(node)
        replica = self.replica
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
            claimed = await self._take(name, replica.epoch)
            return claimed
        finally:
            self._claiming -= Counter([name])  # gone at 0
            if claimed is None and unreleased is not None:
                replica.unreleased.setdefault(name, unreleased)

    async def _take(self, name: str, epoch: int) -> Claim | None:
        """Create or take over node Lease ``name``: the claim, ``None`` if held or lost. Raises :class:`KubeError`."""
        existing: dict[str, Any] | None = None
        marks = ({REPLICA_ANNOTATION: self.replica.name}, self._labels(name))  # its annotations and labels
        for _ in range(2):  # a Lease deleted between the refused create and the read is created again
            try:  # created first: a node's first claim is one request, not a read and a create
                return Claim(self, await self.write(name, None, HELD_BY_REPLICA_S, *marks), epoch)
            except KubeError as exc:
                if exc.status != 409:  # 409 AlreadyExists: an earlier claim's Lease, or another replica's
                    raise
            existing = await self.kube.get_lease(self.namespace, name)
            if existing is not None:
                break
        if existing is None or await self._held_by_another(existing):
            return None
        try:
            return Claim(self, await self.write(name, existing, HELD_BY_REPLICA_S, *marks), epoch)
        except KubeError as exc:
            if exc.status == 409:  # another replica created or took it first
                return None
            raise

    async def write(
        self, name: str, lease: dict[str, Any] | None, duration_s: int, *marks: Any
    ) -> dict[str, Any]:
        """Create Lease ``name`` held here for ``duration_s`` seconds (``lease`` ``None``), else write ``lease`` as
        held here on its resourceVersion; ``marks``: annotations, labels. Raises :class:`KubeError` (409)."""
        body = held_lease(
            lease or new_lease(name, self.namespace, self.holder), self.holder, duration_s, *marks
        )
        if lease is None:
            return await self.kube.create_lease(self.namespace, body)
        return await self.kube.replace_lease(self.namespace, body)

    def held_elsewhere(self, node: str) -> bool:
        """Whether another replica holds ``node``'s Lease, as :attr:`watch` shows (not current: ``True`` unless the
        watch was refused); ``False`` for a holder :meth:`held_elsewhere_now` found lapsed within a renewal period."""
        if not self.watch.live:
            return self.watch.refused is None
        holder = self.watch.holder(lease_name(node))
        if holder is None or holder == self.holder:
            return False
        lapsed = self._lapsed.get(holder)
        return lapsed is None or self.clock() - lapsed >= self.renew_every_s

    async def held_elsewhere_now(self, node: str) -> bool:
        """:meth:`held_elsewhere`, the holder's replica Lease confirmed current (read at most once per renewal
        period; lapsed, or our pod's earlier process: free). An error, a stale copy, an earlier version's: held."""
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
            lapsed = lease is None or holder_of(lease) != holder or expired(lease, self.duration_s)
        for found in (self._lapsed, self._live):  # holders of other processes come and go: keep the recent
            for old in [key for key, at in found.items() if now - at >= self.duration_s]:
                del found[old]
        (self._lapsed if lapsed else self._live)[holder] = now
        if lapsed:
            log.info("node Lease held by a replica that is gone: the node is free", lease=name, holder=holder)
        return not lapsed

    async def clear(self, lease: dict[str, Any] | None) -> bool:
        """Delete a node Lease on the resourceVersion we last wrote (a 409 re-reads it), unless a claim here holds or
        makes it. ``True`` when released, gone, or not ours; ``False`` when the API server did not answer (logged)."""
        for _ in range(RENEW_ATTEMPTS):
            if lease is None or holder_of(lease) != self.holder:
                return True
            metadata = lease.get("metadata") or {}
            name, version = str(metadata.get("name")), metadata.get("resourceVersion")
            if name in self._claiming or any(claim.name == name for claim in self.replica.claims):
                return True
            try:
                try:
                    await self.kube.delete_lease(self.namespace, name, resource_version=version)
                    return True
                except KubeError as exc:
                    if exc.status != 409:
                        raise
                lease = await self.kube.get_lease(self.namespace, name)  # 409: changed since, read it again
            except KubeError as exc:
                log.warning("lease release failed", lease=name, error=str(exc))
                return False
        return False

    def _batchable(self, lease: dict[str, Any]) -> bool:
        """Whether ``lease`` carries this replica's labels as written here (a batch's selector finds it)."""
        metadata = lease.get("metadata") or {}
        return self._labels(metadata["name"]).items() <= (metadata.get("labels") or {}).items()

    def _release_later(self, lease: dict[str, Any], epoch: int) -> None:
        """Queue ``lease`` (held by a claim of ``epoch`` just given up) for the next batch of releases."""
        self._pending[str(lease["metadata"]["name"])] = (lease, epoch)
        if len(self._pending) >= RELEASE_BATCH_MAX:
            self._hurry.set()
        if self._releaser is None or self._releaser.done():
            self._releaser = rest.spawn(self._release_batches(), name="lease-releases")

    async def _release_batches(self) -> None:
        """Send the pending releases, a batch every :data:`RELEASE_BATCH_S` (sooner when full or flushed)."""
        URGENT_RANK.set(AFTER_CORDONS)
        while self._pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RELEASE_BATCH_S):
                    await self._hurry.wait()  # at once when set
            names = list(self._pending)[:RELEASE_BATCH_MAX]
            batch = {name: self._pending.pop(name) for name in names}
            if not self._flushing and len(self._pending) < RELEASE_BATCH_MAX:
                self._hurry.clear()
            await self._send(batch)

    async def _send(self, batch: dict[str, tuple[dict[str, Any], int]]) -> None:
        """Delete ``batch``'s Leases in one request (by our holder label and each one's), only in the batch's epoch
        while the replica Lease is younger than two thirds of its duration (none can be taken over yet). Leases of an
        ended epoch or sharing a held Lease's label, or of a batch unsent or unanswered: :meth:`_clear_each`."""
        self.replica.check()
        epoch = self.replica.epoch
        claims = [claim.name for claim in self.replica.claims]
        held = {label_value(name) for name in [*self._claiming, *claims]}  # held or being claimed here
        alone = {
            name: lease
            for name, (lease, released_in) in batch.items()
            if released_in != epoch or label_value(name) in held
        }
        together = {name: lease for name, (lease, _) in batch.items() if name not in alone}
        self._sending.update({name: asyncio.get_running_loop().create_future() for name in batch})
        try:
            if together:
                selector = (
                    f"{HOLDER_LABEL}={label_value(self.holder)},"
                    f"{LEASE_LABEL} in ({','.join(sorted(label_value(name) for name in together))})"
                )
                try:
                    if not await self._delete_together(selector, epoch):
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
                self._answer(together)
            for name, lease in alone.items():
                await self._clear_each({name: lease})
                self._answer([name])
        finally:
            self._answer(batch)

    async def _delete_together(self, selector: str, epoch: int) -> bool:
        """Delete the Leases ``selector`` names in one request, retried as the client retries one; each attempt
        only in ``epoch`` while the replica Lease is younger than two thirds of its duration, asked once its token
        came: whether it was sent. Raises :class:`KubeError`."""
        async for attempt in self.kube.retrying():
            with attempt:
                await self.kube.limiter.acquire(urgent=True)
                if self.replica.epoch != epoch or self.replica.age() >= self.duration_s * 2 / 3:
                    self.kube.limiter.give_back()  # the epoch ended or the Lease aged while it waited
                    return False
                await self.kube.delete_leases(self.namespace, selector, taken=True)
        return True

    async def _clear_each(self, leases: dict[str, dict[str, Any]]) -> None:
        """Release each of ``leases`` alone (:meth:`clear`); a failed one again at each renewal."""
        for name, lease in leases.items():
            if not await self.clear(lease):
                self.replica.unreleased[name] = lease

    def _answer(self, names: Iterable[str]) -> None:
        """Wake the claims waiting for the release of ``names`` (one batch is sent at a time)."""
        for name in names:
            answer = self._sending.pop(name, None)
            if answer is not None:
                answer.set_result(None)

    async def flush(self) -> None:
        """Send the pending releases now and wait until every release made so far is answered (not raised)."""
        self._flushing += 1
        self._hurry.set()
        try:
            while self._releaser is not None and not self._releaser.done():
                await asyncio.wait({self._releaser})
        finally:
            self._flushing -= 1
            if not self._flushing:
                self._hurry.clear()

    async def _held_by_another(self, lease: dict[str, Any]) -> bool:
        holder = holder_of(lease)
        if holder is None or holder == self.holder:
            return False
        named = ((lease.get("metadata") or {}).get("annotations") or {}).get(REPLICA_ANNOTATION)
        identity, slash, _ = holder.rpartition("/")
        if not named or not slash or replica_lease_name(identity) != named:
            # An earlier version's Lease (renewed by its holder, maybe with our annotation): judged by its renewal.
            return not expired(lease, self.duration_s)
        if named == self.replica.name:  # our pod's earlier process: what it held is ours to take
            return False
        replica = await self.kube.get_lease(self.namespace, named)
        return replica is not None and holder_of(replica) == holder and not expired(replica, self.duration_s)

    def _labels(self, name: str) -> dict[str, str]:
        return {HOLDER_LABEL: label_value(self.holder), LEASE_LABEL: label_value(name)}

    async def close(self, timeout_s: float = 1.0) -> None:
        """At shutdown: flush the releases, then delete the replica Lease, within ``timeout_s`` seconds in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s / 2  # the rest is the replica Lease's
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await self.flush()
        try:
            # A release cancelled mid-request waits for its answer: the timeout's cancellation ends that.
            async with asyncio.timeout_at(max(deadline, loop.time() + timeout_s / 20)):
                await rest.stop(self._releaser)
        except TimeoutError:
            log.warning("node lease releases abandoned at shutdown", leases=len(self._sending))
        self._pending.clear()
        await self.watch.close()
        await self.replica.close(max(timeout_s / 20, deadline + timeout_s / 2 - loop.time()))
