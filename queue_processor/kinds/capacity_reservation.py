"""EC2 Capacity Reservation Instance Interruption Warning → :class:`CapacityReservationInterruptionEvent`.
Format: "Monitor interruptible Capacity Reservations with EventBridge", "Monitor Capacity Blocks" (EC2 User Guide).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import AliasChoices, AwareDatetime, Field, computed_field

from queue_processor.events import SPOT_NOTICE, BaseEvent, EventKind, NonEmptyStr, cached_field, detail_alias
from queue_processor.kinds.base import register, single


class CapacityReservationInterruptionEvent(BaseEvent):
    """An interruptible Capacity Reservation (or Capacity Block) reclaiming the instance, two minutes ahead."""

    detail_type: Literal["EC2 Capacity Reservation Instance Interruption Warning"] = Field(
        default="EC2 Capacity Reservation Instance Interruption Warning",
        alias="detail-type",
        exclude=True,
        repr=False,
    )

    kind: Literal[EventKind.CAPACITY_RESERVATION_INTERRUPTION] = EventKind.CAPACITY_RESERVATION_INTERRUPTION
    instance_id: NonEmptyStr = Field(validation_alias=detail_alias("instance-id"))
    instance_termination_time: AwareDatetime | None = Field(
        default=None, validation_alias=detail_alias("instance-termination-time")
    )
    instance_action: str | None = Field(default=None, validation_alias=detail_alias("instance-action"))
    availability_zone_id: str | None = Field(
        default=None,
        validation_alias=AliasChoices(detail_alias("availability-zone-id"), detail_alias("azId")),
    )

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """``instance_termination_time``, else the end of a two-minute notice."""
        return self.instance_termination_time or self.time + SPOT_NOTICE


finish_capacity_reservation = register("aws.ec2", CapacityReservationInterruptionEvent)(single)
