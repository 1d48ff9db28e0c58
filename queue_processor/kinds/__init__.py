"""One module per message kind; importing this package fills :data:`REGISTRY`.

To add a kind: add its event model to :mod:`queue_processor.events` (validation aliases reading its
EventBridge message, ``detail_type`` a ``Literal`` of its detail-type), write a module here that registers
it with ``register(source, Model)(finish)``, and import the module below.
"""

from queue_processor.kinds import (  # noqa: F401 - imported for their registrations
    asg_lifecycle,
    capacity_reservation,
    health,
    rebalance,
    spot,
    state_change,
)
from queue_processor.kinds.base import REGISTRY, ParseResult, Poison, register

__all__ = ["REGISTRY", "ParseResult", "Poison", "register"]
