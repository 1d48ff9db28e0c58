"""The controller's AWS clients against moto's server over HTTP: every request counted once through botocore's
event hooks (answered, throttled, refused, or never answered), DescribeInstances through its paginator."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from queue_processor.aws import TAGGED_PAGE_SIZE, AwsClients, describe_instances, tagged_instances
from queue_processor.cli import load_settings
from queue_processor.lifecycle import Lifecycle
from queue_processor.observe.metrics import Metrics
from queue_processor.permissions import AWS_API_CALLS
from queue_processor.watch import tagged_nodes
from queue_processor_sandbox.aws import TERMINATE_HOOK, AwsSandbox
from queue_processor_sandbox.clock import SandboxClock

QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/interruptions"


@pytest.fixture(scope="module")
def sandbox() -> Iterator[AwsSandbox]:
    with AwsSandbox(SandboxClock(0.01)) as started:
        yield started


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def requests(metrics: Metrics, service: str, operation: str, result: str) -> float:
    labels = {"service": service, "operation": operation, "result": result}
    return metrics.registry.get_sample_value("queue_processor_aws_requests_total", labels) or 0.0


async def test_describe_instances_reads_every_instance_through_the_paginator(sandbox: AwsSandbox) -> None:
    sandbox.reset()
    instances = sandbox.create_asg("workers", 3)
    metrics = Metrics(process_metrics=False)
    settings = load_settings(queue_url=QUEUE, aws_region=sandbox.region, aws_endpoint=sandbox.endpoint_url)
    async with AwsClients(settings, observer=metrics) as aws:
        wanted = [instance.instance_id for instance in instances[:2]] + ["i-00000000000000000"]
        found = await describe_instances(aws.ec2, wanted)
    assert sorted(instance["InstanceId"] for instance in found) == sorted(wanted[:2])  # unknown: absent
    assert requests(metrics, "ec2", "DescribeInstances", "ok") == 1


@pytest.mark.parametrize(
    ("code", "status", "counted_as"),
    [("Throttling", 400, "throttled"), ("ServiceUnavailable", 503, "error")],
)
async def test_each_attempt_is_counted_then_ok(
    sandbox: AwsSandbox, code: str, status: int, counted_as: str
) -> None:
    # Throttling (HTTP 400) and a 5xx are both retried inside the call; each attempt is one request counted.
    sandbox.reset()
    sandbox.create_asg("workers", 1, heartbeat_timeout_s=300)
    sandbox.inject_error("DescribeLifecycleHooks", code, "try again", times=2, status=status)
    metrics = Metrics(process_metrics=False)
    settings = load_settings(queue_url=QUEUE, aws_region=sandbox.region, aws_endpoint=sandbox.endpoint_url)
    try:
        async with AwsClients(settings, observer=metrics) as aws:
            timeout = await Lifecycle(aws.autoscaling, settings).hook_timeout_s("workers", TERMINATE_HOOK)
    finally:
        sandbox.clear_errors()
    assert timeout == pytest.approx(300 * 0.01)  # the sandbox keeps simulated seconds at 1:100
    assert requests(metrics, "autoscaling", "DescribeLifecycleHooks", counted_as) == 2
    assert requests(metrics, "autoscaling", "DescribeLifecycleHooks", "ok") == 1  # one request per attempt


async def test_a_refused_call_is_an_error_and_is_not_retried(sandbox: AwsSandbox) -> None:
    sandbox.reset()
    sandbox.create_asg("workers", 1)
    sandbox.inject_error("DescribeLifecycleHooks", "AccessDenied", "not authorized")
    metrics = Metrics(process_metrics=False)
    settings = load_settings(queue_url=QUEUE, aws_region=sandbox.region, aws_endpoint=sandbox.endpoint_url)
    try:
        async with AwsClients(settings, observer=metrics) as aws:
            with pytest.raises(ClientError):
                await aws.autoscaling.describe_lifecycle_hooks(AutoScalingGroupName="workers")
    finally:
        sandbox.clear_errors()
    assert requests(metrics, "autoscaling", "DescribeLifecycleHooks", "error") == 1


async def test_the_clients_have_the_operations_the_controller_calls_and_no_other() -> None:
    """The service models are trimmed to permissions.AWS_API_CALLS (queue_processor.aws.TrimmedModels): what
    the IAM policy grants is what the clients can call, and EC2's 807 operations are not kept in memory."""
    settings = load_settings(queue_url=QUEUE, aws_region="us-east-1")
    async with AwsClients(settings) as aws:
        for service, client in (("sqs", aws.sqs), ("ec2", aws.ec2), ("autoscaling", aws.autoscaling)):
            operations = set(client.meta.service_model.operation_names)
            assert operations == set(AWS_API_CALLS[service])
        assert not hasattr(aws.ec2, "terminate_instances")
        assert hasattr(aws.ec2, "describe_instances")


