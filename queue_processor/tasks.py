"""Tasks with an owner: started by name with :func:`spawn`, ended by whoever started them with :func:`stop`
(DESIGN.md rule 3). A cancellation of the caller while it waits goes on to the tasks and is raised."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog

__all__ = ["spawn", "stop", "wait"]

log = structlog.get_logger("queue_processor.tasks")

T = TypeVar("T")


def spawn(coro: Coroutine[Any, Any, T], *, name: str, awaited: bool = False) -> asyncio.Task[T]:
    """Start ``coro`` as a task named ``name``; an exception it ends with is logged, unless ``awaited`` (its
    owner takes the result). Its owner must :func:`stop` it."""
    task = asyncio.create_task(coro, name=name)
    if not awaited:
        task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task ended with an error", task=task.get_name(), error=repr(task.exception()))


async def wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Wait until every one of ``tasks`` (``None`` skipped) has ended; what each ends with is not raised.
    Raises ``CancelledError`` when the caller is cancelled."""
    live = [task for task in tasks if task is not None]
    if live:
        await asyncio.gather(*live, return_exceptions=True)


async def stop(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel every one of ``tasks`` still running and wait as :func:`wait` does."""
    for task in tasks:
        if task is not None and not task.done():
            task.cancel()
    await wait(*tasks)
