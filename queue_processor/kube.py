"""The Kubernetes client: the ``kubernetes`` client's HTTP machinery behind bounded thread pools and a QPS/burst
limit, speaking JSON dicts. Connection errors, 429s and 5xx are retried with jittered backoff (Retry-After honoured);
evictions are not (the drain decides). API reference: core/v1 Node, Pod, Event; policy/v1 Eviction
("API-initiated Eviction"); coordination.k8s.io/v1 Lease."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import urllib3
from kubernetes import client, config
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from queue_processor import __version__, rest
from queue_processor.config import default
from queue_processor.observe.metrics import NULL_OBSERVER, Observer
from queue_processor.outcomes import KubeError, StartupError
from queue_processor.rest import Obj

#: Accept header of metadata-only reads and watches ("Receiving resources as Tables or metadata only", API concepts).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"

#: Content types of a Node's patch (strategic merge) and of the others' (RFC 7386 merge patch).
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"

#: Threads (and connections) for drain traffic; reserved for urgent calls (node reads and cordons, and Lease calls);
#: for the replica's upkeep (:data:`~queue_processor.rest.REPLICA_RANK`), not behind claims and cordons.
THREADS = 32
URGENT_THREADS = 16
REPLICA_THREADS = 2

#: Watch connections the controller keeps open (pod deletions, nodes, and the node Leases with NODE_LEASES).
WATCHES = 3

#: Seconds one request may take, connecting and reading.
REQUEST_TIMEOUT_S = 30.0

#: The User-Agent of every request (what the API server's audit log records as ``userAgent``).
USER_AGENT = f"queue-processor/{__version__}"


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An ApiClient from the in-cluster service account, else ``kubeconfig`` (or ``KUBECONFIG``), a connection per
    thread and watch. Raises :class:`~queue_processor.outcomes.StartupError` if neither works."""
    configuration = client.Configuration()
    configuration.connection_pool_maxsize = THREADS + URGENT_THREADS + REPLICA_THREADS + WATCHES
    # Only a connection that failed before the request went out is retried here; KubeClient makes the rest.
    configuration.retries = urllib3.Retry(
        total=2, connect=2, read=False, status=0, other=0, redirect=0, respect_retry_after_header=False
    )
    in_cluster = False
    if kubeconfig is None:
        with contextlib.suppress(config.ConfigException):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            in_cluster = True
    if not in_cluster:
        path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        try:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
        except Exception as exc:  # a missing file, YAML that does not parse, a context that is not there
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StartupError(
                f"KUBECONFIG={path}: not in a cluster (no service account) and the kubeconfig cannot be used: "
                f"{first}"
            ) from None
    api = client.ApiClient(configuration)
    api.user_agent = USER_AGENT
    return api


#: The Leases of a namespace (coordination.k8s.io/v1).
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{}/leases"


