"""The Terraform module (``terraform/``), read with python-hcl2 and scanned with checkov.

What a user of the module would check before applying it: that every message kind the controller parses has an
EventBridge rule that really matches such a message (and nothing it would only skip), that the controller's role
grants exactly the IAM actions the code calls, that only EventBridge (and, when asked, Auto Scaling's
notification role) may send to the queue, that the hooks and alarms are what the docs say, that every input is
typed and described, that the example is complete, and that the files are ``terraform fmt``-clean.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hcl2
import pytest
from hcl2 import SerializationOptions

from queue_processor.events import EventKind
from queue_processor.parse import REGISTRY, parse
from queue_processor.permissions import AWS_ACTIONS
from queue_processor_sandbox.aws import LAUNCH_HOOK, STANDARD_RULES, TERMINATE_HOOK
from tests.conftest import FIXTURES, ROOT, SHARED_SAMPLES

MODULE = ROOT / "terraform"
EXAMPLES = MODULE / "examples"
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
REQUIRED_INPUTS = {"cluster_name", "asg_names", "oidc_provider_arn", "oidc_provider_url"}
OUTPUTS = {"queue_url", "queue_arn", "dlq_url", "dlq_arn", "role_arn", "rule_arns"}
LIFECYCLE_KINDS = {EventKind.ASG_TERMINATE_LIFECYCLE.value, EventKind.ASG_LAUNCH_LIFECYCLE.value}
_OPTIONS = SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)


# ------------------------------------------------------------------------------------------------ reading HCL


@functools.cache
def _load(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        return dict(hcl2.load(handle, serialization_options=_OPTIONS))


def _tf_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.tf"))


def _blocks(kind: str, directory: Path | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """``resource`` or ``data`` blocks of a directory's .tf files (the module's by default), by (type, name)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in _tf_files(directory or MODULE):
        for entry in _load(path).get(kind, []):
            for type_, named in entry.items():
                for name, body in named.items():
                    assert (type_, name) not in found, f"{kind} {type_}.{name} is declared twice"
                    found[(type_, name)] = body
    return found


def _named(kind: str, directory: Path | None = None) -> dict[str, dict[str, Any]]:
    """``variable``, ``output`` or ``module`` blocks of a directory's .tf files (the module's by default)."""
    found: dict[str, dict[str, Any]] = {}
    for path in _tf_files(directory or MODULE):
        for entry in _load(path).get(kind, []):
            found.update(entry)
    return found


def _locals() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for path in _tf_files(MODULE):
        for entry in _load(path).get("locals", []):
            found.update(entry)
    return found


def _resource(type_: str, name: str) -> dict[str, Any]:
    return _blocks("resource")[(type_, name)]


def _policy(name: str) -> dict[str, Any]:
    return _blocks("data")[("aws_iam_policy_document", name)]


def _hcl_value(expression: str) -> Any:
    """An HCL expression written as ``jsonencode({...})`` (as python-hcl2 renders it), read as a value."""
    match = re.fullmatch(r"\$\{jsonencode\((.*)\)\}", expression, re.DOTALL)
    assert match, f"not a jsonencode(...) expression: {expression!r}"
    return hcl2.loads(f"value = {match.group(1)}\n", serialization_options=_OPTIONS)["value"]


def _statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    return list(document.get("statement", []))


