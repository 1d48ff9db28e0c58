"""A Spot storm: N nodes interrupted at once, the controller running as its own process against the sandbox.

Cluster: ``--nodes`` nodes that get a Spot interruption warning, plus ``--spare`` nodes that do not (a storm
hits a capacity pool, not the whole cluster; the spares take the evicted pods), 10 pods per node from 10
ReplicaSets with PodDisruptionBudgets (maxUnavailable ``--pdb``), a DaemonSet and a mirror pod per node. The
controller is ``queue-processor run`` in a subprocess (its own memory, its own event loop), configured by the
sandbox's env file; time runs at ``--scale`` (a 120 s notice lasts 120 x scale seconds).

Two modes, printed (``mode: ...``) and in the JSON (``"mode"``):

- start-up (the default, the figures of docs/benchmarks.md so far): the N warnings are queued before the
  controllers start; the clock (``seconds_total``) runs from the controllers' start;
- ``--warm``, as in production: the controllers start first, and the burst is published (as fast as the
  sandbox publishes: ``publish_seconds``) once each is warm: it answers /readyz (its first ReceiveMessage was
  answered: it consumes; the API server reached), its metrics count the opening of its watches of nodes and
  pods (and Leases with NODE_LEASES; a watch opens after its start-up list: the watched copies are filled), and
  it made no Kubernetes request for KUBE_API_BURST / KUBE_API_QPS seconds (at least 1 s: its token bucket full
  again). The clock runs from the first warning's publication, and the request counts (``kube_requests_*``,
  ``qps_floor_seconds``, 429s) and ``sandbox_cpu_seconds`` from then too: the start-up's lists and watches are
  not in them (``kube_requests_each``, ``cpu_seconds`` and ``peak_rss_mib`` are the processes' whole lives in
  both modes). ``startup_seconds`` is the controllers' start to warm: ~20 s more than in start-up mode, since
  the first ReceiveMessage on the empty queue is answered when its long poll (WaitTimeSeconds) ends; the burst
  then meets a long poll in flight, as in production. ``published ... from <UTC>`` gives the burst's start, to
  read the controllers' logs (``--log``) against.

Measured in the same run:

- per node, exact (no histogram, no sampling; ``benchmarks/storm_moments.py``), p50, p99 and max of
  ``detect_to_cordon`` (``p50_detect_to_cordon_s``, ``p99_…``, ``max_…``, over ``detect_to_cordon_nodes``):
  the node's ``spec.unschedulable`` written in the API server (the emulation's store; on the real control plane
  the audit log's ``stageTimestamp`` of the controller's first node write answered 200) minus the moment its
  warning's publication returned (the message in the queue); in start-up mode it includes the controllers'
  start-up; and of ``cordon_to_drained`` (``p50_cordon_to_drained_s``…, over ``cordon_to_drained_nodes``): from
  that cordon to the last application pod bound to the node gone from the API server (the emulation's store, the
  pod's grace period included; on the real plane when the sandbox's pod informer saw it deleted), nodes with an
  application pod left not counted;
- ``floor_seconds``: receive + delete of N messages from the same moto queue, with no processing;
- ``seconds_total``: from publishing the N warnings to every message settled (queue empty);
- ``p99_receive_to_cordon_s``: 99th percentile of receive → cordon, from the controller's
  ``queue_processor_event_to_cordon_seconds`` histogram (interpolated inside its bucket, as PromQL's
  ``histogram_quantile``), and ``p99_receive_to_cordon_bucket``, the bucket it lies in (``"(3, 3.5]"``): all the
  histogram can say;
- ``all_drained_within_notice``: every node's drain completed before its notice ended (the controller only
  counts a drain as a success when it does), none was requeued as incomplete (``drains_incomplete``: a
  drain whose evicted pods had not gone by its deadline is requeued, and its second, successful drain came
  after the notice) and every application pod on the storm's nodes when it began was evicted
  (``pods_not_evicted``: those that went down with their node instead, which a drain that finds them gone
  counts as done; replacements scheduled onto a storm node before its cordon are not counted);
- ``kube_requests_per_node``: Kubernetes API requests the controller made, per interrupted node, and
  ``kube_requests_per_node_by_kind`` the same by ``"<verb> <resource>"`` (a watch counts once, when it opens);
- ``peak_rss_mib``: the controller process's peak resident memory (VmHWM; the highest of the replicas, each in
  ``peak_rss_mib_each``);
- ``tasks_left``: operation tasks alive when the queue is empty.

With ``--replicas N`` (issue 30) N controller processes compete for the queue (NODE_LEASES on when N > 1, each
with ``--qps``), and the JSON adds ``replicas``; ``nodes_drained_twice`` (nodes one of whose pods two drains
evicted: the sandbox's figure, :func:`queue_processor_sandbox.run.judge`); ``lease_conflicts`` (Lease updates
answered 409: renewals or takeovers another replica's write refused; a create refused because the Lease exists
is a claim's first step, not counted) and ``lease_held_requeues`` (operations requeued because another replica
held the node's Lease);
``share`` (nodes each replica drained), ``kube_requests_each`` (each replica's Kubernetes requests, as its
client counts them: the setup's watches and lists included) and ``slowest_replica_floor_s`` (the most of those
÷ one replica's QPS: competing consumers split the queue unevenly, and the busiest replica's floor bounds the
storm as ``qps_floor_seconds`` does); ``cpu_seconds`` (each controller process's user + system CPU) and
``sandbox_cpu_seconds`` (this process: moto and the API emulation), against ``cpus``, so that a machine that
is the limit shows as one; ``aws_requests_by_operation`` (every replica's AWS calls); ``cordon_floor_s``
(nodes ÷ the replicas' summed QPS: one cordon write each),
``cordon_goal_s`` (1.2 x that + 0.5 s) and ``cordon_requests_per_node`` (node GETs and PATCHes);
``cordon_path_floor_s`` (the cordon requests and the node Lease creates ÷ the replicas' summed QPS: with
replicas each cordon waits for its node's Lease, an urgent request too) and ``cordon_path_goal_s`` (1.2 x that
+ 0.5 s); and
``receive_seconds`` (from the first Spot warning received to the last, over all replicas, read from their
metrics every 0.25 s). ``--replicas 1,2,3`` runs one storm per count, each on a fresh sandbox, prints each
one's JSON and ends with a summary: ``time_ratio_to_one_replica`` and ``p99_cordon_ratio_to_one_replica``.

With ``--kubernetes real`` the cluster is on a real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK; ``make cluster-bin``) and the controller runs as a ServiceAccount with only its RBAC rules;
the JSON then carries ``kubernetes: "real"`` and the API server's own view of the storm from its ``/metrics``:
``apiserver_requests`` (apiserver_request_total by verb and code, every client), ``apf_rejected`` (requests
API Priority and Fairness rejected with 429, by priority level and reason) and ``controller_requests_by_code``
(the controller's own requests by HTTP status, from the audit log), ``kube_429s_per_node`` and
``kube_requests_per_node_without_429s`` (the requests answered 429, PodDisruptionBudgets' refusals retried, apart
from the rest), and ``apf`` (API Priority and Fairness per priority level and flow schema: requests, mean
seats in use, mean queue wait, the level's nominal seats), ``control_plane_cpu_seconds`` (each component's
CPU over the storm: with ``cpu_seconds`` and ``sandbox_cpu_seconds``, where the machine's cores went);
``kube_429s_per_node`` and ``kube_requests_per_node_without_429s`` come from the emulation's own count too;
``slowest_pod_termination_s`` is the longest
pod grace period (real seconds) and ``goal_seconds`` 1.1 x max(the client QPS floor, that).

Last line: one JSON object with those figures and ``ratio_to_floor``. Goals (issue 6): ratio_to_floor ≤ 1.2,
p99 receive→cordon ≤ 1 s, all drained within the notice, ≤ 2 x pods + 10 requests per node, RSS ≤ 150 MiB,
0 tasks left.

Usage: ``python benchmarks/storm.py [--nodes 1000] [--spare 250] [--scale 1.0] [--qps 200] [--pdb 30%]
[--replicas 1|1,2,3] [--kubernetes emulated|real] [--warm] [--set NAME=VALUE ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from queue_processor_sandbox.processes import (
    Process,
    QueueProcessor,
    Samples,
    parse_metrics,
    peak_rss_mib,
    scrape,
    total,
)
from queue_processor_sandbox.run import judge
from storm_moments import Moments, is_application_pod


def floor_seconds(sandbox: Sandbox, count: int) -> float:
    """Send ``count`` bodies, then time receiving and deleting them all (10 per call, batch deletes)."""
    assert sandbox.queue is not None
    sqs = sandbox.aws.client("sqs")
    body = json.dumps({"detail-type": "floor", "source": "benchmark", "detail": {}})
    for start in range(0, count, 10):
        entries = [{"Id": str(i), "MessageBody": body} for i in range(min(10, count - start))]
        sqs.send_message_batch(QueueUrl=sandbox.queue.url, Entries=entries)
    started = time.perf_counter()
    done = 0
    while done < count:
        messages = sqs.receive_message(QueueUrl=sandbox.queue.url, MaxNumberOfMessages=10).get("Messages", [])
        if messages:
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            sqs.delete_message_batch(QueueUrl=sandbox.queue.url, Entries=entries)
            done += len(messages)
    return time.perf_counter() - started


def _p99(buckets: list[tuple[dict[str, str], float]]) -> float:
    """The 99th percentile of a Prometheus histogram, interpolated linearly inside its bucket (what PromQL's
    ``histogram_quantile(0.99, ...)`` returns)."""
    by_bound: dict[float, float] = {}
    for labels, count in buckets:  # one series per replica: summed by bucket
        by_bound[float(labels["le"])] = by_bound.get(float(labels["le"]), 0.0) + count
    ordered = sorted(by_bound.items())
    if not ordered or not ordered[-1][1]:
        return float("nan")
    rank = 0.99 * ordered[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return round(lower + (bound - lower) * (rank - below) / max(count - below, 1e-9), 3)
        lower, below = bound, count
    return float("inf")


def _p99_bucket(buckets: list[tuple[dict[str, str], float]]) -> str:
    """The histogram bucket the 99th percentile lies in, ``"(3, 3.5]"``: what the interpolated :func:`_p99`
    can honestly say (the buckets of ``event_to_cordon_seconds`` are 0.5 s apart from 1 to 4 s, then 5,
    7.5, 10, 15, 20 s…)."""
    by_bound: dict[float, float] = {}
    for labels, count in buckets:
        by_bound[float(labels["le"])] = by_bound.get(float(labels["le"]), 0.0) + count
    ordered = sorted(by_bound.items())
    if not ordered or not ordered[-1][1]:
        return ""
    lower = 0.0
    for bound, count in ordered:
        if count >= 0.99 * ordered[-1][1]:
            return f"({lower:g}, {bound:g}]"
        lower = bound
    return ""


#: The metric families the storm polls every 0.25 s (parsing only these: the sandbox shares this process).
POLLED = (
    "queue_processor_messages_deleted",
    "queue_processor_messages_received",
    "queue_processor_in_flight_operations",
)


def _wait_ready(controller: Process, timeout_s: float = 120.0) -> None:
    """Until the controller answers /readyz (it has received from SQS and reached the API server) on the
    probes port it logged. Raises ``SystemExit`` when it exits first or is not ready within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if controller.process.poll() is not None:
            raise SystemExit(f"controller exited with {controller.process.returncode}")
        if controller.get("/readyz")[0] == 200:
            return
        time.sleep(0.2)
    raise SystemExit("controller not ready in time")


