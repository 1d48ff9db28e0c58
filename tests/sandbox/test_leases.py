"""Node Leases through the controller's client, on the emulation and the real control plane: one holder at a
time, held while the holder's replica Lease is renewed (no node Lease renewal), takeover when it lapses or is
gone, an earlier version's Leases judged by their own renewal, release."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from queue_processor.kube import KubeClient
from queue_processor.leases import HELD_BY_REPLICA_S, HOLDER_LABEL, LEASE_LABEL, NodeLeases, lease_name
from queue_processor.outcomes import ClaimLost, KubeError
from queue_processor.watch import REPLICA_ANNOTATION
from queue_processor_sandbox.cluster import KubeCluster
from tests.sandbox.conftest import Requests

OPS = f"ops-{uuid.uuid4().hex[:6]}"

#: The sandbox clock's scale for this module's cluster (tests/sandbox/conftest.py).
CLOCK_SCALE = 0.01

LONG_AGO = "2020-01-01T00:00:00.000000Z"


@pytest.fixture(autouse=True)
def ops(cluster: KubeCluster) -> None:
    cluster.ensure_namespace(OPS)


def unique(prefix: str) -> str:
    """A name no other test of the module (sharing the cluster) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def backdate(kube: KubeClient, name: str) -> None:
    """Make the Lease's last renewal long past (its holder stopped renewing it long ago)."""
    lease = await kube.get_lease(OPS, name)
    assert lease is not None
    lease["spec"]["renewTime"] = LONG_AGO
    lease["spec"]["acquireTime"] = LONG_AGO
    await kube.replace_lease(OPS, lease)


async def stop_renewing(leases: NodeLeases) -> None:
    """The replica died or was paused (SIGKILL, SIGSTOP): nothing of it renews its Lease any more."""
    renewer = leases.replica._renewer
    assert renewer is not None
    renewer.cancel()
    await asyncio.gather(renewer, return_exceptions=True)


async def test_a_first_claim_writes_the_replica_lease_and_later_ones_are_one_request(
    kube: KubeClient, requests: Requests
) -> None:
    """A storm's claims are of nodes never claimed: the node Lease is created at once, without a read first;
    the replica's own Lease is written before its first claim only. Releases delete the node Leases, those made
    together in one request: nothing is left for a node that is gone, and a node claimed again is one create
    again."""
    a = NodeLeases(kube, namespace=OPS, identity=unique("replica-a"), duration_s=60)
    nodes = [unique("ip-10-6-0") for _ in range(3)]
    requests.made.clear()
    first = await a.claim(nodes[0])
    assert first is not None
    assert requests.made == {"create leases": 2}  # the replica's, the node's
    others = [await a.claim(node) for node in nodes[1:]]
    assert requests.made == {"create leases": 4}  # one request per node while the replica Lease is fresh
    node_lease = await kube.get_lease(OPS, lease_name(nodes[0]))
    assert node_lease is not None
    assert node_lease["spec"]["holderIdentity"] == a.holder
    assert node_lease["metadata"]["annotations"][REPLICA_ANNOTATION] == a.replica.name
    assert node_lease["spec"]["leaseDurationSeconds"] == HELD_BY_REPLICA_S  # an earlier version keeps off
    replica = await kube.get_lease(OPS, a.replica.name)
    assert replica is not None
    assert replica["spec"]["holderIdentity"] == a.holder
    requests.made.clear()
    for claim in [first, *others]:
        assert claim is not None
        await claim.release()
    await a.flush()
    assert requests.made == {"deletecollection leases": 1}
    for node in nodes:
        assert await kube.get_lease(OPS, lease_name(node)) is None
    b = NodeLeases(kube, namespace=OPS, identity=unique("replica-b"), duration_s=60)
    requests.made.clear()
    again = await b.claim(nodes[0])
    assert requests.made == {"create leases": 2}  # its replica's, the node's
    assert again is not None
    assert again.lease["spec"]["holderIdentity"] == b.holder
    await again.release()
    await a.close()
    await b.close()


