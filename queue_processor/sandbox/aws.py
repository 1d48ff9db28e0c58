"""The sandbox's AWS: moto's server on 127.0.0.1, plus the Auto Scaling lifecycle actions moto lacks.

:class:`AwsSandbox` starts moto's ``ThreadedMotoServer`` on a free port of 127.0.0.1; clients reach it over HTTP
through ``endpoint_url`` with fake credentials (:attr:`AwsSandbox.client_kwargs`), exactly as they reach AWS in
production. Account ``123456789012`` (moto's default), region ``us-east-1`` unless told otherwise.

What moto 5.2.5 lacks and the sandbox adds, with the semantics of "Amazon EC2 Auto Scaling lifecycle hooks"
(EC2 Auto Scaling User Guide) and the API Reference:

- ``RecordLifecycleActionHeartbeat`` and ``CompleteLifecycleAction``, added as methods of moto's
  ``AutoScalingResponse`` (moto dispatches a Query action to the snake_case method of that name). An action is
  addressed by ``LifecycleActionToken`` or ``InstanceId`` (with ``AutoScalingGroupName`` and
  ``LifecycleHookName``); an unknown, completed or timed-out one answers HTTP 400 ``ValidationError`` "No active
  Lifecycle Action found with token <token>" (or "... with instance ID <id>" when addressed by instance).
  A heartbeat restarts the hook's ``HeartbeatTimeout``; no action outlives its global timeout,
  min(48 h, 100 x HeartbeatTimeout). A timed-out action takes the hook's ``DefaultResult``.
- Lifecycle actions themselves: while one is open the instance waits in ``Terminating:Wait``,
  ``Pending:Wait`` or ``Warmed:Pending:Wait`` (as ``DescribeAutoScalingInstances`` and
  ``DescribeAutoScalingGroups`` show it). When every action of the transition has ended: a terminating
  instance is terminated whatever the result (CONTINUE or ABANDON; to the warm pool when its destination is
  ``WarmPool``); a launching instance goes ``InService`` (or ``Warmed:Stopped``/``Warmed:Running``) on
  CONTINUE and is terminated on ABANDON. ABANDON also ends the instance's other open actions of the
  transition (status ``cancelled``).
- ``PutLifecycleHook`` keeps ``NotificationTargetARN``, ``NotificationMetadata`` and ``RoleARN`` (moto drops
  or invents them) and sets ``GlobalTimeout``; an SQS target receives the ``autoscaling:TEST_NOTIFICATION``,
  then every lifecycle notification in the direct format (``LifecycleActionToken``, ``AutoScalingGroupName``,
  ``LifecycleHookName``, ``EC2InstanceId``, ``LifecycleTransition``, ``Origin``, ``Destination``,
  ``NotificationMetadata``, ``AccountId``, ``Service``, ``Time``, ``RequestId``).
- EventBridge delivery: every event AWS would emit (lifecycle actions, EC2 state changes, the scenario
  notices) is matched against the default bus's enabled rules with moto's own event-pattern matcher and sent
  to their SQS targets with the body EventBridge produces ("Amazon EventBridge events", EventBridge User
  Guide). moto's ``PutEvents`` does deliver to SQS, but its default target template drops ``account``; the
  sandbox therefore sends the body itself. Targets with an ``InputTransformer`` and non-SQS targets are not
  served.

Scenarios (:meth:`AwsSandbox.terminate_instance`, :meth:`AwsSandbox.launch_instances`,
:meth:`AwsSandbox.spot_interruption`, ...) publish the documented event formats. Every simulated duration
(hook timeouts, the Spot notice) goes through :meth:`SandboxClock.real`; a notice's event time is backdated
(:meth:`SandboxClock.backdate`) so that the deadline a consumer derives from it is when the sandbox acts.
EventBridge writes ``time`` in whole seconds; under a scaled clock (``scale != 1``) notice times keep
milliseconds, since a truncated second would shorten a 1.2 s scaled notice by up to a second.

Threads: moto's server thread, one thread per HTTP connection, and one timer thread. All state the sandbox
changes (its own and moto's Auto Scaling, EC2 and EventBridge backends) is changed under one lock, which the
server also holds while it serves an Auto Scaling, EC2 or EventBridge request; SQS requests run unlocked so
long polls block nobody. :meth:`AwsSandbox.stop` stops the timer thread, closes the server's connections and
joins every thread it started. One sandbox runs per process at a time: moto's backends are process-wide.

Not modelled: ASG replacement of terminated instances, scale-in through ``SetDesiredCapacity`` or
``TerminateInstanceInAutoScalingGroup`` (use the scenario methods), SNS notification targets.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import itertools
import json
import logging
import math
import re
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from types import TracebackType
from typing import Any, Literal, Self, TypedDict
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

import botocore.session
from moto.autoscaling.exceptions import AutoscalingClientError, ValidationError
from moto.autoscaling.responses import AutoScalingResponse
from moto.backends import get_backend
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.core.responses import ActionResult, EmptyResult
from moto.ec2.models import elastic_network_interfaces as eni_models
from moto.ec2.models import instances as instance_models
from moto.moto_api._internal.models import moto_api_backend
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from moto.server import ThreadedMotoServer
from moto.sqs.models import SQSBackend
from werkzeug.serving import ThreadedWSGIServer

from queue_processor.events import SPOT_NOTICE, EventKind
from queue_processor.sandbox.clock import SandboxClock

__all__ = [
    "ACCOUNT_ID",
    "LAUNCH_HOOK",
    "LAUNCH_TRANSITION",
    "MANAGED_TAG",
    "STANDARD_RULES",
    "TERMINATE_HOOK",
    "TERMINATE_TRANSITION",
    "AwsSandbox",
    "ClientKwargs",
    "LifecycleAction",
    "LifecycleCall",
    "PublishedMessage",
    "SandboxInstance",
    "SandboxQueue",
]

log = logging.getLogger(__name__)

#: moto's default account; the sandbox's fake credentials map to it.
ACCOUNT_ID: str = DEFAULT_ACCOUNT_ID
DEFAULT_REGION = "us-east-1"
DEFAULT_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
#: The tag aws-node-termination-handler checks (``--managed-tag``), propagated to the group's instances.
MANAGED_TAG = "aws-node-termination-handler/managed"
TERMINATE_HOOK = "queue-processor-terminate"
LAUNCH_HOOK = "queue-processor-launch"
TERMINATE_TRANSITION = "autoscaling:EC2_INSTANCE_TERMINATING"
LAUNCH_TRANSITION = "autoscaling:EC2_INSTANCE_LAUNCHING"
#: An image moto knows; the sandbox never boots it.
IMAGE_ID = "ami-12c6146b"
#: "Configure a lifecycle hook": the global timeout is 48 hours or 100 x HeartbeatTimeout, whichever is smaller.
MAX_GLOBAL_TIMEOUT_S = 48 * 3600.0
#: Services whose requests the server serialises with the sandbox's own changes (SQS stays concurrent).
_SERIALIZED_SERVICES = frozenset({"autoscaling", "ec2", "events"})
_CREDENTIAL_SCOPE = re.compile(r"Credential=[^/,]+/\d{8}/[^/,]+/([^/,]+)/aws4_request")
_FAKE_KEY = "testing"

Result = Literal["CONTINUE", "ABANDON"]
ActionStatus = Literal["open", "completed", "timed-out", "cancelled"]
Operation = Literal["RecordLifecycleActionHeartbeat", "CompleteLifecycleAction"]

#: The EventBridge rules the Terraform module creates, one per kind, keyed by the kind they feed
#: ("Amazon EventBridge event patterns"). State changes are limited to the states the controller acts on.
STANDARD_RULES: Mapping[EventKind, Mapping[str, Any]] = {
    EventKind.ASG_TERMINATE_LIFECYCLE: {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
    },
    EventKind.ASG_LAUNCH_LIFECYCLE: {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance-launch Lifecycle Action"],
    },
    EventKind.SPOT_INTERRUPTION: {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Spot Instance Interruption Warning"],
    },
    EventKind.REBALANCE_RECOMMENDATION: {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance Rebalance Recommendation"],
    },
    EventKind.STATE_CHANGE: {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance State-change Notification"],
        "detail": {"state": ["stopping", "stopped", "shutting-down", "terminated"]},
    },
    EventKind.SCHEDULED_CHANGE: {
        "source": ["aws.health"],
        "detail-type": ["AWS Health Event"],
        "detail": {"service": ["EC2"], "eventTypeCategory": ["scheduledChange"]},
    },
    EventKind.CAPACITY_RESERVATION_INTERRUPTION: {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"],
    },
}

_WARM_ROUTES = {
    ("EC2", "AutoScalingGroup"),
    ("EC2", "WarmPool"),
    ("WarmPool", "AutoScalingGroup"),
}


# --------------------------------------------------------------------------------------------- public records


class ClientKwargs(TypedDict):
    """What a boto3 or aiobotocore client needs to reach the sandbox (``create_client(service, **kw)``)."""

    endpoint_url: str
    region_name: str
    aws_access_key_id: str
    aws_secret_access_key: str


@dataclass(frozen=True)
class SandboxInstance:
    """An instance of a sandbox Auto Scaling group, as the Kubernetes side names it: ``private_dns_name`` is
    the node name, ``provider_id`` the node's ``spec.providerID`` (``aws:///<az>/<instance-id>``)."""

    instance_id: str
    private_dns_name: str
    private_ip_address: str
    availability_zone: str
    provider_id: str
    asg_name: str


