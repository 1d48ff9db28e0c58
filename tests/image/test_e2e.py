"""``make e2e``'s run (:mod:`queue_processor_sandbox.e2e`) as CI runs it: the built image installed by Helm on a
real node of its own control plane, a Spot storm drained by the pod, judged; its last line the JSON summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from queue_processor_sandbox.real_node import RealNodeError, find_node_tools
from tests.conftest import REQUIRE_REAL_CLUSTER, ROOT


def test_make_e2e_drains_the_storm_with_the_pod_and_says_so_in_its_last_line(
    image: str, helm_bin: Path
) -> None:
    try:
        find_node_tools()
    except RealNodeError as exc:
        if REQUIRE_REAL_CLUSTER:
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    done = subprocess.run(
        [sys.executable, "-m", "queue_processor_sandbox.e2e", "--image", image, "--helm", str(helm_bin)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["scenario"] == "spot-storm"
    assert summary["drained"] == summary["nodes"] == 10
    assert (summary["messages_left"], summary["dlq"], summary["lifecycle_timed_out"]) == (0, 0, 0)
    assert summary["stopped"]  # the kubelet's SIGTERM reached it
    assert summary["tasks_left"] == 0
