"""Pure pieces of the Kubernetes emulation: selectors, patches and PodDisruptionBudget arithmetic."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queue_processor.drain.surge import selector_matches
from queue_processor_sandbox.kube_logic import (
    ApiError,
    json_patch,
    merge_patch,
    parse_field_selector,
    parse_label_selector,
    pdb_expected,
    pdb_status,
    strategic_merge_patch,
)


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "web"}, True),
        ("app!=web", {"app": "web"}, False),
        ("app!=web", {}, True),
        ("app", {"app": ""}, True),
        ("!app", {"app": "x"}, False),
        ("app in (web, api),tier notin (db)", {"app": "api", "tier": "front"}, True),
        ("app in (web, api),tier notin (db)", {"app": "api", "tier": "db"}, False),
        ("", {"anything": "x"}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector)(labels) is expected


def test_a_malformed_label_selector_is_400() -> None:
    with pytest.raises(ApiError) as error:
        parse_label_selector("app in web")
    assert error.value.code == 400


def test_field_selectors_and_their_index_terms() -> None:
    keep, equals = parse_field_selector("pods", "spec.nodeName=n1,status.phase!=Succeeded")
    assert equals == {"spec.nodeName": "n1"}
    pod: dict[str, Any] = {
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }
    assert keep(pod)
    assert not keep({**pod, "status": {"phase": "Succeeded"}})
    with pytest.raises(ApiError):
        parse_field_selector("nodes", "spec.nodeName=n1")


def test_label_selector_objects() -> None:
    selector = {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}
    assert selector_matches(selector, {"app": "web", "tier": "x"})
    assert not selector_matches(selector, {"app": "web"})
    assert selector_matches({}, {"a": "b"})
    assert not selector_matches(None, {"a": "b"})


def test_strategic_merge_merges_keyed_lists_and_replaces_others() -> None:
    # Node.spec.taints has no patchMergeKey: a real API server replaces the list (kubectl patch --local).
    node = {
        "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}], "podCIDRs": ["10.0.0.0/24"]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    patched = strategic_merge_patch(
        node,
        {
            "spec": {"taints": [{"key": "b", "effect": "NoExecute"}], "podCIDRs": ["10.0.1.0/24"]},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}]},
        },
    )
    assert [t["key"] for t in patched["spec"]["taints"]] == ["b"]
    assert patched["spec"]["podCIDRs"] == ["10.0.1.0/24"]
    # NodeStatus.conditions merge on their "type" key; $patch: delete removes one.
    assert [c["type"] for c in patched["status"]["conditions"]] == ["Ready", "MemoryPressure"]
    removed = strategic_merge_patch(
        patched, {"status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}}
    )
    assert [c["type"] for c in removed["status"]["conditions"]] == ["MemoryPressure"]
    assert node["spec"]["taints"] == [{"key": "a", "effect": "NoSchedule"}]  # the input is not changed


def test_merge_patch_null_deletes() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}}


json_objects = st.dictionaries(
    st.text(min_size=1, max_size=5), st.integers() | st.text(max_size=5), max_size=5
)


@given(json_objects, json_objects)
def test_merge_patch_of_flat_objects_is_dict_update(target: dict[str, Any], patch: dict[str, Any]) -> None:
    assert merge_patch(target, patch) == {**target, **patch}


def test_json_patch_operations_and_failures() -> None:
    doc = {"metadata": {"labels": {"a": "1"}}, "spec": {"taints": []}}
    patched = json_patch(
        doc,
        [
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "x"}},
            {"op": "replace", "path": "/metadata/labels/a", "value": "2"},
            {"op": "test", "path": "/metadata/labels/a", "value": "2"},
            {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/b"},
            {"op": "remove", "path": "/metadata/labels/a"},
        ],
    )
    assert patched == {"metadata": {"labels": {"b": "2"}}, "spec": {"taints": [{"key": "x"}]}}
    with pytest.raises(ApiError) as failed:
        json_patch(doc, [{"op": "test", "path": "/metadata/labels/a", "value": "9"}])
    assert failed.value.code == 422
    assert doc["metadata"]["labels"] == {"a": "1"}  # unchanged on failure


def _pod(name: str, ready: bool = True, terminating: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"app": "web"}}
    if terminating:
        metadata["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": metadata, "status": status}


@pytest.mark.parametrize(
    ("spec", "pods", "expected", "allowed"),
    [
        ({"minAvailable": 2}, [_pod("a"), _pod("b"), _pod("c")], 3, 1),
        ({"minAvailable": 2}, [_pod("a"), _pod("b"), _pod("c", terminating=True)], 3, 0),
        ({"minAvailable": "50%"}, [_pod("a"), _pod("b"), _pod("c")], 3, 1),  # ceil(1.5) = 2
        ({"maxUnavailable": 1}, [_pod("a"), _pod("b", ready=False), _pod("c")], 3, 0),
        ({"maxUnavailable": "34%"}, [_pod(str(i)) for i in range(10)], 10, 4),  # ceil(3.4) = 4
        ({"maxUnavailable": 0}, [_pod("a")], 1, 0),
        ({"maxUnavailable": 1}, [_pod("a")], 0, 0),  # expects no pod (unmanaged): nothing may go
        ({}, [_pod("a")], 0, 0),  # neither field: desiredHealthy 0, but expectedPods 0 blocks
    ],
)
def test_pdb_arithmetic(
    spec: dict[str, Any], pods: list[dict[str, Any]], expected: int, allowed: int
) -> None:
    pdb = {"metadata": {"name": "web"}, "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec}}
    assert pdb_status(pdb, pods, expected)["disruptionsAllowed"] == allowed


def _owned(name: str, rs: str | None, terminating: bool = False) -> dict[str, Any]:
    pod = _pod(name, terminating=terminating)
    if rs is not None:
        pod["metadata"]["ownerReferences"] = [
            {"kind": "ReplicaSet", "name": rs, "uid": f"uid-{rs}", "controller": True}
        ]
    pod["metadata"]["namespace"] = "apps"
    return pod


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"minAvailable": 2}, 4),  # an integer minAvailable counts the selected pods, terminating ones too
        ({"maxUnavailable": 1}, 5 + 3),  # the controllers' scales; the unmanaged pod counts 0
        ({"minAvailable": "50%"}, 5 + 3),
        ({}, 0),
    ],
)
def test_pdb_expected_pods_as_the_disruption_controller_counts_them(
    spec: dict[str, Any], expected: int
) -> None:
    pods = [_owned("a", "web"), _owned("b", "web", terminating=True), _owned("c", "api"), _owned("d", None)]
    scales = {"web": 5, "api": 3}
    pdb = {"metadata": {"name": "x"}, "spec": {"selector": {}, **spec}}
    assert pdb_expected(pdb, pods, lambda reference: scales[reference["name"]]) == expected
