"""The controller's Kubernetes client against the API emulation: node calls (cordon) never queue behind
drain traffic, neither at the rate limiter nor in the thread pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from queue_processor.kube import URGENT_THREADS, KubeClient, load_api_client
from queue_processor.outcomes import KubeError
from queue_processor.rest import URGENT_RANK
from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.kube import KubeSandbox


@pytest.mark.parametrize("call", ["node", "lease", "node pages"])
async def test_node_and_lease_calls_are_answered_while_every_drain_thread_waits_on_a_slow_api_server(
    tmp_path: Path, call: str
) -> None:
    """Cordons, Lease renewals (a late renewal loses the node to another replica) and the pages of the nodes'
    watched copy (each cordon's GET until they are in) have a lane of their own."""
    with KubeSandbox(SandboxClock(1.0)) as sandbox:
        sandbox.ensure_namespace("ops")
        sandbox.add_node("ip-10-0-0-1.ec2.internal")
        sandbox.wait_for_nodes(["ip-10-0-0-1.ec2.internal"])
        client = KubeClient(load_api_client(str(sandbox.kubeconfig(tmp_path / "kubeconfig"))), threads=4)
        try:
            sandbox.inject_fault("list", "pods", delay_s=2.0, count=8)
            slow = [
                asyncio.create_task(client.pods_on_node("ip-10-0-0-1.ec2.internal", cached=False))
                for _ in range(8)
            ]
            await asyncio.sleep(0.2)  # every drain thread now waits for a slow answer
            if call == "node":
                assert await client.get_node("ip-10-0-0-1.ec2.internal") is not None
            elif call == "node pages":  # the watched copy of the nodes, which spares each cordon its GET
                pages = [items async for items, _ in client.node_pages()]
                assert [node["metadata"]["name"] for items in pages for node in items] == [
                    "ip-10-0-0-1.ec2.internal"
                ]
            else:
                lease = {"metadata": {"name": "l", "namespace": "ops"}, "spec": {"holderIdentity": "me"}}
                created = await client.create_lease("ops", lease)
                await client.replace_lease("ops", created)
                assert await client.get_lease("ops", "l") is not None
            assert not any(task.done() for task in slow), f"the {call} call waited behind the pod lists"
            await asyncio.gather(*slow)
        finally:
            client.close()


async def test_the_replica_lease_is_renewed_while_every_urgent_thread_waits_on_a_slow_api_server(
    tmp_path: Path,
) -> None:
    """A storm on a slow API server: its claims and cordons fill the urgent threads and more queue for them.
    The replica Lease's renewal (queue_processor.rest.REPLICA_RANK) has threads of its own: queued behind
    them, it would let every claim the replica holds lapse."""
    name = "ip-10-0-0-1.ec2.internal"
    with KubeSandbox(SandboxClock(1.0)) as sandbox:
        sandbox.ensure_namespace("ops")
        sandbox.add_node(name)
        sandbox.wait_for_nodes([name])
        client = KubeClient(load_api_client(str(sandbox.kubeconfig(tmp_path / "kubeconfig"))))
        try:
            lease = {"metadata": {"name": "replica", "namespace": "ops"}, "spec": {"holderIdentity": "me"}}
            created = await client.create_lease("ops", lease)
            fault = sandbox.inject_fault("get", "nodes", delay_s=8.0, count=URGENT_THREADS + 4)

            async def operation_s_read() -> None:
                URGENT_RANK.set(100.0)  # an operation's, as the handler ranks it
                assert await client.get_node(name) is not None

            slow = [asyncio.create_task(operation_s_read()) for _ in range(URGENT_THREADS + 4)]
            for _ in range(
                3000
            ):  # until every urgent thread waits for a slow answer (four reads queue behind)
                if fault.count <= 4:
                    break
                await asyncio.sleep(0.01)
            assert fault.count == 4, "the operations' reads never filled the urgent threads"
            await client.replace_lease("ops", created)  # this task's rank: the replica's own
            assert not any(task.done() for task in slow), "the renewal waited behind the operations' reads"
            await asyncio.gather(*slow)
        finally:
            client.close()


async def test_throttled_and_reset_calls_are_retried_inside_the_call_and_an_eviction_is_not(
    tmp_path: Path,
) -> None:
    # API Priority and Fairness answers 429 with Retry-After: a cordon (a PATCH, which urllib3 never retries)
    # is tried again after it, as are a connection reset and a 503; an eviction's 429 is the drain's to judge.
    # (Emulation only: a real API server does not throttle or reset on demand.)
    with KubeSandbox(SandboxClock(1.0)) as sandbox:
        name = "ip-10-0-0-1.ec2.internal"
        sandbox.add_node(name)
        sandbox.add_pod("default", "web", node=name)
        sandbox.wait_for_nodes([name])
        client = KubeClient(load_api_client(str(sandbox.kubeconfig(tmp_path / "kubeconfig"))))
        try:
            faults = [
                sandbox.inject_fault("patch", "nodes", status=429, count=1, retry_after_s=1),
                sandbox.inject_fault("patch", "nodes", reset=True, count=1),
                sandbox.inject_fault("patch", "nodes", status=503, count=1),
            ]
            node = await client.patch_node(name, {"spec": {"unschedulable": True}})
            assert node["spec"]["unschedulable"] is True
            assert [fault.count for fault in faults] == [0, 0, 0]
            sandbox.inject_fault("create", "pods/eviction", status=429, count=1, retry_after_s=1)
            with pytest.raises(KubeError) as refused:
                await client.evict("default", "web")
            assert (refused.value.status, refused.value.retry_after_s) == (429, 1.0)
        finally:
            client.close()


async def test_a_cancelled_write_is_over_on_the_server_when_its_caller_is(tmp_path: Path) -> None:
    """Issue "Interruptions in combination" 7: a drain stopped (its operation failed or was cancelled) while
    one of its evictions was still on its way. The thread cannot be stopped, so the POST still reached the
    server later, evicting the pod while the next drain of the node (a terminate action arriving 0.4 s later)
    had listed it as running and evicted it too: two drains at once. A cancelled write now returns only once
    the server has answered it (a GET is left behind: it changes nothing)."""
    with KubeSandbox(SandboxClock(1.0)) as sandbox:
        sandbox.ensure_namespace("apps")
        sandbox.add_node("ip-10-0-0-2.ec2.internal")
        sandbox.wait_for_nodes(["ip-10-0-0-2.ec2.internal"])
        sandbox.add_pod("apps", "web-0", node="ip-10-0-0-2.ec2.internal", grace_s=30)
        client = KubeClient(load_api_client(str(sandbox.kubeconfig(tmp_path / "kubeconfig"))))
        try:
            fault = sandbox.inject_fault("create", "pods/eviction", delay_s=1.0)
            eviction = asyncio.create_task(client.evict("apps", "web-0"))
            while fault.count:  # noqa: ASYNC110 - the server has taken the request (and sits on it)
                await asyncio.sleep(0.01)
            eviction.cancel()
            with pytest.raises(asyncio.CancelledError):
                await eviction
            pod = sandbox.get("pods", "web-0", "apps")
            assert pod is not None
            assert pod["metadata"].get("deletionTimestamp")  # the server had done it before we went on
        finally:
            client.close()
