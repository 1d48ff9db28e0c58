"""Our own fixtures, written from the AWS documentation, give the outcomes listed in
tests/fixtures/expected-messages.json (one per kind, per skip reason and per poison reason)."""

from __future__ import annotations

import json

import pytest

from queue_processor.parse import parse
from tests.conftest import FIXTURES

EXPECTED = json.loads((FIXTURES.parent / "expected-messages.json").read_text())


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(path.name for path in FIXTURES.glob("*.json")) == sorted(EXPECTED)


def test_fixtures_cover_every_kind_and_outcome() -> None:
    from queue_processor.events import EventKind

    kinds = {event["kind"] for expected in EXPECTED.values() for event in expected["events"]}
    assert kinds == {kind.value for kind in EventKind}
    outcomes = [expected["outcome"] for expected in EXPECTED.values()]
    assert min(outcomes.count(outcome) for outcome in ("events", "skip", "poison")) >= 10


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture(name: str) -> None:
    expected = EXPECTED[name]
    result = parse((FIXTURES / name).read_bytes())
    assert result.outcome == expected["outcome"], result.reason
    assert result.envelope == expected["envelope"]
    if expected["reason_contains"] is None:
        assert result.reason is None
    else:
        assert expected["reason_contains"] in (result.reason or ""), result.reason
    got = [
        {
            "kind": event.kind.value,
            "instance_id": event.instance_id,
            "start_time": event.model_dump(mode="json")["start_time"],
        }
        for event in result.events
    ]
    assert got == expected["events"]