def _wait_warm(
    controller: Process, watched: set[str], qps: float, burst: float, timeout_s: float = 120.0
) -> None:
    """Until the controller is warm, as a controller that has run for a while is when a burst comes: it answers
    /readyz (its first ReceiveMessage answered: it consumes; the API server reached), its metrics count the
    opening of a watch of each resource in ``watched`` (``queue_processor_kube_requests_total{verb="watch",
    code="200"}``: a watch opens after its start-up list, so the watched copies are filled), and it has made no
    Kubernetes request for ``burst / qps`` seconds (at least 1 s, at most 15 s in all: its start-up lists are
    over and its client's token bucket is full again). Raises ``SystemExit`` when it exits first or a watch does
    not open within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    _wait_ready(controller, timeout_s)
    requests = ("queue_processor_kube_requests",)
    while True:
        samples = scrape(controller.metrics_port, names=requests).get(
            "queue_processor_kube_requests_total", []
        )
        opened = {
            labels.get("resource", "")
            for labels, value in samples
            if labels.get("verb") == "watch" and labels.get("code") == "200" and value
        }
        if watched <= opened:
            break
        if controller.process.poll() is not None:
            raise SystemExit(f"controller exited with {controller.process.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"controller's watches of {sorted(watched - opened)} not open in time")
        time.sleep(0.2)
    quiet_s, quiet_until = max(1.0, burst / qps), time.monotonic() + 15.0
    last, since = -1.0, time.monotonic()
    while time.monotonic() < quiet_until:
        count = total(scrape(controller.metrics_port, names=requests), "queue_processor_kube_requests_total")
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.25)
    print(f"warm: the controller's Kubernetes requests did not stop for {quiet_s:g} s in 15 s: going on")


def _launch(sandbox: Sandbox, workdir: Path, replicas: int, settings: dict[str, str]) -> list[QueueProcessor]:
    """Start ``replicas`` controller processes (``queue-processor run``, ``POD_NAME=storm-<index>``)."""
    return [
        QueueProcessor(sandbox, workdir / f"controller-{index}.log", POD_NAME=f"storm-{index}", **settings)
        for index in range(replicas)
    ]


def _before(sandbox: Sandbox, plane: Any) -> dict[str, Any]:
    """The counters the storm's figures are deltas of, read when its clock starts."""
    return {
        "kube": sum(sandbox.kube.requests.values()),
        "kinds": dict(sandbox.kube.requests),
        "refused": _refused(sandbox),
        "apiserver": parse_metrics(plane.metrics()) if plane is not None else {},
        "plane_cpu": (
            {name: _cpu_seconds(pid) for name, pid in plane.pids().items()} if plane is not None else {}
        ),
        "sandbox_cpu": time.process_time(),
    }


