"""What the controller is allowed to do: the Kubernetes RBAC rules and the AWS IAM actions its code calls, the
one list the Helm chart's ClusterRole/Role, the Terraform module's IAM policy and the code are tested against.
Less obvious uses: pods watch (metadata-only deletions), Events (in namespace ``default``), DescribeLifecycleHooks
(a hook's HeartbeatTimeout), DescribeAutoScalingGroups (group sizes for DRAIN_BUDGET_NON_URGENT) and
DescribeAutoScalingInstances (whether a lifecycle action still waits). Documents: "Using RBAC Authorization"
(Kubernetes); "Service Authorization Reference" (AWS IAM)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KubernetesRule:
    """One RBAC rule: API group (``""`` = core), resource (``pods/eviction`` for a subresource), verbs, and
    whether it is granted cluster-wide (ClusterRole) or in the controller's namespace (Role)."""

    api_group: str
    resource: str
    verbs: tuple[str, ...]
    cluster_wide: bool = True
    when: str = ""
    """The setting that makes the controller use this rule, when not always."""


KUBERNETES_RULES: tuple[KubernetesRule, ...] = (
    KubernetesRule("", "nodes", ("get", "list", "patch", "watch")),
    KubernetesRule("", "pods", ("list", "watch")),
    KubernetesRule("", "pods/eviction", ("create",)),
    KubernetesRule("", "pods", ("delete",), when="DELETE_AT_DEADLINE"),
    KubernetesRule("apps", "deployments", ("get", "patch"), when="SURGE_DRAINS"),
    KubernetesRule("autoscaling", "horizontalpodautoscalers", ("list",), when="SURGE_DRAINS"),
    KubernetesRule("policy", "poddisruptionbudgets", ("get",)),
    KubernetesRule("", "events", ("create",), when="EMIT_KUBERNETES_EVENTS"),
    KubernetesRule(
        "coordination.k8s.io",
        "leases",
        ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"),
        cluster_wide=False,
        when="NODE_LEASES",
    ),
)

#: Requests only ``queue-processor explain`` makes, with its user's kubeconfig: not granted to the controller.
EXPLAIN_ONLY_REQUESTS: frozenset[str] = frozenset({"list poddisruptionbudgets"})

AWS_API_CALLS: dict[str, tuple[str, ...]] = {
    "sqs": (
        "ReceiveMessage",
        "DeleteMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
    ),
    "ec2": ("DescribeInstances", "DescribeTags"),
    "autoscaling": (
        "CompleteLifecycleAction",
        "RecordLifecycleActionHeartbeat",
        "DescribeLifecycleHooks",
        "DescribeAutoScalingGroups",
        "DescribeAutoScalingInstances",
    ),
}
"""Every AWS API operation the controller calls, by service (botocore service name)."""

AWS_ACTIONS: tuple[str, ...] = tuple(
    sorted({f"{service}:{op.removesuffix('Batch')}" for service, ops in AWS_API_CALLS.items() for op in ops})
)
"""The IAM actions those calls need (``service:Action``); SQS batch calls are authorised by the single-message
action ("Amazon SQS API permissions: Actions and resource reference", SQS Developer Guide)."""


def kubernetes_verbs() -> set[str]:
    """Every granted ``"<verb> <resource>"`` pair, the form the sandbox API server counts requests by."""
    return {f"{verb} {rule.resource}" for rule in KUBERNETES_RULES for verb in rule.verbs}


def rbac_rules(*, cluster_wide: bool, enabled: frozenset[str] = frozenset()) -> list[dict[str, list[str]]]:
    """The ClusterRole's (``cluster_wide``) or Role's ``rules`` as the chart renders them for settings ``enabled``."""
    return [
        {"apiGroups": [rule.api_group], "resources": [rule.resource], "verbs": list(rule.verbs)}
        for rule in KUBERNETES_RULES
        if rule.cluster_wide == cluster_wide and (not rule.when or rule.when in enabled)
    ]
