"""Observability: metric names in the exposition, reason classes, structured logs, the probe server over HTTP."""

from __future__ import annotations

import io
import json
import logging
import re
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import structlog
from prometheus_client import generate_latest

from queue_processor.app import ProbeServer
from queue_processor.config import Settings, parse_annotations
from queue_processor.observe.logs import CONVENTION_KEYS, configure_logging
from queue_processor.observe.metrics import BLOCKED_BUDGETS_MAX, OTHER_BUDGETS, Metrics
from queue_processor.outcomes import ErrorWhere, NodeAction, PoisonClass, SkipClass
from queue_processor.parse import MAX_MESSAGE_BYTES, parse
from tests.conftest import FIXTURES

QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/interruptions"
SPOT = "EC2 Spot Instance Interruption Warning"


def samples(text: str) -> dict[str, str]:
    """``{"name{labels}": "value"}`` of every sample line of a text exposition."""
    lines = (line for line in text.splitlines() if line and not line.startswith("#"))
    return dict(line.rsplit(" ", 1) for line in lines)


def metric_types(text: str) -> dict[str, str]:
    """``{family: type}`` from the ``# TYPE`` lines of a text exposition."""
    return dict(line.split(" ", 3)[2:4] for line in text.splitlines() if line.startswith("# TYPE "))


def record_one_of_each(metrics: Metrics) -> None:
    """One sample in every labelled family, so that each appears in the exposition."""
    metrics.node_action(NodeAction.CORDON_AND_DRAIN, ok=True)
    metrics.node_action(NodeAction.TAINT, ok=True)
    metrics.error(ErrorWhere.DELETE)
    metrics.error(ErrorWhere.RECEIVE)
    metrics.messages_received.labels(queue=QUEUE, kind="spot-interruption").inc()
    metrics.messages_deleted.labels(queue=QUEUE, kind="spot-interruption").inc()
    metrics.messages_requeued.labels(queue=QUEUE, kind="asg-terminate-lifecycle").inc()
    metrics.poison(QUEUE, PoisonClass.NOT_JSON)
    metrics.skipped(QUEUE, SkipClass.TEST_NOTIFICATION)
    metrics.event_to_cordon.observe(0.2)
    metrics.drain_duration.labels(kind="spot-interruption", result="drained").observe(42)
    metrics.in_flight_messages.inc()
    metrics.in_flight_operations.inc()
    metrics.draining_nodes.inc()
    metrics.drains_waiting("workers-a", 3)
    metrics.heartbeats.labels(result="ok").inc()
    metrics.lifecycle_completions.labels(result="continue").inc()
    metrics.evictions.labels(result="pdb-blocked").inc()
    metrics.kube_requests.labels(verb="patch", resource="nodes", code="200").inc()
    metrics.aws_requests.labels(service="sqs", operation="ReceiveMessage", result="ok").inc()
    metrics.receive_answered(QUEUE, at=1_700_000_000.5)
    metrics.drain_blocked("apps/web", 2)
    metrics.deleted_at_deadline()


# --- metrics


def test_drain_blocked_has_a_series_per_budget_while_it_blocks_and_a_bounded_number_of_them() -> None:
    metrics = Metrics(process_metrics=False)

    def series() -> dict[str, float]:
        return {
            sample.labels["pdb"]: sample.value
            for family in metrics.registry.collect()
            if family.name == "queue_processor_drain_blocked"
            for sample in family.samples
        }

    metrics.drain_blocked("apps/web", 2)
    metrics.drain_blocked("apps/db", 1)
    assert series() == {"apps/web": 2, "apps/db": 1}
    metrics.drain_blocked("apps/web", 0)
    assert series() == {"apps/db": 1}  # a budget that blocks nothing any more has no series
    for index in range(BLOCKED_BUDGETS_MAX + 5):
        metrics.drain_blocked(f"team/pdb-{index:03d}", 1)
    shown = series()
    assert len(shown) == BLOCKED_BUDGETS_MAX + 1
    assert shown[OTHER_BUDGETS] == 6  # the 6 last by name, apps/db sorts first
    assert sum(shown.values()) == BLOCKED_BUDGETS_MAX + 6


