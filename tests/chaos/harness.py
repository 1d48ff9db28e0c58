"""What the chaos cases share: the controller as its own process (``queue-processor run``) pointed at a sandbox,
waits on what a user would watch (queue depth, cordons, lifecycle actions), and the verdict every case ends
with: the sandbox's judge (:func:`queue_processor.sandbox.run.judge`) finds nothing lost or done twice, and each
controller that exited left no task behind (its ``stopped`` log line)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import boto3

from queue_processor.sandbox.environment import Sandbox
from queue_processor.sandbox.run import judge

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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


#: Every controller process started, so that a case that fails half-way leaves none running (conftest.py).
STARTED: list[subprocess.Popen[bytes]] = []


def kill_leftovers() -> None:
    """SIGKILL every controller a case started and did not stop."""
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait()


class Controller:
    """``queue-processor run`` in its own process, pointed at the sandbox, logging JSON lines to ``log``
    (appended). ``extra`` settings override the defaults below (sized for a test: short waits)."""

    def __init__(self, sandbox: Sandbox, log: Path, **extra: str) -> None:
        self.probes_port, self.metrics_port = free_port(), free_port()
        env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/tmp"),
            **sandbox.env(),
            "ENABLE_PROMETHEUS_SERVER": "true",
            "PROMETHEUS_SERVER_PORT": str(self.metrics_port),
            "PROBES_SERVER_PORT": str(self.probes_port),
            "JSON_LOGGING": "true",
            "SQS_MSG_VISIBILITY_TIMEOUT_SEC": "10",
            "RECEIVE_WAIT_TIME_SEC": "2",
            "SHUTDOWN_TIMEOUT_SEC": "10",
            "NODE_TERMINATION_GRACE_PERIOD": "120",
            "REQUEUE_BACKOFF_BASE_SEC": "1",
            **extra,
        }
        self.log_path = log
        self._offset = log.stat().st_size if log.exists() else 0
        self.log: IO[str] = log.open("a")
        self.process = subprocess.Popen([SCRIPT, "run"], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        STARTED.append(self.process)

    def lines(self) -> list[dict[str, Any]]:
        """This controller's log lines (JSON objects; any other line as ``{"event": line}``)."""
        with self.log_path.open() as text:
            text.seek(self._offset)
            out = []
            for line in text:
                try:
                    parsed = json.loads(line)
                except ValueError:
                    parsed = {"event": line.rstrip("\n")}
                out.append(parsed if isinstance(parsed, dict) else {"event": line})
            return out

    def count(self, event: str) -> int:
        """How many of its log lines say ``event``."""
        return sum(1 for line in self.lines() if line.get("event") == event)

    def get(self, path: str, port: int | None = None) -> tuple[int, str]:
        """GET ``path`` from its probes server (or ``port``): (status, body); (0, error) when unreachable."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port or self.probes_port}{path}", timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode()
        except OSError as error:
            return 0, str(error)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``, from its /metrics (0 while the
        server is not up yet)."""
        status, body = self.get("/metrics", self.metrics_port)
        if status == 0:
            return 0.0
        assert status == 200, body
        total = 0.0
        for line in body.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, _, value = line.rpartition(" ")
            if all(f'{key}="{want}"' in head for key, want in labels.items()):
                total += float(value)
        return total

    def stop(self, signum: int, bound_s: float) -> int:
        """Send ``signum`` and wait for the exit; its status. Fails when the process outlives ``bound_s``."""
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"the controller did not exit within {bound_s} s of signal {signum}"
            ) from None
        finally:
            self.log.close()

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
    sqs = boto3.client("sqs", **sandbox.aws.client_kwargs)
    assert sandbox.queue is not None
    attributes = sqs.get_queue_attributes(
        QueueUrl=sandbox.queue.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]), int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


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
