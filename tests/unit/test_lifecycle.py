"""Lifecycle actions: heartbeat intervals, how an action is addressed, the first heartbeat of an old action."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queue_processor.config import load_settings
from queue_processor.kinds import AsgTerminateLifecycleEvent
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
    assert autoscaling.describes == (1 if interval == "-1" else 0)  # read once per hook, cached
    assert lifecycle.until_s() == MAX_HEARTBEAT_UNTIL_S


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
