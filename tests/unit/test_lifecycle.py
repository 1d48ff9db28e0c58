"""Lifecycle actions: heartbeat intervals, how an action is addressed, the first heartbeat of an old action."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
import structlog.testing

from queue_processor.cli import load_settings
from queue_processor.events import AsgTerminateLifecycleEvent
from queue_processor.lifecycle import MAX_HEARTBEAT_UNTIL_S, Heartbeats, Lifecycle, action_params

QUEUE = "https://sqs.us-east-1.amazonaws.com/1/q"


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
    # read once per hook, cached (a set interval is checked against the hook's HeartbeatTimeout once)
    assert autoscaling.describes == (0 if interval == "0" else 1)
    assert lifecycle.until_s() == MAX_HEARTBEAT_UNTIL_S


@pytest.mark.parametrize(("interval", "warned"), [("300", True), ("299", False)])
async def test_an_interval_not_shorter_than_the_hooks_timeout_is_warned_of_once(
    monkeypatch: pytest.MonkeyPatch, interval: str, warned: bool
) -> None:
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    monkeypatch.setenv("HEARTBEAT_INTERVAL", interval)
    lifecycle = Lifecycle(FakeAutoscaling(300), load_settings())
    with structlog.testing.capture_logs() as logs:
        for _ in range(2):
            assert await lifecycle.interval_s(ACTION) == float(interval)
    warnings = [entry for entry in logs if "not shorter than the lifecycle hook" in entry["event"]]
    assert len(warnings) == warned


def test_actions_are_addressed_by_token_else_by_instance() -> None:
    assert action_params(ACTION)["LifecycleActionToken"] == "tok"
    without = ACTION.model_copy(update={"lifecycle_action_token": None})
    assert action_params(without)["InstanceId"] == "i-1"
    assert "LifecycleActionToken" not in action_params(without)


@pytest.mark.parametrize(("age_s", "beats_at_once"), [(600.0, True), (1.0, False)])
async def test_an_old_action_gets_its_first_heartbeat_at_once(
    monkeypatch: pytest.MonkeyPatch, age_s: float, beats_at_once: bool
) -> None:
    # A terminate action redelivered after a failed drain and its backoff has gone a whole interval without
    # a heartbeat: waiting another interval could outlast the hook's HeartbeatTimeout.
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


class FakeTime:
    """A clock and a sleep for :class:`Heartbeats`: sleepers wake only when the test moves the clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + max(seconds, 0.0), next(self._seq), future))
        await future

    @staticmethod
    async def settle() -> None:
        for _ in range(50):  # let every task that can run, run (no I/O here, only the fakes)
            await asyncio.sleep(0)

    async def advance_to(self, moment: float) -> None:
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= moment:
            when, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                self.now = max(self.now, when)
                future.set_result(None)
                await self.settle()
        self.now = moment
        await self.settle()


@pytest.mark.parametrize("received_again", [True, False])
async def test_a_requeued_action_back_in_the_queue_gets_a_beat_only_when_its_timeout_needs_it(
    monkeypatch: pytest.MonkeyPatch, received_again: bool
) -> None:
    # After the backoff the message is visible to every consumer and held by none: a beat then keeps alive an
    # action nobody handles. It waits for the receive; without one, it comes a quarter interval late (1.25
    # intervals after the last beat; the HeartbeatTimeout is 2), and it stops when the requeue's margin is over.
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    monkeypatch.setenv("HEARTBEAT_INTERVAL", "30")
    fake = FakeTime()
    beats: list[float] = []

    class Recording(FakeAutoscaling):
        async def record_lifecycle_action_heartbeat(self, **kwargs: Any) -> dict[str, Any]:
            beats.append(fake.now)
            return {}

    action = ACTION.model_copy(update={"time": datetime.now(UTC)})
    heartbeats = Heartbeats(Lifecycle(Recording(60), load_settings()), clock=fake.clock, sleep=fake.sleep)
    heartbeats.start(action)
    try:
        await fake.advance_to(30)
        assert len(beats) == 1  # held: beats every interval
        heartbeats.requeued(action, visible_in_s=10, for_s=100)  # visible at 40, given up at 130
        await fake.advance_to(62)
        assert len(beats) == 1  # due at ~60, the message in the queue: no beat for nobody
        if received_again:
            heartbeats.start(action)  # a receive holds it again: the beat that was due goes at once
            await fake.advance_to(62)
            assert beats[1:] == [62]
        else:
            await fake.advance_to(80)
            assert len(beats) == 2
            assert 66 <= beats[1] <= 69  # the HeartbeatTimeout needed it
            await fake.advance_to(400)
            assert heartbeats.running == 0  # not received again within the margin: stopped
            assert all(moment <= 130 for moment in beats)
    finally:
        await heartbeats.close()


