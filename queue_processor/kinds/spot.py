"""EC2 Spot Instance Interruption Warning → :class:`~queue_processor.events.SpotInterruptionEvent`.

Format: "Spot Instance interruption notices" in the EC2 User Guide: source ``aws.ec2``, detail
``{"instance-id": "i-…", "instance-action": "terminate|stop|hibernate"}``. The instance is interrupted two
minutes after the event, so ``start_time = time + 120 s``. The event model reads the message itself.
"""

from queue_processor.events import SpotInterruptionEvent
from queue_processor.kinds.base import register, single

finish_spot = register("aws.ec2", SpotInterruptionEvent)(single)