async def test_one_replica_holds_a_node_at_a_time(kube: KubeClient) -> None:
    a = NodeLeases(kube, namespace=OPS, identity=unique("replica-a"), duration_s=60)
    b = NodeLeases(kube, namespace=OPS, identity=unique("replica-b"), duration_s=60)
    node = unique("ip-10-0-0-1")
    claims = await asyncio.gather(a.claim(node), b.claim(node))
    assert sum(claim is not None for claim in claims) == 1  # exactly one wins the race
    winner = next(claim for claim in claims if claim is not None)
    loser = b if winner.lease["spec"]["holderIdentity"] == a.holder else a
    assert await loser.claim(node) is None
    await winner.release()
    await a.flush()  # the release sent (it waits for others' at most RELEASE_BATCH_S)
    await b.flush()
    again = await loser.claim(node)  # released: the other may take it
    assert again is not None
    assert again.lease["spec"]["holderIdentity"] == loser.holder
    await again.release()
    await a.close()
    await b.close()


async def test_a_node_lease_is_held_while_its_replica_lease_is_renewed_and_taken_when_that_lapses(
    kube: KubeClient,
) -> None:
    """The node Lease itself is never renewed: what keeps it is its holder's replica Lease. Long after the
    node Lease's own renewal, another replica cannot take it while the holder renews its replica Lease; once
    the holder stops (it died) and that Lease lapses, it can."""
    node = unique("n2")
    holder = NodeLeases(kube, namespace=OPS, identity=unique("crashed"), duration_s=15)
    claim = await holder.claim(node)
    assert claim is not None
    await backdate(kube, lease_name(node))  # the node Lease's own renewal: long past
    taker = NodeLeases(kube, namespace=OPS, identity=unique("alive"), duration_s=15)
    assert await taker.claim(node) is None  # the replica Lease is fresh: held
    await stop_renewing(holder)
    await backdate(kube, holder.replica.name)  # the replica Lease lapsed
    taken = await taker.claim(node)
    assert taken is not None
    assert taken.lease["spec"]["holderIdentity"] == taker.holder
    await taken.release()
    await taker.close()


async def test_the_replica_lease_is_renewed_not_the_node_leases_and_release_stops_the_renewal(
    kube: KubeClient,
) -> None:
    leases = NodeLeases(kube, namespace=OPS, identity=unique("me"), duration_s=15, renew_every_s=0.05)
    nodes = [unique("n3"), unique("n3")]
    claims = [await leases.claim(node) for node in nodes]
    written = [await kube.get_lease(OPS, lease_name(node)) for node in nodes]
    replica = await kube.get_lease(OPS, leases.replica.name)
    assert replica is not None
    first = replica["spec"]["renewTime"]
    deadline = asyncio.get_running_loop().time() + 30  # a hang guard: renewals come every 50 ms
    while (current := await kube.get_lease(OPS, leases.replica.name)) and current["spec"][
        "renewTime"
    ] == first:
        assert asyncio.get_running_loop().time() < deadline, "the replica Lease was never renewed"
        await asyncio.sleep(0.05)
    for node, before in zip(nodes, written, strict=True):
        after = await kube.get_lease(OPS, lease_name(node))
        assert after is not None
        assert before is not None
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # not written
    for claim in claims:
        assert claim is not None
        await claim.release()
    assert leases.replica._renewer is None  # the last release stopped it
    await leases.flush()
    for node in nodes:
        assert await kube.get_lease(OPS, lease_name(node)) is None  # released
    await leases.close()


def test_lease_names_are_valid_object_names() -> None:
    assert lease_name("ip-10-0-0-1.ec2.internal") == "queue-processor-ip-10-0-0-1.ec2.internal"
    assert lease_name("Node_A") == "queue-processor-node-a"
    assert len(lease_name("x" * 400)) <= 253


class SlowLeaseWrites:
    """The controller's client with every Lease write answered ``delay_s`` later (a busy API server): the
    write is sent, then the answer waits."""

    def __init__(self, kube: KubeClient, delay_s: float) -> None:
        self.kube = kube
        self.delay_s = delay_s
        self.writes = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.kube, name)

    async def replace_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        answer = await self.kube.replace_lease(namespace, lease)
        await asyncio.sleep(self.delay_s)
        return answer


