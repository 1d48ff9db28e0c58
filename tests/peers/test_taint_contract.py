"""NTH's taint keys, values and effects are a contract other projects key on (OpenShift HyperShift's Spot
remediation, kubernetes-mixin alert rules): ours must be NTH's, read here from the source of the release
``make cluster-bin`` builds the peer from (tools/cluster/nth/go.mod pins it), not from a copy of ours.

Real-tier (tests/peers): it needs Go and the module proxy, as the peer's build does; skipped with the reason
without them, failed with QP_REQUIRE_REAL_CLUSTER=1 (CI)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from queue_processor.config import Settings
from queue_processor.events import EventKind, make_event_id
from queue_processor.rules import RULES
from queue_processor.steps import OUT_OF_SERVICE_TAINT
from tests.conftest import REQUIRE_REAL_CLUSTER, ROOT

NTH_MODULE = "github.com/aws/aws-node-termination-handler"


def nth_source(relative: str) -> str:
    """A file of the NTH release tools/cluster/nth/go.mod pins, from the Go module cache (downloaded once)."""
    if shutil.which("go") is None:
        if REQUIRE_REAL_CLUSTER:
            pytest.fail("QP_REQUIRE_REAL_CLUSTER=1 and go is not on PATH")
        pytest.skip("go is not on PATH: NTH's source cannot be read")
    wrapper = ROOT / "tools" / "cluster" / "nth"
    for command in (
        ["go", "list", "-m", "-json", NTH_MODULE],
        ["go", "mod", "download", "-json", NTH_MODULE],
    ):
        found = subprocess.run(command, cwd=wrapper, capture_output=True, text=True, check=False)
        directory = json.loads(found.stdout or "{}").get("Dir") if found.returncode == 0 else None
        if directory and (Path(directory) / relative).is_file():
            return (Path(directory) / relative).read_text()
    message = f"NTH's {relative} cannot be read from the Go module cache: {found.stderr.strip()[:300]}"
    if REQUIRE_REAL_CLUSTER:
        pytest.fail(message)
    pytest.skip(message)


def go_constants(source: str) -> dict[str, str]:
    """``Name = "value"`` and ``name = 123`` constants of a Go file (its ``const`` blocks)."""
    return dict(re.findall(r'^\s*(\w+)\s*=\s*"?([\w./:-]+)"?\s*$', source, re.M))


def test_our_taints_are_nths() -> None:
    node = go_constants(nth_source("pkg/node/node.go"))
    assert RULES[EventKind.SPOT_INTERRUPTION].taint_key == node["SpotInterruptionTaint"]
    assert RULES[EventKind.SCHEDULED_CHANGE].taint_key == node["ScheduledMaintenanceTaint"]
    assert RULES[EventKind.ASG_TERMINATE_LIFECYCLE].taint_key == node["ASGLifecycleTerminationTaint"]
    assert RULES[EventKind.REBALANCE_RECOMMENDATION].taint_key == node["RebalanceRecommendationTaint"]
    assert (
        node["OutOfServiceTaintKey"],
        node["OutOfServiceTaintValue"],
        node["OutOfServiceTaintEffectType"],
    ) == OUT_OF_SERVICE_TAINT
    # NTH's taint value is the event ID cut to 63 characters (a label value's limit); ours fit whole.
    assert int(node["maxTaintValueLength"]) == 63
    assert max(len(make_event_id(kind, "i-" + "f" * 17, "key")) for kind in EventKind) <= 63


def test_our_default_taint_effect_is_nths(monkeypatch: pytest.MonkeyPatch) -> None:
    config = go_constants(nth_source("pkg/config/config.go"))
    monkeypatch.setenv("QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/q")
    assert Settings().taint_effect == config["taintEffectDefault"]  # type: ignore[call-arg]
