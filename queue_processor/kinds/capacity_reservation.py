"""EC2 Capacity Reservation Instance Interruption Warning →
:class:`~queue_processor.events.CapacityReservationInterruptionEvent`.

Format: "Monitor interruptible Capacity Reservations with EventBridge" and "Monitor Capacity Blocks" in the
EC2 User Guide: source ``aws.ec2``, detail ``{"instance-id", "instance-action": "terminate",
"instance-termination-time", "azId" | "availability-zone-id"}`` (the two pages spell the zone key
differently; both are read). The notice comes two minutes before the instance is terminated, so
``start_time`` is ``instance-termination-time`` when present, else ``time`` + 120 s.
"""

from queue_processor.events import CapacityReservationInterruptionEvent
from queue_processor.kinds.base import register, single

finish_capacity_reservation = register("aws.ec2", CapacityReservationInterruptionEvent)(single)