def _dynamic_statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``dynamic "statement"`` blocks: each ``{"for_each": ..., "content": [...]}``."""
    return [entry["statement"] for entry in document.get("dynamic", []) if "statement" in entry]


def _principals(statement: dict[str, Any]) -> set[tuple[str, str]]:
    return {(p["type"], ident) for p in statement.get("principals", []) for ident in p["identifiers"]}


def _conditions(statement: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    return {c["variable"]: (c["test"], c["values"]) for c in statement.get("condition", [])}


# ------------------------------------------------------------------------------------- EventBridge patterns

_UNRESOLVED = re.compile(r"\$\{")


def _resolve(value: Any, env: dict[str, Any]) -> Any:
    """Replace each ``"${ref}"`` of a pattern by ``env[ref]``; a reference the test does not know fails."""
    if isinstance(value, dict):
        return {key: _resolve(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item, env) for item in value]
    if isinstance(value, str) and _UNRESOLVED.search(value):
        match = re.fullmatch(r"\$\{([\w.]+)\}", value)
        assert match, f"pattern uses {value!r}, which this test cannot evaluate"
        assert match.group(1) in env, f"pattern uses {value!r}, which this test cannot evaluate"
        return env[match.group(1)]
    return value


def _value_matches(matcher: Any, value: Any, present: bool) -> bool:
    if isinstance(matcher, dict):
        if "exists" in matcher:
            return present is bool(matcher["exists"])
        if not present:
            return False
        if "prefix" in matcher:
            return isinstance(value, str) and value.startswith(matcher["prefix"])
        if "anything-but" in matcher:
            excluded = matcher["anything-but"]
            excluded = excluded if isinstance(excluded, list) else [excluded]
            return value not in excluded
        raise AssertionError(f"this test's matcher does not know {matcher!r}")
    return present and value == matcher


def matches(pattern: dict[str, Any], event: Any) -> bool:
    """Whether ``event`` matches an EventBridge event pattern ("Amazon EventBridge event patterns"), for the
    subset a pattern of this module may use: nested objects, lists of exact values, ``prefix``,
    ``anything-but`` and ``exists``. A list in the pattern matches when any of its values matches the event's
    value, or any element of the event's value when that is an array."""
    if not isinstance(event, dict):
        return False
    for key, expected in pattern.items():
        if isinstance(expected, dict):
            if not matches(expected, event.get(key)):
                return False
            continue
        assert isinstance(expected, list), f"pattern field {key!r} must be a list"
        assert expected, f"pattern field {key!r} must not be empty"
        present = key in event
        value = event.get(key)
        candidates = value if isinstance(value, list) else [value]
        if not any(_value_matches(m, v, present) for m in expected for v in candidates):
            return False
    return True


def _rules() -> dict[str, dict[str, Any]]:
    rules: dict[str, dict[str, Any]] = _locals()["all_event_rules"]
    return rules


def _env(asg_names: list[str], hook: str = TERMINATE_HOOK) -> dict[str, Any]:
    return {"var.asg_names": asg_names, "var.terminate_hook_name": hook, "var.launch_hook_name": hook}


def _eventbridge_samples() -> Iterator[tuple[Path, dict[str, Any], str]]:
    """Every sample body in tests/fixtures/messages and ../shared/samples/messages, with its parse outcome,
    that is an EventBridge message of a kind the parser knows."""
    directories = [FIXTURES]
    if SHARED_SAMPLES.is_dir():
        directories.append(SHARED_SAMPLES)
    elif os.environ.get("CI") == "true":
        pytest.fail(f"{SHARED_SAMPLES} is missing in CI")
    for directory in directories:
        for path in sorted(directory.glob("*.json")):
            body = path.read_bytes()
            result = parse(body)
            if result.envelope != "eventbridge":
                continue
            event = json.loads(body)
            if (event.get("source"), event.get("detail-type")) in REGISTRY:
                yield path, event, result.outcome


def _rule_of(source: str, detail_type: str) -> str:
    found = [
        kind
        for kind, rule in _rules().items()
        if rule["pattern"]["source"] == [source] and rule["pattern"]["detail-type"] == [detail_type]
    ]
    assert len(found) == 1, f"{len(found)} rules for ({source!r}, {detail_type!r}): {found}"
    return found[0]


def _lifecycle_names(event: dict[str, Any]) -> tuple[str, str]:
    detail = event.get("detail", {})
    return str(detail.get("AutoScalingGroupName", "my-asg")), str(detail.get("LifecycleHookName", "hook"))


def test_every_kind_the_parser_knows_has_exactly_one_rule_and_there_are_no_others() -> None:
    pairs = []
    for kind, rule in _rules().items():
        pattern = rule["pattern"]
        assert len(pattern["source"]) == 1, kind
        assert len(pattern["detail-type"]) == 1, kind
        pairs.append((pattern["source"][0], pattern["detail-type"][0]))
    assert sorted(pairs) == sorted(REGISTRY), "the rules and the parser's registry disagree"
    # Keyed by the controller's own kind names, as rule names and the rule_arns output show them.
    assert set(_rules()) == {kind.value for kind in EventKind}


def test_each_rule_sends_its_pattern_to_the_queue_and_failures_to_the_dlq() -> None:
    rule = _resource("aws_cloudwatch_event_rule", "this")
    assert rule["for_each"] == "${local.event_rules}"
    assert rule["event_pattern"] == "${jsonencode(each.value.pattern)}"
    assert rule["name"] == "${local.name}-${each.key}"
    target = _resource("aws_cloudwatch_event_target", "this")
    assert target["for_each"] == "${aws_cloudwatch_event_rule.this}"
    assert target["arn"] == "${aws_sqs_queue.this.arn}"
    assert target["dead_letter_config"] == [{"arn": "${aws_sqs_queue.dlq.arn}"}]
    # Only the launch rule is optional: it exists with the launch hook.
    selection = _locals()["event_rules"]
    assert "local.all_event_rules" in selection
    assert 'kind != "asg-launch-lifecycle" || var.enable_launch_lifecycle_hook' in selection