def test_nth_metrics_keep_their_unprefixed_names_and_labels() -> None:
    metrics = Metrics(process_metrics=False)
    record_one_of_each(metrics)
    text = metrics.render()[0].decode()
    values = samples(text)
    assert values['actions_total{node_action="cordon-and-drain",node_status="success"}'] == "1.0"
    assert values['actions_total{node_action="cordon",node_status="error"}'] == "0.0"
    # NTH's four actions and its one place of error (queue-processor mode); ours go to our own families
    nth_actions = {
        re.sub(r".*node_action=\"([^\"]+)\".*", r"\1", key) for key in values if key.startswith("actions_")
    }
    assert nth_actions == {"pre-drain", "cordon", "cordon-and-drain", "post-drain"}
    assert values['queue_processor_node_actions_total{node_action="taint",node_status="success"}'] == "1.0"
    assert [key for key in values if key.startswith("events_error")] == [
        'events_error_total{event_error_where="SQS_MONITOR"}'
    ]
    assert (
        values['events_error_total{event_error_where="SQS_MONITOR"}'] == "1.0"
    )  # the receive, not the delete
    assert values['queue_processor_errors_total{where="delete"}'] == "1.0"
    types = metric_types(text)
    assert types["actions_total"] == "counter"
    assert types["events_error_total"] == "counter"
    assert "_created" not in text
    assert not any(name.startswith("queue_processor_actions") for name in types)
    assert not any(name.startswith("queue_processor_events_error") for name in types)


def test_our_metrics_are_prefixed_with_the_documented_names_and_types() -> None:
    metrics = Metrics(process_metrics=False)
    record_one_of_each(metrics)
    types = metric_types(metrics.render()[0].decode())
    nths = ("actions_total", "events_error_total", "nth_tagged_instances", "nth_tagged_nodes")
    assert (types["nth_tagged_instances"], types["nth_tagged_nodes"]) == ("gauge", "gauge")
    ours = {name: kind for name, kind in types.items() if name not in nths}
    assert ours == {
        "queue_processor_node_actions_total": "counter",
        "queue_processor_errors_total": "counter",
        "queue_processor_messages_received_total": "counter",
        "queue_processor_messages_deleted_total": "counter",
        "queue_processor_messages_requeued_total": "counter",
        "queue_processor_messages_poison_total": "counter",
        "queue_processor_messages_skipped_total": "counter",
        "queue_processor_event_to_cordon_seconds": "histogram",
        "queue_processor_drain_duration_seconds": "histogram",
        "queue_processor_in_flight_messages": "gauge",
        "queue_processor_in_flight_operations": "gauge",
        "queue_processor_draining_nodes": "gauge",
        "queue_processor_drains_waiting": "gauge",
        "queue_processor_heartbeats_total": "counter",
        "queue_processor_lifecycle_completions_total": "counter",
        "queue_processor_operation_outcomes_total": "counter",
        "queue_processor_evictions_total": "counter",
        "queue_processor_drain_blocked": "gauge",
        "queue_processor_pods_deleted_at_deadline_total": "counter",
        "queue_processor_drained_pods_total": "counter",
        "queue_processor_surges_total": "counter",
        "queue_processor_kube_requests_total": "counter",
        "queue_processor_aws_requests_total": "counter",
        "queue_processor_last_receive_timestamp_seconds": "gauge",
        "queue_processor_build_info": "gauge",
    }


