"""The controller's image, built from this tree by ``tools/image/build.sh`` (``make image``) once per run, and
the containers a case starts, removed after it whatever its outcome.

Skipped with the reason when there is no Docker here; with QP_REQUIRE_REAL_CLUSTER=1 (CI) the build installs
and starts what it needs (Debian's docker.io and mmdebstrap, dockerd) and a failure fails the tests."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_REAL_CLUSTER, ROOT
from tests.image.container import TAG, remove_containers

CACHE = Path(
    os.environ.get("QP_IMAGE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "queue-processor" / "image"
)


def _no_docker() -> str | None:
    """Why the image cannot be built here, or ``None``: a daemon answers, or dockerd is installed (the build
    starts it), or CI asks for it (the build installs it)."""
    if REQUIRE_REAL_CLUSTER or shutil.which("dockerd"):
        return None
    if shutil.which("docker") is None:
        return "no docker here (make image installs Debian's docker.io)"
    answer = subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=60)
    return None if answer.returncode == 0 else "no Docker daemon answers (make image starts one)"


@pytest.fixture(scope="session")
def image() -> str:
    """The tag of the image built from this tree (``queue-processor:dev``). The workers of one run share the
    build (a file lock): the first builds, the others find Docker's layer cache warm."""
    reason = _no_docker()
    if reason is not None:
        pytest.skip(reason)
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = subprocess.run(
            [str(ROOT / "tools" / "image" / "build.sh"), TAG],
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
    if built.returncode != 0:
        pytest.fail(f"tools/image/build.sh failed:\n{built.stdout[-2000:]}\n{built.stderr[-3000:]}")
    return TAG


@pytest.fixture(autouse=True)
def no_container_left() -> Iterator[None]:
    yield
    remove_containers()