@pytest.mark.parametrize("kind", sorted(REGISTRY), ids=lambda key: key[1])
def test_a_sample_of_each_kind_matches_its_rule_and_no_other(kind: tuple[str, str]) -> None:
    samples = [(path, event) for path, event, outcome in _eventbridge_samples() if outcome == "events"]
    samples = [(path, event) for path, event in samples if (event["source"], event["detail-type"]) == kind]
    assert samples, f"no sample body of {kind} in the fixtures"
    own = _rule_of(*kind)
    for path, event in samples:
        asg, hook = _lifecycle_names(event)
        env = _env([asg, "another-group"], hook)
        matched = {name for name, rule in _rules().items() if matches(_resolve(rule["pattern"], env), event)}
        assert matched == {own}, f"{path.name} matched {matched}"
        if own in LIFECYCLE_KINDS:
            # Another group's actions, or another hook's on the same group, are not the controller's to complete.
            other_groups = _resolve(_rules()[own]["pattern"], _env(["another-group"], hook))
            assert not matches(other_groups, event), path.name
            other_hook = _resolve(_rules()[own]["pattern"], _env([asg], "somebody-elses-hook"))
            assert not matches(other_hook, event), path.name


def test_rules_leave_out_messages_the_controller_would_only_skip() -> None:
    """States other than the four that take an instance away, Health events other than EC2 scheduled changes,
    and the test notification a new hook sends (it names no hook) never reach the queue."""
    expected_out = {
        "skip_state_change_pending.json",
        "skip_state_change_running.json",
        "skip_state_change_stopping_pending.json",
        "eventbridge_ec2_state_change_pending.json",
        "skip_health_ec2_issue.json",
        "skip_health_ec2_account_notification.json",
        "skip_health_non_ec2_service.json",
        "skip_asg_test_notification_eventbridge.json",
        "eventbridge_asg_test_notification.json",
    }
    seen = set()
    for path, event, outcome in _eventbridge_samples():
        if path.name not in expected_out:
            continue
        seen.add(path.name)
        assert outcome == "skip", f"{path.name} is no longer skipped by the parser"
        asg, hook = _lifecycle_names(event)
        env = _env([asg], hook)
        matched = [name for name, rule in _rules().items() if matches(_resolve(rule["pattern"], env), event)]
        assert not matched, f"{path.name} would be sent to the queue by {matched}"
    shared = {"eventbridge_ec2_state_change_pending.json", "eventbridge_asg_test_notification.json"}
    assert seen == (expected_out if SHARED_SAMPLES.is_dir() else expected_out - shared), (
        "samples went missing"
    )


def test_rules_are_the_ones_the_sandbox_rehearses() -> None:
    """The sandbox creates these rules (without the group and hook filters) and the same hook names."""
    for kind, rule in _rules().items():
        pattern = dict(rule["pattern"])
        if kind in LIFECYCLE_KINDS:
            assert set(pattern.pop("detail")) == {"AutoScalingGroupName", "LifecycleHookName"}
        assert pattern == STANDARD_RULES[EventKind(kind)], kind
    variables = _named("variable")
    assert variables["terminate_hook_name"]["default"] == TERMINATE_HOOK
    assert variables["launch_hook_name"]["default"] == LAUNCH_HOOK


# ------------------------------------------------------------------------------------------------------- IAM


def test_controller_role_grants_exactly_the_actions_the_code_calls() -> None:
    document = _policy("controller")
    granted: dict[str, list[str]] = {}
    for statement in _statements(document):
        assert statement["effect"] == "Allow"
        assert "condition" not in statement
        for action in statement["actions"]:
            assert action not in granted, f"{action} is granted twice"
            granted[action] = statement["resources"]
    assert sorted(granted) == sorted(AWS_ACTIONS)
    for action in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"):
        assert granted[action] == ["${aws_sqs_queue.this.arn}"], action
    for action in ("autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"):
        assert granted[action] == "${local.asg_arns}", action
    # No resource-level permissions exist for these three (Service Authorization Reference).
    assert granted["ec2:DescribeInstances"] == ["*"]
    assert granted["ec2:DescribeTags"] == ["*"]
    assert granted["autoscaling:DescribeLifecycleHooks"] == ["*"]
    assert "autoScalingGroup:*:autoScalingGroupName/${name}" in _locals()["asg_arns"]

    policy = _resource("aws_iam_role_policy", "controller")
    assert policy["role"] == "${aws_iam_role.controller.id}"
    assert policy["policy"] == "${data.aws_iam_policy_document.controller.json}"


