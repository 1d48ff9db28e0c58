"""What the controller is allowed to do: the Kubernetes RBAC rules and the AWS IAM actions its code calls.

This module is the single list that the Helm chart's ClusterRole/Role (``charts/queue-processor``) and the
Terraform module's IAM policy (``terraform/``) are tested against, and that tests check against the code
itself (every API call the code makes is listed here, and nothing else). Least privilege means: when a
call is added to the code, it is added here, and the chart and module tests then fail until they grant it.

Kubernetes (RBAC, https://kubernetes.io/docs/reference/access-authn-authz/rbac/):

- cluster-wide: ``nodes`` get/list/patch (find, cordon, taint, label) and watch (the watched copy a cordon
  writes on without reading the node first), ``pods`` list (a node's pods with
  ``fieldSelector=spec.nodeName``) and watch (one metadata-only watch of pod deletions, so that a drain waits
  for its evicted pods without re-listing them), ``pods/eviction`` create (policy/v1 Eviction API), ``pods`` delete
  (``DELETE_AT_DEADLINE``: what is left at the instance's end), ``policy`` ``poddisruptionbudgets`` get (the
  arithmetic of a budget that blocks a drain, for its Event and log line), ``events`` create
  (``EMIT_KUBERNETES_EVENTS``; Events are written into the Node's namespace ``default``);
- cluster-wide with ``SURGE_DRAINS``: ``apps`` ``deployments`` get/patch (one replica more while a pod's
  replacement comes up, taken back after; the surge record annotation), ``autoscaling``
  ``horizontalpodautoscalers`` list (a Deployment whose count an autoscaler owns is not scaled); the pods
  ``list`` rule also serves the list of a Deployment's pods in its namespace (a stale surge record);
- in the controller's own namespace: ``coordination.k8s.io`` ``leases`` get/create/update/delete and
  deletecollection (``NODE_LEASES``; node Leases are released in batches, selected by their labels), list and
  watch (who holds each node Lease: a replica waits for one another holds), patch (events handed to the
  holder of a node's Lease, :mod:`queue_processor.handover`).

Differences from aws-node-termination-handler's ClusterRole, on purpose: no ``pods`` get (the drain re-lists
the node's pods instead of a GET per pod), no ``daemonsets`` get (DaemonSet pods are recognised by their
controller reference), no ``events`` patch (Events are never aggregated), no ``pods`` delete unless
``DELETE_AT_DEADLINE`` (evictions only), no ``nodes`` update.

AWS (IAM actions, https://docs.aws.amazon.com/service-authorization/latest/reference/):

- SQS: ReceiveMessage, DeleteMessage (the batch call is authorised by this action), ChangeMessageVisibility
  (likewise for its batch call);
- EC2: DescribeInstances (node resolution), DescribeTags (NTH's ``nth_tagged_instances`` gauge);
- Auto Scaling: CompleteLifecycleAction, RecordLifecycleActionHeartbeat, DescribeLifecycleHooks (the hook's
  HeartbeatTimeout, read once per hook), DescribeAutoScalingGroups (a group's size, for a percentage in
  DRAIN_BUDGET_NON_URGENT; read at most once a minute per group), DescribeAutoScalingInstances (whether an
  action whose heartbeat is due at once, its message received again, still waits; NTH's documented policy
  grants it too).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AWS_ACTIONS",
    "AWS_API_CALLS",
    "EXPLAIN_ONLY_REQUESTS",
    "KUBERNETES_RULES",
    "KubernetesRule",
    "kubernetes_verbs",
    "rbac_rules",
]


@dataclass(frozen=True)
class KubernetesRule:
    """One RBAC rule: API group (``""`` = core), resource (``pods/eviction`` for a subresource), verbs, and
    whether it is granted cluster-wide (ClusterRole) or only in the controller's namespace (Role)."""

    api_group: str
    resource: str
    verbs: tuple[str, ...]
    cluster_wide: bool = True
    when: str = ""
    """The setting that makes the controller use this rule, when not always (e.g. ``NODE_LEASES``)."""


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

#: Requests the Kubernetes client can make that only ``queue-processor explain`` makes, with the credentials of
#: whoever runs it (a kubeconfig), never the controller: not granted to the controller's ServiceAccount.
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

_BATCH_ACTIONS = {
    "DeleteMessageBatch": "DeleteMessage",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
}

AWS_ACTIONS: tuple[str, ...] = tuple(
    sorted(
        {
            f"{service}:{_BATCH_ACTIONS.get(operation, operation)}"
            for service, operations in AWS_API_CALLS.items()
            for operation in operations
        }
    )
)
"""The IAM actions those calls need (``service:Action``); SQS batch calls are authorised by the single-message
action (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-api-permissions-reference.html)."""


def kubernetes_verbs() -> set[str]:
    """Every granted ``"<verb> <resource>"`` pair, the form the sandbox API server counts requests by."""
    return {f"{verb} {rule.resource}" for rule in KUBERNETES_RULES for verb in rule.verbs}


def rbac_rules(*, cluster_wide: bool, enabled: frozenset[str] = frozenset()) -> list[dict[str, list[str]]]:
    """The ``rules`` of the ClusterRole (``cluster_wide``) or of the Role in the controller's namespace, as the
    chart renders them: one item per rule in force, ``{"apiGroups": [...], "resources": [...], "verbs": [...]}``.
    ``enabled`` names the settings that are on (``{"NODE_LEASES", "EMIT_KUBERNETES_EVENTS"}``); a rule that
    depends on a setting not named is left out."""
    return [
        {"apiGroups": [rule.api_group], "resources": [rule.resource], "verbs": list(rule.verbs)}
        for rule in KUBERNETES_RULES
        if rule.cluster_wide == cluster_wide and (not rule.when or rule.when in enabled)
    ]
