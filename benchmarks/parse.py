"""Parse throughput: queue_processor.parse.parse against plain json.loads on the same bodies, in one run.

Builds a realistic mix of SQS message bodies (compact JSON, as EventBridge and Auto Scaling deliver them) for
a Spot interruption storm in a cluster whose queue is fed by the EventBridge rules the Terraform module
creates: per 100 messages, 20 Spot warnings, 15 rebalance recommendations, 20 ASG terminate actions through
EventBridge and 5 sent straight to SQS, 1 wrapped in SNS, 10 launch actions for the replacements, 25 state
changes (10 stopping/shutting-down/terminated, 15 pending/running, skipped), 2 AWS Health scheduled changes
(1-3 instances, with a real-length description), 1 Capacity Reservation interruption, 1 Auto Scaling test
notification or poison body.

Runs on one core (the process is pinned to one CPU where the OS allows it), takes the best of ``--rounds`` (5)
rounds for each side, and prints per-round figures, then one JSON line:
``{"parse_msgs_per_s": ..., "json_loads_msgs_per_s": ..., "ratio": ...}``
where ``ratio = parse_msgs_per_s / json_loads_msgs_per_s``. Goal: parse ≥ 50,000 msgs/s and ratio ≥ 0.5.

Usage: ``python benchmarks/parse.py [--messages 100000] [--rounds 3] [--seed 1]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from queue_processor.events import SqsMessageRef
from queue_processor.parse import ParseResult, parse

#: Every body is parsed as the consumer parses it: with the SQS message it came in attached to its events.
MESSAGE = SqsMessageRef(
    queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/queue-processor",
    message_id="b6a9a3c5-4f0e-4d2b-9f6e-2f1d3c4b5a69",
    receipt_handle="AQEB" + "x" * 180,
    receive_count=1,
)


def parse_as_consumer(body: str) -> ParseResult:
    """What the consumer does with each received message: parse it with its SQS message attached, and read
    each event's ID (``event_id`` is computed on first use, so reading it keeps the measure honest)."""
    result = parse(body, MESSAGE)
    for event in result.events:
        _ = event.event_id
    return result


DESCRIPTION = (
    "EC2 has detected degradation of the underlying hardware hosting your Amazon EC2 instance associated with "
    "this event in the us-east-1 region. Due to this degradation your instance could already be unreachable. "
    "We will stop your instance after 2026-12-01 00:00:00 UTC. Please take appropriate action before this "
    "time. You can find more information about retirement events scheduled for your EC2 instances in the AWS "
    "Management Console https://console.aws.amazon.com/ec2/v2/home?region=us-east-1#Events. "
    "* What will happen to my instance? Your instance will be stopped after the specified retirement date. "
    "You can start it again at any time after it's stopped. Any data on local instance-store volumes will be "
    "lost when the instance is stopped or terminated. * What do I need to do? We recommend that you stop and "
    "start the instance which will migrate the instance to a new host."
)


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


