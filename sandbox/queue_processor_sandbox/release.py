"""The chart installed as users install it: a real Helm (``make cluster-bin`` builds it, pinned in
tools/cluster/helm/go.mod) runs ``helm install`` and ``helm upgrade`` of ``charts/queue-processor`` on the real
control plane, with values that point the controller's pod at a sandbox (its queue, and its AWS through an
address a :class:`~queue_processor_sandbox.real_node.RealNode` forwards to loopback) and place it on a real
node. What ``make e2e`` (:mod:`queue_processor_sandbox.e2e`) and ``tests/image`` share."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from queue_processor_sandbox.environment import Sandbox
from queue_processor_sandbox.real_node import RealNode

__all__ = [
    "AWS_SERVICE",
    "NODE_LABEL",
    "Helm",
    "HelmError",
    "Release",
    "chart_values",
    "is_ready",
    "json_lines",
    "wait_for",
]

T = TypeVar("T")

#: Where a real node forwards the sandbox's AWS endpoint (a free address of the service range, port).
AWS_SERVICE = ("10.96.0.10", 80)
#: The label that places the controller's pod on the real node (the chart's ``nodeSelector``).
NODE_LABEL = "queue-processor.test/real-node"


class HelmError(RuntimeError):
    """A ``helm`` command failed: its arguments, output and error output."""


class Helm:
    """``helm`` (``binary``) with its cache, configuration and data under ``home``, and a kubeconfig."""

    def __init__(self, binary: Path, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            **{f"HELM_{what}_HOME": str(home / what.lower()) for what in ("CACHE", "CONFIG", "DATA")},
            **({"KUBECONFIG": str(kubeconfig)} if kubeconfig else {}),
        }

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``helm args...`` (at most 600 s); raises :class:`HelmError` with its output when it fails and
        ``check``."""
        done = subprocess.run(
            [str(self.binary), *args], env=self.env, capture_output=True, text=True, check=False, timeout=600
        )
        if check and done.returncode != 0:
            raise HelmError(f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}")
        return done


def chart_values(sandbox: Sandbox, node: RealNode, image: str) -> dict[str, Any]:
    """The chart's values for ``sandbox``: its queue and AWS (fake credentials as ``extraEnv``, as a user
    without IRSA would set them), ``image`` (``repository:tag``, imported into ``node``, never pulled), the pod
    on ``node`` (its :data:`NODE_LABEL`), JSON logs, and the controller's waits sized for a test."""
    env = sandbox.env()
    repository, tag = image.rsplit(":", 1)
    return {
        "queueURL": env["QUEUE_URL"],
        "awsRegion": env["AWS_REGION"],
        "awsEndpoint": f"http://{AWS_SERVICE[0]}:{AWS_SERVICE[1]}",
        "extraEnv": [
            {"name": "AWS_ACCESS_KEY_ID", "value": env["AWS_ACCESS_KEY_ID"]},
            {"name": "AWS_SECRET_ACCESS_KEY", "value": env["AWS_SECRET_ACCESS_KEY"]},
        ],
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "nodeSelector": {NODE_LABEL: node.labels[NODE_LABEL]},
        "jsonLogging": True,
        "sqsMsgVisibilityTimeoutSec": 10,
        "receiveWaitTimeSec": 2,
        "shutdownTimeoutSec": 10,
        "requeueBackoffBaseSec": 1,
    }


class Release:
    """The chart (``chart``, a directory) installed by Helm (``helm_bin``) as release and namespace
    ``qp-<random>``, its pod on ``node``; Helm's files under ``workdir``."""

    def __init__(
        self, sandbox: Sandbox, node: RealNode, image: str, helm_bin: Path, chart: Path, workdir: Path
    ) -> None:
        self.sandbox, self.node, self.chart, self.workdir = sandbox, node, chart, workdir
        self.name = self.namespace = f"qp-{uuid.uuid4().hex[:6]}"
        self.helm = Helm(helm_bin, workdir / "helm", node.plane.admin_kubeconfig)
        self.values = chart_values(sandbox, node, image)
        self.revision = 0

    def apply(self, **changes: Any) -> None:
        """``helm install --wait`` (the first time) or ``helm upgrade --wait`` with the values changed by
        ``changes``. Raises :class:`HelmError`."""
        self.values.update(changes)
        if self.revision == 0:  # a namespace of the sandbox's run: its requests and evictions are judged
            self.sandbox.kube.ensure_namespace(self.namespace)
        self.revision += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / f"values-{self.revision}.yaml"
        path.write_text(json.dumps(self.values))  # JSON is YAML
        verb = ["install", "--create-namespace"] if self.revision == 1 else ["upgrade"]
        self.helm(*verb, self.name, str(self.chart), "-n", self.namespace, "-f", str(path), "--wait")

    def uninstall(self) -> None:
        """``helm uninstall --wait``. Raises :class:`HelmError`."""
        self.helm("uninstall", self.name, "-n", self.namespace, "--wait")

    def pods(self) -> list[dict[str, Any]]:
        """The release's pods, as the API server has them now."""
        return list(self.node.plane.request("GET", f"/api/v1/namespaces/{self.namespace}/pods")["items"])

    def ready(self, count: int = 1) -> list[dict[str, Any]] | None:
        """The release's pods once exactly ``count`` exist and all are Ready (an old one still terminating
        counts), else ``None``."""
        pods = self.pods()
        ready = [pod for pod in pods if is_ready(pod)]
        return ready if len(pods) == len(ready) == count else None

    def open_log(self) -> IO[str]:
        """The log file of the controller's container on the node, opened: what it holds stays readable after
        the kubelet removes it with the pod. Raises ``ValueError`` unless exactly one is there."""
        (path,) = self.node.pod_logs.glob(f"{self.namespace}_*/queue-processor/0.log")
        return path.open(errors="replace")


def is_ready(pod: dict[str, Any]) -> bool:
    """Whether the kubelet reports ``pod`` Ready."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def json_lines(log: IO[str]) -> list[dict[str, Any]]:
    """The lines of a container log in the CRI format (``<time> <stream> <tag> <line>``), each parsed as JSON
    (a line that is not JSON becomes ``{"event": line, "raw": True}``)."""
    lines: list[dict[str, Any]] = []
    for raw in log.read().splitlines():
        text = raw.split(" ", 3)[-1]
        try:
            lines.append(json.loads(text))
        except ValueError:
            lines.append({"event": text, "raw": True})
    return lines


async def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = 180.0) -> T:
    """Poll ``check()`` every 0.5 s until it returns something true, and return that; raises ``TimeoutError``
    naming ``what`` after ``timeout_s`` seconds (a bound generous for a loaded machine: pods, kubelets)."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {timeout_s:.0f} s")
        await asyncio.sleep(0.5)
    return found
