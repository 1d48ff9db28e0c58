"""moto patched for the sandbox, and moto's threaded server behind the sandbox's lock.

- :func:`install` adds to moto's ``AutoScalingResponse`` (moto dispatches a Query action to the snake_case
  method of that name) what moto 5.2.5 lacks, for the running sandbox: ``RecordLifecycleActionHeartbeat`` and
  ``CompleteLifecycleAction`` (served by the sandbox's lifecycle actions), ``PutLifecycleHook`` (moto's, then
  what it drops: notification target, metadata, role, global timeout) and ``DescribeLifecycleHooks`` (the
  timeouts in the sandbox's real seconds). Scale-in requests honour terminate lifecycle hooks as AWS does
  ("Amazon EC2 Auto Scaling lifecycle hooks"): ``TerminateInstanceInAutoScalingGroup``, and
  ``SetDesiredCapacity`` and ``UpdateAutoScalingGroup`` when they lower the capacity, put each instance
  they remove of a group with a terminate hook in ``Terminating:Wait`` and open its lifecycle actions, as
  :meth:`AwsSandbox.terminate_instance` does (moto would terminate it at once); groups without such a hook
  keep moto's behaviour. It also makes moto's private IPs unique within the sandbox and its SQS retention
  check, queue counts, receipt-handle lookups (an index), SendMessage (no message counts computed), EC2 tag
  reads and DescribeInstances answers cheap (each instance's serialized form and XML kept while nothing it is
  made from changes: moto's answer byte for byte); :func:`uninstall` puts moto back. One sandbox runs per process at
  a time: moto's backends are process-wide.
- :class:`ServedActions`: what the patches ask of the sandbox they are installed for (it hands an object of
  that shape to :func:`install`; this module does not know ``AwsSandbox``).
- :class:`Faults`: the AWS errors :meth:`AwsSandbox.inject_error` sets up, raised by the added actions.
- :class:`MotoServer`: moto's ``ThreadedMotoServer`` on 127.0.0.1 and a free port. Auto Scaling, EC2 and
  EventBridge requests run under the sandbox's lock (moto's backends are not thread-safe, and the sandbox
  changes them from its own threads); SQS requests run unlocked so long polls block nobody. Its connection
  threads can be closed and joined on stop.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import io
import json
import math
import re
import socket
import threading
import time
import urllib.parse
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

import xmltodict  # type: ignore[import-untyped]
from moto.autoscaling.exceptions import AutoscalingClientError
from moto.autoscaling.models import FakeAutoScalingGroup
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult, EmptyResult
from moto.core.serialize import EC2Serializer
from moto.core.utils import unix_time_millis
from moto.ec2.models import elastic_network_interfaces as eni_models
from moto.ec2.models import instances as instance_models
from moto.ec2.models.core import TaggedEC2Resource
from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from moto.server import ThreadedMotoServer
from moto.sqs.exceptions import InvalidParameterValue, ReceiptHandleIsInvalid
from moto.sqs.models import Message, Queue, SQSBackend
from werkzeug.serving import ThreadedWSGIServer

from queue_processor_sandbox.aws.model import LifecycleRequest, Operation

__all__ = ["Faults", "MotoServer", "ServedActions", "active", "install", "uninstall"]


class ServedActions(Protocol):
    """What the patched moto actions ask of the sandbox they are installed for (:func:`install`); the
    sandbox hands an object of this shape, so neither module reaches into the other's privates. Each method
    runs on a server thread while a request is served and may raise moto's errors (``ValidationError``,
    ``AutoscalingClientError``: HTTP 400 in the AWS Query error shape)."""

    def raise_injected(self, operation: str) -> None:
        """Raise the error set up for ``operation`` (an Auto Scaling action name), if any."""

    def real_seconds(self, simulated_s: float) -> float:
        """The real seconds ``simulated_s`` simulated seconds take on the sandbox's clock."""

    def configure_hook(
        self,
        asg_name: str,
        hook_name: str,
        *,
        notification_target_arn: str | None,
        notification_metadata: str | None,
        role_arn: str | None,
    ) -> None:
        """Keep what moto's ``PutLifecycleHook`` drops; send the hook's test notification."""

    def lifecycle_call(self, request: LifecycleRequest) -> None:
        """Serve ``RecordLifecycleActionHeartbeat`` or ``CompleteLifecycleAction``."""

    def terminate_in_group(self, instance_id: str, should_decrement: bool) -> Any | None:
        """``TerminateInstanceInAutoScalingGroup`` through a terminate hook: moto's activity, or ``None``
        when moto's own behaviour applies."""

    def scale_in_to(self, group: Any, desired: int) -> bool:
        """Lower ``group``'s capacity to ``desired`` through its terminate hook; ``False`` when moto's own
        ``set_desired_capacity`` applies."""


#: Services whose requests the server serialises with the sandbox's own changes (SQS stays concurrent).
_SERIALIZED_SERVICES = frozenset({"autoscaling", "ec2", "events"})
_CREDENTIAL_SCOPE = re.compile(r"Credential=[^/,]+/\d{8}/[^/,]+/([^/,]+)/aws4_request")