def test_controller_gets_kms_decrypt_only_with_a_customer_key_and_only_for_the_queue() -> None:
    assert _locals()["kms_enabled"] == "${var.kms_key_arn != null}"
    (dynamic,) = _dynamic_statements(_policy("controller"))
    assert dynamic["for_each"] == "${local.kms_enabled ? [var.kms_key_arn] : []}"
    (statement,) = dynamic["content"]
    assert statement["actions"] == ["kms:Decrypt"]
    assert statement["resources"] == ["${statement.value}"]
    conditions = _conditions(statement)
    assert conditions["kms:ViaService"] == ("StringEquals", ["sqs.${local.region}.${local.dns_suffix}"])
    assert conditions["kms:EncryptionContext:aws:sqs:arn"] == ("StringEquals", ["${aws_sqs_queue.this.arn}"])


def test_only_the_controller_service_account_can_assume_its_role() -> None:
    (statement,) = _statements(_policy("controller_trust"))
    assert statement["actions"] == ["sts:AssumeRoleWithWebIdentity"]
    assert _principals(statement) == {("Federated", "${var.oidc_provider_arn}")}
    assert _conditions(statement) == {
        "${local.oidc_issuer}:sub": (
            "StringEquals",
            ["system:serviceaccount:${var.service_account_namespace}:${var.service_account_name}"],
        ),
        "${local.oidc_issuer}:aud": ("StringEquals", ["sts.amazonaws.com"]),
    }
    assert _locals()["oidc_issuer"] == '${trimprefix(var.oidc_provider_url, "https://")}'
    role = _resource("aws_iam_role", "controller")
    assert role["assume_role_policy"] == "${data.aws_iam_policy_document.controller_trust.json}"


def test_auto_scaling_notification_role_exists_only_when_asked_and_only_for_the_cluster_groups() -> None:
    toggle = "${var.enable_direct_lifecycle_notifications ? 1 : 0}"
    assert _resource("aws_iam_role", "asg_notifications")["count"] == toggle
    assert _resource("aws_iam_role_policy", "asg_notifications")["count"] == toggle
    trust = _policy("asg_notifications_trust")
    assert trust["count"] == toggle
    (statement,) = _statements(trust)
    assert statement["actions"] == ["sts:AssumeRole"]
    assert _principals(statement) == {("Service", "autoscaling.amazonaws.com")}
    assert _conditions(statement) == {
        "aws:SourceAccount": ("StringEquals", ["${local.account_id}"]),
        "aws:SourceArn": ("ArnLike", "${local.asg_arns}"),
    }
    (send,) = _statements(_policy("asg_notifications"))
    assert send["actions"] == ["sqs:GetQueueUrl", "sqs:SendMessage"]
    assert send["resources"] == ["${aws_sqs_queue.this.arn}"]
    for name in ("terminate", "launch"):
        hook = _resource("aws_autoscaling_lifecycle_hook", name)
        assert hook["notification_target_arn"] == (
            "${var.enable_direct_lifecycle_notifications ? aws_sqs_queue.this.arn : null}"
        )
        assert hook["role_arn"] == (
            "${var.enable_direct_lifecycle_notifications ? aws_iam_role.asg_notifications[0].arn : null}"
        )


@pytest.mark.parametrize("queue", ["queue", "dlq"])
def test_only_the_module_rules_and_the_notification_role_may_send_to_the_queues(queue: str) -> None:
    document = _policy(queue)
    queue_arn = "${aws_sqs_queue.this.arn}" if queue == "queue" else "${aws_sqs_queue.dlq.arn}"
    allows = [s for s in _statements(document) if s["effect"] == "Allow"]
    denies = [s for s in _statements(document) if s["effect"] == "Deny"]
    (eventbridge,) = allows
    assert _principals(eventbridge) == {("Service", "events.amazonaws.com")}
    assert eventbridge["actions"] == ["sqs:SendMessage"]
    assert eventbridge["resources"] == [queue_arn]
    assert _conditions(eventbridge) == {"aws:SourceArn": ("ArnEquals", "${local.rule_arns}")}
    assert _locals()["rule_arns"] == "${[for rule in aws_cloudwatch_event_rule.this : rule.arn]}"
    (deny,) = denies
    assert _conditions(deny) == {"aws:SecureTransport": ("Bool", ["false"])}

    dynamics = _dynamic_statements(document)
    if queue == "dlq":
        assert dynamics == []
    else:
        (dynamic,) = dynamics
        assert dynamic["for_each"] == (
            "${var.enable_direct_lifecycle_notifications ? [aws_iam_role.asg_notifications[0].arn] : []}"
        )
        (role,) = dynamic["content"]
        assert role["effect"] == "Allow"
        assert _principals(role) == {("AWS", "${statement.value}")}
        assert role["resources"] == [queue_arn]
    resource = "this" if queue == "queue" else "dlq"
    policy = _resource("aws_sqs_queue_policy", resource)
    assert policy["queue_url"] == f"${{aws_sqs_queue.{resource}.id}}"
    assert policy["policy"] == f"${{data.aws_iam_policy_document.{queue}.json}}"