async def test_concurrent_confirms_and_the_renewal_never_lose_our_own_lease(kube: KubeClient) -> None:
    """Every eviction and completion confirms the claim first. Once a renewal period has passed, they all
    want the replica Lease renewed at the same moment as the background renewal: one renewal goes out and the
    others wait for its answer, and the claims are never lost to our own writes."""
    slow = SlowLeaseWrites(kube, delay_s=0.2)
    leases = NodeLeases(slow, namespace=OPS, identity=unique("me"), duration_s=15, renew_every_s=0.05)  # type: ignore[arg-type]
    node = unique("n4")
    claim = await leases.claim(node)
    assert claim is not None

    async def evictions_retried() -> None:
        for _ in range(6):
            await claim.confirm()
            await asyncio.sleep(0.03)

    await asyncio.gather(*(evictions_retried() for _ in range(12)))  # raises ClaimLost if it was lost
    assert not claim.lost.is_set()
    assert slow.writes < 12 * 6  # the callers shared renewals
    await claim.release()
    await leases.flush()
    assert await kube.get_lease(OPS, lease_name(node)) is None  # released: the next replica takes it at once
    await leases.close()


async def test_a_paused_replica_whose_lease_lapsed_loses_its_claims_and_leaves_them_to_the_taker(
    kube: KubeClient,
) -> None:
    node = unique("n5")
    paused = NodeLeases(kube, namespace=OPS, identity=unique("paused"), duration_s=15, renew_every_s=0.05)
    claim = await paused.claim(node)
    assert claim is not None
    await stop_renewing(paused)  # SIGSTOP: nothing renews
    await backdate(kube, paused.replica.name)  # its replica Lease lapsed while the process was paused
    other = NodeLeases(kube, namespace=OPS, identity=unique("other"), duration_s=15)
    taken = await other.claim(node)
    assert taken is not None
    paused.replica.renewed_at -= 15  # the paused replica wakes up: its last renewal is a lease duration old
    with pytest.raises(ClaimLost):
        await claim.confirm()
    assert claim.lost.is_set()
    await claim.release()  # a lost Lease another replica took is left to it
    held = await kube.get_lease(OPS, lease_name(node))
    assert held is not None
    assert held["spec"]["holderIdentity"] == other.holder
    await taken.release()
    await other.close()
    await paused.close()


async def test_an_earlier_versions_lease_is_judged_by_its_own_renewal(kube: KubeClient) -> None:
    """A rolling upgrade: a replica of an earlier version renews the node Lease itself and names no replica
    Lease. It is held while that renewal is fresh, and taken once it lapsed."""
    node = unique("n6")
    await kube.create_lease(
        OPS,
        {
            "metadata": {"name": lease_name(node), "namespace": OPS},
            "spec": {
                "holderIdentity": "earlier-version",
                "leaseDurationSeconds": 60,
                "renewTime": "2099-01-01T00:00:00.000000Z",  # renewed: fresh
            },
        },
    )
    leases = NodeLeases(kube, namespace=OPS, identity=unique("new"), duration_s=15)
    assert await leases.claim(node) is None
    await backdate(kube, lease_name(node))
    taken = await leases.claim(node)
    assert taken is not None
    await taken.release()
    await leases.close()


async def test_a_restarted_process_frees_what_its_predecessor_held_and_a_closed_one_what_it_held(
    kube: KubeClient,
) -> None:
    """A container restarted in the same pod (same identity, another process) rewrites the replica Lease:
    what its predecessor held is free at once, for it and for any other replica. At shutdown the replica Lease
    is deleted: a node Lease still naming it is free at once."""
    identity = unique("replica-c")
    first, second, third = unique("n7"), unique("n7"), unique("n7")
    before = NodeLeases(kube, namespace=OPS, identity=identity, duration_s=60)
    held = [await before.claim(first), await before.claim(second)]
    assert all(claim is not None for claim in held)
    await stop_renewing(before)  # the process is killed, its Lease fresh
    restarted = NodeLeases(kube, namespace=OPS, identity=identity, duration_s=60)
    again = await restarted.claim(first)
    assert again is not None
    assert again.lease["spec"]["holderIdentity"] == restarted.holder != before.holder
    other = NodeLeases(kube, namespace=OPS, identity=unique("other"), duration_s=60)
    taken = await other.claim(second)  # the predecessor's: free
    assert taken is not None
    await taken.release()
    kept = await restarted.claim(third)
    assert kept is not None
    assert await other.claim(third) is None  # the restarted process's replica Lease is fresh: held
    await restarted.close()  # shutdown (with a claim still held: its shutdown timed out)
    assert await kube.get_lease(OPS, restarted.replica.name) is None
    taken = await other.claim(third)  # the replica Lease is gone: the node's is free
    assert taken is not None
    await taken.release()
    await again.release()
    await other.close()