# ---------------------------------------------------------------------------------------------- injected errors


@dataclass
class _Fault:
    """An error :meth:`AwsSandbox.inject_error` set up: until ``until`` (monotonic) or for ``times`` calls."""

    operation: str
    code: str
    message: str
    until: float | None
    times: int | None
    status: int = 400


class Faults:
    """The errors :meth:`AwsSandbox.inject_error` set up, kept under the sandbox's ``lock``: each answers one
    operation until a ``time.monotonic()`` reading or for a number of calls, or until :meth:`clear`."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._faults: list[_Fault] = []

    def add(
        self,
        operation: str,
        code: str,
        message: str,
        *,
        seconds: float | None,
        times: int | None,
        status: int = 400,
    ) -> None:
        """Answer ``operation`` with ``code``/``message`` (HTTP ``status``) for the next ``seconds`` real
        seconds, or the next ``times`` calls, or (neither given) until :meth:`clear`."""
        until = time.monotonic() + seconds if seconds is not None else None
        with self._lock:
            self._faults.append(_Fault(operation, code, message, until, times, status))

    def clear(self) -> None:
        """Forget every error set up."""
        with self._lock:
            self._faults.clear()

    def raise_injected(self, operation: str) -> None:
        """Raise moto's ``AutoscalingClientError`` (HTTP 400, code and message as set up) when an error
        applies to ``operation``, counting the call; forget the errors that have run out."""
        with self._lock:
            now = time.monotonic()
            self._faults = [
                f
                for f in self._faults
                if (f.until is None or f.until > now) and (f.times is None or f.times > 0)
            ]
            for fault in self._faults:
                if fault.operation == operation and fault.status < 500:
                    if fault.times is not None:
                        fault.times -= 1
                    raise AutoscalingClientError(fault.code, fault.message)

    def pending(self) -> dict[str, int]:
        """Calls still to be answered with an error, by operation (errors set up for a number of calls)."""
        with self._lock:
            left: dict[str, int] = {}
            for fault in self._faults:
                if fault.times:
                    left[fault.operation] = left.get(fault.operation, 0) + fault.times
            return left

    def server_error(self, operation: str) -> _Fault | None:
        """The 5xx fault that answers this call of ``operation``, if any (counting the call): the endpoint
        answers it before moto serves the call."""
        with self._lock:
            now = time.monotonic()
            for fault in self._faults:
                live = (fault.until is None or fault.until > now) and (fault.times is None or fault.times > 0)
                if live and fault.operation == operation and fault.status >= 500:
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
            return None


# ------------------------------------------------------------------------------------------------ the server


class _QuietHandler(MotoRequestHandler):
    """moto's request handler without one access-log line per request."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


