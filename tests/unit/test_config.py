"""Settings: NTH names and defaults, aliases, and one-line errors naming the variable."""

from __future__ import annotations

import pytest

from queue_processor.cli import load_settings
from queue_processor.config import Settings, region_from_queue_url
from queue_processor.outcomes import ConfigError

QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/queue-processor"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting leaks in from the environment the tests run in."""
    import os

    for name in list(os.environ):
        if name.lower() in Settings.model_fields or name in (
            "CHECK_ASG_TAG_BEFORE_DRAINING",
            "MANAGED_ASG_TAG",
            "GRACE_PERIOD",
            "NAMESPACE",
        ):
            monkeypatch.delenv(name)


def test_defaults_follow_nth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    settings = load_settings()
    assert settings.aws_region == "us-east-1"
    assert settings.check_tag_before_draining is True
    assert settings.managed_tag == "aws-node-termination-handler/managed"
    assert settings.delete_local_data is True
    assert settings.ignore_daemon_sets is True
    assert settings.pod_termination_grace_period == -1
    assert settings.node_termination_grace_period == 120
    assert settings.complete_lifecycle_action_delay_seconds == -1
    assert settings.taint_effect == "NoSchedule"
    assert settings.prometheus_server_port == 9092
    assert settings.probes_server_port == 8080
    assert settings.webhook_headers == {"Content-type": "application/json"}
    assert (settings.cordon_only, settings.taint_node, settings.dry_run, settings.use_apiserver_cache) == (
        False,
        False,
        False,
        False,
    )


@pytest.mark.parametrize(
    ("env", "field", "value"),
    [
        ({"CHECK_ASG_TAG_BEFORE_DRAINING": "false"}, "check_tag_before_draining", False),
        ({"MANAGED_ASG_TAG": "team/managed"}, "managed_tag", "team/managed"),
        ({"GRACE_PERIOD": "30"}, "pod_termination_grace_period", 30),
        ({"NAMESPACE": "kube-system"}, "pod_namespace", "kube-system"),
        ({"POD_NAMESPACE": "ops", "NAMESPACE": "kube-system"}, "pod_namespace", "ops"),
        (
            {"CHECK_TAG_BEFORE_DRAINING": "true", "CHECK_ASG_TAG_BEFORE_DRAINING": "false"},
            "check_tag_before_draining",
            True,
        ),
        ({"QUEUE_URLS": f" {QUEUE}-2 ,{QUEUE}-3,"}, "queue_urls", [f"{QUEUE}-2", f"{QUEUE}-3"]),
        ({"TAINT_EFFECT": "noexecute"}, "taint_effect", "NoExecute"),
        ({"LOG_LEVEL": "DEBUG"}, "log_level", "debug"),
        ({"DRY_RUN": ""}, "dry_run", False),
        ({"AWS_REGION": "us-east-1"}, "aws_region", "us-east-1"),
        ({"QUEUE_URL": "http://127.0.0.1:4566/1/q", "AWS_REGION": "eu-west-1"}, "aws_region", "eu-west-1"),
    ],
)
def test_environment_and_nth_aliases(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], field: str, value: object
) -> None:
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    for name, text in env.items():
        monkeypatch.setenv(name, text)
    assert getattr(load_settings(), field) == value


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"HEARTBEAT_INTERVAL": "10"},
            "HEARTBEAT_INTERVAL=10: must be -1 (automatic), 0 (off) or 30-3600 seconds",
        ),
        ({"HEARTBEAT_INTERVAL": "3601"}, "HEARTBEAT_INTERVAL=3601: must be"),
        ({"HEARTBEAT_UNTIL": "59"}, "HEARTBEAT_UNTIL=59: must be -1 (until handled) or 60-172800 seconds"),
        ({"HEARTBEAT_UNTIL": "172801"}, "HEARTBEAT_UNTIL=172801"),
        (
            {"HEARTBEAT_INTERVAL": "600", "HEARTBEAT_UNTIL": "300"},
            "HEARTBEAT_INTERVAL=600 must be at most HEARTBEAT_UNTIL=300",
        ),
        (
            {"HEARTBEAT_INTERVAL": "0", "HEARTBEAT_UNTIL": "300"},
            "HEARTBEAT_UNTIL is set but HEARTBEAT_INTERVAL=0",
        ),
        ({"TAINT_EFFECT": "Sometimes"}, "TAINT_EFFECT=Sometimes: Input should be"),
        ({"DRY_RUN": "perhaps"}, "DRY_RUN=perhaps: Input should be a valid boolean"),
        ({"KUBE_API_QPS": "0"}, "KUBE_API_QPS=0: Input should be greater than 0"),
        ({"KUBE_API_QPS": "inf"}, "KUBE_API_QPS=inf: Input should be a finite number"),
        ({"KUBE_API_QPS": "nan"}, "KUBE_API_QPS=nan"),
        (
            {"KUBE_API_BURST": "1000000"},
            "KUBE_API_BURST=1000000: Input should be less than or equal to 100000",
        ),
        ({"IN_FLIGHT_BUDGET": "1e30"}, "IN_FLIGHT_BUDGET=1e30: Input should be a valid integer"),
        ({"IN_FLIGHT_BUDGET": "1000000"}, "IN_FLIGHT_BUDGET=1000000: Input should be less than or equal to"),
        ({"DRAIN_BUDGET": "1000000"}, "DRAIN_BUDGET=1000000: Input should be less than or equal to"),
        ({"WEBHOOK_URL": "not a url"}, "WEBHOOK_URL: must be an http(s) URL"),
        ({"SHUTDOWN_TIMEOUT_SEC": "0"}, "SHUTDOWN_TIMEOUT_SEC=0: Input should be greater than 0"),
        (
            {"RECEIVE_WAIT_TIME_SEC": "21"},
            "RECEIVE_WAIT_TIME_SEC=21: Input should be less than or equal to 20",
        ),
        (
            {"NODE_TERMINATION_GRACE_PERIOD": "soon"},
            "NODE_TERMINATION_GRACE_PERIOD=soon: Input should be a valid integer",
        ),
        (
            {"GRACE_PERIOD": "-5"},
            "POD_TERMINATION_GRACE_PERIOD=-5: Input should be greater than or equal to -1",
        ),
        ({"WEBHOOK_HEADERS": "{not json"}, "WEBHOOK_HEADERS: cannot be decoded"),
        ({"QUEUE_URL": ""}, "QUEUE_URL is not set"),
        ({"QUEUE_URL": "sqs/queue"}, "QUEUE_URL=sqs/queue: must be an http(s) URL"),
        (
            {"QUEUE_URL": "http://127.0.0.1:4566/000000000000/q"},
            "AWS_REGION is not set and the queue URL names no region",
        ),
        (
            {"AWS_REGION": "eu-west-1"},
            f"queue {QUEUE} is in us-east-1 but AWS_REGION is eu-west-1: EC2 and Auto Scaling are called in "
            "one region; run one controller per region",
        ),
        (
            {"QUEUE_URLS": QUEUE.replace("us-east-1", "eu-west-1")},
            "is in eu-west-1 but AWS_REGION is us-east-1",
        ),
        (
            {"QUEUE_URLS": QUEUE.replace("123456789012", "210987654321")},
            "is in account 210987654321, queue",
        ),
        (
            {"QUEUE_URL": QUEUE + ".fifo"},
            f"QUEUE_URL={QUEUE}.fifo: {QUEUE}.fifo is a FIFO queue: one held or requeued message would hold back",
        ),
        ({"QUEUE_URLS": QUEUE + "-2.fifo"}, f"{QUEUE}-2.fifo is a FIFO queue"),
        (
            {"SQS_MSG_VISIBILITY_TIMEOUT_SEC": "5"},
            "SQS_MSG_VISIBILITY_TIMEOUT_SEC=5: Input should be greater than or equal to 10",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], line: str
) -> None:
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    for name, text in env.items():
        monkeypatch.setenv(name, text)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert line in message
    assert "\n" not in message


