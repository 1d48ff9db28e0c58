"""The Kubernetes client's rate limiter (a token bucket with urgent callers first), on a fake clock."""

from __future__ import annotations

import asyncio
import math

import pytest

from queue_processor.rest import URGENT_RANK, RateLimiter


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A clock that only moves when the limiter sleeps: ``clock[0]`` is now, in seconds; ``clock[1]`` counts
    the sleeps (each a wake-up of a waiting caller)."""
    now = [0.0, 0]
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        now[0] += seconds
        now[1] += 1
        await real_sleep(0)

    monkeypatch.setattr("queue_processor.rest.asyncio.sleep", sleep)
    return now


async def test_rate_limiter_allows_a_burst_then_the_rate(clock: list[float]) -> None:
    limiter = RateLimiter(qps=50, burst=5, clock=lambda: clock[0])
    for _ in range(5):
        await limiter.acquire()
    assert clock[0] == 0  # the burst is free
    for _ in range(10):
        await limiter.acquire()
    assert clock[0] == pytest.approx(10 / 50, rel=0.01)  # then 50 per second


async def test_urgent_callers_pass_the_rate_limiter_first() -> None:
    # On the real clock: the order is asserted, not the time it takes.
    limiter = RateLimiter(qps=20, burst=1)
    await limiter.acquire()  # the bucket is empty now
    order: list[str] = []

    async def take(name: str, urgent: bool) -> None:
        await limiter.acquire(urgent=urgent)
        order.append(name)

    ordinary = [asyncio.create_task(take(f"drain-{n}", False)) for n in range(3)]
    await asyncio.sleep(0)  # the ordinary callers queue first
    cordon = asyncio.create_task(take("cordon", True))
    await asyncio.gather(*ordinary, cordon)
    assert order[0] == "cordon"


async def test_urgent_callers_are_served_by_rank_then_first_come_first_served(clock: list[float]) -> None:
    """In a storm each operation's claim and cordon are urgent: the operation started first (the lower
    :data:`URGENT_RANK`) is served first, its cordon before the claims of operations started after it that
    queued earlier; work of the replica itself (the default rank) before any operation's; ordinary callers
    after every urgent one; a caller cancelled in the middle of the line leaves the others' order alone."""
    queuing = [True]  # no token comes while the callers get in line
    limiter = RateLimiter(qps=10, burst=1, clock=lambda: 0.0 if queuing[0] else clock[0])
    await limiter.acquire()  # the bucket is empty now
    order: list[str] = []

    async def take(name: str, rank: float | None, urgent: bool = True) -> None:
        if rank is not None:
            URGENT_RANK.set(rank)  # in this task's own context, as an operation's task sets it
        await limiter.acquire(urgent=urgent)
        order.append(name)

    callers = [
        asyncio.create_task(take("evict", None, urgent=False)),
        asyncio.create_task(take("claim-of-op-3", 3.0)),
        asyncio.create_task(take("claim-of-op-2", 2.0)),
        asyncio.create_task(take("gone-op-1", 1.0)),
        asyncio.create_task(take("cordon-of-op-1", 1.0)),
        asyncio.create_task(take("second-claim-of-op-2", 2.0)),
        asyncio.create_task(take("replica-lease-renewal", None)),
    ]
    for _ in range(3):
        await asyncio.sleep(0)  # every caller is in line
    assert order == []
    callers[3].cancel()
    queuing[0] = False
    await asyncio.gather(*callers, return_exceptions=True)
    assert URGENT_RANK.get() == -math.inf  # the callers' ranks stayed in their own tasks
    assert order == [
        "replica-lease-renewal",
        "cordon-of-op-1",
        "claim-of-op-2",
        "second-claim-of-op-2",
        "claim-of-op-3",
        "evict",
    ]


def test_a_rate_limiter_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError, match="qps must be > 0"):
        RateLimiter(qps=0, burst=1)
    with pytest.raises(ValueError, match="burst >= 1"):
        RateLimiter(qps=1, burst=0)


async def test_waiting_callers_are_served_in_order_and_only_the_first_sleeps(clock: list[float]) -> None:
    """A storm queues thousands of evictions on the limiter: they are served first come first served, and
    only the caller at the head of the line sleeps until the next token (the others are woken when their turn
    comes), so the wake-ups are one per token, not one per waiting caller per token."""
    limiter = RateLimiter(qps=100, burst=1, clock=lambda: clock[0])
    await limiter.acquire()  # the bucket is empty now
    order: list[int] = []

    async def take(index: int) -> None:
        await limiter.acquire()
        order.append(index)

    await asyncio.gather(*(take(index) for index in range(300)))
    assert order == list(range(300))
    assert clock[0] == pytest.approx(300 / 100, rel=0.01)
    assert clock[1] <= 300 + 5  # about one sleep per token (each caller polling every token: ~45,000)


async def test_a_caller_that_gives_up_waiting_passes_its_turn_on(clock: list[float]) -> None:
    limiter = RateLimiter(qps=10, burst=1, clock=lambda: clock[0])
    await limiter.acquire()
    served: list[str] = []

    async def take(name: str) -> None:
        await limiter.acquire()
        served.append(name)

    first = asyncio.create_task(take("first"))
    second = asyncio.create_task(take("second"))
    third = asyncio.create_task(take("third"))
    await asyncio.sleep(0)
    first.cancel()  # the head of the line, sleeping until the next token
    second.cancel()  # next in line, waiting for its turn
    await asyncio.gather(first, second, return_exceptions=True)
    await third
    assert served == ["third"]


async def test_tokens_saved_up_go_to_every_caller_they_cover_at_once(clock: list[float]) -> None:
    """On a busy event loop each pass is long: the tokens the bucket holds go to as many callers in line at
    once, not to one caller per pass of the loop (which would cap the rate at one request per pass)."""
    limiter = RateLimiter(qps=100, burst=50, clock=lambda: clock[0])
    for _ in range(50):
        await limiter.acquire()  # the burst is spent
    waiting = [asyncio.create_task(limiter.acquire()) for _ in range(20)]
    await asyncio.sleep(0)  # they queue; the first sleeps until the next token
    clock[0] += 1.0  # a long pause of the loop: the bucket is full again
    for _ in range(3):  # a few passes of the loop, not one per caller
        await asyncio.sleep(0)
    assert all(task.done() for task in waiting)


async def test_a_token_given_back_goes_to_the_next_caller_without_a_wait(clock: list[float]) -> None:
    """An eviction whose budget closed while it waited for its token sends nothing: the token
    it gives back serves the caller behind it, as if it had never been taken."""
    limiter = RateLimiter(qps=10, burst=1, clock=lambda: clock[0])
    await limiter.acquire()  # the bucket is empty now
    first = asyncio.create_task(limiter.acquire())
    second = asyncio.create_task(limiter.acquire())
    await first
    taken_at = clock[0]
    limiter.give_back()
    await second
    assert clock[0] == taken_at  # no wait for the next token
    third = asyncio.create_task(limiter.acquire())
    await third
    assert clock[0] == pytest.approx(taken_at + 0.1, rel=0.01)  # then the rate again
