"""The controller's Kubernetes client: the synchronous ``kubernetes`` client behind one bounded thread pool
and a client-side QPS/burst limit, speaking JSON dicts.

Every call goes through :meth:`KubeClient.request`: it waits for a token of the :class:`RateLimiter`
(``KUBE_API_QPS`` / ``KUBE_API_BURST``, as client-go's token bucket), runs the ``kubernetes`` client's own
HTTP machinery (configuration, auth, TLS) in the thread pool, and returns the decoded JSON body. Objects stay
dicts in the API's JSON shape: decoding into the client's models costs milliseconds per pod list, which a
storm of a thousand drains cannot afford. Connection errors, 429s (API Priority and Fairness, or a rate limit)
and 5xx answers are retried with tenacity, exponential backoff and jitter, a 429's or 503's Retry-After
honoured up to :data:`RETRY_AFTER_MAX_S`; evictions are not (their 429 and 500 mean "PodDisruptionBudget", and
the drain decides). urllib3 under the client retries only connections that failed before the request was
sent, and never sleeps on a Retry-After itself.

API paths and semantics: the Kubernetes API reference (core/v1 Node and Pod, policy/v1 Eviction,
coordination.k8s.io/v1 Lease, core/v1 Event) and "API-initiated Eviction".
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, Final

import urllib3
from kubernetes import client, config
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from queue_processor import __version__
from queue_processor.config import default
from queue_processor.observe.observer import NULL_OBSERVER, Observer
from queue_processor.outcomes import KubeError, StartupError

__all__ = [
    "AFTER_CORDONS",
    "METADATA_ONLY",
    "REPLICA_RANK",
    "REPLICA_THREADS",
    "RETRY_AFTER_MAX_S",
    "URGENT_RANK",
    "Keep",
    "KubeClient",
    "KubeError",
    "NotSentError",
    "RateLimiter",
    "load_api_client",
    "rank_urgent",
]

#: The longest a Retry-After is waited for before a retry (seconds): every wait stays short of what it protects
#: (a cordon, a heartbeat interval, a shutdown); the server asks for 1 s in API Priority and Fairness.
RETRY_AFTER_MAX_S = 10.0

Obj = dict[str, Any]

#: What a watch keeps of each event, run in its thread (:meth:`KubeClient.watch`): the event to deliver in its
#: place, or ``None`` to drop it.
Keep = Callable[[Obj], Obj | None]

#: The ``Accept`` header of a metadata-only read or watch: each object comes as a ``meta.k8s.io/v1``
#: ``PartialObjectMetadata`` (its ``metadata`` alone), as client-go's metadata informers ask ("Receiving
#: resources as Tables or metadata only", API concepts).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


PATCH_TYPES = {
    "strategic": "application/strategic-merge-patch+json",
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
}


#: The rank of the replica's own upkeep, ahead of every operation's: its Lease's renewal (a late renewal
#: loses every node held) and the pages of the watched copies (claims and cordons wait for them at start-up).
#: Work started outside any operation has it unless it says otherwise.
REPLICA_RANK: Final = -math.inf

#: Orders the urgent requests waiting for a token of the :class:`RateLimiter`, lowest first (seconds on the
#: event store's clock, or one of the two bounds below), first come first served within a rank. A draining
#: operation's claim and cordon carry its start (``Handler.handle`` sets it; the tasks it starts inherit it):
#: in a storm the node received first is claimed and cordoned first, its cordon ahead of the claims of nodes
#: received after it, instead of behind every claim queued while its own was answered.
URGENT_RANK: ContextVar[float] = ContextVar("queue_processor_urgent_rank", default=REPLICA_RANK)

#: The rank of urgent work that may wait for every operation's claim and cordon: what an operation does after
#: its cordon, launch operations (polling for their node for up to LAUNCH_READY_TIMEOUT_SEC), node Lease
#: releases and their retries, and the periodic checks (returns, NTH's tagged gauges). Strict order would let
#: such work, ranked by a start long past, hold a storm's cordons back for as long as it lasts.
AFTER_CORDONS: Final = math.inf


def rank_urgent(rank: float) -> None:
    """Rank the urgent requests of the running task, and of the tasks it starts from now on, at ``rank``
    (:data:`URGENT_RANK`; :data:`REPLICA_RANK`, an operation's start, or :data:`AFTER_CORDONS`)."""
    URGENT_RANK.set(rank)


#: A token, less what the sums of a refill lose to floating point (a sleep of 1/qps gives back 0.999…).
_WHOLE = 1 - 1e-9


class RateLimiter:
    """A token bucket: ``qps`` tokens per second, at most ``burst`` saved up (client-go's flowcontrol), with
    two classes of callers: an ``urgent`` one (cordoning a node, claiming a node Lease, renewing the replica
    Lease: DESIGN.md says none waits behind drains) takes the next token before any ordinary one. ``clock``
    returns seconds.

    Ordinary callers wait in line, first come first served. Urgent callers wait in order of their rank
    (:data:`URGENT_RANK` when they call), first come first served within a rank. The caller at the head of
    the lines sleeps until the next token; the others wait to be woken when their turn comes, so that a
    storm's thousands of waiting evictions cost one timer, not a wake-up each per token. (An urgent caller of
    a lower rank that arrives takes the head: the one it passed finishes its sleep, at most 1/``qps``
    seconds, and then waits for its turn.)"""

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
        """Take the head (as :meth:`_head` found it) out of its line."""
        if self._urgent:
            heapq.heappop(self._urgent)
        else:
            self._ordinary.popleft()

    def _remove(self, waiter: _Waiter) -> None:
        """Take ``waiter`` out of its line if it is still in it (the head, but for a cancelled caller further
        back): an urgent one is marked and leaves the heap when it reaches the top (a storm's shutdown cancels
        thousands, each removal from the middle of a heap a walk of it)."""
        if waiter.urgent:
            waiter.gone = True  # the caller's _leave finds the head next, which drops it if it is on top
        else:
            with contextlib.suppress(ValueError):
                self._ordinary.remove(waiter)

    def _leave(self, waiter: _Waiter) -> None:
        """``waiter`` leaves the line (served or cancelled); the tokens in the bucket go to the callers at its
        head at once (a woken caller returns without another turn of the loop: one token per turn would cap
        the rate on a busy loop), and the caller then at its head is woken to sleep until the next token."""
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
        """Take one token, waiting for it when the bucket is empty: an ordinary caller behind every urgent
        one and the ordinary ones that came first, an urgent one behind the urgent callers of a lower
        :data:`URGENT_RANK` and those of its own that came first."""
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
        """Return a token :meth:`acquire` gave and no request used (:class:`NotSentError`): the caller at the head of
        the line takes it when it is woken (at once when it waits for its turn; at its next wake-up, within
        1/``qps`` seconds, when it sleeps until the next token)."""
        self._tokens += 1
        head = self._head()
        if head is not None and not head.turn.done():
            head.turn.set_result(None)


class NotSentError(Exception):
    """A request whose ``sending`` check (:meth:`KubeClient.request`) said no once its token came: it was not
    sent, and the token went back to the rate limiter."""


class _Waiter:
    """A caller in :class:`RateLimiter`'s line: ``turn`` is resolved when it reaches the head or is ``granted``
    a token."""

    __slots__ = ("gone", "granted", "turn", "urgent")

    def __init__(self, urgent: bool) -> None:
        self.urgent = urgent
        self.granted = False
        self.gone = False  # it left the line: an urgent waiter still in the heap is skipped
        self.turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()


#: Threads (and connections) reserved for urgent calls: nodes (get, list, patch: finding and cordoning them) and
#: Leases (get, create, update, delete, deletecollection: a late renewal loses the nodes held).
URGENT_THREADS = 16

#: Threads (and connections) for the urgent calls of the replica's own upkeep (:data:`REPLICA_RANK`: its
#: Lease's renewal, the watched copies' pages). Ranks order tokens, not threads: on a slow API server a storm's
#: claims and cordons fill the urgent threads and queue for them, and a renewal queued behind them would let
#: every claim the replica holds lapse.
REPLICA_THREADS = 2

#: Watch connections the controller keeps open: pod deletions and nodes (queue_processor.drain.departures and
#: queue_processor.drain.node_cache).
WATCHES = 2


def load_api_client(
    kubeconfig: str | None = None, *, pool_size: int = 32 + URGENT_THREADS + REPLICA_THREADS + WATCHES
) -> client.ApiClient:
    """An ApiClient from the in-cluster service account, or from a kubeconfig (``kubeconfig``, else
    ``KUBECONFIG`` / ``~/.kube/config``) outside a cluster, keeping up to ``pool_size`` connections (one per
    thread of :class:`KubeClient`: 32 for drains, :data:`URGENT_THREADS` for node and Lease calls,
    :data:`REPLICA_THREADS` for the replica's own, and one per watch: with fewer, urllib3 discarded a
    connection whenever all were busy, "Connection pool is full"). Raises
    :class:`~queue_processor.outcomes.StartupError` (one line naming KUBECONFIG) when neither is usable."""
    configuration = client.Configuration()
    configuration.connection_pool_maxsize = pool_size
    # Only a connection that failed before the request went out is tried again down there; every other retry
    # (429 with its Retry-After, 5xx, a reset) is KubeClient's, bounded and counted.
    configuration.retries = urllib3.Retry(
        total=2, connect=2, read=False, status=0, other=0, redirect=0, respect_retry_after_header=False
    )
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return _named(client.ApiClient(configuration))
        except config.ConfigException:
            pass
    path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    except Exception as exc:  # a missing file, YAML that does not parse, a context that is not there
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StartupError(
            f"KUBECONFIG={path}: not in a cluster (no service account) and the kubeconfig cannot be used: "
            f"{first}"
        ) from None
    return _named(client.ApiClient(configuration))


#: The User-Agent of every request (what the API server's audit log records as ``userAgent``).
USER_AGENT = f"queue-processor/{__version__}"


def _named(api: client.ApiClient) -> client.ApiClient:
    api.user_agent = USER_AGENT
    return api


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, KubeError) and exc.status in (0, 429, 500, 502, 503, 504)


