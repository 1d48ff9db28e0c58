"""Pure pieces of the Kubernetes API emulation: selectors, patches, PodDisruptionBudget arithmetic.

No I/O; :mod:`queue_processor_sandbox.kube` serves them over HTTP. Semantics follow the Kubernetes API
reference: "Labels and Selectors" and "Field Selectors" (concepts/overview/working-with-objects), JSON merge
patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch ("Update API Objects in Place Using kubectl
patch"), and the disruption controller / eviction subresource ("Specifying a Disruption Budget for your
Application", "API-initiated Eviction").
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

Obj = dict[str, Any]


# ------------------------------------------------------------------------------ the API server's own reading
# The emulation's implementation of what the API server and the disruption controller decide, written from
# their documentation and code (apimachinery's label selectors, podutil.IsPodReady, the disruption
# controller's countHealthyPods), never borrowed from the drainer it judges: a bug in the drainer's reading of
# a budget must show as a disagreement with the real control plane, which runs the same tests.


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """``metav1.LabelSelectorAsSelector(selector).Matches(labels)``: every requirement holds, ``matchLabels``
    entries being ``key In (value)``; ``In`` needs the key with one of the values, ``NotIn`` the key absent or
    with none of them, ``Exists`` / ``DoesNotExist`` the key present / absent. A null selector selects nothing
    (a policy/v1 PodDisruptionBudget without one), an empty one everything."""
    if selector is None:
        return False
    requirements = [(key, "In", [value]) for key, value in (selector.get("matchLabels") or {}).items()]
    requirements += [
        (expression["key"], expression["operator"], list(expression.get("values") or []))
        for expression in selector.get("matchExpressions") or []
    ]
    for key, operator, values in requirements:
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def is_terminating(pod: Mapping[str, Any]) -> bool:
    """``pod.DeletionTimestamp != nil``: a deletion was requested (graceful or not)."""
    return (pod.get("metadata") or {}).get("deletionTimestamp") is not None


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Healthy as the disruption controller counts it (``countHealthyPods``): not being deleted, and
    ``podutil.IsPodReady``: its ``Ready`` condition is ``True``."""
    if is_terminating(pod):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True" for condition in conditions
    )


class ApiError(Exception):
    """An API error to answer with a ``Status`` object: ``code`` (HTTP status), ``reason`` (``NotFound``,
    ``Conflict``, ``AlreadyExists``, ``BadRequest``, ``TooManyRequests``, ``InternalError``, ``Invalid``)."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> Obj:
        """The ``v1.Status`` body the API server sends with this error."""
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        body["message"] = self.message
        if self.reason:  # empty fields are omitted, as in the API server's JSON
            body["reason"] = self.reason
        if self.details:
            body["details"] = self.details
        body["code"] = self.code
        return body


# ---------------------------------------------------------------------------------------------- selectors

_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    """Split on commas that are not inside parentheses (``a in (x,y),b=c``)."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return [part.strip() for part in parts if part.strip()]


LabelTest = Callable[[Mapping[str, str]], bool]


def _label_in(key: str, values: set[str], negate: bool) -> LabelTest:
    return lambda labels: (labels.get(key) in values) != negate


def _label_equals(key: str, value: str, negate: bool) -> LabelTest:
    return lambda labels: (labels.get(key) == value) != negate


def _label_exists(key: str, negate: bool) -> LabelTest:
    return lambda labels: (key in labels) != negate


def parse_label_selector(text: str) -> LabelTest:
    """A predicate over labels for a label selector string (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``,
    ``a in (x,y)``, ``a notin (x)``, comma = AND). Raises :class:`ApiError` 400 for a malformed one."""
    tests: list[LabelTest] = []
    for part in _split_selector(text):
        match = _SET_RE.match(part)
        if match:
            values = {value.strip() for value in match.group(3).split(",")}
            tests.append(_label_in(match.group(1), values, negate=match.group(2) == "notin"))
        elif "!=" in part:
            key, value = (s.strip() for s in part.split("!=", 1))
            tests.append(_label_equals(key, value, negate=True))
        elif "=" in part:
            key, value = (s.strip() for s in part.replace("==", "=").split("=", 1))
            tests.append(_label_equals(key, value, negate=False))
        elif part.startswith("!"):
            tests.append(_label_exists(part[1:].strip(), negate=True))
        elif re.fullmatch(r"[A-Za-z0-9_./-]+", part):
            tests.append(_label_exists(part, negate=False))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return lambda labels: all(test(labels) for test in tests)


