"""The Kubernetes emulation's HTTP layer: paths to handlers, verbs, status codes, faults, JSON and patches.

What it holds:

- :class:`ApiRoutes`: the aiohttp application (:meth:`ApiRoutes.application`) that serves ``/version``, the
  discovery documents and every ``/api/...`` and ``/apis/...`` resource path of the Kubernetes API reference
  (get, list with selectors, ``resourceVersion=0`` and limit/continue pagination, create, replace with the
  resourceVersion check, strategic merge / JSON merge / JSON patch, delete, the ``pods/eviction``
  subresource, watches with selectors, bookmarks and metadata-only objects), answering errors with
  ``v1.Status`` bodies and the API server's status codes; every request counted by
  ``"<verb> <resource>[/<subresource>]"``;
- :class:`Fault`: a fault injected at the HTTP layer (an error status or a delay for matching requests);
- :func:`route`, :func:`verb_of`, :func:`validate_event`, :func:`check_types`: the pure pieces of request
  decoding.

Named ``routes`` rather than ``http`` so that it can never be mistaken for the standard library's module. The
handlers take the sandbox's lock around every access to the store.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.kube.controllers import Controllers
from queue_processor_sandbox.kube.store import RESOURCES, Change, Key, ObjectStore, details, qualified
from queue_processor_sandbox.kube_logic import (
    ApiError,
    Obj,
    json_patch,
    merge_patch,
    parse_field_selector,
    parse_label_selector,
    strategic_merge_patch,
)

__all__ = ["ApiRoutes", "Fault", "check_types", "route", "validate_event", "verb_of", "watch_event"]

#: The longest a watch stays open when the client gives no ``timeoutSeconds`` (real seconds; the API server
#: picks a random time between its --min-request-timeout of 1,800 s and twice that).
WATCH_TIMEOUT_S = 1800.0

#: What a client sends in ``Accept`` to be given metadata-only objects (``PartialObjectMetadata``), as
#: client-go's metadata informers do.
METADATA_ONLY = "as=PartialObjectMetadata;"


@dataclass
class Fault:
    """Answer the next ``count`` requests matching ``verb`` and ``resource`` (``None`` = any) with HTTP
    ``status`` (e.g. 429, 500), or, when ``status`` is ``None``, hold each for ``delay_s`` real seconds first
    (a slow or timing-out API server). ``retry_after_s`` sets the Retry-After header of a 429. ``reset``
    answers nothing: the connection is reset (TCP RST) after ``delay_s``, as by a load balancer or an API
    server that dies mid-request."""

    verb: str | None
    resource: str | None
    status: int | None
    count: int
    delay_s: float = 0.0
    retry_after_s: int | None = None
    reset: bool = False


def _reset(request: web.Request) -> None:
    """Reset the request's connection: close it with SO_LINGER 0, so the client reads a TCP RST."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


#: Resources whose collection can be deleted in one request (``deletecollection``): those the controller
#: deletes so (its node Leases, released in batches). Pods are not among them: their graceful deletion is
#: not emulated for a collection.
COLLECTION_DELETES = frozenset({"leases"})


def verb_of(method: str, name: str | None, query: Any) -> str:
    """The Kubernetes verb of an HTTP request: ``get``, ``list``, ``watch`` (a GET of a collection with
    ``watch=true``), ``create``, ``update``, ``patch``, ``delete``, ``deletecollection`` (a DELETE of a
    collection; other methods: their name in lower case)."""
    if method == "GET":
        if name is None:
            return "watch" if query.get("watch") in ("true", "1") else "list"
        return "get"
    if method == "DELETE" and name is None:
        return "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, method.lower()
    )