_backoff = wait_random_exponential(multiplier=0.2, max=5)


def _wait(state: RetryCallState) -> float:
    """Seconds before the next attempt: the answer's Retry-After (at most RETRY_AFTER_MAX_S), else jittered
    exponential backoff."""
    error = state.outcome.exception() if state.outcome is not None else None
    if isinstance(error, KubeError) and error.retry_after_s is not None:
        return min(max(error.retry_after_s, 0.0), RETRY_AFTER_MAX_S)
    return float(_backoff(state))


class KubeClient:
    """JSON access to the API server for the controller: ``threads`` for drain traffic and
    :data:`URGENT_THREADS` more for urgent node and Lease calls (a cordon's rate is these threads over the API
    server's latency under the storm's load, so they are not few). ``observer`` is told every request
    (:meth:`~queue_processor.observe.observer.Observer.kube_request`). Raises :class:`KubeError` from every
    call that fails."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        qps: float = default("kube_api_qps"),
        burst: int = default("kube_api_burst"),
        threads: int = 32,
        timeout_s: float = 30.0,
        attempts: int = 4,
        observer: Observer = NULL_OBSERVER,
    ) -> None:
        self.api = api_client
        self.limiter = RateLimiter(qps, burst)
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.observer = observer
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")
        # Cordons and Lease renewals must not queue behind a storm's evictions and pod lists: threads of their own.
        self._urgent_pool = ThreadPoolExecutor(max_workers=URGENT_THREADS, thread_name_prefix="kube-urgent")
        # ...and the replica's own upkeep (its Lease's renewal) must not queue behind a storm's claims and cordons.
        self._replica_pool = ThreadPoolExecutor(
            max_workers=REPLICA_THREADS, thread_name_prefix="kube-replica"
        )
        self.answered_at = 0.0
        """``time.monotonic()`` of the last answer from the API server (for readiness)."""
        self.unreachable_at = 0.0
        """``time.monotonic()`` of the last request that got no answer (connection refused, timeout)."""

    def close(self, *, wait: bool = True) -> None:
        """Shut the thread pools down and close the connection pool. ``wait``: wait for the calls in progress
        (each bounded by ``timeout_s``); without it, queued calls are cancelled and calls in progress are
        abandoned (shutdown must not wait on a slow API server)."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
        self._urgent_pool.shutdown(wait=wait, cancel_futures=not wait)
        self._replica_pool.shutdown(wait=wait, cancel_futures=not wait)
        if wait:
            self.api.close()  # type: ignore[no-untyped-call]

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        retry: bool = True,
        urgent: bool = False,
        agent: str | None = None,
        sending: Callable[[], bool] | None = None,
    ) -> Any:
        """One API request; the decoded JSON answer. ``retry=False`` leaves 5xx answers to the caller;
        ``urgent`` requests (node reads and patches: cordoning; Lease calls) pass the rate limiter before drain
        traffic, in order of :data:`URGENT_RANK`, and run on threads of their own (those of
        :data:`REPLICA_RANK` on :data:`REPLICA_THREADS` apart); ``agent`` is appended to the User-Agent
        (``drain/<id>``: the API server's audit log then tells which drain sent it). ``sending``, when given,
        is asked once the rate limiter gave the request its token (at each attempt), which may be seconds after
        the call in a storm: ``False`` gives the token back and raises :class:`NotSentError`."""
        if not retry:
            return await self._once(method, path, query, body, content_type, urgent, agent, sending)
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_retryable),
            wait=_wait,
            stop=stop_after_attempt(self.attempts),
            reraise=True,
        ):
            with attempt:
                return await self._once(method, path, query, body, content_type, urgent, agent, sending)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str | None,
        urgent: bool = False,
        agent: str | None = None,
        sending: Callable[[], bool] | None = None,
    ) -> Any:
        await self.limiter.acquire(urgent=urgent)
        if sending is not None and not sending():
            self.limiter.give_back()
            raise NotSentError(f"{method} {path}")
        loop = asyncio.get_running_loop()
        if not urgent:
            pool = self._pool
        else:
            pool = self._replica_pool if URGENT_RANK.get() == REPLICA_RANK else self._urgent_pool
        sent = loop.run_in_executor(pool, self._call, method, path, query, body, content_type, agent)
        try:
            status, data, retry_after = await asyncio.shield(sent)
        except asyncio.CancelledError:
            # A thread cannot be stopped: a write already on its way still reaches the server. Its caller (a
            # drain that stops) must not go on while it may still land, or a later drain of the node overlaps
            # with it. So a cancelled write returns once answered (at most ``timeout_s``); a second
            # cancellation ends that wait. A read changes nothing and is left behind.
            if method != "GET" and not sent.done():
                await asyncio.wait({sent})
            raise
        verb, resource = _describe(method, path, query)
        self.observer.kube_request(verb, resource, status or None)
        if status:
            self.answered_at = time.monotonic()
        else:
            self.unreachable_at = time.monotonic()
        if status >= 400 or status == 0:
            raise _error(status, data, retry_after)
        return json.loads(data) if data else None

    def _call(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str | None,
        agent: str | None = None,
    ) -> tuple[int, bytes, float | None]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        try:
            params = self.api.param_serialize(
                method,
                path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            if agent:  # the client's default headers win over header_params: set it on the serialized ones
                params[2]["User-Agent"] = f"{self.api.user_agent} {agent}"
            response = self.api.call_api(*params, _request_timeout=self.timeout_s)
            response.read()  # type: ignore[no-untyped-call]
            return (
                int(response.status),
                bytes(response.data or b""),
                _seconds(response.getheader("Retry-After")),  # type: ignore[no-untyped-call]
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return 0, json.dumps({"reason": "ConnectionError", "message": str(exc)}).encode(), None

    async def watch_pods(
        self,
        resource_version: str,
        deliver: Callable[[list[Obj]], None],
        *,
        timeout_s: float,
        opened: Callable[[], None] | None = None,
        keep: Keep | None = None,
    ) -> str:
        """A metadata-only watch of every pod (:meth:`watch`): names, uids and resourceVersions, no specs;
        ``keep`` as :meth:`watch` takes it."""
        return await self.watch(
            "/api/v1/pods",
            resource_version,
            deliver,
            timeout_s=timeout_s,
            opened=opened,
            metadata_only=True,
            keep=keep,
        )

    async def watch_nodes(
        self,
        resource_version: str,
        deliver: Callable[[list[Obj]], None],
        *,
        timeout_s: float,
        opened: Callable[[], None] | None = None,
        keep: Keep | None = None,
    ) -> str:
        """A watch of every Node (:meth:`watch`), whole objects; ``keep`` as :meth:`watch` takes it."""
        return await self.watch(
            "/api/v1/nodes", resource_version, deliver, timeout_s=timeout_s, opened=opened, keep=keep
        )

    async def node_pages(self, limit: int = 500) -> AsyncIterator[tuple[list[Obj], str]]:
        """Every Node, ``limit`` at a time: a list from etcd paged with continue tokens (every page at the first
        one's resourceVersion, "Retrieving large results sets in chunks" in API concepts), so that a cluster of
        thousands of nodes is never held in memory whole. Yields each page's items and the list's
        resourceVersion (where a watch of the nodes starts). Raises :class:`KubeError` (410 when a continue
        token expired mid-list: list again).

        The pages are urgent, as the node reads they spare are: claims and cordons wait for them at start-up
        (:data:`~queue_processor.drain.node_cache.FIRST_COPY_WAIT_S`), and in the drain lane they would wait
        behind every eviction queued."""
        token = ""
        while True:
            query = {"limit": str(limit), **({"continue": token} if token else {})}
            answer = await self.request("GET", "/api/v1/nodes", query=query, urgent=True)
            metadata = answer.get("metadata") or {}
            yield list(answer.get("items") or []), str(metadata.get("resourceVersion") or "")
            token = str(metadata.get("continue") or "")
            if not token:
                return

    async def watch(
        self,
        path: str,
        resource_version: str,
        deliver: Callable[[list[Obj]], None],
        *,
        timeout_s: float,
        opened: Callable[[], None] | None = None,
        query: Mapping[str, str] | None = None,
        metadata_only: bool = False,
        keep: Keep | None = None,
    ) -> str:
        """One watch connection to the collection ``path`` from ``resource_version``, with bookmarks: the
        events come to ``deliver`` (called in the event loop, a list of ``{"type", "object"}`` per chunk the
        server sent; the server's bookmarks are left out, and a chunk whose last line is not delivered ends with
        one ``BOOKMARK`` event whose object carries only the resourceVersion reached) until the server ends the
        stream after ``timeout_s`` seconds (``timeoutSeconds``). Returns the last resourceVersion seen (an
        event's or a bookmark's), to watch on from. The stream is read by a thread of its own (a daemon: it
        never holds the process up); the rate limiter is passed once per connection. ``opened`` is called (in
        the loop) once the server accepted the watch. Metadata-only objects with ``metadata_only``
        (:data:`METADATA_ONLY`). ``keep``, when given, is called in the watch thread with each event and returns
        what is delivered in its place, or ``None`` to drop it: a receiver that reads little of a busy
        collection (a storm's pods: several events for each deletion) then holds and queues to the loop only
        that; a ``keep`` that raises ends the watch as a receiver that raises does (``WatchReceiverError``).

        Raises :class:`KubeError`: status 410 when the server says the resourceVersion is too old (an ERROR
        event or an answer: read the current state again and watch from its resourceVersion, "Efficient
        detection of changes" in API concepts); another error answer's status; 0 when the connection failed or
        broke, or sent a line that is not an event (watch on from the last resourceVersion), and 0 with reason
        ``WatchReceiverError`` when ``deliver`` or ``opened`` raised (the connection is closed: nothing more
        is delivered). Cancelling it closes the connection."""
        await self.limiter.acquire()
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[str] = loop.create_future()
        stream = _Stream(loop, deliver, ended, opened)
        params = {
            **(query or {}),
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(int(timeout_s)),
        }
        accept = METADATA_ONLY if metadata_only else "application/json"
        thread = threading.Thread(
            target=self._stream,
            args=(path, params, accept, timeout_s, stream, keep),
            name="kube-watch",
            daemon=True,
        )
        thread.start()
        try:
            return await ended
        finally:
            stream.close()

    def _stream(
        self,
        path: str,
        query: Mapping[str, str],
        accept: str,
        timeout_s: float,
        stream: _Stream,
        keep: Keep | None,
    ) -> None:
        """The watch thread: connect, read chunks of lines, hand their events to the loop, end ``stream``."""
        rv = str(query["resourceVersion"])
        try:
            params = self.api.param_serialize(
                "GET",
                path,
                query_params=list(query.items()),
                header_params={"Accept": accept},
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(*params, _request_timeout=(10.0, timeout_s + 30.0)).response
            stream.response = response
            status = int(response.status)
            stream.call(self.observer.kube_request, "watch", _describe("GET", path, None)[1], status)
            if status != 200:
                raise _error(status, bytes(response.data or b""))
            stream.call(self._answered)
            if stream.opened is not None:
                stream.call(stream.opened)
            rest = b""
            for chunk in response.stream(1 << 16):
                if stream.closed:
                    return
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
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
                        raise _error(int(obj.get("code") or 500), json.dumps(obj).encode())
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if event.get("type") == "BOOKMARK":
                        passed = True
                        continue
                    try:
                        kept = event if keep is None else keep(event)
                    except Exception as exc:  # ours, not the server's: the watch ends as a receiver's failure
                        raise _KeepError(f"{type(exc).__name__}: {exc}") from exc
                    passed = kept is None
                    if kept is not None:
                        events.append(kept)
                if passed:  # where the stream is, for a receiver that resumes a broken one
                    events.append({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}})
                if events:
                    stream.call(stream.deliver, events)
            stream.end(rv)
        except KubeError as exc:
            stream.fail(exc)
        except _KeepError as exc:
            stream.fail(KubeError(0, "WatchReceiverError", str(exc)))
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            if not stream.closed:
                stream.call(self._unanswered)
            stream.fail(KubeError(0, "ConnectionError", f"watch {path}: {exc}"))
        finally:
            if stream.response is not None:
                stream.response.close()

    def _answered(self) -> None:
        self.answered_at = time.monotonic()

    def _unanswered(self) -> None:
        self.unreachable_at = time.monotonic()

    # ------------------------------------------------------------------------------------------ nodes

    def reachable(self) -> bool:
        """Readiness: the API server answered the latest request that was made (or none was made yet). An
        idle controller makes no request, and stays ready."""
        return self.unreachable_at <= self.answered_at

    async def get_node(self, name: str) -> Obj | None:
        """The Node, or ``None`` when it does not exist."""
        try:
            node: Obj = await self.request("GET", f"/api/v1/nodes/{name}", urgent=True)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return node

    async def list_nodes(self, label_selector: str | None = None, *, cached: bool = False) -> list[Obj]:
        """Every Node (matching ``label_selector``); ``cached`` reads from the API server's cache
        (``resourceVersion=0``)."""
        query = {"labelSelector": label_selector} if label_selector else {}
        if cached:
            query["resourceVersion"] = "0"
        answer = await self.request("GET", "/api/v1/nodes", query=query, urgent=True)
        return list(answer.get("items") or [])

    async def patch_node(self, name: str, patch: Any, patch_type: str = "strategic") -> Obj:
        """Patch a Node (``strategic``, ``merge`` or ``json`` patch); the Node after it."""
        node: Obj = await self.request(
            "PATCH", f"/api/v1/nodes/{name}", body=patch, content_type=PATCH_TYPES[patch_type], urgent=True
        )
        return node

    # ------------------------------------------------------------------------------------------- pods

    async def pods_on_node(self, node: str, *, cached: bool = False) -> list[Obj]:
        """The pods bound to ``node`` (``fieldSelector=spec.nodeName=<node>``), from the API server's cache
        when ``cached`` (``resourceVersion=0``: cheaper, possibly stale)."""
        query = {"fieldSelector": f"spec.nodeName={node}"}
        if cached:
            query["resourceVersion"] = "0"
        answer = await self.request("GET", "/api/v1/pods", query=query)
        return list(answer.get("items") or [])

    async def pods_version(self) -> str:
        """The current resourceVersion of the pods (a quorum list of at most one pod, ``limit=1``): where a watch
        of every pod starts without reading them all."""
        answer = await self.request("GET", "/api/v1/pods", query={"limit": "1"})
        return str(answer["metadata"]["resourceVersion"])

    async def evict(
        self,
        namespace: str,
        name: str,
        grace_s: int | None = None,
        *,
        dry_run: bool = False,
        drain: str | None = None,
        sending: Callable[[], bool] | None = None,
    ) -> None:
        """POST a policy/v1 Eviction (``grace_s``: ``deleteOptions.gracePeriodSeconds``, seconds; ``dry_run``:
        ``dryRun=All``, every check and nothing deleted, as ``kubectl drain --dry-run=server``; ``drain``: the
        ID of the drain that sends it, in the User-Agent as ``drain/<id>``; ``sending``: asked when the rate
        limiter's token comes, ``False`` sends nothing: :meth:`request`). Raises :class:`KubeError`: 429 when a
        PodDisruptionBudget allows no disruption now (its name in :attr:`KubeError.causes`), 500 when several
        budgets match the pod, 404 when it is gone; :class:`NotSentError`. Not retried here: each answer means
        something to the drain."""
        body: Obj = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options: Obj = {}
        if grace_s is not None and grace_s >= 0:
            options["gracePeriodSeconds"] = grace_s
        if dry_run:
            options["dryRun"] = ["All"]
        if options:
            body["deleteOptions"] = options
        await self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            body=body,
            retry=False,
            agent=f"drain/{drain}" if drain else None,
            sending=sending,
        )

    async def delete_pod(
        self, namespace: str, name: str, grace_s: int = 0, *, uid: str | None = None
    ) -> None:
        """DELETE a pod with ``gracePeriodSeconds`` (0: removed from the API server at once, whatever still
        runs on its node, as ``kubectl delete --force --grace-period=0``), only if its uid is ``uid`` (a
        precondition) when given. No PodDisruptionBudget is checked. Raises :class:`KubeError` (404 when it is
        gone, 409 when another pod of that name is there now)."""
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace_s}
        if uid:
            body["preconditions"] = {"uid": uid}
        await self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)

    async def get_pdb(self, namespace: str, name: str) -> Obj | None:
        """The policy/v1 PodDisruptionBudget, or ``None`` when it does not exist."""
        try:
            pdb: Obj = await self.request(
                "GET", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{name}"
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return pdb

    async def list_pdbs(self, namespace: str) -> list[Obj]:
        """Every policy/v1 PodDisruptionBudget of ``namespace``."""
        answer = await self.request("GET", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets")
        return list(answer.get("items") or [])

    async def pods_selected(self, namespace: str, label_selector: str) -> list[Obj]:
        """The pods of ``namespace`` matching ``label_selector`` (a Deployment's, for SURGE_DRAINS: which pods a
        surge record names are still there)."""
        answer = await self.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": label_selector}
        )
        return list(answer.get("items") or [])

    # ------------------------------------------------------------------------- workloads (SURGE_DRAINS)

    async def get_deployment(self, namespace: str, name: str) -> Obj | None:
        """The apps/v1 Deployment, or ``None`` when it does not exist (or the API server serves none)."""
        try:
            deployment: Obj = await self.request(
                "GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return deployment

    async def patch_deployment(self, namespace: str, name: str, patch: Obj) -> Obj:
        """JSON merge patch (RFC 7386) of an apps/v1 Deployment; the Deployment after it. A
        ``metadata.resourceVersion`` in ``patch`` is a precondition: :class:`KubeError` 409 when it is
        stale. Not retried here: the caller reads again."""
        deployment: Obj = await self.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
            body=patch,
            content_type=PATCH_TYPES["merge"],
            retry=False,
        )
        return deployment

    async def list_hpas(self, namespace: str) -> list[Obj]:
        """Every autoscaling/v2 HorizontalPodAutoscaler of ``namespace``."""
        answer = await self.request(
            "GET", f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers"
        )
        return list(answer.get("items") or [])

    async def create_event(self, namespace: str, event: Obj) -> None:
        """Record a core/v1 Event."""
        await self.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)

    # ------------------------------------------------------------------------------------------ leases
    # Urgent, as node calls: a renewal that waits behind a storm's evictions lets the Lease lapse and the node
    # go to another replica (DESIGN.md rule 10).

    async def get_lease(self, namespace: str, name: str) -> Obj | None:
        """The Lease, or ``None``."""
        try:
            lease: Obj = await self.request(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}", urgent=True
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return lease

    async def create_lease(self, namespace: str, lease: Obj) -> Obj:
        """Create a Lease; :class:`KubeError` 409 when it exists. Retried like any request (a 429, a 5xx, a
        reset): a create the server had made before the retry answers 409, and the claim then reads the Lease
        and finds it its own (:meth:`queue_processor.leases.NodeLeases.claim`)."""
        created: Obj = await self.request(
            "POST",
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
            body=lease,
            urgent=True,
        )
        return created

    async def replace_lease(self, namespace: str, lease: Obj) -> Obj:
        """Replace a Lease; :class:`KubeError` 409 when its resourceVersion is stale."""
        name = lease["metadata"]["name"]
        replaced: Obj = await self.request(
            "PUT",
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
            body=lease,
            retry=False,
            urgent=True,
        )
        return replaced

    async def patch_lease(self, namespace: str, name: str, patch: Obj) -> Obj:
        """Merge-patch a Lease (RFC 7386: an annotation added leaves the others, and needs no resourceVersion);
        the Lease after it. :class:`KubeError` 404 when it is gone."""
        patched: Obj = await self.request(
            "PATCH",
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
            body=patch,
            content_type=PATCH_TYPES["merge"],
            urgent=True,
        )
        return patched

    async def list_leases(self, namespace: str, label_selector: str) -> tuple[list[Obj], str]:
        """The Leases of ``namespace`` that ``label_selector`` selects, and the list's resourceVersion (where a
        watch of them starts)."""
        answer: Obj = await self.request(
            "GET",
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
            query={"labelSelector": label_selector},
            urgent=True,
        )
        version = str((answer.get("metadata") or {}).get("resourceVersion") or "")
        return list(answer.get("items") or []), version

    async def watch_leases(
        self,
        namespace: str,
        label_selector: str,
        resource_version: str,
        deliver: Callable[[list[Obj]], None],
        *,
        timeout_s: float,
        opened: Callable[[], None] | None = None,
    ) -> str:
        """A watch of the Leases of ``namespace`` that ``label_selector`` selects (:meth:`watch`)."""
        return await self.watch(
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
            resource_version,
            deliver,
            timeout_s=timeout_s,
            opened=opened,
            query={"labelSelector": label_selector},
        )

    async def delete_lease(self, namespace: str, name: str, *, resource_version: str | None = None) -> None:
        """Delete a Lease, only if it is still at ``resource_version`` when given (a precondition: 409
        Conflict otherwise, :class:`KubeError`); one already gone is not an error."""
        body = None
        if resource_version is not None:
            body = {"preconditions": {"resourceVersion": resource_version}}
        try:
            await self.request(
                "DELETE",
                f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
                body=body,
                urgent=True,
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def delete_leases(
        self, namespace: str, label_selector: str, *, sending: Callable[[], bool] | None = None
    ) -> list[str]:
        """Delete every Lease of ``namespace`` that ``label_selector`` selects, in one request (the
        ``deletecollection`` verb; no precondition: the selector is the condition) and return the names of
        those deleted (the API server answers with the list of the objects it deleted: "Delete Collection",
        Kubernetes API reference, Lease v1). ``sending`` is asked before each attempt (:meth:`request`).
        Raises :class:`KubeError`, :class:`NotSentError`."""
        deleted: Obj = await self.request(
            "DELETE",
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
            query={"labelSelector": label_selector},
            urgent=True,
            sending=sending,
        )
        return [str(item["metadata"]["name"]) for item in deleted.get("items") or ()]


class _KeepError(Exception):
    """A watch's ``keep`` raised (in the watch thread)."""


class _Stream:
    """What a watch thread shares with the event loop: ``deliver`` and ``ended`` are the loop's, reached only
    through :meth:`call`; :meth:`close` (from the loop) shuts the connection down, which ends a blocked read."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[list[Obj]], None],
        ended: asyncio.Future[str],
        opened: Callable[[], None] | None = None,
    ) -> None:
        self.loop = loop
        self.deliver = deliver
        self.ended = ended
        self.opened = opened
        self.response: Any = None
        self.closed = False

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in the loop (dropped once the watch is closed or the loop is gone)."""
        if not self.closed:
            with contextlib.suppress(RuntimeError):  # the loop closed
                self.loop.call_soon_threadsafe(self._call, fn, args)

    def _call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if self.closed:
            return
        try:
            fn(*args)
        except Exception as exc:  # the receiver could not take the events: the watch ends with that
            self._settle("", KubeError(0, "WatchReceiverError", f"{type(exc).__name__}: {exc}"))
            self.close()

    def end(self, rv: str) -> None:
        """The stream ended after ``rv``: the watch's answer."""
        self.call(self._settle, rv, None)

    def fail(self, exc: BaseException) -> None:
        """The watch raises ``exc``."""
        self.call(self._settle, "", exc)

    def _settle(self, rv: str, exc: BaseException | None) -> None:
        if self.ended.done():
            return
        if exc is None:
            self.ended.set_result(rv)
        else:
            self.ended.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        response = self.response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # urllib3: unblocks the thread's read


def _describe(method: str, path: str, query: Mapping[str, str] | None) -> tuple[str, str]:
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


def _seconds(value: str | None) -> float | None:
    """A Retry-After in seconds (the API server sends delta-seconds); ``None`` when absent or not a number."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _error(status: int, data: bytes, retry_after_s: float | None = None) -> KubeError:
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
