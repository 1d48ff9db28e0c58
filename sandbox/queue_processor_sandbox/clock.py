"""The sandbox's time scale: run a 120 s Spot notice or a 300 s hook timeout in a fraction of that.

Every duration the sandbox simulates (a hook's heartbeat timeout, a pod's termination grace period, the Spot
notice, a node's registration delay) is given in the seconds AWS or Kubernetes would use and turned into real
seconds with :meth:`SandboxClock.real`. Times the sandbox *publishes* (an event's ``time``) stay real wall-clock
times; :meth:`SandboxClock.backdate` shifts them so that a deadline derived the way the controller derives it
(e.g. Spot ``time + 120 s``) falls when the scaled deadline does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True)
class SandboxClock:
    """``scale`` is real seconds per simulated second: 1.0 runs in real time, 0.01 runs 100 times faster.

    Raises ``ValueError`` for a scale that is not positive.
    """

    scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"time scale must be > 0, got {self.scale}")

    def real(self, simulated_s: float) -> float:
        """Real seconds for ``simulated_s`` simulated seconds."""
        return simulated_s * self.scale

    def grace(self, simulated_s: int) -> int:
        """A pod's ``terminationGracePeriodSeconds`` for a grace of ``simulated_s`` simulated seconds: whole
        real seconds, as the API takes them, rounded up (never to 0 unless ``simulated_s`` is 0 or less), so
        that the controller reads in a pod's spec the real seconds its termination takes, on either API
        server."""
        return 0 if simulated_s <= 0 else max(1, math.ceil(self.real(simulated_s)))

    def now(self) -> datetime:
        """The real wall-clock time, aware UTC."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """A monotonic reading in real seconds, for deadlines."""
        return time.monotonic()

    def backdate(self, notice_s: float) -> datetime:
        """The event time to publish for a notice of ``notice_s`` simulated seconds, so that
        ``time + notice_s`` is ``now + real(notice_s)``."""
        return self.now() - timedelta(seconds=notice_s - self.real(notice_s))