def test_eventbridge_key_policy_statements_are_output_only_for_a_customer_key() -> None:
    document = _policy("kms_for_eventbridge")
    # No count: whether kms_key_arn is null may be unknown at plan time (a key created in the same apply).
    assert "count" not in document
    (statement,) = _statements(document)
    assert _principals(statement) == {("Service", "events.amazonaws.com")}
    assert statement["actions"] == ["kms:Decrypt", "kms:GenerateDataKey"]
    assert _conditions(statement) == {"aws:SourceArn": ("ArnEquals", "${local.rule_arns}")}
    # Nothing is counted on the key: the module must plan with a key created in the same apply.
    for kind in ("resource", "data"):
        for (type_, name), body in _blocks(kind).items():
            meta = f"{body.get('count', '')} {body.get('for_each', '')}"
            assert "kms" not in meta, f"{type_}.{name} is counted on the KMS key"
    output = _named("output")["kms_key_policy_json"]
    assert output["value"] == (
        "${local.kms_enabled ? data.aws_iam_policy_document.kms_for_eventbridge.json : null}"
    )


# ------------------------------------------------------------------------------------------- queues and hooks


def test_both_queues_are_encrypted_with_sqs_keys_or_the_customer_key() -> None:
    for name in ("this", "dlq"):
        queue = _resource("aws_sqs_queue", name)
        assert queue["sqs_managed_sse_enabled"] == "${local.kms_enabled ? null : true}", name
        assert queue["kms_master_key_id"] == "${var.kms_key_arn}", name


def test_queue_redrives_to_the_dlq_which_only_accepts_the_queue() -> None:
    queue = _resource("aws_sqs_queue", "this")
    assert _hcl_value(queue["redrive_policy"]) == {
        "deadLetterTargetArn": "${aws_sqs_queue.dlq.arn}",
        "maxReceiveCount": "${var.max_receive_count}",
    }
    assert queue["message_retention_seconds"] == "${var.queue_message_retention_seconds}"
    assert queue["visibility_timeout_seconds"] == "${var.queue_visibility_timeout_seconds}"
    assert _resource("aws_sqs_queue", "dlq")["message_retention_seconds"] == (
        "${var.dlq_message_retention_seconds}"
    )
    allow = _resource("aws_sqs_queue_redrive_allow_policy", "dlq")
    assert allow["queue_url"] == "${aws_sqs_queue.dlq.id}"
    assert _hcl_value(allow["redrive_allow_policy"]) == {
        "redrivePermission": "byQueue",
        "sourceQueueArns": ["${aws_sqs_queue.this.arn}"],
    }


