"""Start-up refuses what will not heal with one line naming the setting and exit status 2, never a traceback
and never a process that runs on, unready, forever: a kubeconfig that cannot be used, a port in use, a queue
that does not exist, no AWS credentials. The controller runs as its own process (`queue-processor run`)
against moto's server over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_processor_sandbox.aws import AwsSandbox
from queue_processor_sandbox.clock import SandboxClock

SCRIPT = str(Path(sys.executable).parent / "queue-processor")

#: A kubeconfig that loads (nothing connects to it before the queue is read).
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture(scope="module")
def sandbox() -> Iterator[AwsSandbox]:
    with AwsSandbox(SandboxClock(0.01)) as started:
        yield started


def run(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``queue-processor run`` with only ``env`` (and PATH); it must end by itself (the bound is a hang guard,
    generous for a loaded machine)."""
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true"}
    return subprocess.run(
        [SCRIPT, "run"], env={**base, **env}, capture_output=True, text=True, timeout=120, check=False
    )


def settings(sandbox: AwsSandbox, tmp_path: Path, queue: str) -> dict[str, str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    return {
        "QUEUE_URL": queue,
        "AWS_REGION": sandbox.region,
        "AWS_ENDPOINT": sandbox.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "KUBECONFIG": str(kubeconfig),
        "ENABLE_PROMETHEUS_SERVER": "false",
        "PROBES_SERVER_PORT": "0",  # any free port: a port chosen beforehand can be taken before the bind
    }


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The error line; the process printed no traceback."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr + done.stdout
    lines = [line for line in done.stderr.splitlines() if line.startswith("queue-processor: ")]
    assert len(lines) == 1, done.stderr[-2000:]
    return lines[0]


def test_a_queue_that_does_not_exist(sandbox: AwsSandbox, tmp_path: Path) -> None:
    queue = f"{sandbox.endpoint_url}/123456789012/no-such-queue"
    line = one_line(run(settings(sandbox, tmp_path, queue), tmp_path))
    assert line.startswith(f"queue-processor: cannot start: QUEUE_URL={queue}: the queue does not exist")


def test_no_aws_credentials(sandbox: AwsSandbox, tmp_path: Path) -> None:
    queue = sandbox.create_queue("startup-no-credentials").url
    env = settings(sandbox, tmp_path, queue)
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    env["AWS_SHARED_CREDENTIALS_FILE"] = env["AWS_CONFIG_FILE"] = str(tmp_path / "none")
    line = one_line(run(env, tmp_path))
    assert line.startswith("queue-processor: cannot start: no AWS credentials found")


def test_a_kubeconfig_that_cannot_be_used(sandbox: AwsSandbox, tmp_path: Path) -> None:
    queue = sandbox.create_queue("startup-kubeconfig").url
    env = settings(sandbox, tmp_path, queue)
    for content, says in (
        (None, "No configuration found"),  # the file is missing
        ("clusters: [", "while parsing"),  # YAML that does not parse
    ):
        path = tmp_path / "broken"
        path.unlink(missing_ok=True)
        if content is not None:
            path.write_text(content)
        line = one_line(run({**env, "KUBECONFIG": str(path)}, tmp_path))
        assert line.startswith(f"queue-processor: cannot start: KUBECONFIG={path}: "), line
        assert says in line


def test_a_probe_port_in_use(sandbox: AwsSandbox, tmp_path: Path) -> None:
    queue = sandbox.create_queue("startup-port").url
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # the controller listens on every address too
        taken.listen()
        env = {**settings(sandbox, tmp_path, queue), "PROBES_SERVER_PORT": str(taken.getsockname()[1])}
        line = one_line(run(env, tmp_path))
    assert f"PROBES_SERVER_PORT={env['PROBES_SERVER_PORT']}: cannot listen" in line