def _action(environ: WSGIEnvironment) -> str:
    """The ``Action`` of a Query-protocol request (Auto Scaling, EC2: in the form body, or the query string);
    the body is read and put back for the application."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)
    form = urllib.parse.parse_qs(body.decode(errors="replace"))
    query = urllib.parse.parse_qs(str(environ.get("QUERY_STRING") or ""))
    return (form.get("Action") or query.get("Action") or [""])[0]


class _SerializedApp:
    """WSGI middleware: Auto Scaling, EC2 and EventBridge requests run under the sandbox lock (moto's
    backends are not thread-safe, and the sandbox changes them from its own threads)."""

    def __init__(self, app: WSGIApplication, lock: threading.RLock, faults: Faults | None = None) -> None:
        self._app = app
        self._lock = lock
        self._faults = faults

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        scope = _CREDENTIAL_SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
        if scope is not None and scope.group(1) == "sqs" and self._faults is not None:
            answered = self._sqs_error(environ, start_response)
            if answered is not None:
                return answered
        if scope is None or scope.group(1) not in _SERIALIZED_SERVICES:
            return self._app(environ, start_response)
        if self._faults is not None and scope.group(1) == "autoscaling":
            answered = self._server_error(environ, start_response)
            if answered is not None:
                return answered
        changes = scope.group(1) == "ec2" and not _action(environ).startswith("Describe")
        with self._lock:
            try:
                return list(self._app(environ, start_response))
            finally:
                if changes:  # it may change an instance where the fingerprint does not look: forms made again
                    forget_instances()

    def _server_error(self, environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes] | None:
        """Answer an Auto Scaling call (Query protocol: ``Action=`` in the form body) with the 5xx set up for
        its operation, as the service does when it fails internally; ``None`` to let moto serve it (the body
        put back for it)."""
        assert self._faults is not None
        action = _action(environ)
        fault = self._faults.server_error(action)
        if fault is None:
            return None
        xml = (
            '<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/"><Error><Type>Receiver'
            f"</Type><Code>{fault.code}</Code><Message>{fault.message}</Message></Error>"
            f"<RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>"
        ).encode()
        reason = {500: "Internal Server Error", 503: "Service Unavailable"}.get(fault.status, "Error")
        start_response(
            f"{fault.status} {reason}", [("Content-Type", "text/xml"), ("Content-Length", str(len(xml)))]
        )
        return [xml]

    def _sqs_error(self, environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes] | None:
        """Answer an SQS call (JSON protocol: ``X-Amz-Target: AmazonSQS.<operation>``; the Query protocol's
        ``Action=`` too) with the 5xx set up for its operation (a settlement SQS fails: ``InternalError``);
        ``None`` to let moto serve it."""
        assert self._faults is not None
        target = str(environ.get("HTTP_X_AMZ_TARGET") or "")
        operation = target.rpartition(".")[2] if target else _action(environ)
        fault = self._faults.server_error(operation)
        if fault is None:
            return None
        body = json.dumps({"__type": f"com.amazonaws.sqs#{fault.code}", "message": fault.message}).encode()
        start_response(
            f"{fault.status} Internal Server Error",
            [
                ("Content-Type", "application/x-amz-json-1.0"),
                ("x-amzn-query-error", f"{fault.code};Receiver"),
                ("Content-Length", str(len(body))),
            ],
        )
        return [body]


class _WsgiServer(ThreadedWSGIServer):
    """werkzeug's threaded server that remembers its connection threads, so they can be closed and joined
    (HTTP/1.1 keep-alive would otherwise keep them for as long as a client pools the connection)."""

    def __init__(self, host: str, port: int, app: WSGIApplication) -> None:
        super().__init__(host, port, app, handler=_QuietHandler)
        self._connections: dict[threading.Thread, socket.socket] = {}
        self._connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name="aws-sandbox-request",
            daemon=True,
        )
        with self._connections_lock:
            self._connections[thread] = request
        thread.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._connections.pop(threading.current_thread(), None)

    def close_connections(self, timeout_s: float) -> None:
        """Shut every open connection down and join its thread (a request still running gets
        ``timeout_s`` seconds to finish)."""
        with self._connections_lock:
            connections = list(self._connections.items())
        for _, sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout_s
        for thread, _ in connections:
            thread.join(max(0.0, deadline - time.monotonic()))


class MotoServer(ThreadedMotoServer):
    """``ThreadedMotoServer`` on 127.0.0.1 and ``port`` (0: a free one), with the lock middleware and closable
    connections. ``stop(timeout_s)`` closes the connections too: a request still being served gets ``timeout_s``
    seconds to end."""

    def __init__(self, lock: threading.RLock, port: int = 0, faults: Faults | None = None) -> None:
        super().__init__(ip_address="127.0.0.1", port=port, verbose=False)
        self._lock = lock
        self._faults = faults

    def _server_entry(self) -> None:
        app = _SerializedApp(DomainDispatcherApplication(create_backend_app), self._lock, self._faults)
        self._server = _WsgiServer(self._ip_address, self._port, app)
        self._server_ready_event.set()
        self._server.serve_forever(poll_interval=0.05)

    def stop(self, timeout_s: float = 5.0) -> None:
        super().stop()
        server = self._server
        assert isinstance(server, _WsgiServer)
        server.server_close()
        server.close_connections(timeout_s)


# -------------------------------------------------------------------------- moto AutoScalingResponse methods

_active_lock = threading.Lock()
_ACTIVE: ServedActions | None = None
_ORIGINAL_PUT_HOOK: Callable[[Any], Any] | None = None


def active() -> ServedActions | None:
    """What the patches are installed for, ``None`` when nothing is."""
    return _ACTIVE


def _current() -> ServedActions:
    sandbox = _ACTIVE
    if sandbox is None:  # pragma: no cover - the methods are installed only while a sandbox runs
        raise RuntimeError("no AWS sandbox is running")
    return sandbox


def _lifecycle_request(self: Any, operation: Operation) -> LifecycleRequest:
    """The parameters of a lifecycle-action request, read by the ``AutoScalingResponse`` being served (``self``
    of the patched methods below, which call this as their own helper)."""
    completing = operation == "CompleteLifecycleAction"
    return LifecycleRequest(
        operation,
        asg_name=self._get_param("AutoScalingGroupName") or "",
        hook_name=self._get_param("LifecycleHookName") or "",
        token=self._get_param("LifecycleActionToken"),
        instance_id=self._get_param("InstanceId"),
        result=self._get_param("LifecycleActionResult") if completing else None,
    )


def _record_lifecycle_action_heartbeat(self: Any) -> Any:
    """``RecordLifecycleActionHeartbeat`` (EC2 Auto Scaling API Reference)."""
    _current().lifecycle_call(_lifecycle_request(self, "RecordLifecycleActionHeartbeat"))
    return EmptyResult()


def _complete_lifecycle_action(self: Any) -> Any:
    """``CompleteLifecycleAction`` (EC2 Auto Scaling API Reference)."""
    _current().lifecycle_call(_lifecycle_request(self, "CompleteLifecycleAction"))
    return EmptyResult()


def _put_lifecycle_hook(self: Any) -> Any:
    """``PutLifecycleHook``: moto's, then the notification target, metadata and global timeout it drops."""
    assert _ORIGINAL_PUT_HOOK is not None
    response = _ORIGINAL_PUT_HOOK(self)
    _current().configure_hook(
        self._get_param("AutoScalingGroupName"),
        self._get_param("LifecycleHookName"),
        notification_target_arn=self._get_param("NotificationTargetARN"),
        notification_metadata=self._get_param("NotificationMetadata"),
        role_arn=self._get_param("RoleARN"),
    )
    return response


