"""The Helm chart (charts/queue-processor), linted and rendered by Helm's own engine.

Helm's Go SDK comes with the ``helm-python-sdk`` package (module ``helm_python``, a ctypes binding of
``libhelm_c``): ``helm_python.lint`` is ``helm lint``, ``Chart.render`` is ``helm template`` (values.schema.json
checked first), ``Chart.validate_schema`` checks values against the schema alone. The manifests are read
with PyYAML and checked the way an operator would check them before installing: the controller gets every
setting it reads and nothing it ignores, RBAC grants exactly ``queue_processor.permissions``, a rollout never
needs a host port, the pod is locked down, the alerts read metrics that exist.

When the library cannot be loaded the tests are skipped, except under CI=true, where they fail.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any, Literal, get_args, get_origin

import pytest
import yaml
from pydantic import SecretStr

from queue_processor.cli import load_settings
from queue_processor.config import Settings
from queue_processor.observe.metrics import Metrics
from queue_processor.outcomes import ConfigError
from queue_processor.permissions import AWS_ACTIONS, KUBERNETES_RULES
from tests.conftest import ROOT

CHART = ROOT / "charts" / "queue-processor"
RELEASE = "qp"
NAMESPACE = "ops"
FULLNAME = f"{RELEASE}-queue-processor"
QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/queue-processor"
QUEUE_2 = "https://sqs.eu-west-1.amazonaws.com/123456789012/queue-processor"
ROLE = "arn:aws:iam::123456789012:role/queue-processor"

# The value sets rendered throughout: the defaults (plus the one required value), a production-like set with
# everything optional turned on, a webhook whose URL and headers come from an existing Secret, and one whose
# URL and headers are given as plain values (which the chart moves into a Secret of its own).
BASE: dict[str, Any] = {"queueURL": QUEUE}
#: How the schema describes an aws-node-termination-handler value it accepts and ignores.
NTH_IGNORED = "aws-node-termination-handler's value; ignored here"
FULL: dict[str, Any] = {
    **BASE,
    "replicas": 3,
    "serviceMonitor": {"create": True},
    "prometheusRule": {"create": True},
    "grafanaDashboard": {"create": True},
    "emitKubernetesEvents": True,
    "nodeLeases": True,
    "avoidSpot": True,
    "serviceAccount": {"roleArn": ROLE},
}
WEBHOOK_FROM_SECRET: dict[str, Any] = {
    **BASE,
    "webhookURLSecretName": "queue-processor-webhook",
    "webhookURLSecretKey": "url",
    "webhookHeadersSecretKey": "headers",
}
WEBHOOK_PLAIN: dict[str, Any] = {
    **BASE,
    "webhookURL": "https://hooks.slack.com/services/T000/B000/secret",
    "webhookHeaders": {"Content-type": "application/json", "Authorization": "Bearer token"},
}
VALUE_SETS = {
    "defaults": BASE,
    "full": FULL,
    "webhook-secret": WEBHOOK_FROM_SECRET,
    "webhook-plain": WEBHOOK_PLAIN,
}

# Settings that no plain value sets: credentials come from a Secret, the pod's identity from the downward API.
FROM_SECRET = {"WEBHOOK_URL": "webhookURL", "WEBHOOK_HEADERS": "webhookHeaders"}
FROM_DOWNWARD_API = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
# Values whose schema is stricter than the setting on purpose: a pod needs a fixed port (0 = any free port).
STRICTER_IN_CHART = {"prometheusServerPort", "probesServerPort"}

# A value different from the chart's default for every setting of the mapping; a new setting needs one here.
SAMPLES: dict[str, Any] = {
    "queueURL": QUEUE_2,
    "queueURLs": [f"{QUEUE}-2", "https://sqs.us-east-1.amazonaws.com/123456789012/other"],
    "awsRegion": "us-east-1",  # the queues must be in it
    "awsEndpoint": "http://localhost:4566",
    "sqsMsgVisibilityTimeoutSec": 300,
    "receiveLoopsPerQueue": 4,
    "receiveWaitTimeSec": 10,
    "shutdownTimeoutSec": 20.5,
    "inFlightBudget": 500,
    "poisonVisibilityTimeoutSec": 600,
    "requeueBackoffBaseSec": 2.5,
    "deleteSqsMsgIfNodeNotFound": True,
    "checkTagBeforeDraining": False,
    "managedTag": "example.com/managed",
    "managedTagValue": "cluster-a",
    "useProviderId": True,
    "dryRun": True,
    "cordonOnly": True,
    "taintNode": True,
    "taintEffect": "NoExecute",
    "enableOutOfServiceTaint": True,
    "excludeFromLoadBalancers": True,
    "deleteLocalData": False,
    "ignoreDaemonSets": False,
    "podTerminationGracePeriod": 45,
    "nodeTerminationGracePeriod": 1000000,
    "drainOrder": "all-at-once",
    "drainCriticalPriority": 1000000,
    "graceDeadlineMargin": 15.5,
    "deleteAtDeadline": True,
    "deleteAtDeadlineLead": 3,
    "drainRelistAfter": 2.5,
    "surgeDrains": True,
    "drainBudget": 50,
    "drainBudgetNonUrgent": "10%",
    "drainBudgetGroupLabel": "topology.kubernetes.io/zone",
    "useAPIServerCacheToListPods": True,
    "kubeAPIQPS": 37.5,
    "kubeAPIBurst": 75,
    "evictionsInFlight": 96,
    "nodeLeases": True,
    "nodeLeaseDurationSec": 90,
    "heartbeatInterval": 60,
    "heartbeatUntil": 7200,
    "completeWarmPoolLaunch": True,
    "launchReadyTimeoutSec": 1200,
    "uncordonOnReturn": False,
    "returnCheckIntervalSec": 12.5,
    "completeLifecycleActionDelaySeconds": 30,
    "emitKubernetesEvents": True,
    "kubernetesEventsExtraAnnotations": "team=platform,cost-center=42",
    "webhookTemplate": '{"text": "{{ .Kind }} on {{ .NodeName }}"}',
    "webhookTemplateFile": str(CHART / "README.md"),  # readable: the controller reads it at start-up
    "webhookProxy": "http://proxy.internal:3128",
    "enablePrometheusServer": False,
    "prometheusServerPort": 9100,
    "enableProbesServer": False,
    "probesServerPort": 8081,
    "jsonLogging": True,
    "logLevel": "debug",
}


# --- Helm ------------------------------------------------------------------------------------------------------


def load_engine() -> ModuleType:
    """``helm_python``, once its shared library answers; skips the test when it cannot be loaded (fails it
    in CI)."""
    try:
        import helm_python

        helm_python.helm_sdk_version()
    except Exception as exc:  # ImportError, OSError, helm_python.HelmLibraryError: no usable libhelm_c
        if os.environ.get("CI"):
            pytest.fail(f"Helm's engine (helm-python-sdk) cannot be used in CI: {exc!r}")
        pytest.skip(f"Helm's engine (helm-python-sdk) cannot be used: {exc!r}")
    return helm_python


@pytest.fixture(scope="module")
def helm() -> ModuleType:
    """``helm_python`` (:func:`load_engine`)."""
    return load_engine()


@pytest.fixture(scope="module")
def chart(helm: ModuleType) -> Iterator[Any]:
    loaded = helm.Chart.load(CHART)
    yield loaded
    loaded.close()


class Rendered:
    """The manifests of one render, by kind, and NOTES.txt."""

    def __init__(self, files: dict[str, str]) -> None:
        self.notes = ""
        self.objects: list[dict[str, Any]] = []
        for path, text in files.items():
            if path.endswith("NOTES.txt"):
                self.notes = text
                continue
            self.objects.extend(doc for doc in yaml.safe_load_all(text) if doc)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.all(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        return found[0]

    @property
    def deployment(self) -> dict[str, Any]:
        return self.one("Deployment")

    @property
    def pod(self) -> dict[str, Any]:
        return self.deployment["spec"]["template"]["spec"]

    @property
    def container(self) -> dict[str, Any]:
        containers = self.pod["containers"]
        assert len(containers) == 1
        return containers[0]

    @property
    def env(self) -> dict[str, dict[str, Any]]:
        """Environment variables by name; a name set twice fails (which one wins is not obvious)."""
        entries = self.container.get("env", [])
        names = [entry["name"] for entry in entries]
        assert len(names) == len(set(names)), f"variables set twice: {names}"
        return {entry["name"]: entry for entry in entries}

    def values(self) -> dict[str, str]:
        """The variables given as plain values."""
        return {name: entry["value"] for name, entry in self.env.items() if "value" in entry}


def render(chart: Any, values: dict[str, Any]) -> Rendered:
    return Rendered(chart.render(values=values, name=RELEASE, namespace=NAMESPACE))


def with_values(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**base, **changes}


# --- Helpers on Settings and the chart's files -----------------------------------------------------------------


def settings_env_mapping() -> dict[str, str]:
    """The chart's one mapping, environment variable -> value key ("queue-processor.settingsEnv")."""
    source = (CHART / "templates" / "_helpers.tpl").read_text()
    match = re.search(r'{{- define "queue-processor\.settingsEnv" -}}\n(.*?)\n{{- end }}', source, re.DOTALL)
    assert match, "templates/_helpers.tpl defines no queue-processor.settingsEnv"
    mapping = yaml.safe_load(match.group(1))
    assert isinstance(mapping, dict)
    return mapping