class Mix:
    """Generates bodies of each kind with fresh IDs and times."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.base = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

    def instance(self) -> str:
        return "i-" + "".join(self.rng.choice("0123456789abcdef") for _ in range(17))

    def uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def when(self) -> str:
        return (self.base + timedelta(seconds=self.rng.randrange(3600))).strftime("%Y-%m-%dT%H:%M:%SZ")

    def envelope(self, source: str, detail_type: str, detail: dict[str, object], resources: list[str]) -> str:
        return _compact(
            {
                "version": "0",
                "id": self.uid(),
                "detail-type": detail_type,
                "source": source,
                "account": "123456789012",
                "time": self.when(),
                "region": "us-east-1",
                "resources": resources,
                "detail": detail,
            }
        )

    def ec2(self, detail_type: str, **detail: object) -> str:
        instance = self.instance()
        arn = f"arn:aws:ec2:us-east-1:123456789012:instance/{instance}"
        return self.envelope("aws.ec2", detail_type, {"instance-id": instance, **detail}, [arn])

    def spot(self) -> str:
        return self.ec2("EC2 Spot Instance Interruption Warning", **{"instance-action": "terminate"})

    def rebalance(self) -> str:
        return self.ec2("EC2 Instance Rebalance Recommendation")

    def state(self, states: tuple[str, ...]) -> str:
        return self.ec2("EC2 Instance State-change Notification", state=self.rng.choice(states))

    def capacity(self) -> str:
        return self.ec2(
            "EC2 Capacity Reservation Instance Interruption Warning",
            **{"instance-action": "terminate", "instance-termination-time": self.when(), "azId": "use1-az1"},
        )

    def lifecycle_fields(self, transition: str) -> dict[str, object]:
        return {
            "LifecycleActionToken": self.uid(),
            "AutoScalingGroupName": "eks-workers-spot-" + self.rng.choice("abc"),
            "LifecycleHookName": "queue-processor-terminate",
            "EC2InstanceId": self.instance(),
            "LifecycleTransition": transition,
            "Origin": "AutoScalingGroup",
            "Destination": "EC2",
        }

    def asg(self, launch: bool = False) -> str:
        transition = "LAUNCHING" if launch else "TERMINATING"
        detail_type = (
            "EC2 Instance-launch Lifecycle Action" if launch else "EC2 Instance-terminate Lifecycle Action"
        )
        group = (
            "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:x:autoScalingGroupName/eks-workers"
        )
        return self.envelope(
            "aws.autoscaling",
            detail_type,
            self.lifecycle_fields(f"autoscaling:EC2_INSTANCE_{transition}"),
            [group],
        )

    def asg_direct(self) -> str:
        fields = self.lifecycle_fields("autoscaling:EC2_INSTANCE_TERMINATING")
        extra = {"AccountId": "123456789012", "Service": "AWS Auto Scaling", "RequestId": self.uid()}
        return _compact({**fields, **extra, "Time": self.when()[:-1] + ".123Z"})

    def asg_sns(self) -> str:
        return _compact(
            {
                "Type": "Notification",
                "MessageId": self.uid(),
                "TopicArn": "arn:aws:sns:us-east-1:123456789012:asg-lifecycle",
                "Message": self.asg_direct(),
                "Timestamp": self.when(),
                "SignatureVersion": "1",
                "Signature": "EXAMPLE" * 20,
                "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem",
                "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
            }
        )

    def health(self) -> str:
        instances = [self.instance() for _ in range(self.rng.randint(1, 3))]
        detail = {
            "eventArn": f"arn:aws:health:us-east-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/{self.uid()}",
            "service": "EC2",
            "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "eventTypeCategory": "scheduledChange",
            "eventScopeCode": "ACCOUNT_SPECIFIC",
            "communicationId": self.uid(),
            "startTime": "Tue, 01 Dec 2026 00:00:00 GMT",
            "endTime": "Tue, 01 Dec 2026 02:00:00 GMT",
            "lastUpdatedTime": "Sun, 22 Nov 2026 12:00:00 GMT",
            "statusCode": "upcoming",
            "eventRegion": "us-east-1",
            "eventDescription": [{"language": "en_US", "latestDescription": DESCRIPTION}],
            "affectedEntities": [{"entityValue": i, "status": "PENDING"} for i in instances],
        }
        return self.envelope("aws.health", "AWS Health Event", detail, instances)

    def test_or_poison(self) -> str:
        choice = self.rng.randrange(3)
        if choice == 0:
            return _compact(
                {
                    "AccountId": "123456789012",
                    "RequestId": self.uid(),
                    "AutoScalingGroupARN": "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:x",
                    "AutoScalingGroupName": "eks-workers",
                    "Service": "AWS Auto Scaling",
                    "Event": "autoscaling:TEST_NOTIFICATION",
                    "Time": self.when(),
                }
            )
        if choice == 1:
            return "this is not JSON {"
        return _compact({"Records": [{"eventSource": "aws:s3"}]})


def realistic_mix(count: int, seed: int) -> list[str]:
    """``count`` bodies in the proportions of the module docstring, shuffled."""
    mix = Mix(random.Random(seed))
    makers: list[tuple[int, Callable[[], str]]] = [
        (20, mix.spot),
        (15, mix.rebalance),
        (20, mix.asg),
        (5, mix.asg_direct),
        (1, mix.asg_sns),
        (10, lambda: mix.asg(launch=True)),
        (10, lambda: mix.state(("stopping", "shutting-down", "terminated"))),
        (15, lambda: mix.state(("pending", "running"))),
        (2, mix.health),
        (1, mix.capacity),
        (1, mix.test_or_poison),
    ]
    total = sum(weight for weight, _ in makers)
    bodies = [make() for weight, make in makers for _ in range(count * weight // total)]
    while len(bodies) < count:
        bodies.append(mix.spot())
    mix.rng.shuffle(bodies)
    return bodies


def json_loads(body: str) -> object:
    """The baseline: plain ``json.loads``, catching the error a non-JSON body raises as a consumer would."""
    try:
        return json.loads(body)
    except ValueError:
        return None


def _time(fn: Callable[[str], object], bodies: list[str]) -> float:
    gc.collect()
    start = time.perf_counter()
    for body in bodies:
        fn(body)
    return time.perf_counter() - start


def main() -> None:
    """Run the benchmark and print its figures; the last line is the JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000, help="bodies in the mix (default 100000)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per side; the best is kept (default 5)")
    ap.add_argument("--seed", type=int, default=1, help="random seed of the mix (default 1)")
    args = ap.parse_args()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    bodies = realistic_mix(args.messages, args.seed)
    outcomes = Counter(parse_as_consumer(body).outcome for body in bodies)  # also warms up the validators
    size = sum(len(body) for body in bodies) / len(bodies)
    print(f"bodies: {len(bodies)}, mean {size:.0f} bytes, outcomes: {dict(outcomes)}")

    parse_times, json_times = [], []
    for round_ in range(args.rounds):
        parse_times.append(_time(parse_as_consumer, bodies))
        json_times.append(_time(json_loads, bodies))
        print(
            f"round {round_ + 1}: parse {len(bodies) / parse_times[-1]:,.0f} msgs/s, "
            f"json.loads {len(bodies) / json_times[-1]:,.0f} msgs/s"
        )
    parse_rate = len(bodies) / min(parse_times)
    json_rate = len(bodies) / min(json_times)
    print(
        json.dumps(
            {
                "parse_msgs_per_s": round(parse_rate),
                "json_loads_msgs_per_s": round(json_rate),
                "ratio": round(parse_rate / json_rate, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
