"""The sandbox's AWS as one object: :class:`AwsSandbox`, which ties moto's patched server, the lifecycle
actions and EventBridge delivery together and plays the scenarios.

It starts :class:`~queue_processor_sandbox.aws.moto_server.MotoServer` (with the patches of
:mod:`~queue_processor_sandbox.aws.moto_server` installed), builds queues, rules and Auto Scaling groups over
HTTP as a user would, moves instances between lifecycle states (launches, terminations, the warm pool) once
:class:`~queue_processor_sandbox.aws.lifecycle.LifecycleActions` has settled their actions, and publishes the
documented event formats through :class:`~queue_processor_sandbox.aws.eventbridge.Delivery`. The package
docstring describes the behaviour as a whole.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from email.utils import format_datetime
from types import TracebackType
from typing import Any, Literal, Self

import botocore.session
from moto.autoscaling.exceptions import ValidationError
from moto.autoscaling.models import TerminateInstanceActivity
from moto.backends import get_backend
from moto.core.utils import utcnow as moto_utcnow
from moto.moto_api._internal.models import moto_api_backend

from queue_processor.events import SPOT_NOTICE, EventKind
from queue_processor_sandbox.aws.eventbridge import STANDARD_RULES, Delivery, PublishedMessage
from queue_processor_sandbox.aws.lifecycle import (
    ActionState,
    LifecycleAction,
    LifecycleActions,
    LifecycleCall,
    Schedule,
)
from queue_processor_sandbox.aws.model import (
    ACCOUNT_ID,
    DEFAULT_REGION,
    DEFAULT_ZONES,
    IMAGE_ID,
    LAUNCH_HOOK,
    LAUNCH_TRANSITION,
    MANAGED_TAG,
    MAX_GLOBAL_TIMEOUT_S,
    TERMINATE_HOOK,
    TERMINATE_TRANSITION,
    ActionStatus,
    ClientKwargs,
    QueueCounts,
    Result,
    SandboxInstance,
    SandboxQueue,
    milliseconds,
    utcnow,
    whole_seconds,
)
from queue_processor_sandbox.aws.moto_server import (
    Faults,
    MotoServer,
    active,
    forget_instances,
    install,
    uninstall,
)
from queue_processor_sandbox.clock import SandboxClock

__all__ = ["AwsSandbox"]

_FAKE_KEY = "testing"

_WARM_ROUTES = {
    ("EC2", "AutoScalingGroup"),
    ("EC2", "WarmPool"),
    ("WarmPool", "AutoScalingGroup"),
}


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
        self._server: MotoServer | None = None
        self._endpoint: str | None = None
        self._botocore: botocore.session.Session | None = None
        self._clients: dict[str, Any] = {}
        self._timer_errors: list[BaseException] = []
        self._listeners: list[Callable[[SandboxInstance, str], None]] = []
        self._schedule = Schedule(self._timer_errors)
        self._notices_pending: Counter[str] = Counter()  # instance → its notices that have not ended yet
        self._faults = Faults(self._lock)
        self._delivery = Delivery(self._lock, region)
        self._lifecycle = LifecycleActions(
            self._lock,
            self._changed,
            self.clock,
            self._schedule,
            raise_injected=self._faults.raise_injected,
            publish=self._delivery.publish_action,
            settle=self._settle,
            held=self._delivery.held,
        )
        self._served = _Served(self)

    # ------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        """Reset moto's state, start the server and the timer thread, add the lifecycle actions to moto."""
        if self._server is not None:
            return self
        install(self._served)
        try:
            moto_api_backend.reset()
            self._server = MotoServer(self._lock, faults=self._faults)
            self._server.start()
            host, port = self._server.get_host_and_port()
            self._endpoint = f"http://{host}:{port}"
            self._schedule.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the timers, the server and every thread they started (a request still being served, such as
        an SQS long poll, gets 5 s to end); reset moto's state. Idempotent."""
        if active() is not self._served:
            return
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self._endpoint = None
        self._schedule.stop()
        self._notices_pending.clear()
        if self._server is not None:
            self._server.stop()
            self._server = None
        with self._lock:
            self._schedule.generation += 1
            self._lifecycle.close()
        moto_api_backend.reset()
        uninstall(self._served)

    def stop_endpoint(self) -> None:
        """An outage: the endpoint stops answering (new connections refused, open ones shut down, a request
        being served gets 1 s to end) while moto's state, the lifecycle actions and their timers go on.
        :meth:`restart_endpoint` ends it. Raises ``RuntimeError`` when the sandbox is not started."""
        if self._server is None or self._endpoint is None:
            raise RuntimeError("the AWS sandbox is not started")
        self._server.stop(timeout_s=1.0)

    def restart_endpoint(self) -> None:
        """End the outage :meth:`stop_endpoint` began: serve again on the same address (``endpoint_url``
        unchanged). Raises ``RuntimeError`` when the sandbox is not started."""
        if self._server is None or self._endpoint is None:
            raise RuntimeError("the AWS sandbox is not started")
        port = int(self._endpoint.rsplit(":", 1)[1])
        self._server = MotoServer(self._lock, port, self._faults)
        self._server.start()

    def __enter__(self) -> Self:
        return self.start()

    def inject_error(
        self,
        operation: Literal[
            "DescribeLifecycleHooks",
            "RecordLifecycleActionHeartbeat",
            "CompleteLifecycleAction",
            "DeleteMessageBatch",
            "ChangeMessageVisibility",
            "ChangeMessageVisibilityBatch",
        ],
        code: str,
        message: str,
        *,
        seconds: float | None = None,
        times: int | None = None,
        status: int = 400,
    ) -> None:
        """Answer ``operation`` with the AWS error ``code``/``message`` (HTTP 400, as Auto Scaling's Query API
        answers ``Throttling`` or ``AccessDenied``) for the next ``seconds`` real seconds, or the next
        ``times`` calls, or (neither given) until :meth:`clear_errors`. A failed heartbeat or completion is
        recorded in :meth:`calls` with ``outcome`` ``"<code>: <message>"``. ``status`` 500 or more answers
        as the service failing (``InternalFailure`` / ``ServiceUnavailable``): the endpoint answers before
        the call is served, so such a call is not in :meth:`calls`. SQS's settlement calls (``DeleteMessageBatch``,
        ``ChangeMessageVisibility``, ``ChangeMessageVisibilityBatch``) take a 5xx only (``InternalError``)."""
        self._faults.add(operation, code, message, seconds=seconds, times=times, status=status)

    def pending_errors(self) -> dict[str, int]:
        """Calls still to be answered with an error :meth:`inject_error` set up (for a number of calls), by
        operation: empty once every such error was met."""
        return self._faults.pending()

    def clear_errors(self) -> None:
        """Forget every error :meth:`inject_error` set up."""
        self._faults.clear()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def reset(self) -> None:
        """Forget everything: moto's state (groups, instances, queues, rules), lifecycle actions, pending
        timers and the record. The server keeps running; use between independent tests."""
        with self._lock:
            self._schedule.generation += 1
            self._schedule.clear()
            self._notices_pending.clear()
            self._lifecycle.clear()
            self._delivery.clear()
            self._timer_errors.clear()
            moto_api_backend.reset()
            forget_instances()

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

    def queue_counts(self, queue: SandboxQueue) -> QueueCounts:
        """``queue``'s :class:`QueueCounts`, read over HTTP with ``GetQueueAttributes`` (approximate, as SQS
        says: a message sent or received a moment ago may not be counted yet). Raises botocore's errors."""
        sqs = self.client("sqs")
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        counts = sqs.get_queue_attributes(QueueUrl=queue.url, AttributeNames=names)["Attributes"]
        dlq = sqs.get_queue_attributes(QueueUrl=queue.dlq_url, AttributeNames=names[:1])["Attributes"]
        return QueueCounts(int(counts[names[0]]), int(counts[names[1]]), int(dlq[names[0]]))

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

    def warm_descriptions(self, instance_ids: Sequence[str], *, batch: int = 200) -> None:
        """DescribeInstances of ``instance_ids`` through the endpoint, ``batch`` at a time (an ``instance-id``
        filter, as the controller asks), so that the first description of each is kept before a benchmark's
        clock starts. moto's first description of an instance costs about 1.5 ms of the sandbox's one core
        (:func:`~queue_processor_sandbox.aws.moto_server._serialize_structure`); EC2 itself has no such cost,
        and in a storm's first second it delayed every replica's node resolution. Raises what botocore raises."""
        ec2 = self.client("ec2")
        for start in range(0, len(instance_ids), batch):
            ids = list(instance_ids[start : start + batch])
            ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": ids}])

    # -------------------------------------------------------------------------------------------- scenarios

    def terminate_instance(self, instance_id: str, *, to_warm_pool: bool = False) -> list[LifecycleAction]:
        """Scale-in of one InService instance ("Amazon EC2 Auto Scaling lifecycle hooks"): the desired
        capacity drops by one; with terminate hooks the instance waits in ``Terminating:Wait`` and one
        action per hook opens (notification published); without, it terminates now and the EC2 state
        changes ``shutting-down`` and ``terminated`` are published. ``to_warm_pool`` makes the destination
        ``WarmPool`` (instance reuse policy): the instance is stopped into the pool instead. Returns the
        opened actions. Raises ``ValueError`` when the instance is not InService in a group.

        ``TerminateInstanceInAutoScalingGroup``, ``SetDesiredCapacity`` and ``UpdateAutoScalingGroup`` sent
        over HTTP to a group with a terminate hook take the same path (:meth:`_terminate_in_group`,
        :meth:`_scale_in_to`)."""
        with self._lock:
            state = self._find_state(instance_id)
            if state is None or state.lifecycle_state != "InService":
                where = "in no group" if state is None else state.lifecycle_state
                raise ValueError(f"{instance_id} is not InService in an Auto Scaling group ({where})")
            group = state.auto_scaling_group
            group.desired_capacity = max(0, (group.desired_capacity or 0) - 1)
            destination = "WarmPool" if to_warm_pool else "EC2"
            return [action.snapshot() for action in self._begin_termination(state, destination)]

    def scale_in(self, asg_name: str, count: int) -> list[str]:
        """:meth:`terminate_instance` for ``count`` InService instances of the group (the first ones not
        protected from scale-in, as :meth:`_scale_in_choice` picks them); their IDs."""
        with self._lock:
            group = self._autoscaling.autoscaling_groups[asg_name]
            chosen = [state.instance.id for state in self._scale_in_choice(group, count)]
            for instance_id in chosen:
                self.terminate_instance(instance_id)
            return chosen

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
                    self._start(stopped)
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
        return self._delivery.publish(
            "aws.ec2",
            "EC2 Instance Rebalance Recommendation",
            {"instance-id": instance_id},
            [f"arn:aws:ec2:{zone}:instance/{instance_id}"],
            whole_seconds(utcnow()),
        )

    def publish_state_change(self, instance_id: str, state: str) -> dict[str, Any]:
        """An "EC2 Instance State-change Notification" for ``state`` (``pending``, ``running``, ``stopping``,
        ``stopped``, ``shutting-down``, ``terminated``), without changing the instance. Returns the body."""
        return self._delivery.publish(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            {"instance-id": instance_id, "state": state},
            [f"arn:aws:ec2:{self.region}:{ACCOUNT_ID}:instance/{instance_id}"],
            whole_seconds(utcnow()),
        )

    def stop_instance(self, instance_id: str) -> None:
        """Stop the instance in EC2 (as ``StopInstances`` would): ``stopping`` and ``stopped`` published."""
        with self._lock:
            self._stop_ec2(instance_id)

    def start_instance(self, instance_id: str) -> None:
        """Start a stopped instance in EC2 (as ``StartInstances`` would, or EC2 restarting a stopped Spot
        instance when capacity returns): ``running`` again with a new ``LaunchTime`` (EC2 reports the last
        start), ``pending`` and ``running`` published (the standard rules do not forward them). Its node stays
        registered and Ready throughout (the sandbox does not model a stopped kubelet). Raises ``ValueError``
        when the instance is not stopped."""
        with self._lock:
            state = self._ec2.get_instance(instance_id).state
            if state != "stopped":
                raise ValueError(f"{instance_id} is {state}, not stopped")
            self._start([instance_id])
            self.publish_state_change(instance_id, "pending")
            self.publish_state_change(instance_id, "running")

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
        now = utcnow()
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
        return self._delivery.publish(
            "aws.health", "AWS Health Event", detail, list(instance_ids), whole_seconds(now)
        )

    def send_raw(self, queue: str, body: str) -> None:
        """Send ``body`` as it is to ``queue`` (a URL, ARN or name): poison, or any format by hand."""
        self._delivery.send_raw(queue, body)

    # --------------------------------------------------------------------------------------------- record

    def calls(self, instance_id: str | None = None) -> list[LifecycleCall]:
        """Every heartbeat and completion received, in order; only those naming ``instance_id`` (as given or
        through the token) when given."""
        return self._lifecycle.calls(instance_id)

    def actions(
        self, instance_id: str | None = None, *, status: ActionStatus | None = None
    ) -> list[LifecycleAction]:
        """Every lifecycle action opened, oldest first, as it stands (open or final), optionally filtered."""
        return self._lifecycle.actions(instance_id, status=status)

    def action(self, token: str) -> LifecycleAction:
        """The action of ``token``; raises ``KeyError`` when unknown."""
        return self._lifecycle.action(token)

    def wait_for_action(self, token: str, timeout_s: float = 10.0) -> LifecycleAction:
        """Wait (real seconds) until the action of ``token`` has ended; its final state. Raises
        ``TimeoutError``."""
        return self._lifecycle.wait_for_action(token, timeout_s)

    def notices_pending(self) -> int:
        """How many instances have a Spot or Capacity Reservation notice that has not ended yet (their
        termination, and the state changes it publishes, are still to come)."""
        with self._lock:
            return len(self._notices_pending)

    def published(self) -> list[PublishedMessage]:
        """Every body published, in order."""
        return self._delivery.published()

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
                    "Time": milliseconds(utcnow()),
                }
                self._delivery.send_direct(notification_target_arn, test)

    def _open_actions(self, state: Any, transition: str, origin: str, destination: str) -> list[ActionState]:
        """One action per hook of ``transition``; the instance waits; every action is published."""
        return self._lifecycle.open(
            state, self._autoscaling.lifecycle_hooks.values(), transition, origin, destination
        )

    def _settle(self, action: ActionState, outcome: Result) -> None:
        """The last action of an instance's transition has ended: the instance proceeds with ``outcome``."""
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

    # ------------------------------------------------------------------------------------ scale-in internals

    def _begin_termination(self, state: Any, destination: str) -> list[ActionState]:
        """The terminate transition of one instance (the desired capacity is the caller's business): with
        terminate hooks it waits in ``Terminating:Wait`` and one action per hook opens and is published;
        without, it goes to ``destination`` (``EC2``: terminated, ``WarmPool``: stopped into the pool) at once.
        Returns the opened actions. Called under the lock."""
        actions = self._open_actions(state, TERMINATE_TRANSITION, "AutoScalingGroup", destination)
        if not actions:
            self._finish_transition(state, TERMINATE_TRANSITION, destination, "CONTINUE")
        return actions

    def _scale_in_choice(self, group: Any, count: int) -> list[Any]:
        """The instances a scale-in of ``count`` removes from ``group``: its first ``count`` InService
        instances not protected from scale-in (the sandbox's stand-in for the default termination policy;
        AWS never picks a protected instance). moto's instance states; called under the lock."""
        eligible = [
            state
            for state in group.instance_states
            if state.lifecycle_state == "InService" and not state.protected_from_scale_in
        ]
        return eligible[: max(0, count)]

    def _has_terminate_hook(self, group: Any) -> bool:
        """Whether ``group`` is one of the sandbox's region and has an ``autoscaling:EC2_INSTANCE_TERMINATING``
        lifecycle hook. Called under the lock."""
        backend = self._autoscaling
        return backend.autoscaling_groups.get(group.name) is group and any(
            hook.auto_scaling_group_name == group.name and hook.lifecycle_transition == TERMINATE_TRANSITION
            for hook in backend.lifecycle_hooks.values()
        )

    def _terminate_in_group(self, instance_id: str, should_decrement: bool) -> Any | None:
        """``TerminateInstanceInAutoScalingGroup`` (EC2 Auto Scaling API Reference) for an instance whose group
        has a terminate hook, as :meth:`terminate_instance` does it: the instance waits in
        ``Terminating:Wait``, one action per hook opens and is published, the hook's heartbeat timeout
        (simulated seconds) runs. ``should_decrement`` lowers the desired capacity by one; otherwise it is kept
        and moto's own capacity check then launches a replacement (moto's launch: no launch hook, no
        listener told). Returns moto's ``TerminateInstanceActivity`` (the answer's ``Activity``), or ``None``
        when the instance is in no group of the sandbox's region or its group has no terminate hook (moto's own
        behaviour applies). Raises moto's ``ValidationError`` (HTTP 400) when the instance is neither
        InService nor Standby (already terminating, pending, warmed)."""
        with self._lock:
            state = self._find_state(instance_id)
            if state is None or not self._has_terminate_hook(state.auto_scaling_group):
                return None
            if state.lifecycle_state not in ("InService", "Standby"):
                raise ValidationError(f"The instance {instance_id} is not in InService or Standby.")
            group = state.auto_scaling_group
            original = group.desired_capacity
            if should_decrement:
                group.desired_capacity = max(0, (original or 0) - 1)
            self._begin_termination(state, "EC2")
            group.set_desired_capacity(group.desired_capacity)  # moto's: a replacement if capacity was kept
            return TerminateInstanceActivity(state.instance, original)

    def _scale_in_to(self, group: Any, desired: int) -> bool:
        """Lower ``group``'s desired capacity to ``desired`` instances through its terminate hook, as
        :meth:`scale_in` does (``SetDesiredCapacity`` and ``UpdateAutoScalingGroup`` lowering
        ``DesiredCapacity`` or ``MaxSize``, EC2 Auto Scaling API Reference): the desired capacity becomes
        ``desired``; the InService instances beyond it that :meth:`_scale_in_choice` picks each wait in
        ``Terminating:Wait`` with one action per hook opened and published. Instances protected from
        scale-in stay (the group may then stay above ``desired``). Returns ``False``, changing nothing, when
        this is not a scale-in through a hook: ``desired`` is not below the InService count, the group has no
        terminate hook or is not of the sandbox's region, or it has a mixed instances policy with overrides
        (moto counts weighted capacity there); moto's own ``set_desired_capacity`` then applies. Called
        under the lock (moto's request is served under it)."""
        with self._lock:
            policy = group.mixed_instances_policy or {}
            if policy.get("LaunchTemplate", {}).get("Overrides") or not self._has_terminate_hook(group):
                return False
            surplus = len(group.active_instances()) - desired
            if surplus <= 0:
                return False
            group.desired_capacity = desired
            for state in self._scale_in_choice(group, surplus):
                self._begin_termination(state, "EC2")
            return True

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

    def _start(self, instance_ids: list[str]) -> None:
        """EC2 StartInstances as EC2 answers it afterwards: ``LaunchTime`` is the start's time (EC2 reports an
        instance's most recent launch, "Stop and start Amazon EC2 instances"; moto keeps the first). Called
        under the lock."""
        self._ec2.start_instances(instance_ids)
        for instance_id in instance_ids:
            self._ec2.get_instance(instance_id).launch_time = moto_utcnow()

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
        self._lifecycle.cancel(instance_id)
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
        """A notice time: whole seconds in real time, milliseconds under a scaled clock (package docstring)."""
        return whole_seconds(moment) if self.clock.scale == 1.0 else milliseconds(moment)

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
        end = utcnow() + timedelta(seconds=real_s)
        published = end - timedelta(seconds=notice_s)
        if self.clock.scale == 1.0:  # whole seconds, as EventBridge: act when time + notice says
            published = published.replace(microsecond=0)
            end = published + timedelta(seconds=notice_s)
        zone = self._zone(instance_id)
        body = self._delivery.publish(
            "aws.ec2",
            detail_type,
            detail(end),
            [f"arn:aws:ec2:{zone}:instance/{instance_id}"],
            self._notice_time(published),
        )
        generation = self._schedule.generation
        delay = max(0.0, (end - utcnow()).total_seconds())
        with self._lock:
            self._notices_pending[instance_id] += 1

        def act() -> None:
            with self._lock:
                self._notices_pending[instance_id] -= 1
                if self._notices_pending[instance_id] <= 0:
                    del self._notices_pending[instance_id]
                if generation != self._schedule.generation:
                    return
                if stop:
                    self._stop_ec2(instance_id)
                else:
                    self._terminate_ec2(instance_id)

        self._schedule.call_at(time.monotonic() + delay, act)
        return body


class _Served:
    """What the patched moto actions ask of an :class:`AwsSandbox` (:class:`~.moto_server.ServedActions`):
    the sandbox's own lifecycle, scale-in and fault internals, behind the protocol the patches are written
    against."""

    def __init__(self, sandbox: AwsSandbox) -> None:
        self.raise_injected = sandbox._faults.raise_injected
        self.real_seconds = sandbox.clock.real
        self.configure_hook = sandbox._configure_hook
        self.lifecycle_call = sandbox._lifecycle.serve
        self.terminate_in_group = sandbox._terminate_in_group
        self.scale_in_to = sandbox._scale_in_to