class KubeClient:
    """JSON access to the API server: ``threads`` for drain traffic, ``attempts`` per request; raises KubeError."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        qps: float = default("kube_api_qps"),
        burst: int = default("kube_api_burst"),
        threads: int = THREADS,
        attempts: int = 4,
        observer: Observer = NULL_OBSERVER,
    ) -> None:
        self.api = api_client
        self.limiter = rest.RateLimiter(qps, burst)
        self.attempts = attempts
        self.observer = observer
        self._pools = {
            pool: ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"kube{pool}")
            for pool, workers in (("", threads), ("-urgent", URGENT_THREADS), ("-replica", REPLICA_THREADS))
        }
        self.answered_at = 0.0  # time.monotonic() of the API server's last answer (for readiness)
        self.unreachable_at = 0.0  # time.monotonic() of the last request that got none (refused, timed out)

    def close(self, *, wait: bool = True) -> None:
        """Shut the thread pools and connections down; without ``wait``, abandon the calls in progress."""
        for pool in self._pools.values():
            pool.shutdown(wait=wait, cancel_futures=not wait)
        if wait:
            self.api.close()  # type: ignore[no-untyped-call]

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retry: bool = True,
        urgent: bool = False,
        agent: str | None = None,
        taken: bool = False,
    ) -> Obj:
        """One API request; the decoded JSON answer (``{}`` when empty). ``urgent``: first through the rate limiter,
        own threads; ``agent``: appended to the User-Agent (``drain/<id>``, for the audit log); ``taken``: the caller
        took the token (:attr:`limiter`) to decide after its wait whether to send: not retried."""
        send = functools.partial(self._call, method, path, query, body, content_type, agent)
        if not retry or taken:  # no retry machinery held by each of the evictions waiting at once
            return await self._attempt(send, method, path, urgent, taken=taken)
        async for attempt in self.retrying():
            with attempt:
                return await self._attempt(send, method, path, urgent)
        raise AssertionError("unreachable")  # pragma: no cover

    def retrying(self) -> AsyncRetrying:
        """The attempts of one request (``attempts``, after no answer, a 429 or a 5xx, waiting as
        :func:`~queue_processor.rest.retry_wait` says), the last error raised."""
        return AsyncRetrying(
            retry=retry_if_exception(rest.retryable),
            wait=rest.retry_wait,
            stop=stop_after_attempt(self.attempts),
            reraise=True,
        )

    async def _attempt(
        self,
        send: Callable[[], tuple[int, bytes, float | None]],
        method: str,
        path: str,
        urgent: bool,
        *,
        taken: bool = False,
    ) -> Obj:
        """One attempt of :meth:`request`: a token (unless ``taken``), a thread to ``send`` it. Raises KubeError."""
        if not taken:
            await self.limiter.acquire(urgent=urgent)
        pool = self._pools[
            "" if not urgent else "-replica" if rest.URGENT_RANK.get() == rest.REPLICA_RANK else "-urgent"
        ]
        sent = asyncio.get_running_loop().run_in_executor(pool, send)
        try:
            status, data, retry_after = await asyncio.shield(sent)
        except asyncio.CancelledError:
            # A cancelled write returns once answered (a thread cannot be stopped): a later drain of the
            # node does not overlap with it. A second cancellation ends that wait.
            if method != "GET" and not sent.done():
                await asyncio.wait({sent})
            raise
        verb, resource = rest.describe(method, path)
        self.observer.kube_request(verb, resource, status or None)
        if status:
            self.answered_at = time.monotonic()
        else:
            self.unreachable_at = time.monotonic()
        if status >= 400 or status == 0:
            raise rest.error_of(status, data, retry_after)
        answer: Obj = json.loads(data) if data else {}
        return answer

    def _call(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        agent: str | None,
    ) -> tuple[int, bytes, float | None]:  # the status (0: no answer), body, Retry-After
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
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
            response = self.api.call_api(*params, _request_timeout=REQUEST_TIMEOUT_S)
            response.read()  # type: ignore[no-untyped-call]
            header = response.getheader("Retry-After")  # type: ignore[no-untyped-call]
            try:  # the API server sends delta-seconds; None when absent or not a number
                retry_after: float | None = float(header or "")
            except ValueError:
                retry_after = None
            return int(response.status), bytes(response.data or b""), retry_after
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return 0, json.dumps({"reason": "ConnectionError", "message": str(exc)}).encode(), None

    async def node_pages(self, limit: int = 500) -> AsyncIterator[tuple[list[Obj], str]]:
        """Every Node, ``limit`` at a time ("Retrieving large results sets in chunks", API concepts): each page's
        items and the list's resourceVersion. Raises :class:`KubeError` (410: continue token expired, list again)."""
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
        *,
        timeout_s: float,
        query: Mapping[str, str] | None = None,
        metadata_only: bool = False,
        keep: rest.Keep | None = None,
    ) -> AsyncGenerator[list[Obj], None]:
        """One watch of ``path`` from ``resource_version`` in a thread until the server ends it (``timeout_s``): ``[]``
        once accepted, then each chunk's ``{"type", "object"}`` events ``keep`` kept (ending with a ``BOOKMARK`` where
        the last line was dropped: where the stream is). Closing it shuts the connection. Raises :class:`KubeError`: 410
        for a resourceVersion too old ("Efficient detection of changes"), an error answer's status, 0 for a failed
        connection or a non-event (``WatchReceiverError``: ``keep`` raised)."""
        await self.limiter.acquire()
        stream = rest.WatchStream(asyncio.get_running_loop())
        params = {
            **(query or {}),
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(int(timeout_s)),
        }
        accept = METADATA_ONLY if metadata_only else "application/json"
        args = (self.api, path, params, accept, timeout_s, stream, keep)
        threading.Thread(target=rest.read_watch, args=args, name="kube-watch", daemon=True).start()
        try:
            while (got := await stream.queue.get())[0] != "end":
                kind, value = got
                if kind == "error":
                    raise value
                if kind == "events":
                    yield value
                    continue
                self._answered(path, value)
                if value == 200:
                    yield []
        finally:
            stream.close()

    def _answered(self, path: str, status: int) -> None:
        if not status:  # no answer
            self.unreachable_at = time.monotonic()
            return
        self.observer.kube_request("watch", rest.describe("GET", path)[1], status)
        if status == 200:
            self.answered_at = time.monotonic()

    def reachable(self) -> bool:
        """Readiness: the API server answered the latest request made (or none was made yet)."""
        return self.unreachable_at <= self.answered_at

    async def _get(self, path: str, *, urgent: bool = False) -> Obj | None:
        """The object at ``path``, or ``None`` (404)."""
        try:
            return await self.request("GET", path, urgent=urgent)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def _items(
        self, path: str, query: Mapping[str, str] | None = None, *, urgent: bool = False, cached: bool = False
    ) -> list[Obj]:
        """The items of the list at ``path``; ``cached`` reads the API server's cache (cheaper, maybe stale)."""
        query = {**(query or {}), **({"resourceVersion": "0"} if cached else {})}
        answer = await self.request("GET", path, query=query, urgent=urgent)
        return list(answer.get("items") or [])

    async def get_node(self, name: str) -> Obj | None:
        """The Node, or ``None`` when it does not exist."""
        return await self._get(f"/api/v1/nodes/{name}", urgent=True)

    async def list_nodes(self, label_selector: str | None = None, *, cached: bool = False) -> list[Obj]:
        """Every Node (matching ``label_selector``); ``cached`` reads the API server's cache."""
        query = {"labelSelector": label_selector} if label_selector else {}
        return await self._items("/api/v1/nodes", query, urgent=True, cached=cached)

    async def patch_node(self, name: str, patch: Any) -> Obj:
        """Strategic-merge-patch a Node; the Node after it."""
        return await self.request(
            "PATCH", f"/api/v1/nodes/{name}", body=patch, content_type=STRATEGIC_PATCH, urgent=True
        )

    async def pods_on_node(self, node: str, *, cached: bool = False) -> list[Obj]:
        """The pods bound to ``node``; ``cached`` reads the API server's cache (cheaper, maybe stale)."""
        return await self._items("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"}, cached=cached)

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
        taken: bool = False,
    ) -> None:
        """POST a policy/v1 Eviction (``grace_s`` seconds; ``drain``, ``taken``: :meth:`request`'s ``agent``,
        ``taken``); not retried. Raises :class:`KubeError`: 429 when a PodDisruptionBudget allows no disruption
        (named in :attr:`KubeError.causes`), 500 when several match the pod, 404 when gone."""
        metadata = {"name": name, "namespace": namespace}
        body: Obj = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": metadata}
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
            taken=taken,
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
        return await self._get(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{name}")

    async def list_pdbs(self, namespace: str) -> list[Obj]:
        """Every policy/v1 PodDisruptionBudget of ``namespace``."""
        return await self._items(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets")

    async def pods_selected(self, namespace: str, label_selector: str) -> list[Obj]:
        """The pods of ``namespace`` matching ``label_selector``."""
        return await self._items(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": label_selector})

    async def get_deployment(self, namespace: str, name: str) -> Obj | None:
        """The apps/v1 Deployment, or ``None`` when it does not exist (or the API server serves none)."""
        return await self._get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")

    async def patch_deployment(self, namespace: str, name: str, patch: Obj) -> Obj:
        """Merge-patch (RFC 7386) a Deployment, not retried: the result; ``metadata.resourceVersion``: 409 if stale."""
        return await self.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
            body=patch,
            content_type=MERGE_PATCH,
            retry=False,
        )

    async def list_hpas(self, namespace: str) -> list[Obj]:
        """Every autoscaling/v2 HorizontalPodAutoscaler of ``namespace``."""
        return await self._items(f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers")

    async def create_event(self, namespace: str, event: Obj) -> None:
        await self.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)

    # Lease calls are urgent: a renewal behind evictions lets the Lease lapse (DESIGN.md rule 10).

    async def get_lease(self, namespace: str, name: str) -> Obj | None:
        """The Lease, or ``None``."""
        return await self._get(f"{LEASES.format(namespace)}/{name}", urgent=True)

    async def create_lease(self, namespace: str, lease: Obj) -> Obj:
        """Create a Lease; :class:`KubeError` 409 when it exists (also after a retried create that had landed)."""
        return await self.request("POST", LEASES.format(namespace), body=lease, urgent=True)

    async def replace_lease(self, namespace: str, lease: Obj) -> Obj:
        """Replace a Lease; :class:`KubeError` 409 when its resourceVersion is stale."""
        name = lease["metadata"]["name"]
        return await self.request(
            "PUT", f"{LEASES.format(namespace)}/{name}", body=lease, retry=False, urgent=True
        )

    async def patch_lease(self, namespace: str, name: str, patch: Obj) -> Obj:
        """Merge-patch (RFC 7386) a Lease; the Lease after it. :class:`KubeError` 404 when it is gone."""
        return await self.request(
            "PATCH", f"{LEASES.format(namespace)}/{name}", body=patch, content_type=MERGE_PATCH, urgent=True
        )

    async def list_leases(self, namespace: str, label_selector: str) -> tuple[list[Obj], str]:
        """The Leases of ``namespace`` that ``label_selector`` selects, and the list's resourceVersion."""
        answer = await self.request(
            "GET", LEASES.format(namespace), query={"labelSelector": label_selector}, urgent=True
        )
        version = str((answer.get("metadata") or {}).get("resourceVersion") or "")
        return list(answer.get("items") or []), version

    async def delete_lease(self, namespace: str, name: str, *, resource_version: str | None = None) -> None:
        """Delete a Lease (if still at ``resource_version`` when given, else 409); one already gone is fine."""
        body = None if resource_version is None else {"preconditions": {"resourceVersion": resource_version}}
        try:
            await self.request("DELETE", f"{LEASES.format(namespace)}/{name}", body=body, urgent=True)
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def delete_leases(self, namespace: str, label_selector: str, *, taken: bool = False) -> list[str]:
        """Delete the Leases ``label_selector`` selects in one request ("Delete Collection", API reference, Lease
        v1); the names deleted. ``taken`` as :meth:`request`. Raises :class:`KubeError`."""
        deleted = await self.request(
            "DELETE",
            LEASES.format(namespace),
            query={"labelSelector": label_selector},
            urgent=True,
            taken=taken,
        )
        return [str(item["metadata"]["name"]) for item in deleted.get("items") or ()]
