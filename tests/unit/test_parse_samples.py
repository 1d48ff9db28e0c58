"""The real-format bodies in ../shared/samples/messages give the outcomes its README lists."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from queue_processor.events import EventKind
from queue_processor.parse import parse

# file → (outcome, kind, instance ID, start time), from ../shared/samples/README.md
EXPECTED = {
    "eventbridge_asg_terminate_lifecycle.json": (
        "events",
        EventKind.ASG_TERMINATE_LIFECYCLE,
        "i-0633ac2b0d9769723",
        datetime(2020, 7, 1, 22, 19, 58, tzinfo=UTC),
    ),
    "eventbridge_asg_launch_lifecycle.json": (
        "events",
        EventKind.ASG_LAUNCH_LIFECYCLE,
        "i-0a68bf5ef13e21b52",
        datetime(2020, 7, 1, 22, 30, 58, tzinfo=UTC),
    ),
    "eventbridge_asg_test_notification.json": ("skip", None, None, None),
    "asg_direct_to_sqs_terminate_lifecycle.json": (
        "events",
        EventKind.ASG_TERMINATE_LIFECYCLE,
        "i-040107f6ba000e5ee",
        datetime(2022, 1, 31, 23, 7, 47, 872000, tzinfo=UTC),
    ),
    "asg_direct_to_sqs_test_notification.json": ("skip", None, None, None),
    "eventbridge_spot_interruption_warning.json": (
        "events",
        EventKind.SPOT_INTERRUPTION,
        "i-0b662ef9931388ba0",
        datetime(1970, 1, 1, 0, 2, tzinfo=UTC),
    ),
    "eventbridge_rebalance_recommendation.json": (
        "events",
        EventKind.REBALANCE_RECOMMENDATION,
        "i-0b662ef9931388ba0",
        datetime(2020, 10, 26, 14, 14, 14, tzinfo=UTC),
    ),
    "eventbridge_ec2_state_change_pending.json": ("skip", None, None, None),
    "eventbridge_ec2_state_change_stopping.json": (
        "events",
        EventKind.STATE_CHANGE,
        "i-0123456789abcdef0",
        datetime(2024, 1, 1, tzinfo=UTC),
    ),
    "eventbridge_aws_health_scheduled_change.json": (
        "events",
        EventKind.SCHEDULED_CHANGE,
        "i-12345678",
        datetime(2016, 6, 5, 15, 10, 9, tzinfo=UTC),
    ),
}


def test_every_sample_is_covered(samples_dir: Path) -> None:
    assert sorted(path.name for path in samples_dir.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_outcome(samples_dir: Path, name: str) -> None:
    outcome, kind, instance_id, start_time = EXPECTED[name]
    result = parse((samples_dir / name).read_text())
    assert result.outcome == outcome, result.reason
    if outcome == "events":
        assert len(result.events) == 1
        event = result.events[0]
        assert (event.kind, event.instance_id, event.start_time) == (kind, instance_id, start_time)
        assert result.reason is None
    else:
        assert result.events == ()
        assert result.reason


def test_direct_and_eventbridge_forms_of_one_action_share_the_token_identity(samples_dir: Path) -> None:
    direct = parse((samples_dir / "asg_direct_to_sqs_terminate_lifecycle.json").read_text()).events[0]
    assert direct.kind == EventKind.ASG_TERMINATE_LIFECYCLE
    assert direct.lifecycle_action_token == "b4dd0f5b-0ef2-4479-9dad-6c55f027000e"
    assert direct.auto_scaling_group_name == "my-asg"
    assert direct.lifecycle_hook_name == "test-nth-asg-to-sqs"
    assert direct.source_id == "3775fac9-93c3-7ead-8713-159816566000"