def field_by_env() -> dict[str, str]:
    """Settings field by its environment variable, its name in upper case."""
    return {field.upper(): field for field in Settings.model_fields}


def env_names_read() -> set[str]:
    """Every variable Settings reads: the field names in upper case and their aliases."""
    names = set(field_by_env())
    for info in Settings.model_fields.values():
        extra = info.json_schema_extra
        if isinstance(extra, dict):
            names.update(str(alias).upper() for alias in extra.get("aliases", []))  # type: ignore[union-attr]
    return names


def json_types(annotation: Any) -> set[str]:
    """The JSON schema type(s) that hold a Settings field's Python type."""
    origin = get_origin(annotation)
    if origin is Literal:
        return {"string"} if all(isinstance(arg, str) for arg in get_args(annotation)) else {"integer"}
    if origin is list:
        return {"array"}
    if origin is dict:
        return {"object"}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string", SecretStr: "string"}
    assert annotation in simple, f"no JSON type for {annotation!r}"
    return {simple[annotation]}


def bounds(field: str) -> dict[str, float]:
    """The ge / le / gt constraints of a Settings field."""
    found: dict[str, float] = {}
    for item in Settings.model_fields[field].metadata:
        for name in ("ge", "le", "gt"):
            if getattr(item, name, None) is not None:
                found[name] = getattr(item, name)
    return found


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