def _describe_lifecycle_hooks(self: Any) -> Any:
    """``DescribeLifecycleHooks`` in the sandbox's real seconds: HeartbeatTimeout and GlobalTimeout go through
    the clock (at least 1 s), so a consumer that heartbeats at half the timeout it reads keeps an action alive
    under a scaled clock, as it would at full scale."""
    sandbox = _current()
    sandbox.raise_injected("DescribeLifecycleHooks")
    hooks = []
    for hook in self.autoscaling_backend.describe_lifecycle_hooks(
        as_name=self._get_param("AutoScalingGroupName"),
        lifecycle_hook_names=self._get_param("LifecycleHookNames", []),
    ):
        scaled = copy.copy(hook)
        scaled.heartbeat_timeout = max(1, math.ceil(sandbox.real_seconds(hook.heartbeat_timeout)))
        scaled.global_timeout = max(1, math.ceil(sandbox.real_seconds(hook.global_timeout)))
        hooks.append(scaled)
    return ActionResult({"LifecycleHooks": hooks})


#: Set (per server thread) while a ``SetDesiredCapacity`` or ``UpdateAutoScalingGroup`` request is served: only
#: then does a group's ``set_desired_capacity`` scale in through terminate hooks (moto also calls it to empty
#: a group it deletes, which must stay moto's).
_scaling_request = threading.local()
_ORIGINAL_TERMINATE = AutoScalingResponse.terminate_instance_in_auto_scaling_group
_ORIGINAL_SET_DESIRED = AutoScalingResponse.set_desired_capacity
_ORIGINAL_UPDATE_GROUP = AutoScalingResponse.update_auto_scaling_group
_ORIGINAL_GROUP_SET_DESIRED = FakeAutoScalingGroup.set_desired_capacity


@contextlib.contextmanager
def _scale_in_through_hooks() -> Iterator[None]:
    """While the block runs (one request, on this thread), capacity lowered by moto's
    ``set_desired_capacity`` goes through the terminate hooks (:func:`_group_set_desired_capacity`)."""
    _scaling_request.active = True
    try:
        yield
    finally:
        _scaling_request.active = False


def _terminate_instance_in_auto_scaling_group(self: Any) -> Any:
    """``TerminateInstanceInAutoScalingGroup`` (EC2 Auto Scaling API Reference): ``InstanceId`` and
    ``ShouldDecrementDesiredCapacity`` (default false). For a group with a terminate hook, served by
    :meth:`ServedActions.terminate_in_group` (the instance waits in ``Terminating:Wait``, its actions open; the
    answer is ``{"Activity": ...}`` in moto's shape; HTTP 400 ``ValidationError`` when the instance is neither
    InService nor Standby); otherwise moto's."""
    activity = _current().terminate_in_group(
        self._get_param("InstanceId"),
        self._get_bool_param("ShouldDecrementDesiredCapacity", False),
    )
    if activity is None:
        return _ORIGINAL_TERMINATE(self)
    return ActionResult({"Activity": activity})


def _set_desired_capacity(self: Any) -> Any:
    """``SetDesiredCapacity`` (EC2 Auto Scaling API Reference): moto's, except that a lower capacity removes
    instances of a group with a terminate hook through it (:func:`_group_set_desired_capacity`)."""
    with _scale_in_through_hooks():
        return _ORIGINAL_SET_DESIRED(self)


def _update_auto_scaling_group(self: Any) -> Any:
    """``UpdateAutoScalingGroup`` (EC2 Auto Scaling API Reference): moto's, except that a capacity lowered by
    ``DesiredCapacity`` or ``MaxSize`` removes instances of a group with a terminate hook through it
    (:func:`_group_set_desired_capacity`)."""
    with _scale_in_through_hooks():
        return _ORIGINAL_UPDATE_GROUP(self)


def _group_set_desired_capacity(group: Any, new_capacity: int | None) -> None:
    """moto's ``FakeAutoScalingGroup.set_desired_capacity`` (``None``: the group's MinSize), except, while a
    ``SetDesiredCapacity`` or ``UpdateAutoScalingGroup`` request is served, a scale-in of a group with a
    terminate hook: :meth:`ServedActions.scale_in_to` sets the capacity and puts the instances it removes in
    ``Terminating:Wait``; the group's load balancers and target groups are then refreshed as moto does."""
    sandbox = _ACTIVE
    desired = group.min_size if new_capacity is None else new_capacity
    if (
        sandbox is None
        or not getattr(_scaling_request, "active", False)
        or not sandbox.scale_in_to(group, desired or 0)
    ):
        _ORIGINAL_GROUP_SET_DESIRED(group, new_capacity)
        return
    backend = group.autoscaling_backend
    if group.name in backend.autoscaling_groups:
        backend.update_attached_elbs(group.name)
        backend.update_attached_target_groups(group.name)