async def test_a_beat_for_nobody_asks_first_whether_another_replica_completed_the_action(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Explorer seed 29 (once in CI): our requeued message went to another replica, which completed the action;
    ours, never received again, beat when the HeartbeatTimeout needed it: "No active Lifecycle Action". A beat
    for a message nobody holds asks Auto Scaling first whether the instance still waits."""
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    monkeypatch.setenv("HEARTBEAT_INTERVAL", "30")
    fake = FakeTime()
    beats: list[float] = []
    state = ["Terminating:Wait"]

    class Recording(FakeAutoscaling):
        async def record_lifecycle_action_heartbeat(self, **kwargs: Any) -> dict[str, Any]:
            beats.append(fake.now)
            return {}

        async def describe_auto_scaling_instances(self, **kwargs: Any) -> dict[str, Any]:
            return {"AutoScalingInstances": [{"LifecycleState": state[0]}]}

    action = ACTION.model_copy(update={"time": datetime.now(UTC)})
    heartbeats = Heartbeats(Lifecycle(Recording(60), load_settings()), clock=fake.clock, sleep=fake.sleep)
    heartbeats.start(action)
    try:
        await fake.advance_to(30)
        assert len(beats) == 1
        heartbeats.requeued(action, visible_in_s=10, for_s=100)
        await fake.advance_to(50)
        state[0] = "Terminating:Proceed"  # another replica received the message and completed the action
        await fake.advance_to(400)
        assert len(beats) == 1  # none for nobody at ~67: the action was over
        assert heartbeats.running == 0
    finally:
        await heartbeats.close()


@pytest.mark.parametrize("ours_again", [True, False])
async def test_a_process_that_wakes_from_a_pause_beats_only_once_its_message_is_ours_again(
    monkeypatch: pytest.MonkeyPatch, ours_again: bool
) -> None:
    """Found by the storyline explorer (seed 19): a replica paused (SIGSTOP) for longer than the visibility
    timeout woke up and its heartbeat task beat at once for an action another replica had meanwhile received
    and completed ("No active Lifecycle Action"). Our hold of the message lapses ``hold_s`` (the visibility
    timeout) after the last receive or renewal: beats wait until a renewal or a receive confirms it again."""
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    monkeypatch.setenv("HEARTBEAT_INTERVAL", "30")
    fake = FakeTime()
    beats: list[float] = []

    class Recording(FakeAutoscaling):
        async def record_lifecycle_action_heartbeat(self, **kwargs: Any) -> dict[str, Any]:
            beats.append(fake.now)
            return {}

    action = ACTION.model_copy(update={"time": datetime.now(UTC)})
    lifecycle = Lifecycle(Recording(60), load_settings())
    heartbeats = Heartbeats(lifecycle, clock=fake.clock, sleep=fake.sleep, hold_s=10)
    heartbeats.start(action)  # received at 0: ours until 10 unless renewed
    try:
        for moment in (5, 15, 25):  # the visibility extender renews every half visibility timeout
            await fake.advance_to(moment)
            heartbeats.hold({action.action_key})
        await fake.advance_to(30)
        assert beats == [pytest.approx(30, abs=1)]  # held: beats every interval
        await fake.advance_to(200)  # paused: no renewal since 25, the hold lapsed at 35
        assert len(beats) == 1
        if ours_again:
            heartbeats.hold({action.action_key})  # the renewal after the pause went through: still ours
            await fake.advance_to(200)
            assert beats[1:] == [200]
        else:
            assert heartbeats.running == 1  # waits; the settlement of its message stops it
    finally:
        await heartbeats.close()


async def test_an_action_received_again_while_it_is_being_completed_gets_no_heartbeat_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real-plane explorer seed 42 (heartbeat-after-end: a replica woke from SIGSTOP, completed a launch action
    and beat it 1.5 s later), by the path its logs leave open: a copy of the action's message received while
    the completion was on its way started a new heartbeat task. An action being completed is not heartbeated
    again; a completion that fails heartbeats it again."""
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    monkeypatch.setenv("HEARTBEAT_INTERVAL", "30")
    answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    class Completing(FakeAutoscaling):
        async def complete_lifecycle_action(self, **kwargs: Any) -> dict[str, Any]:
            return await answer

    heartbeats = Heartbeats(Lifecycle(Completing(300), load_settings()))
    heartbeats.start(ACTION)
    try:
        completing = asyncio.ensure_future(heartbeats.complete(ACTION))
        await FakeTime.settle()
        assert heartbeats.running == 0  # stopped before the completion is sent
        heartbeats.start(ACTION)  # the copy of its message, received meanwhile
        assert heartbeats.running == 0
        answer.set_result({})
        await completing
        heartbeats.start(ACTION)
        assert heartbeats.running == 0
    finally:
        await heartbeats.close()