@dataclass(frozen=True)
class SandboxQueue:
    """An SQS queue and its dead-letter queue: URLs as clients of the sandbox use them, and ARNs."""

    url: str
    arn: str
    dlq_url: str
    dlq_arn: str


@dataclass(frozen=True)
class LifecycleAction:
    """One lifecycle action (one hook for one instance's transition), as it stands when read.

    ``status``: ``open``; ``completed`` by ``CompleteLifecycleAction`` (``result`` is the caller's);
    ``timed-out`` (``result`` is the hook's DefaultResult); ``cancelled`` when another hook of the instance
    ended with ABANDON or the instance went away (``result`` is ``None``). Timeouts are simulated seconds;
    times are wall-clock, aware UTC.
    """

    token: str
    instance_id: str
    asg_name: str
    hook_name: str
    transition: str
    origin: str
    destination: str
    default_result: Result
    heartbeat_timeout_s: float
    global_timeout_s: float
    started_at: datetime
    status: ActionStatus
    result: Result | None
    ended_at: datetime | None
    heartbeats: int


@dataclass(frozen=True)
class LifecycleCall:
    """One ``RecordLifecycleActionHeartbeat`` or ``CompleteLifecycleAction`` call as the sandbox received it:
    the parameters as given (``None`` when absent), ``outcome`` = ``"ok"`` or what the caller saw
    (``"ValidationError: <message>"``), and the token of the action it reached (``None`` on error)."""

    operation: Operation
    time: datetime
    asg_name: str
    hook_name: str
    token: str | None
    instance_id: str | None
    result: str | None
    outcome: str
    action_token: str | None

    @property
    def ok(self) -> bool:
        """Whether the call succeeded."""
        return self.outcome == "ok"


@dataclass(frozen=True)
class PublishedMessage:
    """A body the sandbox published: ``via`` ``eventbridge`` (to the matching rules' SQS targets),
    ``direct`` (a lifecycle hook's notification target) or ``raw``; ``queues`` are the names it reached."""

    time: datetime
    via: Literal["eventbridge", "direct", "raw"]
    body: str
    queues: tuple[str, ...]


@dataclass
class _Action:
    """The mutable state behind :class:`LifecycleAction`; deadlines are ``time.monotonic()`` readings."""

    token: str
    instance_id: str
    asg_name: str
    hook_name: str
    transition: str
    origin: str
    destination: str
    default_result: Result
    heartbeat_timeout_s: float
    global_timeout_s: float
    notification_target_arn: str | None
    notification_metadata: str | None
    started_at: datetime
    deadline: float
    global_deadline: float
    episode: list[_Action] = field(repr=False, compare=False)
    status: ActionStatus = "open"
    result: Result | None = None
    ended_at: datetime | None = None
    heartbeats: int = 0

    def snapshot(self) -> LifecycleAction:
        return LifecycleAction(
            token=self.token,
            instance_id=self.instance_id,
            asg_name=self.asg_name,
            hook_name=self.hook_name,
            transition=self.transition,
            origin=self.origin,
            destination=self.destination,
            default_result=self.default_result,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            global_timeout_s=self.global_timeout_s,
            started_at=self.started_at,
            status=self.status,
            result=self.result,
            ended_at=self.ended_at,
            heartbeats=self.heartbeats,
        )


@dataclass
class _Fault:
    """An error :meth:`AwsSandbox.inject_error` set up: until ``until`` (monotonic) or for ``times`` calls."""

    operation: str
    code: str
    message: str
    until: float | None
    times: int | None


# ------------------------------------------------------------------------------------------------- the timer


class _Timers:
    """One daemon thread that runs callbacks at ``time.monotonic()`` deadlines; :meth:`stop` joins it.
    A callback's exception is logged and kept in ``errors``; it never stops the thread."""

    def __init__(self, errors: list[BaseException]) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="aws-sandbox-timers", daemon=True)
        self.errors = errors

    def start(self) -> None:
        self._thread.start()

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), callback))
            self._cond.notify()

    def clear(self) -> None:
        with self._cond:
            self._heap.clear()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        break
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, _, callback = heapq.heappop(self._heap)
            try:
                callback()
            except Exception as exc:  # a broken scenario must not stop the other timers
                log.exception("aws sandbox timer failed")
                self.errors.append(exc)


# ------------------------------------------------------------------------------------------------ the server