def test_sample_lines_carry_the_documented_labels() -> None:
    metrics = Metrics("1.2.3", process_metrics=False)
    record_one_of_each(metrics)
    values = samples(metrics.render()[0].decode())
    q = f'queue="{QUEUE}"'
    expected = {
        f'queue_processor_messages_received_total{{{q},kind="spot-interruption"}}': "1.0",
        f'queue_processor_messages_deleted_total{{{q},kind="spot-interruption"}}': "1.0",
        f'queue_processor_messages_requeued_total{{{q},kind="asg-terminate-lifecycle"}}': "1.0",
        f'queue_processor_messages_poison_total{{{q},reason="not-json"}}': "1.0",
        f'queue_processor_messages_skipped_total{{{q},reason_class="test-notification"}}': "1.0",
        'queue_processor_event_to_cordon_seconds_bucket{le="0.25"}': "1.0",
        'queue_processor_event_to_cordon_seconds_bucket{le="0.1"}': "0.0",
        'queue_processor_drain_duration_seconds_bucket{kind="spot-interruption",le="45.0",result="drained"}': (
            "1.0"
        ),
        'queue_processor_drain_duration_seconds_bucket{kind="spot-interruption",le="600.0",result="drained"}': (
            "1.0"
        ),
        "queue_processor_in_flight_messages": "1.0",
        'queue_processor_heartbeats_total{result="ok"}': "1.0",
        'queue_processor_heartbeats_total{result="validation-error"}': "0.0",
        'queue_processor_lifecycle_completions_total{result="continue"}': "1.0",
        'queue_processor_lifecycle_completions_total{result="no-active-action"}': "0.0",
        'queue_processor_evictions_total{result="pdb-blocked"}': "1.0",
        'queue_processor_kube_requests_total{code="200",resource="nodes",verb="patch"}': "1.0",
        'queue_processor_aws_requests_total{operation="ReceiveMessage",result="ok",service="sqs"}': "1.0",
        f"queue_processor_last_receive_timestamp_seconds{{{q}}}": "1.7000000005e+09",
        'queue_processor_build_info{version="1.2.3"}': "1.0",
    }
    # prometheus-client sorts label names in its output; compare on the sorted form.
    normalised = {_sort_labels(key): value for key, value in values.items()}
    for key, value in expected.items():
        assert normalised[_sort_labels(key)] == value, key


def _sort_labels(sample: str) -> str:
    match = re.fullmatch(r"(?P<name>[^{]+)(?:\{(?P<labels>.*)\})?", sample)
    assert match is not None
    if not match.group("labels"):
        return sample
    labels = sorted(re.findall(r'\w+="[^"]*"', match.group("labels")))
    return f"{match.group('name')}{{{','.join(labels)}}}"


def test_each_metrics_object_has_its_own_registry() -> None:
    first, second = Metrics(process_metrics=False), Metrics(process_metrics=False)
    first.node_action(NodeAction.CORDON, ok=False)
    assert 'actions_total{node_action="cordon",node_status="error"} 1.0' in first.render()[0].decode()
    assert 'actions_total{node_action="cordon",node_status="error"} 0.0' in second.render()[0].decode()


def test_process_metrics_are_included_by_default() -> None:
    text = Metrics().render()[0].decode()
    assert "process_cpu_seconds_total" in text or "python_info" in text
    assert "python_gc_objects_collected_total" in text


def test_render_negotiates_openmetrics() -> None:
    metrics = Metrics(process_metrics=False)
    body, content_type = metrics.render("")
    assert content_type.startswith("text/plain")
    assert body == generate_latest(metrics.registry)  # the Prometheus text format
    body, content_type = metrics.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


# --- reason classes, on the reasons the parser really gives


def eventbridge(detail: dict[str, Any], **envelope: Any) -> str:
    body: dict[str, Any] = {
        "version": "0",
        "id": "5f0e2a8c-0000-4000-8000-000000000001",
        "detail-type": SPOT,
        "source": "aws.ec2",
        "time": "2026-11-22T12:00:00Z",
        "detail": detail,
    }
    body.update(envelope)
    return json.dumps({key: value for key, value in body.items() if value is not None})


def sns(message: str) -> str:
    return json.dumps({"Type": "Notification", "MessageId": "m", "Message": message})


