"""Drain order and deadline-aware grace, measured: the ``spot-critical`` and ``spot-storm`` scenarios run with
each combination of DRAIN_ORDER (waves, all-at-once) and GRACE_DEADLINE_MARGIN (10 s, or -1: never cut, as
aws-node-termination-handler), on the same sandbox options, in one run.

For each run it prints one line with the scenario summary's drain figures: ``pods_finished_grace`` (evicted
pods that had all of their own grace period before the instance's end), ``pods_cut_short`` (given a grace period cut
to end before the instance), ``pods_deleted_at_deadline``, ``evicted``, ``drains``, ``drain_seconds_mean``, and
``pods_killed_mid_grace`` (evicted with their own grace period, which ended after the instance did). Then
one JSON line with every run. Time is scaled (``--scale``, real seconds per simulated second), so a 120 s
notice and a pod's 300 s grace period keep their proportions. ``spot-critical`` runs with DELETE_AT_DEADLINE
as the scenario does, and without it.

Usage: ``python benchmarks/drain_order.py [--scale 0.05] [--nodes 6] [--kubernetes emulated|real]``
(``real`` needs the control plane binaries: ``make cluster-bin``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from queue_processor_sandbox.run import run_scenario

RUNS: list[tuple[str, dict[str, Any]]] = [
    (scenario, {"drain_order": order, "grace_deadline_margin": margin, **extra})
    for scenario, extra in (
        ("spot-critical", {}),
        ("spot-critical", {"delete_at_deadline": False}),
        ("spot-storm", {}),
    )
    for order in ("waves", "all-at-once")
    for margin in ("scaled", -1)
]


async def one(
    scenario: str, settings: dict[str, Any], args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """One scenario run on a fresh sandbox; its summary with the settings."""
    options = SandboxOptions(nodes=args.nodes, scale=args.scale, cluster=ClusterSpec(apps=4))
    plane = None
    if args.kubernetes == "real":
        from queue_processor_sandbox.control_plane import ControlPlane

        plane = ControlPlane()
        plane.start()
    try:
        with Sandbox(
            options, workdir=workdir / "sandbox", kubernetes=args.kubernetes, plane=plane
        ) as sandbox:  # type: ignore[arg-type]
            os.environ.update(sandbox.env())
            overrides = dict(settings)
            if overrides["grace_deadline_margin"] == "scaled":
                overrides.pop("grace_deadline_margin")  # the scenario runner's: 10 s, scaled
            summary = await run_scenario(sandbox, scenario, timeout_s=300, overrides=overrides)
    finally:
        if plane is not None:
            plane.stop()
    return {"scenario": scenario, **settings, **summary}


def main() -> None:
    """Run every combination and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.05)
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--kubernetes", choices=["emulated", "real"], default="emulated")
    args = parser.parse_args()
    rows = []
    for index, (scenario, settings) in enumerate(RUNS):
        with tempfile.TemporaryDirectory() as workdir:
            row = asyncio.run(one(scenario, settings, args, Path(workdir) / str(index)))
        rows.append(row)
        shown = {
            key: row[key]
            for key in (
                "evicted",
                "pods_finished_grace",
                "pods_cut_short",
                "pods_deleted_at_deadline",
                "pods_killed_mid_grace",
                "drains",
                "drain_seconds_mean",
            )
        }
        print(scenario, json.dumps(settings), json.dumps(shown), flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
