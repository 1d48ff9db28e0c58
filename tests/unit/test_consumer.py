"""The consumer's own logic: requeue backoff, liveness while the in-flight budget is full, receive answers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from queue_processor.coalesce import EventStore
from queue_processor.config import REQUEUE_MAX_S
from queue_processor.consumer import Consumer, requeue_backoff_s
from queue_processor.lifecycle import Heartbeats
from queue_processor.observe.metrics import Metrics


def test_requeue_backoff_grows_with_receives_and_is_capped() -> None:
    first = [requeue_backoff_s(1) for _ in range(200)]
    assert min(first) >= 8
    assert max(first) <= 12
    assert 64 <= requeue_backoff_s(4) <= 96
    assert requeue_backoff_s(50) <= REQUEUE_MAX_S * 1.2


async def test_liveness_holds_while_a_full_budget_makes_the_loops_wait() -> None:
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


async def test_an_empty_receive_counts_as_an_answer() -> None:
    # An idle queue answers every long poll with no message: that still proves SQS is reachable (readiness,
    # and the receive gauge QueueProcessorNotProcessing watches).
    class Empty:
        async def receive_message(self, **_: Any) -> dict[str, Any]:
            await asyncio.sleep(0.01)
            return {}

    metrics = Metrics(process_metrics=False)
    consumer = Consumer(
        Empty(),
        SimpleNamespace(heartbeats=Heartbeats(None)),  # type: ignore[arg-type]  # no message arrives
        EventStore(),
        queue_urls=["q"],
        in_flight_budget=2,
        loops_per_queue=1,
        visibility_timeout_s=30,
        observer=metrics,
    )
    consumer.start()
    try:
        while not consumer.answered_at:  # noqa: ASYNC110 - the fake SQS answers within milliseconds
            await asyncio.sleep(0.01)
    finally:
        await consumer.shutdown()
    assert (
        metrics.registry.get_sample_value("queue_processor_last_receive_timestamp_seconds", {"queue": "q"})
        or 0
    ) > 0
