"""The sandbox's AWS, driven over HTTP with boto3 and aiobotocore, as a user of it would check it.

One sandbox serves the module (time scale 0.01: a 300 s hook timeout lasts 3 s, the Spot notice 1.2 s);
each test starts from a reset sandbox, so tests are independent.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, TypeVar

import boto3
import pytest
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from queue_processor.events import (
    AsgLaunchLifecycleEvent,
    AsgTerminateLifecycleEvent,
    CapacityReservationInterruptionEvent,
    EventKind,
    RebalanceRecommendationEvent,
    ScheduledChangeEvent,
    SpotInterruptionEvent,
    StateChangeEvent,
)
from queue_processor.parse import ParseResult, parse
from queue_processor_sandbox.aws import (
    LAUNCH_HOOK,
    MANAGED_TAG,
    STANDARD_RULES,
    TERMINATE_HOOK,
    AwsSandbox,
    SandboxQueue,
)
from queue_processor_sandbox.clock import SandboxClock

SCALE = 0.01
T = TypeVar("T")


@pytest.fixture(scope="module")
def sandbox() -> Iterator[AwsSandbox]:
    with AwsSandbox(SandboxClock(SCALE)) as started:
        yield started


@pytest.fixture(autouse=True)
def fresh(sandbox: AwsSandbox) -> Iterator[None]:
    sandbox.reset()
    yield
    assert sandbox.timer_errors == []


@cache
def _client(endpoint: str, service: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def asc(sandbox: AwsSandbox) -> Any:
    return _client(sandbox.endpoint_url, "autoscaling")


@pytest.fixture
def ec2(sandbox: AwsSandbox) -> Any:
    return _client(sandbox.endpoint_url, "ec2")


@pytest.fixture
def sqs(sandbox: AwsSandbox) -> Any:
    return _client(sandbox.endpoint_url, "sqs")


@pytest.fixture
def queue(sandbox: AwsSandbox) -> SandboxQueue:
    created = sandbox.create_queue("interruptions")
    sandbox.put_standard_rules(created.arn)
    return created


def eventually(check: Callable[[], T | None], timeout_s: float = 5.0) -> T:
    """Poll ``check`` until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {timeout_s} s")
        time.sleep(0.02)


