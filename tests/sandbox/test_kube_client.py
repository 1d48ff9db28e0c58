"""The controller's Kubernetes client against the API emulation: node calls (cordon) never queue behind
drain traffic, neither at the rate limiter nor in the thread pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

from queue_processor.kube import KubeClient, load_api_client
from queue_processor.sandbox.clock import SandboxClock
from queue_processor.sandbox.kube import KubeSandbox


async def test_a_node_call_is_answered_while_every_drain_thread_waits_on_a_slow_api_server(
    tmp_path: Path,
) -> None:
    with KubeSandbox(SandboxClock(1.0)) as sandbox:
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
            node = await client.get_node("ip-10-0-0-1.ec2.internal")
            assert node is not None
            assert not any(task.done() for task in slow), "the node call waited behind the pod lists"
            await asyncio.gather(*slow)
        finally:
            client.close()