def _print_latency(figures: dict[str, Any], real: bool) -> None:
    """The mode and the per-node latencies, for a reader (the JSON line carries them too)."""

    def seconds(key: str) -> str:
        return "-" if figures[key] is None else f"{figures[key]:.3f} s"

    mode = figures["mode"]
    print(
        f"mode: {mode} ("
        + (
            "the controllers consuming, watches open, when the burst was published"
            if mode == "warm"
            else "the burst queued before the controllers started"
        )
        + f"); published in {figures['publish_seconds']:.2f} s, controllers ready after "
        f"{figures['startup_seconds']:.2f} s"
    )
    cordon_source = "the API server's audit log" if real else "the emulation's store"
    print(
        f"detect -> cordon (warning published -> node unschedulable, {cordon_source}), "
        f"{figures['detect_to_cordon_nodes']} nodes: p50 {seconds('p50_detect_to_cordon_s')}, "
        f"p99 {seconds('p99_detect_to_cordon_s')}, max {seconds('max_detect_to_cordon_s')}"
    )
    gone_source = "the sandbox's pod informer" if real else "the emulation's store"
    print(
        f"cordon -> drained (node unschedulable -> its last application pod gone, {gone_source}), "
        f"{figures['cordon_to_drained_nodes']} nodes: p50 {seconds('p50_cordon_to_drained_s')}, "
        f"p99 {seconds('p99_cordon_to_drained_s')}, max {seconds('max_cordon_to_drained_s')}"
    )
    print(
        f"receive -> cordon (the controller's histogram, interpolated): p99 {figures['p99_receive_to_cordon_s']} s, "
        f"in {figures['p99_receive_to_cordon_bucket'] or '-'}"
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used, in seconds (``/proc/<pid>/stat`` utime and stime, proc(5)); 0.0
    when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)


