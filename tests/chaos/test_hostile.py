"""Chaos, hostile messages: bodies built to break a parser, mixed into a Spot storm, read by the controller in
its own process. Each poison one reaches the dead-letter queue through the redrive policy (never deleted),
every valid one is handled, the nodes are drained, and the log holds no traceback."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from queue_processor.parse import MAX_MESSAGE_BYTES
from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from tests.chaos.harness import Controller, assert_judged_clean, queue_depth, until


def spot(instance_id: str) -> dict[str, object]:
    return {
        "version": "0",
        "id": f"hostile-{len(instance_id)}",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "time": "2026-11-23T12:00:00Z",
        "detail": {"instance-id": instance_id, "instance-action": "terminate"},
    }


POISON = {
    "not JSON": "{nope",
    "200 KiB of nested arrays": "[" * 102_400 + "]" * 102_400,
    "deep objects": '{"a":' * 20_000 + "1" + "}" * 20_000,
    "a number out of range": json.dumps(spot("i-1")).replace('"terminate"', "1" + "0" * 5000),
    "detail as a string": json.dumps({**spot("i-1"), "detail": "i-1"}),
    "SNS around garbage": json.dumps({"Type": "Notification", "Message": "\x00\x01garbage"}),
    "not an object": "[1, 2, 3]",
}
#: Valid, and acted on or skipped: instance IDs no instance has (acknowledged as unknown to EC2), duplicate
#: keys (the last one wins, as in JSON parsers generally: an unhandled kind, skipped).
VALID = {
    "a path as instance ID": json.dumps(spot("../../etc/passwd")),
    "a newline in the instance ID": json.dumps(spot("i-1\nX-Injected: yes")),
    "duplicate keys": '{"detail-type":"EC2 Spot Instance Interruption Warning","detail-type":"Nope",'
    '"source":"aws.ec2","time":"2026-11-23T12:00:00Z","detail":{"instance-id":"i-1"}}',
}


def at_the_sqs_maximum(instance_id: str) -> str:
    """A valid Spot warning padded to exactly the largest body SQS takes (1 MiB, MAX_MESSAGE_BYTES)."""
    body = spot(instance_id)
    body["padding"] = ""
    short = len(json.dumps(body).encode())
    body["padding"] = "x" * (MAX_MESSAGE_BYTES - short)
    text = json.dumps(body)
    assert len(text.encode()) == MAX_MESSAGE_BYTES
    return text


def dlq_bodies(sandbox: Sandbox) -> list[str]:
    """Every body in the dead-letter queue (read with a visibility timeout longer than the reading)."""
    assert sandbox.queue is not None
    sqs = boto3.client("sqs", **sandbox.aws.client_kwargs)
    bodies: list[str] = []
    while True:
        answer = sqs.receive_message(
            QueueUrl=sandbox.queue.dlq_url, MaxNumberOfMessages=10, VisibilityTimeout=60
        )
        if not answer.get("Messages"):
            return bodies
        bodies.extend(message["Body"] for message in answer["Messages"])


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    options = SandboxOptions(
        nodes=5, scale=0.05, visibility_timeout_s=10, max_receive_count=2, cluster=ClusterSpec(apps=2)
    )
    with Sandbox(options, workdir=tmp_path / "sandbox") as running:  # parsing is AWS-side: emulated is enough
        yield running


async def test_hostile_messages_in_a_storm(sandbox: Sandbox, tmp_path: Path) -> None:
    assert sandbox.queue is not None
    sqs = boto3.client("sqs", **sandbox.aws.client_kwargs)
    started = time.monotonic()
    controller = Controller(sandbox, tmp_path / "controller.log", POISON_VISIBILITY_TIMEOUT_SEC="1")
    try:
        await until(lambda: controller.count("consuming") == 1, 60, "the controller consuming")
        for body in [*POISON.values(), *VALID.values()]:
            sandbox.aws.send_raw(sandbox.queue.url, body)
        interrupted = sandbox.instances[:3]
        sandbox.aws.send_raw(sandbox.queue.url, at_the_sqs_maximum(interrupted[2].instance_id))
        # Attributes the controller never asked for, one of them bytes that are not UTF-8.
        binary = {"DataType": "Binary", "BinaryValue": b"\xff\xfe\xc3("}
        text = {"DataType": "String", "StringValue": "\u2028\x7f"}
        sqs.send_message(
            QueueUrl=sandbox.queue.url,
            MessageBody=json.dumps(spot(interrupted[1].instance_id)),
            MessageAttributes={"raw": binary, "text": text},
        )
        sandbox.aws.spot_interruption(interrupted[0].instance_id)  # a 6 s notice at this scale
        nodes = {instance.private_dns_name for instance in interrupted}
        drained = lambda: {pod["spec"].get("nodeName") for pod in sandbox.kube.evictions} >= nodes  # noqa: E731
        await until(drained, 60, "pods evicted from every interrupted node")
        # The drains may settle every message before the notice ends; the instance's termination then publishes
        # its state changes. Wait for that first, then for every message to be settled or redriven.
        gone = interrupted[0].instance_id
        await until(
            lambda: sandbox.aws.ec2_state(gone) == "terminated", 60, "the interrupted instance terminated"
        )
        settled = lambda: queue_depth(sandbox) == (0, 0) and sandbox.queue_counts().dlq == len(POISON)  # noqa: E731
        await until(settled, 90, "every message settled or redriven")
    finally:
        assert controller.stop(signal.SIGTERM, 60) == 0
    controller.assert_clean_exit()  # and no traceback
    assert sorted(dlq_bodies(sandbox)) == sorted(POISON.values())  # each poison one, and only those
    assert controller.count("poison message left for the dead-letter queue") >= len(POISON)
    verdict = assert_judged_clean(sandbox, sorted(nodes), started)
    assert verdict["drained"] == len(nodes)
