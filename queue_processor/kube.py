"""The controller's Kubernetes client: the ``kubernetes`` client's HTTP machinery behind bounded thread pools
and a QPS/burst limit (:class:`RateLimiter`), speaking JSON dicts (decoding models costs too much per pod list).
Connection errors, 429s and 5xx are retried with jittered backoff, a Retry-After honoured up to
:data:`RETRY_AFTER_MAX_S`; evictions are not (their 429 and 500 mean "PodDisruptionBudget": the drain decides).

Documents: Kubernetes API reference (core/v1 Node, Pod, Event; policy/v1 Eviction; coordination.k8s.io/v1 Lease),
"API-initiated Eviction".
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

#: The longest a Retry-After is waited for (seconds): short of what the wait holds up (a cordon, a heartbeat).
RETRY_AFTER_MAX_S = 10.0

Obj = dict[str, Any]

#: What a watch keeps of each event, run in its thread (:meth:`KubeClient.watch`); ``None`` drops it.
Keep = Callable[[Obj], Obj | None]

#: Accept header of metadata-only reads and watches ("Receiving resources as Tables or metadata only", API concepts).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


PATCH_TYPES = {
    "strategic": "application/strategic-merge-patch+json",
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
}


#: The rank of the replica's own upkeep, ahead of every operation's: its Lease's renewal (a late one loses every
#: node held) and the watched copies' pages. The default outside any operation.
REPLICA_RANK: Final = -math.inf

#: Orders urgent requests waiting for a token, lowest first: an operation's start (set by ``Handler.handle``, so
#: the node received first is claimed and cordoned first), or one of the two bounds.
URGENT_RANK: ContextVar[float] = ContextVar("queue_processor_urgent_rank", default=REPLICA_RANK)

#: The rank of urgent work that may wait for every claim and cordon: what follows a cordon, launches, Lease
#: releases, periodic checks (ranked by a start long past, it would hold later cordons back).
AFTER_CORDONS: Final = math.inf


def rank_urgent(rank: float) -> None:
    """Rank the urgent requests of the running task, and of the tasks it starts, at ``rank``."""
    URGENT_RANK.set(rank)


#: A token, less what the sums of a refill lose to floating point (a sleep of 1/qps gives back 0.999…).
_WHOLE = 1 - 1e-9


class RateLimiter:
    """A token bucket (client-go's flowcontrol): ``qps`` tokens per second, at most ``burst`` saved up;
    ``clock`` returns seconds. ``urgent`` callers (cordons, Lease calls) take tokens before ordinary ones, in
    order of :data:`URGENT_RANK`; each line is first come first served. Only the caller at the head sleeps
    until the next token; the others wait to be woken, so thousands of waiters cost one timer."""

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
        """``waiter`` leaves; the bucket's tokens go to the callers at the head at once (one per turn of the
        loop would cap the rate on a busy loop), and the next head is woken to sleep until the next token."""
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


class NotSentError(Exception):
    """A request whose ``sending`` check (:meth:`KubeClient.request`) said no: not sent, its token given back."""


class _Waiter:
    """A caller in :class:`RateLimiter`'s line: ``turn`` resolves at the head or when ``granted``."""

    __slots__ = ("gone", "granted", "turn", "urgent")

    def __init__(self, urgent: bool) -> None:
        self.urgent = urgent
        self.granted = False
        self.gone = False  # it left the line: an urgent waiter still in the heap is skipped
        self.turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()


#: Threads (and connections) reserved for urgent calls: node reads and cordons, and Lease calls.
URGENT_THREADS = 16

#: Threads for the replica's own upkeep (:data:`REPLICA_RANK`): ranks order tokens, not threads, and a renewal
#: queued behind a slow API server's claims and cordons would let every claim lapse.
REPLICA_THREADS = 2

#: Watch connections the controller keeps open (pod deletions, nodes).
WATCHES = 2


def load_api_client(
    kubeconfig: str | None = None, *, pool_size: int = 32 + URGENT_THREADS + REPLICA_THREADS + WATCHES
) -> client.ApiClient:
    """An ApiClient from the in-cluster service account, else ``kubeconfig`` (or ``KUBECONFIG``), with one of
    ``pool_size`` connections per thread and watch (fewer: "Connection pool is full"). Raises
    :class:`~queue_processor.outcomes.StartupError` when neither is usable."""
    configuration = client.Configuration()
    configuration.connection_pool_maxsize = pool_size
    # Only a connection that failed before the request went out is retried here; KubeClient makes the rest.
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
    """Seconds before the next attempt: the answer's Retry-After (bounded), else jittered backoff."""
    error = state.outcome.exception() if state.outcome is not None else None
    if isinstance(error, KubeError) and error.retry_after_s is not None:
        return min(max(error.retry_after_s, 0.0), RETRY_AFTER_MAX_S)
    return float(_backoff(state))


