"""EC2 Spot Instance Interruption Warning → :class:`SpotInterruptionEvent`.
Format: "Spot Instance interruption notices" (EC2 User Guide).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, computed_field

from queue_processor.events import SPOT_NOTICE, BaseEvent, EventKind, NonEmptyStr, cached_field, detail_alias
from queue_processor.kinds.base import register, single


class SpotInterruptionEvent(BaseEvent):
    """A Spot interruption warning; ``instance_action`` is ``terminate``, ``stop`` or ``hibernate``."""

    detail_type: Literal["EC2 Spot Instance Interruption Warning"] = Field(
        default="EC2 Spot Instance Interruption Warning", alias="detail-type", exclude=True, repr=False
    )

    kind: Literal[EventKind.SPOT_INTERRUPTION] = EventKind.SPOT_INTERRUPTION
    instance_id: NonEmptyStr = Field(validation_alias=detail_alias("instance-id"))
    instance_action: str | None = Field(default=None, validation_alias=detail_alias("instance-action"))

    @computed_field
    @cached_field
    def start_time(self) -> datetime:
        """The end of the two-minute notice: ``time + 120 s``."""
        return self.time + SPOT_NOTICE


finish_spot = register("aws.ec2", SpotInterruptionEvent)(single)
