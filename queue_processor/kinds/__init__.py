"""One module per message kind: its event model (the wire format it reads), its parser, its taint key and its
deadline rule. Importing this package fills :data:`REGISTRY`.

To add a kind: write a module here holding its event model (a :class:`BaseEvent`
whose validation aliases read its EventBridge message, ``detail_type`` a ``Literal`` of its detail-type,
``taint_key`` and ``notice`` set), register it with ``register(source, Model)(finish)``, add its
:class:`~queue_processor.events.EventKind`, import the module below and add the model to :data:`Event`.
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