class ScriptedLeaseWrites:
    """The controller's client with Lease writes scripted: ``during`` runs while a write is on its way (before
    it is sent), ``fail`` answers the next releases (deletions, alone or in a batch) with a 500, ``hang``
    makes every write wait for an answer that never comes, as the client does for a write it cannot take back
    (a cancellation waits for the answer; a second one ends the wait)."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.during: Any = None
        self.fail = 0
        self.hang = False
        self.alone = 0  # node Leases deleted one by one (not in a batch)

    def __getattr__(self, name: str) -> object:
        return getattr(self.kube, name)

    async def replace_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        if self.hang:
            never = asyncio.get_running_loop().create_future()
            try:
                await asyncio.shield(never)
            except asyncio.CancelledError:
                await never  # the answer is waited for; a second cancellation ends this
        if self.during is not None:
            self.during()
        answer: dict[str, Any] = await self.kube.replace_lease(namespace, lease)
        return answer

    async def delete_lease(self, namespace: str, name: str, *, resource_version: str | None = None) -> None:
        self.alone += 1
        if self.fail:
            self.fail -= 1
            raise KubeError(500, "InternalError", "etcdserver: request timed out")
        await self.kube.delete_lease(namespace, name, resource_version=resource_version)

    async def delete_leases(self, namespace: str, label_selector: str, **kwargs: Any) -> list[str]:
        if self.fail:
            self.fail -= 1
            raise KubeError(500, "InternalError", "etcdserver: request timed out")
        return await self.kube.delete_leases(namespace, label_selector, **kwargs)


async def test_a_batch_of_releases_answered_500_is_sent_again_not_broken_up(kube: KubeClient) -> None:
    """In the bad minute (a 429, a 5xx) a batch of releases is tried again as one request, as any request is,
    rather than falling back at once to a DELETE per Lease, up to 50 of them."""
    scripted = ScriptedLeaseWrites(kube)
    leases = NodeLeases(scripted, namespace=OPS, identity=unique("retried"), duration_s=15)  # type: ignore[arg-type]
    node = unique("n15")
    claim = await leases.claim(node)
    keep = await leases.claim(unique("n15"))
    assert claim is not None
    assert keep is not None
    scripted.fail = 1
    await claim.release()
    await leases.flush()
    assert await kube.get_lease(OPS, lease_name(node)) is None
    assert scripted.alone == 0
    await keep.release()
    await leases.close()


async def test_a_renewal_that_lands_after_the_lease_lapsed_loses_the_claims(kube: KubeClient) -> None:
    """A renewal sent in time but answered after the replica Lease lapsed: another replica may have read it
    expired meanwhile and taken a node. The claims are lost, not revived by the late write."""
    now = [1000.0]
    scripted = ScriptedLeaseWrites(kube)
    leases = NodeLeases(scripted, namespace=OPS, identity=unique("slow"), duration_s=15, clock=lambda: now[0])  # type: ignore[arg-type]
    claim = await leases.claim(unique("n8"))
    assert claim is not None
    now[0] += 10  # a renewal period and more: the next confirmation renews

    def slow() -> None:
        now[0] += 10  # the write is answered 10 s later: 20 s after the last renewal, which lasted 15

    scripted.during = slow
    with pytest.raises(ClaimLost):
        await claim.confirm()
    assert claim.lost.is_set()
    scripted.during = None
    await claim.release()
    await leases.close()


async def test_a_claim_is_lost_when_the_lease_lapses_while_its_renewal_hangs(kube: KubeClient) -> None:
    scripted = ScriptedLeaseWrites(kube)
    leases = NodeLeases(scripted, namespace=OPS, identity=unique("hung"), duration_s=1, renew_every_s=0.05)  # type: ignore[arg-type]
    claim = await leases.claim(unique("n9"))
    assert claim is not None
    scripted.hang = True  # the API server stops answering: every renewal hangs
    await asyncio.wait_for(claim.lost.wait(), timeout=30)  # a hang guard; lost at the lapse (1 s)
    await leases.close(timeout_s=0.2)  # bounded though the renewal in flight is never answered
    scripted.hang = False
    await claim.release()


async def test_a_node_lease_an_earlier_version_took_is_judged_by_its_renewal_whatever_it_kept(
    kube: KubeClient,
) -> None:
    """A rolling upgrade: an earlier version's replica took a node Lease we had released and kept the
    annotation it found (it copies metadata). The annotation names our replica Lease, but the holder is not
    ours: the Lease is judged by its own renewal, held while the earlier version renews it."""
    node = unique("n10")
    new = NodeLeases(kube, namespace=OPS, identity=unique("new"), duration_s=60)
    first = await new.claim(node)
    assert first is not None
    held_elsewhere = await new.claim(unique("n10"))  # keeps our replica Lease renewed
    lease = await kube.get_lease(OPS, lease_name(node))
    assert lease is not None
    lease["metadata"].setdefault("annotations", {})[REPLICA_ANNOTATION] = new.replica.name
    lease["spec"].update(holderIdentity="earlier-version", leaseDurationSeconds=60)
    lease["spec"]["renewTime"] = "2099-01-01T00:00:00.000000Z"
    await kube.replace_lease(OPS, lease)  # the earlier version's takeover, our annotation kept
    other = NodeLeases(kube, namespace=OPS, identity=unique("other"), duration_s=60)
    assert await other.claim(node) is None
    assert held_elsewhere is not None
    await held_elsewhere.release()
    await new.close()
    await other.close()


async def test_a_release_the_api_server_did_not_answer_is_made_again_at_the_next_renewal(
    kube: KubeClient,
) -> None:
    """Otherwise the node Lease, still naming a replica Lease that is renewed while the replica holds other
    nodes, stays held for all of a storm."""
    scripted = ScriptedLeaseWrites(kube)
    leases = NodeLeases(scripted, namespace=OPS, identity=unique("busy"), duration_s=15, renew_every_s=0.05)  # type: ignore[arg-type]
    node = unique("n11")
    claim = await leases.claim(node)
    other_node = await leases.claim(unique("n11"))  # the replica keeps renewing its Lease for this one
    assert claim is not None
    assert other_node is not None
    scripted.fail = kube.attempts + 1  # each attempt of the batch, then the release alone
    await claim.release()
    await leases.flush()  # answered 500
    assert lease_name(node) in leases.replica.unreleased
    other = NodeLeases(kube, namespace=OPS, identity=unique("other"), duration_s=15)
    deadline = asyncio.get_running_loop().time() + 30  # a hang guard: renewals come every 50 ms
    taken = await other.claim(node)
    while taken is None:
        assert asyncio.get_running_loop().time() < deadline, "the node Lease was never released"
        await asyncio.sleep(0.05)
        taken = await other.claim(node)
    await taken.release()
    await other_node.release()
    await leases.close()
    await other.close()


async def test_a_release_made_again_leaves_alone_the_lease_the_replica_claimed_again_meanwhile(
    kube: KubeClient,
) -> None:
    """A release the API server did not answer waits for the next renewal; the replica claims the node again
    before it (a Spot warning after the rebalance drain it ended). The renewal's release must not delete the
    new claim's Lease: another replica would then take the node while this one drains it."""
    scripted = ScriptedLeaseWrites(kube)
    leases = NodeLeases(scripted, namespace=OPS, identity=unique("again"), duration_s=15, renew_every_s=0.05)  # type: ignore[arg-type]
    node = unique("n12")
    claim = await leases.claim(node)
    assert claim is not None
    scripted.fail = kube.attempts + 1  # each attempt of the batch, then the release alone
    await claim.release()
    await leases.flush()  # answered 500: made again at the next renewal
    again = await leases.claim(node)  # the same replica, before that renewal
    assert again is not None
    renewed = leases.replica.lease
    deadline = asyncio.get_running_loop().time() + 30  # a hang guard: renewals come every 50 ms
    while leases.replica.lease is renewed or lease_name(node) in leases.replica.unreleased:
        assert asyncio.get_running_loop().time() < deadline, "the replica Lease was not renewed"
        await asyncio.sleep(0.05)
    lease = await kube.get_lease(OPS, lease_name(node))
    assert lease is not None, "the Lease of the claim made again was deleted"
    assert lease["spec"]["holderIdentity"] == leases.holder
    other = NodeLeases(kube, namespace=OPS, identity=unique("other"), duration_s=15)
    assert await other.claim(node) is None  # held
    await again.release()
    await leases.flush()
    assert await kube.get_lease(OPS, lease_name(node)) is None
    await leases.close()
    await other.close()


