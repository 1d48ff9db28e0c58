"""Each message kind is one module holding its model and parser; its rules (taint key, deadline, …) are one row of
``queue_processor.rules.RULES``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import get_args

from queue_processor.events import EventKind
from queue_processor.kinds import REGISTRY, Event
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
        assert model.__module__.startswith("queue_processor.kinds."), kind


def test_every_kind_module_registers_what_it_parses() -> None:
    modules = {spec.model.__module__ for spec in REGISTRY.values()}
    assert modules == {
        "queue_processor.kinds.asg_lifecycle",
        "queue_processor.kinds.capacity_reservation",
        "queue_processor.kinds.health",
        "queue_processor.kinds.rebalance",
        "queue_processor.kinds.spot",
        "queue_processor.kinds.state_change",
    }


def test_a_notice_is_a_deadline_and_other_start_times_are_not() -> None:
    from queue_processor.kinds import RebalanceRecommendationEvent, SpotInterruptionEvent

    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    spot = SpotInterruptionEvent(instance_id="i-1", time=now)
    rebalance = RebalanceRecommendationEvent(instance_id="i-1", time=now)
    assert (RULES[spot.kind].notice, spot.start_time) == (True, now + timedelta(seconds=120))
    assert (RULES[rebalance.kind].notice, rebalance.start_time) == (False, now)
