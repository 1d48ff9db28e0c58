"""EC2 Instance Rebalance Recommendation → :class:`RebalanceRecommendationEvent`.
Format: "EC2 instance rebalance recommendations" (EC2 User Guide).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from queue_processor.events import BaseEvent, EventKind, NonEmptyStr, detail_alias
from queue_processor.kinds.base import register, single


class RebalanceRecommendationEvent(BaseEvent):
    """A rebalance recommendation: ``detail`` = ``{"instance-id"}``; ``start_time = time`` (no deadline)."""

    detail_type: Literal["EC2 Instance Rebalance Recommendation"] = Field(
        default="EC2 Instance Rebalance Recommendation", alias="detail-type", exclude=True, repr=False
    )

    kind: Literal[EventKind.REBALANCE_RECOMMENDATION] = EventKind.REBALANCE_RECOMMENDATION
    instance_id: NonEmptyStr = Field(validation_alias=detail_alias("instance-id"))


finish_rebalance = register("aws.ec2", RebalanceRecommendationEvent)(single)