@pytest.fixture(scope="module")
def defaults() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No variable Settings reads is left in the test's environment."""
    for name in env_names_read():
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def controller_env(clean_env: pytest.MonkeyPatch) -> Any:
    """A function that loads Settings from exactly the given variables, as the container would."""

    def load(variables: dict[str, str]) -> Settings:
        for name in env_names_read():
            clean_env.delenv(name, raising=False)
        for name, value in variables.items():
            clean_env.setenv(name, value)
        return load_settings()

    return load


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair anywhere in a manifest."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


# --- Lint and schema -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint_is_clean(helm: ModuleType, name: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[name], strict=True, namespace=NAMESPACE, kube_version="v1.33.0")
    problems = [message for message in report["messages"] if message["severity"] >= 2]
    assert not report["errors"], report
    assert not problems, report


def test_the_chart_refuses_to_render_without_a_queue(chart: Any, helm: ModuleType) -> None:
    with pytest.raises(helm.HelmRenderError, match="queueURL"):
        render(chart, {})
    assert render(chart, {"queueURLs": [QUEUE]}).values()["QUEUE_URLS"] == QUEUE


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"replicas": "3"}, "replicas"),
        ({"replicas": 1.5}, "replicas"),
        ({"dryRun": "yes"}, "dryRun"),
        ({"taintEffect": "NoScheduled"}, "taintEffect"),
        ({"heartbeatInterval": 10}, "heartbeatInterval"),
        ({"heartbeatUntil": 30}, "heartbeatUntil"),
        ({"sqsMsgVisibilityTimeoutSec": 5}, "sqsMsgVisibilityTimeoutSec"),
        ({"kubeAPIQPS": 0}, "kubeAPIQPS"),
        ({"prometheusServerPort": 0}, "prometheusServerPort"),
        ({"logLevel": "verbose"}, "logLevel"),
        ({"queueURL": "sqs.us-east-1.amazonaws.com/123456789012/q"}, "queueURL"),
        ({"queueURLs": QUEUE}, "queueURLs"),
        ({"queueUrl": QUEUE}, "queueUrl"),
        ({"serviceAccount": {"roleArn": "queue-processor"}}, "roleArn"),
        ({"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1}}, "podDisruptionBudget"),
        ({"webhookHeaders": ["Authorization: x"]}, "webhookHeaders"),
        ({"probes": {"liveness": {"periodSeconds": "10s"}}}, "periodSeconds"),
    ],
)
def test_the_schema_rejects_bad_values_before_anything_renders(
    chart: Any, helm: ModuleType, values: dict[str, Any], key: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=key):
        chart.validate_schema(with_values(BASE, **values))
    with pytest.raises(helm.HelmValuesError):
        render(chart, with_values(BASE, **values))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"webhookURL": "https://hooks.example.com/x", "webhookURLSecretName": "hook"}, "both set"),
        ({"webhookHeadersSecretKey": "headers"}, "webhookURLSecretName is not"),
        ({"webhookTemplateConfigMapName": "template"}, "set both or neither"),
        ({"serviceMonitor": {"create": True}, "enablePrometheusServer": False}, "enablePrometheusServer"),
        ({"prometheusRule": {"create": True}, "enablePrometheusServer": False}, "enablePrometheusServer"),
        ({"enableSqsTerminationDraining": False}, "queue-processor mode"),
    ],
)
def test_contradictory_values_stop_the_render_with_a_message(
    chart: Any, helm: ModuleType, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(chart, with_values(BASE, **values))


def test_every_value_has_a_default_a_type_and_a_line_in_the_readme(
    schema: dict[str, Any], defaults: dict[str, Any]
) -> None:
    """Except aws-node-termination-handler's values that mean nothing here: the schema accepts them without a
    default (they are listed in the install notes and docs/migration.md)."""
    nths = {
        key
        for key, spec in schema["properties"].items()
        if spec.get("description", "").startswith(NTH_IGNORED)
    }
    properties = set(schema["properties"]) - {"global"} - nths
    assert set(defaults) == properties
    readme = (CHART / "README.md").read_text()
    assert not [key for key in properties if f"`{key}" not in readme]
    assert len(nths) >= 30


# --- Settings <-> values ---------------------------------------------------------------------------------------


def test_every_setting_has_exactly_one_way_in() -> None:
    mapping = settings_env_mapping()
    assert set(mapping).isdisjoint(FROM_SECRET)
    assert set(mapping).isdisjoint(FROM_DOWNWARD_API)
    covered = set(mapping) | set(FROM_SECRET) | set(FROM_DOWNWARD_API)
    assert covered == set(field_by_env()), (
        "settings the chart cannot set, or variables Settings does not read"
    )
    assert len(set(mapping.values())) == len(mapping), "one value feeds two variables"
    assert set(SAMPLES) == set(mapping.values())


def test_the_schema_types_each_setting_as_the_controller_does(schema: dict[str, Any]) -> None:
    fields = field_by_env()
    for env, key in {**settings_env_mapping(), **FROM_SECRET}.items():
        info = Settings.model_fields[fields[env]]
        prop = schema["properties"][key]
        types = {prop["type"]} if isinstance(prop["type"], str) else set(prop["type"])
        expected = json_types(info.annotation)
        if key == "webhookHeaders":
            expected |= {"string"}  # NTH's chart took the headers as a JSON string; both are accepted
        assert types == expected, (key, types, expected)
        if get_origin(info.annotation) is Literal:
            assert set(get_args(info.annotation)) <= set(prop["enum"]), key
            assert {str(v).lower() for v in prop["enum"]} == {
                str(v).lower() for v in get_args(info.annotation)
            }
        limits = bounds(fields[env])
        if key in STRICTER_IN_CHART:
            assert prop["minimum"] >= limits["ge"], key
            assert prop["maximum"] <= limits["le"], key
            continue
        assert prop.get("minimum") == limits.get("ge"), key
        assert prop.get("maximum") == limits.get("le"), key
        assert prop.get("exclusiveMinimum") == limits.get("gt"), key


def _accepted_by_controller(field: str, value: Any) -> bool:
    try:
        load_settings(queue_url=QUEUE, **{field: value})
    except ConfigError:
        return False
    return True


def _accepted_by_schema(chart: Any, helm: ModuleType, key: str, value: Any) -> bool:
    try:
        chart.validate_schema({key: value})
    except helm.HelmValuesError:
        return False
    return True


@pytest.mark.usefixtures("clean_env")
def test_the_schema_accepts_exactly_the_numbers_the_controller_accepts(chart: Any, helm: ModuleType) -> None:
    fields = field_by_env()
    checked = 0
    for env, key in settings_env_mapping().items():
        field = fields[env]
        if json_types(Settings.model_fields[field].annotation) not in ({"integer"}, {"number"}):
            continue
        limits = bounds(field)
        candidates = {-2, -1, 0, 1, 29, 30, 59, 60, 3600, 3601, 172800, 172801}
        for limit in limits.values():
            candidates |= {limit - 1, limit, limit + 1}
        for value in sorted(candidates):
            by_schema = _accepted_by_schema(chart, helm, key, value)
            by_controller = _accepted_by_controller(field, value)
            if key in STRICTER_IN_CHART:
                assert not by_schema or by_controller, (key, value)
            else:
                assert by_schema == by_controller, (key, value, by_schema, by_controller)
            checked += 1
    assert checked > 100


@pytest.mark.parametrize(("env", "key"), sorted(settings_env_mapping().items()))
def test_each_value_reaches_the_controller(chart: Any, controller_env: Any, env: str, key: str) -> None:
    sample = SAMPLES[key]
    values = with_values(BASE, **{key: sample})
    before = render(chart, BASE).values().get(env)
    after = render(chart, values).values()
    assert after.get(env) != before, f"{key}={sample!r} does not change {env}"
    settings = controller_env(after)
    field = field_by_env()[env]
    assert getattr(settings, field) == sample, (env, after.get(env))


def test_the_chart_defaults_are_the_controller_defaults(chart: Any, controller_env: Any) -> None:
    settings = controller_env(render(chart, BASE).values())
    fields = field_by_env()
    differing = {
        env: getattr(settings, fields[env])
        for env in settings_env_mapping()
        if env not in ("QUEUE_URL", "AWS_REGION")
        and getattr(settings, fields[env]) != Settings.model_fields[fields[env]].default
    }
    assert not differing, f"the chart changes the controller's defaults: {differing}"
    assert settings.aws_region == "us-east-1"  # from the queue URL, as without the chart


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_container_sets_no_variable_the_controller_ignores(chart: Any, name: str) -> None:
    extra = [{"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"}]
    rendered = render(chart, with_values(VALUE_SETS[name], extraEnv=extra))
    names = list(rendered.env)
    assert names[-1] == "AWS_STS_REGIONAL_ENDPOINTS"
    assert set(names[:-1]) <= env_names_read()


def test_extra_env_replaces_the_charts_variable_of_the_same_name(chart: Any) -> None:
    extra = [
        {"name": "LOG_LEVEL", "value": "debug"},
        {"name": "POD_NAMESPACE", "value": "elsewhere"},
    ]
    env = render(chart, with_values(BASE, extraEnv=extra)).env  # fails on a name set twice
    assert env["LOG_LEVEL"] == extra[0]
    assert env["POD_NAMESPACE"] == extra[1]


def test_the_pod_knows_its_own_name_and_namespace(chart: Any) -> None:
    env = render(chart, BASE).env
    for name, path in FROM_DOWNWARD_API.items():
        assert env[name]["valueFrom"] == {"fieldRef": {"fieldPath": path}}
        assert name in field_by_env()


def test_node_leases_are_on_whenever_several_replicas_consume(chart: Any) -> None:
    assert render(chart, BASE).values()["NODE_LEASES"] == "false"
    assert render(chart, with_values(BASE, replicas=3)).values()["NODE_LEASES"] == "true"
    assert render(chart, with_values(BASE, replicas=3, nodeLeases=False)).values()["NODE_LEASES"] == "true"
    assert render(chart, with_values(BASE, nodeLeases=True)).values()["NODE_LEASES"] == "true"


# --- Webhook credentials ---------------------------------------------------------------------------------------


def test_the_webhook_url_and_headers_come_from_an_existing_secret(chart: Any) -> None:
    rendered = render(chart, WEBHOOK_FROM_SECRET)
    env = rendered.env
    assert env["WEBHOOK_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "queue-processor-webhook", "key": "url"}
    }
    assert env["WEBHOOK_HEADERS"]["valueFrom"] == {
        "secretKeyRef": {"name": "queue-processor-webhook", "key": "headers"}
    }
    assert not rendered.all("Secret"), "the chart must not shadow the user's Secret"
    default_key = render(chart, with_values(BASE, webhookURLSecretName="hook")).env["WEBHOOK_URL"]
    assert default_key["valueFrom"]["secretKeyRef"] == {"name": "hook", "key": "webhookurl"}  # NTH's key


def test_a_plain_webhook_url_is_kept_in_a_secret_not_in_the_deployment(
    chart: Any, controller_env: Any
) -> None:
    rendered = render(chart, WEBHOOK_PLAIN)
    secret = rendered.one("Secret")
    assert secret["metadata"]["namespace"] == NAMESPACE
    data = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert WEBHOOK_PLAIN["webhookURL"] not in yaml.safe_dump(rendered.deployment)
    assert "Bearer token" not in yaml.safe_dump(rendered.deployment)
    variables = rendered.values()
    for name, entry in rendered.env.items():
        if "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"]
            variables[name] = data[ref["key"]]
    settings = controller_env(variables)
    assert settings.webhook_url.get_secret_value() == WEBHOOK_PLAIN["webhookURL"]
    assert settings.webhook_headers == WEBHOOK_PLAIN["webhookHeaders"]
    # NTH's chart took the headers as a JSON string; that still works.
    nth_style = render(chart, with_values(WEBHOOK_PLAIN, webhookHeaders='{"X-Team": "infra"}')).one("Secret")
    assert base64.b64decode(nth_style["data"]["webhookheaders"]).decode() == '{"X-Team": "infra"}'


