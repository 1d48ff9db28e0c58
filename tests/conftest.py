"""Shared test helpers: where the message fixtures live, and the real Kubernetes control plane."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Machines running the suite are loaded and slow: no per-example deadline and no too-slow health check, ever
# (a property that fails only on timing is a flaky test). Derandomized, so a CI run is reproducible, and a
# failure prints the blob that replays it (@reproduce_failure). HYPOTHESIS_PROFILE=dev gives hypothesis'
# defaults (random exploration).
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, print_blob=True
)
settings.register_profile("dev")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "messages"
# The project's shared samples sit beside the repository in CI (../shared); a user's clone may not have them.
SHARED_SAMPLES = ROOT.parent / "shared" / "samples" / "messages"


@pytest.fixture
def samples_dir() -> Path:
    """../shared/samples/messages; the test is skipped when it is not beside the repository, except in CI,
    where it always is (CI=true): there its absence fails the test."""
    if not SHARED_SAMPLES.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{SHARED_SAMPLES} is missing in CI")
        pytest.skip(f"{SHARED_SAMPLES} is not beside the repository")
    return SHARED_SAMPLES


# ------------------------------------------------------------------------------------ the real control plane

#: Set by .ci/run: a control plane that cannot be built or started fails the tests that need it instead of
#: skipping them.
REQUIRE_REAL_CLUSTER = os.environ.get("QP_REQUIRE_REAL_CLUSTER") == "1"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[Any]:
    """One real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK) for the
    whole run, started on first use; tests share it and keep to their own namespaces and nodes. Skipped with
    the reason when its binaries are missing (`make cluster-bin`), failed instead with QP_REQUIRE_REAL_CLUSTER=1.
    """
    from queue_processor_sandbox.control_plane import ControlPlane, ControlPlaneError, find_binaries

    try:
        find_binaries()
    except ControlPlaneError as exc:
        if REQUIRE_REAL_CLUSTER:
            pytest.fail(f"QP_REQUIRE_REAL_CLUSTER=1 and {exc}")
        pytest.skip(str(exc))
    plane = ControlPlane()
    try:
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the real control plane did not start: {exc}")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """The pinned Helm binary; skipped when it is not built (failed with QP_REQUIRE_REAL_CLUSTER=1)."""
    from queue_processor_sandbox.control_plane import default_bin_dir

    env = os.environ.get("QP_CLUSTER_BIN")
    path = (Path(env) if env else default_bin_dir()) / "helm"
    if not os.access(path, os.X_OK):
        reason = f"{path} is missing: run `make cluster-bin` (needs Go and the Go module proxy)"
        if REQUIRE_REAL_CLUSTER:
            pytest.fail(reason)
        pytest.skip(reason)
    return path


#: The two Kubernetes API servers a backend-neutral test runs against.
KUBERNETES = ["emulated", "real"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``real`` every test that needs the real control plane (it asks for the fixture, or runs with the
    ``real`` value of :data:`KUBERNETES`) or NTH (``tests/peers``): ``make check`` (``-m "not real"``) runs
    the others, on the emulation, in minutes; ``make test`` runs everything."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        fixtures = set(getattr(item, "fixturenames", ()))
        if (
            fixtures
            & {"control_plane", "plane", "nth_webhook", "image", "helm_bin"}  # plane, Go peers, image
            or "real" in params.values()
            or "cluster" in params.values()
            or "/tests/peers/" in str(item.path)
            or item.name.endswith("_on_the_real_control_plane")
            or "_on_the_real_control_plane[" in item.name
        ):
            item.add_marker(pytest.mark.real)


@pytest.fixture(scope="session")
def chart_rbac() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The controller's RBAC as the Helm chart renders it with Helm's own engine (helm-python-sdk), with every
    feature that needs a rule turned on (node Leases, Kubernetes Events, deletion at the deadline, surge
    drains): (ClusterRole rules, Role rules).
    Skipped when Helm's engine cannot be loaded (failed with QP_REQUIRE_REAL_CLUSTER=1 or CI)."""
    import yaml

    try:
        import helm_python

        helm_python.helm_sdk_version()
    except Exception as exc:  # ImportError, OSError, helm_python.HelmLibraryError: no usable libhelm_c
        if REQUIRE_REAL_CLUSTER or os.environ.get("CI"):
            pytest.fail(f"Helm's engine (helm-python-sdk) cannot be used: {exc!r}")
        pytest.skip(f"Helm's engine (helm-python-sdk) cannot be used: {exc!r}")
    chart = helm_python.Chart.load(str(ROOT / "charts" / "queue-processor"))
    try:
        values = {
            "queueURL": "https://sqs.us-east-1.amazonaws.com/123456789012/queue-processor",
            "nodeLeases": True,
            "emitKubernetesEvents": True,
            "deleteAtDeadline": True,
            "surgeDrains": True,
        }
        files = chart.render(values=values, name="queue-processor", namespace="queue-processor")
    finally:
        chart.close()
    objects = [
        doc
        for path, text in files.items()
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    (cluster_role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    (role,) = [o for o in objects if o["kind"] == "Role"]
    return list(cluster_role["rules"]), list(role["rules"])
