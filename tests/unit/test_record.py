"""What the controller records on a Node when it writes to it, and the patch that undoes exactly that
(DESIGN.md rule 12): pure functions, unit tests and a hypothesis property (write, then undo, gives the node
back as it was, whatever others had set)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from queue_processor.drain.node_writes import CordonRecord, cordon_patch, undo_patch
from queue_processor.watch import RECORD_ANNOTATION, RECORD_LABEL

LB = ("node.kubernetes.io/exclude-from-external-load-balancers", "aws-node-termination-handler")
ABOUT = CordonRecord(instance_id="i-1", launch_time="2026-11-25T10:00:00+00:00", since="2026-11-25T11:00:00")


def node(
    *, unschedulable: bool = False, taints: list[dict[str, str]] | None = None, **labels: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": taints or []}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": "n", "resourceVersion": "7", "labels": dict(labels), "annotations": {}},
        "spec": spec,
    }


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A strategic-merge patch as the API server applies it to a Node (maps merged, ``None`` deletes a key,
    ``spec.taints`` replaced: it has no patch merge key)."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def write(current: dict[str, Any], taints: list[tuple[str, str]], labels: dict[str, str]) -> dict[str, Any]:
    """Our cordon as the drainer writes it: unschedulable, our taints, labels the node lacks, and the record."""
    ours = [(k, "ev-1", e) for k, e in taints]
    return merge(current, cordon_patch(current, unschedulable=True, taints=ours, labels=labels, about=ABOUT))


def undo(current: dict[str, Any]) -> dict[str, Any]:
    record = CordonRecord.from_node(current)
    assert record is not None
    patch = undo_patch(current, record)
    assert patch["metadata"].pop("resourceVersion") == current["metadata"]["resourceVersion"]
    return merge(current, patch)


def essentials(
    found: dict[str, Any],
) -> tuple[bool, list[tuple[str, str, str]], dict[str, str], dict[str, str]]:
    spec = found["spec"]
    taints = sorted((t["key"], t.get("value", ""), t["effect"]) for t in spec.get("taints") or [])
    return (
        bool(spec.get("unschedulable")),
        taints,
        found["metadata"]["labels"],
        found["metadata"]["annotations"],
    )


def test_our_cordon_taints_and_label_are_undone_and_nothing_else() -> None:
    foreign = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    before = node(taints=[foreign], team="a")
    after = write(before, [("aws-node-termination-handler/spot-itn", "NoSchedule")], dict([LB]))
    assert after["spec"]["unschedulable"] is True
    assert RECORD_LABEL in after["metadata"]["labels"]
    assert essentials(undo(after)) == essentials(before)


def test_a_cordon_somebody_else_made_before_ours_is_kept() -> None:
    before = node(unschedulable=True)  # kubectl cordon, for maintenance
    after = write(before, [("ours", "NoSchedule")], {})
    record = CordonRecord.from_node(after)
    assert record is not None
    assert not record.unschedulable
    undone = undo(after)
    assert undone["spec"]["unschedulable"] is True
    assert undone["spec"]["taints"] == []


def test_a_label_whose_value_somebody_changed_since_is_kept() -> None:
    after = write(node(), [], dict([LB]))
    after["metadata"]["labels"][LB[0]] = "maintenance"  # somebody took the label over
    assert undo(after)["metadata"]["labels"] == {LB[0]: "maintenance"}


def test_nothing_is_recorded_when_our_write_changes_nothing() -> None:
    cordoned = node(unschedulable=True, taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])
    patch = cordon_patch(cordoned, unschedulable=True, taints=[], labels={}, about=ABOUT)
    assert "annotations" not in patch["metadata"]
    assert CordonRecord.from_node(merge(cordoned, patch)) is None


def test_a_second_write_adds_to_the_record_and_keeps_its_first_facts() -> None:
    first = write(node(), [("a", "NoSchedule")], {})
    later = CordonRecord(instance_id="i-1", launch_time="2026-11-25T12:00:00+00:00", since="later")
    patch = cordon_patch(first, unschedulable=True, taints=[("b", "v", "NoExecute")], labels={}, about=later)
    record = CordonRecord.from_node(merge(first, patch))
    assert record is not None
    assert record.unschedulable  # still ours: the first write set it
    assert record.taints == (("a", "NoSchedule"), ("b", "NoExecute"))
    assert record.launch_time == later.launch_time  # the instance as it is now
    assert record.since == ABOUT.since  # when we first cordoned it


def test_an_unreadable_record_is_no_record() -> None:
    edited = node()
    edited["metadata"]["annotations"][RECORD_ANNOTATION] = "{not json"
    assert CordonRecord.from_node(edited) is None
    assert CordonRecord.from_node(node()) is None


keys = st.sampled_from(["a", "b", "c", "aws-node-termination-handler/spot-itn"])
effects = st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])
pairs = st.lists(st.tuples(keys, effects), unique=True, max_size=4)
label_maps = st.dictionaries(
    st.sampled_from(["team", LB[0], "zone"]), st.sampled_from(["x", "y", LB[1]]), max_size=3
)


@given(st.booleans(), pairs, label_maps, pairs, label_maps)
def test_write_then_undo_gives_the_node_back(
    cordoned: bool,
    foreign: list[tuple[str, str]],
    labels: dict[str, str],
    ours: list[tuple[str, str]],
    our_labels: dict[str, str],
) -> None:
    """Whatever a person or another controller set (a cordon, taints, labels), our write followed by our undo
    leaves the node as it was, a taint of theirs that ours replaced (same key and effect) with its value."""
    before = node(
        unschedulable=cordoned,
        taints=[{"key": k, "value": "theirs", "effect": e} for k, e in foreign],
        **labels,
    )
    after = write(before, ours, our_labels)
    undone = undo(after) if CordonRecord.from_node(after) is not None else after
    assert essentials(undone) == essentials(before)
