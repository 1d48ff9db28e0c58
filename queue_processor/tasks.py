"""Tasks with an owner: started by name, and stopped by whoever started them (DESIGN.md rule 3, kopf's shape).

Every background task of the controller is started with :func:`spawn` (named, so a stop that leaves one
behind says which; an exception it ends with is logged, never lost in an unawaited task) and ended with
:func:`stop`, which cancels the tasks still running and waits until every one has ended, whatever each ends
with. A cancellation of the caller while it waits goes on to the tasks (``asyncio.gather``'s) and is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog

__all__ = ["spawn", "stop", "wait"]

log = structlog.get_logger("queue_processor.tasks")

T = TypeVar("T")


def spawn(coro: Coroutine[Any, Any, T], *, name: str, awaited: bool = False) -> asyncio.Task[T]:
    """Start ``coro`` as a task named ``name``; an exception it ends with (not a cancellation) is logged with
    the name when it ends, unless ``awaited``: its owner takes its result (and so its exception) and deals
    with it. Its owner must :func:`stop` it."""
    task = asyncio.create_task(coro, name=name)
    if not awaited:
        task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task ended with an error", task=task.get_name(), error=repr(task.exception()))


async def wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Wait until every one of ``tasks`` (``None`` entries skipped) has ended by itself, whatever each ends
    with (not raised). Raises ``CancelledError`` when the caller is cancelled while it waits."""
    live = [task for task in tasks if task is not None]
    if live:
        await asyncio.gather(*live, return_exceptions=True)


async def stop(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel every one of ``tasks`` still running (``None`` entries are skipped) and wait until all have
    ended. What each ended with (a result, an exception, a cancellation) is not raised: the task's own
    logging (:func:`spawn`) or its awaiting owner deals with it. Raises ``CancelledError`` when the caller is
    cancelled while it waits."""
    for task in tasks:
        if task is not None and not task.done():
            task.cancel()
    await wait(*tasks)
