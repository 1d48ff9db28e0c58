"""One module per message kind (event model, parser, taint key, deadline rule); importing fills :data:`REGISTRY`.
To add a kind: its module (``register(source, Model)(finish)``), its ``EventKind``, its import and its model in
:data:`Event` below.
"""

from typing import Annotated

from pydantic import Field

from queue_processor.kinds.asg_lifecycle import (
    AsgLaunchLifecycleEvent,
    AsgLifecycleEvent,
    AsgTerminateLifecycleEvent,
)
from queue_processor.kinds.base import REGISTRY, ParseResult, Poison, register
from queue_processor.kinds.capacity_reservation import CapacityReservationInterruptionEvent
from queue_processor.kinds.health import ScheduledChangeEvent
from queue_processor.kinds.rebalance import RebalanceRecommendationEvent
from queue_processor.kinds.spot import SpotInterruptionEvent
from queue_processor.kinds.state_change import StateChangeEvent
from queue_processor.outcomes import PoisonClass, SkipClass

Event = Annotated[
    AsgTerminateLifecycleEvent
    | AsgLaunchLifecycleEvent
    | SpotInterruptionEvent
    | RebalanceRecommendationEvent
    | StateChangeEvent
    | ScheduledChangeEvent
    | CapacityReservationInterruptionEvent,
    Field(discriminator="kind"),
]
"""Any event, discriminated by ``kind``."""

__all__ = [
    "REGISTRY",
    "AsgLaunchLifecycleEvent",
    "AsgLifecycleEvent",
    "AsgTerminateLifecycleEvent",
    "CapacityReservationInterruptionEvent",
    "Event",
    "ParseResult",
    "Poison",
    "PoisonClass",
    "RebalanceRecommendationEvent",
    "ScheduledChangeEvent",
    "SkipClass",
    "SpotInterruptionEvent",
    "StateChangeEvent",
    "register",
]
