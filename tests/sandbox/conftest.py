"""Fixtures for tests that drive our Kubernetes code against both API servers (the emulation must agree with
the real one): ``cluster`` (module-scoped, one per server; its clock runs at the test module's
``CLOCK_SCALE``, 1.0 unless the module says otherwise), ``requests`` (every request the client made) and
``kube`` (a :class:`KubeClient` on the cluster, reporting to ``requests``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from queue_processor.kube import KubeClient, load_api_client
from queue_processor.observe.metrics import Observer
from queue_processor_sandbox.clock import SandboxClock
from queue_processor_sandbox.cluster import KubeCluster
from queue_processor_sandbox.kube import KubeSandbox
from tests.conftest import KUBERNETES


class Requests(Observer):
    """Every request the client made, by ``"<verb> <resource>"`` (:attr:`made`) and by
    ``"<verb> <resource> <status>"`` (:attr:`answered`; status ``None`` when no answer came)."""

    def __init__(self) -> None:
        self.made: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()

    def kube_request(self, verb: str, resource: str, status: int | None) -> None:
        self.made[f"{verb} {resource}"] += 1
        self.answered[f"{verb} {resource} {status}"] += 1

    def clear(self) -> None:
        """Forget every request so far, made and answered alike (a test's setup is not what it counts)."""
        self.made.clear()
        self.answered.clear()


@pytest.fixture(scope="module", params=KUBERNETES)
def cluster(request: pytest.FixtureRequest) -> Iterator[KubeCluster]:
    clock = SandboxClock(getattr(request.module, "CLOCK_SCALE", 1.0))
    if request.param == "emulated":
        with KubeSandbox(clock) as sandbox:
            yield sandbox
        return
    from queue_processor_sandbox.real_kube import RealKube

    with RealKube(clock, plane=request.getfixturevalue("control_plane")) as real:
        yield real


@pytest.fixture
def requests() -> Requests:
    return Requests()


def client_of(cluster: KubeCluster, directory: Path, requests: Requests) -> KubeClient:
    """The controller's Kubernetes client for ``cluster`` (its kubeconfig written in ``directory``), each of
    its requests told to ``requests``."""
    return KubeClient(load_api_client(str(cluster.kubeconfig(directory / "kubeconfig"))), observer=requests)


@pytest.fixture
async def kube(cluster: KubeCluster, tmp_path: Path, requests: Requests) -> AsyncIterator[KubeClient]:
    client = client_of(cluster, tmp_path, requests)
    yield client
    client.close()