# Injected errors (Throttling, AccessDenied) have no error shape in moto's Auto Scaling model: it warns each time.
warnings.filterwarnings(
    "ignore", message=r"Exception\(AutoscalingClientError\) with code", category=UserWarning
)

_PUT_HOOK = "put_lifecycle_hook"
_DESCRIBE_HOOKS = "describe_lifecycle_hooks"
#: The methods added to moto's ``AutoScalingResponse`` (``put_lifecycle_hook``, ``describe_lifecycle_hooks``
#: and those of :data:`_REPLACED` replace moto's own).
_METHODS: dict[str, Callable[[Any], Any]] = {
    "record_lifecycle_action_heartbeat": _record_lifecycle_action_heartbeat,
    "complete_lifecycle_action": _complete_lifecycle_action,
    "put_lifecycle_hook": _put_lifecycle_hook,
    "describe_lifecycle_hooks": _describe_lifecycle_hooks,
    "terminate_instance_in_auto_scaling_group": _terminate_instance_in_auto_scaling_group,
    "set_desired_capacity": _set_desired_capacity,
    "update_auto_scaling_group": _update_auto_scaling_group,
}
#: moto's ``AutoScalingResponse`` methods that :data:`_METHODS` replace and :func:`uninstall` puts back
#: (besides ``put_lifecycle_hook`` and ``describe_lifecycle_hooks``).
_REPLACED: dict[str, Callable[[Any], Any]] = {
    "terminate_instance_in_auto_scaling_group": _ORIGINAL_TERMINATE,
    "set_desired_capacity": _ORIGINAL_SET_DESIRED,
    "update_auto_scaling_group": _ORIGINAL_UPDATE_GROUP,
}
_GROUP_SET_DESIRED = "set_desired_capacity"
_ORIGINAL_DESCRIBE_HOOKS = AutoScalingResponse.describe_lifecycle_hooks
_ISSUED_IPS: set[str] = set()
#: The moto modules that draw instance and interface addresses (each imported the function by name).
_IP_MODULES = (eni_models, instance_models)
_ORIGINAL_RANDOM_IP = getattr(eni_models, "random_private_ip")  # noqa: B009 - not re-exported by moto


def _unique_private_ip(cidr: str | None = None, ipv6: bool = False) -> str:
    """moto's random private IP, never one it gave before in this sandbox: AWS never gives two instances of
    a VPC the same address, and a repeated one would give two instances one node name (with 1,250
    instances in a /16, moto's plain draw repeats about once in twenty clusters)."""
    while True:
        address = str(_ORIGINAL_RANDOM_IP(cidr, ipv6))
        if ipv6 or address not in _ISSUED_IPS:
            _ISSUED_IPS.add(address)
            return address


_RETENTION_CHECK = "is_message_valid_based_on_retention_period"
_ORIGINAL_RETENTION_CHECK = getattr(SQSBackend, _RETENTION_CHECK)


def _retention_check(backend: SQSBackend, queue_name: str, message: Any) -> bool:
    """moto's per-message retention check, without computing every queue attribute (moto 5.2.5 does, which
    costs O(messages in the queue) for each message received: a storm's receives become quadratic). Same
    rule: a message is dropped once ``MessageRetentionPeriod`` seconds have passed since it was sent."""
    retention_s = int(getattr(backend.get_queue(queue_name), "message_retention_period"))  # noqa: B009 - set by moto from the attribute name
    return bool(retention_s + message.sent_timestamp / 1000 > time.time())


def _ready(queue: Queue) -> list[Any]:
    """The queue's messages visible and not delayed (moto's ``Queue.messages``), reading the clock once."""
    now = unix_time_millis()
    return [m for m in queue._messages if now > m.visible_at and not now < m.delayed_until]


def _delayed(queue: Queue) -> int:
    """``ApproximateNumberOfMessagesDelayed``, reading the clock once."""
    now = unix_time_millis()
    return sum(1 for m in queue._messages if now < m.delayed_until)


def _not_visible(queue: Queue) -> int:
    """``ApproximateNumberOfMessagesNotVisible``, reading the clock once."""
    now = unix_time_millis()
    return sum(1 for m in queue._messages if not now > m.visible_at)


def _pending_groups(queue: Queue) -> set[str]:
    """The message groups with a message in flight (moto's ``Queue.pending_message_groups``), from a copy of the
    in-flight set taken in one step: SQS requests run unlocked, and moto iterated the set while another
    receive or delete changed it ("Set changed size during iteration", HTTP 500 to the client)."""
    return {message.group_id for message in list(queue.pending_messages) if message.group_id is not None}


#: moto 5.2.5 counts a queue's messages with two clock readings per message (``Message.visible`` and
#: ``delayed`` each convert the time), and every SendMessage computes every queue attribute, these counts
#: among them: sending N messages cost O(N²) clock conversions (5,000 Spot warnings took minutes to publish,
#: longer than their notices). Same rules, one reading per count; and the in-flight groups from a copy.
_QUEUE_COUNTS: dict[str, property] = {
    "messages": property(_ready),
    "approximate_number_of_messages_delayed": property(_delayed),
    "approximate_number_of_messages_not_visible": property(_not_visible),
    "pending_message_groups": property(_pending_groups),
}
_ORIGINAL_QUEUE_COUNTS = {name: Queue.__dict__[name] for name in _QUEUE_COUNTS}

