"""Chaos, clock skew: notices whose ``time`` is minutes in the future or minutes in the past (a skewed clock
in the publisher, or a message that waited in the queue). The controller drains every node all the same: a
deadline already over is measured from when the work started, and one far away is capped by
NODE_TERMINATION_GRACE_PERIOD; a lifecycle action delivered again with a skewed time is the same action,
completed once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from tests.chaos.harness import Controller, settle, until

SKEW = timedelta(minutes=10)


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    options = SandboxOptions(nodes=5, scale=0.05, visibility_timeout_s=10, cluster=ClusterSpec(apps=2))
    with Sandbox(options, workdir=tmp_path / "sandbox") as running:  # time is the controller's: emulated
        yield running


def spot_warning(instance_id: str, at: datetime) -> str:
    """An EC2 Spot Instance Interruption Warning published at ``at`` (its action two minutes later)."""
    return json.dumps(
        {
            "version": "0",
            "id": f"skewed-{instance_id}",
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": "us-east-1",
            "resources": [f"arn:aws:ec2:us-east-1a:instance/{instance_id}"],
            "detail": {
                "instance-id": instance_id,
                "instance-action": "terminate",
                "instance-action-time": (at + timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        }
    )


async def test_notices_from_the_future_and_the_past_are_all_handled(sandbox: Sandbox, tmp_path: Path) -> None:
    assert sandbox.queue is not None
    future, past, leaving = sandbox.instances[:3]
    started = time.monotonic()
    now = datetime.now(UTC)
    controller = Controller(sandbox, tmp_path / "controller.log")
    await until(lambda: controller.count("consuming") == 1, 60, "the controller consuming")
    sandbox.aws.send_raw(sandbox.queue.url, spot_warning(future.instance_id, now + SKEW))
    sandbox.aws.send_raw(sandbox.queue.url, spot_warning(past.instance_id, now - SKEW))
    (action,) = sandbox.aws.terminate_instance(leaving.instance_id)
    published = [m.body for m in sandbox.aws.published() if action.token in m.body and m.via == "eventbridge"]
    for skew in (SKEW, -SKEW):  # the same lifecycle action again, as a publisher with a skewed clock sent it
        body = json.loads(published[0])
        body["id"] = f"skewed-{skew.total_seconds():+.0f}"
        body["time"] = (now + skew).strftime("%Y-%m-%dT%H:%M:%SZ")
        sandbox.aws.send_raw(sandbox.queue.url, json.dumps(body))
    nodes = [instance.private_dns_name for instance in (future, past, leaving)]
    evicted_from = lambda: {pod["spec"].get("nodeName") for pod in sandbox.kube.evictions}  # noqa: E731
    await until(lambda: evicted_from() >= set(nodes), 90, "pods evicted from all three nodes")
    verdict = await settle(sandbox, [action.token], nodes, started, [controller])
    assert verdict["drained"] == 3
    completions = [c for c in sandbox.aws.calls() if c.operation == "CompleteLifecycleAction"]
    assert [(c.token, c.outcome) for c in completions] == [(action.token, "ok")]  # once
