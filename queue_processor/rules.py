"""What the controller does for each kind of event, in one pure table (as Karpenter's ``actionForMessage``): which
kinds get NTH's PreDrain and which taint, which bring the instance's end (no drain runs past it), which leave time
for DRAIN_BUDGET_NON_URGENT, and which are handed to the replica holding the node's Lease."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from queue_processor.events import EventKind

__all__ = ["RULES", "KindRules", "pre_drains"]


@dataclass(frozen=True)
class KindRules:
    """The rules of one kind. ``pre_drain``: NTH gives it a PreDrain task (its taint goes out with the cordon);
    ``taint_key``: NTH's taint key (TAINT_NODE; value: the event ID), ``None``: never tainted; ``notice``: its start
    time is when the instance is reclaimed (a deadline); ``leaves_time``: ``always``, ``when-far`` (its start more
    than NODE_TERMINATION_GRACE_PERIOD away) or ``never``; ``handed_over``: a replica that cannot claim the node
    hands it to the Lease's holder (not a lifecycle action: its heartbeats stay with its message)."""

    pre_drain: bool
    taint_key: str | None
    notice: bool
    leaves_time: Literal["always", "when-far", "never"]
    handed_over: bool


#: NTH's taint keys are a contract other projects key on (tests/peers/test_taint_contract.py).
RULES: dict[EventKind, KindRules] = {
    EventKind.SPOT_INTERRUPTION: KindRules(
        True, "aws-node-termination-handler/spot-itn", notice=True, leaves_time="never", handed_over=True
    ),
    EventKind.CAPACITY_RESERVATION_INTERRUPTION: KindRules(  # NTH counts it as Spot for PreDrain
        True,
        "aws-node-termination-handler/capacity-reservation-interruption",
        notice=True,
        leaves_time="never",
        handed_over=True,
    ),
    EventKind.REBALANCE_RECOMMENDATION: KindRules(
        True,
        "aws-node-termination-handler/rebalance-recommendation",
        notice=False,
        leaves_time="always",
        handed_over=False,
    ),
    EventKind.SCHEDULED_CHANGE: KindRules(
        True,
        "aws-node-termination-handler/scheduled-maintenance",
        notice=False,
        leaves_time="when-far",
        handed_over=True,
    ),
    EventKind.ASG_TERMINATE_LIFECYCLE: KindRules(
        True,
        "aws-node-termination-handler/asg-lifecycle-termination",
        notice=False,
        leaves_time="never",
        handed_over=False,
    ),
    EventKind.ASG_LAUNCH_LIFECYCLE: KindRules(
        False, None, notice=False, leaves_time="never", handed_over=False
    ),
    EventKind.STATE_CHANGE: KindRules(False, None, notice=False, leaves_time="never", handed_over=True),
}


def pre_drains(kinds: Iterable[EventKind]) -> bool:
    """Whether any of ``kinds`` gets NTH's PreDrain task."""
    return any(RULES[kind].pre_drain for kind in kinds)
