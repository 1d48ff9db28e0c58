"""Each message kind is one model of ``queue_processor.events``, registered with the parser; its rules (taint key,
deadline, …) are one row of ``queue_processor.rules.RULES``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import get_args

from queue_processor.events import Event, EventKind, ScheduledChangeEvent
from queue_processor.parse import REGISTRY, HealthMessage
from queue_processor.rules import RULES

#: NTH's taint keys (pkg/node/node.go in aws-node-termination-handler v1.25.6), and ours for the kinds NTH
#: does not taint for; whether the kind's start time is a deadline the instance is reclaimed at.
EXPECTED = {
    EventKind.SPOT_INTERRUPTION: ("aws-node-termination-handler/spot-itn", True),
    EventKind.CAPACITY_RESERVATION_INTERRUPTION: (
        "aws-node-termination-handler/capacity-reservation-interruption",
        True,
    ),
    EventKind.SCHEDULED_CHANGE: ("aws-node-termination-handler/scheduled-maintenance", False),
    EventKind.ASG_TERMINATE_LIFECYCLE: ("aws-node-termination-handler/asg-lifecycle-termination", False),
    EventKind.REBALANCE_RECOMMENDATION: ("aws-node-termination-handler/rebalance-recommendation", False),
    EventKind.ASG_LAUNCH_LIFECYCLE: (None, False),
    EventKind.STATE_CHANGE: (None, False),
}


def test_each_kind_has_one_model_and_one_row_of_rules_with_its_taint_key_and_deadline_rule() -> None:
    models = get_args(get_args(Event)[0])
    by_kind = {model.model_fields["kind"].default: model for model in models}
    assert set(by_kind) == set(EventKind) == set(RULES)
    assert {kind: (RULES[kind].taint_key, RULES[kind].notice) for kind in by_kind} == EXPECTED
    for kind, model in by_kind.items():
        assert model.__module__ == "queue_processor.events", kind


def test_every_kind_is_registered_with_the_parser() -> None:
    # AWS Health events are registered by their message, which gives one event per affected instance.
    models = set(REGISTRY.values())
    assert models == set(get_args(get_args(Event)[0])) - {ScheduledChangeEvent} | {HealthMessage}


def test_a_notice_is_a_deadline_and_other_start_times_are_not() -> None:
    from queue_processor.events import RebalanceRecommendationEvent, SpotInterruptionEvent

    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    spot = SpotInterruptionEvent(instance_id="i-1", time=now)
    rebalance = RebalanceRecommendationEvent(instance_id="i-1", time=now)
    assert (RULES[spot.kind].notice, spot.start_time) == (True, now + timedelta(seconds=120))
    assert (RULES[rebalance.kind].notice, rebalance.start_time) == (False, now)
