"""The parser's rules, one behaviour per test, on bodies built here from the documented formats."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import pytest

from queue_processor import parse as parse_module
from queue_processor.events import (
    AsgLifecycleEvent,
    EventKind,
    ScheduledChangeEvent,
    SpotInterruptionEvent,
    SqsMessageRef,
    make_event_id,
)
from queue_processor.parse import MAX_MESSAGE_BYTES, REGISTRY, parse

MESSAGE = SqsMessageRef(
    queue_url="https://sqs.us-east-1.amazonaws.com/1/q", message_id="m-1", receipt_handle="rh"
)


def eventbridge(detail_type: str, detail: dict[str, Any], source: str = "aws.ec2", **envelope: Any) -> str:
    body = {
        "version": "0",
        "id": "5f0e2a8c-0000-4000-8000-000000000001",
        "detail-type": detail_type,
        "source": source,
        "account": "123456789012",
        "time": "2026-11-22T12:00:00Z",
        "region": "us-east-1",
        "resources": [],
        "detail": detail,
    }
    body.update(envelope)
    return json.dumps(body, ensure_ascii=False)


SPOT = "EC2 Spot Instance Interruption Warning"


def spot(instance_id: str = "i-0abc", **envelope: Any) -> str:
    return eventbridge(SPOT, {"instance-id": instance_id, "instance-action": "terminate"}, **envelope)


def lifecycle(transition: str = "TERMINATING", **fields: Any) -> dict[str, Any]:
    return {
        "LifecycleActionToken": "71dc6ab2-0000-4000-8000-000000000002",
        "AutoScalingGroupName": "workers",
        "LifecycleHookName": "drain",
        "EC2InstanceId": "i-0def",
        "LifecycleTransition": f"autoscaling:EC2_INSTANCE_{transition}",
        **fields,
    }


def direct(**fields: Any) -> str:
    body = {
        **lifecycle(),
        "AccountId": "123456789012",
        "Service": "AWS Auto Scaling",
        "RequestId": "r-1",
        "Time": "2026-11-22T12:00:00.500Z",
    }
    body.update(fields)
    return json.dumps({key: value for key, value in body.items() if value is not None})


def sns(message: str, **fields: Any) -> str:
    return json.dumps(
        {
            "Type": "Notification",
            "MessageId": "s-1",
            "TopicArn": "arn:aws:sns:x",
            "Message": message,
            **fields,
        }
    )


def test_spot_starts_when_the_two_minute_notice_ends() -> None:
    (event,) = parse(spot()).events
    assert isinstance(event, SpotInterruptionEvent)
    assert event.time == datetime(2026, 11, 22, 12, tzinfo=UTC)
    assert event.start_time == event.time + timedelta(seconds=120)
    assert event.instance_action == "terminate"


def test_the_sqs_message_is_attached_to_every_event() -> None:
    (event,) = parse(spot(), MESSAGE).events
    assert event.message == MESSAGE
    health = eventbridge(
        "AWS Health Event",
        {
            "service": "EC2",
            "eventTypeCategory": "scheduledChange",
            "startTime": "Tue, 01 Dec 2026 00:00:00 GMT",
            "affectedEntities": [{"entityValue": "i-1"}, {"entityValue": "i-2"}],
        },
        source="aws.health",
    )
    assert [e.message for e in parse(health, MESSAGE).events] == [MESSAGE, MESSAGE]
    assert parse(direct(), MESSAGE).events[0].message == MESSAGE


def test_health_gives_one_event_per_affected_instance_with_its_start_time() -> None:
    body = eventbridge(
        "AWS Health Event",
        {
            "eventArn": "arn:aws:health:us-east-1::event/EC2/X/1",
            "service": "EC2",
            "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "eventTypeCategory": "scheduledChange",
            "startTime": "Tue, 01 Dec 2026 00:00:00 GMT",
            "endTime": "2026-12-01T02:00:00Z",
            "affectedEntities": [{"entityValue": "i-1"}, {"entityValue": "i-2"}, {"entityValue": "i-1"}],
        },
        source="aws.health",
    )
    events = parse(body).events
    assert [e.instance_id for e in events] == ["i-1", "i-2"]
    assert all(isinstance(e, ScheduledChangeEvent) for e in events)
    assert {e.start_time for e in events} == {datetime(2026, 12, 1, tzinfo=UTC)}
    assert {e.end_time for e in events} == {datetime(2026, 12, 1, 2, tzinfo=UTC)}
    assert len({e.event_id for e in events}) == 2


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        ("stopping", "events"),
        ("stopped", "events"),
        ("shutting-down", "events"),
        ("terminated", "events"),
        ("pending", "skip"),
        ("running", "skip"),
        ("stopping-pending", "skip"),
        ("Stopping", "skip"),
        ("terminated ", "events"),
    ],
)
def test_state_changes_are_matched_exactly(state: str, outcome: str) -> None:
    body = eventbridge("EC2 Instance State-change Notification", {"instance-id": "i-1", "state": state})
    assert parse(body).outcome == outcome


def test_an_asg_action_has_the_same_identity_through_eventbridge_and_straight_to_sqs() -> None:
    via_eventbridge = parse(
        eventbridge("EC2 Instance-terminate Lifecycle Action", lifecycle(), "aws.autoscaling")
    )
    via_direct = parse(direct())
    via_sns = parse(sns(direct()))
    ids = {result.events[0].event_id for result in (via_eventbridge, via_direct, via_sns)}
    assert len(ids) == 1
    assert [r.envelope for r in (via_eventbridge, via_direct, via_sns)] == [
        "eventbridge",
        "asg-direct",
        "sns+asg-direct",
    ]


def test_warm_pool_fields_are_carried() -> None:
    fields = lifecycle("LAUNCHING", Origin="EC2", Destination="WarmPool", NotificationMetadata="cluster=a")
    (event,) = parse(eventbridge("EC2 Instance-launch Lifecycle Action", fields, "aws.autoscaling")).events
    assert isinstance(event, AsgLifecycleEvent)
    assert (event.kind, event.origin, event.destination) == (
        EventKind.ASG_LAUNCH_LIFECYCLE,
        "EC2",
        "WarmPool",
    )
    assert event.notification_metadata == "cluster=a"
    assert event.lifecycle_transition == "autoscaling:EC2_INSTANCE_LAUNCHING"


def test_a_transition_that_contradicts_the_detail_type_is_poison() -> None:
    body = eventbridge("EC2 Instance-terminate Lifecycle Action", lifecycle("LAUNCHING"), "aws.autoscaling")
    result = parse(body)
    assert result.outcome == "poison"
    assert (
        result.reason == "detail.LifecycleTransition: Input should be 'autoscaling:EC2_INSTANCE_TERMINATING'"
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        ("[]", "not a JSON object"),
        ('"text"', "not a JSON object"),
        ("null", "not a JSON object"),
        ('{"Records": []}', "not a known message shape"),
        (spot(time=None), "time"),
        (eventbridge(SPOT, {}), "detail.instance-id: Field required"),
        (eventbridge(SPOT, {"instance-id": "  "}), "detail.instance-id"),
        (eventbridge(SPOT, {"instance-id": 7}), "detail.instance-id: Input should be a valid string"),
        (eventbridge(SPOT, []), "detail"),  # type: ignore[arg-type]
        (direct(Time=None), "Time: Field required"),
        (direct(EC2InstanceId=None), "EC2InstanceId: Field required"),
        (sns("{"), "not JSON"),
        (sns(sns(spot())), "SNS envelope inside an SNS envelope"),
        (json.dumps({"Type": "Notification"}), "Message: Field required"),
        (
            json.dumps(
                {"detail-type": SPOT, "time": "2026-11-22T12:00:00Z", "detail": {"instance-id": "i-1"}}
            ),
            "source: Field required",
        ),
    ],
)
def test_poison_reasons(body: str, reason: str) -> None:
    result = parse(body)
    assert result.outcome == "poison"
    assert reason in (result.reason or ""), result.reason
    assert result.events == ()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (eventbridge("EC2 Instance Launch Successful", {}, "aws.autoscaling"), "is not acted on"),
        (eventbridge(SPOT, {"instance-id": "i-1"}, "my.app"), "'my.app'"),
        (
            eventbridge(
                "EC2 Instance-terminate Lifecycle Action",
                {"Event": "autoscaling:TEST_NOTIFICATION"},
                "aws.autoscaling",
            ),
            "test notification",
        ),
        (
            direct(LifecycleTransition=None, EC2InstanceId=None, Event="autoscaling:EC2_INSTANCE_LAUNCH"),
            "is not acted on",
        ),
        (json.dumps({"Type": "SubscriptionConfirmation", "Message": "confirm"}), "SubscriptionConfirmation"),
        (
            eventbridge(
                "AWS Health Event", {"service": "EBS", "eventTypeCategory": "scheduledChange"}, "aws.health"
            ),
            "EBS",
        ),
        (
            eventbridge("AWS Health Event", {"service": "EC2", "eventTypeCategory": "issue"}, "aws.health"),
            "issue",
        ),
    ],
)
def test_skip_reasons(body: str, reason: str) -> None:
    result = parse(body)
    assert result.outcome == "skip", result.reason
    assert reason in (result.reason or "")


def test_size_limit_is_one_mebibyte_of_utf8() -> None:
    padding = "x" * (MAX_MESSAGE_BYTES - len(spot()) - 20)
    fits = spot(padding=padding)
    assert len(fits.encode()) <= MAX_MESSAGE_BYTES
    assert parse(fits).outcome == "events"
    # The same number of characters, but some take two bytes in UTF-8: over the limit.
    over = spot(padding="é" * 20 + padding[20:])
    assert len(over.encode()) > MAX_MESSAGE_BYTES
    assert parse(over).reason == f"larger than SQS allows: {len(over.encode())} bytes > {MAX_MESSAGE_BYTES}"
    assert parse(over.encode()).outcome == "poison"


def test_bytes_and_text_give_the_same_result() -> None:
    for body in (spot(), direct(), sns(spot())):
        assert parse(body.encode()) == parse(body)
    assert parse(b"\xff\xfe").outcome == "poison"


def test_an_unexpected_error_in_a_kind_is_poison_not_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(message: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(parse_module, "finish_health", broken)
    result = parse(eventbridge("AWS Health Event", {"service": "EC2"}, source="aws.health"))
    assert result.outcome == "poison"
    assert result.reason == "unexpected RuntimeError while parsing: boom"


def test_each_detail_type_names_one_kind() -> None:
    # Kinds are told apart by detail-type alone: none may be listed under two models or two sources.
    detail_types = [
        detail_type
        for model in set(REGISTRY.values())
        for detail_type in get_args(model.model_fields["detail_type"].annotation)
    ]
    assert len(set(detail_types)) == len(detail_types) == len(REGISTRY)


EVENT_ID = re.compile(r"^[a-z0-9-]{1,63}$")


def test_event_ids_are_valid_taint_values_and_unique_per_instance() -> None:
    ids = {make_event_id(kind, f"i-{n}", "same-key") for kind in EventKind for n in range(50)}
    assert len(ids) == 50 * len(EventKind)
    assert all(EVENT_ID.match(event_id) for event_id in ids)


def test_a_time_without_a_timezone_is_poison() -> None:
    # AWS always sends UTC with a "Z"; a time without a zone is ambiguous, so it is not guessed.
    result = parse(spot(time="2026-11-22T12:00:00"))
    assert result.outcome == "poison"
    assert result.reason == "time: Input should have timezone info"
    assert parse(spot(time="2026-11-22T14:00:00+02:00")).events[0].time == datetime(
        2026, 11, 22, 12, tzinfo=UTC
    )


@pytest.mark.parametrize(
    "body",
    [
        spot(time="9999-12-31T23:59:59Z"),  # + the 120 s notice: past the last representable time
        spot(time="9999-12-31T23:58:30Z"),
    ],
)
def test_a_start_time_past_the_representable_is_poison_at_parse_time(body: str) -> None:
    result = parse(body, MESSAGE)
    assert result.outcome == "poison"
    assert (result.reason or "").startswith("time: start time out of range")


def test_a_far_future_time_that_fits_is_an_event() -> None:
    (event,) = parse(spot(time="9999-12-31T23:57:59Z")).events
    assert event.start_time == datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    (action,) = parse(direct(Time="9999-12-31T23:59:59Z")).events  # starts at its time: representable
    assert action.start_time == datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def test_an_event_built_in_code_derives_the_same_identity_as_a_parsed_one() -> None:
    (parsed,) = parse(spot()).events
    built = SpotInterruptionEvent(instance_id="i-0abc", time=parsed.time, source_id=parsed.source_id)
    assert built.event_id == parsed.event_id
    assert built.start_time == parsed.start_time
    assert built.model_dump() == {**parsed.model_dump(), "instance_action": None}
