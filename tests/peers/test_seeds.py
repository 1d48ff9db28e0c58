"""NTH's production failures (the seeds), each run on aws-node-termination-handler v1.25.6 and on
queue-processor with the same input, one after the other on fresh sandboxes of the real control plane.
queue-processor's side of the contract is asserted; NTH's is recorded (a test property, and printed), not
asserted, since a release of NTH could fix it. What this machine measured for NTH is in each docstring.
"""

from __future__ import annotations

import dataclasses
import re

from sidebyside import apiserver_cache, asg_scale_in, drain_fails, warm_pool
from tests.peers.conftest import Run


def test_a_drain_held_by_a_pdb_past_the_heartbeat_timeout_completes_every_action_once(
    side_by_side: Run,
) -> None:
    """Two instances leave through terminate hooks (HeartbeatTimeout 30 s), a PodDisruptionBudget holds their
    drains for 40 s, and each instance also gets a rebalance recommendation and a state change. Seeds: no
    heartbeat (the action times out, the instance goes with its pods), repeated drains of the same node, a
    heartbeat sent after the action ended. Measured for NTH here: with its defaults every action timed out
    and every node was drained twice; with HEARTBEAT_INTERVAL=30 the actions completed, but a heartbeat
    followed each completion and every node was still drained twice."""
    # NTH's side always runs to the bound: hold + HeartbeatTimeout + 30 s (as drain-fails) is enough for its
    # timed-out actions, its second drains and a heartbeat one interval after a completion to show
    workload = dataclasses.replace(asg_scale_in(2, heartbeat_timeout_s=30, hold_s=40), bound_s=40 + 30 + 30)
    side_by_side("nth", workload)
    ours = side_by_side("queue_processor", workload)
    assert ours["drained"] == 2
    assert ours["lifecycle_completed"] == 2
    assert ours["lifecycle_timed_out"] == 0
    assert ours["nodes_drained_twice"] == 0
    assert ours["heartbeats_after_end"] == 0
    assert (ours["messages_left"], ours["dlq"], ours["exit_status"]) == (0, 0, 0)


def test_a_drain_that_fails_leaves_no_heartbeat_running_and_drains_once_when_it_can(
    side_by_side: Run,
) -> None:
    """One instance leaves through a terminate hook (HeartbeatTimeout 40 s) while a PodDisruptionBudget holds
    its drain for 20 s, longer than the 10 s drain timeout both systems get: the first drain fails, the
    message comes back, and a later drain succeeds. NTH runs with heartbeats on (``nth_tuned``:
    HEARTBEAT_INTERVAL=30, without which it has no heartbeat to leak). Seeds: a heartbeat goroutine left
    running after a failed drain, and repeated drains of the same node."""
    workload = drain_fails(1, hold_s=20, drain_timeout_s=10, heartbeat_timeout_s=40)
    side_by_side("nth_tuned", workload)
    ours = side_by_side("queue_processor", workload)
    assert ours["drained"] == 1
    assert ours["lifecycle_completed"] == 1
    assert ours["lifecycle_timed_out"] == 0
    assert (ours["heartbeats_after_end"], ours["nodes_drained_twice"]) == (0, 0)
    assert (ours["messages_left"], ours["dlq"], ours["exit_status"]) == (0, 0, 0)


def test_pods_listed_from_the_apiserver_cache_leave_daemonset_and_mirror_pods(side_by_side: Run) -> None:
    """Three Spot warnings with USE_APISERVER_CACHE=true, nodes running a DaemonSet pod and a mirror pod each.
    Seed: DaemonSet pods evicted on that path. Measured for NTH v1.25.6 here: it leaves DaemonSet pods (that
    seed is fixed) but evicts each node's mirror pod, which kubectl drain never does. Both systems also post
    their webhooks and record Events here: the bodies are the same bytes once run-specific IDs and times are
    masked, and so are the actions counted; NTH's CordonAndDrain and PostDrain Events were still queued
    behind its client-side rate limit (QPS 5) when its runs ended."""
    workload = apiserver_cache(3)
    env = {
        **workload.env,
        "queue_processor": {**workload.env["queue_processor"], "EMIT_KUBERNETES_EVENTS": "true"},
    }
    workload = dataclasses.replace(workload, webhook_template=WEBHOOK_FIELDS, env=env)
    nth = side_by_side("nth", workload)
    ours = side_by_side("queue_processor", workload)
    assert ours["drained"] == 3
    assert ours["drains_inside_notice_fraction"] == 1.0
    assert (ours["daemonset_pods_evicted"], ours["mirror_pods_evicted"]) == (0, 0)
    assert (ours["messages_left"], ours["dlq"], ours["exit_status"]) == (0, 0, 0)
    # The migration's promise on the same input: NTH's webhook bodies and NTH's actions_total samples
    assert len(ours["webhook_bodies"]) == 3
    assert normalized(ours["webhook_bodies"]) == normalized(nth["webhook_bodies"])
    counted = {key: value for key, value in ours["actions"].items() if value}
    assert counted == {"pre-drain/success": 3, "cordon-and-drain/success": 3, "post-drain/success": 3}
    # NTH counts the same actions (it counts a post-drain after deleting the message: the harness reads its
    # metrics once every node's post-drain is counted, or at its bound)
    theirs = {key: value for key, value in nth["actions"].items() if value}
    assert theirs.keys() == counted.keys()
    assert all(value <= counted[key] for key, value in theirs.items())
    # NTH's Event reasons on the nodes, once per step; PodEviction once per pod evicted (NTH: one per pod on
    # the node, before the drain, DaemonSet and mirror pods included, as docs/migration.md says)
    nodes = {key: value for key, value in ours["event_reasons"].items() if key.startswith("Node/")}
    assert nodes == {
        "Node/SpotInterruption": 3,
        "Node/PreDrain": 3,
        "Node/CordonAndDrain": 3,
        "Node/PostDrain": 3,
    }
    assert ours["event_reasons"]["Pod/PodEviction"] == ours["evicted"]
    # NTH's Node Events are a part of ours: its client-go recorder writes them asynchronously, and in the
    # runs measured here its CordonAndDrain and PostDrain Events had not been written when the run ended
    theirs_on_nodes = {key: value for key, value in nth["event_reasons"].items() if key.startswith("Node/")}
    assert all(value <= nodes.get(key, 0) for key, value in theirs_on_nodes.items())