POISON_BODIES = [
    pytest.param("", "not-json", id="empty"),
    pytest.param("{not json", "not-json", id="not-json"),
    pytest.param(sns("{oops"), "not-json", id="sns-message-not-json"),
    pytest.param("[1, 2]", "not-object", id="array"),
    pytest.param("null", "not-object", id="null"),
    pytest.param('"text"', "not-object", id="string"),
    pytest.param("x" * (MAX_MESSAGE_BYTES + 1), "too-large", id="too-large-str"),
    pytest.param(b" " * (MAX_MESSAGE_BYTES + 1), "too-large", id="too-large-bytes"),
    pytest.param('{"Records": [{"eventSource": "aws:s3"}]}', "unknown-shape", id="s3-event"),
    pytest.param(sns(sns(eventbridge({"instance-id": "i-1"}))), "unknown-shape", id="sns-in-sns"),
    pytest.param(eventbridge({}), "missing-field", id="spot-no-instance-id"),
    pytest.param(eventbridge({"instance-id": "i-1"}, time=None), "missing-field", id="spot-no-time"),
    pytest.param(eventbridge({"instance-id": "i-1"}, source=None), "missing-field", id="no-source"),
    pytest.param(json.dumps({"Type": "Notification"}), "missing-field", id="sns-no-message"),
    pytest.param(eventbridge({"instance-id": 12}), "invalid-field", id="spot-id-number"),
    pytest.param(eventbridge({"instance-id": "  "}), "invalid-field", id="spot-id-blank"),
    pytest.param(eventbridge({"instance-id": "i-1"}, time="yesterday"), "invalid-field", id="bad-time"),
]


@pytest.mark.parametrize(("body", "expected"), POISON_BODIES)
def test_the_parser_classes_each_poison_reason(body: str | bytes, expected: str) -> None:
    result = parse(body)
    assert result.outcome == "poison"
    assert result.reason is not None
    assert result.reason_class == expected, result.reason
    assert isinstance(result.reason_class, PoisonClass)


def test_every_poison_fixture_has_a_specific_class() -> None:
    results = {path.name: parse(path.read_bytes()) for path in sorted(FIXTURES.glob("poison_*.json"))}
    assert results
    for name, result in results.items():
        assert isinstance(result.reason_class, PoisonClass), name
        assert result.reason_class is not PoisonClass.OTHER, (name, result.reason)


def test_a_parser_bug_is_poison_of_class_other(monkeypatch: pytest.MonkeyPatch) -> None:
    import queue_processor.parse as parse_module

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("x")

    monkeypatch.setattr(parse_module, "_parse", broken)
    result = parse("{}")
    assert result.outcome == "poison"
    assert result.reason_class is PoisonClass.OTHER
    assert result.reason == "unexpected KeyError while parsing: 'x'"


def test_a_poison_message_is_counted_by_class_not_by_its_free_text() -> None:
    metrics = Metrics(process_metrics=False)
    result = parse("{not json")
    reason = result.reason
    assert reason is not None
    metrics.poison(QUEUE, PoisonClass(result.reason_class))
    text = metrics.render()[0].decode()
    assert reason not in text
    assert f'queue_processor_messages_poison_total{{queue="{QUEUE}",reason="not-json"}} 1.0' in text


def test_every_skip_fixture_has_a_specific_class() -> None:
    seen = set()
    for path in sorted(FIXTURES.glob("skip_*.json")):
        result = parse(path.read_bytes())
        assert result.outcome == "skip", path.name
        assert result.reason is not None
        reason_class = result.reason_class
        assert isinstance(reason_class, SkipClass), (path.name, result.reason)
        assert not isinstance(reason_class, PoisonClass)  # not poison
        seen.add(reason_class)
    assert {"test-notification", "unhandled-kind", "unhandled-state", "sns-control"} <= seen


# --- logs


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put the root logger and structlog back as they were after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    structlog.reset_defaults()


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.mark.usefixtures("restore_logging")
def test_json_lines_carry_bound_keys_timestamp_and_level() -> None:
    out = io.StringIO()
    configure_logging("info", json=True, stream=out)
    log = structlog.stdlib.get_logger(message_id="m-1", kind="spot-interruption")
    log.bind(event_id="spot-interruption-0123", instance_id="i-0abc").info("cordoned", node="ip-10-0-0-1")
    log.debug("not shown at info")
    (line,) = json_lines(out)
    assert line["event"] == "cordoned"
    assert line["level"] == "info"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", line["timestamp"])
    assert line["logger"] == __name__
    assert {key: line[key] for key in CONVENTION_KEYS} == {
        "message_id": "m-1",
        "event_id": "spot-interruption-0123",
        "instance_id": "i-0abc",
        "node": "ip-10-0-0-1",
        "kind": "spot-interruption",
    }
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]


