"""When a Kubernetes request may go: the client's QPS/burst limit (client-go's flowcontrol token bucket), with
urgent requests first in the order of their rank (the replica's own upkeep, then each operation by its start), and
the wait before a retry (a Retry-After honoured up to :data:`RETRY_AFTER_MAX_S`, else jittered backoff)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import Final

from tenacity import RetryCallState, wait_random_exponential

from queue_processor.outcomes import KubeError

__all__ = [
    "AFTER_CORDONS",
    "REPLICA_RANK",
    "RETRY_AFTER_MAX_S",
    "URGENT_RANK",
    "RateLimiter",
    "rank_urgent",
    "retry_wait",
    "retryable",
]

#: The longest a Retry-After is waited for (seconds): short of what the wait holds up (a cordon, a heartbeat).
RETRY_AFTER_MAX_S = 10.0

#: The rank of the replica's own upkeep (Lease renewals, the watched copies' pages), ahead of every operation's.
REPLICA_RANK: Final = -math.inf

#: Orders urgent requests waiting for a token, lowest first: an operation's start (``Handler.handle``), or a bound.
URGENT_RANK: ContextVar[float] = ContextVar("queue_processor_urgent_rank", default=REPLICA_RANK)

#: The rank of urgent work that may wait for every claim and cordon: what follows a cordon, launches, releases.
AFTER_CORDONS: Final = math.inf


def rank_urgent(rank: float) -> None:
    """Rank the urgent requests of the running task, and of the tasks it starts, at ``rank``."""
    URGENT_RANK.set(rank)


#: A token, less what the sums of a refill lose to floating point (a sleep of 1/qps gives back 0.999…).
_WHOLE = 1 - 1e-9


class RateLimiter:
    """A token bucket (client-go's flowcontrol): ``qps`` tokens per second, at most ``burst`` saved up; ``clock``
    returns seconds. ``urgent`` callers take tokens first, by :data:`URGENT_RANK`; each line is first come first
    served. Only the head sleeps until the next token; the others wait to be woken (thousands cost one timer)."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._urgent: list[tuple[float, int, _Waiter]] = []  # a heap: (rank, arrival, waiter)
        self._arrivals = itertools.count()
        self._ordinary: deque[_Waiter] = deque()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now

    def _head(self) -> _Waiter | None:
        urgent = self._urgent
        while urgent and urgent[0][2].gone:  # cancelled callers leave the heap when they reach its top
            heapq.heappop(urgent)
        return urgent[0][2] if urgent else self._ordinary[0] if self._ordinary else None

    def _pop_head(self) -> None:
        if self._urgent:
            heapq.heappop(self._urgent)
        else:
            self._ordinary.popleft()

    def _remove(self, waiter: _Waiter) -> None:
        """Take ``waiter`` out of its line; an urgent one is only marked (removal from a heap's middle is slow)."""
        if waiter.urgent:
            waiter.gone = True  # the caller's _leave finds the head next, which drops it if it is on top
        else:
            with contextlib.suppress(ValueError):
                self._ordinary.remove(waiter)

    def _leave(self, waiter: _Waiter) -> None:
        """``waiter`` leaves; the bucket's tokens go to the head callers at once, the next head sleeps for the next."""
        self._remove(waiter)
        self._refill()
        head = self._head()
        while head is not None and self._tokens >= _WHOLE:
            self._pop_head()
            self._tokens -= 1
            head.granted = True
            if not head.turn.done():
                head.turn.set_result(None)
            head = self._head()
        if head is not None and not head.turn.done():
            head.turn.set_result(None)

    async def acquire(self, *, urgent: bool = False) -> None:
        """Take one token, waiting in line for it when the bucket is empty (see the class)."""
        self._refill()
        if self._head() is None and self._tokens >= _WHOLE:
            self._tokens -= 1
            return
        waiter = _Waiter(urgent)
        if urgent:
            heapq.heappush(self._urgent, (URGENT_RANK.get(), next(self._arrivals), waiter))
        else:
            self._ordinary.append(waiter)
        try:
            while not waiter.granted:
                if self._head() is not waiter:
                    if waiter.turn.done():
                        waiter.turn = asyncio.get_running_loop().create_future()
                    await waiter.turn  # woken when it reaches the head of the line, or given a token
                    continue
                self._refill()
                if self._tokens >= _WHOLE:
                    self._tokens -= 1
                    waiter.granted = True
                    break
                await asyncio.sleep(max((1 - self._tokens) / self.qps, 0.001))
        except BaseException:
            if waiter.granted:  # given a token, then cancelled before it could use it: the token goes back
                self._tokens += 1
            raise
        finally:
            self._leave(waiter)

    def give_back(self) -> None:
        """Return a token :meth:`acquire` gave and no request used, to the caller at the head."""
        self._tokens += 1
        head = self._head()
        if head is not None and not head.turn.done():
            head.turn.set_result(None)


class _Waiter:
    """A caller in :class:`RateLimiter`'s line: ``turn`` resolves at the head or when ``granted``."""

    __slots__ = ("gone", "granted", "turn", "urgent")

    def __init__(self, urgent: bool) -> None:
        self.urgent = urgent
        self.granted = False
        self.gone = False  # it left the line: an urgent waiter still in the heap is skipped
        self.turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()


def retryable(exc: BaseException) -> bool:
    """Whether a request that raised ``exc`` is tried again: no answer, 429 or a 5xx but 501."""
    return isinstance(exc, KubeError) and exc.status in (0, 429, 500, 502, 503, 504)


_BACKOFF = wait_random_exponential(multiplier=0.2, max=5)


def retry_wait(state: RetryCallState) -> float:
    """Seconds before the next attempt: the answer's Retry-After (bounded), else jittered backoff."""
    error = state.outcome.exception() if state.outcome is not None else None
    if isinstance(error, KubeError) and error.retry_after_s is not None:
        return min(max(error.retry_after_s, 0.0), RETRY_AFTER_MAX_S)
    return float(_BACKOFF(state))
