"""``make e2e``: the install path end to end, as a user runs it. The real control plane (``make cluster-bin``)
with a real node beside the sandbox's KWOK nodes (:mod:`~queue_processor_sandbox.real_node`), the controller's
image (``make image``) imported into that node, ``helm install`` of the chart with its pod placed there, a Spot
storm of the KWOK nodes drained by the pod, ``helm uninstall`` (the kubelet's SIGTERM stops the controller), and
the sandbox's judgment: the last line printed is its JSON summary; exit status 0 only when the scenario ended
as expected (:func:`~queue_processor_sandbox.run.as_expected`), 1 otherwise, 2 when something could not be set
up. Everything it starts it stops; progress goes to standard error. Needs root (a kubelet) and Docker's
daemon running with the image loaded."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.control_plane import ControlPlane, default_bin_dir, running
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from queue_processor_sandbox.real_node import RealNode, RealNodeError
from queue_processor_sandbox.release import AWS_SERVICE, NODE_LABEL, HelmError, Release, json_lines, wait_for
from queue_processor_sandbox.run import as_expected, judge, settle

__all__ = ["main"]


def say(text: str) -> None:
    """A progress line on standard error (standard output carries the summary only)."""
    print(f"e2e: {text}", file=sys.stderr, flush=True)


async def storm(plane: ControlPlane, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The run (module docstring) on ``plane``; the summary."""
    options = SandboxOptions(
        nodes=args.nodes, scale=args.scale, cluster=ClusterSpec(apps=4, pdb_max_unavailable=1)
    )
    with Sandbox(options, workdir=workdir / "sandbox", kubernetes="real", plane=plane) as sandbox:
        moto_port = int(sandbox.env()["AWS_ENDPOINT"].rsplit(":", 1)[1])
        label = uuid.uuid4().hex[:6]
        say("starting a real node (containerd, kubelet) and importing the image")
        node = RealNode(
            plane,
            f"e2e-{label}",
            workdir / "node",
            labels={NODE_LABEL: label},
            images=(args.image,),
            forwards={AWS_SERVICE: moto_port},
        )
        with node:
            release = Release(sandbox, node, args.image, args.helm, args.chart, workdir / "release")
            say(f"helm install {release.name} {args.chart}")
            release.apply()
            await wait_for("the controller's pod Ready", release.ready, 180)
            log = release.open_log()
            nodes = [instance.private_dns_name for instance in sandbox.instances]
            started = time.monotonic()
            published = sandbox.publish("spot-storm")
            say(f"spot-storm of {len(nodes)} KWOK nodes published")
            await settle(sandbox, nodes, started, args.timeout)
            verdict = judge(sandbox, nodes, started)
            say("helm uninstall: the kubelet stops the controller")
            release.uninstall()
            await wait_for("the controller's pod gone", lambda: not release.pods(), 120)
            stopped = [line for line in json_lines(log) if line.get("event") == "stopped"]
            log.close()
    last = stopped[-1] if stopped else {}
    return {
        "scenario": "spot-storm",
        "kubernetes": plane.request("GET", "/version")["gitVersion"],
        "image": args.image,
        "nodes": len(nodes),
        "published": published,
        **verdict,
        "stopped": bool(stopped),
        "heartbeat_tasks_left": last.get("heartbeats_left", -1),
        "operation_tasks_left": last.get("operations_left", -1),
        "tasks_left": last.get("tasks_left", -1),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m queue_processor_sandbox.e2e [--image TAG] [--chart DIR] ...``: the exit status."""
    parser = argparse.ArgumentParser(prog="e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--image", default="queue-processor:dev", help="the image's tag (make image builds it)"
    )
    parser.add_argument(
        "--chart", type=Path, default=Path("charts/queue-processor"), help="the chart's directory"
    )
    parser.add_argument(
        "--helm", type=Path, default=None, help="helm (default: the one make cluster-bin built)"
    )
    parser.add_argument("--nodes", type=int, default=10, help="KWOK nodes interrupted by the storm")
    parser.add_argument(
        "--scale", type=float, default=0.1, help="real seconds per simulated one (Spot: 120 s)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds the storm may take to settle")
    args = parser.parse_args(argv)
    args.helm = args.helm or Path(os.environ.get("QP_CLUSTER_BIN") or default_bin_dir()) / "helm"
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="qp-e2e-") as workdir:
            say("starting the real control plane")
            with running() as plane:
                summary = asyncio.run(storm(plane, args, Path(workdir)))
    except (RealNodeError, HelmError, TimeoutError, OSError) as exc:
        say(f"could not run: {exc}")
        return 2
    summary["seconds"] = round(time.monotonic() - began, 1)
    ok = as_expected(summary) and summary["stopped"] and summary["tasks_left"] == 0
    print(json.dumps(summary, sort_keys=True), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
