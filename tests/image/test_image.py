"""The image as users run it: built from the Dockerfile (``tools/image/build.sh``), run by Docker, never the
source tree. Its command line, what it holds, and the runtime contract the Dockerfile's header promises the
chart (numeric non-root user, a read-only root filesystem, no capabilities, nothing written), checked on a
running controller that drains a sandbox's nodes on both API servers and is stopped mid-drain by ``docker
stop``: it exits 0 with every message it held visible again, having written nothing outside /tmp (a tmpfs,
as the chart's emptyDir; the kubernetes client keeps an inlined CA there), and a second container finishes the work,
judged by the sandbox as a controller process is."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from importlib.metadata import PathDistribution, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from queue_processor_sandbox.environment import Sandbox
from queue_processor_sandbox.processes import proc_status
from tests.chaos.harness import DRAINING, LEAVING, Draining, queue_depth, sandbox_on, until
from tests.conftest import KUBERNETES
from tests.image.container import KUBECONFIG, ImageController, docker

# Run by the image's interpreter: the distributions installed in /opt/venv, by name, with their versions.
LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)


def runtime_closure(name: str) -> dict[str, str]:
    """The distributions ``name`` needs at run time (its requirements without extras, recursively, markers
    evaluated here), by canonical name, with the versions installed in this environment (constraints.txt pins
    both this environment and the image)."""
    found: dict[str, str] = {}
    todo = [name]
    while todo:
        dist = distribution(todo.pop())
        key = canonicalize_name(dist.metadata["Name"])
        if key in found:
            continue
        found[key] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


def test_help_runs_from_the_image(image: str) -> None:
    shown = docker("run", "--rm", image, "--help").stdout
    assert "Usage: queue-processor run" in shown
    assert "--queue-url" in shown


def test_the_image_holds_the_controller_and_its_runtime_dependencies_only(image: str) -> None:
    """/opt/venv holds exactly the controller's distribution and what it needs at run time, at the pinned
    versions: no sandbox, tests, benchmarks, pip or build tools."""
    listed = docker("run", "--rm", "--entrypoint", "/opt/venv/bin/python", image, "-c", LIST_DISTRIBUTIONS)
    installed = {canonicalize_name(name): version for name, version in json.loads(listed.stdout).items()}
    assert installed == runtime_closure("queue-processor")
    ours = distribution("queue-processor")
    assert isinstance(ours, PathDistribution)
    assert installed["queue-processor"] == ours.version
    files = docker("run", "--rm", "--entrypoint", "find", image, "/opt/venv", "-name", "*.py").stdout.split()
    ours_only = (
        "site-packages/queue_processor_sandbox/",
        "site-packages/tests/",
        "site-packages/benchmarks/",
    )
    assert not [f for f in files if any(part in f for part in ours_only)]
    labels = json.loads(docker("image", "inspect", "-f", "{{json .Config.Labels}}", image).stdout)
    assert labels["org.opencontainers.image.version"] == ours.version


@pytest.fixture(params=KUBERNETES)
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    with sandbox_on(request, DRAINING, tmp_path / "sandbox") as running:
        yield running


class InImage(Draining):
    """A :class:`Draining` case whose controllers run in containers of ``image`` (``hardened`` as the chart
    runs them, or not: then ``docker diff`` shows whatever the controller wrote)."""

    def __init__(self, sandbox: Sandbox, tmp_path: Path, image: str) -> None:
        super().__init__(sandbox, tmp_path)
        self.image, self.hardened = image, False

    def controller(self, **extra: str) -> ImageController:
        log = self.tmp_path / "controller.log"
        return ImageController(self.sandbox, log, self.image, hardened=self.hardened, **extra)


def _security(pid: int) -> dict[str, int]:
    """The fields of a running process's /proc status that the runtime contract is about (proc(5))."""
    status = proc_status(pid)
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    capabilities = {k: int(v, 16) for k, _, v in (line.partition(":\t") for line in lines) if k == "CapEff"}
    return {"uid": status["Uid"], "gid": status["Gid"], "no_new_privs": status["NoNewPrivs"], **capabilities}


async def test_docker_stop_mid_drain_then_a_hardened_container_finishes(
    sandbox: Sandbox, tmp_path: Path, image: str
) -> None:
    draining = InImage(sandbox, tmp_path, image)
    first = await draining.first()
    assert first.pid
    assert _security(first.pid)["uid"] == 65532
    assert first.stop(signal.SIGTERM, 10 + 20) == 0, first.lines()[-5:]  # SHUTDOWN_TIMEOUT_SEC, and room
    first.assert_clean_exit()
    assert queue_depth(sandbox) == (LEAVING, 0)  # every message it held visible again at once
    changed = [line.split(" ", 1)[1] for line in docker("diff", first.name).stdout.splitlines()]
    assert [path for path in changed if not KUBECONFIG.startswith(path)] == []  # its mounts aside
    assert [sandbox.aws.action(token).status for token in draining.tokens] == ["open"] * LEAVING

    draining.hardened = True
    second = draining.controller()
    await until(lambda: second.probes_port != 0, 60, "the second container's probes listening")
    assert second.get("/healthz")[0] == 200
    assert _security(second.pid) == {"uid": 65532, "gid": 65532, "no_new_privs": 1, "CapEff": 0}
    await draining.finish(second)