def test_pods_restart_when_the_charts_webhook_secret_changes(chart: Any) -> None:
    def checksum(url: str) -> str:
        template = render(chart, with_values(BASE, webhookURL=url)).deployment["spec"]["template"]
        return str(template["metadata"]["annotations"]["checksum/webhook-secret"])

    assert checksum("https://hooks.example.com/a") != checksum("https://hooks.example.com/b")


def test_the_webhook_template_can_come_from_a_configmap(chart: Any) -> None:
    values = with_values(
        BASE,
        webhookTemplate="ignored",
        webhookTemplateConfigMapName="webhook-template",
        webhookTemplateConfigMapKey="template.json",
    )
    entry = render(chart, values).env["WEBHOOK_TEMPLATE"]
    assert entry == {
        "name": "WEBHOOK_TEMPLATE",
        "valueFrom": {"configMapKeyRef": {"name": "webhook-template", "key": "template.json"}},
    }


# --- RBAC ------------------------------------------------------------------------------------------------------


def _expected_rules(cluster_wide: bool, enabled: dict[str, bool]) -> list[dict[str, Any]]:
    return [
        {"apiGroups": [rule.api_group], "resources": [rule.resource], "verbs": list(rule.verbs)}
        for rule in KUBERNETES_RULES
        if rule.cluster_wide == cluster_wide and (not rule.when or enabled[rule.when])
    ]


