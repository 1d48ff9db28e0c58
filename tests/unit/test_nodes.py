"""Instance → node: batched, cached DescribeInstances and the managed-tag check."""

from __future__ import annotations

import asyncio
from typing import Any

from queue_processor.aws import InstanceInfo, InstanceResolver, is_managed


async def test_instances_asked_together_are_described_in_one_call_and_cached() -> None:
    calls: list[list[str]] = []

    async def describe(ids: list[str]) -> list[dict[str, Any]]:
        calls.append(sorted(ids))
        return [
            {
                "InstanceId": i,
                "PrivateDnsName": f"{i}.internal",
                "Placement": {"AvailabilityZone": "us-east-1a"},
                "State": {"Name": "running"},
                "Tags": [{"Key": "k", "Value": "v"}],
            }
            for i in ids
            if i != "i-unknown"
        ]

    resolver = InstanceResolver(describe, window_s=0.01)
    found = await asyncio.gather(*(resolver.get(i) for i in ["i-1", "i-2", "i-1", "i-unknown"]))
    assert calls == [["i-1", "i-2", "i-unknown"]]
    assert [f.private_dns_name if f else None for f in found] == [
        "i-1.internal",
        "i-2.internal",
        "i-1.internal",
        None,
    ]
    assert found[0] is not None
    assert found[0].provider_id == "aws:///us-east-1a/i-1"
    await resolver.get("i-1")
    assert len(calls) == 1  # cached
    await resolver.get("i-1", fresh=True)
    assert len(calls) == 2


def test_managed_tag_check() -> None:
    info = InstanceInfo("i-1", "n", "us-east-1a", "running", {"team/managed": "blue"})
    assert is_managed(info, check=False, tag="other")
    assert is_managed(info, check=True, tag="team/managed")
    assert is_managed(info, check=True, tag="team/managed", value="blue")
    assert not is_managed(info, check=True, tag="team/managed", value="green")
    assert not is_managed(info, check=True, tag="other")


async def test_a_batch_does_not_wait_for_the_call_before_it() -> None:
    # During a storm a DescribeInstances call may take a few hundred ms; instances asked meanwhile go out in
    # their own call at once (up to `concurrency` calls), not after it.
    release = asyncio.Event()
    calls: list[list[str]] = []

    async def describe(ids: list[str]) -> list[dict[str, Any]]:
        calls.append(sorted(ids))
        if ids == ["i-slow"]:
            await release.wait()
        return [{"InstanceId": i, "PrivateDnsName": f"{i}.internal"} for i in ids]

    resolver = InstanceResolver(describe, window_s=0.01, concurrency=2)
    slow = asyncio.create_task(resolver.get("i-slow"))
    while not calls:  # noqa: ASYNC110 - wait until its call is under way
        await asyncio.sleep(0.001)
    quick = await asyncio.wait_for(resolver.get("i-quick"), 30)  # it would hang if it waited for i-slow
    assert quick is not None
    assert not slow.done()
    release.set()
    assert (await slow) is not None
    assert calls == [["i-slow"], ["i-quick"]]
    await resolver.close()


async def test_many_instances_are_described_in_batches_in_their_order_without_a_task_each() -> None:
    calls: list[list[str]] = []

    async def describe(ids: list[str]) -> list[dict[str, Any]]:
        calls.append(list(ids))
        return [{"InstanceId": i, "State": {"Name": "running"}} for i in ids if i != "i-unknown"]

    resolver = InstanceResolver(describe, window_s=0.0, max_batch=2)
    await resolver.get("i-0")  # cached
    before = len(asyncio.all_tasks())
    asked = asyncio.ensure_future(resolver.get_many(["i-3", "i-unknown", "i-0", "i-1", "i-2"]))
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) <= before + 2  # itself and the batch, not one per instance
    found = await asked
    assert [info.instance_id if info else None for info in found] == ["i-3", None, "i-0", "i-1", "i-2"]
    assert calls[1:] == [["i-3", "i-unknown"], ["i-1", "i-2"]]  # i-0 from the cache, then 2 at a time
    again = await resolver.get_many(["i-0", "i-1"], fresh=True)
    assert calls[-1] == ["i-0", "i-1"]
    assert all(again)