async def test_a_release_never_deletes_the_lease_a_claim_of_the_replica_holds(kube: KubeClient) -> None:
    """Whatever Lease a release is handed (one made again at a renewal, or read back after a 409), a Lease a
    claim of this replica holds now stays: deleting it would let another replica take a node being drained."""
    leases = NodeLeases(kube, namespace=OPS, identity=unique("holds"), duration_s=15)
    node = unique("n13")
    claim = await leases.claim(node)
    assert claim is not None
    assert await leases.clear(claim.lease) is True  # left to the claim that holds it
    lease = await kube.get_lease(OPS, lease_name(node))
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == leases.holder
    await claim.release()
    await leases.flush()
    assert await kube.get_lease(OPS, lease_name(node)) is None
    await leases.close()


async def test_a_claim_that_fails_gives_back_the_release_it_took_over(kube: KubeClient) -> None:
    """A claim takes an unanswered release over; when the claim itself fails (the API server still
    failing), the release is made again at the next renewal as before, not dropped."""
    scripted = ScriptedLeaseWrites(kube)
    leases = NodeLeases(scripted, namespace=OPS, identity=unique("fails"), duration_s=15)  # type: ignore[arg-type]
    node = unique("n14")
    claim = await leases.claim(node)
    keep = await leases.claim(unique("n14"))  # another node held: the replica Lease stays renewed
    assert claim is not None
    assert keep is not None
    scripted.fail = kube.attempts + 1  # each attempt of the batch, then the release alone
    await claim.release()
    await leases.flush()  # answered 500
    assert lease_name(node) in leases.replica.unreleased

    def unavailable() -> None:
        raise KubeError(503, "ServiceUnavailable", "the server is currently unable to handle the request")

    scripted.during = unavailable
    with pytest.raises(KubeError):
        await leases.claim(node)  # created already: read, then taken over by a replace that fails
    scripted.during = None
    assert lease_name(node) in leases.replica.unreleased
    await keep.release()
    await leases.close()