def test_terminate_hook_continues_and_launch_hook_is_optional_and_abandons_by_default() -> None:
    assert _locals()["hooked_groups"] == "${var.create_lifecycle_hooks ? toset(var.asg_names) : toset([])}"
    terminate = _resource("aws_autoscaling_lifecycle_hook", "terminate")
    assert terminate["for_each"] == "${local.hooked_groups}"
    assert terminate["lifecycle_transition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert terminate["heartbeat_timeout"] == "${var.hook_heartbeat_timeout_seconds}"
    assert terminate["default_result"] == "CONTINUE"
    assert terminate["name"] == "${var.terminate_hook_name}"
    launch = _resource("aws_autoscaling_lifecycle_hook", "launch")
    assert launch["for_each"] == "${var.enable_launch_lifecycle_hook ? local.hooked_groups : toset([])}"
    assert launch["lifecycle_transition"] == "autoscaling:EC2_INSTANCE_LAUNCHING"
    assert launch["heartbeat_timeout"] == "${var.launch_hook_heartbeat_timeout_seconds}"
    assert launch["default_result"] == "${var.launch_hook_default_result}"
    assert launch["name"] == "${var.launch_hook_name}"
    variables = _named("variable")
    assert variables["launch_hook_default_result"]["default"] == "ABANDON"
    assert variables["enable_launch_lifecycle_hook"]["default"] is False
    # A hook must not open actions before the way to the queue exists.
    for hook in (terminate, launch):
        assert "${aws_cloudwatch_event_target.this}" in hook["depends_on"]
        assert "${aws_sqs_queue_policy.this}" in hook["depends_on"]


# ---------------------------------------------------------------------------------------------------- alarms

_ALARMS = {
    "oldest_message_age": ("ApproximateAgeOfOldestMessage", "this", "#oldest-message-age", "notBreaching"),
    "messages_visible": ("ApproximateNumberOfMessagesVisible", "this", "#messages-visible", "notBreaching"),
    "dlq_not_empty": ("ApproximateNumberOfMessagesVisible", "dlq", "#dead-letter-queue-not-empty", "ignore"),
}


@pytest.mark.parametrize("name", sorted(_ALARMS))
def test_alarm_watches_the_right_metric_and_links_its_runbook_section(name: str) -> None:
    metric, queue, anchor, missing = _ALARMS[name]
    alarm = _resource("aws_cloudwatch_metric_alarm", name)
    assert alarm["count"] == "${var.create_alarms ? 1 : 0}"
    assert alarm["namespace"] == "AWS/SQS"
    assert alarm["metric_name"] == metric
    assert alarm["dimensions"] == {"QueueName": f"${{aws_sqs_queue.{queue}.name}}"}
    assert alarm["comparison_operator"] == "GreaterThanThreshold"
    assert alarm["treat_missing_data"] == missing
    assert alarm["alarm_actions"] == "${var.alarm_actions}"
    assert alarm["ok_actions"] == "${var.ok_actions}"
    assert alarm["alarm_description"].endswith("${var.runbook_url}" + anchor)
    assert len(alarm["alarm_description"]) < 1024 - 200, "room left for the interpolated names"


def test_dlq_alarm_fires_on_the_first_message() -> None:
    alarm = _resource("aws_cloudwatch_metric_alarm", "dlq_not_empty")
    assert alarm["threshold"] == 0
    assert alarm["evaluation_periods"] == 1


# ------------------------------------------------------------------------------------ variables and outputs


def test_every_variable_has_a_description_and_a_type() -> None:
    variables = _named("variable")
    for name, body in variables.items():
        assert len(body.get("description", "")) > 20, f"variable {name} needs a description"
        assert "type" in body, f"variable {name} needs a type"
    required = {name for name, body in variables.items() if "default" not in body}
    assert required == REQUIRED_INPUTS


def _validation_regexes() -> Iterator[tuple[str, str]]:
    for name, body in _named("variable").items():
        for validation in body.get("validation", []):
            for pattern in re.findall(r'regex\("((?:[^"\\]|\\.)*)"', validation["condition"]):
                yield name, pattern.encode().decode("unicode_escape")


_VALID = {
    "cluster_name": ("prod-eu_1", "-prod"),
    "asg_names": ("testt1.demo-0a20f32c.kops.sh", "prod-*"),
    "oidc_provider_arn": (
        "arn:aws:iam::123456789012:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/ABC",
        "arn:aws:iam::123456789012:role/oidc",
    ),
    "oidc_provider_url": (
        "https://oidc.eks.eu-west-1.amazonaws.com/id/ABC",
        "https://oidc.example.com/id/ABC/",
    ),
    "kms_key_arn": ("arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab", "alias/aws/sqs"),
    "terminate_hook_name": ("queue-processor-terminate", "bad name"),
    "alarm_actions": ("arn:aws:sns:eu-west-1:123456789012:alarms", "arn:aws:lambda:eu-west-1:1:function:x"),
}


@pytest.mark.parametrize("name", sorted(_VALID))
def test_validations_accept_good_values_and_reject_bad_ones(name: str) -> None:
    patterns = [pattern for variable, pattern in _validation_regexes() if variable == name]
    assert patterns, f"variable {name} has no regex validation"
    good, bad = _VALID[name]
    for pattern in patterns:
        assert re.search(pattern, good), (name, pattern, good)
    assert not all(re.search(pattern, bad) for pattern in patterns), (name, bad)


def test_outputs_exist_and_are_described() -> None:
    outputs = _named("output")
    assert set(outputs) >= OUTPUTS
    for name, body in outputs.items():
        assert len(body.get("description", "")) > 10, f"output {name} needs a description"
    assert (
        outputs["rule_arns"]["value"]
        == "${{for kind, rule in aws_cloudwatch_event_rule.this : kind => rule.arn}}"
    )


def test_readme_names_every_input_and_output() -> None:
    readme = (MODULE / "README.md").read_text()
    for name in [*_named("variable"), *_named("output")]:
        assert f"`{name}`" in readme, f"README.md does not document {name}"


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()))
def test_example_calls_the_module_with_every_required_input(example: str) -> None:
    directory = EXAMPLES / example
    modules = _named("module", directory)
    calls = [body for body in modules.values() if body.get("source") == "../.."]
    assert calls, f"examples/{example} does not use the module"
    declared = set(_named("variable"))
    for call in calls:
        inputs = set(call) - {"source", "providers", "depends_on", "count", "for_each"}
        assert inputs >= REQUIRED_INPUTS, f"missing {REQUIRED_INPUTS - inputs}"
        assert inputs <= declared, f"unknown inputs {inputs - declared}"


