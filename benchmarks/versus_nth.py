"""queue-processor and aws-node-termination-handler (NTH) v1.25.6 on the same workloads, in one run.

Each (workload, system) pair runs on a fresh sandbox of one shared real control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, KWOK; ``make cluster-bin`` builds them and NTH), with the same
input: ``benchmarks/sidebyside.py`` defines the workloads and what is measured. Each run waits for
the namespaces of the run before it to finish terminating, so that none shares the machine with the deletion
of another's pods. Systems: ``nth``
(its chart's defaults: WORKERS=10, no heartbeats), ``nth_tuned`` (WORKERS raised to the workload's node
count, HEARTBEAT_INTERVAL=30 where lifecycle hooks are involved; its client QPS/burst cannot be raised in
v1.25.6) and ``queue_processor`` (its defaults).

Figures per system: ``p50_cordon_s``/``p99_cordon_s`` (message sent → node unschedulable, sampled every
0.25 s), ``all_drained_s``, ``drains_inside_notice_fraction`` (Spot notices), ``lifecycle_completed``,
``lifecycle_timed_out``, ``heartbeats_after_end``, ``nodes_drained_twice``, ``daemonset_pods_evicted``,
``mirror_pods_evicted``, ``kept_nodes_cordoned``, ``messages_left``, ``dlq``, ``kube_requests_per_node``
(the API server's audit log, by the system's ServiceAccount; per node of the workload) and
``kube_requests_per_drained_node`` (the same requests per node it drained), ``peak_rss_mib`` (VmHWM). ``ratio`` is NTH's
figure divided by queue-processor's, for the numeric figures where both are non-zero.

Prints a table per workload; writes a PNG (``--png``) with nodes cordoned (dashed) and drained (solid) over
time, one colour per system, the Spot notice's end marked; the last line is the JSON
``{"<workload>": {"nth": {...}, "nth_tuned": {...}, "queue_processor": {...}, "ratio": {...}}, ...}``.

Usage: ``python benchmarks/versus_nth.py [--workloads spot-storm,asg-scale-in,drain-fails,apiserver-cache,warm-pool]
[--systems nth,nth_tuned,queue_processor] [--storm-nodes 200] [--png docs/versus_nth.png]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from queue_processor_sandbox.control_plane import ControlPlane
from sidebyside import (
    QUIET_BOUND_S,
    SPOT_NOTICE_S,
    SYSTEMS,
    WORKLOADS,
    Figures,
    Workload,
    run_workload,
    spot_storm,
)

#: Figures whose ratio (NTH / queue-processor) is printed.
RATIO_KEYS = ("p50_cordon_s", "p99_cordon_s", "all_drained_s", "kube_requests_per_node", "peak_rss_mib")


def workloads(names: list[str], storm_nodes: int) -> list[Workload]:
    """The workloads asked for, at this machine's sizes."""
    built = {**WORKLOADS, "spot-storm": lambda: spot_storm(storm_nodes)}
    unknown = [name for name in names if name not in built]
    if unknown:
        raise SystemExit(f"unknown workload(s) {', '.join(unknown)}: one of {', '.join(built)}")
    return [built[name]() for name in names]


def ratios(nth: dict[str, Any], ours: dict[str, Any]) -> dict[str, float]:
    """NTH's figure / queue-processor's, where both are non-zero numbers."""
    out = {}
    for key in RATIO_KEYS:
        a, b = nth.get(key), ours.get(key)
        if isinstance(a, int | float) and isinstance(b, int | float) and a and b:
            out[key] = round(a / b, 2)
    return out


def table(name: str, describe: str, results: dict[str, Figures]) -> str:
    """A plain-text table: one row per figure, one column per system."""
    systems = list(results)
    keys = list(next(iter(results.values())).values)
    width = max(len(key) for key in keys)
    lines = [f"{name}: {describe}", f"{'':{width}}  " + "  ".join(f"{s:>15}" for s in systems)]
    for key in keys:
        cells = [results[s].values.get(key) for s in systems]
        lines.append(f"{key:{width}}  " + "  ".join(f"{'-' if c is None else c!s:>15}" for c in cells))
    return "\n".join(lines)


def picture(path: Path, runs: dict[str, tuple[Workload, dict[str, Figures]]]) -> None:
    """Nodes cordoned (dashed) and drained (solid) over time for each workload that drains nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [(name, w, r) for name, (w, r) in runs.items() if any(f.values.get("nodes") for f in r.values())]
    if not drawn:
        return
    figure, axes = plt.subplots(len(drawn), 1, figsize=(8, 3.2 * len(drawn)), squeeze=False)
    colours = {"nth": "tab:red", "nth_tuned": "tab:orange", "queue_processor": "tab:blue"}
    for (name, workload, results), axis in zip(drawn, axes[:, 0], strict=True):
        for system, figures in results.items():
            seconds = [t for t, _, _ in figures.timeline]
            axis.plot(seconds, [c for _, c, _ in figures.timeline], "--", color=colours[system], alpha=0.6)
            axis.plot(seconds, [d for _, _, d in figures.timeline], "-", color=colours[system], label=system)
        if workload.name in ("spot-storm", "apiserver-cache"):
            end = SPOT_NOTICE_S * workload.options.scale
            axis.axvline(end, color="black", linewidth=1)
            top = max((f.timeline[-1][1] for f in results.values() if f.timeline), default=0)
            axis.annotate(
                "Spot notice ends", (end, top), textcoords="offset points", xytext=(-4, -12), ha="right"
            )
        axis.set_title(textwrap.fill(f"{name}: {workload.describe}", 100), fontsize=9)
        axis.set_xlabel("seconds since the messages were sent")
        axis.set_ylabel("nodes (dashed: cordoned, solid: drained)", fontsize=8)
        axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    """Run every (workload, system) pair; print the tables and the JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="spot-storm,asg-scale-in,drain-fails,apiserver-cache,warm-pool")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--storm-nodes", type=int, default=200, help="Spot warnings in spot-storm (default 200)")
    ap.add_argument("--png", type=Path, default=Path("versus_nth.png"), help="where the picture goes")
    args = ap.parse_args()
    systems = args.systems.split(",")
    chosen = workloads(args.workloads.split(","), args.storm_nodes)
    plane = ControlPlane(node_lease_s=600, client_qps=500, start_timeout_s=180).start()
    summary: dict[str, Any] = {}
    runs: dict[str, tuple[Workload, dict[str, Figures]]] = {}
    try:
        with tempfile.TemporaryDirectory() as workdir:
            for workload in chosen:
                results = {}
                for system in systems:
                    print(f"{workload.name}: {system}...", file=sys.stderr, flush=True)
                    results[system] = run_workload(
                        system,
                        workload,
                        plane=plane,
                        workdir=Path(workdir) / workload.name / system,
                        quiet_timeout_s=QUIET_BOUND_S,
                    )
                runs[workload.name] = (workload, results)
                print(table(workload.name, workload.describe, results), flush=True)
                entry: dict[str, Any] = {system: figures.values for system, figures in results.items()}
                if "nth" in results and "queue_processor" in results:
                    entry["ratio"] = ratios(results["nth"].values, results["queue_processor"].values)
                summary[workload.name] = entry
    finally:
        plane.stop()
    picture(args.png, runs)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