def receive(sqs: Any, url: str, count: int, timeout_s: float = 5.0) -> list[ParseResult]:
    """Receive and delete ``count`` messages (exactly: one more arriving soon fails), parsed."""
    results: list[ParseResult] = []
    deadline = time.monotonic() + timeout_s
    while len(results) < count and time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            results.append(parse(message["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert len(results) == count, [r.events or r.reason for r in results]
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []
    return results


def events_of(results: list[ParseResult]) -> list[Any]:
    return [event for result in results for event in result.events]


def lifecycle_state(asc: Any, instance_id: str) -> str | None:
    found = asc.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
    return str(found[0]["LifecycleState"]) if found else None


def ec2_state(ec2: Any, instance_id: str) -> str:
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(reservations[0]["Instances"][0]["State"]["Name"])


def error_of(call: Callable[[], object]) -> tuple[int, str, str]:
    with pytest.raises(ClientError) as caught:
        call()
    response = caught.value.response
    return (
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Code"],
        response["Error"]["Message"],
    )


# ------------------------------------------------------------------------------------------------- server


def test_server_is_moto_over_http_on_loopback(sandbox: AwsSandbox) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", sandbox.endpoint_url)
    identity = _client(sandbox.endpoint_url, "sts").get_caller_identity()
    assert identity["Account"] == "123456789012"
    with pytest.raises(RuntimeError, match="another AWS sandbox"):
        AwsSandbox().start()


def test_stop_ends_every_thread_even_with_pending_timers(sandbox: AwsSandbox) -> None:
    sandbox.create_queue("before-restart")  # the sandbox's own clients, on the first endpoint
    sandbox.stop()
    baseline = set(threading.enumerate())
    try:
        with AwsSandbox(SandboxClock(1.0)) as other:
            instance = other.create_asg("stop-test", 2)[0]
            other.terminate_instance(instance.instance_id)  # a 300 s timer pending
            other.spot_interruption(other.instances()[0].instance_id)  # a 120 s timer pending
            client = boto3.client("autoscaling", **other.client_kwargs)  # a kept-alive connection
            assert lifecycle_state(client, instance.instance_id) == "Terminating:Wait"
            started = {thread.name for thread in set(threading.enumerate()) - baseline}
            assert "aws-sandbox-timers" in started
            assert any(name.endswith("(_server_entry)") for name in started)
        assert set(threading.enumerate()) == baseline
        assert other.timer_errors == []
    finally:
        sandbox.start()
    assert sandbox.create_queue("after-restart").url.startswith(sandbox.endpoint_url)


# ---------------------------------------------------------------------------------------- cluster helper


def test_build_cluster_of_1000_instances(sandbox: AwsSandbox, ec2: Any, asc: Any) -> None:
    started = time.perf_counter()
    instances = sandbox.build_cluster({"workers-a": 500, "workers-b": 500}, heartbeat_timeout_s=120)
    elapsed = time.perf_counter() - started
    print(f"built 1000 instances in {elapsed:.2f} s")
    assert elapsed < 20
    assert len(instances) == 1000
    assert len({i.instance_id for i in instances}) == 1000
    assert {i.asg_name for i in instances} == {"workers-a", "workers-b"}
    assert {i.availability_zone for i in instances} == {"us-east-1a", "us-east-1b", "us-east-1c"}
    first = instances[0]
    assert first.provider_id == f"aws:///{first.availability_zone}/{first.instance_id}"
    assert re.fullmatch(r"ip-\d+-\d+-\d+-\d+\.ec2\.internal", first.private_dns_name)

    described = ec2.describe_instances(InstanceIds=[first.instance_id])["Reservations"][0]["Instances"][0]
    assert described["PrivateDnsName"] == first.private_dns_name
    assert described["Placement"]["AvailabilityZone"] == first.availability_zone
    tags = {tag["Key"]: tag["Value"] for tag in described["Tags"]}
    assert MANAGED_TAG in tags
    assert tags["aws:autoscaling:groupName"] == first.asg_name

    group = asc.describe_auto_scaling_groups(AutoScalingGroupNames=["workers-b"])["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 500
    assert len(group["Instances"]) == 500
    assert {i["LifecycleState"] for i in group["Instances"]} == {"InService"}
    hooks = asc.describe_lifecycle_hooks(AutoScalingGroupName="workers-a")["LifecycleHooks"]
    assert [(h["LifecycleHookName"], h["HeartbeatTimeout"], h["DefaultResult"]) for h in hooks] == [
        (TERMINATE_HOOK, math.ceil(sandbox.clock.real(120)), "CONTINUE")  # reported in real seconds
    ]


def test_hooks_report_global_timeout_and_notification_settings(sandbox: AwsSandbox, asc: Any) -> None:
    direct = sandbox.create_queue("direct")
    sandbox.create_asg(
        "hooks",
        1,
        heartbeat_timeout_s=3600,
        launch_hook=True,
        launch_heartbeat_timeout_s=60,
        notification_target_arn=direct.arn,
        notification_metadata="drain-me",
    )
    hooks = {
        h["LifecycleHookName"]: h
        for h in asc.describe_lifecycle_hooks(AutoScalingGroupName="hooks")["LifecycleHooks"]
    }
    # Reported in the sandbox's real seconds (the clock's scale), as a consumer must heartbeat by them.
    assert hooks[TERMINATE_HOOK]["GlobalTimeout"] == math.ceil(
        sandbox.clock.real(172800)
    )  # 48 h < 100 x 3600 s
    assert hooks[LAUNCH_HOOK]["GlobalTimeout"] == math.ceil(sandbox.clock.real(6000))  # 100 x 60 s
    assert hooks[LAUNCH_HOOK]["HeartbeatTimeout"] == math.ceil(sandbox.clock.real(60))
    assert hooks[LAUNCH_HOOK]["DefaultResult"] == "ABANDON"
    assert hooks[TERMINATE_HOOK]["NotificationTargetARN"] == direct.arn
    assert hooks[TERMINATE_HOOK]["NotificationMetadata"] == "drain-me"


# ------------------------------------------------------------------------------------- lifecycle actions


def test_terminate_hook_holds_instance_until_continue(
    sandbox: AwsSandbox, queue: SandboxQueue, asc: Any, ec2: Any, sqs: Any
) -> None:
    instance = sandbox.create_asg("scale-in", 2)[0]
    (action,) = sandbox.terminate_instance(instance.instance_id)

    assert lifecycle_state(asc, instance.instance_id) == "Terminating:Wait"
    assert ec2_state(ec2, instance.instance_id) == "running"
    (event,) = events_of(receive(sqs, queue.url, 1))
    assert isinstance(event, AsgTerminateLifecycleEvent)
    assert (event.instance_id, event.lifecycle_action_token) == (instance.instance_id, action.token)
    assert (event.auto_scaling_group_name, event.lifecycle_hook_name) == ("scale-in", TERMINATE_HOOK)
    assert (event.origin, event.destination) == ("AutoScalingGroup", "EC2")

    asc.complete_lifecycle_action(
        AutoScalingGroupName="scale-in",
        LifecycleHookName=TERMINATE_HOOK,
        LifecycleActionToken=action.token,
        LifecycleActionResult="CONTINUE",
    )
    assert ec2_state(ec2, instance.instance_id) == "terminated"
    assert lifecycle_state(asc, instance.instance_id) is None
    group = asc.describe_auto_scaling_groups(AutoScalingGroupNames=["scale-in"])["AutoScalingGroups"][0]
    assert [i["InstanceId"] for i in group["Instances"]] != [instance.instance_id]
    assert (group["DesiredCapacity"], len(group["Instances"])) == (1, 1)
    states = [e.state for e in events_of(receive(sqs, queue.url, 2))]
    assert states == ["shutting-down", "terminated"]
    final = sandbox.action(action.token)
    assert (final.status, final.result) == ("completed", "CONTINUE")


def test_unknown_token_and_finished_action_answer_validation_error(sandbox: AwsSandbox, asc: Any) -> None:
    instance = sandbox.create_asg("errors", 1)[0]
    unknown = str(uuid.uuid4())
    status, code, message = error_of(
        lambda: asc.record_lifecycle_action_heartbeat(
            AutoScalingGroupName="errors", LifecycleHookName=TERMINATE_HOOK, LifecycleActionToken=unknown
        )
    )
    assert (status, code, message) == (
        400,
        "ValidationError",
        f"No active Lifecycle Action found with token {unknown}",
    )

    (action,) = sandbox.terminate_instance(instance.instance_id)
    asc.complete_lifecycle_action(
        AutoScalingGroupName="errors",
        LifecycleHookName=TERMINATE_HOOK,
        InstanceId=instance.instance_id,
        LifecycleActionResult="ABANDON",
    )
    for call in (
        lambda: asc.complete_lifecycle_action(
            AutoScalingGroupName="errors",
            LifecycleHookName=TERMINATE_HOOK,
            InstanceId=instance.instance_id,
            LifecycleActionResult="CONTINUE",
        ),
        lambda: asc.record_lifecycle_action_heartbeat(
            AutoScalingGroupName="errors", LifecycleHookName=TERMINATE_HOOK, InstanceId=instance.instance_id
        ),
    ):
        assert error_of(call) == (
            400,
            "ValidationError",
            f"No active Lifecycle Action found with instance ID {instance.instance_id}",
        )
    status, code, message = error_of(
        lambda: asc.complete_lifecycle_action(
            AutoScalingGroupName="errors",
            LifecycleHookName=TERMINATE_HOOK,
            LifecycleActionToken=action.token,
            LifecycleActionResult="CONTINUE",
        )
    )
    assert message == f"No active Lifecycle Action found with token {action.token}"
    # A terminate hook terminates the instance on ABANDON too.
    assert sandbox.ec2_state(instance.instance_id) == "terminated"


def test_timed_out_action_takes_default_result_and_rejects_calls(
    sandbox: AwsSandbox, asc: Any, ec2: Any
) -> None:
    instance = sandbox.create_asg("timeout", 1, heartbeat_timeout_s=30, default_result="ABANDON")[0]
    (action,) = sandbox.terminate_instance(instance.instance_id)
    final = sandbox.wait_for_action(action.token, timeout_s=5)
    assert (final.status, final.result) == ("timed-out", "ABANDON")
    assert final.ended_at is not None
    waited = (final.ended_at - final.started_at).total_seconds()
    assert SandboxClock(SCALE).real(30) <= waited < SandboxClock(SCALE).real(30) + 0.5
    assert ec2_state(ec2, instance.instance_id) == "terminated"
    status, code, message = error_of(
        lambda: asc.record_lifecycle_action_heartbeat(
            AutoScalingGroupName="timeout",
            LifecycleHookName=TERMINATE_HOOK,
            LifecycleActionToken=action.token,
        )
    )
    assert (status, code) == (400, "ValidationError")
    assert message.startswith("No active Lifecycle Action found")


def test_heartbeat_restarts_the_timeout(sandbox: AwsSandbox, asc: Any) -> None:
    # 1.5 s real: a heartbeat call on a loaded machine takes far less, so the beats below always come in time
    # (with 0.4 s, a loaded machine made too few calls in the window, or let the action time out between two).
    timeout_s = 150.0
    instance = sandbox.create_asg("heartbeat", 1, heartbeat_timeout_s=timeout_s)[0]
    (action,) = sandbox.terminate_instance(instance.instance_id)
    original_deadline = time.monotonic() + SandboxClock(SCALE).real(timeout_s)
    beats = 0
    while time.monotonic() < original_deadline + 1.0 or beats < 6:  # well past the original timeout
        asc.record_lifecycle_action_heartbeat(
            AutoScalingGroupName="heartbeat",
            LifecycleHookName=TERMINATE_HOOK,
            LifecycleActionToken=action.token,
        )
        beats += 1
        time.sleep(0.1)
    assert sandbox.action(action.token).status == "open"
    assert lifecycle_state(asc, instance.instance_id) == "Terminating:Wait"
    asc.complete_lifecycle_action(
        AutoScalingGroupName="heartbeat",
        LifecycleHookName=TERMINATE_HOOK,
        LifecycleActionToken=action.token,
        LifecycleActionResult="CONTINUE",
    )
    final = sandbox.action(action.token)
    assert (final.status, final.result) == ("completed", "CONTINUE")
    assert final.heartbeats == beats  # every beat reached the open action
    # Without heartbeats it then times out on its own.
    other = sandbox.create_asg("heartbeat-2", 1, heartbeat_timeout_s=timeout_s)[0]
    (silent,) = sandbox.terminate_instance(other.instance_id)
    assert sandbox.wait_for_action(silent.token).status == "timed-out"


def test_launch_hook_abandon_terminates_and_continue_goes_in_service(
    sandbox: AwsSandbox, queue: SandboxQueue, asc: Any, ec2: Any, sqs: Any
) -> None:
    sandbox.create_asg(  # 2 s real: the completions below come first even on a loaded machine
        "launch", 1, launch_hook=True, launch_default_result="CONTINUE", launch_heartbeat_timeout_s=200
    )
    abandoned, continued, timed_out = sandbox.launch_instances("launch", 3)
    for new in (abandoned, continued, timed_out):
        assert lifecycle_state(asc, new.instance_id) == "Pending:Wait"
    launch_events = events_of(receive(sqs, queue.url, 3))
    assert all(isinstance(e, AsgLaunchLifecycleEvent) for e in launch_events)
    assert {e.instance_id for e in launch_events} == {
        abandoned.instance_id,
        continued.instance_id,
        timed_out.instance_id,
    }
    assert {(e.origin, e.destination) for e in launch_events} == {("EC2", "AutoScalingGroup")}

    for new, result in ((abandoned, "ABANDON"), (continued, "CONTINUE")):
        asc.complete_lifecycle_action(
            AutoScalingGroupName="launch",
            LifecycleHookName=LAUNCH_HOOK,
            InstanceId=new.instance_id,
            LifecycleActionResult=result,
        )
    assert ec2_state(ec2, abandoned.instance_id) == "terminated"
    assert lifecycle_state(asc, abandoned.instance_id) is None
    assert lifecycle_state(asc, continued.instance_id) == "InService"
    (pending,) = sandbox.actions(timed_out.instance_id)
    assert sandbox.wait_for_action(pending.token).result == "CONTINUE"  # the hook's DefaultResult
    assert lifecycle_state(asc, timed_out.instance_id) == "InService"
    assert [e.state for e in events_of(receive(sqs, queue.url, 2))] == ["shutting-down", "terminated"]


def test_warm_pool_routes(sandbox: AwsSandbox, queue: SandboxQueue, asc: Any, ec2: Any, sqs: Any) -> None:
    sandbox.create_asg("warm", 1, launch_hook=True)
    asc.put_warm_pool(AutoScalingGroupName="warm", PoolState="Stopped")
    (warmed,) = sandbox.launch_instances("warm", origin="EC2", destination="WarmPool")
    assert lifecycle_state(asc, warmed.instance_id) == "Warmed:Pending:Wait"
    (event,) = events_of(receive(sqs, queue.url, 1))
    assert isinstance(event, AsgLaunchLifecycleEvent)
    assert (event.origin, event.destination) == ("EC2", "WarmPool")
    asc.complete_lifecycle_action(
        AutoScalingGroupName="warm",
        LifecycleHookName=LAUNCH_HOOK,
        LifecycleActionToken=event.lifecycle_action_token,
        LifecycleActionResult="CONTINUE",
    )
    assert lifecycle_state(asc, warmed.instance_id) == "Warmed:Stopped"
    assert ec2_state(ec2, warmed.instance_id) == "stopped"
    assert [e.state for e in events_of(receive(sqs, queue.url, 2))] == ["stopping", "stopped"]

    (moved,) = sandbox.launch_instances("warm", origin="WarmPool", destination="AutoScalingGroup")
    assert moved.instance_id == warmed.instance_id
    assert lifecycle_state(asc, warmed.instance_id) == "Pending:Wait"
    (event,) = events_of(receive(sqs, queue.url, 1))
    assert (event.origin, event.destination) == ("WarmPool", "AutoScalingGroup")
    asc.complete_lifecycle_action(
        AutoScalingGroupName="warm",
        LifecycleHookName=LAUNCH_HOOK,
        InstanceId=warmed.instance_id,
        LifecycleActionResult="CONTINUE",
    )
    assert lifecycle_state(asc, warmed.instance_id) == "InService"
    assert ec2_state(ec2, warmed.instance_id) == "running"


def test_scale_in_to_warm_pool_and_termination_outside_autoscaling(
    sandbox: AwsSandbox, asc: Any, ec2: Any
) -> None:
    sandbox.create_asg("mixed", 3)
    gone, reused = sandbox.scale_in("mixed", 2)
    assert lifecycle_state(asc, gone) == lifecycle_state(asc, reused) == "Terminating:Wait"
    sandbox.terminate_ec2_instance(gone)  # EC2 takes it away while its action is open
    (cancelled,) = sandbox.actions(gone)
    assert (cancelled.status, cancelled.result) == ("cancelled", None)
    assert (
        error_of(
            lambda: asc.record_lifecycle_action_heartbeat(
                AutoScalingGroupName="mixed", LifecycleHookName=TERMINATE_HOOK, InstanceId=gone
            )
        )[2]
        == f"No active Lifecycle Action found with instance ID {gone}"
    )

    (spare,) = [i.instance_id for i in sandbox.instances("mixed") if i.instance_id != reused]
    (action,) = sandbox.terminate_instance(spare, to_warm_pool=True)
    assert (action.origin, action.destination) == ("AutoScalingGroup", "WarmPool")
    asc.complete_lifecycle_action(
        AutoScalingGroupName="mixed",
        LifecycleHookName=TERMINATE_HOOK,
        LifecycleActionToken=action.token,
        LifecycleActionResult="CONTINUE",
    )
    assert lifecycle_state(asc, spare) == "Warmed:Stopped"
    assert ec2_state(ec2, spare) == "stopped"
    with pytest.raises(ValueError, match="not InService"):
        sandbox.terminate_instance(reused)


def test_scale_in_without_hook_terminates_at_once(
    sandbox: AwsSandbox, queue: SandboxQueue, ec2: Any, sqs: Any
) -> None:
    instance = sandbox.create_asg("no-hook", 2, terminate_hook=False)[0]
    assert sandbox.terminate_instance(instance.instance_id) == []
    assert ec2_state(ec2, instance.instance_id) == "terminated"
    events = events_of(receive(sqs, queue.url, 2))
    assert all(isinstance(e, StateChangeEvent) and e.instance_id == instance.instance_id for e in events)
    assert [e.state for e in events] == ["shutting-down", "terminated"]


# ------------------------------------------------------------------- scale-in requests through the hooks


def group_view(asc: Any, name: str) -> tuple[int, dict[str, str]]:
    """The group's DesiredCapacity and {instance ID: LifecycleState}, as DescribeAutoScalingGroups answers."""
    (group,) = asc.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return group["DesiredCapacity"], {i["InstanceId"]: i["LifecycleState"] for i in group["Instances"]}


def assert_waiting_on_hook(
    sandbox: AwsSandbox, asc: Any, sqs: Any, queue: SandboxQueue, asg_name: str, instance_ids: list[str]
) -> dict[str, str]:
    """Each instance is in Terminating:Wait with one open action, announced once in the queue; {ID: token}."""
    for instance_id in instance_ids:
        assert lifecycle_state(asc, instance_id) == "Terminating:Wait"
    opened = {a.instance_id: a.token for a in sandbox.actions(status="open")}
    assert sorted(opened) == sorted(instance_ids)
    events = events_of(receive(sqs, queue.url, len(instance_ids)))
    assert all(isinstance(e, AsgTerminateLifecycleEvent) for e in events)
    assert {e.instance_id: e.lifecycle_action_token for e in events} == opened
    assert {(e.auto_scaling_group_name, e.lifecycle_hook_name) for e in events} == {
        (asg_name, TERMINATE_HOOK)
    }
    return opened


def complete_all(
    sandbox: AwsSandbox,
    asc: Any,
    ec2: Any,
    sqs: Any,
    queue: SandboxQueue,
    asg_name: str,
    opened: dict[str, str],
) -> None:
    """CONTINUE every action over HTTP: each instance is terminated and leaves the group."""
    for instance_id in opened:
        asc.complete_lifecycle_action(
            AutoScalingGroupName=asg_name,
            LifecycleHookName=TERMINATE_HOOK,
            InstanceId=instance_id,
            LifecycleActionResult="CONTINUE",
        )
    for instance_id, token in opened.items():
        final = sandbox.wait_for_action(token)
        assert (final.status, final.result) == ("completed", "CONTINUE")
        assert ec2_state(ec2, instance_id) == "terminated"
        assert lifecycle_state(asc, instance_id) is None
    changes = events_of(receive(sqs, queue.url, 2 * len(opened)))
    assert {(e.instance_id, e.state) for e in changes} == {
        (instance_id, state) for instance_id in opened for state in ("shutting-down", "terminated")
    }


def test_terminate_instance_in_group_with_decrement_goes_through_the_hook(
    sandbox: AwsSandbox, queue: SandboxQueue, asc: Any, ec2: Any, sqs: Any
) -> None:
    target, *others = (i.instance_id for i in sandbox.create_asg("api-terminate", 3))
    answer = asc.terminate_instance_in_auto_scaling_group(
        InstanceId=target, ShouldDecrementDesiredCapacity=True
    )
    activity = answer["Activity"]
    assert activity["AutoScalingGroupName"] == "api-terminate"
    assert activity["Description"] == f"Terminating EC2 instance: {target}"
    assert "shrinking the capacity from 3 to 2" in activity["Cause"]

    opened = assert_waiting_on_hook(sandbox, asc, sqs, queue, "api-terminate", [target])
    assert ec2_state(ec2, target) == "running"
    assert group_view(asc, "api-terminate") == (
        2,
        {target: "Terminating:Wait", **dict.fromkeys(others, "InService")},
    )
    # Already terminating: AWS refuses a second termination.
    status, code, _ = error_of(
        lambda: asc.terminate_instance_in_auto_scaling_group(
            InstanceId=target, ShouldDecrementDesiredCapacity=True
        )
    )
    assert (status, code) == (400, "ValidationError")

    complete_all(sandbox, asc, ec2, sqs, queue, "api-terminate", opened)
    assert group_view(asc, "api-terminate") == (2, dict.fromkeys(others, "InService"))


def test_terminate_instance_in_group_keeping_capacity_goes_through_the_hook(
    sandbox: AwsSandbox, queue: SandboxQueue, asc: Any, ec2: Any, sqs: Any
) -> None:
    target, other = (i.instance_id for i in sandbox.create_asg("api-keep", 2))
    answer = asc.terminate_instance_in_auto_scaling_group(
        InstanceId=target, ShouldDecrementDesiredCapacity=False
    )
    assert "shrinking" not in answer["Activity"]["Cause"]
    opened = assert_waiting_on_hook(sandbox, asc, sqs, queue, "api-keep", [target])
    desired, states = group_view(asc, "api-keep")
    assert desired == 2
    (replacement,) = set(states) - {target, other}  # moto's own replacement launch
    assert states == {target: "Terminating:Wait", other: "InService", replacement: "InService"}

    complete_all(sandbox, asc, ec2, sqs, queue, "api-keep", opened)
    assert group_view(asc, "api-keep") == (2, {other: "InService", replacement: "InService"})


def test_set_desired_capacity_lower_goes_through_the_hook(
    sandbox: AwsSandbox, queue: SandboxQueue, asc: Any, ec2: Any, sqs: Any
) -> None:
    protected, first, second = (i.instance_id for i in sandbox.create_asg("api-desired", 3))
    asc.set_instance_protection(
        AutoScalingGroupName="api-desired", InstanceIds=[protected], ProtectedFromScaleIn=True
    )
    asc.set_desired_capacity(AutoScalingGroupName="api-desired", DesiredCapacity=1)

    opened = assert_waiting_on_hook(sandbox, asc, sqs, queue, "api-desired", [first, second])
    assert group_view(asc, "api-desired") == (
        1,
        {protected: "InService", first: "Terminating:Wait", second: "Terminating:Wait"},
    )
    complete_all(sandbox, asc, ec2, sqs, queue, "api-desired", opened)
    assert group_view(asc, "api-desired") == (1, {protected: "InService"})

    # Raising it stays moto's: one more InService instance, no lifecycle action.
    asc.set_desired_capacity(AutoScalingGroupName="api-desired", DesiredCapacity=2)
    desired, states = group_view(asc, "api-desired")
    assert (desired, sorted(states.values())) == (2, ["InService", "InService"])
    assert sandbox.actions(status="open") == []


def test_update_auto_scaling_group_lower_goes_through_the_hook(
    sandbox: AwsSandbox, queue: SandboxQueue, asc: Any, ec2: Any, sqs: Any
) -> None:
    first, second, third = (i.instance_id for i in sandbox.create_asg("api-update", 3))
    asc.update_auto_scaling_group(AutoScalingGroupName="api-update", DesiredCapacity=2)
    by_desired = assert_waiting_on_hook(sandbox, asc, sqs, queue, "api-update", [first])
    assert group_view(asc, "api-update")[0] == 2

    asc.update_auto_scaling_group(AutoScalingGroupName="api-update", MaxSize=1)  # below the capacity
    (by_max,) = [a for a in sandbox.actions(status="open") if a.instance_id != first]
    assert by_max.instance_id == second
    events = events_of(receive(sqs, queue.url, 1))
    assert [(type(e), e.instance_id, e.lifecycle_action_token) for e in events] == [
        (AsgTerminateLifecycleEvent, second, by_max.token)
    ]
    assert group_view(asc, "api-update") == (
        1,
        {first: "Terminating:Wait", second: "Terminating:Wait", third: "InService"},
    )
    complete_all(sandbox, asc, ec2, sqs, queue, "api-update", {**by_desired, second: by_max.token})
    assert group_view(asc, "api-update") == (1, {third: "InService"})


def test_scale_in_requests_without_terminate_hook_stay_moto(
    sandbox: AwsSandbox, queue: SandboxQueue, asc: Any, ec2: Any, sqs: Any
) -> None:
    instances = [i.instance_id for i in sandbox.create_asg("api-no-hook", 3, terminate_hook=False)]
    asc.set_desired_capacity(AutoScalingGroupName="api-no-hook", DesiredCapacity=2)
    desired, states = group_view(asc, "api-no-hook")
    assert (desired, len(states)) == (2, 2)
    (gone,) = set(instances) - set(states)
    assert ec2_state(ec2, gone) == "terminated"
    target = sorted(states)[0]
    asc.terminate_instance_in_auto_scaling_group(InstanceId=target, ShouldDecrementDesiredCapacity=True)
    assert ec2_state(ec2, target) == "terminated"
    assert group_view(asc, "api-no-hook")[0] == 1
    assert sandbox.actions() == []
    assert sqs.receive_message(QueueUrl=queue.url, WaitTimeSeconds=0).get("Messages", []) == []


def test_direct_notification_to_sqs(sandbox: AwsSandbox, queue: SandboxQueue, asc: Any, sqs: Any) -> None:
    direct = sandbox.create_queue("hook-target")
    instance = sandbox.create_asg(
        "direct", 1, notification_target_arn=direct.arn, notification_metadata='{"cluster":"sandbox"}'
    )[0]
    (test_notification,) = receive(sqs, direct.url, 1)
    assert test_notification.outcome == "skip"
    (action,) = sandbox.terminate_instance(instance.instance_id)

    (direct_result,) = receive(sqs, direct.url, 1)
    (bridged_result,) = receive(sqs, queue.url, 1)
    assert (direct_result.envelope, bridged_result.envelope) == ("asg-direct", "eventbridge")
    (direct_event,) = direct_result.events
    (bridged_event,) = bridged_result.events
    assert isinstance(direct_event, AsgTerminateLifecycleEvent)
    assert isinstance(bridged_event, AsgTerminateLifecycleEvent)
    assert direct_event.lifecycle_action_token == action.token
    assert (
        direct_event.notification_metadata == bridged_event.notification_metadata == '{"cluster":"sandbox"}'
    )
    assert direct_event.event_id == bridged_event.event_id
    body = json.loads(sandbox.published()[-1].body)
    assert body["Service"] == "AWS Auto Scaling"
    assert set(body) >= {"AccountId", "RequestId", "Time", "LifecycleTransition", "Origin", "Destination"}


async def test_aiobotocore_heartbeat_and_complete(sandbox: AwsSandbox) -> None:
    instance = sandbox.create_asg("async", 1, heartbeat_timeout_s=3600)[0]  # never the limit here
    (action,) = sandbox.terminate_instance(instance.instance_id)
    async with get_session().create_client("autoscaling", **sandbox.client_kwargs) as client:
        await client.record_lifecycle_action_heartbeat(
            AutoScalingGroupName="async", LifecycleHookName=TERMINATE_HOOK, InstanceId=instance.instance_id
        )
        await client.complete_lifecycle_action(
            AutoScalingGroupName="async",
            LifecycleHookName=TERMINATE_HOOK,
            LifecycleActionToken=action.token,
            LifecycleActionResult="CONTINUE",
        )
        with pytest.raises(ClientError, match="No active Lifecycle Action found with token"):
            await client.record_lifecycle_action_heartbeat(
                AutoScalingGroupName="async",
                LifecycleHookName=TERMINATE_HOOK,
                LifecycleActionToken=action.token,
            )
    assert sandbox.ec2_state(instance.instance_id) == "terminated"


def test_record_of_calls_and_final_states(sandbox: AwsSandbox, asc: Any) -> None:
    # 2 s real: the calls below come first even on a loaded machine; the third action then times out.
    first, second, third = sandbox.create_asg("record", 3, heartbeat_timeout_s=200, default_result="CONTINUE")
    (a1,) = sandbox.terminate_instance(first.instance_id)
    (a2,) = sandbox.terminate_instance(second.instance_id)
    (a3,) = sandbox.terminate_instance(third.instance_id)
    hook = {"AutoScalingGroupName": "record", "LifecycleHookName": TERMINATE_HOOK}
    asc.record_lifecycle_action_heartbeat(**hook, LifecycleActionToken=a1.token)
    asc.complete_lifecycle_action(**hook, LifecycleActionToken=a1.token, LifecycleActionResult="CONTINUE")
    asc.complete_lifecycle_action(**hook, InstanceId=second.instance_id, LifecycleActionResult="ABANDON")
    with pytest.raises(ClientError):
        asc.complete_lifecycle_action(**hook, LifecycleActionToken=a1.token, LifecycleActionResult="CONTINUE")
    sandbox.wait_for_action(a3.token)

    calls = sandbox.calls()
    assert [(c.operation, c.token, c.instance_id, c.result, c.ok) for c in calls] == [
        ("RecordLifecycleActionHeartbeat", a1.token, None, None, True),
        ("CompleteLifecycleAction", a1.token, None, "CONTINUE", True),
        ("CompleteLifecycleAction", None, second.instance_id, "ABANDON", True),
        ("CompleteLifecycleAction", a1.token, None, "CONTINUE", False),
    ]
    assert calls[3].outcome == f"ValidationError: No active Lifecycle Action found with token {a1.token}"
    assert calls[2].action_token == a2.token
    assert all(c.time.tzinfo is not None for c in calls)
    assert [c.operation for c in sandbox.calls(first.instance_id)] == [
        "RecordLifecycleActionHeartbeat",
        "CompleteLifecycleAction",
        "CompleteLifecycleAction",
    ]
    finals = {a.instance_id: (a.status, a.result, a.heartbeats) for a in sandbox.actions()}
    assert finals == {
        first.instance_id: ("completed", "CONTINUE", 1),
        second.instance_id: ("completed", "ABANDON", 0),
        third.instance_id: ("timed-out", "CONTINUE", 0),
    }
    assert sandbox.actions(status="open") == []


# ---------------------------------------------------------------------------------------------- scenarios


def test_spot_interruption_terminates_when_the_notice_ends(
    sandbox: AwsSandbox, queue: SandboxQueue, ec2: Any, sqs: Any
) -> None:
    instance = sandbox.create_asg("spot", 1)[0]
    called = datetime.now(UTC)
    sandbox.spot_interruption(instance.instance_id)
    assert ec2_state(ec2, instance.instance_id) == "running"
    (event,) = events_of(receive(sqs, queue.url, 1))
    assert isinstance(event, SpotInterruptionEvent)
    assert (event.instance_id, event.instance_action) == (instance.instance_id, "terminate")
    notice = timedelta(seconds=SandboxClock(SCALE).real(120))
    assert abs(event.start_time - (called + notice)) < timedelta(milliseconds=100)

    eventually(lambda: ec2_state(ec2, instance.instance_id) == "terminated")
    terminated_at = datetime.now(UTC)
    assert terminated_at >= event.start_time - timedelta(milliseconds=20)
    assert terminated_at - event.start_time < timedelta(milliseconds=500)
    assert sandbox.lifecycle_state(instance.instance_id) is None
    assert [e.state for e in events_of(receive(sqs, queue.url, 2))] == ["shutting-down", "terminated"]


def test_capacity_reservation_interruption(
    sandbox: AwsSandbox, queue: SandboxQueue, ec2: Any, sqs: Any
) -> None:
    instance = sandbox.create_asg("odcr", 1)[0]
    sandbox.capacity_reservation_interruption(instance.instance_id)
    (event,) = events_of(receive(sqs, queue.url, 1))
    assert isinstance(event, CapacityReservationInterruptionEvent)
    assert event.instance_id == instance.instance_id
    assert event.instance_termination_time is not None
    assert str(event.availability_zone_id).startswith("use1-az")
    eventually(lambda: ec2_state(ec2, instance.instance_id) == "terminated")
    assert datetime.now(UTC) >= event.start_time - timedelta(milliseconds=20)


def test_rebalance_state_change_and_raw(sandbox: AwsSandbox, queue: SandboxQueue, ec2: Any, sqs: Any) -> None:
    first, second = sandbox.create_asg("misc", 2)
    sandbox.rebalance_recommendation(first.instance_id)
    (event,) = events_of(receive(sqs, queue.url, 1))
    assert isinstance(event, RebalanceRecommendationEvent)
    assert event.instance_id == first.instance_id

    sandbox.stop_instance(second.instance_id)
    assert ec2_state(ec2, second.instance_id) == "stopped"
    events = events_of(receive(sqs, queue.url, 2))
    assert [(type(e), e.instance_id, e.state) for e in events] == [
        (StateChangeEvent, second.instance_id, "stopping"),
        (StateChangeEvent, second.instance_id, "stopped"),
    ]
    sandbox.publish_state_change(first.instance_id, "running")  # filtered out by the standard rule
    sandbox.send_raw(queue.url, "this is not JSON")
    (poison,) = receive(sqs, queue.url, 1)
    assert poison.outcome == "poison"


def test_scheduled_change_names_every_instance(sandbox: AwsSandbox, queue: SandboxQueue, sqs: Any) -> None:
    instances = sandbox.create_asg("health", 3)
    ids = [i.instance_id for i in instances]
    body = sandbox.scheduled_change(ids, start_in_s=600)
    start_time = body["detail"]["startTime"]
    assert re.fullmatch(r"[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT", start_time)
    (result,) = receive(sqs, queue.url, 1)
    assert all(isinstance(e, ScheduledChangeEvent) for e in result.events)
    assert [e.instance_id for e in result.events] == ids
    expected = datetime.now(UTC) + timedelta(seconds=SandboxClock(SCALE).real(600))
    assert abs(result.events[0].start_time - expected) < timedelta(seconds=2)


def test_standard_rules_route_each_kind_once(sandbox: AwsSandbox, queue: SandboxQueue, sqs: Any) -> None:
    assert set(STANDARD_RULES) == set(EventKind)
    rules = _client(sandbox.endpoint_url, "events").list_rules(NamePrefix="queue-processor")["Rules"]
    assert len(rules) == len(EventKind)
    only_spot = sandbox.create_queue("only-spot")
    sandbox.put_standard_rules(only_spot.arn, kinds=[EventKind.SPOT_INTERRUPTION], prefix="spot-only")
    instance = sandbox.create_asg("routing", 1)[0]
    sandbox.rebalance_recommendation(instance.instance_id)
    sandbox.spot_interruption(instance.instance_id, action="stop")
    kinds = [e.kind for e in events_of(receive(sqs, queue.url, 2))]
    assert kinds == [EventKind.REBALANCE_RECOMMENDATION, EventKind.SPOT_INTERRUPTION]
    (spot,) = events_of(receive(sqs, only_spot.url, 1))
    assert spot.instance_action == "stop"


def test_never_deleted_message_lands_in_dead_letter_queue(sandbox: AwsSandbox, sqs: Any) -> None:
    queue = sandbox.create_queue("redrive", visibility_timeout_s=1, max_receive_count=2)
    attributes = sqs.get_queue_attributes(QueueUrl=queue.url, AttributeNames=["RedrivePolicy"])["Attributes"]
    assert json.loads(attributes["RedrivePolicy"])["deadLetterTargetArn"] == queue.dlq_arn
    sandbox.send_raw(queue.url, "poison")
    receives = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        received = sqs.receive_message(QueueUrl=queue.url, WaitTimeSeconds=1).get("Messages", [])
        receives += len(received)
        dead = sqs.receive_message(QueueUrl=queue.dlq_url, WaitTimeSeconds=0).get("Messages", [])
        if dead:
            assert dead[0]["Body"] == "poison"
            break
    else:
        pytest.fail("the message never reached the dead-letter queue")
    assert receives == 2


def test_queue_counts_follow_sqs_after_sends_receives_and_delays(sandbox: AwsSandbox, sqs: Any) -> None:
    """The sandbox counts a queue's messages with one clock reading per count (moto read it twice per message on
    every SendMessage: publishing a 5,000-warning storm took longer than its notices). The counts are SQS's
    (GetQueueAttributes, "ApproximateNumberOf…"): visible, received and in flight, delayed."""
    url = sandbox.create_queue("counted").url
    for index in range(6):
        sqs.send_message(QueueUrl=url, MessageBody=f"m-{index}")
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=900)
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=600)["Messages"]
    assert len(received) == 2
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "4"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "2"
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "1"
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=received[0]["ReceiptHandle"], VisibilityTimeout=0
    )
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (
        attributes["ApproximateNumberOfMessages"],
        attributes["ApproximateNumberOfMessagesNotVisible"],
    ) == (
        "5",
        "1",
    )


def test_an_instance_shows_its_own_tags_as_tags_are_created_and_deleted(
    sandbox: AwsSandbox, ec2: Any
) -> None:
    """DescribeInstances gives each instance its own tags, the ones DescribeTags gives for its ID, as they are
    created and deleted (the sandbox reads them by resource ID: moto scanned every tag of every resource for
    each instance described)."""
    first, second = sandbox.build_cluster({"tagged": 2}, heartbeat_timeout_s=120)

    def described(instance_id: str) -> dict[str, str]:
        reservation = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]
        return {tag["Key"]: tag["Value"] for tag in reservation["Instances"][0].get("Tags", [])}

    def listed(instance_id: str) -> dict[str, str]:
        answer = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_id]}])
        return {tag["Key"]: tag["Value"] for tag in answer["Tags"]}

    ec2.create_tags(Resources=[first.instance_id], Tags=[{"Key": "team", "Value": "a"}])
    ec2.create_tags(Resources=[second.instance_id], Tags=[{"Key": "team", "Value": "b"}])
    ec2.delete_tags(Resources=[first.instance_id], Tags=[{"Key": MANAGED_TAG}])
    assert described(first.instance_id) == listed(first.instance_id)
    assert described(first.instance_id)["team"] == "a"
    assert MANAGED_TAG not in described(first.instance_id)
    assert described(second.instance_id) == listed(second.instance_id)
    assert described(second.instance_id)["team"] == "b"
    assert MANAGED_TAG in described(second.instance_id)


