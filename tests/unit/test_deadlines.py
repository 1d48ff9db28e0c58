"""The deadline arithmetic (pure): each function takes both clocks' readings, so the tests set them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from queue_processor.events import (
    AsgLaunchLifecycleEvent,
    RebalanceRecommendationEvent,
    ScheduledChangeEvent,
    SpotInterruptionEvent,
)
from queue_processor.steps import drain_deadline, instance_end, launch_ready_deadline, notice_end

WALL = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def spot(age_s: float) -> SpotInterruptionEvent:
    return SpotInterruptionEvent(instance_id="i-1", time=WALL - timedelta(seconds=age_s), source_id="s")


def health(in_s: float) -> ScheduledChangeEvent:
    return ScheduledChangeEvent(
        instance_id="i-1",
        time=WALL,
        scheduled_start_time=WALL + timedelta(seconds=in_s),
        source_id="h",
        event_arn="arn:aws:health:us-east-1::event/EC2/X/1",
    )


def test_a_spot_notice_ends_120_s_after_its_time_on_the_monotonic_clock() -> None:
    assert notice_end([spot(20)], now=1000.0, wall=WALL, started_at=990.0) == pytest.approx(1100.0)
    assert (
        notice_end(
            [RebalanceRecommendationEvent(instance_id="i-1", time=WALL, source_id="r")],
            now=1,
            wall=WALL,
            started_at=0,
        )
        is None
    )


def test_a_notice_already_over_is_measured_from_the_operations_start() -> None:
    # delivered 10 minutes late: its own 120 s, from when the operation began 30 s ago
    assert notice_end([spot(600)], now=1000.0, wall=WALL, started_at=970.0) == pytest.approx(1090.0)


def test_the_drain_deadline_is_the_grace_period_but_never_past_a_notices_end() -> None:
    events = [spot(20)]
    assert drain_deadline(
        events, grace_period_s=300, now=1000.0, wall=WALL, started_at=1000.0
    ) == pytest.approx(1100.0)
    assert drain_deadline([], grace_period_s=300, now=1000.0, wall=WALL, started_at=1000.0) == 1300.0


def test_the_instance_ends_at_the_earliest_notice_or_scheduled_start_to_come() -> None:
    assert instance_end([health(60), spot(0)], now=0.0, wall=WALL, started_at=0.0) == pytest.approx(60.0)
    assert instance_end([health(-60)], now=0.0, wall=WALL, started_at=0.0) is None  # already past
    assert instance_end([health(600)], now=5.0, wall=WALL, started_at=0.0) == pytest.approx(605.0)


def test_a_launch_waits_from_its_actions_start_at_every_receive() -> None:
    action = AsgLaunchLifecycleEvent(
        instance_id="i-1",
        time=WALL - timedelta(seconds=100),
        auto_scaling_group_name="g",
        lifecycle_hook_name="launch",
        lifecycle_action_token="t",
        lifecycle_transition="autoscaling:EC2_INSTANCE_LAUNCHING",
    )
    assert launch_ready_deadline([action], timeout_s=900, now=50.0, wall=WALL) == pytest.approx(850.0)
    assert launch_ready_deadline([action], timeout_s=60, now=50.0, wall=WALL) == 50.0  # over already
    ahead = action.model_copy(update={"time": WALL + timedelta(seconds=30)})  # this clock is behind AWS's
    assert launch_ready_deadline([ahead], timeout_s=60, now=50.0, wall=WALL) == 110.0