async def test_a_request_that_gets_no_answer_is_counted_as_an_error() -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    metrics = Metrics(process_metrics=False)
    settings = load_settings(queue_url=QUEUE, aws_endpoint=f"http://127.0.0.1:{port}")
    async with AwsClients(settings, observer=metrics) as aws:
        with pytest.raises(EndpointConnectionError):
            await aws.sqs.receive_message(QueueUrl=QUEUE, WaitTimeSeconds=0)
    assert requests(metrics, "sqs", "ReceiveMessage", "error") == 1


async def test_tagged_instances_asks_for_tags_a_page_at_a_time(sandbox: AwsSandbox) -> None:
    """One DescribeTags, not DescribeInstances (whose answer describes each instance in full), filtered to
    instances and the tag key, with MaxResults TAGGED_PAGE_SIZE (botocore's paginator follows NextToken; moto
    answers DescribeTags in one page whatever MaxResults says, so only the request is checked)."""
    sandbox.reset()
    managed = sandbox.create_asg("workers", 7)
    settings = load_settings(queue_url=QUEUE, aws_region=sandbox.region, aws_endpoint=sandbox.endpoint_url)
    metrics = Metrics(process_metrics=False)
    sent: list[dict[str, Any]] = []
    async with AwsClients(settings, observer=metrics) as aws:
        aws.ec2.meta.events.register(
            "before-parameter-build.ec2.DescribeTags", lambda params, **_: sent.append(dict(params))
        )
        found = await tagged_instances(aws.ec2, settings.managed_tag)
    assert found == {instance.instance_id for instance in managed}
    assert requests(metrics, "ec2", "DescribeTags", "ok") == 1
    assert requests(metrics, "ec2", "DescribeInstances", "ok") == 0
    assert sent == [
        {
            "Filters": [
                {"Name": "resource-type", "Values": ["instance"]},
                {"Name": "key", "Values": [settings.managed_tag]},
            ],
            "MaxResults": TAGGED_PAGE_SIZE,
        }
    ]


async def test_tagged_instances_counts_every_instance_with_the_tag_key_as_nth(sandbox: AwsSandbox) -> None:
    """NTH's nth_tagged_instances: a tag-key filter, whatever the value and the state; untagged ones out."""
    sandbox.reset()
    managed = sandbox.create_asg("workers", 2)
    sandbox.create_asg("others", 1, managed=False)
    settings = load_settings(queue_url=QUEUE, aws_region=sandbox.region, aws_endpoint=sandbox.endpoint_url)
    async with AwsClients(settings, observer=Metrics(process_metrics=False)) as aws:
        found = await tagged_instances(aws.ec2, settings.managed_tag)
    assert found == {instance.instance_id for instance in managed}
    nodes = [
        {"spec": {"providerID": f"aws:///us-east-1a/{managed[0].instance_id}"}},
        {"spec": {"providerID": f"aws:///us-east-1a/{managed[1].instance_id}/extra"}},  # six parts: not NTH's
        {"spec": {"providerID": "aws:///us-east-1a/i-0123456789abcdef0"}},  # not tagged
        {"spec": {}},
    ]
    assert tagged_nodes(nodes, found) == 1