async def test_a_batch_of_releases_deletes_what_its_selector_names_and_answers_with_their_names(
    kube: KubeClient, requests: Requests
) -> None:
    """``deletecollection`` with a set-based label selector: the Leases named go, in one request, and the
    answer lists them; a Lease of another holder, or not named, stays."""
    names = [unique("batch") for _ in range(4)]
    for name, holder, lease_label in zip(names, ["a", "a", "a", "b"], ["x", "y", "z", "x"], strict=True):
        await kube.create_lease(
            OPS,
            {
                "metadata": {"name": name, "labels": {HOLDER_LABEL: holder, LEASE_LABEL: lease_label}},
                "spec": {"holderIdentity": holder},
            },
        )
    requests.made.clear()
    deleted = await kube.delete_leases(OPS, f"{HOLDER_LABEL}=a,{LEASE_LABEL} in (x,y)")
    assert requests.made == {"deletecollection leases": 1}
    assert sorted(deleted) == sorted(names[:2])
    assert [await kube.get_lease(OPS, name) is None for name in names] == [True, True, False, False]
    assert await kube.delete_leases(OPS, f"{HOLDER_LABEL}=a,{LEASE_LABEL} in (x,y)") == []
    for name in names[2:]:
        await kube.delete_lease(OPS, name)


async def test_a_batch_of_releases_leaves_the_lease_another_replica_took(kube: KubeClient) -> None:
    """A replica paused past its Lease's lapse has not noticed it yet when it releases: the node Lease was
    taken meanwhile, and the taker's holder label keeps it out of the batch's selector."""
    node = unique("n15")
    paused = NodeLeases(kube, namespace=OPS, identity=unique("paused"), duration_s=15)
    claim = await paused.claim(node)
    assert claim is not None
    await stop_renewing(paused)
    await backdate(kube, paused.replica.name)  # lapsed, as another replica reads it
    taker = NodeLeases(kube, namespace=OPS, identity=unique("taker"), duration_s=15)
    taken = await taker.claim(node)
    assert taken is not None
    assert not claim.lost.is_set()  # the paused replica has not looked at its clock yet
    await claim.release()
    await paused.flush()
    lease = await kube.get_lease(OPS, lease_name(node))
    assert lease is not None, "the batch deleted the Lease the taker holds"
    assert lease["spec"]["holderIdentity"] == taker.holder
    await taken.release()
    await taker.close()
    await paused.close()


