"""Sandbox start-up: how long a 20-node sandbox takes to start, and a 1,000-node x 10-pod cluster to build.

Prints one line per measure, then one JSON line:
``{"start_20_nodes_s": ..., "build_1000_nodes_s": ..., "pods_1000_nodes": ..., "evict_100_s": ...}``.
Goal (issue 5): a 20-node sandbox starts in under 5 s; a 1,000-node x 10-pod cluster is buildable.

Usage: ``python benchmarks/sandbox.py``
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from kubernetes import client, config

from queue_processor_sandbox.environment import Sandbox, SandboxOptions


def main() -> None:
    """Measure and print."""
    figures: dict[str, float | int] = {}
    with tempfile.TemporaryDirectory() as workdir:
        started = time.perf_counter()
        with Sandbox(SandboxOptions(nodes=20, scale=0.01), workdir=Path(workdir) / "small"):
            figures["start_20_nodes_s"] = round(time.perf_counter() - started, 2)
        print(f"20-node sandbox started in {figures['start_20_nodes_s']} s")
        started = time.perf_counter()
        with Sandbox(SandboxOptions(nodes=1000, asgs=4, scale=0.01), workdir=Path(workdir) / "big") as big:
            figures["build_1000_nodes_s"] = round(time.perf_counter() - started, 2)
            figures["pods_1000_nodes"] = len(big.kube.objects("pods"))
            print(
                f"1,000-node sandbox with {figures['pods_1000_nodes']} pods built in {figures['build_1000_nodes_s']} s"
            )
            v1 = client.CoreV1Api(config.new_client_from_config(str(big.kubeconfig_path)))
            started = time.perf_counter()
            for index in range(100):
                name = f"app-{index % 10:03d}-{index // 10:05d}"
                body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace="apps"))
                try:
                    v1.create_namespaced_pod_eviction(name, "apps", body)
                except client.ApiException as refused:
                    if refused.status != 429:
                        raise
            figures["evict_100_s"] = round(time.perf_counter() - started, 2)
            print(f"100 evictions through the kubernetes client in {figures['evict_100_s']} s")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
