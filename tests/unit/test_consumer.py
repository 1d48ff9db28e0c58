"""The consumer with small fakes (SQS, the handler, its heartbeats): what becomes of each message (poison,
skip, done, requeued), the in-flight budget, receive answers, and shutdown. Metrics are read from the registry
a user scrapes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from queue_processor import rest
from queue_processor.config import REQUEUE_MAX_S, default
from queue_processor.consumer import Consumer
from queue_processor.events import AsgLifecycleEvent, EventStore, NodeOperation, SqsMessageRef
from queue_processor.lifecycle import Heartbeats
from queue_processor.observe.metrics import Metrics
from queue_processor.settlement import Ledger, requeue_backoff_s
from queue_processor.steps import Outcome


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
        Ledger(
            NeverAnswers(),
            EventStore(),
            Heartbeats(None),
            in_flight_budget=2,
            visibility_timeout_s=30,
        ),
        SimpleNamespace(parts=SimpleNamespace(leases=None)),  # type: ignore[arg-type]  # no message ever arrives
        queue_urls=["q"],
        loops_per_queue=2,
    )
    async with consumer.ledger.slots.reserve_room(2) as room:  # every slot held by messages under way
        assert room.claim(SqsMessageRef(queue_url="q", message_id="held-1", receipt_handle="rh-1"))
        assert room.claim(SqsMessageRef(queue_url="q", message_id="held-2", receipt_handle="rh-2"))
    consumer.start()
    try:
        await asyncio.sleep(0.01)
        consumer.loop_heartbeat -= 600  # no iteration for ten minutes, but the loops wait for slots
        assert consumer.alive()
        consumer.ledger.slots.release(
            "held-1"
        )  # one loop gets a slot and sits in a receive that never answers
        await asyncio.sleep(0.01)
        assert consumer.alive()  # the other still waits for a slot
        consumer.ledger.slots.release("held-2")
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
        Ledger(
            Empty(),
            EventStore(),
            Heartbeats(None),
            in_flight_budget=2,
            visibility_timeout_s=30,
            observer=metrics,
        ),
        SimpleNamespace(parts=SimpleNamespace(leases=None)),  # type: ignore[arg-type]  # no message arrives
        queue_urls=["q"],
        loops_per_queue=1,
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


async def test_readiness_follows_the_latest_receive() -> None:
    # Not ready until SQS first answers; a failed receive makes it unready until the next answer.
    class Scripted:
        def __init__(self) -> None:
            self.plan: asyncio.Queue[str] = asyncio.Queue()

        async def receive_message(self, **_: Any) -> dict[str, Any]:
            if await self.plan.get() == "fail":
                raise ValueError("no route to SQS")
            return {}

    sqs = Scripted()
    consumer = Consumer(
        Ledger(
            sqs,
            EventStore(),
            Heartbeats(None),
            in_flight_budget=2,
            visibility_timeout_s=30,
        ),
        SimpleNamespace(parts=SimpleNamespace(leases=None)),  # type: ignore[arg-type]  # no message arrives
        queue_urls=["q"],
        loops_per_queue=1,
    )
    consumer.start()

    async def after(step: str, done: Callable[[], bool]) -> bool:
        sqs.plan.put_nowait(step)
        while not done():  # noqa: ASYNC110 - the fake answers at once (a failure waits 1 s to retry)
            await asyncio.sleep(0.01)
        return consumer.reachable()

    try:
        assert not consumer.reachable()
        assert await after("ok", lambda: consumer.answered_at > 0)
        assert not await after("fail", lambda: consumer.failed_at > 0)
        assert await after("ok", lambda: consumer.answered_at > consumer.failed_at)
    finally:
        for _ in range(10):  # the open poll ends, and any a shutdown still lets run
            sqs.plan.put_nowait("ok")
        await consumer.shutdown()


# --------------------------------------------------------------------------- the consumer on a fake SQS

QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/interruptions"
KIND = "asg-terminate-lifecycle"


def terminate_body(token: str = "tok-1", instance: str = "i-0123456789abcdef0") -> str:
    """An EventBridge terminate lifecycle action ("Use EventBridge to handle Auto Scaling events")."""
    return json.dumps(
        {
            "version": "0",
            "id": f"id-{token}",
            "detail-type": "EC2 Instance-terminate Lifecycle Action",
            "source": "aws.autoscaling",
            "time": "2026-11-23T12:00:00Z",
            "detail": {
                "EC2InstanceId": instance,
                "AutoScalingGroupName": "workers",
                "LifecycleHookName": "drain",
                "LifecycleActionToken": token,
                "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
            },
        }
    )


TEST_NOTIFICATION = json.dumps(
    {
        "AccountId": "123456789012",
        "RequestId": "r-1",
        "AutoScalingGroupARN": "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:x",
        "AutoScalingGroupName": "workers",
        "Service": "AWS Auto Scaling",
        "Event": "autoscaling:TEST_NOTIFICATION",
        "Time": "2026-11-23T12:00:00Z",
    }
)


class FakeSqs:
    """Just enough of SQS: ``deliver`` queues bodies for the next ReceiveMessage; deletes and visibility
    changes are recorded by receipt handle."""

    def __init__(self) -> None:
        self.waiting: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.deleted: list[str] = []
        self.visibility: list[tuple[str, int]] = []
        self.bodies: dict[str, str] = {}
        self._count = 0
        self.batches = 0  # ChangeMessageVisibilityBatch calls begun
        self.batch_gate: asyncio.Event | None = None

    def deliver(self, body: str, message_id: str | None = None, receive_count: int = 1) -> str:
        self._count += 1
        message_id = message_id or f"m-{self._count}"
        self.bodies[message_id] = body
        self.waiting.append(
            {
                "MessageId": message_id,
                "ReceiptHandle": f"rh-{message_id}-{self._count}",
                "Body": body,
                "Attributes": {
                    "ApproximateReceiveCount": str(receive_count),
                    "SentTimestamp": "1795435200000",
                },
            }
        )
        self.arrived.set()
        return message_id

    async def receive_message(self, **call: Any) -> dict[str, Any]:
        if not self.waiting:
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), 0.05)  # a short long poll
            except TimeoutError:
                return {}
        most = call["MaxNumberOfMessages"]
        taken, self.waiting = self.waiting[:most], self.waiting[most:]
        return {"Messages": taken}

    async def delete_message_batch(self, **call: Any) -> dict[str, Any]:
        self.deleted.extend(entry["ReceiptHandle"] for entry in call["Entries"])
        return {"Successful": [{"Id": entry["Id"]} for entry in call["Entries"]], "Failed": []}

    async def change_message_visibility(self, **call: Any) -> None:
        self._changed(call["ReceiptHandle"], call["VisibilityTimeout"])

    async def change_message_visibility_batch(self, **call: Any) -> dict[str, Any]:
        self.batches += 1
        if self.batch_gate is not None:  # the answer comes when the test says
            await self.batch_gate.wait()
        for entry in call["Entries"]:
            self._changed(entry["ReceiptHandle"], entry["VisibilityTimeout"])
        return {"Successful": [{"Id": entry["Id"]} for entry in call["Entries"]], "Failed": []}

    def _changed(self, handle: str, seconds: int) -> None:
        """As SQS: a message made visible (0 s) is offered to the next poll, an open one included."""
        self.visibility.append((handle, seconds))
        if seconds == 0:
            message_id = handle.split("-", 1)[1].rsplit("-", 1)[0]
            self.deliver(self.bodies[message_id], message_id=message_id)


class FakeHeartbeats:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.requeues: list[tuple[str, float]] = []
        self.held: list[str] = []  # actions whose message's visibility a renewal extended
        self.closed = False

    def start(self, action: AsgLifecycleEvent) -> None:
        self.started.append(action.action_key.token_or_instance)

    async def stop(self, action: AsgLifecycleEvent) -> None:
        self.stopped.append(action.action_key.token_or_instance)

    def requeued(self, action: AsgLifecycleEvent, visible_in_s: float, for_s: float) -> None:
        self.requeues.append((action.action_key.token_or_instance, for_s))

    def hold(self, keys: Any) -> None:
        self.held.extend(key.token_or_instance for key in keys)

    async def close(self) -> None:
        self.closed = True


class FakeHandler:
    """Answers every operation with ``outcome`` (after ``gate`` opens, when one is set), settling its
    lifecycle actions as completed when the outcome is DONE (the real handler's job); records them."""

    def __init__(self, outcome: Outcome = Outcome.DONE) -> None:
        self.outcome = outcome
        self.heartbeats = FakeHeartbeats()
        self.handled: list[NodeOperation] = []
        self.gate: asyncio.Event | None = None
        self.cancelled = 0
        self.parts: Any = SimpleNamespace(leases=None)

    def received(self, event: Any) -> None:
        if isinstance(event, AsgLifecycleEvent):
            self.heartbeats.start(event)

    async def handle(self, operation: NodeOperation) -> Outcome:
        self.handled.append(operation)
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.outcome is Outcome.DONE:
            for action in operation.unsettled():
                operation.settled[action.action_key] = "completed"
        return self.outcome


class Running:
    def __init__(self, handler: FakeHandler) -> None:
        self.sqs = FakeSqs()
        self.handler = handler
        self.metrics = Metrics(process_metrics=False)
        self.consumer = Consumer(
            Ledger(
                self.sqs,  # type: ignore[arg-type]
                EventStore(),
                handler.heartbeats,  # type: ignore[arg-type]
                in_flight_budget=4,
                visibility_timeout_s=30,
                observer=self.metrics,
            ),
            handler,  # type: ignore[arg-type]
            queue_urls=[QUEUE],
            loops_per_queue=1,
        )

    def count(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    async def until(self, predicate: Any) -> None:
        """Let the loop run until ``predicate`` holds; fail after 4,000 turns (the fakes answer at once, so
        this bounds a hang, it measures nothing)."""
        for _ in range(4000):
            if predicate():
                return
            await asyncio.sleep(0.005)
        raise AssertionError("the consumer never got there")


@pytest.fixture
async def make() -> AsyncIterator[Any]:
    made: list[Running] = []

    def build(outcome: Outcome = Outcome.DONE) -> Running:
        running = Running(FakeHandler(outcome))
        running.consumer.start()
        made.append(running)
        return running

    yield build
    for running in made:
        await running.consumer.shutdown()


async def test_a_poison_message_is_hidden_for_the_redrive_policy_never_deleted(make: Any) -> None:
    running = make()
    message_id = running.sqs.deliver("{not json")
    await running.until(lambda: running.sqs.visibility)
    assert running.sqs.visibility == [(f"rh-{message_id}-1", default("poison_visibility_timeout_sec"))]
    assert running.sqs.deleted == []
    assert running.count("queue_processor_messages_poison_total", queue=QUEUE, reason="not-json") == 1
    assert running.count("queue_processor_messages_received_total", queue=QUEUE, kind="poison") == 1
    assert running.handler.handled == []
    # a batch of nothing NTH could process: NTH's monitor error
    await running.until(lambda: running.count("events_error_total", event_error_where="SQS_MONITOR") == 1)


async def test_a_message_not_acted_on_is_deleted_and_counted_by_its_class(make: Any) -> None:
    running = make()
    running.sqs.deliver(TEST_NOTIFICATION)
    await running.until(lambda: running.sqs.deleted)
    skipped = "queue_processor_messages_skipped_total"
    assert running.count(skipped, queue=QUEUE, reason_class="test-notification") == 1
    assert running.handler.handled == []
    assert running.count("events_error_total", event_error_where="SQS_MONITOR") == 0


async def test_a_handled_action_is_heartbeated_from_receipt_then_its_message_deleted(make: Any) -> None:
    running = make()
    message_id = running.sqs.deliver(terminate_body())
    deleted = "queue_processor_messages_deleted_total"
    await running.until(lambda: running.count(deleted, queue=QUEUE, kind="asg-terminate-lifecycle") == 1)
    assert running.handler.heartbeats.started == ["tok-1"]  # on receipt, before the handler ran
    assert running.sqs.deleted == [f"rh-{message_id}-1"]
    assert running.handler.heartbeats.stopped == ["tok-1"]  # nothing beats for a deleted message
    kind = "asg-terminate-lifecycle"
    assert running.count("queue_processor_messages_deleted_total", queue=QUEUE, kind=kind) == 1
    await running.until(lambda: running.count("queue_processor_in_flight_messages") == 0)
    assert running.consumer.tasks == 0


async def test_a_failed_operation_requeues_with_a_backoff_and_the_action_keeps_beating(make: Any) -> None:
    running = make(Outcome.RETRY)
    message_id = running.sqs.deliver(terminate_body(), receive_count=1)
    requeued = "queue_processor_messages_requeued_total"
    await running.until(lambda: running.count(requeued, queue=QUEUE, kind=KIND) == 1)
    ((handle, backoff),) = running.sqs.visibility
    assert handle == f"rh-{message_id}-1"
    assert 8 <= backoff <= 12  # REQUEUE_BACKOFF_BASE_SEC (10 s) with 20 % jitter, first receive
    assert running.sqs.deleted == []
    assert running.handler.heartbeats.requeues == [("tok-1", backoff + 30)]  # backoff + visibility timeout
    assert running.handler.heartbeats.stopped == []
    kind = "asg-terminate-lifecycle"
    assert running.count("queue_processor_messages_requeued_total", queue=QUEUE, kind=kind) == 1


async def test_a_renewal_in_flight_lands_before_the_requeue_never_after_it(make: Any) -> None:
    """Issue "Interruptions in combination" 6: the visibility extender renews every held message while the
    operation of one ends and requeues it. The requeue's backoff must be the last word: a renewal landing after
    it hid the message for the whole visibility timeout instead of the backoff."""
    running = make(Outcome.RETRY)
    running.handler.gate = asyncio.Event()
    message_id = running.sqs.deliver(terminate_body())
    await running.until(lambda: running.handler.handled)
    running.sqs.batch_gate = asyncio.Event()
    renewal = asyncio.create_task(running.consumer.ledger.renew_held())
    await running.until(lambda: running.sqs.batches == 1)  # the renewal is on its way, unanswered
    running.handler.gate.set()  # the operation ends: requeue
    for _ in range(20):
        await asyncio.sleep(0)
    running.sqs.batch_gate.set()
    await renewal
    requeued = "queue_processor_messages_requeued_total"
    await running.until(lambda: running.count(requeued, queue=QUEUE, kind=KIND) == 1)
    handle = f"rh-{message_id}-1"
    changes = [seconds for changed, seconds in running.sqs.visibility if changed == handle]
    assert changes[0] == 30  # the renewal
    assert 8 <= changes[-1] <= 12  # then the backoff, last
    assert running.count("queue_processor_errors_total", where="visibility") == 0


async def test_messages_answered_after_their_visibility_timeout_are_let_go(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the storyline explorer (seed 19): a replica paused (SIGSTOP) with a long poll open woke up to
    its answer, long after the messages' visibility timeout: another replica had received them meanwhile and
    completed their actions, and this one took them up again (heartbeat after the end). An answer that comes
    later than the poll's wait plus the visibility timeout is let go, and received again fresh."""
    offset = [0.0]

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return time.monotonic() + offset[0]

    monkeypatch.setattr("queue_processor.consumer.time", Clock)
    running = make()
    original = running.sqs.receive_message

    async def paused_once_during_the_poll(**call: Any) -> dict[str, Any]:
        answer = await original(**call)
        if answer.get("Messages") and not offset[0]:
            offset[0] = 3600.0  # the process was stopped for an hour while the answer waited
        return answer

    running.sqs.receive_message = paused_once_during_the_poll
    message_id = running.sqs.deliver(terminate_body())
    deleted = "queue_processor_messages_deleted_total"
    await running.until(lambda: running.count(deleted, queue=QUEUE, kind=KIND) == 1)
    assert running.sqs.visibility[0] == (f"rh-{message_id}-1", 0)  # let go at once
    assert running.handler.heartbeats.started == ["tok-1"]  # once: for the fresh receive only
    assert len(running.handler.handled) == 1


async def test_a_redelivered_message_joins_its_operation_and_is_settled_with_its_newest_handle(
    make: Any,
) -> None:
    running = make()
    running.handler.gate = asyncio.Event()
    running.sqs.deliver(terminate_body(), message_id="m-1")
    await running.until(lambda: running.handler.handled)
    running.sqs.deliver(terminate_body(), message_id="m-1", receive_count=2)  # its visibility ran out
    await running.until(
        lambda: running.count("queue_processor_messages_received_total", queue=QUEUE, kind=KIND) == 2
    )
    running.handler.gate.set()
    await running.until(lambda: running.sqs.deleted)
    assert len(running.handler.handled) == 1  # one operation for both receipts
    assert running.sqs.deleted == ["rh-m-1-2"]  # the newest receipt handle: the old one no longer works
    await running.until(lambda: running.count("queue_processor_in_flight_messages") == 0)
    assert running.consumer.tasks == 0


async def test_a_message_held_for_almost_sqss_limit_is_made_visible_and_received_anew(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47 (smaller): SQS keeps one receipt invisible 12 hours at most; a drain that waits hours for its
    turn held its message until SQS refused the renewal and showed it at a moment nobody chose. Near the limit
    the message is made visible at once instead; received again, it joins its operation with a new receipt,
    whose renewals go on."""
    from queue_processor import settlement

    running = make()
    running.handler.gate = asyncio.Event()
    running.sqs.deliver(terminate_body(), message_id="m-1")
    await running.until(lambda: running.handler.handled)
    monkeypatch.setattr(settlement, "SQS_HOLD_MAX_S", 60.0)  # the limit less two visibility timeouts: now
    await running.consumer.ledger.renew_held()
    assert running.sqs.visibility == [("rh-m-1-1", 0)]  # not renewed: visible again, and offered to a poll
    await running.until(
        lambda: running.count("queue_processor_messages_received_total", queue=QUEUE, kind=KIND) == 2
    )
    monkeypatch.setattr(settlement, "SQS_HOLD_MAX_S", 43_200.0)
    await running.consumer.ledger.renew_held()
    assert running.sqs.visibility[-1] == ("rh-m-1-2", 30)  # the new receipt is renewed
    running.handler.gate.set()
    await running.until(lambda: running.sqs.deleted)
    assert len(running.handler.handled) == 1
    assert running.sqs.deleted == ["rh-m-1-2"]


async def test_shutdown_cancels_operations_lets_open_polls_end_and_leaves_every_message_visible() -> None:
    # A poll still open when this replica makes its messages visible takes them straight back (SQS offers a
    # visible message to any open poll); the consumer lets them go again instead of holding them hidden.
    running = Running(FakeHandler())
    running.handler.gate = asyncio.Event()  # the operation never ends by itself
    running.consumer.start()
    message_id = running.sqs.deliver(terminate_body())
    await running.until(lambda: running.handler.handled)
    await asyncio.wait_for(running.consumer.shutdown(timeout_s=10), 30)
    assert running.handler.cancelled == 1
    assert running.handler.heartbeats.closed  # nothing beats once this replica lets its messages go
    assert [m["MessageId"] for m in running.sqs.waiting] == [message_id]  # visible, held by nobody
    assert running.sqs.visibility
    assert all(seconds == 0 for _, seconds in running.sqs.visibility)
    assert running.sqs.deleted == []
    assert running.consumer.tasks == 0
    assert all(task.done() for task in running.consumer._loops)
    assert (running.consumer.ledger.slots.held, running.consumer.ledger.slots.free) == (
        0,
        4,
    )  # its slot returned


async def test_shutdown_leaves_no_operation_task_in_its_settlement() -> None:
    # Explorer seed 19: an operation ended (its Lease lost) and its requeue's ChangeMessageVisibility was being
    # retried when the shutdown came; the task had left the operations the shutdown stops, and outlived it.
    running = Running(FakeHandler(Outcome.RETRY))
    answer = asyncio.Event()  # SQS never answers the requeue
    begun: list[str] = []

    async def change_message_visibility(**call: Any) -> None:
        begun.append(call["ReceiptHandle"])
        await answer.wait()

    running.sqs.change_message_visibility = change_message_visibility  # type: ignore[method-assign]
    running.consumer.start()
    message_id = running.sqs.deliver(terminate_body())
    await running.until(lambda: bool(begun))
    assert running.consumer.tasks == 1  # settling
    await asyncio.wait_for(running.consumer.shutdown(timeout_s=10), 30)
    left = [task.get_name() for task in asyncio.all_tasks() if task.get_name().startswith("operation-")]
    assert left == []
    assert running.consumer.tasks == 0
    # Not deleted: visible again when its visibility timeout ends (no renewal holds it), as a requeue wanted.
    assert running.sqs.deleted == []
    assert begun == [f"rh-{message_id}-1"]
    assert (running.consumer.ledger.slots.held, running.consumer.ledger.slots.free) == (0, 4)


async def test_shutdown_sends_the_node_lease_releases_before_it_lets_the_messages_go() -> None:
    # With NODE_LEASES an operation the shutdown cancels gives its node Lease up, and a release waits up to
    # RELEASE_BATCH_S for others': it must be sent before the message is visible, or the replica that receives
    # the message at once finds the node held and requeues it with a backoff.
    running = Running(FakeHandler())
    visible_at_flush: list[int] = []

    class Releases:
        async def flush(self) -> None:
            visible_at_flush.append(len(running.sqs.visibility))

    running.handler.parts.leases = Releases()
    running.handler.gate = asyncio.Event()  # the operation never ends by itself
    running.consumer.start()
    running.sqs.deliver(terminate_body())
    await running.until(lambda: running.handler.handled)
    await asyncio.wait_for(running.consumer.shutdown(timeout_s=10), 30)
    assert visible_at_flush == [0]  # sent before any message was let go
    assert running.sqs.visibility
    assert all(seconds == 0 for _, seconds in running.sqs.visibility)


async def test_an_operation_cancelled_before_it_ever_ran_leaves_no_trace() -> None:
    # A poll answered just before the stop: its message's operation task is created, and the shutdown cancels
    # it before the loop ever ran it (its body, and the bookkeeping in its finally, never run).
    running = Running(FakeHandler())
    running.sqs.deliver(terminate_body())
    (message,) = (await running.sqs.receive_message(MaxNumberOfMessages=1))["Messages"]
    async with running.consumer.ledger.slots.reserve_room(1) as room:
        await running.consumer._take_message(QUEUE, message, room)  # type: ignore[arg-type]
    assert running.consumer.tasks == 1  # spawned, not started
    assert running.consumer.ledger.slots.held == 1
    await running.consumer.shutdown(timeout_s=10)  # awaited directly: the loop runs nothing in between
    assert running.handler.handled == []  # it never ran
    assert running.consumer.tasks == 0
    assert [seconds for _, seconds in running.sqs.visibility] == [0]  # its message let go at once
    assert (running.consumer.ledger.slots.held, running.consumer.ledger.slots.free) == (
        0,
        4,
    )  # and its slot returned
    assert not running.consumer.ledger.store.held()


async def test_shutdown_is_bounded_when_a_poll_never_answers() -> None:
    class Hangs(FakeSqs):
        async def receive_message(self, **call: Any) -> dict[str, Any]:
            await asyncio.Event().wait()  # an endpoint that never answers
            return {}

    running = Running(FakeHandler())
    running.sqs = Hangs()
    running.consumer.ledger.sqs = running.sqs  # type: ignore[assignment]
    running.consumer.start()
    await running.until(lambda: running.consumer._polling)
    await asyncio.wait_for(running.consumer.shutdown(timeout_s=0.2), 30)  # returns: the bound held
    assert all(task.done() for task in running.consumer._loops)


# ------------------------------------------------------- the in-flight slots: each path returns one, once


def slots_of(running: Running) -> tuple[int, int]:
    """(held, free) of the consumer's in-flight slots; free + held never exceeds the budget (4)."""
    slots = running.consumer.ledger.slots
    slots.check()
    return slots.held, slots.free


async def test_a_slot_is_returned_once_when_taking_a_message_raises_after_the_store_took_it(
    make: Any,
) -> None:
    """Issue 28: with a plain semaphore the receive loop released the slot when ``_take`` raised, and the
    settlement released it again: the budget grew by one each time."""
    running = make()
    running.handler.gate = asyncio.Event()
    original = running.handler.received

    def fails(event: Any) -> None:
        original(event)
        raise RuntimeError("a bug after the store took the message")

    running.handler.received = fails
    running.sqs.deliver(terminate_body())
    await running.until(lambda: running.count("queue_processor_errors_total", where="handle") == 1)
    assert slots_of(running)[0] == 1  # the message keeps its slot: its operation will settle it
    running.handler.gate.set()
    await running.until(lambda: running.sqs.deleted)
    await running.until(lambda: slots_of(running)[0] == 0)
    assert running.consumer.tasks == 0
    await running.consumer.shutdown(timeout_s=10)
    assert slots_of(running) == (0, 4)  # not 5: returned once


async def test_a_poll_cancelled_in_the_middle_of_its_batch_returns_the_slots_nobody_claimed() -> None:
    class Stuck(FakeSqs):
        """The poison message's visibility change never answers: the batch stops there."""

        async def change_message_visibility(self, **call: Any) -> None:
            await asyncio.Event().wait()

    running = Running(FakeHandler())
    running.sqs = Stuck()
    running.consumer.ledger.sqs = running.sqs  # type: ignore[assignment]
    running.handler.gate = asyncio.Event()
    running.sqs.deliver(terminate_body("tok-1", "i-0000000000000000a"))
    running.sqs.deliver("{not json")
    running.sqs.deliver(terminate_body("tok-2", "i-0000000000000000b"))
    running.consumer.start()
    try:
        await running.until(lambda: running.handler.handled)  # the first kept, the poison one stuck
        assert slots_of(running) == (1, 0)  # one claimed, three reserved for the batch
        (loop,) = running.consumer._loops
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        assert slots_of(running) == (1, 3)  # the unclaimed ones are free again
    finally:
        running.handler.gate.set()
        await running.consumer.shutdown(timeout_s=10)
    assert slots_of(running) == (0, 4)


async def test_an_operation_that_cannot_be_started_is_requeued_not_held_for_ever(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28: an operation task that could not be started left its message in the store, held and renewed
    with nothing to settle it."""
    running = make()
    spawn = rest.spawn

    def cannot_start(coro: Any, *, name: str, **options: Any) -> Any:
        if not name.startswith("operation-"):
            return spawn(coro, name=name, **options)
        coro.close()
        raise RuntimeError("no task for it")

    monkeypatch.setattr(rest, "spawn", cannot_start)
    message_id = running.sqs.deliver(terminate_body())
    requeued = "queue_processor_messages_requeued_total"
    errors = "queue_processor_errors_total"
    # The requeue is counted inside the settlement, the error once the failure reaches the receive loop, a loop
    # turn later: wait for both (a loaded machine ran the check between them).
    await running.until(
        lambda: (
            running.count(requeued, queue=QUEUE, kind=KIND) == 1
            and running.count(errors, where="handle") == 1
        )
    )
    ((handle, backoff),) = running.sqs.visibility
    assert handle == f"rh-{message_id}-1"
    assert 8 <= backoff <= 12
    assert running.consumer.ledger.store.held() == []
    await running.consumer.shutdown(timeout_s=10)
    assert slots_of(running) == (0, 4)


async def test_a_delete_batcher_that_dies_leaves_no_settlement_waiting(make: Any) -> None:
    class Hangs(FakeSqs):
        asked = False

        async def delete_message_batch(self, **call: Any) -> dict[str, Any]:
            self.asked = True
            await asyncio.Event().wait()  # never answers
            return {}

    running = make()
    running.sqs = Hangs()
    running.consumer.ledger.sqs = running.sqs
    running.sqs.deliver(terminate_body())
    await running.until(lambda: running.sqs.asked)  # the batcher sent the delete, unanswered
    assert slots_of(running)[0] == 1  # the message's settlement waits for it, holding its slot
    flusher = running.consumer.ledger._delete_flusher
    flusher.cancel()
    await asyncio.gather(flusher, return_exceptions=True)
    await running.until(lambda: slots_of(running)[0] == 0)  # answered "not deleted": the settlement ended
    assert running.count("queue_processor_errors_total", where="delete") == 1
    assert running.count("queue_processor_messages_deleted_total", queue=QUEUE, kind=KIND) == 0