async def test_a_node_claimed_again_before_its_release_is_sent_keeps_its_lease(kube: KubeClient) -> None:
    """A release waits for others before it is sent; a claim of the same node meanwhile (a Spot warning
    after the rebalance drain it ended) takes the Lease over, and the batch no longer names it."""
    leases = NodeLeases(kube, namespace=OPS, identity=unique("again"), duration_s=15)
    node = unique("n16")
    claim = await leases.claim(node)
    assert claim is not None
    await claim.release()  # not sent yet
    again = await leases.claim(node)
    assert again is not None
    await leases.flush()
    lease = await kube.get_lease(OPS, lease_name(node))
    assert lease is not None, "the batch deleted the Lease of the claim made again"
    other = NodeLeases(kube, namespace=OPS, identity=unique("other"), duration_s=15)
    assert await other.claim(node) is None  # held
    await again.release()
    await leases.close()  # sends the release
    assert await kube.get_lease(OPS, lease_name(node)) is None
    await other.close()


class GatedBatches(ScriptedLeaseWrites):
    """Batches of releases held on their way until :attr:`gate` opens (:attr:`waiting` set meanwhile); the
    Lease requests made while a batch is held are kept in :attr:`early`."""

    def __init__(self, kube: KubeClient) -> None:
        super().__init__(kube)
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self.early: list[str] = []

    async def delete_leases(self, namespace: str, label_selector: str, **kwargs: Any) -> list[str]:
        self.waiting.set()
        await self.gate.wait()
        return await super().delete_leases(namespace, label_selector, **kwargs)

    def _note(self, what: str) -> None:
        if self.waiting.is_set() and not self.gate.is_set():
            self.early.append(what)

    async def create_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        self._note("create")
        created: dict[str, Any] = await self.kube.create_lease(namespace, lease)
        return created

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._note("get")
        return await self.kube.get_lease(namespace, name)

    async def replace_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        self._note("replace")
        return await super().replace_lease(namespace, lease)


async def test_a_claim_waits_for_the_batch_being_sent_that_names_its_lease(kube: KubeClient) -> None:
    """A batch on its way selects the Lease by labels a claim made again would keep: the claim waits for the
    batch's answer, then creates the Lease again, rather than take over one the batch then deletes."""
    gated = GatedBatches(kube)
    leases = NodeLeases(gated, namespace=OPS, identity=unique("sending"), duration_s=15)  # type: ignore[arg-type]
    node = unique("n17")
    claim = await leases.claim(node)
    assert claim is not None
    await claim.release()
    flushing = asyncio.create_task(leases.flush())
    await gated.waiting.wait()  # the batch is on its way
    claiming = asyncio.create_task(leases.claim(node))
    for _ in range(20):  # the claim's first request, were it not waiting, is made in the first of these
        await asyncio.sleep(0)
    assert gated.early == []  # waiting for the batch
    gated.gate.set()
    await flushing
    again = await claiming
    assert again is not None
    lease = await kube.get_lease(OPS, lease_name(node))
    assert lease is not None, "the batch deleted the Lease of the claim made again"
    assert lease["spec"]["holderIdentity"] == leases.holder
    await again.release()
    await leases.close()
    assert await kube.get_lease(OPS, lease_name(node)) is None


class HangingBatches(ScriptedLeaseWrites):
    """Batches of releases never answered, as the client waits for a request it cannot take back (a
    cancellation waits for the answer; a second one ends the wait); ``refuse`` answers them with that error
    instead."""

    def __init__(self, kube: KubeClient) -> None:
        super().__init__(kube)
        self.refuse: KubeError | None = None

    async def delete_leases(self, namespace: str, label_selector: str, **kwargs: Any) -> list[str]:
        if self.refuse is not None:
            raise self.refuse
        never = asyncio.get_running_loop().create_future()
        try:
            await asyncio.shield(never)
        except asyncio.CancelledError:
            await never
        return []


async def test_a_shutdown_is_bounded_when_the_batch_of_releases_hangs(kube: KubeClient) -> None:
    """The API server stops answering the batch: the shutdown gives it half its time, then abandons it and
    still deletes the replica's own Lease (what it named is then free to any replica)."""
    hanging = HangingBatches(kube)
    leases = NodeLeases(hanging, namespace=OPS, identity=unique("hangs"), duration_s=15)  # type: ignore[arg-type]
    claim = await leases.claim(unique("n18"))
    assert claim is not None
    await claim.release()
    async with asyncio.timeout(30):  # a hang guard: the shutdown's own bound is 1 s
        await leases.close(timeout_s=1.0)
    assert await kube.get_lease(OPS, leases.replica.name) is None