class _QuietHandler(MotoRequestHandler):
    """moto's request handler without one access-log line per request."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class _SerializedApp:
    """WSGI middleware: Auto Scaling, EC2 and EventBridge requests run under the sandbox lock (moto's
    backends are not thread-safe, and the sandbox changes them from its own threads)."""

    def __init__(self, app: WSGIApplication, lock: threading.RLock) -> None:
        self._app = app
        self._lock = lock

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        scope = _CREDENTIAL_SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
        if scope is None or scope.group(1) not in _SERIALIZED_SERVICES:
            return self._app(environ, start_response)
        with self._lock:
            return list(self._app(environ, start_response))


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


class _MotoServer(ThreadedMotoServer):
    """``ThreadedMotoServer`` on 127.0.0.1 and a free port, with the lock middleware and closable
    connections."""

    def __init__(self, lock: threading.RLock) -> None:
        super().__init__(ip_address="127.0.0.1", port=0, verbose=False)
        self._lock = lock

    def _server_entry(self) -> None:
        app = _SerializedApp(DomainDispatcherApplication(create_backend_app), self._lock)
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
_ACTIVE: AwsSandbox | None = None
_ORIGINAL_PUT_HOOK: Callable[[Any], Any] | None = None


def _current() -> AwsSandbox:
    sandbox = _ACTIVE
    if sandbox is None:  # pragma: no cover - the methods are installed only while a sandbox runs
        raise RuntimeError("no AWS sandbox is running")
    return sandbox


def _record_lifecycle_action_heartbeat(self: Any) -> Any:
    """``RecordLifecycleActionHeartbeat`` (EC2 Auto Scaling API Reference)."""
    _current()._lifecycle_call(
        "RecordLifecycleActionHeartbeat",
        asg_name=self._get_param("AutoScalingGroupName") or "",
        hook_name=self._get_param("LifecycleHookName") or "",
        token=self._get_param("LifecycleActionToken"),
        instance_id=self._get_param("InstanceId"),
        result=None,
    )
    return EmptyResult()


def _complete_lifecycle_action(self: Any) -> Any:
    """``CompleteLifecycleAction`` (EC2 Auto Scaling API Reference)."""
    _current()._lifecycle_call(
        "CompleteLifecycleAction",
        asg_name=self._get_param("AutoScalingGroupName") or "",
        hook_name=self._get_param("LifecycleHookName") or "",
        token=self._get_param("LifecycleActionToken"),
        instance_id=self._get_param("InstanceId"),
        result=self._get_param("LifecycleActionResult"),
    )
    return EmptyResult()


def _put_lifecycle_hook(self: Any) -> Any:
    """``PutLifecycleHook``: moto's, then the notification target, metadata and global timeout it drops."""
    assert _ORIGINAL_PUT_HOOK is not None
    response = _ORIGINAL_PUT_HOOK(self)
    _current()._configure_hook(
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
    sandbox._raise_injected("DescribeLifecycleHooks")
    hooks = []
    for hook in self.autoscaling_backend.describe_lifecycle_hooks(
        as_name=self._get_param("AutoScalingGroupName"),
        lifecycle_hook_names=self._get_param("LifecycleHookNames", []),
    ):
        scaled = copy.copy(hook)
        scaled.heartbeat_timeout = max(1, math.ceil(sandbox.clock.real(hook.heartbeat_timeout)))
        scaled.global_timeout = max(1, math.ceil(sandbox.clock.real(hook.global_timeout)))
        hooks.append(scaled)
    return ActionResult({"LifecycleHooks": hooks})


# Injected errors (Throttling, AccessDenied) have no error shape in moto's Auto Scaling model: it warns each time.
warnings.filterwarnings(
    "ignore", message=r"Exception\(AutoscalingClientError\) with code", category=UserWarning
)

_PUT_HOOK = "put_lifecycle_hook"
_DESCRIBE_HOOKS = "describe_lifecycle_hooks"
#: The methods added to moto's ``AutoScalingResponse`` (``put_lifecycle_hook`` and
#: ``describe_lifecycle_hooks`` replace moto's own).
_METHODS: dict[str, Callable[[Any], Any]] = {
    "record_lifecycle_action_heartbeat": _record_lifecycle_action_heartbeat,
    "complete_lifecycle_action": _complete_lifecycle_action,
    "put_lifecycle_hook": _put_lifecycle_hook,
    "describe_lifecycle_hooks": _describe_lifecycle_hooks,
}
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


def _install(sandbox: AwsSandbox) -> None:
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
        setattr(SQSBackend, _RETENTION_CHECK, _retention_check)
        _ISSUED_IPS.clear()
        for module in _IP_MODULES:
            setattr(module, "random_private_ip", _unique_private_ip)  # noqa: B010 - not re-exported by moto


def _uninstall(sandbox: AwsSandbox) -> None:
    global _ACTIVE, _ORIGINAL_PUT_HOOK
    with _active_lock:
        if _ACTIVE is not sandbox:
            return
        for name in ("record_lifecycle_action_heartbeat", "complete_lifecycle_action"):
            delattr(AutoScalingResponse, name)
        setattr(AutoScalingResponse, _PUT_HOOK, _ORIGINAL_PUT_HOOK)
        setattr(AutoScalingResponse, _DESCRIBE_HOOKS, _ORIGINAL_DESCRIBE_HOOKS)
        setattr(SQSBackend, _RETENTION_CHECK, _ORIGINAL_RETENTION_CHECK)
        for module in _IP_MODULES:
            setattr(module, "random_private_ip", _ORIGINAL_RANDOM_IP)  # noqa: B010 - not re-exported by moto
        _ORIGINAL_PUT_HOOK = None
        _ACTIVE = None


# ------------------------------------------------------------------------------------------------- formatting


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _whole_seconds(moment: datetime) -> str:
    """EventBridge's ``time``: ``2026-11-22T12:00:37Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _milliseconds(moment: datetime) -> str:
    """``2026-11-22T12:00:37.214Z``, as a lifecycle notification's ``Time``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _queue_name(arn_or_url: str) -> str:
    return arn_or_url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]


# ------------------------------------------------------------------------------------------------ the sandbox


