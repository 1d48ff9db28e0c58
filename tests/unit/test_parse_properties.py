"""Properties of ``parse``: total on any input, and event IDs independent of how the JSON is written."""

from __future__ import annotations

import copy
import json
import os
import random
import re
from datetime import UTC
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from queue_processor.parse import ParseResult, parse
from tests.conftest import FIXTURES, SHARED_SAMPLES

EVENT_ID = re.compile(r"^[a-z0-9-]{1,63}$")

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


def _valid_bodies() -> list[dict[str, Any]]:
    """Every sample and fixture body that parses into events, as JSON objects."""
    bodies = []
    for directory in (SHARED_SAMPLES, FIXTURES):
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
            text = path.read_text(errors="replace")
            if len(text) < 100_000 and parse(text).outcome == "events":
                bodies.append(json.loads(text))
    return bodies


VALID = _valid_bodies()


def check_result(result: ParseResult) -> None:
    """What any result must look like, whatever the input."""
    assert isinstance(result, ParseResult)
    assert result.outcome in ("events", "skip", "poison")
    if result.outcome == "events":
        assert result.events
        assert result.reason is None
        for event in result.events:
            assert event.instance_id.strip()
            assert EVENT_ID.match(event.event_id)
            assert event.time.tzinfo is not None
            assert event.start_time.tzinfo is not None
    else:
        assert not result.events
        assert result.reason


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            paths += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            paths += _paths(child, (*prefix, index))
    return paths


def _mutate(body: Any, path: tuple[Any, ...], replacement: Any, remove: bool) -> Any:
    copy = json.loads(json.dumps(body))
    parent = copy
    for part in path[:-1]:
        parent = parent[part]
    if remove:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return copy


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: _shuffled(child, rng) for key, child in items}
    if isinstance(value, list):
        return [_shuffled(child, rng) for child in value]
    return value


def test_there_are_valid_bodies_to_mutate() -> None:
    assert len(VALID) >= 5


@given(st.text())
def test_parse_never_raises_on_any_text(body: str) -> None:
    check_result(parse(body))


@given(st.binary())
def test_parse_never_raises_on_any_bytes(body: bytes) -> None:
    check_result(parse(body))


@given(json_values)
def test_parse_never_raises_on_any_json(value: Any) -> None:
    check_result(parse(json.dumps(value)))


@given(json_values, st.sampled_from(["detail", "Message", "LifecycleTransition", "Type", "source"]))
def test_parse_never_raises_on_json_objects_with_known_keys(value: Any, key: str) -> None:
    base = {"detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2"}
    check_result(parse(json.dumps({**base, key: value})))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(st.data())
def test_parse_never_raises_on_valid_messages_with_a_field_removed_or_retyped(data: st.DataObject) -> None:
    body = data.draw(st.sampled_from(VALID))
    paths = _paths(body)
    path = data.draw(st.sampled_from(paths))
    remove = data.draw(st.booleans())
    replacement = data.draw(json_values)
    mutated = _mutate(body, path, replacement, remove)
    check_result(parse(json.dumps(mutated)))
    # The SNS-wrapped form of any body behaves the same way.
    check_result(parse(json.dumps({"Type": "Notification", "Message": json.dumps(mutated)})))


@given(st.data())
def test_event_ids_do_not_depend_on_key_order_or_whitespace(data: st.DataObject) -> None:
    body = data.draw(st.sampled_from(VALID))
    seed = data.draw(st.integers(0, 2**32 - 1))
    indent = data.draw(st.sampled_from([None, 0, 1, 2, 4, "\t"]))
    separators = data.draw(st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : ")]))
    if indent is not None:
        separators = (separators[0].rstrip(), separators[1])
    original = parse(json.dumps(body))
    rewritten_text = json.dumps(_shuffled(body, random.Random(seed)), indent=indent, separators=separators)
    assume(len(rewritten_text.encode()) <= 1_048_576)
    rewritten = parse(rewritten_text)
    assert rewritten.outcome == original.outcome == "events"
    assert [e.event_id for e in rewritten.events] == [e.event_id for e in original.events]
    assert [e.model_dump() for e in rewritten.events] == [e.model_dump() for e in original.events]


#: Examples per run of the structured fuzzer: bounded in CI; raise it to fuzz longer (QP_FUZZ_EXAMPLES=100000).
FUZZ_EXAMPLES = int(os.environ.get("QP_FUZZ_EXAMPLES", "400"))
#: One valid EventBridge body per (source, detail-type) among the samples and fixtures.
BY_KIND = {(body["source"], body["detail-type"]): body for body in VALID if "detail-type" in body}
timestamps = st.one_of(
    st.datetimes(timezones=st.just(UTC)).map(lambda moment: moment.isoformat().replace("+00:00", "Z")),
    st.datetimes(timezones=st.timezones()).map(lambda moment: moment.isoformat()),
    st.datetimes().map(str),
    st.text(max_size=30),
    st.integers(),
)
instance_ids = st.one_of(st.from_regex(r"i-[0-9a-f]{8,17}", fullmatch=True), st.text(max_size=40))
field_values = st.one_of(json_scalars, instance_ids, timestamps, json_values)


def test_every_kind_has_a_body_to_fuzz() -> None:
    assert len(BY_KIND) >= 6


@settings(max_examples=FUZZ_EXAMPLES)
@given(st.data())
def test_parse_never_raises_on_structured_messages(data: st.DataObject) -> None:
    # A grammar-shaped fuzzer: a real body of a known kind, its time and any of its detail's fields replaced
    # by values of plausible and implausible shapes, removed, or joined by unknown ones, then sent as it is,
    # wrapped in SNS, or wrapped twice.
    body = copy.deepcopy(BY_KIND[data.draw(st.sampled_from(sorted(BY_KIND)))])
    body["time"] = data.draw(timestamps)
    detail = body["detail"]
    for field in sorted(detail):
        action = data.draw(st.sampled_from(["keep", "replace", "remove"]))
        if action == "replace":
            detail[field] = data.draw(field_values)
        elif action == "remove":
            del detail[field]
    detail.update(data.draw(st.dictionaries(st.text(max_size=12), field_values, max_size=3)))
    text = json.dumps(body)
    for _ in range(data.draw(st.integers(0, 2))):
        text = json.dumps({"Type": "Notification", "MessageId": "m", "Message": text})
    check_result(parse(text))