#: Receipt handle (every one a message was given, the old ones too: moto accepts them) → the message: filled as
#: messages are received, emptied as they are deleted (and as purged or dropped messages are let go: weak
#: references), cleared at :func:`install`.
_RECEIPTS: weakref.WeakValueDictionary[str | None, Message] = weakref.WeakValueDictionary()
_ORIGINAL_MARK_RECEIVED = Message.mark_received
_ORIGINAL_DELETE_MESSAGE = Queue.delete_message
_ORIGINAL_CHANGE_VISIBILITY = SQSBackend.change_message_visibility
_ORIGINAL_SEND_MESSAGE = SQSBackend.send_message
_ORIGINAL_ATTRIBUTES = Queue.__dict__["attributes"]
_SENDING = threading.local()
_MAX_VISIBILITY_S = (
    43200  # ChangeMessageVisibility's 12-hour limit (moto counts it from the message's sending)
)


def _mark_received(self: Message, visibility_timeout: int | None = None) -> None:
    """moto's ``Message.mark_received`` (a new receipt handle), and the handle indexed."""
    _ORIGINAL_MARK_RECEIVED(self, visibility_timeout)
    _RECEIPTS[self.receipt_handle] = self


def _holder(queue: Queue, receipt_handle: str) -> Message | None:
    """The message of ``queue`` that was given ``receipt_handle``, if it is still in the queue."""
    message = _RECEIPTS.get(receipt_handle)
    return message if message is not None and message in queue._messages else None


def _delete_message(self: Queue, receipt_handle: str) -> None:
    """DeleteMessage as moto 5.2.5 answers it (a handle deleted before is accepted again; an unknown one is
    ``ReceiptHandleIsInvalid``), finding the message through :data:`_RECEIPTS`: moto compared the handle with
    every handle of every message in the queue, O(messages) Python calls for each delete."""
    if receipt_handle in self.deleted_messages:
        return
    message = _holder(self, receipt_handle)
    if message is None:
        raise ReceiptHandleIsInvalid()
    self.pending_messages.discard(message)
    handles = message.all_receipt_handles
    self.deleted_messages.update(handles)  # type: ignore[arg-type]
    with self._messages_lock:  # as SendMessage's append: a send or a delete in between is not lost
        kept = list(self._messages)
        with contextlib.suppress(ValueError):  # a concurrent delete of the same message took it out first
            kept.remove(message)
        self._messages = kept  # a new list, as moto's: a receive iterating the old one is not disturbed
    for handle in handles:
        _RECEIPTS.pop(handle, None)


def _change_message_visibility(
    self: SQSBackend, queue_name: str, receipt_handle: str, visibility_timeout: int
) -> None:
    """ChangeMessageVisibility as moto 5.2.5 answers it (at most 12 hours from the message's sending, else
    ``InvalidParameterValue``; a message made visible leaves the in-flight set; an unknown handle is
    ``ReceiptHandleIsInvalid``), finding the message through :data:`_RECEIPTS` instead of a scan."""
    queue = self.get_queue(queue_name)
    message = _holder(queue, receipt_handle)
    if message is None:
        raise ReceiptHandleIsInvalid
    sent_ms = float(message.sent_timestamp or 0)
    if unix_time_millis() + int(visibility_timeout) * 1000 - sent_ms > _MAX_VISIBILITY_S * 1000:
        raise InvalidParameterValue(
            f"Value {visibility_timeout} for parameter VisibilityTimeout is invalid. Reason: Total "
            f"VisibilityTimeout for the message is beyond the limit [{_MAX_VISIBILITY_S} seconds]"
        )
    message.change_visibility(visibility_timeout)
    if message.visible and message in queue.pending_messages:
        queue.pending_messages.discard(message)


def _send_message(self: SQSBackend, *args: Any, **kwargs: Any) -> Message:
    """moto's ``send_message``, with the queue's attributes read without the message counts (below)."""
    _SENDING.active = True
    try:
        return _ORIGINAL_SEND_MESSAGE(self, *args, **kwargs)
    finally:
        _SENDING.active = False


def _attributes(queue: Queue) -> dict[str, Any]:
    """moto's ``Queue.attributes``; inside SendMessage, which reads only ``ContentBasedDeduplication`` from them,
    that setting alone: moto computed every attribute for each message sent, three message counts among
    them (O(messages) each), so that a storm's state changes cost O(N²) to publish."""
    if not getattr(_SENDING, "active", False):
        return _ORIGINAL_ATTRIBUTES.fget(queue)  # type: ignore[no-any-return]
    if not queue.fifo_queue:
        return {}
    setting = getattr(queue, "content_based_deduplication", None)
    return {"ContentBasedDeduplication": str(setting).lower() if isinstance(setting, bool) else setting}