class AwsSandbox:
    """The embedded AWS: moto's server with lifecycle actions, EventBridge delivery and scenarios.

    ``clock`` scales every simulated duration (default: real time); ``region`` is where everything lives.
    Use it as a context manager, or call :meth:`start` and :meth:`stop`. Raises ``RuntimeError`` from
    :meth:`start` when another sandbox runs in the process. Thread-safe.
    """

    def __init__(self, clock: SandboxClock | None = None, *, region: str = DEFAULT_REGION) -> None:
        self.clock = clock or SandboxClock()
        self.region = region
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._server: _MotoServer | None = None
        self._timers: _Timers | None = None
        self._endpoint: str | None = None
        self._generation = 0
        self._actions: dict[str, _Action] = {}
        self._open: dict[str, _Action] = {}
        self._calls: list[LifecycleCall] = []
        self._published: list[PublishedMessage] = []
        self._botocore: botocore.session.Session | None = None
        self._clients: dict[str, Any] = {}
        self._timer_errors: list[BaseException] = []
        self._listeners: list[Callable[[SandboxInstance, str], None]] = []
        self._faults: list[_Fault] = []

    # ------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        """Reset moto's state, start the server and the timer thread, add the lifecycle actions to moto."""
        if self._server is not None:
            return self
        _install(self)
        try:
            moto_api_backend.reset()
            self._server = _MotoServer(self._lock)
            self._server.start()
            host, port = self._server.get_host_and_port()
            self._endpoint = f"http://{host}:{port}"
            self._timers = _Timers(self._timer_errors)
            self._timers.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the timers, the server and every thread they started (a request still being served, such as
        an SQS long poll, gets 5 s to end); reset moto's state. Idempotent."""
        if _ACTIVE is not self:
            return
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self._endpoint = None
        if self._timers is not None:
            self._timers.stop()
            self._timers = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        with self._lock:
            self._generation += 1
            self._open.clear()
        moto_api_backend.reset()
        _uninstall(self)

    def __enter__(self) -> Self:
        return self.start()

    def inject_error(
        self,
        operation: Literal[
            "DescribeLifecycleHooks", "RecordLifecycleActionHeartbeat", "CompleteLifecycleAction"
        ],
        code: str,
        message: str,
        *,
        seconds: float | None = None,
        times: int | None = None,
    ) -> None:
        """Answer ``operation`` with the AWS error ``code``/``message`` (HTTP 400, as Auto Scaling's Query API
        answers ``Throttling`` or ``AccessDenied``) for the next ``seconds`` real seconds, or the next
        ``times`` calls, or (neither given) until :meth:`clear_errors`. A failed heartbeat or completion is
        recorded in :meth:`calls` with ``outcome`` ``"<code>: <message>"``."""
        until = time.monotonic() + seconds if seconds is not None else None
        with self._lock:
            self._faults.append(_Fault(operation, code, message, until, times))

    def clear_errors(self) -> None:
        """Forget every error :meth:`inject_error` set up."""
        with self._lock:
            self._faults.clear()

    def _raise_injected(self, operation: str) -> None:
        with self._lock:
            now = time.monotonic()
            self._faults = [
                f
                for f in self._faults
                if (f.until is None or f.until > now) and (f.times is None or f.times > 0)
            ]
            for fault in self._faults:
                if fault.operation == operation:
                    if fault.times is not None:
                        fault.times -= 1
                    raise AutoscalingClientError(fault.code, fault.message)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def reset(self) -> None:
        """Forget everything: moto's state (groups, instances, queues, rules), lifecycle actions, pending
        timers and the record. The server keeps running; use between independent tests."""
        with self._lock:
            self._generation += 1
            if self._timers is not None:
                self._timers.clear()
            self._actions.clear()
            self._open.clear()
            self._calls.clear()
            self._published.clear()
            self._timer_errors.clear()
            moto_api_backend.reset()

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``; raises ``RuntimeError`` before :meth:`start`."""
        if self._endpoint is None:
            raise RuntimeError("the AWS sandbox is not started")
        return self._endpoint

    @property
    def client_kwargs(self) -> ClientKwargs:
        """Keyword arguments for ``boto3.client(service, **kw)`` or aiobotocore's ``session.create_client``:
        ``endpoint_url``, ``region_name`` and fake credentials."""
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region,
            "aws_access_key_id": _FAKE_KEY,
            "aws_secret_access_key": _FAKE_KEY,
        }

    def client(self, service: str) -> Any:
        """A botocore client of ``service`` on the sandbox (what ``boto3.client`` builds), one per service;
        botocore clients are thread-safe."""
        with self._lock:
            if service not in self._clients:
                if self._botocore is None:
                    self._botocore = botocore.session.get_session()
                self._clients[service] = self._botocore.create_client(
                    service,
                    region_name=self.region,
                    endpoint_url=self.endpoint_url,
                    aws_access_key_id=_FAKE_KEY,
                    aws_secret_access_key=_FAKE_KEY,
                )
            return self._clients[service]

    @property
    def timer_errors(self) -> list[BaseException]:
        """Exceptions raised by scheduled work (timeouts, notice ends); tests assert it stays empty."""
        return list(self._timer_errors)

    # ---------------------------------------------------------------------------------------- moto backends

    @property
    def _autoscaling(self) -> Any:
        return get_backend("autoscaling")[ACCOUNT_ID][self.region]

    @property
    def _ec2(self) -> Any:
        return get_backend("ec2")[ACCOUNT_ID][self.region]

    @property
    def _sqs(self) -> Any:
        return get_backend("sqs")[ACCOUNT_ID][self.region]

    @property
    def _events(self) -> Any:
        return get_backend("events")[ACCOUNT_ID][self.region]

    # ------------------------------------------------------------------------------------------ queue, rules

    def create_queue(
        self, name: str = "queue-processor", *, visibility_timeout_s: int = 30, max_receive_count: int = 5
    ) -> SandboxQueue:
        """An SQS queue with a redrive policy to ``<name>-dlq`` after ``max_receive_count`` receives
        ("Using dead-letter queues", SQS Developer Guide). Created over HTTP, as a user would."""
        sqs = self.client("sqs")
        dlq_url = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)})
        url = sqs.create_queue(
            QueueName=name,
            Attributes={"VisibilityTimeout": str(visibility_timeout_s), "RedrivePolicy": redrive},
        )["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        return SandboxQueue(url=url, arn=arn, dlq_url=dlq_url, dlq_arn=dlq_arn)

    def put_standard_rules(
        self, queue_arn: str, *, kinds: Iterable[EventKind] | None = None, prefix: str = "queue-processor"
    ) -> list[str]:
        """Create the :data:`STANDARD_RULES` of ``kinds`` (default: all) on the default bus, each targeting
        ``queue_arn``, over HTTP; returns the rule names (``<prefix>-<kind>``)."""
        events = self.client("events")
        names = []
        for kind in STANDARD_RULES if kinds is None else kinds:
            name = f"{prefix}-{kind}"
            events.put_rule(Name=name, EventPattern=json.dumps(STANDARD_RULES[kind]), State="ENABLED")
            events.put_targets(Rule=name, Targets=[{"Id": "queue", "Arn": queue_arn}])
            names.append(name)
        return names

    # ---------------------------------------------------------------------------------------------- cluster

    def create_asg(
        self,
        name: str,
        size: int,
        *,
        availability_zones: Sequence[str] = DEFAULT_ZONES,
        instance_type: str = "m5.large",
        managed: bool = True,
        tags: Mapping[str, str] | None = None,
        terminate_hook: bool = True,
        heartbeat_timeout_s: float = 300.0,
        default_result: Result = "CONTINUE",
        launch_hook: bool = False,
        launch_heartbeat_timeout_s: float = 300.0,
        launch_default_result: Result = "ABANDON",
        notification_target_arn: str | None = None,
        notification_metadata: str | None = None,
    ) -> list[SandboxInstance]:
        """An Auto Scaling group of ``size`` InService instances spread round-robin over
        ``availability_zones``, tagged :data:`MANAGED_TAG` (when ``managed``) and ``tags``, all propagated
        at launch; with the lifecycle hooks :data:`TERMINATE_HOOK` and (``launch_hook``)
        :data:`LAUNCH_HOOK`, whose timeouts are simulated seconds. ``notification_target_arn`` (an SQS
        queue ARN) also sends every lifecycle notification straight to that queue. The group, its launch
        template and hooks are created over HTTP; the instances in-process (one call per zone), because
        moto would put them all in one zone. Returns the instances in launch order."""
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        ec2 = self.client("ec2")
        autoscaling = self.client("autoscaling")
        template = f"{name}-template"
        ec2.create_launch_template(
            LaunchTemplateName=template,
            LaunchTemplateData={"ImageId": IMAGE_ID, "InstanceType": instance_type},
        )
        group_tags = dict(tags or {})
        if managed:
            group_tags.setdefault(MANAGED_TAG, "")
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=name,
            LaunchTemplate={"LaunchTemplateName": template, "Version": "$Default"},
            MinSize=0,
            MaxSize=max(size, 1),
            DesiredCapacity=0,
            AvailabilityZones=list(availability_zones),
            Tags=[
                {
                    "ResourceId": name,
                    "ResourceType": "auto-scaling-group",
                    "Key": key,
                    "Value": value,
                    "PropagateAtLaunch": True,
                }
                for key, value in group_tags.items()
            ],
        )
        hooks: list[tuple[str, str, float, Result]] = []
        if terminate_hook:
            hooks.append((TERMINATE_HOOK, TERMINATE_TRANSITION, heartbeat_timeout_s, default_result))
        if launch_hook:
            hooks.append((LAUNCH_HOOK, LAUNCH_TRANSITION, launch_heartbeat_timeout_s, launch_default_result))
        for hook_name, transition, timeout_s, result in hooks:
            extra: dict[str, str] = {}
            if notification_target_arn is not None:
                extra["NotificationTargetARN"] = notification_target_arn
                extra["RoleARN"] = f"arn:aws:iam::{ACCOUNT_ID}:role/sandbox-autoscaling-notifications"
            if notification_metadata is not None:
                extra["NotificationMetadata"] = notification_metadata
            autoscaling.put_lifecycle_hook(
                AutoScalingGroupName=name,
                LifecycleHookName=hook_name,
                LifecycleTransition=transition,
                HeartbeatTimeout=round(timeout_s),
                DefaultResult=result,
                **extra,
            )
        with self._lock:
            group = self._autoscaling.autoscaling_groups[name]
            states = self._run_instances(group, size)
            group.desired_capacity = size
            return [self._describe(state) for state in states]

    def build_cluster(self, sizes: Mapping[str, int], **options: Any) -> list[SandboxInstance]:
        """:meth:`create_asg` for each ``{name: size}`` with the same ``options``; all instances, group by
        group."""
        instances: list[SandboxInstance] = []
        for name, size in sizes.items():
            instances.extend(self.create_asg(name, size, **options))
        return instances

    def instances(self, asg_name: str | None = None) -> list[SandboxInstance]:
        """The instances currently in the sandbox's groups (any lifecycle state), or in ``asg_name``'s."""
        with self._lock:
            groups = self._autoscaling.autoscaling_groups
            selected = [groups[asg_name]] if asg_name is not None else list(groups.values())
            return [self._describe(state) for group in selected for state in group.instance_states]

    def lifecycle_state(self, instance_id: str) -> str | None:
        """The instance's Auto Scaling lifecycle state (``InService``, ``Terminating:Wait``...), ``None`` when
        it is in no group."""
        with self._lock:
            state = self._find_state(instance_id)
            return None if state is None else str(state.lifecycle_state)

    def ec2_state(self, instance_id: str) -> str:
        """The instance's EC2 state name (``running``, ``stopped``, ``terminated``...)."""
        with self._lock:
            return str(self._ec2.get_instance(instance_id).state)

    # -------------------------------------------------------------------------------------------- scenarios

    def terminate_instance(self, instance_id: str, *, to_warm_pool: bool = False) -> list[LifecycleAction]:
        """Scale-in of one InService instance ("Amazon EC2 Auto Scaling lifecycle hooks"): the desired
        capacity drops by one; with terminate hooks the instance waits in ``Terminating:Wait`` and one
        action per hook opens (notification published); without, it terminates now and the EC2 state
        changes ``shutting-down`` and ``terminated`` are published. ``to_warm_pool`` makes the destination
        ``WarmPool`` (instance reuse policy): the instance is stopped into the pool instead. Returns the
        opened actions. Raises ``ValueError`` when the instance is not InService in a group."""
        with self._lock:
            state = self._find_state(instance_id)
            if state is None or state.lifecycle_state != "InService":
                where = "in no group" if state is None else state.lifecycle_state
                raise ValueError(f"{instance_id} is not InService in an Auto Scaling group ({where})")
            group = state.auto_scaling_group
            group.desired_capacity = max(0, (group.desired_capacity or 0) - 1)
            destination = "WarmPool" if to_warm_pool else "EC2"
            actions = self._open_actions(state, TERMINATE_TRANSITION, "AutoScalingGroup", destination)
            if not actions:
                self._finish_transition(state, TERMINATE_TRANSITION, destination, "CONTINUE")
            return [action.snapshot() for action in actions]

    def scale_in(self, asg_name: str, count: int) -> list[str]:
        """:meth:`terminate_instance` for the first ``count`` InService instances of the group; their IDs."""
        with self._lock:
            group = self._autoscaling.autoscaling_groups[asg_name]
            chosen = [s.instance.id for s in group.instance_states if s.lifecycle_state == "InService"]
            for instance_id in chosen[:count]:
                self.terminate_instance(instance_id)
            return chosen[:count]

    def on_instance(self, listener: Callable[[SandboxInstance, str], None]) -> None:
        """Call ``listener(instance, event)`` when an instance starts running in a group (``"launched"``: a
        launch into the group, or out of the warm pool into it) or is terminated (``"terminated"``), so the
        Kubernetes side can register or remove its node. Called under the sandbox's lock: the listener must
        be quick and must not call the sandbox."""
        with self._lock:
            self._listeners.append(listener)

    def _notify(self, instance: SandboxInstance, event: str) -> None:
        for listener in self._listeners:
            listener(instance, event)

    def launch_instances(
        self,
        asg_name: str,
        count: int = 1,
        *,
        origin: Literal["EC2", "WarmPool"] = "EC2",
        destination: Literal["AutoScalingGroup", "WarmPool"] = "AutoScalingGroup",
    ) -> list[SandboxInstance]:
        """Scale-out by ``count`` ("Lifecycle hooks for instances in a warm pool"): ``EC2`` to
        ``AutoScalingGroup`` launches new instances into the group, ``EC2`` to ``WarmPool`` into its warm pool,
        ``WarmPool`` to ``AutoScalingGroup`` moves warmed instances into the group (started). With launch
        hooks each instance waits (``Pending:Wait`` / ``Warmed:Pending:Wait``) and one action per hook opens
        and is published; without, it goes ``InService`` (or ``Warmed:<pool state>``, stopped unless the pool
        state set by ``PutWarmPool`` is ``Running``) at once. Warmed instances are listed among the group's
        instances, with their ``Warmed:*`` state (moto has no warm-pool instance list). Raises ``ValueError``
        for another route or too few warmed instances."""
        if (origin, destination) not in _WARM_ROUTES:
            raise ValueError(f"no launch from {origin} to {destination}")
        with self._lock:
            group = self._autoscaling.autoscaling_groups[asg_name]
            if origin == "WarmPool":
                states = [s for s in group.instance_states if s.lifecycle_state.startswith("Warmed:")]
                states = [s for s in states if ":Wait" not in s.lifecycle_state][:count]
                if len(states) < count:
                    raise ValueError(f"{asg_name} has {len(states)} warmed instances, {count} asked")
                stopped = [s.instance.id for s in states if s.instance.state != "running"]
                if stopped:
                    self._ec2.start_instances(stopped)
            else:
                states = self._run_instances(group, count)
            if destination == "AutoScalingGroup":
                group.desired_capacity = (group.desired_capacity or 0) + count
                group.max_size = max(group.max_size or 0, group.desired_capacity)
            for state in states:
                waiting = "Warmed:Pending" if destination == "WarmPool" else "Pending"
                state.lifecycle_state = waiting
                if destination == "AutoScalingGroup":
                    self._notify(self._describe(state), "launched")
                if not self._open_actions(state, LAUNCH_TRANSITION, origin, destination):
                    self._finish_transition(state, LAUNCH_TRANSITION, destination, "CONTINUE")
            return [self._describe(state) for state in states]

    def spot_interruption(self, instance_id: str, *, action: str = "terminate") -> dict[str, Any]:
        """An "EC2 Spot Instance Interruption Warning" (EC2 User Guide, "Spot Instance interruption
        notices"): ``instance-action`` ``terminate``, ``stop`` or ``hibernate``. The event time is backdated
        so that ``time + 120 s`` is when the notice ends; then, ``clock.real(120)`` seconds after this call,
        the instance is really terminated (or stopped), its state changes published and its open lifecycle
        actions cancelled. Returns the published body."""
        return self._notice(
            instance_id,
            "EC2 Spot Instance Interruption Warning",
            SPOT_NOTICE.total_seconds(),
            lambda _end: {"instance-id": instance_id, "instance-action": action},
            stop=action != "terminate",
        )

    def capacity_reservation_interruption(
        self, instance_id: str, *, notice_s: float = 120.0
    ) -> dict[str, Any]:
        """An "EC2 Capacity Reservation Instance Interruption Warning" ("Monitor interruptible Capacity
        Reservations", EC2 User Guide): ``instance-termination-time`` is when the instance is really
        terminated, ``clock.real(notice_s)`` seconds after this call. Returns the published body."""
        zone_id = self._zone_id(instance_id)
        return self._notice(
            instance_id,
            "EC2 Capacity Reservation Instance Interruption Warning",
            notice_s,
            lambda end: {
                "instance-id": instance_id,
                "instance-action": "terminate",
                "instance-termination-time": self._notice_time(end),
                "azId": zone_id,
            },
            stop=False,
        )

    def rebalance_recommendation(self, instance_id: str) -> dict[str, Any]:
        """An "EC2 Instance Rebalance Recommendation" (EC2 User Guide); nothing else happens. Returns the
        published body."""
        zone = self._zone(instance_id)
        return self._publish(
            "aws.ec2",
            "EC2 Instance Rebalance Recommendation",
            {"instance-id": instance_id},
            [f"arn:aws:ec2:{zone}:instance/{instance_id}"],
            _whole_seconds(_utcnow()),
        )

    def publish_state_change(self, instance_id: str, state: str) -> dict[str, Any]:
        """An "EC2 Instance State-change Notification" for ``state`` (``pending``, ``running``, ``stopping``,
        ``stopped``, ``shutting-down``, ``terminated``), without changing the instance. Returns the body."""
        return self._publish(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            {"instance-id": instance_id, "state": state},
            [f"arn:aws:ec2:{self.region}:{ACCOUNT_ID}:instance/{instance_id}"],
            _whole_seconds(_utcnow()),
        )

    def stop_instance(self, instance_id: str) -> None:
        """Stop the instance in EC2 (as ``StopInstances`` would): ``stopping`` and ``stopped`` published."""
        with self._lock:
            self._stop_ec2(instance_id)

    def terminate_ec2_instance(self, instance_id: str) -> None:
        """Terminate the instance in EC2, outside Auto Scaling (as ``TerminateInstances`` would): it leaves
        its group, its open lifecycle actions are cancelled, ``shutting-down`` and ``terminated`` published."""
        with self._lock:
            self._terminate_ec2(instance_id)

    def scheduled_change(
        self,
        instance_ids: Sequence[str],
        *,
        start_in_s: float = 3600.0,
        duration_s: float = 7200.0,
        event_type_code: str = "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
    ) -> dict[str, Any]:
        """One AWS Health ``scheduledChange`` event for EC2 naming every instance of ``instance_ids``
        ("Monitoring AWS Health events with Amazon EventBridge"): ``startTime`` (RFC 1123) is
        ``clock.real(start_in_s)`` from now, ``endTime`` ``duration_s`` simulated seconds later. Nothing
        happens to the instances. Returns the published body."""
        now = _utcnow()
        start = now + timedelta(seconds=self.clock.real(start_in_s))
        end = start + timedelta(seconds=self.clock.real(duration_s))
        arn = f"arn:aws:health:{self.region}::event/EC2/{event_type_code}/{event_type_code}_{uuid.uuid4()}"
        detail = {
            "eventArn": arn,
            "service": "EC2",
            "eventScopeCode": "ACCOUNT_SPECIFIC",
            "communicationId": uuid.uuid4().hex,
            "lastUpdatedTime": format_datetime(now, usegmt=True),
            "statusCode": "upcoming",
            "eventRegion": self.region,
            "eventTypeCode": event_type_code,
            "eventTypeCategory": "scheduledChange",
            "startTime": format_datetime(start, usegmt=True),
            "endTime": format_datetime(end, usegmt=True),
            "eventDescription": [
                {
                    "language": "en_US",
                    "latestDescription": "The sandbox scheduled a change of these instances.",
                }
            ],
            "affectedEntities": [{"entityValue": iid, "status": "PENDING"} for iid in instance_ids],
            "affectedAccount": ACCOUNT_ID,
        }
        return self._publish(
            "aws.health", "AWS Health Event", detail, list(instance_ids), _whole_seconds(now)
        )

    def send_raw(self, queue: str, body: str) -> None:
        """Send ``body`` as it is to ``queue`` (a URL, ARN or name): poison, or any format by hand."""
        with self._lock:
            self._send(_queue_name(queue), body)
            self._published.append(PublishedMessage(_utcnow(), "raw", body, (_queue_name(queue),)))

    # --------------------------------------------------------------------------------------------- record

    def calls(self, instance_id: str | None = None) -> list[LifecycleCall]:
        """Every heartbeat and completion received, in order; only those naming ``instance_id`` (as given or
        through the token) when given."""
        with self._lock:
            if instance_id is None:
                return list(self._calls)
            return [call for call in self._calls if instance_id in self._call_instances(call)]

    def _call_instances(self, call: LifecycleCall) -> set[str | None]:
        """The instances a call names: as given, through the action it reached, through its token."""
        tokens = (call.action_token, call.token)
        return {call.instance_id} | {self._actions[t].instance_id for t in tokens if t in self._actions}

    def actions(
        self, instance_id: str | None = None, *, status: ActionStatus | None = None
    ) -> list[LifecycleAction]:
        """Every lifecycle action opened, oldest first, as it stands (open or final), optionally filtered."""
        with self._lock:
            return [
                a.snapshot()
                for a in self._actions.values()
                if (instance_id is None or a.instance_id == instance_id)
                and (status is None or a.status == status)
            ]

    def action(self, token: str) -> LifecycleAction:
        """The action of ``token``; raises ``KeyError`` when unknown."""
        with self._lock:
            return self._actions[token].snapshot()

    def wait_for_action(self, token: str, timeout_s: float = 10.0) -> LifecycleAction:
        """Wait (real seconds) until the action of ``token`` has ended; its final state. Raises
        ``TimeoutError``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            action = self._actions[token]
            while not self._expire(action):
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError(f"lifecycle action {token} still open after {timeout_s} s")
                self._changed.wait(min(deadline, action.deadline, action.global_deadline) - now + 0.001)
            return action.snapshot()

    def published(self) -> list[PublishedMessage]:
        """Every body published, in order."""
        with self._lock:
            return list(self._published)

    # --------------------------------------------------------------------------------- lifecycle internals

    def _configure_hook(
        self,
        asg_name: str,
        hook_name: str,
        *,
        notification_target_arn: str | None,
        notification_metadata: str | None,
        role_arn: str | None,
    ) -> None:
        """Keep what moto's ``PutLifecycleHook`` drops or invents; send the test notification to an SQS
        target."""
        with self._lock:
            hook = self._autoscaling.lifecycle_hooks[f"{asg_name}_{hook_name}"]
            hook.notification_target_arn = notification_target_arn
            hook.notification_metadata = notification_metadata
            hook.role_arn = role_arn
            hook.global_timeout = int(min(MAX_GLOBAL_TIMEOUT_S, 100 * hook.heartbeat_timeout))
            if notification_target_arn and ":sqs:" in notification_target_arn:
                group = self._autoscaling.autoscaling_groups[asg_name]
                test = {
                    "AccountId": ACCOUNT_ID,
                    "RequestId": str(uuid.uuid4()),
                    "AutoScalingGroupARN": group.arn,
                    "AutoScalingGroupName": asg_name,
                    "Service": "AWS Auto Scaling",
                    "Event": "autoscaling:TEST_NOTIFICATION",
                    "Time": _milliseconds(_utcnow()),
                }
                self._send_direct(notification_target_arn, test)

    def _open_actions(self, state: Any, transition: str, origin: str, destination: str) -> list[_Action]:
        """One action per hook of ``transition``; the instance waits; every action is published."""
        hooks = [
            hook
            for hook in self._autoscaling.lifecycle_hooks.values()
            if hook.auto_scaling_group_name == state.auto_scaling_group_name
            and hook.lifecycle_transition == transition
        ]
        if not hooks:
            return []
        prefix = {"Pending": "Pending", "Warmed:Pending": "Warmed:Pending"}.get(
            state.lifecycle_state, "Terminating"
        )
        state.lifecycle_state = f"{prefix}:Wait"
        now, mono = _utcnow(), time.monotonic()
        episode: list[_Action] = []
        for hook in hooks:
            heartbeat_s = float(hook.heartbeat_timeout)
            global_s = min(MAX_GLOBAL_TIMEOUT_S, 100 * heartbeat_s)
            action = _Action(
                token=str(uuid.uuid4()),
                instance_id=state.instance.id,
                asg_name=state.auto_scaling_group_name,
                hook_name=hook.name,
                transition=transition,
                origin=origin,
                destination=destination,
                default_result=hook.default_result,
                heartbeat_timeout_s=heartbeat_s,
                global_timeout_s=global_s,
                notification_target_arn=getattr(hook, "notification_target_arn", None),
                notification_metadata=getattr(hook, "notification_metadata", None),
                started_at=now,
                deadline=mono + self.clock.real(heartbeat_s),
                global_deadline=mono + self.clock.real(global_s),
                episode=episode,
            )
            episode.append(action)
            self._actions[action.token] = action
            self._open[action.token] = action
            self._arm(action)
        for action in episode:
            self._publish_action(action, state.auto_scaling_group.arn)
        return episode

    def _arm(self, action: _Action) -> None:
        if self._timers is None:
            return
        generation, token = self._generation, action.token
        self._timers.call_at(
            min(action.deadline, action.global_deadline), lambda: self._on_deadline(token, generation)
        )

    def _on_deadline(self, token: str, generation: int) -> None:
        with self._lock:
            action = self._open.get(token)
            if generation != self._generation or action is None:
                return
            if not self._expire(action):
                self._arm(action)  # a heartbeat moved the deadline

    def _expire(self, action: _Action) -> bool:
        """Time the action out when a deadline has passed (whether or not its timer has fired yet)."""
        if action.status == "open" and time.monotonic() >= min(action.deadline, action.global_deadline):
            self._end(action, "timed-out", action.default_result)
            return True
        return action.status != "open"

    def _lifecycle_call(
        self,
        operation: Operation,
        *,
        asg_name: str,
        hook_name: str,
        token: str | None,
        instance_id: str | None,
        result: str | None,
    ) -> None:
        """Serve a heartbeat or completion, record it, raise moto's ``ValidationError`` as AWS answers."""
        with self._lock:
            matched: _Action | None = None
            outcome = "InternalFailure"
            try:
                self._raise_injected(operation)
                if operation == "CompleteLifecycleAction" and result not in ("CONTINUE", "ABANDON"):
                    raise ValidationError("LifecycleActionResult must be CONTINUE or ABANDON")
                matched = self._find_active(asg_name, hook_name, token, instance_id)
                if operation == "RecordLifecycleActionHeartbeat":
                    matched.heartbeats += 1
                    restarted = time.monotonic() + self.clock.real(matched.heartbeat_timeout_s)
                    matched.deadline = min(restarted, matched.global_deadline)
                else:
                    self._end(matched, "completed", "CONTINUE" if result == "CONTINUE" else "ABANDON")
                outcome = "ok"
            except AutoscalingClientError as error:
                outcome = f"{error.code}: {error.message}"
                raise
            finally:
                reached = matched.token if matched is not None and outcome == "ok" else None
                call = LifecycleCall(
                    operation, _utcnow(), asg_name, hook_name, token, instance_id, result, outcome, reached
                )
                self._calls.append(call)
                self._changed.notify_all()

    def _find_active(
        self, asg_name: str, hook_name: str, token: str | None, instance_id: str | None
    ) -> _Action:
        if not token and not instance_id:
            raise ValidationError("Either LifecycleActionToken or InstanceId must be specified")
        for action in list(self._open.values()):
            if (
                action.asg_name == asg_name
                and action.hook_name == hook_name
                and (not token or action.token == token)
                and (not instance_id or action.instance_id == instance_id)
                and not self._expire(action)
            ):
                return action
        if token:
            raise ValidationError(f"No active Lifecycle Action found with token {token}")
        raise ValidationError(f"No active Lifecycle Action found with instance ID {instance_id}")

    def _end(self, action: _Action, status: ActionStatus, result: Result | None) -> None:
        """End one action; once its whole episode (every hook of the transition) has ended, the instance
        proceeds with ABANDON when any ended so, else CONTINUE."""
        action.status, action.result, action.ended_at = status, result, _utcnow()
        self._open.pop(action.token, None)
        if result == "ABANDON":
            for other in action.episode:
                if other.status == "open":
                    other.status, other.ended_at = "cancelled", action.ended_at
                    self._open.pop(other.token, None)
        self._changed.notify_all()
        if status == "cancelled" or any(other.status == "open" for other in action.episode):
            return
        outcome: Result = (
            "ABANDON" if any(other.result == "ABANDON" for other in action.episode) else "CONTINUE"
        )
        state = self._find_state(action.instance_id)
        if state is not None:
            self._finish_transition(state, action.transition, action.destination, outcome)

    def _finish_transition(self, state: Any, transition: str, destination: str, outcome: Result) -> None:
        """Where the instance goes once its transition's actions have ended (or when there were none)."""
        instance_id = state.instance.id
        if transition == LAUNCH_TRANSITION and outcome == "CONTINUE":
            if destination == "WarmPool":
                self._to_warm_pool(state)
            else:
                state.lifecycle_state = "InService"
        elif transition == TERMINATE_TRANSITION and destination == "WarmPool":
            self._to_warm_pool(state)
        else:  # terminate (CONTINUE or ABANDON), or a launch abandoned
            self._terminate_ec2(instance_id)

    def _to_warm_pool(self, state: Any) -> None:
        warm_pool = state.auto_scaling_group.warm_pool
        pool_state = warm_pool.pool_state if warm_pool is not None else "Stopped"
        state.lifecycle_state = f"Warmed:{pool_state}"
        if pool_state != "Running":
            self._stop_ec2(state.instance.id)

    # ------------------------------------------------------------------------------------- EC2 internals

    def _run_instances(self, group: Any, count: int) -> list[Any]:
        """``count`` new instances in ``group``, round-robin over its zones (moto's own launch, one zone at a
        time). Called under the lock."""
        zones = list(group.availability_zones)
        before = len(group.instance_states)
        try:
            for index, zone in enumerate(zones):
                share = count // len(zones) + (1 if index < count % len(zones) else 0)
                if share:
                    group.availability_zones = [zone]
                    group.replace_autoscaling_group_instances(share, group.get_propagated_tags())
        finally:
            group.availability_zones = zones
        return list(group.instance_states[before:])

    def _find_state(self, instance_id: str) -> Any:
        for group in self._autoscaling.autoscaling_groups.values():
            for state in group.instance_states:
                if state.instance.id == instance_id:
                    return state
        return None

    def _describe(self, state: Any) -> SandboxInstance:
        instance = state.instance
        zone = instance.placement.zone
        return SandboxInstance(
            instance_id=instance.id,
            private_dns_name=instance.private_dns_name,
            private_ip_address=instance.private_ip,
            availability_zone=zone,
            provider_id=f"aws:///{zone}/{instance.id}",
            asg_name=state.auto_scaling_group_name,
        )

    def _zone(self, instance_id: str) -> str:
        with self._lock:
            return str(self._ec2.get_instance(instance_id).placement.zone)

    def _zone_id(self, instance_id: str) -> str:
        with self._lock:
            zone = self._ec2.get_zone_by_name(self._zone(instance_id))
            return str(zone.zone_id) if zone is not None else ""

    def _terminate_ec2(self, instance_id: str) -> None:
        """Out of its group, its open actions cancelled, terminated in EC2, state changes published, listeners
        told."""
        state = self._find_state(instance_id)
        described = self._describe(state) if state is not None else None
        for group in self._autoscaling.autoscaling_groups.values():
            if any(s.instance.id == instance_id for s in group.instance_states):
                group.instance_states = [s for s in group.instance_states if s.instance.id != instance_id]
        for action in [a for a in self._open.values() if a.instance_id == instance_id]:
            action.status, action.ended_at = "cancelled", _utcnow()
            self._open.pop(action.token, None)
        instance = self._ec2.get_instance(instance_id)
        if instance.state == "terminated":
            return
        self._ec2.terminate_instances([instance_id])
        self.publish_state_change(instance_id, "shutting-down")
        self.publish_state_change(instance_id, "terminated")
        if described is not None:
            self._notify(described, "terminated")
        self._changed.notify_all()

    def _stop_ec2(self, instance_id: str) -> None:
        if self._ec2.get_instance(instance_id).state in ("stopped", "terminated"):
            return
        self._ec2.stop_instances([instance_id])
        self.publish_state_change(instance_id, "stopping")
        self.publish_state_change(instance_id, "stopped")

    # ----------------------------------------------------------------------------------------- publishing

    def _notice_time(self, moment: datetime) -> str:
        """A notice time: whole seconds in real time, milliseconds under a scaled clock (module docstring)."""
        return _whole_seconds(moment) if self.clock.scale == 1.0 else _milliseconds(moment)

    def _notice(
        self,
        instance_id: str,
        detail_type: str,
        notice_s: float,
        detail: Callable[[datetime], dict[str, Any]],
        *,
        stop: bool,
    ) -> dict[str, Any]:
        """Publish a notice of ``notice_s`` simulated seconds and act when it ends."""
        real_s = self.clock.real(notice_s)
        end = _utcnow() + timedelta(seconds=real_s)
        published = end - timedelta(seconds=notice_s)
        if self.clock.scale == 1.0:  # whole seconds, as EventBridge: act when time + notice says
            published = published.replace(microsecond=0)
            end = published + timedelta(seconds=notice_s)
        zone = self._zone(instance_id)
        body = self._publish(
            "aws.ec2",
            detail_type,
            detail(end),
            [f"arn:aws:ec2:{zone}:instance/{instance_id}"],
            self._notice_time(published),
        )
        generation = self._generation
        delay = max(0.0, (end - _utcnow()).total_seconds())

        def act() -> None:
            with self._lock:
                if generation != self._generation:
                    return
                if stop:
                    self._stop_ec2(instance_id)
                else:
                    self._terminate_ec2(instance_id)

        if self._timers is not None:
            self._timers.call_at(time.monotonic() + delay, act)
        return body

    def _publish_action(self, action: _Action, group_arn: str) -> None:
        """A lifecycle action's notification: to EventBridge, and straight to the hook's SQS target."""
        detail: dict[str, Any] = {
            "LifecycleActionToken": action.token,
            "AutoScalingGroupName": action.asg_name,
            "LifecycleHookName": action.hook_name,
            "EC2InstanceId": action.instance_id,
            "LifecycleTransition": action.transition,
            "Origin": action.origin,
            "Destination": action.destination,
        }
        if action.notification_metadata is not None:
            detail["NotificationMetadata"] = action.notification_metadata
        detail_type = (
            "EC2 Instance-terminate Lifecycle Action"
            if action.transition == TERMINATE_TRANSITION
            else "EC2 Instance-launch Lifecycle Action"
        )
        self._publish("aws.autoscaling", detail_type, detail, [group_arn], _whole_seconds(action.started_at))
        if action.notification_target_arn and ":sqs:" in action.notification_target_arn:
            direct = {
                "Origin": action.origin,
                "LifecycleHookName": action.hook_name,
                "Destination": action.destination,
                "AccountId": ACCOUNT_ID,
                "RequestId": str(uuid.uuid4()),
                "LifecycleTransition": action.transition,
                "AutoScalingGroupName": action.asg_name,
                "Service": "AWS Auto Scaling",
                "Time": _milliseconds(action.started_at),
                "EC2InstanceId": action.instance_id,
                "LifecycleActionToken": action.token,
            }
            if action.notification_metadata is not None:
                direct["NotificationMetadata"] = action.notification_metadata
            self._send_direct(action.notification_target_arn, direct)

    def _send_direct(self, target_arn: str, body: Mapping[str, Any]) -> None:
        text = json.dumps(body)
        name = _queue_name(target_arn)
        self._send(name, text)
        self._published.append(PublishedMessage(_utcnow(), "direct", text, (name,)))

    def _publish(
        self, source: str, detail_type: str, detail: dict[str, Any], resources: list[str], event_time: str
    ) -> dict[str, Any]:
        """Put one event on the default bus: every enabled rule whose pattern matches (moto's matcher)
        sends the EventBridge body to its SQS targets. Returns the body."""
        event: dict[str, Any] = {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": detail_type,
            "source": source,
            "account": ACCOUNT_ID,
            "time": event_time,
            "region": self.region,
            "resources": resources,
            "detail": detail,
        }
        text = json.dumps(event)
        queues: list[str] = []
        with self._lock:
            for rule in self._rules():
                if (
                    rule.state != "ENABLED"
                    or rule.scheduled_expression
                    or not rule.event_pattern.matches_event(event)
                ):
                    continue
                for target in rule.targets:
                    if ":sqs:" in target["Arn"] and not target.get("InputTransformer"):
                        queues.append(_queue_name(target["Arn"]))
                        self._send(queues[-1], text)
            self._published.append(PublishedMessage(_utcnow(), "eventbridge", text, tuple(queues)))
        return event

    def _rules(self) -> Iterator[Any]:
        bus = self._events.event_buses.get("default")
        return iter(list(bus.rules.values())) if bus is not None else iter(())

    def _send(self, queue_name: str, body: str) -> None:
        try:
            self._sqs.send_message(queue_name=queue_name, message_body=body)
        except Exception:  # a rule or hook pointing at a deleted queue: AWS drops the delivery too
            log.warning("aws sandbox: no queue %s for a delivery", queue_name)