@pytest.mark.parametrize(
    ("events", "delete", "surge"),
    [(False, False, False), (True, False, False), (False, True, False), (False, False, True)],
)
@pytest.mark.parametrize(
    ("replicas", "leases_value", "leases"), [(1, False, False), (1, True, True), (3, False, True)]
)
def test_rbac_grants_exactly_the_requests_the_code_makes(
    chart: Any, events: bool, delete: bool, surge: bool, replicas: int, leases_value: bool, leases: bool
) -> None:
    values = with_values(
        BASE,
        replicas=replicas,
        nodeLeases=leases_value,
        emitKubernetesEvents=events,
        deleteAtDeadline=delete,
        surgeDrains=surge,
    )
    rendered = render(chart, values)
    enabled = {
        "EMIT_KUBERNETES_EVENTS": events,
        "NODE_LEASES": leases,
        "DELETE_AT_DEADLINE": delete,
        "SURGE_DRAINS": surge,
    }
    assert {rule.when for rule in KUBERNETES_RULES if rule.when} <= set(enabled)
    assert rendered.one("ClusterRole")["rules"] == _expected_rules(True, enabled)
    roles = rendered.all("Role")
    namespaced = _expected_rules(False, enabled)
    assert [role["rules"] for role in roles] == ([namespaced] if namespaced else [])
    for role in roles:
        assert role["metadata"]["namespace"] == NAMESPACE
    service_account = rendered.one("ServiceAccount")["metadata"]["name"]
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        for binding in rendered.all(kind):
            assert binding["roleRef"] == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": role_kind,
                "name": FULLNAME,
            }
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": service_account, "namespace": NAMESPACE}
            ]
    assert len(rendered.all("RoleBinding")) == len(roles)
    assert rendered.pod["serviceAccountName"] == service_account