async def test_a_refused_batch_releases_each_lease_alone_and_batches_stop(
    kube: KubeClient, requests: Requests
) -> None:
    """A Role without ``deletecollection`` (an operator's own RBAC, from before the verb): the release is
    made alone at once, logged once, and the next ones go alone from the start."""
    refusing = HangingBatches(kube)
    refusing.refuse = KubeError(403, "Forbidden", 'cannot deletecollection resource "leases"')
    leases = NodeLeases(refusing, namespace=OPS, identity=unique("no-verb"), duration_s=15)  # type: ignore[arg-type]
    nodes = [unique("n19"), unique("n19")]
    first = await leases.claim(nodes[0])
    assert first is not None
    await first.release()
    await leases.flush()
    assert leases.batches is False
    assert await kube.get_lease(OPS, lease_name(nodes[0])) is None
    second = await leases.claim(nodes[1])
    assert second is not None
    requests.made.clear()
    await second.release()
    assert requests.made == {"delete leases": 1}  # alone, at once
    assert await kube.get_lease(OPS, lease_name(nodes[1])) is None
    await leases.close()


async def test_a_batch_is_not_sent_once_the_replica_lease_may_be_read_lapsed_soon(
    kube: KubeClient, requests: Requests
) -> None:
    """A replica of an earlier version that takes a Lease over keeps the labels it found, so a batch is sent
    only while no replica can read this one's Lease lapsed: past two thirds of its duration without a
    renewal, the releases go alone, each on the resourceVersion we wrote."""
    now = [1000.0]
    leases = NodeLeases(kube, namespace=OPS, identity=unique("late"), duration_s=15, clock=lambda: now[0])
    node = unique("n20")
    claim = await leases.claim(node)
    assert claim is not None
    await claim.release()  # the last claim: the renewal stops
    now[0] += 11  # 11 of 15 s without a renewal (a paused process, a renewal failing)
    requests.made.clear()
    await leases.flush()
    assert "deletecollection leases" not in requests.made
    assert requests.made["delete leases"] == 1
    assert await kube.get_lease(OPS, lease_name(node)) is None
    await leases.close()


async def test_the_lease_watch_sees_who_holds_a_node_and_the_events_handed_over(kube: KubeClient) -> None:
    """Issue 47.1: replica B waits for the node Lease replica A holds (no claim tried again meanwhile) and hands
    a Spot warning over on it; A's watch tells A of the warning as soon as it is written, and B's watch tells B
    when A releases the Lease."""
    from datetime import UTC, datetime

    from queue_processor.events import SpotInterruptionEvent
    from queue_processor.rules import annotation, events_in

    a = NodeLeases(kube, namespace=OPS, identity=unique("replica-a"), duration_s=60)
    b = NodeLeases(kube, namespace=OPS, identity=unique("replica-b"), duration_s=60)
    told: list[list[str]] = []
    a.watch.on_handed = lambda name, handed: told.append(sorted(handed))
    node = unique("ip-10-6-9")
    name = lease_name(node)
    try:
        a.watch.start()
        b.watch.start()
        assert await a.watch.wait_first_answer(30)
        assert await b.watch.wait_first_answer(30)
        held = await a.claim(node)
        assert held is not None
        assert await b.claim(node) is None
        waiting = asyncio.create_task(b.watch.released(name, a.holder, 60))
        for _ in range(200):  # until B's copy has A's Lease (the watch delivers it)
            if b.watch.holder(name) == a.holder:
                break
            await asyncio.sleep(0.05)
        assert b.watch.holder(name) == a.holder
        warning = SpotInterruptionEvent(instance_id="i-0handed", time=datetime.now(UTC), source_id="spot-1")
        key, value = annotation(warning)
        await kube.patch_lease(OPS, name, {"metadata": {"annotations": {key: value}}})
        for _ in range(200):
            if told:
                break
            await asyncio.sleep(0.05)
        assert told == [[key]]
        assert [event.event_id for event in events_in(a.watch.handed(name), "i-0handed")] == [
            warning.event_id
        ]
        assert not waiting.done()  # an annotation is not a release
        await held.release()
        await a.flush()
        await asyncio.wait_for(waiting, 30)
        assert b.watch.holder(name) is None
        again = await b.claim(node)
        assert again is not None
        assert b.watch.handed(name) == {}  # the events went with the released Lease
        await again.release()
    finally:
        await a.close()
        await b.close()
