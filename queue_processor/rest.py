"""What the Kubernetes client does below its API calls (client-go's rest and flowcontrol packages): when a request may
go (a QPS/burst token bucket, urgent requests first by rank), the wait before a retry (a Retry-After honoured up to
:data:`RETRY_AFTER_MAX_S`, else jittered backoff), the reading of an answer, and a watch's connection, read in a thread
of its own: chunks of lines become ``{type, object}`` events handed to the loop ("Efficient detection of changes", API
concepts). Also tasks with an owner: started by name with :func:`spawn`, ended by whoever started them with
:func:`stop` (DESIGN.md rule 3); a cancellation of a caller that waits goes on to them."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import math
import time
from collections.abc import Callable, Coroutine, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import structlog
import urllib3
from tenacity import RetryCallState, wait_random_exponential

from queue_processor.outcomes import KubeError

#: The longest a Retry-After is waited for (seconds): short of what the wait holds up (a cordon, a heartbeat).
RETRY_AFTER_MAX_S = 10.0

#: The rank of the replica's own upkeep (Lease renewals, the watched copies' pages), ahead of every operation's.
REPLICA_RANK: Final = -math.inf

#: Orders urgent requests waiting for a token, lowest first: an operation's start (``Handler.handle``), or a bound.
URGENT_RANK: ContextVar[float] = ContextVar("queue_processor_urgent_rank", default=REPLICA_RANK)

#: The rank of urgent work that may wait for every claim and cordon: what follows a cordon, launches, releases.
AFTER_CORDONS: Final = math.inf


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
        self._line: list[tuple[bool, float, int, _Waiter]] = []  # a heap: (not urgent, rank, arrival, waiter)
        self._arrivals = itertools.count()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now

    def _head(self) -> _Waiter | None:
        line = self._line
        while line and line[0][3].gone:  # callers that left stay in the heap until they reach its top
            heapq.heappop(line)
        return line[0][3] if line else None

    def _leave_line(self, waiter: _Waiter) -> None:
        """``waiter`` leaves; the bucket's tokens go to the head callers at once, the next head sleeps for the next."""
        waiter.gone = True
        self._refill()
        head = self._head()
        while head is not None and self._tokens >= _WHOLE:
            heapq.heappop(self._line)
            self._tokens -= 1
            head.granted = True
            _wake(head)
            head = self._head()
        _wake(head)

    async def acquire(self, *, urgent: bool = False) -> None:
        """Take one token, waiting in line for it when the bucket is empty (see the class)."""
        self._refill()
        if self._head() is None and self._tokens >= _WHOLE:
            self._tokens -= 1
            return
        waiter = _Waiter(asyncio.get_running_loop().create_future())
        rank = URGENT_RANK.get() if urgent else 0.0
        heapq.heappush(self._line, (not urgent, rank, next(self._arrivals), waiter))
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
            self._leave_line(waiter)

    def give_back(self) -> None:
        """Return a token :meth:`acquire` gave and no request used, to the caller at the head."""
        self._tokens += 1
        _wake(self._head())


@dataclass(slots=True, eq=False)
class _Waiter:  # a caller in RateLimiter's line: its turn resolves at the head or when granted
    turn: asyncio.Future[None]
    granted: bool = False
    gone: bool = False  # it left the line: still in the heap, it is skipped


def _wake(waiter: _Waiter | None) -> None:
    if waiter is not None and not waiter.turn.done():
        waiter.turn.set_result(None)


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


Obj = dict[str, Any]

#: What a watch keeps of each event, run in its thread (:meth:`KubeClient.watch`); ``None`` drops it.
Keep = Callable[[Obj], Obj | None]


