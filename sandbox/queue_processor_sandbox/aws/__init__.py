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

- Scale-in requests through terminate hooks: ``TerminateInstanceInAutoScalingGroup`` (``InstanceId``,
  ``ShouldDecrementDesiredCapacity``), and ``SetDesiredCapacity`` and ``UpdateAutoScalingGroup`` when they lower
  the capacity (``DesiredCapacity``, or ``MaxSize`` below it), sent to a group with a terminate hook, put each
  instance they remove in ``Terminating:Wait`` and open its actions, exactly as
  :meth:`AwsSandbox.terminate_instance` does (moto terminates it at once). ``SetDesiredCapacity`` and
  ``UpdateAutoScalingGroup`` remove the first InService instances not protected from scale-in, as
  :meth:`AwsSandbox.scale_in` does; ``TerminateInstanceInAutoScalingGroup`` answers moto's ``Activity`` and
  lowers the desired capacity by one only when asked. Raising the capacity, a terminate with the capacity
  kept (moto launches the replacement) and groups without a terminate hook stay moto's.

Not modelled: launch hooks and listeners for instances moto launches itself (replacements, capacity raised
through the API), ``ExecutePolicy`` and ``DetachInstances`` through the hooks, the default termination
policy's balancing across zones, SNS notification targets.

Modules: :mod:`.model` (names, public records, formats), :mod:`.moto_server` (the moto patches, injected
errors and the threaded server), :mod:`.lifecycle` (the lifecycle-action state machine and its timer
thread), :mod:`.eventbridge` (EventBridge and notification delivery to SQS, :data:`STANDARD_RULES`),
:mod:`.sandbox` (:class:`AwsSandbox`, which ties them together and plays the scenarios). The names below are
the package's public face; import them from here.
"""

from queue_processor_sandbox.aws.eventbridge import STANDARD_RULES, PublishedMessage
from queue_processor_sandbox.aws.lifecycle import LifecycleAction, LifecycleCall
from queue_processor_sandbox.aws.model import (
    ACCOUNT_ID,
    LAUNCH_HOOK,
    LAUNCH_TRANSITION,
    MANAGED_TAG,
    TERMINATE_HOOK,
    TERMINATE_TRANSITION,
    ClientKwargs,
    QueueCounts,
    SandboxInstance,
    SandboxQueue,
)
from queue_processor_sandbox.aws.sandbox import AwsSandbox

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
    "QueueCounts",
    "SandboxInstance",
    "SandboxQueue",
]
