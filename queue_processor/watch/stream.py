"""A watch's connection, read in a thread of its own (the ``kubernetes`` client is synchronous): chunks of lines
become ``{type, object}`` events handed to the loop ("Efficient detection of changes", API concepts); and the reading
of the API server's answers (status, Retry-After, Status body) the client shares."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import urllib3

from queue_processor.outcomes import KubeError

Obj = dict[str, Any]

#: What a watch keeps of each event, run in its thread (:meth:`KubeClient.watch`); ``None`` drops it.
Keep = Callable[[Obj], Obj | None]


class KeepError(Exception):
    """A watch's ``keep`` raised (in the watch thread)."""


class WatchStream:
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


def read_watch(
    api: Any,
    path: str,
    query: Mapping[str, str],
    accept: str,
    timeout_s: float,
    stream: WatchStream,
    keep: Keep | None,
    answered: Callable[[int], None],
    unanswered: Callable[[], None],
) -> None:
    """The watch thread: connect with ``api`` (an ApiClient), read chunks of lines, hand their events to the loop,
    end ``stream``. ``answered(status)`` and ``unanswered()`` run in the loop."""
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
        status = int(response.status)
        stream.call(answered, status)
        if status != 200:
            raise error_of(status, bytes(response.data or b""))
        if stream.opened is not None:
            stream.call(stream.opened)
        rest = b""
        for chunk in response.stream(1 << 16):
            if stream.closed:
                return
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            events, rv = _events_of(lines, rv, keep)
            if events:
                stream.call(stream.deliver, events)
        stream.end(rv)
    except KubeError as exc:
        stream.fail(exc)
    except KeepError as exc:
        stream.fail(KubeError(0, "WatchReceiverError", str(exc)))
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        if not stream.closed:
            stream.call(unanswered)
        stream.fail(KubeError(0, "ConnectionError", f"watch {path}: {exc}"))
    finally:
        if stream.response is not None:
            stream.response.close()


def _events_of(lines: list[bytes], rv: str, keep: Keep | None) -> tuple[list[Obj], str]:
    """The events of one chunk's whole ``lines`` that ``keep`` keeps, and the resourceVersion reached. Raises
    :class:`KubeError` for an ``ERROR`` event, ``ValueError`` for a line that is not an event, :class:`KeepError`."""
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
            raise KeepError(f"{type(exc).__name__}: {exc}") from exc
        passed = kept is None
        if kept is not None:
            events.append(kept)
    if passed:  # where the stream is, for a receiver that resumes a broken one
        events.append({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}})
    return events, rv


def describe(method: str, path: str, query: Mapping[str, str] | None) -> tuple[str, str]:
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


def seconds_of(value: str | None) -> float | None:
    """A Retry-After in seconds (the API server sends delta-seconds); ``None`` when absent or not a number."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


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