class WatchStream:
    """What a watch thread hands the loop, in order, through :attr:`queue` (:meth:`put`): ``("answered",
    status)``, ``("events", list)``, then ``("end", rv)`` or ``("error", KubeError)``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.response: Any = None
        self.closed = False

    def put(self, kind: str, value: Any) -> None:
        """Queue ``(kind, value)`` in the loop (dropped once the watch is closed or the loop is gone)."""
        if not self.closed:
            with contextlib.suppress(RuntimeError):  # the loop closed
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))

    def close(self) -> None:
        self.closed = True
        response = self.response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # urllib3: unblocks the thread's read


def read_watch(
    api: Any,
    path: str,
    query: Mapping[str, str],
    accept: str,
    timeout_s: float,
    stream: WatchStream,
    keep: Keep | None,
) -> None:
    """The watch thread: connect with ``api`` (an ApiClient), put the chunks read in ``stream`` (0: no answer)."""
    rv = str(query["resourceVersion"])
    try:
        params = api.param_serialize(
            "GET",
            path,
            query_params=list(query.items()),
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
        )
        response = api.call_api(*params, _request_timeout=(10.0, timeout_s + 30.0)).response
        stream.response = response
        if stream.closed:  # closed while connecting: close() found nothing to shut
            return
        status = int(response.status)
        stream.put("answered", status)
        if status != 200:
            raise error_of(status, bytes(response.data or b""))
        rest = b""
        for chunk in response.stream(1 << 16):
            if stream.closed:
                return
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            events, rv = _events_of(lines, rv, keep)
            if events:
                stream.put("events", events)
        stream.put("end", rv)
    except KubeError as exc:
        stream.put("error", exc)
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        if not stream.closed:
            stream.put("answered", 0)
        stream.put("error", KubeError(0, "ConnectionError", f"watch {path}: {exc}"))
    finally:
        if stream.response is not None:
            stream.response.close()


def _events_of(lines: list[bytes], rv: str, keep: Keep | None) -> tuple[list[Obj], str]:
    """The events of one chunk's whole ``lines`` that ``keep`` keeps, and the resourceVersion reached. Raises
    :class:`KubeError` for an ``ERROR`` event or when ``keep`` raised (reason ``WatchReceiverError``), ``ValueError``
    for a line that is not an event."""
    events = []
    passed = False  # the chunk's last line was not delivered (a bookmark, or dropped by keep)
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            raise ValueError(f"a watch event that is not {{type, object}}: {line[:200]!r}")
        if event.get("type") == "ERROR":  # a Status: 410 when the resourceVersion is too old
            raise error_of(int(obj.get("code") or 500), json.dumps(obj).encode())
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
        if event.get("type") == "BOOKMARK":
            passed = True
            continue
        try:
            kept = event if keep is None else keep(event)
        except Exception as exc:  # ours, not the server's: the watch ends as a receiver's failure
            raise KubeError(0, "WatchReceiverError", f"{type(exc).__name__}: {exc}") from exc
        passed = kept is None
        if kept is not None:
            events.append(kept)
    if passed:  # where the stream is, for a receiver that resumes a broken one
        events.append({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}})
    return events, rv


def describe(method: str, path: str) -> tuple[str, str]:
    """The RBAC verb and resource (``pods/eviction``) of a request: what the permissions list names."""
    parts = [p for p in path.split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        rest = rest[2:]
    resource = rest[0] if rest else ""
    if len(rest) >= 3:
        resource += "/" + rest[2]
    verbs = {
        "GET": "get" if len(rest) >= 2 else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if len(rest) >= 2 else "deletecollection",
    }
    return verbs.get(method, method.lower()), resource


def error_of(status: int, data: bytes, retry_after_s: float | None = None) -> KubeError:
    try:
        body = json.loads(data) if data else {}
    except ValueError:
        body = {"message": data[:200].decode(errors="replace")}
    if not isinstance(body, dict):
        body = {}
    details = body.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return KubeError(
        status,
        str(body.get("reason") or ""),
        str(body.get("message") or ""),
        retry_after_s,
        [cause for cause in causes if isinstance(cause, dict)] if isinstance(causes, list) else None,
    )


_task_log = structlog.get_logger("queue_processor.tasks")

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
        _task_log.error("task ended with an error", task=task.get_name(), error=repr(task.exception()))


async def wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Wait until each of ``tasks`` (``None`` skipped) has ended; raises none of theirs, only ``CancelledError``."""
    await asyncio.gather(*(task for task in tasks if task is not None), return_exceptions=True)


async def stop(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel every one of ``tasks`` still running and wait as :func:`wait` does."""
    for task in tasks:
        if task is not None and not task.done():
            task.cancel()
    await wait(*tasks)