def test_a_dry_run_changes_nothing_and_sends_what_nth_sends(side_by_side: Run) -> None:
    """DRY_RUN=true on both, two Spot warnings (the migration guide's dry-run row). NTH v1.25.6 changes no
    node and evicts nothing, deletes the messages, sends its webhook with empty labels and pods, counts its
    actions as successes, and still records its Events (the guide says so); queue-processor does the same
    but records no Event."""
    base = apiserver_cache(2)
    dry = {"DRY_RUN": "true", "EMIT_KUBERNETES_EVENTS": "true"}
    workload = dataclasses.replace(
        base,
        name="dry-run",
        bound_s=20,  # shorter than the notices (30 s here): no instance terminates during the run
        env={"nth": dry, "queue_processor": dry},
        webhook_template=WEBHOOK_FIELDS,
    )
    nth = side_by_side("nth", workload)
    ours = side_by_side("queue_processor", workload)
    assert (ours["evicted"], ours["p50_cordon_s"]) == (0, None)  # nothing evicted or cordoned
    assert (ours["messages_left"], ours["dlq"], ours["exit_status"]) == (0, 0, 0)
    assert len(ours["webhook_bodies"]) == 2
    assert all(body.endswith("\nnull") for body in ours["webhook_bodies"])  # NodeLabels nil, as NTH's
    assert normalized(ours["webhook_bodies"]) == normalized(nth["webhook_bodies"])
    counted = {key: value for key, value in ours["actions"].items() if value}
    assert counted == {"pre-drain/success": 2, "cordon-and-drain/success": 2, "post-drain/success": 2}
    theirs = {key: value for key, value in nth["actions"].items() if value}
    assert theirs.keys() == counted.keys()
    assert ours["event_reasons"] == {}


#: Every field of NTH's webhook data that does not list pods, one per line.
WEBHOOK_FIELDS = (
    "\n".join(
        f"{{{{ .{name} }}}}"
        for name in [
            "Kind",
            "EventID",
            "InstanceID",
            "InstanceType",
            "NodeName",
            "ProviderID",
            "AutoScalingGroupName",
            "Monitor",
            "IsManaged",
            "InProgress",
            "NodeProcessed",
            "State",
            "EndTime",
            "StartTime",
            "Description",
            "AccountId",
            "AvailabilityZone",
            "Region",
        ]
    )
    + "\n{{ .NodeLabels | toJson }}"
)


def normalized(bodies: list[str]) -> list[str]:
    """Bodies with what differs between two runs of one workload (instance IDs, node names, message IDs in
    EventIDs, times) replaced by placeholders."""
    out = []
    for body in bodies:
        body = re.sub(r"\bi-[0-9a-f]{8,17}\b", "<instance>", body)
        body = re.sub(r"ip-[0-9-]+\.[a-z0-9.-]*internal", "<node>", body)
        body = re.sub(r"(-event-)[0-9a-f]+", r"\1<hex of id>", body)
        body = re.sub(r'("sandbox.queue-processor.dev/run":)"[0-9a-f]+"', r'\1"<run>"', body)
        body = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \+0000 UTC", "<time>", body)
        out.append(body)
    return sorted(out)


def test_warm_pool_launches_complete_without_stuck_messages_or_cordons(side_by_side: Run) -> None:
    """Two launches into a warm pool (their bootstrap completes those actions) and two warmed instances into
    the group. Seed: "No active Lifecycle Action found" and launch actions left to time out. Measured for NTH
    here: its completions of the warm-pool launches fail with "No active Lifecycle Action found" and those
    messages stay in the queue, and the state changes of the stop into the pool, handled once the instances
    were back in the group, cordoned both new nodes (queue-processor did too until this test found it)."""
    workload = warm_pool(2, heartbeat_timeout_s=40)
    side_by_side("nth", workload)
    ours = side_by_side("queue_processor", workload)
    assert ours["lifecycle_completed"] == 4
    assert ours["lifecycle_timed_out"] == 0
    assert ours["kept_nodes_cordoned"] == 0
    assert (ours["messages_left"], ours["dlq"], ours["exit_status"]) == (0, 0, 0)