@pytest.mark.usefixtures("restore_logging")
def test_contextvars_and_exceptions_in_json() -> None:
    out = io.StringIO()
    configure_logging("debug", json=True, stream=out)
    log = structlog.stdlib.get_logger()
    with structlog.contextvars.bound_contextvars(message_id="m-2"):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("handling failed")
    (line,) = json_lines(out)
    assert line["message_id"] == "m-2"
    assert line["level"] == "error"
    assert line["exception"][0]["exc_type"] == "RuntimeError"
    assert "locals" not in line["exception"][0]["frames"][0]


@pytest.mark.usefixtures("restore_logging")
def test_stdlib_logging_goes_through_the_same_renderer_and_level() -> None:
    out = io.StringIO()
    configure_logging("WARNING", json=True, stream=out)
    logging.getLogger("botocore.hooks").info("dropped below the level")
    logging.getLogger("aiohttp.server").warning("slow request: %d ms", 1500)
    (line,) = json_lines(out)
    assert line["logger"] == "aiohttp.server"
    assert line["level"] == "warning"
    assert line["event"] == "slow request: 1500 ms"
    assert "timestamp" in line


@pytest.mark.usefixtures("restore_logging")
def test_configure_logging_is_idempotent_and_switches_renderer() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", json=True, stream=first)
    log = structlog.stdlib.get_logger(node="n-1")
    log.info("one")
    configure_logging("info", json=True, stream=first)
    configure_logging("info", json=False, stream=second)
    log.info("two")
    logging.getLogger("kubernetes.client").info("three")
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_queue_processor_handler", False)]
    assert len(ours) == 1
    assert [line["event"] for line in json_lines(first)] == ["one"]
    console = second.getvalue().splitlines()
    assert len(console) == 2
    assert "two" in console[0]
    assert "node=n-1" in console[0]
    assert "three" in console[1]
    with pytest.raises(json.JSONDecodeError):
        json.loads(console[0])


def test_configure_logging_rejects_unknown_levels() -> None:
    with pytest.raises(ValueError, match="verbose"):
        configure_logging("verbose", json=True)


# --- the probe server, over HTTP


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def get(session: aiohttp.ClientSession, port: int | None, path: str) -> tuple[int, str, str]:
    assert port
    async with session.get(f"http://127.0.0.1:{port}{path}") as response:
        return response.status, response.headers["Content-Type"], await response.text()


async def test_failing_liveness_check_is_named_in_a_503(http: aiohttp.ClientSession) -> None:
    alive = {"receive-loops": True}
    server = ProbeServer(
        Metrics(process_metrics=False),
        metrics_port=0,
        probes_port=0,
        host="127.0.0.1",
        liveness={"receive-loops": lambda: alive["receive-loops"], "event-loop": lambda: True},
    )
    async with server:
        status, content_type, text = await get(http, server.probes_port, "/healthz")
        assert (status, json.loads(text)["status"]) == (200, "ok")
        assert content_type.startswith("application/json")
        alive["receive-loops"] = False
        status, _, text = await get(http, server.probes_port, "/healthz")
    assert status == 503
    body = json.loads(text)
    assert body["failing"] == ["receive-loops"]
    assert body["checks"] == {"receive-loops": False, "event-loop": True}


async def test_readiness_checks_and_a_raising_check(http: aiohttp.ClientSession) -> None:
    now, answered = [1000.0], [None]  # answered: when SQS last answered (None: never)

    def sqs() -> bool:
        return answered[0] is not None and now[0] - answered[0] < 60

    server = ProbeServer(
        Metrics(process_metrics=False),
        metrics_port=0,
        probes_port=0,
        host="127.0.0.1",
        readiness={"sqs-answered": sqs},
    )

    async with server:
        status, _, text = await get(http, server.probes_port, "/readyz")
        assert (status, json.loads(text)["failing"]) == (503, ["sqs-answered"])  # never answered yet
        answered[0] = now[0]
        now[0] += 59
        assert (await get(http, server.probes_port, "/readyz"))[0] == 200
        assert (await get(http, server.probes_port, "/healthz"))[0] == 200  # no liveness check: alive

        def broken() -> bool:
            raise ConnectionError("no route")

        server.readiness["api-server"] = broken  # a check added while serving counts at once
        status, _, text = await get(http, server.probes_port, "/readyz")
        assert status == 503
        assert json.loads(text)["errors"] == {"api-server": "ConnectionError: no route"}
        now[0] += 2
        status, _, text = await get(http, server.probes_port, "/readyz")
    assert json.loads(text)["failing"] == ["sqs-answered", "api-server"]