_SQS_METHODS: tuple[tuple[type, str, Any, Any], ...] = (
    (Message, "mark_received", _mark_received, _ORIGINAL_MARK_RECEIVED),
    (Queue, "delete_message", _delete_message, _ORIGINAL_DELETE_MESSAGE),
    (SQSBackend, "change_message_visibility", _change_message_visibility, _ORIGINAL_CHANGE_VISIBILITY),
    (SQSBackend, "send_message", _send_message, _ORIGINAL_SEND_MESSAGE),
    (Queue, "attributes", property(_attributes), _ORIGINAL_ATTRIBUTES),
)

_GET_TAGS = "get_tags"
_ORIGINAL_GET_TAGS = TaggedEC2Resource.get_tags


def _get_tags(self: Any) -> list[dict[str, str]]:
    """An EC2 resource's tags (moto's ``TaggedEC2Resource.get_tags``) read from the tag store by resource ID.
    moto 5.2.5 answers it with ``describe_tags`` filtered on the ID, which scans every tag of every resource
    with a regular expression: each instance a DescribeInstances answer describes cost O(all tags), and the
    answers of a 5,000-node storm O(N²) (a quarter of the sandbox's CPU at 2,500 nodes). Same entries, in the
    same order."""
    resource_id = getattr(self, "id", None)
    if not resource_id:
        return []
    tags = dict(self.ec2_backend.tags.get(resource_id) or {})
    kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(resource_id), "")
    return [
        {"resource_id": resource_id, "key": key, "value": value, "resource_type": kind}
        for key, value in tags.items()
    ]


_STRUCTURE = "_serialize_type_structure"
_ORIGINAL_STRUCTURE = getattr(EC2Serializer, _STRUCTURE)  # moto has no public hook for it

#: Instance ID → (what its serialized form was made from, the form): :func:`_serialize_structure`'s cache.
_INSTANCES: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

#: ``id()`` of a kept instance form's element content → that element's XML (:func:`_serialize_body`).
_ELEMENTS: dict[int, str] = {}

_BODY = "_serialize_body"
_ORIGINAL_BODY = getattr(EC2Serializer, _BODY)

_PLAIN = (str, int, float, bool, type(None), datetime.datetime)


def forget_instances() -> None:
    """Drop every kept instance form (:func:`_serialize_structure`): after an EC2 request that may change
    instances (any but ``Describe*``), and when the sandbox is reset."""
    _INSTANCES.clear()
    _ELEMENTS.clear()


def _instance_fingerprint(instance: Any) -> tuple[Any, ...]:
    """What an EC2 instance's serialized form is made from, as the sandbox changes it (it stops, starts and
    terminates instances, and tags them), cheaply: each attribute's value when it is plain (a string, a number,
    a time), the fields of its state and state reason (moto changes those in place), the identity and length of a
    collection, the identity of any other object, and the instance's tags. What an EC2 request changes elsewhere
    (an address associated, an interface or a block device modified) is not looked at: every EC2 request but
    ``Describe*`` drops the kept forms (:func:`forget_instances`)."""
    parts: list[Any] = []
    for value in vars(instance).values():
        if isinstance(value, _PLAIN):
            parts.append(value)
        elif isinstance(value, instance_models.InstanceState | instance_models.StateReason):
            parts.append(tuple(vars(value).values()))
        elif isinstance(value, list | dict | set):
            parts.append((id(value), len(value)))
        else:
            parts.append(id(value))
    parts.append(tuple((instance.ec2_backend.tags.get(instance.id) or {}).items()))
    return tuple(parts)


def _serialize_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
    """moto's ``EC2Serializer._serialize_type_structure``, with an EC2 instance's serialized form kept and given
    again while nothing it is made from changed (:func:`_instance_fingerprint`), for the same operation and
    place in its answer. moto 5.2.5 walks the service model for every member of every instance of every
    DescribeInstances answer (1.3 ms per instance here: 0.27 s for the controller's batch of 200, and 1-4 s
    of serialized calls when three replicas resolve a 1,000-node storm); the XML is the same."""
    if key and shape.name == "Instance" and isinstance(value, instance_models.Instance):
        made_from = (self.operation_model.name, tuple(self.path), _instance_fingerprint(value))
        kept = _INSTANCES.get(value.id)
        if kept is None or kept[0] != made_from:
            if kept is not None:
                for content in kept[1].values():
                    _ELEMENTS.pop(id(content), None)
            form: dict[str, Any] = {}
            _ORIGINAL_STRUCTURE(self, form, value, shape, key)
            for name, content in form.items():
                if isinstance(content, dict):
                    _ELEMENTS[id(content)] = xmltodict.unparse(
                        {name: content}, full_document=False, short_empty_elements=True
                    )
            kept = _INSTANCES[value.id] = (made_from, form)
        serialized.update(kept[1])
        return
    _ORIGINAL_STRUCTURE(self, serialized, value, shape, key)


