"""Node Leases through the controller's client, on the emulation and the real control plane: one holder at a
time, takeover after expiry, renewal, release."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from queue_processor.kube import KubeClient
from queue_processor.leases import NodeLeases, lease_name
from queue_processor.outcomes import ClaimLost
from queue_processor_sandbox.cluster import KubeCluster
from tests.sandbox.conftest import Requests

OPS = f"ops-{uuid.uuid4().hex[:6]}"


#: The sandbox clock's scale for this module's cluster (tests/sandbox/conftest.py).
CLOCK_SCALE = 0.01


@pytest.fixture(autouse=True)
def ops(cluster: KubeCluster) -> None:
    cluster.ensure_namespace(OPS)


async def test_a_first_claim_is_one_request_and_a_later_one_takes_the_released_lease(
    kube: KubeClient, requests: Requests
) -> None:
    """A storm's claims are of nodes never claimed: the Lease is created at once, without a read first. A node
    claimed before keeps its released Lease: the create is refused (409 AlreadyExists), the Lease read and
    taken."""
    node = f"ip-10-6-0-{uuid.uuid4().hex[:6]}.ec2.internal"
    leases = NodeLeases(kube, namespace=OPS, identity="replica-a", duration_s=60)
    requests.made.clear()
    first = await leases.claim(node)
    assert first is not None
    assert requests.made == {"create leases": 1}
    await first.release()
    again = await NodeLeases(kube, namespace=OPS, identity="replica-b", duration_s=60).claim(node)
    assert again is not None
    assert again.lease["spec"]["holderIdentity"] == "replica-b"
    await again.release()


async def test_one_replica_holds_a_node_at_a_time(kube: KubeClient) -> None:
    a = NodeLeases(kube, namespace=OPS, identity="replica-a", duration_s=60)
    b = NodeLeases(kube, namespace=OPS, identity="replica-b", duration_s=60)
    claims = await asyncio.gather(a.claim("ip-10-0-0-1.ec2.internal"), b.claim("ip-10-0-0-1.ec2.internal"))
    assert sum(claim is not None for claim in claims) == 1  # exactly one wins the race
    winner = next(claim for claim in claims if claim is not None)
    loser = b if winner.lease["spec"]["holderIdentity"] == "replica-a" else a
    assert await loser.claim("ip-10-0-0-1.ec2.internal") is None
    await winner.release()
    again = await loser.claim("ip-10-0-0-1.ec2.internal")  # released: the other may take it
    assert again is not None
    assert again.lease["spec"]["leaseTransitions"] >= 1
    await again.release()


async def test_a_lease_whose_holder_stopped_renewing_is_taken_over(kube: KubeClient) -> None:
    gone = NodeLeases(kube, namespace=OPS, identity="crashed", duration_s=15)
    claim = await gone.claim(f"n2-{id(kube)}")
    assert claim is not None
    claim._renewer.cancel()  # the replica died: nobody renews
    lease = await kube.get_lease(OPS, lease_name(f"n2-{id(kube)}"))
    assert lease is not None
    lease["spec"]["renewTime"] = "2020-01-01T00:00:00.000000Z"  # long expired
    await kube.replace_lease(OPS, lease)
    taker = NodeLeases(kube, namespace=OPS, identity="alive", duration_s=15)
    taken = await taker.claim(f"n2-{id(kube)}")
    assert taken is not None
    assert taken.lease["spec"]["holderIdentity"] == "alive"
    await taken.release()


async def test_the_holder_renews_and_release_stops_the_renewal(kube: KubeClient) -> None:
    leases = NodeLeases(kube, namespace=OPS, identity="me", duration_s=15, renew_every_s=0.05)
    claim = await leases.claim("n3")
    assert claim is not None
    first = claim.lease["spec"]["renewTime"]
    deadline = asyncio.get_running_loop().time() + 30  # a hang guard: renewals come every 50 ms
    while claim.lease["spec"]["renewTime"] == first:
        assert asyncio.get_running_loop().time() < deadline, "the Lease was never renewed"
        await asyncio.sleep(0.05)
    await claim.release()
    assert claim._renewer.done()
    lease = await kube.get_lease(OPS, lease_name("n3"))
    assert lease is not None
    assert not lease["spec"].get("holderIdentity")


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

    async def replace_lease(self, namespace: str, lease: dict[str, object]) -> dict[str, object]:
        self.writes += 1
        answer = await self.kube.replace_lease(namespace, lease)
        await asyncio.sleep(self.delay_s)
        return answer


async def test_concurrent_confirms_and_the_renewal_never_lose_our_own_lease(kube: KubeClient) -> None:
    """Every eviction and completion confirms the Lease first. Once a renewal period has passed, they all
    want it renewed at the same moment as the background renewal, each with the same resourceVersion: one
    renewal goes out and the others wait for its answer, and the Lease is never lost to our own writes (a 409
    whose holder is still us is not a loss)."""
    slow = SlowLeaseWrites(kube, delay_s=0.2)
    leases = NodeLeases(slow, namespace=OPS, identity="me", duration_s=15, renew_every_s=0.05)  # type: ignore[arg-type]
    node = f"n4-{id(kube)}"
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
    lease = await kube.get_lease(OPS, lease_name(node))
    assert lease is not None
    assert not lease["spec"].get("holderIdentity")  # released: the next replica takes it at once


async def test_a_lease_another_replica_really_took_is_lost_and_left_to_it(kube: KubeClient) -> None:
    node = f"n5-{id(kube)}"
    paused = NodeLeases(kube, namespace=OPS, identity="paused", duration_s=15, renew_every_s=0.05)
    claim = await paused.claim(node)
    assert claim is not None
    claim._renewer.cancel()  # SIGSTOP: nothing renews
    lease = await kube.get_lease(OPS, lease_name(node))
    assert lease is not None
    lease["spec"]["renewTime"] = "2020-01-01T00:00:00.000000Z"  # lapsed while the process was paused
    await kube.replace_lease(OPS, lease)
    other = NodeLeases(kube, namespace=OPS, identity="other", duration_s=15)
    taken = await other.claim(node)
    assert taken is not None
    claim.renewed_at -= 1.0  # the paused replica wakes up: its last renewal is a renewal period old
    with pytest.raises(ClaimLost):
        await claim.confirm()
    assert claim.lost.is_set()
    await claim.release()  # a lost Lease is not released: it is the other replica's
    held = await kube.get_lease(OPS, lease_name(node))
    assert held is not None
    assert held["spec"]["holderIdentity"] == "other"
    await taken.release()