def route(path: str) -> tuple[str, str, str | None, str | None]:
    """``(plural, namespace, name, subresource)`` of an API path; raises 404 for one not served."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        gv, rest = "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or rest[0] not in RESOURCES or RESOURCES[rest[0]].group_version != gv:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    return plural, namespace, name, sub


def validate_event(event: Obj) -> None:
    """core/v1 Event validation: an Event about a cluster-scoped object (a Node) lives in ``default``."""
    involved = event.get("involvedObject") or {}
    namespace = event["metadata"].get("namespace", "")
    if not involved.get("namespace") and namespace not in ("", "default"):
        raise ApiError(
            422,
            "Invalid",
            f'Event "{event["metadata"].get("name", "")}" is invalid: involvedObject.namespace: Invalid value: "": '
            "does not match event.namespace",
            {
                "kind": "Event",
                "causes": [{"reason": "FieldValueInvalid", "field": "involvedObject.namespace"}],
            },
        )
    if involved.get("namespace") and involved["namespace"] != namespace:
        raise ApiError(
            422,
            "Invalid",
            f'Event "{event["metadata"].get("name", "")}" is invalid: involvedObject.namespace: Invalid value: '
            f'"{involved["namespace"]}": does not match event.namespace',
            {
                "kind": "Event",
                "causes": [{"reason": "FieldValueInvalid", "field": "involvedObject.namespace"}],
            },
        )


def check_types(plural: str, obj: Any) -> None:
    """Decoding as the API server does for the typed fields the controller writes: a Lease's
    ``leaseDurationSeconds`` and ``leaseTransitions`` are int32 (a float is a 400, as Go's JSON decoder says)."""
    if plural != "leases" or not isinstance(obj, dict):
        return
    for name in ("leaseDurationSeconds", "leaseTransitions"):
        value = (obj.get("spec") or {}).get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ApiError(
                400,
                "BadRequest",
                f'Lease in version "v1" cannot be handled as a Lease: json: cannot unmarshal '
                f"{type(value).__name__} {value} into Go struct field LeaseSpec.spec.{name} of type int32",
            )


class ApiRoutes:
    """The HTTP handlers over ``store`` and ``controllers``, taking ``lock`` around every access to them.

    ``requests`` counts the requests served; ``faults`` are consumed by matching requests; ``clock`` and
    ``cache_lag_s`` (simulated seconds) set how stale a ``resourceVersion=0`` list may be; ``port`` is the
    server's port, given in the discovery documents (set once the server listens).
    """

    def __init__(
        self,
        store: ObjectStore,
        controllers: Controllers,
        *,
        lock: threading.RLock,
        clock: SandboxClock,
        cache_lag_s: float,
        requests: Counter[str],
    ) -> None:
        self.store = store
        self.controllers = controllers
        self.lock = lock
        self.clock = clock
        self.cache_lag_s = cache_lag_s
        self.requests = requests
        self.forbidden: Counter[str] = Counter()  # requests answered 403, by "<verb> <resource>"
        self.too_many: Counter[str] = Counter()  # requests answered 429, by "<verb> <resource>"
        self.budget_refused_at: dict[tuple[str, str], float] = {}
        """(namespace, name) of each pod whose eviction a PodDisruptionBudget refused → when, last (monotonic)."""
        self.faults: list[Fault] = []
        self.port = 0
        self.watches = 0
        """Watches being served now."""
        self.watches_begun = 0
        """Watches whose start was judged (from now, a resourceVersion too old, or dropped): tests wait on it."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._written: asyncio.Future[None] | None = None  # resolved at the next write (see _wake)
        self._waking = False
        self._closing = False
        self._cut = 0  # end_watches() calls: a watch begun before the last one ends
        store.on_write = self._wake

    def application(self) -> web.Application:
        """The aiohttp application: ``/version``, the discovery documents, and every resource path."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/version", self._version)
        app.router.add_get("/api", self._discovery)
        app.router.add_get("/apis", self._discovery)
        app.router.add_get("/api/v1", self._discovery)
        app.router.add_get("/apis/{group}/{version}", self._discovery)
        app.router.add_route("*", "/api/{tail:.*}", self._handle)
        app.router.add_route("*", "/apis/{tail:.*}", self._handle)
        return app

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"major": "1", "minor": "31", "gitVersion": "v1.31.0-queue-processor-sandbox"}
        )

    async def _discovery(self, request: web.Request) -> web.Response:
        """Discovery documents (``/api``, ``/apis``, ``/api/v1``, ``/apis/<group>/<version>``), so that kubectl
        and other discovery-based clients can talk to the emulation."""
        path = request.path.rstrip("/")
        groups: dict[str, list[str]] = {}
        for info in RESOURCES.values():
            if "/" in info.group_version:
                group, version = info.group_version.split("/")
                if version not in groups.setdefault(group, []):
                    groups[group].append(version)
        if path == "/api":
            body: Obj = {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
                ],
            }
            return web.json_response(body)
        if path == "/apis":
            body = {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": group,
                        "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                        "preferredVersion": {
                            "groupVersion": f"{group}/{versions[0]}",
                            "version": versions[0],
                        },
                    }
                    for group, versions in sorted(groups.items())
                ],
            }
            return web.json_response(body)
        group_version = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
        resources = []
        for plural, info in RESOURCES.items():
            if info.group_version != group_version:
                continue
            verbs = ["create", "delete", "get", "list", "patch", "update"]
            if plural in COLLECTION_DELETES:
                verbs.insert(2, "deletecollection")
            resources.append(
                {
                    "name": plural,
                    "singularName": info.kind.lower(),
                    "namespaced": info.namespaced,
                    "kind": info.kind,
                    "verbs": verbs,
                }
            )
            if plural in ("nodes", "pods"):
                resources.append(
                    {
                        "name": f"{plural}/status",
                        "singularName": "",
                        "namespaced": info.namespaced,
                        "kind": info.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if plural == "pods":
                resources.append(
                    {
                        "name": "pods/eviction",
                        "singularName": "",
                        "namespaced": True,
                        "group": "policy",
                        "version": "v1",
                        "kind": "Eviction",
                        "verbs": ["create"],
                    }
                )
        if not resources:
            error = ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            return web.json_response(error.status(), status=404)
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": resources,
            }
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            found = route(request.path)
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)
        plural, namespace, name, sub = found
        verb = verb_of(request.method, name, request.query)
        resource = plural + (f"/{sub}" if sub else "")
        with self.lock:
            self.requests[f"{verb} {resource}"] += 1
            fault = self.take_fault(verb, resource)
        if fault is not None:
            if fault.reset:
                await asyncio.sleep(fault.delay_s)
                _reset(request)
                return web.Response(status=500)  # never sent: the connection is gone
            if fault.status is None:
                await asyncio.sleep(fault.delay_s)
            else:
                reasons = {403: "Forbidden", 429: "TooManyRequests"}
                error = ApiError(fault.status, reasons.get(fault.status, "InternalError"), "injected fault")
                if fault.status in (403, 429):
                    with self.lock:
                        (self.forbidden if fault.status == 403 else self.too_many)[f"{verb} {resource}"] += 1
                headers = (
                    {"Retry-After": str(fault.retry_after_s)} if fault.retry_after_s is not None else None
                )
                return web.json_response(error.status(), status=fault.status, headers=headers)
        if verb == "watch":
            return await self._watch(request, plural, namespace)
        try:
            try:
                body = await request.json() if request.can_read_body else None
            except ConnectionResetError:  # the client went away (killed, or its request cancelled) mid-body
                return web.Response(status=499)  # never sent: nothing is done, as an API server does
            with self.lock:
                status, payload = self._dispatch(verb, plural, namespace, name, sub, request, body)
        except ApiError as exc:
            if exc.code == 429:  # a PodDisruptionBudget's refusal of an eviction
                with self.lock:
                    self.too_many[f"{verb} {resource}"] += 1
                    if sub == "eviction" and name:
                        self.budget_refused_at[(namespace, name)] = time.monotonic()
            return web.json_response(exc.status(), status=exc.code)
        except json.JSONDecodeError as exc:
            error = ApiError(400, "BadRequest", f"invalid JSON body: {exc}")
            return web.json_response(error.status(), status=400)
        return web.Response(status=status, body=json.dumps(payload), content_type="application/json")

    def take_fault(self, verb: str, resource: str) -> Fault | None:
        """The first :class:`Fault` with requests left that matches (lock held), its ``count`` decremented; a
        fault on a resource matches its subresources too."""
        for fault in self.faults:
            if (
                fault.count > 0
                and fault.verb in (None, verb)
                and fault.resource in (None, resource, resource.split("/")[0])
            ):
                fault.count -= 1
                return fault
        return None

    def _dispatch(
        self,
        verb: str,
        plural: str,
        namespace: str,
        name: str | None,
        sub: str | None,
        request: web.Request,
        body: Any,
    ) -> tuple[int, Obj]:
        objects = self.store.objects
        info = RESOURCES[plural]
        if info.namespaced and name is not None and not namespace:
            raise ApiError(404, "NotFound", f"{plural} must be addressed in a namespace")
        key: Key = (namespace if info.namespaced else "", name or "")
        if verb in ("create", "update"):
            check_types(plural, body)
        if verb == "list":
            return 200, self._list(plural, namespace, request.query)
        if verb == "deletecollection":
            if plural not in COLLECTION_DELETES:
                raise ApiError(405, "MethodNotAllowed", f"deletecollection is not served for {plural}")
            return 200, self._delete_collection(plural, namespace, request.query)
        if verb == "create" and name is None:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the body must be an object")
            obj = copy.deepcopy(body)
            obj.setdefault("apiVersion", info.group_version)
            obj.setdefault("kind", info.kind)
            metadata = obj.setdefault("metadata", {})
            if not metadata.get("name") and not metadata.get("generateName"):
                raise ApiError(
                    422,
                    "Invalid",
                    f'{info.kind} "" is invalid: metadata.name: Required value: name or generateName is required',
                    {
                        "kind": info.kind,
                        "causes": [{"reason": "FieldValueRequired", "field": "metadata.name"}],
                    },
                )
            if info.namespaced:
                metadata["namespace"] = namespace or metadata.get("namespace") or "default"
                if ("", metadata["namespace"]) not in objects["namespaces"]:
                    raise ApiError(
                        404,
                        "NotFound",
                        f'namespaces "{metadata["namespace"]}" not found',
                        {"name": metadata["namespace"], "kind": "namespaces"},
                    )
            if plural == "events":
                validate_event(obj)
            return 201, self._present(plural, self.store.insert(plural, obj))
        if verb == "create" and plural == "pods" and sub == "eviction":
            dry_run = request.query.get("dryRun") == "All"
            agent = request.headers.get("User-Agent", "")
            return 201, self.controllers.evict(key, body or {}, dry_run=dry_run, agent=agent)
        current = objects[plural].get(key)
        if current is None:
            raise ApiError(
                404,
                "NotFound",
                f'{qualified(plural)} "{name}" not found',
                {"name": name, **details(plural)},
            )
        if verb == "get":
            return 200, self._present(plural, current)
        if verb == "delete":
            return 200, self._delete(plural, key, request.query, body)
        if verb == "update":
            return 200, self._update(plural, key, current, body, sub)
        if verb == "patch":
            return 200, self._patch(plural, key, current, body, request.content_type, sub)
        raise ApiError(405, "MethodNotAllowed", f"{verb} is not served for {plural}")

    def _present(self, plural: str, obj: Obj) -> Obj:
        if plural == "poddisruptionbudgets":
            obj = {**obj, "status": self.controllers.pdb_status(obj)}
        return obj

    def close(self) -> None:
        """End every watch being served (in the server's loop, before it stops): each writes its end."""
        self._closing = True
        self._woken()

    def end_watches(self) -> None:
        """Drop every watch being served, without a last bookmark, as an API server that restarts does (any
        thread): each client watches again from the last resourceVersion it saw."""
        self._cut += 1
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._woken)

    def _wake(self) -> None:
        """After a write (lock held, any thread): wake the watches, once per turn of the server's loop."""
        if self.watches and not self._waking and self._loop is not None:
            self._waking = True
            self._loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        self._waking = False
        written, self._written = self._written, None
        if written is not None and not written.done():
            written.set_result(None)

    async def _watch(self, request: web.Request, plural: str, namespace: str) -> web.StreamResponse:
        """``GET <collection>?watch=1``: the changes of the selected objects as a stream of JSON lines
        (``{"type": "ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR", "object": …}``), as the API server
        serves a watch ("Efficient detection of changes", API concepts).

        - ``resourceVersion`` unset or ``"0"``: an ``ADDED`` for every object selected now, then the changes;
          ``N``: every change after ``N``, or one ``ERROR`` with a 410 ``Expired`` Status when ``N`` is older
          than the changes kept (:data:`~queue_processor_sandbox.kube.store.HISTORY`).
        - ``labelSelector`` / ``fieldSelector``: an object that enters the selection is ``ADDED``, one that
          leaves it ``DELETED`` (its new version), as the API server's filtered watch does.
        - A ``DELETED`` object is its last version with ``metadata.resourceVersion`` set to the deletion's.
        - ``timeoutSeconds`` (real seconds) ends the stream; with ``allowWatchBookmarks`` a ``BOOKMARK``
          carrying the latest resourceVersion comes just before that end.
        - ``Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1``: each object is a
          ``PartialObjectMetadata`` (its ``metadata`` only).
        """
        query = request.query
        try:
            keep = self._selection(plural, namespace, query)
            timeout_s = float(query.get("timeoutSeconds") or WATCH_TIMEOUT_S)
            since = query.get("resourceVersion") or ""
            if since not in ("", "0") and not since.isdigit():
                raise ApiError(400, "BadRequest", f'invalid resource version "{since}"')
        except (ApiError, ValueError) as exc:
            error = exc if isinstance(exc, ApiError) else ApiError(400, "BadRequest", str(exc))
            return web.json_response(error.status(), status=error.code)
        metadata_only = METADATA_ONLY in request.headers.get("Accept", "")
        loop = asyncio.get_running_loop()
        self._loop = loop
        info = RESOURCES[plural]

        def line(kind: str, obj: Obj, rv: int | None = None) -> bytes:
            shown = self._present(plural, obj)
            if rv is not None:  # a deletion: the last version, at the deletion's resourceVersion
                shown = {**shown, "metadata": {**shown["metadata"], "resourceVersion": str(rv)}}
            return watch_event(kind, shown, metadata_only) + b"\n"

        def expired_line(since: int) -> bytes:
            """An ERROR event with a 410 Expired Status (lock held)."""
            expired = ApiError(
                410, "Expired", f"too old resource version: {since} ({self.store.history_from(plural)})"
            )
            return json.dumps({"type": "ERROR", "object": expired.status()}).encode() + b"\n"

        def lines_of(change: Change) -> bytes:
            was = change.old is not None and keep(change.old)
            now = change.new is not None and keep(change.new)
            if change.new is None:
                return line("DELETED", change.old, change.rv) if was and change.old is not None else b""
            if now:
                return line("MODIFIED" if was else "ADDED", change.new)
            return line("DELETED", change.new) if was else b""  # it left the selection

        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        ends_at = loop.time() + timeout_s
        born = self._cut
        self.watches += 1
        try:
            with self.lock:
                if self._cut != born:  # dropped before it began (end_watches): ends without a word
                    out, position = b"", -1
                elif since in ("", "0"):
                    out = b"".join(line("ADDED", o) for o in self.store.objects[plural].values() if keep(o))
                    position = self.store.rv
                elif int(since) < self.store.history_from(plural):
                    out, position = expired_line(int(since)), -1
                else:
                    out, position = b"", int(since)
                self.watches_begun += 1
            while True:
                if out:
                    await response.write(out)
                if position < 0:
                    break
                remaining = ends_at - loop.time()
                if self._cut != born:
                    break  # dropped (end_watches): no bookmark
                if remaining <= 0 or self._closing:
                    if query.get("allowWatchBookmarks") in ("true", "1"):
                        mark = {
                            "kind": info.kind,
                            "apiVersion": info.group_version,
                            "metadata": {"resourceVersion": str(position)},
                        }
                        await response.write(
                            json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n"
                        )
                    break
                written = self._written = self._written or loop.create_future()
                with self.lock:
                    if self._cut != born:  # dropped while it waited for the lock: no bookmark, no 410
                        out, position = b"", -1
                        continue
                    if position < self.store.history_from(plural):  # trimmed past what this watch had sent
                        out, position = expired_line(position), -1
                        continue
                    changes = self.store.changes_after(plural, position)
                    position = self.store.rv
                    out = b"".join(lines_of(change) for change in changes)
                if not out:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(written), remaining)
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away, or the server stops
        finally:
            self.watches -= 1
        return response

    @staticmethod
    def _selection(plural: str, namespace: str, query: Any) -> Callable[[Obj], bool]:
        """Whether an object is in a request's namespace, ``labelSelector`` and ``fieldSelector`` (raises
        :class:`ApiError` 400 for a bad selector)."""
        keep_labels = parse_label_selector(query["labelSelector"]) if query.get("labelSelector") else None
        keep_fields = (
            parse_field_selector(plural, query["fieldSelector"])[0] if query.get("fieldSelector") else None
        )

        def keep(obj: Obj) -> bool:
            if namespace and obj["metadata"].get("namespace") != namespace:
                return False
            if keep_labels is not None and not keep_labels(obj["metadata"].get("labels") or {}):
                return False
            return keep_fields is None or bool(keep_fields(obj))

        return keep

    def _list(self, plural: str, namespace: str, query: Any) -> Obj:
        store = self.store
        stale = query.get("resourceVersion") == "0"
        objects, by_node = store.objects[plural], store.pods_by_node
        if stale:
            store.refresh_cache(self.clock.monotonic(), self.clock.real(self.cache_lag_s))
            objects = store.snapshot.get(plural, {})
        keep_labels = parse_label_selector(query["labelSelector"]) if query.get("labelSelector") else None
        keep_fields, equals = (
            parse_field_selector(plural, query["fieldSelector"]) if query.get("fieldSelector") else (None, {})
        )
        if plural == "pods" and "spec.nodeName" in equals and equals["spec.nodeName"]:
            index = store.snapshot_by_node if stale else by_node
            candidates: Iterator[Obj] = (
                objects[k] for k in index.get(equals["spec.nodeName"], ()) if k in objects
            )
        else:
            candidates = iter(objects.values())
        items = []
        for obj in candidates:
            if namespace and obj["metadata"].get("namespace") != namespace:
                continue
            if keep_labels is not None and not keep_labels(obj["metadata"].get("labels") or {}):
                continue
            if keep_fields is not None and not keep_fields(obj):
                continue
            items.append(obj)
        # etcd's key order (namespace, then name), and limit/continue pagination as the API server does it
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        metadata: Obj = {"resourceVersion": str(store.rv)}
        token = query.get("continue")
        if token:
            try:
                after = json.loads(base64.urlsafe_b64decode(token.encode()))
                start = (str(after["namespace"]), str(after["name"]))
            except (ValueError, KeyError, TypeError):
                raise ApiError(
                    400, "BadRequest", "invalid continue token: continue key is not valid"
                ) from None
            items = [
                o for o in items if (o["metadata"].get("namespace") or "", o["metadata"]["name"]) > start
            ]
        limit = int(query.get("limit") or 0)
        if 0 < limit < len(items):
            last = items[limit - 1]["metadata"]
            after = {"namespace": last.get("namespace") or "", "name": last["name"]}
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps(after).encode()).decode()
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        info = RESOURCES[plural]
        return {
            "apiVersion": info.group_version,
            "kind": f"{info.kind}List",
            "metadata": metadata,
            "items": [self._present(plural, obj) for obj in items],
        }

    def _check_version(self, plural: str, current: Obj, body: Obj) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {qualified(plural)} "
                f'"{current["metadata"]["name"]}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": current["metadata"]["name"], **details(plural)},
            )

    def _update(self, plural: str, key: Key, current: Obj, body: Any, sub: str | None) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be an object")
        self._check_version(plural, current, body)
        new = copy.deepcopy(current)
        if sub == "status":
            new["status"] = copy.deepcopy(body.get("status") or {})
        else:
            kept = {
                k: current["metadata"][k]
                for k in ("uid", "creationTimestamp", "namespace", "name", "generation")
                if k in current["metadata"]
            }
            new = {**copy.deepcopy(body), "apiVersion": current["apiVersion"], "kind": current["kind"]}
            new["metadata"] = {**(body.get("metadata") or {}), **kept}
            if plural in ("nodes", "pods"):
                new["status"] = copy.deepcopy(current.get("status"))
        return self._present(plural, self.store.replace(plural, key, new))

    def _patch(
        self, plural: str, key: Key, current: Obj, body: Any, content_type: str, sub: str | None
    ) -> Obj:
        if content_type == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch is a list of operations")
            new = json_patch(current, body)
        elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch is an object")
            self._check_version(plural, current, body)
            patcher = merge_patch if content_type == "application/merge-patch+json" else strategic_merge_patch
            new = patcher(copy.deepcopy(current), body)
        else:
            raise ApiError(
                415, "UnsupportedMediaType", f"the patch content type {content_type!r} is not supported"
            )
        for immutable in ("uid", "name", "namespace", "creationTimestamp"):
            if immutable in current["metadata"]:
                new.setdefault("metadata", {})[immutable] = current["metadata"][immutable]
        return self._present(plural, self.store.replace(plural, key, new))

    def _delete_collection(self, plural: str, namespace: str, query: Any) -> Obj:
        """``DELETE <collection>``: remove every object of the request's namespace and selectors (lock held)
        and answer with them as a list (as the API server's generic registry does), each removal a write of
        its own that watches see as ``DELETED``."""
        keep = self._selection(plural, namespace, query)
        objects = self.store.objects[plural]
        removed = [self.store.remove(plural, key) for key, obj in list(objects.items()) if keep(obj)]
        info = RESOURCES[plural]
        return {
            "apiVersion": info.group_version,
            "kind": f"{info.kind}List",
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": [obj for obj in removed if obj is not None],
        }

    def _delete(self, plural: str, key: Key, query: Any, body: Any) -> Obj:
        preconditions = (body.get("preconditions") or {}) if isinstance(body, dict) else {}
        wanted = preconditions.get("uid")
        current = self.store.objects[plural][key]
        if wanted and wanted != current["metadata"].get("uid"):
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {qualified(plural)} "{key[1]}": Precondition failed: UID in '
                f"precondition: {wanted}, UID in object meta: {current['metadata'].get('uid')}",
                {"name": key[1], **details(plural)},
            )
        version = preconditions.get("resourceVersion")
        if version and str(version) != str(current["metadata"].get("resourceVersion")):
            # The storage layer's wording: the resource named by kind, and kind in the details.
            info = RESOURCES[plural]
            group = info.group_version.rpartition("/")[0]
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {info.kind}{"." + group if group else ""} "{key[1]}": the '
                f"ResourceVersion in the precondition ({version}) does not match the ResourceVersion in record "
                f"({current['metadata'].get('resourceVersion')}). The object might have been modified",
                {"name": key[1], **({"group": group} if group else {}), "kind": info.kind},
            )
        if plural == "pods":
            grace: int | None = None
            if query.get("gracePeriodSeconds") is not None:
                grace = int(query["gracePeriodSeconds"])
            elif isinstance(body, dict) and body.get("gracePeriodSeconds") is not None:
                grace = int(body["gracePeriodSeconds"])
            return self.controllers.start_terminating(key, grace)
        return self.store.remove(plural, key) or {}


def watch_event(kind: str, obj: Obj, metadata_only: bool = False) -> bytes:
    """One watch event as the API server writes it: ``{"type": kind, "object": obj}`` in JSON; with
    ``metadata_only``, the object as a ``meta.k8s.io/v1`` ``PartialObjectMetadata``."""
    if metadata_only:
        obj = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
    return json.dumps({"type": kind, "object": obj}).encode()
