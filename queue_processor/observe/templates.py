"""NTH's webhook data (``combinedDrainData``, ``pkg/webhook`` of aws-node-termination-handler v1.25.6) as a Go
template sees it, and the start-up check of a template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from queue_processor_gotemplate import GoTime, NilMap, NilSlice, Struct, Template, parse

# ``(JSON key, field)`` in the order encoding/json writes NTH's combinedDrainData: the embedded
# ec2metadata.NodeMetadata (json tags; its InstanceID and InstanceType lose to the outer fields), the embedded
# monitor.InterruptionEvent (func fields tagged "-"), then the outer InstanceID and InstanceType.
METADATA = (
    ("accountId", "AccountId"),
    ("instanceId", ""),
    ("instanceLifeCycle", "InstanceLifeCycle"),
    ("instanceType", ""),
    ("publicHostname", "PublicHostname"),
    ("publicIp", "PublicIP"),
    ("localHostname", "LocalHostname"),
    ("privateIp", "LocalIP"),
    ("availabilityZone", "AvailabilityZone"),
    ("region", "Region"),
)
EVENT_FIELDS = (
    "EventID",
    "Kind",
    "Monitor",
    "Description",
    "State",
    "AutoScalingGroupName",
    "NodeName",
    "NodeLabels",
    "Pods",
    "ProviderID",
    "IsManaged",
    "StartTime",
    "EndTime",
    "NodeProcessed",
    "InProgress",
)
JSON_NAMES = (
    *METADATA,
    *((name, name) for name in EVENT_FIELDS),
    ("InstanceID", "InstanceID"),
    ("InstanceType", "InstanceType"),
)
DATA_TYPE = "webhook.combinedDrainData"

#: NTH's default WEBHOOK_TEMPLATE (pkg/config/config.go).
DEFAULT_WEBHOOK_TEMPLATE = (
    '{"text":"[NTH][Instance Interruption] EventID: {{ .EventID }} - Kind: {{ .Kind }} - Instance: '
    '{{ .InstanceID }} - Node: {{ .NodeName }} - Description: {{ .Description }} - Start Time: {{ .StartTime }}"}'
)


def nth_data(fields: Mapping[str, Any]) -> Struct:
    """NTH's ``combinedDrainData`` with ``fields`` (NTH's names), every other one empty as in its queue mode."""
    values: dict[str, Any] = {name: "" for _, name in JSON_NAMES if name}
    values |= {
        "NodeLabels": NilMap(),
        "Pods": NilSlice(),
        "StartTime": GoTime.zero(),
        "EndTime": GoTime.zero(),
    }
    values |= {"IsManaged": False, "NodeProcessed": False, "InProgress": False, **fields}
    return Struct(DATA_TYPE, values, JSON_NAMES)


def check_template(text: str) -> Template:
    """``text`` parsed and executed over empty data, as NTH validates its template at start-up; raises
    :class:`~queue_processor_gotemplate.TemplateError` naming what fails or is not supported."""
    template = parse(text)
    template.execute(nth_data({}))
    return template
