"""The controller run from its image: ``docker run`` attached (the container's output is the log), pointed at a
sandbox over the host's network, so the sandbox's judge reads it as it reads a controller process."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

from queue_processor_sandbox.environment import Sandbox
from tests.chaos.harness import Controller

#: The tag tools/image/build.sh gives the image it builds for the tests.
TAG = "queue-processor:dev"
#: Where a container finds its kubeconfig (mounted read-only).
KUBECONFIG = "/etc/queue-processor/kubeconfig"
#: What the chart's securityContext asks of the kubelet: read-only root, no capabilities, no new privileges
#: (charts/queue-processor/values.yaml). /tmp is always a tmpfs, as the chart's emptyDir there.
HARDENED = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]

#: Names of the containers started and not removed yet (conftest.py removes them after each case).
STARTED: list[str] = []


def docker(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``docker args...``, its output captured; raises ``AssertionError`` with its stderr when it fails."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False, timeout=timeout_s)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr.strip()}"
    return done


def remove_containers() -> None:
    """``docker rm -f`` every container started (running or exited)."""
    while STARTED:
        subprocess.run(["docker", "rm", "-f", STARTED.pop()], capture_output=True, check=False, timeout=120)


def portable_kubeconfig(source: Path, target: Path) -> Path:
    """``source`` with every file it names inlined (``certificate-authority`` as ``-data``, client certificate
    and key likewise), written to ``target`` readable by the image's user (65532): the container sees no host
    path. Kubeconfig format: https://kubernetes.io/docs/reference/config-api/kubeconfig.v1/."""
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    named = [(c["cluster"], "certificate-authority") for c in config.get("clusters", [])] + [
        (u["user"], field) for u in config.get("users", []) for field in ("client-certificate", "client-key")
    ]
    for section, field in named:
        if field in section:
            section[f"{field}-data"] = base64.b64encode(Path(section.pop(field)).read_bytes()).decode()
    target.write_text(json.dumps(config))
    target.chmod(0o644)
    return target


class ImageController(Controller):
    """The controller in a container of ``image`` (``docker run --network host``: the sandbox listens on
    loopback), the sandbox's settings passed as environment variables, as the chart passes them; ``hardened``
    adds what the chart's securityContext asks (:data:`HARDENED`). Stopped with ``docker stop`` (SIGTERM) or
    ``docker kill --signal``: a container killed by signal N exits 128 + N, given here as ``-N`` as for a
    process."""

    def __init__(
        self, sandbox: Sandbox, log: Path, image: str, *, hardened: bool = True, **extra: str
    ) -> None:
        self.image, self.hardened = image, hardened
        self.name = f"queue-processor-test-{uuid.uuid4().hex[:8]}"
        self._host_pid = 0
        self._kubeconfig = log.with_name(f"{self.name}.kubeconfig.json")
        STARTED.append(self.name)
        super().__init__(sandbox, log, **extra)

    def command(self, env: dict[str, str]) -> list[str]:
        """``docker run`` with every setting of ``env`` but the host's PATH and HOME, and the kubeconfig
        mounted (``env["KUBECONFIG"]`` becomes the path the container sees)."""
        portable = portable_kubeconfig(Path(env["KUBECONFIG"]), self._kubeconfig)
        env["KUBECONFIG"] = KUBECONFIG
        settings = [arg for key in sorted(env) if key not in ("PATH", "HOME") for arg in ("-e", key)]
        mount = ["-v", f"{portable}:{KUBECONFIG}:ro"]
        hardened = HARDENED if self.hardened else []
        return [
            "docker",
            "run",
            "--name",
            self.name,
            "--network",
            "host",
            *("--tmpfs", "/tmp"),
            *hardened,
            *mount,
            *settings,
            self.image,
        ]

    @property
    def pid(self) -> int:
        """The controller's process ID on the host (the container's PID 1), 0 until the container runs."""
        if not self._host_pid:
            found = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Pid}}", self.name],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            self._host_pid = int(found.stdout.strip() or 0) if found.returncode == 0 else 0
        return self._host_pid

    def stop(self, signum: int, bound_s: float) -> int:
        """``docker stop`` (SIGTERM; SIGKILL after ``bound_s``) or ``docker kill --signal``; the exit status.
        Fails when the container outlives ``bound_s`` seconds."""
        if self.process.poll() is None:
            if signum == signal.SIGTERM:
                docker("stop", "-t", str(int(bound_s)), self.name, timeout_s=bound_s + 60)
            else:
                docker("kill", "--signal", signal.Signals(signum).name, self.name)
        try:
            status = self.process.wait(timeout=bound_s + 60)
        finally:
            self.log.close()
        assert status != 128 + signal.SIGKILL or signum == signal.SIGKILL, "docker stop had to SIGKILL it"
        return -(status - 128) if 128 < status < 128 + 64 else status
