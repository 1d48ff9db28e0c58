"""The rank the controller's periodic checks make their urgent requests at (queue_processor.rest.URGENT_RANK):
behind every operation's claim and cordon, though they start before any operation, at the replica's rank."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine
from typing import Any

import pytest

from queue_processor import app
from queue_processor.rest import URGENT_RANK
from queue_processor.returns import Returns


async def first_rank(periodic: Coroutine[Any, Any, None], ranks: list[float], seen: asyncio.Event) -> float:
    """Run ``periodic`` until its first check has recorded its rank in ``ranks`` (setting ``seen``), stop it,
    and return that rank."""
    task = asyncio.create_task(periodic)
    try:
        await seen.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return ranks[0]


async def test_the_check_for_instances_back_in_service_waits_for_every_claim_and_cordon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks: list[float] = []
    checked = asyncio.Event()

    async def check(self: Returns) -> None:
        ranks.append(URGENT_RANK.get())
        checked.set()

    monkeypatch.setattr(Returns, "check", check)
    returns = Returns(None, None, None, busy=lambda _: False, interval_s=0)  # type: ignore[arg-type]
    assert await first_rank(returns.run(), ranks, checked) == math.inf


async def test_nth_s_tagged_gauges_wait_for_every_claim_and_cordon(monkeypatch: pytest.MonkeyPatch) -> None:
    ranks: list[float] = []
    refreshed = asyncio.Event()

    async def tagged_instances(ec2: Any, tag: str) -> set[str]:
        ranks.append(URGENT_RANK.get())
        refreshed.set()
        raise RuntimeError("not this test's concern")

    monkeypatch.setattr(app, "TAGGED_GAUGES_PERIOD_S", 0.0)
    monkeypatch.setattr(app, "tagged_instances", tagged_instances)
    gauges = app._tagged_gauges(None, None, None, "tag", None)  # type: ignore[arg-type]
    assert await first_rank(gauges, ranks, refreshed) == math.inf