def test_the_eks_example_hooks_two_groups_and_alarms_to_a_topic() -> None:
    (call,) = _named("module", EXAMPLES / "eks").values()
    assert len(call["asg_names"]) == 2
    assert call["alarm_actions"] == ["${aws_sns_topic.alarms.arn}"]
    assert ("aws_sns_topic", "alarms") in _blocks("resource", EXAMPLES / "eks")


# ------------------------------------------------------------------------------------------------ formatting


# An '=' next to these is part of ==, =>, !=, <=, >=: an operator, not an assignment.
_AFTER = ("=", ">")
_BEFORE = ("=", "!", "<", ">")


def _scan(line: str) -> tuple[list[tuple[int, str]], str]:
    """Brackets and assignment ``=`` outside strings and comments, with their columns; and the line without
    its comment. Interpolations inside strings are skipped (they open and close on one line)."""
    found: list[tuple[int, str]] = []
    stack: list[Any] = []  # "str", or [brace depth] for an interpolation inside a string
    index = 0
    while index < len(line):
        char = line[index]
        mode = stack[-1] if stack else None
        if mode == "str":
            if char == "\\":
                index += 2
                continue
            if char == '"':
                stack.pop()
            elif line.startswith(("${", "%{"), index):
                stack.append([0])
                index += 1
            index += 1
            continue
        if char == "#" or line.startswith("//", index):
            return found, line[:index]
        if char == '"':
            stack.append("str")
        elif isinstance(mode, list):
            if char == "{":
                mode[0] += 1
            elif char == "}":
                if mode[0] == 0:
                    stack.pop()
                else:
                    mode[0] -= 1
        elif char in "([{)]}":
            found.append((index, char))
        elif (
            char == "="
            and line[index + 1 : index + 2] not in _AFTER
            and line[index - 1 : index] not in _BEFORE
        ):
            found.append((index, "="))
        index += 1
    return found, line


def _net(tokens: list[tuple[int, str]]) -> int:
    return sum(1 if char in "([{" else -1 for _, char in tokens if char != "=")


def fmt_problems(text: str) -> list[str]:
    """Where ``text`` differs from ``terraform fmt`` in indentation and ``=`` alignment. A port of hclwrite's
    formatIndent and formatCells: a line that opens more brackets than it closes indents what follows by one
    level; consecutive one-line attributes (``name = value``) align their ``=`` one column after the longest
    name; a blank line, a comment line, a block header or a line opening a multi-line value ends the run."""
    problems: list[str] = []
    if "\t" in text:
        problems.append("tab characters")
    if not text.endswith("\n") or text.endswith("\n\n"):
        problems.append("the file must end with exactly one newline")
    indents: list[int] = []
    chain: list[tuple[int, int, int]] = []  # (line number, lead width, '=' column)

    def close_chain() -> None:
        if chain:
            want = max(width for _, width, _ in chain) + 1
            problems.extend(
                f"line {number}: '=' at column {column + 1}, expected {want + 1}"
                for number, _, column in chain
                if column != want
            )
            chain.clear()

    previous_blank = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line != line.rstrip():
            problems.append(f"line {number}: trailing whitespace")
        if not line.strip():
            if previous_blank:
                problems.append(f"line {number}: two blank lines in a row")
            previous_blank = True
            close_chain()
            continue
        previous_blank = False
        tokens, code = _scan(line)
        net = _net(tokens)
        if net < 0:
            closed = -net
            while closed > 0 and indents:
                if closed >= indents[-1]:
                    closed -= indents.pop()
                else:
                    indents[-1] -= closed
                    closed = 0
        expected = 2 * len(indents)
        if net > 0:
            indents.append(net)
        actual = len(line) - len(line.lstrip(" "))
        if actual != expected:
            problems.append(f"line {number}: indented {actual}, expected {expected}")
        assign = next((column for column, char in tokens if char == "="), None)
        is_attribute = (
            assign is not None
            and code[:assign].strip() != ""
            and _net([t for t in tokens if t[0] > assign]) == 0
        )
        if assign is not None and (
            code[assign + 1 : assign + 2] != " " or code[assign + 2 : assign + 3] == " "
        ):
            problems.append(f"line {number}: one space after '='")
        if is_attribute and assign is not None:
            chain.append((number, len(code[:assign].rstrip()), assign))
        else:
            close_chain()
            if assign is not None and code[:assign] != code[:assign].rstrip() + " ":
                problems.append(f"line {number}: one space before '='")
    close_chain()
    return problems


