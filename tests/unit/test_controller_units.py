"""Small pieces of the controller: the rate limiter, batched DescribeInstances, heartbeat intervals, the
requeue backoff and the managed-tag check."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from queue_processor.config import load_settings
from queue_processor.consumer import REQUEUE_MAX_S, requeue_backoff_s
from queue_processor.events import AsgTerminateLifecycleEvent
from queue_processor.kube import RateLimiter
from queue_processor.lifecycle import MAX_HEARTBEAT_UNTIL_S, Heartbeats, Lifecycle, action_params
from queue_processor.nodes import InstanceInfo, InstanceResolver, is_managed

QUEUE = "https://sqs.us-east-1.amazonaws.com/1/q"


async def test_rate_limiter_allows_a_burst_then_the_rate() -> None:
    limiter = RateLimiter(qps=50, burst=5)
    started = time.monotonic()
    for _ in range(5):
        await limiter.acquire()
    assert time.monotonic() - started < 0.05  # the burst is free
    for _ in range(10):
        await limiter.acquire()
    assert time.monotonic() - started >= 10 / 50 * 0.9  # then 50 per second


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


class FakeAutoscaling:
    def __init__(self, timeout: int) -> None:
        self.timeout = timeout
        self.describes = 0

    async def describe_lifecycle_hooks(self, **kwargs: Any) -> dict[str, Any]:
        self.describes += 1
        return {"LifecycleHooks": [{"HeartbeatTimeout": self.timeout}]}


ACTION = AsgTerminateLifecycleEvent(
    instance_id="i-1",
    time="2026-11-22T12:00:00Z",  # type: ignore[arg-type]
    auto_scaling_group_name="workers",
    lifecycle_hook_name="drain",
    lifecycle_action_token="tok",
    lifecycle_transition="autoscaling:EC2_INSTANCE_TERMINATING",
)


@pytest.mark.parametrize(("interval", "expected"), [("-1", 150.0), ("0", None), ("60", 60.0)])
async def test_heartbeat_interval(
    monkeypatch: pytest.MonkeyPatch, interval: str, expected: float | None
) -> None:
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    monkeypatch.setenv("HEARTBEAT_INTERVAL", interval)
    autoscaling = FakeAutoscaling(300)
    lifecycle = Lifecycle(autoscaling, load_settings())
    assert await lifecycle.interval_s(ACTION) == expected
    await lifecycle.interval_s(ACTION)
    assert autoscaling.describes == (1 if interval == "-1" else 0)  # read once per hook, cached
    assert lifecycle.until_s() == MAX_HEARTBEAT_UNTIL_S


def test_actions_are_addressed_by_token_else_by_instance() -> None:
    assert action_params(ACTION)["LifecycleActionToken"] == "tok"
    without = ACTION.model_copy(update={"lifecycle_action_token": None})
    assert action_params(without)["InstanceId"] == "i-1"
    assert "LifecycleActionToken" not in action_params(without)


def test_requeue_backoff_grows_with_receives_and_is_capped() -> None:
    first = [requeue_backoff_s(1) for _ in range(200)]
    assert min(first) >= 8
    assert max(first) <= 12
    assert 64 <= requeue_backoff_s(4) <= 96
    assert requeue_backoff_s(50) <= REQUEUE_MAX_S * 1.2


async def test_urgent_callers_pass_the_rate_limiter_first() -> None:
    limiter = RateLimiter(qps=20, burst=1)
    await limiter.acquire()  # the bucket is empty now
    order: list[str] = []

    async def take(name: str, urgent: bool) -> None:
        await limiter.acquire(urgent=urgent)
        order.append(name)

    ordinary = [asyncio.create_task(take(f"drain-{n}", False)) for n in range(3)]
    await asyncio.sleep(0)  # the ordinary callers queue first
    cordon = asyncio.create_task(take("cordon", True))
    await asyncio.gather(*ordinary, cordon)
    assert order[0] == "cordon"


async def test_liveness_holds_while_a_full_budget_makes_the_loops_wait() -> None:
    from queue_processor.coalesce import EventStore
    from queue_processor.consumer import Consumer

    class NeverAnswers:
        async def receive_message(self, **_: Any) -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

    consumer = Consumer(
        NeverAnswers(),
        SimpleNamespace(heartbeats=Heartbeats(None)),  # type: ignore[arg-type]  # no message ever arrives
        EventStore(),
        queue_urls=["q"],
        in_flight_budget=2,
        loops_per_queue=2,
        visibility_timeout_s=30,
    )
    for _ in range(2):
        await consumer._budget.acquire()  # every slot held by operations under way
    consumer.start()
    try:
        await asyncio.sleep(0.01)
        consumer.loop_heartbeat -= 600  # no iteration for ten minutes, but the loops wait for slots
        assert consumer.alive()
        consumer._budget.release()  # one loop gets a slot and sits in a receive that never answers
        await asyncio.sleep(0.01)
        assert consumer.alive()  # the other still waits for a slot
        consumer._budget.release()
        await asyncio.sleep(0.01)
        assert not consumer.alive()  # slots free, no iteration for ten minutes: stuck
        for task in consumer._loops:
            task.cancel()
        await asyncio.gather(*consumer._loops, return_exceptions=True)
        assert not consumer.alive()  # a dead loop is never alive
    finally:
        await consumer.shutdown()


@pytest.mark.parametrize(("age_s", "beats_at_once"), [(600.0, True), (1.0, False)])
async def test_an_old_action_gets_its_first_heartbeat_at_once(
    monkeypatch: pytest.MonkeyPatch, age_s: float, beats_at_once: bool
) -> None:
    # A terminate action redelivered after a failed drain and its backoff has gone a whole interval without
    # a heartbeat: waiting another interval could outlast the hook's HeartbeatTimeout.
    from datetime import UTC, datetime, timedelta

    monkeypatch.setenv("QUEUE_URL", QUEUE)
    monkeypatch.setenv("HEARTBEAT_INTERVAL", "30")
    beat = asyncio.Event()

    class Recording(FakeAutoscaling):
        async def record_lifecycle_action_heartbeat(self, **kwargs: Any) -> dict[str, Any]:
            beat.set()
            return {}

    action = ACTION.model_copy(update={"time": datetime.now(UTC) - timedelta(seconds=age_s)})
    heartbeats = Heartbeats(Lifecycle(Recording(300), load_settings()))
    heartbeats.start(action)
    try:
        if beats_at_once:
            await asyncio.wait_for(beat.wait(), 30)
        else:
            for _ in range(20):  # the task runs, reads the interval and goes to sleep for ~29 s
                await asyncio.sleep(0)
            assert heartbeats.running == 1
            assert not beat.is_set()
    finally:
        await heartbeats.close()
    assert heartbeats.running == 0


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
    await asyncio.sleep(0.05)  # its call is under way
    quick = await asyncio.wait_for(resolver.get("i-quick"), 1.0)
    assert quick is not None
    assert not slow.done()
    release.set()
    assert (await slow) is not None
    assert calls == [["i-slow"], ["i-quick"]]
    await resolver.close()


async def test_an_empty_receive_counts_as_an_answer() -> None:
    # An idle queue answers every long poll with no message: that still proves SQS is reachable (readiness,
    # and the receive gauge QueueProcessorNotProcessing watches).
    from queue_processor.coalesce import EventStore
    from queue_processor.consumer import Consumer

    class Empty:
        async def receive_message(self, **_: Any) -> dict[str, Any]:
            await asyncio.sleep(0.01)
            return {}

    answered: list[str] = []
    consumer = Consumer(
        Empty(),
        SimpleNamespace(heartbeats=Heartbeats(None)),  # type: ignore[arg-type]  # no message arrives
        EventStore(),
        queue_urls=["q"],
        in_flight_budget=2,
        loops_per_queue=1,
        visibility_timeout_s=30,
        on_answer=answered.append,
    )
    consumer.start()
    try:
        await asyncio.sleep(0.1)
    finally:
        await consumer.shutdown()
    assert answered
    assert set(answered) == {"q"}
