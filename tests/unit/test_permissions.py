"""The permissions list (``queue_processor.permissions``) equals the API calls the code makes.

The chart's RBAC and the Terraform module's IAM policy are tested against that list; these tests tie the list
to the code, read statically (every AWS operation named on a client, every Kubernetes request the client
module issues), so a new call without a new permission fails here rather than in a cluster.
"""

from __future__ import annotations

import ast
from pathlib import Path

import botocore.session
from botocore import xform_name

from queue_processor import kube, permissions, watch
from queue_processor.rest import describe

PACKAGE = Path(permissions.__file__).parent


def _controller_sources() -> list[Path]:
    return [path for path in PACKAGE.rglob("*.py") if "sandbox" not in path.relative_to(PACKAGE).parts]


def _attribute_names(path: Path) -> set[str]:
    """Every attribute named in the module (``client.describe_instances``), and every operation a paginator
    is asked for (``client.get_paginator("describe_instances")``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            first = node.args[0]
            if node.func.attr == "get_paginator" and isinstance(first, ast.Constant):
                names.add(str(first.value))
    return names


def test_every_aws_operation_the_code_names_is_listed_and_nothing_else() -> None:
    session = botocore.session.get_session()
    used: dict[str, set[str]] = {}
    names = set().union(*(_attribute_names(path) for path in _controller_sources()))
    for service in permissions.AWS_API_CALLS:
        operations = session.get_service_model(service).operation_names
        used[service] = {op for op in operations if xform_name(op) in names}
    # Auto Scaling has a DescribeTags too: the name the code uses is EC2's (tagged_instances).
    assert "DescribeTags" in used["autoscaling"]
    used["autoscaling"].discard("DescribeTags")
    assert used == {service: set(ops) for service, ops in permissions.AWS_API_CALLS.items()}


def test_iam_actions_fold_sqs_batch_calls_into_their_single_message_action() -> None:
    assert permissions.AWS_ACTIONS == (
        "autoscaling:CompleteLifecycleAction",
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:DescribeAutoScalingInstances",
        "autoscaling:DescribeLifecycleHooks",
        "autoscaling:RecordLifecycleActionHeartbeat",
        "ec2:DescribeInstances",
        "ec2:DescribeTags",
        "sqs:ChangeMessageVisibility",
        "sqs:DeleteMessage",
        "sqs:ReceiveMessage",
    )


def _kube_requests() -> set[str]:
    """``"<verb> <resource>"`` for every ``self.request("METHOD", path)``, ``self._get(path)`` and
    ``self._items(path)`` in the Kubernetes client, and ``"watch <resource>"`` for every watch's
    ``super().__init__(kube, path, …)`` (:class:`~queue_processor.watch.Watched`).
    A request whose path is a plain variable is a helper's own (counted where the helper is called)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(Path(watch.__file__).read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__init__"
        ):
            found.add(f"watch {describe('GET', _path(node.args[1]))[1]}")
    tree = ast.parse(Path(kube.__file__).read_text())
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        attr, args = node.func.attr, node.args
        if attr in ("_get", "_items") and not isinstance(args[0], ast.Name):
            found.add(" ".join(describe("GET", _path(args[0]))))
        elif (
            attr == "request"
            and len(args) >= 2
            and isinstance(args[0], ast.Constant)
            and not isinstance(args[1], ast.Name)
        ):
            found.add(" ".join(describe(str(args[0].value), _path(args[1]))))
    return found


def _path(target: ast.expr) -> str:
    """A request's path as the code writes it: a constant, a module constant's ``.format(x)``, or an f-string
    whose fields read ``x`` (or are such a ``.format``)."""
    if (
        isinstance(target, ast.Call)
        and isinstance(target.func, ast.Attribute)
        and target.func.attr == "format"
    ):
        assert isinstance(target.func.value, ast.Name)
        return str(getattr(kube, target.func.value.id)).replace("{}", "x")
    if isinstance(target, ast.JoinedStr):
        return "".join(
            str(part.value)
            if isinstance(part, ast.Constant)
            else _path(part.value)
            if isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Call)
            else "x"
            for part in target.values
        )
    assert isinstance(target, ast.Constant)
    return str(target.value)


def test_every_kubernetes_request_the_client_makes_is_granted_and_nothing_else() -> None:
    assert _kube_requests() == permissions.kubernetes_verbs() | permissions.EXPLAIN_ONLY_REQUESTS
    assert not permissions.EXPLAIN_ONLY_REQUESTS & permissions.kubernetes_verbs()


def test_leases_are_the_only_namespaced_rule() -> None:
    namespaced = [rule.resource for rule in permissions.KUBERNETES_RULES if not rule.cluster_wide]
    assert namespaced == ["leases"]
