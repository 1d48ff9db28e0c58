"""The peer tests need aws-node-termination-handler built (``make cluster-bin``) and the real control plane:
skipped with the reason when NTH is missing, failed instead with QP_REQUIRE_REAL_CLUSTER=1 (CI)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidebyside import Workload, run_workload
from tests.conftest import REQUIRE_REAL_CLUSTER


@pytest.fixture(scope="session")
def nth_built() -> Path:
    """The NTH executable."""
    from nth import find_nth
    from queue_processor_sandbox.control_plane import ControlPlaneError

    try:
        return find_nth()
    except ControlPlaneError as exc:
        if REQUIRE_REAL_CLUSTER:
            pytest.fail(f"QP_REQUIRE_REAL_CLUSTER=1 and {exc}")
        pytest.skip(str(exc))


Run = Callable[[str, Workload], dict[str, Any]]


@pytest.fixture
def side_by_side(
    nth_built: Path, control_plane: Any, tmp_path: Path, record_property: Callable[[str, object], None]
) -> Run:
    """Runs a workload against one system on a fresh sandbox of the shared control plane; its figures, also
    recorded as a property of the test (``<system>``: JSON, in the JUnit XML) so NTH's side is kept."""

    def run(system: str, workload: Workload) -> dict[str, Any]:
        figures = run_workload(system, workload, plane=control_plane, workdir=tmp_path / system).values
        record_property(system, json.dumps(figures))
        print(f"{workload.name} {system}: {json.dumps(figures)}")
        return figures

    return run