def test_a_secret_is_never_echoed_in_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    monkeypatch.setenv("WEBHOOK_HEADERS", '{"Authorization": ["Bearer s3cr3t"]}')
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "WEBHOOK_HEADERS" in str(caught.value)
    assert "s3cr3t" not in str(caught.value)


def test_valid_heartbeat_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    monkeypatch.setenv("HEARTBEAT_INTERVAL", "30")
    monkeypatch.setenv("HEARTBEAT_UNTIL", "60")
    settings = load_settings()
    assert (settings.heartbeat_interval, settings.heartbeat_until) == (30, 60)


def test_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_URL", QUEUE)
    monkeypatch.setenv("CORDON_ONLY", "false")
    settings = load_settings(cordon_only="true", queue_url=f"{QUEUE}-other")
    assert settings.cordon_only is True
    assert settings.all_queue_urls == [f"{QUEUE}-other"]


@pytest.mark.parametrize(
    ("url", "region"),
    [
        ("https://sqs.us-east-1.amazonaws.com/1/q", "us-east-1"),
        ("https://us-west-2.queue.amazonaws.com/1/q", "us-west-2"),
        ("https://vpce-0a1b2c3d-x.sqs.eu-central-1.vpce.amazonaws.com/1/q", "eu-central-1"),
        ("https://sqs.cn-north-1.amazonaws.com.cn/1/q", "cn-north-1"),
        ("https://sqs.us-gov-west-1.amazonaws.com/1/q", "us-gov-west-1"),
        ("http://127.0.0.1:5000/123456789012/q", None),
        ("https://example.com/sqs.us-east-1.amazonaws.com/q", None),
    ],
)
def test_region_from_queue_url(url: str, region: str | None) -> None:
    assert region_from_queue_url(url) == region
