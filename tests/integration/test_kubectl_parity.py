"""Parity with ``kubectl drain``: the controller's drain evicts the same pods as the real
``kubectl drain --ignore-daemonsets --delete-emptydir-data --force`` (kubectl 1.34), on the real control plane.

Why: DESIGN.md rule 1 says a drain has kubectl-drain semantics whatever the source of the pod list, and
``queue_processor/drain/filters.py`` re-implements kubectl's filters from their documentation. Unit tests of the
filters only check them against our reading of kubectl; this test checks them against kubectl itself, with both
pod sources (``USE_APISERVER_CACHE`` off: a quorum list; on: a ``resourceVersion=0`` list of the watch cache).

What: two identical nodes on the real control plane (kube-apiserver, kube-controller-manager, kube-scheduler,
KWOK kubelets), each carrying one pod of every role kubectl's filters tell apart:

========================  =============================================================================
role                      pod
========================  =============================================================================
``replicaset``            a pod of a ReplicaSet (two replicas on the node)
``daemonset``             the pod of a DaemonSet
``emptydir``              a ReplicaSet pod with an emptyDir volume
``bare``                  a pod without a controller
``pdb-blocked``           a ReplicaSet pod whose PodDisruptionBudget allows no disruption (minAvailable 1)
``completed``             a pod without a controller in phase Succeeded
``terminating``           a pod deleted (grace period 60 s) before the drain, still terminating
``mirror``                a mirror (static) pod
========================  =============================================================================

Node A is drained by the real kubectl (``--timeout 5s``: the PodDisruptionBudget never allows its pod to go, so
kubectl gives up and exits non-zero, as it does on a real cluster), node B by the controller (a Spot interruption
for B's instance; ``NODE_TERMINATION_GRACE_PERIOD=5``, so the blocked drain times out and the message is
requeued once). Both drains run at the same time; replacements of evicted ReplicaSet pods may land on the other
node before it is cordoned, and are not among the pods compared. Then, per role (pod names differ between the
nodes), two things are compared, for the pods that were on the node when the drains started:

- the pod's fate: ``evicted`` (the API server accepted an eviction of it: the policy/v1 Eviction API, read from
  the API server's audit log), ``deleted`` (it went away, or began terminating, without an eviction), ``left``
  (neither). kubectl's fates are asserted to be :data:`KUBECTL_FATES` (what kubectl 1.34 was seen to do), and
  the controller's to be the same.
- whether the pod is still on the node (running or terminating) after the drains: the same for both.

The one place where they differ is :data:`KNOWN_DIFFERENCES`, asserted as such (not skipped): kubectl evicts an
already-terminating pod again (the API server accepts it with 201: it deletes a terminating pod without a budget
check, and the deletion deadline does not move, which the test checks); the controller sends no such eviction
and only waits for the pod (``filters.terminating_filter``). Either way the pod is left to finish terminating.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from queue_processor.app import Controller, run_controller
from queue_processor.cli import load_settings
from queue_processor_sandbox.aws import AwsSandbox
from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.control_plane import ControlPlane
from queue_processor_sandbox.real_kube import RealKube
from tests.integration.test_controller import until

SCALE = 0.01  # Kubernetes side: a grace of 100 simulated seconds is 1 real second
ROLE = "parity.queue-processor.dev/role"
SIDE = "parity.queue-processor.dev/side"
KUBECTL_TIMEOUT_S = 5
DRAIN_DEADLINE_S = 5  # NODE_TERMINATION_GRACE_PERIOD: the controller's drain gives up after this

#: What ``kubectl drain --ignore-daemonsets --delete-emptydir-data --force`` (1.34) does with each role.
KUBECTL_FATES = {
    "replicaset": "evicted",
    "daemonset": "left",  # --ignore-daemonsets
    "emptydir": "evicted",  # --delete-emptydir-data
    "bare": "evicted",  # --force: through the Eviction API too, not a DELETE
    "pdb-blocked": "left",  # 429 until --timeout
    "completed": "evicted",  # a finished pod passes every filter; the Eviction API deletes it at once
    "terminating": "evicted",  # evicted again (a no-op, see KNOWN_DIFFERENCES) and waited for
    "mirror": "left",  # the kubelet owns it
}

#: The roles of the pods on each node before the drains (two ReplicaSet pods, one of every other role).
ROLES_ON_A_NODE = sorted([*KUBECTL_FATES, "replicaset"])

#: Where the controller's fate differs from kubectl's, on purpose (role: controller's fate).
KNOWN_DIFFERENCES = {"terminating": "left"}

#: Which roles are still on the node (running, or terminating) once both drains have ended.
STILL_THERE = {"daemonset", "pdb-blocked", "terminating", "mirror"}


@dataclass(frozen=True)
class Pod:
    role: str
    uid: str
    namespace: str
    name: str
    deletion_timestamp: str | None


@pytest.fixture
def aws() -> Iterator[AwsSandbox]:
    with AwsSandbox(SandboxClock(1.0)) as sandbox:
        yield sandbox


def _pods(kube: RealKube, node: str) -> dict[str, Pod]:
    """This run's pods on ``node``, by UID."""
    pods = {}
    for obj in kube.pods_on(node):
        metadata = obj["metadata"]
        pods[metadata["uid"]] = Pod(
            role=(metadata.get("labels") or {}).get(ROLE, "?"),
            uid=metadata["uid"],
            namespace=metadata["namespace"],
            name=metadata["name"],
            deletion_timestamp=metadata.get("deletionTimestamp"),
        )
    return pods