class KubeClient:
    """JSON access to the API server: ``threads`` for drain traffic, more for urgent calls; ``observer`` is told
    every request. Every call that fails raises :class:`KubeError`."""

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
        # Threads of their own: urgent calls must not queue behind drain traffic, nor the replica's behind those.
        self._urgent_pool = ThreadPoolExecutor(max_workers=URGENT_THREADS, thread_name_prefix="kube-urgent")
        self._replica_pool = ThreadPoolExecutor(
            max_workers=REPLICA_THREADS, thread_name_prefix="kube-replica"
        )
        self.answered_at = 0.0
        """``time.monotonic()`` of the last answer from the API server (for readiness)."""
        self.unreachable_at = 0.0
        """``time.monotonic()`` of the last request that got no answer (connection refused, timeout)."""

    def close(self, *, wait: bool = True) -> None:
        """Shut the thread pools and connections down; without ``wait``, abandon the calls in progress."""
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
        """One API request; the decoded JSON answer. ``retry=False`` retries nothing; ``urgent`` requests pass the
        rate limiter first and run on threads of their own; ``agent`` is appended to the User-Agent (``drain/<id>``,
        for the audit log). ``sending`` is asked at each attempt once the token came (maybe seconds later):
        ``False`` gives it back and raises :class:`NotSentError`."""
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
            # A thread cannot be stopped: a cancelled write returns once answered (at most ``timeout_s``) so that
            # a later drain of the node does not overlap with it; a second cancellation ends that wait.
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
        """A metadata-only watch of every pod (:meth:`watch`)."""
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
        """A watch of every Node (:meth:`watch`)."""
        return await self.watch(
            "/api/v1/nodes", resource_version, deliver, timeout_s=timeout_s, opened=opened, keep=keep
        )

    async def node_pages(self, limit: int = 500) -> AsyncIterator[tuple[list[Obj], str]]:
        """Every Node, ``limit`` at a time ("Retrieving large results sets in chunks", API concepts); yields
        each page's items and the list's resourceVersion. Urgent: claims and cordons wait for them at start-up.
        Raises :class:`KubeError` (410 when a continue token expired: list again)."""
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
        """One watch of the collection ``path`` from ``resource_version``, read by a daemon thread, until the
        server ends it after ``timeout_s`` seconds; returns the last resourceVersion seen. ``deliver`` gets, in
        the loop, the ``{"type", "object"}`` events of each chunk (server bookmarks left out; a chunk whose last
        line was not delivered ends with a ``BOOKMARK`` carrying the resourceVersion reached). ``opened`` is
        called once the server accepted it; ``keep`` filters events in the thread (:data:`Keep`).

        Raises :class:`KubeError`: 410 when the resourceVersion is too old (list again, "Efficient detection of
        changes" in API concepts); an error answer's status; 0 when the connection failed or sent a line that is
        not an event (watch on); 0 with reason ``WatchReceiverError`` when ``deliver``, ``opened`` or ``keep``
        raised. Cancelling it closes the connection."""
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
        """Readiness: the API server answered the latest request made (or none was made yet)."""
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
        """Every Node (matching ``label_selector``); ``cached`` reads the API server's cache."""
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
        """The pods bound to ``node``; ``cached`` reads the API server's cache (cheaper, maybe stale)."""
        query = {"fieldSelector": f"spec.nodeName={node}"}
        if cached:
            query["resourceVersion"] = "0"
        answer = await self.request("GET", "/api/v1/pods", query=query)
        return list(answer.get("items") or [])

    async def pods_version(self) -> str:
        """The pods' current resourceVersion (a quorum list of one pod): where a watch of all pods starts."""
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
        """POST a policy/v1 Eviction (``grace_s`` seconds; ``dry_run``: ``dryRun=All``; ``drain`` and ``sending``
        as :meth:`request` takes ``agent`` and ``sending``); not retried. Raises :class:`KubeError`: 429 when a
        PodDisruptionBudget allows no disruption now (named in :attr:`KubeError.causes`), 500 when several
        budgets match the pod, 404 when it is gone; :class:`NotSentError`."""
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
        """DELETE a pod, no PodDisruptionBudget checked (``grace_s`` 0: at once, as ``kubectl delete --force``),
        on the precondition of ``uid`` when given. Raises :class:`KubeError` (404 gone, 409 another uid)."""
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
        """The pods of ``namespace`` matching ``label_selector``."""
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
        """Merge-patch (RFC 7386) an apps/v1 Deployment; the Deployment after it. Not retried; a
        ``metadata.resourceVersion`` in ``patch`` is a precondition (:class:`KubeError` 409 when stale)."""
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
    # Urgent: a renewal behind a storm's evictions lets the Lease lapse (DESIGN.md rule 10).

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
        """Create a Lease; :class:`KubeError` 409 when it exists (also after a retried create that had landed)."""
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
        """Merge-patch (RFC 7386) a Lease; the Lease after it. :class:`KubeError` 404 when it is gone."""
        patched: Obj = await self.request(
            "PATCH",
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
            body=patch,
            content_type=PATCH_TYPES["merge"],
            urgent=True,
        )
        return patched

    async def list_leases(self, namespace: str, label_selector: str) -> tuple[list[Obj], str]:
        """The Leases of ``namespace`` that ``label_selector`` selects, and the list's resourceVersion."""
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
        """Delete a Lease (if still at ``resource_version`` when given, else 409); one already gone is fine."""
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
        """Delete the Leases ``label_selector`` selects in one request ("Delete Collection", API reference, Lease
        v1); the names deleted. ``sending`` as :meth:`request`. Raises :class:`KubeError`, :class:`NotSentError`."""
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
    """What a watch thread shares with the loop (``deliver`` and ``ended`` only through :meth:`call`)."""

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
        self.call(self._settle, rv, None)

    def fail(self, exc: BaseException) -> None:
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