def test_receipt_handles_delete_and_change_visibility_as_moto_answers(sandbox: AwsSandbox, sqs: Any) -> None:
    """The sandbox finds a message by its receipt handle through an index (moto compared the handle with every
    handle of every message, for each delete and visibility change). The answers are moto's: a handle of an
    earlier receive still names the message, a deleted message's handle may be deleted again, and one that
    names no message is ``ReceiptHandleIsInvalid``."""
    url = sandbox.create_queue("receipts").url
    sqs.send_message(QueueUrl=url, MessageBody="kept")
    sqs.send_message(QueueUrl=url, MessageBody="deleted")
    first = {
        m["Body"]: m["ReceiptHandle"]
        for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
    }
    again = {
        m["Body"]: m["ReceiptHandle"]
        for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600)["Messages"]
    }
    assert set(first) == set(again) == {"kept", "deleted"}
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=again["kept"], VisibilityTimeout=0)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["deleted"])  # an earlier receive's handle
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["deleted"])  # deleted already: accepted
    assert error_of(lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="no-such-handle"))[1] == (
        "ReceiptHandleIsInvalid"
    )
    assert (
        error_of(
            lambda: sqs.change_message_visibility(
                QueueUrl=url, ReceiptHandle=again["deleted"], VisibilityTimeout=5
            )
        )[1]
        == "ReceiptHandleIsInvalid"
    )
    left = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600)["Messages"]
    assert [m["Body"] for m in left] == ["kept"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (
        attributes["ApproximateNumberOfMessages"],
        attributes["ApproximateNumberOfMessagesNotVisible"],
    ) == (
        "0",
        "1",
    )


def test_describe_instances_answers_as_moto_does_while_instances_change(
    sandbox: AwsSandbox, ec2: Any
) -> None:
    """The sandbox keeps each instance's serialized form and XML while nothing it is made from changes (moto's
    serializer took 1.3 ms per instance): every answer must be moto's own, byte for byte (but the request ID),
    cold, warm, and after each change an instance goes through, the sandbox's own (stop, start) and EC2
    requests (tags, an address, a termination)."""
    from moto.core.serialize import EC2Serializer

    from queue_processor_sandbox.aws import moto_server

    first, second, third = sandbox.build_cluster({"kept": 3}, heartbeat_timeout_s=120)
    ids = [first.instance_id, second.instance_id, third.instance_id]
    answers: list[bytes] = []
    ec2.meta.events.register(
        "after-call.ec2.DescribeInstances", lambda http_response, **_: answers.append(http_response.content)
    )

    def answer() -> tuple[bytes, Any]:
        parsed = ec2.describe_instances(InstanceIds=ids)["Reservations"]
        return re.sub(rb"<requestId>[^<]*</requestId>", b"", answers[-1]), parsed

    def as_moto_answers() -> tuple[bytes, Any]:
        kept = (EC2Serializer._serialize_type_structure, EC2Serializer._serialize_body)
        EC2Serializer._serialize_type_structure = moto_server._ORIGINAL_STRUCTURE  # type: ignore[method-assign]
        EC2Serializer._serialize_body = moto_server._ORIGINAL_BODY  # type: ignore[method-assign]
        try:
            return answer()
        finally:
            EC2Serializer._serialize_type_structure, EC2Serializer._serialize_body = kept  # type: ignore[method-assign]

    changes: list[Callable[[], object]] = [
        lambda: None,
        lambda: ec2.create_tags(Resources=[first.instance_id], Tags=[{"Key": "team", "Value": "a"}]),
        lambda: ec2.delete_tags(Resources=[first.instance_id], Tags=[{"Key": MANAGED_TAG}]),
        lambda: ec2.associate_address(  # changes the instance's network interface, in place
            InstanceId=first.instance_id, AllocationId=ec2.allocate_address(Domain="vpc")["AllocationId"]
        ),
        lambda: sandbox.stop_instance(second.instance_id),
        lambda: sandbox.start_instance(second.instance_id),
        lambda: ec2.terminate_instances(InstanceIds=[third.instance_id]),
    ]
    for change in changes:
        change()
        cold_or_changed, parsed = answer()
        warm, parsed_again = answer()
        moto, parsed_by_moto = as_moto_answers()
        assert cold_or_changed == warm == moto
        assert parsed == parsed_again == parsed_by_moto
    assert len(moto_server._INSTANCES) >= 3  # the forms were kept


def test_warm_descriptions_keep_each_instance_before_the_first_question(
    sandbox: AwsSandbox, ec2: Any
) -> None:
    """``warm_descriptions`` (storm.py calls it before its clock starts) describes every instance it is given,
    in batches, so that each one's serialized form is kept: a controller's first question finds it, and the
    answer is the one it would have been."""
    from queue_processor_sandbox.aws import moto_server

    instances = sandbox.build_cluster({"warm": 5}, heartbeat_timeout_s=120)
    ids = [instance.instance_id for instance in instances]
    moto_server.forget_instances()
    sandbox.warm_descriptions(ids, batch=2)
    assert set(ids) <= set(moto_server._INSTANCES)
    kept = {instance_id: moto_server._INSTANCES[instance_id] for instance_id in ids}
    reservations = ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": ids}])["Reservations"]
    described = [instance["InstanceId"] for r in reservations for instance in r["Instances"]]
    assert sorted(described) == sorted(ids)
    assert all(moto_server._INSTANCES[instance_id] is kept[instance_id] for instance_id in ids)  # no new form


def test_sqs_answers_a_settlement_with_the_500_set_up(sandbox: AwsSandbox) -> None:
    """The explorer's settlement faults (issue 47): SQS fails a DeleteMessageBatch with ``InternalError``
    (HTTP 500, the JSON protocol's error shape) for the calls set up, then serves the next one."""
    from botocore.config import Config

    queue = sandbox.create_queue(f"settle-{uuid.uuid4().hex[:6]}")
    sqs = boto3.client("sqs", config=Config(retries={"total_max_attempts": 1}), **sandbox.client_kwargs)
    sqs.send_message(QueueUrl=queue.url, MessageBody="{}")
    (message,) = sqs.receive_message(QueueUrl=queue.url)["Messages"]
    entries = [{"Id": "1", "ReceiptHandle": message["ReceiptHandle"]}]
    sandbox.inject_error(
        "DeleteMessageBatch", "InternalError", "We encountered an internal error.", times=1, status=500
    )
    with pytest.raises(ClientError) as refused:
        sqs.delete_message_batch(QueueUrl=queue.url, Entries=entries)
    assert refused.value.response["Error"]["Code"] == "InternalError"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert sqs.delete_message_batch(QueueUrl=queue.url, Entries=entries)["Successful"] == [{"Id": "1"}]