def _all_tf_files() -> list[Path]:
    return sorted(MODULE.rglob("*.tf"))


@pytest.mark.parametrize("path", _all_tf_files(), ids=lambda path: str(path.relative_to(MODULE)))
def test_files_are_terraform_fmt_clean(path: Path) -> None:
    assert fmt_problems(path.read_text()) == []


def test_fmt_check_catches_misaligned_and_misindented_lines() -> None:
    good = 'resource "a" "b" {\n  name  = "x"\n  count = 1\n\n  tags = {\n    k = "v"\n  }\n}\n'
    assert fmt_problems(good) == []
    assert fmt_problems(good.replace('name  = "x"', 'name = "x"'))
    assert fmt_problems(good.replace('    k = "v"', '  k = "v"'))
    assert fmt_problems(good.replace("\n\n", "\n\n\n"))


# ---------------------------------------------------------------------------------------------------- checkov


def test_checkov_skips_are_justified_inline() -> None:
    for path in _all_tf_files():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if "checkov:skip" in line:
                match = re.fullmatch(r"\s*#checkov:skip=(CKV2?_AWS_\d+):(.{20,})", line)
                assert match, f"{path.relative_to(MODULE)}:{number}: a skip needs a check ID and a reason"


def test_checkov_finds_nothing_to_fix() -> None:
    if not CHECKOV.exists():
        message = f"{CHECKOV} is missing (make .venv-checkov/bin/checkov)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    # --skip-download: no call to Prisma Cloud for guideline links (there is no network in CI).
    arguments = ["-d", "terraform", "--framework", "terraform", "--compact", "-o", "json", "--skip-download"]
    completed = subprocess.run(
        [str(CHECKOV), *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(completed.stdout)
    reports = report if isinstance(report, list) else [report]
    (terraform,) = [r for r in reports if r.get("check_type") == "terraform"]
    summary = terraform["summary"]
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}:{c['file_line_range']})"
        for c in terraform["results"]["failed_checks"]
    ]
    assert failed == []
    assert summary["parsing_errors"] == 0
    assert summary["passed"] > 50
    # The module's resources are checked as the examples instantiate them.
    checked = {c["resource"] for c in terraform["results"]["passed_checks"]}
    assert any(resource.startswith("module.queue_processor.aws_sqs_queue.") for resource in checked)
    for skipped in terraform["results"]["skipped_checks"]:
        assert skipped["check_result"].get("suppress_comment"), skipped["check_id"]


# ------------------------------------------------------------------------------- several clusters, one account

#: Resource types whose names are unique per account and region (or account, for IAM): their names must come
#: from ``local.name`` (``name_prefix``, default ``<cluster_name>-qp``), so that one module instance per cluster
#: never collides with another in the same account and region.
ACCOUNT_NAMED = {
    "aws_sqs_queue": "name",
    "aws_cloudwatch_metric_alarm": "alarm_name",
    "aws_cloudwatch_event_rule": "name",
    "aws_iam_role": "name",
}
#: Resource types named within a parent that is the cluster's own: a lifecycle hook within its Auto Scaling
#: group (the cluster's), an inline role policy within its role, an event target within its rule; queue
#: policies and redrive policies have no name.
PARENT_SCOPED = {
    "aws_autoscaling_lifecycle_hook",
    "aws_iam_role_policy",
    "aws_cloudwatch_event_target",
    "aws_sqs_queue_policy",
    "aws_sqs_queue_redrive_allow_policy",
}


def test_one_module_instance_per_cluster_names_nothing_another_cluster_also_names() -> None:
    resources = _blocks("resource")
    assert {type_ for type_, _ in resources} <= set(ACCOUNT_NAMED) | PARENT_SCOPED, (
        "a new resource type: say whether its name is account-wide (ACCOUNT_NAMED) or within a parent"
    )
    for (type_, name), body in resources.items():
        if type_ in ACCOUNT_NAMED:
            value = str(body[ACCOUNT_NAMED[type_]])
            assert "local.name" in value, f"{type_}.{name}: {value} does not derive from local.name"
    assert _locals()["name"] == '${coalesce(var.name_prefix, "${var.cluster_name}-qp")}'