def test_rbac_can_be_left_to_the_operator(chart: Any) -> None:
    rendered = render(chart, with_values(FULL, rbac={"create": False}))
    kinds = {obj["kind"] for obj in rendered.objects}
    assert kinds.isdisjoint({"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"})


def test_irsa_role_arn_annotates_the_service_account(chart: Any) -> None:
    values = with_values(
        BASE, serviceAccount={"roleArn": ROLE, "annotations": {"example.com/owner": "infra"}}
    )
    annotations = render(chart, values).one("ServiceAccount")["metadata"]["annotations"]
    assert annotations == {"eks.amazonaws.com/role-arn": ROLE, "example.com/owner": "infra"}
    assert "annotations" not in render(chart, BASE).one("ServiceAccount")["metadata"]


def test_the_notes_list_exactly_the_iam_actions_the_code_calls(chart: Any) -> None:
    notes = render(chart, BASE).notes
    assert set(re.findall(r"\b(?:sqs|ec2|autoscaling):[A-Za-z]+", notes)) == set(AWS_ACTIONS)


# --- Scheduling and rollout ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_nothing_uses_the_host_network_ports_or_filesystem(chart: Any, name: str) -> None:
    rendered = render(chart, VALUE_SETS[name])
    for obj in rendered.objects:
        for key, value in walk(obj):
            assert key not in ("hostNetwork", "hostPort", "hostPID", "hostIPC", "hostPath"), (
                obj["kind"],
                key,
                value,
            )


@pytest.mark.parametrize("name", VALUE_SETS)
def test_a_rollout_progresses_on_a_single_control_plane_node(chart: Any, name: str) -> None:
    """kOps upgrades stalled when NTH's new pod stayed Pending next to the old one (host port, required
    anti-affinity): the old pod may go first, and nothing requires a separate node. Every value set, on the
    rendered manifests; tests/deploy/test_rollout.py runs the upgrade on the real scheduler."""
    rendered = render(chart, VALUE_SETS[name])
    strategy = rendered.deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 1
    assert strategy["rollingUpdate"]["maxSurge"] == 1
    affinity = rendered.pod.get("affinity", {})
    for kind in ("podAntiAffinity", "podAffinity", "nodeAffinity"):
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity.get(kind, {}), kind
    for constraint in rendered.pod.get("topologySpreadConstraints", []):
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"


def test_replicas_spread_and_get_a_disruption_budget_only_when_there_are_several(chart: Any) -> None:
    single = render(chart, BASE)
    assert single.deployment["spec"]["replicas"] == 1
    assert "topologySpreadConstraints" not in single.pod
    assert not single.all("PodDisruptionBudget")

    several = render(chart, FULL)
    assert several.deployment["spec"]["replicas"] == 3
    labels = several.deployment["spec"]["template"]["metadata"]["labels"]
    spread = several.pod["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    for constraint in spread:
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
    budget = several.one("PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_scheduling_values_are_honoured(chart: Any) -> None:
    tolerations = [{"key": "CriticalAddonsOnly", "operator": "Exists"}]
    values = with_values(
        BASE, tolerations=tolerations, nodeSelector={"node-role": "system"}, priorityClassName="custom"
    )
    pod = render(chart, values).pod
    assert pod["tolerations"] == tolerations
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "node-role": "system"}
    assert pod["priorityClassName"] == "custom"
    assert render(chart, BASE).pod["priorityClassName"] == "system-cluster-critical"


def test_custom_labels_label_every_object_but_not_the_pods_or_the_selectors(chart: Any) -> None:
    """NTH's ``customLabels``: on the metadata of every object the chart renders; ``podLabels`` labels pods."""
    rendered = render(chart, with_values(FULL, customLabels={"team": "platform"}))
    assert len(rendered.objects) >= 8
    unlabelled = [
        obj["kind"] for obj in rendered.objects if obj["metadata"]["labels"].get("team") != "platform"
    ]
    assert not unlabelled
    deployment = rendered.deployment
    assert "team" not in deployment["spec"]["selector"]["matchLabels"]
    assert "team" not in deployment["spec"]["template"]["metadata"]["labels"]


def test_avoid_spot_prefers_on_demand_nodes_and_keeps_the_users_affinity(chart: Any) -> None:
    assert "affinity" not in render(chart, BASE).pod
    mine = {
        "weight": 10,
        "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
    }
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [mine]}}
    pod = render(chart, with_values(BASE, avoidSpot=True, affinity=affinity)).pod
    preferred = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0] == mine
    expressions = preferred[1]["preference"]["matchExpressions"]
    # Karpenter's label (values spot / on-demand) and EKS managed node groups' (SPOT / ON_DEMAND).
    assert {"key": "karpenter.sh/capacity-type", "operator": "NotIn", "values": ["spot"]} in expressions
    assert {"key": "eks.amazonaws.com/capacityType", "operator": "NotIn", "values": ["SPOT"]} in expressions
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["nodeAffinity"]