def _metadata(field: str) -> Callable[[Obj], str]:
    return lambda obj: str(obj["metadata"].get(field) or "")


def _spec_node(obj: Obj) -> str:
    return str((obj.get("spec") or {}).get("nodeName") or "")


def _status_phase(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def _path(section: str, field: str) -> Callable[[Obj], str]:
    def get(obj: Obj) -> str:
        value = (obj.get(section) or {}).get(field)
        if isinstance(value, bool):
            return "true" if value else "false"
        return "" if value is None else str(value)

    return get


_COMMON_FIELDS: dict[str, Callable[[Obj], str]] = {
    "metadata.name": _metadata("name"),
    "metadata.namespace": _metadata("namespace"),
}
#: Field selectors per resource, the ones the API server supports for these (pods: the pod registry's
#: PodToSelectableFields; nodes: NodeToSelectableFields); others answer 400 "field label not supported".
FIELD_PATHS: dict[str, dict[str, Callable[[Obj], str]]] = {
    "pods": {
        **_COMMON_FIELDS,
        "spec.nodeName": _spec_node,
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "status.phase": _status_phase,
        "status.podIP": _path("status", "podIP"),
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    "nodes": {**_COMMON_FIELDS, "spec.unschedulable": _path("spec", "unschedulable")},
    "*": _COMMON_FIELDS,
}

FieldTest = Callable[[Obj], bool]


def _field_test(getter: Callable[[Obj], str], value: str, negate: bool) -> FieldTest:
    return lambda obj: (getter(obj) == value) != negate


def parse_field_selector(resource: str, text: str) -> tuple[FieldTest, dict[str, str]]:
    """A predicate for a field selector (``f=v``, ``f==v``, ``f!=v``, comma = AND) on ``resource``, and the
    equality terms (for index lookups). Raises :class:`ApiError` 400 for a field the resource does not
    support, as the API server does ("field label not supported")."""
    paths = FIELD_PATHS.get(resource, FIELD_PATHS["*"])
    tests: list[FieldTest] = []
    equals: dict[str, str] = {}
    for part in _split_selector(text):
        negate = "!=" in part
        field, value = (s.strip() for s in part.replace("==", "=").replace("!=", "=").split("=", 1))
        getter = paths.get(field)
        if getter is None:
            raise ApiError(400, "BadRequest", f"field label not supported: {field}")
        if not negate:
            equals[field] = value
        tests.append(_field_test(getter, value, negate))
    return (lambda obj: all(test(obj) for test in tests)), equals


# ------------------------------------------------------------------------------------------------ patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


#: List fields that strategic merge patch merges by a key (patchStrategy "merge" with a patchMergeKey in the
#: Kubernetes API types); other lists are replaced whole. ``Node.spec.taints`` and ``Pod.spec.tolerations`` have
#: no merge key: a patch that carries them replaces the list (kubectl patch --local shows it).
MERGE_KEYS = {
    "conditions": "type",
    "ownerReferences": "uid",
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "addresses": "type",
    "finalizers": None,  # a set of strings: merged as a set
}


def strategic_merge_patch(target: Any, patch: Any, field: str | None = None) -> Any:
    """Strategic merge patch, the subset the API server applies for the objects emulated here: maps merge
    (``null`` deletes, ``$patch: replace`` replaces, ``$patch: delete`` removes), lists in
    :data:`MERGE_KEYS` merge item by item on their key (an item with ``$patch: delete`` is removed), other
    lists are replaced; ``$setElementOrder/...`` and ``$retainKeys`` directives are ignored."""
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        result = dict(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
                continue
            if value is None:
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value, key)
        return result
    if isinstance(patch, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        existing = list(target) if isinstance(target, list) else []
        if key is None:
            return existing + [item for item in patch if item not in existing]
        for item in patch:
            if not isinstance(item, dict):
                continue
            index = next((i for i, old in enumerate(existing) if old.get(key) == item.get(key)), None)
            if item.get("$patch") == "delete":
                if index is not None:
                    existing.pop(index)
            elif index is None:
                existing.append(copy.deepcopy(item))
            else:
                existing[index] = strategic_merge_patch(existing[index], item)
        return existing
    return copy.deepcopy(patch)


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def json_patch(target: Obj, operations: list[Obj]) -> Obj:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test). Raises :class:`ApiError` 422 when an
    operation does not apply (a missing path, a failed test), leaving ``target`` unchanged."""
    doc: Any = copy.deepcopy(target)

    def parent(parts: list[str]) -> tuple[Any, str]:
        node = doc
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node, parts[-1]

    def get(parts: list[str]) -> Any:
        node = doc
        for part in parts:
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    def add(parts: list[str], value: Any) -> None:
        nonlocal doc
        if not parts:
            doc = value
            return
        node, last = parent(parts)
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), value)
        else:
            node[last] = value

    def remove(parts: list[str]) -> Any:
        node, last = parent(parts)
        return node.pop(int(last)) if isinstance(node, list) else node.pop(last)

    try:
        for op in operations:
            kind, parts = op["op"], _pointer(op["path"])
            if kind == "add":
                add(parts, copy.deepcopy(op["value"]))
            elif kind == "remove":
                remove(parts)
            elif kind == "replace":
                remove(parts)
                add(parts, copy.deepcopy(op["value"]))
            elif kind == "move":
                add(parts, remove(_pointer(op["from"])))
            elif kind == "copy":
                add(parts, copy.deepcopy(get(_pointer(op["from"]))))
            elif kind == "test":
                if get(parts) != op["value"]:
                    raise ApiError(422, "Invalid", f"test operation failed at {op['path']}")
            else:
                raise ApiError(422, "Invalid", f"unknown JSON patch operation {kind!r}")
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise ApiError(422, "Invalid", f"JSON patch does not apply: {exc!r}") from None
    if not isinstance(doc, dict):
        raise ApiError(422, "Invalid", "a JSON patch must leave an object")
    return doc


# -------------------------------------------------------------------------- PodDisruptionBudget arithmetic


def _scaled(value: int | str, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        fraction = int(value[:-1]) * total / 100
        return math.ceil(fraction) if round_up else math.floor(fraction)
    return int(value)


def pdb_expected(pdb: Obj, pods: list[Obj], scale: Callable[[Obj], int]) -> int:
    """``expectedPods`` as the disruption controller computes it for the pods ``pdb`` selects (terminating ones
    included): with an integer ``minAvailable``, the number of those pods; with ``maxUnavailable`` or a
    percentage, the sum of the scales of their controllers (``scale(controller reference)``; a pod without a
    controller counts 0 — the controller warns "UnmanagedPods"); with neither, 0."""
    spec = pdb.get("spec") or {}
    min_available = spec.get("minAvailable")
    if spec.get("maxUnavailable") is None:
        if min_available is None:
            return 0
        if not isinstance(min_available, str):
            return len(pods)
    scales: dict[str, int] = {}
    for pod in pods:
        reference = owner(pod)
        if reference is not None and reference["uid"] not in scales:
            scales[reference["uid"]] = scale(reference | {"namespace": pod["metadata"].get("namespace", "")})
    return sum(scales.values())


def pdb_status(pdb: Obj, pods: list[Obj], expected: int) -> Obj:
    """The status the disruption controller would give ``pdb``: ``currentHealthy`` (selected pods that are
    ready and not terminating), ``desiredHealthy``, ``expectedPods`` (``expected``, see :func:`pdb_expected`),
    ``disruptionsAllowed`` (0 whenever ``expected`` is 0: a budget that expects no pods protects them all).

    ``minAvailable`` and ``maxUnavailable`` may be integers or percentages of ``expected``, both rounded up
    (as the controller does).
    """
    spec = pdb.get("spec") or {}
    selected = [
        pod for pod in pods if selector_matches(spec.get("selector"), pod["metadata"].get("labels") or {})
    ]
    return pdb_status_of(pdb, sum(1 for pod in selected if is_ready(pod)), expected)


def pdb_status_of(pdb: Obj, healthy: int, expected: int) -> Obj:
    """:func:`pdb_status` from the counts: ``healthy`` selected pods that are ready, ``expected`` pods."""
    spec = pdb.get("spec") or {}
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, round_up=True))
    elif spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected, round_up=True)
    else:
        desired = 0
    allowed = healthy - desired if expected > 0 else 0
    return {
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "disruptionsAllowed": max(0, allowed),
        "observedGeneration": pdb["metadata"].get("generation", 1),
    }


def owner(obj: Obj) -> Obj | None:
    """The controller ownerReference of ``obj`` (``controller: true``), if any."""
    for reference in obj["metadata"].get("ownerReferences") or []:
        if reference.get("controller"):
            return dict(reference)
    return None
