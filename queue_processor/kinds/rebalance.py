"""EC2 Instance Rebalance Recommendation → :class:`~queue_processor.events.RebalanceRecommendationEvent`.

Format: "EC2 instance rebalance recommendations" in the EC2 User Guide: source ``aws.ec2``, detail
``{"instance-id": "i-…"}``. No deadline is given, so ``start_time = time``. The event model reads the message
itself.
"""

from queue_processor.events import RebalanceRecommendationEvent
from queue_processor.kinds.base import register, single

finish_rebalance = register("aws.ec2", RebalanceRecommendationEvent)(single)