# --- The container ---------------------------------------------------------------------------------------------


def _dockerfile_entrypoint() -> list[str] | None:
    dockerfile = ROOT / "Dockerfile"
    if not dockerfile.exists():
        return None
    lines = [line for line in dockerfile.read_text().splitlines() if line.strip().startswith("ENTRYPOINT")]
    assert lines, "the Dockerfile has no ENTRYPOINT"
    entrypoint = json.loads(lines[-1].split(None, 1)[1])
    assert isinstance(entrypoint, list)
    return [str(part) for part in entrypoint]


def test_the_pod_runs_as_the_images_user(chart: Any) -> None:
    dockerfile = ROOT / "Dockerfile"
    if not dockerfile.exists():
        pytest.skip("no Dockerfile")
    users = re.findall(r"^USER\s+(\d+)(?::(\d+))?\s*$", dockerfile.read_text(), re.MULTILINE)
    assert users, "the Dockerfile sets no numeric USER"
    uid, gid = users[-1]
    context = render(chart, BASE).pod["securityContext"]
    assert context["runAsUser"] == int(uid)
    if gid:
        assert context["runAsGroup"] == int(gid)


def test_the_container_runs_queue_processor_run(chart: Any) -> None:
    from queue_processor.cli import main

    container = render(chart, BASE).container
    entrypoint = _dockerfile_entrypoint() or ["queue-processor", "run"]  # the image's documented ENTRYPOINT
    argv = list(container.get("command") or entrypoint) + list(container.get("args") or [])
    assert argv == ["queue-processor", "run"]
    assert "run" in main.commands  # type: ignore[attr-defined]
    scripts = (ROOT / "pyproject.toml").read_text()
    assert 'queue-processor = "queue_processor.cli:main"' in scripts
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container["image"] == f"queue-processor:{app_version}"
    assert (
        render(chart, with_values(BASE, image={"repository": "r.example/qp", "tag": "v2"})).container["image"]
        == "r.example/qp:v2"
    )


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_pod_runs_locked_down(chart: Any, name: str) -> None:
    rendered = render(chart, VALUE_SETS[name])
    effective = {**rendered.pod.get("securityContext", {}), **rendered.container.get("securityContext", {})}
    assert effective["runAsNonRoot"] is True
    assert isinstance(effective["runAsUser"], int)
    assert effective["runAsUser"] > 0
    assert effective["readOnlyRootFilesystem"] is True
    assert effective["allowPrivilegeEscalation"] is False
    assert effective["capabilities"] == {"drop": ["ALL"]}
    assert effective["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in effective or effective["privileged"] is False
    mounts = {mount["mountPath"]: mount["name"] for mount in rendered.container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in rendered.pod["volumes"]}
    assert set(mounts) == {"/tmp"}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_resources_are_requested_and_memory_is_bounded(chart: Any) -> None:
    resources = render(chart, BASE).container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]


def test_probes_hit_the_controllers_endpoints(chart: Any) -> None:
    container = render(chart, BASE).container
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"metrics": 9092, "probes": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8080}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8080}

    moved = render(chart, with_values(BASE, probesServerPort=8443)).container
    assert moved["livenessProbe"]["httpGet"]["port"] == 8443
    assert {port["containerPort"] for port in moved["ports"]} == {9092, 8443}

    shared = render(chart, with_values(BASE, probesServerPort=9092)).container
    assert [port["containerPort"] for port in shared["ports"]] == [9092], "one listener serves both"
    assert shared["readinessProbe"]["httpGet"]["port"] == 9092

    off = render(chart, with_values(BASE, enableProbesServer=False)).container
    assert "livenessProbe" not in off
    assert "readinessProbe" not in off