def _populate(kube: RealKube, namespace: str, side: str, node: str) -> None:
    """One pod of every role on ``node`` (the DaemonSet's pod is made elsewhere)."""

    def labels(role: str) -> dict[str, str]:
        return {ROLE: role, SIDE: side}

    kube.add_replicaset(
        namespace, f"web-{side}", nodes=[node], replicas=2, labels=labels("replicaset"), grace_s=100
    )
    kube.add_replicaset(
        namespace,
        f"scratch-{side}",
        nodes=[node],
        replicas=1,
        labels=labels("emptydir"),
        grace_s=100,
        empty_dir=True,
    )
    kube.add_replicaset(
        namespace, f"guarded-{side}", nodes=[node], replicas=1, labels=labels("pdb-blocked"), grace_s=100
    )
    kube.add_pdb(namespace, f"guarded-{side}", match_labels=labels("pdb-blocked"), min_available=1)
    kube.add_pod(namespace, f"bare-{side}", node=node, labels=labels("bare"), grace_s=100)
    kube.add_pod(namespace, f"completed-{side}", node=node, labels=labels("completed"), phase="Succeeded")
    kube.add_pod(namespace, f"static-{side}", node=node, labels=labels("mirror"), mirror=True)
    # Deleted with its own grace period (60 s real): it is still terminating when the drains run.
    kube.add_pod(namespace, f"terminating-{side}", node=node, labels=labels("terminating"), grace_s=6000)
    path = f"/api/v1/namespaces/{namespace}/pods/terminating-{side}"
    kube.plane.request("DELETE", path)


def _terminating_seen(kube: RealKube, node: str) -> bool:
    return any(p.role == "terminating" and p.deletion_timestamp for p in _pods(kube, node).values())


def _unschedulable(kube: RealKube, node: str) -> bool:
    return bool(((kube.get("nodes", node) or {}).get("spec") or {}).get("unschedulable"))


def _fates(kube: RealKube, before: dict[str, Pod], after: dict[str, Pod]) -> dict[str, str]:
    """Role → ``evicted``, ``deleted`` or ``left`` for the pods of ``before``; every role's pods must agree."""
    evicted = {pod["metadata"].get("uid") for pod in kube.evictions}
    fates: dict[str, set[str]] = {}
    for uid, pod in before.items():
        now = after.get(uid)
        if uid in evicted:
            fate = "evicted"
        elif now is None or (now.deletion_timestamp is not None and pod.deletion_timestamp is None):
            fate = "deleted"
        else:
            fate = "left"
        fates.setdefault(pod.role, set()).add(fate)
    assert all(len(f) == 1 for f in fates.values()), f"pods of one role met different fates: {fates}"
    return {role: next(iter(f)) for role, f in fates.items()}


def _requeued(controller: Controller) -> float:
    return sum(
        sample.value
        for metric in controller.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "queue_processor_messages_requeued_total"
    )


async def _kubectl_drain(kubectl: Path, kubeconfig: Path, node: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        str(kubectl),
        f"--kubeconfig={kubeconfig}",
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        f"--timeout={KUBECTL_TIMEOUT_S}s",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), KUBECTL_TIMEOUT_S + 30)
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