async def test_metrics_endpoint_serves_the_exposition(http: aiohttp.ClientSession) -> None:
    metrics = Metrics("9.9.9", process_metrics=False)
    metrics.node_action(NodeAction.CORDON, ok=True)
    async with ProbeServer(metrics, metrics_port=0, probes_port=0, host="127.0.0.1") as server:
        assert server.shared
        assert server.metrics_port == server.probes_port  # equal ports: one listener
        status, content_type, text = await get(http, server.metrics_port, "/metrics")
        assert (await get(http, server.metrics_port, "/healthz"))[0] == 200
    assert status == 200
    assert content_type.startswith("text/plain")
    assert "version=0.0.4" in content_type
    assert 'actions_total{node_action="cordon",node_status="success"} 1.0' in text
    assert 'queue_processor_build_info{version="9.9.9"} 1.0' in text


async def test_separate_ports_serve_separate_paths(http: aiohttp.ClientSession) -> None:
    with socket.socket() as taken:  # a free port for the probes, another one (0) for the metrics
        taken.bind(("127.0.0.1", 0))
        free = taken.getsockname()[1]
    server = ProbeServer(Metrics(process_metrics=False), metrics_port=0, probes_port=free, host="127.0.0.1")
    async with server:
        assert server.metrics_port
        assert server.probes_port
        assert server.metrics_port != server.probes_port
        assert (await get(http, server.metrics_port, "/metrics"))[0] == 200
        assert (await get(http, server.metrics_port, "/healthz"))[0] == 404
        assert (await get(http, server.probes_port, "/healthz"))[0] == 200
        assert (await get(http, server.probes_port, "/readyz"))[0] == 200
        assert (await get(http, server.probes_port, "/metrics"))[0] == 404
        port = server.probes_port
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(http, port, "/healthz")
    assert (server.metrics_port, server.probes_port) == (0, free)  # stopped: back to the ports asked for


async def test_disabled_metrics_server_serves_probes_only(http: aiohttp.ClientSession) -> None:
    async with ProbeServer(
        Metrics(process_metrics=False), metrics_port=None, probes_port=0, host="127.0.0.1"
    ) as server:
        assert server.metrics_port is None
        assert (await get(http, server.probes_port, "/healthz"))[0] == 200
        assert (await get(http, server.probes_port, "/metrics"))[0] == 404


def test_from_settings_follows_the_enable_flags_and_ports() -> None:
    same = ProbeServer.from_settings(
        Settings(queue_url=QUEUE, prometheus_server_port=9000, probes_server_port=9000),
        Metrics(process_metrics=False),
    )
    assert (same.metrics_port, same.probes_port, same.shared) == (9000, 9000, True)
    off = ProbeServer.from_settings(
        Settings(queue_url=QUEUE, enable_prometheus_server=False), Metrics(process_metrics=False)
    )
    assert (off.metrics_port, off.probes_port, off.shared) == (None, 8080, False)
    two = ProbeServer.from_settings(Settings(queue_url=QUEUE), Metrics(process_metrics=False))
    assert (two.metrics_port, two.probes_port, two.shared) == (9092, 8080, False)


# --- Kubernetes Events


def test_extra_annotations_are_nths_comma_separated_pairs() -> None:
    assert parse_annotations("") == {}
    assert parse_annotations("team=platform, cost-center = 42,") == {"team": "platform", "cost-center": "42"}
    assert parse_annotations("url=https://x/?a=b") == {"url": "https://x/?a=b"}  # NTH refuses this one
    for bad in ("team", "=value", "a=b,oops"):
        with pytest.raises(ValueError, match="is not key=value"):
            parse_annotations(bad)
