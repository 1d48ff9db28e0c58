"""What the chaos cases share: the controller as its own process (``queue-processor run``) pointed at a sandbox,
waits on what a user would watch (queue depth, cordons, lifecycle actions), and the verdict every case ends
with: the sandbox's judge (:func:`queue_processor_sandbox.run.judge`) finds nothing lost or done twice, and each
controller that exited left no task behind (its ``stopped`` log line)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from queue_processor.permissions import kubernetes_verbs
from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import Sandbox, SandboxOptions
from queue_processor_sandbox.processes import QueueProcessor
from queue_processor_sandbox.run import judge

SCRIPT = str(Path(sys.executable).parent / "queue-processor")
#: The judge's fields every case must end with at zero.
CLEAN = (
    "lifecycle_timed_out",
    "nodes_drained_twice",
    "daemonset_pods_evicted",
    "heartbeats_after_end",
    "messages_left",
    "evictions_denied",
)


#: Every controller process started, so that a case that fails half-way leaves none running (conftest.py).
STARTED: list[subprocess.Popen[bytes]] = []


def kill_leftovers() -> None:
    """SIGKILL every controller a case started and did not stop."""
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait()


class Controller(QueueProcessor):
    """``queue-processor run`` in its own process, pointed at the sandbox, logging JSON lines to ``log``
    (appended). ``extra`` settings override the defaults below (sized for a test: short waits)."""

    def __init__(self, sandbox: Sandbox, log: Path, **extra: str) -> None:
        defaults = {
            "SQS_MSG_VISIBILITY_TIMEOUT_SEC": "10",
            "RECEIVE_WAIT_TIME_SEC": "2",
            "SHUTDOWN_TIMEOUT_SEC": "10",
            "NODE_TERMINATION_GRACE_PERIOD": "120",
            "REQUEUE_BACKOFF_BASE_SEC": "1",
        }
        super().__init__(sandbox, log, **{**defaults, **extra})
        STARTED.append(self.process)

    def count(self, event: str) -> int:
        """How many of its log lines say ``event``."""
        return sum(1 for line in self.lines() if line.get("event") == event)

    def stop(self, signum: int, bound_s: float) -> int:
        """Send ``signum`` and wait for the exit; its status. Fails when the process outlives ``bound_s``."""
        try:
            return super().stop(signum, bound_s)
        except AssertionError:
            raise AssertionError(
                f"the controller did not exit within {bound_s} s of signal {signum}"
            ) from None

    def left_behind(self) -> dict[str, Any]:
        """What its ``stopped`` line says it left (tasks, operations, heartbeats); it must have one."""
        stopped = [line for line in self.lines() if line.get("event") == "stopped"]
        assert stopped, f"no 'stopped' line: {self.lines()[-5:]}"
        return {key: stopped[-1][key] for key in ("tasks_left", "operations_left", "heartbeats_left")}

    def assert_clean_exit(self) -> None:
        """Stopped by SIGTERM: nothing left behind, no traceback in its log."""
        left = self.left_behind()
        assert left == {"tasks_left": 0, "operations_left": 0, "heartbeats_left": 0}, self.lines()[-1]
        assert not any("Traceback" in json.dumps(line) for line in self.lines())


def queue_depth(sandbox: Sandbox) -> tuple[int, int]:
    """(visible, in flight) messages of the sandbox's queue."""
    counts = sandbox.queue_counts()
    return counts.visible, counts.in_flight


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait until ``predicate()``; fails after ``timeout_s`` (a hang guard, generous for a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        await asyncio.sleep(0.2)


def heartbeats(sandbox: Sandbox) -> int:
    """RecordLifecycleActionHeartbeat calls the sandbox received."""
    return sum(1 for call in sandbox.aws.calls() if call.operation == "RecordLifecycleActionHeartbeat")


def cordoned(sandbox: Sandbox, nodes: list[str]) -> int:
    """How many of ``nodes`` are unschedulable."""
    return sum(
        1
        for node in nodes
        if ((sandbox.kube.get("nodes", node) or {}).get("spec") or {}).get("unschedulable")
    )


def hold_drains(sandbox: Sandbox, held: bool) -> None:
    """Make the apps' PodDisruptionBudgets allow no eviction (``held``), or one at a time."""
    for app in ("app-000", "app-001"):
        sandbox.kube.set_pdb(sandbox.cluster.namespace, app, max_unavailable=0 if held else 1)


def assert_judged_clean(
    sandbox: Sandbox, nodes: list[str], started: float, expected: dict[str, int] | None = None
) -> dict[str, Any]:
    """The judge's verdict on ``nodes`` since ``started``: every CLEAN field at zero (or at the value
    ``expected`` gives it, with the case saying why); the verdict."""
    verdict = judge(sandbox, nodes, started)
    wanted = {**dict.fromkeys(CLEAN, 0), **(expected or {})}
    assert {key: verdict[key] for key in CLEAN} == wanted, verdict
    return verdict


async def settle(
    sandbox: Sandbox,
    tokens: list[str],
    nodes: list[str],
    started: float,
    controllers: list[Controller],
    expected: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Wait until every action of ``tokens`` is settled and the queue is empty, SIGTERM ``controllers`` (each
    must exit cleanly within 60 s), and check: every action completed (none timed out), the judge's verdict
    clean, and nothing left behind in any controller. Returns the verdict."""
    try:
        settled = lambda: all(sandbox.aws.action(token).status != "open" for token in tokens)  # noqa: E731
        await until(settled, 180, "every action settled")
        await until(lambda: queue_depth(sandbox) == (0, 0), 60, "the queue empty")
    finally:
        statuses = [controller.stop(signal.SIGTERM, 60) for controller in controllers]
    assert statuses == [0] * len(controllers)
    for controller in controllers:
        controller.assert_clean_exit()
    assert [sandbox.aws.action(token).status for token in tokens] == ["completed"] * len(tokens)
    return assert_judged_clean(sandbox, nodes, started, expected)


@contextmanager
def sandbox_on(
    request: pytest.FixtureRequest, options: SandboxOptions, workdir: Path, *, granted: bool = True
) -> Iterator[Sandbox]:
    """A sandbox of ``options`` on the API server the fixture's parameter names (``emulated``, or ``real``: the
    shared control plane, the controller limited to the chart's RBAC). With ``granted`` the case fails when the
    controller made a request its RBAC does not grant."""
    real = request.param == "real"
    plane = request.getfixturevalue("control_plane") if real else None
    rbac = request.getfixturevalue("chart_rbac") if real else None
    with Sandbox(options, workdir=workdir, kubernetes=request.param, plane=plane, rbac=rbac) as running:
        yield running
        if granted:
            assert set(running.kube.requests) <= kubernetes_verbs(), set(running.kube.requests)


#: How many of the four nodes leave in a :class:`Draining` case.
LEAVING = 3
#: The sandbox of a :class:`Draining` case: 4 nodes, the apps' budgets letting one pod go at a time; hooks'
#: HeartbeatTimeout 6000 s is 60 s real (scale 0.01), longer than a kill's 10 s visibility timeout.
DRAINING = SandboxOptions(
    nodes=4,
    scale=0.01,
    visibility_timeout_s=10,
    heartbeat_timeout_s=6000,
    cluster=ClusterSpec(apps=2, pdb_max_unavailable=1),
)


class Draining:
    """Three nodes leaving through terminate hooks, their drains held by the PodDisruptionBudgets, and the
    first controller started (``extra`` settings) once they are all cordoned."""

    def __init__(self, sandbox: Sandbox, tmp_path: Path) -> None:
        self.sandbox, self.tmp_path = sandbox, tmp_path
        self.started = time.monotonic()
        leaving = sandbox.instances[:LEAVING]
        self.nodes = [instance.private_dns_name for instance in leaving]
        self.tokens: list[str] = []
        hold_drains(sandbox, True)
        for instance in leaving:
            self.tokens += [action.token for action in sandbox.aws.terminate_instance(instance.instance_id)]

    def controller(self, **extra: str) -> Controller:
        """A controller started now (``extra`` settings), logging to the case's ``controller.log``."""
        return Controller(self.sandbox, self.tmp_path / "controller.log", **extra)

    async def first(self, **extra: str) -> Controller:
        """The first controller (``extra`` settings), returned once every leaving node is cordoned."""
        controller = self.controller(**extra)
        await until(lambda: cordoned(self.sandbox, self.nodes) == LEAVING, 60, "every leaving node cordoned")
        return controller

    async def finish(self, *running: Controller) -> None:
        """Let the drains go, start a controller again unless some still run, and check the verdict."""
        hold_drains(self.sandbox, False)
        controllers = list(running) or [self.controller()]
        await settle(self.sandbox, self.tokens, self.nodes, self.started, controllers)