async def _controller_drain(aws: AwsSandbox, kubeconfig: Path, instance_id: str) -> None:
    """The controller in this event loop, until the first drain of the instance's node has ended (requeued)."""
    settings = load_settings(prometheus_server_port=0, probes_server_port=0, receive_wait_time_sec=2)
    stop = asyncio.Event()
    started: list[Controller] = []
    task = asyncio.create_task(
        run_controller(settings, stop, kubeconfig=str(kubeconfig), serve=False, started=started.append)
    )
    await until(lambda: bool(started) or task.done(), timeout_s=30, what="controller start")
    if task.done():
        task.result()
    try:
        aws.spot_interruption(instance_id)
        await until(
            lambda: _requeued(started[0]) >= 1, timeout_s=DRAIN_DEADLINE_S + 20, what="first drain requeued"
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert started[0].consumer.tasks == 0


@pytest.mark.parametrize("cache", [False, True], ids=["live-list", "apiserver-cache"])
async def test_the_controller_evicts_what_kubectl_drain_evicts(
    control_plane: ControlPlane,
    aws: AwsSandbox,
    cache: bool,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    with RealKube(SandboxClock(SCALE), plane=control_plane) as kube:
        run = kube.run
        queue = aws.create_queue(f"parity-{run}", visibility_timeout_s=30, max_receive_count=5)
        aws.put_standard_rules(queue.arn)
        (instance,) = aws.build_cluster({f"parity-{run}": 1}, heartbeat_timeout_s=300)
        namespace = f"parity-{run}"
        node_a = f"parity-kubectl-{run}"  # kubectl's: no instance needed
        node_b = instance.private_dns_name  # the controller's: found through the instance
        kube.add_node(node_a)
        kube.add_node(node_b, provider_id=instance.provider_id)
        kube.wait_for_nodes([node_a, node_b])
        kube.add_daemonset(namespace, "agent", labels={ROLE: "daemonset"})
        for side, node in (("a", node_a), ("b", node_b)):
            _populate(kube, namespace, side, node)
        await until(
            lambda: all(_terminating_seen(kube, node) for node in (node_a, node_b)),
            timeout_s=10,
            what="the terminating pods seen terminating",
        )
        before = {node: _pods(kube, node) for node in (node_a, node_b)}
        for node, pods in before.items():
            assert sorted(p.role for p in pods.values()) == ROLES_ON_A_NODE, f"{node}: {pods}"
        setup_s = time.monotonic() - started

        kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
        for key, value in {
            "QUEUE_URL": queue.url,
            "AWS_REGION": aws.region,
            "AWS_ENDPOINT": aws.endpoint_url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            # --ignore-daemonsets --delete-emptydir-data (--force is always on) and kubectl's --grace-period -1
            "IGNORE_DAEMON_SETS": "true",
            "DELETE_LOCAL_DATA": "true",
            "POD_TERMINATION_GRACE_PERIOD": "-1",
            "NODE_TERMINATION_GRACE_PERIOD": str(DRAIN_DEADLINE_S),
            "REQUEUE_BACKOFF_BASE_SEC": "600",  # one attempt only
            "USE_APISERVER_CACHE": str(cache).lower(),
            "POD_NAMESPACE": namespace,
        }.items():
            monkeypatch.setenv(key, value)
        (code, output), _ = await asyncio.gather(
            _kubectl_drain(control_plane.kubectl, control_plane.admin_kubeconfig, node_a),
            _controller_drain(aws, kubeconfig, instance.instance_id),
        )
        drains_s = time.monotonic() - started - setup_s

        after = {node: _pods(kube, node) for node in (node_a, node_b)}
        kubectl_fates = _fates(kube, before[node_a], after[node_a])
        controller_fates = _fates(kube, before[node_b], after[node_b])
        report = (
            f"kubectl exit {code}, output:\n{output}\nkubectl: {kubectl_fates}\ncontroller: {controller_fates}\n"
            f"setup {setup_s:.1f} s, drains {drains_s:.1f} s"
        )

        # kubectl gave up on the PodDisruptionBudget, as on any cluster.
        assert code != 0, report
        assert "global timeout reached" in output or "timed out" in output, report
        assert _unschedulable(kube, node_a), report
        assert _unschedulable(kube, node_b), report

        assert kubectl_fates == KUBECTL_FATES, report
        assert controller_fates == {**kubectl_fates, **KNOWN_DIFFERENCES}, report
        # The difference has no effect: kubectl's second eviction did not move the deletion deadline.
        for node in (node_a, node_b):
            (terminating,) = (p for p in before[node].values() if p.role == "terminating")
            assert after[node][terminating.uid].deletion_timestamp == terminating.deletion_timestamp, report

        # Evicted pods go once their grace period (1 s) has passed: poll until only the kept ones are left.
        def still_there(node: str) -> set[str]:
            return {p.role for uid, p in _pods(kube, node).items() if uid in before[node]}

        with contextlib.suppress(AssertionError):  # the assertions below say what differs
            await until(
                lambda: all(still_there(node) == STILL_THERE for node in (node_a, node_b)),
                timeout_s=15,
                what="evicted pods gone",
            )
        assert still_there(node_a) == STILL_THERE, report
        assert still_there(node_b) == STILL_THERE, report
