"""A Spot storm: N nodes interrupted at once, the controller running as its own process against the sandbox.

Cluster: ``--nodes`` nodes that get a Spot interruption warning, plus ``--spare`` nodes that do not (a storm
hits a capacity pool, not the whole cluster; the spares take the evicted pods), 10 pods per node from 10
ReplicaSets with PodDisruptionBudgets (maxUnavailable ``--pdb``), a DaemonSet and a mirror pod per node. The
controller is ``queue-processor run`` in a subprocess (its own memory, its own event loop), configured by the
sandbox's env file; time runs at ``--scale`` (a 120 s notice lasts 120 x scale seconds).

Measured in the same run:

- ``floor_seconds``: receive + delete of N messages from the same moto queue, with no processing;
- ``seconds_total``: from publishing the N warnings to every message settled (queue empty);
- ``p99_receive_to_cordon_s``: 99th percentile of receive → cordon, from the controller's
  ``queue_processor_event_to_cordon_seconds`` histogram (interpolated inside its bucket, as PromQL's
  ``histogram_quantile``);
- ``all_drained_within_notice``: every node's drain completed before its notice ended (the controller only
  counts a drain as a success when it does);
- ``kube_requests_per_node``: Kubernetes API requests the controller made, per interrupted node, and
  ``kube_requests_per_node_by_kind`` the same by ``"<verb> <resource>"`` (a watch counts once, when it opens);
- ``peak_rss_mib``: the controller process's peak resident memory (VmHWM);
- ``tasks_left``: operation tasks alive when the queue is empty.

With ``--kubernetes real`` the cluster is on a real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK; ``make cluster-bin``) and the controller runs as a ServiceAccount with only its RBAC rules;
the JSON then carries ``kubernetes: "real"`` and the API server's own view of the storm from its ``/metrics``:
``apiserver_requests`` (apiserver_request_total by verb and code, every client), ``apf_rejected`` (requests
API Priority and Fairness rejected with 429, by priority level and reason) and ``controller_requests_by_code``
(the controller's own requests by HTTP status, from the audit log); ``slowest_pod_termination_s`` is the longest
pod grace period (real seconds) and ``goal_seconds`` 1.1 x max(the client QPS floor, that).

Last line: one JSON object with those figures and ``ratio_to_floor``. Goals (issue 6): ratio_to_floor ≤ 1.2,
p99 receive→cordon ≤ 1 s, all drained within the notice, ≤ 2 x pods + 10 requests per node, RSS ≤ 150 MiB,
0 tasks left.

Usage: ``python benchmarks/storm.py [--nodes 1000] [--spare 250] [--scale 1.0] [--qps 200] [--pdb 30%]
[--kubernetes emulated|real]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from queue_processor_sandbox.processes import parse_metrics, peak_rss_mib, scrape, total


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
    ordered = sorted(((float(labels["le"]), count) for labels, count in buckets), key=lambda pair: pair[0])
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


def _wait_ready(port: int, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Until the controller answers /readyz (it has received from SQS and reached the API server)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"controller exited with {process.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("controller not ready in time")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    """Run the storm and print its figures; the last line is the JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000, help="interrupted nodes (default 1000)")
    ap.add_argument("--spare", type=int, default=None, help="nodes not interrupted (default nodes / 4)")
    ap.add_argument(
        "--scale", type=float, default=1.0, help="real seconds per simulated second (default 1.0)"
    )
    ap.add_argument("--qps", type=float, default=200.0, help="KUBE_API_QPS for the controller (default 200)")
    ap.add_argument("--log", type=Path, default=None, help="keep the controller's log (info level) here")
    ap.add_argument("--timeline", action="store_true", help="print cordoned/evicted/deleted over time")
    ap.add_argument("--pdb", default="30%", help="maxUnavailable of every PodDisruptionBudget (default 30%%)")
    ap.add_argument(
        "--kubernetes",
        choices=["emulated", "real"],
        default="emulated",
        help="the sandbox's API emulation (default) or a real control plane (make cluster-bin)",
    )
    args = ap.parse_args()
    spare = args.spare if args.spare is not None else max(1, args.nodes // 4)
    options = SandboxOptions(
        nodes=args.nodes + spare,
        asgs=max(1, (args.nodes + spare) // 250),
        scale=args.scale,
        cluster=ClusterSpec(apps=10, pdb_max_unavailable=args.pdb, empty_dir_pods=0, unreplicated_pods=0),
    )
    plane = None
    if args.kubernetes == "real":
        from queue_processor_sandbox.control_plane import ControlPlane

        # Thousands of nodes: KWOK renews each node's Lease every 150 s instead of every 10 s; the control
        # plane's own controllers get the API rate they need to create and bind the pods in minutes.
        plane = ControlPlane(node_lease_s=600, client_qps=500, start_timeout_s=180).start()
    built_at = time.perf_counter()
    with (
        tempfile.TemporaryDirectory() as workdir,
        Sandbox(options, workdir=Path(workdir), kubernetes=args.kubernetes, plane=plane) as sandbox,
    ):
        print(
            f"sandbox ({args.kubernetes}): {len(sandbox.instances)} nodes, {len(sandbox.kube.objects('pods'))} pods"
            f", built in {time.perf_counter() - built_at:.0f} s"
        )
        floor = floor_seconds(sandbox, args.nodes)
        print(f"floor: receive+delete {args.nodes} messages in {floor:.2f} s")
        port = _free_port()
        env = {
            **os.environ,
            **sandbox.env(),
            "PROMETHEUS_SERVER_PORT": str(port),
            "PROBES_SERVER_PORT": str(port),
            "KUBE_API_QPS": str(args.qps),
            "KUBE_API_BURST": str(int(args.qps * 1.5)),
            "JSON_LOGGING": "true",
            "LOG_LEVEL": "info" if args.log else "warning",
        }
        # The storm is in the queue before the controller starts (the issue: "N Spot warnings in the
        # queue"); each notice runs from its publication, so the time they wait counts against the drains.
        published_at = time.perf_counter()
        targets = sandbox.instances[: args.nodes]
        for instance in targets:
            sandbox.aws.spot_interruption(instance.instance_id)
        published = time.perf_counter() - published_at
        kube_before = sum(sandbox.kube.requests.values())
        kinds_before = dict(sandbox.kube.requests)
        apiserver_before = parse_metrics(plane.metrics()) if plane is not None else {}
        log = open(Path(workdir) / "controller.log", "w")  # noqa: SIM115 - closed below
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "queue_processor.cli", "run"], env=env, stdout=log, stderr=log
        )
        try:
            _wait_ready(port, process)
            ready = time.perf_counter() - started
            timeline: list[str] = []
            deadline = started + 120 * args.scale * 5 + 60
            while time.perf_counter() < deadline:
                time.sleep(0.25)
                scraped = scrape(port)
                # Spot warnings only: when a notice ends the instance is terminated and the state changes
                # that follow are more messages, handled too, but not part of the storm being timed.
                deleted = sum(
                    value
                    for labels, value in scraped.get("queue_processor_messages_deleted_total", [])
                    if labels.get("kind") == "spot-interruption"
                )
                received = total(scraped, "queue_processor_messages_received_total")
                cordoned = sandbox.kube.count("nodes", lambda node: bool(node["spec"].get("unschedulable")))
                timeline.append(
                    f"{time.perf_counter() - started:6.1f}s cordoned={cordoned} "
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
                    f"published {args.nodes} warnings in {published:.2f} s; controller ready after {ready:.2f} s"
                )
                print("\n".join(timeline[:: max(1, len(timeline) // 40)]))
            kube_requests = sum(sandbox.kube.requests.values()) - kube_before
            by_kind = {
                kind: round((count - kinds_before.get(kind, 0)) / args.nodes, 2)
                for kind, count in sorted(sandbox.kube.requests.items())
                if count > kinds_before.get(kind, 0)
            }
            apiserver_after = parse_metrics(plane.metrics()) if plane is not None else {}
            # The messages that followed (state changes of terminated instances) settle too: then count what
            # is left (tasks, messages), up to 60 s.
            settle_until = time.perf_counter() + 60
            while time.perf_counter() < settle_until and (
                sandbox.queue_counts().left or total(scrape(port), "queue_processor_in_flight_operations")
            ):
                time.sleep(1.0)
            metrics = scrape(port)
            drained = sum(
                value
                for labels, value in metrics.get("actions_total", [])
                if labels.get("node_action") == "cordon-and-drain" and labels.get("node_status") == "success"
            )
            in_flight = sum(value for _, value in metrics.get("queue_processor_in_flight_operations", []))
            figures: dict[str, Any] = {
                "nodes": args.nodes,
                "seconds_total": round(seconds, 2),
                "floor_seconds": round(floor, 2),
                "ratio_to_floor": round(seconds / floor, 2) if floor else None,
                "p99_receive_to_cordon_s": _p99(
                    metrics.get("queue_processor_event_to_cordon_seconds_bucket", [])
                ),
                "all_drained_within_notice": drained >= args.nodes,
                "drained": int(drained),
                "kube_requests_per_node": round(kube_requests / args.nodes, 1),
                "kube_requests_per_node_by_kind": by_kind,
                "peak_rss_mib": peak_rss_mib(process.pid),
                "tasks_left": int(in_flight),
                "messages_left": sandbox.queue_counts().left,
                "publish_seconds": round(published, 2),
                "startup_seconds": round(ready, 2),
                "qps_floor_seconds": round(kube_requests / args.qps, 2),
                "evictions": len(sandbox.kube.evictions),
                "scale": args.scale,
                "kubernetes": args.kubernetes,
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
            figures["goal_seconds"] = round(1.1 * max(kube_requests / args.qps, slowest), 2)
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
                by_code: dict[str, int] = {}
                for (_what, code), count in sandbox.kube.requests_by(  # type: ignore[attr-defined]
                    sandbox.controller_username
                ).items():
                    by_code[str(code)] = by_code.get(str(code), 0) + count
                figures["controller_requests_by_code"] = by_code
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
            log.close()
            if args.log:
                args.log.write_text((Path(workdir) / "controller.log").read_text())
    if plane is not None:
        plane.stop()
    print(json.dumps(figures))


def _delta(
    before: dict[str, list[tuple[dict[str, str], float]]],
    after: dict[str, list[tuple[dict[str, str], float]]],
    name: str,
    keys: tuple[str, ...],
) -> dict[str, int]:
    """How much a counter grew between two scrapes, summed by the given labels (joined with a space)."""
    totals: dict[str, float] = {}
    for sign, samples in ((-1, before.get(name, [])), (1, after.get(name, []))):
        for labels, value in samples:
            key = " ".join(labels.get(k, "") for k in keys)
            totals[key] = totals.get(key, 0.0) + sign * value
    return {key: int(value) for key, value in sorted(totals.items()) if value}


if __name__ == "__main__":
    main()