def _merged(scrapes: list[Samples]) -> Samples:
    """Every replica's samples under one name (sums over replicas with :func:`total`)."""
    merged: Samples = {}
    for samples in scrapes:
        for name, values in samples.items():
            merged.setdefault(name, []).extend(values)
    return merged


def _by_label(samples: Samples, name: str, label: str) -> dict[str, int]:
    """A counter summed by one label (over every replica)."""
    sums: dict[str, float] = {}
    for labels, value in samples.get(name, []):
        sums[labels.get(label, "")] = sums.get(labels.get(label, ""), 0.0) + value
    return {key: int(value) for key, value in sorted(sums.items()) if value}


def _spot(samples: Samples, name: str) -> float:
    """A message counter's Spot warnings only: when a notice ends the instance is terminated and the state
    changes that follow are more messages, handled too, but not part of the storm being timed."""
    return total(samples, name, kind="spot-interruption")


def main() -> None:
    """Run the storm once per replica count and print its figures; the last line is the JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000, help="interrupted nodes (default 1000)")
    ap.add_argument("--spare", type=int, default=None, help="nodes not interrupted (default nodes / 4)")
    ap.add_argument(
        "--scale", type=float, default=1.0, help="real seconds per simulated second (default 1.0)"
    )
    ap.add_argument(
        "--qps", type=float, default=200.0, help="KUBE_API_QPS of each controller process (default 200)"
    )
    ap.add_argument(
        "--replicas",
        default="1",
        help="controller processes, or a comma list of counts run one after the other on fresh sandboxes "
        "(1,2,3); with more than one, NODE_LEASES is on (default 1)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of every controller process (EVICTIONS_IN_FLIGHT=800); may be repeated",
    )
    ap.add_argument("--log", type=Path, default=None, help="keep the controllers' logs (info level) here")
    ap.add_argument("--timeline", action="store_true", help="print cordoned/evicted/deleted over time")
    ap.add_argument(
        "--warm",
        action="store_true",
        help="start the controllers first and publish the burst once each is warm (consuming, its watches open, "
        "its start-up requests over), as in production; default: the burst is queued before they start",
    )
    ap.add_argument("--pdb", default="30%", help="maxUnavailable of every PodDisruptionBudget (default 30%%)")
    ap.add_argument(
        "--kubernetes",
        choices=["emulated", "real"],
        default="emulated",
        help="the sandbox's API emulation (default) or a real control plane (make cluster-bin)",
    )
    args = ap.parse_args()
    counts = [int(count) for count in str(args.replicas).split(",")]
    if not counts or min(counts) < 1:
        raise SystemExit("--replicas: counts of 1 or more, separated by commas")
    plane = None
    if args.kubernetes == "real":
        from queue_processor_sandbox.control_plane import ControlPlane

        # Thousands of nodes: KWOK renews each node's Lease every 150 s instead of every 10 s; the control
        # plane's own controllers get the API rate they need to create and bind the pods in minutes.
        plane = ControlPlane(node_lease_s=600, client_qps=500, start_timeout_s=180).start()
    try:
        runs = [storm(args, count, plane) for count in counts]
    finally:
        if plane is not None:
            plane.stop()
    if len(runs) == 1:
        print(json.dumps(runs[0]))
        return
    for run in runs:
        print(json.dumps(run))
    one = next((run for run in runs if run["replicas"] == 1), None)
    summary: dict[str, Any] = {
        "replica_counts": counts,
        "mode": "warm" if args.warm else "start-up",
        "seconds_total": {run["replicas"]: run["seconds_total"] for run in runs},
        "p99_receive_to_cordon_s": {run["replicas"]: run["p99_receive_to_cordon_s"] for run in runs},
        "nodes_drained_twice": {run["replicas"]: run["nodes_drained_twice"] for run in runs},
        "cpu_seconds": {run["replicas"]: run["cpu_seconds"] for run in runs},
    }
    if one is not None and one["seconds_total"]:
        summary["time_ratio_to_one_replica"] = {
            run["replicas"]: round(run["seconds_total"] / one["seconds_total"], 2) for run in runs
        }
        summary["p99_cordon_ratio_to_one_replica"] = {
            run["replicas"]: round(run["p99_receive_to_cordon_s"] / one["p99_receive_to_cordon_s"], 2)
            for run in runs
            if one["p99_receive_to_cordon_s"] == one["p99_receive_to_cordon_s"]  # not NaN (no cordon)
            and one["p99_receive_to_cordon_s"]
            and run["p99_receive_to_cordon_s"] == run["p99_receive_to_cordon_s"]
        }
    print(json.dumps(summary))


def _application_pods(sandbox: Sandbox, nodes: set[str]) -> set[str]:
    """UIDs of the pods a drain of ``nodes`` evicts: bound to one of them, neither a DaemonSet's nor a mirror
    pod."""
    return {
        pod["metadata"]["uid"]
        for pod in sandbox.kube.objects("pods")
        if pod["spec"].get("nodeName") in nodes and is_application_pod(pod)
    }


def _refused(sandbox: Any) -> int:
    """The requests the emulated API server answered 429 so far (0 on a real control plane, which counts them
    in its audit log instead)."""
    counted = getattr(sandbox.kube, "too_many_requests", None)
    return sum(counted().values()) if counted is not None else 0


def storm(args: argparse.Namespace, replicas: int, plane: Any) -> dict[str, Any]:
    """One storm on a fresh sandbox with ``replicas`` controller processes: its figures (see the module
    docstring)."""
    spare = args.spare if args.spare is not None else max(1, args.nodes // 4)
    options = SandboxOptions(
        nodes=args.nodes + spare,
        asgs=max(1, (args.nodes + spare) // 250),
        scale=args.scale,
        cluster=ClusterSpec(apps=10, pdb_max_unavailable=args.pdb, empty_dir_pods=0, unreplicated_pods=0),
    )
    built_at = time.perf_counter()
    with (
        tempfile.TemporaryDirectory() as workdir,
        Sandbox(options, workdir=Path(workdir), kubernetes=args.kubernetes, plane=plane) as sandbox,
    ):
        print(
            f"sandbox ({args.kubernetes}): {len(sandbox.instances)} nodes, {len(sandbox.kube.objects('pods'))} pods"
            f", built in {time.perf_counter() - built_at:.0f} s; {replicas} replica(s)"
        )
        # moto's first description of an instance costs the sandbox's one core about 1.5 ms, a cost EC2 has
        # not: described once now, the storm's first second is not spent on it (docs/benchmarks.md).
        sandbox.aws.warm_descriptions([instance.instance_id for instance in sandbox.instances])
        floor = floor_seconds(sandbox, args.nodes)
        print(f"floor: receive+delete {args.nodes} messages in {floor:.2f} s")
        sandbox.kube.ensure_namespace(sandbox.controller_namespace)
        settings = {
            "KUBE_API_QPS": str(args.qps),
            "KUBE_API_BURST": str(int(args.qps * 1.5)),
            "LOG_LEVEL": "info" if args.log else "warning",
            "POD_NAMESPACE": sandbox.controller_namespace,
            **({"NODE_LEASES": "true"} if replicas > 1 else {}),
            **dict(setting.split("=", 1) for setting in args.set),
        }
        # Start-up mode: the storm is in the queue before the controllers start (the issue: "N Spot warnings in
        # the queue"); each notice runs from its publication, so the time they wait counts against the drains.
        # Warm mode: the controllers run, consuming with their watches open, when the burst is published.
        targets = sandbox.instances[: args.nodes]
        storm_pods = _application_pods(sandbox, {instance.private_dns_name for instance in targets})
        moments = Moments(
            sandbox,
            [instance.private_dns_name for instance in targets],
            plane,
            sandbox.controller_username if plane is not None else "",
        )
        processes: list[QueueProcessor] = []
        try:
            launched = time.perf_counter()
            if args.warm:
                processes = _launch(sandbox, Path(workdir), replicas, settings)
                watched = {"nodes", "pods"} | ({"leases"} if settings.get("NODE_LEASES") == "true" else set())
                for process in processes:
                    _wait_warm(
                        process, watched, float(settings["KUBE_API_QPS"]), float(settings["KUBE_API_BURST"])
                    )
                ready = time.perf_counter() - launched
                before = _before(sandbox, plane)
            moments.start()
            published_at, published_monotonic = time.perf_counter(), time.monotonic()
            for instance in targets:
                sandbox.aws.spot_interruption(instance.instance_id)
                moments.published[instance.private_dns_name] = time.time()
            published = time.perf_counter() - published_at
            print(
                f"published {args.nodes} warnings from "
                f"{datetime.fromtimestamp(time.time() - published, UTC).isoformat(timespec='milliseconds')} "
                f"in {published:.2f} s"
            )
            if args.warm:
                started = published_at  # the clock runs from the burst
                started_monotonic = published_monotonic
            else:
                before = _before(sandbox, plane)
                started = time.perf_counter()  # the clock runs from the controllers' start
                started_monotonic = time.monotonic()
                processes = _launch(sandbox, Path(workdir), replicas, settings)
                for process in processes:
                    _wait_ready(process)
                ready = time.perf_counter() - started
            kube_before, kinds_before, refused_before = before["kube"], before["kinds"], before["refused"]
            apiserver_before, plane_cpu_before = before["apiserver"], before["plane_cpu"]
            sandbox_cpu_before = before["sandbox_cpu"]
            timeline: list[str] = []
            first_received: float | None = None
            last_received: float | None = None
            deadline = started + 120 * args.scale * 5 + 60
            while time.perf_counter() < deadline:
                time.sleep(0.25)
                scraped = _merged([scrape(process.metrics_port, names=POLLED) for process in processes])
                now = time.perf_counter() - started
                deleted = _spot(scraped, "queue_processor_messages_deleted_total")
                received = _spot(scraped, "queue_processor_messages_received_total")
                if received and first_received is None:
                    first_received = now
                if received >= args.nodes and last_received is None:
                    last_received = now
                cordoned = sandbox.kube.count("nodes", lambda node: bool(node["spec"].get("unschedulable")))
                timeline.append(
                    f"{now:6.1f}s cordoned={cordoned} "
                    f"evictions={len(sandbox.kube.evictions)} deleted={int(deleted)} "
                    f"node_gets={sandbox.kube.requests['get nodes']} received={int(received)}"
                )
                if deleted >= args.nodes:
                    break
                busy = total(scraped, "queue_processor_in_flight_operations")
                if len(timeline) % 8 == 0 and not busy and not sandbox.queue_counts().left:
                    break  # every message settled, some of them otherwise (instance gone before drained)
            seconds = time.perf_counter() - started
            if args.timeline:
                print(
                    f"published {args.nodes} warnings in {published:.2f} s; controllers ready after {ready:.2f} s"
                )
                print("\n".join(timeline[:: max(1, len(timeline) // 40)]))
            kube_requests = sum(sandbox.kube.requests.values()) - kube_before
            grown = {
                kind: count - kinds_before.get(kind, 0)
                for kind, count in sorted(sandbox.kube.requests.items())
                if count > kinds_before.get(kind, 0)
            }
            by_kind = {kind: round(count / args.nodes, 2) for kind, count in grown.items()}
            apiserver_after = parse_metrics(plane.metrics()) if plane is not None else {}
            plane_cpu = (
                {
                    name: round(_cpu_seconds(pid) - plane_cpu_before.get(name, 0.0), 1)
                    for name, pid in plane.pids().items()
                }
                if plane is not None
                else {}
            )
            # The messages that followed (state changes of terminated instances) settle too: then count what
            # is left (tasks, messages), up to 60 s.
            settle_until = time.perf_counter() + 60
            while time.perf_counter() < settle_until and (
                sandbox.queue_counts().left
                or total(
                    _merged([scrape(process.metrics_port) for process in processes]),
                    "queue_processor_in_flight_operations",
                )
            ):
                time.sleep(1.0)
            each = [scrape(process.metrics_port) for process in processes]
            metrics = _merged(each)
            success = {"node_action": "cordon-and-drain", "node_status": "success"}
            drained = total(metrics, "actions_total", **success)
            # A drain that did not finish by its deadline (inside the notice) is requeued and drained again:
            # counted apart, so that a second, successful drain of the same node is not taken for one in time.
            incomplete = total(metrics, "actions_total", node_action="cordon-and-drain", node_status="error")
            in_flight = total(metrics, "queue_processor_in_flight_operations")
            verdict = judge(sandbox, [instance.private_dns_name for instance in targets], started_monotonic)
            not_evicted = len(storm_pods - {pod["metadata"].get("uid") for pod in sandbox.kube.evictions})
            aggregate_qps = args.qps * replicas
            # Each replica's own requests (its client's count): the busiest one's ÷ its QPS bounds the storm as
            # the summed floor does, and shows what an uneven split of the queue among replicas costs.
            requests_each = [int(total(samples, "queue_processor_kube_requests_total")) for samples in each]
            p99 = _p99(metrics.get("queue_processor_event_to_cordon_seconds_bucket", []))
            moments.stop()
            latency = moments.figures()
            cordon_floor = args.nodes / aggregate_qps
            cordon_requests = grown.get("get nodes", 0) + grown.get("patch nodes", 0)
            cordon_path = cordon_requests + grown.get("create leases", 0)  # each cordon waits for its claim
            figures: dict[str, Any] = {
                "nodes": args.nodes,
                "replicas": replicas,
                "mode": "warm" if args.warm else "start-up",
                "seconds_total": round(seconds, 2),
                "floor_seconds": round(floor, 2),
                "ratio_to_floor": round(seconds / floor, 2) if floor else None,
                **latency,
                "p99_receive_to_cordon_s": p99,
                "p99_receive_to_cordon_bucket": _p99_bucket(
                    metrics.get("queue_processor_event_to_cordon_seconds_bucket", [])
                ),
                "cordon_floor_s": round(cordon_floor, 2),
                "cordon_goal_s": round(1.2 * cordon_floor + 0.5, 2),
                "cordon_requests_per_node": round(cordon_requests / args.nodes, 2),
                "cordon_path_floor_s": round(cordon_path / aggregate_qps, 2),
                "cordon_path_goal_s": round(1.2 * cordon_path / aggregate_qps + 0.5, 2),
                "receive_seconds": (
                    round(last_received - first_received, 2)
                    if first_received is not None and last_received is not None
                    else None
                ),
                "all_drained_within_notice": drained >= args.nodes and not incomplete and not not_evicted,
                "drains_incomplete": int(incomplete),
                "pods_not_evicted": not_evicted,
                "drained": int(drained),
                "nodes_drained_twice": verdict["nodes_drained_twice"],
                "evictions_repeated": verdict["evictions_repeated"],
                "lease_conflicts": int(
                    total(
                        metrics,
                        "queue_processor_kube_requests_total",
                        verb="update",
                        resource="leases",
                        code="409",
                    )
                ),
                "lease_held_requeues": int(
                    total(metrics, "queue_processor_operation_outcomes_total", outcome="lease-held")
                ),
                "share": [int(total(samples, "actions_total", **success)) for samples in each],
                "kube_requests_each": requests_each,
                "slowest_replica_floor_s": round(max(requests_each) / args.qps, 2),
                "aws_requests_by_operation": _by_label(
                    metrics, "queue_processor_aws_requests_total", "operation"
                ),
                "kube_requests_per_node": round(kube_requests / args.nodes, 1),
                "kube_requests_per_node_by_kind": by_kind,
                "peak_rss_mib": max(peak_rss_mib(process.process.pid) for process in processes),
                "peak_rss_mib_each": [peak_rss_mib(process.process.pid) for process in processes],
                "cpu_seconds": [_cpu_seconds(process.process.pid) for process in processes],
                "sandbox_cpu_seconds": round(time.process_time() - sandbox_cpu_before, 1),
                "tasks_left": int(in_flight),
                "messages_left": sandbox.queue_counts().left,
                "publish_seconds": round(published, 2),
                "startup_seconds": round(ready, 2),
                "qps_floor_seconds": round(kube_requests / aggregate_qps, 2),
                "evictions": len(sandbox.kube.evictions),
                "scale": args.scale,
                "kubernetes": args.kubernetes,
                "cpus": os.cpu_count(),
            }
            slowest = max(
                (
                    int(p["spec"].get("terminationGracePeriodSeconds") or 0)
                    for p in sandbox.kube.objects("pods")
                ),
                default=0,
            )
            figures["slowest_pod_termination_s"] = slowest
            by_owner: dict[str, int] = {}
            for pod in sandbox.kube.evictions:
                kind = ((pod["metadata"].get("ownerReferences") or [{}])[0]).get("kind") or "none"
                by_owner[kind] = by_owner.get(kind, 0) + 1
            figures["evicted_by_owner"] = by_owner
            figures["goal_seconds"] = round(1.1 * max(kube_requests / aggregate_qps, slowest), 2)
            if plane is None:
                # The emulation's count of its 429s (it has no other clients and no APF): the evictions the
                # PodDisruptionBudgets refused.
                refused = _refused(sandbox) - refused_before
                figures["kube_429s_per_node"] = round(refused / args.nodes, 2)
                figures["kube_requests_per_node_without_429s"] = round(
                    (kube_requests - refused) / args.nodes, 2
                )
            if plane is not None:
                figures["apiserver_requests"] = _delta(
                    apiserver_before, apiserver_after, "apiserver_request_total", ("verb", "code")
                )
                figures["apf_rejected"] = _delta(
                    apiserver_before,
                    apiserver_after,
                    "apiserver_flowcontrol_rejected_requests_total",
                    ("priority_level", "reason"),
                )
                figures["apf"] = _apf(apiserver_before, apiserver_after, seconds)
                figures["control_plane_cpu_seconds"] = plane_cpu
                by_code: dict[str, int] = {}
                for (_what, code), count in sandbox.kube.requests_by(  # type: ignore[attr-defined]
                    sandbox.controller_username
                ).items():
                    by_code[str(code)] = by_code.get(str(code), 0) + count
                figures["controller_requests_by_code"] = by_code
                # The 429s apart: a PodDisruptionBudget's refusals are retried while the replacements start
                # (how many depends on how fast they turn Ready), and APF's rejections (apf_rejected) too.
                figures["kube_429s_per_node"] = round(by_code.get("429", 0) / args.nodes, 2)
                figures["kube_requests_per_node_without_429s"] = round(
                    (sum(by_code.values()) - by_code.get("429", 0)) / args.nodes, 2
                )
            _print_latency(figures, plane is not None)
        finally:
            moments.stop()
            for process in processes:
                try:
                    process.stop(signal.SIGTERM, 30)
                except AssertionError as error:
                    print(f"controller: {error}")
            if args.log:
                args.log.mkdir(parents=True, exist_ok=True)
                for index, process in enumerate(processes):
                    (args.log / f"controller-{replicas}-{index}.log").write_text(process.log_path.read_text())
    return figures


def _delta(
    before: dict[str, list[tuple[dict[str, str], float]]],
    after: dict[str, list[tuple[dict[str, str], float]]],
    name: str,
    keys: tuple[str, ...],
) -> dict[str, int]:
    """How much a counter grew between two scrapes, summed by the given labels (joined with a space)."""
    return {key: int(value) for key, value in _grown(before, after, name, keys).items()}


def _grown(
    before: dict[str, list[tuple[dict[str, str], float]]],
    after: dict[str, list[tuple[dict[str, str], float]]],
    name: str,
    keys: tuple[str, ...],
) -> dict[str, float]:
    """:func:`_delta` unrounded (seconds of a histogram's ``_sum``)."""
    totals: dict[str, float] = {}
    for sign, samples in ((-1, before.get(name, [])), (1, after.get(name, []))):
        for labels, value in samples:
            key = " ".join(labels.get(k, "") for k in keys)
            totals[key] = totals.get(key, 0.0) + sign * value
    return {key: value for key, value in sorted(totals.items()) if value}


def _apf(
    before: dict[str, list[tuple[dict[str, str], float]]],
    after: dict[str, list[tuple[dict[str, str], float]]],
    seconds: float,
) -> dict[str, dict[str, float]]:
    """API Priority and Fairness in the storm, per ``"<priority level> <flow schema>"`` that dispatched
    requests (the exempt level left out): ``requests`` dispatched, ``mean_seats`` (seconds of execution ÷ the
    storm's seconds: the seats in use on average, Little's law), ``mean_wait_ms`` (time queued before
    execution) and the level's ``nominal_seats`` (``apiserver_flowcontrol_nominal_limit_seats``)."""
    keys = ("priority_level", "flow_schema")
    dispatched = _grown(before, after, "apiserver_flowcontrol_dispatched_requests_total", keys)
    executing = _grown(before, after, "apiserver_flowcontrol_request_execution_seconds_sum", keys)
    waited = _grown(before, after, "apiserver_flowcontrol_request_wait_duration_seconds_sum", keys)
    nominal = {
        labels.get("priority_level", ""): value
        for labels, value in after.get("apiserver_flowcontrol_nominal_limit_seats", [])
    }
    out: dict[str, dict[str, float]] = {}
    for key, count in dispatched.items():
        level = key.split(" ")[0]
        if level == "exempt" or not count:
            continue
        out[key] = {
            "requests": int(count),
            "mean_seats": round(executing.get(key, 0.0) / seconds, 2) if seconds else 0.0,
            "mean_wait_ms": round(1000 * waited.get(key, 0.0) / count, 2),
            "nominal_seats": nominal.get(level, 0.0),
        }
    return out


if __name__ == "__main__":
    main()