def test_metrics_are_served_to_prometheus(chart: Any) -> None:
    rendered = render(chart, FULL)
    labels = rendered.deployment["spec"]["template"]["metadata"]["labels"]
    service = rendered.one("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9092, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["spec"]["publishNotReadyAddresses"] is True
    monitor = rendered.one("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"

    off = render(chart, with_values(BASE, enablePrometheusServer=False))
    assert not off.all("Service")
    assert [port["name"] for port in off.container["ports"]] == ["probes"]


# --- Alerts ----------------------------------------------------------------------------------------------------

ALERTS = {
    "QueueProcessorNotProcessing",
    "QueueProcessorDrainErrors",
    "QueueProcessorLifecycleActionsTimingOut",
    "QueueProcessorPoisonMessages",
}


def _exposition() -> str:
    return Metrics("test", process_metrics=False).render()[0].decode()


def _alerts(chart: Any, values: dict[str, Any] = FULL) -> dict[str, dict[str, Any]]:
    rule = render(chart, values).one("PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def test_the_alerts_are_the_documented_ones_with_runbooks_and_severities(chart: Any) -> None:
    alerts = _alerts(chart)
    assert set(alerts) == ALERTS
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in ("critical", "warning")
        assert alert["annotations"]["runbook_url"] == f"docs/runbook.md#{name.lower()}"
        assert alert["annotations"]["summary"]
        assert alert["annotations"]["description"]
    assert alerts["QueueProcessorNotProcessing"]["labels"]["severity"] == "critical"
    custom = _alerts(
        chart,
        with_values(
            FULL,
            prometheusRule={
                "create": True,
                "runbookURL": "https://example.com/runbook.md",
                "additionalRuleLabels": {"team": "infra"},
            },
        ),
    )
    for name, alert in custom.items():
        assert alert["annotations"]["runbook_url"] == f"https://example.com/runbook.md#{name.lower()}"
        assert alert["labels"]["team"] == "infra"


def test_the_alerts_read_metrics_and_label_values_the_controller_exposes(chart: Any) -> None:
    exposition = _exposition()
    families = set(re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE))
    names = {sample for sample, _ in families}
    names |= {f"{name}_total" for name, kind in families if kind == "counter"}
    names |= {f"{name}_count" for name, kind in families if kind == "histogram"}
    selector = f'job="{FULLNAME}",namespace="{NAMESPACE}"'
    for name, alert in _alerts(chart).items():
        expr = alert["expr"]
        selectors = re.findall(r"([a-z_:][a-z0-9_:]*)\{([^}]*)\}", expr)
        assert selectors, name
        for metric, matchers in selectors:
            assert metric in names | {"up"}, (name, metric)
            assert matchers.startswith(selector), (name, metric, "selects other releases' series")
            for label, value in re.findall(r'(\w+)="([^"]*)"', matchers[len(selector) :]):
                assert f'{label}="{value}"' in exposition, (name, metric, label, value)


def test_the_dashboard_queries_only_metrics_the_controller_exports(chart: Any) -> None:
    """The Grafana dashboard (dashboards/queue-processor.json, also docs/grafana-dashboard.json): every query
    names a metric of the controller's /metrics, and the chart ships it as a ConfigMap for Grafana's sidecar."""
    source = (CHART / "dashboards" / "queue-processor.json").read_text()
    assert (ROOT / "docs" / "grafana-dashboard.json").read_text() == source
    dashboard = json.loads(source)
    exposition = Metrics().render()[0].decode()
    families = {
        line.split(" ")[2]: line.split(" ")[3]
        for line in exposition.splitlines()
        if line.startswith("# TYPE")
    }
    names = set(families) | {
        f"{name}{suffix}"
        for name, kind in families.items()
        if kind == "histogram"
        for suffix in ("_bucket", "_sum", "_count")
    }
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) >= 10
    used = {metric for expr in exprs for metric in re.findall(r"([a-z_:][a-z0-9_:]*)\{", expr)}
    assert used <= names, used - names
    for wanted in (
        "queue_processor_messages_received_total",
        "queue_processor_evictions_total",
        "actions_total",
    ):
        assert wanted in used
    (configmap,) = [
        obj for obj in render(chart, FULL).all("ConfigMap") if obj["metadata"]["name"].endswith("-dashboard")
    ]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["queue-processor.json"]) == dashboard
    assert not [
        obj for obj in render(chart, BASE).all("ConfigMap") if obj["metadata"]["name"].endswith("-dashboard")
    ]


def test_the_alert_selector_can_be_replaced(chart: Any) -> None:
    values = with_values(FULL, prometheusRule={"create": True, "selector": 'service="queue-processor"'})
    for alert in _alerts(chart, values).values():
        assert 'service="queue-processor"' in alert["expr"]
        assert "job=" not in alert["expr"]


def test_the_runbook_has_a_section_per_alert() -> None:
    runbook = ROOT / "docs" / "runbook.md"
    if not runbook.exists():
        pytest.skip("docs/runbook.md is not written yet")
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in runbook.read_text().splitlines()
        if line.startswith("#")
    }
    assert {name.lower() for name in ALERTS} <= anchors


# --- Migration guide -------------------------------------------------------------------------------------------


def test_the_migration_guide_places_every_setting_and_value() -> None:
    guide = (ROOT / "docs" / "migration.md").read_text()
    missing = [env for env in field_by_env() if f"`{env}`" not in guide]
    missing += [key for key in settings_env_mapping().values() if f"`{key}`" not in guide]
    assert not missing, f"docs/migration.md says nothing of {missing}"


def test_an_nth_values_file_installs_and_the_notes_name_what_is_ignored(chart: Any) -> None:
    """NTH's values for queue-processor mode (tests/migration/nth.py) pass the schema and render; the notes
    name every NTH value that means nothing here and what replaces it."""
    from tests.migration.nth import HELM_VALUES, VALUES_FILE

    assert set(VALUES_FILE) <= HELM_VALUES
    rendered = render(chart, VALUES_FILE)
    env = rendered.values()
    assert env["QUEUE_URL"] == VALUES_FILE["queueURL"]
    assert env.get("SQS_MSG_VISIBILITY_TIMEOUT_SEC") == "20"
    ignored = rendered.notes.split("Ignored aws-node-termination-handler values", 1)[1]
    for key in (
        "workers",
        "logFormatVersion",
        "useHostNetwork",
        "enableSpotInterruptionDraining",
        "updateStrategy",
    ):
        assert f"  - {key}: " in ignored
    for nested in ("probes.httpGet", "image.pullSecrets", "rbac.pspEnabled", "enableProbesServer=false"):
        assert f"  - {nested}" in ignored
    assert "Ignored aws-node-termination-handler values" not in render(chart, BASE).notes
