"""The modules one Spot warning passes through (:func:`spot_path`): the controller runs in this process against
the emulated sandbox, a profile hook (``sys.setprofile``) on the event loop's thread records every call into a
module of ``queue_processor`` from the moment the warning is published until its message is deleted: the modules
in the order first entered and the calls from one module into another. Calls made in the Kubernetes client's
threads and by the background watches count only where the loop's thread enters them. Used by
``benchmarks/spot_path.py`` and ``tests/sandbox/test_spot_path.py``."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from queue_processor.app import Controller, run_controller
from queue_processor.cli import load_settings
from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions

PACKAGE = "queue_processor"


def _ours(module: str) -> bool:
    return module == PACKAGE or (
        module.startswith(PACKAGE + ".") and not module.startswith("queue_processor_")
    )


class PathTrace:
    """Modules of ``queue_processor`` entered, in first-entry order, and calls between two of them."""

    def __init__(self) -> None:
        self.modules: list[str] = []
        self.crossings: Counter[str] = Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = str(frame.f_globals.get("__name__", ""))
        if not _ours(module):
            return
        if module not in self.modules:
            self.modules.append(module)
        caller = str(frame.f_back.f_globals.get("__name__", "")) if frame.f_back is not None else ""
        if _ours(caller) and caller != module:
            self.crossings[f"{caller} -> {module}"] += 1

    def upward(self, layer_of: Callable[[str], int]) -> list[str]:
        """The crossings ``caller -> callee`` whose callee is in a higher layer than its caller (``layer_of``)."""
        return sorted(
            crossing
            for crossing in self.crossings
            if layer_of(crossing.split(" -> ")[0]) < layer_of(crossing.split(" -> ")[1])
        )


async def _until(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the Spot warning was not handled in time")
        await asyncio.sleep(0.05)


def _cordoned_or_gone(sandbox: Sandbox, node: str) -> bool:
    found = sandbox.kube.get("nodes", node)
    return found is None or bool((found.get("spec") or {}).get("unschedulable"))


async def trace(sandbox: Sandbox) -> PathTrace:
    """Start the controller, publish one Spot warning once it consumes, and trace until its message is gone."""
    settings = load_settings(prometheus_server_port=0, probes_server_port=0, receive_wait_time_sec=2)
    stop = asyncio.Event()
    started: list[Controller] = []
    task = asyncio.create_task(
        run_controller(
            settings, stop, kubeconfig=str(sandbox.kubeconfig_path), serve=False, started=started.append
        )
    )
    await _until(lambda: bool(started) or task.done())
    await asyncio.sleep(1.5)  # its watches open and its first polls out: the path, not the start-up
    path = PathTrace()
    instance = sandbox.instances[0]
    sys.setprofile(path)
    try:
        sandbox.aws.spot_interruption(instance.instance_id)
        await _until(lambda: _cordoned_or_gone(sandbox, instance.private_dns_name))
        counts = sandbox.queue_counts
        await _until(lambda: (counts().visible, counts().in_flight) == (0, 0) and bool(path.modules))
    finally:
        sys.setprofile(None)
        stop.set()
        await asyncio.wait_for(task, 30)
    return path


def spot_path() -> PathTrace:
    """Trace one Spot warning on a sandbox of six nodes (about 15 s). Sets the sandbox's environment variables."""
    options = SandboxOptions(nodes=6, scale=0.1, cluster=ClusterSpec(apps=4, pdb_max_unavailable=1))
    with (
        tempfile.TemporaryDirectory() as workdir,
        Sandbox(options, workdir=Path(workdir) / "sandbox") as sandbox,
    ):
        os.environ.update(sandbox.env())
        return asyncio.run(trace(sandbox))