def _serialize_body(self: Any, body: Any) -> str:
    """moto's ``EC2Serializer._serialize_body`` (``xmltodict.unparse``), with each kept instance form
    (:func:`_serialize_structure`) emitted as the XML it was emitted as when it was kept: unparsing was 90 % of
    a DescribeInstances answer once the forms were kept. Each form is stood in for by a token, unparsed with the
    rest, and the token's element replaced by the form's XML. Byte for byte moto's answer (tested)."""
    if self.pretty_print or not _ELEMENTS:
        return str(_ORIGINAL_BODY(self, body))
    elements: dict[str, str] = {}

    def stand_in(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: stand_in(item) for key, item in value.items()}
        if isinstance(value, list):
            items = []
            for item in value:
                xml = _ELEMENTS.get(id(item)) if isinstance(item, dict) else None
                if xml is None:
                    items.append(stand_in(item))
                else:
                    token = f"qp-kept-instance-{len(elements)}-{id(elements)}"
                    elements[token] = xml
                    items.append(token)
            return items
        return value

    emitted = str(_ORIGINAL_BODY(self, stand_in(body)))
    if not elements:
        return emitted
    return _TOKEN_ELEMENT.sub(lambda match: elements.get(match.group(2), match.group(0)), emitted)


#: An element whose only content is a stand-in token of :func:`_serialize_body`.
_TOKEN_ELEMENT = re.compile(r"<([A-Za-z][\w.-]*)>(qp-kept-instance-\d+-\d+)</\1>")


def install(sandbox: ServedActions) -> None:
    """Patch moto for ``sandbox``: the ``AutoScalingResponse`` methods (served by ``sandbox``), the group's
    ``set_desired_capacity`` (scale-in through terminate hooks during the requests that ask for it), unique private
    IPs (the record of issued ones restarts), the cheap SQS retention check, queue counts, receipt-handle index and
    SendMessage, and EC2 tag reads by resource ID. Raises ``RuntimeError`` when another sandbox is installed
    (moto's state is process-wide)."""
    global _ACTIVE, _ORIGINAL_PUT_HOOK
    with _active_lock:
        if _ACTIVE is not None:
            raise RuntimeError(
                "another AWS sandbox is running in this process (moto's state is process-wide)"
            )
        _ACTIVE = sandbox
        _ORIGINAL_PUT_HOOK = AutoScalingResponse.put_lifecycle_hook
        for name, method in _METHODS.items():
            setattr(AutoScalingResponse, name, method)
        setattr(FakeAutoScalingGroup, _GROUP_SET_DESIRED, _group_set_desired_capacity)
        setattr(SQSBackend, _RETENTION_CHECK, _retention_check)
        for name, counted in _QUEUE_COUNTS.items():
            setattr(Queue, name, counted)
        setattr(TaggedEC2Resource, _GET_TAGS, _get_tags)
        setattr(EC2Serializer, _STRUCTURE, _serialize_structure)
        setattr(EC2Serializer, _BODY, _serialize_body)
        _INSTANCES.clear()
        _ELEMENTS.clear()
        _RECEIPTS.clear()
        for owner, name, patched, _ in _SQS_METHODS:
            setattr(owner, name, patched)
        _ISSUED_IPS.clear()
        for module in _IP_MODULES:
            setattr(module, "random_private_ip", _unique_private_ip)  # noqa: B010 - not re-exported by moto


def uninstall(sandbox: ServedActions) -> None:
    """Put moto back as it was before :func:`install`; nothing when ``sandbox`` is not the one installed."""
    global _ACTIVE, _ORIGINAL_PUT_HOOK
    with _active_lock:
        if _ACTIVE is not sandbox:
            return
        for name in ("record_lifecycle_action_heartbeat", "complete_lifecycle_action"):
            delattr(AutoScalingResponse, name)
        setattr(AutoScalingResponse, _PUT_HOOK, _ORIGINAL_PUT_HOOK)
        setattr(AutoScalingResponse, _DESCRIBE_HOOKS, _ORIGINAL_DESCRIBE_HOOKS)
        for name, method in _REPLACED.items():
            setattr(AutoScalingResponse, name, method)
        setattr(FakeAutoScalingGroup, _GROUP_SET_DESIRED, _ORIGINAL_GROUP_SET_DESIRED)
        setattr(SQSBackend, _RETENTION_CHECK, _ORIGINAL_RETENTION_CHECK)
        for name, original in _ORIGINAL_QUEUE_COUNTS.items():
            setattr(Queue, name, original)
        setattr(TaggedEC2Resource, _GET_TAGS, _ORIGINAL_GET_TAGS)
        setattr(EC2Serializer, _STRUCTURE, _ORIGINAL_STRUCTURE)
        setattr(EC2Serializer, _BODY, _ORIGINAL_BODY)
        _INSTANCES.clear()
        _ELEMENTS.clear()
        for owner, name, _, original in _SQS_METHODS:
            setattr(owner, name, original)
        _RECEIPTS.clear()
        for module in _IP_MODULES:
            setattr(module, "random_private_ip", _ORIGINAL_RANDOM_IP)  # noqa: B010 - not re-exported by moto
        _ORIGINAL_PUT_HOOK = None
        _ACTIVE = None
