"""A fleet-wide rebalance in one labelled group: N rebalance recommendations at once, with
DRAIN_BUDGET_NON_URGENT a percentage of a group that DRAIN_BUDGET_GROUP_LABEL names (issue 47, defect 6).

Every node of the sandbox carries the same ``node.kubernetes.io/instance-type``, the group label here: one
group of N nodes and ``--spare`` more (not interrupted: the evicted pods' replacements run there), of which
``--percent`` drain at a time while the others wait their turn, cordoned. Each drain
that leaves time needs its group's size. The controller runs as its own process (``queue-processor run``).

Measured in the same run:

- ``seconds_total``: from publishing the N recommendations (and ``--launches`` launch actions) to every
  message settled; ``rebalance_seconds`` until the recommendations' alone (checked every second);
- ``node_requests_per_node``: the controller's ``get nodes`` and ``list nodes`` per node (the group's size read
  with a LIST per drain cost O(N²) transfer: a 1,000-node LIST is about 13 MiB of JSON);
- ``peak_rss_mib``: the controller's peak resident memory (VmHWM);
- ``probe_latency_s``: how long the controller's ``/healthz`` took to answer, polled every 0.1 s through the
  storm (its probe server runs on the event loop: a loop busy parsing a large body answers late), as p50, p99
  and max.

Usage: ``python benchmarks/rebalance_group.py [--nodes 1000] [--spare 250] [--percent 10%] [--scale 1.0]
[--set NAME=VALUE ...]``; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from queue_processor_sandbox.processes import QueueProcessor, peak_rss_mib, scrape, total

LABEL = "node.kubernetes.io/instance-type"
REBALANCE = "rebalance-recommendation"


def main() -> None:
    """Run the rebalance once and print its figures; the last line is the JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000, help="nodes, each with a rebalance recommendation")
    ap.add_argument(
        "--spare", type=int, default=None, help="nodes without one (default nodes / 4): they take the pods"
    )
    ap.add_argument("--percent", default="10%", help="DRAIN_BUDGET_NON_URGENT (default 10%%)")
    ap.add_argument(
        "--launches",
        type=int,
        default=0,
        help="instances launched (through their launch hook) with the recommendations, as Capacity Rebalancing "
        "does: their launch actions wait for their nodes meanwhile (default 0)",
    )
    ap.add_argument("--scale", type=float, default=1.0, help="real seconds per simulated second")
    ap.add_argument("--qps", type=float, default=200.0, help="KUBE_API_QPS of the controller (default 200)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting (or variable) of the controller",
    )
    args = ap.parse_args()
    spare = args.spare if args.spare is not None else max(1, args.nodes // 4)
    options = SandboxOptions(
        nodes=args.nodes + spare,
        asgs=max(1, (args.nodes + spare) // 250),
        scale=args.scale,
        cluster=ClusterSpec(
            apps=2, pdb_max_unavailable="50%", empty_dir_pods=0, unreplicated_pods=0, grace_s=1
        ),
    )
    with tempfile.TemporaryDirectory() as workdir, Sandbox(options, workdir=Path(workdir)) as sandbox:
        print(f"sandbox: {len(sandbox.instances)} nodes, {len(sandbox.kube.objects('pods'))} pods")
        sandbox.aws.warm_descriptions([instance.instance_id for instance in sandbox.instances])
        sandbox.kube.ensure_namespace(sandbox.controller_namespace)
        for instance in sandbox.instances[: args.nodes]:
            sandbox.aws.rebalance_recommendation(instance.instance_id)
        groups = sorted({instance.asg_name for instance in sandbox.instances if instance.asg_name})
        for index in range(args.launches):
            sandbox.aws.launch_instances(groups[index % len(groups)])
        before = dict(sandbox.kube.requests)
        started = time.perf_counter()
        controller = QueueProcessor(
            sandbox,
            Path(workdir) / "controller.log",
            POD_NAME="rebalance",
            POD_NAMESPACE=sandbox.controller_namespace,
            KUBE_API_QPS=str(args.qps),
            KUBE_API_BURST=str(int(args.qps * 1.5)),
            LOG_LEVEL="warning",
            DRAIN_BUDGET_NON_URGENT=args.percent,
            DRAIN_BUDGET_GROUP_LABEL=LABEL,
            NODE_TERMINATION_GRACE_PERIOD="600",
            **dict(setting.split("=", 1) for setting in args.set),
        )
        latencies: list[float] = []
        rebalanced: float | None = None
        try:
            deadline = started + 1800
            while time.perf_counter() < deadline:
                asked = time.perf_counter()
                try:
                    status, _ = controller.get("/healthz")
                except OSError:
                    status = 0
                if status == 200:
                    latencies.append(time.perf_counter() - asked)
                time.sleep(0.1)
                if len(latencies) % 10 == 0 and latencies:
                    scraped = scrape(controller.metrics_port, names=("queue_processor_messages_deleted",))
                    deleted = "queue_processor_messages_deleted_total"
                    if rebalanced is None and total(scraped, deleted, kind=REBALANCE) >= args.nodes:
                        rebalanced = time.perf_counter() - started
                    if total(scraped, deleted) >= args.nodes + args.launches:
                        break
            seconds = time.perf_counter() - started
            rss = peak_rss_mib(controller.process.pid)
        finally:
            controller.stop(15, 60)
        grown = {
            kind: count - before.get(kind, 0)
            for kind, count in sorted(sandbox.kube.requests.items())
            if count > before.get(kind, 0)
        }
        ordered = sorted(latencies)
        figures = {
            "nodes": args.nodes,
            "launches": args.launches,
            "percent": args.percent,
            "seconds_total": round(seconds, 1),
            "rebalance_seconds": round(rebalanced, 1) if rebalanced is not None else None,
            "node_requests_per_node": {
                kind: round(grown.get(kind, 0) / args.nodes, 2) for kind in ("get nodes", "list nodes")
            },
            "kube_requests_per_node": round(sum(grown.values()) / args.nodes, 2),
            "peak_rss_mib": rss,
            "probe_latency_s": {
                "p50": round(statistics.median(ordered), 4) if ordered else None,
                "p99": round(ordered[int(0.99 * (len(ordered) - 1))], 4) if ordered else None,
                "max": round(ordered[-1], 4) if ordered else None,
                "samples": len(ordered),
            },
            "evictions": len(sandbox.kube.evictions),
        }
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
